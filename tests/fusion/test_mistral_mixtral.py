"""Mistral and Mixtral layers as HF writes them, compiled with the hexlayout backend
(emulator, hidden 64, seq 8): Mistral's sliding-window mask built from positions is computed
in the attention kernel (no mask tensor, nothing left to torch but RoPE and free views);
Mixtral's experts in the dense "gather the top-k experts' weights" form are one
``fused_moe`` call (the norm before them recomputed in its prologue and the router GEMM's,
the residual after them in its sum kernel, the routing left to torch: 5 kernels per layer),
and HF's per-expert loop (graph breaks at its data-dependent
``torch.where``) still compiles and agrees. Each within 1e-2 of max|eager| of eager and of
float64."""

from __future__ import annotations

import copy
import warnings

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from hexlayout.fusion.fused_op import FusionWarning  # noqa: E402
from hexlayout.fusion.plan import GraphPlan  # noqa: E402
from hexlayout.runtime.launch_log import launch_log  # noqa: E402
from tests.fusion.test_decoder_layers import Layer, close, compile_and_run  # noqa: E402

WINDOW = 3


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    torch._dynamo.reset()


def sliding_window_mask(t: int, sk: int, window: int, form: str, dtype: torch.dtype) -> torch.Tensor:
    """HF's Mistral masks: ``"bool"`` as ``masking_utils.sdpa_mask`` builds it by broadcasting
    (``kv <= q`` and ``kv > q - window``; True: attend), ``"add"`` as the older
    ``_prepare_4d_causal_attention_mask_with_cache_position`` (``full(min)`` times the keys
    that are in the future or out of the window)."""
    cache_position = torch.arange(t)
    if form == "bool":
        q, kv = cache_position[None, None, :, None], torch.arange(sk)[None, None, None, :]
        return (kv <= q) & (kv > q - window)
    mask = torch.full((t, sk), fill_value=torch.finfo(dtype).min, dtype=dtype)
    hidden = torch.arange(sk) > cache_position.reshape(-1, 1)
    hidden.bitwise_or_(torch.arange(sk) <= (cache_position.reshape(-1, 1) - window))
    mask *= hidden
    return mask[None, None, :, :]


class Mistral(Layer):
    """The Llama layer with Mistral's sliding-window attention (``WINDOW`` keys) through a
    mask built from positions in the layer (``form``: boolean or additive)."""

    def __init__(self, form: str) -> None:
        super().__init__("llama")
        self.form = form

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """The sliding window (form ``"none"``: Llama's plain causal attention)."""
        if self.form == "none":
            return super().attend(q, k, v)
        t = q.shape[2]
        mask = sliding_window_mask(t, t, WINDOW, self.form, q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True)


@pytest.mark.parametrize("form,dtype", [("bool", torch.float16), ("add", torch.bfloat16)],
                         ids=["bool-f16", "additive-bf16"])
def test_mistral_sliding_window_layer(form: str, dtype: torch.dtype) -> None:
    """5 launches as Llama's; the window's mask (aranges, comparisons, views) is the
    attention kernel's prologue, computed from its positions (no mask tensor read)."""
    torch.manual_seed(1)
    m = Mistral(form).to(dtype).eval()
    x = torch.randn(2, 8, 64, dtype=dtype)
    pos = torch.arange(8)[None].expand(2, 8)
    run = compile_and_run(m, x, pos)
    plan, log = run.plan, run.log
    assert len(log) == len(plan.kernels) == 5, plan
    (att,) = [r for r in log if "sdpa" in r.name]
    assert att.name.endswith("_index_mask") and "aten.arange.default" in att.prologue, att
    assert not {"aten.arange.default", "aten.full.default", "aten.le.Tensor", "aten.gt.Tensor",
                "aten.where.self"} & {f.op for f in plan.fallbacks}, plan
    close(run.out, run.ref, run.want)
    causal = copy.deepcopy(m).double()
    causal.form = "none"          # the window matters: plain causal attention differs
    with torch.no_grad():
        diff = (run.want - causal(x.double(), pos)).abs().max().item()
    assert diff > 1e-2 * run.want.abs().max().item()


