"""sm_100a kernels in PTX mode: tensor memory (alloc / dealloc / relinquish), ``tcgen05.mma``
with its shared-memory and instruction descriptors decoded from the register bits, commits
landing on mbarriers (multicast for the CTA pair), ``tcgen05.ld`` fragments and the block-scaled
MMA with ``tcgen05.cp``'d factors, executed from the PTX NVRTC made of the printed source,
against float64 at small, ragged sizes with NaN-filled outputs; and mutations of the printed
source that only PTX mode sees."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from hexlayout.ops.gemm.config import CONFIGS, GemmConfig
from hexlayout.ops.gemm.op import _arg_order, gemm_fused

import hexlayout.lang as hl
import hexlayout.runtime as rt
from hexlayout.ptx import PtxDeadlockError, PtxError, PtxRaceError

from .test_ops import ptx_runs  # noqa: F401  (fixture)

_EP = (False, False, "none", False)


def _config(name: str):
    cfgs = CONFIGS["sm_100a"]
    if name == "small persistent pair":          # built for 200 x 64: GRID = 1, one pair walks every tile
        return GemmConfig("sm_100a", 128, 64, 64, 2, CONSUMERS=1, persistent=True, cluster=2)
    if name == "small persistent":               # ... one CTA walks every tile
        return GemmConfig("sm_100a", 128, 64, 64, 2, CONSUMERS=1, persistent=True, cluster=1)
    if name in ("pair", "persistent pair"):
        return next(c for c in cfgs if c.cluster == 2 and c.persistent == (name == "persistent pair"))
    if name == "persistent":
        return next(c for c in cfgs if c.persistent and c.cluster == 1)
    return next(
        c
        for c in cfgs
        if (c.BM, c.BN, c.cluster)
        == {"m64": (64, 64, 1), "m64n128": (64, 128, 1), "m128": (128, 128, 1)}[name]
    )


_BUILDS: dict[str, object] = {}


def _build(name: str):
    if name not in _BUILDS:
        n = 64 if name.startswith("small persistent") else 200
        _BUILDS[name] = gemm_fused(hl.bf16, "nk", _EP, "sm_100a", _config(name), 200, n, compile=False)
    return _BUILDS[name]


def _run(name: str, m: int, n: int, k: int, source: str | None = None, seed: int = 1, mode: str = "ptx"):
    bld, prog = _build(name)
    rng = np.random.default_rng(seed + m * n + k)
    npdt = hl.bf16.numpy()
    a, b = rng.standard_normal((m, k)).astype(npdt), rng.standard_normal((n, k)).astype(npdt)
    c = np.full((m, n), np.nan, npdt)
    by_role = {"a": a, "b": b, "c": c, "bias": None, "residual": None, "scale": 0.5}
    roles = ["a", "b", "c", "bias", "residual", "scale"]
    rep = rt.emulate(bld, *[by_role[roles[i]] for i in _arg_order(prog, _EP)], mode=mode, source=source)
    want = a.astype(np.float64) @ b.astype(np.float64).T
    return rep, c.astype(np.float64), want


def _err(c, want) -> float:
    return float((np.abs(c - want) / (np.abs(want) + 1)).max())


@pytest.mark.parametrize(
    ("cfg", "shape", "ld"),
    [
        ("m64", (64, 56, 136), "tcgen05.ld.sync.aligned.16x256b.x8.b32"),  # M=64: rows in half quarters
        ("m64n128", (64, 136, 72), "tcgen05.ld.sync.aligned.16x256b.x16.b32"),  # 2 column tiles
        ("m128", (100, 56, 152), "tcgen05.ld.sync.aligned.32x32b.x128.b32"),
        ("persistent", (200, 120, 72), "tcgen05.ld.sync.aligned.32x32b.x128.b32"),  # 4 tiles on 2 blocks
    ],
)
def test_gemm_matches_float64(cfg: str, shape, ld: str) -> None:
    rep, c, want = _run(cfg, *shape)
    assert rep.opcodes.get("tcgen05.mma.cta_group::1.kind::f16") and rep.opcodes.get(ld)
    assert rep.opcodes.get("tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32")
    assert _err(c, want) < 1e-2
    _, c_ir, _ = _run(cfg, *shape, mode="ir")
    np.testing.assert_allclose(c, c_ir, rtol=2**-7, atol=0)  # IR mode's result, to a bf16 rounding


@pytest.mark.parametrize(
    ("cfg", "shape", "blocks"),
    [
        ("pair", (200, 136, 72), 2),
        ("persistent pair", (200, 300, 72), 2),  # one pair walks both column tiles
    ],
)
def test_gemm_cta_pair_matches_float64(cfg: str, shape, blocks: int) -> None:
    """cta_group::2: the even CTA issues, each CTA of the pair reads its half of A and of B at the
    same shared offsets, commits multicast to both CTAs' barriers; ragged in M, N and K."""
    rep, c, want = _run(cfg, *shape)
    assert rep.opcodes.get("tcgen05.mma.cta_group::2.kind::f16")
    assert rep.opcodes.get(
        "tcgen05.commit.cta_group::2.mbarrier::arrive::one.shared::cluster.multicast::cluster.b64"
    )
    assert len(rep.blocks) == blocks
    assert _err(c, want) < 1e-2
    _, c_ir, _ = _run(cfg, *shape, mode="ir")
    np.testing.assert_allclose(c, c_ir, rtol=2**-7, atol=0)


