"""One-thread copy atoms and TMA atoms: bit widths, PTX, constraints."""

from __future__ import annotations

import pytest

from hexlayout.arch import get_atom, list_atoms


@pytest.mark.parametrize("bits", [8, 16, 32, 64, 128])
def test_universal_copy_widths(bits: int) -> None:
    atom = get_atom(f"UniversalCopy_U{bits}")
    assert atom is get_atom(f"UniversalCopy<uint{bits}_t>")
    assert atom.num_threads == 1 and atom.bits_per_thread == bits and atom.access_bits == bits
    assert str(atom.src_layout) == f"(1,{bits}):(0,1)" and atom.dst_layout == atom.src_layout
    assert atom.alignment == bits // 8
    assert set(atom.archs) == {"sm_80", "sm_89", "sm_90a", "sm_100a"}


def test_universal_copy_ptx_per_space() -> None:
    assert get_atom("UniversalCopy_U128").ptx == "ld.global.v4.b32"
    assert get_atom("UniversalCopy_U64", src="rmem", dst="gmem").ptx == "st.global.v2.b32"
    assert get_atom("UniversalCopy_U32", src="smem", dst="rmem").ptx == "ld.shared.b32"
    assert get_atom("UniversalCopy_U128", src="rmem", dst="smem").ptx == "st.shared.v4.b32"
    assert get_atom("UniversalCopy_U16", src="rmem", dst="smem").ptx == "st.shared.b16"
    with pytest.raises(ValueError, match="src="):
        get_atom("UniversalCopy_U32", src="lmem")


@pytest.mark.parametrize("name,bits,cache", [
    ("SM80_CP_ASYNC_CACHEALWAYS_U32", 32, "ca"), ("SM80_CP_ASYNC_CACHEALWAYS_U64", 64, "ca"),
    ("SM80_CP_ASYNC_CACHEALWAYS_U128", 128, "ca"), ("SM80_CP_ASYNC_CACHEGLOBAL_U128", 128, "cg"),
    ("SM80_CP_ASYNC_CACHEALWAYS_ZFILL_U64", 64, "ca"), ("SM80_CP_ASYNC_CACHEGLOBAL_ZFILL_U128", 128, "cg"),
])
def test_cp_async(name: str, bits: int, cache: str) -> None:
    atom = get_atom(name)
    assert atom.kind == "cp.async" and atom.num_threads == 1 and atom.bits_per_thread == bits
    assert (atom.src_space, atom.dst_space, atom.alignment) == ("gmem", "smem", bits // 8)
    assert atom.ptx == f"cp.async.{cache}.shared.global.L2::128B"
    assert atom.ptx_operands.startswith(f"[dst], [src], {bits // 8}")
    assert atom.ptx_operands.endswith("src_size") == ("ZFILL" in name)
    assert atom.archs == ("sm_80", "sm_89", "sm_90a", "sm_100a")


def test_cp_async_cg_only_16_bytes() -> None:
    names = list_atoms(kind="cp.async")
    assert "SM80_CP_ASYNC_CACHEGLOBAL_U64" not in names and "SM80_CP_ASYNC_CACHEGLOBAL_U32" not in names
    assert len(names) == 8
    assert get_atom("SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>").name == "SM80_CP_ASYNC_CACHEGLOBAL_U128"
    with pytest.raises(ValueError, match="close matches: SM80_CP_ASYNC_CACHE"):
        get_atom("SM80_CP_ASYNC_CACHEGLOBAL<uint64_t>")


def test_tma_atoms() -> None:
    ld = get_atom("SM90_TMA_LOAD", rank=3, bits=64 * 64 * 16)
    assert ld.ptx == "cp.async.bulk.tensor.3d.shared::cluster.global.mbarrier::complete_tx::bytes"
    assert (ld.src_space, ld.dst_space, ld.num_threads, ld.bits_per_thread) == ("gmem", "smem", 1, 65536)
    st = get_atom("SM90_TMA_STORE")
    assert st.ptx == "cp.async.bulk.tensor.2d.global.shared::cta.bulk_group"
    assert st.archs == ("sm_90a", "sm_100a") and "SM90_TMA_LOAD" not in list_atoms("sm_80")
    with pytest.raises(ValueError, match="rank 6"):
        get_atom("SM90_TMA_LOAD", rank=6)
