"""Deliberately contradictory kernels: each must fail synthesis with a ``SynthesisError`` whose
message names both ops in conflict by source line and states both requirements.

Expected lines are found with ``inspect`` from a snippet of the kernel's source, never
written as numbers. Every message must be a readable one-liner from ``hexlayout.synth``
(no traceback text, no exception from inside the solver).
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.emulator import run
from hexlayout.lang import f16, f32
from hexlayout.layout import Layout
from hexlayout.synth.solve import SynthesisError, synthesize

M, N, K = hl.dims("M N K")
FILE = os.path.basename(__file__)

ROWS = Layout((128, 32), (32, 1))   # thread t holds row t: no mma operand layout looks like this


@hl.kernel(threads=128)
def role_clash(a: f16[M, K], w: f16[N, K], c: f32[M, N]):
    """(a) %rw is operand b of one mma and operand a of another with the same warps."""
    x = hl.register(f16, (64, 64))
    hl.copy(hl.view(a, tile=(64, 64)), x)
    rw = hl.register(f16, (64, 64))
    hl.copy(hl.view(w, tile=(64, 64)), rw)
    acc1 = hl.zeros((64, 64), f32)
    hl.mma(x, rw, acc1, warps=hl.spatial(4, 1))
    acc2 = hl.zeros((64, 64), f32)
    hl.mma(rw, x, acc2, warps=hl.spatial(4, 1))
    hl.copy(acc1 + acc2, hl.view(c, tile=(64, 64)))


@hl.kernel(threads=128)
def column_copy_vs_ldmatrix(at: f16[K, M], b: f16[N, K], c: f32[M, N]):
    """(b) a 4-byte cp.async from a column-contiguous global view, then ldmatrix (16-byte rows
    along K) from the same shared tile."""
    sa = hl.shared(f16, (64, 32))
    hl.copy(hl.view(at, tile=(32, 64)).T, sa, instruction="SM80_CP_ASYNC_CACHEALWAYS_U32")
    hl.commit_group()
    hl.wait_group(0)
    hl.syncthreads()
    ra = hl.register(f16, (64, 32))
    hl.copy(sa, ra, instruction="SM75_U32x4_LDSM_N")
    rb = hl.register(f16, (64, 32))
    hl.copy(hl.view(b, tile=(64, 32)), rb)
    acc = hl.zeros((64, 64), f32)
    hl.mma(ra, rb, acc)
    hl.copy(acc, hl.view(c, tile=(64, 64)))


@hl.kernel(threads=128)
def explicit_vs_mma(a: f16[M, K], b: f16[N, K], c: f32[M, N]):
    """(c) an explicit register layout (one row per thread) used as an mma operand."""
    ra = hl.register(f16, (128, 32), layout=ROWS)
    hl.copy(hl.view(a, tile=(128, 32)), ra)
    rb = hl.register(f16, (64, 32))
    hl.copy(hl.view(b, tile=(64, 32)), rb)
    acc = hl.zeros((128, 64), f32)
    hl.mma(ra, rb, acc)
    hl.copy(acc, hl.view(c, tile=(128, 64)))


@hl.kernel(threads=128)
def elementwise_joins_accumulators(a: f16[M, K], b: f16[N, K], c: f32[M, N]):
    """(d) two accumulators whose mmas split the warps differently, multiplied elementwise."""
    ra = hl.register(f16, (64, 32))
    hl.copy(hl.view(a, tile=(64, 32)), ra)
    rb = hl.register(f16, (64, 32))
    hl.copy(hl.view(b, tile=(64, 32)), rb)
    ra2 = hl.register(f16, (64, 32))
    hl.copy(hl.view(a, tile=(64, 32)), ra2)
    rb2 = hl.register(f16, (64, 32))
    hl.copy(hl.view(b, tile=(64, 32)), rb2)
    acc1 = hl.zeros((64, 64), f32)
    hl.mma(ra, rb, acc1, warps=hl.spatial(4, 1))
    acc2 = hl.zeros((64, 64), f32)
    hl.mma(ra2, rb2, acc2, warps=hl.spatial(1, 4))
    prod = acc1 * acc2
    hl.copy(prod, hl.view(c, tile=(64, 64)))


@hl.kernel(threads=128)
def swizzle_hint_vs_wgmma(a: f16[M, K], b: f16[N, K], c: f32[M, N]):
    """(e) a 128-byte swizzle asked for a wgmma operand whose K rows are 64 bytes."""
    sa = hl.shared(f16, (64, 32), layout=hl.auto(swizzle="128B"))
    sb = hl.shared(f16, (64, 32))
    bar = hl.mbarrier(1)
    hl.mbarrier_init(bar, 0, 1)
    hl.syncthreads()
    hl.arrive(bar, 0, tx_bytes=sa.nbytes + sb.nbytes, who="one")
    hl.copy(hl.view(a, tile=(64, 32)), sa, mbarrier=bar[0])
    hl.copy(hl.view(b, tile=(64, 32)), sb, mbarrier=bar[0])
    hl.wait(bar, 0, 0)
    acc = hl.zeros((64, 64), f32)
    hl.wgmma_fence()
    hl.mma(sa, sb, acc)
    hl.wgmma_commit()
    hl.wgmma_wait(0)
    hl.copy(acc, hl.view(c, tile=(64, 64)))


@hl.kernel(threads=128)
def stride_hint_vs_column_copy(at: f16[K, M], b: f16[N, K], c: f32[M, N]):
    """(f) rows along mode 1 asked for a tile filled by a 4-byte cp.async from a global view
    that is contiguous along mode 0 only."""
    sa = hl.shared(f16, (64, 32), layout=hl.auto(stride=(None, 1)))
    hl.copy(hl.view(at, tile=(32, 64)).T, sa, instruction="SM80_CP_ASYNC_CACHEALWAYS_U32")
    hl.commit_group()
    hl.wait_group(0)
    hl.syncthreads()
    ra = hl.register(f16, (64, 32))
    hl.copy(sa, ra)
    rb = hl.register(f16, (64, 32))
    hl.copy(hl.view(b, tile=(64, 32)), rb)
    acc = hl.zeros((64, 64), f32)
    hl.mma(ra, rb, acc)
    hl.copy(acc, hl.view(c, tile=(64, 64)))


def line_of(kernel: Any, snippet: str) -> int:
    """The source line of ``kernel`` holding ``snippet`` (which must occur exactly once)."""
    lines, start = inspect.getsourcelines(kernel.fn)
    hits = [start + i for i, text in enumerate(lines) if snippet in text]
    assert len(hits) == 1, (snippet, hits)
    return hits[0]


def diagnose(kernel: Any, arch: str) -> tuple[str, SynthesisError]:
    with pytest.raises(SynthesisError) as info:
        synthesize(kernel.trace(), arch)
    err = info.value
    msg = str(err)
    assert type(err) is SynthesisError
    assert msg.startswith(f"{kernel.name}: ")
    assert "Traceback" not in msg and "\n" not in msg
    return msg, err


# (kernel, arch, (snippet of line 1, snippet of line 2), phrases naming the two requirements)
CASES = [
    (role_clash, "sm_80", ("hl.mma(x, rw, acc1", "hl.mma(rw, x, acc2"),
     ["register tile %rw", "needs %rw as the B operand (N x K)", "needs %rw as the A operand (M x K)",
      "warps= given there"]),
    (column_copy_vs_ldmatrix, "sm_80", ("hl.copy(hl.view(at", "hl.copy(sa, ra"),
     ["shared tile %sa", "needs the tile's rows along mode 0", "contiguous along mode 0 only",
      "needs the tile's rows along mode 1", "cp.async: no vector width of 4, 8 or 16 bytes",
      "the 8 elements of a matrix row are not contiguous in shared memory"]),
    (explicit_vs_mma, "sm_80", ("ra = hl.register(", "hl.mma(ra, rb, acc)"),
     ["register tile %ra", "gives %ra the explicit TV layout (128,32):(32,1)",
      "needs %ra as the A operand (M x K) fragment"]),
    (elementwise_joins_accumulators, "sm_80", ("hl.mma(ra, rb, acc1", "hl.mma(ra2, rb2, acc2"),
     ["register tiles %acc1 (f32 64x64) and %acc2 (f32 64x64) must have one layout",
      "needs %acc1 as the accumulator (M x N)", "needs %acc2 as the accumulator (M x N)",
      "combines them elementwise"]),
    (swizzle_hint_vs_wgmma, "sm_90a", ("sa = hl.shared(", "hl.mma(sa, sb, acc)"),
     ["shared tile %sa", 'asks for a 128-byte swizzle (swizzle="128B")',
      "not a canonical K-major wgmma layout", "a row of %sa along mode 1 is 32 x f16 = 64 bytes",
      "Without the hint it works with", "64-byte swizzle"]),
    (stride_hint_vs_column_copy, "sm_80", ("sa = hl.shared(", "hl.copy(hl.view(at"),
     ["shared tile %sa", "asks for stride 1 in mode 1 (rows along mode 1)",
      "needs the tile's rows along mode 0", "contiguous along mode 0 only",
      "cp.async: no vector width of 4, 8 or 16 bytes", "Without the hint it accepts"]),
]


@pytest.mark.parametrize(("kernel", "arch", "snippets", "phrases"), CASES,
                         ids=[c[0].name for c in CASES])
def test_contradiction_names_both_lines_and_requirements(kernel: Any, arch: str, snippets: tuple[str, str],
                                                         phrases: list[str]) -> None:
    msg, err = diagnose(kernel, arch)
    lines = [line_of(kernel, s) for s in snippets]
    for line, snippet in zip(lines, snippets):
        assert f"{FILE}:{line} `" in msg, (line, msg)           # file:line followed by the code
        assert snippet in msg
    for phrase in phrases:
        assert phrase in msg, (phrase, msg)
    assert {op.loc.line for op in err.ops if op.loc is not None} >= set(lines)


def test_elementwise_join_names_the_joining_op() -> None:
    msg, err = diagnose(elementwise_joins_accumulators, "sm_80")
    line = line_of(elementwise_joins_accumulators, "prod = acc1 * acc2")
    assert f"elementwise at {FILE}:{line} `prod = acc1 * acc2` combines them elementwise" in msg
    assert line in {op.loc.line for op in err.ops}


def test_same_program_same_diagnostic() -> None:
    assert diagnose(column_copy_vs_ldmatrix, "sm_80")[0] == diagnose(column_copy_vs_ldmatrix, "sm_80")[0]


@hl.kernel(threads=128)
def register_view(a: f16[M, K], c: f16[M, K]):
    x = hl.register(f16, (64, 64))
    hl.copy(hl.view(a, tile=(64, 64)), x)
    for k in hl.range(2):
        hl.copy(x.tile((32, 64), (k * 32, 0)), hl.view(c, tile=(32, 64)))


def test_unsupported_construct_is_a_synthesis_error_with_its_line() -> None:
    # static windows of register tiles are supported now (tests/e2e/test_register_views.py);
    # a window at a run-time offset is not
    msg, err = diagnose(register_view, "sm_80")
    line = line_of(register_view, "hl.copy(x.tile((32, 64), (k * 32, 0))")
    assert f"{FILE}:{line}" in msg and "views of register tiles are not supported" in msg


def _chained(q: f16[M, K], k: f16[N, K], v: f16[N, K], o: f32[M, N]):
    """P = q k^T (64 x 64) feeds P v as its A operand, as in attention."""
    rq = hl.register(f16, (64, 64))
    hl.copy(hl.view(q, tile=(64, 64)), rq)
    rk = hl.register(f16, (64, 64))
    hl.copy(hl.view(k, tile=(64, 64)), rk)
    rv = hl.register(f16, (64, 64))
    hl.copy(hl.view(v, tile=(64, 64)), rv)
    s = hl.zeros((64, 64), f32)
    hl.mma(rq, rk, s)
    acc = hl.zeros((64, 64), f32)
    hl.mma(hl.cast(s, f16), rv, acc)
    hl.copy(acc, hl.view(o, tile=(64, 64)))


def test_chained_mma_on_too_many_warps_hints_at_the_warp_count() -> None:
    """64 rows are 4 m16 row blocks: on 8 warps two warps split each row block's columns, which
    the next mma's A operand cannot take; on 4 warps the same program synthesizes."""
    msg, err = diagnose(hl.kernel(threads=256, name="chained8")(_chained), "sm_80")
    assert "Hint: mma at" in msg and "has 64 rows, 4 row block(s) of its mma atom, for 8 warps" in msg
    assert "Use at most 4 warps" in msg
    assert len({op.loc.line for op in err.ops if op.loc is not None}) >= 2
    synthesize(hl.kernel(threads=128, name="chained4")(_chained).trace(), "sm_80")


