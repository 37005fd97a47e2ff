"""No internal exceptions (issue 9 item 5): a batch of valid and invalid programs - random
shapes (odd ones too), scopes, dtypes, thread counts, declared alignments, and wrong ops -
goes through trace, synthesis, lowering and the emulator (through the launcher's argument
checks). Every failure must be a ``HexlayoutError`` that names the kernel, and for kernel
and synthesis errors the op's source line; never a bare ``TypeError``, ``IndexError``,
``KeyError``, ``AssertionError``, ...

The programs are generated from a seeded RNG, so a failure reproduces; each case prints
its parameters in the assertion message."""

from __future__ import annotations

import pathlib
from typing import Any

import ml_dtypes
import numpy as np
import pytest

import hexlayout.lang as hl
from hexlayout.errors import HexlayoutError
from hexlayout.lang import bf16, f16, f32, i32, s8, u8
from hexlayout.lang.errors import KernelError
from hexlayout.runtime import emulate
from hexlayout.synth.solve import SynthesisError, synthesize

FILE = pathlib.Path(__file__).name
R, C, K = hl.dims("R C K")
DTYPES = {"f16": (f16, np.float16), "bf16": (bf16, ml_dtypes.bfloat16), "f32": (f32, np.float32),
          "u8": (u8, np.uint8), "s8": (s8, np.int8), "i32": (i32, np.int32)}
UNARY = ["neg", "add", "mul", "silu", "exp", "shr", "and", "xor", "cast", "max", "sum", "none"]
EXTENTS = [1, 3, 7, 8, 16, 16, 32, 32, 48, 64, 64, 100]


def _elementwise_kernel(name: str, dt: Any, out_dt: Any, tile: tuple[int, int], threads: int, fn: str,
                        align: int | None) -> Any:
    xa = dt[R, C] if align is None else dt[R, C].aligned(align)
    ya = out_dt[R, C] if align is None else out_dt[R, C].aligned(align)

    def body(x, y):
        r0, c0 = hl.grid(hl.spatial(hl.cdiv(x.shape[0], tile[0]), hl.cdiv(x.shape[1], tile[1])))
        t = hl.register(dt, tile)
        hl.copy(hl.view(x, tile=tile, origin=(r0 * tile[0], c0 * tile[1])), t)
        if fn == "neg":
            t = -t
        elif fn == "add":
            t = t + t
        elif fn == "mul":
            t = t * 3
        elif fn == "silu":
            t = hl.silu(t)
        elif fn == "exp":
            t = hl.exp(t)
        elif fn == "shr":
            t = t >> 1
        elif fn == "and":
            t = t & 7
        elif fn == "xor":
            t = t ^ t
        elif fn == "max":
            t = hl.maximum(t, t * 2)
        elif fn == "sum":
            t = hl.sum(t, 1)
        if t.dtype != out_dt:
            t = hl.cast(t, out_dt)
        hl.copy(t, hl.view(y, tile=tile, origin=(r0 * tile[0], c0 * tile[1])))

    body.__annotations__ = {"x": xa, "y": ya}
    return hl.kernel(threads=threads, name=name)(body)


def _gemm_kernel(name: str, dt: Any, bm: int, bn: int, bk: int, threads: int, a_scope: str,
                 b_scope: str) -> Any:
    def body(a, b, c):
        pm, pn = hl.grid(hl.spatial(hl.cdiv(a.shape[0], bm), hl.cdiv(b.shape[0], bn)))
        acc = hl.zeros((bm, bn), f32)
        for k in hl.range(hl.cdiv(a.shape[1], bk)):
            ops = []
            for src, rows, org, scope in ((a, bm, pm * bm, a_scope), (b, bn, pn * bn, b_scope)):
                v = hl.view(src, tile=(rows, bk), origin=(org, k * bk))
                if scope == "shared":
                    s = hl.shared(dt, (rows, bk))
                    hl.copy(v, s)
                    hl.commit_group()
                    hl.wait_group(0)
                    hl.syncthreads()
                    r = hl.register(dt, (rows, bk))
                    hl.copy(s, r)
                else:
                    r = hl.register(dt, (rows, bk))
                    hl.copy(v, r)
                ops.append(r)
            hl.mma(ops[0], ops[1], acc)
            hl.syncthreads()
        hl.copy(acc, hl.view(c, tile=(bm, bn), origin=(pm * bm, pn * bn)))

    body.__annotations__ = {"a": dt[R, K], "b": dt[C, K], "c": f32[R, C]}
    return hl.kernel(threads=threads, name=name)(body)


def _wrong_kernel(name: str, which: int) -> Any:
    """Programs with a wrong op (each must be refused at trace or synthesis time)."""

    def body(x: f16[R, C], y: f16[R, C], idx: i32[R]):
        t = hl.register(f16, (16, 16))
        hl.copy(hl.view(x, tile=(16, 16)), t)
        if which == 0:
            u = hl.register(f16, (16, 8))
            hl.copy(t, u)                                   # shapes differ
        elif which == 1:
            t = t >> 1                                      # shift of a float tile
        elif which == 2:
            t = hl.sum(t, 3)                               # no such axis
        elif which == 3:
            hl.mma(t, t, t)                                 # 16x16 f16 tile as A, B and accumulator
        elif which == 4:
            s = hl.shared(f16, (16, 16, 4))
            hl.copy(t, s[:, :, 5])                          # stage out of range
        elif which == 5:
            t = hl.cast(t, u8) + t                          # mixed element types
        elif which == 6:
            hl.copy(hl.view(y, tile=(16, 16)), hl.view(x, tile=(16, 16)))   # global -> global
        elif which == 7:
            g = hl.view(x, tile=(16, 16), origin=(None, 0), rows=t)         # float row indices
            hl.copy(g, t)
        elif which == 8:
            t = t.T.T[0:3]                                  # a 3-row window stored as 16 rows
        elif which == 9:
            hl.copy(t, hl.view(y, tile=(16, 32)))           # shape mismatch into global
        elif which == 10:
            s = hl.shared(f16, (1024, 1024))                # more shared memory than a block has
            hl.copy(hl.view(x, tile=(1024, 1024)), s)
        elif which == 11:
            hl.copy(hl.view(x, tile=(16, 16), origin=(0.5, 0)), t)     # a float origin
        elif which == 12:
            t = hl.reduce(t, "median", 0)                   # no such reduction
        elif which == 13:
            hl.copy(t, hl.view(y, tile=(16, 16)), mask=hl.iota((16, 8), 0) < 3)   # mask shape
        hl.copy(t, hl.view(y, tile=(16, 16)))

    return hl.kernel(threads=64, name=name)(body)


