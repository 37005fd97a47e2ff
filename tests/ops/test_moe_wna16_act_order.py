"""GPTQ act-order (``desc_act=True``, ``g_idx``) through ``prepare_wna16(..., g_idx=)`` and
``torch.ops.hexlayout.fused_moe_wna16`` in the emulator, on sm_80 and sm_90a
(``HEXLAYOUT_EMULATE_ARCH``), against a float64 reference dequantized from the CHECKPOINT
tensors: row ``k`` of ``W[e]`` scaled by group ``g_idx[e, k]`` (random permutations of the
groups' rows, packed in checkpoint order); every validation error, eager and fake."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from hexlayout.ops.moe.wna16 import fused_moe_wna16, prepare_wna16  # noqa: E402
from test_moe_wna16 import _bound, gptq_pack, reference, reference_alignment, routing  # noqa: E402

from hexlayout.errors import HexlayoutError  # noqa: E402


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setattr("hexlayout.ops.moe.pipeline.run_moe_align", reference_alignment)


def act_order_checkpoint(bits: int, e: int, k: int, n: int, group: int, dtype: torch.dtype,
                         gen: torch.Generator):
    """GPTQ act-order checkpoint ``(qweight, scales, g_idx)`` of ``y = x @ W`` and ``W`` [E, K, N]
    float64: ``W[e, k, n] = (q[e, k, n] - 2^(bits-1)) * s[e, g_idx[e, k], n]``, ``g_idx[e]`` a
    random permutation of ``k // G`` (each group G rows, scattered over K)."""
    q = torch.randint(0, 2**bits, (e, k, n), generator=gen)
    gs = k if group == -1 else group
    g_idx = torch.stack([(torch.arange(k) // gs)[torch.randperm(k, generator=gen)] for _ in range(e)])
    s = (torch.rand(e, k // gs, n, generator=gen) * 0.02 + 0.004).to(dtype)
    row_s = s.double().gather(1, g_idx.unsqueeze(-1).expand(-1, -1, n))  # [E, K, N]: s of row k's group
    w = (q.double() - 2 ** (bits - 1)) * row_s
    return (gptq_pack(q, bits), s, g_idx.to(torch.int32)), w


def _run(bits, group, dtype, t, e, k, *, h, i, seed, act="silu", on_input=False, emap_half=False):
    gen = torch.Generator().manual_seed(seed)
    (q13, s13, g13), w13 = act_order_checkpoint(bits, e, h, 2 * i, group, dtype, gen)
    (q2, s2, g2), w2 = act_order_checkpoint(bits, e, i, h, group, dtype, gen)
    p13 = prepare_wna16(q13, s13, quant_format="gptq", bits=bits, group_size=group, g_idx=g13, gate_up=True)
    p2 = prepare_wna16(q2, s2, quant_format="gptq", bits=bits, group_size=group, g_idx=g2)
    assert p13.perm.dtype == torch.int32 and tuple(p13.perm.shape) == (e, h)
    x = torch.randn(t, h, generator=gen).to(dtype)
    emap, gne = None, e
    if emap_half:  # 2E global experts, the odd ones remote, the even ones local expert g / 2
        gne = 2 * e
        emap = torch.where(torch.arange(gne) % 2 == 0, torch.arange(gne) // 2, -1).to(torch.int32)
    ids = routing("random", t, gne, k, gen)
    tw = torch.rand(t, k, generator=gen)
    out = fused_moe_wna16(x, p13, p2, tw, ids, activation=act, apply_router_weight_on_input=on_input,
                          expert_map=emap, global_num_experts=gne if emap is not None else None)
    return out, reference(x, w13, w2, tw, ids, act, on_input, emap)


CASES = [
    # bits, group, dtype, T, E, k, H, I: groups 32 / 128; several k-tiles; N ragged against the 64-column tile
    (4, 32, torch.float16, 5, 4, 2, 160, 96),
    (4, 128, torch.bfloat16, 3, 4, 2, 256, 128),
    (8, 32, torch.bfloat16, 16, 4, 1, 96, 160),
    (4, 128, torch.float16, 70, 2, 2, 128, 128),      # the large-token config (BM 64)
]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize(("bits", "group", "dtype", "t", "e", "k", "h", "i"), CASES)
def test_act_order_matches_the_float64_reference(monkeypatch, arch, bits, group, dtype, t, e, k, h,
                                                 i) -> None:
    if arch == "sm_90a":
        monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")
    out, want = _run(bits, group, dtype, t, e, k, h=h, i=i, seed=t + h + i + bits)
    assert out.dtype == dtype and out.shape == want.shape and not out.isnan().any()
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(dtype) * want.abs().max().item(), (err, want.abs().max().item())


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_act_order_with_split_k(monkeypatch, arch) -> None:
    """The decode path a GPU takes (split-K partials, then the activation / cast kernels) on
    the gathered activations: ``HEXLAYOUT_MOE_SPLIT_K=2`` forces it on CPU tensors."""
    monkeypatch.setenv("HEXLAYOUT_MOE_SPLIT_K", "2")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    out, want = _run(4, 32, torch.float16, 2, 4, 2, h=128, i=64, seed=21)
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(torch.float16) * want.abs().max().item(), err


def test_act_order_with_remote_experts() -> None:
    """Slots of remote experts (``expert_map`` -1) gather by any order and are never read."""
    out, want = _run(4, 32, torch.float16, 8, 4, 3, h=64, i=64, seed=12, emap_half=True)
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(torch.float16) * want.abs().max().item(), err


def test_act_order_on_sm89(monkeypatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_89")
    out, want = _run(4, 32, torch.bfloat16, 4, 4, 2, h=64, i=96, seed=89)
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(torch.bfloat16) * want.abs().max().item(), err


def test_act_order_with_the_router_weight_on_the_input() -> None:
    out, want = _run(4, 32, torch.float16, 6, 4, 1, h=64, i=64, seed=9, on_input=True)
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(torch.float16) * want.abs().max().item(), err


def test_prepare_applies_the_permutation_to_the_rows_of_k() -> None:
    """Row ``k`` of the prepared weights is the checkpoint's row ``perm[e, k]``, which belongs to
    group ``k // G``; without ``g_idx`` there is no permutation."""
    gen = torch.Generator().manual_seed(2)
    (qw, s, g_idx), _ = act_order_checkpoint(4, 2, 64, 16, 32, torch.float16, gen)
    p = prepare_wna16(qw, s, quant_format="gptq", bits=4, group_size=32, g_idx=g_idx)
    want = torch.stack([torch.argsort(g, stable=True) for g in g_idx.long()])
    assert torch.equal(p.perm.long(), want)
    assert torch.equal(g_idx.long().gather(1, want), (torch.arange(64) // 32).expand(2, -1))
    plain = prepare_wna16(qw, s, quant_format="gptq", bits=4, group_size=32)
    assert plain.perm is None and not torch.equal(plain.qweight, p.qweight)


# ---- validation ----


def _ck(e=2, k=64, n=16, g=32):
    gen = torch.Generator().manual_seed(0)
    return act_order_checkpoint(4, e, k, n, g, torch.float16, gen)[0]


@pytest.mark.parametrize(
    ("g_idx", "match"),
    [
        (lambda g: g.long(), r"g_idx.*int32"),
        (lambda g: g[:, :32], r"g_idx.*\[E, K\]"),
        (lambda g: [0] * 64, r"g_idx.*expected an int32 tensor"),
        (lambda g: torch.where(g == 1, 2, g), r"g_idx.*\[0, 2\].*< K/G = 2"),
        (lambda g: torch.where(g == 1, -1, g), r"g_idx.*\[-1, 0\]"),
        (lambda g: torch.cat([torch.zeros_like(g[:, :33]), torch.ones_like(g[:, 33:])], 1),
         r"g_idx.*expert 0 has 33 rows in group 0.*exactly group_size = 32"),
    ],
)
def test_prepare_names_a_bad_g_idx(g_idx, match) -> None:
    qw, s, g = _ck()
    with pytest.raises(HexlayoutError, match=match):
        prepare_wna16(qw, s, quant_format="gptq", bits=4, group_size=32, g_idx=g_idx(g))


def test_g_idx_is_refused_for_awq() -> None:
    from test_moe_wna16 import checkpoint

    gen = torch.Generator().manual_seed(1)
    (qw, s, qz), _ = checkpoint("awq", 4, 2, 64, 16, 32, torch.float16, gen)
    g = (torch.arange(64) // 32).expand(2, -1).to(torch.int32).contiguous()
    with pytest.raises(HexlayoutError, match=r"g_idx.*GPTQ"):
        prepare_wna16(qw, s, qz, quant_format="awq", bits=4, group_size=32, g_idx=g)


def _op_tensors(e=2, h=64, i=64):
    gen = torch.Generator().manual_seed(4)
    (q13, s13, g13), _ = act_order_checkpoint(4, e, h, 2 * i, 32, torch.float16, gen)
    (q2, s2, g2), _ = act_order_checkpoint(4, e, i, h, 32, torch.float16, gen)
    p13 = prepare_wna16(q13, s13, quant_format="gptq", bits=4, group_size=32, g_idx=g13, gate_up=True)
    p2 = prepare_wna16(q2, s2, quant_format="gptq", bits=4, group_size=32, g_idx=g2)
    x = torch.randn(3, h, generator=gen).half()
    ids = torch.tensor([[0, 1], [1, 0], [0, 1]], dtype=torch.int32)
    tw = torch.rand(3, 2, generator=gen)
    return x, p13, p2, tw, ids


_BAD_PERMS = [
    ({"w13_perm": "p13.long()"}, r"w13_perm.*int32 \[E, K\]"),
    ({"w2_perm": "p2[:, :32]"}, r"w2_perm.*int32 \[E, K\] = \[2, 64\]"),
    ({"w13_perm": "p2"}, None),                       # a valid permutation of another expert: allowed
    ({"w2_perm": "torch.zeros_like(p2)"}, r"w2_perm.*not a permutation"),
    ({"w13_perm": "p13.t().contiguous().t()"}, r"w13_perm.*contiguous"),
]


@pytest.mark.parametrize(("change", "match"), _BAD_PERMS)
@pytest.mark.parametrize("fake", [False, True])
def test_the_op_names_a_bad_perm(change, match, fake) -> None:
    """Eagerly and in the fake implementation (FakeTensorMode) alike, but for the content check
    (is each row a permutation?), which needs the values."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    x, p13, p2, tw, ids = _op_tensors()
    kw = {"w13_perm": p13.perm, "w2_perm": p2.perm}
    env = {"p13": p13.perm, "p2": p2.perm, "torch": torch}
    kw.update({name: eval(expr, env) for name, expr in change.items()})  # noqa: S307 - test table
    tensors, consts = p13.op_args(p2)
    args = (x, *tensors, tw, ids, *consts)
    if fake and match is not None and "permutation" in match:
        match = None                                  # values: checked only where they exist
    if fake:
        with FakeTensorMode(allow_non_fake_inputs=True) as mode:
            fargs = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a for a in args]
            fkw = {n: mode.from_tensor(v) for n, v in kw.items()}
            if match is None:
                out = torch.ops.hexlayout.fused_moe_wna16(*fargs, **fkw)
                assert tuple(out.shape) == tuple(x.shape)
                return
            with pytest.raises(HexlayoutError, match=match):
                torch.ops.hexlayout.fused_moe_wna16(*fargs, **fkw)
        return
    if match is None:
        assert torch.ops.hexlayout.fused_moe_wna16(*args, **kw).shape == x.shape
        return
    with pytest.raises(HexlayoutError, match=match):
        torch.ops.hexlayout.fused_moe_wna16(*args, **kw)
