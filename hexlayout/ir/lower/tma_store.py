"""TMA store (sm_90a): a shared tile written to global memory by ``cp.async.bulk.tensor`` stores.

``hl.copy(shared_tile, global_view)`` on an architecture with TMA is lowered, when the
shared layout is one TMA reads, to

1. ``fence.proxy.async.shared::cta`` by every thread of the region: the tile was written
   through the generic proxy (``st.shared`` / ``stmatrix``), TMA reads it through the async
   proxy; each writer's fence orders its writes before the barrier that follows;
2. a barrier of the region (the elected thread must see every thread's fenced writes);
3. one ``cp.async.bulk.tensor.Nd.global.shared::cta.bulk_group`` per box, by the elected
   thread; the box geometry and the shared layout it requires are exactly those of a TMA load
   of the same tiles in the other direction (``lower_tma_load``: box ``b`` at a
   period-aligned start ``s_b``, element ``e`` of the box at ``s_b + Sw(e0 + B0*(e1 + ...))``);
4. ``cp.async.bulk.commit_group`` and ``cp.async.bulk.wait_group.read 0`` by the elected
   thread: once it returns the shared tile may be written again (the elected thread
   reaches the program's next barrier only after the wait, so every thread is ordered).

Elements outside the tensor are not written: TMA clips the box at the tensor's bounds, and a
plain view's extent per mode is ``min(tile, shape - origin)``, the same bound. Gathered views
(rows through an index tile) cannot be stored by TMA. The tensor map is a ``TmaDesc`` kernel
parameter, encoded on the host like a load's.
"""

from __future__ import annotations

from ..lowered import (
    BarSync,
    FenceProxyAsync,
    Instr,
    MbarRef,
    TmaLoad,
    TmaStore,
    TmaStoreCommit,
    TmaStoreWait,
)
from .copy import CopyPlan, lower_tma_load
from .copy_rules import COPY_RULES, CopyContext, CopyRule, ViaRegistersRule
from .rejection import Rejection

__all__ = ["TmaStoreRule", "lower_tma_store"]

NAME = "SM90_TMA_STORE"


def lower_tma_store(ctx: CopyContext, barrier: BarSync) -> CopyPlan | Rejection:
    """The plan of a TMA store of ``ctx.src`` (shared) into ``ctx.dst`` (a global view)."""
    src, dst = ctx.src, ctx.dst
    if dst.gather is not None:
        return Rejection("TMA cannot scatter rows through an index tile", instruction=NAME)
    # the geometry of a load of dst into src is the geometry of this store (no barrier is
    # used: the load's instructions are only read for their boxes and coordinates)
    res = lower_tma_load(dst, src, MbarRef("unused"), ctx.elect, ctx.elem_bits, f"tma_{dst.param.name}")
    if isinstance(res, str):
        return Rejection(f"TMA store of %{ctx.names[0]} into %{ctx.names[1]}: {res}",
                         layouts=(("shared", src.full_layout),), instruction=NAME)
    load, desc = res
    stores: list[Instr] = [TmaStore(desc, ins.coords, ins.dst, pred=ctx.elect)
                           for ins in load.instrs if isinstance(ins, TmaLoad)]
    instrs: list[Instr] = [FenceProxyAsync(), barrier, *stores,
                           TmaStoreCommit(pred=ctx.elect), TmaStoreWait(0, pred=ctx.elect)]
    plan = CopyPlan(instrs, NAME, load.vector_elems, load.requirements)
    plan.desc = desc
    return plan


class TmaStoreRule(CopyRule):
    """``SM90_TMA_STORE``: shared -> global by TMA box stores (architectures with TMA), preferred
    to loads and stores through registers where the shared layout is one TMA reads."""

    family = "tma store"

    def instructions(self, ctx: CopyContext) -> list[str]:
        if ctx.scopes != ("shared", "global") or not ctx.arch.has_tma:
            return []
        if ctx.want is not None and ctx.want != NAME:
            return []
        return [NAME]

    def lower(self, ctx: CopyContext, name: str) -> CopyPlan | Rejection:
        if ctx.barrier is None:
            return Rejection("a TMA store needs a barrier of the threads that wrote the tile (none for a "
                             "copy under a condition)", instruction=name)
        return lower_tma_store(ctx, ctx.barrier())


def register() -> TmaStoreRule:
    """Register the rule once (ahead of the memory-to-memory copies through registers)."""
    for rule in COPY_RULES:
        if isinstance(rule, TmaStoreRule):
            return rule
    return COPY_RULES.register(TmaStoreRule(), before=ViaRegistersRule)  # type: ignore[return-value]


register()
