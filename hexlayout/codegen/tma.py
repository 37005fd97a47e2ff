"""Printers of TMA (``cp.async.bulk.tensor``) loads and stores.

Each ``TmaDesc`` is a ``const __grid_constant__ CUtensorMap`` kernel parameter, encoded on
the host from the descriptor's parameters; the instruction takes its generic address.
Loads complete on an mbarrier (``mbarrier::complete_tx::bytes``), with a CTA mask
(``.multicast::cluster``) in every CTA of the mask; stores form bulk groups.
"""

from __future__ import annotations

from hexlayout.ir.lowered import TmaDesc, TmaLoad, TmaStore, TmaStoreCommit, TmaStoreWait

from .emitter import Emitter, asm, wait_group

__all__ = ["PRINTERS"]


def _desc(em: Emitter, desc: TmaDesc, coords: tuple) -> tuple[str, list[str]]:
    if em.arch not in ("sm_90a", "sm_100a"):
        raise em.error(f"TMA needs sm_90a or sm_100a; the kernel is for {em.arch}")
    name = em.tma_name(desc)
    rank = len(coords)
    if not 1 <= rank <= 5 or rank != len(desc.box):
        raise em.error(f"TMA {desc.name}: {rank} coordinate(s) for a {len(desc.box)}-d box")
    return name, [f'"r"({em.expr(c)})' for c in coords]


def _coord_list(first: int, rank: int) -> str:
    return "{" + ", ".join(f"%{first + i}" for i in range(rank)) + "}"


def tma_load(em: Emitter, ins: TmaLoad) -> list[str]:
    name, crd = _desc(em, ins.desc, ins.coords)
    rank = len(crd)
    mc = ins.multicast is not None
    if mc and not em.kernel.cluster:
        raise em.error("a multicast TMA load needs a kernel launched in clusters (cluster=)")
    if ins.pair_bar and tuple(em.kernel.cluster or ()) not in ((2,), (2, 1), (2, 1, 1)):
        raise em.error("a TMA load completing on the pair's barrier needs 2-CTA clusters (cluster=(2, 1, 1))")
    # .cta_group::2: the barrier address's peer bit (24) selects the CTA of the pair; a shared::cta
    # address has it clear, i.e. names the even CTA's barrier at that offset
    group = ".cta_group::2" if ins.pair_bar else ""
    text = (f"cp.async.bulk.tensor.{rank}d{group}.shared::cluster.global.mbarrier::complete_tx::bytes"
            + (".multicast::cluster" if mc else "")
            + f" [%0], [%1, {_coord_list(2, rank)}], [%{2 + rank}]" + (f", %{3 + rank};" if mc else ";"))
    ins_ = [f'"r"({em.smem_addr(ins.dst)})', f'"l"(reinterpret_cast<unsigned long long>(&{name}))']
    ins_ += crd + [f'"r"({em.mbar_addr(ins.bar)})']
    if mc:
        ins_.append(f'"h"(static_cast<unsigned short>({em.expr(ins.multicast)}))')
    return asm(text, [], ins_)


def tma_store(em: Emitter, ins: TmaStore) -> list[str]:
    name, crd = _desc(em, ins.desc, ins.coords)
    rank = len(crd)
    text = (f"cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group"
            f" [%0, {_coord_list(1, rank)}], [%{1 + rank}];")
    ins_ = [f'"l"(reinterpret_cast<unsigned long long>(&{name}))'] + crd + [f'"r"({em.smem_addr(ins.src)})']
    return asm(text, [], ins_)


def tma_store_commit(em: Emitter, ins: TmaStoreCommit) -> list[str]:
    return asm("cp.async.bulk.commit_group;", [], [])


def tma_store_wait(em: Emitter, ins: TmaStoreWait) -> list[str]:
    return wait_group(em, "cp.async.bulk.wait_group", ins.pending, ".read")


PRINTERS = {TmaLoad: tma_load, TmaStore: tma_store, TmaStoreCommit: tma_store_commit,
            TmaStoreWait: tma_store_wait}
