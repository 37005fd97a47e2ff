"""Bulk asynchronous copies (sm_90, PTX ISA "cp.async.bulk.tensor", "cp.async.bulk"): TMA
loads and stores of a tensor map's box, and their bulk groups.

Tensor maps. On a GPU the kernel receives the driver's opaque 128-byte ``CUtensorMap``;
here it receives ``encode_tensor_map(params)``: the same ``cuTensorMapEncodeTiled``
parameters the launcher encodes (``hexlayout.runtime.tensormap.TensorMapParams``) in this
executor's own layout (``_FORMAT``: magic, rank, element bytes, swizzle bytes, NaN fill,
global address, dimensions, byte strides of dimensions 1.., box, element strides). The
instruction reads those bytes from where the kernel points (a ``.param`` tensor map's
address), so a wrong parameter or a wrong address in the printed code is seen.

* ``cp.async.bulk.tensor.Nd.shared::cluster.global{.tile}.mbarrier::complete_tx::bytes
  {.multicast::cluster} [dst], [map, {c0, ..}], [mbar]{, ctaMask}``: the box at coordinates
  ``c`` (innermost first; elements outside ``[0, dim)`` read as zero, NaN with the NaN fill)
  is read from global memory at issue and laid out in shared memory densely, innermost
  dimension contiguous, then ``Swizzle<B,4,3>`` applied to the absolute shared byte address
  (B = 1, 2, 3 for 32, 64, 128-byte swizzle); ``dst`` must be aligned to 128 bytes. The
  copy is *in flight* until it lands: its shared bytes are marked pending (any access is an
  error, ``Machine.check_tma_pending``) and it lands (bytes written, tx-count of ``mbar``
  lowered by the box's bytes: ``mbarrier.pend_transaction`` / ``land``) when a thread waits
  on ``mbar`` (``mbarrier.try_wait``) or when nothing else can run. With
  ``.multicast::cluster`` the box lands at ``dst`` in every CTA of the cluster whose rank bit
  is set in ``ctaMask``, each on its own barrier at ``mbar``'s offset. With ``.cta_group::2``
  (CTA pairs, sm_100a) the bytes complete instead on the barrier at ``mbar``'s offset in the
  even CTA of the destination's pair (ranks ``2p``, ``2p + 1``), as ``tcgen05.mma.cta_group::2``
  waits there for both CTAs' operands.
* ``cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [dst], [src], size,
  [mbar]``: ``size`` contiguous bytes (multiple of 16, both addresses 16-byte aligned).
* ``cp.async.bulk.tensor.Nd.global.shared::cta{.tile}.bulk_group [map, {c..}], [src]``: the
  box is read from shared memory (same layout) and written to its in-bounds global elements
  at issue; ``cp.reduce.async.bulk.tensor`` with ``.add`` adds instead.
  ``cp.async.bulk.commit_group`` / ``wait_group{.read} N``: nothing left to wait for.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np

from .alu import _reg
from .errors import PtxError, PtxIllegalInstructionError
from .machine import Machine
from .mbarrier import pend_transaction
from .memops import cp_async
from .parse import Instruction, TensorAddr

__all__ = ["TensorMap", "encode_tensor_map", "decode_tensor_map", "TMA_MAGIC"]

TMA_MAGIC = 0x4D54_4C48  # "HLTM"
#: magic, rank, element bytes, swizzle bytes, NaN fill, global address, dims[5] (u32),
#: byte strides of dims 1..4 (u64), box[5] (u32), element strides[5] (u32): 120 bytes
_FORMAT = "<IIIIIQ5I4Q5I5I"
_SWZ_BITS = {0: 0, 32: 1, 64: 2, 128: 3}


@dataclass(frozen=True)
class TensorMap:
    """A tensor map's parameters (dimensions innermost first; ``strides``: bytes of dims 1..)."""

    rank: int
    elem_bytes: int
    swizzle: int
    nan_fill: bool
    address: int
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    element_strides: tuple[int, ...]


def _pad(xs: Any, n: int) -> list[int]:
    return [int(x) for x in xs] + [0] * (n - len(xs))


def encode_tensor_map(p: Any) -> bytes:
    """The 128 bytes the executor's kernels receive for ``TensorMapParams`` ``p``."""
    raw = struct.pack(
        _FORMAT,
        TMA_MAGIC,
        int(p.rank),
        int(p.elem_bytes),
        int(p.swizzle_bytes),
        int("NAN" in str(p.oob_fill)),
        int(p.global_address),
        *_pad(p.global_dims, 5),
        *_pad(p.global_strides, 4),
        *_pad(p.box_dims, 5),
        *_pad(p.element_strides, 5),
    )
    return raw + bytes(128 - len(raw))


