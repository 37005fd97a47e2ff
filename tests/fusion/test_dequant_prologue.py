"""Dequantization prologues as models write them, fused into the GEMM's B-operand load:
``x @ (w_q.to(dtype) * scale).T`` and ``F.linear(x, ...)`` with int8 or fp8 (e4m3, e5m2)
weights, per-output-channel scales ``[N, 1]`` or ``[N]`` (cast, then ``[:, None]``), and a
zero point subtracted. One launch (no separate elementwise kernel), nothing left to torch;
within 1e-2 of max|eager| of eager and of float64 (tiny shapes, the emulator)."""

from __future__ import annotations

import warnings

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from hexlayout.fusion.fused_op import FusionWarning  # noqa: E402
from hexlayout.fusion.plan import GraphPlan  # noqa: E402
from hexlayout.runtime.launch_log import launch_log  # noqa: E402

N, K = 64, 64


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    torch._dynamo.reset()


def _weights(kind: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(1)
    if kind == "int8":
        return torch.randint(-127, 128, (N, K), dtype=torch.int8, generator=g)
    fp8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}[kind]
    return (torch.randn(N, K, generator=g) * 4).to(fp8)


def _matmul_scale_n1(wq: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor | None):
    """``x @ (w.to(dtype) * scale[N, 1]).T`` (the zero point ``[N, 1]`` subtracted first)."""
    def f(x: torch.Tensor) -> torch.Tensor:
        w = wq.to(x.dtype)
        if zp is not None:
            w = w - zp.to(x.dtype)
        return x @ (w * scale.to(x.dtype)).T
    return f


def _linear_scale_n(wq: torch.Tensor, scale: torch.Tensor, zp: torch.Tensor | None):
    """``F.linear(x, w.to(dtype) * scale.to(dtype)[:, None])`` (scale ``[N]``, float32)."""
    def f(x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, wq.to(x.dtype) * scale.to(x.dtype)[:, None])
    return f


CASES = [("int8", _matmul_scale_n1, torch.float16, False), ("int8", _linear_scale_n, torch.bfloat16, False),
         ("int8", _matmul_scale_n1, torch.bfloat16, True), ("e4m3", _matmul_scale_n1, torch.bfloat16, False),
         ("e5m2", _matmul_scale_n1, torch.float16, False)]


IDS = [f"{k}-{f.__name__[1:]}-{str(d)[6:]}{'-zp' if z else ''}" for k, f, d, z in CASES]


@pytest.mark.parametrize("kind,form,dtype,zero_point", CASES, ids=IDS)
def test_dequant_prologue_is_fused(kind: str, form, dtype: torch.dtype, zero_point: bool) -> None:
    g = torch.Generator().manual_seed(2)
    wq = _weights(kind)
    n1 = form is _matmul_scale_n1
    scale = torch.rand(N, 1, generator=g) * 0.02 + 0.005
    scale = scale if n1 else scale[:, 0].contiguous()
    zp = torch.randint(-3, 4, (N, 1), generator=g).float() if zero_point else None
    fn = form(wq, scale, zp)
    x = torch.randn(2, 8, K, generator=g).to(dtype)
    plans: list[GraphPlan] = []
    c = torch.compile(fn, backend="hexlayout", options={"fallback": "eager", "on_plan": plans.append})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FusionWarning)
        with launch_log() as log:
            out = c(x)
        ref = fn(x)
    plan = GraphPlan.merge(plans)
    assert len(log) == 1 and len(plan.kernels) == 1 and plan.fallbacks == [], plan
    assert log[0].name.startswith(plan.kernels[0].name)
    assert {"aten._to_copy.default", "aten.mul.Tensor"} <= set(log[0].prologue), log[0]
    assert ("aten.sub.Tensor" in log[0].prologue) == zero_point
    w64 = wq.to(torch.float64) if kind == "int8" else wq.to(torch.float32).double()
    if zp is not None:
        w64 = w64 - zp.double()
    want = x.double() @ (w64 * scale.double().reshape(N, 1)).T
    assert out.shape == ref.shape and out.dtype == ref.dtype
    tol = 1e-2 * ref.float().abs().max().item()
    assert (out.float() - ref.float()).abs().max().item() <= tol
    assert (out.double() - want).abs().max().item() <= tol


# --- per-group scales and zero points, as models write them (``w.view(N, K/g, g)``) ----------------

