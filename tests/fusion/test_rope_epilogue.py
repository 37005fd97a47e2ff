"""RoPE in the QKV GEMM's epilogue: ``hexlayout::rope`` of a product's q / k columns
(rotate-half and interleaved pairs; cos / sin as a ``[max_pos, D]`` cache gathered by
position ids, as ``[B, S, D]`` rows already gathered, or as ``[S, D]`` shared by the batch)
computed by the GEMM, and the graph pass that finds RoPE as models write it: one launch for
the projection and its RoPE, the q / k / v parts views of its output, values within 1e-2 of
max|eager| of eager and of float64; where it cannot apply, the plan's note says why."""

from __future__ import annotations

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

import hexlayout.ops  # noqa: E402,F401 - registers the GEMM anchors

from hexlayout.fusion import Epilogue, FusedSpec, Node, run_fused  # noqa: E402
from hexlayout.fusion.partition import _VIEW_REASON  # noqa: E402
from hexlayout.fusion.plan import GraphPlan  # noqa: E402
from hexlayout.runtime.launch_log import launch_log  # noqa: E402

ROPE = "hexlayout.rope.default"


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    torch._dynamo.reset()


def rotate_half(x: torch.Tensor) -> torch.Tensor:
    """HF Llama's helper: ``cat(-x2, x1)`` of the halves of the last dimension."""
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def rotate_every_two(x: torch.Tensor) -> torch.Tensor:
    """HF GPT-J's helper: pairs ``(2i, 2i + 1)`` become ``(-x[2i + 1], x[2i])``."""
    return torch.stack((-x[..., 1::2], x[..., ::2]), dim=-1).flatten(-2)


def _tables(hd: int, interleaved: bool, n: int = 64) -> tuple[torch.Tensor, torch.Tensor]:
    inv = 1.0 / (10000 ** (torch.arange(0, hd, 2).float() / hd))
    f = torch.outer(torch.arange(n).float(), inv)
    emb = f.repeat_interleave(2, -1) if interleaved else torch.cat((f, f), -1)
    return emb.cos(), emb.sin()


def _close(out: torch.Tensor, ref: torch.Tensor, want: torch.Tensor) -> None:
    tol = 1e-2 * ref.float().abs().max().item()
    assert (out.float() - ref.float()).abs().max().item() <= tol
    assert (out.double() - want).abs().max().item() <= tol


@pytest.mark.parametrize("interleaved,gathered,dtype",
                         [(False, True, torch.float16), (True, False, torch.bfloat16)],
                         ids=["half-cache-f16", "pairs-per-seq-bf16"])
def test_rope_node_in_a_gemm_epilogue(interleaved: bool, gathered: bool, dtype: torch.dtype) -> None:
    """``linear`` with a bias and ``rope`` of its first 6 of 8 heads of 16: one launch; rows
    take ``cache[ids[m]]`` or row ``m mod S`` of an ``[S, D]`` table; the last 2 heads are
    the product."""
    torch.manual_seed(0)
    hd, b, s = 16, 2, 8
    x, w = torch.randn(b * s, 64).to(dtype), (torch.randn(8 * hd, 64) * 0.2).to(dtype)
    bias = torch.randn(8 * hd)
    cos, sin = (t.to(dtype) for t in _tables(hd, interleaved))
    ids = torch.randint(0, 64, (b, s))
    if gathered:
        ins, pos, rows = [cos, sin, ids], ("input", 2), ids.reshape(-1)
    else:
        ins, pos, rows = [cos[:s], sin[:s]], ("const", None), torch.arange(b * s) % s
    spec = FusedSpec("aten.linear.default", epilogue=Epilogue(
        (Node(ROPE, (("anchor",), ("input", 0), ("input", 1), pos, ("const", hd), ("const", 6 * hd),
                     ("const", interleaved))),), outputs=(("node", 0),)))
    with launch_log() as log:
        (y,) = run_fused(spec, [x, w, bias.to(dtype)], ins)
    assert len(log) == 1 and log[0].epilogue == (ROPE,), log
    y64 = F.linear(x.double(), w.double(), bias.to(dtype).double())
    heads = y64[:, :6 * hd].reshape(b * s, 6, hd)
    c, sn = cos.double()[rows][:, None], sin.double()[rows][:, None]
    rot = rotate_every_two(heads) if interleaved else rotate_half(heads)
    want = torch.cat([(heads * c + rot * sn).reshape(b * s, -1), y64[:, 6 * hd:]], 1)
    assert y.dtype == dtype and y.shape == want.shape
    tol = 1e-2 * want.abs().max().item()
    assert (y.double() - want).abs().max().item() <= tol


