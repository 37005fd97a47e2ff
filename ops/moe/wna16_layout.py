"""The synthesized offline layout of the W4A16 / W8A16 MoE weights and the re-layout step of
``prepare_wna16``.

The kernels (``wna16_kernels_sm80``, ``wna16_kernels_sm90``, ``wna16_kernels_sm100``) declare the weights ``q:
hl.offline(u4[E*NP, KP])`` (``u8`` for 8-bit) and copy ``(BN, BK)`` tiles of them in logical
coordinates; synthesis chooses the register layout of the mma operand the tile feeds and with
it the tile's storage order (``hexlayout.ir.offline``: each thread's fragment one contiguous,
16-byte-vector run). ``wna16_offline_layout`` synthesizes the kernel that will run for a target
and returns that ``OfflineLayout``; ``relayout`` applies it to the integer values.

Rows: column ``n`` of expert ``e``'s ``W`` is row ``e * NP + n'``; for the down projection
``n' = n`` and ``NP = roundup(N, TR)``; for the gate-up projection (``gate_up=True``, ``N = 2I``
columns ``[gate | up]``) each half is padded apart, ``NP = 2 roundup(I, TR)`` and up column
``I + n`` is ``n' = NP / 2 + n`` (every ``BN``-row tile the kernels copy starts on a tile). K is
padded to ``KP = roundup(K, TK)``. Padded values are 0 (the kernels multiply them by zero
activations, or write no output for them).
"""

from __future__ import annotations

from functools import cache
from typing import Any

__all__ = ["wna16_offline_layout", "relayout", "padded_rows", "kernel_tiles", "k_tile"]


def k_tile(k: int, group_size: int) -> int:
    """The kernels' k-tile ``BK`` (the re-laid weights' chunk along K): 64; 32 for groups of 32
    (one scale per k-tile) and for K not a multiple of 64."""
    return 32 if group_size == 32 or k % 64 else 64


def kernel_tiles(arch: str, bk: int) -> dict[str, Any]:
    """The constants of the kernel whose offline layout the weights take (the layout depends
    on the weight tile ``(BN, BK)`` and the warps that consume it, not on ``BM``: decode and
    prefill share it; sm_90a and sm_100a run one warp group, ``BN = 64``)."""
    if arch in ("sm_90a", "sm_100a"):
        return {"BM": 16, "BK": bk, "STAGES": 3, "WG": 1, "GROUP": 128}
    return {"BM": 16, "BN": 64, "BK": bk, "STAGES": 3, "WARPS": 4, "GROUP": 128}


@cache
def _layout(arch: str, dtype: Any, wt: Any, bits: int, bk: int, gate_up: bool) -> Any:
    from hexlayout.runtime import build

    from .wna16_kernels_sm80 import moe_wna16_down_kernel, moe_wna16_gate_up_kernel
    from .wna16_kernels_sm90 import moe_wna16_down_sm90_kernel, moe_wna16_gate_up_sm90_kernel
    from .wna16_kernels_sm100 import moe_wna16_down_sm100_kernel, moe_wna16_gate_up_sm100_kernel

    if arch == "sm_90a":
        fac = moe_wna16_gate_up_sm90_kernel if gate_up else moe_wna16_down_sm90_kernel
    elif arch == "sm_100a":
        fac = moe_wna16_gate_up_sm100_kernel if gate_up else moe_wna16_down_sm100_kernel
    else:
        fac = moe_wna16_gate_up_kernel if gate_up else moe_wna16_down_kernel
    kernel = fac(dtype, bits, bk, False, wt)
    return build(kernel, arch, compile=False, **kernel_tiles(arch, bk)).offline_layouts["q"]


def wna16_offline_layout(arch: str, dtype: Any, bits: int, size_k: int, group_size: int,
                         gate_up: bool, weight: Any = None) -> Any:
    """The ``OfflineLayout`` synthesis gives the weights of the gate-up (``gate_up``) or down
    kernel for ``arch`` (sm_80 / sm_89 / sm_90a / sm_100a), activations ``dtype`` (a language dtype),
    ``bits`` 4 or 8 (weights ``u4`` / ``u8``, or ``weight``: ``e2m1`` for MXFP4), input dim
    ``size_k``; memoized per kernel."""
    from hexlayout.lang import u4, u8

    wt = weight or (u4 if bits == 4 else u8)
    return _layout(arch, dtype, wt, bits, k_tile(size_k, group_size), gate_up)


def padded_rows(size_n: int, tile_rows: int, gate_up: bool) -> int:
    """``NP``: the offline rows per expert for ``size_n`` output columns."""
    def up(x: int) -> int:
        return -(-x // tile_rows) * tile_rows

    return 2 * up(size_n // 2) if gate_up else up(size_n)


def relayout(q_ekn: Any, layout: Any, gate_up: bool) -> Any:
    """The offline tensor ``[E * NP, KP * bits / 8]`` (uint8) of the integer values ``q_ekn``
    ``[E, K, N]`` (``W``'s quantized values, ``[0, 2^bits)``) in ``layout``'s order, padded
    with zeros (see the module docstring)."""
    import torch

    from hexlayout.runtime.alloc import zeroed

    e, k, n = q_ekn.shape
    tr, tk = layout.tile
    kp = -(-k // tk) * tk
    np_ = padded_rows(n, tr, gate_up)
    q = q_ekn.transpose(1, 2).to(torch.uint8)  # [E, N, K]: row n is W[e, :, n]
    out = zeroed((e, np_, kp), torch.uint8, q.device)  # the padding is 0
    if gate_up:
        i = n // 2
        out[:, :i, :k] = q[:, :i]
        out[:, np_ // 2:np_ // 2 + i, :k] = q[:, i:]
    else:
        out[:, :n, :k] = q
    return layout.apply(out.reshape(e * np_, kp)).contiguous()
