"""Rotary position embedding (RoPE) of column ranges of a product: the op
``hexlayout::rope`` the GEMM anchor's graph pass puts after a QKV projection, its eager
meaning and the tile math that computes it in the GEMM's epilogue.

``rope(y, cos, sin, positions, head_dim, rope_cols, interleaved) -> out`` on ``y[M, N]``
(the projection's product, heads of ``head_dim = D`` columns side by side). Row ``m``'s
tables are ``C[m] = cos[positions[m]]`` (a ``[max_pos, D]`` cache gathered by position ids,
``positions`` holding ``M`` ids) or ``C[m] = cos[m mod T]`` (``positions`` absent: ``T`` rows
of ``D``, ``T`` dividing ``M``: ``T = M`` for tables already gathered per token, ``T = S`` for
one ``[S, D]`` table serving every sequence of a batch), the same for ``S`` from ``sin``, both rounded to
``y``'s dtype (as models cast them before the product). For a column ``j < rope_cols`` (a
multiple of ``D``: the q and k heads, which come first), head ``h = j // D``, ``d = j % D``:

    out[m, j] = y[m, j] * C[m, d] + sign(d) * y[m, partner(j)] * S[m, d]

- rotate-half (HF Llama, Qwen2, Gemma, Mistral: ``x * cos + cat(-x2, x1) * sin`` with
  ``x1, x2`` the two halves of a head): ``partner(j) = h*D + (d + D/2) mod D``,
  ``sign(d) = -1`` for ``d < D/2``, else ``+1``;
- interleaved (GPT-J, pairs ``(2i, 2i + 1)``: ``x * cos + stack(-x_odd, x_even).flatten()
  * sin``): ``partner(j) = j xor 1``, ``sign(d) = -1`` for even ``d``, else ``+1``;

and ``out[m, j] = y[m, j]`` for ``j >= rope_cols`` (the v heads). The map is linear in
each output row and never leaves a head, so a GEMM tile whose columns hold whole heads
(``BN`` a multiple of ``D``) computes it from its own accumulator: the partner of every
element is in the tile (``rotate`` regroups the tile in registers: ``hl.reshape`` /
``hl.concat`` / ``hl.interleave``), and the tables are one ``BM x D`` load per tile,
broadcast over the tile's heads. The fused kernel computes in f32 from ``y`` rounded to
its dtype and rounds once; eager rounds after each op (well within 1e-2 of ``max|out|``).
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["ROPE", "rope_op", "rope_eager", "rotate"]

#: the op's name as FX prints it (a spec node's ``op``)
ROPE = "hexlayout.rope.default"
_LOCK = threading.Lock()
_LIB: list[Any] = []
#: the columns an interleaved rope rotates at a time (its registers are live for one window)
_WINDOW = 32


def rope_eager(y: Any, cos: Any, sin: Any, positions: Any, head_dim: int, rope_cols: int,
               interleaved: bool) -> Any:
    """The op's meaning in torch (see the module docstring); meta tensors give its shape."""
    import torch

    from hexlayout.runtime.alloc import fresh_like

    if y.dim() != 2 or head_dim <= 0 or head_dim % 2 or rope_cols % head_dim or rope_cols > y.shape[1]:
        raise ValueError(f"hexlayout::rope: y of shape {tuple(y.shape)}, head_dim {head_dim}, rope_cols "
                         f"{rope_cols} (a 2-D y, an even head_dim dividing rope_cols <= y's columns)")
    m = y.shape[0]

    def table(t: Any) -> Any:
        t = t.reshape(-1, head_dim)
        if positions is not None:
            t = t[positions.reshape(-1)]
        elif t.shape[0] and m % t.shape[0] == 0 and t.shape[0] != m:
            t = t[torch.arange(m, device=t.device) % t.shape[0]]
        if t.shape[0] != m:
            raise ValueError(f"hexlayout::rope: a table of {t.shape[0]} rows for {m} rows of y")
        return t.to(y.dtype).float()

    c, s = table(cos), table(sin)
    if y.device.type == "meta":
        return fresh_like(y, y.shape)
    heads = rope_cols // head_dim
    q = y[:, :rope_cols].float().reshape(m, heads, head_dim)
    if interleaved:
        pairs = q.reshape(m, heads, head_dim // 2, 2)
        rot = torch.stack((-pairs[..., 1], pairs[..., 0]), -1).reshape(m, heads, head_dim)
    else:
        half = head_dim // 2
        rot = torch.cat((-q[..., half:], q[..., :half]), -1)
    out = y.clone()
    out[:, :rope_cols] = (q * c[:, None] + rot * s[:, None]).reshape(m, rope_cols).to(y.dtype)
    return out


def _fake(y: Any, cos: Any, sin: Any, positions: Any, head_dim: int, rope_cols: int,
          interleaved: bool) -> Any:
    import torch

    return torch.empty_like(y)


def rope_op() -> Any:
    """Register (once) and return ``torch.ops.hexlayout.rope.default``."""
    import torch

    with _LOCK:
        if not _LIB:
            lib = torch.library.Library("hexlayout", "FRAGMENT")
            lib.define("rope(Tensor y, Tensor cos, Tensor sin, Tensor? positions, int head_dim, "
                       "int rope_cols, bool interleaved) -> Tensor")
            lib.impl("rope", rope_eager, "CompositeExplicitAutograd")
            torch.library.register_fake("hexlayout::rope", _fake, lib=lib)
            _LIB.append(lib)
    return torch.ops.hexlayout.rope.default


def rotate(y: Any, table: Any, keep: Any, head_dim: int, interleaved: bool, dtype: Any) -> Any:
    """The roped tile (module docstring) of an f32 register tile ``y`` of ``BM x BN`` (``BN``
    a multiple of ``head_dim``: whole heads; its values exact in ``dtype``), traced into the
    kernel being extended. ``table(which, d0, width)``: the f32 ``BM x width`` columns ``d0 ...``
    of the rows' cos (``which`` 0) or sin (1) table, loaded once per call site and broadcast
    over the tile's heads; ``keep(c0, width)``: the ``1 x width`` predicate of tile columns
    ``c0 ...`` that are roped (below ``rope_cols``; the others keep ``y``).

    Interleaved pairs are regrouped in registers (a pair is in one thread's registers).
    Rotate-half partners are half a head apart, in other threads: the tile goes through
    shared memory once (in ``dtype``), each half head and its partner are read back and the
    roped halves are joined in registers."""
    import hexlayout.lang as hl

    bm, bn = y.shape
    heads, d = bn // head_dim, head_dim
    if interleaved:                          # in windows of w columns: registers live for one window
        w = min(d, _WINDOW)
        tabs: dict = {}
        outs = []
        for c0 in range(0, bn, w):
            d0 = c0 % d
            for k in (0, 1):
                if (k, d0) not in tabs:
                    tabs[k, d0] = table(k, d0, w)
            yw = y[:, c0:c0 + w]
            pairs = hl.reshape(yw, (bm, w // 2, 2))
            rot = hl.interleave([-pairs[:, :, 1], pairs[:, :, 0]], -1)
            outs.append(hl.where(keep(c0, w), yw * tabs[0, d0] + rot * tabs[1, d0], yw))
        return hl.concat(outs, 1) if len(outs) > 1 else outs[0]
    w = d // 2
    staged = hl.register(dtype, (bm, bn))
    hl.assign(staged, hl.cast(y, dtype))
    st = hl.shared(dtype, (bm, bn))
    hl.copy(staged, st)
    hl.syncthreads()
    tabs = {(k, half): table(k, half * w, w) for k in (0, 1) for half in (0, 1)}
    outs = []
    for h in range(heads):
        for half in (0, 1):
            own, partner = h * d + half * w, h * d + (1 - half) * w
            yp, pp = hl.register(dtype, (bm, w)), hl.register(dtype, (bm, w))
            hl.copy(st[:, own:own + w], yp)
            hl.copy(st[:, partner:partner + w], pp)
            yf, pf = hl.cast(yp, hl.f32), hl.cast(pp, hl.f32)
            rot = pf if half else -pf
            outs.append(hl.where(keep(own, w), yf * tabs[0, half] + rot * tabs[1, half], yf))
    return hl.concat(outs, 1) if len(outs) > 1 else outs[0]
