"""The aten ops fusion can put into a kernel, each as tile-language math on f32 register
tiles, and their eager meaning.

``ELEMENTWISE[name](args, kwargs)`` traces the op into the kernel being extended: ``args``
are register tiles (f32), Python numbers or scalar ``Expr`` s (runtime scalar parameters),
``kwargs`` the node's keyword arguments. Every result is f32; a cast node rounds to its
dtype and widens back (``x.to(f16)`` is ``f32(f16(x))``), so the fused kernel computes each
op in f32 where eager rounds after each op to the tensor's dtype (the difference is the
rounding of intermediates: well within 1e-2 of ``max|eager|`` for f16 / bf16).

Math per op (x, y tiles or scalars): add ``x + alpha*y``; sub ``x - alpha*y``; mul, div;
neg ``-x``; relu ``x < 0 ? 0 : x`` (NaN stays NaN); gelu as its ``approximate`` says (``hl.gelu``):
``'none'`` (the default) ``x / 2 * (1 + erf(x / sqrt 2))``, ``'tanh'`` ``x * sigmoid(1.5957691 (x +
0.044715 x^3))``; silu ``x * sigmoid(x)``; sigmoid ``1 / (1 +
exp(-x))``; tanh, exp, log, sqrt, rsqrt, abs; reciprocal ``1 / x``; maximum / minimum;
pow with exponent 2 ``x * x``; clone / alias / detach: ``x``. ``BITWISE``: ``x >> s``
(arithmetic for signed types, as torch's) and ``x & m`` of integer tiles (an integer input is
loaded as it is for them, and their integer result is converted to f32 where another op
reads it): the unpacking of sub-byte weights packed into bytes or words.

``VIEWS``: the shape-only ops (``view``, ``_unsafe_view``, ``reshape``, ``permute``, ``t``,
``transpose``, ``expand``, ``unsqueeze``, ``squeeze``) and ``CASTS`` (dtype changes).
``torch_dtype(name)`` / ``dtype_name(torch dtype)`` translate dtype spellings.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

__all__ = ["ELEMENTWISE", "BITWISE", "CASTS", "VIEWS", "SLICES", "HEAD_OPS", "emit_elementwise", "dtype_name",
           "torch_dtype", "hl_dtype", "is_fusible"]

CASTS = ("aten._to_copy.default", "aten.to.dtype", "prims.convert_element_type.default",
         "aten.to.dtype_layout")
VIEWS = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.permute.default",
         "aten.t.default", "aten.transpose.int", "aten.expand.default", "aten.unsqueeze.default",
         "aten.squeeze.dim", "aten.squeeze.default")
SLICES = ("aten.slice.Tensor",)

_TORCH_NAMES = {"f16": "float16", "bf16": "bfloat16", "f32": "float32", "f64": "float64", "s8": "int8",
                "u8": "uint8", "s16": "int16", "s32": "int32", "s64": "int64", "e4m3": "float8_e4m3fn",
                "e5m2": "float8_e5m2", "pred": "bool"}


def dtype_name(dt: Any) -> str:
    """hexlayout's name of a dtype (``torch.float16``, ``"float16"``, ``"f16"`` -> ``"f16"``)."""
    from hexlayout.arch.dtypes import get_dtype

    return get_dtype(dt).name


def torch_dtype(name: Any) -> Any:
    """The torch dtype of a dtype name (any spelling ``dtype_name`` takes)."""
    import torch

    return getattr(torch, _TORCH_NAMES[dtype_name(name)])


def hl_dtype(name: Any) -> Any:
    """The tile-language element type (a ``DType``) of a dtype name."""
    from hexlayout.arch.dtypes import get_dtype

    return get_dtype(name)


def _is_tile(x: Any) -> bool:
    from hexlayout.lang.tensor import Tile

    return isinstance(x, Tile)


def _sigmoid(x: Any) -> Any:
    import hexlayout.lang as hl

    return 1.0 / (hl.exp(x * -1.0) + 1.0)


def _add(a: list[Any], kw: dict[str, Any], sign: float = 1.0) -> Any:
    alpha = kw.get("alpha", 1)
    x, y = a[0], a[1]
    if alpha != 1:
        y = y * float(alpha)
    if not _is_tile(x):                      # scalar + tile: put the tile first
        return y + x if sign > 0 else (y * -1.0) + x
    return x + y if sign > 0 else x - y


