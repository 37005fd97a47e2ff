"""Small helpers to write ``LoweredKernel``s by hand in the emulator tests."""

from __future__ import annotations

import inspect
from typing import Any

import numpy as np

from hexlayout.ir import lowered as L
from hexlayout.ir.expr import Var
from hexlayout.ir.tile import GlobalParam, ScalarParam, SourceLoc
from hexlayout.ir.types import DType, dtype_from_name


def here(code: str = "") -> SourceLoc:
    """The caller's source line (what the language would record for a tile op)."""
    f = inspect.currentframe().f_back  # type: ignore[union-attr]
    return SourceLoc(f.f_code.co_filename.rsplit("/", 1)[-1], f.f_lineno, f.f_code.co_name, code)  # type: ignore


def dt(name: str) -> DType:
    return dtype_from_name(name)


def gparam(
    name: str, dtype: str, shape: tuple[Any, ...], stride: tuple[Any, ...] | None = None
) -> GlobalParam:
    if stride is None:
        st, acc = [], 1
        for s in reversed(shape):
            st.append(acc)
            acc = acc * s
        stride = tuple(reversed(st))
    return GlobalParam(name, dt(dtype), tuple(shape), tuple(stride))


def sparam(name: str, hi: int | None = None) -> ScalarParam:
    return ScalarParam(name, dt("i32"), Var(name, 0, hi))


class KB:
    """A kernel under construction: thread / block variables, registers, shared buffers."""

    def __init__(self, name: str, threads: int, grid: tuple[Any, ...] = (1,), arch: str = "sm_80") -> None:
        self.name = name
        self.threads = threads
        self.tid = Var("tid", 0, threads, kind="thread")
        self.bid = tuple(Var(f"bid{i}", 0, None, kind="block") for i in range(len(grid)))
        self.grid = grid
        self.arch = arch
        self.regs: list[L.RegArray] = []
        self.smem: list[L.SmemBuffer] = []
        self.mbarriers: list[L.MbarRef] = []
        self._smem_top = 0

    def reg(self, name: str, dtype: str, count: int) -> L.RegArray:
        r = L.RegArray(name, dt(dtype), count)
        self.regs.append(r)
        return r

    def shared(self, name: str, dtype: str, nelems: int, align: int = 128) -> L.SmemBuffer:
        d = dt(dtype)
        off = -(-self._smem_top // align) * align
        b = L.SmemBuffer(name, d, int(nelems * d.bits // 8), off, align)
        self._smem_top = off + b.nbytes
        self.smem.append(b)
        return b

    def mbar(self, name: str, count: int = 1) -> L.MbarRef:
        r = L.MbarRef(name, 0, count)
        self.mbarriers.append(r)
        return r

    def build(self, params: list[Any], body: list[L.Instr]) -> L.LoweredKernel:
        return L.LoweredKernel(
            self.name,
            params,
            self.grid,
            self.threads,
            self.tid,
            self.bid,
            body,
            registers=self.regs,
            smem=self.smem,
            mbarriers=self.mbarriers,
            arch=self.arch,
        )


def rr(arr: L.RegArray, start: Any = 0, count: int | None = None) -> L.RegRef:
    return L.RegRef(
        arr, start, arr.count - (start if isinstance(start, int) else 0) if count is None else count
    )


def rand(
    shape: tuple[int, ...], dtype: Any, rng: np.random.Generator, lo: float = -2.0, hi: float = 2.0
) -> np.ndarray:
    """Fresh random data (never zeros) of a numpy dtype."""
    x = rng.uniform(lo, hi, size=shape)
    x = np.where(np.abs(x) < 0.05, 0.5, x)
    return x.astype(dtype)
