"""sm_90a kernels in PTX mode: TMA (tensor maps as the launcher encodes them), mbarriers,
wgmma descriptors and fragments, setmaxnreg, warp-specialized rings and 2-CTA clusters with
multicast, executed from the PTX NVRTC made of the printed source, against float64 and IR
mode at small, ragged sizes with NaN-filled outputs."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hexlayout.ops.gemm.config import CONFIGS
from hexlayout.ops.gemm.op import _arg_order, gemm_fused

import hexlayout.lang as hl
import hexlayout.runtime as rt
from hexlayout.lang.examples import gemm_sm90
from hexlayout.ptx import PtxDeadlockError, PtxRaceError

from .test_ops import ptx_runs  # noqa: F401  (fixture)


def _reference(a, b, b_layout, bias, act):
    y = a.astype(np.float64) @ (b.astype(np.float64).T if b_layout == "nk" else b.astype(np.float64))
    if bias is not None:
        y = y + bias.astype(np.float64)
    return np.maximum(y, 0) if act == "relu" else y


@pytest.fixture(scope="module")
def example():
    return rt.build(gemm_sm90, "sm_90a", compile=False)


def test_example_gemm_ragged_matches_float64_and_ir_mode(example) -> None:
    g = torch.Generator().manual_seed(7)
    m, n, k = 100, 200, 72
    a, b = torch.randn(m, k, generator=g).half(), torch.randn(n, k, generator=g).half()
    c_ptx, c_ir = (torch.full((m, n), float("nan"), dtype=torch.float16) for _ in range(2))
    rep = rt.emulate(example, a, b, c_ptx, mode="ptx")
    rt.emulate(example, a, b, c_ir, mode="ir")
    ops = rep.opcodes
    assert any(o.startswith("wgmma.mma_async") for o in ops) and any(
        o.startswith("cp.async.bulk.tensor") for o in ops
    )
    assert any(o.startswith("mbarrier.try_wait") for o in ops) and any(
        o.startswith("setmaxnreg") for o in ops
    )
    ref = a.double() @ b.double().T
    torch.testing.assert_close(c_ptx.double(), ref, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(c_ptx, c_ir, rtol=2e-3, atol=2e-3)


def _config(name: str):
    cfgs = CONFIGS["sm_90a"]
    if name == "persistent":
        return next(c for c in cfgs if c.persistent)
    if name == "cluster":
        return next(c for c in cfgs if c.cluster == 2)
    return next(c for c in cfgs if c.CONSUMERS == 1 and c.BN == 128)


@pytest.mark.parametrize(
    ("cfg", "b_layout", "dtype", "ep", "shape"),
    [
        ("persistent", "nk", hl.f16, (True, False, "relu", False), (136, 300, 200)),
        ("one_consumer", "kn", hl.bf16, (False, False, "none", False), (72, 136, 136)),
        ("cluster", "nk", hl.bf16, (True, False, "none", False), (136, 600, 200)),  # 3 columns: an idle CTA
    ],
)
def test_gemm_configs_match_float64(cfg: str, b_layout: str, dtype, ep, shape) -> None:
    m, n, k = shape
    config = _config(cfg)
    bld, prog = gemm_fused(dtype, b_layout, ep, "sm_90a", config, m, n, compile=False)
    rng = np.random.default_rng(m * n + k)
    npdt = dtype.numpy()
    a = rng.standard_normal((m, k)).astype(npdt)
    b = rng.standard_normal((n, k) if b_layout == "nk" else (k, n)).astype(npdt)
    bias = rng.standard_normal(n).astype(npdt)
    c = np.full((m, n), np.nan, npdt)
    by_role = {"a": a, "b": b, "c": c, "bias": bias.reshape(1, n), "residual": None, "scale": 0.5}
    roles = ["a", "b", "c", "bias", "residual", "scale"]
    args = [by_role[roles[i]] for i in _arg_order(prog, ep)]
    rep = rt.emulate(bld, *args, mode="ptx")
    if cfg == "cluster":
        assert (
            any("multicast::cluster" in o for o in rep.opcodes) and "mapa.shared::cluster.u32" in rep.opcodes
        )
        assert len(rep.blocks) == 2 * -(-m // 128) * ((-(-n // 256) + 1) // 2)
    want = _reference(a, b, b_layout, bias if ep[0] else None, ep[2])
    err = np.abs(c.astype(np.float64) - want) / (np.abs(want) + 1)
    assert err.max() < 1e-2


# --- mutations of the printed source that only PTX mode sees ---------------------------------------


def _mutate(source: str, old: str, new: str) -> str:
    assert source.count(old) >= 1, f"the printed source no longer contains {old!r}"
    return source.replace(old, new, 1)


def _ab(m: int, n: int, k: int, seed: int):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(m, k, generator=g).half(), torch.randn(n, k, generator=g).half()


def _mutations(example, pattern: str, repl: str) -> str:
    src = example.generated.source
    bad, n = re.subn(pattern, repl, src, count=1)
    assert n == 1, f"the printed source no longer matches {pattern!r}"
    return bad


def _ir_and_ptx(example, bad: str, m: int, n: int, k: int, seed: int):
    a, b = _ab(m, n, k, seed)
    c_ir, c_ptx = (torch.full((m, n), float("nan"), dtype=torch.float16) for _ in range(2))
    rt.emulate(example, a, b, c_ir, mode="ir")
    ref = a.double() @ b.double().T
    torch.testing.assert_close(c_ir.double(), ref, rtol=1e-2, atol=1e-2)  # IR mode: still right
    rt.emulate(example, a, b, c_ptx, mode="ptx", source=bad)
    return c_ptx, ref


def test_mutated_wgmma_swizzle_mode_gives_a_wrong_product(example) -> None:
    """The B descriptor's layout type printed as 64-byte swizzle (2) instead of 128-byte (1)."""
    bad = _mutations(
        example, r"(\"l\"\(hl_gmma_desc_add\(hl_gmma_desc\(smem_base, 16, 1024, )1(\), k_1)", r"\g<1>2\2"
    )
    c, ref = _ir_and_ptx(example, bad, 64, 256, 64, 1)
    assert (c.double() - ref).abs().nan_to_num(1e9).max() > 1