def _binary(fn: Callable[[Any, Any], Any], rfn: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def emit(a: list[Any], kw: dict[str, Any]) -> Any:
        x, y = a[0], a[1]
        return fn(x, y) if _is_tile(x) else rfn(y, x)
    return emit


def _unary(name: str) -> Callable[..., Any]:
    def emit(a: list[Any], kw: dict[str, Any]) -> Any:
        import hexlayout.lang as hl

        return getattr(hl, name)(a[0])
    return emit


def _gelu(a: list[Any], kw: dict[str, Any]) -> Any:
    import hexlayout.lang as hl
    from hexlayout.lang.math import GELU_FORMS

    approximate = a[1] if len(a) > 1 else kw.get("approximate", "none")
    if approximate not in GELU_FORMS:
        raise NotImplementedError(f"gelu with approximate={approximate!r} (only 'none' and 'tanh')")
    return hl.gelu(a[0], approximate=approximate)


def _relu(a: list[Any], kw: dict[str, Any]) -> Any:
    import hexlayout.lang as hl

    return hl.where(a[0] < 0.0, 0.0, a[0])      # NaN stays NaN, as torch.relu


def _pow(a: list[Any], kw: dict[str, Any]) -> Any:
    if a[1] != 2:
        raise NotImplementedError(f"pow with exponent {a[1]!r} (only 2)")
    return a[0] * a[0]


def _minmax(name: str) -> Callable[..., Any]:
    def emit(a: list[Any], kw: dict[str, Any]) -> Any:
        import hexlayout.lang as hl

        x, y = (a[0], a[1]) if _is_tile(a[0]) else (a[1], a[0])
        return getattr(hl, name)(x, y)
    return emit


ELEMENTWISE: dict[str, Callable[[list[Any], dict[str, Any]], Any]] = {
    "aten.add.Tensor": _add, "aten.add.Scalar": _add,
    "aten.sub.Tensor": lambda a, kw: _add(a, kw, -1.0), "aten.sub.Scalar": lambda a, kw: _add(a, kw, -1.0),
    "aten.rsub.Scalar": lambda a, kw: _add([a[1], a[0]], kw, -1.0),
    "aten.mul.Tensor": _binary(lambda x, y: x * y, lambda y, x: y * x),
    "aten.mul.Scalar": _binary(lambda x, y: x * y, lambda y, x: y * x),
    "aten.div.Tensor": _binary(lambda x, y: x / y, lambda y, x: (1.0 / y) * x),
    "aten.div.Scalar": _binary(lambda x, y: x / y, lambda y, x: (1.0 / y) * x),
    "aten.neg.default": lambda a, kw: a[0] * -1.0,
    "aten.relu.default": _relu,
    "aten.gelu.default": _gelu,
    "aten.silu.default": _unary("silu"),
    "aten.sigmoid.default": lambda a, kw: _sigmoid(a[0]),
    "aten.tanh.default": _unary("tanh"),
    "aten.exp.default": _unary("exp"),
    "aten.log.default": _unary("log"),
    "aten.sqrt.default": _unary("sqrt"),
    "aten.rsqrt.default": _unary("rsqrt"),
    "aten.abs.default": _unary("abs"),
    "aten.reciprocal.default": lambda a, kw: 1.0 / a[0],
    "aten.maximum.default": _minmax("maximum"),
    "aten.minimum.default": _minmax("minimum"),
    "aten.pow.Tensor_Scalar": _pow,
    "aten.clone.default": lambda a, kw: a[0],
    "aten.alias.default": lambda a, kw: a[0],
    "aten.detach.default": lambda a, kw: a[0],
}


def _int_tile(x: Any) -> bool:
    return _is_tile(x) and x.dtype.kind in ("int", "uint")


def _bitwise(fn: Callable[[Any, Any], Any]) -> Callable[..., Any]:
    def emit(a: list[Any], kw: dict[str, Any]) -> Any:
        x, y = a[0], a[1]
        if not _int_tile(x) or not (_int_tile(y) or (isinstance(y, int) and not isinstance(y, bool))):
            raise NotImplementedError("a bitwise op of a non-integer tile")
        return fn(x, y)
    return emit


#: integer ops on integer tiles (the unpacking of packed sub-byte weights)
BITWISE: dict[str, Callable[[list[Any], dict[str, Any]], Any]] = {
    **{f"aten.{name}.{ov}": _bitwise(lambda x, y: x >> y)
       for name in ("__rshift__", "bitwise_right_shift") for ov in ("Tensor", "Scalar", "Tensor_Scalar")},
    **{f"aten.{name}.{ov}": _bitwise(lambda x, y: x & y)
       for name in ("__and__", "bitwise_and") for ov in ("Tensor", "Scalar")},
}
ELEMENTWISE.update(BITWISE)


def emit_elementwise(op: str, args: list[Any], kwargs: dict[str, Any]) -> Any:
    """Trace ``op`` on f32 tiles / scalars (see the module docstring); casts included."""
    if op in CASTS:
        import hexlayout.lang as hl

        dt = kwargs.get("dtype") if op != "aten.to.dtype" or len(args) < 2 else args[1]
        if op == "prims.convert_element_type.default" and len(args) > 1:
            dt = args[1]
        x = args[0]
        if dt is None or dtype_name(dt) == "f32":
            return x
        return hl.cast(hl.cast(x, hl_dtype(dt)), hl.f32)
    return ELEMENTWISE[op](args, kwargs)


#: ops of whole heads of the product (``fusion.rope``): an epilogue computes them on a tile of whole heads
HEAD_OPS = ("hexlayout.rope.default",)


def is_fusible(op: str) -> bool:
    """Whether fusion knows ``op`` (an elementwise op, a cast, a view, a column slice or an op
    of whole heads)."""
    return op in ELEMENTWISE or op in CASTS or op in VIEWS or op in SLICES or op in HEAD_OPS
