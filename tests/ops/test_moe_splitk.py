"""Split-K gate-up and down GEMMs of the fused MoE (``ops/moe_splitk.py``), run in the emulator
against a float64 torch reference on fresh random data with ``SPLIT_K`` forced to 2, 3 and 4 (``K``
not a multiple of ``SPLIT_K * BK``, splits without a k-tile, ``N`` not a multiple of ``BN``): bf16 / f16,
SiLU / GELU, experts without tokens, an expert map with half the experts remote, the router weight
on the input; the chooser's decisions for the DeepSeek-V3 TP8 and Mixtral decode shapes; no host
synchronization and workspaces sized from the sizes only; NVRTC compiles without spills."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import hexlayout.ops  # noqa: F401 - registers torch.ops.hexlayout.fused_moe
import pytest
import torch
import torch.nn.functional as F
from hexlayout.ops.moe.op import _down, _gate_up, run_fused_moe
from hexlayout.ops.moe.pipeline import run_moe_pipeline
from hexlayout.ops.moe.splitk import SPLIT_K_ENV, choose_split_k, splitk_down, splitk_gate_up

from hexlayout.runtime.args import ArgumentError

splitk_mod = importlib.import_module("hexlayout.ops.moe.splitk")


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.delenv(SPLIT_K_ENV, raising=False)


def reference(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, tw: torch.Tensor, ti: torch.Tensor,
              act: str = "silu", emap: torch.Tensor | None = None, scale_in: bool = False) -> torch.Tensor:
    """float64: out[t] = sum_j w_tj * w2[e] @ (act(w13[e, :I] @ x_t) * (w13[e, I:] @ x_t))."""
    x, w13, w2 = x.double(), w13.double(), w2.double()
    i = w2.shape[2]
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ti.shape[1]):
            g = int(ti[t, j])
            e = g if emap is None else int(emap[g])
            if e < 0:
                continue
            w = float(tw[t, j])
            xt = x[t] * w if scale_in else x[t]
            h = w13[e] @ xt
            a = F.silu(h[:i]) if act == "silu" else F.gelu(h[:i])
            o = w2[e] @ (a * h[i:])
            out[t] += o if scale_in else w * o
    return out


def make(t: int, h: int, i: int, e: int, k: int, dt: torch.dtype, seed: int, used: int | None = None
         ) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(dt)
    w13 = (torch.randn(e, 2 * i, h, generator=g) / h ** 0.5).to(dt)
    w2 = (torch.randn(e, h, i, generator=g) / i ** 0.5).to(dt)
    tw = torch.rand(t, k, generator=g) + 0.1
    used = used or e
    ids = torch.stack([torch.randperm(used, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    return x, w13, w2, tw, ids


def close(got: torch.Tensor, want: torch.Tensor, dt: torch.dtype) -> None:
    tol = 2e-2 if dt == torch.bfloat16 else 4e-3
    err = (got.double() - want).abs().max().item()
    assert err <= tol * (1 + want.abs().max().item()), err


def _never(run: Any, inter: Any) -> None:
    raise AssertionError("the plain gate-up launcher ran instead of the split one")


def _split(w13: torch.Tensor, n: int, fallback: Callable[..., None] = _never) -> Callable[..., None]:
    return splitk_gate_up(w13, fallback, split_k=n)


def _split_down(w2: torch.Tensor, n: int) -> Callable[..., None]:
    return splitk_down(w2, _never, split_k=n)


# split, t, h, i, e, k, dtype, activation, experts used (the rest get no token). BK is 64 for these
# slot counts: H 200 -> 4 k-tiles (split 3: 2 + 2 + none), H 320 -> 5 (split 4: 2 + 2 + 1 + none),
# H 136 -> 3 (split 2: 2 + 1); I 96 and 40 are not multiples of BN = 64.
CASES = [
    (2, 1, 136, 64, 8, 2, torch.float16, "silu", 8),
    (3, 3, 200, 40, 32, 6, torch.bfloat16, "gelu", 20),
    (4, 16, 320, 96, 8, 2, torch.float16, "gelu", 5),
    (4, 5, 200, 64, 16, 8, torch.bfloat16, "silu", 12),
]


@pytest.mark.parametrize(("split", "t", "h", "i", "e", "k", "dt", "act", "used"), CASES)
def test_forced_split_matches_float64(split: int, t: int, h: int, i: int, e: int, k: int, dt: torch.dtype,
                                      act: str, used: int) -> None:
    x, w13, w2, tw, ids = make(t, h, i, e, k, dt, seed=split * 31 + t, used=used)
    out = run_moe_pipeline(x, tw, ids, e, i, act, False, None, _split(w13, split), _down(w2))
    assert out.shape == x.shape and out.dtype == dt
    close(out, reference(x, w13, w2, tw, ids, act), dt)


# split, t, h, i, e, k, dtype, activation, router weight on the input: the down GEMM's K is I (200 ->
# 4 k-tiles: split 3 = 2 + 2 + none; 320 -> 5: split 4 = 2 + 2 + 1 + none; 136 -> 3: split 2 = 2 + 1),
# its N = H (72, 40 not multiples of BN = 64)
DOWN_CASES = [
    (2, 1, 72, 136, 8, 2, torch.bfloat16, "silu", False),
    (3, 4, 40, 200, 16, 6, torch.float16, "gelu", False),
    (4, 9, 64, 320, 8, 1, torch.bfloat16, "gelu", True),
]


@pytest.mark.parametrize(("split", "t", "h", "i", "e", "k", "dt", "act", "scale_in"), DOWN_CASES)
def test_forced_split_down_matches_float64(split: int, t: int, h: int, i: int, e: int, k: int,
                                           dt: torch.dtype, act: str, scale_in: bool) -> None:
    x, w13, w2, tw, ids = make(t, h, i, e, k, dt, seed=split * 37 + t, used=max(k, e // 2))
    out = run_moe_pipeline(x, tw, ids, e, i, act, scale_in, None, _gate_up(w13), _split_down(w2, split))
    close(out, reference(x, w13, w2, tw, ids, act, scale_in=scale_in), dt)


def test_expert_map_with_half_the_experts_remote() -> None:
    x, w13, w2, tw, _ = make(8, 200, 64, 8, 2, torch.bfloat16, seed=5)
    g = torch.Generator().manual_seed(11)
    emap = torch.full((16,), -1, dtype=torch.int32)
    emap[torch.randperm(16, generator=g)[:8]] = torch.randperm(8, generator=g).to(torch.int32)
    ids = torch.stack([torch.randperm(16, generator=g)[:2] for _ in range(8)]).to(torch.int32)
    out = run_moe_pipeline(x, tw, ids, 8, 64, "silu", False, emap, _split(w13, 3), _down(w2))
    close(out, reference(x, w13, w2, tw, ids, emap=emap), torch.bfloat16)
    both = run_moe_pipeline(x, tw, ids, 8, 64, "silu", False, emap, _split(w13, 2), _split_down(w2, 2))
    close(both, reference(x, w13, w2, tw, ids, emap=emap), torch.bfloat16)
    assert (both[(emap[ids.long()] < 0).all(1)] == 0).all()
    remote = (emap[ids.long()] < 0).all(1)
    assert remote.any() and (out[remote] == 0).all()


def test_router_weight_on_input() -> None:
    x, w13, w2, tw, ids = make(7, 200, 64, 8, 1, torch.float16, seed=9)
    out = run_moe_pipeline(x, tw, ids, 8, 64, "gelu", True, None, _split(w13, 2), _down(w2))
    want = reference(x, w13, w2, tw, ids, "gelu", scale_in=True)
    close(out, want, torch.float16)
    # not the same as weighting the output (GELU is not linear)
    assert (want - reference(x, w13, w2, tw, ids, "gelu")).abs().max() > 1e-2


def test_nan_in_the_input_propagates_to_its_token_only() -> None:
    x, w13, w2, tw, ids = make(3, 136, 136, 8, 2, torch.float16, seed=1)
    x[1, 5] = float("nan")
    out = run_moe_pipeline(x, tw, ids, 8, 136, "silu", False, None, _split(w13, 2), _split_down(w2, 2))
    assert torch.isnan(out[1]).all()
    assert torch.isfinite(out[[0, 2]]).all()


def test_intermediate_equals_the_plain_kernel() -> None:
    """The split path's ``inter`` (rows of an expert, padding rows included) is the plain
    kernel's up to f32 summation order."""
    x, w13, w2, tw, ids = make(3, 320, 96, 8, 2, torch.bfloat16, seed=21, used=3)
    got: dict[str, torch.Tensor] = {}

    def keep(name: str) -> Callable[..., None]:
        def down(run: Any, inter: torch.Tensor, y: torch.Tensor) -> None:
            used = (run.expert_ids >= 0).repeat_interleave(run.cfg["BM"])
            got[name] = inter[used].clone()
            _down(w2)(run, inter, y)
        return down

    run_moe_pipeline(x, tw, ids, 8, 96, "silu", False, None, _gate_up(w13), keep("plain"))
    run_moe_pipeline(x, tw, ids, 8, 96, "silu", False, None, _split(w13, 4), keep("split"))
    assert got["plain"].shape == got["split"].shape and got["plain"].shape[0] >= 16
    assert torch.allclose(got["split"].double(), got["plain"].double(), rtol=2e-2, atol=2e-2)


