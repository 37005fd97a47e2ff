"""get_atom / list_atoms / get_arch: lookups, errors, per-architecture facts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from hexlayout.arch import CopyAtom, MmaAtom, get_arch, get_atom, list_atoms


def test_unknown_atom_lists_close_matches() -> None:
    with pytest.raises(ValueError) as e:
        get_atom("SM80_16x8x16_F32F16F16F32_NT")
    assert "SM80_16x8x16_F32F16F16F32_TN" in str(e.value) and "close matches" in str(e.value)
    with pytest.raises(ValueError, match="unknown atom 'nonsense'"):
        get_atom("nonsense")
    with pytest.raises(ValueError, match="SM90_64x128x16_F32BF16BF16_SS"):
        get_atom("SM90_64x128x16_F32BF16BF16_S")


def test_unknown_option() -> None:
    with pytest.raises(ValueError, match="unknown option.*allowed: none"):
        get_atom("SM80_16x8x16_F32F16F16F32_TN", a_major="MN")


def test_list_atoms_filters() -> None:
    everything = list_atoms()
    assert everything == sorted(everything) and len(everything) > 700
    mma80 = list_atoms("sm_80", "mma")
    assert all(n.startswith("SM80_") for n in mma80)
    mma90 = list_atoms("sm_90a", "mma")
    assert set(mma80) < set(mma90) and set(list_atoms("sm_89", "mma")) < set(mma90)
    assert any(n.startswith("SM89_") for n in list_atoms("sm_89"))
    copies = list_atoms(kind="copy")
    assert all(isinstance(get_atom(n), CopyAtom) for n in copies)
    assert all(isinstance(get_atom(n), MmaAtom) for n in list_atoms(kind="mma.sync"))
    with pytest.raises(ValueError, match="unknown atom kind"):
        list_atoms(kind="mmma")
    with pytest.raises(ValueError, match="sm_80, sm_89, sm_90a, sm_100a"):
        list_atoms("sm_70")


@pytest.mark.parametrize("name", list_atoms(kind="copy"))
def test_every_copy_atom_consistent(name: str) -> None:
    atom = get_atom(name)
    bits = atom.ref_layout.size()
    # both sides cover the same reference bits (ldmatrix's row side repeats rows: stride 0)
    assert set(atom.src_layout.indices()) == set(atom.dst_layout.indices()) == set(range(bits))
    assert atom.bits_per_thread * atom.num_threads == atom.ref_layout.size()
    assert atom.alignment * 8 <= max(atom.access_bits, 1024) and atom.ptx


def test_arch_facts() -> None:
    a80, a89, a90 = get_arch("sm_80"), get_arch("sm89"), get_arch("SM_90A")
    for a in (a80, a89, a90):
        assert (a.num_banks, a.bank_bytes, a.warp_size, a.max_regs_per_thread) == (32, 4, 32, 255)
        assert a.regs_per_sm == 65536 and a.max_threads_per_block == 1024
        assert a.has_cp_async and a.has_ldmatrix
        assert a.smem_per_block_max < a.smem_per_sm
    assert (a80.smem_per_sm, a80.smem_per_block_max) == (164 * 1024, 163 * 1024)
    assert (a89.smem_per_sm, a89.smem_per_block_max) == (100 * 1024, 99 * 1024)
    assert (a90.smem_per_sm, a90.smem_per_block_max) == (228 * 1024, 227 * 1024)
    assert not a80.has_wgmma and not a80.has_tma and not a80.has_stmatrix and not a80.has_fp8_mma
    assert a89.has_fp8_mma and not a89.has_wgmma
    assert a90.has_wgmma and a90.has_tma and a90.has_stmatrix and a90.has_clusters
    assert a90.max_warps_per_sm == 64 and a89.max_warps_per_sm == 48
    assert set(a80.mma_atoms()) < set(a90.mma_atoms())  # sm_90a includes the sm_80 atoms
    assert "SM90_TMA_LOAD" in a90.copy_atoms() and "SM90_TMA_LOAD" not in a80.copy_atoms()
    assert a90.offers("SM80_16x8x16_F32F16F16F32_TN") and not a80.offers("SM90_64x64x16_F32F16F16_SS")


def test_unknown_arch() -> None:
    with pytest.raises(ValueError, match="not supported: the builds are sm_80, sm_89, sm_90a, sm_100a"):
        get_arch("sm_110a")


@pytest.mark.parametrize(("name", "words"), [
    ("sm_86", ["'sm_86' has no build of its own", "the sm_80 build runs on sm_86", "use 'sm_80'"]),
    ("sm87", ["the sm_80 build runs on sm_87", "use 'sm_80'"]),
    ("sm_90", ["the sm_90a build runs on sm_90", "use 'sm_90a'"]),
    ("sm_100", ["the sm_100a build runs on sm_100", "use 'sm_100a'"]),
    ("sm_120", ["'sm_120' is not supported", "the builds are sm_80, sm_89, sm_90a, sm_100a",
                "none runs on sm_120"]),
    ("sm_75", ["'sm_75' is not supported", "needs sm_80 or newer"]),
    ("gfx90a", ["unknown architecture 'gfx90a'", "sm_80, sm_89, sm_90a, sm_100a"]),
])
def test_unsupported_arch_names_the_build_that_runs_there(name: str, words: list[str]) -> None:
    """An arch without a build of its own says which build runs there (sm_86 / sm_87: sm_80;
    sm_90: sm_90a), or that none does and which builds exist, in every arch parser of the API."""
    from hexlayout.arch.registry import list_atoms
    from hexlayout.arch.targets import UnsupportedArchError, check_arch_name
    from hexlayout.errors import HexlayoutError

    for parse in (check_arch_name, get_arch, lambda a: list_atoms(arch=a)):
        with pytest.raises(UnsupportedArchError) as e:
            parse(name)
        assert isinstance(e.value, ValueError) and isinstance(e.value, HexlayoutError)
        for w in words:
            assert w in str(e.value), str(e.value)
    assert check_arch_name("SM89") == "sm_89" and get_arch("sm_89").name == "sm_89"


def test_import_is_light() -> None:
    code = ("import sys, time; t = time.perf_counter(); import hexlayout.layout, hexlayout.arch; "
            "dt = time.perf_counter() - t; "
            "assert not any(m in sys.modules for m in ('torch', 'matplotlib', 'cuda')), 'heavy import'; "
            "print(dt)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert float(out.stdout) < 0.5  # 0.2 s target; generous for loaded CI machines
