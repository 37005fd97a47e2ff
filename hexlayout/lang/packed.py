"""Packed data: ``hl.bitcast`` (a register tile's bits as another type of one width) and
``hl.unpack`` / ``hl.pack`` (sub-word elements of integer words, along a chosen mode).

The bit operators of integer tiles (``<< >> & | ^ ~``) are ``Tile`` operators
(``hexlayout.lang.tensor``); this module holds what reinterprets values. ``unpack`` and
``pack`` are written with those operators, ``bitcast`` and ``hl.interleave`` /
``hl.reshape``: each thread keeps the sub-elements of the words it holds (the layout of
the unpacked tile is the words' layout recast to the narrower elements).
"""

from __future__ import annotations

from typing import Any

from hexlayout.arch.dtypes import PRED, DType
from hexlayout.ir.functions import alu_function
from hexlayout.ir.tile import Elementwise, SourceLoc
from hexlayout.ir.types import LayoutVar, Scope, TileType

from .checks import as_tile, begin, require_scope
from .context import TraceContext
from .dtypes import canonical
from .ops import cast
from .regroup import interleave, reshape
from .tensor import Tile, describe

__all__ = ["bitcast", "unpack", "pack"]


def bitcast(x: Tile, dtype: DType) -> Tile:
    """Read the bits of a register tile as another element type of the same width:
    ``y[c]`` has the bit pattern of ``x[c]`` (no conversion, no rounding).

    ``f32 <-> s32 / u32``, ``f16 <-> bf16 <-> b16``, ``s8 <-> u8 <-> e4m3 <-> e5m2``, ``s32 <->
    u32``. Predicates and 4-bit types have no register bit pattern of their own and are
    refused. The ALU function ``bitcast``; the result's layout is ``x``'s.

    Args:
        x (Tile): a register tile.
        dtype (DType): the result's element type, as wide as ``x``'s.

    Returns:
        Tile: a new register tile of ``x``'s shape and element type ``dtype``.

    Raises:
        KernelError: called outside a kernel trace; ``x`` is not a register tile;
            ``dtype`` is not an element type, or not as wide as ``x``'s; either is a
            predicate or a 4-bit type.

    Example:
        The sign bit of every f32 element, as an integer::

            @hl.kernel(threads=128)
            def signs(x: hl.f32["N"], y: hl.u32["N"]):
                t = hl.register(hl.f32, (128,))
                hl.copy(x.tile((128,), (0,)), t)
                bits = hl.bitcast(t, hl.u32)
                hl.copy(bits >> 31, y.tile((128,), (0,)))

            signs.trace()
    """
    ctx, loc = begin("bitcast")
    t = as_tile(ctx, "bitcast", loc, x, "x")
    require_scope(ctx, "bitcast", loc, t, "x", (Scope.REGISTER,))
    try:
        dt = canonical(dtype)
    except (ValueError, KeyError, AttributeError):
        raise ctx.error("bitcast", loc, f"{dtype!r} is not an element type") from None
    for d in (t.dtype, dt):
        if d == PRED or d.bits < 8:       # (4-bit register tiles are refused where they are made)
            raise ctx.error("bitcast", loc, f"{d} has no bit pattern of its own in registers "
                            f"(bitcast {describe(t.value)} to {dt})")
    if dt.bits != t.dtype.bits:
        raise ctx.error("bitcast", loc, f"{describe(t.value)} has {t.dtype.bits}-bit elements, {dt} "
                        f"{dt.bits}-bit ones; bitcast keeps the width (hl.cast converts values)")
    v = ctx.new_value(TileType(dt, t.shape, Scope.REGISTER, LayoutVar()), loc, (t.value,))
    ctx.emit(Elementwise(v, alu_function("bitcast"), (t.value,), loc=loc))
    return Tile(v, ctx)


#: what a sub-element of each type is held as in registers (4-bit types have no register type)
_HELD_AS = {"u4": "u8", "s4": "s8"}


