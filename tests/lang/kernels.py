"""Small kernels and helpers shared by the hexlayout.lang tests."""

from __future__ import annotations

import inspect
from typing import Any

import hexlayout.lang as hl
from hexlayout.ir.tile import Block, For, If, Op
from hexlayout.lang import f16, f32

M, N, K = hl.dims("M N K")


def line_of(kernel: Any, snippet: str, nth: int = 0) -> int:
    """The file line number of the ``nth`` line of ``kernel``'s source containing ``snippet``."""
    fn = kernel.fn if hasattr(kernel, "fn") else kernel
    lines, start = inspect.getsourcelines(fn)
    hits = [start + i for i, text in enumerate(lines) if snippet in text]
    assert len(hits) > nth, f"{snippet!r} not found {nth + 1} times in {fn.__name__}"
    return hits[nth]


def ops_of(block: Block, kind: type | None = None) -> list[Op]:
    """All ops under ``block`` (pre-order), optionally only of one class."""
    return [op for op in block.walk() if kind is None or isinstance(op, kind)]


def top(block: Block) -> list[str]:
    return [op.name for op in block.ops]


def loops(block: Block) -> list[For]:
    return [op for op in block.walk() if isinstance(op, For)]


def ifs(block: Block) -> list[If]:
    return [op for op in block.walk() if isinstance(op, If)]


@hl.kernel(threads=128)
def simple_gemm(a: f16[M, K], b: f16[N, K], c: f16[M, N], *, BM: int = 64, BN: int = 64, BK: int = 32):
    Mx, Kx = a.shape
    Nx = b.shape[0]
    pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(Mx, BM), hl.cdiv(Nx, BN)))
    acc = hl.zeros((BM, BN), f32)
    for k in hl.range(hl.cdiv(Kx, BK)):
        ra = hl.register(f16, (BM, BK))
        rb = hl.register(f16, (BN, BK))
        hl.copy(a.tile((BM, BK), (pid_m * BM, k * BK)), ra)
        hl.copy(b.tile((BN, BK), (pid_n * BN, k * BK)), rb)
        hl.mma(ra, rb, acc)
    hl.copy(hl.cast(acc, f16), c.tile((BM, BN), (pid_m * BM, pid_n * BN)))
