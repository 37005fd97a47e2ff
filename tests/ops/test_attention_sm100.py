"""Attention on Blackwell (compute capability 10.0, sm_100a): no tcgen05 attention kernel exists,
so the ops run their mma.sync kernels (the sm_80 ones, which sm_100a executes) built for
sm_100a -- paged (f16 / bf16 and FP8 caches), varlen and MLA (``test_mla_decode.py``). The
device mapping gives sm_100a for 10.0; under ``HEXLAYOUT_EMULATE_ARCH=sm_100a`` the emulator
runs the builds against float64; NVRTC compiles them for sm_100a with HMMA and no spills."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
import test_attention_varlen_op as varlen_case  # noqa: E402
import test_paged_attention_op as paged_case  # noqa: E402
from hexlayout.ops.attention import paged as paged_mod  # noqa: E402
from hexlayout.ops.attention import varlen as varlen_mod  # noqa: E402
from hexlayout.ops.host import device as device_mod  # noqa: E402

from hexlayout.ir.lowered import MmaSync, walk_instrs  # noqa: E402


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


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_paged_attention_runs_the_mma_sync_kernel_on_sm100(sm100: list, dtype: torch.dtype) -> None:
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
