"""Elementwise math on register tiles, with numpy broadcasting.

Operands are register tiles, Python numbers or integer ``Expr`` (scalars broadcast).
Shapes broadcast as in numpy (aligned on the right; extents equal or 1); the result has
the broadcast shape and the type the function's typing rule gives (the operands' element
type, which tile operands must agree on (use ``hl.cast``), or a predicate for comparisons).
Each call emits one ``Elementwise(result, fn, args)`` op; ``out=`` writes into an existing
tile of the broadcast shape instead of a new one (how loop-carried state is updated).

The functions and their rules are the ALU functions of ``hexlayout.ir.functions``; every
one with a ``lang_name`` (``exp exp2 exp2_approx log log2 rsqrt sqrt silu erf tanh softplus``) gets a
unary ``hl.<lang_name>(x, *, out=None)`` generated here (``FUNCTIONS``), whose docstring is
the function's. Operators, ``abs``, ``maximum``/``minimum``, ``where``, comparisons,
logical functions and ``gelu`` (exact or tanh form, as torch's ``F.gelu``) are written out below.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hexlayout.arch.dtypes import DType
from hexlayout.ir.expr import Expr, emax, emin
from hexlayout.ir.functions import (
    KIND_WORDS,
    AluFunction,
    AluTypeError,
    UnknownFunctionError,
    alu_function,
    alu_functions,
)
from hexlayout.ir.tile import Elementwise, SourceLoc, Value
from hexlayout.ir.types import LayoutVar, Scope, TileType

from .checks import begin
from .context import TraceContext
from .tensor import GlobalTensor, Tile, describe, method, shape_str

__all__ = [
    "elementwise", "broadcast_shapes", "unary_function", "function", "FUNCTIONS", "abs_", "maximum",
    "minimum", "where", "equal", "not_equal", "logical_and", "logical_or", "logical_not", "gelu",
    "GELU_FORMS",
]


def broadcast_shapes(shapes: list[tuple[int, ...]]) -> tuple[int, ...] | None:
    """numpy's broadcast of ``shapes`` (None when they do not broadcast)."""
    rank = max(len(s) for s in shapes)
    out = []
    for d in range(rank):
        ext = 1
        for s in shapes:
            k = d - (rank - len(s))
            if k < 0:
                continue
            e = s[k]
            if e == 1:
                continue
            if ext not in (1, e):
                return None
            ext = e
        out.append(ext)
    return tuple(out)


def _operand(ctx: TraceContext, op: str, loc: SourceLoc | None, x: Any) -> Value | float | int | Expr:
    if isinstance(x, Tile):
        if x._ctx is not ctx:
            raise ctx.error(op, loc, f"%{x.name} belongs to another kernel trace")
        if x.scope != Scope.REGISTER:
            raise ctx.error(op, loc, f"elementwise math needs register tiles, {describe(x.value)} is "
                            f"{x.scope}; copy it to registers first (hl.copy)")
        return x.value
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, (int, float, Expr)):
        return x
    try:
        import numpy as np

        if isinstance(x, (np.integer, np.floating)):
            return x.item()
    except ImportError:  # pragma: no cover
        pass
    if isinstance(x, GlobalTensor):
        raise ctx.error(op, loc, f"the global tensor {x.name} is not a register tile; view and copy it first")
    raise ctx.error(op, loc, f"{x!r} ({type(x).__name__}) is not a tile or a scalar")