def test_mutated_tma_coordinate_order_gives_a_wrong_tile(example) -> None:
    """The A tile's TMA box origin printed with its two coordinates swapped."""
    bad = _mutations(example, r'"r"\((k \* 64)\), "r"\((bid_y \* 128)\)', r'"r"(\2), "r"(\1)')
    c, ref = _ir_and_ptx(example, bad, 128, 256, 128, 3)
    assert (c.double() - ref).abs().nan_to_num(1e9).max() > 1


def test_mutated_mbarrier_parity_reads_a_tile_still_in_flight(example) -> None:
    """The consumers' wait on a full stage printed with the inverted parity: it passes before the
    stage's TMA copy landed, and the wgmma reads bytes still in flight."""
    bad = _mutations(example, r"(hl_mbar_wait\(smem_base \+ k_1 [^,]*, k_1 / 4 % 2)\);", r"\1 ^ 1);")
    with pytest.raises((PtxRaceError, PtxDeadlockError)) as ei:
        _ir_and_ptx(example, bad, 64, 256, 128, 2)
    assert "wgmma" in str(ei.value) or "mbarrier" in str(ei.value)


# --- the serving ops on sm_90a, every launch from its PTX ------------------------------------------


@pytest.fixture
def ptx90(ptx_runs: list[str], monkeypatch: pytest.MonkeyPatch) -> list[str]:  # noqa: F811
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")
    return ptx_runs


def test_gemm_op_sm90(ptx90: list[str]) -> None:
    from hexlayout.ops.gemm import gemm

    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(70, 136, generator=g).bfloat16(), torch.randn(90, 136, generator=g).bfloat16()
    bias = torch.randn(90, generator=g).bfloat16()
    c = gemm(a, b, bias=bias, activation="gelu")
    ref = torch.nn.functional.gelu(a.double() @ b.double().T + bias.double())
    torch.testing.assert_close(c.double(), ref, rtol=2e-2, atol=5e-2)
    assert ptx90 and all("sm90" in r for r in ptx90)


def test_paged_attention_sm90_split_kv(ptx90: list[str]) -> None:
    from hexlayout.ops.attention import paged_attention

    from tests.ops.test_paged_attention_op import _check, make_case, reference

    a = make_case(4, [2, 1], [130, 57], 4, 2, 64, 16, "HND", torch.bfloat16)
    out, lse = paged_attention(**a, num_splits=2, return_lse=True)
    _check(out, lse, reference(a), a["q"].shape[0], 1.6e-2)
    assert any("sm90" in r for r in ptx90) and any("combine" in r for r in ptx90)


