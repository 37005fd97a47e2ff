"""Tile operations: ``copy``, ``mma``, ``cast``, ``fill`` / ``full`` / ``zeros``, ``reduce``,
``rearrange``, ``iota``, ``assign``.

- ``hl.copy(src, dst, instruction=None, mask=None, mbarrier=None)``: ``dst = src`` for
  tiles of equal shape and element type, between scopes global->register,
  global->shared, shared->register, register->shared, register->global, shared->global.
  ``instruction`` names a copy atom (``hexlayout.arch``) to force, else synthesis picks.
  ``mask``: an ``Expr`` (copy all or nothing) or a predicate tile of the copy's shape.
  ``mbarrier=bars[i]`` (global->shared only): an asynchronous bulk (TMA) copy that
  completes as transaction bytes on that barrier.
- ``hl.mma(a, b, c, atom=None, warps=None)``: ``c += a @ b^T`` with ``a`` (M,K), ``b``
  (N,K) register or shared tiles and ``c`` (M,N) a register accumulator (f32, f16 or
  s32). ``atom`` forces an mma atom, ``warps`` the task mapping of the atom's thread
  groups (warps / warp groups) over the (M/atom_m, N/atom_n) atom tiles.
- ``hl.cast(x, dtype)``: a new register tile of ``dtype`` (round to nearest even).
- ``hl.fill(x, v)``; ``hl.full(shape, v, dtype)``, ``hl.zeros(shape, dtype)``: new
  register tiles (``Alloc`` + ``Fill``).
- ``hl.reduce(x, "sum" | "max" | "min", axis)``: keeps ``axis`` with extent 1, so the
  result broadcasts against ``x``; a ragged view's padding counts as the identity.
  ``hl.sum``, ``hl.max_reduce``, ``hl.min_reduce``.
- ``hl.rearrange(x, layout=hl.auto)``: the same values in a register tile of another
  layout (synthesis routes it through shuffles or shared memory).
- ``hl.iota(shape, axis)``: a register s32 tile whose element at ``c`` is ``c[axis]``.
- ``hl.assign(dst, src)`` (also ``dst[...] = src``): write ``src`` (broadcast) into ``dst``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from hexlayout.arch import get_atom
from hexlayout.arch.copy_atom import CopyAtom
from hexlayout.arch.dtypes import DType, get_dtype
from hexlayout.arch.mma_atom import MmaAtom
from hexlayout.arch.sm100 import block_scaled_kind
from hexlayout.ir.expr import Expr
from hexlayout.ir.mapping import TaskMapping
from hexlayout.ir.mapping import spatial as _spatial
from hexlayout.ir.tile import Alloc, Cast, Copy, Fill, Iota, Mma, Rearrange, Reduce
from hexlayout.ir.types import LayoutVar, Scope, TileType

from .checks import SCOPE_NAMES, as_tile, begin, refuse_sub_byte, require_scope, static_int, static_shape
from .dtypes import canonical, f32, i32
from .layouts import auto, resolve_layout
from .math import elementwise
from .sync import BarrierRef, as_barrier
from .tensor import METHODS, Tile, describe, method, shape_str

__all__ = ["copy", "mma", "cast", "fill", "full", "zeros", "reduce", "sum_", "max_reduce", "min_reduce",
           "rearrange", "iota", "assign"]

G, S, R = Scope.GLOBAL, Scope.SHARED, Scope.REGISTER
_COPY_PAIRS = {(G, R), (G, S), (S, R), (R, S), (R, G), (S, G)}
_SPACE = {G: "gmem", S: "smem", R: "rmem"}


def copy(src: Tile, dst: Tile | None = None, instruction: str | None = None, mask: Any = None,
         mbarrier: BarrierRef | Any = None, multicast: int | None = None, *,
         other: float | None = None, pair_barrier: bool = False) -> Tile | None:
    """Copy tile ``src`` into tile ``dst``: ``dst[c] = src[c]`` for every coordinate ``c``.

    ``src`` and ``dst`` have the same shape and element type, in one of the scope pairs
    global->register, global->shared, shared->register, register->shared, register->global
    and shared->global (a register->register change of layout is ``hl.rearrange``). A global
    view (``hl.view``) with ragged-edge extents reads its out-of-bounds elements as 0 and
    never writes them; those elements are the view's *padding*, and no reduction counts them
    (``hl.reduce`` takes them as its identity, through any elementwise math in between;
    ``hexlayout.ir.padding``). ``other=v`` (a global -> register load, as Triton's ``other``)
    reads them as ``v`` instead, a value like any other that every later op, reductions
    included, takes as it is. Synthesis chooses the instruction (vectorized ld/st.global,
    cp.async, ldmatrix/stmatrix, TMA) and the layouts of both tiles unless they are given.
    A cp.async copy is asynchronous: close its group with ``hl.commit_group()`` and wait
    with ``hl.wait_group(n)`` before reading ``dst``.

    Args:
        src (Tile): the tile read.
        dst (Tile): the tile written; same shape and element type as ``src``.
        instruction (str | None): the name of a copy atom of ``hexlayout.arch`` to use
            (``hexlayout.arch.list_atoms()``, e.g. ``"SM80_CP_ASYNC_CACHEGLOBAL_U128"``);
            its source and destination memory spaces must be those of the two tiles.
            ``None``: synthesis chooses.
        mask (Expr | Tile | None): an integer ``Expr``: the whole copy happens iff it is
            nonzero (a masked-off zero-filling load writes zeros); or a register ``bool_``
            tile of the copy's shape selecting elements (accepted by the language; the
            lowering rejects it for now).
        mbarrier (BarrierRef | None): ``bars[i]`` of an ``hl.mbarrier`` array: the copy is
            an asynchronous global->shared bulk (TMA) copy whose bytes complete on that
            barrier (``hl.arrive(..., tx_bytes=)`` / ``hl.wait``).
        multicast (int | None): with ``mbarrier`` in a kernel with a cluster: a static mask
            of cluster ranks (bit ``r``: CTA ``r``); the TMA load
            (``.multicast::cluster``) writes the tile into ``dst`` of every CTA in the mask and
            completes its bytes on each one's barrier at the same index, so each of them
            expects them (``hl.arrive(..., tx_bytes=)``) although a peer issued the copy.
        other (float | None): a global -> register copy only: the value its out-of-bounds
            (and masked-off) elements read; ``None``: 0, as padding that reductions skip.
        pair_barrier (bool): with ``mbarrier`` in a kernel of 2-CTA clusters
            (``cluster=(2, 1, 1)``, sm_100a): the tile lands in this CTA's ``dst`` but its bytes
            complete on the barrier at the same index of the pair's even CTA (rank 0), as the
            pair's ``tcgen05.mma.cta_group::2`` needs (``cp.async.bulk.tensor.cta_group::2``):
            the even CTA's barrier expects both CTAs' bytes.

    A 4-bit global view (``hl.view`` of a ``u4`` / ``s4`` argument, ``hexlayout.lang.
    packed_global``) copies to or from register tiles of ``u8`` / ``s8``: ``w =
    hl.copy(view)`` returns a new register tile of the unpacked values (``dst`` left out),
    ``hl.copy(tile, view)`` packs and stores.

    Returns:
        Tile | None: ``None`` (the ``Copy`` op is appended to the kernel being traced);
        for a 4-bit global source, the register tile of its values.

    Raises:
        KernelError: called outside a kernel trace; ``src`` or ``dst`` is not a tile (a
            whole global tensor instead of ``a.tile(...)``); the scope pair is not one of
            the six above; the shapes or the element types differ; ``instruction`` is
            unknown, not a copy atom, or copies between other memory spaces; ``mask`` is
            neither an expression nor a register predicate tile of the copy's shape;
            ``mbarrier`` is given for a copy that is not global->shared; ``other`` is given
            for a copy that is not global->register or is not a number of ``dst``'s type.

    Example:
        Stage a tile of ``a`` through shared memory into registers and store it to ``c``::

            @hl.kernel(threads=128)
            def stage(a: hl.f16["M", "K"], c: hl.f16["M", "K"]):
                sa = hl.shared(hl.f16, (64, 32))
                ra = hl.register(hl.f16, (64, 32))
                hl.copy(a.tile((64, 32), (0, 0)), sa)
                hl.syncthreads()
                hl.copy(sa, ra)
                hl.copy(ra, c.tile((64, 32), (0, 0)))

            tk = stage.trace()
            assert [op.name for op in tk.body.ops].count("Copy") == 3

            # a row max of a ragged tile whose padding reads -inf (no select needed, none done)
            @hl.kernel(threads=128)
            def rowmax(x: hl.f32["M", "N"].aligned(4), y: hl.f32["M", 1]):
                r = hl.register(hl.f32, (64, 64))
                hl.copy(x.tile((64, 64), (0, 0)), r, other=float("-inf"))
                hl.copy(hl.max_reduce(r, 1), y.tile((64, 1), (0, 0)))

            tk = rowmax.trace()
            assert tk.body.ops[2].other == float("-inf") and tk.body.ops[3].valid is None
    """
    special = getattr(src, "copy_op", None) or getattr(dst, "copy_op", None)
    if special is not None:                  # a view of a 4-bit global tensor (packed_global)
        return METHODS[special](src, dst, instruction, mask)
    ctx, loc = begin("copy")
    s, d, pair = _copy_tiles(ctx, loc, src, dst, instruction)
    m = None if mask is None else _copy_mask(ctx, loc, mask, s)
    bar, bidx = _copy_barrier_args(ctx, loc, mbarrier, multicast, pair_barrier, s, d, pair)
    fill = None if other is None else _other(ctx, loc, other, s, d, pair)
    ctx.emit(Copy(s.value, d.value, instruction, m, bar, bidx, multicast, loc=loc, other=fill,
                  pair_barrier=bool(pair_barrier)))


def _copy_tiles(ctx: Any, loc: Any, src: Any, dst: Any, instruction: str | None) -> tuple[Tile, Tile, str]:
    """``copy``'s checked ``(src, dst)`` tiles and their description for errors."""
    s = as_tile(ctx, "copy", loc, src, "src")
    d = as_tile(ctx, "copy", loc, dst, "dst")
    pair = f"src {describe(s.value)} and dst {describe(d.value)}"
    _check_copy_tiles(ctx, loc, s, d, pair)
    if instruction is not None:
        _check_copy_instruction(ctx, loc, instruction, s, d, pair)
    return s, d, pair


