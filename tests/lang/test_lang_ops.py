"""Semantics of individual language features: shapes, broadcasting, grids, control, views."""

from __future__ import annotations

import hexlayout.lang as hl
from hexlayout.ir.expr import Const, Var, bounds, evaluate, free_vars
from hexlayout.ir.mapping import spatial as ir_spatial
from hexlayout.ir.tile import (
    Alloc,
    Copy,
    Elementwise,
    Fill,
    For,
    GlobalParam,
    GlobalView,
    If,
    Iota,
    Reduce,
    ScalarParam,
    Slice,
    SubTile,
    Sync,
)
from hexlayout.ir.types import LayoutVar, Scope
from hexlayout.lang import Layout, Swizzle, composition, f16, f32, i32

from .kernels import K, M, N, line_of, ops_of

T = hl.dims("T")


def test_broadcasting_and_reduce_shapes() -> None:
    @hl.kernel(threads=128)
    def bc(a: f16[M, K]):
        x = hl.zeros((64, 32), f32)
        row = hl.reduce(x, "max", 1)
        col = hl.sum(x, axis=0)
        y = x - row
        z = hl.exp2(y) * col
        v = hl.zeros((32,), f32)
        w = x + v
        p = x < 1.5
        q = hl.where(p, x, 0.0)
        r = 2.0 * x + 1
        s = -x
        t = hl.max(x, row)
        u = hl.min_reduce(x, -1)
        return z, w, q, r, s, t, u

    tk = bc.trace()
    vals = {op.result.name: op.result for op in tk.body.walk() if hasattr(op, "result")}
    assert vals["row"].type.shape == (64, 1)
    assert vals["col"].type.shape == (1, 32)
    assert vals["y"].type.shape == (64, 32)
    assert vals["z"].type.shape == (64, 32)
    assert vals["w"].type.shape == (64, 32)
    assert str(vals["p"].type.dtype) == "pred"
    assert vals["q"].type.shape == (64, 32) and str(vals["q"].type.dtype) == "f32"
    assert vals["u"].type.shape == (64, 1)
    red = ops_of(tk.body, Reduce)
    assert [(r.fn, r.axis) for r in red] == [("max", 1), ("sum", 0), ("min", 1)]
    ew = {op.result.name: op for op in ops_of(tk.body, Elementwise)}
    assert ew["r"].fn == "add" and ew["r"].args[1] == 1
    inner = ew["r"].args[0]
    assert ew[inner.name].fn == "mul" and ew[inner.name].args[0] == 2.0  # 2.0 * x keeps operand order
    assert ew["s"].fn == "neg" and ew["t"].fn == "max"
    assert ew["z"].args[0].name != "z"  # the inner exp2 became a temporary


def test_in_place_updates_and_assign() -> None:
    @hl.kernel(threads=128)
    def inplace(a: f16[M, K]):
        acc = hl.zeros((16, 16), f32)
        alpha = hl.full((16, 1), 0.5, f32)
        acc *= alpha
        acc += 1.0
        hl.assign(acc, hl.exp(acc))
        acc[...] = 0.0

    tk = inplace.trace()
    acc = tk.body.ops[0].result
    ew = ops_of(tk.body, Elementwise)
    assert [op.fn for op in ew] == ["mul", "add", "exp", "mov"]
    assert ew[0].result is acc and ew[1].result is acc and ew[3].result is acc
    fills = ops_of(tk.body, Fill)
    assert fills[-1].dst is acc and fills[-1].value == 0.0


