"""PTX mode checks what was printed: errors name the PTX line, the opcode, the CUDA line of
the ``.loc`` and the kernel source line; changes to the printed CUDA text that a printer bug
could make (a shuffle offset, a loop bound, a dropped predicate, an index off alignment, a
swizzle XOR constant, an mma operand's register order; on sm_90a in test_sm90: a descriptor
swizzle mode, a TMA coordinate order, an mbarrier parity)
fail in PTX mode while IR mode, which runs the lowered program, still passes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hexlayout.runtime as rt
from hexlayout.codegen import generate
from hexlayout.lang.examples import gemm_sm80
from hexlayout.ptx import (
    PtxDeadlockError,
    PtxDivergenceError,
    PtxMisalignedAccessError,
    PtxOutOfBoundsError,
    UnsupportedInstructionError,
)
from tests.codegen.kernels import row_reduce

from .harness import run_body

ROW_IN = "(tid % 32 / 4 + tid / 32 * 16 < M - bid_x * 64)"
FIRST_LOAD_PRED = (ROW_IN + " ? *reinterpret_cast<const uint2*>(X + bid_x * 4096 "
                   "+ (tid % 32 / 4 + tid / 32 * 16) * 64 + tid % 4 * 2)")


@pytest.fixture(scope="module")
def reduce_max():
    k = row_reduce("sm_80", "max")
    return k, generate(k).source


def _reduce(k, x, mode, source=None):
    y = np.full((x.shape[0], 1), np.nan, np.float32)
    rt.emulate(k, x, y, mode=mode, source=source)
    return y[:, 0]


def _mutate(source: str, old: str, new: str, count: int = -1) -> str:
    assert source.count(old) >= 1, f"the printed source no longer contains {old!r}"
    return source.replace(old, new, count)


def test_unmutated_source_passes(reduce_max) -> None:
    k, src = reduce_max
    x = np.random.default_rng(0).standard_normal((100, 64)).astype(np.float32)
    np.testing.assert_array_equal(_reduce(k, x, "ptx", src), x.max(1))


def test_mutated_shuffle_offset_fails_in_ptx_mode_only(reduce_max) -> None:
    k, src = reduce_max
    x = np.random.default_rng(1).standard_normal((100, 64)).astype(np.float32)
    bad = _mutate(src, "r[v], 2, 32)", "r[v], 4, 32)")
    np.testing.assert_array_equal(_reduce(k, x, "ir"), x.max(1))                 # IR mode: still right
    assert not np.array_equal(_reduce(k, x, "ptx", bad), x.max(1))               # PTX mode: wrong rows


def test_dropped_predicate_is_an_out_of_bounds_read_naming_all_lines(reduce_max) -> None:
    k, src = reduce_max
    x = np.random.default_rng(2).standard_normal((100, 64)).astype(np.float32)
    bad = _mutate(src, FIRST_LOAD_PRED, FIRST_LOAD_PRED.replace(ROW_IN, "(1)", 1))
    np.testing.assert_array_equal(_reduce(k, x, "ir"), x.max(1))
    with pytest.raises(PtxOutOfBoundsError) as ei:
        _reduce(k, x, "ptx", bad)
    e = ei.value
    cuda_line = 1 + bad.split("\n").index(next(ln for ln in bad.split("\n") if "&x[0]) = (1)" in ln))
    assert e.opcode.startswith("ld.global") and e.ptx_line and e.cuda_line == cuda_line
    msg = str(e)
    assert f"PTX line {e.ptx_line}" in msg and f"CUDA line {cuda_line}" in msg and "'X'" in msg
    assert "kernels_src.py:50 [copy] x = hl.copy(X[m0, :])" in msg and e.block == (1, 0, 0)


def test_index_off_alignment_is_a_misaligned_access(reduce_max) -> None:
    k, src = reduce_max
    x = np.random.default_rng(3).standard_normal((128, 64)).astype(np.float32)
    bad = _mutate(src, FIRST_LOAD_PRED, FIRST_LOAD_PRED[:-1] + " + 1)")
    with pytest.raises(PtxMisalignedAccessError, match=r"8-byte global access .* not a multiple of 8"):
        _reduce(k, x, "ptx", bad)


def test_mutated_loop_bound_fails_in_ptx_mode_only() -> None:
    bld = rt.build(gemm_sm80, "sm_80", compile=False, BM=64, BN=64)
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(64, 96, generator=g).half(), torch.randn(64, 96, generator=g).half()
    ref = a.double() @ b.double().T
    bad = _mutate(bld.generated.source, "k < (K + 31) / 32;", "k < (K + 31) / 32 - 1;")
    c_ir, c_ptx = (torch.full((64, 64), float("nan"), dtype=torch.float16) for _ in range(2))
    rt.emulate(bld, a, b, c_ir, mode="ir")
    rt.emulate(bld, a, b, c_ptx, mode="ptx", source=bad)
    torch.testing.assert_close(c_ir.double(), ref, rtol=1e-2, atol=1e-2)
    assert (c_ptx.double() - ref).abs().max() > 0.5          # the last k-tile is missing


def test_unimplemented_instructions_are_named() -> None:
    """An instruction form the executor does not implement (tcgen05.shift) is a clear error naming
    its PTX line, not a wrong result."""
    body = """
    tcgen05.shift.cta_group::1.down [%r1];
