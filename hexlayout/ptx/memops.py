"""Loads, stores, atomics and asynchronous copies (PTX ISA "Data Movement and Conversion
Instructions": ld, st, atom, red, cp.async with commit_group / wait_group).

``ld`` / ``st`` move ``.vN`` elements of the type per thread; the access (all N elements)
must be aligned to its size and in bounds of its state space (see ``machine``). A load
into a register wider than the type zero-extends (sign-extends for signed types).

``cp.async`` (sm_80): the global bytes are read when the copy is issued, but written to
shared memory only when a ``cp.async.wait_group N`` / ``wait_all`` of the issuing thread
retires its group (groups are closed by ``commit_group``; ``wait_group N`` retires all but
the newest N), so a read before the wait sees the old shared bytes, as it may on a GPU.
``src-size`` < ``cp-size`` zero-fills the rest; only ``src-size`` bytes are read (and
bounds-checked) from global memory.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from .alu import HANDLERS, _reg
from .parse import Imm, Instruction, Vec
from .types import BITS, NP, UINT, type_of

__all__ = ["HANDLERS", "CpAsyncQueue", "cp_async"]

_SPACES = ("global", "shared", "local", "param", "const")


def _space(ins: Instruction) -> str:
    for p in ins.parts[1:]:
        base = p.split("::")[0]
        if base in _SPACES:
            return base
    return ""


def _vec(ins: Instruction) -> int:
    for p in ins.parts:
        if p in ("v2", "v4", "v8"):
            return int(p[1:])
    return 1


def _items(op: Any, n: int) -> list[Any]:
    return list(op.items) if isinstance(op, Vec) else [op] * (1 if n == 1 else n)


def _access(m: Any, ins: Instruction, idx: Any, a: int) -> tuple[str, int, int, str, np.ndarray]:
    """``(type, elements, bytes per element, state space, addresses)`` of an ``ld`` / ``st``
    whose address is operand ``a``."""
    t = type_of(ins.parts)
    space = _space(ins) or m.space_of(ins.operands[a])
    return t, _vec(ins), BITS[t] // 8, space, m.address(ins.operands[a], idx)


@_reg("ld", "ldu")
def _ld(m: Any, ins: Instruction, idx: Any) -> None:
    t, n, sz, space, addr = _access(m, ins, idx, 1)
    data = m.load(space, addr, sz * n, idx, f"{ins.opcode} load")
    vals = data.reshape(-1, n, sz)
    for k, dst in enumerate(_items(ins.operands[0], n)):
        v = (
            np.ascontiguousarray(vals[:, k, :])
            .view(UINT[BITS[t]] if BITS[t] in UINT else np.uint8)
            .reshape(-1)
        )
        m.write(dst, t, idx, v.view(NP[t]))


@_reg("st")
def _st(m: Any, ins: Instruction, idx: Any) -> None:
    t, n, sz, space, addr = _access(m, ins, idx, 0)
    cnt = len(addr)
    data = np.empty((cnt, n, sz), dtype=np.uint8)
    for k, src in enumerate(_items(ins.operands[1], n)):
        v = np.broadcast_to(np.asarray(m.read(src, t, idx), dtype=NP[t]), (cnt,))
        data[:, k, :] = np.ascontiguousarray(v).view(np.uint8).reshape(cnt, sz)
    m.store(space, addr, data.reshape(cnt, n * sz), idx, f"{ins.opcode} store")


_ATOM_OPS = {"add", "min", "max", "exch", "cas", "and", "or", "xor", "inc", "dec"}


@_reg("atom", "red")
def _atom(m: Any, ins: Instruction, idx: Any) -> None:
    """Applied thread by thread in thread order (one valid serialization of the atomics)."""
    t = type_of(ins.parts)
    op = next(p for p in ins.parts[1:] if p in _ATOM_OPS)
    space = _space(ins) or m.space_of(ins.operands[0 if ins.parts[0] == "red" else 1])
    has_dst = ins.parts[0] == "atom"
    aop = ins.operands[1] if has_dst else ins.operands[0]
    srcs = ins.operands[2:] if has_dst else ins.operands[1:]
    if t in ("f16x2", "bf16x2") or "v2" in ins.parts or "v4" in ins.parts:
        raise m.unsupported()
    sz = BITS[t] // 8
    addr = m.address(aop, idx)
    threads = np.arange(m.T)[idx]
    vals = [np.broadcast_to(np.asarray(m.read(s, t, idx), dtype=NP[t]), (len(threads),)) for s in srcs]
    buf, off = m.locate(space, addr, sz, idx, f"{ins.opcode}")
    old_all = np.empty(len(threads), dtype=NP[t])
    for i in range(len(threads)):
        at = off[i] + np.arange(sz)
        raw = buf.gather(at[None, :])[0] if hasattr(buf, "gather") else buf[at]
        old = raw.view(NP[t])[0]
        b = vals[0][i]
        if op == "add":
            new = (
                (old + b)
                if t[0] == "f"
                else NP[t](
                    (int(old) + int(b)) % (1 << (8 * sz))
                    if t[0] != "s"
                    else ((int(old) + int(b) + 2 ** (8 * sz - 1)) % (1 << 8 * sz)) - 2 ** (8 * sz - 1)
                )
            )
        elif op == "min":
            new = min(old, b)
        elif op == "max":
            new = max(old, b)
        elif op == "exch":
            new = b
        elif op == "cas":
            new = vals[1][i] if old == b else old
        elif op == "and":
            new = NP[t](int(old) & int(b))
        elif op == "or":
            new = NP[t](int(old) | int(b))
        elif op == "xor":
            new = NP[t](int(old) ^ int(b))
        elif op == "inc":
            new = NP[t](0 if int(old) >= int(b) else int(old) + 1)
        else:
            new = NP[t](int(b) if int(old) == 0 or int(old) > int(b) else int(old) - 1)
        nb = np.array([new], dtype=NP[t]).view(np.uint8)
        if hasattr(buf, "scatter"):
            buf.scatter(at[None, :], nb[None, :])
        else:
            buf[at] = nb
        old_all[i] = old
    if has_dst:
        m.write(ins.operands[0], t, idx, old_all)


class CpAsyncQueue:
    """In-flight cp.async copies: per copy the threads, shared destinations, bytes, and the
    group each belongs to (-1: not yet committed)."""

    def __init__(self, T: int) -> None:
        self.copies: list[dict[str, Any]] = []
        self.commits = np.zeros(T, dtype=np.int64)

    def issue(self, threads: np.ndarray, dst: np.ndarray, data: np.ndarray) -> None:
        self.copies.append(
            {"thr": threads, "dst": dst, "data": data, "group": np.full(len(threads), -1, dtype=np.int64)}
        )

    def commit(self, threads: np.ndarray) -> None:
        for c in self.copies:
            sel = np.isin(c["thr"], threads) & (c["group"] < 0)
            c["group"][sel] = self.commits[c["thr"][sel]]
        self.commits[threads] += 1

    def wait(self, m: Any, threads: np.ndarray, n: int | None) -> None:
        keep = []
        for c in self.copies:
            mine = np.isin(c["thr"], threads)
            if n is None:
                done = mine
            else:
                done = mine & (c["group"] >= 0) & (c["group"] < self.commits[c["thr"]] - n)
            if done.any():
                at = c["dst"][done].reshape(-1, 1) + np.arange(c["data"].shape[1])
                if m.races is not None:      # the copy writes shared memory now, as its issuing thread
                    m.races.access(m, at, c["thr"][done], write=True)
                m.smem[at] = c["data"][done]
            if not done.all():
                keep.append({k: (v[~done] if isinstance(v, np.ndarray) else v) for k, v in c.items()})
        self.copies = keep


def cp_async(m: Any, ins: Instruction, idx: Any) -> None:
    """``cp.async`` and its groups (``bulk.cp`` dispatches the bulk forms)."""
    parts = ins.parts
    threads = np.arange(m.T)[idx]
    if parts[1] != "async":
        raise m.unsupported()
    op = parts[2]
    if op == "commit_group":
        m.cpasync.commit(threads)
        return
    if op == "wait_group":
        m.cpasync.wait(m, threads, m.uniform(ins.operands[0], idx, "cp.async.wait_group N"))
        return
    if op == "wait_all":
        m.cpasync.wait(m, threads, None)
        return
    if op not in ("ca", "cg"):
        raise m.unsupported()
    dst_op, src_op, size_op = ins.operands[:3]
    cp_size = int(size_op.value) if isinstance(size_op, Imm) else m.uniform(size_op, idx, "cp-size")
    rest = ins.operands[3:]
    src_size = np.full(len(threads), cp_size, dtype=np.int64)
    if rest and not (isinstance(rest[0], Imm) and isinstance(rest[0].value, float)):
        first = rest[0]
        if "L2::cache_hint" not in parts or len(rest) > 1:
            if getattr(first, "name", "").startswith("%p") or (
                hasattr(first, "name") and m.rtypes.get(first.name) == "pred"
            ):
                ignore = np.asarray(m.read(first, "pred", idx), dtype=bool)
                src_size = np.where(ignore, 0, src_size)
            else:
                src_size = np.broadcast_to(
                    np.asarray(m.read(first, "u32", idx)).astype(np.int64), (len(threads),)
                ).copy()
    dst = m.address(dst_op, idx)
    _, dflat = m.locate("shared", dst, cp_size, idx, f"{ins.opcode} shared destination")
    data = np.zeros((len(threads), cp_size), dtype=np.uint8)
    src = m.address(src_op, idx)
    for s in np.unique(src_size):
        sel = src_size == s
        if s <= 0:
            continue
        sub = np.arange(m.T)[idx][sel]
        got = (
            m.load("global", src[sel], int(s), sub, f"{ins.opcode} global source")
            if s == cp_size
            else _load_partial(m, src[sel], int(s), sub, ins)
        )
        data[sel, : int(s)] = got
    m.cpasync.issue(threads, dflat, data)


def _load_partial(m: Any, addr: np.ndarray, n: int, idx: Any, ins: Instruction) -> np.ndarray:
    """``n`` bytes (fewer than the copy size) without the copy-size alignment requirement."""
    buf, off = m.locate("global", addr, 1, idx, f"{ins.opcode} global source")
    m.locate("global", addr + np.uint64(n - 1), 1, idx, f"{ins.opcode} global source")
    at = off.reshape(-1, 1) + np.arange(n)
    return buf.gather(at) if hasattr(buf, "gather") else buf[at]