def _chain4(q: f16[M, K], w: f16[N, K], o: f32[M, N]):
    """Four mmas, each accumulator (cast) the A operand of the next."""
    x = hl.register(f16, (64, 64))
    hl.copy(hl.view(q, tile=(64, 64)), x)
    for _ in range(4):
        rw = hl.register(f16, (64, 64))
        hl.copy(hl.view(w, tile=(64, 64)), rw)
        s = hl.zeros((64, 64), f32)
        hl.mma(x, rw, s)
        x = hl.cast(s, f16)
    hl.copy(s, hl.view(o, tile=(64, 64)))


def test_conflicts_prune_the_search_over_partial_mma_choices() -> None:
    """Each of the 4 mmas has 24 candidates (331,776 combinations). A conflict between two
    chosen mmas rejects every completion at once, so an unsatisfiable chain is reported after
    a few hundred checks, and a satisfiable one (4 warps) is found."""
    msg, _ = diagnose(hl.kernel(threads=256, name="chain8")(_chain4), "sm_80")
    checked = int(msg.split(" full or partial combinations checked")[0].rsplit("(", 1)[1])
    assert 1 < checked < 2000, checked
    s = synthesize(hl.kernel(threads=128, name="chain4")(_chain4).trace(), "sm_80")
    assert len(s.mma) == 4
    rng = np.random.default_rng(4)
    q = rng.standard_normal((64, 64)).astype(np.float16)
    w = (rng.standard_normal((64, 64)) / 8).astype(np.float16)
    o = np.full((64, 64), np.nan, dtype=np.float32)
    run(s.lowered.kernel, {"q": q, "w": w, "o": o})
    want = q.astype(np.float64)
    for step in range(4):
        want = want @ w.astype(np.float64).T
        if step < 3:
            want = want.astype(np.float16).astype(np.float64)   # the cast between mmas
    np.testing.assert_allclose(o, want, rtol=1e-2, atol=1e-2)


