"""Blackwell tensor-core atoms (sm_100a): ``tcgen05.mma`` kind::f16 and kind::f8f6f4.

One thread issues ``tcgen05.mma`` for its CTA (``cta_group::1``) or for a pair of CTAs of a
cluster (``cta_group::2``); it computes ``D[M,N] (+)= A[M,K] @ B[N,K]^T`` with D in tensor
memory (TMEM, see ``tmem.py``), B from shared memory through a descriptor, and A from shared
memory (``SS``) or TMEM (``TS``). ``K = 256 / bits(A)``: 16 for f16/bf16, 32 for e4m3/e5m2.
Valid shapes (PTX ISA "Valid shapes for kind::f16 / kind::f8f6f4", dense):

* ``cta_group::1``: ``M = 64`` with ``N % 8 == 0``, ``M = 128`` with ``N % 16 == 0``;
* ``cta_group::2``: ``M = 128`` with ``N % 32 == 0``, ``M = 256`` with ``N % 16 == 0``;

always ``N <= 256``. CuTe's MMA traits (``SM100_MMA_F16BF16_SS`` and its ``_TS`` /
``_2x1SM_`` forms, ``SM100_MMA_F8F6F4_SS``) give the layouts: with one CTA
``ThrID = 1`` and ``A = (1,(M,K)):(0,(1,M))``, ``B = (1,(N,K)):(0,(1,N))``,
``C = (1,(M,N)):(0,(1,M))``; with two, ``ThrID = 2`` (the peer CTAs) and each CTA holds half
of A's rows, half of B's rows and half of D's rows: ``A = (2,(M/2,K)):(M/2,(1,M))``,
``B = (2,(N/2,K)):(N/2,(1,N))``, ``C = (2,(M/2,N)):(M/2,(1,M))``.

Names: ``SM100_{M}x{N}x{K}_{D}{A}{B}_{SS|TS}`` and ``SM100_2x1SM_{M}x{N}x{K}_..._{SS|TS}`` (CuTe's
templates ``SM100_MMA_F16BF16_SS<A, B, D, M, N, a_major, b_major>`` spelled out like the
sm_90a wgmma names). Options ``a_major`` / ``b_major`` in {"K", "MN"} select the canonical
shared-memory layout (instruction-descriptor bits 15 / 16); a TMEM A is K-major.

**Block-scaled** ``tcgen05.mma.cta_group::{1,2}.kind::mxf8f6f4.block_scale.scale_vec::1X``
(e4m3 / e5m2 operands, f32 accumulate, ue8m0 scale factors; CuTe ``SM100_MMA_MXF8F6F4_SS`` /
``_2x1SM_SS``): ``D (+)= (A * 2^(SFA - 127)) @ (B * 2^(SFB - 127))^T`` where ``SFA[m]`` and
``SFB[n]`` are one unsigned 8-bit exponent per row for the instruction's K = 32 (scale_vec::1X:
one scale per 32 K elements), read from tensor memory at the addresses ``[sfa_tmem]`` /
``[sfb_tmem]`` (layout: ``block_scale.py``). Shapes (CuTe's static asserts): ``cta_group::1``
``M = 128``, ``N % 8 == 0``; ``cta_group::2`` ``M = 256``, ``N % 16 == 0``; ``8 <= N <= 256``.
Names ``SM100_{M}x{N}x32_F32{A}{B}_UE8M0_SS`` (and ``SM100_2x1SM_...``); same thread / value
layouts as the unscaled atoms, ``scale_type = "ue8m0"``, ``scale_vec = 32``. The ``[a-tmem]`` form
(A from TMEM, K-major, ``..._UE8M0_TS``: ``tcgen05.mma...block_scale [d], [a], b_desc, idesc, [sfa],
[sfb], p``) is built for these fp8 kinds; for the FP4 kinds only the ``_SS`` form is.

**FP4** (``kind::mxf4.block_scale.scale_vec::2X``, ``kind::mxf4nvf4.block_scale.scale_vec::{2X,4X}``;
CuTe ``SM100_MMA_MXF4_SS<..., VS>``): e2m1 A and B (``E2M1`` = 1 in the descriptor's format
fields), ``K = 64`` (256 bits), the same shapes; one factor per ``VS`` = 32 (2X, ue8m0) or 16 (4X,
ue4m3 = NVFP4, or ue8m0) K elements, ``K / VS`` factors per row per MMA
(``block_scale``). ``D (+)= sum_k A[m,k] SFA[m, k//VS] B[n,k] SFB[n, k//VS]``. In shared memory the
operands are packed, two elements per byte (even ``k`` in the low nibble), K-major only: a row's
64 elements are 32 bytes, so the descriptor and swizzle see exactly the bytes of a K = 32 fp8
operand (``umma_desc_addresses(desc, "K", 8, mn, 32)``, element ``k`` in byte ``k // 2``). Names
``SM100_{M}x{N}x64_F32E2M1E2M1_{UE8M0|UE4M3}_VS{32|16}_{MXF4|MXF4NVF4}_SS``. kind::mxf8f6f4 with
e2m1 / e2m3 / e3m2 operands (each padded to a byte in shared memory) is not modelled.
"""

