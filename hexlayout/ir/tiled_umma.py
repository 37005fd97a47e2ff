"""A tiled ``tcgen05.mma`` (sm_100a): one single-thread MMA atom repeated along N, its
accumulator in tensor memory, and the ``tcgen05.ld`` that brings it to registers.

``TiledUmma(atom, n_atoms, k_tiles, threads, ld_shape, ld_num, loads, register_tv)`` covers an
``M x N x K`` tile with ``M = atom_m`` (64 or 128: one CTA, ``cta_group::1``), ``N = n_atoms *
atom_n`` and ``K = k_tiles * atom_k``. One thread (the elected thread of the ``threads`` that
run the op) issues, for each k-step ``k`` and N block ``j``, ``D[:, j*atom_n:(j+1)*atom_n] (+)=
A[:, k] @ B[j, k]^T`` with D at TMEM column ``j * atom_n`` of the accumulator's allocation
(``arch.tmem.accumulator_layout``: row ``i``, column ``j`` at lane ``i`` (M = 128) and column
``j``).

The accumulator reaches the registers of the ``threads = 128 * G`` threads (G warp groups) by
``tcgen05.ld.{ld_shape}.x{ld_num}``: the columns are dealt to the warp groups in blocks of
``chunk`` (block ``b`` to group ``b % G``; ``chunk = N / G``: one contiguous block each), warp
``w`` of a group reads the lanes of its quarter ``32*(w%4) ..``; ``loads``
lists the (lane within the quarter, column among the group's columns) origin of each of a
warp's loads, in register order (load ``q`` writes registers ``[q*R, (q+1)*R)``, R the registers
of one load). ``register_tv`` is the resulting TV layout ``(thread, value) -> m + M*n`` over
the ``threads`` threads: the layout of the accumulator's register tile (chosen by synthesis,
``hexlayout.synth.tmem_choice``).

A pair of CTAs (``atom.cta_group == 2``, an ``SM100_2x1SM_256xNx16`` atom, ``n_atoms == 1``): the
tile is one CTA's share, ``M = 128`` rows (the pair's 256) by the pair's ``N`` columns; the even
CTA's thread issues for both, each CTA's A holds its 128 rows and its B half of B's ``N`` rows
(``N/2``, the same shared offsets in both CTAs), and each CTA's rows of D are in its own TMEM in the
same layout as one CTA's ``M = 128`` accumulator.

**A from tensor memory** (``a_store`` given, a ``_TS`` atom, 128 threads per CTA; a pair's: each
CTA writes its own 128 rows into its own TMEM at the same columns): ``a`` is a register tile;
before the MMAs the threads write it into the ``a_columns`` TMEM columns of
the op (``arch.tmem.operand_a_layout``; ``a_sets`` = ``R`` sets of them when ``R - 1`` earlier
executions of the op may be in flight at its store: execution ``e`` writes set ``e % R``) with
``a_store`` (``synth.tmem_choice.TmemOperandStore``:
``tcgen05.st.{shape}.x{num}`` at its origins), and the k-step ``k`` MMA reads A at column
``k * 256 / 32`` of them. ``a_tv`` is then the store's element register layout.

**A staged through shared memory** (``a_stage`` given, an ``_SS`` atom, A K-major): ``a`` is a
register tile; before the MMAs the threads store it into a shared buffer the lowering allocates
(one of a ring, ``ir.lower.umma``; a pair's: each CTA its own rows, at the same offsets) in
``a_stage.layout`` (``synth.smem_stage.SmemOperandStage``)
and the MMAs read it through descriptors as any shared A. ``a_tv`` is then ``a_stage.register_tv``.

The same object answers the questions the register-layout solver asks a ``TiledMma``
(``c_tv``, ``tile_mnk``, ``threads``, ``atom``, ``warps``, ``k_inner``, ``a_tv`` with A in TMEM);
``b_tv`` does not exist (B is read from shared memory), nor ``a_tv`` with A in shared memory.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from hexlayout.layout import Layout

from .mapping import TaskMapping, repeat
from .tiled_mma import TiledMma

__all__ = ["TiledUmma"]


@dataclass(frozen=True)
class TiledUmma:
    atom: Any                 # a kind="tcgen05" MmaAtom (hexlayout.arch.sm100)
    n_atoms: int
    k_tiles: int
    threads: int              # the threads that run the op (the epilogue's); 128 * warp groups
    ld_shape: str
    ld_num: int
    loads: tuple[tuple[int, int], ...]
    register_tv: Layout
    chunk: int = 0            # columns of one warp group's contiguous block (0: N / groups)
    k_inner: bool = True
    a_store: Any = None       # A from TMEM: its tcgen05.st (synth.tmem_choice.TmemOperandStore)
    a_stage: Any = None       # A staged through shared memory (synth.smem_stage.SmemOperandStage)
    a_sets: int = 1           # register A: R, the TMEM column sets / shared buffers its A rotates through

    def __post_init__(self) -> None:
        if self.atom.kind != "tcgen05":
            raise ValueError(f"TiledUmma: {self.atom.name} is not a tcgen05.mma atom")
        if self.threads % 128 or self.threads <= 0:
            raise ValueError(f"TiledUmma: {self.threads} threads are not whole warp groups")
        if self.chunk == 0:
            object.__setattr__(self, "chunk", self.columns // self.groups)
        if (self.a_store is not None) != (self.atom.a_source == "tmem"):
            raise ValueError(f"TiledUmma: {self.atom.name} takes A from {self.atom.a_source}; a_store is "
                             f"{'given' if self.a_store is not None else 'missing'}")
        if self.a_stage is not None and (self.atom.a_source == "tmem" or self.atom.a_major != "K"
                                         or self.a_stage.threads != self.threads):
            raise ValueError(f"TiledUmma: a register A staged through shared memory needs a K-major _SS atom "
                             f"and its stores for the {self.threads} threads; {self.atom.name} takes A "
                             f"{self.atom.a_major}-major from {self.atom.a_source}")
        if self.a_store is not None and self.threads != 128:
            raise ValueError(f"TiledUmma: an A operand in TMEM is written by one warp group; {self.threads} "
                             "threads run the op")
        if (self.columns // self.groups) % self.chunk:
            raise ValueError(f"TiledUmma: blocks of {self.chunk} columns do not tile a warp group's "
                             f"{self.columns // self.groups}")

    @property
    def groups(self) -> int:
        """Warp groups that read the accumulator (each its share of the columns)."""
        return self.threads // 128

    @property
    def cta_group(self) -> int:
        """CTAs that run one MMA: 1, or 2 (the pair of a cluster, ``tcgen05.mma.cta_group::2``)."""
        return int(self.atom.cta_group)

    @property
    def atom_threads(self) -> int:
        return 1

    @property
    def warps(self) -> TaskMapping:
        """The atom tiles one issuing thread covers: ``repeat(1, n_atoms)``."""
        return repeat(1, self.n_atoms)

    @property
    def tile_mnk(self) -> tuple[int, int, int]:
        """One CTA's tile: ``M`` its rows (the pair's M / 2 for ``cta_group::2``), the accumulator's
        ``N`` columns, ``K``."""
        m, n, k = self.atom.shape_mnk
        return m // self.cta_group, n * self.n_atoms, k * self.k_tiles

    @property
    def columns(self) -> int:
        """TMEM columns of the accumulator (32-bit: one per output column)."""
        return self.tile_mnk[1]

    @property
    def a_columns(self) -> int:
        """TMEM columns of the A operand (0: A in shared memory)."""
        if self.a_store is None:
            return 0
        return self.tile_mnk[2] * self.atom.a_dtype.bits // 32

    @property
    def regs_per_load(self) -> int:
        from hexlayout.arch.tmem import TMEM_SHAPES

        return TMEM_SHAPES[self.ld_shape].regs * self.ld_num

    def issue(self) -> TiledMma:
        """The single-thread issues as a ``TiledMma`` of one worker (its ``instances()``: the
        (N block, k-step) pairs; its shared-operand descriptors, ``ir.lower.mma``)."""
        return TiledMma(self.atom, self.warps, self.k_tiles)

    def c_tv(self) -> Layout:
        return self.register_tv

    def a_tv(self) -> Layout:
        if self.a_stage is not None:
            return self.a_stage.register_tv
        if self.a_store is None:
            raise ValueError(f"TiledUmma: {self.atom.name} reads A from shared memory; it has no A registers")
        return self.a_store.register_tv

    def b_tv(self) -> Layout:
        raise ValueError(f"TiledUmma: {self.atom.name} reads B from shared memory; it has no B registers")

    def __str__(self) -> str:
        m, n, k = self.tile_mnk
        split = f", columns dealt in blocks of {self.chunk}" if self.chunk * self.groups != n else ""
        pair = (f" per CTA of a pair (cta_group::2: {2 * m}x{n} for the pair, each CTA holding {n // 2} of "
                f"B's {n} rows)" if self.cta_group == 2 else "")
        a = ""
        if self.a_store is not None:
            s = self.a_store
            cols = f"{self.a_columns} columns"
            if self.a_sets > 1:
                cols = (f"{self.a_sets} sets of {cols}, one per execution in flight at its store plus one: "
                        f"{self.a_sets * self.a_columns}")
            a = f", A from TMEM ({cols}) written by tcgen05.st.{s.shape}.x{s.num} ({s.stores} per warp)"
        elif self.a_stage is not None:
            ring = f", a ring of {self.a_sets}" if self.a_sets > 1 else ""
            a = f", register A staged through shared memory ({self.a_stage}{ring})"
        majors = f" (A {self.atom.a_major}-major, B {self.atom.b_major}-major)"
        return (f"{self.atom.name} x{self.n_atoms} (N) x{self.k_tiles} (K) = {m}x{n}x{k}{majors}{pair}, "
                f"accumulator in TMEM ({m} lanes x {n} columns), read by {self.threads} threads with "
                f"tcgen05.ld.{self.ld_shape}.x{self.ld_num} ({len(self.loads)} per warp{split}){a}")