@method("elementwise")
def elementwise(fn: str | AluFunction, args: tuple[Any, ...], *, out: Tile | None = None,
                opname: str | None = None) -> Tile:
    """Emit ``Elementwise(result, fn, args)`` (see the module docstring); ``fn`` is an ALU
    function or its name, ``opname`` how messages name the operation."""
    try:
        f = alu_function(fn)
    except UnknownFunctionError as e:
        ctx, loc = begin(opname or str(fn))
        raise ctx.error(opname or str(fn), loc, str(e)) from None
    op = opname or f.operator or str(f)
    ctx, loc = begin(op)
    ops = [_operand(ctx, op, loc, a) for a in args]
    tiles = [o for o in ops if isinstance(o, Value)]
    if not tiles:
        raise ctx.error(op, loc, "needs at least one register tile operand")
    shape = broadcast_shapes([tuple(t.type.shape) for t in tiles])
    if shape is None:
        desc = ", ".join(describe(t) for t in tiles)
        raise ctx.error(op, loc, f"shapes do not broadcast: {desc}")
    dtype = _result_dtype(ctx, op, loc, f, ops)
    if out is not None:
        if not isinstance(out, Tile) or out.scope != Scope.REGISTER:
            raise ctx.error(op, loc, f"out= must be a register tile, got {out!r}")
        if broadcast_shapes([shape, tuple(out.shape)]) != tuple(out.shape):
            raise ctx.error(op, loc, f"the result shape {shape_str(shape)} does not broadcast to out= "
                            f"{describe(out.value)}")
        if out.dtype != dtype:
            raise ctx.error(op, loc, f"the result is {dtype} but out= {describe(out.value)}; use hl.cast")
        ctx.emit(Elementwise(out.value, f, tuple(ops), loc=loc))
        return out
    ty = TileType(dtype, shape, Scope.REGISTER, LayoutVar())
    v = ctx.new_value(ty, loc, tuple(tiles))
    ctx.emit(Elementwise(v, f, tuple(ops), loc=loc))
    return Tile(v, ctx)


def _result_dtype(ctx: TraceContext, op: str, loc: SourceLoc | None, fn: AluFunction,
                  ops: list[Any]) -> DType:
    """``fn``'s typing rule on the operands, its refusal as a message naming the tiles."""
    if "float" not in fn.accepts:
        for o in ops:
            if isinstance(o, float):
                raise ctx.error(op, loc, f"{fn} takes no floating-point operands, {o!r} is a float")
    try:
        return fn.result_dtype([o.type.dtype if isinstance(o, Value) else None for o in ops])
    except AluTypeError as e:
        named = [ops[i] for i in e.operands]
        what = [describe(o) if isinstance(o, Value) else repr(o) for o in named]
        if e.requirement == "condition":
            msg = f"the condition {what[0]} must be a predicate tile (a comparison)"
        elif e.requirement == "tile":
            msg = "needs a tile among the two choices" if fn.condition else "needs a tile operand"
        elif e.requirement == "same":
            msg = f"element types differ: {' and '.join(what)}; convert one with hl.cast"
        elif e.requirement == "kind":
            want = " or ".join(KIND_WORDS[k] for k in sorted(fn.accepts))
            msg = f"{fn} needs a {want} tile, {what[0]} is {named[0].type.dtype}"
        else:
            msg = str(e)
        raise ctx.error(op, loc, msg) from None


_UNARY_DOC = """{math}

Elementwise over a register tile: element ``i`` of the result is the function of ``x[i]``,
computed in f32 (f64 for f64 tiles) and rounded once to ``x``'s element type. Shapes of
``x`` and ``out`` broadcast as in numpy. (Generated from the ALU function ``{fn}`` of
``hexlayout.ir.functions``{accuracy}.)

Args:
    x: a register tile of {kinds} elements.
    out: a register tile to write the result into (its shape the broadcast of ``x``'s, its
        type ``x``'s); ``None`` for a new tile.

Returns:
    The result tile (``out`` when given), of ``x``'s element type.

Raises:
    KernelError: ``x`` is not a register tile or not of {kinds} type, or ``out`` does not
        fit the result.

Example:
    ``hl.{name}`` of a tile loaded from global memory::

        @hl.kernel(threads=128)
        def f(a: hl.f32["M", "N"], c: hl.f32["M", "N"]):
            x = hl.register(hl.f32, (64, 64))
            hl.copy(a.tile((64, 64), (0, 0)), x)
            hl.copy(hl.{name}(x), c.tile((64, 64), (0, 0)))

        f.trace()
"""


def unary_function(fn: AluFunction) -> Callable[..., Tile]:
    """``hl.<fn.lang_name>(x, *, out=None)``: ``fn`` of a register tile, elementwise (its
    docstring generated from ``fn``'s)."""
    name = fn.lang_name or str(fn)

    def f(x: Tile, *, out: Tile | None = None) -> Tile:
        return elementwise(fn, (x,), out=out, opname=name)

    f.__name__ = f.__qualname__ = name
    f.__module__ = __name__
    accuracy = f"; the device's math library is within {fn.device_ulp} ulp in f32" if fn.device_ulp else ""
    kinds = " or ".join(KIND_WORDS[k] for k in sorted(fn.accepts))
    f.__doc__ = _UNARY_DOC.format(math=fn.doc, fn=fn, name=name, kinds=kinds, accuracy=accuracy)
    return f


