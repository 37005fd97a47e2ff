"""Split-K for the fp8 fused MoE (``ops/moe_fp8.py``: the ``split=True`` forms of the sm_89 and
sm_90a swap-AB grouped GEMMs, ``moe_splitk``'s chooser, activation and cast kernels), run in the
emulator against the float64 reference and tolerance of ``test_moe_fp8.py`` with
``HEXLAYOUT_MOE_SPLIT_K`` forcing 2 and 3 splits where K is not a multiple of ``SPLIT_K * 128``
(splits of unequal length, a split without a k-tile, a ragged last k-tile): sm_89 and sm_90a,
per-expert and 128 x 128 block scales, experts without tokens, an expert map with half the
experts remote, the router weight on the input; the chooser's decisions for the DeepSeek-V3 TP8
and Mixtral decode shapes with the fp8 tiles; no host synchronization; NVRTC compiles of the split
kernels for sm_89 and sm_90a without spills, local memory or serialized wgmma."""

from __future__ import annotations

import importlib
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
from hexlayout.ops.moe.fp8 import (  # noqa: E402
    SWAP_STAGES,
    fp8_split_k,
    fused_moe_fp8,
    prepare_fp8,
    run_fused_moe_fp8,
)
from hexlayout.ops.moe.splitk import SPLIT_K_ENV  # noqa: E402
from test_moe_fp8 import check, make, reference  # noqa: E402

from hexlayout.runtime.args import ArgumentError  # noqa: E402

attention_args = importlib.import_module("hexlayout.ops.host.launch")


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_89")
    monkeypatch.delenv(SPLIT_K_ENV, raising=False)


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[tuple[str, Any]]:
    """``(kernel name, SPLIT_K)`` of every build the op asks for."""
    seen: list[tuple[str, Any]] = []
    real = attention_args.build_for

    def record(kernel: Any, device: Any, consts: dict[str, Any]) -> Any:
        seen.append((kernel.name, consts.get("SPLIT_K")))
        return real(kernel, device, consts)

    monkeypatch.setattr(attention_args, "build_for", record)
    return seen


def _gemms(seen: list[tuple[str, Any]]) -> list[tuple[str, Any]]:
    return [(n, s) for n, s in seen if "gate_up" in n or "down" in n or "splitk" in n]


def _run(x, w13, s13, w2, s2, tw, ids, block, **kw):
    blk = (128, 128) if block else None
    return fused_moe_fp8(x, prepare_fp8(w13, s13, block=blk), prepare_fp8(w2, s2, block=blk), tw, ids, **kw)


# split, seed, T, H, I, E, k, dtype, block scales, activation, arch. K = H for gate-up, I for down,
# in k-tiles of 128: H 384 -> 3 (split 2: 2 + 1; split 3: 1 + 1 + 1), H 640 -> 5 (split 3: 2 + 2 +
# 1), H 256 -> 2 (split 3: 1 + 1 + none); I 176 -> 2 with a ragged last tile (split 3: 1 + 1 +
# none), I 320 -> 3 ragged (split 2: 2 + 1), I 96 -> 1 (split 2: 1 + none); I 176 is no multiple of
# 64: the up tiles' block scales straddle two scale blocks (not UNIFORM)
CASES = [
    (2, 0, 1, 384, 96, 8, 2, torch.bfloat16, False, "silu", "sm_89"),
    (3, 1, 3, 640, 176, 16, 2, torch.float16, True, "gelu", "sm_89"),
    (2, 2, 5, 384, 320, 8, 2, torch.bfloat16, True, "silu", "sm_90a"),
    (3, 3, 2, 256, 176, 16, 4, torch.bfloat16, True, "gelu", "sm_90a"),
    (2, 6, 4, 384, 96, 8, 2, torch.float16, False, "silu", "sm_90a"),
]


@pytest.mark.parametrize(("split", "seed", "t", "h", "inter", "e", "k", "dtype", "block", "act", "arch"),
                         CASES)