def _bits_as(ctx: TraceContext, loc: SourceLoc | None, x: Tile, dt: DType) -> Tile:
    """The low ``dt.bits`` bits of every element of the integer tile ``x``, as ``dt``
    (the ``bitcast`` function on patterns: the destination takes the low bits)."""
    v = ctx.new_value(TileType(dt, x.shape, Scope.REGISTER, LayoutVar()), loc, (x.value,))
    ctx.emit(Elementwise(v, alu_function("bitcast"), (x.value,), loc=loc))
    return Tile(v, ctx)


def _word_and_part(op: str, x: Any, dtype: DType, unpacking: bool) -> tuple[Any, Any, Tile, DType, int]:
    ctx, loc = begin(op)
    t = as_tile(ctx, op, loc, x, "x")
    require_scope(ctx, op, loc, t, "x", (Scope.REGISTER,))
    try:
        dt = canonical(dtype)
    except (ValueError, KeyError, AttributeError):
        raise ctx.error(op, loc, f"{dtype!r} is not an element type") from None
    word = t.dtype if unpacking else dt
    part = dt if unpacking else None
    if word.kind not in ("int", "uint") or word.bits < 8:
        raise ctx.error(op, loc, f"the words must be an integer type of 8 or more bits, not {word}")
    if part is not None and (part == PRED or part.bits >= word.bits or word.bits % part.bits):
        raise ctx.error(op, loc, f"{word} words do not hold a whole number of {part} elements")
    return ctx, loc, t, dt, word.bits


def unpack(x: Tile, dtype: DType, axis: int = -1) -> Tile:
    """The sub-word elements of a tile of integer words, along ``axis``: a ``u32`` tile seen
    as 8 ``u4`` / 4 ``u8`` / 2 ``f16`` values per word.

    Element ``c'`` of the result, with ``c'[axis] = k * c[axis] + i`` (``k`` elements per
    word), is element ``i`` of word ``x[c]``: its bits ``[b i, b (i + 1))`` (``b`` the
    element's width; little-endian, as a vector load of the words would place them), read as
    ``dtype``. 4-bit elements come out as ``u8`` (``u4``: ``[0, 15]``) or ``s8`` (``s4``:
    ``[-8, 7]``, sign-extended), registers having no 4-bit type. Each thread keeps the
    elements of the words it holds: written with shifts, masks, ``bitcast`` and
    ``hl.interleave``.

    Args:
        x (Tile): a register tile of integer words (``u8`` / ``s8`` / ``u32`` / ``s32`` / ``s64``).
        dtype (DType): the element type (``u4``, ``s4``, ``u8``, ``s8``, ``f16``, ``bf16``,
            ``e4m3``, ``e5m2``, ...), narrower than the words and dividing them.
        axis (int): the mode the elements of a word line up along (default the last).

    Returns:
        Tile: a new register tile, ``k`` times longer along ``axis``.

    Raises:
        KernelError: ``x`` is not a register tile of integer words; ``dtype`` does not
            divide the word; ``axis`` is not a mode.

    Example:
        Eight 4-bit values per 32-bit word, converted to f16::

            @hl.kernel(threads=128)
            def nibbles(w: hl.u32["R", "C"], y: hl.f16["R", "C8"]):
                words = hl.register(hl.u32, (64, 8))
                hl.copy(hl.view(w, tile=(64, 8)), words)
                q = hl.unpack(words, hl.u4, axis=1)
                assert q.shape == (64, 64) and q.dtype == hl.u8
                hl.copy(hl.cast(q, hl.f16), hl.view(y, tile=(64, 64)))

            nibbles.trace()
    """
    ctx, loc, t, dt, wbits = _word_and_part("unpack", x, dtype, True)
    if not isinstance(axis, int) or not -t.ndim <= axis < t.ndim:
        raise ctx.error("unpack", loc, f"axis {axis!r} is not a mode of {describe(t.value)}")
    b, k = dt.bits, wbits // dt.bits
    mask = (1 << b) - 1
    parts = []
    for i in range(k):
        bits = (t >> (b * i)) & mask             # the field, whatever the words' signedness
        if dt.name in _HELD_AS:
            held = canonical(_HELD_AS[dt.name])
            if dt.kind == "int":                   # sign-extend the 4-bit field
                bits = (bits ^ (1 << (b - 1))) - (1 << (b - 1))
            parts.append(_cast_int(bits, held))
        elif dt.kind in ("int", "uint"):
            parts.append(_cast_int(bits, dt))      # int -> int wraps: the low bits, two's complement
        else:
            parts.append(_bits_as(ctx, loc, bits, dt))
    return parts[0] if k == 1 else interleave(parts, axis=axis)