def _route(gate: nn.Linear, x: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Mixtral's routing as HF writes it: softmax in f32, top-k, renormalised, cast back."""
    logits = gate(x)
    w = F.softmax(logits, dim=1, dtype=torch.float)
    w, ids = torch.topk(w, k, dim=-1)
    w /= w.sum(dim=-1, keepdim=True)
    return w.to(x.dtype), ids, logits


class GatheredMoE(nn.Module):
    """The experts in the "topk + index" form: each token's top-k experts' weights gathered
    (``w1[ids]``), contracted with ``einsum``, combined with the routing weights.
    ``transposed``: ``w1`` / ``w3`` stored ``[E, H, I]`` and ``w2`` ``[E, I, H]``."""

    def __init__(self, h: int = 64, inter: int = 128, experts: int = 4, k: int = 2,
                 transposed: bool = False) -> None:
        super().__init__()
        self.gate, self.k, self.transposed = nn.Linear(h, experts, bias=False), k, transposed
        up, down = ((experts, h, inter), (experts, inter, h)) if transposed else \
            ((experts, inter, h), (experts, h, inter))
        self.w1, self.w3 = (nn.Parameter(torch.randn(up) * 0.1) for _ in range(2))
        self.w2 = nn.Parameter(torch.randn(down) * 0.1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, h = x.shape
        x = x.view(-1, h)
        w, ids, _ = _route(self.gate, x, self.k)
        if self.transposed:
            g = F.silu(torch.einsum("ti,taio->tao", x, self.w1[ids]))
            y = torch.einsum("tao,taoi->tai", g * torch.einsum("ti,taio->tao", x, self.w3[ids]), self.w2[ids])
        else:
            g = F.silu(torch.einsum("ti,taoi->tao", x, self.w1[ids]))
            y = torch.einsum("tao,taio->tai", g * torch.einsum("ti,taoi->tao", x, self.w3[ids]), self.w2[ids])
        return torch.einsum("tai,ta->ti", y, w).view(b, t, h)


@pytest.mark.parametrize("dtype,transposed", [(torch.float16, False), (torch.bfloat16, True)],
                         ids=["f16", "bf16-transposed-weights"])
def test_gathered_experts_are_one_fused_moe(dtype: torch.dtype, transposed: bool) -> None:
    """The gathers, the three contractions, SiLU * up and the weighted sum over k: one
    ``fused_moe`` (its alignment, gate-up, down and sum kernels; the weights concatenated
    once); the routing is torch's (the router GEMM's N = 4 experts is not a multiple of 8)."""
    torch.manual_seed(2)
    m = GatheredMoE(transposed=transposed).to(dtype).eval()
    x = torch.randn(1, 8, 64, dtype=dtype)
    run = compile_and_run(m, x)
    plan, log = run.plan, run.log
    assert [k.anchor for k in plan.kernels].count("hexlayout.fused_moe.default") == 1, plan
    assert any(n.startswith("moe: the experts of gathered weights") for n in plan.notes), plan
    left = {f.op for f in plan.fallbacks}
    assert not {"aten.index.Tensor", "aten.bmm.default", "aten.silu.default"} & left, plan
    names = [r.name for r in log]
    assert [n.split("_")[1] for n in names if n.startswith("moe_") and "align" not in n] == \
        ["gate", "down", "sum"], names                  # one launch each: every expert, every token
    close(run.out, run.ref, run.want)
    with torch.no_grad():               # the re-laid-out weights follow an in-place update
        m.w3.mul_(-0.5)
        out, ref = run.fn(x), m(x)
        close(out, ref, copy.deepcopy(m).double()(x.double()))


class Expert(nn.Module):
    def __init__(self, h: int, inter: int) -> None:
        super().__init__()
        self.w1, self.w3 = nn.Linear(h, inter, bias=False), nn.Linear(h, inter, bias=False)
        self.w2 = nn.Linear(inter, h, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class HFSparseMoE(nn.Module):
    """transformers' ``MixtralSparseMoeBlock.forward``: the loop over the experts hit,
    ``torch.where(expert_mask[e])``, ``hidden[top_x]``, the expert MLP times
    ``routing_weights[top_x, idx, None]``, ``index_add_``."""

    def __init__(self, h: int = 64, inter: int = 128, experts: int = 4, k: int = 2) -> None:
        super().__init__()
        self.gate, self.k, self.n = nn.Linear(h, experts, bias=False), k, experts
        self.experts = nn.ModuleList(Expert(h, inter) for _ in range(experts))

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        b, t, h = hidden_states.shape
        hidden_states = hidden_states.view(-1, h)
        routing_weights, selected, _ = _route(self.gate, hidden_states, self.k)
        final = torch.zeros((b * t, h), dtype=hidden_states.dtype, device=hidden_states.device)
        expert_mask = F.one_hot(selected, num_classes=self.n).permute(2, 1, 0)
        expert_hit = torch.greater(expert_mask.sum(dim=(-1, -2)), 0).nonzero()
        for expert_idx in expert_hit:
            idx, top_x = torch.where(expert_mask[expert_idx].squeeze(0))
            cur = hidden_states[None, top_x].reshape(-1, h)
            cur = self.experts[expert_idx](cur) * routing_weights[top_x, idx, None]
            final.index_add_(0, top_x, cur.to(hidden_states.dtype))
        return final.reshape(b, t, h)


class HFRangeLoopMoE(HFSparseMoE):
    """The older transformers loop, ``for expert_idx in range(num_experts)``: unrolled by
    dynamo when it captures ``nonzero`` (``capture_dynamic_output_shape_ops``)."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        b, t, h = hidden_states.shape
        hidden_states = hidden_states.view(-1, h)
        routing_weights, selected, _ = _route(self.gate, hidden_states, self.k)
        final = torch.zeros((b * t, h), dtype=hidden_states.dtype, device=hidden_states.device)
        expert_mask = F.one_hot(selected, num_classes=self.n).permute(2, 1, 0)
        for expert_idx in range(self.n):
            idx, top_x = torch.where(expert_mask[expert_idx])
            cur = hidden_states[None, top_x].reshape(-1, h)
            cur = self.experts[expert_idx](cur) * routing_weights[top_x, idx, None]
            final.index_add_(0, top_x, cur.to(hidden_states.dtype))
        return final.reshape(b, t, h)


def test_hf_range_loop_in_one_graph_is_one_fused_moe() -> None:
    """With dynamo capturing ``nonzero``, HF's loop over ``range(E)`` is one graph: its
    experts (the ``torch.where`` selections, the gathers of tokens, each expert's MLP, the
    ``index_add`` chain) become one ``fused_moe`` over the experts' weights stacked once."""
    torch.manual_seed(4)
    m = HFRangeLoopMoE().to(torch.bfloat16).eval()
    x = torch.randn(1, 8, 64, dtype=torch.bfloat16)
    with torch._dynamo.config.patch(capture_dynamic_output_shape_ops=True, capture_scalar_outputs=True):
        run = compile_and_run(m, x)
    plan, log = run.plan, run.log
    assert [k.anchor for k in plan.kernels].count("hexlayout.fused_moe.default") == 1, plan
    assert any(n.startswith("moe: HF's per-expert loop (4 experts") for n in plan.notes), plan
    left = {f.op for f in plan.fallbacks}
    assert not {"aten.nonzero.default", "aten.index_add.default", "aten.index.Tensor",
                "aten.silu.default"} & left, plan
    names = [r.name for r in log]
    assert [n.split("_")[1] for n in names if n.startswith("moe_") and "align" not in n] == \
        ["gate", "down", "sum"], names
    close(run.out, run.ref, run.want)


def test_hf_expert_loop_compiles_and_agrees() -> None:
    """HF's loop: dynamo breaks the graph at ``nonzero`` / ``torch.where`` (data-dependent
    sizes), so each expert's MLP is a graph of its own - 2 GEMM kernels per expert hit
    (gate / up as one, down) - and the routing and ``index_add_`` are torch's."""
    torch.manual_seed(3)
    m = HFSparseMoE().to(torch.float16).eval()
    x = torch.randn(1, 8, 64, dtype=torch.float16)
    run = compile_and_run(m, x, strict=False)
    log = run.log
    hit = int(F.one_hot(_route(m.gate, x.view(-1, 64), 2)[1], 4).sum((0, 1)).gt(0).sum())
    gemms = [r for r in log if r.anchor in ("aten.linear.default", "aten.mm.default")]
    assert len(gemms) == 2 * hit, [r.name for r in log]
    assert not any(r.name.startswith("moe_") for r in log)
    notes = run.plan.notes
    assert any(n.startswith("moe: the top-k ids become a one-hot expert mask") for n in notes), notes
    close(run.out, run.ref, run.want)


def test_window_with_a_padding_mask_is_read_from_memory() -> None:
    """A window mask ANDed with a padding mask (a tensor input) is not a program of positions:
    torch builds it, the kernel reads it as a boolean mask, and the aranges are listed as left
    to torch."""
    g = torch.Generator().manual_seed(4)
    q = torch.randn(2, 4, 8, 16, generator=g).half()
    k, v = (torch.randn(2, 2, 8, 16, generator=g).half() for _ in range(2))
    pad = torch.ones(2, 8, dtype=torch.bool)
    pad[1, :2] = False                   # the second sequence starts with two padding keys

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pad: torch.Tensor) -> torch.Tensor:
        m = sliding_window_mask(8, 8, WINDOW, "bool", q.dtype) & pad[:, None, None, :]
        m = m | torch.eye(8, dtype=torch.bool)             # every row sees a key
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)

    plans: list[GraphPlan] = []
    c = torch.compile(f, backend="hexlayout", options={"fallback": "eager", "on_plan": plans.append})
    with launch_log() as log:
        out = c(q, k, v, pad)
    plan = GraphPlan.merge(plans)
    (rec,) = log
    assert rec.name.endswith("_bool_mask"), rec
    assert "aten.arange.default" in {f_.op for f_ in plan.fallbacks}, plan
    want = f(q, k, v, pad)
    assert (out.float() - want.float()).abs().max().item() <= 1e-2 * want.float().abs().max().item()


def _window_program(window: int) -> tuple:
    """``(kv <= q) & (kv > q - window)`` as spec nodes: ``q`` an ``arange`` on the query axis
    (``[S, 1]``), ``kv`` one on the key axis."""
    from hexlayout.fusion.spec import Node

    return (Node("aten.arange.default", (("const", 8),), (("dtype", "s64"),)),
            Node("aten.unsqueeze.default", (("node", 0), ("const", 1))),
            Node("aten.arange.default", (("const", 8),), (("dtype", "s64"),)),
            Node("aten.le.Tensor", (("node", 2), ("node", 1))),
            Node("aten.sub.Tensor", (("node", 1), ("const", window))),
            Node("aten.gt.Tensor", (("node", 2), ("node", 4))),
            Node("aten.bitwise_and.Tensor", (("node", 3), ("node", 5))))


def test_index_mask_axes_and_refusals() -> None:
    """Which arange indexes queries and which keys comes from where its dimension lands; a
    program that reads a tensor, or puts a position on a batch / head dimension, is not one."""
    from hexlayout.ops.attention.index_mask import IndexMask

    from hexlayout.fusion.reference import eval_nodes
    from hexlayout.fusion.spec import Node

    nodes = _window_program(WINDOW)
    fn = IndexMask.of(nodes, 6)
    assert fn is not None and fn.boolean and (fn.axes[0], fn.axes[2]) == ("q", "k")
    assert fn.key_bounds() == (-(WINDOW - 1), 0)         # i - W < j <= i
    got = eval_nodes(nodes, None, [])[6]
    assert torch.equal(got, sliding_window_mask(8, 8, WINDOW, "bool", torch.float16)[0, 0])
    reads = nodes[:6] + (Node("aten.bitwise_and.Tensor", (("node", 3), ("input", 0))),)
    assert IndexMask.of(reads, 6) is None
    on_heads = nodes + (Node("aten.view.default", (("node", 0), ("const", (8, 1, 1)))),
                        Node("aten.le.Tensor", (("node", 7), ("node", 6))))
    assert IndexMask.of(on_heads, 8) is None


@pytest.mark.nvrtc
def test_index_mask_kernel_compiles_without_spills() -> None:
    """NVRTC, sm_80: the GPU configuration of the f16 kernel with the sliding window computed
    from positions (comparisons and predicates of the position tiles) keeps everything in
    registers."""
    from hexlayout.ops.attention.index_mask import IndexMask
    from hexlayout.ops.attention.sdpa_anchor import sdpa_consts, sdpa_kernel

    import hexlayout.lang as hl
    from hexlayout.runtime import build

    fn = IndexMask.of(_window_program(128), 6)
    tk = sdpa_kernel(hl.f16, "index", mask_fn=fn).trace(**sdpa_consts(512, 512, 128, False, False))
    res = build(tk, "sm_80").compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, res


class Mixtral(Mistral):
    """Mistral's attention (boolean window) and a MoE block of 8 gathered experts, top-2."""

    def __init__(self) -> None:
        super().__init__("bool")
        self.moe = GatheredMoE(experts=8)
        del self.gate, self.up, self.down

    def mlp(self, h: torch.Tensor) -> torch.Tensor:
        return self.moe(h)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_mixtral_layer_launches_and_values(dtype: torch.dtype) -> None:
    """5 kernels, the anchors: QKV (norm prologue, RoPE epilogue), attention (window from
    positions), o_proj + residual, the router GEMM and ``fused_moe`` - the second norm,
    read by both, recomputed in each one's prologue (the router's rows in its A tiles;
    ``fused_moe``'s row scale in its gate-up kernel, the norm weight folded into ``w13``), the
    residual add after the experts in ``fused_moe``'s top-k sum kernel (7 launches: 4
    alignment, gate-up, down, sum); the routing (softmax, topk, renormalisation) is torch's,
    listed with its reason."""
    torch.manual_seed(5)
    m = Mixtral().to(dtype).eval()
    x = torch.randn(2, 8, 64, dtype=dtype)
    pos = torch.arange(8)[None].expand(2, 8)
    plans: list[GraphPlan] = []
    c = torch.compile(m, backend="hexlayout", options={"fallback": "eager", "on_plan": plans.append})
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FusionWarning)
        with launch_log() as log:
            out = c(x, pos)
        ref = m(x, pos)
        want = copy.deepcopy(m).double()(x.double(), pos)
    plan = GraphPlan.merge(plans)
    names = [r.name for r in log]
    assert len(plan.kernels) == 5 and len(log) == 5 + 6, names
    (moe,) = [k for k in plan.kernels if k.anchor == "hexlayout.fused_moe.default"]
    norm = {"aten.mean.dim", "aten.rsqrt.default", "aten.pow.Tensor_Scalar"}
    assert norm <= set(moe.prologue) and "aten.add.Tensor" in moe.epilogue, moe
    assert sum(norm <= set(k.prologue) for k in plan.kernels) == 3, plan     # QKV, router, experts
    assert any(n.startswith("moe_gate_up") and n.endswith("_row_scaled") for n in names), names
    assert names[-1].endswith("__moe_sum_" + ("f16" if dtype == torch.float16 else "bf16")), names
    left = {f.op: f.reason for f in plan.fallbacks}
    assert not {"aten.mean.dim", "aten.rsqrt.default", "aten.pow.Tensor_Scalar"} & set(left), plan
    assert left["aten.amax.default"].startswith("MoE routing over 8 experts"), plan
    assert all(r.anchor is not None for r in log if not r.name.startswith("moe_")), names
    close(out, ref, want)