from __future__ import annotations

from collections.abc import Callable

from ..layout import Layout
from .block_scale import SCALE_VEC_NAME, SCALE_VECS
from .dtypes import BF16, E2M1, E4M3, E5M2, F16, F32, DType
from .mma_atom import MmaAtom

__all__ = ["SM100_UMMA", "umma_atom", "umma_n_values", "UMMA_SHAPES", "MMA_KINDS", "kind_of",
           "BLOCK_SCALED_SHAPES", "block_scaled_n_values", "umma_block_scaled_atom", "block_scaled_kind",
           "scaled_kind_of"]

#: (cta_group, M) -> the step of N (N ranges over step, 2*step, ..., 256).
UMMA_SHAPES: dict[tuple[int, int], int] = {(1, 64): 8, (1, 128): 16, (2, 128): 32, (2, 256): 16}
#: block-scaled kind::mxf8f6f4 (cta_group, M) -> the step of N (CuTe ``SM100_MMA_MXF8F6F4_SS``)
BLOCK_SCALED_SHAPES: dict[tuple[int, int], int] = {(1, 128): 8, (2, 256): 16}
#: scale-factor types of a block-scaled MMA (instruction-descriptor bit 23)
SCALE_TYPES = ("ue8m0", "ue4m3")
_MAJORS = ("K", "MN")
#: Operand formats per mma kind (bits 7..9 and 10..12 of the instruction descriptor).
MMA_KINDS: dict[str, dict[str, int]] = {
    "f16": {"f16": 0, "bf16": 1},
    "f8f6f4": {"e4m3": 0, "e5m2": 1},
}


def kind_of(a: DType) -> str:
    """The ``tcgen05.mma`` kind that multiplies ``a``: ``"f16"`` (f16, bf16), ``"f8f6f4"`` (e4m3, e5m2)."""
    for kind, formats in MMA_KINDS.items():
        if a.name in formats:
            return kind
    raise ValueError(f"tcgen05.mma: {a.name} operands are not supported (f16, bf16, e4m3, e5m2)")



def umma_n_values(cta_group: int, m: int) -> tuple[int, ...]:
    """The N extents ``tcgen05.mma`` accepts for ``cta_group`` and ``m``."""
    if (cta_group, m) not in UMMA_SHAPES:
        raise ValueError(f"tcgen05.mma: M={m} is not valid for cta_group::{cta_group} "
                         f"(valid: {', '.join(f'cta_group::{g} M={mm}' for g, mm in UMMA_SHAPES)})")
    step = UMMA_SHAPES[(cta_group, m)]
    return tuple(range(step, 257, step))


def _operand(groups: int, rows: int, k: int) -> Layout:
    """``(groups, (rows/groups, k)) : (rows/groups, (1, rows))``: each CTA of the group its rows."""
    per = rows // groups
    return Layout((groups, (per, k)), (per if groups > 1 else 0, (1, rows)))


