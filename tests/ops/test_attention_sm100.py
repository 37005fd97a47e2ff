"""Attention on Blackwell (compute capability 10.0, sm_100a). The sm_90a paged kernel
(``kernels_sm90.paged_attention_sm90_kernel``, ``hl.mma`` on shared Q / K and on a register P)
builds for sm_100a unchanged, with tcgen05 (``paged_attention_sm100_*``: S and O in tensor
memory, P written to TMEM with ``tcgen05.st``, O read, rescaled and stored back between key
blocks): under ``HEXLAYOUT_EMULATE_ARCH=sm_100a`` it matches float64 on ragged batches (GQA,
both KV layouts, causal / window / softcap, split-KV, sinks, FP8 caches; two consumer warp
groups, each with its own commit barriers), and NVRTC compiles it with UTCHMMA, LDTM, STTM and
no spills. The ops dispatch the head sizes of ``paged.SM100_TCGEN05_HEADS`` to it (the static
numbers decide: ``paged.paged_sm100_tcgen05``) and run their mma.sync kernels (the sm_80 ones)
otherwise -- paged, varlen (the sm_90a varlen kernel's two consumer warp groups split one
128-row tile, whose tcgen05 accumulator each warp group reads in halves of its columns: the
softmax's row reductions would cross warp groups) and MLA (``test_mla_decode.py``). The device
mapping gives sm_100a for 10.0."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
import test_attention_varlen_op as varlen_case  # noqa: E402
import test_paged_attention_op as paged_case  # noqa: E402
from hexlayout.ops.attention import paged as paged_mod  # noqa: E402
from hexlayout.ops.attention import varlen as varlen_mod  # noqa: E402
from hexlayout.ops.host import device as device_mod  # noqa: E402
from test_attention_fp8_kv import fp8_case  # noqa: E402
from test_attention_sinks import _sinks, with_sinks  # noqa: E402

from hexlayout.ir.lowered import MmaSync, walk_instrs  # noqa: E402
from hexlayout.ir.lowered_tcgen05 import Tcgen05Ld, Tcgen05Mma, Tcgen05St  # noqa: E402
from hexlayout.synth.errors import SynthesisError  # noqa: E402


@pytest.mark.parametrize(("cap", "arch"), [((8, 0), "sm_80"), ((8, 6), "sm_80"), ((8, 9), "sm_89"),
                                           ((9, 0), "sm_90a"), ((10, 0), "sm_100a")])
def test_compute_capabilities_map_to_targets(cap: tuple[int, int], arch: str) -> None:
    assert device_mod.device_arch(cap) == arch


@pytest.mark.parametrize("cap", [(7, 5), (10, 3), (12, 0)])
def test_other_capabilities_are_refused_by_name(cap: tuple[int, int]) -> None:
    with pytest.raises(ValueError, match=rf"compute capability {cap[0]}\.{cap[1]} is not supported.*10\.0"):
        device_mod.device_arch(cap)


def test_a_cuda_device_of_capability_10_builds_for_sm100(monkeypatch: pytest.MonkeyPatch) -> None:
    dev = torch.device("cuda", 5)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda d=None: (10, 0))
    monkeypatch.setattr(device_mod, "_ARCH", {})
    assert device_mod.kernel_arch(dev) == "sm_100a"


@pytest.fixture
def sm100(monkeypatch: pytest.MonkeyPatch) -> list:
    """The emulated sm_100a; the builds the attention ops make, recorded."""
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_100a")
    built: list = []
    for mod in (paged_mod, varlen_mod):
        real = mod.build_for

        def spy(kernel, device, consts, real=real):
            b = real(kernel, device, consts)
            built.append(b)
            return b

        monkeypatch.setattr(mod, "build_for", spy)
    return built


def _mma_sync_only(built: list) -> None:
    assert built and all(b.lowered.arch == "sm_100a" for b in built)
    assert any(isinstance(i, MmaSync) for i in walk_instrs(built[0].lowered.body))


def _tcgen05_only(built: list) -> None:
    assert built and all(b.lowered.arch == "sm_100a" for b in built)
    assert built[0].generated.name.startswith("paged_attention_sm100_"), built[0].generated.name
    kinds = {type(i) for i in walk_instrs(built[0].lowered.body)}
    assert {Tcgen05Mma, Tcgen05Ld, Tcgen05St} <= kinds and MmaSync not in kinds, kinds


@pytest.fixture
def tcgen05(sm100: list, monkeypatch: pytest.MonkeyPatch) -> list:
    """``sm100`` with every paged case dispatched to the tcgen05 build (the op takes it for head
    size 256 only: ``paged.paged_sm100_tcgen05``)."""
    monkeypatch.setattr(paged_mod, "paged_sm100_tcgen05", lambda head_size, fp8=False: True)
    return sm100


TCGEN05_CASES = [
    # seed, qlens, klens, H, KVH, D, block, layout, dtype, options, splits
    # head size 64: two consumer warp groups over alternate key blocks (KSPLIT), GQA, ragged
    (0, [1, 5, 1, 17], [17, 9, 1, 140], 4, 2, 64, 16, "NHD", torch.float16, {}, 0),
    # a window: one masked segment, OVERLAP (P of the previous block in flight: a ring of P sets)
    (2, [6, 2], [150, 2], 4, 4, 64, 16, "NHD", torch.float16, {"window_size": (70, 0)}, 0),
    # head size 128, one warp group with OVERLAP; softcap, not causal, split-KV partials
    (1, [3, 1], [33, 140], 8, 1, 128, 32, "HND", torch.bfloat16, {"causal": False, "softcap": 5.0}, 2),
    # head size 96 padded to 128
    (3, [5, 4], [3, 30], 4, 1, 96, 64, "HND", torch.float16, {"causal": False, "window_size": (3, 2)}, 0),
]


@pytest.mark.parametrize(
    ("seed", "qlens", "klens", "h", "kvh", "d", "bs", "layout", "dtype", "opts", "splits"), TCGEN05_CASES
)
def test_paged_attention_tcgen05_build_matches_float64(tcgen05: list, seed: int, qlens: list[int],
                                                       klens: list[int], h: int, kvh: int, d: int, bs: int,
                                                       layout: str, dtype: torch.dtype, opts: dict,
                                                       splits: int) -> None:
    a = paged_case.make_case(seed, qlens, klens, h, kvh, d, bs, layout, dtype)
    out, lse = hexlayout.ops.paged_attention(**a, **opts, num_splits=splits, return_lse=True)
    want = paged_case.reference(a, opts.get("softmax_scale"), opts.get("causal", True),
                                opts.get("window_size", (-1, -1)), opts.get("softcap", 0.0))
    paged_case._check(out, lse, want, a["q"].shape[0], 2e-3 if dtype == torch.float16 else 1.6e-2)
    _tcgen05_only(tcgen05)
    assert len(tcgen05) == (2 if splits > 1 else 1)        # the partials and the combine kernel


def test_paged_attention_tcgen05_build_with_fp8_cache_and_sinks(tcgen05: list) -> None:
    q8, deq = fp8_case(4, [1, 3], [20, 9], 4, 2, 64, 16, "NHD", "fp8_e4m3", 0.3, 0.05)
    sinks = _sinks(4, 4)
    out, lse = hexlayout.ops.paged_attention(**q8, num_splits=0, kv_cache_dtype="fp8_e4m3", sinks=sinks,
                                             k_scale=torch.tensor([0.3]), v_scale=torch.tensor([0.05]),
                                             return_lse=True)
    want = with_sinks(paged_case.reference(deq, None, True, (-1, -1), 0.0), sinks)
    paged_case._check(out, lse, want, q8["q"].shape[0], 2e-3)
    _tcgen05_only(tcgen05)


@pytest.mark.parametrize("d", [256, 200])
def test_paged_attention_head_size_256_dispatches_to_the_tcgen05_build(sm100: list, d: int) -> None:
    """Unforced: head sizes padded to 256 run ``paged_attention_sm100_*`` (a window and sinks:
    rows with no visible key give 0 and the sink)."""
    a = paged_case.make_case(7, [1, 3], [19, 4], 2, 1, d, 16, "NHD", torch.float16)
    sinks = _sinks(2, 7)
    out, lse = hexlayout.ops.paged_attention(**a, softmax_scale=0.3, window_size=(3, 0), sinks=sinks,
                                             return_lse=True)
    want = with_sinks(paged_case.reference(a, 0.3, True, (3, 0), 0.0), sinks)
    paged_case._check(out, lse, want, a["q"].shape[0], 2e-3)
    _tcgen05_only(sm100)


def test_tcgen05_constants_fit_tensor_memory() -> None:
    """Per consumer warp group a score tile per key-loop segment, O and P's sets: the sm_90a
    constants where they fit 512 columns, else without OVERLAP, then one warp group."""
    got = {(hd, w): (c["KSPLIT"], c["OVERLAP"]) for hd in (64, 128, 256) for w in (False, True)
           for c in [paged_mod.paged_attention_sm100_consts(hd, 16, 8, 1, True, w, False)]}
    assert got == {(64, False): (2, False), (64, True): (2, True), (128, False): (1, True),
                   (128, True): (2, False), (256, False): (1, False), (256, True): (1, False)}


def test_the_varlen_kernel_is_refused_for_sm100_by_its_row_reduction() -> None:
    """The sm_90a varlen kernel's two consumer warp groups share one 128-row tile; a tcgen05
    accumulator of 128 rows is read by each warp group in half of its columns, so the softmax's
    row maximum would need both warp groups: synthesis refuses it (the op runs mma.sync)."""
    from hexlayout.ops.attention.kernels_sm90 import attention_varlen_sm90_consts as consts
    from hexlayout.ops.attention.kernels_sm90 import attention_varlen_sm90_kernel

    import hexlayout.lang as hl
    from hexlayout.runtime import build

    with pytest.raises(SynthesisError, match=r"attention_varlen_sm100_f16.*reduce"):
        build(attention_varlen_sm90_kernel(hl.f16, arch="sm_100a"), "sm_100a", compile=False,
              **consts(64, False, False, False))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_paged_attention_runs_the_mma_sync_kernel_on_sm100(sm100: list, dtype: torch.dtype) -> None:
    assert not paged_mod.paged_sm100_tcgen05(128) and not paged_mod.paged_sm100_tcgen05(256, fp8=True)
    a = paged_case.make_case(11, [1, 4, 2], [90, 9, 33], 4, 2, 128, 16, "NHD", dtype)
    out, lse = hexlayout.ops.paged_attention(**a, num_splits=0, return_lse=True)
    want = paged_case.reference(a, None, True, (-1, -1), 0.0)
    paged_case._check(out, lse, want, a["q"].shape[0], 2e-3 if dtype == torch.float16 else 1.6e-2)
    _mma_sync_only(sm100)


def test_attention_varlen_runs_the_mma_sync_kernel_on_sm100(sm100: list) -> None:
    a = varlen_case.make_case(12, [30, 1, 9], [30, 40, 12], 4, 2, 64, torch.float16)
    out, lse = hexlayout.ops.attention_varlen(**a, causal=True, return_lse=True)
    want = varlen_case.reference(a, None, True, (-1, -1), 0.0)
    varlen_case._check(out, lse, want, a["q"].shape[0], torch.float16)
    _mma_sync_only(sm100)


@pytest.mark.nvrtc
@pytest.mark.parametrize("which", ["paged", "paged-e4m3", "varlen"])
def test_compiles_for_sm100_with_hmma_and_no_spills(which: str) -> None:
    from hexlayout.ops.attention.paged import paged_attention_consts, paged_whole_pages
    from hexlayout.ops.attention.paged_kernels_sm80 import paged_attention_kernel
    from hexlayout.ops.attention.varlen import attention_varlen_consts
    from hexlayout.ops.attention.varlen_kernels_sm80 import attention_varlen_kernel

    import hexlayout.lang as hl
    from hexlayout.runtime import build

    if which == "varlen":                                   # the builds the ops make for these
        consts = attention_varlen_consts(128, False, True, False)
        b = build(attention_varlen_kernel(hl.f16), "sm_100a", **consts)
    elif which == "paged":
        kernel = paged_attention_kernel(hl.bf16, False, None, paged_whole_pages(16, 128))
        b = build(kernel, "sm_100a", **paged_attention_consts(128, 16, 8, 1, True, False, False))
    else:                                                   # FP8: converted rows, the heavy tiles
        consts = paged_attention_consts(128, 16, 8, 1, True, False, False, heavy=True)
        b = build(paged_attention_kernel(hl.bf16, False, hl.e4m3), "sm_100a", **consts)
    r = b.compiled.resources
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0, r
    counts = b.compiled.sass_counts()
    assert any(op.startswith("HMMA") for op in counts), counts
    assert b.stats.main_loop is not None and b.stats.main_loop.mma_opcode.startswith("HMMA")


@pytest.mark.nvrtc
def test_the_dispatched_tcgen05_build_compiles_with_utchmma_ldtm_and_fewer_non_mma() -> None:
    """Head size 256 (``paged.SM100_TCGEN05_HEADS``): NVRTC compiles the tcgen05 build without
    spills, S and O in tensor memory (UTCHMMA, LDTM, STTM; no HMMA / HGMMA), 16 + 4 UTCHMMA per
    64-key block (Q K^T over K = 256, P V over 64 keys), and its main loop runs fewer non-MMA
    instructions per 64-key block than the mma.sync kernel's (16 keys a step) four steps: the
    dispatch's reason. (NVRTC takes minutes on this build: the only compile of the dispatched
    tcgen05 kernel.)"""
    from hexlayout.ops.attention.kernels_sm90 import paged_attention_sm90_kernel
    from hexlayout.ops.attention.paged_kernels_sm80 import paged_attention_kernel

    import hexlayout.lang as hl
    from hexlayout.runtime import build

    shape = (256, 16, 8, 1, True, False, False)
    assert paged_mod.paged_sm100_tcgen05(256)
    b = build(paged_attention_sm90_kernel(hl.f16, arch="sm_100a"), "sm_100a",
              **{**paged_mod.paged_attention_sm100_consts(*shape), "SINKS": False})
    r = b.compiled.resources
    assert r.spill_stores == 0 and r.spill_loads == 0 and r.stack_frame == 0, r
    st = b.stats
    assert st.local_memory_instructions == 0 and not st.warnings, st.summary()
    counts = b.compiled.sass_counts()

    def n(prefix: str) -> int:
        return sum(v for op, v in counts.items() if op.startswith(prefix))

    assert n("UTCHMMA") > 0 and n("LDTM") > 0 and n("STTM") > 0, sorted(counts)
    assert n("HMMA") == 0 and n("HGMMA") == 0, sorted(counts)
    lp = st.main_loop
    assert lp is not None and lp.mma_opcode == "UTCHMMA" and lp.mma == 16 + 4, st.summary()
    c80 = {**paged_mod.paged_attention_consts(*shape, heavy=False), "SINKS": False}
    mma_sync = build(paged_attention_kernel(hl.f16, False, None), "sm_100a", **c80).stats.main_loop
    assert mma_sync is not None and mma_sync.mma_opcode.startswith("HMMA")
    assert lp.non_mma < mma_sync.non_mma * (64 // c80["BN"]), (lp.non_mma, mma_sync.non_mma, c80["BN"])
