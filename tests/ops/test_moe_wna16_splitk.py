"""Split-K of the W4A16 / W8A16 fused MoE (``split=True`` of ``ops/moe_wna16_kernels.py`` and
``ops/moe_wna16_kernels_sm90.py``, dispatched by ``ops/moe_wna16.py``): forced with
``HEXLAYOUT_MOE_SPLIT_K`` 2 and 3 in the emulator (sm_80 and ``HEXLAYOUT_EMULATE_ARCH=sm_90a``)
against the float64 reference of ``test_moe_wna16`` (dequantized from the CHECKPOINT tensors):
K not a multiple of ``SPLIT_K * BK`` (splits of unequal length, empty splits), groups 32 / 128 /
-1, AWQ-4, GPTQ-4 / 8, f16 / bf16, experts without tokens, half the experts remote, the router
weight on the input; the split sizes ``wna16_split_k`` picks for the decode shapes; NVRTC builds
of the split kernels for sm_80 and sm_90a: no spills, no local memory, no C7515 / C7510."""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")

from hexlayout.ops.moe.wna16 import wna16_config, wna16_sm90_config, wna16_split_k  # noqa: E402
from hexlayout.ops.moe.wna16_kernels_sm80 import moe_wna16_down_kernel, moe_wna16_gate_up_kernel  # noqa: E402
from hexlayout.ops.moe.wna16_kernels_sm90 import (  # noqa: E402
    moe_wna16_down_sm90_kernel,
    moe_wna16_gate_up_sm90_kernel,
)
from test_moe_wna16 import _bound, _run, reference_alignment  # noqa: E402

from hexlayout.errors import HexlayoutError  # noqa: E402

_LAUNCHED: list[str] = []


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.delenv("HEXLAYOUT_EMULATE_ARCH", raising=False)
    monkeypatch.delenv("HEXLAYOUT_MOE_SPLIT_K", raising=False)
    # the alignment kernel has its own tests; a reference alignment keeps the emulated runs short
    monkeypatch.setattr("hexlayout.ops.moe.pipeline.run_moe_align", reference_alignment)
    attention_args = importlib.import_module("hexlayout.ops.host.launch")
    build_for = attention_args.build_for

    def spy(kernel, device, consts):
        _LAUNCHED.append(f"{kernel.name} SPLIT_K={consts.get('SPLIT_K')}")
        return build_for(kernel, device, consts)

    monkeypatch.setattr(attention_args, "build_for", spy)
    _LAUNCHED.clear()


CASES = [
    # arch, split, fmt, bits, group, dtype, T, E, k, act, routing, H, I
    # H = 160 (BK 32: 5 k-tiles, splits of 3 + 2 / 2 + 2 + 1), I = 96 (3 k-tiles: 2 + 1 / 1 + 1 + 1)
    ("sm_80", 2, "awq", 4, 32, torch.float16, 3, 8, 2, "silu", "random", 160, 96),
    ("sm_80", 3, "gptq", 8, -1, torch.bfloat16, 4, 8, 2, "gelu", "random", 160, 96),
    # group 128: H = I = 128 (BK 64: 2 k-tiles; split 3 leaves the third split empty)
    ("sm_80", 3, "gptq", 4, 128, torch.float16, 1, 64, 8, "silu", "single", 128, 128),
    ("sm_90a", 2, "gptq", 4, 32, torch.bfloat16, 3, 8, 2, "silu", "random", 160, 96),
    ("sm_90a", 3, "awq", 4, -1, torch.float16, 2, 8, 2, "gelu", "random", 160, 96),
    ("sm_90a", 3, "gptq", 8, 128, torch.bfloat16, 1, 64, 8, "silu", "single", 128, 128),
]


def _check(out, want, dtype) -> None:
    assert out.dtype == dtype and out.shape == want.shape
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(dtype) * want.abs().max().item(), (err, want.abs().max().item())


