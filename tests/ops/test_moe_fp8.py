"""``hexlayout.ops.fused_moe`` with ``prepare_fp8`` experts (``torch.ops.hexlayout.fused_moe_fp8``)
in the emulator (sm_89 and sm_90a) against a float64 reference that dequantizes from the
checkpoint tensors (``w * scale`` over its block) and quantizes the activations as the op
specifies (``s = max|row| / 448``, ``e4m3(row / s)`` in float32, the intermediate rounded to the
activations' dtype first): random routings with experts that get no token, all tokens on one
expert, T 1 / 3 / 16, E 8 / 64, k 1 / 2 / 8, bf16 / f16, per-expert and 128 x 128 block scales,
SiLU / GELU, an expert map with half the experts remote, the router weight on the input; the
sm_80 refusal and bad arguments naming the argument.

Tolerance: the reference quantizes x with the very float32 operations of the op, so ``xq``
matches bit for bit. The intermediate ``h`` is summed in float32 by the kernel and in float64
by the reference before both round it to bf16 / f16: where the two land on either side of a
rounding boundary (probability ~ 1e-3 per element) the bf16 value differs by one ulp, and its
e4m3 quantization may then round to the neighbouring e4m3 value: one element of ``hq`` off by
one e4m3 ulp (<= 2^-3 relative). Each contribution ``W2[e] @ hq`` is therefore allowed two such
flips, ``2 * 2^-3 * max_i |h_i| * max_i |W2[e, n, i]|``, on top of ``2^-7`` relative to the
sum of magnitudes (each contribution's and the output's rounding to bf16, 2^-9 each, float32
accumulation). A wrong scale,
expert, row or weight is off by O(1) relative and fails.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
import torch.nn.functional as F  # noqa: E402
from hexlayout.ops.moe.fp8 import Fp8MoEWeights, fused_moe_fp8, prepare_fp8  # noqa: E402

from hexlayout.errors import HexlayoutError  # noqa: E402

E4M3_MAX = 448.0


@pytest.fixture(autouse=True)
def emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_89")


def _dequant(w: torch.Tensor, s: torch.Tensor, block: bool) -> torch.Tensor:
    wd = w.double()
    if not block:
        return wd * s.double()[:, None, None]
    sd = s.double().repeat_interleave(128, 1).repeat_interleave(128, 2)
    return wd * sd[:, : w.shape[1], : w.shape[2]]


def _quant(v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row e4m3 quantization of float32 rows, as specified: (dequantized float64, scales)."""
    s = v.abs().amax(1) / E4M3_MAX
    q = (v / torch.where(s == 0, 1.0, s)[:, None]).to(torch.float8_e4m3fn)
    return q.double() * s.double()[:, None], s.double()


def reference(x, w13, s13, w2, s2, tw, ids, block, act="silu", router=False, emap=None):
    """float64 output and per-element tolerance (see the module docstring)."""
    W13, W2 = _dequant(w13, s13, block), _dequant(w2, s2, block)
    t_, k = ids.shape
    inter = w2.shape[2]
    xf = x.float() * tw.reshape(-1)[:, None] if router else x.float()
    xq, _ = _quant(xf)
    out = torch.zeros(t_, x.shape[1], dtype=torch.float64)
    tol = torch.zeros_like(out)
    for t in range(t_):
        for j in range(k):
            e = int(ids[t, j])
            if emap is not None:
                e = int(emap[e])
                if e < 0:
                    continue
            y = W13[e] @ xq[t]
            g = F.silu(y[:inter]) if act == "silu" else F.gelu(y[:inter])
            h = (g * y[inter:]).to(x.dtype).float()
            hq, _ = _quant(h[None])
            wt = 1.0 if router else float(tw[t, j])
            c = wt * (W2[e] @ hq[0])
            out[t] += c
            tol[t] += wt * (W2[e].abs() @ hq[0].abs()) * 2.0**-7
            tol[t] += wt * 2 * 2.0**-3 * h.abs().max().double() * W2[e].abs().amax(1)
    return out, tol + 1e-6


