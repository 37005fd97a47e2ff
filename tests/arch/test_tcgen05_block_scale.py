"""sm_100a block-scaled MMA (kind::mxf8f6f4.block_scale, scale_vec::1X, ue8m0): atoms, the
instruction descriptor, the scale factors' shared-memory and TMEM layouts, and tcgen05.cp.

Expected values come from CuTe / CUTLASS sources (``UMMA::InstrDescriptorBlockScaled``'s
bitfields, ``UMMA::tmem_sf_frg``, ``Sm1xxBlkScaledConfig::SfKMajorAtom``, the
``SM100_UTCCP_*`` PTX strings) and the PTX ISA's tcgen05.cp shape table, rebuilt here
independently of the code under test.
"""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.arch import get_atom, list_atoms
from hexlayout.arch.block_scale import (
    from_ue8m0,
    is_ue8m0,
    scale_columns,
    scale_smem_layout,
    scale_tmem_layout,
    to_ue8m0,
)
from hexlayout.arch.dtypes import E2M1, E4M3, E5M2
from hexlayout.arch.sm100 import umma_block_scaled_atom
from hexlayout.arch.tcgen05 import InstrDescriptorBlockScaled, UmmaDescriptor
from hexlayout.arch.tcgen05_cp import CP_SHAPES, cp_smem_addresses, tmem_cp_layout
from hexlayout.arch.tcgen05_ops import tcgen05_ptx
from hexlayout.layout import Layout, composition, tiled_product

# CuTe's InstrDescriptorBlockScaled, fields in declaration order (name, bits); None: padding
_CUTE_FIELDS = [("sparse_id2", 2), ("sparse_flag", 1), (None, 1), ("b_sf_id", 2), (None, 1), ("a_format", 3),
                ("b_format", 3), ("a_negate", 1), ("b_negate", 1), ("a_major", 1), ("b_major", 1),
                ("n_dim", 6), ("scale_format", 1), ("m_dim", 5), ("a_sf_id", 2), ("k_size", 1)]


def _cute_pack(**f: int) -> int:
    out, pos = 0, 0
    for name, width in _CUTE_FIELDS:
        if name is not None:
            v = f.get(name, 0)
            assert 0 <= v < 1 << width
            out |= v << pos
        pos += width
    assert pos == 32
    return out


def test_block_scaled_atoms() -> None:
    names = [n for n in list_atoms(kind="tcgen05") if n.endswith("UE8M0_SS")]
    # CuTe SM100_MMA_MXF8F6F4_SS: M = 128, N % 8; _2x1SM_SS: M = 256, N % 16; 8 <= N <= 256
    assert len(names) == (32 + 16) * 4
    a = get_atom("SM100_128x8x32_F32E4M3E5M2_UE8M0_SS")
    assert a.shape_mnk == (128, 8, 32) and (a.a_dtype, a.b_dtype) == (E4M3, E5M2)
    assert a.ptx == "tcgen05.mma.cta_group::1.kind::mxf8f6f4.block_scale.scale_vec::1X"
    assert "[sfa_tmem], [sfb_tmem]" in a.ptx_operands
    assert (a.scale_type, a.scale_vec, a.c_source, a.num_threads) == ("ue8m0", 32, "tmem", 1)
    assert str(a.c_layout) == "(1,(128,8)):(0,(1,128))"
    pair = get_atom("SM100_2x1SM_256x256x32_F32E5M2E5M2_UE8M0_SS")
    assert pair.ptx.startswith("tcgen05.mma.cta_group::2.")
    assert str(pair.a_layout) == "(2,(128,32)):(128,(1,256))"
    for bad in ("SM100_64x64x32_F32E4M3E4M3_UE8M0_SS", "SM100_2x1SM_128x64x32_F32E4M3E4M3_UE8M0_SS",
                "SM100_2x1SM_256x24x32_F32E4M3E4M3_UE8M0_SS", "SM100_128x64x32_F32E4M3E4M3_UE8M0_TS"):
        assert bad not in names
    assert get_atom("SM100_128x64x32_F32E4M3E4M3_UE8M0_SS", b_major="MN").b_major == "MN"
    # the [a-tmem] form (PTX ISA: tcgen05.mma...block_scale [d], [a], b_desc, idesc, [sfa], [sfb], p):
    # fp8 kinds only, A K-major, the same shapes
    ts = [n for n in list_atoms(kind="tcgen05") if n.endswith("UE8M0_TS")]
    assert sorted(t[:-3] for t in ts) == sorted(n[:-3] for n in names)
    t = get_atom("SM100_128x64x32_F32E4M3E5M2_UE8M0_TS", b_major="MN")
    assert (t.a_source, t.a_major, t.b_major, t.ptx) == ("tmem", "K", "MN", a.ptx)
    assert t.ptx_operands.startswith("[d_tmem], [a_tmem], b_desc, idesc, [sfa_tmem], [sfb_tmem]")
    with pytest.raises(ValueError, match="A from tensor memory is built for kind::mxf8f6f4"):
        umma_block_scaled_atom(128, 64, E2M1, E2M1, a_source="tmem")


