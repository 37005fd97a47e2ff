"""Compile evidence for the Mamba-1 kernels (issue 24): ``selective_scan`` (bf16, every option on:
softplus, D, z, delta_bias, last state; N = 16, the shipped tile of 32 channels x 16 steps, with
64-bit vector loads along L) and ``selective_state_update`` (bf16 inputs with an f32 state moved
as 128-bit vectors, N = 16 and N = 128) compile with NVRTC
for sm_80 and sm_90a without spills or local memory; and each kernel is at most 150 lines of the
language (issue 24's size rule). Static numbers are in docs/ops/selective_scan.md."""

from __future__ import annotations

import inspect

import pytest

ALL = {"SOFTPLUS": True, "HAS_D": True, "HAS_Z": True, "HAS_BIAS": True}


def _no_spills(b) -> None:
    res = b.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, res
    assert not any(name.startswith(("LDL", "STL")) for name in b.compiled.sass_counts())


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a"])
def test_selective_scan_compiles_without_spills(arch: str) -> None:
    from hexlayout.ops.mamba.selective_scan_kernel import selective_scan_consts, selective_scan_kernel

    import hexlayout.lang as hl
    from hexlayout.runtime import build

    consts = {**selective_scan_consts(1536, 16, 4096), **ALL, "LAST": True}
    b = build(selective_scan_kernel(hl.bf16), arch, **consts)
    _no_spills(b)
    assert b.compiled.resources.registers <= 96, b.compiled.resources   # 48 on sm_80, 56 on sm_90a
    counts = b.compiled.sass_counts()
    assert any(name.startswith("MUFU.EX2") for name in counts) and any(n.startswith("LDS") for n in counts)
    assert any(name.startswith("LDG.E.64") for name in counts), counts   # 64-bit vectors along L


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a"])
@pytest.mark.parametrize("n", [16, 128])
def test_state_update_compiles_without_spills(arch: str, n: int) -> None:
    from hexlayout.ops.mamba.state_update_kernel import state_update_consts, state_update_kernel

    import hexlayout.lang as hl
    from hexlayout.runtime import build

    consts = {**state_update_consts(64, n), **ALL, "HAS_IDX": True}
    b = build(state_update_kernel(hl.bf16, hl.f32, hl.i32), arch, **consts)
    _no_spills(b)
    counts = b.compiled.sass_counts()   # the f32 state moves as 128-bit vectors
    assert any(n.startswith("LDG.E.128") for n in counts) and any(n.startswith("STG.E.128") for n in counts)


@pytest.mark.parametrize("factory", ["selective_scan_kernel.selective_scan_kernel",
                                     "state_update_kernel.state_update_kernel"])
def test_kernel_is_at_most_150_lines(factory: str) -> None:
    import importlib

    mod, name = factory.split(".")
    fn = getattr(importlib.import_module(f"hexlayout.ops.mamba.{mod}"), name)
    src = inspect.getsource(getattr(fn, "__wrapped__", fn))
    assert "@hl.kernel" in src and len(src.splitlines()) <= 150, len(src.splitlines())


def test_bench_static_traces_both_kernels() -> None:
    """``benchmarks/bench_static.py --only mamba1`` lists the builds the two ops launch (traced on
    meta tensors through their host paths) on sm_80 and sm_90a."""
    import importlib.util
    import sys
    from pathlib import Path

    script = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_static.py"
    spec = importlib.util.spec_from_file_location("bench_static_mamba1", script)
    bench_static = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = bench_static  # its dataclasses look their module up
    spec.loader.exec_module(bench_static)
    cases = bench_static.serving_cases(["mamba1"])
    got = {(c.arch, c.factory) for c in cases}
    want = {(a, f) for a in ("sm_80", "sm_90a") for f in ("selective_scan_kernel", "state_update_kernel")}
    assert got == want, got
    assert len(cases) == 6 and all(c.problems for c in cases)   # one scan, two state-update builds per arch