def test_grid_bounds_static_symbolic_and_composed() -> None:
    seen = {}

    @hl.kernel(threads=128)
    def g1(a: f16[M, K]):
        seen["static"] = hl.grid(hl.spatial(4, 8))

    tk = g1.trace()
    pm, pn = seen["static"]
    assert isinstance(pm, Var) and (pm.lo, pm.hi) == (0, 4) and (pn.lo, pn.hi) == (0, 8)
    assert tk.launch.grid == (8, 4) and tk.launch.block_index == (pn, pm)

    @hl.kernel(threads=128)
    def g2(a: f16[M, K], *, BM: int = 64):
        seen["sym"] = hl.grid(hl.spatial(hl.cdiv(a.shape[0], BM), 3))

    tk = g2.trace()
    pm, pn = seen["sym"]
    assert (pm.lo, pm.hi) == (0, None) and (pn.lo, pn.hi) == (0, 3)
    assert isinstance(tk.launch.grid[0], int) and tk.launch.grid[0] == 3

    @hl.kernel(threads=128)
    def g3(a: f16[M, K]):
        seen["comp"] = hl.grid(hl.spatial(2, 3) * hl.spatial(4, 1))

    tk = g3.trace()
    assert tk.launch.grid == (24,)
    (bx,) = tk.launch.block_index
    m, n = seen["comp"]
    assert bounds(m) == (0, 8) and bounds(n)[0] == 0 and bounds(n)[1] >= 3
    # matches the task mapping's own worker -> task assignment
    ref = ir_spatial(2, 3) * ir_spatial(4, 1)
    for w in range(24):
        assert (evaluate(m, {bx: w}), evaluate(n, {bx: w})) == ref.worker_tasks(w)[0]

    @hl.kernel(threads=128)
    def g4(a: f16[M, K]):
        seen["rep"] = hl.grid(hl.spatial(2) * hl.repeat(3))

    tk = g4.trace()
    assert tk.launch.grid == (2,)
    (bx,) = tk.launch.block_index
    assert [evaluate(t, {bx: 1}) for t in seen["rep"]] == [3, 4, 5]


def test_thread_coordinates() -> None:
    seen = {}

    @hl.kernel(threads=256)
    def th(a: f16[M, K]):
        seen["t"] = (hl.thread_index(), hl.warp_index(), hl.lane_index(), hl.warp_group_index())

    tk = th.trace()
    t, w, lane, wg = seen["t"]
    assert t is tk.launch.thread_index and (t.lo, t.hi) == (0, 256)
    assert bounds(w) == (0, 8) and bounds(lane) == (0, 32) and bounds(wg) == (0, 2)
    assert tk.launch.grid == (1,)


def test_loops_and_ifs_nest() -> None:
    @hl.kernel(threads=256)
    def nest(a: f16[M, K], n: hl.i32):
        for i in hl.range(n):
            with hl.if_(i.eq(0)):
                for j in hl.range(2, 10, step=2, unroll=True):  # noqa: B007
                    hl.syncthreads()
            with hl.else_():
                hl.commit_group()
            for s in range(2):
                hl.wait_group(s)
        with hl.warp_group(1):
            hl.syncthreads()

    tk = nest.trace()
    (loop, wg) = tk.body.ops
    assert isinstance(loop, For) and loop.var.name == "i"
    n_param = tk.params[1]
    assert isinstance(n_param, ScalarParam) and loop.stop is n_param.var
    branch = loop.body.ops[0]
    assert isinstance(branch, If) and branch.else_body is not None
    inner = branch.then_body.ops[0]
    assert isinstance(inner, For) and (inner.start, inner.stop, inner.step, inner.unroll) == (2, 10, 2, True)
    assert inner.var.name == "j" and (inner.var.lo, inner.var.hi) == (2, 10)
    assert isinstance(inner.body.ops[0], Sync)
    assert [op.name for op in branch.else_body.ops] == ["AsyncCommit"]
    assert [op.pending for op in loop.body.ops[1:]] == [0, 1]   # the Python loop unrolled
    assert isinstance(wg, If) and wg.warp_groups == (1,)
    assert inner.loc.line == line_of(nest, "for j in hl.range(2, 10")
    assert branch.loc.line == line_of(nest, "with hl.if_(i.eq(0))")