@pytest.mark.parametrize(
    ("arch", "split", "fmt", "bits", "group", "dtype", "t", "e", "k", "act", "kind", "h", "i"), CASES
)
def test_forced_split_matches_the_float64_reference(
    monkeypatch, arch, split, fmt, bits, group, dtype, t, e, k, act, kind, h, i
) -> None:
    if arch == "sm_90a":
        monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")
    monkeypatch.setenv("HEXLAYOUT_MOE_SPLIT_K", str(split))
    out, want = _run(fmt, bits, group, dtype, t, e, k, act, kind, seed=31 * t + e + split, h=h, i=i)
    _check(out, want, dtype)
    sm90 = "_sm90" if arch == "sm_90a" else ""
    names = [n.split(" ")[0] for n in _LAUNCHED]
    assert any(n.startswith(f"moe_wna16_gate_up{sm90}_") and n.endswith("_splitk") for n in names), _LAUNCHED
    assert any(n.startswith(f"moe_wna16_down{sm90}_") and n.endswith("_splitk") for n in names), _LAUNCHED
    assert any(n.startswith("moe_splitk_act_") for n in names) and any(
        n.startswith("moe_splitk_cast_") for n in names
    ), _LAUNCHED
    assert all(f"SPLIT_K={split}" in n for n in _LAUNCHED if "_splitk " in n), _LAUNCHED


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_split_with_half_the_experts_remote(monkeypatch, arch) -> None:
    if arch == "sm_90a":
        monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")
    monkeypatch.setenv("HEXLAYOUT_MOE_SPLIT_K", "2")
    out, want = _run(
        "awq", 4, 32, torch.float16, 4, 8, 4, "silu", "random", seed=5, emap_half=True, h=160, i=96
    )
    _check(out, want, torch.float16)
    assert any("_splitk " in n for n in _LAUNCHED), _LAUNCHED


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_split_with_the_router_weight_on_the_input(monkeypatch, arch) -> None:
    if arch == "sm_90a":
        monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")
    monkeypatch.setenv("HEXLAYOUT_MOE_SPLIT_K", "3")
    out, want = _run(
        "gptq", 4, 32, torch.bfloat16, 3, 8, 1, "silu", "random", seed=9, on_input=True, h=160, i=96
    )
    _check(out, want, torch.bfloat16)
    assert any("_splitk " in n for n in _LAUNCHED), _LAUNCHED


def test_cpu_tensors_run_unsplit_without_the_variable_and_a_bad_value_is_named(monkeypatch) -> None:
    out, want = _run("gptq", 4, 32, torch.float16, 2, 8, 2, "silu", "random", seed=2, h=96, i=96)
    _check(out, want, torch.float16)
    assert _LAUNCHED and not any("splitk" in n for n in _LAUNCHED), _LAUNCHED
    monkeypatch.setenv("HEXLAYOUT_MOE_SPLIT_K", "0")
    with pytest.raises(HexlayoutError, match="HEXLAYOUT_MOE_SPLIT_K"):
        _run("gptq", 4, 32, torch.float16, 2, 8, 2, "silu", "random", seed=2, h=96, i=96)


