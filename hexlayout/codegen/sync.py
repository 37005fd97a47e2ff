"""Printers of synchronization: mbarriers (init, arrive[.expect_tx], parity wait), block
barriers, the async-proxy fence, ``setmaxnreg`` and the cluster forms (sm_90): an arrive on a
peer CTA's barrier (``mapa`` to its ``shared::cluster`` address, then
``mbarrier.arrive.shared::cluster`` with the default ``.release.cta`` semantics, as CUTLASS's
``ClusterBarrier::arrive(cta_id)``: the arriving consumers' reads are done - wgmma.wait - so
no cluster-scope fence is needed before the peer's TMA overwrites the stage; ``scope="cluster"``
prints ``.release.cluster``, the release of a pair's epilogue whose fenced ``tcgen05.ld`` must
precede the peer CTA's next MMA into the same TMEM columns) and the cluster
barrier (``fence.mbarrier_init``, then ``barrier.cluster.arrive.release`` / ``wait.acquire``).

An mbarrier is 8 bytes of dynamic shared memory placed after the buffers; ``MbarWait`` is a
``try_wait.parity`` loop on sm_90a and a ``test_wait.parity`` loop on sm_80 / sm_89.
"""

from __future__ import annotations

from hexlayout.ir.lowered import (
    BarSync,
    ClusterBarrier,
    FenceProxyAsync,
    MbarArrive,
    MbarInit,
    MbarWait,
    SetMaxNReg,
    WarpSync,
)

from .emitter import Emitter, asm

__all__ = ["PRINTERS"]


def mbar_init(em: Emitter, ins: MbarInit) -> list[str]:
    if ins.arrivals < 1:
        raise em.error(f"mbarrier.init with {ins.arrivals} arrivals")
    return asm("mbarrier.init.shared::cta.b64 [%0], %1;", [],
               [f'"r"({em.mbar_addr(ins.bar)})', f'"r"({int(ins.arrivals)})'])


#: the targets with sm_90's TMA, clusters, expect_tx and the async proxy
_SM90_UP = ("sm_90a", "sm_100a")


def _need_cluster(em: Emitter, what: str) -> None:
    if em.arch not in _SM90_UP:
        raise em.error(f"{what} needs sm_90; the kernel is for {em.arch}")
    if not em.kernel.cluster:
        raise em.error(f"{what} needs a kernel launched in clusters (cluster=)")


def mbar_arrive(em: Emitter, ins: MbarArrive) -> list[str]:
    addr = em.mbar_addr(ins.bar)
    if ins.cta is not None:
        _need_cluster(em, "an arrive on a peer CTA's mbarrier")
        if ins.tx_bytes:
            raise em.error("an arrive on a peer CTA's mbarrier cannot expect transaction bytes")
        if ins.scope not in ("cta", "cluster"):
            raise em.error(f"mbarrier.arrive with release scope {ins.scope!r} (cta or cluster)")
        sem = ".release.cluster" if ins.scope == "cluster" else ""
        return asm("{\n.reg .b32 remote;\nmapa.shared::cluster.u32 remote, %0, %1;\n"
                   f"mbarrier.arrive{sem}.shared::cluster.b64 _, [remote];\n}}", [],
                   [f'"r"({addr})', f'"r"({em.expr(ins.cta)})'])
    if ins.tx_bytes:
        if em.arch not in _SM90_UP:
            raise em.error(f"mbarrier.arrive.expect_tx needs sm_90; the kernel is for {em.arch}")
        if not 0 < ins.tx_bytes < 1 << 20:
            raise em.error(f"expect_tx of {ins.tx_bytes} bytes is outside (0, 2^20)")
        return asm("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;", [],
                   [f'"r"({addr})', f'"r"({int(ins.tx_bytes)})'])
    return asm("{\n.reg .b64 state;\nmbarrier.arrive.shared::cta.b64 state, [%0];\n}", [],
               [f'"r"({addr})'])


def mbar_wait(em: Emitter, ins: MbarWait) -> list[str]:
    em.helpers.add("mbar_wait_sm90" if em.arch in _SM90_UP else "mbar_wait_sm80")
    return [f"hl_mbar_wait({em.mbar_addr(ins.bar)}, {em.expr(ins.phase)});"]


def bar_sync(em: Emitter, ins: BarSync) -> list[str]:
    if not 0 <= ins.barrier_id < 16:
        raise em.error(f"bar.sync {ins.barrier_id}: named barriers are 0..15")
    if ins.threads is None:
        return asm(f"bar.sync {int(ins.barrier_id)};", [], [])
    if ins.threads % 32 or not 0 < ins.threads <= em.kernel.threads:
        raise em.error(f"bar.sync with {ins.threads} threads: a multiple of 32 up to the block's "
                       f"{em.kernel.threads} is needed")
    return asm(f"bar.sync {int(ins.barrier_id)}, {int(ins.threads)};", [], [])


def warp_sync(em: Emitter, ins: WarpSync) -> list[str]:
    return ["__syncwarp();"]


def fence_proxy_async(em: Emitter, ins: FenceProxyAsync) -> list[str]:
    if em.arch not in _SM90_UP:
        raise em.error(f"fence.proxy.async needs sm_90; the kernel is for {em.arch}")
    return asm("fence.proxy.async.shared::cta;", [], [])


def cluster_barrier(em: Emitter, ins: ClusterBarrier) -> list[str]:
    _need_cluster(em, "barrier.cluster")
    fence = "fence.mbarrier_init.release.cluster;\n" if ins.init_fence else ""
    return asm(fence + "barrier.cluster.arrive.release.aligned;\n"
               "barrier.cluster.wait.acquire.aligned;", [], [])


def set_max_nreg(em: Emitter, ins: SetMaxNReg) -> list[str]:
    if em.arch not in _SM90_UP:
        raise em.error(f"setmaxnreg needs sm_90a or sm_100a; the kernel is for {em.arch}")
    if ins.count % 8 or not 24 <= ins.count <= 256:
        raise em.error(f"setmaxnreg {ins.count}: the count must be a multiple of 8 in [24, 256]")
    kind = "inc" if ins.increase else "dec"
    return asm(f"setmaxnreg.{kind}.sync.aligned.u32 {int(ins.count)};", [], [])


PRINTERS = {MbarInit: mbar_init, MbarArrive: mbar_arrive, MbarWait: mbar_wait, BarSync: bar_sync,
            WarpSync: warp_sync,
            FenceProxyAsync: fence_proxy_async, SetMaxNReg: set_max_nreg, ClusterBarrier: cluster_barrier}
