"""Bad input to ``paged_attention`` (issue 12's "Bad input"): each gets an ``ArgumentError`` /
``ArgumentTypeError`` naming the argument, eagerly, through ``torch.ops`` and (for checks that
do not read tensor contents) under ``FakeTensorMode``."""

from __future__ import annotations

from typing import Any

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
from hexlayout.ops.attention.paged import paged_attention  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from hexlayout.runtime.args import ArgumentError, ArgumentTypeError  # noqa: E402


@pytest.fixture(autouse=True)
def emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


F16 = torch.float16


def _args(**over: Any) -> dict[str, Any]:
    """Two sequences: 2 + 1 queries, 20 and 5 keys, block size 16 (2 blocks per row of the table)."""
    a: dict[str, Any] = {
        "q": torch.zeros(3, 4, 64, dtype=F16), "key_cache": torch.zeros(4, 16, 2, 64, dtype=F16),
        "value_cache": torch.zeros(4, 16, 2, 64, dtype=F16),
        "cu_seqlens_q": torch.tensor([0, 2, 3], dtype=torch.int32),
        "seqused_k": torch.tensor([20, 5], dtype=torch.int32),
        "block_table": torch.tensor([[0, 1], [2, -1]], dtype=torch.int32),
        "max_seqlen_q": 2, "max_seqlen_k": 20,
    }
    a.update(over)
    return a


CONTENT = [
    ({"cu_seqlens_q": torch.tensor([0, 3, 2], dtype=torch.int32)}, "cu_seqlens_q", "decreases"),
    ({"cu_seqlens_q": torch.tensor([0, 2, 5], dtype=torch.int32), "max_seqlen_q": 3}, "cu_seqlens_q",
     "past q's 3 tokens"),
    ({"seqused_k": torch.tensor([40, 5], dtype=torch.int32), "max_seqlen_k": 40}, "block_table",
     "needs 3"),
    ({"block_table": torch.tensor([[0, 9], [2, -1]], dtype=torch.int32)}, "block_table", "block 9"),
    ({"max_seqlen_q": 1}, "max_seqlen_q", "has 2 queries"),
    ({"seqused_k": torch.tensor([-1, 5], dtype=torch.int32)}, "seqused_k", "< 0"),
]

STATIC = [
    ({"q": torch.zeros(3, 4, 64)}, "q", "float32"),
    ({"q": torch.zeros(3, 4, 320, dtype=F16), "key_cache": torch.zeros(4, 16, 2, 320, dtype=F16),
      "value_cache": torch.zeros(4, 16, 2, 320, dtype=F16)}, "key_cache", "head size 320"),
    ({"value_cache": torch.zeros(4, 16, 1, 64, dtype=F16)}, "value_cache", "KVH"),
    ({"value_cache": torch.zeros(4, 32, 2, 64, dtype=F16)}, "value_cache", "block_size"),
    ({"value_cache": torch.zeros(4, 16, 2, 128, dtype=F16)[..., :64].contiguous()[..., :56]}, "value_cache",
     "head size"),
    ({"q": torch.zeros(3, 3, 64, dtype=F16)}, "q", "not a multiple"),
    ({"key_cache": torch.zeros(4, 16, 2, 128, dtype=F16)[..., ::2]}, "key_cache", "contiguous"),
    ({"cu_seqlens_q": torch.tensor([0, 3], dtype=torch.int32)}, "cu_seqlens_q", "B \\+ 1"),
    ({"block_table": torch.zeros(3, 2, dtype=torch.int32)}, "block_table", "rows"),
    ({"seqused_k": torch.tensor([20, 5])}, "seqused_k", "int64"),
    ({"num_splits": 17}, "num_splits", "at most 16"),
    ({"window_size": (-3, 0)}, "window_size", ">= 0 or -1"),
    ({"softcap": -1.0}, "softcap", ">= 0"),
    ({"kv_layout": "NDH"}, "kv_layout", "HND"),
]


@pytest.mark.parametrize(("over", "arg", "match"), CONTENT + STATIC)
def test_bad_input_names_the_argument(over: dict[str, Any], arg: str, match: str) -> None:
    with pytest.raises(ArgumentError, match=match) as e:
        paged_attention(**_args(**over))
    assert e.value.arg == arg
    with pytest.raises(ArgumentError) as e2:
        torch.ops.hexlayout.paged_attention(**_args(**over))
    assert e2.value.arg == arg


@pytest.mark.parametrize(("over", "arg", "match"), STATIC)
def test_bad_input_under_fake_tensors(over: dict[str, Any], arg: str, match: str) -> None:
    with FakeTensorMode(allow_non_fake_inputs=True), pytest.raises(ArgumentError, match=match) as e:
        torch.ops.hexlayout.paged_attention(**_args(**over))
    assert e.value.arg == arg


@pytest.mark.parametrize("over", [c[0] for c in CONTENT])
def test_content_checks_do_not_run_on_fake_tensors(over: dict[str, Any]) -> None:
    """Fake / meta tensors have no contents (and CUDA tensors are not read without
    HEXLAYOUT_CHECK=1): the fake implementation gives the output shapes."""
    with FakeTensorMode(allow_non_fake_inputs=True):
        out, lse = torch.ops.hexlayout.paged_attention(**_args(**over))
    assert out.shape == (3, 4, 64) and lse.shape == (4, 3)


def test_wrong_kinds() -> None:
    with pytest.raises(ArgumentTypeError) as e:
        paged_attention(**_args(causal=1))
    assert e.value.arg == "causal"
    with pytest.raises(ArgumentTypeError) as e:
        paged_attention(**_args(block_table=[[0, 1], [2, 3]]))
    assert e.value.arg == "block_table"