#: the generated unary functions, ``lang_name -> function`` (exported as ``hl.<lang_name>``)
FUNCTIONS: dict[str, Callable[..., Tile]] = {fn.lang_name: unary_function(fn) for fn in alu_functions()
                                             if fn.lang_name}
globals().update(FUNCTIONS)
__all__ += list(FUNCTIONS)


def function(lang_name: str) -> Callable[..., Tile]:
    """The unary function ``hl.<lang_name>`` (generated on first use for an ALU function defined
    after this module was imported); ``LookupError`` when no ALU function has that name."""
    if lang_name not in FUNCTIONS:
        for fn in alu_functions():
            if fn.lang_name == lang_name:
                FUNCTIONS[lang_name] = unary_function(fn)
                break
        else:
            raise LookupError(f"no ALU function has the language name {lang_name!r}")
    return FUNCTIONS[lang_name]


_TILE_RAISES = """KernelError: an operand is not a register tile or a scalar, the shapes do not
        broadcast, the element types differ or are not accepted, or ``out`` does not fit
        (the message names the kernel, the tiles and the source line)."""


def abs_(x: Tile, *, out: Tile | None = None) -> Tile:
    """``|x|`` elementwise (``hl.abs``; also ``abs(tile)``).

    Element ``i`` of the result is ``|x[i]|`` (``-0.0`` becomes ``+0.0``, NaN stays NaN; of
    the most negative integer, itself, as two's complement wraps). The ALU function ``abs``.

    Args:
        x: a register tile of floating-point or signed integer elements.
        out: a register tile to write into (the shape and type of the result); ``None`` for a
            new tile.

    Returns:
        The result tile (``out`` when given), of ``x``'s type.

    Raises:
        {raises}

    Example:
        The magnitude of a loaded tile::

            @hl.kernel(threads=128)
            def magnitude(a: hl.f32["M", "N"], c: hl.f32["M", "N"]):
                x = hl.register(hl.f32, (64, 64))
                hl.copy(a.tile((64, 64), (0, 0)), x)
                hl.copy(hl.abs(x), c.tile((64, 64), (0, 0)))

            magnitude.trace()
    """
    return elementwise("abs", (x,), out=out, opname="abs")


#: ``hl.gelu``'s ``approximate`` values (torch's) and the ALU function each one is
GELU_FORMS = {"none": "gelu", "tanh": "gelu_tanh"}


def gelu(x: Tile, approximate: str = "none", *, out: Tile | None = None) -> Tile:
    """GELU elementwise, as torch's ``F.gelu(x, approximate=...)``.

    ``approximate="none"`` (the default, torch's and vLLM's ``gelu``): the exact form
    ``x * Phi(x) = x / 2 * (1 + erf(x / sqrt 2))``, computed as ``x / 2 * erfc(-x / sqrt 2)``
    (the ALU function ``gelu``; the device's ``erfcf`` is within 4 ulp).
    ``approximate="tanh"``: ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3)))`` (the ALU
    function ``gelu_tanh``), which differs from the exact form by up to 1.5e-3 absolute
    (about 15 % relative near x = -3.25). Computed in f32 (f64 for f64 tiles), rounded once
    to ``x``'s type.

    Args:
        x: a register tile of floating-point elements.
        approximate: ``"none"`` (exact, erf) or ``"tanh"``.
        out: a register tile to write into (the shape and type of the result); ``None`` for a
            new tile.

    Returns:
        The result tile (``out`` when given), of ``x``'s type.

    Raises:
        KernelError: ``approximate`` is neither ``"none"`` nor ``"tanh"``, ``x`` is not a
            floating-point register tile, or ``out`` does not fit (the message names the
            kernel, the tile and the source line).

    Example:
        The exact GELU of a loaded tile, and the tanh form::

            @hl.kernel(threads=128)
            def f(a: hl.f32["M", "N"], c: hl.f32["M", "N"], d: hl.f32["M", "N"]):
                x = hl.register(hl.f32, (64, 64))
                hl.copy(a.tile((64, 64), (0, 0)), x)
                hl.copy(hl.gelu(x), c.tile((64, 64), (0, 0)))
                hl.copy(hl.gelu(x, approximate="tanh"), d.tile((64, 64), (0, 0)))

            f.trace()
    """
    fn = GELU_FORMS.get(approximate) if isinstance(approximate, str) else None
    if fn is None:
        ctx, loc = begin("gelu")
        raise ctx.error("gelu", loc,
                        f"approximate must be 'none' (exact, erf) or 'tanh', got {approximate!r}")
    return elementwise(fn, (x,), out=out, opname="gelu")


