"""The fusion mechanism (issue 13): prologues into a GEMM anchor's operand loads, epilogues
into its store, run in the emulator on CPU tensors and compared with torch eager (within
1e-2 of max|eager| for f16 / bf16); what ran, through ``launch_log`` and torch.profiler;
one build for sizes that differ only in symbolic dims."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import hexlayout.ops  # noqa: E402,F401 - registers the anchor kernels with hexlayout.fusion

from hexlayout.fusion import Epilogue, FusedSpec, FusionUnsupported, Node, Prologue, run_fused  # noqa: E402
from hexlayout.runtime import launch_log  # noqa: E402

A = ("anchor",)


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.delenv("HEXLAYOUT_EMULATE_ARCH", raising=False)


def _close(out, want) -> None:
    assert out.shape == want.shape and out.dtype == want.dtype
    err = (out.double() - want.double()).abs().max().item()
    assert err <= 1e-2 * want.double().abs().max().item(), err


def _rand(*shape, dtype=torch.float16, scale=1.0, seed=0):
    g = torch.Generator().manual_seed(seed + sum(shape))
    return (torch.randn(*shape, generator=g) * scale).to(dtype)


def test_addmm_bias_gelu_is_one_kernel() -> None:
    x, w, bias = _rand(40, 32), _rand(64, 32, scale=0.3, seed=1), _rand(64, seed=2)
    spec = FusedSpec("aten.addmm.default",
                     epilogue=Epilogue((Node("aten.gelu.default", (A,)),), (("node", 0),)))
    with launch_log() as log:
        (out,) = run_fused(spec, [bias, x, w.t()], [])
    _close(out, torch.nn.functional.gelu(torch.addmm(bias, x, w.t())))
    (rec,) = log                                     # one kernel: no separate bias or GELU kernel
    assert rec.anchor == "aten.addmm.default" and rec.prologue == ()
    assert rec.epilogue == ("aten.gelu.default",) and rec.device == "cpu"
    assert (40, 32) in rec.shapes and (40, 64) in rec.shapes and len(rec.build_key) == 64


def test_linear_bias_residual_bf16_three_dims() -> None:
    dt = torch.bfloat16
    x, w = _rand(2, 20, 32, dtype=dt), _rand(64, 32, dtype=dt, scale=0.3, seed=1)
    bias, res = _rand(64, dtype=dt, seed=2), _rand(2, 20, 64, dtype=dt, seed=3)
    spec = FusedSpec("aten.linear.default",
                     epilogue=Epilogue((Node("aten.relu.default", (A,)),
                                        Node("aten.add.Tensor", (("node", 0), ("input", 0)))),
                                       (("node", 1),)))
    (out,) = run_fused(spec, [x, w, bias], [res])
    _close(out, torch.relu(torch.nn.functional.linear(x, w, bias)) + res)


def test_gated_mlp_from_one_concatenated_weight() -> None:
    """SiLU(gate) * up where gate and up are the two column halves of one product."""
    h = 32
    x, wgu = _rand(40, 32), _rand(2 * h, 32, scale=0.3, seed=4)
    nodes = (Node("aten.slice.Tensor", (A, ("const", -1), ("const", 0), ("const", h))),
             Node("aten.slice.Tensor", (A, ("const", -1), ("const", h), ("const", 2 * h))),
             Node("aten.silu.default", (("node", 0),)),
             Node("aten.mul.Tensor", (("node", 2), ("node", 1))))
    spec = FusedSpec("aten.mm.default", epilogue=Epilogue(nodes, (("node", 3),)))
    with launch_log() as log:
        (out,) = run_fused(spec, [x, wgu.t()], [])
    y = x @ wgu.t()
    _close(out, torch.nn.functional.silu(y[:, :h]) * y[:, h:])
    assert len(log) == 1 and log[0].epilogue == tuple(n.op for n in nodes)


def test_relaid_halves_follow_the_weight() -> None:
    """The column halves' re-laid-out weight is cached per weight: a weight changed in place,
    and a weight of another dtype / another tensor (possibly at a freed weight's address) of
    the same shape, each give their own product."""
    h = 32
    nodes = (Node("aten.slice.Tensor", (A, ("const", -1), ("const", 0), ("const", h))),
             Node("aten.slice.Tensor", (A, ("const", -1), ("const", h), ("const", 2 * h))),
             Node("aten.silu.default", (("node", 0),)),
             Node("aten.mul.Tensor", (("node", 2), ("node", 1))))
    spec = FusedSpec("aten.linear.default", epilogue=Epilogue(nodes, (("node", 3),)))

    def check(x: torch.Tensor, w: torch.Tensor) -> None:
        (out,) = run_fused(spec, [x, w], [])
        y = x.float() @ w.float().t()
        _close(out, (torch.nn.functional.silu(y[:, :h]) * y[:, h:]).to(x.dtype))

    x, w = _rand(24, 32), _rand(2 * h, 32, scale=0.3, seed=30)
    check(x, w)
    w.copy_(_rand(2 * h, 32, scale=0.3, seed=31))        # in place: a new version
    check(x, w)
    del w
    for seed, dt in ((32, torch.float16), (33, torch.bfloat16)):
        check(_rand(24, 32, dtype=dt), _rand(2 * h, 32, dtype=dt, scale=0.3, seed=seed))


def test_output_permuted_into_heads() -> None:
    b, s, heads, d = 2, 20, 4, 16
    dt = torch.bfloat16
    x, w = _rand(b, s, 32, dtype=dt), _rand(heads * d, 32, dtype=dt, scale=0.3, seed=5)
    nodes = (Node("aten.add.Tensor", (A, ("const", 1.0))),
             Node("aten.view.default", (("node", 0), ("const", (b, s, heads, d)))),
             Node("aten.permute.default", (("node", 1), ("const", (0, 2, 1, 3)))))
    spec = FusedSpec("aten.linear.default", epilogue=Epilogue(nodes, (("node", 2),)))
    (out,) = run_fused(spec, [x, w], [])
    want = (torch.nn.functional.linear(x, w) + 1.0).view(b, s, heads, d).permute(0, 2, 1, 3)
    _close(out, want)
    assert out.stride() == want.stride()


@pytest.mark.parametrize("dt", [torch.float16, torch.bfloat16])
def test_output_stored_permuted_into_heads(dt: torch.dtype) -> None:
    """clone(permute(view(Y, [B, T, H, hd]), (0, 2, 1, 3))): the kernel stores [B, H, T, hd]
    itself (a 4-D output parameter, gathered row stores per head; tiles that cross a batch
    boundary: T = 7), no host view; contiguous like eager's; T = 7 and T = 13 share one build."""
    heads, d = 4, 16
    w, bias = _rand(heads * d, 32, dtype=dt, scale=0.3, seed=40), _rand(heads * d, dtype=dt, seed=41)
    nodes = (Node("aten.relu.default", (A,)),
             Node("aten.view.default", (("node", 0), ("const", (-1, 7, heads, d)))),
             Node("aten.permute.default", (("node", 1), ("const", (0, 2, 1, 3)))),
             Node("aten.clone.default", (("node", 2),)))
    with launch_log() as log:
        for b, t in ((3, 7), (2, 13)):
            view = Node("aten.view.default", (("node", 0), ("const", (-1, t, heads, d))))
            nodes = (nodes[0], view, *nodes[2:])
            spec = FusedSpec("aten.linear.default", epilogue=Epilogue(nodes, (("node", 3),)))
            x = _rand(b, t, 32, dtype=dt, seed=b)
            (out,) = run_fused(spec, [x, w, bias], [])
            want = torch.relu(torch.nn.functional.linear(x, w, bias)).view(b, t, heads, d).permute(0, 2, 1, 3)
            want = want.contiguous()
            _close(out, want)
            assert out.stride() == want.stride() and out.is_contiguous()
            assert (b, heads, t, d) in log[-1].shapes           # the kernel's own 4-D output
    assert log[0].build_key == log[1].build_key
    assert log[0].epilogue[-2:] == ("aten.permute.default", "aten.clone.default")


@pytest.mark.parametrize("qdtype", [torch.int8, torch.float8_e4m3fn])
def test_dequantization_prologue_of_the_weight(qdtype) -> None:
    """linear(x, w_q.to(f16) * scale[:, None]): the dequantization runs in the weight's loads."""
    n, k = 64, 32
    x = _rand(40, k)
    if qdtype == torch.int8:
        wq = torch.randint(-127, 128, (n, k), generator=torch.Generator().manual_seed(6), dtype=torch.int8)
    else:
        wq = _rand(n, k, dtype=torch.float32, seed=6).to(qdtype)
    scale = (torch.rand(n, 1, generator=torch.Generator().manual_seed(7)) * 0.02 + 0.001).half()
    pro = Prologue(1, (Node("aten._to_copy.default", (("input", 0),), (("dtype", "f16"),)),
                       Node("aten.mul.Tensor", (("node", 0), ("input", 1)))), 1)
    spec = FusedSpec("aten.linear.default", prologues=(pro,))
    with launch_log() as log:
        (out,) = run_fused(spec, [x, None], [wq, scale])
    _close(out, torch.nn.functional.linear(x, wq.to(torch.float16) * scale))
    (rec,) = log
    assert rec.prologue == ("aten._to_copy.default", "aten.mul.Tensor") and (n, k) in rec.shapes


def test_activation_dequantization_prologue_with_a_scalar_scale() -> None:
    """mm(x_int8.to(f16) * s, w) + bias with a per-tensor scale ``s`` (a scalar parameter)."""
    xq = torch.randint(-100, 100, (40, 32), generator=torch.Generator().manual_seed(8), dtype=torch.int8)
    w, bias = _rand(32, 64, scale=0.05, seed=9), _rand(64, seed=10)
    pro = Prologue(0, (Node("aten._to_copy.default", (("input", 0),), (("dtype", "f16"),)),
                       Node("aten.mul.Tensor", (("node", 0), ("input", 1)))), 1)
    spec = FusedSpec("aten.mm.default", prologues=(pro,),
                     epilogue=Epilogue((Node("aten.add.Tensor", (A, ("input", 2))),), (("node", 0),)))
    (out,) = run_fused(spec, [None, w], [xq, 0.03, bias])
    _close(out, (xq.to(torch.float16) * 0.03) @ w + bias)


def test_symbolic_sizes_share_one_build_and_bmm_runs_per_batch() -> None:
    w, bias = _rand(64, 32, scale=0.3, seed=11), _rand(64, seed=12)
    spec = FusedSpec("aten.linear.default",
                     epilogue=Epilogue((Node("aten.silu.default", (A,)),), (("node", 0),)))
    with launch_log() as log:
        for m in (72, 100):                          # sequence lengths: one tile config, one build
            x = _rand(m, 32, seed=m)
            (out,) = run_fused(spec, [x, w, bias], [])
            _close(out, torch.nn.functional.silu(torch.nn.functional.linear(x, w, bias)))
    assert len(log) == 2 and log[0].shapes != log[1].shapes
    assert log[0].build_key == log[1].build_key
    a, b = _rand(3, 24, 32, seed=13), _rand(3, 32, 48, scale=0.3, seed=14)
    spec = FusedSpec("aten.bmm.default",
                     epilogue=Epilogue((Node("aten.tanh.default", (A,)),), (("node", 0),)))
    with launch_log() as log:
        (out,) = run_fused(spec, [a, b], [])
    _close(out, torch.tanh(torch.bmm(a, b)))
    assert len(log) == 3 and len({r.build_key for r in log}) == 1


def test_launches_appear_in_torch_profiler() -> None:
    x, w = _rand(24, 32), _rand(32, 32, scale=0.3, seed=15)
    spec = FusedSpec("aten.mm.default", name="neg_mm",
                     epilogue=Epilogue((Node("aten.neg.default", (A,)),), (("node", 0),)))
    run_fused(spec, [x, w], [])                        # build first: the profiled call only runs
    cpu = [torch.profiler.ProfilerActivity.CPU]
    with launch_log() as log, torch.profiler.profile(activities=cpu) as prof:
        (out,) = run_fused(spec, [x, w], [])
    _close(out, -(x @ w))
    names = {e.key for e in prof.key_averages()}
    assert f"hexlayout::{log[0].name}" in names and log[0].name.startswith("neg_mm")


def test_gemm_op_builds_its_epilogue_through_the_mechanism() -> None:
    a, b, bias, res = _rand(24, 32), _rand(40, 32, seed=16), _rand(40, seed=17), _rand(24, 40, seed=18)
    with launch_log() as log:
        c = torch.ops.hexlayout.gemm(a, b, bias, res, "silu", 0.5)
    want = torch.nn.functional.silu(0.5 * (a.float() @ b.float().t()) + bias.float()) + res.float()
    _close(c, want.half())
    (rec,) = log
    assert rec.anchor == "hexlayout.gemm"
    assert rec.epilogue == ("aten.mul.Tensor", "aten.add.Tensor", "aten.silu.default", "aten.add.Tensor")


@pytest.mark.parametrize(("spec", "args", "inputs", "match"), [
    (FusedSpec("aten.mm.default", epilogue=Epilogue((Node("aten.cumsum.default", (A, ("const", 1))),),
                                                    (("node", 0),))),
     "f16", [], "cumsum"),
    (FusedSpec("aten.mm.default", epilogue=Epilogue((Node("aten.t.default", (A,)),
                                                     Node("aten.relu.default", (("node", 0),))),
                                                    (("node", 1),))),
     "f16", [], "view"),
    (FusedSpec("aten.mm.default"), "f32", [], "f16 or bf16"),
    (FusedSpec("aten.mm.default", epilogue=Epilogue((Node("aten.add.Tensor", (A, ("input", 0))),),
                                                    (("node", 0),))),
     "f16", ["col3"], "broadcast"),
    (FusedSpec("aten.convolution.default"), "f16", [], "not an anchor"),
])
def test_what_cannot_fuse_says_why(spec, args, inputs, match) -> None:
    dt = torch.float16 if args == "f16" else torch.float32
    x, w = _rand(16, 32, dtype=dt), _rand(32, 64, dtype=dt, seed=19)
    extra = [torch.zeros(16, 3, dtype=dt) if i == "col3" else i for i in inputs]
    with launch_log() as log, pytest.raises(FusionUnsupported, match=match) as e:
        run_fused(spec, [x, w], extra)
    assert e.value.reason and not log                  # nothing ran


def _compile_cases():
    h = 32
    gated = FusedSpec("aten.mm.default", epilogue=Epilogue(
        (Node("aten.slice.Tensor", (A, ("const", -1), ("const", 0), ("const", h))),
         Node("aten.slice.Tensor", (A, ("const", -1), ("const", h), ("const", 2 * h))),
         Node("aten.silu.default", (("node", 0),)), Node("aten.mul.Tensor", (("node", 2), ("node", 1)))),
        (("node", 3),)))
    dequant = FusedSpec("aten.linear.default", prologues=(Prologue(1, (
        Node("aten._to_copy.default", (("input", 0),), (("dtype", "f16"),)),
        Node("aten.mul.Tensor", (("node", 0), ("input", 1)))), 1),))
    mlp = FusedSpec("aten.addmm.default", epilogue=Epilogue(
        (Node("aten.gelu.default", (A,)), Node("aten.add.Tensor", (("node", 0), ("input", 0)))),
        (("node", 1),)))
    # heads of 64 (with heads of 16, 8 column pieces a 128-wide tile, sm_80 spills 24 bytes)
    heads = FusedSpec("aten.linear.default", epilogue=Epilogue(
        (Node("aten.view.default", (A, ("const", (-1, 16, 2, 64)))),
         Node("aten.permute.default", (("node", 0), ("const", (0, 2, 1, 3)))),
         Node("aten.clone.default", (("node", 1),))), (("node", 2),)))
    x, w = _rand(64, 64), _rand(64, 64, seed=20)
    return [(gated, [x, w.t()], []),
            (dequant, [x, None], [torch.zeros(64, 64, dtype=torch.int8), torch.ones(64, 1).half()]),
            (mlp, [_rand(64), x, w.t()], [_rand(64, 64, seed=21)]),
            (heads, [x, _rand(128, 64, seed=22)], [])]


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_fused_kernels_compile_without_spills(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA path's kernels: every pattern compiles for the architecture at production tile
    sizes, without spills (the warp-specialized Hopper kernel takes epilogues; prologues and
    column halves take the staged kernel)."""
    from hexlayout.ops.gemm.fusion import anchor_consts, fused_build
    from hexlayout.ops.gemm.fusion_plan import plan_call

    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    for spec, args, inputs in _compile_cases():
        call = plan_call(spec, args, inputs)
        call.m = call.n = call.k = 4096                       # the production tile sizes
        consts = anchor_consts(call)
        bld, _ = fused_build(spec, call, consts, compile=True)
        res = bld.compiled.resources
        assert res.spill_stores == 0 and res.spill_loads == 0, (spec.display_name(), res)
        assert bld.generated.name.startswith(spec.display_name())


def test_a_broadcast_bias_gets_a_stride_zero_layout() -> None:
    """The bias row is loaded once per column and broadcast over the rows in registers: its
    synthesized TV layout has stride 0 on the thread modes that walk rows (many (thread,
    value) slots hold one element). The output is staged through shared memory in column
    windows (``STAGE_EPILOGUE``, N % 8 == 0), so the bias rows are a window wide."""
    from hexlayout.ops.gemm.config import CONFIGS
    from hexlayout.ops.gemm.op import gemm_fused

    import hexlayout.lang as hl
    from hexlayout.ir.types import Scope
    from hexlayout.layout import flatten, size

    cfg = CONFIGS["sm_80"][4]
    bld, _ = gemm_fused(hl.f16, "nk", (True, False, "none", False), "sm_80", cfg, 64, 64, compile=False)
    rows = [(v, lay) for v, lay in bld.synthesis.layouts()
            if v.type.scope == Scope.REGISTER and tuple(v.type.shape)[0] == 1 and v.type.shape[1] > 1
            and cfg.BN % v.type.shape[1] == 0]
    assert rows
    for v, lay in rows:
        assert 0 in flatten(lay.stride)
        assert len({lay(i) for i in range(size(lay))}) == v.type.shape[1] < size(lay)


def test_several_outputs_of_different_dtypes() -> None:
    """One kernel stores the product (f16) and relu(product) + r as f32: two outputs."""
    x, w, r = _rand(40, 32), _rand(32, 64, scale=0.3, seed=22), _rand(40, 64, seed=23)
    nodes = (Node("aten.relu.default", (A,)),
             Node("aten._to_copy.default", (("node", 0),), (("dtype", "f32"),)),
             Node("aten.add.Tensor", (("node", 1), ("input", 0))))
    spec = FusedSpec("aten.mm.default", epilogue=Epilogue(nodes, (A, ("node", 2))))
    with launch_log() as log:
        y, z = run_fused(spec, [x, w], [r])
    prod = x @ w
    _close(y, prod)
    _close(z, torch.relu(prod).float() + r)
    assert len(log) == 1 and (40, 64) in log[0].shapes


@pytest.mark.nvrtc
def test_cuda_host_path_with_the_gpu_stubbed(tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA branch of run_fused up to the driver launch (the GPU parts stubbed as in
    benchmarks/bench_host.py): the kernel compiles, every argument passes the launcher's
    checks (shapes, strides, alignment) in the order of the fused program's parameters, one
    launch per call, recorded as a CUDA launch; a second length reuses the build."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_host.py"
    spec_ = importlib.util.spec_from_file_location("bench_host", path)
    bench = importlib.util.module_from_spec(spec_)
    spec_.loader.exec_module(bench)
    monkeypatch.setenv("HEXLAYOUT_CACHE_DIR", str(tmp_path / "cache"))
    w, bias = _rand(64, 32, scale=0.3, seed=24), _rand(64, seed=25)
    spec = FusedSpec("aten.linear.default", epilogue=Epilogue(
        (Node("aten.gelu.default", (A,)), Node("aten.add.Tensor", (("node", 0), ("input", 0)))),
        (("node", 1),)))
    drv = bench.stub_gpu(torch, monkeypatch.setattr)
    with launch_log() as log:
        for m in (80, 120):
            (out,) = run_fused(spec, [_rand(m, 32, seed=m), w, bias], [_rand(m, 64, seed=m + 1)])
            assert out.shape == (m, 64) and out.dtype == torch.float16
    assert drv.launches == 2
    assert [r.device for r in log] == ["cuda", "cuda"] and log[0].build_key == log[1].build_key


def test_per_row_and_one_element_tensor_inputs_broadcast() -> None:
    """(Y * s_row[M, 1]) * s[()] - t[N]: a per-row column, a 0-d tensor (read in the kernel,
    never synchronized to the host) and a row, each broadcast over the tile."""
    x, w = _rand(40, 32), _rand(32, 64, scale=0.3, seed=26)
    s_row = (torch.rand(40, 1, generator=torch.Generator().manual_seed(27)) + 0.5).half()
    s, t = torch.tensor(0.75, dtype=torch.float16), _rand(64, seed=28)
    nodes = (Node("aten.mul.Tensor", (A, ("input", 0))),
             Node("aten.mul.Tensor", (("node", 0), ("input", 1))),
             Node("aten.sub.Tensor", (("node", 1), ("input", 2))))
    spec = FusedSpec("aten.mm.default", epilogue=Epilogue(nodes, (("node", 2),)))
    with launch_log() as log:
        (out,) = run_fused(spec, [x, w], [s_row, s, t])
    _close(out, (x @ w) * s_row * s - t)
    assert {(40, 1), (1, 1), (1, 64)} <= set(log[0].shapes)


def test_addmm_with_a_transposed_dequantized_weight() -> None:
    """addmm(bias, x, t(w_q.to(bf16) * s)) - nn.Linear on a quantized weight as aot_autograd
    writes it: the transpose ends the prologue, so the kernel reads w as N x K."""
    dt = torch.bfloat16
    x, bias = _rand(40, 32, dtype=dt), _rand(64, dtype=dt, seed=29)
    wq = torch.randint(-127, 128, (64, 32), generator=torch.Generator().manual_seed(30), dtype=torch.int8)
    s = (torch.rand(64, 1, generator=torch.Generator().manual_seed(31)) * 0.02).to(dt)
    pro = Prologue(2, (Node("aten._to_copy.default", (("input", 0),), (("dtype", "bf16"),)),
                       Node("aten.mul.Tensor", (("node", 0), ("input", 1))),
                       Node("aten.t.default", (("node", 1),))), 2)
    spec = FusedSpec("aten.addmm.default", prologues=(pro,))
    (out,) = run_fused(spec, [bias, x, None], [wq, s])
    _close(out, torch.addmm(bias, x, (wq.to(dt) * s).t()))