@pytest.mark.parametrize("shape", [(300, 104, 200), (300, 104, 40)])
def test_persistent_pair_accumulator_stages_match_float64(shape) -> None:
    """The persistent pair with an MMA warp group and two TMEM accumulator stages: 4 tiles on one
    pair (stages 0, 1, 0, 1), ragged M, N and K (K = 40: one partial k-tile, the k-loop empty);
    each epilogue warp of both CTAs releases a stage by a ``__syncwarp`` and lane 0's cluster-scope
    remote arrive on the even CTA's acc_empty. (K = 0 has no tensor map - extents must be >= 1 -
    and never launches: the op writes the zero product itself; the IR emulator runs the kernel's
    K = 0 path.)"""
    rep, c, want = _run("small persistent pair", *shape)
    assert rep.opcodes.get("mbarrier.arrive.release.cluster.shared::cluster.b64")
    assert rep.opcodes.get("bar.warp.sync")
    assert rep.opcodes.get("tcgen05.mma.cta_group::2.kind::f16")
    assert len(rep.blocks) == 2
    assert _err(c, want) < 1e-2
    _, c_ir, _ = _run("small persistent pair", *shape, mode="ir")
    np.testing.assert_allclose(c, c_ir, rtol=2**-7, atol=0)


# --- the MoE families on sm_100a ------------------------------------------------------------------


@pytest.fixture
def sm100(ptx_runs: list[str], monkeypatch: pytest.MonkeyPatch) -> list[str]:  # noqa: F811
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_100a")
    return ptx_runs


@pytest.mark.parametrize(
    ("t", "h", "i", "e", "k", "dt", "act", "used", "kind"),
    [
        (3, 96, 80, 8, 2, torch.bfloat16, "silu", 5, "sm100_"),  # swap-AB, BM 16; H, I ragged
        (40, 64, 72, 2, 4, torch.float16, "gelu", 2, "sm100_ws_"),  # large-token, warp-specialized
    ],
)
def test_fused_moe_bf16_f16(sm100: list[str], t, h, i, e, k, dt, act, used, kind) -> None:
    from hexlayout.ops import fused_moe

    from tests.ops.test_moe_op import close, make
    from tests.ops.test_moe_op import reference as moe_reference

    x, w13, w2, tw, ids = make(t, h, i, e, k, dt, seed=t + 27, experts_used=used)
    out = fused_moe(x, w13 * 2, w2 * 2, tw, ids, activation=act)
    close(out, moe_reference(x, w13 * 2, w2 * 2, tw, ids, act), dt)
    assert any(r.startswith("moe_gate_up_" + kind) for r in sm100)
    assert any(r.startswith("moe_down_" + kind) for r in sm100)


def test_fused_moe_fp8_block_scales(sm100: list[str]) -> None:
    import hexlayout.ops
    from hexlayout.ops.moe.fp8 import prepare_fp8

    from tests.ops.test_moe_fp8 import check, make, reference

    x, w13, s13, w2, s2, tw, ids = make(7, 5, 256, 176, 4, 2, torch.bfloat16, True, gne=4)
    a, b = prepare_fp8(w13, s13, block=(128, 128)), prepare_fp8(w2, s2, block=(128, 128))
    out = hexlayout.ops.fused_moe(x, a, b, tw, ids, activation="silu")
    check(out, *reference(x, w13, s13, w2, s2, tw, ids, True, "silu"))
    assert any(r.startswith("moe_fp8_gate_up_sm100") for r in sm100)


