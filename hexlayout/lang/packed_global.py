"""4-bit global tensors: kernel arguments declared ``u4[..., N]`` / ``s4[..., N]``.

Storage (the host convention): two elements per byte along the last mode, row-major,
element ``j`` of a row in byte ``j // 2``, even ``j`` in the low nibble (bits 0-3) and odd
``j`` in the high nibble (bits 4-7) -- the order of torch's and numpy's packed int4 and of
CUTLASS's ``int4b_t`` arrays, and the one a little-endian load of wider words sees (nibble
``i`` of a 32-bit word is element ``8 w + i``). The host passes a ``uint8`` tensor whose
last extent is ``N / 2`` (``N`` even); an ``s4`` byte holds two's-complement nibbles.

In the kernel program the argument *is* that byte tensor (a ``u8`` parameter of shape
``[..., N_bytes]``, the size ``N_bytes`` bound from the host tensor; a size ``N`` of other
arguments is a separate size, not checked against it), so the emulator, the
launcher and the code generator address whole bytes only. The language shows the element
view: ``w.dtype`` is ``u4`` / ``s4``, ``w.shape[-1]`` is ``2 * N_bytes``. ``hl.view(w, tile,
origin)`` is a ``PackedView``; ``hl.copy`` from it into a register tile of ``u8`` (``u4``:
``[0, 15]``) or ``s8`` (``s4``: ``[-8, 7]``) loads the bytes (vector loads, 16 bytes = 32
elements per thread where the layout allows) and unpacks them with ``hl.unpack``; ``hl.copy``
of such a tile into a ``PackedView`` packs with ``hl.pack(bits=4)`` and stores the bytes.
The tile's and the origin's last-mode extents must be even: a byte holds two elements, and
no half byte is ever addressed.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hexlayout.arch.dtypes import DType
from hexlayout.ir.expr import ExprLike, Var
from hexlayout.ir.passes.algebra import is_multiple
from hexlayout.ir.tile import GlobalParam, SourceLoc
from hexlayout.ir.types import Scope

from .checks import as_index, begin, static_int, static_shape
from .dtypes import canonical
from .memory import register, view
from .ops import assign, copy
from .packed import pack, unpack
from .tensor import GlobalTensor, Tile, describe, method, shape_str

if TYPE_CHECKING:
    from .context import TraceContext

__all__ = ["PackedGlobalTensor", "PackedView", "packed_param", "copy_packed", "HELD_AS"]

#: the register type a 4-bit element is held as once unpacked (``e2m1``: its code, one per byte)
HELD_AS = {"u4": "u8", "s4": "s8", "e2m1": "e2m1"}


def _row_major(shape: tuple[ExprLike, ...]) -> tuple[ExprLike, ...]:
    """Row-major strides: ``stride[i] = prod(shape[i+1:])``."""
    out: list[ExprLike] = []
    acc: ExprLike = 1
    for s in reversed(shape):
        out.append(acc)
        acc = acc * s
    return tuple(reversed(out))


def packed_param(name: str, dtype: DType, shape: tuple[ExprLike, ...], dims: tuple[Any, ...],
                 stride: Any, align_bytes: int, sizes: dict[str, Var]
                 ) -> tuple[GlobalParam, tuple[ExprLike, ...]]:
    """The byte parameter of a 4-bit argument and its element shape.

    ``shape`` is the declared element shape (resolved), ``dims`` the annotation's entries.
    The last extent must be an even integer or a size name ``N`` (the byte extent is then
    the size ``N_bytes``, bound from the host tensor). Raises ``ValueError`` (the caller
    names the argument) for explicit strides or another last extent.
    """
    if stride is not None:
        raise ValueError(f"{dtype} tensors are stored packed row-major (two elements per byte); "
                         "explicit strides are not supported")
    if not shape:
        raise ValueError(f"a {dtype} tensor needs at least one mode")
    last = shape[-1]
    if isinstance(last, int):
        if last % 2:
            raise ValueError(f"the last extent of a {dtype} tensor must be even (two elements per byte), "
                             f"not {last}")
        nbytes: ExprLike = last // 2
        elems: ExprLike = last
    elif isinstance(last, Var) and str(getattr(dims[-1], "text", dims[-1])).strip() == last.name:
        key = f"{last.name}_bytes"
        if key not in sizes:
            sizes[key] = Var(key, 0, None, kind="size")
        nbytes = sizes[key]
        elems = nbytes * 2
    else:
        raise ValueError(f"the last extent of a {dtype} tensor must be an even integer or a size name, "
                         f"not {dims[-1]!r}")
    bshape = tuple(shape[:-1]) + (nbytes,)
    gp = GlobalParam(name, canonical("u8"), bshape, _row_major(bshape), align_bytes)
    return gp, tuple(shape[:-1]) + (elems,)


class PackedGlobalTensor(GlobalTensor):
    """A ``u4`` / ``s4`` global tensor argument: ``param`` is its byte tensor, the
    properties show the elements (``shape[-1]`` twice the bytes, row-major strides). Its views
    (``hl.view``, ``.tile``) are ``PackedView`` s (``packed_view``)."""

    view_op = "packed_view"

    def __init__(self, param: GlobalParam, ctx: TraceContext, dtype: DType,
                 shape: tuple[ExprLike, ...]) -> None:
        super().__init__(param, ctx)
        self._dtype = dtype
        self._shape = shape

    @property
    def dtype(self) -> DType:
        """The element type (``u4`` or ``s4``)."""
        return self._dtype

    @property
    def shape(self) -> tuple[ExprLike, ...]:
        """The extents in elements (the last one twice the host tensor's)."""
        return self._shape

    @property
    def stride(self) -> tuple[ExprLike, ...]:
        """Row-major element strides."""
        return _row_major(self._shape)

    def __getitem__(self, index: Any) -> Any:
        ctx, loc = begin("load")
        raise ctx.error("load", loc, f"{self._dtype} tensor {self.name}: single 4-bit elements cannot be "
                        "loaded; copy a tile (hl.copy(hl.view(...), register tile))")

    def __repr__(self) -> str:
        return f"GlobalTensor({self.name}: {self._dtype}[{', '.join(str(s) for s in self._shape)}])"


class PackedView:
    """A window of a 4-bit global tensor (``hl.view`` of it): ``shape`` elements at element
    ``origin``; ``bytes`` is the ``u8`` global view of its bytes (last mode halved). ``hl.copy``
    to or from it is ``copy_packed``."""

    copy_op = "copy_packed"

    def __init__(self, tensor: PackedGlobalTensor, shape: tuple[int, ...], bytes_: Tile,
                 loc: SourceLoc | None) -> None:
        self.tensor = tensor
        self.shape = shape
        self.bytes = bytes_
        self.loc = loc

    @property
    def dtype(self) -> DType:
        return self.tensor.dtype

    @property
    def scope(self) -> Scope:
        return Scope.GLOBAL

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def __repr__(self) -> str:
        return f"PackedView({self.tensor.name}: {self.dtype}{shape_str(self.shape)})"


@method("packed_view")
def packed_view(a: PackedGlobalTensor, tile: Any, origin: Any, *, rows: Tile | None,
                valid_rows: ExprLike | None, name: str | None) -> PackedView:
    """``hl.view`` of a 4-bit tensor: checks the last mode's even extent and origin and
    makes the byte view (``tile[-1] / 2`` bytes at byte ``origin[-1] / 2``)."""
    ctx, loc = begin("view")
    shape = static_shape(ctx, "view", loc, tile, f"tile of {a.name}")
    if len(shape) != a.ndim:
        raise ctx.error("view", loc, f"tile {shape_str(shape)} has {len(shape)} modes, tensor {a.name} has "
                        f"{a.ndim}")
    if rows is not None and a.ndim < 2:
        raise ctx.error("view", loc, f"{a.dtype} tensor {a.name}: gathered rows need a second (packed) mode")
    if shape[-1] % 2:
        raise ctx.error("view", loc, f"{a.dtype} tensor {a.name}: the tile's last extent {shape[-1]} must be "
                        "even (two elements per byte; a half byte cannot be addressed)")
    org = list(origin) if isinstance(origin, (tuple, list)) else ([origin] if origin is not None
                                                                   else [0] * a.ndim)
    if len(org) != a.ndim:
        raise ctx.error("view", loc, f"origin {tuple(org)!r} has {len(org)} entries, tensor {a.name} has "
                        f"{a.ndim} modes")
    o = as_index(ctx, "view", loc, org[-1], f"origin of {a.name} mode {a.ndim - 1}")
    so = static_int(o)
    if (so is not None and so % 2) or (so is None and not is_multiple(o, 2)):
        raise ctx.error("view", loc, f"{a.dtype} tensor {a.name}: the origin {o} of the last mode must be "
                        "even (provably, for a symbolic origin: two elements per byte; a half byte cannot "
                        "be addressed)")
    org[-1] = so // 2 if so is not None else o // 2
    bytes_ = view(GlobalTensor(a.param, ctx), tuple(shape[:-1]) + (shape[-1] // 2,), tuple(org), rows=rows,
                  valid_rows=valid_rows, name=name)
    return PackedView(a, shape, bytes_, loc)


@method("copy_packed")
def copy_packed(src: Any, dst: Any, instruction: str | None, mask: Any) -> Tile | None:
    """``hl.copy`` with a ``PackedView`` on one side: a load (bytes loaded, then
    ``hl.unpack``-ed along the last mode: ``w[c] = element c``, ``u8`` for ``u4``, ``s8``
    sign-extended for ``s4``) returned as a new register tile, and written into ``dst``
    too when one is given (``hl.assign``); or a store of a register tile (``hl.pack(bits=4)``
    into bytes, then stored)."""
    ctx, loc = begin("copy")
    load = isinstance(src, PackedView)
    pv, t = (src, dst) if load else (dst, src)
    if load and dst is None:
        raw = register(canonical("u8"), pv.bytes.shape)
        copy(pv.bytes, raw, instruction, mask)
        return unpack(raw, pv.dtype, axis=-1)
    if isinstance(t, PackedView):
        raise ctx.error("copy", loc, f"cannot copy between two 4-bit global views ({src} -> {dst})")
    held = canonical(HELD_AS[pv.dtype.name])
    pair = f"{pv} and {describe(t.value)}" if isinstance(t, Tile) else f"{pv} and {t!r}"
    if not isinstance(t, Tile) or t.scope != Scope.REGISTER:
        raise ctx.error("copy", loc, f"a {pv.dtype} global view copies to or from a register tile of {held} "
                        f"(the unpacked values), not {pair}")
    if t.shape != pv.shape:
        raise ctx.error("copy", loc, f"shapes differ: {pair}")
    if t.dtype != held:
        raise ctx.error("copy", loc, f"element types differ: {pair}; {pv.dtype} values are held in registers "
                        f"as {held}")
    if load:
        raw = register(canonical("u8"), pv.bytes.shape)
        copy(pv.bytes, raw, instruction, mask)
        return assign(t, unpack(raw, pv.dtype, axis=-1))
    copy(pack(t, canonical("u8"), axis=-1, bits=4), pv.bytes, instruction, mask)
    return None