def _per_group(wq: torch.Tensor, g: int, scale: torch.Tensor, zp: torch.Tensor | None, zp_where: str,
               linear: bool, pos: torch.Tensor | None):
    """``((w.view(N, K/g, g).to(dtype) - zero) * scale[N, K/g, 1]).view(N, K)``: the zero point
    per group ``[N, K/g, 1]`` (``zp_where="group"``) or per channel ``[N, 1]`` subtracted
    before the view (``"channel"``); ``pos``: a factor per position in a group ``[g]``."""
    def f(x: torch.Tensor) -> torch.Tensor:
        w = wq.to(x.dtype)
        if zp is not None and zp_where == "channel":
            w = w - zp.to(x.dtype)
        w = w.view(N, K // g, g)
        if zp is not None and zp_where == "group":
            w = w - zp.to(x.dtype)
        w = w * scale.to(x.dtype)
        if pos is not None:
            w = w * pos.to(x.dtype)
        w = w.view(N, K)
        return F.linear(x, w) if linear else x @ w.T
    return f


GROUP_CASES = [("int8", 16, torch.float16, None, False, False),
               ("int8", 32, torch.bfloat16, "group", True, False),
               ("e4m3", 16, torch.bfloat16, "channel", False, False),
               ("e5m2", 8, torch.float16, "group", True, True)]
GROUP_IDS = [f"{k}-g{g}-{str(d)[6:]}{'-zp_' + z if z else ''}-{'linear' if lin else 'matmul'}"
             f"{'-pos' if p else ''}" for k, g, d, z, lin, p in GROUP_CASES]


@pytest.mark.parametrize("kind,g,dtype,zp_where,linear,per_position", GROUP_CASES, ids=GROUP_IDS)
def test_per_group_dequant_prologue_is_fused(kind: str, g: int, dtype: torch.dtype, zp_where: str | None,
                                             linear: bool, per_position: bool) -> None:
    gen = torch.Generator().manual_seed(3)
    wq = _weights(kind)
    scale = (torch.rand(N, K // g, 1, generator=gen) * 0.02 + 0.005).to(dtype)
    zp = None
    if zp_where == "group":
        zp = torch.randint(-3, 4, (N, K // g, 1), generator=gen).to(dtype)
    elif zp_where == "channel":
        zp = torch.randint(-3, 4, (N, 1), generator=gen).float()
    pos = torch.rand(g, generator=gen) + 0.5 if per_position else None
    fn = _per_group(wq, g, scale, zp, zp_where or "", linear, pos)
    x = torch.randn(*((2, 4) if linear else (8,)), K, generator=gen).to(dtype)
    plans: list[GraphPlan] = []
    c = torch.compile(fn, backend="hexlayout", options={"fallback": "eager", "on_plan": plans.append})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FusionWarning)
        with launch_log() as log:
            out = c(x)
        ref = fn(x)
    plan = GraphPlan.merge(plans)
    # one launch, every op of the dequantization in its prologue (nothing left to torch)
    assert len(log) == 1 and len(plan.kernels) == 1 and plan.fallbacks == [], plan.report()
    assert {"aten._to_copy.default", "aten.mul.Tensor", "aten.view.default"} <= set(log[0].prologue), log[0]
    assert ("aten.sub.Tensor" in log[0].prologue) == (zp is not None), log[0]
    w64 = wq.to(torch.float64) if kind == "int8" else wq.to(torch.float32).double()
    if zp is not None and zp_where == "channel":
        w64 = w64 - zp.double()
    w64 = w64.view(N, K // g, g)
    if zp is not None and zp_where == "group":
        w64 = w64 - zp.double()
    w64 = w64 * scale.double()
    if pos is not None:
        w64 = w64 * pos.double()
    want = x.double() @ w64.view(N, K).T
    assert out.shape == ref.shape and out.dtype == ref.dtype
    tol = 1e-2 * ref.float().abs().max().item()
    assert (out.float() - ref.float()).abs().max().item() <= tol
    assert (out.double() - want).abs().max().item() <= tol


# --- int4 weights packed into int32 words or bytes, unpacked as models write it --------------------

def _int4(packed: torch.Tensor, shifts: torch.Tensor, g: int, scale: torch.Tensor, zero: torch.Tensor | None,
          linear: bool):
    """``((packed[..., None] >> shifts) & 0xF).view(N, K)`` (eight nibbles per int32 word or
    two per byte), minus 8 or a per-group zero point, times per-group scales."""
    def f(x: torch.Tensor) -> torch.Tensor:
        w = ((packed.unsqueeze(-1) >> shifts) & 0xF).view(N, K).to(x.dtype)
        w = (w - 8) if zero is None else w
        w = w.view(N, K // g, g)
        if zero is not None:
            w = w - zero.to(x.dtype)
        w = (w * scale.to(x.dtype)).view(N, K)
        return F.linear(x, w) if linear else x @ w.T
    return f


@pytest.mark.parametrize("word,dtype,zero_tensor,linear", [(torch.int32, torch.float16, False, False),
                                                           (torch.uint8, torch.bfloat16, True, True)],
                         ids=["int32-f16-zero8-matmul", "uint8-bf16-zero_group-linear"])
def test_int4_unpacking_is_fused(word: torch.dtype, dtype: torch.dtype, zero_tensor: bool,
                                 linear: bool) -> None:
    gen = torch.Generator().manual_seed(4)
    per = 8 if word == torch.int32 else 2
    g = 16
    nib = torch.randint(0, 16, (N, K // per, per), generator=gen)
    packed = torch.zeros(N, K // per, dtype=torch.int64)
    for j in range(per):
        packed |= nib[..., j] << (4 * j)
    packed = packed.to(word)                # int32 words with the top nibble >= 8 are negative
    shifts = torch.arange(0, 4 * per, 4, dtype=word)
    scale = (torch.rand(N, K // g, 1, generator=gen) * 0.02 + 0.005).to(dtype)
    zero = torch.randint(6, 10, (N, K // g, 1), generator=gen).to(dtype) if zero_tensor else None
    fn = _int4(packed, shifts, g, scale, zero, linear)
    x = torch.randn(*((2, 4) if linear else (8,)), K, generator=gen).to(dtype)
    plans: list[GraphPlan] = []
    c = torch.compile(fn, backend="hexlayout", options={"fallback": "eager", "on_plan": plans.append})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FusionWarning)
        with launch_log() as log:
            out = c(x)
        ref = fn(x)
    plan = GraphPlan.merge(plans)
    assert len(log) == 1 and len(plan.kernels) == 1 and plan.fallbacks == [], plan.report()
    assert {"aten.__rshift__.Tensor", "aten.bitwise_and.Scalar", "aten.sub.Tensor"} <= set(log[0].prologue)
    w64 = nib.reshape(N, K).double().view(N, K // g, g)        # the nibbles, independent of the packing
    w64 = (w64 - (8.0 if zero is None else zero.double())) * scale.double()
    want = x.double() @ w64.view(N, K).T
    tol = 1e-2 * ref.float().abs().max().item()
    assert (out.float() - ref.float()).abs().max().item() <= tol
    assert (out.double() - want).abs().max().item() <= tol


@pytest.mark.parametrize("dtype,fields", [(torch.float16, 2), (torch.bfloat16, 4)],
                         ids=["f16-nibbles", "bf16-crumbs"])
def test_stacked_unpacking_is_fused(dtype: torch.dtype, fields: int) -> None:
    """``torch.stack([p & m, (p >> b) & m, ...], -1).view(N, K)``: the fields of each byte
    stacked along a new last dimension (two nibbles, or four 2-bit fields), per-group scales:
    the stack becomes one-hot products of per-group fields (``fusion_unstack``), one launch."""
    gen = torch.Generator().manual_seed(6)
    bits, g = 8 // fields, 16
    vals = torch.randint(0, 2 ** bits, (N, K // fields, fields), generator=gen)
    packed = torch.zeros(N, K // fields, dtype=torch.int64)
    for j in range(fields):
        packed |= vals[..., j] << (bits * j)
    packed = packed.to(torch.uint8)
    mask, mid = 2 ** bits - 1, 2 ** (bits - 1)
    scale = (torch.rand(N, K // g, 1, generator=gen) * 0.02 + 0.005).to(dtype)

    def fn(x: torch.Tensor) -> torch.Tensor:
        w = torch.stack([(packed >> (bits * j)) & mask if j else packed & mask for j in range(fields)], -1)
        w = (w.view(N, K).to(x.dtype) - mid).view(N, K // g, g) * scale
        return F.linear(x, w.view(N, K))

    x = torch.randn(2, 3, K, generator=gen).to(dtype)
    plans: list[GraphPlan] = []
    c = torch.compile(fn, backend="hexlayout", options={"fallback": "eager", "on_plan": plans.append})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FusionWarning)
        with launch_log() as log:
            out = c(x)
        ref = fn(x)
    plan = GraphPlan.merge(plans)
    assert len(log) == 1 and len(plan.kernels) == 1 and plan.fallbacks == [], plan.report()
    assert "aten.bitwise_and.Scalar" in log[0].prologue, log[0]
    assert any(n.startswith(f"unpack: stack of {fields} fields") for n in plan.notes), plan.report()
    w64 = ((vals.reshape(N, K).double() - mid).view(N, K // g, g) * scale.double()).view(N, K)
    want = x.double() @ w64.T
    tol = 1e-2 * ref.float().abs().max().item()
    assert (out.float() - ref.float()).abs().max().item() <= tol
    assert (out.double() - want).abs().max().item() <= tol


def test_stack_onehot_and_what_is_not_unstacked() -> None:
    """The one-hot constants; float stacks and stacks along another dimension stay stacks."""
    from hexlayout.ops.gemm.fusion_unstack import _stacked, stack_onehot

    e = stack_onehot(4, 2, 2, torch.uint8, "cpu")
    assert e.shape == (1, 1, 4) and e.tolist() == [[[0, 0, 1, 0]]]
    assert stack_onehot(4, 2, 2, torch.uint8, "cpu") is e
    gm = torch.fx.symbolic_trace(lambda a, b: torch.stack([a, b], -1))
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            n.meta["val"] = torch.zeros(3, 4, dtype=torch.uint8)
    (st,) = [n for n in gm.graph.nodes if n.op == "call_function"]
    st.target = torch.ops.aten.stack.default
    assert _stacked(st) is not None
    for dtype, dim in ((torch.float16, -1), (torch.uint8, 0)):
        for n in gm.graph.nodes:
            if n.op == "placeholder":
                n.meta["val"] = torch.zeros(3, 4, dtype=dtype)
        st.args = (st.args[0], dim)
        assert _stacked(st) is None, (dtype, dim)


def _grouped_specs() -> list:
    """The specs the front end makes of a per-group int8 dequantization with a zero point and of
    an int4 unpacking (group 32, inputs in the flattened frame of groups)."""
    from hexlayout.fusion import FusedSpec, Node, Prologue

    g = 32

    def cast(ref: tuple) -> Node:
        return Node("aten._to_copy.default", (ref,), (("dtype", "f16"),))

    int8 = FusedSpec("aten.linear.default", prologues=(Prologue(1, (
        cast(("input", 0)), cast(("input", 1)), Node("aten.sub.Tensor", (("node", 0), ("input", 2))),
        Node("aten.mul.Tensor", (("node", 2), ("node", 1))),
        Node("aten.view.default", (("node", 3), ("const", (N, K // g, g)))),
        Node("aten.view.default", (("node", 4), ("const", (N, K))))), 5),))
    int4 = FusedSpec("aten.linear.default", prologues=(Prologue(1, (
        Node("aten.__rshift__.Tensor", (("input", 0), ("input", 1))),
        Node("aten.bitwise_and.Scalar", (("node", 0), ("const", 15))),
        Node("aten.view.default", (("node", 1), ("const", (N, K)))), cast(("node", 2)),
        Node("aten.sub.Tensor", (("node", 3), ("const", 8))),
        Node("aten.view.default", (("node", 4), ("const", (N * K // g, g)))),
        Node("aten.mul.Tensor", (("node", 5), ("input", 2))),
        Node("aten.view.default", (("node", 6), ("const", (N, K))))), 7),))
    scale = torch.rand(N * K // g, 1).half()
    return [(int8, [torch.randint(-127, 128, (N * K // g, g), dtype=torch.int8), scale.float(), scale]),
            (int4, [torch.randint(0, 2 ** 31 - 1, (N * K // 8, 1), dtype=torch.int32),
                    torch.arange(0, 32, 4, dtype=torch.int32).view(1, 8), scale])]


@pytest.mark.nvrtc
@pytest.mark.parametrize("case,arch", [(0, "sm_90a"), (1, "sm_80")], ids=["int8-group-sm_90a", "int4-sm_80"])
def test_grouped_prologues_compile_without_spills(case: int, arch: str,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """At production tile sizes the gathered per-group inputs take ``BK = 32`` (at 64 the int8
    one spills on sm_80) and compile without spills."""
    from hexlayout.ops.gemm.fusion import anchor_consts, fused_build
    from hexlayout.ops.gemm.fusion_plan import plan_call

    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    spec, inputs = _grouped_specs()[case]
    call = plan_call(spec, [torch.randn(64, K).half(), None], inputs)
    assert any(s.group for s in call.plan.inputs) and (case == 0 or any(s.period for s in call.plan.inputs))
    call.m = call.n = call.k = 4096
    consts = anchor_consts(call)
    assert consts["BK"] == 32, consts
    bld, _ = fused_build(spec, call, consts, compile=True)
    res = bld.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0, res
