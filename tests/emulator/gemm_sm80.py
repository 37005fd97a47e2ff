"""A hand-lowered sm_80 GEMM block tile (what synthesis would emit), used by the tests.

C[M, N] (f32) = A[M, K] @ B[N, K]^T (f16, both K-major). One block computes a BM x BN tile
with WM x WN warps; per BK slice: cp.async 16-byte chunks into Swizzle<3,3,3>-or-<2,3,3>
shared tiles, wait, bar.sync, then per k16 step ldmatrix.x4 fragments of A and B and
m16n8k16 mma.sync into f32 accumulators; epilogue: 64-bit stores of the C fragments.
"""

from __future__ import annotations

from hexlayout.ir import lowered as L
from hexlayout.ir.expr import Var
from hexlayout.layout import Swizzle

from .kbuild import KB, gparam, here, rr

ATOM = "SM80_16x8x16_F32F16F16F32_TN"


def gemm_kernel(
    M: int,
    N: int,
    K: int,
    BM: int,
    BN: int,
    BK: int,
    WM: int,
    WN: int,
    swizzle: bool = True,
    sync_after_wait: bool = True,
) -> L.LoweredKernel:
    threads = 32 * WM * WN
    kb = KB(f"gemm_{BM}x{BN}x{BK}", threads, grid=(M // BM, N // BN))
    A = gparam("A", "f16", (M, K))
    B = gparam("B", "f16", (N, K))
    C = gparam("C", "f32", (M, N))
    sA = kb.shared("sA", "f16", BM * BK, align=1024)
    sB = kb.shared("sB", "f16", BN * BK, align=1024)
    bits = {32: 2, 64: 3}[BK]
    sw = Swizzle(bits, 3, 3) if swizzle else (lambda e: e)
    tid, (bm, bn) = kb.tid, kb.bid
    lane, warp = tid % 32, tid // 32
    wm, wn = warp % WM, warp // WM
    TM, TN = BM // WM, BN // WN
    MI, NI = TM // 16, TN // 8
    acc = kb.reg("acc", "f32", MI * NI * 4)
    fa = kb.reg("fa", "f16", MI * 8)
    fb = kb.reg("fb", "f16", NI * 4)
    kt = Var("kt", 0, K // BK)
    body: list[L.Instr] = [L.Alu("mov", rr(acc), (0.0,), origin="acc = 0")]
    loop: list[L.Instr] = []
    cpr = BK // 8  # 16-byte chunks per row
    for src, dst, rows, org in ((A, sA, BM, bm), (B, sB, BN, bn)):
        for i in range(rows * cpr // threads):
            c = tid + i * threads
            r, ch = c // cpr, c % cpr
            loop.append(
                L.CpAsync(
                    L.SharedRef(dst, sw(r * BK + ch * 8)),
                    L.GlobalRef(src, (org * rows + r) * K + kt * BK + ch * 8),
                    16,
                    loc=here("copy(g, s)"),
                    origin=f"copy {src.name} -> {dst.name}",
                )
            )
    loop += [L.CpAsyncCommit(), L.CpAsyncWait(0)]
    if sync_after_wait:
        loop.append(L.BarSync(loc=here("sync")))
    j, r8 = lane // 8, lane % 8
    for kk in range(BK // 16):
        for mi in range(MI):
            m = wm * TM + mi * 16 + r8 + 8 * (j % 2)
            k = kk * 16 + 8 * (j // 2)
            loop.append(
                L.Ldmatrix(
                    rr(fa, mi * 8, 8),
                    L.SharedRef(sA, sw(m * BK + k)),
                    4,
                    loc=here("ldmatrix A"),
                    origin="copy sA -> regs",
                )
            )
        for ni in range(0, NI, 2):
            n = wn * TN + ni * 8 + r8 + 8 * (j // 2)
            k = kk * 16 + 8 * (j % 2)
            loop.append(
                L.Ldmatrix(
                    rr(fb, ni * 4, 8),
                    L.SharedRef(sB, sw(n * BK + k)),
                    4,
                    loc=here("ldmatrix B"),
                    origin="copy sB -> regs",
                )
            )
        for mi in range(MI):
            for ni in range(NI):
                d = rr(acc, (mi * NI + ni) * 4, 4)
                loop.append(
                    L.MmaSync(ATOM, d, rr(fa, mi * 8, 8), rr(fb, ni * 4, 4), d, loc=here("mma"), origin="mma")
                )
    loop.append(L.BarSync(loc=here("sync before refill")))
    body.append(L.ForLoop(kt, 0, K // BK, 1, loop))
    g, t = lane // 4, lane % 4
    for mi in range(MI):
        for ni in range(NI):
            for h in range(2):
                row = bm * BM + wm * TM + mi * 16 + g + 8 * h
                col = bn * BN + wn * TN + ni * 8 + 2 * t
                body.append(
                    L.StGlobal(
                        L.GlobalRef(C, row * N + col),
                        rr(acc, (mi * NI + ni) * 4 + 2 * h, 2),
                        64,
                        loc=here("store C"),
                        origin="copy acc -> C",
                    )
                )
    return kb.build([A, B, C], body)
