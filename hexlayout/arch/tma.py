"""TMA bulk tensor copies (sm_90+): the ``SM90_TMA_LOAD`` / ``SM90_TMA_STORE`` atoms and
``check_tma``, the legality rules of a tensor map (``cuTensorMapEncodeTiled``) and its box.

A TMA copy is issued by one thread and moves a whole box of a rank-1..5 tensor between
global and shared memory; CuTe's traits are ``Src = Dst = (1, bits) : (0, 1)`` with ``bits``
the box size in bits (option ``bits`` here). The rules ``check_tma`` enforces (dimension 0 is
the contiguous one, extents and strides in elements):

* rank in [1, 5]; every global extent in [1, 2^32]; dimension 0 has stride 1;
* global address 16-byte aligned; global strides of dimensions >= 1 multiples of 16 bytes
  and below 2^40 bytes;
* box extents in [1, 256]; the inner box row ``box[0] * elem_bytes`` a multiple of 16 bytes;
* element strides (traversal strides) in [1, 8];
* swizzle none / 32 / 64 / 128 bytes (byte swizzles ``Swizzle<B,4,3>``, B = 1, 2, 3);
  with a swizzle the inner box row must not exceed the swizzle span;
* shared-memory address aligned to 128 bytes, or to the swizzle period
  (256 / 512 / 1024 bytes for 32 / 64 / 128-byte swizzle).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from ..layout import Layout
from .copy_atom import CopyAtom

__all__ = ["TMA_ATOMS", "check_tma", "tma_atom", "TMA_SWIZZLE_BYTES", "tma_swizzle_period"]

#: Legal swizzle modes in bytes (0 = none).
TMA_SWIZZLE_BYTES: tuple[int, ...] = (0, 32, 64, 128)


def tma_swizzle_period(swizzle: int) -> int:
    """Bytes after which the swizzle pattern repeats (``2^(B+4+3)``); 128 for none."""
    return {0: 128, 32: 256, 64: 512, 128: 1024}[swizzle]


def tma_atom(store: bool, rank: int = 2, bits: int = 128) -> CopyAtom:
    """``SM90_TMA_LOAD`` (global -> shared) or ``SM90_TMA_STORE`` (shared -> global)."""
    if not 1 <= rank <= 5:
        raise ValueError(f"TMA: rank {rank} is not in [1, 5]")
    if bits <= 0 or bits % 128:
        raise ValueError(f"TMA: a box of {bits} bits is not a positive multiple of 128 bits (16 bytes)")
    coords = "{" + ", ".join(f"c{i}" for i in range(rank)) + "}"
    if store:
        name, src, dst = "SM90_TMA_STORE", "smem", "gmem"
        ptx = f"cp.async.bulk.tensor.{rank}d.global.shared::cta.bulk_group"
        operands = f"[tensor_map, {coords}], [smem]"
    else:
        name, src, dst = "SM90_TMA_LOAD", "gmem", "smem"
        ptx = f"cp.async.bulk.tensor.{rank}d.shared::cluster.global.mbarrier::complete_tx::bytes"
        operands = f"[smem], [tensor_map, {coords}], [mbar]"
    lay = Layout((1, bits), (0, 1))
    cons = ("tensor map legal per check_tma", "shared-memory box aligned to 128 B or the swizzle period",
            "one thread issues it" + ("" if store else "; completion through an mbarrier transaction count"))
    return CopyAtom(
        name=name, kind="tma", thr_id=Layout(1), src_layout=lay, dst_layout=lay, ref_layout=lay,
        access_bits=bits, src_space=src, dst_space=dst, arch="sm_90", ptx=ptx, ptx_operands=operands,
        alignment=128, constraints=cons, options=(("rank", str(rank)), ("bits", str(bits))),
    )


def check_tma(
    elem_bits: int,
    global_shape: Sequence[int],
    global_strides: Sequence[int],
    box_shape: Sequence[int],
    *,
    swizzle: int = 0,
    global_address: int = 0,
    smem_address: int = 0,
    element_strides: Sequence[int] | None = None,
) -> list[str]:
    """Problems that make a TMA tensor map / box illegal, as messages (empty when legal).

    ``global_shape``, ``global_strides`` (elements) and ``box_shape`` list dimensions
    innermost first; ``swizzle`` is in bytes (0, 32, 64, 128); addresses are in bytes.
    """
    out: list[str] = []
    rank = len(global_shape)
    if elem_bits not in (8, 16, 32, 64):
        out.append(f"element width {elem_bits} bits is not one of 8, 16, 32, 64")
        return out
    eb = elem_bits // 8
    if not 1 <= rank <= 5:
        out.append(f"rank {rank} is not in [1, 5]")
    if len(global_strides) != rank or len(box_shape) != rank:
        out.append(f"global shape (rank {rank}), strides (rank {len(global_strides)}) and box "
                   f"(rank {len(box_shape)}) differ in rank")
        return out
    if element_strides is not None and len(element_strides) != rank:
        out.append(f"element strides have rank {len(element_strides)}, the tensor {rank}")
        element_strides = None
    for i, e in enumerate(global_shape):
        if not 1 <= e <= 1 << 32:
            out.append(f"global extent of dimension {i} is {e}, not in [1, 2^32]")
    if global_address % 16:
        out.append(f"global address {global_address:#x} is not 16-byte aligned")
    if rank and global_strides[0] != 1:
        out.append(f"dimension 0 must be contiguous (stride 1), its stride is {global_strides[0]}")
    for i in range(1, rank):
        sb = global_strides[i] * eb
        if sb % 16:
            out.append(f"global stride of dimension {i} is {sb} bytes, not a multiple of 16 bytes")
        if not 0 < sb < 1 << 40:
            out.append(f"global stride of dimension {i} is {sb} bytes, not in (0, 2^40)")
    for i, b in enumerate(box_shape):
        if not 1 <= b <= 256:
            out.append(f"box extent of dimension {i} is {b}, not in [1, 256]")
    inner = box_shape[0] * eb if rank else 0
    if rank and inner % 16:
        out.append(f"inner box row is {inner} bytes ({box_shape[0]} x {eb} B), not a multiple of 16 bytes")
    if element_strides is not None:
        for i, s in enumerate(element_strides):
            if not 1 <= s <= 8:
                out.append(f"element stride of dimension {i} is {s}, not in [1, 8]")
    if swizzle not in TMA_SWIZZLE_BYTES:
        out.append(f"swizzle {swizzle} B is not one of none (0), 32, 64, 128 bytes")
        return out
    if swizzle and inner > swizzle:
        out.append(f"inner box row is {inner} bytes, more than the {swizzle}-byte swizzle span")
    period = tma_swizzle_period(swizzle)
    if smem_address % period:
        why = f"the {swizzle}-byte swizzle period" if swizzle else "128 bytes"
        out.append(f"shared-memory address {smem_address:#x} is not aligned to {period} bytes ({why})")
    return out


def _factory(store: bool) -> Callable[..., CopyAtom]:
    def make(rank: int = 2, bits: int = 128) -> CopyAtom:
        return tma_atom(store, rank, bits)

    return make


#: name -> factory (options ``rank``, ``bits``) of the TMA atoms.
TMA_ATOMS: dict[str, Callable[..., CopyAtom]] = {
    "SM90_TMA_LOAD": _factory(False),
    "SM90_TMA_STORE": _factory(True),
}