def test_fused_moe_fp8_ue8m0_block_scaled_mma(sm100: list[str]) -> None:
    import hexlayout.ops
    from hexlayout.ops.moe.fp8 import prepare_fp8

    from tests.ops.test_moe_fp8 import check, make, reference

    x, w13, s13, w2, s2, tw, ids = make(9, 5, 256, 176, 4, 2, torch.bfloat16, True, gne=4)
    s13, s2 = (torch.exp2(torch.round(torch.log2(s))) for s in (s13, s2))
    a, b = prepare_fp8(w13, s13, block=(128, 128)), prepare_fp8(w2, s2, block=(128, 128))
    assert a.scale_format == "ue8m0"
    out = hexlayout.ops.fused_moe(x, a, b, tw, ids, activation="silu")
    check(out, *reference(x, w13, s13, w2, s2, tw, ids, True, "silu"))
    assert any(r.startswith("moe_fp8_gate_up_sm100_ue8m0") for r in sm100)


@pytest.mark.parametrize(("fmt", "bits", "group", "dtype"), [
    ("awq", 4, 32, torch.float16),
    ("gptq", 8, -1, torch.bfloat16),  # W8A16, per-channel scales
])
def test_fused_moe_wna16(sm100: list[str], fmt: str, bits: int, group: int, dtype) -> None:
    from tests.ops.test_moe_wna16 import _bound
    from tests.ops.test_moe_wna16 import _run as wna16_run

    out, want = wna16_run(fmt, bits, group, dtype, 5, 4, 2, "silu", "random", seed=511)
    assert (out.double() - want).abs().max().item() <= _bound(dtype) * want.abs().max().item()
    assert any(r.startswith("moe_wna16_gate_up_sm100") for r in sm100)


# --- mutations of the printed source that only PTX mode sees ---------------------------------------


def _mutated(name: str, pattern: str, repl: str, flags: int = 0) -> str:
    bld, _ = _build(name)
    bad, n = re.subn(pattern, repl, bld.generated.source, count=1, flags=flags)  # type: ignore[attr-defined]
    assert n == 1, f"the printed source no longer matches {pattern!r}"
    return bad


def test_mutated_instruction_descriptor_a_major_bit_gives_a_wrong_product() -> None:
    """Bit 15 of the instruction descriptor (A major: 0 K, 1 MN) set in the first k-tile's MMAs:
    the executor decodes the printed bits, reads A MN-major, and the product is wrong."""
    bad = _mutated("m64", r"\"r\"\(0x4100490u\), \"r\"\(0\)", '"r"(0x4108490u), "r"(0)')
    _, c, want = _run("m64", 64, 56, 136, source=bad)
    _, c_ok, _ = _run("m64", 64, 56, 136)
    assert _err(c_ok, want) < 1e-2 and _err(c, want) > 0.1


def test_mutated_tcgen05_ld_shape_gives_a_wrong_result() -> None:
    """The accumulator read as ``16x128b.x16`` (the same 32 registers) instead of ``16x256b.x8``."""
    bad = _mutated(
        "m64", r"tcgen05\.ld\.sync\.aligned\.16x256b\.x8\.b32", "tcgen05.ld.sync.aligned.16x128b.x16.b32"
    )
    _, c, want = _run("m64", 64, 56, 136, source=bad)
    assert not np.isnan(c).any() and _err(c, want) > 0.1


def test_dropped_commit_is_a_deadlock() -> None:
    """The first k-tile's ``tcgen05.commit`` (its stage's release) dropped: nothing arrives on that
    stage's empty barrier, so the producer waits forever to refill it once the ring wraps (9
    k-tiles through 7 stages)."""
    commit = (r"asm volatile\(\"\{\\n\.reg \.pred q;\\nsetp\.ne\.b32 q, %1, 0;\\n"
              r"@q tcgen05\.commit[^;]*;\\n\}\\n\"")
    bad = _mutated("m64", commit + r"\s*::[^:]*: \"memory\"\);", ";")
    with pytest.raises(PtxDeadlockError, match=r"none of the \d+ live threads can run(.|\n)*ring\.acquire"):
        _run("m64", 64, 56, 576, source=bad)