def _copy_barrier_args(ctx: Any, loc: Any, mbarrier: Any, multicast: int | None, pair_barrier: bool,
                       s: Tile, d: Tile, pair: str) -> tuple[Any, Any]:
    """``copy``'s ``(barrier, index)`` (``(None, 0)`` without ``mbarrier``), with ``multicast`` and
    ``pair_barrier`` checked against it."""
    bar, bidx = (None, 0) if mbarrier is None else _copy_barrier(ctx, loc, mbarrier, s, d, pair)
    if multicast is not None:
        _check_multicast(ctx, loc, multicast, bar)
    if pair_barrier and (bar is None or tuple(ctx.cluster or ()) not in ((2,), (2, 1), (2, 1, 1))):
        raise ctx.error("copy", loc, "pair_barrier=True is for TMA copies (mbarrier=) in a kernel of 2-CTA "
                        "clusters (cluster=(2, 1, 1))")
    return bar, bidx


def _check_copy_tiles(ctx: Any, loc: Any, s: Tile, d: Tile, pair: str) -> None:
    """A copy's tiles: an allowed scope pair, one shape, one element type."""
    if (s.scope, d.scope) not in _COPY_PAIRS:
        hint = " (use hl.rearrange to change a register layout)" if s.scope == d.scope == R else ""
        raise ctx.error("copy", loc, f"cannot copy {SCOPE_NAMES[s.scope]} -> {SCOPE_NAMES[d.scope]}: {pair}; "
                        "allowed: global->register/shared, shared->register/global, register->shared/global"
                        + hint)
    if s.shape != d.shape:
        raise ctx.error("copy", loc, f"shapes differ: {pair}")
    if s.dtype != d.dtype:
        raise ctx.error("copy", loc, f"element types differ: {pair}; convert with hl.cast first")


def _named_atom(ctx: Any, loc: Any, op: str, arg: str, name: str, kind: type) -> Any:
    """The registered atom ``name`` given as ``op``'s ``arg=``, which must be a ``kind``."""
    try:
        atom = get_atom(name)
    except ValueError as e:
        raise ctx.error(op, loc, f"{arg}: {e}") from None
    if not isinstance(atom, kind):
        what = "a copy atom" if kind is CopyAtom else "an mma atom"
        raise ctx.error(op, loc, f"{arg} {name!r} is not {what}")
    return atom


