"""sm_100a: tcgen05.mma atoms, instruction / shared-memory descriptors, TMEM layouts and rules.

The TMEM fragment models below are written from the PTX ISA's figures "Matrix fragment for
tcgen05.ld/st .32x32b / .16x64b / .16x128b / .16x256b / .16x32bx2" (as tabulated per lane and
register), independently of the CuTe layouts they check.
"""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.arch import get_arch, get_atom, list_atoms
from hexlayout.arch.dtypes import BF16, E4M3, E5M2, F16, F32
from hexlayout.arch.gmma import gmma_smem_atom, make_gmma_desc
from hexlayout.arch.sm100 import umma_n_values
from hexlayout.arch.tcgen05 import InstrDescriptor, UmmaDescriptor, make_umma_desc, umma_desc_addresses
from hexlayout.arch.tmem import (
    TMEM_SHAPES,
    accumulator_layout,
    check_alloc_columns,
    lane_quarter,
    tmem_copy_layout,
    tmem_ld_ptx,
)
from hexlayout.layout import ComposedLayout, Layout, composition, tile_to_shape

from .ptx_model import tv_index_table

UMMA = list_atoms(kind="tcgen05")


def test_sm100a_target_and_atoms_listed() -> None:
    a = get_arch("sm_100a")
    assert a.compute_capability == (10, 0) and a.has_tcgen05 and a.has_tma and not a.has_wgmma
    assert not get_arch("sm_90a").has_tcgen05
    # shapes: cta_group::1 M=64 (N%8), M=128 (N%16); cta_group::2 M=128 (N%32), M=256 (N%16)
    assert (len(umma_n_values(1, 64)), len(umma_n_values(1, 128)), len(umma_n_values(2, 128)),
            len(umma_n_values(2, 256))) == (32, 16, 8, 16)
    # dense: 72 shapes x 6 type combinations x SS/TS; block-scaled: 48 shapes x (4 mxf8f6f4 x SS/TS + 4 FP4)
    assert len(UMMA) == 72 * 6 * 2 + (32 + 16) * (4 * 2 + 4)
    assert set(UMMA) <= set(list_atoms("sm_100a", "mma"))
    assert not set(UMMA) & set(list_atoms("sm_90a")) and not set(UMMA) & set(list_atoms("sm_80"))
    assert not set(list_atoms(kind="wgmma")) & set(list_atoms("sm_100a"))  # Blackwell has no wgmma
    assert set(list_atoms("sm_80", "mma")) < set(list_atoms("sm_100a", "mma"))
    for name in ("SM100_64x8x16_F32F16F16_SS", "SM100_128x256x16_F32BF16BF16_TS",
                 "SM100_2x1SM_128x32x32_F32E4M3E5M2_SS", "SM100_2x1SM_256x256x32_F32E5M2E5M2_TS"):
        assert name in UMMA
    for bad in ("SM100_128x8x16_F32F16F16_SS", "SM100_2x1SM_128x48x16_F32F16F16_SS",
                "SM100_256x128x16_F32F16F16_SS"):
        assert bad not in UMMA


def test_atom_layouts_and_ptx() -> None:
    one = get_atom("SM100_128x256x16_F32BF16BF16_SS")
    assert one.kind == "tcgen05" and one.archs == ("sm_100a",) and one.num_threads == 1
    assert str(one.a_layout) == "(1,(128,16)):(0,(1,128))" and str(one.b_layout) == "(1,(256,16)):(0,(1,256))"
    assert str(one.c_layout) == "(1,(128,256)):(0,(1,128))"
    assert (one.a_source, one.b_source, one.c_source) == ("smem", "smem", "tmem")
    assert (one.regs_c, one.cta_group) == (0, 1)
    assert one.ptx == "tcgen05.mma.cta_group::1.kind::f16"
    assert one.ptx_operands == "[d_tmem], a_desc, b_desc, idesc, enable_input_d"
    pair = get_atom("SM100_2x1SM_256x128x32_F32E4M3E4M3_TS")
    assert pair.ptx == "tcgen05.mma.cta_group::2.kind::f8f6f4" and pair.num_threads == 2
    assert pair.shape_mnk == (256, 128, 32) and pair.a_source == "tmem"
    # each CTA of the pair holds half of A's, B's and D's rows
    assert str(pair.a_layout) == "(2,(128,32)):(128,(1,256))"
    assert str(pair.b_layout) == "(2,(64,32)):(64,(1,128))"
    assert str(pair.c_layout) == "(2,(128,128)):(128,(1,256))"
    for atom in (one, pair):
        assert sorted(atom.c_layout.indices()) == list(range(atom.m * atom.n))
    mn = get_atom("SM100_64x64x16_F32F16F16_SS[a_major=MN,b_major=MN]")
    assert (mn.a_major, mn.b_major) == ("MN", "MN")
    with pytest.raises(ValueError, match="tensor memory is K-major"):
        get_atom("SM100_128x64x16_F32F16F16_TS", a_major="MN")


