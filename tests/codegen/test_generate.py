"""The CUDA printer: deterministic text, the intended PTX per instruction family, kernel
parameters in a documented order, and errors that name the instruction and its source line.
No compiler needed."""

from __future__ import annotations

import subprocess
import sys

import pytest

import hexlayout.lang as hl
from hexlayout.codegen import CodegenError, generate, generate_cuda
from hexlayout.ir.expr import Var
from hexlayout.ir.lowered import Alu, BarSync, LoweredKernel, RegArray, RegRef, Wgmma, WgmmaFence
from hexlayout.ir.tile import SourceLoc
from hexlayout.ir.types import f32

from .kernels import ALL, elementwise, gemm_sm80, gemm_sm90, misc_sm90, row_reduce


@pytest.mark.parametrize("name", sorted(ALL))
def test_generation_is_deterministic(name: str) -> None:
    # two independently built kernels (fresh variables and arrays) print the same text
    assert generate_cuda(ALL[name]()) == generate_cuda(ALL[name]())


def test_import_hexlayout_does_not_load_the_backend() -> None:
    code = ("import sys, hexlayout; bad = [m for m in ('hexlayout.codegen', 'hexlayout.runtime', 'cuda') "
            "if m in sys.modules]; assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True)


def test_sm80_gemm_text() -> None:
    g = generate(gemm_sm80())
    src = g.source
    assert 'extern "C" __global__ void __launch_bounds__(128) gemm_sm80(' in src
    assert "const half* __restrict__ A" in src and "half* __restrict__ C" in src
    assert [(a.kind, a.name) for a in g.args] == [("tensor", "A"), ("tensor", "B"), ("tensor", "C"),
                                                  ("size", "M"), ("size", "K"), ("size", "N")]
    assert "extern __shared__ __align__(1024) unsigned char smem[];" in src
    assert "__align__(16) half a_frag[32];" in src and "__align__(16) float acc[32];" in src
    assert src.count("cp.async.cg.shared.global [%0], [%1], 16, %2;") == 4        # zero-fill by src-size
    assert '"r"(in ? 16 : 0)' in src
    assert src.count("ldmatrix.sync.aligned.m8n8.x4.shared.b16") == 8
    assert src.count("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32") == 16
    assert "cp.async.commit_group;" in src and "cp.async.wait_group 0;" in src
    assert "__float2half_rn(acc[v])" in src
    assert src.count("if (") >= 16                                                 # predicated st.global
    assert "// kernels_src.py:12  [copy]  hl.copy(A[m0, k0], sa)" in src
    assert "#pragma unroll 1\n  for (int kt = 0; kt < (K + 31) / 32; ++kt) {" in src
    assert g.smem_bytes == 8192


def test_sm90_gemm_text() -> None:
    g = generate(gemm_sm90())
    src = g.source
    assert [a.kind for a in g.args] == ["tensor"] * 3 + ["size"] * 3 + ["tensor_map"] * 2
    assert "const __grid_constant__ CUtensorMap tma_a" in src
    assert src.count("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16") == 4
    # K-major 128-byte swizzle: LBO 16 (unused), SBO 1024 (8 rows of 128 B), layout type 1; k steps of
    # 32 B: the descriptor of the shared window advanced by 2 units of 16 B (A at 0, B at 8192 B)
    for units in (0, 2, 4, 6, 512, 514, 516, 518):
        assert f"hl_gmma_desc_add(hl_gmma_desc(smem_base, 16, 1024, 1), {units})" in src
    assert "p, 1, 1, 0, 0;" in src                                                 # scale-d, K-major A and B
    assert src.count("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes") == 2
    assert "mbarrier.init.shared::cta.b64" in src and "mbarrier.arrive.expect_tx.shared::cta.b64" in src
    assert "mbarrier.try_wait.parity" in src and "hl_mbar_wait(smem_base + 16384, kt % 2);" in src
    assert "wgmma.fence.sync.aligned;" in src and "wgmma.wait_group.sync.aligned 0;" in src
    assert 'asm volatile("" : "+f"(acc[v]) :: "memory");' in src                   # operand fences
    assert g.smem_bytes == 16384 + 8        # one mbarrier after the buffers


def test_reduction_and_elementwise_text() -> None:
    src = generate_cuda(row_reduce())
    assert src.count("__shfl_xor_sync(0xffffffffu") == 2
    assert "fmaxf(" in src
    src = generate_cuda(elementwise())
    assert "#include <cuda_bf16.h>" in src and "#include <cuda_fp8.h>" in src
    assert "const float scale" in src and "exp2f(" in src
    assert "__float2bfloat16_rn(" in src and "__nv_fp8_e4m3(" in src
    assert "static_cast<float>(" in src                                             # int iota mask -> select


def test_misc_text() -> None:
    g = generate(misc_sm90())
    src = g.source
    assert "__launch_bounds__(256, 1)" in src        # setmaxnreg needs minBlocks
    for text in ("setmaxnreg.dec.sync.aligned.u32 40;", "setmaxnreg.inc.sync.aligned.u32 232;",
                 "stmatrix.sync.aligned.m8n8.x4.shared.b16",
                 "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group",
                 "cp.async.bulk.commit_group;", "cp.async.bulk.wait_group.read 0;", "bar.sync 1, 128;",
                 "fence.proxy.async.shared::cta;", "__shfl_sync(0xffffffffu", "hl_shfl(", "#pragma unroll 4",
                 "} else {", "__int_as_float(0x7f800000)"):
        assert text in src, text


def _tiny(body, arch: str = "sm_80", regs=()) -> LoweredKernel:
    tid = Var("threadIdx.x", 0, 128, "thread")
    return LoweredKernel("tiny", [], (1,), 128, tid, (Var("blockIdx.x", 0, 1, "block"),), body,
                         registers=list(regs), arch=arch)


def test_unbound_variable_is_reported_with_its_source_line() -> None:
    r = RegArray("r", f32, 4)
    bad = Alu("mov", RegRef(r, 0, 4), (Var("m0", 0, None, "index"),),
              loc=SourceLoc("my_kernel.py", 42, "k", "x = hl.iota(...)"), origin="iota")
    with pytest.raises(CodegenError) as e:
        generate(_tiny([bad], regs=[r]))
    msg = str(e.value)
    assert "m0" in msg and "my_kernel.py:42" in msg and "iota" in msg and "tiny" in msg


def test_arch_specific_instructions_are_refused_on_sm80() -> None:
    with pytest.raises(CodegenError, match="wgmma.fence needs sm_90a"):
        generate(_tiny([WgmmaFence()]))
    r = RegArray("r", f32, 32)
    from hexlayout.ir.lowered import SmemBuffer, SmemDesc
    buf = SmemBuffer("s", f32, 4096)
    w = Wgmma("SM90_64x64x16_F32F16F16_SS", RegRef(r, 0, 32), SmemDesc(buf, 0, 1, 16, 1024),
              SmemDesc(buf, 0, 1, 16, 1024))
    k = _tiny([w], regs=[r])
    k.smem = [buf]
    with pytest.raises(CodegenError, match="needs sm_90a"):
        generate(k)


def test_undeclared_register_array_and_bad_barrier() -> None:
    r = RegArray("r", f32, 4)
    with pytest.raises(CodegenError, match="not in LoweredKernel.registers"):
        generate(_tiny([Alu("mov", RegRef(r, 0, 4), (0.0,))]))
    with pytest.raises(CodegenError, match="multiple of 32"):
        generate(_tiny([BarSync(1, 48)]))
    with pytest.raises(CodegenError, match="outside"):
        generate(_tiny([Alu("mov", RegRef(r, 2, 4), (0.0,))], regs=[r]))


CM, CN = hl.dims("CM CN")


def _copy_kernel(**kw):
    @hl.kernel(threads=128, **kw)
    def copy_rows(x: hl.f16[CM, CN], y: hl.f16[CM, CN], *, BM: int = 32, SMEM: int = 0):
        pid = hl.grid(hl.spatial(hl.cdiv(x.shape[0], BM)))
        t = hl.register(hl.f16, (BM, 64))
        if SMEM:
            s = hl.shared(hl.f16, (SMEM, 64))
            hl.copy(hl.view(x, tile=(BM, 64), origin=(pid * BM, 0)), s[:BM, :])
            hl.syncthreads()
            hl.copy(s[:BM, :], t)
        else:
            hl.copy(hl.view(x, tile=(BM, 64), origin=(pid * BM, 0)), t)
        hl.copy(t, hl.view(y, tile=(BM, 64), origin=(pid * BM, 0)))

    return copy_rows


@pytest.mark.parametrize(("kw", "smem_rows", "bounds"), [
    ({}, 0, "__launch_bounds__(128)"),                          # the compiler's choice
    ({"min_blocks": 3}, 0, "__launch_bounds__(128, 3)"),       # the kernel's
    ({"min_blocks": lambda c: 4 // (c["BM"] // 32)}, 0, "__launch_bounds__(128, 4)"),
    ({}, 1024, "__launch_bounds__(128)"),                       # 128 KiB of shared: still ptxas's
])
def test_launch_bounds_min_blocks(kw, smem_rows, bounds) -> None:
    from hexlayout.runtime import build

    b = build(_copy_kernel(**kw), "sm_80", compile=False, SMEM=smem_rows)
    assert f"{bounds} copy_rows(" in b.generated.source


@pytest.mark.parametrize("bad", [0, 33, 2.0, True, "2"])
def test_min_blocks_out_of_range_is_refused(bad) -> None:
    from hexlayout.errors import HexlayoutError

    with pytest.raises(HexlayoutError, match="min_blocks"):
        _copy_kernel(min_blocks=bad).trace()
