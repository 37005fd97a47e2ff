"""sm_100a in the emulator: the FP4 block-scaled tcgen05.mma (kind::mxf4 scale_vec::2X with UE8M0
factors per 32 K elements, kind::mxf4nvf4 scale_vec::4X with UE4M3 = NVFP4 or UE8M0 factors per 16)
reading packed e2m1 operands from shared memory, against a float64 reference whose FP4 values and
factors are decoded here by hand; the errors of its factor IDs; the same program printed and
compiled by NVRTC for sm_100a."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.arch.block_scale import scale_smem_layout
from hexlayout.emulator import IllegalInstructionError, run
from hexlayout.ir import lowered as L
from hexlayout.ir import lowered_tcgen05 as T
from hexlayout.ir.expr import RegRead

from .kbuild import KB, gparam, here, rr
from .test_wgmma import stage_k_major

M, N, K = 128, 32, 256            # K e2m1 elements: 128 bytes per row, four K = 64 MMAs
D_COLS, SFA_COL, SFB_COL = 32, 32, 48
FORMS = {   # name: (atom, VS, factor type)
    "mxf4": ("SM100_128x32x64_F32E2M1E2M1_UE8M0_VS32_MXF4_SS", 32, "ue8m0"),
    "nvfp4": ("SM100_128x32x64_F32E2M1E2M1_UE4M3_VS16_MXF4NVF4_SS", 16, "ue4m3"),
    "mxf4nvf4_2x": ("SM100_128x32x64_F32E2M1E2M1_UE8M0_VS32_MXF4NVF4_SS", 32, "ue8m0"),
    "mxf4nvf4_4x_ue8m0": ("SM100_128x32x64_F32E2M1E2M1_UE8M0_VS16_MXF4NVF4_SS", 16, "ue8m0"),
}


def fp4_kernel(form: str, sf_id_shift: int = 0):
    """D[128, 32] = block-scaled A[128, 256] @ B[32, 256]^T, e2m1 packed (128 bytes a row, staged
    into 128B-swizzled K-major tiles as f16 pairs of bytes); the factors, in the host's
    ``scale_smem_layout`` order (K / VS k-blocks: one 512-byte atom per 4), stored one word per
    thread per atom and copied by thread 0 (tcgen05.cp.32x128b.warpx4 per atom, 4 columns each);
    MMA ``s`` reads k-blocks ``s K/VS ..``: column ``(s nsf) // 4``, byte ``(s nsf) % 4``."""
    atom, vs, _ = FORMS[form]
    nsf, kb_n = 64 // vs, K // vs
    atoms = kb_n // 4
    kb = KB("umma_fp4", 128, arch="sm_100a")
    tid = kb.tid
    A, B = gparam("A", "f16", (M, K // 4)), gparam("B", "f16", (N, K // 4))    # packed e2m1 bytes
    SA, SB = gparam("SA", "u32", (128 * atoms,)), gparam("SB", "u32", (128 * atoms,))
    D = gparam("D", "f32", (M, N))
    sA = kb.shared("sA", "f16", M * K // 4, align=1024)
    sB = kb.shared("sB", "f16", N * K // 4, align=1024)
    sSA = kb.shared("sSA", "u32", 128 * atoms, align=128)
    sSB = kb.shared("sSB", "u32", 128 * atoms, align=128)
    tm = kb.shared("tmem_addr", "u32", 1, align=16)
    bar = kb.mbar("mma_done")
    acc, ta, w = kb.reg("acc", "f32", N), kb.reg("taddr", "u32", 1), kb.reg("w", "u32", 1)
    taddr = RegRead(ta, 0)
    warp0 = tid < 32
    body = [L.MbarInit(bar, 1, pred=tid.eq(0)), T.TmemAlloc(L.SharedRef(tm, 0), 64, pred=warp0)]
    body += stage_k_major(kb, A, sA, M, K // 4) + stage_k_major(kb, B, sB, N, K // 4)
    for g, s in ((SA, sSA), (SB, sSB)):
        for j in range(atoms):
            body += [L.LdGlobal(rr(w), L.GlobalRef(g, tid + 128 * j), 32),
                     L.StShared(L.SharedRef(s, tid + 128 * j), rr(w), 32)]
    body += [T.Tcgen05Fence("before_thread_sync"), L.FenceProxyAsync(), L.BarSync(),
             T.Tcgen05Fence("after_thread_sync"), L.LdShared(rr(ta), L.SharedRef(tm, 0), 32)]
    for buf, col in ((sSA, SFA_COL), (sSB, SFB_COL)):
        for j in range(atoms):
            src = L.SmemDesc(buf, 128 * j, 0, 0, 128)
            body.append(T.Tcgen05Cp("32x128b.warpx4", taddr + col + 4 * j, src, pred=tid.eq(0)))
    for s in range(K // 64):                              # 64 e2m1 = 32 bytes = 16 f16 units
        a, b = L.SmemDesc(sA, s * 16, 1, 16, 1024), L.SmemDesc(sB, s * 16, 1, 16, 1024)
        first = s * nsf
        col = 4 * (first // 4)
        body.append(T.Tcgen05Mma(atom, taddr, a, b, accumulate=int(s > 0), pred=tid.eq(0),
                                 sfa=taddr + SFA_COL + col, sfb=taddr + SFB_COL + col,
                                 sfa_id=first % 4 + sf_id_shift, sfb_id=first % 4,
                                 loc=here("hl.mma(sA, sB, acc, scales)")))
    body.append(T.Tcgen05Commit(bar, pred=tid.eq(0)))
    body += [L.MbarWait(bar, 0), T.Tcgen05Fence("after_thread_sync"),
             T.Tcgen05Ld("32x32b", 32, rr(acc), taddr + (tid // 32) * 32 * 65536), T.Tcgen05Wait("ld")]
    body += [L.StGlobal(L.GlobalRef(D, tid * N + j), rr(acc, j, 4), 128) for j in range(0, N, 4)]
    body += [T.Tcgen05Fence("before_thread_sync"), L.BarSync(), T.TmemDealloc(taddr, 64, pred=warp0),
             T.TmemRelinquish(pred=warp0)]
    return kb.build([A, B, SA, SB, D], body)


def _e2m1_by_hand(code: np.ndarray) -> np.ndarray:
    """OCP e2m1: sign bit 3, exponent bits 1..2 (bias 1), mantissa bit 0; exponent 0 is subnormal."""
    s, e, m = (code >> 3) & 1, (code >> 1) & 3, code & 1
    mag = np.where(e == 0, 0.5 * m, (1 + 0.5 * m) * 2.0 ** (e.astype(np.float64) - 1))
    return np.where(s == 1, -mag, mag)


def _factor_by_hand(b: np.ndarray, kind: str) -> np.ndarray:
    b = b.astype(np.int64)
    if kind == "ue8m0":
        return 2.0 ** (b - 127.0)
    e, m = (b >> 3) & 15, b & 7                            # UE4M3: E4M3 without a sign, bias 7
    return np.where(e == 0, m / 8 * 2.0 ** -6, (1 + m / 8) * 2.0 ** (e - 7.0))


def _sf_words(sf: np.ndarray) -> np.ndarray:
    """The factors ``sf [128, kblocks]`` in shared-memory order (``scale_smem_layout``) as words."""
    lay = scale_smem_layout(128, sf.shape[1])
    out = np.zeros(128 * sf.shape[1], np.uint8)
    for r in range(sf.shape[0]):
        for k in range(sf.shape[1]):
            out[lay(r, k)] = sf[r, k]
    return out.view(np.uint32)


def _pack(c: np.ndarray) -> np.ndarray:
    """Two codes a byte, the even element in the low nibble."""
    return (c[:, 0::2] | (c[:, 1::2] << 4)).astype(np.uint8)


def _data(form: str, seed: int):
    _, vs, st = FORMS[form]
    rng = np.random.default_rng(seed)
    ca = rng.integers(0, 16, (M, K)).astype(np.uint8)     # e2m1 codes
    cb = rng.integers(0, 16, (N, K)).astype(np.uint8)
    if st == "ue8m0":
        sfa = rng.integers(120, 134, (M, K // vs)).astype(np.uint8)
        sfb = rng.integers(120, 134, (128, K // vs)).astype(np.uint8)
    else:                                                  # UE4M3 codes 0x08 .. 0x5F: 2^-6 .. 15
        sfa = rng.integers(0x08, 0x60, (M, K // vs)).astype(np.uint8)
        sfb = rng.integers(0x08, 0x60, (128, K // vs)).astype(np.uint8)
    args = {"A": _pack(ca).view(np.float16), "B": _pack(cb).view(np.float16), "SA": _sf_words(sfa),
            "SB": _sf_words(sfb), "D": np.zeros((M, N), np.float32)}
    a = _e2m1_by_hand(ca) * np.repeat(_factor_by_hand(sfa, st), vs, axis=1)
    b = _e2m1_by_hand(cb) * np.repeat(_factor_by_hand(sfb[:N], st), vs, axis=1)
    want = np.zeros((M, N), np.float32)
    for s in range(K // 64):                               # f32 accumulator, each MMA's sum exact
        k = slice(64 * s, 64 * s + 64)
        want = (want.astype(np.float64) + a[:, k] @ b[:, k].T).astype(np.float32)
    return args, want


@pytest.mark.parametrize("form", sorted(FORMS))
def test_fp4_block_scaled_mma_is_bit_exact(form):
    args, want = _data(form, 7)
    rep = run(fp4_kernel(form), args)
    np.testing.assert_array_equal(args["D"], want)
    assert np.abs(want).max() > 1 and sum(s.executions for s in rep.find("Tcgen05Mma")) == K // 64


def test_a_factor_id_inside_the_mmas_factors_is_an_error():
    with pytest.raises(IllegalInstructionError) as e:     # 2X: 2 factors per row, so ID 0 or 2
        run(fp4_kernel("mxf4", sf_id_shift=1), _data("mxf4", 8)[0])
    assert "A scale-factor ID 1 is not a byte 0..3 that is a multiple of 2" in str(e.value)
    assert "hl.mma(sA, sB, acc, scales)" in str(e.value)


@pytest.mark.nvrtc
@pytest.mark.parametrize("form", ["mxf4", "nvfp4"])
def test_the_emulated_fp4_kernel_compiles_for_sm_100a(form):
    """Printed with its PTX (kind, scale_vec, the descriptor's E2M1 formats and factor IDs) and
    compiled by NVRTC for sm_100a: no spills; the SASS has UTCCP and the block-scaled UTC*MMA."""
    from hexlayout.codegen import generate
    from hexlayout.runtime import compile_cuda
    from hexlayout.runtime.sass import count_prefix

    g = generate(fp4_kernel(form))
    ptx = {"mxf4": "kind::mxf4.block_scale.scale_vec::2X",
           "nvfp4": "kind::mxf4nvf4.block_scale.scale_vec::4X"}
    assert f"tcgen05.mma.cta_group::1.{ptx[form]}" in g.source
    ck = compile_cuda(g.source, "sm_100a", name=g.name, backend="nvrtc", cache=False)
    assert ck.resources is not None and not ck.resources.spills and ck.resources.stack_frame == 0, ck.log
    counts = ck.sass_counts()
    assert count_prefix(counts, "UTCCP") >= 2, sorted(counts)
    assert sum(v for k, v in counts.items() if k.startswith("UTC") and "MMA" in k) >= K // 64, sorted(counts)


@pytest.mark.nvrtc
@pytest.mark.parametrize("form", ["mxf4", "nvfp4"])
def test_the_ptx_executor_runs_the_printed_fp4_mma_bit_exactly(form):
    """The PTX NVRTC made of the printed kernel, executed: the descriptor's E2M1 formats, factor type
    and IDs decoded from the register bits, the scale vector from the qualifier."""
    import hexlayout.runtime as rt

    args, want = _data(form, 11)
    rt.emulate(fp4_kernel(form), *(args[k] for k in ("A", "B", "SA", "SB", "D")), mode="ptx")
    np.testing.assert_array_equal(args["D"], want)


@pytest.mark.nvrtc
def test_the_ptx_executor_refuses_ue4m3_factors_with_scale_vec_2x():
    """A printed NVFP4 MMA mutated to ``scale_vec::2X``: its descriptor's UE4M3 factors are not valid
    for 2X (one factor per 32), which only PTX mode sees."""
    import hexlayout.runtime as rt
    from hexlayout.codegen import generate
    from hexlayout.ptx import PtxError

    kern = fp4_kernel("nvfp4")
    src = generate(kern).source
    bad = src.replace("kind::mxf4nvf4.block_scale.scale_vec::4X", "kind::mxf4nvf4.block_scale.scale_vec::2X")
    assert bad != src
    args, _ = _data("nvfp4", 12)
    with pytest.raises(PtxError, match="takes ue8m0 factors, not ue4m3"):
        rt.emulate(kern, *(args[n] for n in ("A", "B", "SA", "SB", "D")), mode="ptx", source=bad)