def test_views_extents_and_gather() -> None:
    @hl.kernel(threads=128)
    def views(a: f16[M, 64], idx: i32[T], x: f32[128, 96].strides(1, 128), *, BM: int = 32):  # noqa: F821
        ga = hl.view(a, tile=(BM, 64), origin=(5, 0))
        rows = hl.register(i32, (BM,))
        hl.copy(hl.view(idx, tile=(BM,), origin=(7,)), rows)
        gg = hl.view(a, tile=(BM, 16), origin=(None, 16), rows=rows, valid_rows=20)
        gx = x.tile((64, 64), (96, 64))
        sub = gx[0:32, 16:48]
        col = gx[:, 3]  # noqa: F841
        r = hl.register(f16, (BM, 16))
        hl.copy(gg, r)
        hl.copy(ga, hl.shared(f16, (BM, 64)))
        hl.copy(sub, hl.register(f32, (32, 32)))

    tk = views.trace()
    gvs = {op.result.name: op for op in ops_of(tk.body, GlobalView)}
    a_param = tk.params[0]
    assert isinstance(a_param, GlobalParam) and a_param.stride == (64, 1)
    ga = gvs["ga"]
    assert ga.result.type.layout == Layout((32, 64), (64, 1))  # static strides: a real layout
    assert ga.extent[1] == 64 and free_vars(ga.extent[0]) == {a_param.shape[0]}
    gg = gvs["gg"]
    assert gg.gather is not None and gg.gather.name == "rows"
    assert gg.extent == (20, 16) and gg.result.type.layout is None and gg.origin == (0, 16)
    gx = gvs["gx"]
    assert gx.extent == (32, 32)                         # ragged: 128-96 rows, 96-64 columns
    assert gx.result.type.layout == Layout((64, 64), (1, 128))
    sub = next(op for op in ops_of(tk.body, SubTile))
    assert sub.offset == (0, 16) and sub.result.type.shape == (32, 32)
    assert sub.result.type.layout == Layout((32, 32), (1, 128)) and sub.result.base is gx.result
    col = next(op for op in ops_of(tk.body, Slice) if op.result.name == "col")
    assert col.index == (None, 3) and col.result.type.shape == (64,)
    assert col.result.type.layout == Layout((64,), (1,))


def test_symbolic_strides_and_annotations() -> None:
    @hl.kernel(threads=128)
    def strided(a: hl.Tensor(f16, ("M", "K"), stride=("lda", 1)), b: f16[N, 2*K], n: hl.i32):  # noqa: F821
        hl.copy(a.tile((16, 16)), hl.register(f16, (16, 16)))

    tk = strided.trace()
    a, b, n = tk.params
    assert [str(s) for s in a.stride] == ["lda", "1"]
    assert str(b.shape[1]) == "K * 2" and not isinstance(b.shape[1], int)
    assert a.shape[1] in free_vars(b.shape[1])     # the same size variable K
    gv = ops_of(tk.body, GlobalView)[0]
    assert gv.result.type.layout is None           # symbolic strides: layout None, strides on the param

    tk2 = strided.trace(a=f16[64, 32])
    assert tk2.params[0].shape == (64, 32) and tk2.params[0].stride == (32, 1)
    assert ops_of(tk2.body, GlobalView)[0].result.type.layout == Layout((16, 16), (32, 1))


def test_explicit_layouts_and_hints() -> None:
    sw = composition(Swizzle(3, 3, 3), Layout((64, 64), (64, 1)))
    tv = hl.make_layout_tv(Layout((4, 32), (32, 1)), Layout((1, 4)))

    @hl.kernel(threads=128)
    def lays(a: f16[M, K]):
        s1 = hl.shared(f16, (64, 64), layout=sw)
        s2 = hl.shared(f16, (64, 64, 2), layout=hl.auto(swizzle="128B", stride=(None, 1, None)))
        r1 = hl.register(f32, (4, 128), layout=tv)
        r2 = hl.register(f32, (128, 4), layout=Layout((128, 4), (1, 128)))
        x = s1[:, 8]  # noqa: F841
        y = s2[:, :, 1]  # noqa: F841
        z = hl.rearrange(r2)  # noqa: F841
        w = r1.T  # noqa: F841

    tk = lays.trace()
    vals = {op.result.name: op.result for op in tk.body.walk() if hasattr(op, "result")}
    assert vals["s1"].type.layout is sw
    assert vals["s2"].type.layout.hints == {"swizzle": "128B", "stride": (None, 1, None)}
    assert vals["r1"].type.layout == tv[1] and vals["r2"].type.has_layout
    assert isinstance(vals["x"].type.layout, LayoutVar) and vals["x"].type.layout.hints["view_of"] is sw
    assert vals["y"].type.layout.hints["view_of"] is vals["s2"].type.layout
    assert isinstance(vals["z"].type.layout, LayoutVar) and vals["z"].type.scope == Scope.REGISTER
    assert vals["w"].type.shape == (128, 4)


