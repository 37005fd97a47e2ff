"""The synthesized offline layout of the W4A16 / W8A16 MoE weights and the re-layout step of
``prepare_wna16``.

The kernels (``wna16_kernels_sm80``, ``wna16_kernels_sm90``, ``wna16_kernels_sm100``) declare the weights ``q:
hl.offline(u4[E*NP, KP])`` (``u8`` for 8-bit) and copy ``(BN, BK)`` tiles of them in logical
coordinates; synthesis chooses the register layout of the mma operand the tile feeds and with
it the tile's storage order (``hexlayout.ir.offline``: each thread's fragment one contiguous,
16-byte-vector run). The scales ``s: hl.offline(dt[E*NP, G])`` and AWQ's zero points ``z:
hl.offline(u8[E*NP, G])`` (the same rows, column the group) are copied as ``(BN, 1)`` columns
into the register column the dequantization broadcasts along K, which the threads of a fragment
share: stored in its owners' order (``hexlayout.ir.offline``), a thread's columns are one run.
``wna16_offline_layouts`` synthesizes the kernel that will run for a target and returns those
``OfflineLayout`` by name (``offline_key``: the one key the prepared weights record);
``relayout`` / ``relayout_groups`` apply them.

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

__all__ = ["wna16_offline_layout", "wna16_offline_layouts", "offline_key", "relayout", "relayout_groups",
           "group_view", "padded_rows", "kernel_tiles", "k_tile"]


def k_tile(k: int, group_size: int) -> int:
    """The kernels' k-tile ``BK`` (the re-laid weights' chunk along K): 64; 32 for groups of 32
    (one scale per k-tile) and for K not a multiple of 64."""
    return 32 if group_size == 32 or k % 64 else 64


def kernel_tiles(arch: str, bk: int, group: int = 128, zero: int = 0) -> dict[str, Any]:
    """The constants of the kernel whose offline layouts the weights take (the layouts depend
    on the weight tile ``(BN, BK)`` and the warps that consume it, not on ``BM``: decode and
    prefill share them; sm_90a and sm_100a run one warp group, ``BN = 64``); ``group`` (the
    kernels' ``GROUP``: per-channel scales are read after the k loop, in the accumulator's
    column order) and ``zero`` (``ZERO``: 0 reads AWQ's zero points) choose which copies of the
    scales and zero points the kernel makes."""
    if arch in ("sm_90a", "sm_100a"):
        return {"BM": 16, "BK": bk, "STAGES": 3, "WG": 1, "GROUP": group, "ZERO": zero}
    return {"BM": 16, "BN": 64, "BK": bk, "STAGES": 3, "WARPS": 4, "GROUP": group, "ZERO": zero}


@cache
def _layouts(arch: str, dtype: Any, wt: Any, bits: int, bk: int, gate_up: bool, group: int,
             zero: int) -> dict[str, Any]:
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
    return build(kernel, arch, compile=False, **kernel_tiles(arch, bk, group, zero)).offline_layouts


#: the kernels' ``GROUP`` for one group over K (``wna16.ONE_GROUP``)
_ONE_GROUP = 1 << 30
#: the ``GROUP`` of the kernel synthesized for grouped scales (any group size: the same layouts)
_LAYOUT_GROUP = 128


def wna16_offline_layouts(arch: str, dtype: Any, bits: int, size_k: int, group_size: int,
                          gate_up: bool, weight: Any = None, zero: int = 0) -> dict[str, Any]:
    """The ``OfflineLayout`` synthesis gives each offline argument of the gate-up (``gate_up``)
    or down kernel for ``arch`` (sm_80 / sm_89 / sm_90a / sm_100a), by name: ``q`` the weights,
    ``s`` the scales, ``z`` the zero points (only when the kernel reads them: ``zero`` 0, AWQ);
    activations ``dtype`` (a language dtype), ``bits`` 4 or 8 (weights ``u4`` / ``u8``, or
    ``weight``: ``e2m1`` for MXFP4), input dim ``size_k``, ``group_size`` (-1: per channel);
    memoized per kernel.

    The layouts are those of the operand fragments and scale columns, which the activations'
    16-bit type (f16 or bf16) and the group size (``GROUP`` fixes only which k-tiles load a
    group's scales, not how) do not change: the kernel synthesized is the f16 one with groups of
    128 (or per channel), so formats that differ only there share one synthesis. Every launch
    compares the layouts of the kernel it runs with the weights' key (``wna16._same_layout``)."""
    from hexlayout.lang import bf16, f16, u4, u8

    wt = weight or (u4 if bits == 4 else u8)
    group = _ONE_GROUP if group_size == -1 else _LAYOUT_GROUP
    dtype = f16 if dtype == bf16 else dtype
    return _layouts(arch, dtype, wt, bits, k_tile(size_k, group_size), gate_up, group, zero)


def wna16_offline_layout(arch: str, dtype: Any, bits: int, size_k: int, group_size: int,
                         gate_up: bool, weight: Any = None) -> Any:
    """The weights' (``q``'s) ``OfflineLayout`` of ``wna16_offline_layouts``."""
    return wna16_offline_layouts(arch, dtype, bits, size_k, group_size, gate_up, weight)["q"]


def offline_key(layouts: dict[str, Any]) -> str:
    """One key for the offline layouts of a kernel's arguments (``name:key`` joined by ``;``
    in name order): the prepared weights record it, the op compares it with the kernel's."""
    return ";".join(f"{name}:{lay.key}" for name, lay in sorted(layouts.items()))


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


def relayout_groups(t_egn: Any, layout: Any, gate_up: bool) -> Any:
    """The group tensor ``t_egn`` ``[E, G, N]`` (scales or zero points) in ``layout``'s order,
    returned as the ``[E, G, N]`` view (``group_view``) of the offline tensor ``[E * NP, G]``
    whose row ``e * NP + n'`` is column ``n`` of expert ``e`` (the weights' rows, the same
    padding: zeros) and whose column is the group."""
    import torch

    from hexlayout.runtime.alloc import zeroed

    e, g, n = t_egn.shape
    np_ = padded_rows(n, layout.tile[0], gate_up)
    rows = zeroed((e, np_, g), t_egn.dtype, t_egn.device)  # [E, NP, G], padding 0
    cols = t_egn.transpose(1, 2)                             # [E, N, G]
    if gate_up:
        i = n // 2
        rows[:, :i] = cols[:, :i]
        rows[:, np_ // 2:np_ // 2 + i] = cols[:, i:]
    else:
        rows[:, :n] = cols
    flat = layout.apply(rows.reshape(e * np_, g)).contiguous()
    return torch.as_strided(flat, (e, g, n), (np_ * g, np_, 1))


def group_view(t: Any) -> Any:
    """The offline tensor ``[E * NP, G]`` behind the ``[E, G, N]`` view ``relayout_groups``
    returns (strides ``(NP * G, NP, 1)``)."""
    import torch

    e, g, _ = t.shape
    np_ = t.stride(1)
    return torch.as_strided(t, (e * np_, g), (g, 1), t.storage_offset())