def test_dropped_dealloc_is_an_error_at_exit() -> None:
    bad = _mutated("m64", r"if \(tid < 32\) asm volatile\(\"tcgen05\.dealloc[^;]*;\\n\"[^;]*;", ";")
    with pytest.raises(PtxError, match=r"exits with TMEM columns \[0, 64\) still allocated"):
        _run("m64", 64, 56, 136, source=bad)


def test_pair_commit_multicast_to_one_cta_is_a_deadlock() -> None:
    """cta_group::2's commit of the tile (onto the accumulator's barrier, after the k-loop)
    multicast to the even CTA only: the odd CTA's epilogue waits forever."""
    bad = _mutated(
        "pair",
        r"(tcgen05\.commit\.cta_group::2[^\n]*\n\s*:: \"r\"\(smem_base \+ \d+\), "
        r"\"h\"\(\(unsigned short\)\()3\)",
        r"\g<1>1)",
    )
    with pytest.raises(PtxDeadlockError):
        _run("pair", 130, 136, 72, source=bad)


def test_stage_released_before_the_mma_completes_is_caught() -> None:
    """The first k-tile's stage released by a plain ``mbarrier.arrive`` at issue instead of the
    MMAs' ``tcgen05.commit``: the producer's next TMA copy into that stage writes bytes the
    in-flight MMA reads, an error (9 k-tiles through 7 stages)."""
    commit = r"tcgen05\.commit\.cta_group::1\.mbarrier::arrive::one\.shared::cluster\.b64 \[%0\];"
    bad = _mutated("m64", commit, "mbarrier.arrive.shared::cta.b64 _, [%0];")
    _, c, want = _run("m64", 64, 56, 576)
    assert _err(c, want) < 1e-2
    with pytest.raises(PtxError, match=r"a TMA copy writes shared byte \d+, which the tcgen05\.mma"):
        _run("m64", 64, 56, 576, source=bad)


# --- the accumulator's release: the next MMA into a stage is ordered after its epilogue's reads ------

_WAIT_LD = r'asm volatile\("tcgen05\.wait::ld\.sync\.aligned;\\n" ::: "memory"\);'
_FENCE_AFTER_WAIT = (_WAIT_LD + r'(\s*#pragma unroll\s*for \(int v = 0; v < \d+; \+\+v\) '
                     r'asm volatile\(""[^;]*;\s*)asm volatile\("tcgen05\.fence::before_thread_sync;\\n" '
                     r'::: "memory"\);')
#: the epilogue's release of the accumulator stage: all its threads arrive (one CTA); __syncwarp, then
#: lane 0's remote arrive on the even CTA's barrier (the pair)
_ARRIVE = {
    "small persistent": r'asm volatile\("\{\\n\.reg \.b64 state;\\nmbarrier\.arrive\.shared::cta\.b64 state, '
                        r'\[%0\];\\n\}\\n"\s*:: "r"\(smem_base \+ \d+\)\s*: "memory"\);',
    "small persistent pair": r'__syncwarp\(\);\s*if \(loop_inv\[\d+\]\) \{\s*asm volatile\("\{\\n\.reg \.b32 '
                             r'remote;[^;]*;[^;]*;\\n\}\\n"[^;]*;\s*\}',
}
_MUTATIONS = {
    "no fence::before_thread_sync": lambda name: (
        _FENCE_AFTER_WAIT, r'asm volatile("tcgen05.wait::ld.sync.aligned;\\n" ::: "memory");\1', 0),
    "no wait::ld": lambda name: (_WAIT_LD, ";", 0),
    "arrive before the loads": lambda name: (
        r"(// \[tcgen05\.ld of the accumulator\])(.*?)(" + _ARRIVE[name] + ")", r"\3\n\1\2", re.S),
}