def decode_tensor_map(raw: bytes) -> TensorMap | None:
    """The parameters in 128 encoded bytes; None when they are not an encoded tensor map."""
    f = struct.unpack(_FORMAT, bytes(raw[: struct.calcsize(_FORMAT)]))
    if f[0] != TMA_MAGIC or not 1 <= f[1] <= 5:
        return None
    r = f[1]
    dims, strides, box, es = f[6:11], f[11:15], f[15:20], f[20:25]
    return TensorMap(
        r,
        f[2],
        f[3],
        bool(f[4]),
        f[5],
        tuple(dims[:r]),
        tuple(strides[: r - 1]),
        tuple(box[:r]),
        tuple(es[:r]),
    )


def _map(m: Machine, ins: Instruction, op: TensorAddr, t: int) -> TensorMap:
    addr = m.address(op.addr, np.array([t]))
    space = m.space_of(op.addr)
    if int(addr[0]) % 64:
        raise PtxIllegalInstructionError(
            f"{ins.opcode}: tensor map address {int(addr[0]):#x} is not 64-byte aligned", **m.where(t)
        )
    raw = m.load(
        space if space == "param" else "",
        addr + np.arange(0, 128, 16, dtype=np.uint64),
        16,
        np.full(8, t),
        f"{ins.opcode} tensor map",
    ).reshape(-1)
    tm = decode_tensor_map(raw.tobytes())
    if tm is None:
        raise PtxIllegalInstructionError(
            f"{ins.opcode}: the 128 bytes at {int(addr[0]):#x} are not a tensor map", **m.where(t)
        )
    if len(op.coords.items) != tm.rank:
        raise PtxIllegalInstructionError(
            f"{ins.opcode}: {len(op.coords.items)} coordinates for a rank-{tm.rank} tensor map", **m.where(t)
        )
    if any(s != 1 for s in tm.element_strides):
        raise m.unsupported(f"tensor maps with element strides {tm.element_strides}")
    return tm


