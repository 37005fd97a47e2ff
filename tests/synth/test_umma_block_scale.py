"""``hl.mma(..., scale_a=, scale_b=)``: block-scaled fp8 products. On sm_100a synthesis picks the
block-scaled ``tcgen05.mma`` (kind::mxf8f6f4), gives the scale tiles the layout ``tcgen05.cp``
reads and the factors TMEM columns; the lowered kernel matches float64 in the emulator and
compiles for sm_100a. Elsewhere the op is refused by name."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.arch.block_scale import scale_smem_layout
from hexlayout.emulator import run
from hexlayout.ir import lowered as L
from hexlayout.ir import lowered_tcgen05 as T
from hexlayout.lang.errors import KernelError
from hexlayout.synth.solve import SynthesisError, synthesize

M, N, K, KB, NP = hl.dims("M N K KB NP")


@hl.kernel(threads=128, name="bs_gemm")
def bs_gemm(a: hl.e4m3[M, K], b: hl.e5m2[N, K], sfa: hl.u8[M, KB], sfb: hl.u8[NP, KB], c: hl.f32[M, N]):
    """``c = sum_kb (a * 2^(sfa - 127)) @ (b * 2^(sfb - 127))^T`` per 32-wide k-block (sfb's rows
    past N padding to 128), one 128-wide k-tile per iteration."""
    sa = hl.shared(hl.e4m3, (128, 128))
    sb = hl.shared(hl.e5m2, (32, 128))
    ssa = hl.shared(hl.u8, (128, 4))
    ssb = hl.shared(hl.u8, (128, 4))
    acc = hl.register(hl.f32, (128, 32))
    ra = hl.register(hl.u8, (128, 4))
    rb = hl.register(hl.u8, (128, 4))
    for kt in hl.range(a.shape[1] // 128):
        hl.copy(a.tile((128, 128), (0, kt * 128)), sa)
        hl.copy(b.tile((32, 128), (0, kt * 128)), sb)
        hl.copy(sfa.tile((128, 4), (0, kt * 4)), ra)
        hl.copy(ra, ssa)
        hl.copy(sfb.tile((128, 4), (0, kt * 4)), rb)
        hl.copy(rb, ssb)
        hl.commit_group()
        hl.wait_group(0)
        hl.syncthreads()
        hl.wgmma_fence()
        hl.mma(sa, sb, acc, accumulate=kt > 0, scale_a=ssa, scale_b=ssb)
        hl.wgmma_commit()
        hl.wgmma_wait(0)
        hl.syncthreads()
    hl.copy(acc, c.tile((128, 32), (0, 0)))


@pytest.fixture(scope="module")
def synthesized():
    return synthesize(bs_gemm.trace(), "sm_100a")


def _flat(body):
    for i in body:
        yield i
        for sub in ("body", "then_body", "else_body"):
            yield from _flat(getattr(i, sub, None) or [])


def test_synthesis_chooses_the_block_scaled_atom_and_the_cp_layout(synthesized) -> None:
    choices = [c for op, c in synthesized.lowered.choices if type(op).__name__ == "Mma"]
    assert choices and choices[0].startswith("SM100_128x32x32_F32E4M3E5M2_UE8M0_SS x1 (N) x4 (K)"), choices
    ins = list(_flat(synthesized.lowered.kernel.body))
    cps = [i for i in ins if isinstance(i, T.Tcgen05Cp)]
    mmas = [i for i in ins if isinstance(i, T.Tcgen05Mma)]
    assert len(cps) == 2 and all(i.shape == "32x128b.warpx4" and i.src.sbo == 128 for i in cps)
    assert [(i.sfa_id, i.sfb_id) for i in mmas] == [(k, k) for k in range(4)]
    assert {b.name for b in synthesized.lowered.kernel.smem} >= {"ssa", "ssb"}
    for name in ("ssa", "ssb"):
        v = next(v for v in synthesized.kernel.values() if v.name == name)
        assert str(synthesized.assignment.layout_of(v)) == str(scale_smem_layout(128, 4))
    # TMEM: the accumulator's 32 columns, then 4 columns of A's and 4 of B's factors
    assert [str(i.taddr) for i in cps] == [str(mmas[0].sfa), str(mmas[0].sfb)]
    assert "32" in str(cps[0].taddr) and "36" in str(cps[1].taddr), [str(i.taddr) for i in cps]
    assert next(i for i in ins if isinstance(i, T.TmemAlloc)).ncols == 64
    assert any(isinstance(i, L.FenceProxyAsync) for i in ins)   # st.shared of the factors, then tcgen05.cp


def test_block_scaled_gemm_matches_float64(synthesized) -> None:
    rng = np.random.default_rng(12)
    k = 256
    a = rng.uniform(-2, 2, (128, k)).astype(ml_dtypes.float8_e4m3fn)
    b = rng.uniform(-2, 2, (32, k)).astype(ml_dtypes.float8_e5m2)
    sa = rng.integers(118, 136, (128, k // 32)).astype(np.uint8)
    sb = rng.integers(118, 136, (128, k // 32)).astype(np.uint8)
    c = np.full((128, 32), np.nan, np.float32)
    run(synthesized.lowered.kernel, {"a": a, "b": b, "sfa": sa, "sfb": sb, "c": c})
    fa = np.repeat(np.ldexp(1.0, sa.astype(np.int64) - 127), 32, axis=1)
    fb = np.repeat(np.ldexp(1.0, sb[:32].astype(np.int64) - 127), 32, axis=1)
    want = (a.astype(np.float64) * fa) @ (b.astype(np.float64) * fb).T
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_block_scales_off_sm100_are_refused_by_name() -> None:
    with pytest.raises(SynthesisError) as e:
        synthesize(bs_gemm.trace(), "sm_90a")
    msg = str(e.value)
    assert "block scales (scale_a / scale_b)" in msg and "sm_100a" in msg
    assert "bs_gemm" in msg and "hl.mma(sa, sb, acc, accumulate=kt > 0, scale_a=ssa, scale_b=ssb)" in msg


def _bad(which: str):
    @hl.kernel(threads=128, name="bad_scales")
    def bad(a: hl.e4m3[M, K], b: hl.e4m3[N, K], c: hl.f32[M, N]):
        sa = hl.shared(hl.e4m3, (128, 64))
        sb = hl.shared(hl.e4m3, (32, 64))
        s8 = hl.shared(hl.u8, (128, 2))
        s16 = hl.shared(hl.f16, (128, 2))
        acc = hl.register(hl.f32, (128, 32))
        if which == "one":
            hl.mma(sa, sb, acc, scale_a=s8)
        elif which == "dtype":
            hl.mma(sa, sb, acc, scale_a=s8, scale_b=s16)
        else:
            hl.mma(sa, sb, acc, scale_a=s8, scale_b=hl.shared(hl.u8, (32, 2)))

    return bad


@pytest.mark.parametrize(("which", "words"), [
    ("one", "give both scale_a and scale_b"),
    ("dtype", "must be a u8 (128, 2) tile of UE8M0 exponents"),
    ("rows", "scale_b %"),
])
def test_scale_argument_errors_name_the_op(which, words) -> None:
    with pytest.raises(KernelError) as e:
        _bad(which).trace()
    assert words in str(e.value) and "bad_scales: mma at" in str(e.value)


@pytest.mark.nvrtc
def test_synthesized_block_scaled_gemm_compiles_for_sm100(synthesized) -> None:
    from hexlayout.codegen import generate
    from hexlayout.runtime import compile_cuda
    from hexlayout.runtime.sass import count_prefix

    g = generate(synthesized.lowered.kernel)
    ck = compile_cuda(g.source, "sm_100a", name=g.name, backend="nvrtc", cache=False)
    assert ck.resources is not None and not ck.resources.spills and ck.resources.stack_frame == 0, ck.log
    counts = ck.sass_counts()
    assert count_prefix(counts, "UTCCP") >= 2 and count_prefix(counts, "UTCQMMA") >= 1, sorted(counts)
