"""The sm_100a W4A16 / W8A16 fused MoE (``ops/moe/wna16_kernels_sm100.py``: swap-AB tcgen05, the
dequantized weights fed to the MMA from tensor memory, the accumulators in tensor memory)
through ``hexlayout.ops.moe.wna16`` in the emulator (``HEXLAYOUT_EMULATE_ARCH=sm_100a``) against
the float64 reference of ``test_moe_wna16`` (dequantized from the CHECKPOINT tensors, packed there
from the formats' definitions) on ragged small routings: AWQ-4, GPTQ-4, GPTQ-8, act-order, MXFP4;
groups 32 / 64 / 128 / -1 (per channel); f16 and bf16; experts without tokens; the decode and
large-token configs; the weights prepared for sm_100a refused by the sm_90a kernel."""

from __future__ import annotations

import importlib

import pytest

torch = pytest.importorskip("torch")

from test_moe_wna16 import _bound, _run, reference_alignment  # noqa: E402

_LAUNCHED: list[str] = []
_REPORTS: list[tuple[str, object]] = []


@pytest.fixture(autouse=True)
def _emulate_sm100(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_100a")
    # the alignment kernel has its own tests; a reference alignment keeps the emulated runs short
    monkeypatch.setattr("hexlayout.ops.moe.pipeline.run_moe_align", reference_alignment)
    launch = importlib.import_module("hexlayout.ops.host.launch")
    build_for = launch.build_for

    def spy(kernel, device, consts):
        _LAUNCHED.append(f"{kernel.name} BM={consts.get('BM')}")
        return build_for(kernel, device, consts)

    monkeypatch.setattr(launch, "build_for", spy)
    _LAUNCHED.clear()
    # the emulator's reports (shared-memory wavefronts per instruction site)
    emulator = importlib.import_module("hexlayout.emulator")
    run = emulator.run

    def recorded(kernel, *args, **kwargs):
        rep = run(kernel, *args, **kwargs)
        _REPORTS.append((kernel.name, rep))
        return rep

    monkeypatch.setattr(emulator, "run", recorded)
    _REPORTS.clear()


def _check(out, want, dtype) -> None:
    assert out.dtype == dtype and out.shape == want.shape
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(dtype) * want.abs().max().item(), (err, want.abs().max().item())


CASES = [
    # fmt, bits, group, dtype, T, E, k, act, routing
    ("awq", 4, 32, torch.float16, 5, 4, 2, "silu", "random"),
    ("gptq", 4, 128, torch.bfloat16, 3, 4, 2, "gelu", "random"),
    ("gptq", 8, -1, torch.float16, 4, 4, 3, "silu", "one"),
]


@pytest.mark.parametrize(("fmt", "bits", "group", "dtype", "t", "e", "k", "act", "kind"), CASES)
def test_matches_the_float64_reference_on_sm100(fmt, bits, group, dtype, t, e, k, act, kind) -> None:
    out, want = _run(fmt, bits, group, dtype, t, e, k, act, kind, seed=t * 100 + e + k + 2)
    _check(out, want, dtype)
    assert len(_LAUNCHED) == 2 and all("_sm100_" in n for n in _LAUNCHED), _LAUNCHED
    # the dequantized tiles reach the MMA through tensor memory (tcgen05.st), not shared memory
    sites = [s for name, rep in _REPORTS if "_sm100_" in name for s in rep.sites if s.executions]
    assert not [s for s in sites if type(s.instr).__name__ == "StShared"], "a shared store of the weights"
    a_stores = [(name, s.instr) for name, rep in _REPORTS if "_sm100_" in name for s in rep.sites
                if s.executions and type(s.instr).__name__ == "Tcgen05St" and "register A" in s.instr.origin]
    # one tcgen05.st.16x64b per warp and k-tile (one row per thread): .x8 for BK 32 (16 columns),
    # .x16 for BK 64
    assert a_stores and all((i.shape, i.num) == ("16x64b", 8 if "_k32" in n else 16) for n, i in a_stores)


def test_ragged_sizes_with_half_the_experts_remote() -> None:
    # H = 160, I = 96: not multiples of a block's 64 columns (the last block half empty)
    out, want = _run("awq", 4, 32, torch.bfloat16, 6, 4, 2, "silu", "random", seed=31, emap_half=True,
                     h=160, i=96)
    _check(out, want, torch.bfloat16)


def test_the_stage_ring_wraps_with_the_mmas_releasing_it() -> None:
    """H = 352, I = 160 in k-tiles of 32 (groups of 32): 11 and 5 k-tiles through the 4 activation
    stages, an odd count (the unrolled loop's tail): each refill waits for the MMAs that release
    the stage (and the tensor-memory A columns of the same unrolled copy) two k-tiles back."""
    out, want = _run("awq", 4, 32, torch.float16, 3, 4, 2, "silu", "random", seed=59, h=352, i=160)
    _check(out, want, torch.float16)
    assert len(_LAUNCHED) == 2 and all("_sm100_" in n and "_k32" in n for n in _LAUNCHED), _LAUNCHED


def test_router_weight_on_input() -> None:
    out, want = _run("gptq", 4, 32, torch.float16, 4, 4, 1, "gelu", "random", seed=37, on_input=True)
    _check(out, want, torch.float16)


def test_large_token_config() -> None:
    """140 rows on 2 experts (one with tokens): ``BM`` 64 (``wna16_sm90_config``), the tcgen05
    N side 64."""
    out, want = _run("gptq", 8, 64, torch.bfloat16, 70, 2, 2, "silu", "random", seed=41)
    _check(out, want, torch.bfloat16)
    assert _LAUNCHED == ["moe_wna16_gate_up_sm100_bf16_w8_k64 BM=64",
                         "moe_wna16_down_sm100_bf16_w8_k64 BM=64"], _LAUNCHED


def test_split_k(monkeypatch: pytest.MonkeyPatch) -> None:
    """The decode path a GPU takes (split-K f32 partials, then the activation / cast kernels)."""
    monkeypatch.setenv("HEXLAYOUT_MOE_SPLIT_K", "2")
    out, want = _run("awq", 4, 32, torch.float16, 2, 4, 2, "silu", "random", seed=43, h=128, i=64)
    _check(out, want, torch.float16)
    assert [n.split()[0] for n in _LAUNCHED if "wna16" in n] == [
        "moe_wna16_gate_up_sm100_f16_w4_k32_splitk", "moe_wna16_down_sm100_f16_w4_k32_splitk"], _LAUNCHED


def test_act_order() -> None:
    from test_moe_wna16_act_order import _run as act_order_run

    out, want = act_order_run(4, 32, torch.bfloat16, 5, 4, 2, h=160, i=96, seed=47)
    _check(out, want, torch.bfloat16)
    assert len(_LAUNCHED) == 2 and all("_sm100_" in n for n in _LAUNCHED), _LAUNCHED


def test_mxfp4() -> None:
    from test_moe_mxfp4 import _run as mxfp4_run

    out, want = mxfp4_run(torch.bfloat16, 3, 4, 2, h=96, i=64, seed=53, act="gelu")
    _check(out, want, torch.bfloat16)
    assert _LAUNCHED == ["moe_wna16_gate_up_sm100_bf16_wfp4_k32 BM=16",
                         "moe_wna16_down_sm100_bf16_wfp4_k32 BM=16"], _LAUNCHED


def test_weights_prepared_for_another_arch_are_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    """Weights prepared for sm_90a (register-A fragment order) run on sm_100a: the op names
    ``w13_qweight`` and the layout the sm_100a kernel reads, before any launch."""
    from hexlayout.ops.moe.wna16 import prepare_wna16
    from test_moe_wna16 import checkpoint

    from hexlayout.runtime.args import ArgumentError

    gen = torch.Generator().manual_seed(59)
    (q13, s13, z13), _ = checkpoint("gptq", 4, 2, 64, 128, 32, torch.float16, gen)
    fmt = {"quant_format": "gptq", "bits": 4, "group_size": 32}
    p90 = prepare_wna16(q13, s13, z13, **fmt, gate_up=True, arch="sm_90a")
    p100 = prepare_wna16(q13, s13, z13, **fmt, gate_up=True)
    assert p100.layout_key != p90.layout_key
    (q2, s2, _), _ = checkpoint("gptq", 4, 2, 64, 64, 32, torch.float16, gen)
    p2 = prepare_wna16(q2, s2, quant_format="gptq", bits=4, group_size=32)
    from hexlayout.ops.moe.wna16 import fused_moe_wna16

    x = torch.randn(2, 64, generator=gen).half()
    ids = torch.tensor([[0, 1], [1, 0]], dtype=torch.int32)
    tw = torch.rand(2, 2, generator=gen)
    with pytest.raises(ArgumentError, match="w13_qweight.*prepared in the offline layout.*sm_100a kernel"):
        fused_moe_wna16(x, p90, p2, tw, ids)
    assert _LAUNCHED == []
    # the fake (meta) path checks the same: sm_100a weights give the output's shape, sm_90a ones
    # are refused
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode() as mode:
        for w13, ok in ((p100, True), (p90, False)):
            (args, consts), kw = w13.op_args(p2), w13.op_kwargs(p2)
            fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
                    for a in (x, *args[:6], tw, ids)]
            if ok:
                out = torch.ops.hexlayout.fused_moe_wna16(*fake, *consts, **kw)
                assert out.shape == x.shape and out.dtype == x.dtype
            else:
                with pytest.raises(Exception, match="w13_qweight.*sm_100a kernel"):
                    torch.ops.hexlayout.fused_moe_wna16(*fake, *consts, **kw)
    assert _LAUNCHED == []


