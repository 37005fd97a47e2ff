"""The sm_90a varlen (prefill) kernel, FlashAttention-3's structure (``attention_varlen_sm90_kernel``:
a TMA producer warp group, two wgmma consumer warp groups, a K/V stage ring on mbarriers),
synthesized for sm_90a and run in the emulator against a float64 reference per sequence:
ragged batches (lengths 1, 17, 100, 257 and empty ones), GQA, head sizes 64 / 96 / 128 / 256,
f16 / bf16, causal (bottom-right), windows, softcap, LSE; q / k / v strided views of one
fused QKV tensor; Q / K / V rows past the last sequence hold NaN (a sequence's last key block
is read shifted to end at its last key);
rows past ``cu_seqlens_q[-1]`` are never written."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
from hexlayout.ops.attention.args import head_dim_tile  # noqa: E402
from hexlayout.ops.attention.kernels_sm90 import (  # noqa: E402
    attention_varlen_sm90_consts,
    attention_varlen_sm90_kernel,
)
from hexlayout.ops.host.launch import fresh, lang_dtype, run_kernel  # noqa: E402

from hexlayout.ir.lowered import TmaLoad, Wgmma  # noqa: E402
from hexlayout.runtime import build  # noqa: E402

LOG2E = 1.4426950408889634
BIG = 1 << 30


def _cu(lens: list[int]) -> torch.Tensor:
    return torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32)


def reference(q, k, v, cq, ck, causal, window, softcap):
    """float64 attention per sequence and head, from the definition (0 / -inf without keys)."""
    tq, h, d = q.shape
    g = h // k.shape[1]
    out = torch.zeros(tq, h, d, dtype=torch.float64)
    lse = torch.full((h, tq), float("-inf"), dtype=torch.float64)
    for s in range(len(cq) - 1):
        q0, sq, k0, sk = cq[s], cq[s + 1] - cq[s], ck[s], ck[s + 1] - ck[s]
        i, j = torch.arange(sq)[:, None], torch.arange(sk)[None, :]
        vis = torch.ones(sq, sk, dtype=torch.bool)
        if causal:
            vis &= j <= i + sk - sq
        if window[0] >= 0:
            vis &= j >= i + sk - sq - window[0]
        if window[1] >= 0:
            vis &= j <= i + sk - sq + window[1]
        for hh in range(h):
            sc = q[q0 : q0 + sq, hh].double() @ k[k0 : k0 + sk, hh // g].double().T * d**-0.5
            if softcap > 0:
                sc = softcap * torch.tanh(sc / softcap)
            sc = sc.masked_fill(~vis, float("-inf"))
            m = sc.amax(1, keepdim=True).clamp(min=-1e300) if sk else torch.zeros(sq, 1, dtype=torch.float64)
            e = torch.exp(sc - m)
            tot = e.sum(1, keepdim=True)
            out[q0 : q0 + sq, hh] = (
                torch.where(tot > 0, e / tot.clamp(min=1e-300), 0.0) @ v[k0 : k0 + sk, hh // g].double()
            )
            lse[hh, q0 : q0 + sq] = (m + torch.log(tot)).squeeze(1)
    return out, lse


def run_sm90(q, k, v, cu_q, cu_k, max_q, causal, window, softcap):
    """The kernel as the op runs it (log2-domain scale, key bounds relative to each row's
    aligned key, an unbounded side 2^30), in the emulator for sm_90a."""
    tq, h, d = q.shape
    left, right = (w if w >= 0 else BIG for w in window)
    if causal:
        right = min(right, 0)
    scale = 1 / math.sqrt(d)
    qk_scale, cap = (scale / softcap, softcap * LOG2E) if softcap > 0 else (scale * LOG2E, 0.0)
    consts = attention_varlen_sm90_consts(head_dim_tile(d), left < BIG, right < BIG, softcap > 0)
    bld = build(attention_varlen_sm90_kernel(lang_dtype(q.dtype)), "sm_90a", compile=False, **consts)
    kinds = set()
    stack = list(bld.lowered.body)
    while stack:
        i = stack.pop()
        kinds.add(type(i))
        stack += [*getattr(i, "body", []), *getattr(i, "then_body", []), *getattr(i, "else_body", [])]
    assert {TmaLoad, Wgmma} <= kinds
    out = fresh((tq, h, d), q.dtype, q.device)          # NaN: what the kernel does not write stays NaN
    lse = fresh((h, tq), torch.float32, q.device)
    run_kernel(
        bld,
        (q, k, v, cu_q, cu_k, out, lse, torch.zeros(1), qk_scale, cap, left, right,
         -(-max_q // consts["BM"])),
        outputs=(5, 6),
        strides=(0, 1, 2),
    )
    return out, lse


CASES = [
    # seed, qlens, klens, H, KVH, D, dtype, causal, window, softcap
    (0, [1, 17, 100, 257], [1, 17, 100, 257], 1, 1, 64, torch.float16, True, (-1, -1), 0.0),
    (1, [3, 20], [50, 20], 8, 2, 128, torch.bfloat16, False, (-1, -1), 5.0),
    (2, [70, 0, 3], [90, 5, 0], 4, 1, 64, torch.float16, True, (40, -1), 0.0),
    (3, [9, 14], [12, 14], 2, 2, 256, torch.bfloat16, False, (4, 3), 2.0),
    (4, [130, 6], [140, 6], 8, 1, 96, torch.float16, True, (-1, -1), 0.0),  # head size padded to 128
    (5, [5, 40], [70, 40], 2, 1, 256, torch.bfloat16, True, (-1, -1), 0.0),  # OVERLAP=False schedule
]


@pytest.mark.parametrize(
    ("seed", "qlens", "klens", "h", "kvh", "d", "dtype", "causal", "window", "softcap"), CASES
)
def test_sm90_varlen_kernel_matches_float64(
    seed, qlens, klens, h, kvh, d, dtype, causal, window, softcap
) -> None:
    g = torch.Generator().manual_seed(seed)
    pad = 3
    tq, tk = sum(qlens) + pad, sum(klens) + pad
    q = torch.randn(tq, h + 1, d, generator=g).to(dtype)[:, 1:]  # strided views
    kv = torch.randn(tk, 2 * kvh, d, generator=g).to(dtype)
    k, v = kv[:, :kvh], kv[:, kvh:]
    for t in (q, k, v):  # padding rows: NaN (never read into a result)
        t[-pad:] = float("nan")
    cq, ck = _cu(qlens), _cu(klens)
    out, lse = run_sm90(q, k, v, cq, ck, max(qlens), causal, window, softcap)
    want = reference(q, k, v, cq.tolist(), ck.tolist(), causal, window, softcap)
    rows = sum(qlens)
    tol = 2e-3 if dtype == torch.float16 else 1.6e-2
    assert (out[:rows].double() - want[0][:rows]).abs().max().item() <= tol
    fin = torch.isfinite(want[1][:, :rows])
    assert torch.equal(torch.isfinite(lse[:, :rows]), fin)
    assert (lse[:, :rows][fin].double() - want[1][:, :rows][fin]).abs().max().item() <= 1e-3
    assert out[rows:].isnan().all() and lse[:, rows:].isnan().all()  # padding rows untouched


def test_op_dispatches_to_the_sm90_kernel(monkeypatch: pytest.MonkeyPatch) -> None:
    """``hexlayout.ops.attention_varlen`` emulating sm_90a runs the wgmma kernel on fused-QKV
    views (the op's argument checks guarantee what TMA needs: 16-byte aligned data and row
    strides), and the sm_80 kernel without the emulated architecture; both match."""
    import hexlayout.ops  # noqa: F401 - registers the ops
    from hexlayout.ops.attention import varlen as op

    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    names = []
    real = op.build_for

    def spy(kernel, device, consts):
        names.append(kernel.name)
        return real(kernel, device, consts)

    monkeypatch.setattr(op, "build_for", spy)
    g = torch.Generator().manual_seed(9)
    lens = [5, 40]
    qkv = torch.randn(45, 4, 64, generator=g).to(torch.float16)
    q, k, v = qkv[:, :2], qkv[:, 2:3], qkv[:, 3:]
    want = reference(q, k, v, _cu(lens).tolist(), _cu(lens).tolist(), True, (-1, -1), 0.0)
    for arch in ("sm_90a", "sm_80"):
        monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
        out, lse = op.attention_varlen(q, k, v, _cu(lens), _cu(lens), 40, 40, causal=True, return_lse=True)
        assert (out.double() - want[0]).abs().max().item() <= 2e-3
        assert (lse.double() - want[1]).abs().max().item() <= 1e-3
    assert names == ["attention_varlen_sm90_f16", "attention_varlen_f16"], names
