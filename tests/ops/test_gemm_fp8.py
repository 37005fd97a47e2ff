"""``hexlayout.ops.gemm_fp8``: the dense e4m3 GEMM with per-token-group activation scales and 128 x 128
weight block scales, in the emulator (``HEXLAYOUT_EMULATE_ARCH`` sm_89, sm_90a, sm_100a) against
float64 from the dequantized operands on fresh random data, ragged M / N / K with the k-loop over
more k-tiles than the ring has stages; UE8M0 scales through sm_100a's block-scaled MMA; the fake
(meta) path; the argument errors; the NVRTC builds (no spills, the fp8 MMA in the SASS)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops

from hexlayout.runtime.args import ArgumentError, ArgumentTypeError  # noqa: E402

F8 = torch.float8_e4m3fn


def make(seed: int, m: int, n: int, k: int, pow2: bool = False):
    """Random e4m3 operands (values over e4m3's range) and positive f32 scales (powers of two from
    2^-9 to 2^3 when ``pow2``, 2^-127 included)."""
    g = torch.Generator().manual_seed(seed)
    a = (torch.randn(m, k, generator=g) * 40).clamp(-448, 448).to(F8)
    b = (torch.randn(n, k, generator=g) * 40).clamp(-448, 448).to(F8)
    kb, nb = -(-k // 128), -(-n // 128)
    if pow2:
        sa = torch.exp2(torch.randint(-9, 4, (m, kb), generator=g).float())
        sb = torch.exp2(torch.randint(-9, 4, (nb, kb), generator=g).float())
        sa[0, 0] = 2.0 ** -127
    else:
        sa = torch.rand(m, kb, generator=g) * 0.02 + 1e-3
        sb = torch.rand(nb, kb, generator=g) * 0.02 + 1e-3
    return a, b, sa, sb


def reference(a, b, sa, sb, bias=None):
    """float64 ``(a * sa) @ (b * sb)^T + bias`` from the dequantized operands."""
    k = a.shape[1]
    ad = a.double() * sa.double().repeat_interleave(128, 1)[:, :k]
    bd = b.double() * sb.double().repeat_interleave(128, 0)[: b.shape[0]].repeat_interleave(128, 1)[:, :k]
    out = ad @ bd.T
    return out if bias is None else out + bias.double()


def check(out, ref, dtype):
    assert out.dtype == dtype and out.shape == ref.shape
    assert torch.isfinite(out).all()                      # outputs start NaN: every element written
    torch.testing.assert_close(out.double(), ref, rtol=1e-2, atol=1e-2 * ref.abs().max().item())


def _tag(dtype):
    return {torch.bfloat16: "bf16", torch.float16: "f16"}[dtype]


@pytest.mark.parametrize(("arch", "seed", "m", "n", "k", "dtype", "bias", "kernel"), [
    # ragged M over 64 / 128-row tiles, N over 64 and 128, K: 6 k-tiles (the last 16 wide), rings wrap
    ("sm_89", 1, 70, 200, 656, torch.bfloat16, True, "gemm_fp8_sm89"),
    # > 64 rows: warp-specialized, 9 k-tiles through its 6-stage ring
    ("sm_90a", 2, 140, 200, 1040, torch.float16, True, "gemm_fp8_sm90_ws"),
    ("sm_100a", 3, 140, 200, 1040, torch.bfloat16, False, "gemm_fp8_sm100_ws"),
    ("sm_90a", 4, 5, 72, 144, torch.bfloat16, False, "gemm_fp8_sm90"),     # decode: 16-row tiles, 2 k-tiles
    ("sm_100a", 11, 40, 200, 656, torch.float16, True, "gemm_fp8_sm100"),   # swap-AB, 64-row tiles
])
def test_gemm_fp8_matches_float64(arch, seed, m, n, k, dtype, bias, kernel, built, monkeypatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    a, b, sa, sb = make(seed, m, n, k)
    bs = torch.randn(n).to(dtype) if bias else None
    out = hexlayout.ops.gemm_fp8(a, b, sa, sb, out_dtype=dtype, bias=bs, scale_format="auto")
    check(out, reference(a, b, sa, sb, bs), dtype)
    assert built == [f"{kernel}_{_tag(dtype)}"]            # general scales: the register path


@pytest.mark.parametrize(("arch", "kernel"), [("sm_100a", "gemm_fp8_sm100_ue8m0"),
                                              ("sm_90a", "gemm_fp8_sm90_ws"), ("sm_89", "gemm_fp8_sm89")])
def test_ue8m0_scales_run_in_the_block_scaled_mma_on_sm100(arch, kernel, built, monkeypatch) -> None:
    """Powers-of-two scales (``scale_format="auto"`` reads them, ``"ue8m0"`` vouches): on sm_100a the
    block-scaled ``tcgen05.mma`` applies both sides' factors; elsewhere the register path runs."""
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    a, b, sa, sb = make(5, 70, 200, 528, pow2=True)      # two row tiles, the second of 6 rows
    bias = torch.randn(200, dtype=torch.float32)
    ref = reference(a, b, sa, sb, bias)
    for fmt in ("auto", "ue8m0"):
        check(hexlayout.ops.gemm_fp8(a, b, sa, sb, bias=bias, scale_format=fmt), ref, torch.bfloat16)
    assert built == [f"{kernel}_bf16"] * 2