@pytest.mark.parametrize("form", ["bool", "add"])
def test_window_skips_key_blocks_and_agrees(form: str) -> None:
    """40 queries and keys, a window of 5, 16-key blocks in the emulator: query blocks 1 and
    2 start at key block 1 (the mask's bounds ``i - 4 <= j <= i``), and every row agrees with
    float64 attention over its window."""
    g = torch.Generator().manual_seed(6)
    q = torch.randn(1, 2, 40, 16, generator=g).to(torch.bfloat16)
    k, v = (torch.randn(1, 2, 40, 16, generator=g).to(torch.bfloat16) for _ in range(2))

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        m = sliding_window_mask(40, 40, 5, form, q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=m)

    c = torch.compile(f, backend="hexlayout", options={"fallback": "eager"})
    with launch_log() as log:
        out = c(q, k, v)
    (rec,) = log
    assert rec.name.endswith("_index_mask"), rec
    i = torch.arange(40)
    visible = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - 5)
    s = (q.double() @ k.double().transpose(-1, -2)) * 16 ** -0.5
    ref = s.masked_fill(~visible, float("-inf")).softmax(-1) @ v.double()
    assert (out.double() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()


def test_window_mask_with_dynamic_lengths_shares_one_build() -> None:
    """Sequence lengths 8, then 12 and 20 (dynamo makes the length symbolic): the mask's
    aranges and sizes are symbolic, the spec holds them as None, so the dynamic graph's
    kernel - the window still computed from positions - is one build for both lengths."""
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        mask = sliding_window_mask(q.shape[2], q.shape[2], WINDOW, "bool", q.dtype)
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    c = torch.compile(f, backend="hexlayout", options={"fallback": "eager"})
    g = torch.Generator().manual_seed(7)
    recs = []
    for t in (8, 12, 20):
        q, k, v = (torch.randn(1, 2, t, 16, generator=g).half() for _ in range(3))
        with launch_log() as log:
            out = c(q, k, v)
        (rec,) = log
        recs.append(rec)
        i = torch.arange(t)
        visible = (i[None, :] <= i[:, None]) & (i[None, :] > i[:, None] - WINDOW)
        s = (q.double() @ k.double().transpose(-1, -2)) * 16 ** -0.5
        ref = s.masked_fill(~visible, float("-inf")).softmax(-1) @ v.double()
        assert (out.double() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()
    assert all(r.name.endswith("_index_mask") for r in recs), recs
    assert recs[1].build_key == recs[2].build_key and recs[1].shapes != recs[2].shapes, recs


def test_gathered_experts_with_dynamic_token_counts() -> None:
    """8, then 12 and 20 tokens (dynamo makes the count symbolic): the match follows the
    symbolic token index through the einsum's reshapes (``[2 * T, 1, I]``), so the dynamic
    graph's experts are one ``fused_moe`` too - with the norm before them in its prologue and
    the residual after them in its sum kernel, each one build for 12 and 20 tokens."""
    torch.manual_seed(8)
    m = GemmaNormMoE(k=2).to(torch.float16).eval()
    c = torch.compile(m, backend="hexlayout", options={"fallback": "eager"})
    keys = []
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("error", FusionWarning)
        for t in (8, 12, 20):
            x = torch.randn(1, t, 64, dtype=torch.float16)
            with launch_log() as log:
                out = c(x)
            names = [r.name for r in log]
            assert sum(n.startswith("moe_gate_up") and n.endswith("_row_scaled") for n in names) == 1, names
            assert names[-1].endswith("__moe_sum_f16"), names
            keys.append(log[-1].build_key)
            close(out, m(x), copy.deepcopy(m).double()(x.double()))
    assert keys[1] == keys[2], keys


def _rms_nodes(center: bool = False) -> tuple:
    """HF's RMSNorm ``w * (x.float() * rsqrt(mean(x.float() ** 2, -1) + eps)).to(f16)`` as spec
    nodes of ``("input", 0)`` (x ``[T, H]``) and ``("input", 1)`` (w ``[H]``); ``center``:
    ``x - mean`` instead (LayerNorm's centering: not a scale)."""
    from hexlayout.fusion.spec import Node

    xf = Node("aten._to_copy.default", (("input", 0),), (("dtype", "f32"),))
    sq = Node("aten.pow.Tensor_Scalar", (("node", 0), ("const", 2)))
    mean = Node("aten.mean.dim", (("node", 1), ("const", (-1,)), ("const", True)))
    eps = Node("aten.add.Tensor", (("node", 2), ("const", 1e-6)))
    rs = Node("aten.rsqrt.default", (("node", 3),))
    scale = Node("aten.sub.Tensor" if center else "aten.mul.Tensor", (("node", 0), ("node", 4)))
    half = Node("aten._to_copy.default", (("node", 5),), (("dtype", "f16"),))
    return (xf, sq, mean, eps, rs, scale, half, Node("aten.mul.Tensor", (("input", 1), ("node", 6))))


def test_moe_prologue_is_a_row_and_a_column_scale() -> None:
    """The RMSNorm of ``hidden_states``: one row scale (``rsqrt(mean(x ** 2) + eps)``, its
    ``pre`` and ``post`` evaluated here against torch) and the weight as the column scale;
    LayerNorm's ``x - mean`` is refused naming the node."""
    from hexlayout.ops.moe.fusion_prologue import column_scale, moe_prologue

    from hexlayout.fusion.reference import eval_nodes
    from hexlayout.fusion.spec import FusionUnsupported, Prologue

    g = torch.Generator().manual_seed(9)
    x, w = torch.randn(5, 32, generator=g).half(), torch.randn(32, generator=g).half()
    pro = moe_prologue(Prologue(0, _rms_nodes(), 7), [x, w], 5, 32, "k")
    (sc,) = pro.scales
    assert pro.x == 0 and sc.fn == "mean"
    pre = eval_nodes(sc.pre, None, [x.float()])[sc.pre_out]
    r = eval_nodes(sc.post, None, [pre.mean(-1, keepdim=True)])[sc.post_out]
    assert torch.allclose(r, torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6))
    assert torch.equal(column_scale(pro, [x, w], 32), w.float())
    with pytest.raises(FusionUnsupported, match="node 5 .aten.sub.Tensor"):
        moe_prologue(Prologue(0, _rms_nodes(center=True), 7), [x, w], 5, 32, "k")


@pytest.mark.parametrize("center", [False, True], ids=["rmsnorm-recomputed", "centred-stays-a-kernel"])
def test_norm_read_by_two_gemms(center: bool) -> None:
    """One norm over rows of 256 read by two GEMMs: an RMSNorm is a row factor of each product,
    so each GEMM recomputes it in its prologue (2 kernels, no norm kernel); a norm that
    subtracts the row mean is no row factor and the rows do not fit a tile (128): neither
    recomputes it, it stays a kernel of its own, and the plan says why."""
    import hexlayout.ops  # noqa: F401 - registers the anchor records
    from torch.fx.experimental.proxy_tensor import make_fx

    from hexlayout.fusion.partition import partition

    def f(x: torch.Tensor, w: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> tuple:
        xf = x.float()
        xf = xf - xf.mean(-1, keepdim=True) if center else xf
        h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).half() * w
        return h @ a.t(), h @ b.t()

    args = (torch.randn(4, 256).half(), torch.randn(256).half(), torch.randn(16, 256).half(),
            torch.randn(24, 256).half())
    part = partition(make_fx(f, tracing_mode="fake")(*args))
    anchors = [g.spec.anchor for g in part.groups]
    if not center:
        assert anchors == ["aten.linear.default"] * 2 and not part.notes, (anchors, part.notes)
        assert all(any(nd.op == "aten.mean.dim" for p in g.spec.prologues for nd in p.nodes)
                   for g in part.groups), part.groups
        return
    why = "norm: read by 2 kernels, a kernel of its own (not recomputed in each: K=256 > 128"
    assert any(n.startswith(why) for n in part.notes), part.notes
    assert anchors.count("aten.mean.dim") == 2 and len(anchors) == 4, anchors


class LayerNormMoE(nn.Module):
    """``x + experts(layer_norm(x))`` with the LayerNorm written out (f32 inside, the mean
    subtracted: no row factor), 8 gathered experts, top-2."""

    def __init__(self, h: int = 64) -> None:
        super().__init__()
        self.w = nn.Parameter(1.0 + torch.randn(h) * 0.2)
        self.moe = GatheredMoE(h=h, experts=8, k=2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        d = xf - xf.mean(-1, keepdim=True)
        h = (d * torch.rsqrt(d.pow(2).mean(-1, keepdim=True) + 1e-5) * self.w.float()).to(x.dtype)
        return x + self.moe(h)


def test_layer_norm_before_the_experts_stays_a_kernel() -> None:
    """``fused_moe`` takes only a row factor as its prologue: a LayerNorm read by the router
    GEMM and the experts stays row-reduction kernels (the plan says why), the experts still
    run as one ``fused_moe`` with the residual in its sum kernel, and nothing warns."""
    torch.manual_seed(11)
    m = LayerNormMoE().to(torch.float16).eval()
    x = torch.randn(1, 5, 64, dtype=torch.float16) + 0.5
    run = compile_and_run(m, x)
    plan, log, out, ref, want = run.plan, run.log, run.out, run.ref, run.want
    anchors = [k.anchor for k in plan.kernels]
    assert anchors.count("hexlayout.fused_moe.default") == 1 and anchors.count("aten.mean.dim") >= 1, anchors
    assert any("not a row factor for hexlayout.fused_moe" in n for n in plan.notes), plan.report()
    assert len(log) == len(plan.kernels) + 6, [r.name for r in log]      # fused_moe: 7 launches
    close(out, ref, want)


class GemmaNormMoE(nn.Module):
    """``x + experts(norm(x))`` with Gemma's norm ``(x * rsqrt(mean(x ** 2) + eps) * (1 + w))``
    (f32 inside, one cast at the end), 8 gathered experts, top-``k``, hidden ``h``."""

    def __init__(self, k: int, h: int = 64) -> None:
        super().__init__()
        self.w = nn.Parameter(torch.randn(h) * 0.2)
        self.moe = GatheredMoE(h=h, experts=8, k=k)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + self.w.float())).to(x.dtype)
        return x + self.moe(h)