def test_small_persistent_accumulator_stages_match_float64() -> None:
    """The persistent one-CTA GEMM with two TMEM accumulator stages, 3 tiles on each of 2 CTAs (stages
    0, 1, 0: the third tile's MMAs are ordered after the first tile's epilogue by its release of
    acc_empty), K = 40: no error, float64's product."""
    rep, c, want = _run("small persistent", 300, 104, 40)
    assert rep.opcodes.get("tcgen05.mma.cta_group::1.kind::f16") and len(rep.blocks) == 2
    assert _err(c, want) < 1e-2


@pytest.mark.parametrize("mutation", list(_MUTATIONS))
@pytest.mark.parametrize(("name", "group"), [("small persistent", 1), ("small persistent pair", 2)])
def test_accumulator_released_before_its_reads_are_ordered_is_caught(name: str, group: int,
                                                                    mutation: str) -> None:
    """The first stage's epilogue with its ``tcgen05.fence::before_thread_sync`` dropped, or its
    release of acc_empty moved before its ``tcgen05.ld``: the MMAs of the third tile (the same
    stage, 4 or 6 tiles of 300 x 104) overwrite an accumulator whose reads they are not ordered
    after - an error at the ``tcgen05.mma`` naming the reading thread. With its ``tcgen05.wait::ld``
    dropped, the first read of a loaded register is the error, naming the ``tcgen05.ld``."""
    pattern, repl, flags = _MUTATIONS[mutation](name)
    bad = _mutated(name, pattern, repl, flags)
    if mutation == "no wait::ld":       # the first use of the load's registers is already an error
        with pytest.raises(PtxRaceError, match=r"reads register %\w+, which the tcgen05\.ld\S* at PTX line "
                           r"\d+ still writes \(tcgen05\.wait::ld first\)"):
            _run(name, 300, 104, 40, source=bad)
        return
    want = (rf"tcgen05\.mma\.cta_group::{group}\.kind::f16: D: writes TMEM cell \(lane \d+, column \d+\) "
            r"that thread \d+ reads with tcgen05\.ld, without the issuing thread \d+ being ordered after "
            r"that read(.|\n)*at PTX line \d+: `tcgen05\.mma")
    with pytest.raises(PtxRaceError, match=want):
        _run(name, 300, 104, 40, source=bad)


@pytest.mark.parametrize("name", ["small persistent", "small persistent pair"])
def test_dropped_accumulator_release_is_a_deadlock_naming_the_wait(name: str) -> None:
    """The first stage's release of acc_empty dropped: the MMA warp waits for it forever at the third
    tile; the deadlock names that mbarrier wait and its pending arrivals."""
    bad = _mutated(name, _ARRIVE[name], ";")
    want = (r"meanwhile thread 128 of block \(0, 0, 0\) waits on the mbarrier at shared offset \d+ \(phase "
            r"0: (128 of 128|8 of 8) arrivals pending\) at PTX line \d+: `mbarrier\.try_wait")
    with pytest.raises(PtxDeadlockError, match=want):
        _run(name, 300, 104, 40, source=bad)


def test_accumulator_read_without_observing_its_commit_is_caught() -> None:
    """Only the first epilogue warp waits on the accumulator's barrier (which lands the commit): the
    other warps' ``tcgen05.ld`` reads completed cells without having observed the arrival."""
    bad = _mutated("m64", r"(hl_mbar_wait\(smem_base \+ \d+, tc_commits\[0\])", r"if (tid / 32 % 4 == 0) \1")
    with pytest.raises(PtxRaceError, match=r"tcgen05\.ld\S*: reads TMEM cells that the tcgen05\.mma at PTX "
                       r"line \d+ wrote, whose tcgen05\.commit arrived, but thread \d+ has not observed"):
        _run("m64", 64, 56, 136, source=bad)


# --- a register A operand fed through tensor memory -------------------------------------------------


