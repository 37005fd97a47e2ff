"""``mma.sync.aligned`` (sm_80 / sm_89): warp-wide ``D = A @ B^T + C`` over one atom.

The atom (``hexlayout.arch.get_atom(ins.atom)``) gives the TV layouts mapping (lane, value)
to tile coordinates: A ``m + M*k``, B ``n + N*k``, C/D ``m + M*n``; value order is the order
of elements in the register slices. Per warp the fragments are gathered into dense tiles,
converted exactly (float inputs to float32, tf32 truncated to its 19 bits, integers to
int64), multiplied in float32 (integers: exact, wrapped to int32) and scattered back to D;
16-bit accumulators are rounded (to nearest even) to f16 at the end. Every warp of the
executing group must be complete.
"""

from __future__ import annotations

from functools import cache
from typing import Any

import numpy as np

from hexlayout.arch import get_atom
from hexlayout.arch.mma_atom import MmaAtom
from hexlayout.ir.lowered import MmaSync, RegRef

from .errors import IllegalInstructionError
from .machine import Active, Machine
from .numerics import atom_numpy, is_int_type, to_compute
from .warps import whole_units

__all__ = ["HANDLERS", "tv_index", "read_operand", "dense_from_fragments", "fragments_from_dense"]


@cache
def tv_index(atom_name: str, operand: str) -> np.ndarray:
    """``[threads, values]`` tile index of each fragment element of an atom operand (a, b, c)."""
    atom = get_atom(atom_name)
    lay = {"a": atom.a_layout, "b": atom.b_layout, "c": atom.c_layout}[operand]
    t = atom.num_threads
    return lay.indices().reshape(-1, t).T.copy()


@cache
def atom_values(atom_name: str) -> tuple[int, int, int]:
    """Elements of A, B, C per thread (cached: computing layout sizes is not free)."""
    atom = get_atom(atom_name)
    return atom.values_a, atom.values_b, atom.values_c  # type: ignore[union-attr]


def read_operand(
    m: Machine,
    ins: object,
    ref: RegRef,
    tids: np.ndarray,
    env: dict,
    dtype: object,
    count: int,
    what: str,
    check_pending: bool = True,
) -> np.ndarray:
    """The register slice as ``[n, count]`` values of the atom's ``dtype`` (bytes reinterpreted)."""
    npd = atom_numpy(dtype)
    nb = m.reg_bytes_of(ref)
    if nb != count * npd.itemsize:
        m.fail(
            IllegalInstructionError,
            ins,
            f"{what}: the atom takes {count} {dtype} element(s) per thread "  # type: ignore[arg-type]
            f"({count * npd.itemsize} bytes), register slice {ref.array.name} holds {nb} bytes",
        )
    raw = m.read_reg_bytes(ref, tids, env, ins, check_pending=check_pending)  # type: ignore[arg-type]
    return np.ascontiguousarray(raw).view(npd).reshape(len(tids), count)


def dense_from_fragments(frag: np.ndarray, index: np.ndarray, rows: int, cols: int) -> np.ndarray:
    """``[U, threads, V]`` fragments -> ``[U, rows, cols]`` tiles, ``index`` = r + rows*c."""
    u = frag.shape[0]
    flat = np.zeros((u, rows * cols), dtype=frag.dtype)
    flat[:, index.reshape(-1)] = frag.reshape(u, -1)
    return flat.reshape(u, cols, rows).transpose(0, 2, 1)


def fragments_from_dense(tile: np.ndarray, index: np.ndarray) -> np.ndarray:
    """``[U, rows, cols]`` -> ``[U, threads, V]`` at ``index`` = r + rows*c."""
    u = tile.shape[0]
    flat = tile.transpose(0, 2, 1).reshape(u, -1)
    return flat[:, index.reshape(-1)].reshape(u, *index.shape)


def finish_accumulator(d: np.ndarray, dtype: object) -> np.ndarray:
    npd = atom_numpy(dtype)
    if is_int_type(dtype):
        return d.astype(np.int64).astype(np.int32)
    return d.astype(np.float32).astype(npd)


def instruction_atom(m: Machine, ins: Any, kind: str, what: str) -> MmaAtom:
    """The mma atom ``ins.atom`` names, which must be a ``kind`` atom (``what``: the instruction)."""
    try:
        atom: MmaAtom = get_atom(ins.atom)  # type: ignore[assignment]
    except ValueError as e:
        m.fail(IllegalInstructionError, ins, str(e))
    if atom.kind != kind:
        m.fail(IllegalInstructionError, ins, f"{what} with atom {ins.atom}, a {atom.kind} atom")
    return atom


def mma_sync(m: Machine, ins: MmaSync, x: Active) -> None:
    if not len(x.tids):
        return
    atom = instruction_atom(m, ins, "mma.sync", "MmaSync")
    grid = whole_units(m, ins, x.tids, 32, "mma.sync")
    tids = grid.reshape(-1)
    M, N, K = atom.shape_mnk
    w = len(grid)
    va, vb, vc = atom_values(ins.atom)
    a = read_operand(m, ins, ins.a, tids, x.env, atom.a_dtype, va, "A")
    b = read_operand(m, ins, ins.b, tids, x.env, atom.b_dtype, vb, "B")
    c = read_operand(m, ins, ins.c, tids, x.env, atom.c_dtype, vc, "C")
    A = dense_from_fragments(to_compute(a, atom.a_dtype).reshape(w, 32, -1), tv_index(ins.atom, "a"), M, K)
    B = dense_from_fragments(to_compute(b, atom.b_dtype).reshape(w, 32, -1), tv_index(ins.atom, "b"), N, K)
    C = dense_from_fragments(to_compute(c, atom.c_dtype).reshape(w, 32, -1), tv_index(ins.atom, "c"), M, N)
    if m.reg_bytes_of(ins.d) != vc * atom_numpy(atom.c_dtype).itemsize:
        m.fail(
            IllegalInstructionError,
            ins,
            f"D: register slice {ins.d.array.name} holds {m.reg_bytes_of(ins.d)} "
            f"bytes, the atom writes {vc} {atom.c_dtype} element(s) per thread",
        )
    D = np.matmul(A, B.transpose(0, 2, 1)) + C
    d = fragments_from_dense(finish_accumulator(D, atom.c_dtype), tv_index(ins.atom, "c"))
    m.write_reg_bytes(ins.d, tids, x.env, ins, np.ascontiguousarray(d.reshape(len(tids), -1)).view(np.uint8))


HANDLERS = {MmaSync: mma_sync}
