"""One-thread copy atoms: vectorized ld/st (``UniversalCopy``) and ``cp.async`` (sm_80+).

Each thread moves one ``N``-bit value, ``N`` in {8, 16, 32, 64, 128}; CuTe's traits are
``Src = Dst = (1, N) : (0, 1)`` in bits with a one-thread ``ThrID``. The address of each
access must be ``N/8``-byte aligned (a 128-bit ``ld.global.v4`` needs 16-byte alignment).

* ``UniversalCopy_U{N}`` (CuTe ``UniversalCopy<uintN_t>``): a plain load/store, whose PTX
  depends on the memory spaces (options ``src``/``dst`` in {"gmem", "smem", "rmem"}):
  ``ld.global.v4.b32`` (gmem->rmem), ``st.shared.b64`` (rmem->smem), ...
* ``SM80_CP_ASYNC_CACHEALWAYS_U{32,64,128}`` (``cp.async.ca``, 4/8/16 bytes, cached in L1)
  and ``SM80_CP_ASYNC_CACHEGLOBAL_U128`` (``cp.async.cg``, 16 bytes only, L2 only):
  global to shared without registers; ``_ZFILL`` variants take a source size (0 fills the
  destination with zeros, for predicated-off tiles).
"""

from __future__ import annotations

from collections.abc import Callable

from ..layout import Layout
from .copy_atom import CopyAtom

__all__ = ["COPIES", "universal_copy", "cp_async"]

_ONE = Layout(1)
_SPACES = ("gmem", "smem", "rmem")
_PTX_SPACE = {"gmem": "global", "smem": "shared"}
_VEC = {8: "b8", 16: "b16", 32: "b32", 64: "v2.b32", 128: "v4.b32"}


def _bits_layout(bits: int) -> Layout:
    return Layout((1, bits), (0, 1))


def universal_copy(bits: int, src: str = "gmem", dst: str = "rmem") -> CopyAtom:
    """``UniversalCopy<uint{bits}_t>`` between the memory spaces ``src`` and ``dst``."""
    if bits not in _VEC:
        raise ValueError(f"UniversalCopy: {bits} bits is not one of {sorted(_VEC)}")
    for what, sp in (("src", src), ("dst", dst)):
        if sp not in _SPACES:
            raise ValueError(f"UniversalCopy_U{bits}: {what}={sp!r} is not one of {', '.join(_SPACES)}")
    t = _VEC[bits]
    parts = []
    if src != "rmem":
        parts.append(f"ld.{_PTX_SPACE[src]}.{t}")
    if dst != "rmem":
        parts.append(f"st.{_PTX_SPACE[dst]}.{t}")
    if not parts:
        parts.append(f"mov.b{bits}" if bits <= 64 else "mov.b64 x2")
    if len(parts) == 1 and src != "rmem":
        operands = "r, [src]"
    elif len(parts) == 1 and dst != "rmem":
        operands = "[dst], r"
    else:
        operands = "r, [src]; [dst], r" if len(parts) == 2 else "dst, src"
    ends = (("source", src), ("destination", dst))
    cons = [f"{what} address aligned to {bits // 8} bytes" for what, sp in ends if sp != "rmem"]
    return CopyAtom(
        name=f"UniversalCopy_U{bits}", kind="universal", thr_id=_ONE, src_layout=_bits_layout(bits),
        dst_layout=_bits_layout(bits), ref_layout=_bits_layout(bits), access_bits=bits, src_space=src,
        dst_space=dst, arch="sm_75", ptx="; ".join(parts), ptx_operands=operands, alignment=bits // 8,
        constraints=tuple(cons), options=(("src", src), ("dst", dst)),
    )


def cp_async(bits: int, cache_global: bool, zfill: bool) -> CopyAtom:
    """``cp.async.{ca|cg}.shared.global`` of ``bits`` (32/64/128; ``.cg`` only 128)."""
    nbytes = bits // 8
    if bits not in (32, 64, 128) or (cache_global and bits != 128):
        raise ValueError(f"cp.async.{'cg' if cache_global else 'ca'}: {nbytes} bytes is not supported "
                         f"({'16' if cache_global else '4, 8 or 16'} bytes)")
    base = "SM80_CP_ASYNC_CACHEGLOBAL" if cache_global else "SM80_CP_ASYNC_CACHEALWAYS"
    name = f"{base}{'_ZFILL' if zfill else ''}_U{bits}"
    ptx = f"cp.async.{'cg' if cache_global else 'ca'}.shared.global.L2::128B"
    operands = f"[dst], [src], {nbytes}" + (", src_size" if zfill else "")
    cons = [f"global source and shared destination addresses aligned to {nbytes} bytes",
            "source in global memory, destination in shared memory",
            "completes asynchronously: cp.async.commit_group / cp.async.wait_group before reading"]
    if zfill:
        cons.append(f"src_size in [0, {nbytes}]: bytes past src_size are written as zeros")
    return CopyAtom(
        name=name, kind="cp.async", thr_id=_ONE, src_layout=_bits_layout(bits), dst_layout=_bits_layout(bits),
        ref_layout=_bits_layout(bits), access_bits=bits, src_space="gmem", dst_space="smem", arch="sm_80",
        ptx=ptx, ptx_operands=operands, alignment=nbytes, constraints=tuple(cons),
    )


def _uc_factory(bits: int) -> Callable[..., CopyAtom]:
    def make(src: str = "gmem", dst: str = "rmem") -> CopyAtom:
        return universal_copy(bits, src, dst)

    return make


def _cp_factory(bits: int, cg: bool, zfill: bool) -> Callable[[], CopyAtom]:
    def make() -> CopyAtom:
        return cp_async(bits, cg, zfill)

    return make


def _table() -> dict[str, Callable[..., CopyAtom]]:
    out: dict[str, Callable[..., CopyAtom]] = {}
    for bits in _VEC:
        out[f"UniversalCopy_U{bits}"] = _uc_factory(bits)
    for zfill in (False, True):
        z = "_ZFILL" if zfill else ""
        for bits in (32, 64, 128):
            out[f"SM80_CP_ASYNC_CACHEALWAYS{z}_U{bits}"] = _cp_factory(bits, False, zfill)
        out[f"SM80_CP_ASYNC_CACHEGLOBAL{z}_U128"] = _cp_factory(128, True, zfill)
    return out


#: name -> factory of every one-thread copy atom.
COPIES: dict[str, Callable[..., CopyAtom]] = _table()
