"""Row reductions as fusion anchors (``aten.mean.dim`` / ``aten.sum.dim_IntList`` /
``aten.amax.default`` over the last dimension): RMSNorm and softmax as fused kernels in the
emulator (``HEXLAYOUT_EMULATE=1``, CPU tensors, small shapes), compared with eager torch
within 1e-2 of max|eager|; ``launch_log`` proves which kernels ran."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn

import hexlayout.ops  # noqa: E402,F401 - registers the anchor kernels with hexlayout.fusion

from hexlayout.fusion import Epilogue, FusedSpec, FusionUnsupported, Node, Prologue, run_fused  # noqa: E402
from hexlayout.fusion.explain import explain  # noqa: E402
from hexlayout.runtime.launch_log import launch_log  # noqa: E402

DTYPES = [(torch.float16, "f16"), (torch.bfloat16, "bf16")]
KEEP = (("dim", (-1,)), ("keepdim", True))


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


def _close(out: torch.Tensor, ref: torch.Tensor) -> None:
    assert out.shape == ref.shape and out.dtype == ref.dtype
    scale = ref.float().abs().max().item()
    err = (out.float() - ref.float()).abs().max().item()
    assert err <= 1e-2 * scale, f"max |out - eager| = {err} > 1e-2 * {scale}"


def _f32(ref: tuple) -> Node:
    return Node("aten._to_copy.default", (ref,), (("dtype", "f32"),))


def _rmsnorm_spec(dname: str, eps: float) -> FusedSpec:
    """Llama's RMSNorm of input 0 with weight input 1: one mean anchor, the square in its
    prologue, ``x * rsqrt(mean + eps)``, the cast and the weight in its epilogue."""
    return FusedSpec("aten.mean.dim", prologues=(Prologue(0, (
        _f32(("input", 0)), Node("aten.pow.Tensor_Scalar", (("node", 0), ("const", 2)))), 1),),
        epilogue=Epilogue((
            Node("aten.add.Tensor", (("anchor",), ("const", eps))),
            Node("aten.rsqrt.default", (("node", 0),)),
            _f32(("input", 0)),
            Node("aten.mul.Tensor", (("node", 2), ("node", 1))),
            Node("aten._to_copy.default", (("node", 3),), (("dtype", dname),)),
            Node("aten.mul.Tensor", (("node", 4), ("input", 1)))), outputs=(("node", 5),)),
        anchor_kwargs=KEEP)


@pytest.mark.parametrize("dtype,dname", DTYPES)
def test_rmsnorm_is_one_kernel(dtype: torch.dtype, dname: str) -> None:
    torch.manual_seed(1)
    x = torch.randn(3, 5, 128, dtype=dtype) * 3
    w = (1 + 0.1 * torch.randn(128)).to(dtype)
    with launch_log() as log:
        (y,) = run_fused(_rmsnorm_spec(dname, 1e-5), [None], [x, w])
    xf = x.float()
    want = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5)).to(dtype) * w
    _close(y, want)
    (rec,) = log
    assert rec.anchor == "aten.mean.dim"
    assert rec.prologue == ("aten._to_copy.default", "aten.pow.Tensor_Scalar")
    assert "aten.rsqrt.default" in rec.epilogue


@pytest.mark.parametrize("dtype,dname", DTYPES)
def test_softmax_is_two_reduction_kernels(dtype: torch.dtype, dname: str) -> None:
    """softmax(x, -1) = exp(x - max) / sum(exp(x - max)): an amax kernel, then a sum kernel
    that recomputes exp(x - max) in its prologue and divides by the sum in its epilogue."""
    torch.manual_seed(2)
    x = torch.randn(7, 64, dtype=dtype) * 4
    amax = FusedSpec("aten.amax.default", epilogue=Epilogue(), anchor_kwargs=KEEP)
    shifted = (_f32(("input", 0)), Node("aten.sub.Tensor", (("node", 0), ("input", 1))),
               Node("aten.exp.default", (("node", 1),)))
    norm = FusedSpec("aten.sum.dim_IntList", prologues=(Prologue(0, shifted, 2),), epilogue=Epilogue(
        (*shifted, Node("aten.div.Tensor", (("node", 2), ("anchor",))),
         Node("aten._to_copy.default", (("node", 3),), (("dtype", dname),))), outputs=(("node", 4),)),
        anchor_kwargs=KEEP)
    with launch_log() as log:
        (m,) = run_fused(amax, [x.float()], [])
        (y,) = run_fused(norm, [None], [x, m])
    _close(m, x.float().amax(-1, keepdim=True))
    _close(y, torch.softmax(x.float(), -1).to(dtype))
    assert [r.anchor for r in log] == ["aten.amax.default", "aten.sum.dim_IntList"]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_fused_reductions_compile_without_spills(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """NVRTC: the fused RMSNorm over rows of 1024 (4 warps), of 64 (one warp), of 100 (a masked
    tail, 8-byte aligned rows) and of MAX_ROW = 8192 (8 warps)."""
    from hexlayout.ops.row_reduce.fusion import row_fused_build

    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    for cols in (1024, 64, 100, 8192):
        x, w = torch.randn(8, cols, dtype=torch.float16), torch.randn(cols, dtype=torch.float16)
        bld = row_fused_build(_rmsnorm_spec("f16", 1e-6), [None], [x, w])
        res = bld.compiled.resources
        assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, (cols, res)


def test_unfusible_reductions_say_why() -> None:
    from hexlayout.ops.row_reduce.kernels import MAX_ROW

    with pytest.raises(FusionUnsupported, match=f"rows of {MAX_ROW + 1} .*1 to {MAX_ROW}"):
        run_fused(FusedSpec("aten.sum.dim_IntList", anchor_kwargs=KEEP),
                  [torch.randn(1, MAX_ROW + 1, dtype=torch.float16)], [])
    with pytest.raises(FusionUnsupported, match="last dimension"):
        run_fused(FusedSpec("aten.sum.dim_IntList", anchor_kwargs=(("dim", (0,)), ("keepdim", True))),
                  [torch.randn(4, 64)], [])


@pytest.mark.parametrize("cols", [1, 7, 33, 100, 300])
def test_rows_of_any_length_mask_their_tail(cols: int) -> None:
    """Rows that are not a power of two: the tile's tail is masked with each reduction's
    identity (all-negative rows: a max over zeros would be wrong; softmax's exp(x - max)
    prologue is 1 on a zero tail: a sum over it would be wrong), vs float64."""
    g = torch.Generator().manual_seed(cols)
    x = -(torch.rand(5, cols, generator=g) * 3 + 0.5).half()           # every value negative
    x64 = x.double()
    with launch_log() as log:
        (s,) = run_fused(FusedSpec("aten.sum.dim_IntList", anchor_kwargs=KEEP), [x], [])
        (mu,) = run_fused(FusedSpec("aten.mean.dim", anchor_kwargs=KEEP), [x], [])
        (mx,) = run_fused(FusedSpec("aten.amax.default", anchor_kwargs=KEEP), [x.float()], [])
    for got, want in ((s, x64.sum(-1, keepdim=True)), (mu, x64.mean(-1, keepdim=True)),
                      (mx, x64.amax(-1, keepdim=True))):
        assert got.shape == want.shape
        assert (got.double() - want).abs().max().item() <= 1e-3 * want.abs().max().item(), (got, want)
    assert len(log) == 3
    shifted = (_f32(("input", 0)), Node("aten.sub.Tensor", (("node", 0), ("input", 1))),
               Node("aten.exp.default", (("node", 1),)))
    norm = FusedSpec("aten.sum.dim_IntList", prologues=(Prologue(0, shifted, 2),), epilogue=Epilogue(
        (*shifted, Node("aten.div.Tensor", (("node", 2), ("anchor",)))), outputs=(("node", 3),)),
        anchor_kwargs=KEEP)
    (p,) = run_fused(norm, [None], [x, mx])
    assert (p.double() - x64.softmax(-1)).abs().max().item() <= 1e-3


def test_row_lengths_with_one_tile_share_a_build() -> None:
    """Rows of 40 and 56 (multiples of 8 elements: 16-byte aligned rows) both fit a 64-column
    tile: one build; and RMSNorm over an odd hidden size (rows 2-byte aligned)."""
    torch.manual_seed(4)
    with launch_log() as log:
        for cols in (40, 56, 45):
            x = torch.randn(6, cols, dtype=torch.float16) * 2
            w = (1 + 0.1 * torch.randn(cols)).half()
            (y,) = run_fused(_rmsnorm_spec("f16", 1e-6), [None], [x, w])
            xf = x.float()
            _close(y, (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).half() * w)
    assert log[0].build_key == log[1].build_key and log[0].shapes != log[1].shapes
    assert log[2].build_key != log[0].build_key


class _Softmax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        e = (xf - xf.amax(-1, keepdim=True)).exp()
        return (e / e.sum(-1, keepdim=True)).to(x.dtype)


def test_frontend_fuses_softmax_and_leaves_other_reductions() -> None:
    torch._dynamo.reset()
    x = torch.randn(2, 6, 64, dtype=torch.float16)
    m = _Softmax()
    plan = explain(m, x)
    assert [k.anchor for k in plan.kernels] == ["aten.amax.default", "aten.sum.dim_IntList"], plan
    assert plan.fallbacks == [], plan
    c = torch.compile(m, backend="hexlayout", options={"fallback": "eager"})
    with launch_log() as log:
        out = c(x)
    _close(out, m(x))
    assert [r.anchor for r in log] == ["aten.amax.default", "aten.sum.dim_IntList"]

    # F.softmax over rows of 64: the backend decomposes it into the same two kernels
    torch._dynamo.reset()
    sm = nn.Softmax(-1)
    plan = explain(sm, x)
    assert [k.anchor for k in plan.kernels] == ["aten.amax.default", "aten.sum.dim_IntList"], plan
    assert plan.fallbacks == [], plan
    torch._dynamo.reset()
    c = torch.compile(sm, backend="hexlayout", options={"fallback": "eager"})
    with launch_log() as log:
        out = c(x)
    _close(out, sm(x))
    assert [r.anchor for r in log] == ["aten.amax.default", "aten.sum.dim_IntList"]
    torch._dynamo.reset()                                 # rows of 48: the same two kernels
    x48 = torch.randn(2, 48, dtype=torch.float16)
    c = torch.compile(sm, backend="hexlayout", options={"fallback": "eager"})
    with launch_log() as log:
        out = c(x48)
    _close(out, sm(x48))
    assert [r.anchor for r in log] == ["aten.amax.default", "aten.sum.dim_IntList"]
    from hexlayout.ops.row_reduce.kernels import MAX_ROW

    torch._dynamo.reset()                                 # rows too long: one softmax op, left to torch
    plan = explain(sm, torch.randn(1, MAX_ROW + 8, dtype=torch.float16))
    assert plan.kernels == [] and [f.op for f in plan.fallbacks] == ["aten._softmax.default"], plan

    class ColSum(nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x.sum(1, keepdim=True) * 2
    torch._dynamo.reset()
    plan = explain(ColSum(), x)
    assert "last dimension" in {f.op: f.reason for f in plan.fallbacks}["aten.sum.dim_IntList"], plan