@pytest.mark.parametrize(("a", "b", "m", "n", "am", "bm", "sfa", "sfb"), [
    (E4M3, E4M3, 128, 64, "K", "K", 0, 0),
    (E4M3, E5M2, 128, 8, "K", "MN", 3, 1),
    (E5M2, E4M3, 256, 256, "MN", "K", 2, 3),
])
def test_block_scaled_instruction_descriptor_matches_cute(a, b, m, n, am, bm, sfa, sfb) -> None:
    fmt = {"e4m3": 0, "e5m2": 1}                               # CuTe UMMA::MXF8F6F4Format
    want = _cute_pack(a_format=fmt[a.name], b_format=fmt[b.name], a_major=int(am == "MN"),
                      b_major=int(bm == "MN"), n_dim=n >> 3, m_dim=m >> 4, scale_format=1,  # UE8M0 = 1
                      a_sf_id=sfa, b_sf_id=sfb)
    d = InstrDescriptorBlockScaled(a, b, m, n, am, bm, sfa, sfb)
    assert d.encode() == want
    assert InstrDescriptorBlockScaled.decode(want) == d


def test_block_scaled_descriptor_errors() -> None:
    with pytest.raises(ValueError, match="scale-factor ID 4"):
        InstrDescriptorBlockScaled(E4M3, E4M3, 128, 64, a_sf_id=4).encode()
    from hexlayout.arch.dtypes import F16

    with pytest.raises(ValueError, match="f16 is not e4m3 or e5m2"):
        InstrDescriptorBlockScaled(F16, E4M3, 128, 64).encode()
    with pytest.raises(ValueError, match="sparse"):
        InstrDescriptorBlockScaled.decode(_cute_pack(sparse_flag=1, m_dim=8, n_dim=8))


