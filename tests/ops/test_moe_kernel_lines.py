"""Issue 11's size rule: every MoE kernel is at most 200 lines of the language. Each kernel
factory of the MoE modules (``*_kernel`` functions: alignment, bf16 / f16, W4A16 / W8A16, FP8,
split-K, for sm_80 / sm_89 / sm_90a) is measured from its ``def`` to its end, the kernel it
defines included."""

from __future__ import annotations

import importlib
import inspect

import pytest

MODULES = ("align", "kernels_sm80", "kernels_sm90", "wna16_kernels_sm80", "wna16_kernels_sm90",
           "fp8_kernels_sm89", "fp8_kernels_sm90", "splitk")


def _factories() -> list[tuple[str, object]]:
    out = []
    for m in MODULES:
        mod = importlib.import_module(f"hexlayout.ops.moe.{m}")
        for name, fn in vars(mod).items():
            fn = getattr(fn, "__wrapped__", fn)
            if name.endswith("_kernel") and inspect.isfunction(fn) and fn.__module__ == mod.__name__:
                out.append((f"{m}.{name}", fn))
    return out


def test_every_moe_module_defines_kernels() -> None:
    found = {name.split(".")[0] for name, _ in _factories()}
    assert found == set(MODULES)


@pytest.mark.parametrize("name,fn", _factories(), ids=lambda v: v if isinstance(v, str) else "")
def test_moe_kernel_is_at_most_200_lines(name: str, fn: object) -> None:
    src = inspect.getsource(fn)
    assert "@hl.kernel" in src, f"{name} defines no kernel"
    assert len(src.splitlines()) <= 200, f"{name}: {len(src.splitlines())} lines"