def umma_atom(m: int, n: int, da: DType, db: DType, dc: DType, a_source: str = "smem", cta_group: int = 1,
              a_major: str = "K", b_major: str = "K") -> MmaAtom:
    """The ``tcgen05.mma.cta_group::{cta_group}.kind::{f16|f8f6f4}`` atom ``m x n x (256/bits(A))``.

    Example:
        >>> umma_atom(128, 256, BF16, BF16, F32).name
        'SM100_128x256x16_F32BF16BF16_SS'
    """
    for what, major in (("a_major", a_major), ("b_major", b_major)):
        if major not in _MAJORS:
            raise ValueError(f"tcgen05.mma: {what}={major!r} is not one of 'K', 'MN'")
    if a_source not in ("smem", "tmem"):
        raise ValueError(f"tcgen05.mma: A comes from 'smem' or 'tmem', not {a_source!r}")
    if n not in umma_n_values(cta_group, m):
        raise ValueError(f"tcgen05.mma: N={n} is not valid for cta_group::{cta_group} M={m} (multiples of "
                         f"{UMMA_SHAPES[(cta_group, m)]} up to 256)")
    kind = kind_of(da)
    if kind_of(db) != kind:
        raise ValueError(f"tcgen05.mma: A {da.name} and B {db.name} are not of one kind")
    k = 256 // da.bits
    src = "SS" if a_source == "smem" else "TS"
    pair = "2x1SM_" if cta_group == 2 else ""
    name = f"SM100_{pair}{m}x{n}x{k}_{dc.cute}{da.cute}{db.cute}_{src}"
    if a_source == "tmem" and a_major != "K":
        raise ValueError(f"{name}: A from tensor memory is K-major (got a_major={a_major!r})")
    a_opnd = "a_desc" if a_source == "smem" else "[a_tmem]"
    return MmaAtom(
        name=name, kind="tcgen05", shape_mnk=(m, n, k), thr_id=Layout(cta_group),
        a_layout=_operand(cta_group, m, k), b_layout=_operand(cta_group, n, k),
        c_layout=_operand(cta_group, m, n), a_dtype=da, b_dtype=db, c_dtype=dc,
        arch="sm_100a", ptx=f"tcgen05.mma.cta_group::{cta_group}.kind::{kind}",
        ptx_operands=f"[d_tmem], {a_opnd}, b_desc, idesc, enable_input_d", regs_a=0, regs_b=0, regs_c=0,
        a_source=a_source, b_source="smem", a_major=a_major, b_major=b_major,
        options=(("a_major", a_major), ("b_major", b_major)), c_source="tmem", cta_group=cta_group,
    )


def block_scaled_n_values(cta_group: int, m: int) -> tuple[int, ...]:
    """The N extents the block-scaled ``tcgen05.mma`` accepts for ``cta_group`` and ``m``."""
    if (cta_group, m) not in BLOCK_SCALED_SHAPES:
        raise ValueError(f"tcgen05.mma.block_scale: M={m} is not valid for "
                         f"cta_group::{cta_group} "
                         f"(valid: {', '.join(f'cta_group::{g} M={mm}' for g, mm in BLOCK_SCALED_SHAPES)})")
    step = BLOCK_SCALED_SHAPES[(cta_group, m)]
    return tuple(range(step, 257, step))


def block_scaled_kind(da: DType, db: DType, scale_type: str, vs: int) -> str:
    """The kind of the block-scaled ``tcgen05.mma`` that multiplies ``da`` by ``db`` with
    ``scale_type`` factors per ``vs`` K elements (``block_scale.SCALE_VECS``): e4m3 / e5m2 ->
    ``mxf8f6f4`` (VS 32, ue8m0); e2m1 with ue8m0 per 32 -> ``mxf4`` (CuTe's choice for MXFP4);
    e2m1 per 16 -> ``mxf4nvf4`` (ue4m3: NVFP4, or ue8m0). ``ValueError`` naming the combination
    otherwise."""
    names = (da.name, db.name)
    fp8 = all(n in MMA_KINDS["f8f6f4"] for n in names)
    fp4 = all(n == "e2m1" for n in names)
    if not (fp8 or fp4):
        raise ValueError(f"block-scaled tcgen05.mma: A {da.name} and B {db.name} are not both fp8 (e4m3 / "
                         "e5m2, kind::mxf8f6f4) or both e2m1 (kind::mxf4 / mxf4nvf4)")
    if scale_type not in SCALE_TYPES:
        raise ValueError(f"block-scaled tcgen05.mma: scale factor type {scale_type!r} is not one of "
                         f"{', '.join(SCALE_TYPES)}")
    if fp8:
        kind = "mxf8f6f4"
    else:
        kind = "mxf4" if vs == 32 else "mxf4nvf4"
    if (kind, vs) not in SCALE_VECS:
        valid = sorted({v for k, v in SCALE_VECS if (k == "mxf8f6f4") == fp8}, reverse=True)
        raise ValueError(f"block-scaled tcgen05.mma: {da.name} x {db.name} operands take one factor per "
                         f"{' or '.join(map(str, valid))} K elements, not {vs}")
    if scale_type not in SCALE_VECS[(kind, vs)]:
        raise ValueError(f"block-scaled tcgen05.mma.kind::{kind}.scale_vec::{SCALE_VEC_NAME[(kind, vs)]}: "
                         f"{scale_type} factors are not valid (valid: {', '.join(SCALE_VECS[(kind, vs)])}; "
                         "ue4m3 factors cover 16 K elements)")
    return kind