def _cast_int(x: Tile, dt: DType) -> Tile:
    return cast(x, dt)


def pack(x: Tile, dtype: DType, axis: int = -1, *, bits: int | None = None) -> Tile:
    """Elements packed into integer words along ``axis``, the inverse of ``hl.unpack``:
    word ``c`` of the result holds elements ``k c[axis] + i`` (``i = 0 .. k-1``) of ``x`` in
    its bits ``[b i, b (i + 1))``.

    ``x``'s elements are packed with their bit patterns. ``dtype`` is the word type; the
    field width is ``x``'s element width, or ``bits`` (``bits=4`` packs the low 4 bits of
    ``u8`` / ``s8`` elements: what ``hl.unpack(w, hl.u4)`` gives back).

    Args:
        x (Tile): a register tile whose extent along ``axis`` is a multiple of ``k``.
        dtype (DType): the word type (``u32``, ``s32``, ``u8``, ...).
        axis (int): the mode whose consecutive elements share a word (default the last).
        bits (int | None): the field width (default ``x``'s element width).

    Returns:
        Tile: a new register tile of words, ``k`` times shorter along ``axis``.

    Raises:
        KernelError: ``x`` is not a register tile; the words are not an integer type
            wider than and divisible by the elements; the extent along ``axis`` is not a
            multiple of ``k``.

    Example:
        Two f16 values per 32-bit word::

            @hl.kernel(threads=128)
            def pairs(y: hl.u32["R", "C"]):
                h = hl.zeros((64, 16), hl.f16)
                words = hl.pack(h, hl.u32, axis=1)
                assert words.shape == (64, 8) and words.dtype == hl.u32
                hl.copy(words, hl.view(y, tile=(64, 8)))

            pairs.trace()
    """
    return _pack(x, dtype, axis, bits)


def _pack(x: Tile, dtype: DType, axis: int, bits: int | None) -> Tile:
    ctx, loc, t, dt, wbits = _word_and_part("pack", x, dtype, False)
    b = t.dtype.bits if bits is None else bits
    if t.dtype == PRED or not isinstance(b, int) or not 0 < b <= t.dtype.bits or b >= wbits or wbits % b:
        raise ctx.error("pack", loc, f"{dt} words do not hold a whole number of {b}-bit elements "
                        f"({describe(t.value)})")
    if not isinstance(axis, int) or not -t.ndim <= axis < t.ndim:
        raise ctx.error("pack", loc, f"axis {axis!r} is not a mode of {describe(t.value)}")
    axis %= t.ndim
    k = wbits // b
    if t.shape[axis] % k:
        raise ctx.error("pack", loc, f"{describe(t.value)} has {t.shape[axis]} elements along mode {axis}, "
                        f"not a multiple of {k} ({k} per {dt} word)")
    shape = list(t.shape)
    grouped = reshape(t, tuple(shape[:axis] + [shape[axis] // k, k] + shape[axis + 1:]))
    index: list[Any] = [slice(None)] * (t.ndim + 1)
    word = None
    for i in range(k):
        index[axis + 1] = i
        part = grouped[tuple(index)]
        field = _bits_as(ctx, loc, part, dt) & ((1 << b) - 1)
        word = field if word is None else word | (field << (b * i))
    return word