def test_search_limit_gives_a_diagnostic_not_a_hang(monkeypatch: pytest.MonkeyPatch) -> None:
    """Past ``MAX_REGISTER_CHECKS`` checked choices the search stops with the first conflict
    and says so (with a limit of 50 the 576 conflicting pairs of the chain are not all seen)."""
    import hexlayout.synth.solve as solve

    monkeypatch.setattr(solve, "MAX_REGISTER_CHECKS", 50)
    msg, err = diagnose(hl.kernel(threads=256, name="chain8s")(_chain4), "sm_80")
    assert "The search stopped after 50 full or partial combinations" in msg
    assert "give atom= or warps= to an mma" in msg
    assert "has 64 rows, 4 row block(s)" in msg and len(err.ops) >= 2


@hl.kernel(threads=128)
def shared_a_and_transposed_b(a: f16[M, K], b: f16[N, K], c: f32[M, N], *,
                              ATOM: str | None = "SM90_64x32x16_F32F16F16_SS"):
    """(g) %sa is the A operand of one wgmma (K-major: rows along mode 1) and, transposed, the
    B operand of another (K-major B of sa.T when ``ATOM`` is the K-major atom: rows along
    mode 0; legal with an MN-major B descriptor when the atom is left to synthesis)."""
    sa = hl.shared(f16, (64, 32))
    sb = hl.shared(f16, (64, 32))
    sc = hl.shared(f16, (64, 64))
    hl.copy(hl.view(a, tile=(64, 32)), sa)
    hl.copy(hl.view(b, tile=(64, 32)), sb)
    hl.copy(hl.view(b, tile=(64, 64)), sc)
    hl.commit_group()
    hl.wait_group(0)
    hl.fence_proxy_async()               # cp.async wrote the tiles the wgmmas read
    hl.syncthreads()
    acc = hl.zeros((64, 64), f32)
    acc2 = hl.zeros((64, 32), f32)
    hl.wgmma_fence()
    hl.mma(sa, sb, acc)
    hl.mma(sc, sa.T, acc2, atom=ATOM)
    hl.wgmma_commit()
    hl.wgmma_wait(0)
    hl.copy(acc, hl.view(c, tile=(64, 64)))
    hl.copy(acc2, hl.view(c, tile=(64, 32)))