def test_instruction_descriptor_bits() -> None:
    """Bits per the PTX ISA table: D format [4,6), A [7,10), B [10,13), majors 15/16, N>>3 at
    [17,23), M>>4 at [24,29)."""
    d = InstrDescriptor(BF16, BF16, F32, 128, 256)
    assert d.encode() == (1 << 4) | (1 << 7) | (1 << 10) | (32 << 17) | (8 << 24) == 0x08400490
    assert InstrDescriptor(F16, F16, F32, 64, 8).encode() == (1 << 4) | (1 << 17) | (4 << 24)
    fp8 = InstrDescriptor(E4M3, E5M2, F32, 256, 16, a_major="K", b_major="MN", negate_a=True)
    assert fp8.encode() == (1 << 4) | (0 << 7) | (1 << 10) | (1 << 13) | (1 << 16) | (2 << 17) | (16 << 24)
    for desc in (d, fp8, InstrDescriptor(F16, F16, F16, 128, 16, a_major="MN", saturate=True)):
        assert InstrDescriptor.decode(desc.encode(), desc.kind) == desc
    with pytest.raises(ValueError, match="not one kind"):
        InstrDescriptor(BF16, E4M3, F32, 128, 64).encode()


@pytest.mark.parametrize("major", ["K", "MN"])
@pytest.mark.parametrize("swizzle", [0, 32, 64, 128])
def test_smem_descriptor(major: str, swizzle: int) -> None:
    """The sm_100a descriptor reads the bytes of CuTe's canonical layouts; layout type at bits
    61..63 (0 none, 2 128B, 4 64B, 6 32B) and the fixed version 1 at bit 46."""
    tile = tile_to_shape(gmma_smem_atom(16, major, swizzle), (128, 64))
    base, k0 = 3 * 1024, 16  # the second K=16 block of the tile: one kind::f16 MMA's operand
    block = ComposedLayout(tile.layout_a, tile.offset + tile.layout_b((0, k0)),
                           composition(tile.layout_b, Layout((128, 16), (1, 128))))
    desc = make_umma_desc(block, major, 16, 128, 16, base_address=base)
    offs = np.array([[int(tile((i, k0 + j))) for j in range(16)] for i in range(128)])
    np.testing.assert_array_equal(umma_desc_addresses(desc, major, 16, 128, 16), base + 2 * offs)
    value = desc.encode()
    assert (value >> 46) & 3 == 1 and value >> 61 == {0: 0, 32: 6, 64: 4, 128: 2}[swizzle]
    assert UmmaDescriptor.decode(value) == desc
    g = make_gmma_desc(block, major, 16, 128, 16, base_address=base)
    assert value & ((1 << 46) - 1) == g.encode() & ((1 << 46) - 1)  # same address fields as wgmma's


def test_smem_descriptor_errors() -> None:
    assert UmmaDescriptor(0, 16, 1024, "128B_BASE32B").encode() >> 61 == 1
    with pytest.raises(ValueError, match="version"):
        UmmaDescriptor.decode(0)
    with pytest.raises(ValueError, match="multiple of 16"):
        UmmaDescriptor(8, 16, 1024).encode()


