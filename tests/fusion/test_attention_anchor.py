"""``scaled_dot_product_attention`` as a fusion anchor (``ops/sdpa_anchor.py``): causal and
not, f16 and bf16, grouped-query heads, boolean and additive masks, vs eager within 1e-2 of
max|eager| and vs float64 (emulator, small shapes); its output's transpose / reshape back to
``[B, S, H*D]`` are host views of the stored output; attention the kernel cannot compute is
left to torch with the reason."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from hexlayout.fusion.explain import explain  # noqa: E402
from hexlayout.runtime.launch_log import launch_log  # noqa: E402

SDPA = "aten._scaled_dot_product_flash_attention_for_cpu.default"


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    torch._dynamo.reset()


def _merge_heads(causal: bool, scale: float | None = None):  # noqa: ANN202
    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        b, h, t, d = q.shape
        a = F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=scale)
        return a.transpose(1, 2).reshape(b, t, h * d)
    return f


@pytest.mark.parametrize("causal,scale,dtype", [(False, None, torch.float16), (True, None, torch.float16),
                                                (True, 0.3, torch.bfloat16)])
def test_sdpa_is_one_kernel_with_its_views(causal: bool, scale: float | None, dtype: torch.dtype) -> None:
    torch.manual_seed(3)
    q, k, v = (torch.randn(2, 4, 20, 16, dtype=dtype) for _ in range(3))
    f = _merge_heads(causal, scale)
    plan = explain(f, q, k, v)
    assert [k_.anchor for k_ in plan.kernels] == [SDPA] and plan.fallbacks == [], plan
    assert plan.kernels[0].prologue == [] and "aten.transpose.int" in plan.kernels[0].epilogue
    torch._dynamo.reset()
    c = torch.compile(f, backend="hexlayout", options={"fallback": "eager"})
    with launch_log() as log:
        out = c(q, k, v)
    want = f(q, k, v)
    assert out.shape == want.shape == (2, 20, 64) and out.dtype == want.dtype
    err, top = (out.float() - want.float()).abs().max().item(), want.float().abs().max().item()
    assert err <= 1e-2 * top, (err, top)
    # against float64 too: softmax(q k^T * scale [+ mask]) v
    q64, k64, v64 = (t.double() for t in (q, k, v))
    s = q64 @ k64.transpose(-1, -2) * (scale if scale is not None else 16 ** -0.5)
    if causal:
        s = s.masked_fill(torch.ones(20, 20, dtype=torch.bool).triu(1), float("-inf"))
    ref = (s.softmax(-1) @ v64).transpose(1, 2).reshape(2, 20, 64)
    assert (out.double() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()
    assert [r.anchor for r in log] == [SDPA] and log[0].prologue == ()


def _ref64(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor | None = None,
           causal: bool = False) -> torch.Tensor:
    """softmax(q k^T / sqrt(D) [+ mask | causal top-left]) v in float64, kv heads repeated."""
    q64, k64, v64 = (t.double() for t in (q, k, v))
    rep = q.shape[1] // k.shape[1]
    k64, v64 = k64.repeat_interleave(rep, 1), v64.repeat_interleave(rep, 1)
    s = q64 @ k64.transpose(-1, -2) * q.shape[-1] ** -0.5
    if causal:
        s = s.masked_fill(torch.ones(q.shape[2], k.shape[2], dtype=torch.bool).tril().logical_not(),
                          float("-inf"))
    if mask is not None:
        s = s.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else s + mask.double()
    return s.softmax(-1) @ v64


@pytest.mark.parametrize("mask", ["bool", "add"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_masked_grouped_query_attention(mask: str, dtype: torch.dtype) -> None:
    """GQA (4 query heads over 2 kv heads) with a boolean [Sq, Sk] mask (torch's graph turns it
    into where(m, 0, -inf), which the kernel reads as the boolean m: the where is in the
    kernel's prologue) or an additive [B, 1, Sq, Sk] mask: one kernel, nothing left to torch."""
    g = torch.Generator().manual_seed(5)
    q = torch.randn(2, 4, 12, 16, generator=g).to(dtype)
    k, v = (torch.randn(2, 2, 20, 16, generator=g).to(dtype) for _ in range(2))
    if mask == "bool":
        m = torch.rand(12, 20, generator=g) > 0.4
        m[:, 0] = True                                   # every row sees a key (torch: NaN otherwise)
    else:
        m = (torch.randn(2, 1, 12, 20, generator=g) * 2).to(dtype)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
        b, h, t, d = q.shape
        a = F.scaled_dot_product_attention(q, k, v, attn_mask=m, enable_gqa=True)
        return a.transpose(1, 2).reshape(b, t, h * d)

    plan = explain(f, q, k, v, m)
    assert [k_.anchor for k_ in plan.kernels] == [SDPA] and plan.fallbacks == [], plan
    assert ("aten.where.self" in plan.kernels[0].prologue) == (mask == "bool"), plan
    torch._dynamo.reset()
    c = torch.compile(f, backend="hexlayout", options={"fallback": "eager"})
    with launch_log() as log:
        out = c(q, k, v, m)
    want = f(q, k, v, m)
    assert out.shape == want.shape and out.dtype == dtype
    assert (out.float() - want.float()).abs().max().item() <= 1e-2 * want.float().abs().max().item()
    ref = _ref64(q, k, v, m).transpose(1, 2).reshape(2, 12, 64)
    assert (out.double() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()
    (rec,) = log
    assert rec.anchor == SDPA and rec.name.endswith(f"sdpa_{'f16' if dtype == torch.float16 else 'bf16'}_"
                                                    f"{mask}_mask")


def test_causal_with_fewer_queries_than_keys_is_top_left() -> None:
    """torch's is_causal aligns the mask top-left (query i sees keys j <= i) for any Sq, Sk."""
    g = torch.Generator().manual_seed(6)
    q = torch.randn(1, 2, 8, 16, generator=g).half()
    k, v = (torch.randn(1, 2, 12, 16, generator=g).half() for _ in range(2))
    f = _merge_heads(True)
    plan = explain(f, q, k, v)
    assert [k_.anchor for k_ in plan.kernels] == [SDPA] and plan.fallbacks == [], plan
    torch._dynamo.reset()
    out = torch.compile(f, backend="hexlayout", options={"fallback": "eager"})(q, k, v)
    ref = _ref64(q, k, v, causal=True).transpose(1, 2).reshape(1, 8, 32)
    assert (out.double() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()
    want = f(q, k, v)
    assert (out.float() - want.float()).abs().max().item() <= 1e-2 * want.float().abs().max().item()


def test_attention_the_kernel_cannot_compute_goes_to_torch_with_reason() -> None:
    q, k, v = (torch.randn(1, 2, 8, 16) for _ in range(3))              # f32
    plan = explain(_merge_heads(False), q, k, v)
    assert plan.kernels == [] and "f16 or bf16" in {f.op: f.reason for f in plan.fallbacks}[SDPA], plan
    torch._dynamo.reset()
    q, k, v = (torch.randn(1, 2, 8, 12, dtype=torch.float16) for _ in range(3))   # head size 12
    plan = explain(_merge_heads(True), q, k, v)
    assert plan.kernels == [] and "head size 12" in {f.op: f.reason for f in plan.fallbacks}[SDPA], plan


@pytest.mark.nvrtc
def test_attention_anchor_compiles_without_spills() -> None:
    """NVRTC, sm_80: the GPU configuration (64 query rows, 4 warps) of the bf16 kernel with a
    boolean mask and head size 128 - the largest of the variants - keeps everything in
    registers."""
    import hexlayout.ops  # noqa: F401 - registers the attention anchor
    from hexlayout.ops.attention.sdpa_anchor import sdpa_consts, sdpa_kernel

    import hexlayout.lang as hl
    from hexlayout.runtime import build

    tk = sdpa_kernel(hl.bf16, "bool", 16).trace(**sdpa_consts(512, 512, 128, False, False))
    res = build(tk, "sm_80").compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, res


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_attention_anchor_on_cuda(dtype: torch.dtype) -> None:
    """The CUDA launch (GPU tile constants): causal GQA and a boolean-masked attention of 300
    queries over 300 / 333 keys, head size 64 and 128, vs float64."""
    import hexlayout.ops  # noqa: F401 - registers the attention anchor

    from hexlayout.fusion import FusedSpec, run_fused

    g = torch.Generator(device="cuda").manual_seed(7)
    for d, sk, causal in ((64, 300, True), (128, 333, False)):
        q = torch.randn(2, 8, 300, d, device="cuda", generator=g).to(dtype)
        k, v = (torch.randn(2, 2, sk, d, device="cuda", generator=g).to(dtype) for _ in range(2))
        mask = None if causal else torch.rand(300, sk, device="cuda", generator=g) > 0.5
        if mask is not None:
            mask[:, 0] = True
        spec = FusedSpec(SDPA, anchor_kwargs=(("is_causal", causal),))
        (out,) = run_fused(spec, [q, k, v] + ([mask] if mask is not None else []), [])
        ref = _ref64(q.cpu(), k.cpu(), v.cpu(), None if mask is None else mask.cpu(), causal)
        assert (out.cpu().double() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_math_of_the_output_is_in_the_store(dtype: torch.dtype) -> None:
    """A cast and a scale of attention's output (after its views) are computed in the kernel's
    store (the output stored in f32, one launch); math with another tensor (a residual) is
    left to torch with the reason."""
    g = torch.Generator().manual_seed(8)
    q, k, v = (torch.randn(2, 4, 12, 16, generator=g).to(dtype) for _ in range(3))
    res = torch.randn(2, 12, 64, generator=g)

    def f(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, res: torch.Tensor) -> tuple:
        b, h, t, d = q.shape
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, t, h * d)
        y = a.float() * 0.5
        return y, y + res

    plan = explain(f, q, k, v, res)
    assert [k_.anchor for k_ in plan.kernels] == [SDPA], plan
    assert {"aten._to_copy.default", "aten.mul.Tensor"} <= set(plan.kernels[0].epilogue), plan
    left = {f_.op: f_.reason for f_ in plan.fallbacks}
    assert set(left) == {"aten.add.Tensor"} and "reshaped output" in left["aten.add.Tensor"], plan
    torch._dynamo.reset()
    c = torch.compile(f, backend="hexlayout", options={"fallback": "eager"})
    with launch_log() as log:
        y, z = c(q, k, v, res)
    ref = (_ref64(q, k, v, causal=True).transpose(1, 2).reshape(2, 12, 64) * 0.5)
    assert y.dtype == torch.float32 and y.shape == (2, 12, 64)
    assert (y.double() - ref).abs().max().item() <= 1e-2 * ref.abs().max().item()
    want = ref + res.double()
    assert (z.double() - want).abs().max().item() <= 1e-2 * want.abs().max().item()
    (rec,) = log
    assert rec.epilogue[-2:] == ("aten._to_copy.default", "aten.mul.Tensor") and (2, 12, 4, 16) in rec.shapes