def make(seed, t, h, inter, e, k, dtype=torch.bfloat16, block=False, one_expert=None, gne=None):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(t, h, generator=g).to(dtype)
    w13 = (torch.randn(e, 2 * inter, h, generator=g) * 0.5).to(torch.float8_e4m3fn)
    w2 = (torch.randn(e, h, inter, generator=g) * 0.5).to(torch.float8_e4m3fn)
    if block:
        s13 = torch.rand(e, -(-2 * inter // 128), -(-h // 128), generator=g) * 0.05 + 0.01
        s2 = torch.rand(e, -(-h // 128), -(-inter // 128), generator=g) * 0.05 + 0.01
    else:
        s13 = torch.rand(e, generator=g) * 0.05 + 0.01
        s2 = torch.rand(e, generator=g) * 0.05 + 0.01
    n = gne or e
    ids = torch.stack([torch.randperm(n, generator=g)[:k] for _ in range(t)]).to(torch.int32)
    if one_expert is not None:
        ids[:, 0] = one_expert
    tw = torch.rand(t, k, generator=g)
    return x, w13, s13, w2, s2, tw, ids


def check(out, ref, tol):
    assert out.shape == ref.shape
    err = (out.double() - ref).abs()
    bad = err > tol
    worst = float((err - tol).max())
    assert not bad.any(), f"{int(bad.sum())} elements off; worst {worst}, |ref| max {ref.abs().max()}"
    assert ref.abs().max() > 0


CASES = [
    # seed, T, H, I, E, k, dtype, block, act, arch
    (0, 1, 128, 64, 8, 1, torch.bfloat16, False, "silu", "sm_89"),
    (1, 3, 256, 176, 8, 2, torch.float16, True, "gelu", "sm_90a"),   # I % 64: up tiles straddle scale blocks
    (2, 16, 128, 64, 64, 8, torch.bfloat16, False, "silu", "sm_90a"),
    (3, 16, 256, 128, 8, 2, torch.bfloat16, True, "silu", "sm_89"),
]


@pytest.mark.parametrize(("seed", "t", "h", "inter", "e", "k", "dtype", "block", "act", "arch"), CASES)
def test_fused_moe_fp8_matches_float64(seed, t, h, inter, e, k, dtype, block, act, arch, monkeypatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    x, w13, s13, w2, s2, tw, ids = make(seed, t, h, inter, e, k, dtype, block)
    blk = (128, 128) if block else None
    a, b = prepare_fp8(w13, s13, block=blk), prepare_fp8(w2, s2, block=blk)
    out = hexlayout.ops.fused_moe(x, a, b, tw, ids, activation=act)   # dispatches to fused_moe_fp8
    assert out.dtype == dtype and out.shape == (t, h)
    check(out, *reference(x, w13, s13, w2, s2, tw, ids, block, act))
    if e >= 16:   # most experts got no token: their blocks cost nothing, the result is still exact
        assert len(set(ids.flatten().tolist())) < e


def test_all_tokens_on_one_expert_and_router_weight_on_input() -> None:
    x, w13, s13, w2, s2, tw, ids = make(4, 16, 128, 64, 8, 1, torch.float16, one_expert=5)
    a, b = prepare_fp8(w13, s13), prepare_fp8(w2, s2)
    out = fused_moe_fp8(x, a, b, tw, ids, apply_router_weight_on_input=True)
    check(out, *reference(x, w13, s13, w2, s2, tw, ids, False, router=True))
    out = torch.ops.hexlayout.fused_moe_fp8(x, w13, s13, w2, s2, tw, ids)
    check(out, *reference(x, w13, s13, w2, s2, tw, ids, False))


def test_expert_map_half_remote() -> None:
    gne, e = 16, 8
    x, w13, s13, w2, s2, tw, ids = make(5, 16, 128, 64, e, 2, torch.bfloat16, block=True, gne=gne)
    perm = torch.randperm(gne, generator=torch.Generator().manual_seed(6))
    emap = torch.full((gne,), -1, dtype=torch.int32)
    emap[perm[:e]] = torch.arange(e, dtype=torch.int32)
    blk = (128, 128)
    out = fused_moe_fp8(x, prepare_fp8(w13, s13, block=blk), prepare_fp8(w2, s2, block=blk), tw, ids,
                        expert_map=emap, global_num_experts=gne)
    ref, tol = reference(x, w13, s13, w2, s2, tw, ids, True, emap=emap)
    check(out, ref, tol)
    remote = (emap[ids.long()] < 0).all(1)   # tokens whose every choice is remote: exactly 0
    assert torch.equal(out[remote], torch.zeros_like(out[remote]))


def test_nan_in_a_token_propagates_to_its_row_only() -> None:
    x, w13, s13, w2, s2, tw, ids = make(7, 3, 128, 64, 8, 2)
    x[1, 5] = float("nan")
    out = fused_moe_fp8(x, prepare_fp8(w13, s13), prepare_fp8(w2, s2), tw, ids)
    assert out[1].isnan().any()
    assert torch.isfinite(out[[0, 2]]).all()


def test_sm80_is_refused_naming_the_weights(monkeypatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_80")
    x, w13, s13, w2, s2, tw, ids = make(8, 1, 128, 64, 8, 1)
    with pytest.raises(HexlayoutError, match=r"w13.*sm_89, sm_90a or sm_100a.*sm_80"):
        fused_moe_fp8(x, prepare_fp8(w13, s13), prepare_fp8(w2, s2), tw, ids)


def test_prepare_fp8_bad_arguments() -> None:
    x, w13, s13, w2, s2, tw, ids = make(9, 1, 128, 64, 8, 1, block=True)
    with pytest.raises(TypeError, match="'w'.*float8_e4m3fn"):
        prepare_fp8(w13.to(torch.bfloat16), s13, block=(128, 128))
    with pytest.raises(ValueError, match="'w'.*E, N, K"):
        prepare_fp8(w13[0], s13, block=(128, 128))
    with pytest.raises(TypeError, match="'scale'.*float32"):
        prepare_fp8(w13, s13.half(), block=(128, 128))
    with pytest.raises(ValueError, match=r"'scale'.*\[8, 1, 1\]"):
        prepare_fp8(w13, s13.repeat(1, 2, 1), block=(128, 128))
    with pytest.raises(ValueError, match=r"'scale'.*\[8\]"):
        prepare_fp8(w13, s13)
    with pytest.raises(ValueError, match="'block'.*128"):
        prepare_fp8(w13, s13, block=(64, 64))
    with pytest.raises(TypeError, match="'block'"):
        prepare_fp8(w13, s13, block="128")
    p = prepare_fp8(w13, s13, block=[128, 128])
    assert isinstance(p, Fp8MoEWeights) and p.w is w13 and p.scale is s13 and p.block == (128, 128)


def test_fused_moe_fp8_bad_arguments() -> None:
    x, w13, s13, w2, s2, tw, ids = make(10, 3, 128, 64, 8, 2)
    a, b = prepare_fp8(w13, s13), prepare_fp8(w2, s2)
    op = torch.ops.hexlayout.fused_moe_fp8
    cases = [
        (lambda: fused_moe_fp8(x.float(), a, b, tw, ids), "hidden_states"),
        (lambda: fused_moe_fp8(x[:, :64].contiguous(), a, b, tw, ids), "w13"),
        (lambda: fused_moe_fp8(x.t().contiguous().t(), a, b, tw, ids), "hidden_states"),
        (lambda: fused_moe_fp8(x, a, b, tw, ids.long()), "topk_ids"),
        (lambda: fused_moe_fp8(x, a, b, tw.half(), ids), "topk_weights"),
        (lambda: fused_moe_fp8(x, a, b, tw, ids + 8), "topk_ids"),
        (lambda: fused_moe_fp8(x, a, b, tw, ids, activation="relu"), "activation"),
        (lambda: fused_moe_fp8(x, a, b, tw, ids, apply_router_weight_on_input=True),
         "apply_router_weight_on_input"),
        (lambda: fused_moe_fp8(x, a, b, tw, ids, expert_map=torch.zeros(5, dtype=torch.int32),
                               global_num_experts=8), "expert_map"),
        (lambda: fused_moe_fp8(x, a, prepare_fp8(w2[:4].contiguous(), s2[:4].contiguous()), tw, ids), "w2"),
        (lambda: fused_moe_fp8(x, a, w2, tw, ids), "w2"),
        (lambda: op(x, w13, s13, w2, s2, tw, ids, [64, 64]), "block"),
        (lambda: op(x, w13, s13[:4], w2, s2, tw, ids), "w13_scale"),
    ]
    for fn, name in cases:
        with pytest.raises(HexlayoutError, match=f"'?{name}'?"):
            fn()


def test_int64_ids_and_strided_inputs_name_the_fix() -> None:
    """torch.topk's int64 ids get ``topk_ids.int()``, a strided input ``.contiguous()``: eagerly and
    in the fake (meta) implementation."""
    x, w13, s13, w2, s2, tw, ids = make(12, 3, 128, 64, 8, 2)
    ids64 = torch.topk(torch.randn(3, 8), 2).indices
    strided = x.t().contiguous().t()
    op = torch.ops.hexlayout.fused_moe_fp8
    for dev in ("cpu", "meta"):
        tensors = (x, w13, s13, w2, s2, tw, ids, ids64, strided)
        xx, a, sa, b, sb, ww, ii, ii64, ss = (v.to(dev) for v in tensors)
        with pytest.raises(HexlayoutError, match=r"'topk_ids'.*torch\.int64.*pass topk_ids\.int\(\)"):
            op(xx, a, sa, b, sb, ww, ii64)
        with pytest.raises(HexlayoutError, match=r"'hidden_states'.*pass hidden_states\.contiguous\(\)"):
            op(ss, a, sa, b, sb, ww, ii)
        with pytest.raises(HexlayoutError, match=r"'w13'.*pass w13\.contiguous\(\)"):
            op(xx, a.transpose(1, 2).contiguous().transpose(1, 2), sa, b, sb, ww, ii)
    with pytest.raises(HexlayoutError, match=r"'topk_ids'.*pass topk_ids\.int\(\)"):
        fused_moe_fp8(x, prepare_fp8(w13, s13), prepare_fp8(w2, s2), tw, ids64)


def test_fake_implementation_checks_and_gives_the_output() -> None:
    x, w13, s13, w2, s2, tw, ids = make(11, 3, 128, 64, 8, 2)
    meta = [v.to("meta") for v in (x, w13, s13, w2, s2, tw, ids)]
    out = torch.ops.hexlayout.fused_moe_fp8(*meta)
    assert out.device.type == "meta" and out.shape == x.shape and out.dtype == x.dtype
    with pytest.raises(HexlayoutError, match="w2_scale"):
        torch.ops.hexlayout.fused_moe_fp8(*meta[:4], meta[4][:2], *meta[5:])
