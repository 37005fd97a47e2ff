"""Attention sinks (``sinks=`` of ``hexlayout.ops.paged_attention`` and
``hexlayout.ops.attention_varlen``: one f32 logit ``t_h`` per query head that joins the softmax
denominator only, as gpt-oss uses) in the emulator, on sm_80 (mma.sync) and sm_90a (wgmma),
against the float64 references of ``test_paged_attention_op`` / ``test_attention_varlen_op``
with the sink folded in from the definition: ``o_sink = o * Z / (Z + e^t)`` and ``lse_sink =
log(Z + e^t)`` with ``Z = e^lse`` (a row with no visible key: 0 and ``t``). Split-KV counts the
sink once; head sizes padded to the kernels' tiles; the argument checks name ``sinks``."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
import test_attention_varlen_op as varlen_case  # noqa: E402
import test_paged_attention_op as paged_case  # noqa: E402

from hexlayout.runtime.args import ArgumentError, ArgumentTypeError  # noqa: E402


@pytest.fixture(autouse=True)
def emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


def with_sinks(
    want: tuple[torch.Tensor, torch.Tensor], sinks: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """The float64 reference ``(out [T, H, D], lse [H, T])`` with sink ``t_h`` per head folded in."""
    out, lse = want
    t = sinks.double()[:, None]                                # [H, 1]
    lse_s = torch.logaddexp(lse, t.expand_as(lse))
    w = torch.exp(lse - lse_s)                                 # Z / (Z + e^t); 0 where Z = 0
    return out * w.T[:, :, None], lse_s


def _sinks(h: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(h, generator=g) * 2.0).float()


PAGED = [
    # arch, seed, qlens, klens, H, KVH, D, block, options, splits
    ("sm_80", 0, [1, 5, 1, 17], [17, 9, 1, 40], 4, 2, 64, 16, {}, 0),
    ("sm_80", 1, [3, 1], [33, 70], 4, 1, 80, 32, {"causal": False, "softcap": 5.0}, 3),
    ("sm_80", 2, [6, 2], [20, 2], 4, 4, 112, 16, {"window_size": (4, 0)}, 0),
    ("sm_90a", 0, [1, 5, 1, 17], [17, 9, 1, 140], 4, 2, 64, 16, {}, 2),
    ("sm_90a", 3, [2, 1], [19, 4], 2, 1, 192, 16, {"window_size": (3, 0)}, 0),
]


@pytest.mark.parametrize(("arch", "seed", "qlens", "klens", "h", "kvh", "d", "bs", "opts", "splits"), PAGED)
def test_paged_sinks_match_float64(
    arch: str, seed: int, qlens: list[int], klens: list[int], h: int, kvh: int, d: int, bs: int, opts: dict,
    splits: int, monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rows with no visible key (the window / causal cases) give 0 and the sink."""
    if arch != "sm_80":
        monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    a = paged_case.make_case(seed, qlens, klens, h, kvh, d, bs)
    sinks = _sinks(h, seed)
    out, lse = torch.ops.hexlayout.paged_attention(**a, **opts, num_splits=splits, sinks=sinks)
    want = paged_case.reference(
        a, None, opts.get("causal", True), opts.get("window_size", (-1, -1)), opts.get("softcap", 0.0)
    )
    paged_case._check(out, lse, with_sinks(want, sinks), a["q"].shape[0], 2e-3)


VARLEN = [
    # arch, seed, qlens, klens, H, KVH, D, options
    ("sm_80", 0, [3, 17], [3, 70], 4, 2, 64, {"causal": True}),
    ("sm_80", 1, [5, 1], [9, 20], 2, 1, 96, {"window_size": (4, 0), "softcap": 3.0}),
    ("sm_90a", 2, [3, 17], [3, 70], 2, 1, 128, {"causal": True}),
    ("sm_90a", 3, [4, 2], [4, 9], 2, 2, 256, {}),
]


@pytest.mark.parametrize(("arch", "seed", "qlens", "klens", "h", "kvh", "d", "opts"), VARLEN)
def test_varlen_sinks_match_float64(
    arch: str, seed: int, qlens: list[int], klens: list[int], h: int, kvh: int, d: int, opts: dict,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    if arch != "sm_80":
        monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    a = varlen_case.make_case(seed, qlens, klens, h, kvh, d)
    sinks = _sinks(h, seed)
    out, lse = hexlayout.ops.attention_varlen(**a, **opts, sinks=sinks, return_lse=True)
    want = varlen_case.reference(
        a, None, opts.get("causal", False), opts.get("window_size", (-1, -1)), opts.get("softcap", 0.0)
    )
    varlen_case._check(out, lse, with_sinks(want, sinks), a["q"].shape[0], torch.float16)


def test_sinks_checked_and_fake() -> None:
    """A wrong ``sinks`` is named; fake tensors give the outputs' shapes with sinks."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    a = paged_case.make_case(6, [1, 2], [5, 7], 4, 2, 64, 16)
    with pytest.raises(ArgumentError, match="sinks.*\\[H\\] = \\[4\\]"):
        hexlayout.ops.paged_attention(**a, sinks=torch.zeros(3))
    with pytest.raises(ArgumentError, match="sinks.*float32"):
        hexlayout.ops.paged_attention(**a, sinks=torch.zeros(4, dtype=torch.float16))
    with pytest.raises(ArgumentTypeError, match="sinks"):
        hexlayout.ops.paged_attention(**a, sinks=[0.0] * 4)
    v = varlen_case.make_case(1, [2], [2], 4, 2, 64)
    with pytest.raises(ArgumentError, match="attention_varlen.*sinks"):
        hexlayout.ops.attention_varlen(**v, sinks=torch.zeros(2))
    with FakeTensorMode(allow_non_fake_inputs=True):
        out, lse = torch.ops.hexlayout.paged_attention(**a, sinks=torch.zeros(4))
        assert out.shape == a["q"].shape and lse.shape == (4, 3)
