"""sm_100a FP4 block-scaled MMAs: kind::mxf4 (scale_vec::2X, UE8M0) and kind::mxf4nvf4 (2X UE8M0,
4X UE4M3 or UE8M0): atoms, instruction descriptors, UE4M3, and which factor bytes an MMA reads.

Expected values are rebuilt from CuTe / CUTLASS sources (``UMMA::InstrDescriptorBlockScaled``'s
bitfields, ``MXF4Format::E2M1 = 1``, ``ScaleFormat::UE4M3 = 0``, ``SM100_MMA_MXF4_SS``'s PTX strings
and static asserts, ``tmem_sf_frg``) independently of the code under test.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from hexlayout.arch import get_atom, list_atoms
from hexlayout.arch.block_scale import from_ue4m3, mma_sf_id, scale_tmem_layout, to_ue4m3
from hexlayout.arch.dtypes import E2M1, E4M3, UE4M3, get_dtype
from hexlayout.arch.sm100 import block_scaled_kind, umma_block_scaled_atom
from hexlayout.arch.tcgen05 import InstrDescriptorBlockScaled
from hexlayout.layout import Layout, composition, tiled_product

from .test_tcgen05_block_scale import _cute_pack


def test_fp4_atoms_match_cutes_sm100_mma_mxf4_ss() -> None:
    fp4 = [n for n in list_atoms(kind="tcgen05") if "E2M1" in n]
    # four (kind, scale_vec, factor) forms x (M = 128: 32 N values; M = 256 pair: 16)
    assert len(fp4) == 4 * (32 + 16)
    a = get_atom("SM100_128x64x64_F32E2M1E2M1_UE4M3_VS16_MXF4NVF4_SS")
    assert a.shape_mnk == (128, 64, 64) and (a.a_dtype, a.b_dtype) == (E2M1, E2M1)
    # CuTe SM100_MMA_MXF4_SS<VS = 16> (PTX before CUDA 12.9) / <VS = 32>
    assert a.ptx == "tcgen05.mma.cta_group::1.kind::mxf4nvf4.block_scale.scale_vec::4X"
    assert (a.scale_type, a.scale_vec) == ("ue4m3", 16)
    m = get_atom("SM100_128x64x64_F32E2M1E2M1_UE8M0_VS32_MXF4_SS")
    assert m.ptx == "tcgen05.mma.cta_group::1.kind::mxf4.block_scale.scale_vec::2X"
    nv2 = get_atom("SM100_2x1SM_256x32x64_F32E2M1E2M1_UE8M0_VS32_MXF4NVF4_SS")
    assert nv2.ptx == "tcgen05.mma.cta_group::2.kind::mxf4nvf4.block_scale.scale_vec::2X"
    assert str(a.a_layout) == "(1,(128,64)):(0,(1,128))"          # CuTe ALayout, K = 64
    assert get_atom("SM100_128x8x64_F32E2M1E2M1_UE8M0_VS16_MXF4NVF4_SS").scale_vec == 16
    with pytest.raises(ValueError, match="K-major only"):
        get_atom("SM100_128x64x64_F32E2M1E2M1_UE8M0_VS32_MXF4_SS", b_major="MN")


@pytest.mark.parametrize(("da", "db", "st", "vs", "words"), [
    (E2M1, E2M1, "ue4m3", 32, "ue4m3 factors are not valid"),      # UE4M3 only with 4X
    (E4M3, E4M3, "ue8m0", 16, "one factor per 32 K elements, not 16"),  # fp8 is 1X only
    (E4M3, E2M1, "ue8m0", 32, "are not both fp8"),
    (E2M1, E2M1, "ue8m0", 8, "not 8"),
])
def test_invalid_kind_combinations_are_refused(da, db, st, vs, words) -> None:
    with pytest.raises(ValueError, match=words):
        block_scaled_kind(da, db, st, vs)
    with pytest.raises(ValueError, match=words):
        umma_block_scaled_atom(128, 64, da, db, scale_type=st, vs=vs)


@pytest.mark.parametrize(("kind", "st", "vs", "m", "n", "sfa", "sfb"), [
    ("mxf4", "ue8m0", 32, 128, 64, 0, 2),
    ("mxf4nvf4", "ue8m0", 32, 128, 256, 2, 0),
    ("mxf4nvf4", "ue4m3", 16, 128, 8, 0, 0),
    ("mxf4nvf4", "ue8m0", 16, 256, 128, 0, 0),
])
def test_fp4_instruction_descriptor_matches_cute(kind, st, vs, m, n, sfa, sfb) -> None:
    want = _cute_pack(a_format=1, b_format=1, n_dim=n >> 3, m_dim=m >> 4,   # MXF4Format::E2M1 = 1
                      scale_format={"ue4m3": 0, "ue8m0": 1}[st], a_sf_id=sfa, b_sf_id=sfb)
    d = InstrDescriptorBlockScaled(E2M1, E2M1, m, n, a_sf_id=sfa, b_sf_id=sfb, scale_type=st, kind=kind,
                                   vs=vs)
    assert d.encode() == want
    assert InstrDescriptorBlockScaled.decode(want, kind, vs) == d


def test_fp4_descriptor_errors() -> None:
    # 2X: an MMA reads 2 factors per row, so its first byte is 0 or 2; 4X: 4 factors, byte 0
    with pytest.raises(ValueError, match="scale-factor ID 1 is not a byte 0..3 that is a multiple of 2"):
        InstrDescriptorBlockScaled(E2M1, E2M1, 128, 64, a_sf_id=1, kind="mxf4").encode()
    with pytest.raises(ValueError, match="B scale-factor ID 2 .* multiple of 4"):
        InstrDescriptorBlockScaled(E2M1, E2M1, 128, 64, b_sf_id=2, scale_type="ue4m3", kind="mxf4nvf4",
                                   vs=16).encode()
    with pytest.raises(ValueError, match="kind::mxf4: A e4m3 is not e2m1"):
        InstrDescriptorBlockScaled(E4M3, E2M1, 128, 64, kind="mxf4").encode()
    with pytest.raises(ValueError, match="takes ue8m0 factors, not ue4m3"):
        InstrDescriptorBlockScaled(E2M1, E2M1, 128, 64, scale_type="ue4m3", kind="mxf4").encode()
    with pytest.raises(ValueError, match="operand format 5"):         # mxf8f6f4's E2M1 code under mxf4
        bad = _cute_pack(a_format=5, b_format=1, n_dim=8, m_dim=8, scale_format=1)
        InstrDescriptorBlockScaled.decode(bad, "mxf4")


def test_ue4m3_is_e4m3_without_sign() -> None:
    codes = np.arange(0x7F)
    ref = np.asarray(codes.astype(np.uint8).view(ml_dtypes.float8_e4m3fn), np.float64)   # sign bit 0
    np.testing.assert_array_equal(from_ue4m3(codes), ref)
    assert from_ue4m3(np.array([0x38]))[0] == 1.0 and from_ue4m3(np.array([0x7E]))[0] == 448.0
    assert from_ue4m3(np.array([0x01]))[0] == 2.0 ** -9 and np.isnan(from_ue4m3(np.array([0x7F]))[0])
    np.testing.assert_array_equal(to_ue4m3(ref), codes)
    with pytest.raises(ValueError, match="0.3 is not a UE4M3 value"):
        to_ue4m3(np.array([1.0, 0.3]))
    assert get_dtype("ue4m3") is UE4M3 and UE4M3.bits == 8 and UE4M3.numpy() == np.uint8


@pytest.mark.parametrize(("kind", "vs"), [("mxf4", 32), ("mxf4nvf4", 16), ("mxf8f6f4", 32)])
def test_mma_factor_bytes_are_cutes_tmem_sf_frg(kind, vs) -> None:
    """CuTe's ``tmem_sf_frg`` atom ``(((32, MN/32), 4), (VS, NSF)) : (((1, 512), 32), (0, 128))`` with
    ``NSF = K / VS`` factors per MMA, tiled by the MMAs along K and composed with
    ``(128, 16384) : (DP<uint8_t>, 1)``: factor ``j`` of MMA ``s`` for row ``r`` is the TMEM byte
    ``scale_tmem_layout`` gives k-block ``s NSF + j``, and its byte in the column is
    ``mma_sf_id(s) + j``."""
    k = 32 if kind == "mxf8f6f4" else 64
    nsf, rows, steps = k // vs, 128, 4
    kblocks = steps * nsf
    atom = Layout((((32, rows // 32), 4), (vs, nsf)), (((1, 512), 32), (0, 128)))
    cute = composition(Layout((128, 16384), (1 << 18, 1)), tiled_product(atom, Layout((1, steps))))
    mine = scale_tmem_layout(rows, kblocks)
    for s in range(steps):
        for j in range(nsf):
            for r in (0, 5, 37, 127):
                for q in range(4):
                    flat_mn = (r % 32) + 32 * (r // 32) + rows * q
                    # the atom (mode 0) at ((MN), (vec 0, sf j)) as its flat index, MMA s along K
                    want = cute(flat_mn + 4 * rows * vs * j, 0, s)
                    assert mine(r, s * nsf + j, q) == want, (s, j, r, q)
                    assert (want & 3) == mma_sf_id(kind, vs, s) + j
