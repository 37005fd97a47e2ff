"""Generated kernels compile with NVRTC and with nvcc for sm_80 and sm_90a (wgmma / TMA only
for sm_90a), without spills, and their SASS holds the intended instructions."""

from __future__ import annotations

import functools

import pytest

from hexlayout.codegen import generate
from hexlayout.runtime import CompiledKernel, compile_cuda
from hexlayout.runtime.sass import count_prefix

from .kernels import ALL

# kernel -> (architectures, {SASS opcode prefix: minimum count})
EXPECT = {
    "gemm_sm80": (("sm_80", "sm_90a"), {"HMMA.16816": 16, "LDSM": 8, "LDGSTS": 4}),
    "gemm_sm90": (("sm_90a",), {"HGMMA.64x64x16": 4, "UTMALDG": 2, "SYNCS": 1}),
    "row_reduce": (("sm_80", "sm_90a"), {"SHFL.BFLY": 4}),
    "elementwise": (("sm_80", "sm_89", "sm_90a"), {"MUFU.EX2": 1}),
    "misc_sm90": (("sm_90a",), {"STSM": 1, "UTMASTG": 1, "USETMAXREG": 2, "SHFL.IDX": 1}),
}
CASES = [(k, a, b) for k, (archs, _) in EXPECT.items() for a in archs for b in ("nvrtc", "nvcc")]


@functools.cache
def _compiled(kernel: str, arch: str, backend: str) -> CompiledKernel:
    g = generate(ALL[kernel]())
    return compile_cuda(g.source, arch, name=g.name, backend=backend, cache=False)


def _marks(backend: str) -> pytest.MarkDecorator:
    return getattr(pytest.mark, backend)


@pytest.mark.parametrize(("kernel", "arch", "backend"),
                         [pytest.param(*c, marks=_marks(c[2]), id="-".join(c)) for c in CASES])
def test_compiles_without_spills_with_intended_sass(kernel: str, arch: str, backend: str) -> None:
    ck = _compiled(kernel, arch, backend)
    assert ck.cubin[:4] == b"\x7fELF"
    assert ck.resources is not None, ck.log
    assert ck.resources.registers > 0
    assert not ck.resources.spills and ck.resources.stack_frame == 0, ck.log
    assert "setmaxnreg' ignored" not in ck.log
    counts = ck.sass_counts()
    for prefix, least in EXPECT[kernel][1].items():
        assert count_prefix(counts, prefix) >= least, (prefix, sorted(counts))
    if kernel == "gemm_sm80":
        # fragments stay in registers: no local memory
        assert count_prefix(counts, "LDL") == 0 and count_prefix(counts, "STL") == 0


@pytest.mark.nvrtc
@pytest.mark.nvcc
def test_both_compilers_agree_on_resources() -> None:
    a, b = _compiled("gemm_sm80", "sm_80", "nvrtc"), _compiled("gemm_sm80", "sm_80", "nvcc")
    assert a.resources == b.resources
    assert a.compiler.startswith("nvrtc") and b.compiler.startswith("nvcc")
