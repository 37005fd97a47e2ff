"""The depthwise causal convolution kernels of Mamba's short convolution, in the language.

``causal_conv1d_kernel``: for one sequence ``s`` and ``BD`` channels a thread block computes

    out[t, d] = act(bias[d] + sum_{k<W} w[k, d] · xs[t - (W-1) + k, d])

where ``xs[j]`` is the sequence's input at position ``j >= 0`` and ``init[s, (W-1) + j, d]``
(the initial state, zeros without one) at ``j < 0``; ``act`` is the identity or SiLU. The
block walks the sequence one position at a time, keeping the last ``W-1`` inputs (the
window) in registers, so each input is read once; it writes the window at the end as the
final state ``final[s, j, d] = xs[n - (W-1) + j, d]``. Tensors are channel-last
(``[.., L, D]`` with ``D`` contiguous: vLLM's layout, coalesced across a block's channels).

``causal_conv1d_update_kernel``: one decode step of ``L >= 1`` new positions for batch row
``b``: the window comes from the last ``W-1`` of the ``SL >= W-1`` state rows
``state[r, :, d]`` at ``r = idx[b]`` (``-1``: the row is skipped, its output is 0); after
the convolution the state becomes the last ``SL`` positions of ``[state, x]``.
"""

# Annotations are evaluated when a kernel is defined: the tensor types depend on the dtype.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32, i32

__all__ = ["causal_conv1d_kernel", "causal_conv1d_update_kernel", "CONV_BD"]

NB, L, D, W, S, WS, S1, NS, SL = hl.dims("NB L D W S WS S1 NS SL")
SXB, SXL, SOB, SOL, SSN, SSL = hl.dims("SXB SXL SOB SOL SSN SSL")

#: channels per thread block (one per thread)
CONV_BD = 128


def _row(t: Any, origin: tuple[Any, ...], bd: int) -> Any:
    """The ``(1, bd)`` f32 register row of channel-last tensor ``t`` at ``origin`` (the
    channel mode last); channels past ``D`` read 0."""
    rank = len(origin)
    src = hl.view(t, (1,) * (rank - 1) + (bd,), origin)
    r = hl.register(t.dtype, (1, bd))
    hl.copy(src[(0,) * (rank - 2)] if rank > 2 else src, r)
    return hl.cast(r, f32)


def _store_row(v: Any, t: Any, origin: tuple[Any, ...], bd: int) -> None:
    """Store the f32 row ``v`` into ``t`` at ``origin`` in ``t``'s dtype (channels past ``D``
    skipped)."""
    rank = len(origin)
    dst = hl.view(t, (1,) * (rank - 1) + (bd,), origin)
    hl.copy(hl.cast(v, t.dtype), dst[(0,) * (rank - 2)] if rank > 2 else dst)


def _conv_step(xt: Any, win: list[Any], taps: list[Any], bias: Any, silu: bool) -> Any:
    """One output row ``act(bias + sum_k taps[k] · [win, xt][k])``; shifts ``xt`` into ``win``."""
    acc = bias + taps[-1] * xt
    for k, wk in enumerate(win):
        acc = acc + taps[k] * wk
    for k in range(len(win) - 1):
        hl.assign(win[k], win[k + 1])
    if win:
        hl.assign(win[-1], xt)
    return hl.silu(acc) if silu else acc


@cache
def causal_conv1d_kernel(dtype: DType) -> Any:
    """The prefill convolution for ``dtype`` (f16 / bf16; see the module docstring). Constants:
    ``WIDTH`` (2-4), ``SILU``, ``VARLEN`` (sequence ``s`` is ``x[0, cu[s]:cu[s+1]]``; else
    row ``s`` of ``x``), ``FINAL`` (write the final states)."""
    dt = dtype

    @hl.kernel(threads=lambda c: c["BD"], name=f"causal_conv1d_{dt}")
    def causal_conv1d_k(x: dt[NB, L, D].strides(SXB, SXL, 1), w: dt[W, D], bias: dt[1, D],  # type: ignore
                        init: dt[S, WS, D], out: dt[NB, L, D].strides(SOB, SOL, 1),  # type: ignore
                        final: dt[S, WS, D], cu: i32[S1], SXB: i32, SXL: i32, SOB: i32, SOL: i32,  # type: ignore
                        *, BD: int = 128, WIDTH: int = 4, SILU: bool = False, VARLEN: bool = False,
                        FINAL: bool = False):
        s, db = hl.grid(hl.spatial(init.shape[0], hl.cdiv(x.shape[2], BD)))
        d0 = db * BD
        if VARLEN:
            b, start = 0, cu[s]
            n = cu[s + 1] - start
        else:
            b, start, n = s, 0, x.shape[1]
        taps = [_row(w, (k, d0), BD) for k in range(WIDTH)]
        b_row = _row(bias, (0, d0), BD)
        win = [_row(init, (s, j, d0), BD) for j in range(WIDTH - 1)]
        for t in hl.range(n):
            xt = _row(x, (b, start + t, d0), BD)
            _store_row(_conv_step(xt, win, taps, b_row, SILU), out, (b, start + t, d0), BD)
        if FINAL:
            for j in range(WIDTH - 1):
                _store_row(win[j], final, (s, j, d0), BD)

    return causal_conv1d_k


@cache
def causal_conv1d_update_kernel(dtype: DType) -> Any:
    """The decode convolution for ``dtype`` (f16 / bf16; see the module docstring). Constants:
    ``WIDTH`` (2-4), ``SILU``, ``INDEXED`` (the state row is ``idx[b]``; else ``b``)."""
    dt = dtype

    @hl.kernel(threads=lambda c: c["BD"], name=f"causal_conv1d_update_{dt}")
    def causal_conv1d_update_k(x: dt[NB, L, D].strides(SXB, SXL, 1),  # type: ignore
                               state: dt[NS, SL, D].strides(SSN, SSL, 1),  # type: ignore
                               w: dt[W, D], bias: dt[1, D], out: dt[NB, L, D], idx: i32[S1],  # type: ignore
                               SXB: i32, SXL: i32, SSN: i32, SSL: i32, *, BD: int = 128, WIDTH: int = 4,
                               SILU: bool = False, INDEXED: bool = False):
        b, db = hl.grid(hl.spatial(x.shape[0], hl.cdiv(x.shape[2], BD)))
        d0 = db * BD
        n, sl = x.shape[1], state.shape[1]
        r = idx[b] if INDEXED else b
        keep = hl.cast(hl.iota((1, BD), 0) + r >= 0, f32)   # 0 for a skipped row (-1)
        rr = hl.maximum(r, 0)
        taps = [_row(w, (k, d0), BD) for k in range(WIDTH)]
        b_row = _row(bias, (0, d0), BD)
        win = [_row(state, (rr, sl - (WIDTH - 1) + j, d0), BD) for j in range(WIDTH - 1)]
        for t in hl.range(n):
            xt = _row(x, (b, t, d0), BD)
            _store_row(_conv_step(xt, win, taps, b_row, SILU) * keep, out, (b, t, d0), BD)
        with hl.if_(r >= 0):
            # state[j] = [state, x][j + n]: ascending j reads ahead of what it overwrites
            for j in hl.range(sl):
                src = j + n
                old = _row(state, (rr, src, d0), BD)          # past SL: reads 0
                new = _row(x, (b, hl.maximum(src - sl, 0), d0), BD)
                pick = hl.iota((1, BD), 0) + src < sl
                _store_row(hl.where(pick, old, new), state, (rr, j, d0), BD)

    return causal_conv1d_update_k
