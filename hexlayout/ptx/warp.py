"""Warp-collective instructions: ``shfl.sync``, ``vote.sync`` / ``bar.warp.sync``,
``ldmatrix``, ``stmatrix`` and ``mma.sync`` (PTX ISA "Data Movement": shfl.sync, ldmatrix;
"Warp Level Matrix Multiply-Accumulate Instructions": mma, fragment layouts for
m16n8k8 / m16n8k16 / m16n8k32).

A ``.sync.aligned`` collective needs every lane of its warp executing it together (for
``shfl.sync``: every lane of ``membermask``); the executor runs threads at the same PTX
line in lockstep, so a warp split by divergent control flow is a ``PtxDivergenceError``.

``shfl.sync.mode.b32 d[|p], a, b, c, membermask`` (lane = laneid, bval = b & 31,
cval = c & 31, segmask = (c >> 8) & 31): maxLane = (lane & segmask) | (cval & ~segmask),
minLane = lane & segmask; up: j = lane - bval, p = j >= maxLane; down: j = lane + bval,
p = j <= maxLane; bfly: j = lane ^ bval, p = j <= maxLane; idx: j = minLane | (bval &
~segmask), p = j <= maxLane; d = a of lane j if p else a of the lane itself.

``mma.sync.aligned.m16n8kK.row.col.dtype.atype.btype.ctype``: D = A (16xK, row) * B (Kx8,
col) + C, products and sums in float64 (integers: exact int64), rounded once to the D type.
Fragments (g = lane >> 2, t = lane & 3, i = element in register order):
k16 16-bit A: row g + 8((i>>1)&1), col 2t + (i&1) + 8(i>=4); B: k 2t + (i&1) + 8(i>=2), n g;
k8 16-bit A: row g + 8(i>=2), col 2t + (i&1); B: k 2t + i, n g;
k32 8-bit A: row g + 8((i>>2)&1), col 4t + (i&3) + 16(i>=8); B: k 4t + (i&3) + 16(i>=4), n g;
C / D: row g + 8(i>=2), col 2t + (i&1).

``ldmatrix.sync.aligned.m8n8.xN{.trans}.shared.b16 {r0..r(N-1)}, [a]``: lanes 8j..8j+7 give
the 16-byte row addresses of matrix j; lane l receives in rj the two 16-bit elements (row
l/4, cols 2(l%4), 2(l%4)+1) of matrix j (``.trans``: (rows 2(l%4), 2(l%4)+1, col l/4)).
"""

from __future__ import annotations

from typing import Any

import ml_dtypes
import numpy as np

from .alu import _reg
from .errors import PtxDivergenceError, PtxIllegalInstructionError
from .parse import Instruction, Pair, Vec
from .types import NP

__all__ = ["warps_of"]