def test_an_arch_without_kernels_is_refused() -> None:
    from hexlayout.ops.moe.wna16 import prepare_wna16
    from test_moe_wna16 import checkpoint

    from hexlayout.runtime.args import ArgumentError

    (q, s, _), _ = checkpoint("gptq", 4, 2, 64, 64, 32, torch.float16, torch.Generator().manual_seed(61))
    with pytest.raises(ArgumentError, match="arch.*sm_80, sm_89, sm_90a, sm_100a, got 'sm_120'"):
        prepare_wna16(q, s, quant_format="gptq", bits=4, group_size=32, arch="sm_120")


@pytest.mark.parametrize(("kernel", "bits", "bk", "consts", "ncols", "sets"), [
    ("gate_up", 4, 64, {"BM": 64, "ZERO": 0, "TOPK": 2}, 256, 4),
    ("down", 4, 32, {"BM": 32, "ZERO": 8, "GROUP": 32}, 64, 2),
])
def test_tensor_memory_columns(kernel, bits, bk, consts, ncols, sets) -> None:
    """The TMEM allocation: the accumulators (gate-up: two of ``BM`` columns; down: one) and one
    set of A columns per unrolled mma (``BK`` x 16 / 32 each) - the two slots' MMAs are in flight at
    each other's stores, the tail reuses slot 0's columns (its wait on the slot's barrier retires
    slot 0's last MMAs), and no mma has its own previous execution in flight at its store (the
    slot's wait retires it), so no mma takes a ring of sets (``ir.mma_in_flight``). Gate-up BM 64:
    128 + 4 x 32 = 256 columns; down BM 32: 32 + 2 x 16 = 64."""
    from hexlayout.ops.moe.wna16_kernels_sm100 import moe_wna16_down_sm100_kernel as down
    from hexlayout.ops.moe.wna16_kernels_sm100 import moe_wna16_gate_up_sm100_kernel as gate_up

    from hexlayout.ir import lowered as L
    from hexlayout.ir import lowered_tcgen05 as T
    from hexlayout.lang import bf16
    from hexlayout.synth.solve import synthesize

    make = gate_up if kernel == "gate_up" else down
    syn = synthesize(make(bf16, bits, bk, False).trace(WG=1, **consts), "sm_100a")
    body = list(L.walk_instrs(syn.lowered.kernel.body))
    assert [i.ncols for i in body if isinstance(i, T.TmemAlloc)] == [ncols]
    stores = {str(i.taddr) for i in body if isinstance(i, T.Tcgen05St) and "register A" in i.origin}
    assert len(stores) == sets and not any("_aset" in s for s in stores), stores
    mmas = [i for op, i in syn.lowered.choices if type(op).__name__ == "Mma"]
    assert mmas and all(f"A from TMEM ({bk // 2} columns)" in i for i in mmas), mmas