def _blocks(t, k, e, size_k, size_n, tiles):
    """(tiles, SPLIT_K) for 132 SMs: tiles = row blocks with an expert x column blocks."""
    return wna16_split_k(t, k, e, size_k, size_n, 132, tiles)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_decode_shapes_get_a_wave_of_blocks(arch) -> None:
    """DeepSeek-V3 TP8 slice (E 256, k 8, H 7168, I 256) at T = 1: 8 experts x 256 / 64 column
    blocks = 32 gate-up tiles -> 8 splits (264 // 32 = 8, 112 k-tiles // 8 = 14) = 256 blocks;
    its down GEMM (8 x 7168 / 64 = 896 tiles) stays whole. Mixtral-8x7B (E 8, k 2, H 4096, I
    14336) at T = 1: 2 x 64 = 128 down tiles -> 2 splits; gate-up (2 x 224 = 448) whole. Large T:
    no split."""

    def tiles(s, e, size_k, size_n):
        cfg = wna16_config(s, e, size_k, 128)
        if arch == "sm_90a":
            c = wna16_sm90_config(s, e, size_n)
            cfg.update(BM=c["BM"], BN=64 * c["WG"])
        return cfg

    assert _blocks(1, 8, 256, 7168, 256, tiles(8, 256, 7168, 256)) == 8
    assert _blocks(1, 8, 256, 256, 7168, tiles(8, 256, 256, 7168)) == 1
    assert _blocks(4, 8, 256, 7168, 256, tiles(32, 256, 7168, 256)) == 2     # 128 tiles: 264 // 128
    assert _blocks(8, 8, 256, 7168, 256, tiles(64, 256, 7168, 256)) == 1     # 256 tiles: a wave
    assert _blocks(1, 2, 8, 4096, 14336, tiles(2, 8, 4096, 14336)) == 1
    assert _blocks(1, 2, 8, 14336, 4096, tiles(2, 8, 14336, 4096)) == 2
    assert _blocks(4096, 2, 8, 4096, 14336, tiles(8192, 8, 4096, 14336)) == 1


#: (arch, kernel, bits, dtype, constants) of the split builds: the decode configs at the split
#: the chooser picks for DeepSeek (8), both widths and dtypes, groups of 32 (BK 32), the router
SPLIT_BUILDS = [
    (a, kern, b, d, {"BM": 16, "BK": 64, "SPLIT_K": 8})
    for a in ("sm_80", "sm_90a")
    for kern in ("gate_up", "down")
    for b, d in ((4, "bf16"), (8, "f16"))
] + [
    ("sm_80", "gate_up", 4, "f16", {"BM": 16, "BK": 32, "GROUP": 32, "SPLIT_K": 3, "ROUTER": True}),
    ("sm_90a", "down", 4, "bf16", {"BM": 32, "BK": 32, "GROUP": 32, "SPLIT_K": 2, "ROUTER": True}),
]


@pytest.mark.nvrtc
@pytest.mark.parametrize(("arch", "kernel", "bits", "dtype", "consts"), SPLIT_BUILDS)
def test_split_kernels_compile_without_spills(arch, kernel, bits, dtype, consts) -> None:
    from hexlayout.lang import bf16, f16
    from hexlayout.runtime import build
    from hexlayout.runtime.sass import count_prefix, disassemble, opcode_counts

    dt = f16 if dtype == "f16" else bf16
    factories = {
        ("sm_80", "gate_up"): moe_wna16_gate_up_kernel,
        ("sm_80", "down"): moe_wna16_down_kernel,
        ("sm_90a", "gate_up"): moe_wna16_gate_up_sm90_kernel,
        ("sm_90a", "down"): moe_wna16_down_sm90_kernel,
    }
    extra = {"ZERO": 0 if bits == 4 else 128, **{c: v for c, v in consts.items() if c != "BK"}}
    if kernel == "gate_up" or arch == "sm_80":
        extra["TOPK"] = 8
    if arch == "sm_90a":
        extra["WG"] = 1
    b = build(factories[arch, kernel](dt, bits, consts["BK"], True), arch, **extra)
    st = b.stats
    assert not st.spills and st.local_memory_instructions == 0, st.summary()
    assert not st.serialization and not any("C7515" in w or "C7510" in w for w in st.warnings), st.warnings
    counts = opcode_counts(disassemble(b.compiled.cubin))
    assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0
    mma = "HGMMA" if arch == "sm_90a" else "HMMA"
    assert count_prefix(counts, mma) > 0 and st.main_loop is not None and st.main_loop.mma > 0, counts
    reds = sum(count_prefix(counts, op) for op in ("RED", "REDG", "ATOM", "ATOMG"))
    assert reds > 0, counts  # the f32 partials, added atomically
