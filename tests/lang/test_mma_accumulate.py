"""``hl.mma(..., accumulate=...)``: ``False`` gives ``c = a @ b^T`` without reading ``c``; a run-time
expression (``kt > 0`` in a k-loop) chooses per call. The accumulator here starts as NaN, so any
read of its old value shows in the result. wgmma (sm_90a) carries the flag as the scale-d operand
of its first k-step (no zeroing instruction before it); mma.sync (sm_80) zeroes or selects the
accumulator first. Emulated against float64; the printed op shows the flag."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.errors import HexlayoutError
from hexlayout.ir.lowered import Alu, Wgmma
from hexlayout.synth.solve import synthesize

M, N, K = hl.dims("M N K")
NAN = float("nan")


def k_loop(arch: str, mode: str):
    """``c = sum over k-tiles of a_k @ b_k^T`` (64 x 64, k-tiles of 64), the first k-tile's mma
    with ``accumulate`` = ``kt > 0`` (``"runtime"``) or each k-tile's ``False`` (``"last"``:
    only the last tile's product remains)."""

    @hl.kernel(threads=128, name=f"acc_{mode}")
    def k(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
        sa = hl.shared(hl.f16, (64, 64))
        sb = hl.shared(hl.f16, (64, 64))
        acc = hl.full((64, 64), NAN, hl.f32)
        for kt in hl.range(hl.cdiv(a.shape[1], 64)):
            hl.syncthreads()
            hl.copy(a.tile((64, 64), (0, kt * 64)), sa)
            hl.copy(b.tile((64, 64), (0, kt * 64)), sb)
            hl.commit_group()
            hl.wait_group(0)
            flag = kt > 0 if mode == "runtime" else False
            if arch == "sm_90a":
                hl.fence_proxy_async()
                hl.syncthreads()
                hl.wgmma_fence()
                hl.mma(sa, sb, acc, accumulate=flag)
                hl.wgmma_commit()
                hl.wgmma_wait(0)
            else:
                hl.syncthreads()
                ra = hl.register(hl.f16, (64, 64))
                rb = hl.register(hl.f16, (64, 64))
                hl.copy(sa, ra)
                hl.copy(sb, rb)
                hl.mma(ra, rb, acc, accumulate=flag)
        hl.copy(acc, c.tile((64, 64), (0, 0)))

    return k


def _flat(body):
    for i in body:
        yield i
        for sub in ("body", "then_body", "else_body"):
            yield from _flat(getattr(i, sub, []))


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize("mode", ["runtime", "last"])
def test_mma_without_accumulating_ignores_the_old_accumulator(arch: str, mode: str) -> None:
    rng = np.random.default_rng(21)
    kt = 3
    a = rng.standard_normal((64, 64 * kt)).astype(np.float16)
    b = rng.standard_normal((64, 64 * kt)).astype(np.float16)
    tk = k_loop(arch, mode).trace()
    syn = synthesize(tk, arch)
    c = np.zeros((64, 64), np.float32)
    run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    want = a64 @ b64.T if mode == "runtime" else a64[:, -64:] @ b64[:, -64:].T
    assert np.all(np.isfinite(c))
    np.testing.assert_allclose(c, want, rtol=1e-4, atol=1e-3)
    instrs = list(_flat(syn.lowered.kernel.body))
    if arch == "sm_90a":
        # the first k-step's wgmma carries the flag; later k-steps accumulate (scale-d 1)
        scales = [str(i.scale_d) for i in instrs if isinstance(i, Wgmma)]
        assert len(scales) == 4 and scales[1:] == ["1"] * 3 and scales[0] != "1", scales
    else:
        assert any(isinstance(i, Alu) and i.op.name in ("select", "mov")
                   and i.dst.array.name.startswith("acc") for i in instrs)
    assert ("accumulate=" in str(tk)) and ("accumulate=False" in str(tk)) == (mode == "last")


def test_accumulate_must_be_a_flag_or_a_scalar_expression() -> None:
    @hl.kernel(threads=128, name="bad_accumulate")
    def k(a: hl.f16[M, K], b: hl.f16[N, K], c: hl.f32[M, N]):
        ra = hl.register(hl.f16, (64, 16))
        rb = hl.register(hl.f16, (64, 16))
        acc = hl.zeros((64, 64), hl.f32)
        hl.mma(ra, rb, acc, accumulate=acc)

    with pytest.raises(HexlayoutError, match="accumulate=.* must be True, False or a scalar integer"):
        k.trace()