def test_shared_tile_as_a_and_transposed_b_names_both_mmas() -> None:
    """Both wgmmas are named with their lines and the requirement each fails (no '?')."""
    msg, err = diagnose(shared_a_and_transposed_b, "sm_90a")
    calls = ("hl.mma(sa, sb, acc)", "hl.mma(sc, sa.T, acc2, atom=ATOM)")
    lines = [line_of(shared_a_and_transposed_b, s) for s in calls]
    for line in lines:
        assert f"{FILE}:{line} `" in msg, (line, msg)
    assert "shared tile %sa" in msg and "has no layout that serves both" in msg
    assert "B operand: " in msg and "A operand: " in msg
    assert msg.count("not a canonical K-major wgmma layout") == 2
    assert ": ?" not in msg
    assert {op.loc.line for op in err.ops if op.loc is not None} >= set(lines)


def test_shared_tile_as_a_and_transposed_b_is_legal_with_an_mn_major_b() -> None:
    """Left to synthesis, the second wgmma reads %sa.T through an MN-major B descriptor (this
    program was refused while the search stopped after three register solutions)."""
    syn = synthesize(shared_a_and_transposed_b.trace(ATOM=None), "sm_90a")
    majors = sorted((tm.atom.a_major, tm.atom.b_major) for tm in syn.mma.values())
    assert majors == [("K", "K"), ("K", "MN")], majors
    rng = np.random.default_rng(2)
    a = rng.standard_normal((64, 64)).astype(np.float16)
    b = rng.standard_normal((64, 64)).astype(np.float16)
    c = np.zeros((64, 64), np.float32)
    report = run(syn.lowered.kernel, {"a": a, "b": b, "c": c})
    ad, bd = a.astype(np.float64), b.astype(np.float64)
    want = ad[:, :32] @ bd[:, :32].T
    want[:, :32] = bd @ ad[:, :32]            # the second store overwrites the first 32 columns
    assert np.abs(c - want).max() < 1e-3 and report.totals["bank_conflicts"] == 0