def _check_copy_instruction(ctx: Any, loc: Any, instruction: str, s: Tile, d: Tile, pair: str) -> None:
    """``instruction=``: a copy atom between the two tiles' memory spaces."""
    atom = _named_atom(ctx, loc, "copy", "instruction", instruction, CopyAtom)
    spaces = (_SPACE[s.scope], _SPACE[d.scope])
    if atom.kind != "universal" and (atom.src_space, atom.dst_space) != spaces:
        raise ctx.error("copy", loc, f"instruction {instruction} copies {atom.src_space} -> "
                        f"{atom.dst_space}, "
                        f"but {pair}")


def _copy_barrier(ctx: Any, loc: Any, mbarrier: Any, s: Tile, d: Tile, pair: str) -> tuple[Any, Any]:
    """``mbarrier=``: (the barrier array, the index) of a global->shared bulk (TMA) copy."""
    ref = as_barrier(ctx, "copy", loc, mbarrier)
    if (s.scope, d.scope) != (G, S):
        raise ctx.error("copy", loc, f"mbarrier= is for global->shared bulk (TMA) copies, not {pair}")
    return ref.bar, ref.index


def _copy_mask(ctx: Any, loc: Any, mask: Any, s: Tile) -> Any:
    """``mask=``: an expression as given, or a register predicate tile of the copy's shape (its value)."""
    if isinstance(mask, Tile):
        mt = as_tile(ctx, "copy", loc, mask, "mask")
        if mt.dtype.name != "pred" or mt.shape != s.shape or mt.scope != R:
            raise ctx.error("copy", loc, f"mask {describe(mt.value)} must be a register predicate "
                            "tile of "
                            f"shape {shape_str(s.shape)}")
        return mt.value
    if isinstance(mask, (bool, int, Expr)):
        return mask
    raise ctx.error("copy", loc, f"mask {mask!r} must be an expression or a predicate tile")


def _other(ctx: Any, loc: Any, other: Any, s: Tile, d: Tile, pair: str) -> float:
    """The ``other=`` of a copy, checked: a number of ``d``'s type, a global -> register copy."""
    if (s.scope, d.scope) != (G, R):
        raise ctx.error("copy", loc, f"other= is the value a global -> register load reads out of bounds; "
                        f"not for {pair}")
    if isinstance(other, bool) or not isinstance(other, (int, float)):
        raise ctx.error("copy", loc, f"other={other!r} must be a number")
    if d.dtype.kind in ("int", "uint"):
        if other != other or other in (float("inf"), float("-inf")) or other != int(other):
            raise ctx.error("copy", loc, f"other={other!r} is not an integer of {describe(d.value)}; "
                            "use the type's smallest / largest value")
        bits = d.dtype.bits
        signed = d.dtype.kind == "int"
        lo, hi = (-(1 << (bits - 1)), (1 << (bits - 1)) - 1) if signed else (0, (1 << bits) - 1)
        if not lo <= other <= hi:
            raise ctx.error("copy", loc, f"other={other!r} is outside the range [{lo}, {hi}] of "
                            f"{describe(d.value)}")
        return int(other)
    return float(other)


def _check_multicast(ctx: Any, loc: Any, mask: Any, bar: Any) -> None:
    """``multicast=``: a static CTA mask of the kernel's cluster, on a TMA (mbarrier) copy."""
    from .sync import cluster_size

    size = cluster_size(ctx)
    if size is None:
        raise ctx.error("copy", loc, "multicast= needs a kernel with a cluster (@hl.kernel(cluster=...))")
    if bar is None:
        raise ctx.error("copy", loc, "multicast= is for TMA copies: pass mbarrier= too")
    if not isinstance(mask, int) or isinstance(mask, bool) or not 0 < mask < 1 << size:
        raise ctx.error("copy", loc, f"multicast={mask!r} must be a static mask of CTA ranks in [1, "
                        f"{(1 << size) - 1}] for a cluster of {size}")


_ACC = {"f32", "f16", "s32"}