def test_column_major_activation_scales_are_read_in_place(built, monkeypatch) -> None:
    """``a_scale`` with strides ``(1, M)`` (vLLM's ``column_major_scales=True``): the kernel gets its
    ``[K / 128, M]`` storage itself (no copy) and the result is the row-major call's."""
    from hexlayout.ops.host import launch

    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")
    a, b, sa, sb = make(9, 20, 64, 400)
    col = sa.t().contiguous().t()
    assert col.stride() == (1, 20) and not col.is_contiguous()
    seen = []
    real = launch.run_kernel

    def spy(bld, args, **kw):
        seen.append(args[1])
        return real(bld, args, **kw)

    monkeypatch.setattr(launch, "run_kernel", spy)
    out = hexlayout.ops.gemm_fp8(a, b, col, sb)
    assert seen[0].data_ptr() == col.data_ptr() and seen[0].shape == (4, 20)
    check(out, reference(a, b, sa, sb), torch.bfloat16)
    torch.testing.assert_close(out, hexlayout.ops.gemm_fp8(a, b, sa, sb), rtol=0, atol=0)


def test_rows_beyond_one_launch_run_as_row_slices(built, monkeypatch) -> None:
    """More rows than one launch takes (the grid's 65,535 row tiles or 32-bit indices; here forced to
    64): row slices of ``a``, its scales and ``c``, one launch each, the same result."""
    from hexlayout.ops.gemm import fp8

    assert fp8.rows_per_launch(64, 16, 32) == 65535 * 64                     # the grid's row tiles
    assert fp8.rows_per_launch(64, 7168, 18432) == 116416     # 32-bit indices: 116416 * 18432 < 2^31
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_89")
    monkeypatch.setattr(fp8, "rows_per_launch", lambda bm, n, k: 64)
    from hexlayout.ops.host import launch

    rows, real = [], launch.run_kernel

    def spy(bld, args, **kw):
        rows.append(args[0].shape[0])
        return real(bld, args, **kw)

    monkeypatch.setattr(launch, "run_kernel", spy)
    a, b, sa, sb = make(12, 150, 72, 272)
    check(hexlayout.ops.gemm_fp8(a, b, sa, sb), reference(a, b, sa, sb), torch.bfloat16)
    assert built == ["gemm_fp8_sm89_bf16"] and rows == [64, 64, 22]


def test_general_scales_never_take_the_block_scaled_mma(built) -> None:
    a, b, sa, sb = make(6, 24, 64, 256)
    sa[0, 0] = 3.0                                          # one scale not a power of two
    check(hexlayout.ops.gemm_fp8(a, b, sa, sb, scale_format="auto"), reference(a, b, sa, sb), torch.bfloat16)
    assert built == ["gemm_fp8_sm100_bf16"]
    with pytest.raises(ArgumentError, match="a_scale.*not a power of two"):
        hexlayout.ops.gemm_fp8(a, b, sa, sb, scale_format="ue8m0")