def _scalars(a: Any, b: Any) -> bool:
    return all(isinstance(x, (int, Expr)) and not isinstance(x, bool) for x in (a, b))


def maximum(a: Any, b: Any, *, out: Tile | None = None) -> Any:
    """The elementwise maximum of two tiles (``hl.max``), or of two integer scalars.

    With a register tile among ``a`` and ``b``: element ``i`` of the result is
    ``max(a[i], b[i])`` after numpy broadcasting (a scalar broadcasts); of a NaN and a number
    it is the number (PTX ``max``, C ``fmaxf``). With two integers or integer ``Expr`` (and no
    ``out``): their maximum, an ``Expr`` when either is one (for sizes and bounds).

    {extremum}

    Example:
        A ReLU, and the maximum of two sizes::

            @hl.kernel(threads=128)
            def relu(a: hl.f32["M", "N"], c: hl.f32["M", "N"]):
                x = hl.register(hl.f32, (64, 64))
                hl.copy(a.tile((64, 64), (0, 0)), x)
                hl.copy(hl.maximum(x, 0.0), c.tile((64, 64), (0, 0)))

            relu.trace()
            assert hl.max(3, 5) == 5
    """
    if out is None and _scalars(a, b):
        return emax(a, b) if isinstance(a, Expr) or isinstance(b, Expr) else max(a, b)
    return elementwise("max", (a, b), out=out, opname="maximum")


def minimum(a: Any, b: Any, *, out: Tile | None = None) -> Any:
    """The elementwise minimum of two tiles (``hl.min``), or of two integer scalars.

    With a register tile among ``a`` and ``b``: element ``i`` of the result is
    ``min(a[i], b[i])`` after numpy broadcasting; of a NaN and a number it is the number
    (PTX ``min``, C ``fminf``). With two integers or integer ``Expr`` (and no ``out``):
    their minimum, an ``Expr`` when either is one.

    {extremum}

    Example:
        Clamp a tile from above, and the minimum of two sizes::

            @hl.kernel(threads=128)
            def clamp(a: hl.f32["M", "N"], c: hl.f32["M", "N"]):
                x = hl.register(hl.f32, (64, 64))
                hl.copy(a.tile((64, 64), (0, 0)), x)
                hl.copy(hl.minimum(x, 6.0), c.tile((64, 64), (0, 0)))

            clamp.trace()
            assert hl.min(3, 5) == 3
    """
    if out is None and _scalars(a, b):
        return emin(a, b) if isinstance(a, Expr) or isinstance(b, Expr) else min(a, b)
    return elementwise("min", (a, b), out=out, opname="minimum")


def where(cond: Tile, a: Any, b: Any, *, out: Tile | None = None) -> Tile:
    """``a`` where the predicate tile ``cond`` holds, else ``b``, elementwise.

    Element ``i`` of the result is ``a[i] if cond[i] else b[i]`` after numpy broadcasting
    of the three operands (scalars broadcast). The ALU function ``select``.

    Args:
        cond: a predicate register tile (a comparison such as ``x < y``).
        a: the value where ``cond`` holds: a register tile or a scalar.
        b: the value elsewhere: a register tile or a scalar (one of ``a``, ``b`` a tile).
        out: a register tile to write into; ``None`` for a new tile.

    Returns:
        The result tile (``out`` when given), of the type of ``a`` and ``b``.

    Raises:
        {raises}

    Example:
        A causal mask over a tile of scores::

            @hl.kernel(threads=128)
            def mask(s: hl.f32["M", "N"], c: hl.f32["M", "N"]):
                x = hl.register(hl.f32, (64, 64))
                hl.copy(s.tile((64, 64), (0, 0)), x)
                rows = hl.iota((64, 64), 0)
                cols = hl.iota((64, 64), 1)
                hl.copy(hl.where(cols <= rows, x, -1e30), c.tile((64, 64), (0, 0)))

            mask.trace()
    """
    return elementwise("select", (cond, a, b), out=out, opname="where")


_PRED_EXAMPLE = """
    Example:
        {what}::

            @hl.kernel(threads=128)
            def f(a: hl.s32["M", "N"], c: hl.s32["M", "N"]):
                x = hl.register(hl.s32, (64, 64))
                hl.copy(a.tile((64, 64), (0, 0)), x)
                keep = {expr}
                hl.copy(hl.where(keep, x, 0), c.tile((64, 64), (0, 0)))

            f.trace()
"""