def mma(a: Tile, b: Tile, c: Tile, atom: str | None = None,
        warps: TaskMapping | tuple[int, ...] | None = None, *, accumulate: bool | Expr = True,
        scale_a: Tile | None = None, scale_b: Tile | None = None, packed: DType | None = None) -> None:
    """Matrix multiply-accumulate: ``c += a @ b^T`` (``c = a @ b^T`` when not ``accumulate``).

    ``c[m, n] += sum_k a[m, k] * b[n, k]`` for ``a`` of shape (M, K), ``b`` of shape
    (N, K) (a (K, N) tile is passed as ``b.T``) and ``c`` of shape (M, N). ``a`` and
    ``b`` are register or shared tiles of the same element type (f16, bf16, tf32/f32, s8
    or u8, or any two fp8 types e4m3/e5m2); ``c`` is a register accumulator of f32 or
    f16 for floating-point inputs, s32 for integer inputs. Within one instruction the
    products are summed in f32 (integers exactly, wrapping to s32) and an f16
    accumulator is rounded to f16 after each instruction. Synthesis picks the mma atom
    (mma.sync or wgmma), the arrangement of warps over the (M, N) atom tiles and the
    operand layouts unless they are given.

    **The pair form** (a kernel launched in 2-CTA clusters, ``cluster=(2, 1, 1)``; sm_100a):
    ``c`` (M, N), ``a`` (M, K) shared or in registers (each CTA's rows, a register ``a`` written to
    each CTA's TMEM or shared buffer, a cluster barrier before the issue), shared ``b`` of N/2 rows:
    ``b`` is this CTA's half of its pair's B (CTAs 2p, 2p + 1); each CTA computes ``c += a @
    concat(b of CTA 2p, b of CTA 2p+1)^T``. Synthesis runs it as one ``tcgen05.mma.cta_group::2``
    (M = 128 rows per CTA, the pair's 256; N up to 256) that the even CTA issues; both CTAs' ``a``
    and ``b`` must be in place (e.g. ``hl.cluster_sync()`` after they are written) before it, and
    each ``b`` stays read until the MMA's ``hl.wgmma_wait``.

    Args:
        a (Tile): the (M, K) left operand, register or shared.
        b (Tile): the (N, K) right operand, register or shared, same element type as ``a``
            (fp8 types may mix).
        c (Tile): the (M, N) register accumulator, f32, f16 or s32; updated in place.
        atom (str | None): the name of an mma atom of ``hexlayout.arch`` to use (e.g.
            ``"SM80_16x8x16_F32F16F16F32_TN"``); its element types must match, M, N and K
            must be multiples of its shape and ``a`` / ``b`` must be in the memory it reads
            (``_SS`` wgmma atoms read both from shared memory). ``None``: synthesis chooses.
        warps (TaskMapping | tuple[int, ...] | None): the task mapping of the atom's thread
            groups (warps, or warp groups for wgmma) over the (M/atom_m, N/atom_n) atom
            tiles; a tuple ``(wm, wn)`` means ``hl.spatial(wm, wn)``. ``None``: synthesized.
        accumulate (bool | Expr): ``True``: ``c += a @ b^T``; ``False``: ``c = a @ b^T``
            (``c``'s earlier values are not read: no zeroed accumulator needed); a scalar
            integer expression (e.g. ``k > 0`` in a k-loop): chosen at run time, nonzero
            accumulates. On wgmma it is the instruction's scale-d operand of the first
            k-step (the first wgmma of a tile writes the accumulator instead of adding to
            registers zeroed before the loop, which would serialize the wgmma pipeline); on
            mma.sync the accumulator is zeroed (or selected) before the first k-step. A
            run-time value must be the same for every thread of the block.
        scale_a (Tile | None): block scales of ``a``: a shared ``u8`` tile of UE8M0 exponents of
            shape (M rounded up to a multiple of 128, K/32) (whole 128-row atoms of the factors'
            layout; rows past M are not read); ``a[m, k]`` counts ``2^(scale_a[m, k // 32] -
            127)`` times (255: NaN). With ``scale_b``, fp8 (e4m3 / e5m2) operands (``b`` shared,
            ``a`` shared or in registers), f32 ``c``: ``c (+)= sum_kb (a[:, kb] * 2^(scale_a[:, kb]
            - 127)) @ (b[:, kb] * 2^(scale_b[:, kb] - 127))^T`` over 32-wide K blocks ``kb``. Only
            sm_100a computes it (the block-scaled ``tcgen05.mma``, kind::mxf8f6f4, factors copied
            to TMEM with ``tcgen05.cp``; synthesis lays out the scale tiles and their TMEM
            columns); elsewhere synthesis refuses the op, naming it.
        scale_b (Tile | None): block scales of ``b``: shared ``u8`` (N rounded up to 128, K/32).
        packed (DType | None): ``hl.e2m1``: ``a`` / ``b`` are ``u8`` (M, K/2) / (N, K/2) tiles of
            packed FP4 (``b`` shared, ``a`` shared or in registers), element ``2j`` in the low
            nibble of byte ``j``; with scales of one factor per ``VS`` K elements
            (``c (+)= sum_k a[:,k] sa[:,k//VS] b[:,k] sb[:,k//VS]``):
            ``u8`` (rows, K/32): MXFP4, UE8M0 (kind::mxf4 scale_vec::2X); ``ue4m3`` (rows, K/16):
            NVFP4 (kind::mxf4nvf4 4X); ``u8`` (rows, K/16): UE8M0 per 16. sm_100a; K % 64 == 0.

    Returns:
        None: the ``Mma`` op is appended to the kernel being traced.

    Raises:
        KernelError: called outside a kernel trace; an operand is not a tile, is not a
            matrix, or is in the wrong scope (``c`` must be a register tile); scales / ``packed``
            no block-scaled MMA takes (e.g. UE4M3 per 32, fp8 with factors per 16); M, N or K
            disagree between ``a``, ``b`` and ``c``; ``a`` and ``b`` differ in element type;
            ``c`` is not f32/f16/s32 or does not match integer/floating inputs; ``atom`` is
            unknown, not an mma atom, of other element types, does not divide the shape or
            reads an operand from the other memory; ``warps`` is not a task mapping or
            needs more warps than the block has; ``accumulate`` is not a bool or a scalar
            integer expression.

    Example:
        One K-step of a GEMM tile with f32 accumulation::

            @hl.kernel(threads=128)
            def step(a: hl.f16["M", "K"], b: hl.f16["N", "K"], c: hl.f32["M", "N"]):
                ra = hl.register(hl.f16, (64, 32))
                rb = hl.register(hl.f16, (64, 32))
                acc = hl.zeros((64, 64), hl.f32)
                hl.copy(a.tile((64, 32), (0, 0)), ra)
                hl.copy(b.tile((64, 32), (0, 0)), rb)
                hl.mma(ra, rb, acc)
                hl.copy(acc, c.tile((64, 64), (0, 0)))

            step.trace()
    """
    ctx, loc = begin("mma")
    pk = _packed(ctx, loc, packed, scale_a, scale_b)
    ta, tb, tc = _mma_tiles(ctx, loc, a, b, c, pk)
    if atom is not None:
        _check_mma_atom(ctx, loc, atom, ta, tb, tc)
    wm = None if warps is None else _mma_warps(ctx, loc, warps)
    acc_flag = _accumulate_flag(ctx, loc, accumulate)
    sa, sb = _block_scales(ctx, loc, ta, tb, tc, scale_a, scale_b, atom, pk)
    ctx.emit(Mma(ta.value, tb.value, tc.value, atom, wm, accumulate=acc_flag, loc=loc, scale_a=sa,
                 scale_b=sb, packed=pk))


def _packed(ctx: Any, loc: Any, packed: Any, scale_a: Any, scale_b: Any) -> str | None:
    """``mma``'s ``packed=``: None or ``hl.e2m1`` (with block scales)."""
    if packed is None:
        return None
    if not isinstance(packed, DType) or packed.name != "e2m1":
        raise ctx.error("mma", loc, f"packed={packed!r}: the only packed operand type is hl.e2m1 (FP4, two "
                        "per byte of a u8 tile)")
    if scale_a is None and scale_b is None:
        raise ctx.error("mma", loc, "packed=hl.e2m1 operands are multiplied by the block-scaled tcgen05.mma "
                        "only: give scale_a and scale_b (UE8M0 per 32 K elements: MXFP4; UE4M3 per 16: "
                        "NVFP4)")
    return "e2m1"