@pytest.mark.parametrize("wait", [True, False])
def test_register_a_through_tmem(wait: bool) -> None:
    """``hl.mma`` on a register tile: the printed ``tcgen05.st.16x64b`` of A into TMEM and the
    ``_TS`` tcgen05.mma reading ``[a_tmem]``, executed from the PTX against float64 over 6 k-tiles;
    with ``wgmma_wait(2)`` instead of 1 the MMA of k-tile ``k`` may still run at ``k + 2``'s store of
    the same unrolled A, which therefore rotates through two sets of columns (no race reported)."""
    from tests.emulator.test_tcgen05_tmem_a import _gemm_args, _tmem_a_gemm

    bld = rt.build(_tmem_a_gemm(wait), "sm_100a", compile=False)
    args, want = _gemm_args()
    rep = rt.emulate(bld, args["a"], args["b"], args["c"], mode="ptx")
    assert rep.opcodes.get("tcgen05.st.sync.aligned.16x64b.x8.b32")
    assert rep.opcodes.get("tcgen05.wait::st.sync.aligned")
    assert "tcgen05.mma.cta_group::1.kind::f16 [%0], [%1], %2" in bld.generated.source  # A: [a_tmem]
    assert ("_aset" in bld.generated.source) == (not wait)      # the execution counter of the sets
    np.testing.assert_allclose(args["c"], want, rtol=1e-5, atol=1e-5)


def test_register_a_ring_in_tmem(monkeypatch: pytest.MonkeyPatch) -> None:
    """One register-A mma per k-tile left in flight by ``wgmma_wait(1)`` (5 ragged k-tiles): its A
    rotates through two TMEM column sets and the PTX matches float64 with no race; forced to one
    set, the executor reports the store into the columns the previous MMA reads."""
    import hexlayout.ir.lower.umma as lu
    from tests.emulator.test_tcgen05_tmem_a_ring import gemm_args, ring_gemm

    bld = rt.build(ring_gemm(1), "sm_100a", compile=False)
    args, want = gemm_args()
    rt.emulate(bld, args["a"], args["b"], args["c"], mode="ptx")
    np.testing.assert_allclose(args["c"], want, rtol=1e-5, atol=1e-5)
    real = lu.a_ranges

    def one_set(lw):
        ranges, depth, sets = real(lw)
        return ranges, {u: 1 for u in depth}, {r: 1 for r in sets}

    monkeypatch.setattr(lu, "a_ranges", one_set)
    monkeypatch.setenv("HEXLAYOUT_BUILD_CACHE", "0")         # synthesize again, under the patch
    bad = rt.build(ring_gemm(1), "sm_100a", compile=False)
    assert "_aset" not in bad.generated.source
    with pytest.raises(PtxError, match="is still read as its A operand by the tcgen05.mma"):
        rt.emulate(bad, *gemm_args()[0].values(), mode="ptx")


# --- a register A operand staged through shared memory by synthesis --------------------------------


def test_register_a_staged_through_shared_memory() -> None:
    """``hl.mma`` on a register tile run by two warp groups (no tcgen05.st writes it into TMEM):
    the printed ``st.shared.v4`` of A into its ring, ``fence.proxy.async``, the barrier and the
    ``_SS`` tcgen05.mma reading A through a descriptor, executed from the PTX against float64
    over a ragged K (5 k-tiles through a ring of 2)."""
    from tests.emulator.register_a_gemm import gemm_args
    from tests.emulator.test_tcgen05_smem_a import KX, two_group_gemm

    bld = rt.build(two_group_gemm(), "sm_100a", compile=False)
    args, want = gemm_args(KX)
    rep = rt.emulate(bld, args["a"], args["b"], args["c"], mode="ptx")
    assert any(op.startswith("st.shared.v4") for op in rep.opcodes), sorted(rep.opcodes)
    assert any(op.startswith("fence.proxy.async") for op in rep.opcodes), sorted(rep.opcodes)
    assert "tcgen05.mma.cta_group::1.kind::f16 [%0], %1, %2, %3, p" in bld.generated.source  # A: descriptor
    assert "[tcgen05.st of the register A operand]" not in bld.generated.source
    np.testing.assert_allclose(args["c"], 2 * want, rtol=1e-5, atol=1e-5)


# --- a register A of a pair's and of a block-scaled MMA ----------------------------------------------