def equal(a: Any, b: Any) -> Tile:
    """``a == b`` elementwise, as a predicate tile.

    Element ``i`` is true where ``a[i] == b[i]`` after numpy broadcasting (floats compare as
    IEEE: NaN equals nothing, ``-0.0 == +0.0``). The ALU function ``eq``.

    {compare}
    """
    return elementwise("eq", (a, b), opname="equal")


def not_equal(a: Any, b: Any) -> Tile:
    """``a != b`` elementwise, as a predicate tile.

    Element ``i`` is true where ``a[i] != b[i]`` after numpy broadcasting (true where either
    is NaN). The ALU function ``ne``.

    {compare}
    """
    return elementwise("ne", (a, b), opname="not_equal")


def logical_and(a: Any, b: Any) -> Tile:
    """``a and b`` of two predicate tiles, elementwise (also ``a & b``).

    Element ``i`` is true where both ``a[i]`` and ``b[i]`` are, after numpy broadcasting.
    The ALU function ``and``.

    {logic}
    """
    return elementwise("and", (a, b), opname="logical_and")


def logical_or(a: Any, b: Any) -> Tile:
    """``a or b`` of two predicate tiles, elementwise (also ``a | b``).

    Element ``i`` is true where ``a[i]`` or ``b[i]`` is, after numpy broadcasting. The ALU
    function ``or``.

    {logic}
    """
    return elementwise("or", (a, b), opname="logical_or")


def logical_not(a: Any) -> Tile:
    """``not a`` of a predicate tile, elementwise (also ``~a``).

    Element ``i`` is true where ``a[i]`` is false. The ALU function ``not``.

    Args:
        a: a predicate register tile.

    Returns:
        A new predicate register tile of ``a``'s shape.

    Raises:
        {raises}
    """
    return elementwise("not", (a,), opname="logical_not")


#: the arguments, result and errors of the comparisons and of the binary logical functions
_BINARY_PRED = {
    "{compare}": """Args:
        a: a register tile or a scalar.
        b: a register tile or a scalar (one of ``a``, ``b`` a tile; tiles of one type).

    Returns:
        A new predicate (``bool_``) register tile of the broadcast shape.

    Raises:
        {raises}""",
    "{logic}": """Args:
        a: a predicate register tile (or a 0 / 1 scalar).
        b: a predicate register tile (or a 0 / 1 scalar).

    Returns:
        A new predicate register tile of the broadcast shape.

    Raises:
        {raises}""",
}
for _f in (equal, not_equal, logical_and, logical_or):
    for _key, _text in _BINARY_PRED.items():
        _f.__doc__ = (_f.__doc__ or "").replace(_key, _text)
#: the arguments, result and errors of ``hl.maximum`` and ``hl.minimum``
_EXTREMUM = """Args:
        a: a register tile, a number or an integer ``Expr``.
        b: a register tile, a number or an integer ``Expr``.
        out: a register tile to write into (the broadcast shape, the operands' type);
            ``None`` for a new tile.

    Returns:
        The result tile (``out`` when given), or the scalar {which}.

    Raises:
        {raises}"""
for _f, _which in ((maximum, "maximum"), (minimum, "minimum")):
    _f.__doc__ = (_f.__doc__ or "").replace("{extremum}", _EXTREMUM.replace("{which}", _which))
for _f in (abs_, maximum, minimum, where, equal, not_equal, logical_and, logical_or, logical_not):
    _f.__doc__ = (_f.__doc__ or "").replace("{raises}", _TILE_RAISES)
_PRED_EXAMPLES = {
    equal: ("Keep the elements equal to 7", "hl.equal(x, 7)"),
    not_equal: ("Zero the elements equal to 7", "hl.not_equal(x, 7)"),
    logical_and: ("Keep the elements in [0, 10)", "hl.logical_and(x >= 0, x < 10)"),
    logical_or: ("Keep the elements outside [0, 10)", "hl.logical_or(x < 0, x >= 10)"),
    logical_not: ("Keep the non-negative elements", "hl.logical_not(x < 0)"),
}
for _f, (_what, _expr) in _PRED_EXAMPLES.items():
    _f.__doc__ += _PRED_EXAMPLE.format(what=_what, expr=_expr)
