"""Offline layouts: the global layout synthesis chooses for a tensor declared ``hl.offline``.

A kernel declares an input whose layout the op chooses once, ahead of time (a quantized
weight, re-laid out at load time): ``q: hl.offline(hl.u4[R, K])``. The kernel indexes it in
*logical* coordinates ``(r, k)`` and copies ``(TR, TK)`` tiles at tile-aligned origins into
register tiles. Once synthesis has chosen the destination tile's thread-value layout
``L: (t, v) -> i`` (``i = r' + TR * k'`` the colexicographic in-tile index; ``T`` threads,
``V`` values each, ``T * V = TR * TK``, ``L`` a bijection), the in-tile storage order is the
inverse of ``L``, thread-major::

    phys(r, k) = (r // TR * (K / TK) + k // TK) * TR * TK + t * V + v,   (t, v) = L^-1(r % TR, k % TK)

so thread ``t``'s ``V`` values are contiguous in value order: its whole fragment is one run of
``V * bits / 8`` bytes, loaded as 16-byte vectors (fewer bytes: one vector). Tiles are stored
tile-major (row tiles outer, k tiles inner: a block walking K reads consecutive tiles). The
physical tensor keeps the logical one's byte shape ``[R, K * bits / 8]`` (row-major), so the
launch binds the same sizes; only the order of the bytes inside each ``TR x TK`` tile block
differs.

Storage units: ``u8`` / ``s8`` / 16-bit elements are one unit each; ``u4`` / ``s4`` are stored
two per byte along K (even k in the low nibble), and ``L`` is the layout of the *byte* tile
``(TR, TK / 2)`` the kernel loads (``hexlayout.lang.packed_global``): each byte keeps its two
logical neighbours ``k = 2 j, 2 j + 1``.

In-word nibble order (4-bit elements): inside each 32-bit word of a thread's run the eight
nibbles may be stored in another order, also the layout's choice. The thread's unpacked values
``i`` (nibble ``i`` of its logical run: ``2 v`` the low and ``2 v + 1`` the high nibble of byte
``v``) are stored at nibble ``8 (i // 8) + nibbles[i % 8]`` of the run. ``in_word_order``
chooses it: for whole words, ``nibbles[i] = i // 2 + 4 (i % 2)`` (the word holds values ``0, 2,
4, 6, 1, 3, 5, 7``, as Marlin's), so each aligned pair ``(2 m, 2 m + 1)`` of unpacked values
sits at the same nibble of bytes ``m // 2`` and ``m // 2 + 2``, the low and high 16-bit halves
of the word: a conversion of the pair to a 16-bit float pair masks both at once
(``(w >> 8 (m // 2)) & 0x000f000f``, one ``LOP3`` with the magic exponent) instead of first
placing one byte's two nibbles in the two halves (a byte permute per pair). The load
(``hexlayout.ir.lower.offline``) gives the register tile its logical bytes back with
``nibble_pair`` functions, which the code generator sees through (``byte_sources``).

Replicated register layouts: a register tile whose threads hold the same values (a ``(BN, 1)``
column of scales broadcast across the K threads of an mma fragment: ``L``'s thread modes of
stride 0) has the storage order of its *owners*: ``L`` with the stride-0 thread modes removed,
``L'``: ``(t', v) -> i`` over ``T' = T / replicas`` owners (``t'`` colexicographic over the kept
thread modes); every thread reads its owner's run (``hexlayout.ir.lower.offline.owners``). So the
values one thread needs (columns ``n`` and ``n + 8`` of a fragment) are one run, one load.

``OfflineLayout`` is what synthesis reports (``LoweredProgram.offline``, ``Build.offline_layouts``):
the tile, the element bits, the in-tile CuTe layout (logical byte index -> physical position),
the in-word nibble order, a stable ``key``, ``permutation(shape)`` (logical flat element index
-> physical flat element index) and ``apply(values)`` that packs the logical integer values
``[R, K]`` into the physical ``uint8`` tensor.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from hexlayout.layout import Layout, composition, left_inverse

__all__ = ["OfflineLayout", "in_word_order", "INTERLEAVED"]

#: the nibble-interleaved in-word order: unpacked value ``i`` at nibble ``i // 2 + 4 (i % 2)``
INTERLEAVED = (0, 4, 1, 5, 2, 6, 3, 7)


def in_word_order(bits: int, values: int) -> tuple[int, ...]:
    """The in-word nibble order of a thread's run of ``values`` storage units of ``bits``-bit
    elements (see the module docstring): ``INTERLEAVED`` for 4-bit elements in whole 32-bit
    words (``values`` a multiple of 4 bytes), else ``()`` (the logical order)."""
    return INTERLEAVED if bits == 4 and values % 4 == 0 else ()


@dataclass(frozen=True)
class OfflineLayout:
    """The synthesized storage order of an ``hl.offline`` tensor (see the module docstring).

    ``tile`` ``(TR, TK)`` in elements; ``bits`` the element width (4: two per byte); ``tv``
    the destination register tile's TV layout over the storage-unit tile ``(TR, TK * bits / 8)``
    (units: bytes for 4-bit elements, elements otherwise), ``threads`` its ``T``; ``vector_bytes``
    the bytes of one load instruction; ``nibbles`` the in-word nibble order of 4-bit elements
    (``()``: the logical order; ``in_word_order``)."""

    param: str
    tile: tuple[int, int]
    bits: int
    tv: Layout
    threads: int
    vector_bytes: int
    _positions: tuple[int, ...] = field(default=(), repr=False, compare=False)
    nibbles: tuple[int, ...] = ()
    replicas: int = 1

    @staticmethod
    def of(param: str, tile: tuple[int, int], bits: int, tv: Layout, threads: int,
           vector_bytes: int, nibbles: tuple[int, ...] = (), replicas: int = 1) -> OfflineLayout:
        """The layout of register TV layout ``tv`` (``threads`` threads, the owners) over the
        unit tile of ``tile``, with the in-word nibble order ``nibbles`` (4-bit elements);
        ``replicas`` threads of the kernel read each owner's run (a replicated register layout,
        ``tv`` its compact form: see the module docstring)."""
        table = tv.indices().reshape(-1, threads).T          # [t, v] -> unit index (colex)
        pos = np.empty(table.size, dtype=np.int64)
        pos[table.reshape(-1)] = np.arange(table.size)       # unit index -> t * V + v
        if nibbles and (bits != 4 or sorted(nibbles) != list(range(8)) or table.shape[1] % 4):
            raise ValueError(f"offline tensor {param}: in-word nibble order {nibbles} needs 4-bit elements, "
                             f"a permutation of the 8 nibbles of a word and whole words per thread")
        return OfflineLayout(param, tile, bits, tv, threads, vector_bytes, tuple(int(p) for p in pos),
                             tuple(nibbles), replicas)

    @property
    def per_unit(self) -> int:
        """Elements per storage unit: 2 for 4-bit elements, else 1."""
        return 2 if self.bits == 4 else 1

    @property
    def unit_tile(self) -> tuple[int, int]:
        """The tile in storage units ``(TR, TK / per_unit)``."""
        return self.tile[0], self.tile[1] // self.per_unit

    @property
    def values(self) -> int:
        """``V``: the storage units each thread holds (one contiguous run)."""
        return self.unit_tile[0] * self.unit_tile[1] // self.threads

    @property
    def thread_bytes(self) -> int:
        """Bytes of one thread's fragment per tile (``V`` units)."""
        return self.values * (1 if self.bits <= 8 else self.bits // 8)

    @property
    def in_tile(self) -> Layout:
        """The in-tile order as a CuTe layout: colexicographic unit index ``r' + TR * k'`` ->
        physical position ``t * V + v`` (``(T, V):(V, 1) o L^-1``)."""
        tv_inv = left_inverse(self.tv)
        return composition(Layout((self.threads, self.values), (self.values, 1)), tv_inv)

    @property
    def key(self) -> str:
        """A stable fingerprint: element bits, tile, threads, vector, and a hash of the in-tile order."""
        h = hashlib.sha1(np.asarray(self._positions, dtype=np.int64).tobytes()).hexdigest()[:10]
        order = f"/n{''.join(str(n) for n in self.nibbles)}" if self.nibbles else ""
        return f"u{self.bits}/{self.tile[0]}x{self.tile[1]}/t{self.threads}x{self.thread_bytes}B/{h}{order}"

    def owner(self) -> np.ndarray:
        """``[TR, TK]`` (elements): the thread that loads each element of a tile."""
        tr, tu = self.unit_tile
        pos = np.asarray(self._positions).reshape(tu, tr).T  # [r', k'] (colex index r' + TR k')
        return np.repeat(pos // self.values, self.per_unit, axis=1)

    def permutation(self, shape: tuple[int, int]) -> np.ndarray:
        """For logical ``[R, K]`` elements (``R``, ``K`` multiples of the tile): the physical
        flat element index of every logical flat (row-major) element index."""
        rows, cols = shape
        tr, tk = self.tile
        if rows % tr or cols % tk:
            raise ValueError(f"offline tensor {self.param}: shape {list(shape)} is not a multiple of the "
                             f"tile {tr}x{tk} (pad it first)")
        pu = self.per_unit
        r = np.arange(rows, dtype=np.int64)[:, None]
        k = np.arange(cols, dtype=np.int64)[None, :]
        tru, tku = self.unit_tile
        ku = k // pu
        pos = np.asarray(self._positions, dtype=np.int64)[(r % tr) + tr * (ku % tku)]
        tile_index = (r // tr) * (cols // tk) + ku // tku
        unit = tile_index * (tru * tku) + pos
        nib = unit * pu + k % pu
        if self.nibbles:  # (4-bit: a word is 8 nibbles, its start a multiple of 8 in every run)
            nib = nib - nib % 8 + np.asarray(self.nibbles, dtype=np.int64)[nib % 8]
        return nib.reshape(-1)

    def apply(self, values: Any) -> Any:
        """The physical tensor of the logical values ``values`` ``[R, K]`` (a torch tensor):
        element ``(r, k)`` moves to ``permutation`` ``[r * K + k]``. 4-bit and 8-bit elements
        are integers in ``[0, 2^bits)``, stored as ``uint8`` ``[R, K * bits / 8]`` (4-bit pairs
        packed, even index low); wider elements keep their dtype and shape ``[R, K]`` (16-bit
        scales)."""
        import torch

        rows, cols = values.shape
        perm = torch.from_numpy(self.permutation((rows, cols))).to(values.device)
        if self.bits > 8:
            if values.element_size() * 8 != self.bits:
                raise ValueError(f"offline tensor {self.param}: {self.bits}-bit elements, got {values.dtype}")
            out = torch.empty(rows * cols, dtype=values.dtype, device=values.device)
            out[perm] = values.reshape(-1)
            return out.reshape(rows, cols)
        out = torch.empty(rows * cols, dtype=torch.uint8, device=values.device)
        out[perm] = values.reshape(-1).to(torch.uint8)
        if self.bits == 4:
            out = out[0::2] | (out[1::2] << 4)
        return out.reshape(rows, cols * self.bits // 8)

    def describe(self) -> dict[str, Any]:
        """A JSON-able summary (``hexlayout explain``)."""
        return {"param": self.param, "tile": list(self.tile), "bits": self.bits, "threads": self.threads,
                "values_per_thread": self.values, "thread_bytes": self.thread_bytes,
                "vector_bytes": self.vector_bytes, "tv": str(self.tv), "in_tile": str(self.in_tile),
                "nibbles": list(self.nibbles), "replicas": self.replicas, "key": self.key}
