"""``hexlayout.ops.paged_attention`` / ``torch.ops.hexlayout.paged_attention`` in the emulator
against a float64 reference per sequence: ragged mixed prefill / decode batches, GQA ratios
1, 2, 4, 8, block sizes 16, 32, 64, 128, NHD and HND (halves of one K|V tensor), shuffled block
tables whose unused entries hold garbage and -1, strided q, causal (bottom-right) and not,
windows, softcap, LSE, rows with no visible key, rows past ``cu_seqlens_q[-1]`` untouched."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
from hexlayout.ops.attention.paged import paged_attention, run_paged_attention  # noqa: E402


@pytest.fixture(autouse=True)
def emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


def make_case(
    seed: int,
    qlens: list[int],
    klens: list[int],
    h: int,
    kvh: int,
    d: int,
    bs: int,
    layout: str = "NHD",
    dtype: torch.dtype = torch.float16,
    pad: int = 0,
) -> dict:
    """Random q (a strided slice of a fused QKV tensor), caches, a shuffled block table."""
    g = torch.Generator().manual_seed(seed)
    b = len(qlens)
    blocks = [-(-n // bs) for n in klens]
    nb = sum(blocks) + 3
    maxb = max(blocks) + 2
    table = torch.randint(-(10**6), 10**6, (b, maxb), generator=g, dtype=torch.int32)
    table[:, -1] = -1  # unused entries: never read
    perm = torch.randperm(nb, generator=g).to(torch.int32)
    k = 0
    for s, n in enumerate(blocks):
        table[s, :n] = perm[k : k + n]
        k += n
    tq = sum(qlens) + pad
    qkv = torch.randn(tq, h + 2 * kvh, d, generator=g).to(dtype)
    if layout == "NHD":
        kc = torch.randn(nb, bs, kvh, d, generator=g).to(dtype)
        vc = torch.randn(nb, bs, kvh, d, generator=g).to(dtype)
    else:
        kv = torch.randn(nb, kvh, bs, 2 * d, generator=g).to(dtype)
        kc, vc = kv[..., :d], kv[..., d:]
    cu = torch.tensor([0, *torch.tensor(qlens).cumsum(0).tolist()], dtype=torch.int32)
    return {
        "q": qkv[:, :h],
        "key_cache": kc,
        "value_cache": vc,
        "cu_seqlens_q": cu,
        "seqused_k": torch.tensor(klens, dtype=torch.int32),
        "block_table": table,
        "max_seqlen_q": max(qlens),
        "max_seqlen_k": max(klens),
        "kv_layout": layout,
    }


def reference(
    a: dict,
    scale: float | None = None,
    causal: bool = True,
    window: tuple[int, int] = (-1, -1),
    softcap: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 attention per sequence and head, written from the issue's definition."""
    q, cu, ks, table = a["q"], a["cu_seqlens_q"].tolist(), a["seqused_k"].tolist(), a["block_table"]
    kc, vc = a["key_cache"], a["value_cache"]
    if a["kv_layout"] == "HND":
        kc, vc = kc.transpose(1, 2), vc.transpose(1, 2)
    tq, h, d = q.shape
    bs, kvh = kc.shape[1], kc.shape[2]
    scale = scale if scale is not None else d**-0.5
    out = torch.zeros(tq, h, d, dtype=torch.float64)
    lse = torch.full((h, tq), float("-inf"), dtype=torch.float64)
    for s in range(len(ks)):
        q0, sq, sk = cu[s], cu[s + 1] - cu[s], ks[s]
        j = torch.arange(sk)
        blk = table[s, j // bs].long()
        keys, vals = kc[blk, j % bs].double(), vc[blk, j % bs].double()
        i = torch.arange(sq)[:, None]
        vis = torch.ones(sq, sk, dtype=torch.bool)
        if causal:
            vis &= j[None, :] <= i + sk - sq
        if window[0] >= 0:
            vis &= j[None, :] >= i + sk - sq - window[0]
        if window[1] >= 0:
            vis &= j[None, :] <= i + sk - sq + window[1]
        for hh in range(h):
            sc = q[q0 : q0 + sq, hh].double() @ keys[:, hh // (h // kvh)].T * scale
            if softcap > 0:
                sc = softcap * torch.tanh(sc / softcap)
            sc = sc.masked_fill(~vis, float("-inf"))
            m = sc.max(1, keepdim=True).values.clamp(min=-1e300) if sk else torch.zeros(sq, 1)
            e = torch.exp(sc - m)
            tot = e.sum(1, keepdim=True)
            out[q0 : q0 + sq, hh] = (
                torch.where(tot > 0, e / tot.clamp(min=1e-300), 0.0) @ vals[:, hh // (h // kvh)]
            )
            lse[hh, q0 : q0 + sq] = (m + torch.log(tot)).squeeze(1)
    return out, lse


def _check(
    out: torch.Tensor, lse: torch.Tensor, want: tuple[torch.Tensor, torch.Tensor], rows: int, tol: float
) -> None:
    err = (out[:rows].double() - want[0][:rows]).abs().max().item()
    assert err <= tol, f"max abs error {err}"
    wl = want[1][:, :rows]
    fin = torch.isfinite(wl)
    assert torch.equal(torch.isfinite(lse[:, :rows]), fin)  # -inf exactly where no key is visible
    assert (lse[:, :rows][fin].double() - wl[fin]).abs().max().item() <= 1e-3


CASES = [
    # seed, qlens, klens, H, KVH, D, block, layout, dtype, options
    (0, [1, 5, 1, 17], [17, 9, 1, 40], 4, 2, 64, 16, "NHD", torch.float16, {}),
    (1, [3, 1], [33, 100], 8, 1, 128, 32, "HND", torch.bfloat16, {"causal": False, "softcap": 5.0}),
    (2, [6, 2], [20, 2], 4, 4, 64, 16, "NHD", torch.float16, {"window_size": (4, 0)}),
    (
        3,
        [5, 4],
        [3, 30],
        4,
        1,
        96,
        64,
        "HND",
        torch.float16,
        {"causal": False, "window_size": (3, 2), "softmax_scale": 0.3},
    ),
    (4, [2, 1], [130, 257], 8, 2, 64, 128, "NHD", torch.bfloat16, {}),
    (7, [1, 3], [19, 4], 2, 1, 256, 16, "NHD", torch.float16, {}),
]


@pytest.mark.parametrize(("seed", "qlens", "klens", "h", "kvh", "d", "bs", "layout", "dtype", "opts"), CASES)
def test_matches_float64(
    seed: int,
    qlens: list[int],
    klens: list[int],
    h: int,
    kvh: int,
    d: int,
    bs: int,
    layout: str,
    dtype: torch.dtype,
    opts: dict,
) -> None:
    a = make_case(seed, qlens, klens, h, kvh, d, bs, layout, dtype)
    out, lse = paged_attention(**a, **opts, return_lse=True)
    want = reference(
        a,
        opts.get("softmax_scale"),
        opts.get("causal", True),
        opts.get("window_size", (-1, -1)),
        opts.get("softcap", 0.0),
    )
    tol = 2e-3 if dtype == torch.float16 else 1.6e-2
    _check(out, lse, want, a["q"].shape[0], tol)


@pytest.mark.parametrize(
    ("splits", "opts", "d"),
    [
        (2, {}, 64),
        (3, {"window_size": (6, 0)}, 64),
        (8, {"causal": False, "softcap": 4.0}, 64),
        (3, {"softcap": 4.0}, 256),     # S over two 128-column halves of Q (no whole Q fragment)
    ],
)
def test_split_kv_matches_float64(splits: int, opts: dict, d: int) -> None:
    """Forced split counts (more splits than some sequences have key blocks: empty splits)
    through the torch op; the combine kernel leaves padding rows alone."""
    a = make_case(8, [1, 4, 2], [70, 9, 33], 4, 2, d, 16, pad=2)
    out, lse = torch.ops.hexlayout.paged_attention(**a, **opts, num_splits=splits)
    want = reference(
        a, None, opts.get("causal", True), opts.get("window_size", (-1, -1)), opts.get("softcap", 0.0)
    )
    _check(out, lse, want, 7, 2e-3)
    assert out[7:].isnan().all() and lse[:, 7:].isnan().all()  # never written: still the CPU's NaN fill


def test_torch_op_and_padding_rows_untouched() -> None:
    """Rows past cu_seqlens_q[-1] (CUDA-graph padding) are not written; the op returns both."""
    a = make_case(5, [1, 3], [24, 5], 4, 2, 64, 16, pad=3)
    out = torch.full(a["q"].shape, float("nan"), dtype=a["q"].dtype)
    lse = torch.full((4, a["q"].shape[0]), float("nan"))
    run_paged_attention(
        a["q"],
        a["key_cache"],
        a["value_cache"],
        a["cu_seqlens_q"],
        a["seqused_k"],
        a["block_table"],
        a["max_seqlen_q"],
        a["max_seqlen_k"],
        None,
        True,
        (-1, -1),
        0.0,
        "NHD",
        out=out,
        lse=lse,
    )
    assert out[-3:].isnan().all() and lse[:, -3:].isnan().all()
    want = reference(a)
    _check(out, lse, want, 4, 2e-3)
    o2, l2 = torch.ops.hexlayout.paged_attention(**a)
    assert torch.equal(o2[:4], out[:4]) and torch.equal(l2[:, :4], lse[:, :4])


@pytest.mark.parametrize("layout", ["offset", "every_other"])
def test_q_of_any_layout_is_read(layout: str) -> None:
    """q 2 bytes off 16-byte alignment, or every other element of a wider tensor (views that
    16-byte row vectors cannot read in place), gives what its contiguous copy gives."""
    a = make_case(9, [2, 5], [40, 17], 4, 2, 64, 16)
    q = a["q"]
    if layout == "offset":
        odd = torch.empty(q.numel() + 1, dtype=q.dtype)[1:].view(q.shape)
    else:
        odd = torch.empty(*q.shape[:-1], 2 * q.shape[-1], dtype=q.dtype)[..., ::2]
    odd.copy_(q)
    assert torch.equal(paged_attention(**{**a, "q": odd}), paged_attention(**a))


def test_fake_tensors() -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    a = make_case(6, [1, 2], [5, 7], 4, 2, 64, 16)
    with FakeTensorMode(allow_non_fake_inputs=True):
        out, lse = torch.ops.hexlayout.paged_attention(**a)
        assert out.shape == a["q"].shape and lse.shape == (4, 3) and lse.dtype == torch.float32


def test_kernel_is_at_most_150_lines() -> None:
    import inspect

    from hexlayout.ops.attention import paged_kernels_sm80 as attention_kernels

    for fn in (attention_kernels.paged_attention_kernel, attention_kernels.paged_attention_combine_kernel):
        src = inspect.getsource(fn)
        assert len(src[src.index("@hl.kernel") :].splitlines()) <= 150


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_vllm_stage_patterns_with_nan_in_unused_slots(arch: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the vLLM stage's tiny models hand the CPU backend: H 2 / KVH 1, head size 64, bf16,
    HND halves of one cache with block size 32, chunked prefill mixed with decodes, contexts
    shorter than a 64-key step and one past it (not a multiple of 64), two sequences sharing a
    prefix block, block-table padding pointing at block 0 (vLLM's null block); every cache row
    no sequence uses (the tail of each last block, the null block) holds NaN: a kernel that lets
    an unused row into P V (0 * NaN) or into the row sums writes NaN."""
    if arch != "sm_80":
        monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    a = make_case(11, [1, 5, 1, 3], [9, 21, 29, 70], 2, 1, 64, 32, "HND", torch.bfloat16)
    _stage_patterns(a, 32)
    out, lse = paged_attention(**a, return_lse=True)
    _check(out, lse, reference(a), a["q"].shape[0], 1.6e-2)


def _stage_patterns(a: dict, bs: int) -> None:
    """vLLM's block-table patterns in case ``a`` (block size ``bs``): sequence 1's first block
    shared with sequence 0 (a prefix), the table's padding pointing at block 0 (the null
    block), and NaN in every cache row no sequence uses (in any layout)."""
    table = a["block_table"]
    table[1, 0] = table[0, 0]                                  # a shared prefix block
    table[:, -1] = 0                                           # padding: the null block
    kc, vc = a["key_cache"], a["value_cache"]
    if a["kv_layout"] == "HND":
        kc, vc = kc.transpose(1, 2), vc.transpose(1, 2)
    used = torch.zeros(kc.shape[0], kc.shape[1], dtype=torch.bool)
    for s, n in enumerate(a["seqused_k"].tolist()):
        for j in range(n):
            used[table[s, j // bs], j % bs] = True
    kc[~used] = float("nan")
    vc[~used] = float("nan")


@pytest.mark.parametrize("splits", [1, 3])
def test_wide_key_blocks_hd128_f16_stage_patterns(splits: int) -> None:
    """Issue 26 item 6, the reverted 64-key variant's inputs: head size 128 in f16 takes 64 keys
    per step (4 pages of 16, whole blocks read page by page, row sums of P by an MMA against
    ones). GQA 4 (Mixtral's packing: 4 query heads a row group), out-of-order blocks, a shared
    prefix block, null-block padding, NaN in every unused cache row (the tail of each last
    block and whole unallocated pages inside the last 64-key span), contexts not a multiple of
    64 (37: one masked step; 70, 129: whole steps then a partial span over an allocated and an
    unallocated page), a chunked prefill beside decodes; whole and split-KV (3 splits, one
    empty for the short context)."""
    a = make_case(12, [1, 3, 1], [37, 70, 129], 4, 1, 128, 16)
    _stage_patterns(a, 16)
    out, lse = torch.ops.hexlayout.paged_attention(**a, num_splits=splits)
    _check(out, lse, reference(a), a["q"].shape[0], 2e-3)


def test_the_reverted_64_key_bf16_variant_is_correct(monkeypatch: pytest.MonkeyPatch) -> None:
    """The reverted variant (64-key blocks at head size 64, row sums of P by an MMA of P rounded
    to bf16 against ones) on the vLLM stage's inputs (bf16, H 2 / KVH 1, HND, block size 32,
    chunked prefill beside decodes, shared prefix, null-block padding, NaN in unused rows).
    Its divergence in the stage (AWQ Mixtral 28/32 tokens against vLLM's own run) was no
    kernel error: both kernels are within bf16 rounding of float64, but they round differently
    (the variant's denominator sums bf16-rounded P: its LSE is off by up to 2^-8 relative, the
    shipped kernel's by f32 rounding), and that difference flipped a near-tied top-2 expert
    choice later in the model (float64 router margin 0.0022 at that position), which the
    stage's old run-against-run comparison counted as a failure. The stage now checks each run
    against float64 and stops a sequence at a routing near tie; there the variant passes."""
    from hexlayout.ops.attention import paged as paged_mod

    a = make_case(11, [1, 5, 1, 3], [9, 21, 29, 70], 2, 1, 64, 32, "HND", torch.bfloat16)
    _stage_patterns(a, 32)
    want = reference(a)
    rows = a["q"].shape[0]
    shipped, shipped_lse = paged_attention(**a, return_lse=True)
    consts = paged_mod.paged_attention_consts

    def variant(head_size: int, *args: object, **kw: object) -> dict:
        c = consts(head_size, *args, **kw)
        assert c["HEAD_DIM"] == 64 and c["BN"] == 32          # the shipped choice at head size 64
        return {**c, "BN": 64, "CHUNK": 64, "DCHUNK": 64, "SUMS": 1}

    monkeypatch.setattr(paged_mod, "paged_attention_consts", variant)
    out, lse = paged_attention(**a, return_lse=True)
    for o, ls in ((shipped, shipped_lse), (out, lse)):
        _check(o, ls, want, rows, 1.6e-2)                     # both within bf16 rounding of float64
    fin = torch.isfinite(want[1][:, :rows])

    def lse_err(x: torch.Tensor) -> float:
        return (x[:, :rows][fin].double() - want[1][:, :rows][fin]).abs().max().item()

    assert lse_err(shipped_lse) <= 1e-5                        # f32 sums of unrounded P
    assert 1e-4 <= lse_err(lse) <= 2**-8                       # sums of P rounded to bf16
    diff = (out[:rows].double() - shipped[:rows].double()).abs()
    assert 0 < diff.max().item() <= 1.6e-2                    # different roundings, nothing more
