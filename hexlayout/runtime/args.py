"""Launch arguments: checked against a kernel's parameters before anything runs.

``bind_args(build_or_generated, lowered, tensors, scalars, device=...) -> BoundArgs`` takes
the tensors (torch tensors, or numpy arrays for the emulator) and scalars of one call and
checks, raising ``ArgumentError`` (a ``ValueError``) that names the kernel, the argument
and what was expected:

* tensor vs scalar, and that every parameter is given exactly once;
* device: every tensor on one CUDA device (``device="cuda"``) or on the CPU (``"cpu"``);
* dtype (torch dtype or numpy dtype vs the parameter's ``DType``) and rank;
* shapes: a size variable shared by several tensors (``M`` in ``a`` and ``c``) agrees;
  static extents match;
* strides: the parameter's stride expressions (``a: f16[M, K]`` is row-major contiguous,
  strides ``(K, 1)``), ignoring dimensions of extent 1 as torch does;
* every ``Requirement`` of the lowered program (16-byte aligned data pointers, strides and
  extents multiples of the vector width, TMA: 16-byte aligned base, strides multiples of
  16 bytes; a broken one raises ``MisalignedArgumentError``, which ``emulate`` and the
  ``Launcher`` answer with a build specialized on the call's ``facts``, ``specialize``) and
  the legality of each TMA tensor map (``check_tma``);
* 32-bit limits: the generated code indexes with ``int``.

It evaluates the launch grid from the kernel's grid expressions and lists the kernel
argument values in ``GeneratedKernel.args`` order (pointers, scalars, sizes, then one
``TensorMapParams`` per tensor map).

Everything that depends only on the kernel is precomputed once into a ``_Plan`` (cached
per generated kernel): expressions are compiled to Python lambdas, requirements grouped
per tensor, so a call costs a few microseconds per tensor.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from hexlayout.errors import HexlayoutError
from hexlayout.ir.divisibility import DivisibilityFacts
from hexlayout.ir.expr import BinOp, Const, Expr, Select, UnOp, Var, evaluate, free_vars, to_c
from hexlayout.ir.lowered import LoweredKernel, TmaDesc
from hexlayout.ir.tile import GlobalParam, ScalarParam

from .tensormap import TensorMapParams, tensormap_params

__all__ = ["ArgumentError", "ArgumentTypeError", "MisalignedArgumentError", "BoundArgs", "bind_args",
           "kernel_plan", "torch_dtype", "INT32_MAX", "GRID_LIMITS"]

INT32_MAX = 2**31 - 1
#: CUDA's launch-grid limits (blocks in x, y, z).
GRID_LIMITS = (2**31 - 1, 65535, 65535)


class _NamedArgument(HexlayoutError):
    """An error about argument ``arg`` of ``kernel`` (a kernel or op name): ``detail`` says what."""

    def __init__(self, kernel: str, arg: str | None, detail: str) -> None:
        self.kernel = kernel
        self.arg = arg
        self.detail = detail
        where = f"argument {arg!r}: " if arg else ""
        super().__init__(f"{kernel}: {where}{detail}")


class ArgumentError(_NamedArgument, ValueError):
    """A launch argument does not fit the kernel; ``kernel``, ``arg`` and ``detail`` say how."""


class MisalignedArgumentError(ArgumentError):
    """An argument breaks an alignment the build assumed (a data pointer, a stride, an extent
    or a size in a view origin that its vector accesses need). The launcher answers it with a
    build specialized on the call's divisibility facts (``hexlayout.runtime.specialize``);
    it reaches the user only where no such build exists."""


class ArgumentTypeError(_NamedArgument, TypeError):
    """An argument of the wrong kind (not a tensor where a tensor is expected, a string for a
    number, ...); ``kernel`` (kernel or op), ``arg`` and ``detail`` as in ``ArgumentError``."""


@dataclass
class BoundArgs:
    """One call's checked arguments.

    ``values``: one per ``GeneratedKernel.args`` entry - a data pointer (int) per tensor, the
    scalar value (int or float; 8- and 16-bit float scalars as their bit pattern), the int value of
    each size variable, a ``TensorMapParams`` per tensor map. ``grid``: 3 block counts.
    ``device``: the CUDA device index, or ``"cpu"``. ``sizes``: the value of every variable of
    the kernel's extents, strides and grid by name (scalar parameters included).
    """

    kernel: str
    values: list[Any]
    grid: tuple[int, int, int]
    device: int | str
    sizes: dict[str, int]
    tensors: dict[str, Any] = field(default_factory=dict)
    scalars: dict[str, Any] = field(default_factory=dict)
    tensor_maps: list[TensorMapParams] = field(default_factory=list)

    @property
    def empty(self) -> bool:
        """No block to run (a zero-sized grid dimension)."""
        return 0 in self.grid


# --- dtypes -----------------------------------------------------------------------------------

_TORCH_DTYPES = {
    "f16": "float16", "bf16": "bfloat16", "f32": "float32", "tf32": "float32", "f64": "float64",
    "e4m3": "float8_e4m3fn", "e5m2": "float8_e5m2", "s8": "int8", "u8": "uint8", "s32": "int32",
    "u32": "uint32", "s64": "int64", "b16": "uint16", "pred": "bool", "ue4m3": "uint8",
}


def torch_dtype(dt: Any) -> Any:
    """The torch dtype holding elements of hexlayout ``DType`` ``dt`` (imports torch)."""
    import torch

    try:
        return getattr(torch, _TORCH_DTYPES[dt.name])
    except KeyError:
        raise ValueError(f"element type {dt} has no torch dtype") from None


# --- expressions compiled to Python -------------------------------------------------------------

_PY_BIN = {"+": "+", "-": "-", "*": "*", "//": "//", "%": "%", "&": "&", "|": "|", "^": "^",
           "<<": "<<", ">>": ">>"}
_PY_CMP = {"<": "<", "<=": "<=", "==": "==", "!=": "!=", "&&": "and", "||": "or"}


def _py(e: Any, slots: Mapping[Var, int]) -> str:
    if not isinstance(e, Expr):
        return str(int(e))
    if isinstance(e, Const):
        return str(e.value)
    if isinstance(e, Var):
        return f"v[{slots[e]}]"
    if isinstance(e, BinOp):
        a, b = _py(e.a, slots), _py(e.b, slots)
        if e.op in _PY_BIN:
            return f"({a} {_PY_BIN[e.op]} {b})"
        if e.op in _PY_CMP:
            return f"int({a} {_PY_CMP[e.op]} {b})"
        if e.op in ("min", "max"):
            return f"{e.op}({a}, {b})"
    elif isinstance(e, UnOp):
        return f"int(not {_py(e.a, slots)})"
    elif isinstance(e, Select):
        return f"({_py(e.a, slots)} if {_py(e.cond, slots)} else {_py(e.b, slots)})"
    raise TypeError(f"cannot compile {e!r}")


def _compile(e: Any, slots: Mapping[Var, int]) -> Callable[[list[Any]], Any]:
    """``e`` as ``lambda v: ...`` over the slot list ``v`` (falls back to ``evaluate``)."""
    try:
        return eval(f"lambda v: {_py(e, slots)}", {"min": min, "max": max, "int": int})  # noqa: S307
    except (TypeError, KeyError, SyntaxError):
        inv = {i: var for var, i in slots.items()}
        return lambda v: evaluate(e, {inv[i]: x for i, x in enumerate(v) if x is not None})


def _show(e: Any) -> str:
    return to_c(e) if isinstance(e, Expr) else str(int(e))


# --- the per-kernel plan ------------------------------------------------------------------------

@dataclass(eq=False)
class _Mode:
    """One dimension of a tensor parameter: how its extent / stride is bound or checked."""

    shape_expr: Any
    stride_expr: Any
    shape_bind: int | None       # slot bound from this extent (a bare size Var)
    stride_bind: int | None      # slot bound from this stride (a bare stride Var)
    shape_fn: Callable[[list[Any]], Any]
    stride_fn: Callable[[list[Any]], Any]


@dataclass(eq=False)
class _TensorParam:
    index: int                   # position among the kernel's parameters
    pos: int                     # position among its tensor parameters
    param: GlobalParam
    modes: list[_Mode]
    align: list[tuple[int, str]] = field(default_factory=list)              # (bytes, reason)
    stride_mult: list[tuple[int, int, str]] = field(default_factory=list)   # (mode, elements, reason)
    extent_mult: list[tuple[int, int, str]] = field(default_factory=list)
    stride_bytes: list[tuple[int, int, str]] = field(default_factory=list)  # (mode or -1, bytes, reason)
    torch_dtype: Any = None
    numpy_dtype: Any = None
    max_align: int = 1

    @property
    def signature(self) -> str:
        p = self.param
        return f"{p.name}: {p.dtype}[{', '.join(_show(s) for s in p.shape)}]"


@dataclass(eq=False)
class _ScalarParamSlot:
    index: int
    param: ScalarParam
    slot: int | None


class _Plan:
    """Everything about a kernel's arguments that does not depend on one call."""

    def __init__(self, kernel: LoweredKernel, args: Sequence[Any], requirements: Sequence[Any],
                 grid: Sequence[Any]) -> None:
        self.name = kernel.name
        self.params = list(kernel.params)
        self.names = [p.name for p in self.params]
        slots: dict[Var, int] = {}

        def slot(v: Var) -> int:
            if v not in slots:
                slots[v] = len(slots)
            return slots[v]

        self.scalars: list[_ScalarParamSlot] = []
        for i, p in enumerate(self.params):
            if isinstance(p, ScalarParam):
                self.scalars.append(_ScalarParamSlot(i, p, slot(p.var)))
        self.tensors: list[_TensorParam] = []
        for p in self.params:
            if not isinstance(p, GlobalParam):
                continue
            if len(p.shape) != len(p.stride):
                raise ArgumentError(self.name, p.name,
                                    f"shape {p.shape} and strides {p.stride} differ in rank")
            for e in tuple(p.shape) + tuple(p.stride):
                for v in free_vars(e):
                    slot(v)
        bindable = {slots[s.param.var] for s in self.scalars}
        for i, p in enumerate(self.params):
            if not isinstance(p, GlobalParam):
                continue
            modes = []
            for s, d in zip(p.shape, p.stride):
                sb = slots[s] if isinstance(s, Var) else None
                db = slots[d] if isinstance(d, Var) else None
                bindable |= {x for x in (sb, db) if x is not None}
                modes.append(_Mode(s, d, sb, db, _compile(s, slots), _compile(d, slots)))
            self.tensors.append(_TensorParam(i, len(self.tensors), p, modes))
        unbound = sorted(v.name for v, i in slots.items() if i not in bindable)
        if unbound:
            raise ArgumentError(self.name, None, f"size variable(s) {', '.join(unbound)} appear only inside "
                                "compound extents or strides and cannot be taken from the arguments")
        self.slots = slots
        self.float_slots = {s.slot for s in self.scalars if s.param.dtype.is_float and s.slot is not None}
        self.nslots = len(slots)
        self.var_names = {i: v.name for v, i in slots.items()}
        by_name = {t.param.name: t for t in self.tensors}
        slot_of = {n: i for i, n in self.var_names.items()}
        self.size_mult: list[tuple[int, int, str, str]] = []     # (slot, multiple, reason, tensor)
        for r in requirements:
            t = by_name.get(r.param)
            if t is None:
                raise ArgumentError(self.name, r.param, f"a requirement ({r.kind}) names no tensor parameter")
            if r.kind == "align_bytes":
                t.align.append((int(r.value), r.reason))
            elif r.kind == "stride_multiple":
                for k in _stride_modes(t.param, int(r.mode)):
                    t.stride_mult.append((k, int(r.value), r.reason))
            elif r.kind == "extent_multiple":
                t.extent_mult.append((_vector_mode(t.param, int(r.mode)), int(r.value), r.reason))
            elif r.kind == "stride_bytes_multiple":
                t.stride_bytes.append((int(r.mode), int(r.value), r.reason))
            elif r.kind == "size_multiple":
                if r.size in slot_of:
                    self.size_mult.append((slot_of[r.size], int(r.value), r.reason, r.param))
            else:
                raise ArgumentError(self.name, r.param, f"unknown requirement kind {r.kind!r}")
        self.grid_fns = [_compile(g, slots) for g in grid]
        self.grid_exprs = tuple(grid)
        if len(self.grid_fns) > 3:
            raise ArgumentError(self.name, None, f"a {len(self.grid_fns)}-d grid (at most 3)")
        index = {id(p): i for i, p in enumerate(self.params)}
        tpos = {t.index: t for t in self.tensors}
        self.tensor_pos = {t.index: t.pos for t in self.tensors}
        self.out: list[tuple[str, Any]] = []          # how to produce each kernel argument
        self.maps: list[tuple[TmaDesc, _TensorParam]] = []
        for a in args:
            if a.kind in ("tensor", "scalar"):
                self.out.append((a.kind, index[id(a.obj)]))
            elif a.kind == "size":
                self.out.append(("size", slots[a.obj]))
            elif a.kind == "tensor_map":
                self.out.append(("map", len(self.maps)))
                self.maps.append((a.obj, tpos[index[id(a.obj.param)]]))
            else:
                raise ArgumentError(self.name, a.name, f"unknown kernel argument kind {a.kind!r}")
        # fast-path tables
        self.cache: dict[tuple, BoundArgs] = {}
        self.tensor_names = [t.param.name for t in self.tensors]
        for t in self.tensors:
            t.max_align = max([n for n, _ in t.align] + [16 if any(tp is t for _, tp in self.maps) else 1])
        structural: set[int] = set()
        for e in [*grid] + [x for t in self.tensors for m in t.modes for x in (m.shape_expr, m.stride_expr)]:
            structural |= {slots[v] for v in free_vars(e)}
        self.struct_scalars = [s for s in self.scalars if s.slot in structural]
        out_pos = {(kind, i): pos for pos, (kind, i) in enumerate(self.out)}
        self.free_scalars = [(out_pos.get(("scalar", s.index)), s) for s in self.scalars
                             if s.slot not in structural]
        self.ptr_slots = [(out_pos[("tensor", t.index)], t.pos) for t in self.tensors
                          if ("tensor", t.index) in out_pos]
        self.map_slots = [(out_pos[("map", mi)], mi, t.pos) for mi, (_, t) in enumerate(self.maps)]

    # --- normalizing the call -----------------------------------------------------------------
    def collect(self, tensors: Mapping[str, Any] | Sequence[Any],
                scalars: Mapping[str, Any] | None) -> list[Any]:
        """The value of every parameter, in declaration order."""
        vals: list[Any] = [_MISSING] * len(self.params)
        if isinstance(tensors, Mapping):
            items = list(tensors.items())
        else:
            if len(tensors) > len(self.params):
                raise ArgumentError(self.name, None, f"{len(tensors)} positional arguments, the kernel takes "
                                    f"{len(self.params)}: {', '.join(self.names)}")
            items = list(zip(self.names, tensors))
        if scalars:
            items += list(scalars.items())
        for name, v in items:
            try:
                i = self.names.index(name)
            except ValueError:
                raise ArgumentError(self.name, name,
                                    f"no such parameter; parameters: {', '.join(self.names)}") \
                    from None
            if vals[i] is not _MISSING:
                raise ArgumentError(self.name, name, "given twice")
            vals[i] = v
        for i, v in enumerate(vals):
            if v is _MISSING:
                raise ArgumentError(self.name, self.names[i],
                                    f"missing; the kernel takes {', '.join(self.names)}")
        return vals

    # --- binding -----------------------------------------------------------------------------
    def bind(self, vals: list[Any], device: str) -> BoundArgs:
        """Check ``vals`` (one per parameter) and produce the call's ``BoundArgs``.

        Fast path: a call whose tensors have the dtypes, devices, shapes and strides of an
        earlier checked call (and the same values of scalars that sizes or the grid depend on)
        reuses that call's result; only data pointers (alignment) and scalars are checked anew.
        """
        key = self._key(vals, device)
        if key is not None:
            tpl = self.cache.get(key)
            if tpl is not None:
                out = self._from_template(tpl, vals)
                if out is not None:
                    return out
        ba = self._bind_slow(vals, device)
        if key is not None:
            if len(self.cache) >= _CACHE_LIMIT:
                self.cache.clear()
            self.cache[key] = replace(ba, tensors={})      # the template must not keep tensors alive
        return ba

    def _key(self, vals: list[Any], device: str) -> tuple | None:
        tensor_type = _torch_tensor_type()
        if tensor_type is None:
            return None
        parts: list[Any] = [device]
        for t in self.tensors:
            o = vals[t.index]
            if not isinstance(o, tensor_type):
                return None
            parts += (o.dtype, o.device, o.shape, o.stride())
        for s in self.struct_scalars:
            x = vals[s.index]
            if not isinstance(x, (int, float)):
                return None
            parts.append((type(x), x))
        return tuple(parts)

    def _from_template(self, tpl: BoundArgs, vals: list[Any]) -> BoundArgs | None:
        ptrs = []
        for t in self.tensors:
            ptr = vals[t.index].data_ptr()
            if ptr % t.max_align:
                return None               # the full check names the problem
            ptrs.append(ptr)
        values = list(tpl.values)
        for pos, k in self.ptr_slots:
            values[pos] = ptrs[k]
        scal = dict(tpl.scalars)
        sizes = tpl.sizes
        for pos, sc in self.free_scalars:
            x = _scalar_value(self.name, sc.param, vals[sc.index])
            scal[sc.param.name] = x
            if pos is not None:
                values[pos] = x
            if sizes.get(sc.param.name, x) != x:          # this call's scalar, not the template's
                sizes = sizes if sizes is not tpl.sizes else dict(sizes)
                sizes[sc.param.name] = x
        maps = []
        for pos, mi, k in self.map_slots:
            mp = tpl.tensor_maps[mi]
            mp = _new_tuple(TensorMapParams, mp[:5] + (ptrs[k],) + mp[6:])
            values[pos] = mp
            maps.append(mp)
        return BoundArgs(self.name, values, tpl.grid, tpl.device, sizes,
                         dict(zip(self.tensor_names, (vals[t.index] for t in self.tensors))), scal, maps)

    def facts(self, vals: list[Any], device: str) -> DivisibilityFacts:
        """The call's divisibility facts: per tensor the largest power of two (at most 16)
        dividing its data pointer in bytes, per size or stride variable the one dividing its
        value in elements (``hexlayout.ir.divisibility``). Raises ``ArgumentError`` as
        ``bind`` does for arguments that do not fit the kernel at all."""
        v, _, _, infos, _ = self._sizes(vals, device)
        return DivisibilityFacts.of({t.param.name: ptr for t, _, _, _, ptr in infos},
                                    {self.var_names[i]: x for i, x in enumerate(v)
                                     if isinstance(x, int) and i not in self.float_slots})

    def _sizes(self, vals: list[Any], device: str) -> tuple[list[Any], dict[int, str], dict[str, Any],
                                                            list[Any], int | str | None]:
        """Scalars, tensor infos and the size variables bound from extents and strides."""
        name = self.name
        v: list[Any] = [None] * self.nslots
        src: dict[int, str] = {}
        scal: dict[str, Any] = {}
        for s in self.scalars:
            x = _scalar_value(name, s.param, vals[s.index])
            scal[s.param.name] = x
            if s.slot is not None:
                v[s.slot] = x
                src[s.slot] = f"scalar {s.param.name!r}"
        infos: list[tuple[_TensorParam, Any, tuple[int, ...], tuple[int, ...], int]] = []
        dev: int | str | None = None
        for t in self.tensors:
            obj = vals[t.index]
            shape, strides, ptr, d = _tensor_info(name, t, obj, device)
            if dev is None:
                dev = d
            elif d != dev:
                raise ArgumentError(name, t.param.name, f"is on {_dev_str(d)} but earlier tensors are on "
                                    f"{_dev_str(dev)}; all tensors must be on one device")
            if len(shape) != len(t.modes):
                raise ArgumentError(name, t.param.name,
                                    f"has {len(shape)} dimensions (shape {tuple(shape)}), "
                                    f"expected {len(t.modes)} ({t.signature})")
            infos.append((t, obj, shape, strides, ptr))
        # sizes from extents, then stride variables from strides
        for t, _, shape, _, _ in infos:
            for k, m in enumerate(t.modes):
                i = m.shape_bind
                if i is None:
                    continue
                if v[i] is None:
                    v[i] = shape[k]
                    src[i] = f"dimension {k} of {t.param.name!r}"
                elif v[i] != shape[k]:
                    raise ArgumentError(name, t.param.name, f"dimension {k} is {shape[k]} but size "
                                        f"{self.var_names[i]} is {v[i]} from {src[i]} ({t.signature})")
        for t, _, _, strides, _ in infos:
            for k, m in enumerate(t.modes):
                i = m.stride_bind
                if i is not None and v[i] is None:
                    v[i] = strides[k]
                    src[i] = f"stride {k} of {t.param.name!r}"
        return v, src, scal, infos, dev

    def _bind_slow(self, vals: list[Any], device: str) -> BoundArgs:
        name = self.name
        v, src, scal, infos, dev = self._sizes(vals, device)
        for i, x in enumerate(v):
            if isinstance(x, int) and not -INT32_MAX - 1 <= x <= INT32_MAX and i not in self.float_slots:
                raise ArgumentError(name, None,
                                    f"size {self.var_names[i]} = {x} (from {src.get(i)}) does not "
                                    "fit the kernel's 32-bit int")
        for t, _, shape, strides, ptr in infos:
            self._check_tensor(t, shape, strides, ptr, v)
        for i, w, why, pname in self.size_mult:
            if isinstance(v[i], int) and v[i] % w:
                raise MisalignedArgumentError(name, pname, f"size {self.var_names[i]} is {v[i]} "
                                              f"(from {src.get(i)}), expected a multiple of {w} ({why})"
                                              f"{_ALIGN_HINT}")
        grid = [int(f(v)) for f in self.grid_fns]
        for k, g in enumerate(grid):
            if not 0 <= g <= GRID_LIMITS[k]:
                raise ArgumentError(name, None,
                                    f"grid dimension {'xyz'[k]} = {g} ({_show(self.grid_exprs[k])}) "
                                    f"is outside [0, {GRID_LIMITS[k]}]")
        grid3 = (tuple(grid) + (1, 1, 1))[:3]
        maps: list[TensorMapParams] = []
        for desc, t in self.maps:
            _, _, shape, strides, ptr = infos[t.pos]
            p = tensormap_params(desc, shape, strides, t.param.dtype.bits // 8, ptr)
            if 0 not in grid3:
                bad = p.problems()
                if bad:
                    raise ArgumentError(name, t.param.name, f"its TMA tensor map {desc.name} is illegal: "
                                        + "; ".join(bad))
            maps.append(p)
        values: list[Any] = []
        for kind, i in self.out:
            if kind == "tensor":
                values.append(infos[self.tensor_pos[i]][4])
            elif kind == "scalar":
                values.append(scal[self.names[i]])
            elif kind == "size":
                values.append(v[i])
            else:
                values.append(maps[i])
        sizes = {self.var_names[i]: x for i, x in enumerate(v)}
        return BoundArgs(name, values, grid3, dev if dev is not None else device, sizes,
                         {t.param.name: obj for t, obj, *_ in infos}, scal, maps)

    def _check_tensor(self, t: _TensorParam, shape: tuple[int, ...], strides: tuple[int, ...], ptr: int,
                      v: list[Any]) -> None:
        name, pname = self.name, t.param.name
        want_shape = tuple(int(m.shape_fn(v)) for m in t.modes)
        if want_shape != tuple(shape):
            exprs = ", ".join(_show(m.shape_expr) for m in t.modes)
            raise ArgumentError(name, pname, f"has shape {tuple(shape)}, expected ({exprs}) = {want_shape} "
                                f"({t.signature})")
        want = tuple(int(m.stride_fn(v)) for m in t.modes)
        if any(w != s and n > 1 for w, s, n in zip(want, strides, shape)):
            exprs = ", ".join(_show(m.stride_expr) for m in t.modes)
            hint = ""
            if want == _contiguous(shape):
                hint = " (row-major contiguous: pass .contiguous())"
            raise ArgumentError(name, pname, f"has strides {tuple(strides)} (elements), expected ({exprs}) = "
                                f"{want}{hint}")
        eb8 = t.param.dtype.bits
        span = 1 + sum((n - 1) * abs(s) for n, s in zip(shape, strides)) if 0 not in shape else 0
        if span > INT32_MAX:
            raise ArgumentError(name, pname,
                                f"spans {span} elements; the generated kernel indexes with 32-bit "
                                "int (at most 2^31 - 1)")
        for nbytes, why in t.align:
            if ptr % nbytes:
                raise MisalignedArgumentError(name, pname,
                                    f"data pointer {ptr:#x} is not {nbytes}-byte aligned (needed for "
                                    f"{why}); pass a copy (.clone()) or a freshly allocated tensor "
                                    "(.contiguous() keeps a contiguous view's offset)")
        for k, w, why in t.stride_mult:
            if shape[k] > 1 and strides[k] % w:
                raise MisalignedArgumentError(name, pname,
                                    f"stride {k} is {strides[k]} elements, expected a multiple of "
                                    f"{w} ({why}){_ALIGN_HINT}")
        for k, w, why in t.extent_mult:
            if shape[k] % w:
                raise MisalignedArgumentError(name, pname, f"dimension {k} is {shape[k]}, expected a "
                                              f"multiple of {w} ({why}){_ALIGN_HINT}")
        for k, nbytes, why in t.stride_bytes:
            ks = range(len(shape)) if k < 0 else (k,)
            for j in ks:
                if shape[j] > 1 and strides[j] != 1 and (strides[j] * eb8 // 8) % nbytes:
                    raise MisalignedArgumentError(name, pname,
                                        f"stride {j} is {strides[j] * eb8 // 8} bytes, expected a "
                                        f"multiple of {nbytes} bytes ({why})")


_MISSING = object()
_ALIGN_HINT = ("; a Build (hexlayout.runtime.build) specializes itself on such a call's alignment; "
               "for a bare lowered program declare the tensor's alignment in the kernel "
               "(e.g. hl.f16[T, I].aligned(2)): the kernel then uses vectors no wider than that")


def _unit_modes(p: GlobalParam) -> list[int]:
    return [k for k, d in enumerate(p.stride) if not isinstance(d, Expr) and int(d) == 1
            or isinstance(d, Const) and d.value == 1]


def _vector_mode(p: GlobalParam, mode: int) -> int:
    """The tensor mode an ``extent_multiple`` requirement constrains.

    The lowering numbers requirement modes by the modes of the tile *view* it copies, which
    differ from the tensor's when the view spans fewer modes (a (Sq, D) tile of a
    (B, Sq, H, D) tensor). The vector mode is the one of unit stride, so the tensor's unique
    unit-stride mode is taken; otherwise ``mode`` as given.
    """
    units = _unit_modes(p)
    return units[0] if len(units) == 1 else mode


def _stride_modes(p: GlobalParam, mode: int) -> list[int]:
    """The tensor modes a ``stride_multiple`` requirement constrains: every mode without a
    unit stride (a view's origin moves along the modes it does not span too, so their strides
    must keep vectors aligned as well); ``mode`` alone when no unit-stride mode is known."""
    units = _unit_modes(p)
    if len(units) != 1:
        return [mode] if 0 <= mode < len(p.stride) else []
    return [k for k in range(len(p.stride)) if k != units[0]]
_CACHE_LIMIT = 256
_new_tuple = tuple.__new__


def _torch_tensor_type() -> Any:
    """``torch.Tensor`` if torch is imported (never imports it)."""
    import sys

    mod = sys.modules.get("torch")
    return getattr(mod, "Tensor", None) if mod is not None else None


def _contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    out, acc = [], 1
    for n in reversed(shape):
        out.append(acc)
        acc *= max(n, 1)
    return tuple(reversed(out))


def _dev_str(d: int | str | None) -> str:
    return f"cuda:{d}" if isinstance(d, int) else str(d)


_INT_RANGES = {"s8": (-2**7, 2**7 - 1), "u8": (0, 2**8 - 1), "s32": (-2**31, 2**31 - 1),
               "u32": (0, 2**32 - 1), "s64": (-2**63, 2**63 - 1), "b16": (0, 2**16 - 1), "pred": (0, 1)}


def _scalar_value(kernel: str, p: ScalarParam, x: Any) -> Any:
    """A Python int / float for scalar parameter ``p`` (8/16-bit floats: their bit pattern)."""
    dt = p.dtype
    if type(x) is float and dt.is_float and dt.bits >= 32:     # the common case, per launch
        return x
    import numbers

    if hasattr(x, "shape") and not isinstance(x, numbers.Number):
        if getattr(x, "shape", None) == () and type(x).__module__.startswith("numpy"):
            x = x.item()
        else:
            raise ArgumentError(kernel, p.name, f"expected a scalar ({dt}), got a {type(x).__name__} "
                                f"of shape {tuple(x.shape)}; pass a Python number")
    if dt.is_float:
        if not isinstance(x, numbers.Real) or isinstance(x, bool):
            raise ArgumentError(kernel, p.name, f"expected a float scalar ({dt}), got {type(x).__name__} "
                                f"{x!r}")
        f = float(x)
        if dt.bits in (8, 16):
            import numpy as np

            return int(np.array(f, dtype=dt.numpy()).view(np.uint8 if dt.bits == 8 else np.uint16))
        return f
    if isinstance(x, bool) and dt.name != "pred":
        raise ArgumentError(kernel, p.name, f"expected an integer scalar ({dt}), got a bool")
    if not isinstance(x, numbers.Integral):
        raise ArgumentError(kernel, p.name,
                            f"expected an integer scalar ({dt}), got {type(x).__name__} {x!r}")
    lo, hi = _INT_RANGES.get(dt.name, (-2**31, 2**31 - 1))
    if not lo <= int(x) <= hi:
        raise ArgumentError(kernel, p.name, f"{int(x)} is outside the range of {dt} [{lo}, {hi}]")
    return int(x)


def _tensor_info(kernel: str, t: _TensorParam, obj: Any, device: str
                 ) -> tuple[tuple[int, ...], tuple[int, ...], int, int | str]:
    """(shape, strides in elements, data pointer, device) of a torch tensor or numpy array."""
    p = t.param
    if p.dtype.bits % 8:
        raise ArgumentError(kernel, p.name,
                            f"sub-byte element type {p.dtype} is not supported by the launcher")
    mod = type(obj).__module__
    if mod.startswith("torch"):
        import torch

        if not isinstance(obj, torch.Tensor):
            raise ArgumentError(kernel, p.name,
                                f"expected a tensor ({t.signature}), got {type(obj).__name__}")
        if t.torch_dtype is None:
            t.torch_dtype = torch_dtype(p.dtype)
        if obj.dtype != t.torch_dtype:
            raise ArgumentError(kernel, p.name,
                                f"has dtype {obj.dtype}, expected {t.torch_dtype} ({p.dtype})")
        dv = obj.device
        if device == "cuda":
            if dv.type != "cuda":
                raise ArgumentError(kernel, p.name,
                                    f"is on {dv}, expected a CUDA device (for the CPU emulator "
                                    "use hexlayout.runtime.emulate)")
            d: int | str = dv.index if dv.index is not None else 0
        else:
            if dv.type != "cpu":
                raise ArgumentError(kernel, p.name, f"is on {dv}, expected the CPU (the emulator runs on "
                                    "host memory)")
            d = "cpu"
        return tuple(obj.shape), tuple(obj.stride()), obj.data_ptr(), d
    if mod == "numpy" and hasattr(obj, "strides") and hasattr(obj, "dtype"):
        if device == "cuda":
            raise ArgumentError(kernel, p.name, "is a numpy array (host memory), expected a CUDA tensor")
        if t.numpy_dtype is None:
            import numpy as np

            t.numpy_dtype = np.dtype(p.dtype.numpy())
        if obj.dtype != t.numpy_dtype:
            raise ArgumentError(kernel, p.name,
                                f"has dtype {obj.dtype}, expected {t.numpy_dtype} ({p.dtype})")
        isz = obj.itemsize
        if any(s % isz for s in obj.strides):
            raise ArgumentError(kernel, p.name,
                                f"byte strides {obj.strides} are not multiples of the element size")
        return tuple(obj.shape), tuple(s // isz for s in obj.strides), int(obj.ctypes.data), "cpu"
    if isinstance(obj, (int, float, bool)):
        raise ArgumentError(kernel, p.name, f"expected a tensor ({t.signature}), got the scalar {obj!r}")
    raise ArgumentError(kernel, p.name, f"expected a tensor ({t.signature}), got {type(obj).__name__}")


# --- the entry point ------------------------------------------------------------------------------

_PLANS: dict[tuple[int, int], tuple[Any, Any, _Plan]] = {}


def _unpack(build_or_generated: Any, lowered: Any) -> tuple[Any, LoweredKernel, list[Any]]:
    gen = getattr(build_or_generated, "generated", build_or_generated)
    if lowered is None:
        syn = getattr(build_or_generated, "synthesis", None)
        if syn is None:
            raise TypeError("bind_args needs the lowered program when given a GeneratedKernel")
        lowered = syn.lowered
    if isinstance(lowered, LoweredKernel):
        return gen, lowered, []
    return gen, lowered.kernel, list(getattr(lowered, "requirements", []))


def kernel_plan(build_or_generated: Any, lowered: Any = None) -> _Plan:
    """The cached argument plan of a ``Build`` (or ``GeneratedKernel`` + lowered program)."""
    gen = getattr(build_or_generated, "generated", build_or_generated)
    key = (id(gen), id(lowered))
    hit = _PLANS.get(key)
    if hit is not None and hit[0] is gen and hit[1] is lowered:
        return hit[2]
    gen, kernel, reqs = _unpack(build_or_generated, lowered)
    plan = _Plan(kernel, gen.args, reqs, gen.grid)
    _PLANS[key] = (gen, lowered, plan)
    return plan


def bind_args(build_or_generated: Any, lowered: Any = None,
              tensors: Mapping[str, Any] | Sequence[Any] = (), scalars: Mapping[str, Any] | None = None,
              *, device: str = "cuda") -> BoundArgs:
    """Check one call's arguments against the kernel and compute the grid and argument values.

    ``build_or_generated``: a ``Build`` (``lowered`` may then be ``None``) or a
    ``GeneratedKernel`` with ``lowered`` its ``LoweredProgram`` (requirements checked) or
    ``LoweredKernel``. ``tensors``: name -> value, or the parameters in declaration order
    (scalars may be among them); ``scalars``: more name -> value. ``device``: ``"cuda"``
    (launch: all tensors on one CUDA device) or ``"cpu"`` (emulation). Raises
    ``ArgumentError``.
    """
    if device not in ("cuda", "cpu"):
        raise ValueError(f"device must be 'cuda' or 'cpu', not {device!r}")
    plan = kernel_plan(build_or_generated, lowered)
    return plan.bind(plan.collect(tensors, scalars), device)