@pytest.mark.parametrize("tokens,h", [(1, 64), (5, 96)], ids=["decode", "ragged-row"])
def test_gemma_norm_and_residual_in_fused_moe(tokens: int, h: int) -> None:
    """One token (bf16; the match drops its index of one value), and rows of 96 (the row
    scale's pass over 64-column tiles: the second one ragged): Gemma's norm is recomputed in
    the router GEMM's prologue and ``fused_moe``'s (``1 + w`` folded into the gate-up
    weights), the residual add is in the top-k sum kernel: 2 kernels, 8 launches (the router
    GEMM, fused_moe's 7)."""
    torch.manual_seed(10)
    m = GemmaNormMoE(k=2, h=h).to(torch.bfloat16).eval()
    x = torch.randn(1, tokens, h, dtype=torch.bfloat16) * 2
    run = compile_and_run(m, x)
    plan, log, out, ref, want = run.plan, run.log, run.out, run.ref, run.want
    names = [r.name for r in log]
    assert len(plan.kernels) == 2 and len(log) == 8, names
    assert names[-1].endswith("__moe_sum_bf16") and "moe_gate_up_bf16_silu_row_scaled" in names, names
    close(out, ref, want)


@pytest.mark.nvrtc
def test_row_scaled_gate_up_compiles_without_spills() -> None:
    """NVRTC, sm_80: the gate-up kernel with an RMSNorm's row scale (the row read again in
    accumulator-shaped tiles, reduced after the row) keeps everything in registers in the
    prefill config (64-row blocks, the largest; decode's 16 rows compile the same way)."""
    from hexlayout.ops.moe.fusion_prologue import moe_prologue
    from hexlayout.ops.moe.kernels_sm80 import moe_config, moe_gate_up_kernel

    import hexlayout.lang as hl
    from hexlayout.fusion.spec import Prologue
    from hexlayout.runtime import build

    x, w = torch.zeros(4, 32, dtype=torch.float16), torch.zeros(32, dtype=torch.float16)
    scales = moe_prologue(Prologue(0, _rms_nodes(), 7), [x, w], 4, 32, "k").scales
    bld = build(moe_gate_up_kernel(hl.f16, "silu", scales), "sm_80", **moe_config(8192), TOPK=2)
    res = bld.compiled.resources
    assert res.spill_stores == res.spill_loads == res.stack_frame == 0, res