def umma_block_scaled_atom(m: int, n: int, da: DType, db: DType, cta_group: int = 1, a_major: str = "K",
                           b_major: str = "K", scale_type: str = "ue8m0", vs: int = 32,
                           kind: str | None = None, a_source: str = "smem") -> MmaAtom:
    """The block-scaled ``tcgen05.mma.cta_group::{g}.kind::{kind}.block_scale.scale_vec::{1X|2X|4X}``
    atom ``m x n x K`` (A and B from shared memory, f32 accumulator in TMEM, ``scale_type`` factors
    per ``vs`` K elements in TMEM); ``K`` = 32 for fp8 operands, 64 for e2m1 (packed two per byte in
    shared memory: 32 bytes per row either way). ``kind`` (default ``block_scaled_kind``) may name
    ``mxf4nvf4`` for e2m1 with ue8m0 per 32 too. ``a_source="tmem"``: A read from tensor memory
    (``[a_tmem]``, a ``_TS`` atom, K-major), built for kind::mxf8f6f4 (fp8 A) only.

    Example:
        >>> umma_block_scaled_atom(128, 64, E4M3, E4M3).name
        'SM100_128x64x32_F32E4M3E4M3_UE8M0_SS'
        >>> umma_block_scaled_atom(128, 64, E2M1, E2M1, scale_type="ue4m3", vs=16).ptx
        'tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X'
    """
    for what, major in (("a_major", a_major), ("b_major", b_major)):
        if major not in _MAJORS:
            raise ValueError(f"tcgen05.mma: {what}={major!r} is not one of 'K', 'MN'")
    chosen = block_scaled_kind(da, db, scale_type, vs)
    if kind is not None and kind != chosen:
        if not (kind == "mxf4nvf4" and chosen == "mxf4"):
            raise ValueError(f"block-scaled tcgen05.mma: kind::{kind} does not multiply {da.name} x "
                             f"{db.name} with {scale_type} factors per {vs} K elements (kind::{chosen} does)")
        chosen = kind
    if a_source not in ("smem", "tmem"):
        raise ValueError(f"tcgen05.mma: A comes from 'smem' or 'tmem', not {a_source!r}")
    if a_source == "tmem" and (chosen != "mxf8f6f4" or a_major != "K"):
        raise ValueError(f"block-scaled tcgen05.mma.kind::{chosen}: A from tensor memory is built for "
                         "kind::mxf8f6f4 with a K-major A only")
    if chosen != "mxf8f6f4" and (a_major, b_major) != ("K", "K"):
        raise ValueError(f"tcgen05.mma.kind::{chosen}: e2m1 operands are K-major only (got "
                         f"a_major={a_major!r}, b_major={b_major!r})")
    if n not in block_scaled_n_values(cta_group, m):
        raise ValueError(f"tcgen05.mma.kind::{chosen}.block_scale: N={n} is not valid for "
                         f"cta_group::{cta_group} "
                         f"M={m} (multiples of {BLOCK_SCALED_SHAPES[(cta_group, m)]} up to 256)")
    k = 256 // da.bits
    pair = "2x1SM_" if cta_group == 2 else ""
    tag = "" if chosen == "mxf8f6f4" else f"_VS{vs}_{chosen.upper()}"
    src = "TS" if a_source == "tmem" else "SS"
    name = f"SM100_{pair}{m}x{n}x{k}_{F32.cute}{da.cute}{db.cute}_{scale_type.upper()}{tag}_{src}"
    return MmaAtom(
        name=name, kind="tcgen05", shape_mnk=(m, n, k), thr_id=Layout(cta_group),
        a_layout=_operand(cta_group, m, k), b_layout=_operand(cta_group, n, k),
        c_layout=_operand(cta_group, m, n), a_dtype=da, b_dtype=db, c_dtype=F32,
        arch="sm_100a", ptx=(f"tcgen05.mma.cta_group::{cta_group}.kind::{chosen}.block_scale."
                             f"scale_vec::{SCALE_VEC_NAME[(chosen, vs)]}"),
        ptx_operands=(f"[d_tmem], {'[a_tmem]' if a_source == 'tmem' else 'a_desc'}, b_desc, idesc, "
                      "[sfa_tmem], [sfb_tmem], enable_input_d"),
        regs_a=0, regs_b=0, regs_c=0, a_source=a_source, b_source="smem", a_major=a_major, b_major=b_major,
        options=(("a_major", a_major), ("b_major", b_major)), c_source="tmem", cta_group=cta_group,
        scale_type=scale_type, scale_vec=vs,
    )


