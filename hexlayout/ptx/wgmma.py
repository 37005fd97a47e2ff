"""Warpgroup instructions (sm_90a, PTX ISA "Asynchronous Warpgroup Level Matrix Multiply-
Accumulate"): ``wgmma.mma_async`` with its fence / commit_group / wait_group, and
``setmaxnreg``.

A warpgroup is 4 consecutive warps (threads ``128w .. 128w + 127`` of a block); each
``.sync.aligned`` instruction needs all 128 threads executing it together.

``wgmma.mma_async.sync.aligned.m64nNkK.dtype.atype.btype d, a, b-desc, scale-d,
imm-scale-a, imm-scale-b{, imm-trans-a}{, imm-trans-b}``: ``D[64, N] = (+-A)[64, K] @
(+-B)[K, N] (+ D when scale-d)``. Products and sums in float64 (integers exact), rounded
once to the D type.

* Shared-memory operands come through 64-bit matrix descriptors (the value in the first
  thread of the warpgroup; it must be the same in all 128): start address, leading and
  stride byte offsets and the swizzle mode decode as ``hexlayout.arch.gmma.GmmaDescriptor``
  and the element ``(mn, k)`` is read at ``gmma_desc_addresses`` (the canonical K-major
  layout, or MN-major when ``imm-trans`` is 1), swizzled on the absolute shared address.
  A is ``[64, K]`` (``a`` a descriptor) or registers; B is ``[N, K]``.
* Register fragments (warp ``w`` of the warpgroup, ``g = lane >> 2``, ``t = lane & 3``):
  D element ``i`` (f32 / s32: ``N/2`` registers; f16: ``N/4`` registers of two halves, low
  first, elements ``2j, 2j+1``) is row ``16w + g + 8((i >> 1) & 1)``, column
  ``8(i >> 2) + 2t + (i & 1)``; register A (4 ``.b32`` registers) holds element ``i`` of
  the ``mma.m16n8k16`` (16-bit) or ``m16n8k32`` (8-bit) A fragment at row ``16w + row``.

Asynchrony: the product is computed when the wgmma is issued (its shared bytes are read
then, so they must not be pending TMA writes), which is one legal completion order; the
commit and wait instructions only check that the warpgroup executes them together.
``setmaxnreg`` changes nothing on the CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from hexlayout.arch.gmma import GmmaDescriptor, gmma_desc_addresses

from .alu import _reg
from .errors import PtxDivergenceError, PtxIllegalInstructionError
from .machine import Machine
from .parse import Imm, Instruction, Vec
from .warp import _ELEM, _frag_index

__all__ = ["warpgroups"]

_BITS = {"f16": 16, "bf16": 16, "e4m3": 8, "e5m2": 8, "s8": 8, "u8": 8}


def warpgroups(m: Machine, idx: Any, what: str) -> np.ndarray:
    """``[G, 128]`` threads of the complete warpgroups executing ``what``."""
    threads = np.arange(m.T)[idx]
    wg = m.blk[threads] * ((m.ntid + 127) // 128) + m.tid[threads] // 128
    groups = np.unique(wg)
    out = np.full((len(groups), 128), -1, dtype=np.int64)
    out[np.searchsorted(groups, wg), m.tid[threads] % 128] = threads
    if (out < 0).any():
        g = int(np.argmax((out < 0).any(axis=1)))
        t0 = int(out[g][out[g] >= 0][0])
        missing = np.nonzero(out[g] < 0)[0]
        raise PtxDivergenceError(
            f"{what} needs all 128 threads of warpgroup {int(m.tid[t0]) // 128} together; "
            f"threads {missing[:8].tolist()}{'...' if len(missing) > 8 else ''} of it "
            "are not executing it (divergent control flow, or exited threads)",
            **m.where(t0),
        )
    return out


@_reg("setmaxnreg")
def _setmaxnreg(m: Machine, ins: Instruction, idx: Any) -> None:
    warpgroups(m, idx, ins.opcode)


def _desc_operand(
    m: Machine, ins: Instruction, op: Any, wg: np.ndarray, major: str, bits: int, mn: int, k: int, what: str
) -> np.ndarray:
    """``[mn, k]`` raw elements (uint8 / uint16) of a descriptor operand for warpgroup ``wg``."""
    v = np.asarray(m.read(op, "u64", wg)).astype(np.uint64)
    if (v != v[0]).any():
        raise PtxIllegalInstructionError(
            f"{ins.opcode}: the {what} descriptor differs between the threads of the warpgroup",
            **m.where(int(wg[0])),
        )
    d = GmmaDescriptor.decode(int(v[0]))
    if d.base_offset:
        raise m.unsupported(f"{what} descriptors with a base offset ({d.base_offset})")
    addr = gmma_desc_addresses(d, major, bits, mn, k).reshape(-1)
    eb = bits // 8
    t0 = int(wg[0])
    raw = m.load("shared", addr.astype(np.uint64), eb, np.full(len(addr), t0), f"{ins.opcode} {what} operand")
    return raw.view(np.uint8 if eb == 1 else np.uint16).reshape(mn, k)


def _read32(m: Machine, regs: Any, wg: np.ndarray) -> np.ndarray:
    """``[128, R]`` raw bits of the 32-bit registers ``regs`` of warpgroup ``wg``."""
    return np.stack([np.asarray(m.read(r, "b32", wg)).astype(np.uint32) for r in regs], axis=1)


def _write32(m: Machine, regs: Any, wg: np.ndarray, bits: np.ndarray) -> None:
    """Write raw 32-bit ``bits[:, j]`` to register ``regs[j]`` of warpgroup ``wg``."""
    for j, r in enumerate(regs):
        arr = m.reg(r.name)
        if arr.dtype == np.uint32:
            arr[wg] = bits[:, j]
        else:
            m.write(r, "b32", wg, bits[:, j])


def _d_index(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(row, col) of D element ``i`` of thread ``128``-index ``x``: ``[128, N/2]`` arrays."""
    x = np.arange(128)[:, None]
    w, lane = x // 32, x % 32
    g, t = lane >> 2, lane & 3
    i = np.arange(n // 2)[None, :]
    return 16 * w + g + 8 * ((i >> 1) & 1), 8 * (i >> 2) + 2 * t + (i & 1)


def _wgmma(m: Machine, ins: Instruction, idx: Any) -> None:
    parts = ins.parts
    shape = next(p for p in parts if p.startswith("m64n"))
    n, k = int(shape[4:].split("k")[0]), int(shape.split("k")[1])
    types = [p for p in parts[4:] if p in _BITS or p in ("f32", "s32")]
    if len(types) != 3 or types[1] not in _BITS or types[2] not in _BITS:
        raise m.unsupported()
    dt, at, bt = types
    bits = _BITS[at]
    if k * bits != 256:
        raise m.unsupported()
    ops = ins.operands
    d_op, a_op, b_op, sd_op = ops[:4]
    imms = [int(o.value) for o in ops[4:] if isinstance(o, Imm)]
    rs = isinstance(a_op, Vec)
    scale_a, scale_b = (imms + [1, 1])[:2]
    trans = imms[2:] if bits == 16 else []
    tr_a = bool(trans[0]) if trans and not rs else False
    tr_b = bool(trans[-1]) if trans else False
    dregs = d_op.items if isinstance(d_op, Vec) else (d_op,)
    per = n // 2 if dt != "f16" else n // 4
    if len(dregs) != per:
        raise PtxIllegalInstructionError(
            f"{ins.opcode}: {len(dregs)} D registers, the shape needs {per}",
            **m.where(int(np.arange(m.T)[idx][0])),
        )
    groups = warpgroups(m, idx, ins.opcode)
    rows, cols = _d_index(n)
    ar, ac = _frag_index("m16n8k16" if bits == 16 else "m16n8k32", "a", bits)
    for wg in groups:
        t0 = int(wg[0])
        sd = (
            np.asarray(m.read(sd_op, "pred", wg), dtype=bool)
            if not isinstance(sd_op, Imm)
            else np.full(128, bool(sd_op.value))
        )
        if (sd != sd[0]).any():
            raise PtxIllegalInstructionError(
                f"{ins.opcode}: scale-d differs between the threads of the warpgroup", **m.where(t0)
            )
        if rs:
            regs = _read32(m, a_op.items, wg)
            ev = regs.view(np.uint8 if bits == 8 else np.uint16).view(_ELEM[at]).astype(np.float64)
            A = np.zeros((64, k))
            lane = np.arange(128) % 32
            w = np.arange(128) // 32
            A[16 * w[:, None] + ar[lane], ac[lane]] = ev
        else:
            A = _desc_operand(m, ins, a_op, wg, "MN" if tr_a else "K", bits, 64, k, "A").view(_ELEM[at])
            A = A.astype(np.float64)
        B = (
            _desc_operand(m, ins, b_op, wg, "MN" if tr_b else "K", bits, n, k, "B")
            .view(_ELEM[bt])
            .astype(np.float64)
        )
        D = (scale_a * A) @ (scale_b * B).T
        c = _read32(m, dregs, wg) if sd[0] else None
        if dt == "f16":
            if c is not None:
                D[rows, cols] += c.view(np.float16).astype(np.float64)
            _write32(m, dregs, wg, D[rows, cols].astype(np.float16).view(np.uint32))
            continue
        npt = np.float32 if dt == "f32" else np.int32
        if c is not None:
            D[rows, cols] += c.view(npt)
        vals = D[rows, cols]
        vals = vals.astype(np.float32) if dt == "f32" else np.clip(vals, -(2**31), 2**31 - 1).astype(np.int32)
        _write32(m, dregs, wg, vals.view(np.uint32))


@_reg("wgmma")
def _wgmma_any(m: Machine, ins: Instruction, idx: Any) -> None:
    op = ins.parts[1]
    if op == "mma_async":
        if "sp" in ins.parts:
            raise m.unsupported()
        return _wgmma(m, ins, idx)
    if op in ("fence", "commit_group", "wait_group"):
        warpgroups(m, idx, ins.opcode)
        return None
    raise m.unsupported()