class GPTJAttention(nn.Module):
    """GPT-J's attention with one QKV projection: ``chunk(3)``, heads ``[B, S, H, D]``, RoPE
    on pairs ``(2i, 2i + 1)`` with tables gathered by position ids, then transposed."""

    def __init__(self, h: int = 64, heads: int = 4) -> None:
        super().__init__()
        self.heads, self.hd = heads, h // heads
        self.qkv = nn.Linear(h, 3 * h, bias=False)
        self.o = nn.Linear(h, h, bias=False)
        cos, sin = _tables(self.hd, interleaved=True)
        self.register_buffer("cos", cos)
        self.register_buffer("sin", sin)

    def forward(self, x: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        q, k, v = (p.view(b, t, self.heads, self.hd) for p in self.qkv(x).chunk(3, -1))
        cos, sin = self.cos[pos][:, :, None, :].to(x.dtype), self.sin[pos][:, :, None, :].to(x.dtype)
        q = q * cos + rotate_every_two(q) * sin
        k = k * cos + rotate_every_two(k) * sin
        q, k, v = (p.transpose(1, 2) for p in (q, k, v))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return x + self.o(a.transpose(1, 2).reshape(b, t, -1))


class Qwen2Attention(nn.Module):
    """Qwen2's attention as recent HF writes it: ``position_embeddings = (cos, sin)`` given to
    the layer (``[B, S, D]`` gathered, or ``[S, D]`` for the whole batch), QKV bias, GQA."""

    def __init__(self, h: int = 64, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.hd = heads, kv_heads, h // heads
        self.qkv = nn.Linear(h, (heads + 2 * kv_heads) * self.hd)
        self.o = nn.Linear(h, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        kv = self.kv_heads * self.hd
        q, k, v = self.qkv(x).split([self.heads * self.hd, kv, kv], -1)
        q, k, v = (p.view(b, t, -1, self.hd).transpose(1, 2) for p in (q, k, v))
        cos, sin = cos.unsqueeze(-3), sin.unsqueeze(-3)          # [B, 1, S, D] or [1, S, D]
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return x + self.o(a.transpose(1, 2).reshape(b, t, -1))


def _compiled(m: nn.Module, *args: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, list,
                                                           GraphPlan]:
    plans: list[GraphPlan] = []
    c = torch.compile(m, backend="hexlayout", options={"fallback": "eager", "on_plan": plans.append})
    with torch.no_grad():
        with launch_log() as log:
            out = c(*args)
        ref = m(*args)
        want = copy.deepcopy(m).double()(*(a.double() if a.is_floating_point() else a for a in args))
    return out, ref, want, list(log), GraphPlan.merge(plans)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["f16", "bf16"])
def test_interleaved_rope_attention_block(dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    m = GPTJAttention().to(dtype).eval()
    x, pos = torch.randn(2, 8, 64, dtype=dtype), torch.randint(0, 64, (2, 8))
    out, ref, want, log, plan = _compiled(m, x, pos)
    assert len(log) == 3 and ROPE in log[0].epilogue, log        # QKV + RoPE, attention, o_proj + residual
    assert {f.reason for f in plan.fallbacks} == {_VIEW_REASON}, plan
    assert any(n.startswith("rope: interleaved RoPE of columns [0, 128)") for n in plan.notes), plan.notes
    _close(out, ref, want)


@pytest.mark.parametrize("per_batch", [True, False], ids=["BSD", "SD"])
def test_position_embeddings_given_as_tables(per_batch: bool) -> None:
    torch.manual_seed(0)
    dtype = torch.bfloat16
    m = Qwen2Attention().to(dtype).eval()
    x = torch.randn(2, 8, 64, dtype=dtype)
    cos, sin = (t.to(dtype) for t in _tables(16, interleaved=False))
    ids = torch.randint(0, 64, (2, 8)) if per_batch else torch.arange(8)
    out, ref, want, log, plan = _compiled(m, x, cos[ids], sin[ids])
    assert len(log) == 3 and log[0].epilogue[0] == ROPE, log          # the bias is the linear's own
    assert {f.reason for f in plan.fallbacks} == {_VIEW_REASON}, plan
    note = "rope: rotate-half RoPE of columns [0, 96) (6 heads of 16)"
    assert any(n.startswith(note) for n in plan.notes), plan.notes
    _close(out, ref, want)


class QAlsoReturned(Qwen2Attention):
    """The un-rotated q is an output too: RoPE cannot replace the product's q columns."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> tuple[torch.Tensor, ...]:
        b, t, _ = x.shape
        kv = self.kv_heads * self.hd
        q, k, v = self.qkv(x).split([self.heads * self.hd, kv, kv], -1)
        raw = q * 2.0
        q, k, v = (p.view(b, t, -1, self.hd).transpose(1, 2) for p in (q, k, v))
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        return F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), raw


def test_rope_left_to_torch_says_why() -> None:
    torch.manual_seed(0)
    dtype = torch.float16
    m = QAlsoReturned().to(dtype).eval()
    x = torch.randn(2, 8, 64, dtype=dtype)
    cos, sin = (t.to(dtype)[torch.arange(8)].expand(2, 8, 16) for t in _tables(16, interleaved=False))
    plans: list[GraphPlan] = []
    c = torch.compile(m, backend="hexlayout", options={"fallback": "eager", "on_plan": plans.append})
    with torch.no_grad():
        out = c(x, cos, sin)
        ref = m(x, cos, sin)
    plan = GraphPlan.merge(plans)
    assert any(n.startswith("rope: left to torch (") and "unrotated columns [0, 64)" in n
               for n in plan.notes), plan.notes
    assert "aten.cat.default" in {f.op for f in plan.fallbacks}, plan
    for o, r in zip(out, ref):
        assert (o.float() - r.float()).abs().max().item() <= 1e-2 * r.float().abs().max().item()


def test_dynamic_sequence_lengths_share_one_build() -> None:
    """Symbolic batch and sequence sizes: one graph, one build per kernel for both lengths."""
    torch.manual_seed(0)
    m = GPTJAttention().half().eval()
    plans: list[GraphPlan] = []
    c = torch.compile(m, backend="hexlayout", dynamic=True,
                      options={"fallback": "eager", "on_plan": plans.append})
    with torch.no_grad(), launch_log() as log:
        for t in (8, 6):
            x, pos = torch.randn(2, t, 64, dtype=torch.float16), torch.randint(0, 64, (2, t))
            out, ref = c(x, pos), m(x, pos)
            assert (out.float() - ref.float()).abs().max().item() <= 1e-2 * ref.float().abs().max().item()
    assert len(plans) == 1 and any(n.startswith("rope: interleaved") for n in plans[0].notes), plans
    assert len(log) == 6 and [r.build_key for r in log[:3]] == [r.build_key for r in log[3:]], log
    assert log[0].shapes != log[3].shapes and ROPE in log[3].epilogue, log


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch,interleaved", [("sm_80", False), ("sm_90a", True)])
def test_rope_kernels_compile_without_spills(arch: str, interleaved: bool,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The CUDA path at production tiles (heads of 128, ``BM x BN`` 128 x 128): the rope
    epilogue compiles without spills (one form per architecture)."""
    from hexlayout.ops.gemm.fusion import anchor_consts, fused_build
    from hexlayout.ops.gemm.fusion_plan import plan_call

    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    hd = 128
    spec = FusedSpec("aten.linear.default", epilogue=Epilogue(
        (Node(ROPE, (("anchor",), ("input", 0), ("input", 1), ("input", 2), ("const", hd), ("const", 4 * hd),
                     ("const", interleaved))),), outputs=(("node", 0),)))
    x, w = torch.randn(64, 64).half(), torch.randn(6 * hd, 64).half()
    tables = [torch.randn(256, hd), torch.randn(256, hd), torch.randint(0, 256, (64,))]
    call = plan_call(spec, [x, w, None], tables)
    call.m = call.n = call.k = 4096
    consts = anchor_consts(call)
    assert consts["BN"] % hd == 0 and "STAGE_EPILOGUE" not in consts, consts
    bld, _ = fused_build(spec, call, consts, compile=True)
    res = bld.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0, res


class SeparateProjections(nn.Module):
    """HF Llama's attention with its own ``q_proj`` / ``k_proj`` / ``v_proj``: every column of
    the q and k products is rotated."""

    def __init__(self, h: int = 64, heads: int = 4, kv_heads: int = 2) -> None:
        super().__init__()
        self.hd = h // heads
        self.q_proj, self.k_proj = nn.Linear(h, h, bias=False), nn.Linear(h, kv_heads * self.hd, bias=False)
        self.v_proj, self.o_proj = nn.Linear(h, kv_heads * self.hd, bias=False), nn.Linear(h, h, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        b, t, _ = x.shape
        projections = (self.q_proj, self.k_proj, self.v_proj)
        q, k, v = (p(x).view(b, t, -1, self.hd).transpose(1, 2) for p in projections)
        cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        q, k = q * cos + rotate_half(q) * sin, k * cos + rotate_half(k) * sin
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        return self.o_proj(a.transpose(1, 2).reshape(b, t, -1))


def test_separate_q_and_k_projections_rotate_all_their_columns() -> None:
    torch.manual_seed(0)
    m = SeparateProjections().half().eval()
    cos, sin = (t.half() for t in _tables(16, interleaved=False))
    ids = torch.randint(0, 64, (2, 8))
    out, ref, want, log, plan = _compiled(m, torch.randn(2, 8, 64, dtype=torch.float16), cos[ids], sin[ids])
    assert len(log) == 5 and not plan.fallbacks, plan             # q, k, v, attention, o
    assert sum(ROPE in r.epilogue for r in log) == 2, log
    assert sorted(n.split(" in the")[0] for n in plan.notes if n.startswith("rope")) == [
        "rope: rotate-half RoPE of columns [0, 32) (2 heads of 16)",
        "rope: rotate-half RoPE of columns [0, 64) (4 heads of 16)"], plan.notes
    _close(out, ref, want)
