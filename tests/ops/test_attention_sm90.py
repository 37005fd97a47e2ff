"""The sm_90a paged attention kernel (wgmma, ``ops/attention_kernels_sm90.py``) through
``hexlayout.ops.paged_attention`` with ``HEXLAYOUT_EMULATE_ARCH=sm_90a``: the emulator runs
the wgmma kernel (checked: the build's lowered code holds wgmma, no mma.sync) against the
float64 reference of ``test_paged_attention_op`` on ragged mixed prefill / decode batches,
GQA, both KV layouts, causal / window / softcap, LSE and forced split counts."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
from hexlayout.ops.attention import paged as attention  # noqa: E402
from hexlayout.ops.attention.paged import paged_attention  # noqa: E402
from hexlayout.ops.host.device import kernel_arch  # noqa: E402
from test_paged_attention_op import _check, make_case, reference  # noqa: E402


@pytest.fixture(autouse=True)
def emulate_sm90(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")


def _flat(body):
    for i in body:
        yield i
        for sub in ("body", "then_body", "else_body"):
            yield from _flat(getattr(i, sub, []))


CASES = [
    # seed, qlens, klens, H, KVH, D, block, layout, dtype, options, splits
    (0, [1, 5, 1, 17], [17, 9, 1, 140], 4, 2, 64, 16, "NHD", torch.float16, {}, 0),
    (1, [3, 1], [33, 100], 8, 1, 128, 32, "HND", torch.bfloat16, {"causal": False, "softcap": 5.0}, 0),
    (2, [6, 2], [150, 2], 4, 4, 64, 16, "NHD", torch.float16, {"window_size": (70, 0)}, 0),
    (4, [2, 1], [130, 257], 8, 2, 64, 128, "NHD", torch.bfloat16, {}, 3),
    (5, [1, 4, 2], [200, 9, 70], 4, 1, 64, 32, "HND", torch.float16, {"causal": False}, 2),
    (3, [5, 4], [3, 30], 4, 1, 96, 64, "HND", torch.float16, {"causal": False, "window_size": (3, 2)}, 0),
    (7, [1, 3], [19, 4], 2, 1, 256, 16, "NHD", torch.float16, {"softmax_scale": 0.3}, 0),
    # five 64-key blocks in one split: the OVERLAP ring of three K / V buffers wraps
    (8, [1, 2], [300, 260], 4, 1, 128, 16, "NHD", torch.bfloat16, {}, 0),
]


@pytest.mark.parametrize(
    ("seed", "qlens", "klens", "h", "kvh", "d", "bs", "layout", "dtype", "opts", "splits"), CASES
)
def test_sm90_kernel_matches_float64(
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
    splits: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert kernel_arch(torch.device("cpu")) == "sm_90a"
    built = []
    real_build = attention.build_for

    def spy(kernel, device, consts):
        b = real_build(kernel, device, consts)
        built.append(b)
        return b

    monkeypatch.setattr(attention, "build_for", spy)
    a = make_case(seed, qlens, klens, h, kvh, d, bs, layout, dtype)
    out, lse = paged_attention(**a, **opts, num_splits=splits, return_lse=True)
    instrs = {type(i).__name__ for i in _flat(built[0].lowered.body)}
    assert {"Wgmma", "FenceProxyAsync", "CpAsync"} <= instrs and "MmaSync" not in instrs
    assert len(built) == (2 if splits > 1 else 1)  # the split-KV partials and the combine kernel
    want = reference(
        a,
        opts.get("softmax_scale"),
        opts.get("causal", True),
        opts.get("window_size", (-1, -1)),
        opts.get("softcap", 0.0),
    )
    tol = 2e-3 if dtype == torch.float16 else 1.6e-2
    _check(out, lse, want, a["q"].shape[0], tol)


@pytest.mark.parametrize(("ksplit", "overlap"), [(1, True), (2, False)])
def test_every_schedule_matches_float64(ksplit: int, overlap: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each schedule the kernel has, whatever the chooser picks for the head size: one warp group
    with the overlap (its three-buffer ring wrapping), two warp groups waited for; five 64-key
    blocks, causal rows that see all but the last one whole, an odd and an even count of blocks
    per warp group."""
    real = attention.paged_attention_sm90_consts

    def forced(*args, **kwargs):
        return {**real(*args, **kwargs), "KSPLIT": ksplit, "OVERLAP": overlap}

    monkeypatch.setattr(attention, "paged_attention_sm90_consts", forced)
    a = make_case(9, [1, 3], [300, 200], 4, 1, 128, 16, "NHD", torch.bfloat16)
    out, lse = paged_attention(**a, num_splits=1, return_lse=True)
    want = reference(a, None, True, (-1, -1), 0.0)
    _check(out, lse, want, a["q"].shape[0], 1.6e-2)


def test_sm90_kernels_are_at_most_150_lines() -> None:
    import inspect

    from hexlayout.ops.attention import kernels_sm90 as m

    for f in (m.paged_attention_sm90_kernel, m.attention_varlen_sm90_kernel):
        src = inspect.getsource(f)
        assert len(src[src.index("@hl.kernel") :].splitlines()) <= 150, f.__name__