def _mma_tiles(ctx: Any, loc: Any, a: Any, b: Any, c: Any, packed: str | None = None
               ) -> tuple[Tile, Tile, Tile]:
    """``mma``'s operands as tiles: ``a`` / ``b`` in registers or shared memory, ``c`` in
    registers, their shapes and element types checked (``_check_mma_operands``; ``packed``: ``a``
    / ``b`` are shared u8 tiles of packed e2m1 pairs)."""
    ta = as_tile(ctx, "mma", loc, a, "a")
    tb = as_tile(ctx, "mma", loc, b, "b")
    tc = as_tile(ctx, "mma", loc, c, "c")
    require_scope(ctx, "mma", loc, ta, "a", (R, S))
    require_scope(ctx, "mma", loc, tb, "b", (R, S))
    require_scope(ctx, "mma", loc, tc, "c (the accumulator)", (R,))
    if packed is not None:
        for role, t, scopes in (("a", ta, (Scope.SHARED, Scope.REGISTER)), ("b", tb, (Scope.SHARED,))):
            if t.value.type.dtype.name != "u8" or t.value.type.scope not in scopes:
                where = "a shared or register" if role == "a" else "a shared"
                raise ctx.error("mma", loc, f"packed=hl.{packed}: {role} must be {where} u8 tile of packed "
                                f"{packed} pairs (two FP4 values a byte); {role} is {describe(t.value)}")
    _check_mma_operands(ctx, loc, ta, tb, tc, packed)
    return ta, tb, tc


def _accumulate_flag(ctx: Any, loc: Any, accumulate: Any) -> bool | Expr:
    """``mma``'s ``accumulate`` as a bool or a scalar expression (an int ``x``: ``x != 0``)."""
    if isinstance(accumulate, Tile) or not isinstance(accumulate, (bool, int, Expr)):
        raise ctx.error("mma", loc, f"accumulate={accumulate!r:.60} must be True, False or a scalar integer "
                        "expression (e.g. k > 0), not a tile or another value")
    return accumulate if isinstance(accumulate, (bool, Expr)) else accumulate != 0


