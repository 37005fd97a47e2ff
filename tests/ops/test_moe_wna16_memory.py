"""An MoE layer's expert parameter bytes with the plugin on (the prepared tensors, which replace
vLLM's packed parameters) against vLLM's own layout (the parameters its ``create_weights``
allocates for the checkpoint), within 1.05x, for every quantized method the plugin serves:
AWQ, GPTQ 4-bit (groups, per channel, act-order) and 8-bit (int8 W8A16), MXFP4.

Per weight, with group size ``G`` (``s``: the scales' 2 bytes; the layer's ``w13`` and ``w2``
alike): AWQ's checkpoint holds ``1/2`` byte (the 4-bit value) ``+ 2/G`` (a scale) ``+ 1/(2G)``
(a 4-bit zero point), the prepared tensors ``1/2 + 2/G + 1/G`` (the zero point a byte):
``(1/2 + 3/G) / (1/2 + 5/(2G))``, 1.027x at G = 32, 1.008x at 128. GPTQ's checkpoint holds
``bits/8 + 2/G + bits/(8G)`` (vLLM allocates ``qzeros`` though the zero point is the constant
``2^(bits-1)``), the prepared tensors ``bits/8 + 2/G`` (``qzeros`` released); act-order adds
``g_idx`` int32 per row of K on both sides (the prepared permutation takes its place). MXFP4's
checkpoint holds ``1/2 + 1/32`` (an e8m0 byte per 32 values), the prepared tensors the same (the
scales stay bytes): 1.00x. Shapes are whole tiles (no padding), as in the vLLM stage's tiny
models; padding adds ``NP / N`` (rows to 64) and ``KP / K`` (K to k-tiles) to the weights.
"""

from __future__ import annotations

import pytest
import torch
from hexlayout.ops import prepare_mxfp4, prepare_wna16

#: the issue's bound on the prepared layer's bytes over vLLM's
BOUND = 1.05
#: experts, hidden size, intermediate size (w13: K = H, N = 2I; w2: K = I, N = H)
E, H, I = 2, 128, 128


