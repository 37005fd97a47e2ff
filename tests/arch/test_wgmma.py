"""wgmma atoms: D and register-A fragments against the PTX ISA, SS layouts, descriptors."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.arch import get_atom, list_atoms
from hexlayout.arch.gmma import GmmaDescriptor, gmma_desc_addresses, gmma_smem_atom, make_gmma_desc
from hexlayout.layout import ComposedLayout, Layout, composition, tile_to_shape

from .ptx_model import tv_index_table, wgmma_a_reg_coord, wgmma_d_coord

WGMMA = list_atoms(kind="wgmma")


def test_all_n_and_types_listed() -> None:
    for n in range(8, 257, 8):
        for stem in ("F16F16F16", "F32F16F16", "F32BF16BF16"):
            assert f"SM90_64x{n}x16_{stem}_SS" in WGMMA and f"SM90_64x{n}x16_{stem}_RS" in WGMMA
        for acc in ("F16", "F32"):
            for a in ("E4M3", "E5M2"):
                for b in ("E4M3", "E5M2"):
                    assert f"SM90_64x{n}x32_{acc}{a}{b}_SS_TN" in WGMMA
    assert len(WGMMA) == 32 * (6 + 16)
    assert set(WGMMA) <= set(list_atoms("sm_90a", "mma"))
    assert not set(WGMMA) & set(list_atoms("sm_89"))


@pytest.mark.parametrize("n", [8, 16, 24, 64, 128, 200, 256])
@pytest.mark.parametrize("stem", ["F32F16F16", "F16F16F16", "F32BF16BF16"])
def test_d_fragment(n: int, stem: str) -> None:
    for src in ("SS", "RS"):
        atom = get_atom(f"SM90_64x{n}x16_{stem}_{src}")
        assert atom.num_threads == 128 and atom.shape_mnk == (64, n, 16)
        c = tv_index_table(atom.c_layout, 128)
        assert c.shape == (128, n // 2)
        for thr in range(128):
            for i in range(n // 2):
                row, col = wgmma_d_coord(thr, i)
                assert c[thr, i] == row + 64 * col
        assert sorted(c.reshape(-1)) == list(range(64 * n))
        assert atom.regs_c == (n // 2 if stem.startswith("F32") else n // 4)


@pytest.mark.parametrize("name", [n for n in WGMMA if "_RS" in n and n.split("x")[1] in ("8", "64", "256")])
def test_register_a_fragment(name: str) -> None:
    atom = get_atom(name)
    bits = atom.a_dtype.bits
    k = atom.shape_mnk[2]
    a = tv_index_table(atom.a_layout, 128)
    for thr in range(128):
        for i in range(a.shape[1]):
            m, kk = wgmma_a_reg_coord(bits, thr, i)
            assert a[thr, i] == m + 64 * kk
    assert sorted(a.reshape(-1)) == list(range(64 * k))
    assert atom.regs_a == 4 and atom.a_source == "rmem" and atom.b_source == "smem"


@pytest.mark.parametrize("n", [8, 96, 256])
def test_fp8_d_fragment(n: int) -> None:
    atom = get_atom(f"SM90_64x{n}x32_F32E4M3E5M2_SS_TN")
    assert atom.shape_mnk == (64, n, 32) and atom.regs_c == n // 2
    c = tv_index_table(atom.c_layout, 128)
    for thr in range(0, 128, 5):
        for i in range(n // 2):
            row, col = wgmma_d_coord(thr, i)
            assert c[thr, i] == row + 64 * col


def test_ss_layouts_and_ptx() -> None:
    atom = get_atom("SM90_64x128x16_F32BF16BF16_SS")
    assert str(atom.a_layout) == "(128,(64,16)):(0,(1,64))"
    assert str(atom.b_layout) == "(128,(128,16)):(0,(1,128))"
    assert str(atom.c_layout) == "((4,8,4),(2,2,16)):((128,1,16),(64,8,512))"
    assert atom.ptx == "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16"
    assert (atom.a_source, atom.b_source, atom.regs_a, atom.regs_b, atom.regs_c) == ("smem", "smem", 0, 0, 64)
    assert atom.archs == ("sm_90a",)
    assert atom.ptx_operands.endswith("1, 1, 0, 0")
    mn = get_atom("SM90_64x128x16_F32BF16BF16_SS", a_major="MN", b_major="MN")
    assert (mn.a_major, mn.b_major) == ("MN", "MN") and mn.ptx_operands.endswith("1, 1, 1, 1")
    assert mn.a_layout == atom.a_layout  # the TV layout is the same; the descriptor differs
    rs = get_atom("SM90_64x64x16_F16F16F16_RS", b_major="MN")
    assert str(rs.a_layout) == "((4,8,4),(2,2,2)):((128,1,16),(64,8,512))" and rs.regs_c == 16
    fp8 = get_atom("SM90_64x256x32_F32E4M3E4M3_SS_TN")
    assert fp8.ptx == "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3" and fp8.regs_c == 128
    assert str(fp8.a_layout) == "(128,(64,32)):(0,(1,64))"
    assert str(get_atom("SM90_64x8x32_F16E5M2E4M3_RS_TN").a_layout) == (
        "((4,8,4),(4,2,2)):((256,1,16),(64,8,1024))")


def test_major_option_errors() -> None:
    with pytest.raises(ValueError, match="K-major"):
        get_atom("SM90_64x64x32_F32E4M3E4M3_SS_TN", b_major="MN")
    with pytest.raises(ValueError, match="registers must be K-major"):
        get_atom("SM90_64x64x16_F32F16F16_RS", a_major="MN")
    with pytest.raises(ValueError, match="not one of"):
        get_atom("SM90_64x64x16_F32F16F16_SS", a_major="T")
    with pytest.raises(ValueError, match="unknown option"):
        get_atom("SM90_64x64x16_F32F16F16_SS", major="K")


def test_smem_atoms_match_cute() -> None:
    assert str(gmma_smem_atom(16, "K", 128)) == "Sw<3,3,3> o 0 o (8,64):(64,1)"
    assert str(gmma_smem_atom(16, "MN", 64)) == "Sw<2,3,3> o 0 o (32,8):(1,32)"
    assert str(gmma_smem_atom(8, "K", 32)) == "Sw<1,4,3> o 0 o (8,32):(32,1)"
    assert str(gmma_smem_atom(16, "K", 0).layout_b) == "(8,8):(8,1)"


def _block(tile: ComposedLayout, mn: int, k0: int, kw: int) -> ComposedLayout:
    inner = tile.layout_b
    block = composition(inner, Layout((mn, kw), (1, mn)))
    return ComposedLayout(tile.layout_a, tile.offset + inner((0, k0)), block)


@pytest.mark.parametrize("bits", [16, 8])
@pytest.mark.parametrize("major", ["K", "MN"])
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_descriptor_reproduces_tiles(bits: int, major: str, swizzle: int) -> None:
    """Tiles built from CuTe's atoms (tile_to_shape) are read back exactly through the descriptor
    for every wgmma K block (start address advanced inside the swizzle pattern)."""
    kw = 256 // bits
    mn = 128
    tile = tile_to_shape(gmma_smem_atom(bits, major, swizzle), (mn, 4 * kw))
    base = 7 * 1024
    for kb in range(4):
        blk = _block(tile, mn, kb * kw, kw)
        desc = make_gmma_desc(blk, major, bits, mn, kw, base_address=base)
        got = gmma_desc_addresses(desc, major, bits, mn, kw)
        offs = np.array([[int(tile((i, kb * kw + j))) for j in range(kw)] for i in range(mn)])
        want = base + offs * bits // 8
        np.testing.assert_array_equal(got, want)
        assert GmmaDescriptor.decode(desc.encode()) == desc


def test_known_descriptors() -> None:
    tile = tile_to_shape(gmma_smem_atom(16, "K", 128), (128, 64))
    d = make_gmma_desc(_block(tile, 128, 32, 16), "K", 16, 128, 16, base_address=0x400)
    fields = (d.start_address, d.leading_byte_offset, d.stride_byte_offset, d.swizzle)
    assert fields == (0x400 + 64, 16, 1024, 128)
    v = d.encode()
    assert v & 0x3FFF == (0x440 >> 4) and (v >> 32) & 0x3FFF == 64 and v >> 62 == 1
    tile = tile_to_shape(gmma_smem_atom(16, "MN", 128), (128, 16))
    d = make_gmma_desc(tile, "MN", 16, 128, 16)
    assert (d.leading_byte_offset, d.stride_byte_offset) == (1024, 2048)


def test_non_canonical_rejected() -> None:
    with pytest.raises(ValueError, match="not a canonical"):
        make_gmma_desc(Layout((64, 16), (16, 1)), "K", 16, 64, 16)  # plain row-major, rows 32 B apart
    with pytest.raises(ValueError, match="aligned"):
        make_gmma_desc(gmma_smem_atom(16, "K", 128), "K", 16, 8, 16, base_address=512)


def test_every_wgmma_atom() -> None:
    """All 704 wgmma atoms: D against the ISA formula (vectorized), A/B per source."""
    thr = np.arange(128)[:, None]
    for name in WGMMA:
        atom = get_atom(name)
        m, n, k = atom.shape_mnk
        i = np.arange(n // 2)[None, :]
        w, g, t = thr // 32, (thr % 32) >> 2, thr % 4
        row = 16 * w + g + 8 * ((i >> 1) & 1)
        col = 8 * (i >> 2) + 2 * t + (i & 1)
        np.testing.assert_array_equal(tv_index_table(atom.c_layout, 128), row + 64 * col, err_msg=name)
        assert atom.b_layout == Layout((128, (n, k)), (0, (1, n)))
        if atom.a_source == "smem":
            assert atom.a_layout == Layout((128, (64, k)), (0, (1, 64)))
        else:
            a = tv_index_table(atom.a_layout, 128)
            want = [[(lambda mk: mk[0] + 64 * mk[1])(wgmma_a_reg_coord(atom.a_dtype.bits, tt, ii))
                     for ii in range(a.shape[1])] for tt in range(128)]
            np.testing.assert_array_equal(a, np.array(want), err_msg=name)
