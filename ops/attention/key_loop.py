"""The key-block loop of the sm_90a attention kernels: ``S = Q K^T`` and ``O += P V`` on wgmma,
the online softmax in between, in one of two schedules.

For key blocks ``b = lo .. hi - 1`` (given as ``segments``: ``(start, stop, masked)`` runs, the
masked ones holding a key some row does not see), the kernel hands the loop its steps:

- ``scores(b)``: wait for block ``b``'s keys, issue and commit ``S_b`` (a wgmma group);
- ``visible(s, b, masked)``: the scores with a softcap and ``-inf`` at hidden keys;
- ``values(p, b)``: issue and commit ``acc += p V_b`` (``p`` the A operand in registers);
- ``issued(b)``: after block ``b``'s products are issued (a prefetch of the next block's keys);
- ``retired(b)``: after block ``b``'s ``P V`` completed (its K / V buffers may be reused).

``overlap=False``: per block ``S_b``, wait, ``p_b`` (``acc`` rescaled), ``P V``, wait.
``overlap=True`` (FlashAttention-3's intra-warpgroup overlap): block ``b``'s ``S_b`` is issued,
``acc`` is rescaled to block ``b - 1``'s row max while it runs, block ``b - 1``'s ``P V`` is
issued, ``wgmma.wait_group 1`` retires ``S_b``, and ``p_b`` is computed while that ``P V``
runs; ``wait_group 0``, then ``p_b`` (cast, in a register tile) and its ``alpha`` wait for the
next block. The first block is taken alone (masked: a mask is exact on any block) and the last
``P V`` after the loop; both schedules give the same ``acc`` and softmax state (the rescale is
applied before the ``P V`` it precedes in either).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import hexlayout.lang as hl
from hexlayout.lang import f32

__all__ = ["wgmma_key_loop"]


def wgmma_key_loop(sm: Any, acc: Any, segments: Sequence[tuple[Any, Any, bool]], lo: Any, hi: Any, *,
                   scores: Callable[[Any], Any], visible: Callable[[Any, Any, bool], Any],
                   values: Callable[[Any, Any], None], mult: Any, dt: Any, rows: int, keys: int,
                   overlap: bool, issued: Callable[[Any], None] | None = None,
                   retired: Callable[[Any], None] | None = None, rescale_first: bool = False) -> None:
    """Run key blocks ``lo .. hi - 1`` into ``sm`` / ``acc`` (see the module docstring); ``rows`` x
    ``keys`` is a score block, ``dt`` the type ``p`` is cast to, ``mult`` the scores' factor into
    the log2 domain, ``rescale_first`` as ``OnlineSoftmax.step`` (the waited schedule)."""
    def after_issue(b: Any) -> None:
        if issued is not None:
            issued(b)

    def after_retire(b: Any) -> None:
        if retired is not None:
            retired(b)

    if not overlap:
        for start, stop, masked in segments:
            for b in hl.range(start, stop):
                sc = scores(b)
                after_issue(b)
                hl.wgmma_wait(0)
                p = sm.step(visible(sc, b, masked), acc, mult, rescale_first=rescale_first)
                values(hl.cast(p, dt), b)
                hl.wgmma_wait(0)
                after_retire(b)
        return
    pp = hl.register(dt, (rows, keys))                         # the previous block's p: its P V's A
    ap = hl.register(f32, (rows, 1))                           # ... and its alpha, not yet applied
    with hl.if_(hi > lo):
        sc = scores(lo)
        after_issue(lo)
        hl.wgmma_wait(0)
        p, alpha = sm.step_scores(visible(sc, lo, True), mult)
        hl.assign(pp, hl.cast(p, dt))
        hl.assign(ap, alpha)
        for start, stop, masked in segments:
            for b in hl.range(hl.maximum(start, lo + 1), stop):
                sc = scores(b)
                acc *= ap                                      # acc and p_{b-1}: one max
                values(pp, b - 1)
                after_issue(b)
                hl.wgmma_wait(1)                               # S_b landed; P V of b - 1 in flight
                p, alpha = sm.step_scores(visible(sc, b, masked), mult)
                hl.wgmma_wait(0)
                after_retire(b - 1)
                hl.assign(pp, hl.cast(p, dt))                  # pp: read by the P V just retired
                hl.assign(ap, alpha)
        acc *= ap
        values(pp, hi - 1)
        hl.wgmma_wait(0)
        after_retire(hi - 1)