def test_torch_compile_fullgraph_runs_the_op(monkeypatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_89")
    a, b, sa, sb = make(10, 9, 48, 160)
    bias = torch.randn(48)

    def layer(a, sa, bias):
        return torch.ops.hexlayout.gemm_fp8(a, b, sa, sb, out_dtype=torch.float16, bias=bias) * 2

    out = torch.compile(layer, backend="eager", fullgraph=True)(a, sa, bias)
    check(out, 2 * reference(a, b, sa, sb, bias), torch.float16)


def test_fake_path_gives_the_output_and_checks_as_eager(monkeypatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")
    a, b, sa, sb = (t.to("meta") for t in make(7, 33, 80, 160))
    out = torch.ops.hexlayout.gemm_fp8(a, b, sa, sb, out_dtype=torch.float16)
    assert out.device.type == "meta" and out.shape == (33, 80) and out.dtype == torch.float16
    assert torch.ops.hexlayout.gemm_fp8(a, b, sa, sb).dtype == torch.bfloat16
    with pytest.raises(ArgumentError, match="b_scale.*must have shape"):
        torch.ops.hexlayout.gemm_fp8(a, b, sa, sb[:, :1])
    from torch._subclasses.fake_tensor import FakeTensorMode

    a, b, sa, sb = make(7, 33, 80, 160)
    with FakeTensorMode() as mode:
        fa, fb, fsa, fsb = (mode.from_tensor(t) for t in (a, b, sa, sb))
        assert torch.ops.hexlayout.gemm_fp8(fa, fb, fsa, fsb, scale_format="auto").shape == (33, 80)
        with pytest.raises(ArgumentError, match="'a'.*multiple of 16"):
            torch.ops.hexlayout.gemm_fp8(fa[:, :40], fb[:, :40], fsa[:, :1], fsb[:, :1])


def test_errors_name_the_argument(monkeypatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_89")
    a, b, sa, sb = make(8, 8, 64, 128)
    f = hexlayout.ops.gemm_fp8
    cases = [
        ((a.to(torch.bfloat16), b, sa, sb), {}, ArgumentTypeError, r"'a'.*float8_e4m3fn"),
        ((a, b[:, :112].contiguous(), sa, sb), {}, ArgumentError, r"'b'.*\[N, K\] with K = 128"),
        ((a[:, :120].contiguous(), b[:, :120].contiguous(), sa, sb), {}, ArgumentError,
         r"'a'.*multiple of 16"),
        ((a, b, sa.double(), sb), {}, ArgumentTypeError, r"'a_scale'.*float32"),
        ((a, b, sa[:, :0], sb), {}, ArgumentError, r"'a_scale'.*shape \[8, 1\]"),
        ((a, b, sa, torch.ones(2, 1)), {}, ArgumentError, r"'b_scale'.*shape \[1, 1\]"),
        ((a, b, sa, sb), {"out_dtype": torch.float32}, ArgumentTypeError, r"'out_dtype'.*bfloat16"),
        ((a, b, sa, sb), {"bias": torch.ones(63)}, ArgumentError, r"'bias'.*\[64\]"),
        ((a, b, sa, sb), {"bias": torch.ones(64, dtype=torch.float16)}, ArgumentTypeError,
         r"'bias'.*float32"),
        ((a, b, sa, sb), {"scale_format": "e8m0"}, ArgumentError, r"'scale_format'"),
        ((a, b.t(), sa, sb), {}, ArgumentError, r"'b'"),
        ((torch.cat([a, a], 1)[:, :128], b, sa, sb), {}, ArgumentError, r"'a'.*contiguous"),
    ]
    for args, kw, exc, msg in cases:
        with pytest.raises(exc, match=msg):
            f(*args, **kw)
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_80")
    with pytest.raises(ArgumentError, match=r"'a'.*e4m3 mma.*sm_80"):
        f(a, b, sa, sb)


@pytest.mark.nvrtc
@pytest.mark.parametrize(("m", "arch", "ue8m0", "mma"), [
    (64, "sm_89", False, "QMMA.16832"), (64, "sm_90a", False, "QGMMA"), (512, "sm_90a", False, "QGMMA"),
    (64, "sm_100a", False, "UTCQMMA"), (512, "sm_100a", False, "UTCQMMA"), (64, "sm_100a", True, "UTCQMMA")])
def test_kernels_compile_without_spills_with_the_fp8_mma(m, arch, ue8m0, mma) -> None:
    """NVRTC, every kernel the op builds (64-row tiles, and the 128-row warp-specialized kernel of
    512 rows): no spills or local memory; the e4m3 MMA (QMMA.16832 sm_89, QGMMA sm_90a, UTCQMMA
    sm_100a) in the main loop; the block-scaled kernel scales nothing in registers in it (no FMUL /
    FFMA) and copies factors to TMEM (UTCCP)."""
    from hexlayout.ops.gemm.fp8 import fp8_gemm_config

    from hexlayout.lang import bf16
    from hexlayout.runtime import build
    from hexlayout.runtime.stats import build_stats

    factory, consts = fp8_gemm_config(m, arch, ue8m0)
    st = build_stats(build(factory(bf16), arch, **consts, HAS_BIAS=True))
    assert not st.spills and st.stack_frame == 0, st.summary()
    assert not st.warnings, st.warnings     # e.g. NVRTC's #549-D, a register stored to TMEM unset
    lp = st.main_loop
    assert lp is not None and lp.mma_opcode.startswith(mma), st.summary()
    if ue8m0:
        assert any(o.startswith("UTCCP") for o in lp.mix), lp.mix
        assert not any(o.startswith(("FFMA", "FMUL")) for o in lp.mix), lp.mix


@pytest.mark.gpu
@pytest.mark.parametrize("m", [1, 40, 300])
@pytest.mark.parametrize("pow2", [False, True])
def test_cuda_matches_float64(m, pow2) -> None:
    """On an sm_89+ GPU: every kernel the op picks (decode, 64-row, warp-specialized; UE8M0 through
    the block-scaled MMA on sm_100a) against float64 on DeepSeek-like ragged sizes, and the op
    replayed in a CUDA graph on new activations."""
    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev) < (8, 9):
        pytest.skip("e4m3 MMA needs sm_89 or newer")
    a, b, sa, sb = make(20 + m, m, 1000, 2064, pow2=pow2)
    bias = torch.randn(1000)
    args = [t.to(dev) for t in (a, b, sa, sb)]
    bias_d, fmt = bias.to(dev), "ue8m0" if pow2 else ""

    def run() -> torch.Tensor:
        return hexlayout.ops.gemm_fp8(*args, bias=bias_d, scale_format=fmt)

    check(run().cpu(), reference(a, b, sa, sb, bias), torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    a2, _, sa2, _ = make(40 + m, m, 1000, 2064, pow2=pow2)
    args[0].copy_(a2.to(dev))
    args[2].copy_(sa2.to(dev))
    graph.replay()
    torch.cuda.synchronize()
    check(out.cpu(), reference(a2, b, sa2, sb, bias), torch.bfloat16)
