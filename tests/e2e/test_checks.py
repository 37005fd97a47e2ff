"""What the emulator proves about lowered kernels: bank conflicts of unswizzled vs swizzled
stages, a planted race and a planted out-of-bounds access reported at their source lines."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import OutOfBoundsError, RaceError, run
from hexlayout.lang import f16
from hexlayout.lang.examples import explicit
from hexlayout.lang.examples.explicit import gemm_sm80_explicit
from hexlayout.layout import Layout
from hexlayout.synth.solve import synthesize


def _args(m: int = 128, n: int = 128, k: int = 128):
    rng = np.random.default_rng(0)
    return {"a": rng.standard_normal((m, k)).astype(np.float16),
            "b": rng.standard_normal((n, k)).astype(np.float16),
            "c": np.zeros((m, n), np.float16)}


def _line_of(fn, text: str) -> int:
    src, start = inspect.getsourcelines(fn)
    for i, line in enumerate(src):
        if text in line:
            return start + i
    raise AssertionError(text)


@pytest.mark.parametrize(("swizzle", "ratio"), [(False, 8), (True, 1)])
def test_ldmatrix_on_64_column_fp16_stages(swizzle: bool, ratio: int) -> None:
    prog = synthesize(gemm_sm80_explicit(BK=64, swizzle=swizzle).trace(), "sm_80").lowered
    report = run(prog.kernel, _args())
    ld = [s for s in report.sites if s.kind == "Ldmatrix"]
    assert ld
    for s in ld:
        assert s.smem_wavefronts == ratio * s.smem_ideal_wavefronts
    total = sum(s.bank_conflicts for s in ld)
    assert (total == 0) == swizzle and report.totals["bank_conflicts"] >= total


def test_missing_barrier_is_a_race_naming_both_lines() -> None:
    prog = synthesize(gemm_sm80_explicit(sync=False).trace(), "sm_80").lowered
    with pytest.raises(RaceError) as info:
        run(prog.kernel, _args(k=256))
    msg = str(info.value)
    src = inspect.getsource(explicit)
    assert "explicit.py" in msg
    lines = {int(x) for x in re.findall(r"explicit\.py:(\d+)", msg)}
    copy_lines = {i + 1 for i, line in enumerate(src.splitlines()) if "hl.copy(" in line}
    assert len(lines) >= 2 and lines <= copy_lines


M, N = hl.dims("M N")


@hl.kernel(threads=128)
def off_by_one_stage(a: f16[M, N], c: f16[M, N]):
    s_tile = hl.shared(f16, (32, 64, 2), layout=Layout((32, 64, 2), (64, 1, 2048)))
    r = hl.register(f16, (32, 64), layout=Layout((128, 16), (1, 128)))
    for k in hl.range(2):
        hl.copy(hl.view(a, tile=(32, 64), origin=(0, 0)), s_tile[:, :, k])
        hl.commit_group()
        hl.wait_group(0)
        hl.syncthreads()
        hl.copy(s_tile[:, :, k + 1], r)   # planted: stage k + 1 does not exist for k = 1
        hl.syncthreads()
    hl.copy(r, hl.view(c, tile=(32, 64), origin=(0, 0)))


def test_out_of_bounds_shared_read_names_its_line() -> None:
    prog = synthesize(off_by_one_stage.trace(), "sm_80").lowered
    rng = np.random.default_rng(1)
    args = {"a": rng.standard_normal((32, 64)).astype(np.float16), "c": np.zeros((32, 64), np.float16)}
    with pytest.raises(OutOfBoundsError) as info:
        run(prog.kernel, args)
    line = _line_of(off_by_one_stage.fn, "planted")
    assert f"test_checks.py:{line}" in str(info.value)
