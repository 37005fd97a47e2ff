"""The state of a batch of thread blocks executing one PTX entry, and operand access.

Threads are numbered block-major (``t = b * ntid + tid``); every register is a numpy array
over all threads, holding the raw bits of its declared width (``.pred``: bool). Fresh
registers hold ``0xFF..`` bits (NaN / -1), so a read before any write shows up in results.

Address spaces (PTX ISA "State Spaces"):

* global: the tensors' real host addresses (their data pointers); an access must lie in a
  ``GlobalRegion``'s in-bounds span (``extent`` bytes from ``base``, the span the tensor
  parameter's shape and strides address) and be aligned to its size;
* shared: per block, ``size`` bytes from address 0: the dynamic window (``extern .shared``)
  at 0, then the static ``.shared`` variables at their alignment; filled with ``0xFF``;
* local: per thread, the ``.local`` variables (``__local_depot``);
* param: the kernel parameters' bytes (``ld.param``); a generic address is one of the
  above, the shared, local and param windows living at ``SHARED_WINDOW`` /
  ``LOCAL_WINDOW`` / ``PARAM_WINDOW``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from .errors import (
    PtxError,
    PtxMisalignedAccessError,
    PtxOutOfBoundsError,
    PtxRaceError,
    PtxSite,
    UnsupportedInstructionError,
)
from .parse import Addr, Entry, Imm, Instruction, Module, Reg, Sym, Vec
from .srcmap import SourceMap
from .types import BITS, NP, UINT, from_bits, to_bits

__all__ = ["GlobalRegion", "Machine", "SharedRaces", "SHARED_WINDOW", "LOCAL_WINDOW", "PARAM_WINDOW",
           "WINDOWS", "POISON", "CLUSTER_RANK_SHIFT"]

SHARED_WINDOW = 0x7E00_0000_0000_0000
LOCAL_WINDOW = 0x7D00_0000_0000_0000
PARAM_WINDOW = 0x7C00_0000_0000_0000
_WINDOW = 0x0100_0000_0000_0000
#: the state spaces a generic address reaches through a window, and where each window starts
WINDOWS = {"shared": SHARED_WINDOW, "local": LOCAL_WINDOW, "param": PARAM_WINDOW}
POISON = 0xFF
RUN, BARRIER, EXITED, WAIT, CONVERGE = 0, 1, 2, 3, 4
#: a ``shared::cluster`` address of CTA rank r (``mapa``) is ``(r + 1) << CLUSTER_RANK_SHIFT | offset``;
#: a plain ``shared::cta`` offset (below ``1 << CLUSTER_RANK_SHIFT``) names the executing CTA.
CLUSTER_RANK_SHIFT = 24


@dataclass
class GlobalRegion:
    """A tensor in global memory: ``raw`` bytes (a view of the caller's array, written in
    place) at host address ``base``; ``extent`` bytes from ``base`` are in bounds."""

    name: str
    base: int
    raw: np.ndarray
    extent: int


class Machine:
    """Blocks ``blocks`` (``(x, y, z)`` each) of ``entry`` with ``ntid`` threads, run together."""

    def __init__(
        self,
        module: Module,
        entry: Entry,
        params: list[Any],
        regions: list[GlobalRegion],
        grid: tuple[int, int, int],
        ntid: tuple[int, int, int],
        blocks: list[tuple[int, int, int]],
        dynamic_smem: int,
        srcmap: SourceMap | None = None,
        kernel: str = "",
        check_races: bool = True,
        cluster: tuple[int, int, int] = (1, 1, 1),
    ) -> None:
        self.module, self.entry = module, entry
        self.kernel = kernel or entry.name
        self.srcmap = srcmap or SourceMap("")
        self.grid, self.ntid_xyz, self.blocks = grid, ntid, blocks
        self.ntid = ntid[0] * ntid[1] * ntid[2]
        self.nb = len(blocks)
        self.T = self.nb * self.ntid
        t = np.arange(self.T, dtype=np.int64)
        self.tid = t % self.ntid
        self.blk = t // self.ntid
        self.lane = self.tid % 32
        self.warp = t // 32 if self.ntid % 32 == 0 else self.blk * ((self.ntid + 31) // 32) + self.tid // 32
        # --- clusters: a CTA's rank and the batch index of each rank of its cluster ----------------
        self.cluster = cluster
        self.csize = cluster[0] * cluster[1] * cluster[2]
        cid = [(b[0] // cluster[0], b[1] // cluster[1], b[2] // cluster[2]) for b in blocks]
        cx, cy, cz = cluster
        self.crank = np.array([b[0] % cx + cx * (b[1] % cy + cy * (b[2] % cz))
                               for b in blocks], dtype=np.int64)
        where = {(c, int(r)): i for i, (c, r) in enumerate(zip(cid, self.crank))}
        self.cta_of_rank = np.array([[where.get((c, r), -1) for r in range(self.csize)] for c in cid],
                                    dtype=np.int64).reshape(self.nb, self.csize)
        self.cluster_id = cid
        self.regs: dict[str, np.ndarray] = {}
        #: registers an asynchronous load (``tcgen05.ld``) writes, per thread, until its wait
        #: (``tcgen05.wait::ld``): reading one before is an error (``pend_regs``)
        self.reg_pending: dict[str, np.ndarray] = {}
        self.reg_pending_ins: dict[str, Instruction] = {}
        self.rtypes = entry.regs
        self.pc = np.zeros(self.T, dtype=np.int64)
        self.state = np.zeros(self.T, dtype=np.int8)
        self.ins: Instruction | None = None
        self.steps = 0
        # --- symbols: shared / local variables and parameters -----------------------------------
        self.symbols: dict[str, tuple[str, int]] = {}
        top = 0
        statics = []
        for v in [*module.variables, *entry.variables]:
            if v.space == "shared" and v.extern:
                self.symbols[v.name] = ("shared", 0)
                top = max(top, dynamic_smem)
            elif v.space == "shared":
                statics.append(v)
        for v in statics:
            top = -(-top // v.align) * v.align
            self.symbols[v.name] = ("shared", top)
            top += v.nbytes
        self.smem_size = max(top, dynamic_smem)
        self.smem = np.full(max(self.nb * self.smem_size, 1), POISON, dtype=np.uint8)
        ltop = 0
        for v in entry.variables:
            if v.space == "local":
                ltop = -(-ltop // v.align) * v.align
                self.symbols[v.name] = ("local", ltop)
                ltop += v.nbytes
        self.local_size = ltop
        self.local = np.full(max(self.T * ltop, 1), POISON, dtype=np.uint8)
        if len(params) != len(entry.params):
            raise PtxError(
                f"the kernel takes {len(entry.params)} parameters, {len(params)} were given",
                kernel=self.kernel,
            )
        pbytes, off = bytearray(), 0
        for p, val in zip(entry.params, params):
            off = -(-off // p.align) * p.align
            pbytes.extend(b"\0" * (off - len(pbytes)))
            self.symbols[p.name] = ("param", off)
            pbytes.extend(_param_bytes(p.type, p.nbytes, val))
            off += p.nbytes
        self.params = np.frombuffer(bytes(pbytes) + b"\0" * 16, dtype=np.uint8)
        self.regions = sorted(regions, key=lambda r: r.base)
        self.races: SharedRaces | None = SharedRaces(self) if check_races else None
        #: per shared byte: TMA copies issued but not landed that write it (reading it is an error)
        self.tma_pending = np.zeros(self.smem.size, dtype=np.int16)
        self.tma_pending_count = 0
        self._bases = np.array([r.base for r in self.regions], dtype=np.uint64)

    # --- errors ---------------------------------------------------------------------------------
    def site(self, ins: Instruction | None = None) -> PtxSite | None:
        ins = ins or self.ins
        if ins is None:
            return None
        cl = ins.loc[1] if ins.loc is not None and ins.loc[0] == _main_file(self.module) else None
        return PtxSite(
            ins.line,
            ins.opcode,
            ins.text,
            cl,
            self.srcmap.cuda_text(cl) if cl else "",
            self.srcmap.source(cl) if cl else "",
        )

    def where(self, t: int) -> dict[str, Any]:
        return {
            "kernel": self.kernel,
            "block": self.blocks[int(self.blk[t])],
            "thread": int(self.tid[t]),
            "site": self.site(),
        }

    def unsupported(self, what: str = "") -> PtxError:
        ins = self.ins
        op = ins.opcode if ins is not None else "?"
        return UnsupportedInstructionError(
            f"the PTX executor does not implement {what or op!r}", kernel=self.kernel, site=self.site()
        )

    # --- registers ------------------------------------------------------------------------------
    def reg(self, name: str) -> np.ndarray:
        r = self.regs.get(name)
        if r is None:
            t = self.rtypes.get(name)
            if t is None:
                raise PtxError(f"register {name} is not declared", kernel=self.kernel, site=self.site())
            if t == "pred":
                r = np.zeros(self.T, dtype=np.bool_)
            else:
                r = np.full(self.T, np.iinfo(UINT[BITS[t]]).max, dtype=UINT[BITS[t]])
            self.regs[name] = r
        return r

    def width(self, name: str) -> int:
        return BITS[self.rtypes[name]]

    def read(self, op: Any, t: str, idx: Any) -> Any:
        """Operand ``op`` as PTX type ``t`` for threads ``idx`` (an array, or a scalar for
        immediates)."""
        if isinstance(op, Reg):
            if op.name.startswith("%") and "." in op.name[1:] or op.name in _SPECIAL_PLAIN:
                v = self.special(op.name, idx)
                return v.astype(NP[t]) if t != "pred" else v.astype(bool)
            r = self.reg(op.name)
            if self.reg_pending and op.name in self.reg_pending:
                self._check_pending(op.name, idx)
            if r.dtype == np.bool_:
                v = r[idx]
                return ~v if op.neg else v
            return from_bits(r[idx], r.dtype.itemsize * 8, t)
        if isinstance(op, Imm):
            if t == "pred":
                return np.bool_(bool(op.value))
            if op.bits is not None and BITS.get(t) == op.width and t[0] not in "f":
                return np.array(op.bits, dtype=UINT[op.width]).view(NP[t])[()]
            if isinstance(op.value, float) or t[0] == "f" or t == "bf16":
                return NP[t](op.value)
            bits = BITS[t]
            return np.array(op.value % (1 << bits), dtype=UINT[bits]).view(NP[t])[()]
        if isinstance(op, Sym):
            space, addr = self.symbols.get(op.name, (None, None))
            if space is None:
                raise PtxError(f"unknown symbol {op.name}", kernel=self.kernel, site=self.site())
            return np.array(addr, dtype=np.uint64).astype(NP[t])[()]
        if isinstance(op, Vec):
            raise self.unsupported("a vector operand here")
        raise PtxError(f"cannot read operand {op!r}", kernel=self.kernel, site=self.site())

    def pend_regs(self, names: list[str], threads: np.ndarray, ins: Instruction) -> None:
        """Registers ``names`` of ``threads`` are written by the asynchronous ``ins`` until
        ``clear_pending(threads)``."""
        for n in names:
            p = self.reg_pending.get(n)
            if p is None:
                p = self.reg_pending[n] = np.zeros(self.T, dtype=bool)
            p[threads] = True
            self.reg_pending_ins[n] = ins

    def clear_pending(self, threads: np.ndarray) -> None:
        """The asynchronous loads of ``threads`` completed (their wait)."""
        for n in list(self.reg_pending):
            p = self.reg_pending[n]
            p[threads] = False
            if not p.any():
                del self.reg_pending[n]
                self.reg_pending_ins.pop(n, None)

    def _check_pending(self, name: str, idx: Any) -> None:
        hit = self.reg_pending[name][idx]
        if np.any(hit):
            t = int(np.arange(self.T)[idx][np.flatnonzero(np.atleast_1d(hit))[0]])
            ld = self.reg_pending_ins.get(name)
            what = f"the {ld.opcode} at PTX line {ld.line}" if ld is not None else "an asynchronous load"
            raise PtxRaceError(f"reads register {name}, which {what} still writes (tcgen05.wait::ld first)",
                               **self.where(t))

    def write(self, op: Any, t: str, idx: Any, val: Any) -> None:
        """Write ``val`` (PTX type ``t``) to register operand ``op`` for threads ``idx``."""
        if op is None:
            return
        if not isinstance(op, Reg):
            raise PtxError(f"cannot write operand {op!r}", kernel=self.kernel, site=self.site())
        r = self.reg(op.name)
        n = len(self.tid) if isinstance(idx, slice) else len(idx)
        v = np.broadcast_to(np.asarray(val, dtype=NP[t] if t != "pred" else np.bool_), (n,))
        if r.dtype == np.bool_:
            r[idx] = v
            return
        r[idx] = to_bits(v, t, r.dtype.itemsize * 8)

    def uniform(self, op: Any, idx: Any, what: str) -> int:
        """An operand that must be the same in every executing thread (e.g. a barrier id)."""
        v = np.asarray(self.read(op, "s64", idx))
        if v.ndim and v.size and (v != v.flat[0]).any():
            raise PtxError(f"{what} differs between threads", kernel=self.kernel, site=self.site())
        return int(v.flat[0]) if v.size else 0

    # --- special registers ---------------------------------------------------------------------
    def special(self, name: str, idx: Any) -> np.ndarray:
        base, _, comp = name[1:].partition(".")
        k = "xyz".index(comp) if comp in ("x", "y", "z") else 0
        if base == "tid":
            nx, ny = self.ntid_xyz[0], self.ntid_xyz[1]
            t = self.tid[idx]
            return (t % nx, t // nx % ny, t // (nx * ny))[k]
        if base == "ntid":
            return np.full(len(self.tid[idx]), self.ntid_xyz[k])
        if base == "ctaid":
            return np.array([b[k] for b in self.blocks], dtype=np.int64)[self.blk[idx]]
        if base == "nctaid":
            return np.full(len(self.tid[idx]), self.grid[k])
        if base == "laneid":
            return self.lane[idx]
        if base == "warpid":
            return self.tid[idx] // 32
        if base == "nwarpid":
            return np.full(len(self.tid[idx]), (self.ntid + 31) // 32)
        if base in ("clock", "clock64", "globaltimer"):
            return np.full(len(self.tid[idx]), self.steps)
        if base in ("dynamic_smem_size", "total_smem_size"):
            return np.full(len(self.tid[idx]), self.smem_size)
        if base == "cluster_ctarank":
            return self.crank[self.blk[idx]]
        if base == "cluster_nctarank":
            return np.full(len(self.tid[idx]), self.csize)
        if base == "cluster_ctaid":
            return np.array([b[k] % self.cluster[k] for b in self.blocks], dtype=np.int64)[self.blk[idx]]
        if base == "cluster_nctaid":
            return np.full(len(self.tid[idx]), self.cluster[k])
        if base == "clusterid":
            return np.array([c[k] for c in self.cluster_id], dtype=np.int64)[self.blk[idx]]
        if base == "nclusterid":
            return np.full(len(self.tid[idx]), -(-self.grid[k] // self.cluster[k]))
        if base == "is_explicit_cluster":
            return np.full(len(self.tid[idx]), int(self.csize > 1))
        raise self.unsupported(f"special register {name}")

    # --- memory ---------------------------------------------------------------------------------
    def address(self, op: Any, idx: Any) -> np.ndarray:
        """The byte addresses of an address operand ``[base+offset]`` for threads ``idx`` (uint64)."""
        if not isinstance(op, Addr):
            raise PtxError(f"expected an address operand, got {op!r}", kernel=self.kernel, site=self.site())
        n = len(self.tid[idx])
        if op.base is None:
            a = np.full(n, op.offset, dtype=np.uint64)
        elif isinstance(op.base, Sym):
            space, addr = self.symbols[op.base.name]
            a = np.full(n, addr + op.offset, dtype=np.uint64)
        else:
            w = self.width(op.base.name)
            a = self.read(op.base, "u64" if w == 64 else "u32", idx).astype(np.uint64)
            a = a + np.uint64(op.offset % (1 << 64))
        return a

    def space_of(self, op: Any) -> str:
        if isinstance(op, Addr) and isinstance(op.base, Sym):
            return self.symbols[op.base.name][0]
        return ""

    def _check_align(self, addr: np.ndarray, nbytes: int, idx: Any, space: str) -> None:
        bad = (addr % np.uint64(nbytes)) != 0
        if bad.any():
            i = int(np.argmax(bad))
            t = int(np.arange(self.T)[idx][i])
            raise PtxMisalignedAccessError(
                f"{nbytes}-byte {space} access at address {int(addr[i]):#x}, which is "
                f"not a multiple of {nbytes}",
                address=int(addr[i]),
                **self.where(t),
            )

    def _window(self, space: str, threads: np.ndarray) -> tuple[np.ndarray, int, Any, str, str]:
        """``(byte array, bytes addressable, flat offset of each thread's window, what an address
        in it is called, its size in words)`` of the shared, local or param window."""
        if space == "shared":
            return (self.smem, self.smem_size, self.blk[threads] * self.smem_size, "shared address",
                    f"the block has {self.smem_size} bytes of shared memory")
        if space == "local":
            return (self.local, self.local_size, threads * self.local_size, "local address",
                    f"each thread has {self.local_size} bytes of local memory")
        return (self.params, len(self.params), 0, "parameter offset",
                f"the parameters take {len(self.params) - 16} bytes")

    def locate(
        self, space: str, addr: np.ndarray, nbytes: int, idx: Any, what: str
    ) -> tuple[Any, np.ndarray]:
        """``(byte array, flat byte offsets)`` for accesses of ``nbytes`` at ``addr`` in ``space``
        (``""``: generic), checked for bounds and alignment."""
        if space == "":
            for sp, base in WINDOWS.items():
                if len(addr) and (addr >= np.uint64(base)).all() and (addr < np.uint64(base + _WINDOW)).all():
                    return self.locate(sp, addr - np.uint64(base), nbytes, idx, what)
            space = "global"
        self._check_align(addr, nbytes, idx, space)
        threads = np.arange(self.T)[idx]
        if space in WINDOWS:
            array, size, first, called, size_text = self._window(space, threads)
            bad = addr + np.uint64(nbytes) > np.uint64(size)
            if bad.any():
                i = int(np.argmax(bad))
                raise PtxOutOfBoundsError(
                    f"{what} of {nbytes} bytes at {called} {int(addr[i])}: {size_text}",
                    buffer=space,
                    address=int(addr[i]),
                    **self.where(int(threads[i])),
                )
            return array, first + addr.astype(np.int64)
        if space != "global":
            raise self.unsupported(f"the {space} state space")
        k = np.searchsorted(self._bases, addr, side="right").astype(np.int64) - 1
        ok = k >= 0
        kk = np.maximum(k, 0)
        if self.regions:
            ends = np.array([r.base + r.extent for r in self.regions], dtype=np.uint64)
            ok &= addr + np.uint64(nbytes) <= ends[kk]
        else:
            ok &= False
        if not ok.all():
            i = int(np.argmin(ok))
            a = int(addr[i])
            near = min(
                self.regions, key=lambda r: min(abs(a - r.base), abs(a - r.base - r.extent)), default=None
            )
            desc = (
                (
                    f"tensor {near.name!r} spans [{near.base:#x}, {near.base + near.extent:#x}), "
                    f"the access is {a - near.base:+d} bytes from its start"
                )
                if near
                else "no tensor is bound"
            )
            raise PtxOutOfBoundsError(
                f"{what} of {nbytes} bytes at global address {a:#x} is outside every tensor "
                f"argument ({desc})",
                buffer=near.name if near else None,
                address=a,
                **self.where(int(threads[i])),
            )
        if len(self.regions) == 1 or (kk == kk[0]).all():
            r = self.regions[int(kk[0])] if len(kk) else self.regions[0]
            return r.raw, (addr - np.uint64(r.base)).astype(np.int64)
        return _Multi(self.regions, kk), (addr - self._bases[kk]).astype(np.int64)

    def cluster_shared(self, addr: np.ndarray, threads: np.ndarray, nbytes: int, what: str) -> np.ndarray:
        """Flat indices into ``smem`` of the ``shared::cluster`` addresses ``addr`` of ``threads``
        (a ``mapa`` address names a CTA of the cluster, a plain offset the thread's own CTA);
        bounds- and alignment-checked, and the target CTA must not have exited."""
        addr = np.asarray(addr, dtype=np.uint64)
        rank = (addr >> np.uint64(CLUSTER_RANK_SHIFT)).astype(np.int64) - 1
        off = addr & np.uint64((1 << CLUSTER_RANK_SHIFT) - 1)
        own = self.blk[threads]
        blk = own.copy()
        remote = rank >= 0
        if remote.any():
            if (rank[remote] >= self.csize).any():
                i = int(np.argmax(remote & (rank >= self.csize)))
                raise PtxError(f"{what}: shared::cluster address {int(addr[i]):#x} names CTA rank "
                               f"{int(rank[i])} of "
                               f"a {self.csize}-CTA cluster", **self.where(int(threads[i])))
            blk[remote] = self.cta_of_rank[own[remote], rank[remote]]
            for i in np.nonzero(remote)[0]:
                b = int(blk[i])
                if b < 0 or (self.state[self.blk == b] == EXITED).all():
                    raise PtxError(f"{what}: CTA rank {int(rank[i])} of the cluster has exited (or is not "
                                   "running): its shared memory is gone", **self.where(int(threads[i])))
        self._check_align(off, min(nbytes, 16), threads, "shared::cluster")
        bad = off + np.uint64(nbytes) > np.uint64(self.smem_size)
        if bad.any():
            i = int(np.argmax(bad))
            raise PtxOutOfBoundsError(f"{what} of {nbytes} bytes at shared::cluster offset {int(off[i])}: "
                                      "a block "
                                      f"has {self.smem_size} bytes of shared memory", buffer="shared",
                                      address=int(off[i]), **self.where(int(threads[i])))
        return blk * self.smem_size + off.astype(np.int64)

    def load(self, space: str, addr: np.ndarray, nbytes: int, idx: Any, what: str = "load") -> np.ndarray:
        """``[n, nbytes]`` uint8 read at ``addr``."""
        buf, off = self.locate(space, addr, nbytes, idx, what)
        at = off.reshape(-1, 1) + np.arange(nbytes)
        if isinstance(buf, _Multi):
            return buf.gather(at)
        if buf is self.smem:
            self.check_tma_pending(at, np.arange(self.T)[idx], what)
            if self.races is not None:
                self.races.access(self, at, np.arange(self.T)[idx], write=False)
        return buf[at]

    def check_tma_pending(self, at: np.ndarray, threads: np.ndarray, what: str) -> None:
        """Reading or writing shared bytes that an issued TMA copy has not written yet is an error
        (the access does not wait on the copy's mbarrier)."""
        if not self.tma_pending_count:
            return
        bad = self.tma_pending[at] > 0
        if bad.any():
            i, j = np.argwhere(bad)[0]
            t = int(np.broadcast_to(threads.reshape(-1, 1), at.shape)[i, j])
            byte = int(at[i, j]) - int(self.blk[t]) * self.smem_size
            raise PtxRaceError(f"{what} touches shared byte {byte}, which a TMA copy in flight will write: "
                               "the access does not wait on that copy's mbarrier phase", address=byte,
                               buffer="shared", **self.where(t))

    def store(self, space: str, addr: np.ndarray, data: np.ndarray, idx: Any, what: str = "store") -> None:
        buf, off = self.locate(space, addr, data.shape[1], idx, what)
        at = off.reshape(-1, 1) + np.arange(data.shape[1])
        if isinstance(buf, _Multi):
            buf.scatter(at, data)
            return
        if buf is self.smem:
            self.check_tma_pending(at, np.arange(self.T)[idx], what)
            self.check_mma_reads(at, np.arange(self.T)[idx], what)
            if self.races is not None:
                self.races.access(self, at, np.arange(self.T)[idx], write=True)
        buf[at] = data

    def check_mma_reads(self, at: np.ndarray, threads: np.ndarray, what: str) -> None:
        """Writing shared bytes (flat ``at``) an in-flight ``tcgen05.mma`` / ``cp`` reads is an error."""
        state = getattr(self, "tcgen05", None)     # set by ``tcgen05``, with its checker
        if state is not None:
            state["check_reads"](self, at, threads, what)


class SharedRaces:
    """Happens-before race detection on shared memory, per byte: the last writer and reader
    (thread, PTX line) and the barrier epoch of their access. A block's epoch advances when
    one of its barriers opens. An access races with an earlier one to the same byte by a
    thread of another warp in the same epoch when at least one of them writes. Accesses by
    threads of one warp are not compared (warp-synchronous code), nor are atomics."""

    def __init__(self, m: Machine) -> None:
        n = m.smem.size
        self.epoch = np.zeros(m.nb, dtype=np.int64)
        self.w_thr = np.full(n, -1, dtype=np.int64)
        self.w_ep = np.full(n, -1, dtype=np.int64)
        self.w_line = np.zeros(n, dtype=np.int64)
        self.r_thr = np.full(n, -1, dtype=np.int64)
        self.r_ep = np.full(n, -1, dtype=np.int64)
        self.r_line = np.zeros(n, dtype=np.int64)

    def access(self, m: Machine, at: np.ndarray, threads: np.ndarray, write: bool) -> None:
        """Check and record the accesses ``at`` ([n, nbytes] flat shared byte indices) of ``threads``."""
        thr = np.broadcast_to(threads.reshape(-1, 1), at.shape)
        ep = self.epoch[m.blk[thr]]
        warp = m.warp[thr]
        checks = [(self.w_thr, self.w_ep, self.w_line, "written")]
        if write:
            checks.append((self.r_thr, self.r_ep, self.r_line, "read"))
        for other, oep, oline, did in checks:
            o = other[at]
            bad = (o >= 0) & (oep[at] == ep) & (m.warp[np.maximum(o, 0)] != warp)
            if bad.any():
                i, j = np.argwhere(bad)[0]
                t, u = int(thr[i, j]), int(o[i, j])
                byte = int(at[i, j]) - int(m.blk[t]) * m.smem_size
                verb = "writes" if write else "reads"
                raise PtxRaceError(f"thread {int(m.tid[t])} {verb} shared byte {byte}, "
                                   f"which thread {int(m.tid[u])} (another warp) {did} at PTX line "
                                   f"{int(oline[at[i, j]])} with no barrier between", address=byte,
                                   other_thread=int(m.tid[u]), buffer="shared", **m.where(t))
        line = m.ins.line if m.ins is not None else 0
        if write:
            self.w_thr[at], self.w_ep[at], self.w_line[at] = thr, ep, line
        else:
            self.r_thr[at], self.r_ep[at], self.r_line[at] = thr, ep, line


class _Multi:
    """Accesses spread over several tensors (one region index per thread)."""

    def __init__(self, regions: list[GlobalRegion], k: np.ndarray) -> None:
        self.regions, self.k = regions, k

    def gather(self, at: np.ndarray) -> np.ndarray:
        out = np.empty(at.shape, dtype=np.uint8)
        for r in np.unique(self.k):
            sel = self.k == r
            out[sel] = self.regions[int(r)].raw[at[sel]]
        return out

    def scatter(self, at: np.ndarray, data: np.ndarray) -> None:
        for r in np.unique(self.k):
            sel = self.k == r
            self.regions[int(r)].raw[at[sel]] = data[sel]


_SPECIAL_PLAIN = {
    "%laneid",
    "%warpid",
    "%nwarpid",
    "%clock",
    "%clock64",
    "%globaltimer",
    "%dynamic_smem_size",
    "%total_smem_size",
    "%cluster_ctarank",
    "%cluster_nctarank",
    "%is_explicit_cluster",
}


def _main_file(module: Module) -> int:
    for k, name in module.files.items():
        if name.endswith(".cu"):
            return k
    return 1


def _param_bytes(t: str, nbytes: int, val: Any) -> bytes:
    """A parameter's bytes: ints and floats packed as the parameter's type; raw bytes
    (``bytes`` / a uint8 array, e.g. an encoded tensor map) as they are."""
    if isinstance(val, (bytes, bytearray)):
        b = bytes(val)
    elif isinstance(val, np.ndarray) and val.dtype == np.uint8:
        b = val.tobytes()
    elif t in NP and t != "pred" and t[0] in "fb" and t[0] == "f":
        b = np.array(val, dtype=NP[t]).tobytes()
    elif isinstance(val, float):
        b = np.array(val, dtype=np.float32 if nbytes == 4 else np.float64).tobytes()
    else:
        b = int(val).to_bytes(8, "little", signed=int(val) < 0)[:nbytes]
    return (b + b"\0" * nbytes)[:nbytes]