def test_forced_split_matches_float64(split, seed, t, h, inter, e, k, dtype, block, act, arch, monkeypatch,
                                      builds) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    monkeypatch.setenv(SPLIT_K_ENV, str(split))
    x, w13, s13, w2, s2, tw, ids = make(seed, t, h, inter, e, k, dtype, block)
    out = _run(x, w13, s13, w2, s2, tw, ids, block, activation=act)
    assert out.dtype == dtype and out.shape == (t, h)
    check(out, *reference(x, w13, s13, w2, s2, tw, ids, block, act))
    sm90 = "_sm90" if arch == "sm_90a" else ""
    dt = "bf16" if dtype == torch.bfloat16 else "f16"
    assert _gemms(builds) == [(f"moe_fp8_gate_up{sm90}_{dt}_splitk", split),
                              (f"moe_splitk_act_{dt}_{act}_slots", None),
                              (f"moe_fp8_down{sm90}_{dt}_splitk", split),
                              (f"moe_splitk_cast_{dt}", None)]
    assert len(set(ids.flatten().tolist())) < e          # experts without a token


@pytest.mark.parametrize("arch", ["sm_89", "sm_90a"])
def test_expert_map_half_remote(arch, monkeypatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    monkeypatch.setenv(SPLIT_K_ENV, "3")
    gne, e = 16, 8
    x, w13, s13, w2, s2, tw, ids = make(5, 8, 384, 128, e, 2, torch.bfloat16, block=True, gne=gne)
    perm = torch.randperm(gne, generator=torch.Generator().manual_seed(6))
    emap = torch.full((gne,), -1, dtype=torch.int32)
    emap[perm[:e]] = torch.arange(e, dtype=torch.int32)
    out = _run(x, w13, s13, w2, s2, tw, ids, True, expert_map=emap, global_num_experts=gne)
    check(out, *reference(x, w13, s13, w2, s2, tw, ids, True, emap=emap))
    remote = (emap[ids.long()] < 0).all(1)               # tokens whose every choice is remote: exactly 0
    assert remote.any() and torch.equal(out[remote], torch.zeros_like(out[remote]))


@pytest.mark.parametrize("arch", ["sm_89", "sm_90a"])
def test_router_weight_on_input(arch, monkeypatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    monkeypatch.setenv(SPLIT_K_ENV, "2")
    x, w13, s13, w2, s2, tw, ids = make(4, 6, 384, 256, 8, 1, torch.float16, one_expert=3)
    out = _run(x, w13, s13, w2, s2, tw, ids, False, apply_router_weight_on_input=True)
    want, tol = reference(x, w13, s13, w2, s2, tw, ids, False, router=True)
    check(out, want, tol)
    # not the same as weighting the output (SiLU is not linear)
    assert ((want - reference(x, w13, s13, w2, s2, tw, ids, False)[0]).abs() > tol).any()


def test_environment_forces_the_split_and_cpu_never_splits_by_itself(monkeypatch, builds) -> None:
    x, w13, s13, w2, s2, tw, ids = make(7, 2, 384, 64, 8, 2)
    want, tol = reference(x, w13, s13, w2, s2, tw, ids, False)
    check(_run(x, w13, s13, w2, s2, tw, ids, False), want, tol)            # nothing forced: plain kernels
    monkeypatch.setenv(SPLIT_K_ENV, "1")                                     # 1: off
    check(_run(x, w13, s13, w2, s2, tw, ids, False), want, tol)
    assert [s for _, s in _gemms(builds)] == [None] * 4
    assert not any("splitk" in n for n, _ in builds)
    for bad in ("0", "two", "2.5", "-1"):
        monkeypatch.setenv(SPLIT_K_ENV, bad)
        with pytest.raises(ArgumentError, match=f"{SPLIT_K_ENV}.*integer >= 1"):
            _run(x, w13, s13, w2, s2, tw, ids, False)


def test_nan_in_a_token_propagates_to_its_row_only(monkeypatch) -> None:
    monkeypatch.setenv(SPLIT_K_ENV, "2")
    x, w13, s13, w2, s2, tw, ids = make(8, 3, 384, 64, 8, 2)
    x[1, 5] = float("nan")
    out = _run(x, w13, s13, w2, s2, tw, ids, False)
    assert out[1].isnan().any()
    assert torch.isfinite(out[[0, 2]]).all()


def test_the_split_path_never_synchronizes(monkeypatch) -> None:
    """No tensor becomes a host value, and the launches (shapes, constants) depend on the sizes
    only: two routings give the same ones."""
    monkeypatch.setenv(SPLIT_K_ENV, "2")
    x, w13, s13, w2, s2, tw, ids = make(9, 4, 384, 128, 8, 2)
    want, tol = reference(x, w13, s13, w2, s2, tw, ids, False)
    seen: list[tuple] = []
    real = attention_args.run_kernel

    def record(bld: Any, args: tuple, outputs: tuple) -> None:
        seen.append(tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args))
        real(bld, args, outputs)

    monkeypatch.setattr(attention_args, "run_kernel", record)

    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("host synchronization")

    with monkeypatch.context() as m:
        for name in ("item", "tolist", "__int__", "__bool__", "__index__", "nonzero"):
            m.setattr(torch.Tensor, name, refuse)
        out = run_fused_moe_fp8(x, w13, s13, w2, s2, tw, ids)   # the run path (CPU checks read ids)
    check(out, want, tol)
    n = len(seen)
    other = torch.zeros_like(ids)
    other[:, 1] = 1                                      # every token on experts 0 and 1
    run_fused_moe_fp8(x, w13, s13, w2, s2, tw, other)
    assert n >= 6 and seen[:n] == seen[n:]


# (T, k, E, H, I) -> (gate-up SPLIT_K, down SPLIT_K) on 132 SMs, fp8 tiles 16 x 64 x 128 (decode:
# at most 16 slots per expert), by the documented rule worked by hand: M = min(NB, max(ceil(S /
# 16), min(S, E))) row blocks, tiles = M * ceil(N / 64), KT = ceil(K / 128); tiles >= 132 -> 1,
# else min(16, 264 // tiles, KT // 8), 1 below 2.
DEEPSEEK = (256, 7168, 256)        # E, H, I of the DeepSeek-V3 TP8 slice (k = 8)
MIXTRAL = (8, 4096, 14336)         # Mixtral-8x7B (k = 2)
DECISIONS = [
    ((1, 8, *DEEPSEEK), (7, 1)),           # gate-up M 8 x 4 = 32 tiles: min(8, 56 // 8 = 7) -> 224 blocks;
                                           # down 8 x 112 = 896 tiles
    ((2, 8, *DEEPSEEK), (4, 1)),           # 64 tiles -> 4 (256 blocks)
    ((4, 8, *DEEPSEEK), (2, 1)),           # 128 tiles -> 2
    ((8, 8, *DEEPSEEK), (1, 1)),           # 256 tiles: a wave already
    ((1, 2, *MIXTRAL), (1, 2)),            # gate-up 2 x 224 = 448 tiles; down 2 x 64 = 128 -> 2 (KT 112)
    ((2, 2, *MIXTRAL), (1, 1)),            # down 4 x 64 = 256 tiles
    ((1, 2, 8, 4096, 1792), (4, 1)),       # Mixtral TP8: 2 x 28 = 56 -> min(4, 32 // 8); down KT 14 -> 1
]


@pytest.mark.parametrize(("sizes", "splits"), DECISIONS)
def test_chooser_decisions_with_fp8_tiles(sizes: tuple[int, ...], splits: tuple[int, int]) -> None:
    got = tuple(fp8_split_k(*sizes, 132, 16, gemm) for gemm in ("gate_up", "down"))
    assert got == splits
    assert fp8_split_k(*sizes, 132, 128) == 1            # the large-token kernels never split


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["sm_89", "sm_90a"])
@pytest.mark.parametrize("block_scale", [False, True])
def test_split_kernels_compile_without_spills(arch: str, block_scale: bool) -> None:
    from hexlayout.ops.moe.fp8_kernels_sm89 import moe_fp8_down_kernel, moe_fp8_gate_up_kernel
    from hexlayout.ops.moe.fp8_kernels_sm90 import moe_fp8_down_sm90_kernel, moe_fp8_gate_up_sm90_kernel
    from hexlayout.ops.moe.splitk import moe_splitk_act_kernel

    from hexlayout.lang import bf16
    from hexlayout.runtime import build
    from hexlayout.runtime.sass import count_prefix, disassemble, opcode_counts

    consts = {"BM": 16, "BN": 64, "BK": 128, "STAGES": 2, "BLOCK_SCALE": block_scale}
    if arch == "sm_90a":  # the swap-AB kernels' ring: one stage more for the wgmma group in flight
        consts["STAGES"] = SWAP_STAGES
        kernels = (moe_fp8_gate_up_sm90_kernel(bf16, True), moe_fp8_down_sm90_kernel(bf16, True))
        mma = "QGMMA.64x"
    else:
        kernels = (moe_fp8_gate_up_kernel(bf16, True), moe_fp8_down_kernel(bf16, True))
        mma = "QMMA.16832"
        consts["WARPS"] = 4
    for kern, extra, products in zip(kernels, ({"TOPK": 8, "UNIFORM": block_scale, "SPLIT_K": 7},
                                               {"ROUTER": False, "SPLIT_K": 2}), (2, 1)):
        b = build(kern, arch, **consts, **extra)
        st = b.stats
        assert not st.spills and st.local_memory_instructions == 0 and st.stack_frame == 0, st.summary()
        assert not st.warnings, st.warnings                  # no C7515 / C7510 (serialized wgmma)
        counts = opcode_counts(disassemble(b.compiled.cubin))
        assert any(op.startswith(mma) and "E4M3.E4M3" in op for op in counts), sorted(counts)
        assert count_prefix(counts, "HMMA") == 0, counts      # no f16 emulation of the fp8 mma
        assert count_prefix(counts, "RED") + count_prefix(counts, "REDG") > 0, counts   # atomic f32 partials
        assert count_prefix(counts, "STG") == 0, counts
        loop = st.main_loop
        # sm_90a block scales: two k-tiles per iteration (wgmma_pipeline)
        per_iteration = 8 if arch == "sm_89" else 4 * (2 if block_scale else 1)
        assert loop is not None and loop.mma == per_iteration * products, st.summary()
    act = build(moe_splitk_act_kernel(bf16, "silu", slot_rows=True), arch, BM=16).stats
    assert not act.spills and act.local_memory_instructions == 0 and act.stack_frame == 0, act.summary()