def test_iota_cast_and_copy_options() -> None:
    @hl.kernel(threads=128)
    def misc(a: f16[M, K]):
        bars = hl.mbarrier(2)
        hl.mbarrier_init(bars, 1, arrivals=128)
        s = hl.shared(f16, (64, 64))
        cols = hl.iota((64, 64), 1) + hl.thread_index()
        hl.copy(a.tile((64, 64)), s, mbarrier=bars[1])
        hl.arrive(bars[1], tx_bytes=s.nbytes, who="one")
        hl.wait(bars, 1, 0)
        r = hl.register(f16, (64, 64))
        hl.copy(s, r, instruction="SM75_U32x4_LDSM_N", mask=cols < 3)

    tk = misc.trace()
    assert isinstance(ops_of(tk.body, Iota)[0], Iota) and ops_of(tk.body, Iota)[0].axis == 1
    tma, ld = ops_of(tk.body, Copy)
    assert tma.mbarrier is tk.mbarriers[0] and tma.mbarrier_index == 1
    assert ld.instruction == "SM75_U32x4_LDSM_N" and ld.mask.name != "" and str(ld.mask.type.dtype) == "pred"
    arrive = next(op for op in tk.body.ops if op.name == "MbarrierArrive")
    assert arrive.tx_bytes == 64 * 64 * 2


def test_value_names_are_unique_and_follow_assignments() -> None:
    @hl.kernel(threads=128)
    def names(a: f16[M, K]):
        x = hl.zeros((8, 8), f32)
        for _ in range(2):
            x = x * 2.0
        y = hl.exp(x + 1.0)  # noqa: F841

    tk = names.trace()
    named = [op.result.name for op in tk.body.walk() if hasattr(op, "result")]
    assert len(named) == len(set(named))
    assert named[0] == "x" and "y" in named
    allocs = ops_of(tk.body, Alloc)
    assert allocs[0].result.type.layout.name == "x"


def test_printer_output() -> None:
    from .kernels import simple_gemm

    tk = simple_gemm.trace()
    text = str(tk)
    lines = text.splitlines()
    assert lines[0].startswith("kernel simple_gemm(a: f16[M, K] stride (K, 1), b: f16[N, K] stride (K, 1)")
    assert lines[1] == "  consts BM=64, BN=64, BK=32"
    assert lines[2].startswith("  launch grid=((N + 63) / 64, (M + 63) / 64) threads=128")
    mma_line = line_of(simple_gemm, "hl.mma(ra, rb, acc)")
    assert f"    mma %ra, %rb -> %acc  # kernels.py:{mma_line}" in lines
    acc_line = line_of(simple_gemm, "acc = hl.zeros")
    assert f"  %acc: register<f32(64,64), ?L0> = alloc  # kernels.py:{acc_line}" in lines
    assert any(ln.startswith("  for k in range(0, (K + 31) / 32, 1):") for ln in lines)
    assert any(ln.startswith("    %ra: register<f16(64,32), ?L1> = alloc") for ln in lines)
    assert any("= view %a[blockIdx.y * 64, k * 32] extent (min(M - blockIdx.y * 64, 64), min(K - k * 32, 32))"
               in ln for ln in lines)
    assert text == str(simple_gemm.trace()) and text == hl_format(tk)


def hl_format(tk: object) -> str:
    from hexlayout.ir.printer import format_kernel

    return format_kernel(tk)  # type: ignore[arg-type]


def test_printer_shows_swizzled_layouts_and_nesting() -> None:
    sw = composition(Swizzle(3, 3, 3), Layout((128, 32, 3), (32, 1, 4096)))

    @hl.kernel(threads=128)
    def pr(a: f16[M, K]):
        sa = hl.shared(f16, (128, 32, 3), layout=sw)  # noqa: F841
        with hl.if_(hl.thread_index() < 64):
            for k in hl.range(3):  # noqa: B007
                hl.syncthreads()
        with hl.else_():
            hl.wgmma_fence()

    text = str(pr.trace())
    assert "  %sa: shared<f16(128,32,3), Sw<3,3,3> o 0 o (128,32,3):(32,1,4096)> = alloc" in text
    assert "\n  if threadIdx.x < 64:" in text
    assert "\n    for k in range(0, 3, 1):" in text and "\n      syncthreads  #" in text
    assert "\n  else:\n    wgmma.fence  #" in text


def test_static_constant_folding_in_extents() -> None:
    @hl.kernel(threads=128)
    def st(a: f16[100, 40]):
        g = hl.view(a, tile=(64, 32), origin=(64, 32))  # noqa: F841

    gv = ops_of(st.trace().body, GlobalView)[0]
    assert gv.extent == (36, 8) and not isinstance(gv.extent[0], Const)
