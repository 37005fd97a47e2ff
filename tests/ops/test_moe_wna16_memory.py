"""The prepared W4A16 expert tensors against the checkpoint's bytes (issue 26, item 2: the plugin
replaces vLLM's packed parameters by them, within 1.05x).

Per weight, with group size ``G``: AWQ's checkpoint holds ``1/2`` byte (the 4-bit value) ``+
2/G`` (an f16 scale) ``+ 1/(2G)`` (a 4-bit zero point); the prepared tensors ``1/2 + 2/G + 1/G``
(the zero point a byte): ``(1/2 + 3/G) / (1/2 + 5/(2G))``, 1.027x at G = 32. MXFP4's checkpoint holds
``1/2 + 1/32`` (an e8m0 byte per 32 values), the prepared tensors the same (the scales stay
bytes): 1.00x. Shapes are whole tiles (no padding), as in the vLLM stage's tiny models.
"""

from __future__ import annotations

import torch
from hexlayout.ops import prepare_mxfp4, prepare_wna16

#: the issue's bound on the prepared layer's bytes over the checkpoint's
BOUND = 1.05


def _nbytes(*tensors) -> int:
    return sum(t.numel() * t.element_size() for t in tensors if t is not None)


def _prepared_bytes(p) -> int:
    return _nbytes(p.qweight, p.scales, p.zeros, p.perm)


def test_awq_g32_prepared_bytes_within_bound() -> None:
    gen = torch.Generator().manual_seed(0)
    e, k, n, g = 2, 128, 64, 32
    qw, qz = (torch.randint(-2**31, 2**31 - 1, shape, generator=gen, dtype=torch.int64).to(torch.int32)
              for shape in ((e, k, n // 8), (e, k // g, n // 8)))
    s = torch.rand(e, k // g, n, generator=gen).to(torch.float16)
    p = prepare_wna16(qw, s, qz, quant_format="awq", bits=4, group_size=g, arch="sm_80")
    assert p.zeros.dtype == torch.uint8 and tuple(p.zeros.shape) == (e, k // g, n)
    ratio = _prepared_bytes(p) / _nbytes(qw, qz, s)
    assert ratio <= BOUND, ratio
    assert abs(ratio - (0.5 + 3 / g) / (0.5 + 2.5 / g)) < 1e-9, ratio  # a byte per zero point


def test_mxfp4_prepared_bytes_equal_the_checkpoint() -> None:
    gen = torch.Generator().manual_seed(1)
    e, n, k = 2, 64, 128
    w = torch.randint(0, 256, (e, n, k // 2), generator=gen, dtype=torch.uint8)
    s = torch.randint(120, 135, (e, n, k // 32), generator=gen, dtype=torch.uint8)
    p = prepare_mxfp4(w, s, dtype=torch.bfloat16, arch="sm_80")
    assert p.scales.dtype == torch.uint8 and p.dtype == torch.bfloat16
    assert _prepared_bytes(p) == _nbytes(w, s)