@pytest.mark.parametrize("opts", [{}, {"window": (33, 0), "softcap": 5.0}])
def test_attention_varlen_sm90_strided_qkv(ptx90: list[str], opts: dict) -> None:
    from hexlayout.ops import attention_varlen

    from tests.ops.test_attention_varlen_op import _check as varlen_check
    from tests.ops.test_attention_varlen_op import make_case as varlen_case
    from tests.ops.test_attention_varlen_op import reference as varlen_reference

    a = varlen_case(5, [3, 70, 0], [3, 70, 0], 4, 2, 64, torch.float16)
    kw = {"window_size": opts["window"], "softcap": opts["softcap"]} if opts else {}
    out, lse = attention_varlen(**a, causal=True, return_lse=True, **kw)
    varlen_check(out, lse, varlen_reference(a, causal=True, **opts), a["q"].shape[0], 2e-3)
    assert any("sm90" in r for r in ptx90)


@pytest.mark.parametrize(("t", "e", "k"), [(3, 8, 2), (48, 4, 2), (140, 2, 1)])  # swap-AB BM 16 / 32; large
def test_fused_moe_bf16_sm90(ptx90: list[str], t: int, e: int, k: int) -> None:
    from hexlayout.ops import fused_moe

    from tests.ops.test_moe_op import close, make
    from tests.ops.test_moe_op import reference as moe_reference

    x, w13, w2, tw, ids = make(t, 136, 80, e, k, torch.bfloat16, seed=t + k, experts_used=e)
    out = fused_moe(x, w13, w2, tw, ids, activation="silu")
    close(out, moe_reference(x, w13, w2, tw, ids, "silu"), torch.bfloat16)
    assert any("sm90" in r for r in ptx90)


@pytest.mark.parametrize(
    ("arch", "fmt", "bits", "dtype", "t"),
    [
        ("sm_90a", "gptq", 4, torch.float16, 5),
        ("sm_90a", "awq", 4, torch.bfloat16, 40),  # BM 32, zero points
        ("sm_80", "awq", 4, torch.float16, 9),
        ("sm_90a", "gptq", 8, torch.bfloat16, 7),  # W8A16
        ("sm_80", "gptq", 8, torch.float16, 7),
    ],
)
def test_fused_moe_wna16(
    ptx90: list[str],
    arch: str,
    fmt: str,
    bits: int,
    dtype: torch.dtype,
    t: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.ops.test_moe_wna16 import _bound, _run

    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    out, want = _run(fmt, bits, 64, dtype, t, 4, 2, "silu", "random", seed=3)
    assert (out.double() - want).abs().max().item() <= _bound(dtype) * want.abs().max().item()
    assert any("wna16_gate_up" in r for r in ptx90)
    assert all(("sm90" in r) == (arch == "sm_90a") for r in ptx90 if "wna16" in r)


@pytest.mark.parametrize("t", [16, 48, 200])  # swap-AB BM 16 / 32; warp-specialized large
def test_fused_moe_fp8_sm90(ptx90: list[str], t: int) -> None:
    import hexlayout.ops
    from hexlayout.ops.moe.fp8 import prepare_fp8

    from tests.ops.test_moe_fp8 import check
    from tests.ops.test_moe_fp8 import make as fp8_make
    from tests.ops.test_moe_fp8 import reference as fp8_reference

    x, w13, s13, w2, s2, tw, ids = fp8_make(1, t, 128, 64, 4, 2, torch.bfloat16, True)
    blk = (128, 128)
    out = hexlayout.ops.fused_moe(
        x, prepare_fp8(w13, s13, block=blk), prepare_fp8(w2, s2, block=blk), tw, ids, activation="silu"
    )
    check(out, *fp8_reference(x, w13, s13, w2, s2, tw, ids, True, "silu"))
    assert any("sm90" in r for r in ptx90)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_fused_moe_split_k(ptx_runs: list[str], arch: str, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: F811
    """The split-K path (f32 partials added with red.global into a zeroed workspace) from PTX."""
    from hexlayout.ops import fused_moe

    from tests.ops.test_moe_op import close, make
    from tests.ops.test_moe_op import reference as moe_reference

    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    monkeypatch.setenv("HEXLAYOUT_MOE_SPLIT_K", "2")
    x, w13, w2, tw, ids = make(5, 256, 192, 4, 2, torch.float16, seed=8, experts_used=3)
    out = fused_moe(x, w13, w2, tw, ids, activation="gelu")
    close(out, moe_reference(x, w13, w2, tw, ids, "gelu"), torch.float16)
    assert any("splitk" in r for r in ptx_runs), ptx_runs
