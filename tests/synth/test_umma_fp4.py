"""``hl.mma(..., scale_a=, scale_b=, packed=hl.e2m1)``: FP4 block-scaled GEMMs written in the
language. On sm_100a synthesis picks the FP4 block-scaled ``tcgen05.mma`` the scale tiles call
for (MXFP4: UE8M0 factors per 32 K elements, kind::mxf4 scale_vec::2X; NVFP4: UE4M3 per 16,
kind::mxf4nvf4 scale_vec::4X), describes the packed u8 operand tiles as 8-bit ones (a K = 64 step
is 32 bytes) and gives the factors TMEM columns and bytes; the kernel matches float64 (FP4 values
and factors decoded here by hand) in the emulator on ragged M / N / K and compiles for sm_100a.
Invalid combinations are refused naming the op and its line."""

from __future__ import annotations

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.ir import lowered_tcgen05 as T
from hexlayout.lang.errors import KernelError
from hexlayout.synth.solve import SynthesisError, synthesize

M, N, KH, KS = hl.dims("M N KH KS")
BN = 32
FORMS = {"mxfp4": (hl.u8, 32, "SM100_128x32x64_F32E2M1E2M1_UE8M0_VS32_MXF4_SS"),
         "nvfp4": (hl.ue4m3, 16, "SM100_128x32x64_F32E2M1E2M1_UE4M3_VS16_MXF4NVF4_SS")}


def fp4_gemm(form: str):
    """``c = sum_k a[:, k] sfa[:, k // VS] b[:, k] sfb[:, k // VS]`` over packed e2m1 ``a`` / ``b``
    (``K / 2`` bytes a row); one 128 x 32 tile per block, 256-element (128-byte) k-tiles, ragged edges
    read as zero codes and zero factors."""
    sf, vs, _ = FORMS[form]
    kbt = 256 // vs                      # factors per row per k-tile

    @hl.kernel(threads=128, name=f"fp4_gemm_{form}")
    def gemm(a: hl.u8[M, KH], b: hl.u8[N, KH], sfa: sf[M, KS], sfb: sf[N, KS], c: hl.f32[M, N]):  # type: ignore
        pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(a.shape[0], 128), hl.cdiv(b.shape[0], BN)))
        m0, n0 = pid_m * 128, pid_n * BN
        sa = hl.shared(hl.u8, (128, 128))
        sb = hl.shared(hl.u8, (BN, 128))
        ssa = hl.shared(sf, (128, kbt))
        ssb = hl.shared(sf, (128, kbt))
        ra = hl.register(sf, (128, kbt))
        rb = hl.register(sf, (128, kbt))
        acc = hl.register(hl.f32, (128, BN))
        for kt in hl.range(hl.cdiv(a.shape[1], 128)):
            hl.copy(hl.view(a, (128, 128), (m0, kt * 128)), sa)
            hl.copy(hl.view(b, (BN, 128), (n0, kt * 128)), sb)
            hl.copy(hl.view(sfa, (128, kbt), (m0, kt * kbt)), ra)
            hl.copy(ra, ssa)
            hl.copy(hl.view(sfb, (128, kbt), (n0, kt * kbt)), rb)
            hl.copy(rb, ssb)
            hl.commit_group()
            hl.wait_group(0)
            hl.syncthreads()
            hl.wgmma_fence()
            hl.mma(sa, sb, acc, accumulate=kt > 0, scale_a=ssa, scale_b=ssb, packed=hl.e2m1)
            hl.wgmma_commit()
            hl.wgmma_wait(0)
            hl.syncthreads()
        hl.copy(acc, hl.view(c, (128, BN), (m0, n0)))

    return gemm


_BUILT: dict[str, object] = {}


def _synth(form: str):
    if form not in _BUILT:
        _BUILT[form] = synthesize(fp4_gemm(form).trace(), "sm_100a")
    return _BUILT[form]


