"""ldmatrix / stmatrix atoms against an independent model of their PTX semantics."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.arch import get_atom, list_atoms

from .ptx_model import ldmatrix_model, tv_index_table

LDSM = [(1, False, "SM75_U32x1_LDSM_N"), (2, False, "SM75_U32x2_LDSM_N"), (4, False, "SM75_U32x4_LDSM_N"),
        (1, True, "SM75_U16x2_LDSM_T"), (2, True, "SM75_U16x4_LDSM_T"), (4, True, "SM75_U16x8_LDSM_T")]
STSM = [(n, t, name.replace("SM75", "SM90").replace("LDSM", "STSM")) for n, t, name in LDSM]


def _preimage(layout_table: np.ndarray) -> dict[int, tuple[int, int]]:
    """bit -> (thread, value) of its lowest thread."""
    out: dict[int, tuple[int, int]] = {}
    nt, nv = layout_table.shape
    for t in range(nt - 1, -1, -1):
        for v in range(nv):
            out[int(layout_table[t, v])] = (t, v)
    return out


def _through_atom(rows_tab: np.ndarray, regs_tab: np.ndarray, mem16: np.ndarray, row_addr: np.ndarray,
                  num: int) -> np.ndarray:
    """What the atom's layouts say lane l holds in register j, half e: the register bit
    ``32j + 16e`` of lane l is reference bit r; the row thread/bit mapped to r says where it is read."""
    pre = _preimage(rows_tab)
    out = np.zeros((32, num, 2), dtype=mem16.dtype)
    for lane in range(32):
        for j in range(num):
            for e in range(2):
                r = int(regs_tab[lane, 32 * j + 16 * e])
                st, sv = pre[r]
                assert sv % 16 == 0
                out[lane, j, e] = mem16[row_addr[st] // 2 + sv // 16]
    return out


@pytest.mark.parametrize("num,trans,name", LDSM)
def test_ldmatrix_semantics(num: int, trans: bool, name: str) -> None:
    atom = get_atom(name)
    assert atom.kind == "ldmatrix" and atom.num_threads == 32
    assert atom.ptx == f"ldmatrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16"
    assert (atom.src_space, atom.dst_space, atom.access_bits, atom.alignment) == ("smem", "rmem", 128, 16)
    assert atom.bits_per_thread == 32 * num  # num 32-bit registers per lane
    rng = np.random.default_rng(num + 10 * trans)
    mem16 = np.arange(4096, dtype=np.int64)
    for _ in range(5):
        chunks = rng.permutation(4096 // 8)[:32]
        row_addr = chunks * 16  # byte addresses of 16-byte rows, all lanes given
        rows_tab = tv_index_table(atom.src_layout, 32)
        regs_tab = tv_index_table(atom.dst_layout, 32)
        got = _through_atom(rows_tab, regs_tab, mem16, row_addr, num)
        want = ldmatrix_model(mem16, row_addr, num, trans)
        np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("num,trans,name", STSM)
def test_stmatrix_semantics(num: int, trans: bool, name: str) -> None:
    atom = get_atom(name)
    assert atom.kind == "stmatrix" and atom.arch == "sm_90" and atom.archs == ("sm_90a", "sm_100a")
    assert atom.ptx == f"stmatrix.sync.aligned.m8n8.x{num}{'.trans' if trans else ''}.shared.b16"
    assert (atom.src_space, atom.dst_space) == ("rmem", "smem")
    ld = get_atom(name.replace("SM90", "SM75").replace("STSM", "LDSM"))
    assert atom.src_layout == ld.dst_layout and atom.dst_layout == ld.src_layout
    # stmatrix writes register element (lane, j, e) where ldmatrix would have read it
    rng = np.random.default_rng(7 + num)
    chunks = rng.permutation(512)[:32]
    row_addr = chunks * 16
    mem16 = np.arange(4096, dtype=np.int64)
    got = _through_atom(tv_index_table(atom.dst_layout, 32), tv_index_table(atom.src_layout, 32), mem16,
                        row_addr, num)
    np.testing.assert_array_equal(got, ldmatrix_model(mem16, row_addr, num, trans))


def test_only_first_lanes_address_rows() -> None:
    """.x1 uses lanes 0-7's addresses, .x2 lanes 0-15: the others repeat them (stride 0)."""
    for num, _, name in LDSM:
        rows = tv_index_table(get_atom(name).src_layout, 32)
        for lane in range(32):
            np.testing.assert_array_equal(rows[lane], rows[lane % (8 * num)])


def test_listed() -> None:
    copies = list_atoms(kind="ldmatrix")
    assert sorted(n for _, _, n in LDSM) == copies
    assert sorted(n for _, _, n in STSM) == list_atoms(kind="stmatrix")
    assert set(copies) <= set(list_atoms("sm_80", "copy"))
    assert not set(list_atoms(kind="stmatrix")) & set(list_atoms("sm_89"))