def test_splits_read_each_weight_tile_once_and_add_only_real_rows() -> None:
    """Emulator counters: the split kernel's cp.async traffic (rows of ``x``, tiles of ``w13``)
    equals the plain kernel's (the prefetches past a split's last k-tile read nothing), and its
    atomic additions cover the real slots only (``S * I`` f32 per split and product)."""
    from hexlayout.ops.moe.align import run_moe_align
    from hexlayout.ops.moe.kernels_sm80 import moe_config, moe_gate_up_kernel
    from hexlayout.ops.moe.splitk import moe_gate_up_splitk_kernel

    from hexlayout.lang import f16
    from hexlayout.runtime import build
    from hexlayout.runtime.emulate import emulate

    t, k, e, h, i, split = 3, 2, 8, 320, 64, 3          # 5 k-tiles: 2 + 2 + 1
    x, w13, _, tw, ids = make(t, h, i, e, k, torch.float16, seed=17)
    cfg = moe_config(t * k)
    sid, eid, _ = run_moe_align(ids, e, cfg["BM"])
    inter = torch.empty(sid.shape[0], i, dtype=torch.float16)
    plain = emulate(build(moe_gate_up_kernel(f16, "silu"), "sm_80", compile=False, **cfg, TOPK=k),
                    x, w13, sid, eid, tw.reshape(-1), inter)
    ws = torch.zeros(2, sid.shape[0], i)
    sk = emulate(build(moe_gate_up_splitk_kernel(f16), "sm_80", compile=False, **cfg, TOPK=k, SPLIT_K=split),
                 x, w13, sid, eid, ws[0], ws[1])

    def by_kind(r: Any, kind: str) -> int:
        return sum(s.gmem_bytes for s in r.find(kind))

    experts = len(torch.unique(ids))                    # one block each (at most 6 slots)
    assert by_kind(sk, "CpAsync") == by_kind(plain, "CpAsync") == (experts * 2 * i + t * k) * h * 2
    assert by_kind(sk, "RedGlobal") == 2 * t * k * i * 4 * split
    used = (eid >= 0).repeat_interleave(cfg["BM"])
    x64, w64 = x.double(), w13.double()
    slots = sid[used]
    for p, s in zip(torch.nonzero(used).flatten().tolist(), slots.tolist()):
        ex = int(eid[p // cfg["BM"]])
        want = w64[ex] @ x64[s // k] if s < t * k else torch.zeros(2 * i, dtype=torch.float64)
        assert torch.allclose(ws[0][p].double(), want[:i], atol=1e-3)
        assert torch.allclose(ws[1][p].double(), want[i:], atol=1e-3)


def test_fused_moe_splits_when_forced_by_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    x, w13, w2, tw, ids = make(2, 200, 64, 8, 2, torch.float16, seed=3)
    built: list[int] = []
    real = splitk_mod.build_for
    monkeypatch.setattr(splitk_mod, "build_for",
                        lambda k, d, c: built.append(c.get("SPLIT_K", 0)) or real(k, d, c))
    plain = run_fused_moe(x, w13, w2, tw, ids)          # CPU, nothing forced: the plain path
    assert built == []
    monkeypatch.setenv(SPLIT_K_ENV, "3")
    out = torch.ops.hexlayout.fused_moe(x, w13, w2, tw, ids)
    assert built == [3, 0, 3, 0]           # split gate-up, activation kernel, split down, cast kernel
    want = reference(x, w13, w2, tw, ids)
    close(out, want, torch.float16)
    close(plain, want, torch.float16)
    monkeypatch.setenv(SPLIT_K_ENV, "1")                 # 1: off
    run_fused_moe(x, w13, w2, tw, ids)
    assert built == [3, 0, 3, 0]
    for bad in ("0", "two", "2.5", "-1"):
        monkeypatch.setenv(SPLIT_K_ENV, bad)
        with pytest.raises(ArgumentError, match=f"{SPLIT_K_ENV}.*integer >= 1"):
            run_fused_moe(x, w13, w2, tw, ids)
    with pytest.raises(ArgumentError, match="split_k.*integer >= 1"):
        splitk_gate_up(w13, _gate_up(w13), split_k=0)
    with pytest.raises(ArgumentError, match="split_k.*integer >= 1"):
        splitk_down(w2, _down(w2), split_k=True)


# (T, k, E, H, I, SMs) -> SPLIT_K by the documented rule, worked by hand: decode (S = T * k <= 128)
# tiles are BM 16 x BN 64 x BK 64; M = min(NB, max(ceil(S / 16), min(S, E))) row blocks, tiles =
# M * ceil(I / 64), KT = ceil(H / 64); tiles >= SMs -> 1, else min(16, 2 * SMs // tiles, KT // 8).
DEEPSEEK = (256, 7168, 256)        # E, H, I of the DeepSeek-V3 TP8 slice (k = 8): KT = 112
MIXTRAL = (8, 4096, 14336)         # Mixtral-8x7B (k = 2): KT = 64
DECISIONS = [
    ((1, 8, *DEEPSEEK, 132), 8, 32),      # M 8, 4 column blocks: 32 tiles; 264 // 32 = 8 -> 256 blocks
    ((2, 8, *DEEPSEEK, 132), 4, 64),      # M 16: 64 tiles -> 4
    ((4, 8, *DEEPSEEK, 132), 2, 128),     # M 32: 128 tiles (< 132) -> 2
    ((8, 8, *DEEPSEEK, 132), 1, 256),     # M 64: 256 tiles, a wave already
    ((16, 8, *DEEPSEEK, 132), 1, 512),
    ((1, 8, *DEEPSEEK, 108), 6, 32),      # A100: 216 // 32 = 6
    ((1, 2, *MIXTRAL, 132), 1, 448),      # M 2 x 224 column blocks
    ((16, 2, *MIXTRAL, 132), 1, 1792),    # M 8 (all experts)
    ((1, 2, 8, 4096, 1792, 132), 4, 56),  # Mixtral TP8 slice: 2 x 28 = 56 tiles; 264 // 56 = 4
    ((1, 2, 8, 512, 1792, 132), 1, 56),   # KT 8: 8 // 8 = 1 split of 8 k-tiles at most
    ((1, 8, 256, 1024, 256, 132), 2, 32),  # KT 16: capped at 16 // 8 = 2
]


# the down GEMM: N = H, K = I (BN 64, BK 64 at decode): tiles = M * ceil(H / 64), KT = ceil(I / 64)
DOWN_DECISIONS = [
    ((1, 8, *DEEPSEEK, 132), 1),          # M 8 x 112 column blocks = 896 tiles
    ((1, 2, *MIXTRAL, 132), 2),           # M 2 x 64 = 128 tiles (< 132): min(16, 264 // 128, 224 // 8) = 2
    ((2, 2, *MIXTRAL, 132), 1),           # M 4: 256 tiles
    ((1, 2, 8, 4096, 1792, 132), 2),      # Mixtral TP8: 128 tiles, KT 28 -> min(2, 3) = 2
    ((1, 2, 8, 4096, 960, 132), 1),       # KT 15: 15 // 8 = 1
    ((1, 1, 8, 2048, 8192, 132), 8),      # M 1 x 32 = 32 tiles: min(16, 8, 128 // 8) = 8
]


@pytest.mark.parametrize(("sizes", "split"), DOWN_DECISIONS)
def test_chooser_decisions_down(sizes: tuple[int, ...], split: int) -> None:
    assert choose_split_k(*sizes, gemm="down") == split


@pytest.mark.parametrize(("sizes", "split", "tiles"), DECISIONS)
def test_chooser_decisions(sizes: tuple[int, ...], split: int, tiles: int) -> None:
    assert choose_split_k(*sizes) == split
    sms = sizes[-1]
    if split > 1:                                        # one to two waves of blocks
        assert tiles < sms and tiles * split <= 2 * sms
        assert sizes[3] // 64 // split >= 8              # every split at least 8 k-tiles


def test_chooser_fills_at_most_two_waves_for_every_decode_size() -> None:
    for t in range(1, 17):
        for e, k, h, i in ((256, 8, 7168, 256), (8, 2, 4096, 14336), (8, 2, 4096, 1792), (64, 6, 2048, 1408)):
            s = choose_split_k(t, k, e, h, i, 132)
            assert 1 <= s <= 16
            assert s == 1 or -(-h // 64) // s >= 8, (t, e, k, h, i, s)


def test_the_split_path_never_synchronizes(monkeypatch: pytest.MonkeyPatch) -> None:
    """No tensor becomes a host value, and the workspace and launch constants depend on the
    sizes only (two different routings: the same)."""
    x, w13, w2, tw, ids = make(4, 136, 136, 8, 2, torch.float16, seed=6)
    want = reference(x, w13, w2, tw, ids)
    seen: list[tuple] = []
    real = splitk_mod.run_kernel

    def record(bld: Any, args: tuple, outputs: tuple) -> None:
        seen.append(tuple(tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args))
        real(bld, args, outputs)

    monkeypatch.setattr(splitk_mod, "run_kernel", record)

    def refuse(*a: object, **k: object) -> None:
        raise AssertionError("host synchronization")

    with monkeypatch.context() as m:
        for name in ("item", "tolist", "__int__", "__bool__", "__index__", "nonzero"):
            m.setattr(torch.Tensor, name, refuse)
        out = run_moe_pipeline(x, tw, ids, 8, 136, "silu", False, None, _split(w13, 2), _split_down(w2, 2))
    close(out, want, torch.float16)
    other = torch.zeros_like(ids)
    other[:, 1] = 1                                      # every token on experts 0 and 1
    run_moe_pipeline(x, tw, other, 8, 136, "silu", False, None, _split(w13, 2), _split_down(w2, 2))
    assert len(seen) == 8 and seen[:4] == seen[4:]


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_kernels_compile_without_spills(arch: str) -> None:
    from hexlayout.ops.moe.kernels_sm80 import moe_config, moe_down_config
    from hexlayout.ops.moe.splitk import (
        moe_down_splitk_kernel,
        moe_gate_up_splitk_kernel,
        moe_splitk_act_kernel,
        moe_splitk_cast_kernel,
    )

    from hexlayout.lang import bf16, f16
    from hexlayout.runtime import build
    from hexlayout.runtime.sass import count_prefix, disassemble, opcode_counts

    for dt, extra in ((bf16, {"TOPK": 8, "SPLIT_K": 8}), (f16, {"TOPK": 2, "SPLIT_K": 3})):
        b = build(moe_gate_up_splitk_kernel(dt), arch, **moe_config(16), **extra)
        st = b.stats
        assert not st.spills and st.local_memory_instructions == 0 and st.stack_frame == 0, st.summary()
        assert not st.warnings, st.warnings
        counts = opcode_counts(disassemble(b.compiled.cubin))
        assert count_prefix(counts, "HMMA") > 0 and st.main_loop is not None and st.main_loop.mma == 16
        assert count_prefix(counts, "RED") + count_prefix(counts, "REDG") > 0, counts   # atomic partials
        assert count_prefix(counts, "STG") == 0, counts
    for dt, extra in ((bf16, {"SPLIT_K": 2}), (f16, {"SPLIT_K": 3, "SCALE_IN": True})):
        b = build(moe_down_splitk_kernel(dt), arch, **moe_down_config(moe_config(16)), **extra)
        st = b.stats
        assert not st.spills and st.local_memory_instructions == 0 and st.stack_frame == 0, st.summary()
        assert not st.warnings, st.warnings
        counts = opcode_counts(disassemble(b.compiled.cubin))
        assert count_prefix(counts, "HMMA") > 0 and st.main_loop is not None and st.main_loop.mma == 8
        assert count_prefix(counts, "RED") + count_prefix(counts, "REDG") > 0, counts
    st = build(moe_splitk_cast_kernel(bf16), arch).stats
    assert not st.spills and st.local_memory_instructions == 0 and st.epilogue_stores == {"STG.128": 2}
    for act, scale_in in (("silu", False), ("gelu", True)):
        st = build(moe_splitk_act_kernel(bf16, act), arch, BM=16, SCALE_IN=scale_in).stats
        assert not st.spills and st.local_memory_instructions == 0 and st.stack_frame == 0, st.summary()
        assert st.epilogue_stores == {"STG.128": 2}, st.summary()


@pytest.mark.gpu
@pytest.mark.parametrize(("e", "k", "h", "i"), [(16, 8, 2048, 256), (8, 2, 2048, 2048)])
def test_cuda_chooses_a_split_and_captures_in_a_cuda_graph(e: int, k: int, h: int, i: int) -> None:
    """On a GPU the chooser splits these decode shapes (DeepSeek-like gate-up: 8 experts x 4
    column blocks; Mixtral-like down: 2 x 32 blocks) and the op replays in a CUDA graph on a
    new routing."""
    dev = torch.device("cuda")
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    splits = (choose_split_k(1, k, e, h, i, sms), choose_split_k(1, k, e, h, i, sms, gemm="down"))
    assert max(splits) > 1, splits
    x, w13, w2, tw, ids = make(1, h, i, e, k, torch.bfloat16, seed=40)
    args = [a.to(dev) for a in (x, w13, w2, tw, ids)]
    close(run_fused_moe(*args).cpu(), reference(x, w13, w2, tw, ids), torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = run_fused_moe(*args)
    x2, _, _, tw2, ids2 = make(1, h, i, e, k, torch.bfloat16, seed=41)
    for dst, src in ((args[0], x2), (args[3], tw2), (args[4], ids2)):
        dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    close(out.cpu(), reference(x2, w13, w2, tw2, ids2), torch.bfloat16)