@pytest.mark.parametrize("threads", [128, 256])
def test_pair_register_a_from_the_ptx(threads: int) -> None:
    """A pair's register A, executed from the PTX against float64 (ragged M, N, K): one warp group
    writes each CTA's rows into its own TMEM (``tcgen05.st``, the ``[a_tmem]`` form of
    ``tcgen05.mma.cta_group::2``), two warp groups stage them in each CTA's shared ring
    (``st.shared.v4``, descriptors); a cluster barrier after the stores either way."""
    from tests.emulator.test_tcgen05_register_a_forms import pair_args, pair_gemm

    bld = rt.build(pair_gemm(threads), "sm_100a", compile=False)
    args, want = pair_args()
    rep = rt.emulate(bld, args["a"], args["b"], args["c"], mode="ptx")
    assert rep.opcodes.get("tcgen05.mma.cta_group::2.kind::f16")
    assert rep.opcodes.get("barrier.cluster.arrive.release.aligned", 0) >= 2 * 2 * 3   # 2 per k-tile and CTA
    a_tmem = "tcgen05.mma.cta_group::2.kind::f16 [%0], [%1], %2" in bld.generated.source
    assert a_tmem == (threads == 128)
    stores = bool(rep.opcodes.get("tcgen05.st.sync.aligned.32x32b.x32.b32"))
    assert stores == (threads == 128), sorted(rep.opcodes)
    assert any(op.startswith("st.shared.v4") for op in rep.opcodes) == (threads == 256), sorted(rep.opcodes)
    np.testing.assert_allclose(args["c"], want, rtol=1e-5, atol=1e-5)


def test_pair_register_a_rewritten_under_the_inflight_mma_is_reported_from_the_ptx(monkeypatch) -> None:
    """One set of TMEM columns for the pair's A under ``wgmma_wait(1)``: the executor reports the
    store of k-tile 1 into the columns the MMA of k-tile 0 still reads."""
    import hexlayout.ir.lower.umma as lu
    from tests.emulator.test_tcgen05_register_a_forms import pair_args, pair_gemm

    real = lu.a_ranges

    def one_set(lw):
        ranges, depth, sets = real(lw)
        return ranges, {u: 1 for u in depth}, {r: 1 for r in sets}

    monkeypatch.setattr(lu, "a_ranges", one_set)
    monkeypatch.setenv("HEXLAYOUT_BUILD_CACHE", "0")
    bad = rt.build(pair_gemm(128), "sm_100a", compile=False)
    with pytest.raises(PtxError, match="is still read as its A operand by the tcgen05.mma"):
        rt.emulate(bad, *pair_args()[0].values(), mode="ptx")


@pytest.mark.parametrize("threads", [128, 256])
def test_block_scaled_register_a_from_the_ptx(threads: int) -> None:
    """A block-scaled (kind::mxf8f6f4) MMA on an fp8 register A converted from f16 in registers
    (``cvt.rn.satfinite.e4m3x2.f16x2``), written to TMEM (one warp group: the ``[a_tmem]`` form) or
    staged through shared memory (two), its factors copied with ``tcgen05.cp``: executed from the
    PTX against float64 (ragged M, N, K)."""
    from tests.emulator.test_tcgen05_register_a_forms import bs_args, bs_gemm

    bld = rt.build(bs_gemm(threads), "sm_100a", compile=False)
    args, want = bs_args()
    rep = rt.emulate(bld, *args.values(), mode="ptx")
    mma = "tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.scale_vec::1X"
    assert rep.opcodes.get(mma), sorted(rep.opcodes)
    assert bool(rep.opcodes.get("tcgen05.st.sync.aligned.32x32b.x32.b32")) == (threads == 128)
    assert any(op.startswith("st.shared.v4") for op in rep.opcodes) == (threads == 256), sorted(rep.opcodes)
    np.testing.assert_allclose(args["c"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())


def test_fp4_register_a_from_the_ptx() -> None:
    """MXFP4 (kind::mxf4) on a packed e2m1 register A negated in registers (``^ 0x88``) and staged
    through shared memory as 128-byte rows: executed from the PTX against float64 (ragged M, N, K)."""
    from tests.emulator.test_tcgen05_register_a_forms import fp4_args, fp4_gemm

    bld = rt.build(fp4_gemm(), "sm_100a", compile=False)
    args, want = fp4_args()
    rep = rt.emulate(bld, *args.values(), mode="ptx")
    mma = "tcgen05.mma.cta_group::1.kind::mxf4.block_scale.scale_vec::2X"
    assert rep.opcodes.get(mma), sorted(rep.opcodes)
    assert any(op.startswith("st.shared.v4") for op in rep.opcodes), sorted(rep.opcodes)
    np.testing.assert_allclose(args["c"], want, rtol=1e-5, atol=1e-5 * np.abs(want).max())