def warps_of(m: Any, idx: Any, what: str, need: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """``(threads [W, 32], complete warp ids)`` for a collective executed by threads ``idx``:
    every lane of each warp involved must be executing (or, with ``need`` [W, 32] bool,
    those lanes)."""
    threads = np.arange(m.T)[idx]
    warps = np.unique(m.warp[threads])
    lanes = np.full((len(warps), 32), -1, dtype=np.int64)
    pos = np.searchsorted(warps, m.warp[threads])
    lanes[pos, m.lane[threads]] = threads
    required = np.ones_like(lanes, dtype=bool) if need is None else need
    missing = required & (lanes < 0)
    if missing.any():
        w = int(np.argmax(missing.any(axis=1)))
        miss = np.nonzero(missing[w])[0].tolist()
        t0 = int(lanes[w][lanes[w] >= 0][0])
        raise PtxDivergenceError(
            f"{what} needs lanes {miss} of warp {int(m.tid[t0]) // 32} to execute it "
            "together with the others (divergent control flow, or exited lanes)",
            **m.where(t0),
        )
    return lanes, warps


@_reg("shfl")
def _shfl(m: Any, ins: Instruction, idx: Any) -> None:
    parts = ins.parts
    mode = next(p for p in parts[1:] if p in ("up", "down", "bfly", "idx"))
    dst = ins.operands[0]
    a_op, b_op, c_op = ins.operands[1:4]
    threads = np.arange(m.T)[idx]
    if "sync" in parts:
        memb = np.asarray(m.read(ins.operands[4], "u32", idx), dtype=np.int64)
        memb = np.broadcast_to(memb, (len(threads),))
        need = np.zeros((0, 32), dtype=bool)
        warps = np.unique(m.warp[threads])
        need = np.zeros((len(warps), 32), dtype=bool)
        pos = np.searchsorted(warps, m.warp[threads])
        for w in range(len(warps)):
            ms = np.unique(memb[pos == w])
            if len(ms) > 1:
                raise PtxDivergenceError(
                    "shfl.sync lanes of one warp give different membermasks",
                    **m.where(int(threads[pos == w][0])),
                )
            need[w] = (int(ms[0]) >> np.arange(32)) & 1 == 1
        lanes, warps = warps_of(m, idx, "shfl.sync", need)
    else:
        lanes, warps = warps_of(m, idx, "shfl")
    lane = m.lane[threads]
    b = np.broadcast_to(np.asarray(m.read(b_op, "u32", idx), dtype=np.int64), lane.shape) & 31
    c = np.broadcast_to(np.asarray(m.read(c_op, "u32", idx), dtype=np.int64), lane.shape)
    cval, seg = c & 31, (c >> 8) & 31
    max_lane = (lane & seg) | (cval & ~seg)
    min_lane = lane & seg
    if mode == "up":
        j = lane - b
        p = j >= max_lane
    elif mode == "down":
        j = lane + b
        p = j <= max_lane
    elif mode == "bfly":
        j = lane ^ b
        p = j <= max_lane
    else:
        j = min_lane | (b & ~seg)
        p = j <= max_lane
    j = np.where(p, j, lane)
    pos = np.searchsorted(warps, m.warp[threads])
    src = lanes[pos, j]
    if (src < 0).any():
        k = int(np.argmax(src < 0))
        raise PtxDivergenceError(
            f"shfl.sync lane {int(lane[k])} reads lane {int(j[k])}, which does not execute "
            "it (not in membermask, diverged or exited)",
            **m.where(int(threads[k])),
        )
    full = m.read(a_op, "b32", slice(None))
    val = np.broadcast_to(np.asarray(full), (m.T,))[src]
    d, pd = (dst.first, dst.second) if isinstance(dst, Pair) else (dst, None)
    m.write(d, "b32", idx, val)
    if pd is not None:
        m.write(pd, "pred", idx, p)


@_reg("vote")
def _vote(m: Any, ins: Instruction, idx: Any) -> None:
    parts = ins.parts
    lanes, warps = warps_of(m, idx, ins.opcode)
    threads = np.arange(m.T)[idx]
    pos = np.searchsorted(warps, m.warp[threads])
    pv = np.zeros(m.T, dtype=bool)
    pv[threads] = np.broadcast_to(np.asarray(m.read(ins.operands[1], "pred", idx), dtype=bool), threads.shape)
    per = np.where(lanes >= 0, pv[np.maximum(lanes, 0)], False)
    if "ballot" in parts:
        bits = (per.astype(np.uint64) << np.arange(32, dtype=np.uint64)).sum(axis=1).astype(np.uint32)
        m.write(ins.operands[0], "b32", idx, bits[pos])
        return
    if "all" in parts:
        r = (per | (lanes < 0)).all(axis=1)
    elif "any" in parts:
        r = per.any(axis=1)
    else:
        r = per.all(axis=1) | (~per).all(axis=1)
    m.write(ins.operands[0], "pred", idx, r[pos])


@_reg("ldmatrix")
def _ldmatrix(m: Any, ins: Instruction, idx: Any) -> None:
    parts = ins.parts
    n = int(next(p for p in parts if p in ("x1", "x2", "x4"))[1:])
    if "m8n8" not in parts or "b16" not in parts:
        raise m.unsupported()
    lanes, _ = warps_of(m, idx, ins.opcode)
    addr_all = np.zeros(m.T, dtype=np.uint64)
    threads = np.arange(m.T)[idx]
    addr_all[threads] = m.address(ins.operands[1], idx)
    dsts = ins.operands[0].items if isinstance(ins.operands[0], Vec) else (ins.operands[0],)
    if len(dsts) != n:
        raise PtxIllegalInstructionError(
            f"{ins.opcode} has {len(dsts)} destination registers, .x{n} needs {n}",
            kernel=m.kernel,
            site=m.site(),
        )
    W = lanes.shape[0]
    row_lanes = lanes[:, : 8 * n]  # [W, 8n]: the row address givers
    ra = addr_all[row_lanes.reshape(-1)]
    rows = m.load("shared", ra, 16, row_lanes.reshape(-1), f"{ins.opcode} row").reshape(W, n, 8, 16)
    mats = rows.view(np.uint16).reshape(W, n, 8, 8)  # [W, matrix, row, col]
    if "trans" in parts:
        mats = mats.transpose(0, 1, 3, 2)
    lane = np.arange(32)
    r, c = lane // 4, 2 * (lane % 4)
    lo = mats[:, :, r, c]  # [W, n, 32]
    hi = mats[:, :, r, c + 1]
    word = lo.astype(np.uint32) | (hi.astype(np.uint32) << np.uint32(16))
    order = np.argsort(lanes.reshape(-1))
    flat_threads = lanes.reshape(-1)
    for j, d in enumerate(dsts):
        vals = word[:, j, :].reshape(-1)
        out = np.empty(m.T, dtype=np.uint32)
        out[flat_threads] = vals
        m.write(d, "b32", idx, out[threads])
    _ = order


@_reg("stmatrix")
def _stmatrix(m: Any, ins: Instruction, idx: Any) -> None:
    parts = ins.parts
    n = int(next(p for p in parts if p in ("x1", "x2", "x4"))[1:])
    lanes, _ = warps_of(m, idx, ins.opcode)
    threads = np.arange(m.T)[idx]
    addr_all = np.zeros(m.T, dtype=np.uint64)
    addr_all[threads] = m.address(ins.operands[0], idx)
    srcs = ins.operands[1].items if isinstance(ins.operands[1], Vec) else (ins.operands[1],)
    W = lanes.shape[0]
    words = np.zeros((m.T, n), dtype=np.uint32)
    for j, s in enumerate(srcs):
        words[threads, j] = m.read(s, "b32", idx)
    w = words[lanes.reshape(-1)].reshape(W, 32, n)  # [W, lane, j]
    mats = np.zeros((W, n, 8, 8), dtype=np.uint16)
    lane = np.arange(32)
    r, c = lane // 4, 2 * (lane % 4)
    for j in range(n):
        mats[:, j, r, c] = (w[:, :, j] & 0xFFFF).astype(np.uint16)
        mats[:, j, r, c + 1] = (w[:, :, j] >> 16).astype(np.uint16)
    if "trans" in parts:
        mats = mats.transpose(0, 1, 3, 2).copy()
    row_lanes = lanes[:, : 8 * n].reshape(-1)
    data = mats.reshape(W * n * 8, 8).copy().view(np.uint8).reshape(-1, 16)
    m.store("shared", addr_all[row_lanes], data, row_lanes, f"{ins.opcode} row")


def _frag_index(shape: str, kind: str, elem_bits: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of each (lane, element) of an mma fragment: ``[32, E]`` arrays (B: (k, n)).

    With ``g, t = lane // 4, lane % 4`` and ``p = 32 / elem_bits`` elements per register (PTX
    ISA, mma.m16n8k8 / k16 / k32 fragments): C element ``i`` is at ``(g + 8 [i >= 2], 2t + i % 2)``;
    A (16 x k) element ``i < k/2`` at ``(g + 8 ((i / p) % 2), p t + i % p + k/2 [i >= 2p])``;
    B (k x 8) element ``i < k/4`` at ``(p t + i % p + k/2 [i >= p], g)``."""
    lane = np.arange(32)[:, None]
    g, t = lane >> 2, lane & 3
    k = int(shape.split("k")[1])
    if kind == "c":
        i = np.arange(4)[None, :]
        return g + 8 * (i >= 2), 2 * t + (i & 1)
    if (elem_bits, k) not in ((16, 16), (16, 8), (8, 32)):
        raise KeyError(shape)
    p = 32 // elem_bits
    if kind == "a":
        i = np.arange(k // 2)[None, :]
        return g + 8 * ((i // p) & 1), p * t + i % p + k // 2 * (i >= 2 * p)
    i = np.arange(k // 4)[None, :]
    return p * t + i % p + k // 2 * (i >= p), np.broadcast_to(g, (32, k // 4))


_ELEM = {
    "f16": np.float16,
    "bf16": ml_dtypes.bfloat16,
    "e4m3": ml_dtypes.float8_e4m3fn,
    "e5m2": ml_dtypes.float8_e5m2,
    "s8": np.int8,
    "u8": np.uint8,
}


@_reg("mma")
def _mma(m: Any, ins: Instruction, idx: Any) -> None:
    parts = ins.parts
    shape = next(p for p in parts if p.startswith("m") and "n" in p and "k" in p)
    types = [p for p in parts if p in NP]
    if len(types) == 4:
        dt, at, bt, ct = types
    elif len(types) == 2:  # mma.sync...f16.f16 (d and c types) with f16 inputs
        dt, ct = types
        at = bt = "f16"
    else:
        raise m.unsupported()
    if shape not in ("m16n8k16", "m16n8k8", "m16n8k32") or at not in _ELEM or "row" not in parts:
        raise m.unsupported()
    lanes, _ = warps_of(m, idx, ins.opcode)
    threads = np.arange(m.T)[idx]
    W = lanes.shape[0]
    flat = lanes.reshape(-1)
    ebits = 16 if at in ("f16", "bf16") else 8
    per = 32 // ebits
    K = int(shape.split("k")[1])

    def gather(op: Any, kind: str) -> np.ndarray:
        items = op.items if isinstance(op, Vec) else (op,)
        t = "b32" if kind in ("a", "b") or ct in ("f16",) else ("f32" if ct == "f32" else "s32")
        regs = np.zeros((m.T, len(items)), dtype=np.uint32 if t == "b32" else NP[t])
        for j, it in enumerate(items):
            regs[threads, j] = m.read(it, t, idx)
        return regs[flat].reshape(W, 32, len(items))

    ra, rb = gather(ins.operands[1], "a"), gather(ins.operands[2], "b")
    ea = ra.copy().view(np.uint8 if ebits == 8 else np.uint16).view(_ELEM[at]).reshape(W, 32, -1)
    eb = rb.copy().view(np.uint8 if ebits == 8 else np.uint16).view(_ELEM[bt]).reshape(W, 32, -1)
    _ = per
    ar, ac = _frag_index(shape, "a", ebits)
    br, bc = _frag_index(shape, "b", ebits)
    cr, cc = _frag_index(shape, "c", ebits)
    A = np.zeros((W, 16, K))
    B = np.zeros((W, K, 8))
    A[:, ar, ac] = ea.astype(np.float64)
    B[:, br, bc] = eb.astype(np.float64)
    if ct == "f16":
        rc = gather(ins.operands[3], "c")
        ec = rc.copy().view(np.uint16).view(np.float16).reshape(W, 32, 4).astype(np.float64)
    else:
        ec = gather(ins.operands[3], "c").astype(np.float64)
    C = np.zeros((W, 16, 8))
    C[:, cr, cc] = ec
    D = np.einsum("wmk,wkn->wmn", A, B) + C
    dv = D[:, cr, cc]  # [W, 32, 4]
    dsts = ins.operands[0].items
    if dt == "f16":
        packed = dv.astype(np.float16).reshape(W * 32, 4).copy().view(np.uint32)  # [W*32, 2]
        for j, d in enumerate(dsts):
            out = np.zeros(m.T, dtype=np.uint32)
            out[flat] = packed[:, j]
            m.write(d, "b32", idx, out[threads])
        return
    nt = "f32" if dt == "f32" else "s32"
    vals = (
        dv.astype(np.float32)
        if nt == "f32"
        else np.clip(dv, -(2**31), 2**31 - 1).astype(np.int64).astype(np.int32)
    )
    for j, d in enumerate(dsts):
        out = np.zeros(m.T, dtype=NP[nt])
        out[flat] = vals.reshape(W * 32, 4)[:, j]
        m.write(d, nt, idx, out[threads])


@_reg("elect")
def _elect(m: Any, ins: Instruction, idx: Any) -> None:
    """``elect.sync d|p, membermask``: in each warp, the lowest executing lane in
    ``membermask`` is elected: ``p`` is true there only, ``d`` is its lane id everywhere."""
    threads = np.arange(m.T)[idx]
    mask = np.broadcast_to(np.asarray(m.read(ins.operands[1], "u32", idx)).astype(np.int64), threads.shape)
    lanes, warps = warps_of(m, idx, ins.opcode,
                            need=((int(mask[0]) >> np.arange(32)) & 1 == 1)[None, :].repeat(
                                len(np.unique(m.warp[threads])), axis=0))
    pos = np.searchsorted(warps, m.warp[threads])
    inmask = (lanes >= 0) & (((int(mask[0]) >> np.arange(32)) & 1) == 1)[None, :]
    leader = np.where(inmask.any(axis=1), np.argmax(inmask, axis=1), -1)
    dst = ins.operands[0]
    d, p = (dst.first, dst.second) if isinstance(dst, Pair) else (dst, None)
    if d is not None and getattr(d, "name", "_") != "_":
        m.write(d, "u32", idx, leader[pos].astype(np.uint32))
    if p is not None:
        m.write(p, "pred", idx, m.lane[threads] == leader[pos])
