"""``define_op``: a toy GEMM op ``torch.ops.hexlayout.<toy>`` on CPU through the emulator
(``HEXLAYOUT_EMULATE=1``), its fake implementation (fake and meta tensors), torch.compile
tracing; on a GPU, launches and CUDA-graph capture."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

import hexlayout.runtime as rt
from hexlayout.lang.examples import gemm_sm80, gemm_sm90
from hexlayout.runtime import EmulationDisabledError, define_op, run_build
from hexlayout.runtime.torch_ops import EMULATE_ENV


def _build_for(t: torch.Tensor):
    """A compiled build for CUDA tensors (by device architecture), an uncompiled one for the CPU."""
    if t.device.type == "cuda":
        if torch.cuda.get_device_capability(t.device) == (9, 0):
            return rt.build(gemm_sm90, "sm_90a")
        return rt.build(gemm_sm80, "sm_80")
    return rt.build(gemm_sm80, "sm_80", compile=False, BM=64, BN=64)


toy = define_op("test_toy_gemm", "(Tensor a, Tensor b) -> Tensor")


@toy.fake
def _toy_fake(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.new_empty((a.shape[0], b.shape[0]))


@toy.impl
def _toy_impl(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = a.new_empty((a.shape[0], b.shape[0]))
    run_build(_build_for(a), a, b, c)
    return c


def _toy_out_impl(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> None:
    run_build(_build_for(a), a, b, c)


toy_out = define_op("test_toy_gemm_out", "(Tensor a, Tensor b, Tensor(a!) c) -> ()",
                    fake=lambda a, b, c: None, impl=_toy_out_impl)


def _inputs(m: int = 40, n: int = 24, k: int = 32, device: str = "cpu"):
    g = torch.Generator(device=device).manual_seed(m + n + k)
    return (torch.randn(m, k, generator=g, device=device).half(),
            torch.randn(n, k, generator=g, device=device).half())


@pytest.fixture
def emulate_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(EMULATE_ENV, "1")


def test_cpu_tensors_run_in_the_emulator(emulate_on) -> None:
    a, b = _inputs(100, 72, 40)
    c = torch.ops.hexlayout.test_toy_gemm(a, b)
    torch.testing.assert_close(c.double(), a.double() @ b.double().T, rtol=1e-2, atol=1e-2)
    assert toy(a, b).shape == (100, 72)


def test_cpu_tensors_without_emulation_are_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(EMULATE_ENV, raising=False)
    a, b = _inputs()
    with pytest.raises(EmulationDisabledError, match=r"hexlayout\.test_toy_gemm: CPU tensors need "
                       r"HEXLAYOUT_EMULATE=1 \(emulator, small sizes\) or a CUDA device"):
        torch.ops.hexlayout.test_toy_gemm(a, b)
    monkeypatch.setenv(EMULATE_ENV, "0")
    with pytest.raises(EmulationDisabledError):
        torch.ops.hexlayout.test_toy_gemm(a, b)


def test_argument_errors_reach_the_caller(emulate_on) -> None:
    a, b = _inputs()
    with pytest.raises(rt.ArgumentError, match="'a': has dtype torch.float32"):
        torch.ops.hexlayout.test_toy_gemm(a.float(), b)


def test_fake_tensors_and_meta_tensors() -> None:
    with FakeTensorMode():
        a, b = torch.empty(40, 32, dtype=torch.float16), torch.empty(24, 32, dtype=torch.float16)
        c = torch.ops.hexlayout.test_toy_gemm(a, b)
    assert isinstance(c, FakeTensor) and c.shape == (40, 24) and c.dtype == torch.float16
    m = torch.ops.hexlayout.test_toy_gemm(torch.empty(7, 16, device="meta").half(),
                                          torch.empty(9, 16, device="meta").half())
    assert m.device.type == "meta" and m.shape == (7, 9) and m.dtype == torch.float16


@pytest.mark.parametrize("backend", ["eager", "aot_eager"])
def test_torch_compile_fullgraph_traces_the_op(emulate_on, backend: str) -> None:
    torch._dynamo.reset()

    @torch.compile(fullgraph=True, backend=backend)
    def f(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return torch.ops.hexlayout.test_toy_gemm(a * 2, b).float() + 1

    a, b = _inputs(64, 48, 16)
    torch.testing.assert_close(f(a, b).double(), 2 * a.double() @ b.double().T + 1, rtol=2e-2, atol=2e-2)


def test_mutating_op_under_compile(emulate_on) -> None:
    torch._dynamo.reset()
    a, b = _inputs(32, 16, 16)

    @torch.compile(fullgraph=True, backend="aot_eager")
    def f(a: torch.Tensor, b: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
        torch.ops.hexlayout.test_toy_gemm_out(a, b, c)
        return c + 0

    c = torch.zeros(32, 16, dtype=torch.float16)
    out = f(a, b, c)
    torch.testing.assert_close(out.double(), a.double() @ b.double().T, rtol=1e-2, atol=1e-2)
    torch.testing.assert_close(c, out)


def test_redefinition_swaps_implementations(emulate_on) -> None:
    again = define_op("test_toy_gemm", "(Tensor a,  Tensor b) -> Tensor")
    assert again is toy
    with pytest.raises(ValueError, match="already defined as"):
        define_op("test_toy_gemm", "(Tensor a) -> Tensor")
    plain = define_op("test_toy_plain", "(Tensor x) -> Tensor", fake=lambda x: torch.empty_like(x))
    with pytest.raises(NotImplementedError, match="no CPU"):
        torch.ops.hexlayout.test_toy_plain(torch.zeros(2))
    plain.cpu(lambda x: x + 1)
    assert torch.ops.hexlayout.test_toy_plain(torch.zeros(2)).tolist() == [1.0, 1.0]
    with pytest.raises(ValueError, match="must start with the argument list"):
        define_op("test_bad", "Tensor x -> Tensor")


@pytest.mark.gpu
def test_op_on_cuda_and_in_a_cuda_graph() -> None:
    a, b = _inputs(256, 128, 64, device="cuda")
    c = torch.ops.hexlayout.test_toy_gemm(a, b)
    torch.testing.assert_close(c.float(), a.float() @ b.float().T, rtol=2e-2, atol=2e-2)
    out = torch.empty_like(c)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        torch.ops.hexlayout.test_toy_gemm_out(a, b, out)
    a.copy_(torch.randn_like(a))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(out.float(), a.float() @ b.float().T, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_op_under_torch_compile_on_cuda() -> None:
    pytest.importorskip("triton")
    torch._dynamo.reset()
    f = torch.compile(lambda a, b: torch.ops.hexlayout.test_toy_gemm(a, b) * 2, fullgraph=True)
    a, b = _inputs(128, 256, 64, device="cuda")
    torch.testing.assert_close(f(a, b).float(), 2 * (a.float() @ b.float().T), rtol=3e-2, atol=3e-2)


# --- one check for every path; autograd never silently missing ------------------------------------

def test_op_without_backward_refuses_inputs_that_require_grad(emulate_on) -> None:
    """No silent ``None`` gradients: an op with no backward refuses, naming the argument,
    eagerly and on meta tensors; under no_grad or with detached inputs it runs."""
    a, b = _inputs(16, 8, 16)
    w = b.clone().requires_grad_()
    for args in ((a, w), (a.to("meta"), w.detach().to("meta").requires_grad_())):
        with pytest.raises(rt.ArgumentError, match=r"argument 'b': requires grad, but "
                           r"hexlayout\.test_toy_gemm has no backward.*b\.detach\(\)"):
            torch.ops.hexlayout.test_toy_gemm(*args)
    with torch.no_grad():
        torch.testing.assert_close(toy(a, w).double(), a.double() @ b.double().T, rtol=1e-2, atol=1e-2)
    assert toy(a, w.detach()).shape == (16, 8)


def test_check_runs_before_every_implementation(emulate_on) -> None:
    """``check=`` is called with the op's arguments before the fake, CPU and CUDA kernels,
    so eager, meta and fake tensors get its error."""
    seen = []

    def check(x: torch.Tensor, n: int = 1) -> None:
        seen.append(x.device.type)
        if n < 0:
            raise rt.ArgumentError("hexlayout.test_checked", "n", f"must be >= 0, got {n}")

    op = define_op("test_checked", "(Tensor x, int n=1) -> Tensor", check=check,
                   fake=lambda x, n=1: torch.empty_like(x), impl=lambda x, n=1: x * n)
    assert op.arguments() == [("x", "Tensor", False), ("n", "int", True)]
    assert torch.ops.hexlayout.test_checked(torch.ones(2), 3).tolist() == [3.0, 3.0]
    for x in (torch.ones(2), torch.ones(2, device="meta")):
        with pytest.raises(rt.ArgumentError, match="argument 'n': must be >= 0, got -1"):
            torch.ops.hexlayout.test_checked(x, -1)
    with FakeTensorMode(), pytest.raises(rt.ArgumentError, match="argument 'n'"):
        torch.ops.hexlayout.test_checked(torch.ones(2), -1)
    assert seen[:3] == ["cpu", "cpu", "meta"]
    assert op in rt.torch_ops.defined_ops() and op.module == __name__


def test_calling_the_op_object_checks_argument_kinds(emulate_on) -> None:
    """``Op.__call__`` binds the arguments to the schema: wrong kinds, unknown, missing and
    doubled arguments are ``ArgumentTypeError``s (``TypeError``) naming the argument."""
    from hexlayout.runtime.args import ArgumentTypeError

    a, b = _inputs(16, 8, 16)
    cases = [((a, "b"), {}, "'b': expected Tensor, got str 'b'"),
             ((a,), {}, "'b': missing"),
             ((a, b), {"c": 1}, "'c': no such argument"),
             ((a, b), {"a": a}, "'a': given twice"),
             ((a, b, a), {}, "takes 2 arguments"),
             ((None, b), {}, "'a': expected Tensor, got NoneType")]
    for args, kwargs, match in cases:
        with pytest.raises(ArgumentTypeError, match=match):
            toy(*args, **kwargs)
    op = define_op("test_kinds",
                   "(Tensor x, float s, str mode=\"a\", Tensor? y=None, bool flag=False) -> Tensor",
                   fake=lambda x, *r, **k: torch.empty_like(x), impl=lambda x, *r, **k: x.clone())
    for kwargs, arg in (({"s": "0.5"}, "s"), ({"s": True}, "s"), ({"s": 1.0, "mode": 3}, "mode"),
                        ({"s": 1.0, "y": 2.0}, "y"), ({"s": 1.0, "flag": 1}, "flag")):
        with pytest.raises(ArgumentTypeError, match=f"argument '{arg}'"):
            op(torch.ones(2), **kwargs)
    assert op(torch.ones(2), s=float("nan"), y=None).tolist() == [1.0, 1.0]


def test_fast_path_runs_only_where_the_check_could_not_fail_differently(emulate_on, monkeypatch) -> None:
    """``fast=``: tried before the check on CPU (emulation on) and CUDA kernels, from the
    Autograd kernel when no grad is needed, under inference mode and inside autograd's forward;
    its ``None`` falls back to check + implementation; never with emulation off (the check's
    error comes first), never for fake / meta tensors, never where an op without a backward
    must refuse an input that requires grad."""
    calls: list[str] = []
    hit = {"on": True}

    def check(x: torch.Tensor, n: int = 1) -> None:
        calls.append("check")
        if n < 0:
            raise rt.ArgumentError("hexlayout.test_fast", "n", f"must be >= 0, got {n}")

    def fast(x: torch.Tensor, n: int = 1) -> torch.Tensor | None:
        calls.append("fast")
        return x * (10 * n) if hit["on"] and n >= 0 else None

    def impl(x: torch.Tensor, n: int = 1) -> torch.Tensor:
        calls.append("impl")
        return x * n

    kw = {"check": check, "fast": fast, "impl": impl, "fake": lambda x, n=1: torch.empty_like(x)}
    plain = define_op("test_fast", "(Tensor x, int n=1) -> Tensor", **kw)
    with_bw = define_op("test_fast_bw", "(Tensor x, int n=1) -> Tensor", **kw,
                        backward=lambda ctx, g: (g * ctx.n, None),
                        setup_context=lambda ctx, inputs, out: setattr(ctx, "n", inputs[1]))
    x = torch.ones(2)

    def run(op, *args, expect):
        calls.clear()
        out = op.op(*args)
        assert calls == expect
        return out

    for op in (plain, with_bw):
        assert run(op, x, 2, expect=["fast"]).tolist() == [20.0, 20.0]
        with torch.inference_mode():
            assert run(op, x, 2, expect=["fast"]).tolist() == [20.0, 20.0]
        with pytest.raises(rt.ArgumentError, match="'n': must be >= 0, got -1"):
            run(op, x, -1, expect=None)
        assert calls == ["fast", "check"]
        hit["on"] = False
        assert run(op, x, 2, expect=["fast", "check", "impl"]).tolist() == [2.0, 2.0]
        hit["on"] = True
        run(op, torch.ones(2, device="meta"), 2, expect=["check"])
        with FakeTensorMode():
            run(op, torch.ones(2), 2, expect=["check"])
        monkeypatch.setenv(EMULATE_ENV, "0")
        with pytest.raises(rt.ArgumentError, match="'n'"):
            run(op, x, -1, expect=None)
        with pytest.raises(EmulationDisabledError):
            run(op, x, 2, expect=None)
        assert calls == ["check"]
        monkeypatch.setenv(EMULATE_ENV, "1")
    w = torch.ones(2, requires_grad=True)
    with pytest.raises(rt.ArgumentError, match="'x': requires grad, but hexlayout.test_fast has no backward"):
        run(plain, w, 2, expect=None)
    assert calls == ["check"]
    with torch.no_grad():
        assert run(plain, w, 2, expect=["fast"]).tolist() == [20.0, 20.0]
    out = run(with_bw, w, 3, expect=["fast"])            # inside autograd.Function's forward
    assert out.requires_grad and out.tolist() == [30.0, 30.0]
    out.sum().backward()
    assert w.grad.tolist() == [3.0, 3.0]