def _box(
    m: Machine, ins: Instruction, tm: TensorMap, op: TensorAddr, t: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(global byte addresses, in-bounds mask, shared byte offsets before swizzle)`` of the
    box elements (innermost fastest)."""
    origin = [int(np.asarray(m.read(c, "s32", np.array([t]))).reshape(-1)[0]) for c in op.coords.items]
    crd = np.indices(tuple(reversed(tm.box))).reshape(tm.rank, -1)[::-1]
    inb = np.ones(crd.shape[1], dtype=bool)
    off = np.zeros(crd.shape[1], dtype=np.int64)
    for i in range(tm.rank):
        g = origin[i] + crd[i]
        inb &= (g >= 0) & (g < tm.dims[i])
        off += g * (tm.elem_bytes if i == 0 else tm.strides[i - 1])
    lin = np.arange(crd.shape[1], dtype=np.int64) * tm.elem_bytes
    return tm.address + off, inb, lin


def _swizzle(addr: np.ndarray, swizzle: int) -> np.ndarray:
    b = _SWZ_BITS[swizzle]
    return addr ^ ((addr >> 3) & (((1 << b) - 1) << 4)) if b else addr


def _gather(
    m: Machine, ins: Instruction, tm: TensorMap, gaddr: np.ndarray, inb: np.ndarray, t: int
) -> np.ndarray:
    """The box's bytes ``[n, elem_bytes]``: in-bounds elements from global memory, the rest
    zero (NaN with the NaN fill)."""
    eb = tm.elem_bytes
    out = np.zeros((len(gaddr), eb), dtype=np.uint8)
    if tm.nan_fill:
        nan = {
            2: np.array([np.nan], dtype=np.float16),
            4: np.array([np.nan], dtype=np.float32),
            1: np.array([np.nan], dtype=ml_dtypes.float8_e4m3fn),
        }.get(eb)
        if nan is not None:
            out[:] = nan.view(np.uint8)
    if inb.any():
        sel = np.nonzero(inb)[0]
        out[sel] = m.load(
            "global",
            gaddr[sel].astype(np.uint64),
            eb,
            np.full(len(sel), t),
            f"{ins.opcode} global box element",
        )
    return out


def _load(m: Machine, ins: Instruction, idx: Any) -> None:
    threads = np.arange(m.T)[idx]
    dst_op, src_op, bar_op = ins.operands[:3]
    multicast = "multicast::cluster" in ins.parts
    pair = "cta_group::2" in ins.parts
    if pair and m.csize % 2:
        raise PtxIllegalInstructionError(f"{ins.opcode}: .cta_group::2 needs CTA pairs; the cluster has "
                                         f"{m.csize} CTAs", **m.where(int(threads[0])))
    for t in threads:
        t = int(t)
        one = np.array([t])
        if isinstance(src_op, TensorAddr):
            tm = _map(m, ins, src_op, t)
            gaddr, inb, lin = _box(m, ins, tm, src_op, t)
            data = _gather(m, ins, tm, gaddr, inb, t).reshape(-1)
            swz = tm.swizzle
            lin = (lin[:, None] + np.arange(tm.elem_bytes)).reshape(-1)
        else:  # cp.async.bulk [dst], [src], size, [mbar]
            size = int(np.asarray(m.read(ins.operands[2], "u32", one)).reshape(-1)[0])
            bar_op = ins.operands[3]
            if size % 16:
                raise PtxIllegalInstructionError(
                    f"{ins.opcode}: size {size} is not a multiple of 16", **m.where(t)
                )
            src = m.address(src_op, one) + np.arange(0, size, 16, dtype=np.uint64)
            data = m.load("global", src, 16, np.full(size // 16, t), f"{ins.opcode} global source").reshape(
                -1
            )
            swz, lin = 0, np.arange(size, dtype=np.int64)
        dst = m.address(dst_op, one)
        align = 128 if isinstance(src_op, TensorAddr) else 16
        if int(dst[0]) % align:
            raise PtxIllegalInstructionError(
                f"{ins.opcode}: shared destination {int(dst[0]) & 0xFFFFFF} is not {align}-byte aligned",
                **m.where(t),
            )
        ranks: list[int | None] = [None]
        if multicast:
            mask = int(np.asarray(m.read(ins.operands[3], "u16", one)).reshape(-1)[0])
            ranks = [r for r in range(m.csize) if mask >> r & 1]
            if not ranks:
                raise PtxIllegalInstructionError(f"{ins.opcode}: an empty ctaMask", **m.where(t))
        for r in ranks:
            base = int(dst[0]) & 0xFFFFFF
            daddr = np.array([base if r is None else base | (r + 1) << 24], dtype=np.uint64)
            dflat = m.cluster_shared(daddr, one, 16, f"{ins.opcode} shared destination")[0]
            cta, off = divmod(int(dflat), m.smem_size)
            at = _swizzle(off + lin, swz)
            if int(at.max()) >= m.smem_size:
                raise PtxError(
                    f"{ins.opcode}: the box reaches shared byte {int(at.max())} of {m.smem_size}",
                    **m.where(t),
                )
            flat = cta * m.smem_size + at
            bop = m.address(bar_op, one)
            if r is not None:
                bop = np.array([(int(bop[0]) & 0xFFFFFF) | (r + 1) << 24], dtype=np.uint64)
            if pair:      # the barrier at that offset in the even CTA of the destination's pair
                even = int(m.crank[cta]) & ~1
                bop = np.array([(int(bop[0]) & 0xFFFFFF) | (even + 1) << 24], dtype=np.uint64)
            key = int(m.cluster_shared(bop, one, 8, f"{ins.opcode} mbarrier")[0])
            m.check_tma_pending(flat.reshape(1, -1), one, f"{ins.opcode} shared destination")
            pend_transaction(m, key, flat, data, t)


def _store(m: Machine, ins: Instruction, idx: Any, reduce: str | None) -> None:
    threads = np.arange(m.T)[idx]
    map_op, src_op = ins.operands[:2]
    for t in threads:
        t = int(t)
        one = np.array([t])
        tm = _map(m, ins, map_op, t)
        gaddr, inb, lin = _box(m, ins, tm, map_op, t)
        src = m.address(src_op, one)
        if int(src[0]) % 128:
            raise PtxIllegalInstructionError(
                f"{ins.opcode}: shared source {int(src[0])} is not 128-byte aligned", **m.where(t)
            )
        eb = tm.elem_bytes
        at = _swizzle(int(src[0]) + lin, tm.swizzle)
        data = m.load(
            "shared", at.astype(np.uint64), eb, np.full(len(at), t), f"{ins.opcode} shared box element"
        )
        sel = np.nonzero(inb)[0]
        if not len(sel):
            continue
        if reduce is None:
            m.store(
                "global",
                gaddr[sel].astype(np.uint64),
                data[sel],
                np.full(len(sel), t),
                f"{ins.opcode} global box element",
            )
            continue
        dt = {2: np.float16, 4: np.float32}.get(eb) if reduce == "f" else None
        if dt is None:
            raise m.unsupported(f"{ins.opcode} on {eb}-byte elements")
        old = m.load("global", gaddr[sel].astype(np.uint64), eb, np.full(len(sel), t), f"{ins.opcode} global")
        new = (old.view(dt) + data[sel].view(dt)).astype(dt).view(np.uint8)
        m.store(
            "global",
            gaddr[sel].astype(np.uint64),
            new.reshape(len(sel), eb),
            np.full(len(sel), t),
            f"{ins.opcode} global box element",
        )


@_reg("cp")
def cp(m: Machine, ins: Instruction, idx: Any) -> None:
    """``cp.async.bulk*`` and ``cp.reduce.async.bulk.tensor`` here; other ``cp.async`` forms in
    ``memops.cp_async``."""
    parts = ins.parts
    if "bulk" not in parts:
        return cp_async(m, ins, idx)
    if parts[0] == "cp" and parts[1] == "reduce":
        if "add" not in parts:
            raise m.unsupported()
        return _store(m, ins, idx, "f")
    if "commit_group" in parts or "wait_group" in parts:
        return None
    if "prefetch" in parts:
        return None
    dst_space = parts[3] if parts[3] != "tensor" else parts[5]
    if dst_space.startswith("global"):
        if "tensor" not in parts:
            raise m.unsupported()
        return _store(m, ins, idx, None)
    return _load(m, ins, idx)
