"""Plain vector loads and stores: ``ld/st.global`` and ``ld/st.shared`` of 8..128 bits.

Each active thread moves ``bits`` bits between memory at its element offset and its
register slice, byte for byte (the register slice must hold exactly ``bits`` bits). The
address must be aligned to the access width and inside the tensor (global: its extent) or
buffer (shared). ``LdGlobal`` with ``zero_fill`` writes zeros into the registers of the
threads its predicate switches off (``ld.global`` guarded by a predicate with a zeroing
``else``). Global requests are counted per warp in 32-byte sectors; shared requests in
bank wavefronts; shared accesses are race-checked.
"""

from __future__ import annotations

import numpy as np

from hexlayout.ir.lowered import Instr, LdGlobal, LdShared, StGlobal, StShared

from .errors import IllegalInstructionError
from .machine import Active, Machine
from .memory import gather_bytes

__all__ = ["HANDLERS"]

_WIDTHS = (8, 16, 32, 64, 128)


def _check_width(m: Machine, ins: Instr, bits: int, reg_bytes: int, what: str) -> int:
    if bits not in _WIDTHS:
        m.fail(IllegalInstructionError, ins, f"{what}: {bits}-bit access is not one of {_WIDTHS}")
    if reg_bytes * 8 != bits:
        m.fail(
            IllegalInstructionError,
            ins,
            f"{what}: moves {bits} bits but its register slice holds {reg_bytes * 8} bits",
        )
    return bits // 8


def ld_global(m: Machine, ins: LdGlobal, x: Active) -> None:
    nb = _check_width(m, ins, ins.bits, m.reg_bytes_of(ins.dst), "ld.global")
    if len(x.tids):
        t, addr = m.global_addresses(ins.src, x.env, x.tids, nb, ins)
        m.write_reg_bytes(ins.dst, x.tids, x.env, ins, gather_bytes(t.raw, addr, nb))
        m.count_gmem(ins, x.tids, addr, nb)
    if ins.zero_fill and x.mask is not None and not x.mask.all():
        off = x.group[~x.mask]
        m.write_reg_bytes(ins.dst, off, x.group_env, ins, np.zeros((len(off), nb), dtype=np.uint8))


def st_global(m: Machine, ins: StGlobal, x: Active) -> None:
    nb = _check_width(m, ins, ins.bits, m.reg_bytes_of(ins.src), "st.global")
    if not len(x.tids):
        return
    data = m.read_reg_bytes(ins.src, x.tids, x.env, ins)
    t, addr = m.global_addresses(ins.dst, x.env, x.tids, nb, ins)
    t.raw[m.byte_idx(addr, nb)] = data
    m.count_gmem(ins, x.tids, addr, nb)


def ld_shared(m: Machine, ins: LdShared, x: Active) -> None:
    nb = _check_width(m, ins, ins.bits, m.reg_bytes_of(ins.dst), "ld.shared")
    if not len(x.tids):
        return
    addr = m.smem_addresses(ins.src, x.env, x.tids, nb, ins)
    idx = m.byte_idx(addr, nb)
    m.smem_read(ins, x.tids, idx)
    m.write_reg_bytes(ins.dst, x.tids, x.env, ins, m.smem.raw[idx])
    m.count_smem(ins, x.tids, addr, nb)


def st_shared(m: Machine, ins: StShared, x: Active) -> None:
    nb = _check_width(m, ins, ins.bits, m.reg_bytes_of(ins.src), "st.shared")
    if not len(x.tids):
        return
    data = m.read_reg_bytes(ins.src, x.tids, x.env, ins)
    addr = m.smem_addresses(ins.dst, x.env, x.tids, nb, ins)
    m.smem_write(ins, x.tids, m.byte_idx(addr, nb), data)
    m.count_smem(ins, x.tids, addr, nb)


HANDLERS = {LdGlobal: ld_global, StGlobal: st_global, LdShared: ld_shared, StShared: st_shared}
