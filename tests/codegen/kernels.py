"""Lowered kernels assembled by hand from the lowering functions, for the CUDA backend tests.

* ``gemm_sm80``: a 64x64 tile of ``C = A @ B^T`` (f16 in, f32 accumulate, f16 out) over a
  runtime K loop: cp.async (zero-filled edges) into swizzled shared tiles, ldmatrix, mma.sync
  m16n8k16, cvt, predicated st.global.
* ``gemm_sm90``: the same with TMA box loads completing on an mbarrier and wgmma SS
  (m64n64k16) reading 128-byte-swizzled tiles through descriptors.
* ``row_reduce``: a 64x64 f32 tile loaded in the mma accumulator layout, reduced along rows
  with in-thread ops and warp butterflies (shfl.sync.bfly), stored per row.
* ``elementwise``: f16 -> f32, times a scalar argument, exp2, a column mask from an iota,
  then cvt to bf16 and to fp8 (e4m3), stored.
"""

from __future__ import annotations

from hexlayout.arch import get_atom
from hexlayout.arch.gmma import gmma_smem_atom
from hexlayout.ir.expr import Var, as_expr
from hexlayout.ir.lower.copy import (
    lower_gmem_to_smem,
    lower_ldmatrix,
    lower_reg_mem,
    lower_tma_load,
)
from hexlayout.ir.lower.math import lower_elementwise, lower_fill, lower_iota, lower_reduce
from hexlayout.ir.lower.mma import lower_mma
from hexlayout.ir.lower.views import GlobalTileView, RegisterTile, SharedTileView
from hexlayout.ir.lowered import (
    BarSync,
    Comment,
    CpAsyncCommit,
    CpAsyncWait,
    ForLoop,
    Instr,
    LoweredKernel,
    MbarArrive,
    MbarInit,
    MbarRef,
    MbarWait,
    RegArray,
    SmemBuffer,
    WgmmaCommit,
    WgmmaFence,
    WgmmaWait,
)
from hexlayout.ir.mapping import repeat, spatial
from hexlayout.ir.tile import GlobalParam, ScalarParam, SourceLoc
from hexlayout.ir.tiled_mma import TiledMma
from hexlayout.ir.types import bf16, e4m3, f16, f32, i32
from hexlayout.layout import Layout, Swizzle, composition, tile_to_shape
from hexlayout.layout.tv import copy_thread_layout

__all__ = ["gemm_sm80", "gemm_sm90", "row_reduce", "elementwise", "ALL"]

FILE = "kernels_src.py"


def _ok(res):
    assert not isinstance(res, str), res
    return res


def tag(instrs: list[Instr], line: int, origin: str, code: str = "") -> list[Instr]:
    """Give instructions the source line and tile op they came from."""
    for ins in instrs:
        ins.loc = SourceLoc(FILE, line, "kernel", code)
        ins.origin = origin
    return instrs


def _sizes() -> tuple[Var, Var, Var]:
    return Var("M", 1, None, "size"), Var("N", 1, None, "size"), Var("K", 1, None, "size")