def _nbytes(tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _prepared(p) -> list:
    return [p.qweight, p.scales, p.zeros, p.perm]


def _g_idx(k: int, g: int, gen) -> torch.Tensor:
    """An act-order ``g_idx`` ``[E, K]``: each group ``G`` rows, scattered over K."""
    return torch.stack([torch.randperm(k, generator=gen) // g for _ in range(E)]).to(torch.int32)


def _words(shape, gen) -> torch.Tensor:
    return torch.randint(-2**31, 2**31 - 1, shape, generator=gen, dtype=torch.int64).to(torch.int32)


def _wna16_layer(fmt: str, bits: int, g: int, act_order: bool) -> tuple[list, list]:
    """vLLM's parameters of one layer (``create_weights``'s shapes) and the prepared tensors."""
    gen = torch.Generator().manual_seed(bits * 1000 + g + act_order)
    per = 32 // bits
    vllm, ours = [], []
    for k, n, gate_up in ((H, 2 * I, True), (I, H, False)):
        groups = 1 if g == -1 else k // g
        s = (torch.rand(E, groups, n, generator=gen) + 0.5).to(torch.float16)
        gi = _g_idx(k, g, gen) if act_order else None
        if fmt == "awq":   # [E, K, N/8] packed along N, zero points [E, G, N/8]
            qw, qz = _words((E, k, n // per), gen), _words((E, groups, n // per), gen)
            p = prepare_wna16(qw, s, qz, quant_format="awq", bits=4, group_size=g, gate_up=gate_up,
                              arch="sm_80")
        else:              # [E, K/p, N] packed along K; qzeros allocated, unused (symmetric)
            qw, qz = _words((E, k // per, n), gen), _words((E, groups, n // per), gen)
            p = prepare_wna16(qw, s, None, quant_format="gptq", bits=bits, group_size=g, g_idx=gi,
                              gate_up=gate_up, arch="sm_80")
        vllm += [qw, s, qz, gi]
        ours += _prepared(p)
    return vllm, ours


CASES = {  # name -> (format, bits, group, act-order, the ratio per weight (see the docstring))
    "awq g32": ("awq", 4, 32, False, (1 / 2 + 3 / 32) / (1 / 2 + 5 / 64)),
    "awq g128": ("awq", 4, 128, False, (1 / 2 + 3 / 128) / (1 / 2 + 5 / 256)),
    "gptq-4 g128": ("gptq", 4, 128, False, (1 / 2 + 2 / 128) / (1 / 2 + 2.5 / 128)),
    "gptq-4 channel": ("gptq", 4, -1, False, (1 / 2 + 2 / H) / (1 / 2 + 2.5 / H)),
    "gptq-4 g128 act-order": ("gptq", 4, 128, True, None),
    "gptq-8 g128 (int8 W8A16)": ("gptq", 8, 128, False, (1 + 2 / 128) / (1 + 3 / 128)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_prepared_wna16_layer_bytes_within_bound(case) -> None:
    fmt, bits, g, act_order, want = CASES[case]
    vllm, ours = _wna16_layer(fmt, bits, g, act_order)
    ratio = _nbytes(ours) / _nbytes(vllm)
    assert ratio <= BOUND, (case, ratio)
    if want is not None:
        assert abs(ratio - want) < 1e-9, (case, ratio, want)
    else:   # act-order: g_idx int32 [E, K] and the permutation int32 [E, K] add alike
        base = _wna16_layer(fmt, bits, g, False)
        extra = 4 * E * (H + I)
        assert _nbytes(ours) - _nbytes(base[1]) == _nbytes(vllm) - _nbytes(base[0]) == extra


def test_awq_zero_points_are_bytes() -> None:
    gen = torch.Generator().manual_seed(0)
    k, n, g = 128, 64, 32
    qw, qz = _words((E, k, n // 8), gen), _words((E, k // g, n // 8), gen)
    s = torch.rand(E, k // g, n, generator=gen).to(torch.float16)
    p = prepare_wna16(qw, s, qz, quant_format="awq", bits=4, group_size=g, arch="sm_80")
    assert p.zeros.dtype == torch.uint8 and tuple(p.zeros.shape) == (E, k // g, n)
    # the k-th nibble (AWQ's column order 0 2 4 6 1 3 5 7) of each word, one byte each, in the
    # offline order of the zero points (n = 64: no padded rows), undone by its permutation
    from hexlayout.ops.moe.wna16 import zero_point
    from hexlayout.ops.moe.wna16_layout import group_view, wna16_offline_layouts

    from hexlayout.lang import f16

    lay = wna16_offline_layouts("sm_80", f16, 4, k, g, False, zero=zero_point("awq", 4))["z"]
    flat = group_view(p.zeros)
    assert flat.shape == (E * n, k // g) and p.zeros.is_contiguous()
    logical = flat.reshape(-1)[torch.from_numpy(lay.permutation(tuple(flat.shape)))]
    order = [0, 4, 1, 5, 2, 6, 3, 7]
    want = torch.stack([(qz >> (4 * order[j])) & 15 for j in range(8)], dim=-1).reshape(E, k // g, n)
    assert torch.equal(logical.reshape(E, n, k // g).transpose(1, 2).to(torch.int32), want)


def test_mxfp4_layer_bytes_equal_vllms() -> None:
    gen = torch.Generator().manual_seed(1)
    vllm, ours = [], []
    for k, n, gate_up in ((H, 2 * I, True), (I, H, False)):   # w13_weight [E, 2I, H/2], w2 [E, H, I/2]
        w = torch.randint(0, 256, (E, n, k // 2), generator=gen, dtype=torch.uint8)
        s = torch.randint(120, 135, (E, n, k // 32), generator=gen, dtype=torch.uint8)
        p = prepare_mxfp4(w, s, dtype=torch.bfloat16, gate_up=gate_up, arch="sm_80")
        assert p.scales.dtype == torch.uint8 and p.dtype == torch.bfloat16
        vllm += [w, s]
        ours += _prepared(p)
    assert _nbytes(ours) == _nbytes(vllm)