@pytest.mark.parametrize(("rows", "kblocks"), [(128, 1), (128, 4), (128, 8), (256, 4), (256, 8)])
def test_scale_tmem_layout_is_cutes_tmem_sf_frg(rows, kblocks) -> None:
    """CuTe: ``tmem_atom = (((32, MN/32), 4), (VS, NSF)) : (((1, 512), 32), (0, 128))``, tiled by
    the MMAs along K, composed with ``(128, 16384) : (DP<uint8_t>, 1)``; one MMA (K = 32,
    scale_vec::1X) has NSF = 1, so its factors are k-block ``kb`` = MMA ``kb``."""
    atom = Layout((((32, rows // 32), 4), (32, 1)), (((1, 512), 32), (0, 128)))
    cute = composition(Layout((128, 16384), (1 << 18, 1)), tiled_product(atom, Layout((1, kblocks))))
    mine = scale_tmem_layout(rows, kblocks)
    got = np.array([[[mine(r, kb, q) for q in range(4)] for kb in range(kblocks)] for r in range(rows)])
    exp = np.zeros_like(got)
    for r in range(rows):
        for kb in range(kblocks):
            for q in range(4):
                # CuTe coordinate (((r % 32, r // 32), q), (vec 0, sf 0)) as its flat index, MMA 0 along
                # MN, MMA kb along K
                exp[r, kb, q] = cute((r % 32) + 32 * (r // 32) + rows * q, 0, kb)
    np.testing.assert_array_equal(got, exp)
    lanes, cols = got >> 18, (got & 0xFFFF) // 4
    assert np.array_equal(np.unique(lanes), np.arange(128))
    assert cols.max() + 1 == scale_columns(rows, kblocks)


@pytest.mark.parametrize("kblocks", [4, 8])
def test_scale_smem_layout_is_cutlass_sf_atom(kblocks) -> None:
    """CUTLASS ``SfKMajorAtom = ((32, 4), (32, 4)) : ((16, 4), (0, 1))`` (rows, K elements), atoms
    tiled K first (``Step<_2, _1>``): atom ``(i, j)`` (rows ``128 i``, k-blocks ``4 j``) at ``512 (j + i
    * kblocks / 4)``."""
    atom = Layout(((32, 4), (32, 4)), ((16, 4), (0, 1)))
    rows = 256
    mine = scale_smem_layout(rows, kblocks)
    for r in range(rows):
        for kb in range(kblocks):
            want = 512 * (kb // 4 + (r // 128) * (kblocks // 4)) + atom(r % 128, 32 * (kb % 4))
            assert mine(r, kb) == want, (r, kb)
    assert str(scale_smem_layout(128, 4)) == "((32,4),4):((16,4),1)"


def _isa_cp_lanes(shape: str, r: int) -> list[int]:
    """PTX ISA tcgen05.cp: the TMEM lanes (relative to the address) row ``r`` of the copy reaches."""
    return {"128x256b": [r], "128x128b": [r], "4x256b": [32 * r],
            "64x128b.warpx2::02_13": [r, r + 64],
            "64x128b.warpx2::01_23": [64 * (r // 32) + r % 32, 64 * (r // 32) + r % 32 + 32],
            "32x128b.warpx4": [r + 32 * q for q in range(4)]}[shape]


@pytest.mark.parametrize("shape", sorted(CP_SHAPES))
def test_cp_shapes_match_the_isa_table(shape) -> None:
    s = CP_SHAPES[shape]
    rows, bits = (int(x) for x in shape.split(".")[0].replace("b", "").split("x"))
    assert (s.rows, s.bits, s.words) == (rows, bits, bits // 32)
    lay = tmem_cp_layout(shape)
    reps = lay.shape[2]
    for r in range(rows):
        for w in range(bits // 32):
            cells = sorted(lay(r, w, q) for q in range(reps))
            assert cells == sorted((lane << 16) | w for lane in _isa_cp_lanes(shape, r)), (r, w)
    cells = [lay(i) for i in range(lay.size())]
    assert len(set(cells)) == len(cells) and max(c >> 16 for c in cells) < 128
    assert tcgen05_ptx("cp", 1, shape) == f"tcgen05.cp.cta_group::1.{shape}"


def test_cp_ptx_is_cutes_and_smem_walk_is_the_isas() -> None:
    # CuTe SM100_UTCCP_4x32dp128bit_1cta / _128dp256bit_2cta / _4dp256bit_1cta asm strings
    assert tcgen05_ptx("cp", 1, "32x128b.warpx4") == "tcgen05.cp.cta_group::1.32x128b.warpx4"
    assert tcgen05_ptx("cp", 2, "128x256b") == "tcgen05.cp.cta_group::2.128x256b"
    assert tcgen05_ptx("cp", 1, "4x256b") == "tcgen05.cp.cta_group::1.4x256b"
    with pytest.raises(ValueError, match="shape '32x64b' is not one of"):
        tcgen05_ptx("cp", 1, "32x64b")
    # ISA: before swizzling, row r at (r // 8) * SBO + (r % 8) * 16 bytes, the second 16 bytes LBO later
    got = cp_smem_addresses(UmmaDescriptor(0, 4096, 256), "128x256b")
    r, b = np.meshgrid(np.arange(128), np.arange(32), indexing="ij")
    np.testing.assert_array_equal(got, (r // 8) * 256 + (r % 8) * 16 + (b // 16) * 4096 + b % 16)
    # one scale-factor atom (512 contiguous bytes) is one 32x128b copy with SBO = 128
    np.testing.assert_array_equal(cp_smem_addresses(UmmaDescriptor(0, 0, 128), "32x128b.warpx4").reshape(-1),
                                  np.arange(512))


def test_ue8m0() -> None:
    x = np.array([1.0, 0.5, 2.0 ** -127, 2.0 ** 127, 0.125])
    e = to_ue8m0(x)
    np.testing.assert_array_equal(e, [127, 126, 0, 254, 124])
    np.testing.assert_array_equal(from_ue8m0(e), x)
    assert np.isnan(from_ue8m0(np.array([255]))).all()
    assert not is_ue8m0(np.array([3.0, 0.0, -1.0, 2.0 ** 128])).any()
    with pytest.raises(ValueError, match="3.0 is not a power of two"):
        to_ue8m0(np.array([1.0, 3.0]))
