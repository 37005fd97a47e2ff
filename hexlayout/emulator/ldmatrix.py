"""``ldmatrix`` / ``stmatrix`` ``.m8n8.x{1,2,4}[.trans].b16``: warp-wide 8x8 matrix moves.

Lanes ``8j .. 8j+7`` give the (16-byte aligned) shared addresses of rows ``0..7`` of matrix
``j``; the other lanes' addresses are ignored. Lane ``l`` holds in its register ``j`` (two
16-bit elements, elements ``2j, 2j+1`` of the register slice) the elements ``(row l/4, cols
2(l%4), 2(l%4)+1)`` of matrix ``j``; with ``.trans`` the elements ``(rows 2(l%4), 2(l%4)+1,
col l/4)``. ``stmatrix`` moves the same elements the other way. Bank wavefronts are counted
per 8-lane phase of 16-byte rows; the row reads / writes are race-checked as accesses of
the lane that gave the row address.
"""

from __future__ import annotations

import numpy as np

from hexlayout.ir.lowered import Ldmatrix, Stmatrix

from .errors import IllegalInstructionError
from .machine import Active, Machine
from .warps import whole_units

__all__ = ["HANDLERS"]

_LANE = np.arange(32)
_ROW = _LANE // 4  # row (non-trans) / column (trans) of each lane
_COLS = 2 * (_LANE % 4)[:, None] + np.arange(2)  # [32, 2] the lane's two columns (rows when .trans)


def _setup(
    m: Machine, ins: Ldmatrix | Stmatrix, x: Active, reg_ref: object
) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    num = ins.num
    if num not in (1, 2, 4):
        m.fail(IllegalInstructionError, ins, f"{ins.opname}.x{num}: only .x1, .x2, .x4 exist")
    nb = m.reg_bytes_of(reg_ref)  # type: ignore[arg-type]
    if nb != 4 * num:
        m.fail(
            IllegalInstructionError,
            ins,
            f"{ins.opname}.x{num} moves {num} 32-bit register(s) per lane, its "
            f"register slice holds {nb} bytes",
        )
    grid = whole_units(m, ins, x.tids, 32, ins.opname)
    rows_t = grid[:, : 8 * num].reshape(-1)  # lanes giving row addresses, [W * 8num]
    env = {**x.env, m.tvar: rows_t}
    ref = ins.src if isinstance(ins, Ldmatrix) else ins.dst
    addr = m.smem_addresses(ref, env, rows_t, 16, ins)
    return grid, rows_t, addr, num


def ldmatrix(m: Machine, ins: Ldmatrix, x: Active) -> None:
    if not len(x.tids):
        return
    grid, rows_t, addr, num = _setup(m, ins, x, ins.dst)
    idx = m.byte_idx(addr, 16)
    m.smem_read(ins, rows_t, idx)
    mats = np.ascontiguousarray(m.smem.raw[idx]).view(np.uint16).reshape(len(grid), num, 8, 8)
    if ins.trans:
        vals = mats[:, :, _COLS, _ROW[:, None]]  # [W, num, 32, 2]
    else:
        vals = mats[:, :, _ROW[:, None], _COLS]
    out = np.ascontiguousarray(vals.transpose(0, 2, 1, 3)).reshape(len(x.tids), 2 * num)
    m.write_reg_bytes(ins.dst, grid.reshape(-1), x.env, ins, out.view(np.uint8))
    m.count_smem(ins, rows_t, addr, 16, ldsm=num)
    if m.options.check_races:
        m.shadow.clocks.join_units(grid)


def stmatrix(m: Machine, ins: Stmatrix, x: Active) -> None:
    if not len(x.tids):
        return
    grid, rows_t, addr, num = _setup(m, ins, x, ins.src)
    regs = np.ascontiguousarray(m.read_reg_bytes(ins.src, grid.reshape(-1), x.env, ins)).view(np.uint16)
    vals = regs.reshape(len(grid), 32, num, 2).transpose(0, 2, 1, 3)  # [W, num, 32, 2]
    mats = np.zeros((len(grid), num, 8, 8), dtype=np.uint16)
    if ins.trans:
        mats[:, :, _COLS, _ROW[:, None]] = vals
    else:
        mats[:, :, _ROW[:, None], _COLS] = vals
    data = mats.reshape(-1, 8).view(np.uint8)
    m.smem_write(ins, rows_t, m.byte_idx(addr, 16), data)
    m.count_smem(ins, rows_t, addr, 16, ldsm=num)
    if m.options.check_races:
        m.shadow.clocks.join_units(grid)


HANDLERS = {Ldmatrix: ldmatrix, Stmatrix: stmatrix}
