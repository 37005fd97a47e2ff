"""Register math lowering: elementwise with broadcasting, iota, reductions with warp
butterflies, run through a small interpreter of the emitted Alu / Shfl instructions."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.arch import get_atom
from hexlayout.ir.expr import Expr, Var, evaluate
from hexlayout.ir.lower.math import lower_elementwise, lower_iota, lower_reduce, value_map
from hexlayout.ir.lower.views import RegisterTile
from hexlayout.ir.lowered import Alu, RegArray, RegRef, Shfl
from hexlayout.ir.mapping import repeat, spatial
from hexlayout.ir.tiled_mma import TiledMma
from hexlayout.ir.types import f32
from hexlayout.layout import Layout

TID = Var("threadIdx.x", 0, 128, "tid")
TM = TiledMma(get_atom("SM80_16x8x16_F32F16F16F32_TN"), spatial(4, 1) * repeat(1, 8), 1)
C_TV = TM.c_tv()                                    # 64 x 64 over 128 threads, 32 values each
ROW_TV = Layout(((4, 8, 4), 2), ((0, 1, 16), 8))    # 64 x 1: the rows each thread's C values are on
OPS = {"add": np.add, "sub": np.subtract, "mul": np.multiply, "max": np.maximum, "min": np.minimum,
       "mov": lambda a: a, "exp2": np.exp2}


def _tile(name: str, shape, tv) -> RegisterTile:
    return RegisterTile(RegArray(name, f32, tv.size() // 128), f32, shape, tv, 128)


def _run(instrs, regs: dict[str, np.ndarray]) -> None:
    tid = np.arange(128)

    def read(src, n):
        if isinstance(src, RegRef):
            return regs[src.array.name][:, src.start:src.start + n]
        if isinstance(src, Expr):
            return np.broadcast_to(np.asarray(evaluate(src, {TID: tid}))[:, None], (128, n))
        return np.full((128, n), float(src))

    for ins in instrs:
        if isinstance(ins, Alu):
            n = ins.dst.count
            vals = [read(s, n) for s in ins.srcs]
            regs[ins.dst.array.name][:, ins.dst.start:ins.dst.start + n] = OPS[ins.op](*vals)
        else:
            assert isinstance(ins, Shfl) and ins.mode == "bfly"
            src = regs[ins.src.array.name][:, ins.src.start:ins.src.start + ins.src.count].copy()
            regs[ins.dst.array.name][:, ins.dst.start:ins.dst.start + ins.dst.count] = src[tid ^ int(ins.arg)]


def _regs(tile: np.ndarray, tv) -> np.ndarray:
    return tile.reshape(-1, order="F")[tv.indices().reshape(-1, 128).T]


def _untile(regs: np.ndarray, tv, shape) -> np.ndarray:
    out = np.full(int(np.prod(shape)), np.nan)
    out[tv.indices().reshape(-1, 128).T] = regs
    return out.reshape(shape, order="F")


@pytest.mark.parametrize(("fn", "ref"), [("max", np.max), ("sum", np.sum), ("min", np.min)])
def test_row_reduction_of_an_mma_accumulator(fn, ref) -> None:
    rng = np.random.default_rng(3)
    x = rng.standard_normal((64, 64))
    src, dst = _tile("s", (64, 64), C_TV), _tile("r", (64, 1), ROW_TV)
    instrs = lower_reduce(fn, dst, src, 1, RegArray("tmp", f32, 2))
    assert not isinstance(instrs, str), instrs
    assert sum(isinstance(i, Shfl) for i in instrs) == 2       # lanes differing in bits 0 and 1
    regs = {"s": _regs(x, C_TV), "r": np.zeros((128, 2)), "tmp": np.zeros((128, 2))}
    _run(instrs, regs)
    np.testing.assert_allclose(_untile(regs["r"], ROW_TV, (64, 1))[:, 0], ref(x, axis=1), rtol=1e-12)


def test_broadcast_subtract_then_exp2() -> None:
    rng = np.random.default_rng(4)
    x, m = rng.standard_normal((64, 64)), rng.standard_normal((64, 1))
    s, r, p = _tile("s", (64, 64), C_TV), _tile("r", (64, 1), ROW_TV), _tile("p", (64, 64), C_TV)
    vm = value_map(s, r)
    assert not isinstance(vm, str)
    instrs = lower_elementwise("sub", p, [s, r]) + lower_elementwise("exp2", p, [p])
    regs = {"s": _regs(x, C_TV), "r": _regs(m, ROW_TV), "p": np.zeros((128, 32))}
    _run(instrs, regs)
    np.testing.assert_allclose(_untile(regs["p"], C_TV, (64, 64)), np.exp2(x - m), rtol=1e-12)
    assert len(instrs) < 64                                    # runs are merged


def test_iota_gives_coordinates_for_causal_masks() -> None:
    cols = _tile("c", (64, 64), C_TV)
    instrs = lower_iota(cols, 1, TID)
    regs = {"c": np.zeros((128, 32))}
    _run(instrs, regs)
    got = _untile(regs["c"], C_TV, (64, 64))
    np.testing.assert_array_equal(got, np.broadcast_to(np.arange(64), (64, 64)))


def test_incompatible_layouts_are_reported() -> None:
    s = _tile("s", (64, 64), C_TV)
    other = _tile("o", (64, 64), Layout((128, 32), (32, 1)))   # rows of 32 per thread
    assert isinstance(lower_elementwise("add", s, [s, other]), str)
    r = _tile("r", (64, 1), Layout((128, 1), (0, 0)))          # every thread: row 0 only
    reason = lower_reduce("sum", r, s, 1, RegArray("t", f32, 1))
    assert isinstance(reason, str)