def _tmem_cell(shape: str, num: int, lane: int, r: int) -> tuple[int, int]:
    """(TMEM lane, 32-bit column) of register ``r`` of thread ``lane`` (PTX ISA figures):
    32x32b "thread i of the warp accesses lane i, one column per register";
    16x64b "threads 0,1 / 2,3 hold lanes 0 and 8 of columns 0 / 1, each 4 threads one lane further";
    16x128b "threads 4i..4i+3 hold lane i (r even) or i+8 (r odd), columns 0..3, then the next 4";
    16x256b "as the m16n8 accumulator: lane i / i+8 (registers 2,3), columns 2(t%4), 2(t%4)+1";
    16x32bx2 "threads 0..15 lanes 0..15 of the first half, threads 16..31 of the second half"."""
    if shape == "32x32b":
        return lane, r
    if shape == "16x64b":
        return lane // 4 + 8 * (lane % 2), (lane // 2) % 2 + 2 * r
    if shape == "16x128b":
        return lane // 4 + 8 * (r % 2), lane % 4 + 4 * (r // 2)
    if shape == "16x256b":
        return lane // 4 + 8 * ((r // 2) % 2), r % 2 + 2 * (lane % 4) + 8 * (r // 4)
    return lane % 16, r + num * (lane // 16)


@pytest.mark.parametrize("shape", list(TMEM_SHAPES))
def test_tmem_copy_layouts_match_ptx_figures(shape: str) -> None:
    s = TMEM_SHAPES[shape]
    for num in (1, 4, s.nums[-1]):
        tv = tv_index_table(tmem_copy_layout(shape, num), 32)
        assert tv.shape == (32, s.regs * num)
        for lane in range(32):
            for r in range(s.regs * num):
                row, col = _tmem_cell(shape, num, lane, r)
                assert tv[lane, r] == row + s.lanes * col, (shape, num, lane, r)
        assert sorted(tv.reshape(-1)) == list(range(s.lanes * s.columns * num))
    assert s.nums[-1] * s.regs == 128
    assert tmem_ld_ptx(shape, 2) == f"tcgen05.ld.sync.aligned.{shape}.x2.b32"
    with pytest.raises(ValueError, match="not one of"):
        tmem_copy_layout(shape, 3)


def test_accumulator_layouts() -> None:
    """M=128 (and 128 rows per CTA of M=256): row i in lane i; M=64: the first 16 lanes of each
    warp's quarter; cta_group::2 M=128: 64 rows per CTA, the second half of N in lanes 64..127."""
    dp = 1 << 16
    for (m, group), lanes in (((128, 1), range(128)), ((256, 2), range(128)),
                              ((64, 1), [32 * q + i for q in range(4) for i in range(16)]),
                              ((128, 2), range(128))):
        n = 64
        lay = accumulator_layout(m, n, group)
        addr = np.asarray(lay.indices())
        assert len(set(addr.tolist())) == addr.size  # one cell per element
        assert sorted(set((addr // dp).tolist())) == list(lanes)
        assert (addr % dp).max() < (n // 2 if (m, group) == (128, 2) else n)
    m64 = accumulator_layout(64, 32)
    assert m64((17, 5)) == (32 + 1) * dp + 5
    assert accumulator_layout(128, 32, 2)((3, 20)) == (64 + 3) * dp + 4


def test_alloc_rules_and_lane_quarters() -> None:
    for ok in (32, 64, 128, 256, 512):
        check_alloc_columns(ok)
    for bad in (16, 48, 96, 1024):
        with pytest.raises(ValueError, match="power of two"):
            check_alloc_columns(bad)
    with pytest.raises(ValueError, match="exceed the 512 columns"):
        check_alloc_columns(256, in_use=384)
    assert lane_quarter(0) == range(0, 32) and lane_quarter(6) == range(64, 96)


def test_tcgen05_sync_and_management_ptx() -> None:
    from hexlayout.arch.tcgen05_ops import TCGEN05_OPS, tcgen05_ptx

    assert tcgen05_ptx("alloc", 2) == "tcgen05.alloc.cta_group::2.sync.aligned.shared::cta.b32"
    assert tcgen05_ptx("commit") == "tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64"
    assert tcgen05_ptx("wait_ld") == "tcgen05.wait::ld.sync.aligned"
    assert tcgen05_ptx("fence_after") == "tcgen05.fence::after_thread_sync"
    assert TCGEN05_OPS["commit"].scope == "thread" and TCGEN05_OPS["dealloc"].scope == "warp"
    with pytest.raises(ValueError, match="unknown op"):
        tcgen05_ptx("arrive")