def _block_scales(ctx: Any, loc: Any, ta: Tile, tb: Tile, tc: Tile, scale_a: Any, scale_b: Any,
                  atom: str | None, packed: str | None = None) -> tuple[Any, Any]:
    """The values of ``mma``'s block-scale tiles (both or neither): shared tiles of shape (M, K/VS)
    and (N, K/VS), rows rounded up to a multiple of 128, for an f32 accumulator: ``u8`` (UE8M0) with
    VS = 32 for fp8 shared operands; for ``packed`` e2m1 operands ``u8`` with VS 32 or 16 or ``ue4m3``
    with VS 16 (``arch.sm100.block_scaled_kind``)."""
    if scale_a is None and scale_b is None:
        return None, None
    if scale_a is None or scale_b is None:
        raise ctx.error("mma", loc, "block scales come in pairs: give both scale_a and scale_b")
    if atom is not None:
        raise ctx.error("mma", loc, f"atom={atom}: a block-scaled mma's atom is chosen by synthesis (leave "
                        "atom= out)")
    if packed is None:
        for role, t, scopes in (("a", ta, (Scope.SHARED, Scope.REGISTER)), ("b", tb, (Scope.SHARED,))):
            if t.value.type.dtype.name not in ("e4m3", "e5m2") or t.value.type.scope not in scopes:
                raise ctx.error("mma", loc, "block scales need fp8 (e4m3 / e5m2) operands, b in shared "
                                "memory and a in shared memory or registers, or u8 tiles of packed e2m1 with "
                                f"packed=hl.e2m1; {role} is {describe(t.value)}")
    if tc.value.type.dtype.name != "f32":
        raise ctx.error("mma", loc, f"block scales need an f32 accumulator; c is {describe(tc.value)}")
    k = ta.shape[1] * (2 if packed else 1)
    step = 64 if packed else 32
    if k % step:
        raise ctx.error("mma", loc, f"K = {k} is not a multiple of the block-scaled MMA's K = {step}")
    tiles = []
    for role, s in (("scale_a", scale_a), ("scale_b", scale_b)):
        t = as_tile(ctx, "mma", loc, s, role)
        require_scope(ctx, "mma", loc, t, role, (S,))
        tiles.append(t)
    sa = tiles[0]
    st = sa.value.type.dtype.name
    cols = sa.shape[1] if sa.ndim == 2 else 0
    vs = k // cols if cols and k % cols == 0 else 0
    fmt = "ue4m3" if st == "ue4m3" else "ue8m0"
    try:
        if st not in ("u8", "ue4m3"):
            raise ValueError("factors are u8 (UE8M0 exponents) or ue4m3 tiles")
        block_scaled_kind(get_dtype(packed or ta.dtype.name), get_dtype(packed or tb.dtype.name), fmt, vs)
    except ValueError as e:
        raise ctx.error("mma", loc, f"scale_a {describe(sa.value)} for a {describe(ta.value)}"
                        f"{' (packed e2m1)' if packed else ''} of K = {k}: {e}") from None
    out = []
    for role, t, n in (("scale_a", tiles[0], ta.shape[0]), ("scale_b", tiles[1], tb.shape[0])):
        rows = -(-n // 128) * 128
        if t.value.type.dtype.name != st or tuple(t.shape) != (rows, k // vs):
            what = "UE4M3 factors" if st == "ue4m3" else "UE8M0 exponents"
            raise ctx.error("mma", loc, f"{role} {describe(t.value)} must be a {st} ({rows}, {k // vs}) tile "
                            f"of {what} (one per row and {vs} K elements)")
        out.append(t.value)
    return out[0], out[1]


def _check_mma_operands(ctx: Any, loc: Any, ta: Tile, tb: Tile, tc: Tile, packed: str | None = None) -> None:
    """An mma's operands: matrices whose M, N, K agree, ``a`` and ``b`` of one element type (or
    two fp8 types), ``c`` an f32 / f16 / s32 accumulator that matches integer or float inputs."""
    for role, t in (("a", ta), ("b", tb), ("c", tc)):
        if t.ndim != 2:
            raise ctx.error("mma", loc, f"{role} {describe(t.value)} must be a matrix (2 modes)")
    (am, ak), (bn, bk), (cm, cn) = ta.shape, tb.shape, tc.shape
    da, db, dc = describe(ta.value), describe(tb.value), describe(tc.value)
    if ak != bk:
        raise ctx.error("mma", loc, f"a {da} but b {db}; K differs ({ak} vs {bk}); b must be (N,K)")
    if am != cm:
        raise ctx.error("mma", loc, f"a {da} but c {dc}; M differs ({am} vs {cm})")
    pair = (cn == 2 * bn and tuple(ctx.cluster or ()) in ((2,), (2, 1), (2, 1, 1))
            and ta.value.type.scope in (R, S) and tb.value.type.scope == S)
    if bn != cn and not pair:
        raise ctx.error("mma", loc, f"b {db} but c {dc}; N differs ({bn} vs {cn})"
                        + ("" if cn != 2 * bn else "; c may have twice b's rows only for a shared b (a "
                           "shared or in registers) in a kernel of 2-CTA clusters (cluster=(2, 1, 1)): the "
                           "pair form"))
    fp8 = {"e4m3", "e5m2"}
    if ta.dtype != tb.dtype and not (ta.dtype.name in fp8 and tb.dtype.name in fp8):
        raise ctx.error("mma", loc, f"a {da} and b {db} have different element types")
    if tc.dtype.name not in _ACC:
        raise ctx.error("mma", loc, f"the accumulator c {dc} must be f32, f16 or s32")
    if (tc.dtype.name == "s32") != (ta.dtype.kind in ("int", "uint") and packed is None):
        raise ctx.error("mma", loc, f"a {da} cannot accumulate into c {dc}")


def _check_mma_atom(ctx: Any, loc: Any, atom: str, ta: Tile, tb: Tile, tc: Tile) -> None:
    """``atom=``: an mma atom of the operands' element types whose shape divides (M, N, K) and
    that reads ``a`` and ``b`` from the memory they are in."""
    (am, ak), (bn, _) = ta.shape, tb.shape
    at = _named_atom(ctx, loc, "mma", "atom", atom, MmaAtom)
    for role, t, want in (("a", ta, at.a_dtype), ("b", tb, at.b_dtype), ("c", tc, at.c_dtype)):
        if t.dtype.name != want.name and not (want.name == "tf32" and t.dtype.name == "f32"):
            raise ctx.error("mma", loc, f"atom {atom} takes {role} as {want}, but {role} is "
                            f"{describe(t.value)}")
    for what, n, d in (("M", am, at.m), ("N", bn, at.n), ("K", ak, at.k)):
        if n % d:
            raise ctx.error("mma", loc, f"atom {atom} is {at.m}x{at.n}x{at.k}: {what}={n} is not a "
                            "multiple "
                            f"of {d}")
    for role, t, src in (("a", ta, at.a_source), ("b", tb, at.b_source)):
        want_scope = S if src == "smem" else R
        if t.scope != want_scope:
            raise ctx.error("mma", loc, f"atom {atom} reads {role} from {SCOPE_NAMES[want_scope]} "
                            "memory, "
                            f"but {role} is {describe(t.value)}")


def _mma_warps(ctx: Any, loc: Any, warps: Any) -> TaskMapping:
    """``warps=``: a task mapping (a tuple of static ints as ``hl.spatial``) the block has warps for."""
    if isinstance(warps, tuple) and all(static_int(w) is not None for w in warps):
        wm = _spatial(*warps)
    elif isinstance(warps, TaskMapping):
        wm = warps
    else:
        raise ctx.error("mma", loc, f"warps={warps!r} must be a task mapping (hl.spatial(...)) or a "
                        "tuple")
    if wm.num_workers * 32 > ctx.threads:
        raise ctx.error("mma", loc, f"warps={wm} needs {wm.num_workers} warps, the block has "
                        f"{ctx.threads // 32}")
    return wm


@method("cast")
def cast(x: Tile, dtype: DType) -> Tile:
    """Convert a register tile to another element type: ``y[c] = dtype(x[c])``.

    Floating-point results are rounded to nearest even (fp8 results saturate to the
    largest finite value, as ``cvt.rn.satfinite``); a floating-point input converted to an
    integer type rounds to nearest even and saturates (NaN -> 0); integer to integer
    wraps. The result is a new register tile of ``x``'s shape whose layout
    synthesis chooses (usually ``x``'s).

    Args:
        x (Tile): a register tile.
        dtype (DType): the result's element type (``hl.f16``, ``hl.bf16``, ``hl.f32``, ...).

    Returns:
        Tile: a new register tile of shape ``x.shape`` and element type ``dtype``.

    Raises:
        KernelError: called outside a kernel trace; ``x`` is not a register tile;
            ``dtype`` is not an element type.

    Example:
        Store an f32 accumulator as f16::

            @hl.kernel(threads=128)
            def store(c: hl.f16["M", "N"]):
                acc = hl.zeros((64, 64), hl.f32)
                out = hl.cast(acc, hl.f16)
                assert out.dtype == hl.f16 and out.shape == (64, 64)
                hl.copy(out, c.tile((64, 64), (0, 0)))

            store.trace()
    """
    ctx, loc = begin("cast")
    t = as_tile(ctx, "cast", loc, x, "x")
    require_scope(ctx, "cast", loc, t, "x", (R,))
    try:
        dt = canonical(dtype)
    except (ValueError, KeyError, AttributeError):
        raise ctx.error("cast", loc, f"{dtype!r} is not an element type") from None
    refuse_sub_byte(ctx, "cast", loc, dt, "register tiles")
    if t.dtype.name == "e2m1" and dt.name not in ("f16", "bf16"):
        raise ctx.error("cast", loc, f"{describe(t.value)} holds e2m1 (FP4) codes, which convert to f16 or "
                        f"bf16 only, not {dt}; cast to f16 / bf16 first")
    v = ctx.new_value(TileType(dt, t.shape, R, LayoutVar()), loc, (t.value,))
    ctx.emit(Cast(v, t.value, loc=loc))
    return Tile(v, ctx)


def _scalar(ctx: Any, op: str, loc: Any, v: Any) -> float:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        try:
            return float(v)
        except (TypeError, ValueError):
            raise ctx.error(op, loc, f"fill value {v!r} must be a number") from None
    return float(v)


def fill(x: Tile, value: float) -> Tile:
    """Set every element of a register or shared tile to one value: ``x[c] = value``.

    ``value`` is converted to ``x``'s element type (round to nearest even). Shared tiles
    are accepted when tracing, but synthesis fills register tiles only for now (a shared
    fill is reported as a ``SynthesisError``).

    Args:
        x (Tile): a register tile (or, when tracing, a shared tile), written in place.
        value (float): the value (a Python number, or anything ``float()`` accepts).

    Returns:
        Tile: ``x`` itself.

    Raises:
        KernelError: called outside a kernel trace; ``x`` is not a register or shared
            tile; ``value`` is not a number.

    Example:
        Reset a running maximum at the start of a row block::

            @hl.kernel(threads=128)
            def reset():
                m = hl.register(hl.f32, (64, 1))
                hl.fill(m, float("-inf"))

            reset.trace()
    """
    ctx, loc = begin("fill")
    t = as_tile(ctx, "fill", loc, x, "x")
    require_scope(ctx, "fill", loc, t, "x", (R, S))
    ctx.emit(Fill(t.value, _scalar(ctx, "fill", loc, value), loc=loc))
    return t


def full(shape: tuple[int, ...] | int, value: float, dtype: DType = f32, layout: Any = auto, *,
         name: str | None = None) -> Tile:
    """A new register tile filled with one value: ``y[c] = value`` for ``c`` in ``shape``.

    Args:
        shape (tuple[int, ...] | int): static positive extents (an int is one mode).
        value (float): the value, converted to ``dtype`` (round to nearest even).
        dtype (DType): the element type; default ``hl.f32``.
        layout (Auto | Layout): ``hl.auto`` (synthesis chooses, hints allowed) or an
            explicit TV layout ``(thread, value) -> index`` (see ``hl.register``).
        name (str | None): the value's name in the IR (default: the assignment target).

    Returns:
        Tile: a new register tile (``Alloc`` followed by ``Fill``).

    Raises:
        KernelError: called outside a kernel trace; ``shape`` is not static and positive;
            ``dtype`` is not an element type; ``value`` is not a number; ``layout`` is not
            a valid register layout for ``shape``.

    Example:
        A row-sum accumulator that starts at one::

            @hl.kernel(threads=128)
            def ones():
                l = hl.full((64, 1), 1.0, hl.f32)
                assert l.shape == (64, 1) and l.dtype == hl.f32

            ones.trace()
    """
    ctx, loc = begin("full")
    shp = static_shape(ctx, "full", loc, shape, "shape")
    try:
        dt = canonical(dtype)
    except (ValueError, KeyError, AttributeError):
        raise ctx.error("full", loc, f"{dtype!r} is not an element type") from None
    refuse_sub_byte(ctx, "full", loc, dt, "register tiles")
    val = _scalar(ctx, "full", loc, value)
    v = ctx.new_value(TileType(dt, shp, R, None), loc, name=name)
    v.type.layout = resolve_layout(ctx, "full", loc, f"%{v.name}", R, shp, layout)
    if isinstance(v.type.layout, LayoutVar) and not v.type.layout.name:
        v.type.layout.name = v.name
    ctx.emit(Alloc(v, loc=loc))
    ctx.emit(Fill(v, val, loc=loc))
    return Tile(v, ctx)


def zeros(shape: tuple[int, ...] | int, dtype: DType = f32, layout: Any = auto, *,
          name: str | None = None) -> Tile:
    """A new register tile of zeros: ``hl.full(shape, 0.0, dtype, layout)``.

    Args:
        shape (tuple[int, ...] | int): static positive extents (an int is one mode).
        dtype (DType): the element type; default ``hl.f32``.
        layout (Auto | Layout): ``hl.auto`` or an explicit TV layout (see ``hl.register``).
        name (str | None): the value's name in the IR (default: the assignment target).

    Returns:
        Tile: a new register tile with every element 0.

    Raises:
        KernelError: as ``hl.full``.

    Example:
        The accumulator of a GEMM tile::

            @hl.kernel(threads=128)
            def init():
                acc = hl.zeros((128, 128), hl.f32)
                assert str(acc.scope) == "register" and acc.shape == (128, 128)

            init.trace()
    """
    return full(shape, 0.0, dtype, layout, name=name)


_REDUCE = ("sum", "max", "min")


def reduce(x: Tile, fn: str, axis: int) -> Tile:
    """Reduce a register tile along one axis, keeping the axis with extent 1.

    For ``fn`` in ``"sum"``, ``"max"``, ``"min"``: ``y[..., 0, ...] = fn_i x[..., i, ...]``
    over the extent of ``axis``. The result has ``x``'s shape with ``shape[axis] = 1`` and
    ``x``'s element type, so it broadcasts against ``x`` (``x - hl.max_reduce(x, 1)``).
    Elements that hold the padding of a ragged view (loaded past the view's in-bounds
    extent, and any math on them) take part as the identity (0, -inf, +inf): ``i`` runs
    over the in-bounds extent only (``hexlayout.ir.padding``); where the language cannot
    follow the padding to the reduction the trace fails (load with ``other=`` or mask with
    ``hl.where``). Sums accumulate in the element type, in an unspecified order. Synthesis
    routes the reduction through in-thread accumulation, warp shuffles and, across warps,
    shared memory.

    Args:
        x (Tile): a register tile.
        fn (str): ``"sum"``, ``"max"`` or ``"min"``.
        axis (int): the mode reduced, static; negative counts from the end.

    Returns:
        Tile: a new register tile of shape ``x.shape`` with ``axis`` of extent 1.

    Raises:
        KernelError: called outside a kernel trace; ``x`` is not a register tile; ``fn``
            is not one of the three; ``axis`` is not a static mode of ``x``.

    Example:
        Row maxima of a score tile::

            @hl.kernel(threads=128)
            def rowmax():
                s = hl.zeros((64, 128), hl.f32)
                m = hl.reduce(s, "max", axis=1)
                assert m.shape == (64, 1)

            rowmax.trace()
    """
    ctx, loc = begin("reduce")
    t = as_tile(ctx, "reduce", loc, x, "x")
    require_scope(ctx, "reduce", loc, t, "x", (R,))
    if fn not in _REDUCE:
        raise ctx.error("reduce", loc, f"unknown reduction {fn!r}; use one of {', '.join(_REDUCE)}")
    ax = static_int(axis)
    if ax is None or not -t.ndim <= ax < t.ndim:
        raise ctx.error("reduce", loc, f"axis {axis!r} out of range for {describe(t.value)}")
    ax %= t.ndim
    shape = tuple(1 if i == ax else s for i, s in enumerate(t.shape))
    v = ctx.new_value(TileType(t.dtype, shape, R, LayoutVar()), loc, (t.value,))
    ctx.emit(Reduce(v, t.value, fn, ax, loc=loc))
    return Tile(v, ctx)


_NAMED_REDUCTION_DOC = """The {what} along ``axis``: ``hl.reduce(x, "{fn}", axis)``.

    ``y[..., 0, ...] = {fn}_i x[..., i, ...]``; the axis stays with extent 1.

    Args:
        x (Tile): a register tile.
        axis (int): the mode reduced, static; negative counts from the end.

    Returns:
        Tile: a new register tile of shape ``x.shape`` with ``axis`` of extent 1.

    Raises:
        KernelError: as ``hl.reduce``.

    Example:
        {example}::

            @hl.kernel(threads=128)
            def {kernel}():
                s = hl.zeros((64, 128), hl.f32)
                r = hl.{name}(s, {axis})
                assert r.shape == {shape}

            {kernel}.trace()
    """


def _named_reduction(fn: str, name: str, what: str, example: str, kernel: str, axis: int,
                     shape: tuple[int, int]) -> Callable[[Tile, int], Tile]:
    """``hl.<name>(x, axis)``: ``hl.reduce(x, fn, axis)``, its docstring's example reducing a
    64x128 tile along ``axis`` to ``shape``."""

    def f(x: Tile, axis: int) -> Tile:
        return reduce(x, fn, axis)

    f.__name__ = f.__qualname__ = name
    f.__doc__ = _NAMED_REDUCTION_DOC.format(what=what, fn=fn, example=example, kernel=kernel, name=name,
                                            axis=axis, shape=shape)
    return f


sum_ = _named_reduction("sum", "sum", "sum", "Row sums (the softmax denominator)", "rowsum", 1, (64, 1))
max_reduce = _named_reduction("max", "max_reduce", "maximum", "Column maxima", "colmax", 0, (1, 128))
min_reduce = _named_reduction("min", "min_reduce", "minimum", "Row minima, last axis by a negative index",
                              "rowmin", -1, (64, 1))


def rearrange(x: Tile, layout: Any = auto) -> Tile:
    """The same values in a new register tile of another layout: ``y[c] = x[c]``.

    Only the distribution over threads changes (e.g. an mma accumulator re-used as the A
    operand of the next mma, or a layout that stores coalesced). Synthesis routes it
    through register moves, warp shuffles or shared memory.

    Args:
        x (Tile): a register tile.
        layout (Auto | Layout): the new TV layout, or ``hl.auto`` (synthesis chooses).

    Returns:
        Tile: a new register tile of ``x``'s shape and element type.

    Raises:
        KernelError: called outside a kernel trace; ``x`` is not a register tile;
            ``layout`` is not a valid register layout for ``x``'s shape.

    Example:
        Hand an accumulator to a layout synthesis picks for its consumer::

            @hl.kernel(threads=128)
            def relayout(c: hl.f32["M", "N"]):
                acc = hl.zeros((64, 64), hl.f32)
                r = hl.rearrange(acc)
                hl.copy(r, c.tile((64, 64), (0, 0)))

            relayout.trace()
    """
    ctx, loc = begin("rearrange")
    t = as_tile(ctx, "rearrange", loc, x, "x")
    require_scope(ctx, "rearrange", loc, t, "x", (R,))
    v = ctx.new_value(TileType(t.dtype, t.shape, R, None), loc, (t.value,))
    v.type.layout = resolve_layout(ctx, "rearrange", loc, f"%{v.name}", R, t.shape, layout)
    if isinstance(v.type.layout, LayoutVar) and not v.type.layout.name:
        v.type.layout.name = v.name
    ctx.emit(Rearrange(v, t.value, loc=loc))
    return Tile(v, ctx)


def iota(shape: tuple[int, ...] | int, axis: int, dtype: DType = i32, layout: Any = auto) -> Tile:
    """A register tile of coordinates: ``y[c] = c[axis]``.

    Useful for masks and index arithmetic (``cols = hl.iota((1, BN), 1) + n0``, then
    ``cols < N``).

    Args:
        shape (tuple[int, ...] | int): static positive extents.
        axis (int): the mode whose coordinate each element holds; negative counts from the end.
        dtype (DType): an integer element type; default ``hl.i32``.
        layout (Auto | Layout): ``hl.auto`` or an explicit TV layout.

    Returns:
        Tile: a new register tile of ``shape`` and element type ``dtype``.

    Raises:
        KernelError: called outside a kernel trace; ``shape`` is not static and positive;
            ``axis`` is not a mode of ``shape``; ``dtype`` is not an integer type.

    Example:
        Column indices of a 64x128 tile, for a causal mask::

            @hl.kernel(threads=128)
            def causal():
                rows = hl.iota((64, 1), 0)
                cols = hl.iota((1, 128), 1)
                keep = cols <= rows
                assert keep.shape == (64, 128)

            causal.trace()
    """
    ctx, loc = begin("iota")
    shp = static_shape(ctx, "iota", loc, shape, "shape")
    ax = static_int(axis)
    if ax is None or not -len(shp) <= ax < len(shp):
        raise ctx.error("iota", loc, f"axis {axis!r} out of range for shape {shape_str(shp)}")
    dt = canonical(dtype)
    if dt.kind not in ("int", "uint"):
        raise ctx.error("iota", loc, f"iota needs an integer element type, not {dt}")
    refuse_sub_byte(ctx, "iota", loc, dt, "register tiles")
    v = ctx.new_value(TileType(dt, shp, R, None), loc)
    v.type.layout = resolve_layout(ctx, "iota", loc, f"%{v.name}", R, shp, layout)
    ctx.emit(Iota(v, ax % len(shp), loc=loc))
    return Tile(v, ctx)


@method("assign")
def assign(dst: Tile, src: Any) -> Tile:
    """Write ``src`` into register tile ``dst``: ``dst[c] = src[c]`` (``src`` broadcast).

    A tile ``src`` broadcasts to ``dst``'s shape as in numpy and must have ``dst``'s
    element type; a scalar is ``hl.fill(dst, src)``. ``dst[...] = src`` and
    ``dst[i, :] = src`` are the same through views. This is how loop-carried register
    state takes a new value (rebinding a Python name does not carry across ``hl.range``
    iterations).

    Args:
        dst (Tile): the register tile written in place.
        src (Tile | float): a register tile broadcastable to ``dst``, or a number.

    Returns:
        Tile: ``dst`` itself.

    Raises:
        KernelError: called outside a kernel trace; ``dst`` is not a register tile (or,
            for a scalar, not a register or shared tile); the shapes do not broadcast or
            the element types differ.

    Example:
        Carry a running maximum across loop iterations::

            @hl.kernel(threads=128)
            def running(n: hl.i32):
                m = hl.full((64, 1), float("-inf"))
                for k in hl.range(n):
                    s = hl.zeros((64, 128), hl.f32)
                    hl.assign(m, hl.maximum(m, hl.max_reduce(s, 1)))

            running.trace()
    """
    if not isinstance(src, Tile):
        return fill(dst, src)
    return elementwise("mov", (src,), out=dst, opname="assign")