def _flat(body):
    for i in body:
        yield i
        for sub in ("body", "then_body", "else_body"):
            yield from _flat(getattr(i, sub, None) or [])


@pytest.mark.parametrize("form", sorted(FORMS))
def test_synthesis_chooses_the_fp4_atom_and_factor_bytes(form) -> None:
    _, vs, atom = FORMS[form]
    s = _synth(form)
    choices = [c for op, c in s.lowered.choices if type(op).__name__ == "Mma"]
    assert choices and choices[0].startswith(f"{atom} x1 (N) x4 (K)"), choices
    ins = list(_flat(s.lowered.kernel.body))
    mmas = [i for i in ins if isinstance(i, T.Tcgen05Mma)]
    cps = [i for i in ins if isinstance(i, T.Tcgen05Cp)]
    nsf = 64 // vs                          # factors per row per MMA: 2X 2, 4X 4
    # MMA s reads k-blocks s*nsf ..: byte (s*nsf) % 4 of column group (s*nsf) // 4
    assert [(i.sfa_id, i.sfb_id) for i in mmas] == [((s * nsf) % 4,) * 2 for s in range(4)]
    groups = 256 // vs // 4                 # 512-byte factor atoms per operand per k-tile
    assert len(cps) == 2 * groups
    # the k-step of A's descriptor: 32 bytes (64 packed e2m1) further each MMA
    offs = [str(i.a.offset) for i in mmas]
    assert len(set(offs)) == 4, offs


def _e2m1(code: np.ndarray) -> np.ndarray:
    s, e, m = (code >> 3) & 1, (code >> 1) & 3, code & 1
    mag = np.where(e == 0, 0.5 * m, (1 + 0.5 * m) * 2.0 ** (e.astype(np.float64) - 1))
    return np.where(s == 1, -mag, mag)


def _factor(b: np.ndarray, form: str) -> np.ndarray:
    b = b.astype(np.int64)
    if form == "mxfp4":
        return 2.0 ** (b - 127.0)
    e, m = (b >> 3) & 15, b & 7
    return np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7.0))


