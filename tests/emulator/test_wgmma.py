"""wgmma m64nNk16 with operands read through shared-memory descriptors (128B-swizzled K-major),
register A (RS), wrong descriptors, and the asynchronous hazards of wgmma."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.emulator import AsyncHazardError, run
from hexlayout.ir import lowered as L
from hexlayout.ir.types import f16
from hexlayout.layout import Swizzle

from .kbuild import KB, gparam, here, rr

SW128 = Swizzle(3, 3, 3)  # Swizzle<3,4,3> on bytes == Swizzle<3,3,3> on 16-bit elements


def d_frag_stores(kb, D, acc, N):
    """D fragment (PTX: row = 16w + g + 8((i>>1)&1), col = 8(i>>2) + 2t + (i&1)) -> global, 64-bit pairs."""
    tid = kb.tid
    w, g, t = tid // 32, (tid % 32) // 4, tid % 4
    out = []
    for i in range(0, N // 2, 2):
        row = 16 * w + g + 8 * ((i >> 1) & 1)
        col = 8 * (i >> 2) + 2 * t
        out.append(L.StGlobal(L.GlobalRef(D, row * N + col), rr(acc, i, 2), 64, origin="store D"))
    return out


def stage_k_major(kb, src, dst, rows, K, swizzle=True):
    """st.shared a row-major (rows, K=64) f16 global tile into a 128B-swizzled K-major smem tile."""
    tid, out = kb.tid, []
    v = kb.reg(f"v_{dst.name}", "f16", 8)
    sw = SW128 if swizzle else (lambda e: e)
    for i in range(rows * K // 8 // kb.threads):
        c = tid + i * kb.threads
        r, ch = c // (K // 8), c % (K // 8)
        out += [
            L.LdGlobal(rr(v), L.GlobalRef(src, r * K + ch * 8), 128),
            L.StShared(L.SharedRef(dst, sw(r * K + ch * 8)), rr(v), 128, origin=f"stage {dst.name}"),
        ]
    return out


def wgmma_kernel(N=64, K=64, a_swizzle=1, b_swizzle=1, rs=False, read_early=False, overwrite_early=False):
    kb = KB("wgmma", 128, arch="sm_90a")
    A = gparam("A", "f16", (64, K))
    B = gparam("B", "f16", (N, K))
    D = gparam("D", "f32", (64, N))
    sA = kb.shared("sA", "f16", 64 * K, align=1024)
    sB = kb.shared("sB", "f16", N * K, align=1024)
    acc = kb.reg("acc", "f32", N // 2)
    body = stage_k_major(kb, A, sA, 64, K) + stage_k_major(kb, B, sB, N, K)
    body += [L.BarSync(), L.FenceProxyAsync(), L.WgmmaFence()]
    atom = f"SM90_64x{N}x16_F32F16F16_{'RS' if rs else 'SS'}"
    fa = kb.reg("fa", "f16", 8 * (K // 16))
    if rs:  # A fragments from global by the PTX formula (each warp's m16n8k16 A, rows + 16w)
        tid = kb.tid
        w, g, t = tid // 32, (tid % 32) // 4, tid % 4
        for ks in range(K // 16):
            for i in range(0, 8, 2):
                row = 16 * w + g + 8 * ((i >> 1) & 1)
                col = ks * 16 + 2 * t + 8 * (i >= 4)
                body.append(L.LdGlobal(rr(fa, ks * 8 + i, 2), L.GlobalRef(A, row * K + col), 32))
    for ks in range(K // 16):
        a = rr(fa, ks * 8, 8) if rs else L.SmemDesc(sA, ks * 16, a_swizzle, 16, 1024)
        b = L.SmemDesc(sB, ks * 16, b_swizzle, 16, 1024)
        body.append(
            L.Wgmma(atom, rr(acc), a, b, scale_d=0 if ks == 0 else 1, loc=here("wgmma"), origin="mma")
        )
    body.append(L.WgmmaCommit(loc=here("commit")))
    if overwrite_early:
        body.append(L.StShared(L.SharedRef(sB, kb.tid * 8), rr(kb.regs[1]), 128, loc=here("sB[...] = v")))
    if not read_early:
        body.append(L.WgmmaWait(0, loc=here("wait")))
    body += d_frag_stores(kb, D, acc, N)
    return kb.build([A, B, D], body)


def _args(N=64, K=64, seed=60):
    rng = np.random.default_rng(seed)
    a = rng.uniform(-1, 1, (64, K)).astype(np.float16)
    b = rng.uniform(-1, 1, (N, K)).astype(np.float16)
    return {"A": a, "B": b, "D": np.zeros((64, N), np.float32)}


def _ref(args):
    return args["A"].astype(np.float64) @ args["B"].astype(np.float64).T


@pytest.mark.parametrize("N", [64, 128])
def test_wgmma_ss_128b_swizzled_k_major(N):
    args = _args(N)
    rep = run(wgmma_kernel(N), args)
    np.testing.assert_allclose(args["D"], _ref(args), rtol=1e-5, atol=1e-5)
    assert sum(s.executions for s in rep.find("Wgmma")) == 4


def test_wgmma_rs_register_a():
    args = _args(seed=61)
    run(wgmma_kernel(rs=True), args)
    np.testing.assert_allclose(args["D"], _ref(args), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("wrong", [2, 3, 0])
def test_wgmma_wrong_swizzle_mode_gives_wrong_answer(wrong):
    args = _args(seed=62)
    run(wgmma_kernel(b_swizzle=wrong), args)
    assert not np.allclose(args["D"], _ref(args), rtol=1e-2, atol=1e-2)


def test_reading_accumulator_before_wait_is_an_error():
    with pytest.raises(AsyncHazardError) as e:
        run(wgmma_kernel(read_early=True), _args())
    assert e.value.instr.opname == "StGlobal" and e.value.other_instr.opname == "Wgmma"
    assert "wgmma.wait_group" in str(e.value)


def test_overwriting_operand_smem_of_inflight_wgmma_is_an_error():
    with pytest.raises(AsyncHazardError) as e:
        run(wgmma_kernel(overwrite_early=True), _args())
    assert e.value.instr.opname == "StShared" and e.value.other_instr.opname == "Wgmma"
    assert e.value.buffer == "sB"


def test_wgmma_mn_major_b_128b_swizzle():
    """B given as Bkn[K, N] (N contiguous) in the MN-major SW128 canonical layout
    ((T,8,m),(8,k)):((1,T,LBO),(8T,SBO)): 64-element N blocks LBO apart, 8-row K groups SBO apart."""
    N, K = 128, 32
    kb = KB("wgmma_mn", 128, arch="sm_90a")
    A = gparam("A", "f16", (64, K))
    Bkn = gparam("Bkn", "f16", (K, N))
    D = gparam("D", "f32", (64, N))
    sA = kb.shared("sA", "f16", 64 * 64, align=1024)
    sB = kb.shared("sB", "f16", K * N, align=1024)
    acc = kb.reg("acc", "f32", N // 2)
    v = kb.reg("v", "f16", 8)
    tid = kb.tid
    LBO, SBO = 1024, 2048  # bytes: N block of 64 x 8 rows; K group of 8
    body = []
    # A: (64, K=32) into a K-major SW128 tile of 64-element rows (only k < 32 used)
    for i in range(64 * K // 8 // 128):
        c = tid + i * 128
        r, ch = c // (K // 8), c % (K // 8)
        body += [
            L.LdGlobal(rr(v), L.GlobalRef(A, r * K + ch * 8), 128),
            L.StShared(L.SharedRef(sA, SW128(r * 64 + ch * 8)), rr(v), 128),
        ]
    for i in range(K * N // 8 // 128):
        c = tid + i * 128
        k, n = c // (N // 8), (c % (N // 8)) * 8
        off = (k % 8) * 64 + (k // 8) * (SBO // 2) + (n // 64) * (LBO // 2) + n % 64
        body += [
            L.LdGlobal(rr(v), L.GlobalRef(Bkn, k * N + n), 128),
            L.StShared(L.SharedRef(sB, SW128(off)), rr(v), 128),
        ]
    body += [L.FenceProxyAsync(), L.BarSync(), L.WgmmaFence()]  # generic writes, then wgmma reads
    for ks in range(K // 16):
        body.append(
            L.Wgmma(
                f"SM90_64x{N}x16_F32F16F16_SS",
                rr(acc),
                L.SmemDesc(sA, ks * 16, 1, 16, 1024),
                L.SmemDesc(sB, ks * 2 * (SBO // 2), 1, LBO, SBO, major="MN"),
                scale_d=int(ks > 0),
            )
        )
    body += [L.WgmmaCommit(), L.WgmmaWait(0)] + d_frag_stores(kb, D, acc, N)
    rng = np.random.default_rng(63)
    a = rng.uniform(-1, 1, (64, K)).astype(np.float16)
    b = rng.uniform(-1, 1, (K, N)).astype(np.float16)
    d = np.zeros((64, N), np.float32)
    run(kb.build([A, Bkn, D], body), {"A": a, "Bkn": b, "D": d})
    np.testing.assert_allclose(d, a.astype(np.float64) @ b.astype(np.float64), rtol=1e-5, atol=1e-5)


def test_wgmma_f16_accumulator():
    k = wgmma_kernel()
    for ins in k.body:
        if isinstance(ins, L.Wgmma):
            ins.atom = "SM90_64x64x16_F16F16F16_SS"
    acc = next(r for r in k.registers if r.name == "acc")
    acc.dtype = f16
    D = next(p for p in k.params if p.name == "D")
    D.dtype = acc.dtype
    for ins in k.body:
        if isinstance(ins, L.StGlobal) and ins.dst.param is D:
            ins.bits = 32
    args = _args(seed=64)
    args["D"] = np.zeros((64, 64), np.float16)
    run(k, args)
    np.testing.assert_allclose(args["D"], _ref(args), rtol=1e-2, atol=1e-2)