"""
    with pytest.raises(UnsupportedInstructionError, match=r"not implement .*\n.*PTX line \d+: `tcgen05.shi"):
        run_body(body)


def test_mbarrier_that_never_completes_is_a_deadlock() -> None:
    """A wait on an mbarrier phase that one of its two expected arrivals never reaches."""
    body = """
    .shared .align 8 .b64 bar;
    mov.u32 %r1, bar;
    setp.eq.u32 %p1, %r0, 0;
    @%p1 mbarrier.init.shared::cta.b64 [%r1], 2;
    bar.sync 0;
    @%p1 mbarrier.arrive.shared::cta.b64 %rd5, [%r1];
$W:
    mbarrier.try_wait.parity.shared::cta.b64 %p2, [%r1], 0;
    @!%p2 bra $W;
"""
    with pytest.raises(PtxDeadlockError, match=r"mbarrier at shared offset 0 \(phase 0: 1 of 2 arrivals"):
        run_body(body)


def test_barrier_deadlock_names_the_barrier() -> None:
    body = """
    setp.lt.u32 %p1, %r0, 32;
    @%p1 bra $A;
    bar.sync 2, 64;
    bra.uni $END;
$A:
    bar.sync 1, 64;
$END:
"""
    with pytest.raises(PtxDeadlockError, match=r"barrier 1 \(bar.sync\) where 32 of the 64 .*\n.*PTX line"):
        run_body(body, threads=64)


def test_shuffle_in_a_divergent_branch_is_an_error() -> None:
    body = """
    setp.lt.u32 %p1, %r0, 16;
    @%p1 bra $END;
    shfl.sync.bfly.b32 %r10, %r0, 1, 31, -1;
$END:
"""
    with pytest.raises(PtxDivergenceError, match=r"needs lanes \[0, 1, .*15\] of warp 0"):
        run_body(body)


def test_exited_threads_do_not_hold_a_barrier() -> None:
    body = """
    setp.ge.u32 %p1, %r0, 32;
    @%p1 bra $OUT;
    bar.sync 0;
    mov.u32 %r10, 7;
$OUT:
"""
    out = run_body(body, threads=64)
    assert (out[:32, 0] == 7).all() and (out[32:, 0] == 0).all()


def test_dropped_barrier_is_a_shared_memory_race() -> None:
    """Without the bar.sync after cp.async.wait_group, warps read stages other warps' copies
    wrote: IR mode (the lowered program has its barrier) passes, PTX mode names the race."""
    from hexlayout.ptx import PtxRaceError

    bld = rt.build(gemm_sm80, "sm_80", compile=False, BM=64, BN=64)
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(64, 64, generator=g).half(), torch.randn(64, 64, generator=g).half()
    bar = '  asm volatile("bar.sync 0;\\n" ::: "memory");\n'
    src = bld.generated.source
    assert src.count(bar) >= 1
    bad = src.replace(bar, "", 1)
    c = torch.full((64, 64), float("nan"), dtype=torch.float16)
    rt.emulate(bld, a, b, c, mode="ir")
    torch.testing.assert_close(c.double(), a.double() @ b.double().T, rtol=1e-2, atol=1e-2)
    with pytest.raises(PtxRaceError, match=r"reads shared byte \d+, which thread \d+ \(another warp\) wr"):
        rt.emulate(bld, a, b, c, mode="ptx", source=bad)
    rt.emulate(bld, a, b, c, mode="ptx", source=src)       # with its barrier: no race


def _gemm_fails_in_ptx_mode_only(bad_of) -> str:  # noqa: ANN001
    """Run the sm_80 GEMM in IR mode (must be right) and with ``bad_of(source)`` in PTX mode:
    returns how PTX mode failed (a wrong product or the executor's error)."""
    from hexlayout.ptx import PtxError

    bld = rt.build(gemm_sm80, "sm_80", compile=False, BM=64, BN=64)
    g = torch.Generator().manual_seed(6)
    a, b = torch.randn(64, 96, generator=g).half(), torch.randn(64, 96, generator=g).half()
    ref = a.double() @ b.double().T
    bad = bad_of(bld.generated.source)
    assert bad != bld.generated.source
    c_ir, c_ptx = (torch.full((64, 64), float("nan"), dtype=torch.float16) for _ in range(2))
    rt.emulate(bld, a, b, c_ir, mode="ir")
    torch.testing.assert_close(c_ir.double(), ref, rtol=1e-2, atol=1e-2)
    try:
        rt.emulate(bld, a, b, c_ptx, mode="ptx", source=bad)
    except PtxError as e:
        return type(e).__name__
    err = (c_ptx.double() - ref).abs().nan_to_num(1e9).max().item()
    assert err > 0.5, "the mutation went unnoticed in PTX mode"
    return "wrong product"


def test_mutated_swizzle_xor_constant_fails_in_ptx_mode_only() -> None:
    """One cp.async destination's XOR swizzle mask printed as 128 instead of 192."""
    how = _gemm_fails_in_ptx_mode_only(lambda s: _mutate(s, "& 192) >> 3) * 2),", "& 128) >> 3) * 2),", 1))
    assert how in ("wrong product", "PtxRaceError"), how


def test_mutated_mma_operand_register_order_fails_in_ptx_mode_only() -> None:
    """The A fragment's first two registers swapped in every mma.sync."""
    how = _gemm_fails_in_ptx_mode_only(
        lambda s: _mutate(s, "{%4, %5, %6, %7}, {%8, %9}", "{%5, %4, %6, %7}, {%8, %9}"))
    assert how == "wrong product"
