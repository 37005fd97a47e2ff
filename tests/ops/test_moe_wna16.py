"""W4A16 / W8A16 fused MoE (``hexlayout.ops.prepare_wna16``, ``torch.ops.hexlayout.fused_moe_wna16``)
in the emulator against a float64 torch reference that dequantizes the CHECKPOINT tensors (AWQ /
GPTQ packing written here from the formats' definitions, not from the code under test); bad
input; the fake (meta) path."""

from __future__ import annotations

import importlib
import os

import pytest

torch = pytest.importorskip("torch")

from hexlayout.ops.moe.wna16 import fused_moe_wna16, prepare_wna16  # noqa: E402

from hexlayout.errors import HexlayoutError  # noqa: E402

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)  # nibble i of a word holds column 8 w + AWQ_ORDER[i]


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    # the routing alignment kernel (ops/moe_align.py) is tested on its own and slow to emulate on
    # many slots; here a reference alignment with its semantics keeps the runs short (one test
    # below runs the real one)
    monkeypatch.setattr("hexlayout.ops.moe.pipeline.run_moe_align", reference_alignment)


def reference_alignment(topk_ids, num_experts, block_m, expert_map=None):
    """vLLM's moe_align_block_size: slots sorted by local expert (slot order within one), each
    expert's list padded with the slot count to a multiple of ``block_m``; the expert of each
    block (-1 past the used ones); the padded total."""
    from hexlayout.ops.moe.align import max_padded_slots

    ids = topk_ids.reshape(-1).long()
    s = ids.numel()
    local = ids if expert_map is None else expert_map.long()[ids]
    em = max_padded_slots(s, num_experts, block_m)
    sorted_ids = torch.full((em,), s, dtype=torch.int32)
    expert_ids = torch.full((em // block_m,), -1, dtype=torch.int32)
    off = 0
    for e in range(num_experts):
        slots = torch.nonzero(local == e).flatten()
        n = -(-slots.numel() // block_m) * block_m
        sorted_ids[off : off + slots.numel()] = slots.to(torch.int32)
        expert_ids[off // block_m : (off + n) // block_m] = e
        off += n
    return sorted_ids, expert_ids, torch.tensor([off], dtype=torch.int32)


def _words(v: torch.Tensor) -> torch.Tensor:
    """int64 values < 2^32 as the int32 words of the same bits."""
    return torch.where(v >= 2**31, v - 2**32, v).to(torch.int32)


def awq_pack(v: torch.Tensor) -> torch.Tensor:
    """4-bit ``[..., N]`` -> AutoAWQ words ``[..., N / 8]``."""
    v = v.to(torch.int64)
    w = torch.zeros(*v.shape[:-1], v.shape[-1] // 8, dtype=torch.int64)
    for i, j in enumerate(AWQ_ORDER):
        w |= v[..., j::8] << (4 * i)
    return _words(w)


def gptq_pack(v: torch.Tensor, bits: int) -> torch.Tensor:
    """``[E, K, N]`` -> GPTQ words ``[E, K * bits / 32, N]``, value i of word r is row (32/bits) r + i."""
    v = v.to(torch.int64)
    per = 32 // bits
    w = torch.zeros(v.shape[0], v.shape[1] // per, v.shape[2], dtype=torch.int64)
    for i in range(per):
        w |= v[:, i::per, :] << (bits * i)
    return _words(w)


def checkpoint(
    fmt: str, bits: int, e: int, k: int, n: int, group: int, dtype: torch.dtype, gen: torch.Generator
):
    """Random checkpoint tensors ``(qweight, scales, qzeros)`` of ``y = x @ W`` (K = k, N = n) and
    ``W`` [E, K, N] float64 dequantized from them."""
    q = torch.randint(0, 2**bits, (e, k, n), generator=gen)
    groups = 1 if group == -1 else k // group
    s = (torch.rand(e, groups, n, generator=gen) * 0.02 + 0.004).to(dtype)
    gs = k if group == -1 else group
    if fmt == "awq":
        z = torch.randint(0, 16, (e, groups, n), generator=gen)
        ck = (awq_pack(q), s, awq_pack(z))
    else:
        z = torch.full((e, groups, n), 2 ** (bits - 1))
        ck = (gptq_pack(q, bits), s, None)
    w = (q.double() - z.double().repeat_interleave(gs, 1)) * s.double().repeat_interleave(gs, 1)
    return ck, w


def reference(x, w13, w2, tw, ids, act, on_input, emap):
    """float64 ``sum_j tw * W2^T (act(gate) * up)`` over local choices (vLLM's semantics)."""
    x = x.double()
    t_, k = ids.shape
    inter = w13.shape[2] // 2
    out = torch.zeros(t_, w2.shape[2], dtype=torch.float64)
    for t in range(t_):
        for j in range(k):
            e = int(ids[t, j]) if emap is None else int(emap[int(ids[t, j])])
            if e < 0:
                continue
            xt = x[t] * (float(tw[t, j]) if on_input else 1.0)
            gu = xt @ w13[e]
            g, u = gu[:inter], gu[inter:]
            a = torch.nn.functional.silu(g) if act == "silu" else torch.nn.functional.gelu(g)
            out[t] += ((a * u) @ w2[e]) * (1.0 if on_input else float(tw[t, j]))
    return out


def routing(kind: str, t: int, e: int, k: int, gen: torch.Generator) -> torch.Tensor:
    """topk ids ``[T, k]``: ``random`` over the first half of the experts (the rest get none),
    ``one`` (every token on expert 1, other choices distinct), ``single`` (one token on each
    used expert)."""
    if kind == "one":
        rest = torch.stack([torch.randperm(e - 2, generator=gen)[: k - 1] + 2 for _ in range(t)])
        return torch.cat([torch.ones(t, 1, dtype=torch.int64), rest], 1).to(torch.int32)
    if kind == "single":
        return torch.randperm(e, generator=gen)[: t * k].reshape(t, k).to(torch.int32)
    return torch.stack([torch.randperm(max(e // 2, k), generator=gen)[:k] for _ in range(t)]).to(torch.int32)


def _bound(dtype: torch.dtype) -> float:
    """Relative error allowed: a few roundings of the dtype (weights, intermediate, output)."""
    return 6 * (2.0**-11 if dtype == torch.float16 else 2.0**-9)


CASES = [
    # fmt, bits, group, dtype, T, E, k, act, routing
    ("awq", 4, 32, torch.float16, 16, 8, 2, "silu", "random"),
    ("awq", 4, 128, torch.bfloat16, 1, 64, 8, "gelu", "single"),
    ("gptq", 4, 128, torch.float16, 3, 64, 2, "silu", "random"),
    ("gptq", 8, 32, torch.bfloat16, 100, 8, 1, "silu", "random"),
    ("gptq", 8, -1, torch.float16, 16, 8, 6, "gelu", "one"),
    ("awq", 4, -1, torch.bfloat16, 100, 8, 1, "silu", "one"),
    ("gptq", 4, 64, torch.bfloat16, 3, 8, 8, "silu", "random"),
    # the prefill config (64 and more rows per expert: BM 64, 3 stages)
    ("awq", 4, 64, torch.bfloat16, 64, 2, 2, "gelu", "random"),
]


def _run(fmt, bits, group, dtype, t, e, k, act, kind, *, seed, on_input=False, emap_half=False, h=64, i=64):
    gen = torch.Generator().manual_seed(seed)
    if group == 128:
        h = i = 128
    ck13, w13 = checkpoint(fmt, bits, e, h, 2 * i, group, dtype, gen)
    ck2, w2 = checkpoint(fmt, bits, e, i, h, group, dtype, gen)
    p13 = prepare_wna16(*ck13, quant_format=fmt, bits=bits, group_size=group, gate_up=True)
    p2 = prepare_wna16(*ck2, quant_format=fmt, bits=bits, group_size=group)
    x = torch.randn(t, h, generator=gen).to(dtype)
    emap = None
    gne = e
    if emap_half:  # 2E global experts, the odd ones remote, the even ones local expert g / 2
        gne = 2 * e
        emap = torch.where(torch.arange(gne) % 2 == 0, torch.arange(gne) // 2, -1).to(torch.int32)
    ids = routing(kind, t, gne, k, gen)
    tw = torch.rand(t, k, generator=gen)
    out = fused_moe_wna16(
        x,
        p13,
        p2,
        tw,
        ids,
        activation=act,
        apply_router_weight_on_input=on_input,
        expert_map=emap,
        global_num_experts=gne if emap is not None else None,
    )
    want = reference(x, w13, w2, tw, ids, act, on_input, emap)
    return out, want


@pytest.mark.parametrize(("fmt", "bits", "group", "dtype", "t", "e", "k", "act", "kind"), CASES)
def test_matches_the_float64_reference(fmt, bits, group, dtype, t, e, k, act, kind) -> None:
    out, want = _run(fmt, bits, group, dtype, t, e, k, act, kind, seed=t * 100 + e + k)
    assert out.dtype == dtype and out.shape == want.shape
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(dtype) * want.abs().max().item(), (err, want.abs().max().item())


def test_expert_map_skips_remote_experts() -> None:
    out, want = _run("awq", 4, 64, torch.float16, 16, 8, 4, "silu", "random", seed=7, emap_half=True)
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(torch.float16) * want.abs().max().item(), err


def test_router_weight_on_input() -> None:
    out, want = _run("gptq", 4, 64, torch.float16, 16, 8, 1, "silu", "random", seed=11, on_input=True)
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(torch.float16) * want.abs().max().item(), err


def test_nan_in_the_input_propagates_to_its_token_only() -> None:
    gen = torch.Generator().manual_seed(3)
    ck13, _ = checkpoint("gptq", 4, 8, 64, 128, 64, torch.float16, gen)
    ck2, _ = checkpoint("gptq", 4, 8, 64, 64, 64, torch.float16, gen)
    p13 = prepare_wna16(*ck13, quant_format="gptq", bits=4, group_size=64)
    p2 = prepare_wna16(*ck2, quant_format="gptq", bits=4, group_size=64)
    x = torch.randn(3, 64, generator=gen).half()
    x[1, 5] = float("nan")
    ids = torch.tensor([[0, 1], [1, 2], [2, 3]], dtype=torch.int32)
    out = fused_moe_wna16(x, p13, p2, torch.rand(3, 2, generator=gen), ids)
    assert out[1].isnan().all() and not out[0].isnan().any() and not out[2].isnan().any()


# ---- prepare_wna16: the re-laid weights dequantize to the checkpoint's ----


@pytest.mark.parametrize(("fmt", "bits", "group"), [("awq", 4, 32), ("gptq", 4, 128), ("gptq", 8, -1)])
def test_prepared_weights_dequantize_to_the_checkpoint(fmt, bits, group) -> None:
    gen = torch.Generator().manual_seed(bits + group)
    e, k, n = 3, 128, 48
    ck, w = checkpoint(fmt, bits, e, k, n, group, torch.float16, gen)
    p = prepare_wna16(*ck, quant_format=fmt, bits=bits, group_size=group)
    assert (p.num_experts, p.size_k, p.size_n, p.bits) == (e, k, n, bits)
    # the synthesized offline layouts (their key recorded), undone by their own permutations
    from hexlayout.ops.moe.wna16 import zero_point
    from hexlayout.ops.moe.wna16_layout import group_view, offline_key, wna16_offline_layouts

    from hexlayout.lang import f16

    lays = wna16_offline_layouts("sm_80", f16, bits, k, group, False, zero=zero_point(fmt, bits))
    assert p.layout_key == offline_key(lays)
    assert sorted(lays) == (["q", "s", "z"] if fmt == "awq" else ["q", "s"])
    lay = lays["q"]
    q = p.qweight.to(torch.int64)
    if bits == 4:  # even elements in the low nibble
        q = torch.stack([q & 15, q >> 4], -1).flatten(-2)
    rows, cols = q.shape
    assert rows == e * 64 and cols == k  # N = 48 padded to the 64-row tile
    logical = q.reshape(-1)[torch.from_numpy(lay.permutation((rows, cols)))].reshape(e, 64, k)
    assert not logical[:, n:].any()  # padded rows are 0
    q = logical[:, :n].transpose(1, 2)
    gs = k if group == -1 else group

    def groups(t, name):  # the offline [E * 64, G] tensor behind the prepared [E, G, N] view, undone
        flat = group_view(t)
        assert tuple(t.shape) == (e, k // gs, n) and tuple(flat.shape) == (e * 64, k // gs)
        perm = torch.from_numpy(lays[name].permutation(tuple(flat.shape)))
        logical = flat.reshape(-1)[perm].reshape(e, 64, -1)
        assert not logical[:, n:].any()  # padded rows are 0
        return logical[:, :n].transpose(1, 2).double()

    s = groups(p.scales, "s")
    z = groups(p.zeros, "z") if p.zeros is not None else torch.full_like(s, 2 ** (bits - 1))
    got = (q.double() - z.repeat_interleave(gs, 1)) * s.repeat_interleave(gs, 1)
    assert torch.equal(got, w)


# ---- bad input ----


def _awq(e=2, k=64, n=16, g=32):
    gen = torch.Generator().manual_seed(0)
    return checkpoint("awq", 4, e, k, n, g, torch.float16, gen)[0]


@pytest.mark.parametrize(
    ("change", "name"),
    [
        (lambda a: ((a[0].float(),) + a[1:], {}), "qweight"),
        (lambda a: ((a[0][:, :, :1],) + a[1:], {}), "scales"),
        (lambda a: ((a[0], a[1].float(), a[2]), {}), "scales"),
        (lambda a: ((a[0], a[1], a[2][:, :1]), {}), "qzeros"),
        (lambda a: ((a[0], a[1], None), {}), "qzeros"),
        (lambda a: (a, {"group_size": 48}), "group_size"),
        (lambda a: (a, {"group_size": 128}), "group_size"),
        (lambda a: (a, {"bits": 8}), "bits"),
        (lambda a: (a, {"quant_format": "exl2"}), "quant_format"),
        (lambda a: ((a[0][0],) + a[1:], {}), "qweight"),
    ],
)
def test_prepare_names_the_bad_argument(change, name) -> None:
    args, kw = change(_awq())
    kwargs = {"quant_format": "awq", "bits": 4, "group_size": 32, **kw}
    with pytest.raises(HexlayoutError, match=rf"\b{name}\b"):
        prepare_wna16(*args, **kwargs)


def test_gptq_takes_no_qzeros_and_bits_3_is_refused() -> None:
    gen = torch.Generator().manual_seed(1)
    (qw, s, _), _ = checkpoint("gptq", 4, 2, 64, 16, 32, torch.float16, gen)
    with pytest.raises(HexlayoutError, match=r"qzeros.*GPTQ"):
        prepare_wna16(
            qw, s, torch.zeros(2, 2, 2, dtype=torch.int32), quant_format="gptq", bits=4, group_size=32
        )
    with pytest.raises(HexlayoutError, match=r"\bbits\b"):
        prepare_wna16(qw, s, quant_format="gptq", bits=3, group_size=32)
    with pytest.raises(HexlayoutError, match=r"\bscales\b"):  # 8-bit packing: K/4 rows, not K/8
        prepare_wna16(qw, s, quant_format="gptq", bits=8, group_size=32)


def _op_args(t=4, k=2, e=4, dtype=torch.float16):
    gen = torch.Generator().manual_seed(5)
    p13 = prepare_wna16(
        *checkpoint("gptq", 4, e, 64, 128, 32, dtype, gen)[0], quant_format="gptq", bits=4, group_size=32
    )
    p2 = prepare_wna16(
        *checkpoint("gptq", 4, e, 64, 64, 32, dtype, gen)[0], quant_format="gptq", bits=4, group_size=32
    )
    x = torch.randn(t, 64, generator=gen).to(dtype)
    ids = torch.randint(0, e, (t, k), generator=gen).to(torch.int32)
    return x, p13, p2, torch.rand(t, k, generator=gen), ids


def test_the_op_names_the_bad_argument() -> None:
    x, p13, p2, tw, ids = _op_args()
    with pytest.raises(HexlayoutError, match=r"\btopk_ids\b.*expected 0 <= id < 4"):
        fused_moe_wna16(x, p13, p2, tw, ids + 4)
    with pytest.raises(HexlayoutError, match=r"\bexpert_map\b"):
        fused_moe_wna16(
            x, p13, p2, tw, ids, expert_map=torch.zeros(3, dtype=torch.int32), global_num_experts=4
        )
    with pytest.raises(HexlayoutError, match=r"\bhidden_states\b.*contiguous"):
        fused_moe_wna16(torch.randn(64, 4).half().T, p13, p2, tw, ids)
    with pytest.raises(HexlayoutError, match=r"\bhidden_states\b.*alignment"):
        fused_moe_wna16(torch.randn(4 * 64 + 1).half()[1:].view(4, 64), p13, p2, tw, ids)
    with pytest.raises(HexlayoutError, match=r"\bapply_router_weight_on_input\b"):
        fused_moe_wna16(x, p13, p2, tw, ids, apply_router_weight_on_input=True)
    with pytest.raises(HexlayoutError, match=r"\bw13_scales\b"):
        fused_moe_wna16(x.bfloat16(), p13, p2, tw, ids)
    with pytest.raises(HexlayoutError, match=r"\bw2_scales\b.*expected 64"):
        fused_moe_wna16(x, p13, p13, tw, ids)
    with pytest.raises(HexlayoutError, match=r"\btopk_weights\b"):
        fused_moe_wna16(x, p13, p2, tw.double(), ids)
    with pytest.raises(HexlayoutError, match=r"\bactivation\b"):
        fused_moe_wna16(x, p13, p2, tw, ids, activation="relu")


def test_int64_ids_and_strided_inputs_name_the_fix() -> None:
    """torch.topk's int64 ids get ``topk_ids.int()``, a strided input ``.contiguous()``: eagerly and
    in the fake (FakeTensorMode) implementation."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, p13, p2, tw, ids = _op_args()
    ids64 = torch.topk(torch.randn(*ids.shape[:1], 4), ids.shape[1]).indices
    strided = x.t().contiguous().t()
    with pytest.raises(HexlayoutError, match=r"'topk_ids'.*torch\.int64.*pass topk_ids\.int\(\)"):
        fused_moe_wna16(x, p13, p2, tw, ids64)
    with pytest.raises(HexlayoutError, match=r"'hidden_states'.*pass hidden_states\.contiguous\(\)"):
        fused_moe_wna16(strided, p13, p2, tw, ids)
    weights = [p13.qweight, p13.scales, p13.zeros, p2.qweight, p2.scales, p2.zeros]
    consts = ["gptq", 4, 32, 32]
    with FakeTensorMode() as mode:
        fx, fs, ftw, fids, fids64 = (mode.from_tensor(a) for a in (x, strided, tw, ids, ids64))
        fw = [mode.from_tensor(w) if isinstance(w, torch.Tensor) else w for w in weights]
        with pytest.raises(HexlayoutError, match=r"'topk_ids'.*pass topk_ids\.int\(\)"):
            torch.ops.hexlayout.fused_moe_wna16(fx, *fw, ftw, fids64, *consts)
        with pytest.raises(HexlayoutError, match=r"'hidden_states'.*pass hidden_states\.contiguous\(\)"):
            torch.ops.hexlayout.fused_moe_wna16(fs, *fw, ftw, fids, *consts)


def test_fake_tensors_get_the_shape_and_the_same_checks() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, p13, p2, tw, ids = _op_args()
    args = [
        x,
        p13.qweight,
        p13.scales,
        p13.zeros,
        p2.qweight,
        p2.scales,
        p2.zeros,
        tw,
        ids,
        "gptq",
        4,
        32,
        32,
    ]
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
        out = torch.ops.hexlayout.fused_moe_wna16(*fake)
        assert out.shape == x.shape and out.dtype == x.dtype
        bad = list(fake)
        bad[10] = 8  # bits: the packed rows no longer match
        with pytest.raises(Exception, match=r"w13_qweight"):
            torch.ops.hexlayout.fused_moe_wna16(*bad)


def test_cpu_tensors_need_the_emulator(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEXLAYOUT_EMULATE")
    assert "HEXLAYOUT_EMULATE" not in os.environ
    x, p13, p2, tw, ids = _op_args()
    with pytest.raises(HexlayoutError, match="HEXLAYOUT_EMULATE"):
        fused_moe_wna16(x, p13, p2, tw, ids)


def test_fused_moe_dispatches_prepared_weights_through_the_real_alignment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """``hexlayout.ops.fused_moe`` with ``WNA16Weights`` runs ``fused_moe_wna16`` through the
    pipeline's own alignment kernels (moe_align)."""
    import hexlayout.ops as ops

    real = importlib.import_module("hexlayout.ops.moe.align").run_moe_align
    monkeypatch.setattr(importlib.import_module("hexlayout.ops.moe.pipeline"), "run_moe_align", real)
    gen = torch.Generator().manual_seed(21)
    ck13, w13 = checkpoint("awq", 4, 8, 64, 128, 32, torch.float16, gen)
    ck2, w2 = checkpoint("awq", 4, 8, 64, 64, 32, torch.float16, gen)
    p13 = ops.prepare_wna16(*ck13, quant_format="awq", bits=4, group_size=32)
    p2 = ops.prepare_wna16(*ck2, quant_format="awq", bits=4, group_size=32)
    x = torch.randn(16, 64, generator=gen).half()
    ids = routing("random", 16, 8, 2, gen)
    tw = torch.rand(16, 2, generator=gen)
    out = ops.fused_moe(x, p13, p2, tw, ids)
    want = reference(x, w13, w2, tw, ids, "silu", False, None)
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(torch.float16) * want.abs().max().item(), err


def test_the_documented_example_runs() -> None:
    """The example of docs/ops/prepare_wna16.md (AWQ 4-bit through ``fused_moe``) runs and gives a
    [T, H] f16 output."""
    import pathlib
    import re

    text = (pathlib.Path(__file__).resolve().parents[2] / "docs" / "ops" / "prepare_wna16.md").read_text()
    start = text.index("## Example\n")
    end = text.find("\n## ", start + 1)
    (code,) = re.findall(r"```python\n(.*?)```", text[start:end if end >= 0 else None], flags=re.S)
    ns: dict = {}
    exec(compile(code, "prepare_wna16.md[Example]", "exec"), ns)  # noqa: S102 - the doc's own example
    assert ns["out"].shape == (4, 128) and ns["out"].dtype == torch.float16
    assert ns["out"].isfinite().all() and ns["out"].abs().max() > 0


def test_the_stage_ring_wraps_over_four_and_five_k_tiles() -> None:
    """K = 320 in the gate-up kernel (BK 64: 5 k-tiles) and 256 in the down kernel (4 k-tiles)
    through the 3-stage cp.async ring: every stage slot is refilled after it was read."""
    from hexlayout.ops.moe.wna16 import wna16_config

    up, down = wna16_config(7 * 2, 4, 320, 64), wna16_config(7 * 2, 4, 256, 64)
    assert up["STAGES"] == down["STAGES"] == 3 and 320 // up["BK"] == 5 and 256 // down["BK"] == 4, (up, down)
    out, want = _run("awq", 4, 64, torch.float16, 7, 4, 2, "silu", "random", seed=11, h=320, i=256)
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(torch.float16) * want.abs().max().item(), (err, want.abs().max().item())
