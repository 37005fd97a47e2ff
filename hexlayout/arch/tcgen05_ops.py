"""The sm_100a tcgen05 instructions besides ``mma``, ``ld`` and ``st``: tensor-memory
management, completion and ordering. Each entry gives its PTX (``{g}`` is the cta_group,
1 or 2) and who issues it (PTX ISA "tcgen05 instructions"):

* ``alloc`` (a whole warp, ``.sync.aligned``): writes the TMEM address of ``ncols`` new
  columns (power of two, 32..512) to shared memory;
* ``dealloc`` (a warp): frees ``ncols`` columns at ``taddr``; every column allocated must be
  freed before the CTA exits, and after the last ``tcgen05.ld`` of them completed
  (``wait::ld``);
* ``relinquish_alloc_permit`` (a warp): the CTA will not allocate again;
* ``commit`` (one thread): the mbarrier gets one arrive once every ``tcgen05.mma`` / ``cp``
  this thread issued before completed -- the only way to know an accumulator is ready;
* ``fence::before_thread_sync`` / ``fence::after_thread_sync`` (each thread): order tcgen05
  operations before / after a thread synchronization (barrier, mbarrier wait);
* ``wait::ld`` / ``wait::st`` (a warp): every earlier ``tcgen05.ld`` / ``st`` of the warp completed
  (their registers / TMEM cells may be used);
* ``cp`` (one thread): shared memory -> TMEM (e.g. FP8 block scales), ordered before the thread's
  later MMAs, completes through commit; its ``.shape`` (and multicast) from ``tcgen05_cp.py``.

Example:
    >>> tcgen05_ptx("commit", 1)
    'tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64'
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["Tcgen05Op", "TCGEN05_OPS", "tcgen05_ptx"]


@dataclass(frozen=True)
class Tcgen05Op:
    """One tcgen05 instruction: PTX template (``{g}`` = cta_group), operands, issuing scope."""

    name: str
    ptx: str
    operands: str
    scope: str  # "thread", "warp"


TCGEN05_OPS: dict[str, Tcgen05Op] = {o.name: o for o in (
    Tcgen05Op("alloc", "tcgen05.alloc.cta_group::{g}.sync.aligned.shared::cta.b32", "[dst_smem], ncols",
              "warp"),
    Tcgen05Op("dealloc", "tcgen05.dealloc.cta_group::{g}.sync.aligned.b32", "taddr, ncols", "warp"),
    Tcgen05Op("relinquish_alloc_permit", "tcgen05.relinquish_alloc_permit.cta_group::{g}.sync.aligned", "",
              "warp"),
    Tcgen05Op("commit", "tcgen05.commit.cta_group::{g}.mbarrier::arrive::one.shared::cluster.b64", "[mbar]",
              "thread"),
    Tcgen05Op("fence_before", "tcgen05.fence::before_thread_sync", "", "thread"),
    Tcgen05Op("fence_after", "tcgen05.fence::after_thread_sync", "", "thread"),
    Tcgen05Op("wait_ld", "tcgen05.wait::ld.sync.aligned", "", "warp"),
    Tcgen05Op("wait_st", "tcgen05.wait::st.sync.aligned", "", "warp"),
    Tcgen05Op("cp", "tcgen05.cp.cta_group::{g}.{shape}", "[taddr], s_desc", "thread"),
)}


def tcgen05_ptx(name: str, cta_group: int = 1, shape: str | None = None) -> str:
    """The PTX instruction (without operands) of the tcgen05 op ``name`` for ``cta_group`` 1 or 2
    (``cp``: of ``shape``, one of ``tcgen05_cp.CP_SHAPES``)."""
    if name not in TCGEN05_OPS:
        raise ValueError(f"tcgen05: unknown op {name!r}; known: {', '.join(TCGEN05_OPS)}")
    if cta_group not in (1, 2):
        raise ValueError(f"tcgen05.{name}: cta_group {cta_group} is not 1 or 2")
    if name == "cp":
        from .tcgen05_cp import tcgen05_cp_ptx

        if shape is None:
            raise ValueError("tcgen05.cp: give its shape (e.g. '32x128b.warpx4')")
        return tcgen05_cp_ptx(shape, cta_group)
    return TCGEN05_OPS[name].ptx.format(g=cta_group)
