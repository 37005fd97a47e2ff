"""Work placed beside an in-flight wgmma group stays there.

A kernel that overlaps computation with its tensor-core work writes it between a
``wgmma.commit_group`` and the ``wgmma.wait_group`` that follows (FlashAttention-3's softmax of
block ``j`` while block ``j - 1``'s ``P V`` runs). The C++ compiler may sink that computation
past the wait (it depends on nothing the wait produces), and then the tensor cores run with
nothing beside them. ``plan_overlap`` finds, in a straight-line body, each ``WgmmaWait`` whose
nearest earlier wgmma instruction is a ``WgmmaCommit`` or a ``WgmmaWait`` that leaves groups in
flight (``wait_group n``, ``n > 0``), and the register arrays written between the two (the
*region*) that are also read outside it (values the region produces for later:
``p`` for the next ``P V``, the softmax state); the printer ties those arrays with an empty
``asm volatile`` just before the wait (``codegen.mma.wgmma_wait``), so their values are computed
before it. Temporaries read only inside the region are not tied (tying them would keep them
all live at once).
"""

from __future__ import annotations

from collections import Counter

from hexlayout.ir.lowered import Instr, RegArray, RegRef, Wgmma, WgmmaCommit, WgmmaFence, WgmmaWait

from .fold_zero import named_arrays

__all__ = ["plan_overlap"]


def plan_overlap(body: list[Instr], uses: Counter[int],
                 async_arrays: list[RegArray]) -> dict[int, list[RegArray]]:
    """``id(wait)`` -> the arrays to tie before it, for the waits of the straight-line ``body``
    (``uses``: ``array_uses`` of the whole kernel; ``async_arrays``: the wgmma operand arrays,
    tied after every wait already)."""
    plans: dict[int, list[RegArray]] = {}
    start: int | None = None                   # index after the latest commit, if no wgmma op since
    for i, ins in enumerate(body):
        if isinstance(ins, WgmmaCommit):
            start = i + 1
        elif isinstance(ins, WgmmaWait):
            if start is not None:
                tied = _produced(body[start:i], uses, async_arrays)
                if tied:
                    plans[id(ins)] = tied
            start = i + 1 if ins.pending > 0 else None     # groups still in flight after it
        elif isinstance(ins, (Wgmma, WgmmaFence)):
            start = None
    return plans


def _produced(region: list[Instr], uses: Counter[int], async_arrays: list[RegArray]) -> list[RegArray]:
    """The arrays ``region`` writes that some instruction outside it names."""
    inside: Counter[int] = Counter()
    for ins in region:
        for a in {id(x): x for x in named_arrays(ins)}.values():
            inside[id(a)] += 1
    out: dict[int, RegArray] = {}
    for ins in region:
        dst = getattr(ins, "dst", None)
        if isinstance(dst, RegRef):
            a = dst.array
            if uses[id(a)] > inside[id(a)] and all(a is not x for x in async_arrays):
                out[id(a)] = a
    return list(out.values())