def scaled_kind_of(atom: MmaAtom) -> str:
    """The kind (``mxf8f6f4``, ``mxf4``, ``mxf4nvf4``) of a block-scaled atom (from its PTX)."""
    if not atom.scale_type:
        raise ValueError(f"{atom.name} is not a block-scaled tcgen05.mma")
    return atom.ptx.split(".kind::")[1].split(".")[0]


def _factory(m: int, n: int, da: DType, db: DType, dc: DType, a_source: str,
             group: int) -> Callable[..., MmaAtom]:
    def make(a_major: str = "K", b_major: str = "K") -> MmaAtom:
        return umma_atom(m, n, da, db, dc, a_source, group, a_major, b_major)

    return make


def _table() -> dict[str, Callable[..., MmaAtom]]:
    out: dict[str, Callable[..., MmaAtom]] = {}
    combos = [(F16, F16, F32), (BF16, BF16, F32)] + [(a, b, F32) for a in (E4M3, E5M2) for b in (E4M3, E5M2)]
    for group, m in UMMA_SHAPES:
        for n in umma_n_values(group, m):
            for da, db, dc in combos:
                for src, tag in (("smem", "SS"), ("tmem", "TS")):
                    pair = "2x1SM_" if group == 2 else ""
                    name = f"SM100_{pair}{m}x{n}x{256 // da.bits}_{dc.cute}{da.cute}{db.cute}_{tag}"
                    out[name] = _factory(m, n, da, db, dc, src, group)
    scaled = [(da, db, "ue8m0", 32, None) for da in (E4M3, E5M2) for db in (E4M3, E5M2)] + [
        (E2M1, E2M1, "ue8m0", 32, None), (E2M1, E2M1, "ue8m0", 32, "mxf4nvf4"),
        (E2M1, E2M1, "ue4m3", 16, None), (E2M1, E2M1, "ue8m0", 16, None)]
    for group, m in BLOCK_SCALED_SHAPES:
        for n in block_scaled_n_values(group, m):
            for da, db, st, vs, kind in scaled:
                for src in ("smem", "tmem") if da.bits == 8 else ("smem",):
                    atom = umma_block_scaled_atom(m, n, da, db, group, scale_type=st, vs=vs, kind=kind,
                                                  a_source=src)
                    out[atom.name] = _scaled_factory(m, n, da, db, group, st, vs, kind, src)
    return out


def _scaled_factory(m: int, n: int, da: DType, db: DType, group: int, scale_type: str, vs: int,
                    kind: str | None, a_source: str = "smem") -> Callable[..., MmaAtom]:
    def make(a_major: str = "K", b_major: str = "K") -> MmaAtom:
        return umma_block_scaled_atom(m, n, da, db, group, a_major, b_major, scale_type, vs, kind, a_source)

    return make


#: name -> factory (options ``a_major``, ``b_major``) of every sm_100a tcgen05.mma atom.
SM100_UMMA: dict[str, Callable[..., MmaAtom]] = _table()