def _reg(name: str, dtype, shape, tv: Layout, threads: int = 128) -> RegisterTile:
    return RegisterTile(RegArray(name, dtype, tv.size() // threads), dtype, shape, tv, threads)


def gemm_sm80() -> LoweredKernel:
    tid = Var("threadIdx.x", 0, 128, "thread")
    bx, by = Var("blockIdx.x", 0, None, "block"), Var("blockIdx.y", 0, None, "block")
    kt = Var("kt", 0, None, "loop")
    M, N, K = _sizes()
    A = GlobalParam("A", f16, (M, K), (K, 1))
    B = GlobalParam("B", f16, (N, K), (K, 1))
    C = GlobalParam("C", f16, (M, N), (N, 1))
    tm = TiledMma(get_atom("SM80_16x8x16_F32F16F16F32_TN"), spatial(2, 2) * repeat(2, 4), 2)   # 64x64x32
    m0, n0, k0 = by * 64, bx * 64, kt * 32
    ga = GlobalTileView(A, f16, (64, 32), (0, 1), (m0, k0), (M - m0, K - k0))
    gb = GlobalTileView(B, f16, (64, 32), (0, 1), (n0, k0), (N - n0, K - k0))
    gc = GlobalTileView(C, f16, (64, 64), (0, 1), (m0, n0), (M - m0, N - n0))
    lay = composition(Swizzle(2, 3, 3), Layout((64, 32), (32, 1)))
    sa_buf, sb_buf = SmemBuffer("sa", f16, 4096, 0, 1024), SmemBuffer("sb", f16, 4096, 4096, 1024)
    sa = SharedTileView.of(sa_buf, f16, (64, 32), lay)
    sb = SharedTileView.of(sb_buf, f16, (64, 32), lay)
    a = _reg("a_frag", f16, (64, 32), tm.a_tv())
    b = _reg("b_frag", f16, (64, 32), tm.b_tv())
    acc = _reg("acc", f32, (64, 64), tm.c_tv())
    out = _reg("out", f16, (64, 64), tm.c_tv())
    ldsm = get_atom("SM75_U32x4_LDSM_N")
    loop = ForLoop(kt, 0, (K + 31) // 32, 1, [
        *tag(_ok(lower_gmem_to_smem(ga, sa, tid, 128, 16)).instrs, 12, "copy", "hl.copy(A[m0, k0], sa)"),
        *tag(_ok(lower_gmem_to_smem(gb, sb, tid, 128, 16)).instrs, 13, "copy", "hl.copy(B[n0, k0], sb)"),
        *tag([CpAsyncCommit(), CpAsyncWait(0), BarSync()], 14, "async_wait"),
        *tag(_ok(lower_ldmatrix(a, sa, ldsm, tid, 16)).instrs, 15, "copy", "a = hl.copy(sa)"),
        *tag(_ok(lower_ldmatrix(b, sb, ldsm, tid, 16)).instrs, 16, "copy", "b = hl.copy(sb)"),
        *tag(_ok(lower_mma(tm, a, b, acc, tid, 16)), 17, "mma", "hl.mma(a, b, acc)"),
        *tag([BarSync()], 18, "sync"),
    ])
    loop.loc, loop.origin = SourceLoc(FILE, 11, "kernel", "for kt in hl.range(cdiv(K, 32)):"), "for"
    body = [Comment("kernel gemm_sm80"),
            *tag(lower_fill(acc, 0.0), 10, "fill", "acc = hl.zeros((64, 64), f32)"),
            loop,
            *tag(_ok(lower_elementwise("cvt", out, [acc])), 19, "cast", "out = hl.cast(acc, f16)"),
            *tag(_ok(lower_reg_mem(out, gc, False, tid, 16)).instrs, 20, "copy", "hl.copy(out, C[m0, n0])")]
    return LoweredKernel("gemm_sm80", [A, B, C], ((N + 63) // 64, (M + 63) // 64), 128, tid, (bx, by), body,
                         registers=[a.array, b.array, acc.array, out.array], smem=[sa_buf, sb_buf],
                         arch="sm_80", loc=SourceLoc(FILE, 9, "gemm_sm80"))


def gemm_sm90() -> LoweredKernel:
    tid = Var("threadIdx.x", 0, 128, "thread")
    bx, by = Var("blockIdx.x", 0, None, "block"), Var("blockIdx.y", 0, None, "block")
    kt = Var("kt", 0, None, "loop")
    M, N, K = _sizes()
    A = GlobalParam("A", f16, (M, K), (K, 1))
    B = GlobalParam("B", f16, (N, K), (K, 1))
    C = GlobalParam("C", f32, (M, N), (N, 1))
    tm = TiledMma(get_atom("SM90_64x64x16_F32F16F16_SS"), spatial(1, 1), 4)     # 64x64x64
    m0, n0, k0 = by * 64, bx * 64, kt * 64
    ga = GlobalTileView(A, f16, (64, 64), (0, 1), (m0, k0), (M - m0, K - k0))
    gb = GlobalTileView(B, f16, (64, 64), (0, 1), (n0, k0), (N - n0, K - k0))
    gc = GlobalTileView(C, f32, (64, 64), (0, 1), (m0, n0), (M - m0, N - n0))
    lay = tile_to_shape(gmma_smem_atom(16, "K", 128), (64, 64))
    sa_buf, sb_buf = SmemBuffer("sa", f16, 8192, 0, 1024), SmemBuffer("sb", f16, 8192, 8192, 1024)
    sa = SharedTileView.of(sa_buf, f16, (64, 64), lay)
    sb = SharedTileView.of(sb_buf, f16, (64, 64), lay)
    full = MbarRef("full", 0, 1)
    elect = as_expr(tid).eq(0)
    plan_a, desc_a = _ok(lower_tma_load(ga, sa, full, elect, 16, "tma_a"))
    plan_b, desc_b = _ok(lower_tma_load(gb, sb, full, elect, 16, "tma_b"))
    acc = _reg("acc", f32, (64, 64), tm.c_tv())
    loop = ForLoop(kt, 0, (K + 63) // 64, 1, [
        *tag([MbarArrive(full, 2 * 8192, pred=elect)], 32, "mbarrier_arrive"),
        *tag(plan_a.instrs, 33, "copy", "hl.copy(A[m0, k0], sa, mbarrier=full)"),
        *tag(plan_b.instrs, 34, "copy", "hl.copy(B[n0, k0], sb, mbarrier=full)"),
        *tag([MbarWait(full, kt % 2)], 35, "mbarrier_wait"),
        *tag([WgmmaFence()], 36, "wgmma_fence"),
        *tag(_ok(lower_mma(tm, sa, sb, acc, tid, 16)), 37, "mma", "hl.mma(sa, sb, acc)"),
        *tag([WgmmaCommit(), WgmmaWait(0)], 38, "wgmma_wait"),
        *tag([BarSync()], 39, "sync"),
    ])
    body = [*tag([MbarInit(full, 1, pred=elect), BarSync()], 29, "mbarrier_init"),
            *tag(lower_fill(acc, 0.0), 30, "fill"),
            loop,
            *tag(_ok(lower_reg_mem(acc, gc, False, tid, 32)).instrs, 40, "copy", "hl.copy(acc, C[m0, n0])")]
    return LoweredKernel("gemm_sm90", [A, B, C], ((N + 63) // 64, (M + 63) // 64), 128, tid, (bx, by), body,
                         registers=[acc.array], smem=[sa_buf, sb_buf], mbarriers=[full], tma=[desc_a, desc_b],
                         arch="sm_90a", loc=SourceLoc(FILE, 28, "gemm_sm90"))


# 64 x 64 over 128 threads in the m16n8k16 accumulator layout; rows: 64 x 1
_C_TV = TiledMma(get_atom("SM80_16x8x16_F32F16F16F32_TN"), spatial(4, 1) * repeat(1, 8), 1).c_tv()
_ROW_TV = Layout(((4, 8, 4), 2), ((0, 1, 16), 8))


def row_reduce(arch: str = "sm_80", fn: str = "max") -> LoweredKernel:
    tid = Var("threadIdx.x", 0, 128, "thread")
    bx = Var("blockIdx.x", 0, None, "block")
    M = Var("M", 1, None, "size")
    X = GlobalParam("X", f32, (M, 64), (64, 1))
    Y = GlobalParam("Y", f32, (M, 1), (1, 1))
    m0 = bx * 64
    gx = GlobalTileView(X, f32, (64, 64), (0, 1), (m0, 0), (M - m0, 64))
    gy = GlobalTileView(Y, f32, (64, 1), (0, 1), (m0, 0), (M - m0, 1))
    x = _reg("x", f32, (64, 64), _C_TV)
    r = _reg("r", f32, (64, 1), _ROW_TV)
    tmp = RegArray("r_shfl", f32, r.values)
    body = [*tag(_ok(lower_reg_mem(x, gx, True, tid, 32)).instrs, 50, "copy", "x = hl.copy(X[m0, :])"),
            *tag(_ok(lower_reduce(fn, r, x, 1, tmp)), 51, "reduce", f"r = hl.reduce_{fn}(x, axis=1)"),
            *tag(_ok(lower_reg_mem(r, gy, False, tid, 32)).instrs, 52, "copy", "hl.copy(r, Y[m0, :])")]
    return LoweredKernel(f"row_reduce_{fn}", [X, Y], ((M + 63) // 64,), 128, tid, (bx,), body,
                         registers=[x.array, r.array, tmp], arch=arch, loc=SourceLoc(FILE, 49, "row_reduce"))


def elementwise(arch: str = "sm_89") -> LoweredKernel:
    tid = Var("threadIdx.x", 0, 128, "thread")
    bx = Var("blockIdx.x", 0, None, "block")
    M = Var("M", 1, None, "size")
    scale = ScalarParam("scale", f32, Var("scale", None, None, "scalar"))
    X = GlobalParam("X", f16, (M, 64), (64, 1))
    Y = GlobalParam("Y", bf16, (M, 64), (64, 1))
    Z = GlobalParam("Z", e4m3, (M, 64), (64, 1))
    m0 = bx * 32
    views = {p.name: GlobalTileView(p, p.dtype, (32, 64), (0, 1), (m0, 0), (M - m0, 64)) for p in (X, Y, Z)}
    tv = _ok(copy_thread_layout((32, 64), [1, 0], 8, 128))
    x, t = _reg("x", f16, (32, 64), tv), _reg("t", f32, (32, 64), tv)
    col, keep = _reg("col", i32, (32, 64), tv), _reg("keep", i32, (32, 64), tv)
    y, z = _reg("y", bf16, (32, 64), tv), _reg("z", e4m3, (32, 64), tv)
    ew = lower_elementwise
    load = _ok(lower_reg_mem(x, views["X"], True, tid, 16)).instrs
    body = [*tag(load, 60, "copy", "x = hl.copy(X[m0, :])"),
            *tag(_ok(ew("cvt", t, [x])), 61, "cast", "t = hl.cast(x, f32)"),
            *tag(_ok(ew("mul", t, [t, scale])), 62, "elementwise", "t = t * scale"),
            *tag(_ok(ew("exp2", t, [t])), 63, "elementwise", "t = hl.exp2(t)"),
            *tag(lower_iota(col, 1, tid), 64, "iota", "col = hl.iota((32, 64), axis=1)"),
            *tag(_ok(ew("lt", keep, [col, 48])), 65, "elementwise", "keep = col < 48"),
            *tag(_ok(ew("select", t, [keep, t, 0.0])), 66, "elementwise", "t = hl.where(keep, t, 0.0)"),
            *tag(_ok(ew("cvt", y, [t])), 67, "cast", "y = hl.cast(t, bf16)"),
            *tag(_ok(ew("cvt", z, [t])), 68, "cast", "z = hl.cast(t, e4m3)"),
            *tag(_ok(lower_reg_mem(y, views["Y"], False, tid, 16)).instrs, 69, "copy", "hl.copy(y, Y)"),
            *tag(_ok(lower_reg_mem(z, views["Z"], False, tid, 8)).instrs, 70, "copy", "hl.copy(z, Z[m0, :])")]
    return LoweredKernel("elementwise", [X, Y, Z, scale], ((M + 31) // 32,), 128, tid, (bx,), body,
                         registers=[x.array, t.array, col.array, keep.array, y.array, z.array], arch=arch,
                         loc=SourceLoc(FILE, 59, "elementwise"))


ALL = {"gemm_sm80": gemm_sm80, "gemm_sm90": gemm_sm90, "row_reduce": row_reduce, "elementwise": elementwise}


def misc_sm90() -> LoweredKernel:
    """Instructions the other kernels do not use: setmaxnreg in warp-specialized branches,
    shared loads / stores, stmatrix, TMA store groups, named barriers, shfl.idx of 16- and
    8-bit elements, runtime if / else, partially unrolled loops, every ALU op."""
    from hexlayout.ir.lowered import (
        Alu,
        FenceProxyAsync,
        IfThen,
        LdShared,
        RegRef,
        SetMaxNReg,
        SharedRef,
        Shfl,
        Stmatrix,
        StShared,
        TmaDesc,
        TmaStore,
        TmaStoreCommit,
        TmaStoreWait,
    )

    tid = Var("threadIdx.x", 0, 256, "thread")
    bx = Var("blockIdx.x", 0, None, "block")
    i = Var("i", 0, None, "loop")
    M = Var("M", 1, None, "size")
    n = ScalarParam("n", i32, Var("n", None, None, "scalar"))
    Y = GlobalParam("Y", f16, (M, 64), (64, 1))
    buf = SmemBuffer("tile", f16, 64 * 64 * 2, 0, 1024)
    desc = TmaDesc("tma_y", Y, (64, 64), (1, 0), 128)
    h = RegArray("h", f16, 8)
    q = RegArray("q", e4m3, 4)
    f = RegArray("f", f32, 4)
    k = RegArray("k", i32, 4)
    t = as_expr(tid)
    ops = []
    for op, nsrc in (("neg", 1), ("abs", 1), ("exp", 1), ("log2", 1), ("log", 1), ("rcp", 1), ("rsqrt", 1),
                     ("sqrt", 1), ("silu", 1), ("gelu", 1), ("add", 2), ("sub", 2), ("mul", 2), ("div", 2),
                     ("max", 2), ("min", 2), ("le", 2), ("gt", 2), ("ge", 2), ("eq", 2), ("ne", 2),
                     ("and", 2), ("or", 2), ("not", 1), ("fma", 3)):
        srcs = tuple([RegRef(f, 0, 4)] * nsrc)
        ops.append(Alu(op, RegRef(f, 0, 4), srcs))
    ints = [Alu("mov", RegRef(k, 0, 4), (t % 7,)), Alu("add", RegRef(k, 0, 4), (RegRef(k, 0, 4), n)),
            Alu("max", RegRef(k, 0, 4), (RegRef(k, 0, 4), 3)),
            Alu("div", RegRef(k, 0, 4), (RegRef(k, 0, 4), 2)),
            Alu("cvt", RegRef(f, 0, 4), (RegRef(k, 0, 4),)), Alu("cvt", RegRef(k, 0, 4), (RegRef(f, 0, 4),)),
            Alu("mov", RegRef(f, 0, 1), (float("inf"),)), Alu("mov", RegRef(f, 1, 1), (-1.5,))]
    producer = [SetMaxNReg(40, False),
                *tag([TmaStore(desc, (0, bx * 64), SharedRef(buf, 0), pred=t.eq(0)),
                      TmaStoreCommit(pred=t.eq(0)), TmaStoreWait(0, pred=t.eq(0))], 80, "copy")]
    consumer = [SetMaxNReg(232, True),
                LdShared(RegRef(h, 0, 8), SharedRef(buf, (t % 128) * 8), 128),
                Alu("cvt", RegRef(f, 0, 4), (RegRef(h, 0, 4),)),
                *ops, *ints,
                Alu("cvt", RegRef(h, 4, 4), (RegRef(f, 0, 4),)),
                Alu("cvt", RegRef(q, 0, 4), (RegRef(f, 0, 4),)),
                Shfl(RegRef(h, 0, 8), RegRef(h, 0, 8), "idx", t % 32 // 2, 16),
                Shfl(RegRef(q, 0, 4), RegRef(q, 0, 4), "bfly", 1),
                BarSync(1, 128),
                Stmatrix(SharedRef(buf, (t % 128) * 8), RegRef(h, 0, 8), 4),
                ForLoop(i, 0, n.var, 2, [StShared(SharedRef(buf, (t % 128) * 8 + i), RegRef(h, 0, 1), 16)],
                        unroll=4),
                FenceProxyAsync()]
    body = [IfThen(t < 128, producer, consumer), BarSync()]
    return LoweredKernel("misc_sm90", [Y, n], ((M + 63) // 64,), 256, tid, (bx,), body,
                         registers=[h, q, f, k], smem=[buf], tma=[desc], arch="sm_90a")


ALL["misc_sm90"] = misc_sm90