@pytest.mark.parametrize("arch", ["sm_89", "sm_90a"])
def test_splits_read_each_weight_tile_once_and_add_only_real_rows(arch: str, monkeypatch) -> None:
    """Emulator counters: the split gate-up kernel's cp.async traffic (token rows of ``xq``, tiles
    of ``w13``) equals the plain kernel's (the prefetches past a split's last k-tile read
    nothing), its atomic additions cover the real slots only (``S * I`` f32 per split and
    product), and the workspace holds the scaled products ``s_t * W[e] @ xq[t]``."""
    from hexlayout.ops.moe.align import run_moe_align
    from hexlayout.ops.moe.fp8_kernels_sm89 import moe_fp8_gate_up_kernel, moe_fp8_quant_kernel
    from hexlayout.ops.moe.fp8_kernels_sm90 import moe_fp8_gate_up_sm90_kernel

    from hexlayout.lang import bf16
    from hexlayout.runtime import build
    from hexlayout.runtime.emulate import emulate

    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    t, k, e, h, i, split = 3, 2, 8, 640, 64, 3            # 5 k-tiles: 2 + 2 + 1
    x, w13, s13, _, _, tw, ids = make(12, t, h, i, e, k, torch.bfloat16, block=True)
    xq = torch.zeros(t, h, dtype=torch.float8_e4m3fn)
    xs = torch.zeros(t)
    emulate(build(moe_fp8_quant_kernel(bf16), arch, compile=False, ROWS=4, BK=256, WARPS=4), x, xs, xq, xs)
    sid, eid, _ = run_moe_align(ids, e, 16)
    factory = moe_fp8_gate_up_sm90_kernel if arch == "sm_90a" else moe_fp8_gate_up_kernel
    consts = {"BM": 16, "BN": 64, "BK": 128, "STAGES": 2, "TOPK": k, "BLOCK_SCALE": True, "UNIFORM": True}
    if arch == "sm_89":
        consts["WARPS"] = 4
    else:  # the swap-AB kernels' ring: one stage more for the wgmma group in flight
        consts["STAGES"] = SWAP_STAGES
    inter = torch.zeros(t * k, i, dtype=torch.bfloat16)
    plain = emulate(build(factory(bf16), arch, compile=False, **consts), xq, xs, w13, s13, sid, eid, inter)
    ws = torch.zeros(2, t * k, i)
    sk = emulate(build(factory(bf16, True), arch, compile=False, **consts, SPLIT_K=split),
                 xq, xs, w13, s13, sid, eid, ws)

    def by_kind(r: Any, kind: str) -> int:
        return sum(s.gmem_bytes for s in r.find(kind))

    experts = len(torch.unique(ids))                      # one block each (at most 6 slots)
    assert by_kind(sk, "CpAsync") == by_kind(plain, "CpAsync") == (experts * 2 * i + t * k) * h   # e4m3 bytes
    assert by_kind(sk, "RedGlobal") == 2 * t * k * i * 4 * split
    sd = s13.double().repeat_interleave(128, 1).repeat_interleave(128, 2)[:, : 2 * i, :h]
    w64 = w13.double() * sd
    for s in range(t * k):
        want = xs[s // k].double() * (w64[int(ids.flatten()[s])] @ xq[s // k].double())
        assert torch.allclose(ws[0][s].double(), want[:i], rtol=1e-5, atol=1e-4)
        assert torch.allclose(ws[1][s].double(), want[i:], rtol=1e-5, atol=1e-4)


@pytest.mark.gpu
def test_cuda_chooses_a_split_and_captures_in_a_cuda_graph() -> None:
    """On an sm_89 / sm_90 GPU the chooser splits this DeepSeek-like decode gate-up (8 experts x 4
    column blocks of 64 over H = 2048) and the op replays in a CUDA graph on a new routing."""
    dev = torch.device("cuda")
    if torch.cuda.get_device_capability(dev) < (8, 9):
        pytest.skip("fp8 experts need sm_89 or sm_90")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    assert fp8_split_k(1, 8, 16, 2048, 256, sms, 16) > 1
    x, w13, s13, w2, s2, tw, ids = make(13, 1, 2048, 256, 16, 8, torch.bfloat16, block=True)
    args = [a.to(dev) for a in (x, w13, s13, w2, s2, tw, ids)]

    def run() -> torch.Tensor:
        return run_fused_moe_fp8(*args, [128, 128])

    check(run().cpu(), *reference(x, w13, s13, w2, s2, tw, ids, True))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run()
    x2, _, _, _, _, tw2, ids2 = make(14, 1, 2048, 256, 16, 8, torch.bfloat16, block=True)
    for dst, src in ((args[0], x2), (args[5], tw2), (args[6], ids2)):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    check(out.cpu(), *reference(x2, w13, s13, w2, s2, tw2, ids2, True))
