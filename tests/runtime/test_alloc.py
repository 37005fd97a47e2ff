"""``hexlayout.runtime.alloc``: ``fresh`` / ``fresh_like`` poison-fill CPU tensors (NaN for every
floating dtype, fp8 included; the most negative value for signed integers; all ones for unsigned
ones; True for bool) and leave meta tensors (and CUDA ones) uninitialised; ``zeroed`` is zeros."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
from hexlayout.runtime.alloc import fresh, fresh_like, poison_value, zeroed  # noqa: E402


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64,
                                   torch.float8_e4m3fn])
def test_floating_outputs_are_nan_on_the_cpu(dtype: torch.dtype) -> None:
    t = fresh((3, 5), dtype, torch.device("cpu"))
    assert t.shape == (3, 5) and t.dtype == dtype and t.float().isnan().all()
    like = fresh_like(t, (2,))
    assert like.dtype == dtype and like.float().isnan().all()


@pytest.mark.parametrize(("dtype", "value"), [(torch.int32, -(2**31)), (torch.int64, -(2**63)),
                                              (torch.int8, -128), (torch.uint8, 255), (torch.bool, True)])
def test_integer_outputs_hold_a_poison_value(dtype: torch.dtype, value: int) -> None:
    assert poison_value(dtype) == value
    assert (fresh((4,), dtype, "cpu") == value).all()


def test_meta_and_empty_tensors_and_zeroed() -> None:
    m = fresh((2, 3), torch.float16, "meta")
    assert m.device.type == "meta" and m.shape == (2, 3)
    assert fresh((0, 4), torch.float32, "cpu").shape == (0, 4)
    z = zeroed((2, 2), torch.float32, "cpu")
    assert z.dtype == torch.float32 and not z.any()
