"""mma.sync atoms (sm_80, sm_89) against the PTX ISA fragment formulas."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.arch import get_atom, list_atoms
from hexlayout.layout import Layout

from .ptx_model import mma_a_coord, mma_b_coord, mma_c_coord, tv_index_table

MMA_SYNC = list_atoms(kind="mma.sync")


def test_required_atoms_present() -> None:
    required = [
        "SM80_16x8x8_F16F16F16F16_TN", "SM80_16x8x8_F32F16F16F32_TN", "SM80_16x8x16_F16F16F16F16_TN",
        "SM80_16x8x16_F32F16F16F32_TN", "SM80_16x8x8_F32BF16BF16F32_TN", "SM80_16x8x16_F32BF16BF16F32_TN",
        "SM80_16x8x32_S32S8S8S32_TN", "SM89_16x8x32_F32E4M3E4M3F32_TN", "SM89_16x8x32_F32E4M3E5M2F32_TN",
        "SM89_16x8x32_F32E5M2E4M3F32_TN", "SM89_16x8x32_F32E5M2E5M2F32_TN",
    ]
    for name in required:
        assert name in MMA_SYNC
    assert not any("BF16BF16F16" in n for n in MMA_SYNC)  # bf16 accumulates in f32 only


@pytest.mark.parametrize("name", MMA_SYNC)
def test_fragments_match_ptx(name: str) -> None:
    atom = get_atom(name)
    m_, n_, k_ = atom.shape_mnk
    assert (m_, n_) == (16, 8) and atom.num_threads == 32
    a = tv_index_table(atom.a_layout, 32)
    b = tv_index_table(atom.b_layout, 32)
    c = tv_index_table(atom.c_layout, 32)
    for lane in range(32):
        for i in range(a.shape[1]):
            row, col = mma_a_coord(k_, atom.a_dtype.bits, lane, i)
            assert a[lane, i] == row + m_ * col, (name, "A", lane, i)
        for i in range(b.shape[1]):
            kk, nn = mma_b_coord(k_, atom.b_dtype.bits, lane, i)
            assert b[lane, i] == nn + n_ * kk, (name, "B", lane, i)
        for i in range(c.shape[1]):
            row, col = mma_c_coord(lane, i)
            assert c[lane, i] == row + m_ * col, (name, "C", lane, i)
    # every element of every tile is held exactly once
    for tab, size in ((a, m_ * k_), (b, n_ * k_), (c, m_ * n_)):
        assert sorted(tab.reshape(-1)) == list(range(size))


@pytest.mark.parametrize("name", MMA_SYNC)
def test_registers_and_ptx(name: str) -> None:
    atom = get_atom(name)
    assert atom.regs_a == atom.values_a * atom.a_dtype.bits // 32
    assert atom.regs_b == atom.values_b * atom.b_dtype.bits // 32
    assert atom.regs_c == atom.values_c * atom.c_dtype.bits // 32
    m, n, k = atom.shape_mnk
    d, a, b = atom.c_dtype.ptx, atom.a_dtype.ptx, atom.b_dtype.ptx
    assert atom.ptx == f"mma.sync.aligned.m{m}n{n}k{k}.row.col.{d}.{a}.{b}.{d}"
    assert atom.a_source == atom.b_source == "rmem"


def test_known_values() -> None:
    atom = get_atom("SM80_16x8x16_F32F16F16F32_TN")
    assert atom.shape_mnk == (16, 8, 16)
    assert atom.ptx == "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
    assert (atom.regs_a, atom.regs_b, atom.regs_c) == (4, 2, 4)
    assert str(atom.a_layout) == "((4,8),(2,2,2)):((32,1),(16,8,128))"
    assert str(atom.b_layout) == "((4,8),(2,2)):((16,1),(8,64))"
    assert str(atom.c_layout) == "((4,8),(2,2)):((32,1),(16,8))"
    assert atom.archs == ("sm_80", "sm_89", "sm_90a", "sm_100a")
    assert (atom.a_dtype.name, atom.b_dtype.name, atom.c_dtype.name, atom.d_dtype.name) == (
        "f16", "f16", "f32", "f32")
    f16acc = get_atom("SM80_16x8x16_F16F16F16F16_TN")
    assert f16acc.c_layout == atom.c_layout and f16acc.regs_c == 2  # two halves per register
    assert get_atom("SM80_16x8x8_F16F16F16F16_TN").regs_c == 2
    s8 = get_atom("SM80_16x8x32_S32S8S8S32_TN")
    assert s8.ptx == "mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32"
    assert (s8.regs_a, s8.regs_b, s8.regs_c) == (4, 2, 4)
    fp8 = get_atom("SM89_16x8x32_F32E4M3E5M2F32_TN")
    assert fp8.ptx == "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e5m2.f32"
    assert fp8.archs == ("sm_89", "sm_90a", "sm_100a") and fp8.arch == "sm_89"
    assert fp8.a_layout == s8.a_layout and fp8.b_layout == s8.b_layout


def test_atoms_are_cached_and_frozen() -> None:
    a = get_atom("SM80_16x8x16_F32F16F16F32_TN")
    assert a is get_atom("SM80_16x8x16_F32F16F16F32_TN")
    with pytest.raises(AttributeError):
        a.ptx = "x"  # type: ignore[misc]
    assert isinstance(a.a_layout, Layout)
    assert np.array_equal(a.thr_id.indices(), np.arange(32))
