"""Bad input to ``attention_varlen`` (issue 12's "Bad input"): each gets an ``ArgumentError`` /
``ArgumentTypeError`` naming the argument, eagerly, through ``torch.ops`` and (for checks that
do not read tensor contents) under ``FakeTensorMode``; content checks are skipped for fake
tensors."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
from hexlayout.ops.attention.varlen import attention_varlen  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from hexlayout.errors import HexlayoutError  # noqa: E402
from hexlayout.runtime.args import ArgumentError, ArgumentTypeError  # noqa: E402


@pytest.fixture(autouse=True)
def emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


F16 = torch.float16


def _i32(*xs: int) -> torch.Tensor:
    return torch.tensor(xs, dtype=torch.int32)


def _args(**over: Any) -> dict[str, Any]:
    """Two sequences: 2 + 1 queries, 4 + 3 keys; 4 query heads, 2 KV heads, head size 64."""
    a: dict[str, Any] = {
        "q": torch.randn(3, 4, 64).to(F16),
        "k": torch.randn(7, 2, 64).to(F16),
        "v": torch.randn(7, 2, 64).to(F16),
        "cu_seqlens_q": _i32(0, 2, 3),
        "cu_seqlens_k": _i32(0, 4, 7),
        "max_seqlen_q": 2,
        "max_seqlen_k": 4,
    }
    a.update(over)
    return a


CONTENT = [
    ({"cu_seqlens_q": _i32(0, 3, 2), "max_seqlen_q": 3}, "cu_seqlens_q", "decreases"),
    ({"cu_seqlens_k": _i32(0, 5, 4), "max_seqlen_k": 5}, "cu_seqlens_k", "decreases"),
    ({"cu_seqlens_q": _i32(0, 2, 5), "max_seqlen_q": 3}, "cu_seqlens_q", "past q's 3 tokens"),
    ({"cu_seqlens_k": _i32(0, 4, 9), "max_seqlen_k": 5}, "cu_seqlens_k", "past k's 7 tokens"),
    ({"cu_seqlens_q": _i32(-1, 2, 3), "max_seqlen_q": 3}, "cu_seqlens_q", "< 0"),
    ({"max_seqlen_q": 1}, "max_seqlen_q", "has 2 queries"),
    ({"max_seqlen_k": 3}, "max_seqlen_k", "has 4 keys"),
]

STATIC = [
    ({"q": torch.zeros(3, 4, 64)}, "q", "float32"),
    ({"k": torch.zeros(7, 2, 64, dtype=torch.bfloat16)}, "k", "bfloat16"),
    ({"q": torch.zeros(3, 4, 320, dtype=F16), "k": torch.zeros(7, 2, 320, dtype=F16),
      "v": torch.zeros(7, 2, 320, dtype=F16)}, "q", "head size 320"),
    ({"q": torch.zeros(3, 3, 64, dtype=F16)}, "q", "not a multiple"),
    ({"v": torch.zeros(7, 1, 64, dtype=F16)}, "v", "shape"),
    ({"v": torch.zeros(6, 2, 64, dtype=F16)}, "v", "shape"),
    ({"k": torch.zeros(7, 2, 128, dtype=F16), "v": torch.zeros(7, 2, 128, dtype=F16)}, "k", "head size 128"),
    ({"cu_seqlens_q": torch.tensor([0, 2, 3])}, "cu_seqlens_q", "int64"),
    ({"cu_seqlens_k": _i32(0, 7)}, "cu_seqlens_k", "B \\+ 1"),
    ({"window_size": (-3, 0)}, "window_size", ">= 0 or -1"),
    ({"softcap": -1.0}, "softcap", ">= 0"),
    ({"softmax_scale": 0.0}, "softmax_scale", "> 0"),
    ({"max_seqlen_q": -1}, "max_seqlen_q", ">= 0"),
]


@pytest.mark.parametrize(("over", "arg", "match"), CONTENT + STATIC)
def test_bad_input_names_the_argument(over: dict[str, Any], arg: str, match: str) -> None:
    with pytest.raises(ArgumentError, match=match) as e:
        attention_varlen(**_args(**over))
    assert e.value.arg == arg and isinstance(e.value, HexlayoutError)
    assert "attention_varlen" in str(e.value)
    with pytest.raises(ArgumentError) as e2:
        torch.ops.hexlayout.attention_varlen(**_args(**over))
    assert e2.value.arg == arg


@pytest.mark.parametrize(("over", "arg", "match"), STATIC)
def test_bad_input_under_fake_tensors(over: dict[str, Any], arg: str, match: str) -> None:
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(ArgumentError, match=match) as e:
        torch.ops.hexlayout.attention_varlen(**_args(**over))
    assert e.value.arg == arg


@pytest.mark.parametrize("over", [c[0] for c in CONTENT])
def test_content_checks_do_not_run_on_fake_tensors(over: dict[str, Any]) -> None:
    """Fake / meta tensors have no contents (and CUDA tensors are not read without
    HEXLAYOUT_CHECK=1): the fake implementation gives the output shapes."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        out, lse = torch.ops.hexlayout.attention_varlen(**_args(**over))
    assert out.shape == (3, 4, 64) and lse.shape == (4, 3)


def test_wrong_kinds() -> None:
    for over, arg in (
        ({"causal": 1}, "causal"),
        ({"return_lse": "yes"}, "return_lse"),
        ({"k": [[0.0]]}, "k"),
        ({"window_size": (1, 2, 3)}, "window_size"),
        ({"max_seqlen_k": 2.5}, "max_seqlen_k"),
    ):
        with pytest.raises(ArgumentTypeError) as e:
            attention_varlen(**_args(**over))
        assert e.value.arg == arg
