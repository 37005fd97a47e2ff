"""Accumulators handed from one warp role to another (sm_100a, the accumulator in TMEM).

A tcgen05 mma keeps its accumulator in tensor memory; its register tile only names the values
the threads that *read* it get with ``tcgen05.ld``. So the threads issuing the mma (one elected
thread of a warp-group role, the MMA issuer) need not be the threads reading it (the epilogue
warp groups): the accumulator is *handed off* when an op other than an mma on it (a read, a
write) runs in another warp-group region than the mma. Then:

* the register tile belongs to the readers: its TV layout spreads over the reading region's
  ``T = 128 G`` threads and the tcgen05 tiling is chosen for ``T`` threads (``tcgen05.ld`` of
  warp ``w`` of the readers: lanes ``32 (w % 4)`` ..);
* nothing orders the readers' loads after the MMAs but the author's barriers: the MMA role
  commits onto a barrier (``hl.arrive(acc_full, s, who="mma")``) that the readers wait on
  before reading, and the readers arrive on a barrier (``acc_empty``) that the MMA role waits
  on before its next MMA into the same columns. The emulator checks both orders (a read before
  the commit's arrival was observed, an MMA into cells a load read without the MMA's issuer
  having observed that load).

Example:
    >>> import hexlayout.lang as hl
    >>> M, N, K = hl.dims("M N K")
    >>> @hl.kernel(threads=256, name="handoff_doc")
    ... def k(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
    ...     sa, sb = hl.shared(hl.f16, (128, 64)), hl.shared(hl.f16, (64, 64))
    ...     acc = hl.register(hl.f32, (128, 64))
    ...     with hl.warp_group(0):
    ...         hl.mma(sa, sb, acc, accumulate=False)
    ...     with hl.else_():
    ...         hl.copy(acc, c.tile((128, 64), (0, 0)))
    >>> tk = k.trace()
    >>> br = tk.body.ops[-1]
    >>> regions = {id(o): (0, 128) for o in br.then_body.walk()}
    >>> regions.update({id(o): (128, 256) for o in br.else_body.walk()})
    >>> list(handoff_regions(tk, regions).values())
    [(128, 256)]
"""

from __future__ import annotations

from typing import Any

from .tile import Alloc, Mma, TileKernel
from .types import Scope

__all__ = ["handoff_regions"]


def handoff_regions(tk: TileKernel, regions: dict[int, Any]) -> dict[int, tuple[int, int]]:
    """Per mma uid (an mma with a shared operand: tcgen05 on sm_100a) whose accumulator is handed
    off, the thread range ``[lo, hi)`` of its readers: the region of the first op (in program
    order) that names the accumulator's tile other than as an mma's accumulator or its
    allocation, when that region differs from the mma's (``regions``: ``id(op)`` -> range; an op
    absent runs on every thread)."""
    everyone = (0, tk.launch.threads)
    ops = list(tk.body.walk())
    out: dict[int, tuple[int, int]] = {}
    for op in ops:
        if not isinstance(op, Mma) or Scope.SHARED not in (op.a.type.scope, op.b.type.scope):
            continue
        mine = tuple(regions.get(id(op), everyone))
        rid = op.c.root.id
        for o in ops:
            if isinstance(o, Alloc) or (isinstance(o, Mma) and o.c.root.id == rid):
                continue
            if o.blocks() or not any(v.root.id == rid for v in o.values()):
                continue
            theirs = tuple(regions.get(id(o), everyone))
            if theirs != mine:
                out[op.uid] = (int(theirs[0]), int(theirs[1]))
            break
    return out
