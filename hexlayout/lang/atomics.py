"""Atomic additions into global memory, for combining the results of several blocks."""

from __future__ import annotations

from hexlayout.ir.atomic import AtomicAdd
from hexlayout.ir.types import Scope

from .checks import as_tile, begin
from .tensor import Tile, describe

__all__ = ["atomic_add"]


def atomic_add(dst: Tile, src: Tile) -> None:
    """Add register tile ``src`` into global tile ``dst`` atomically: ``dst[c] += src[c]``.

    Every element's addition is one atomic ``red.global.add``, so any number of blocks may
    add into the same elements (split-K partial sums, the top-k combine of a mixture of
    experts); the order of the additions is not defined, so floating-point sums may round
    differently from run to run. ``dst`` is a global view, plain or gathered (a scatter-add
    through an index tile, ``hl.atomic_add(y[rows, 0:64], t)``); elements outside the
    tensor are skipped. f32 adds one element per instruction (round to nearest even,
    subnormals flushed to zero); f16 and bf16 add two adjacent elements per instruction
    (``.f16x2`` / ``.bf16x2``, each element rounded on its own, subnormals kept) where
    the layout allows, else one. bf16 needs sm_90a.

    Args:
        dst (Tile): a global view of f32, f16 or bf16 elements.
        src (Tile): a register tile of ``dst``'s shape and element type.

    Returns:
        None: the op is recorded in the kernel being traced.

    Raises:
        KernelError: ``dst`` is not a global view or ``src`` not a register tile; shapes
            or element types differ; the element type has no atomic add.

    Example:
        Split-K: each block adds its partial product into ``c`` (zeroed beforehand)::

            @hl.kernel(threads=128)
            def split_k(a: hl.f16["M", "K"], b: hl.f16["N", "K"], c: hl.f32["M", "N"]):
                kb = hl.grid(hl.spatial(4))
                ra, rb = hl.register(hl.f16, (64, 32)), hl.register(hl.f16, (64, 32))
                hl.copy(a.tile((64, 32), (0, kb * 32)), ra)
                hl.copy(b.tile((64, 32), (0, kb * 32)), rb)
                acc = hl.zeros((64, 64), hl.f32)
                hl.mma(ra, rb, acc)
                hl.atomic_add(c.tile((64, 64), (0, 0)), acc)

            split_k.trace()
    """
    ctx, loc = begin("atomic_add")
    d = as_tile(ctx, "atomic_add", loc, dst, "dst")
    s = as_tile(ctx, "atomic_add", loc, src, "src")
    if d.value.scope != Scope.GLOBAL:
        raise ctx.error("atomic_add", loc, f"dst {describe(d.value)} must be a global view")
    if s.value.scope != Scope.REGISTER:
        raise ctx.error("atomic_add", loc, f"src {describe(s.value)} must be a register tile")
    if tuple(s.shape) != tuple(d.shape):
        raise ctx.error("atomic_add", loc, f"shapes differ: {describe(s.value)} into {describe(d.value)}")
    if s.dtype != d.dtype:
        raise ctx.error("atomic_add", loc, f"element types differ: {describe(s.value)} into "
                        f"{describe(d.value)}; convert with hl.cast first")
    if s.dtype.name not in ("f32", "f16", "bf16"):
        raise ctx.error("atomic_add", loc, f"red.global.add takes f32, f16 and bf16 elements, not {s.dtype}")
    ctx.emit(AtomicAdd(s.value, d.value, loc=loc))