@pytest.mark.parametrize(("form", "m", "n", "k"), [("mxfp4", 150, 40, 320), ("nvfp4", 100, 44, 288)])
def test_fp4_gemm_matches_float64_on_ragged_shapes(form, m, n, k) -> None:
    _, vs, _ = FORMS[form]
    rng = np.random.default_rng(5 + m)
    ca = rng.integers(0, 16, (m, k)).astype(np.uint8)
    cb = rng.integers(0, 16, (n, k)).astype(np.uint8)
    ks = (-(-k // vs) + 15) // 16 * 16   # factor rows padded to 16 bytes (the loads' alignment)
    lo, hi = (122, 132) if form == "mxfp4" else (0x10, 0x48)
    sfa = rng.integers(lo, hi, (m, ks)).astype(np.uint8)
    sfb = rng.integers(lo, hi, (n, ks)).astype(np.uint8)
    pack = lambda c: (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)  # noqa: E731
    c = np.full((m, n), np.nan, np.float32)
    run(_synth(form).lowered.kernel, {"a": pack(ca), "b": pack(cb), "sfa": sfa, "sfb": sfb, "c": c})
    fa = np.repeat(_factor(sfa, form), vs, axis=1)[:, :k]      # padding columns: no K elements
    fb = np.repeat(_factor(sfb, form), vs, axis=1)[:, :k]
    want = (_e2m1(ca) * fa) @ (_e2m1(cb) * fb).T
    np.testing.assert_allclose(c, want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_fp4_off_sm100_is_refused_by_name() -> None:
    with pytest.raises(SynthesisError) as e:
        synthesize(fp4_gemm("nvfp4").trace(), "sm_90a")
    msg = str(e.value)
    assert "block scales (scale_a / scale_b)" in msg and "FP4 kind::mxf4 / mxf4nvf4" in msg, msg
    assert "fp4_gemm_nvfp4" in msg and "packed=hl.e2m1)" in msg, msg


def _bad(which: str):
    @hl.kernel(threads=128, name="bad_fp4")
    def bad(a: hl.u8[M, KH], c: hl.f32[M, N]):
        sa = hl.shared(hl.u8, (128, 64))
        sb = hl.shared(hl.u8, (32, 64))
        s8 = hl.shared(hl.e4m3, (128, 128))
        t8 = hl.shared(hl.e4m3, (32, 128))
        acc = hl.register(hl.f32, (128, 32))
        if which == "ue4m3_2x":              # UE4M3 factors per 32 K elements
            hl.mma(sa, sb, acc, scale_a=hl.shared(hl.ue4m3, (128, 4)), scale_b=hl.shared(hl.ue4m3, (128, 4)),
                   packed=hl.e2m1)
        elif which == "e4m3_16":             # fp8 operands with factors per 16 (mxf4nvf4's)
            hl.mma(s8, t8, acc, scale_a=hl.shared(hl.u8, (128, 8)), scale_b=hl.shared(hl.u8, (128, 8)))
        elif which == "e4m3_packed":         # e4m3 tiles given as packed FP4
            hl.mma(s8, t8, acc, scale_a=hl.shared(hl.u8, (128, 4)), scale_b=hl.shared(hl.u8, (128, 4)),
                   packed=hl.e2m1)
        elif which == "no_scales":
            hl.mma(sa, sb, acc, packed=hl.e2m1)
        else:                                # the scales disagree
            hl.mma(sa, sb, acc, scale_a=hl.shared(hl.ue4m3, (128, 8)), scale_b=hl.shared(hl.u8, (128, 8)),
                   packed=hl.e2m1)

    return bad


@pytest.mark.parametrize(("which", "words"), [
    ("ue4m3_2x", "ue4m3 factors are not valid"),
    ("e4m3_16", "take one factor per 32 K elements, not 16"),
    ("e4m3_packed", "a must be a shared or register u8 tile of packed e2m1 pairs"),
    ("no_scales", "give scale_a and scale_b"),
    ("mixed", "scale_b %"),
])
def test_invalid_fp4_combinations_name_the_op_and_line(which, words) -> None:
    with pytest.raises(KernelError) as e:
        _bad(which).trace()
    msg = str(e.value)
    assert words in msg and "bad_fp4: mma at" in msg and "test_umma_fp4.py:" in msg, msg


@pytest.mark.nvrtc
@pytest.mark.parametrize("form", sorted(FORMS))
def test_fp4_gemm_compiles_for_sm100_without_spills(form) -> None:
    """Printed and compiled by NVRTC for sm_100a: no spills (47 / 48 registers when written), the
    factor copies (UTCCP) and the FP4 block-scaled MMA in the SASS."""
    from hexlayout.codegen import generate
    from hexlayout.runtime import compile_cuda
    from hexlayout.runtime.sass import count_prefix

    g = generate(_synth(form).lowered.kernel)
    kind = {"mxfp4": "kind::mxf4.block_scale.scale_vec::2X",
            "nvfp4": "kind::mxf4nvf4.block_scale.scale_vec::4X"}
    assert kind[form] in g.source
    ck = compile_cuda(g.source, "sm_100a", name=g.name, backend="nvrtc", cache=False)
    assert ck.resources is not None and not ck.resources.spills and ck.resources.stack_frame == 0, ck.log
    counts = ck.sass_counts()
    assert count_prefix(counts, "UTCCP") >= 2, sorted(counts)
    # the FP4 block-scaled MMA: UTCOMMA (2X), UTCOMMA.4X (NVFP4), one per K = 64 step of the k-tile
    sass = {"mxfp4": "UTCOMMA", "nvfp4": "UTCOMMA.4X"}[form]
    assert counts.get(sass, 0) == 4, sorted(counts)