def _check_error(e: BaseException, name: str, where: str) -> None:
    assert isinstance(e, HexlayoutError), f"{where}: internal {type(e).__name__}: {e}"
    msg = str(e)
    assert name in msg, f"{where}: the error does not name the kernel: {msg}"
    if isinstance(e, (KernelError, SynthesisError)):
        assert f"{FILE}:" in msg, f"{where}: the error names no source line: {msg}"


def _run_case(kernel: Any, arch: str, args: list[np.ndarray], where: str) -> str:
    try:
        tk = kernel.trace()
        syn = synthesize(tk, arch)
        emulate(syn.lowered, *args)
    except Exception as e:  # noqa: BLE001 - the point: classify every failure
        _check_error(e, kernel.name, where)
        return type(e).__name__
    return "ok"


def _random_array(rng: np.random.Generator, npt: Any, shape: tuple[int, ...]) -> np.ndarray:
    if np.issubdtype(np.dtype(npt), np.integer):
        return rng.integers(0, 50, shape).astype(npt)
    return rng.standard_normal(shape).astype(npt)


@pytest.mark.parametrize("seed", range(4))
def test_random_elementwise_programs_fail_only_with_located_errors(seed: int) -> None:
    rng = np.random.default_rng(seed)
    outcomes = []
    for n in range(10):
        dn, on = rng.choice(list(DTYPES)), rng.choice(list(DTYPES))
        tile = (int(rng.choice(EXTENTS)), int(rng.choice(EXTENTS)))
        threads = int(rng.choice([32, 64, 96, 128, 256]))
        fn = str(rng.choice(UNARY))
        align = [None, 1, 2, 4, 16][int(rng.integers(5))]
        arch = str(rng.choice(["sm_80", "sm_90a"]))
        name = f"ew_{seed}_{n}"
        where = f"{name}: {dn}->{on} tile {tile} threads {threads} fn {fn} align {align} {arch}"
        k = _elementwise_kernel(name, DTYPES[dn][0], DTYPES[on][0], tile, threads, fn, align)
        cols = int(rng.integers(1, 70)) if rng.random() < 0.4 else 16 * int(rng.integers(1, 5))
        shape = (int(rng.integers(1, 40)), cols)
        args = [_random_array(rng, DTYPES[dn][1], shape), np.zeros(shape, DTYPES[on][1])]
        outcomes.append(_run_case(k, arch, args, where))
    # the batch holds valid programs too: most of them run (the reference is checked elsewhere)
    assert outcomes.count("ok") >= 2, outcomes


@pytest.mark.parametrize("seed", range(3))
def test_random_gemm_programs_fail_only_with_located_errors(seed: int) -> None:
    rng = np.random.default_rng(100 + seed)
    outcomes = []
    for n in range(5):
        dn = str(rng.choice(["f16", "bf16", "f16", "f32", "s8"]))
        bm, bn, bk = (int(rng.choice([8, 16, 24, 32, 32, 64])) for _ in range(3))
        threads = int(rng.choice([32, 64, 128, 128]))
        scopes = [str(rng.choice(["register", "shared"])) for _ in range(2)]
        arch = str(rng.choice(["sm_80", "sm_90a"]))
        name = f"gemm_{seed}_{n}"
        where = f"{name}: {dn} {bm}x{bn}x{bk} threads {threads} {scopes} {arch}"
        k = _gemm_kernel(name, DTYPES[dn][0], bm, bn, bk, threads, *scopes)
        m, nn = (int(rng.integers(1, 50)) for _ in range(2))
        kk = int(rng.integers(1, 50)) if rng.random() < 0.3 else 16 * int(rng.integers(1, 4))
        nn = nn if rng.random() < 0.3 else 8 * int(rng.integers(1, 6))
        args = [_random_array(rng, DTYPES[dn][1], (m, kk)), _random_array(rng, DTYPES[dn][1], (nn, kk)),
                np.zeros((m, nn), np.float32)]
        outcomes.append(_run_case(k, arch, args, where))
    assert outcomes.count("ok") >= 1, outcomes


@pytest.mark.parametrize("which", range(14))
def test_wrong_ops_are_refused_with_the_kernel_op_and_line(which: int) -> None:
    k = _wrong_kernel(f"wrong_{which}", which)
    rng = np.random.default_rng(which)
    x = rng.standard_normal((20, 20)).astype(np.float16)
    outcome = _run_case(k, "sm_80", [x, np.zeros_like(x), np.zeros(20, np.int32)], f"wrong op {which}")
    assert outcome in ("KernelError", "SynthesisError"), outcome
