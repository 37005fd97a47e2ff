"""Pictures: the cell data they are drawn from (checked against independent formulas),
and the files (valid PNG/SVG whose content shows the thread colours and labels)."""

from __future__ import annotations

import subprocess
import sys
import time
import xml.etree.ElementTree as ET
from pathlib import Path

import numpy as np
import pytest

from hexlayout.draw import (
    CUTE_TV_COLORS,
    atom_grid,
    column_chunk_phases,
    draw,
    draw_atom,
    draw_layout,
    draw_smem,
    draw_tv,
    layout_grid,
    smem_grid,
    thread_color,
    tv_grid,
    wavefronts,
)
from hexlayout.layout import Layout
from hexlayout.layout.parse import parse_layout

C_16x8 = "((4,8),(2,2)):((32,1),(16,8))"  # m16n8k* accumulator, (T,V) -> m + 16*n


def _arch():
    return pytest.importorskip("hexlayout.arch")


# --- cell data -------------------------------------------------------------------------

def test_layout_grid_row_major_values() -> None:
    g = layout_grid(parse_layout("(4,8):(8,1)"))
    assert g.shape == (4, 8)
    for i in range(4):
        for j in range(8):
            assert g.labels[i, j] == str(8 * i + j)
    assert "(4,8):(8,1)" in g.title


def test_layout_grid_rank1_is_one_row_and_higher_rank_groups_mode0_by_rest() -> None:
    g = layout_grid(Layout(8, 3))
    assert g.shape == (1, 8) and [g.labels[0, j] for j in range(8)] == [str(3 * j) for j in range(8)]
    # (2,3,4) compact: cell (i, j) = i + 2*j with j running over the 12 coordinates of (3,4).
    g = layout_grid(Layout((2, 3, 4)))
    assert g.shape == (2, 12)
    assert all(g.labels[i, j] == str(i + 2 * j) for i in range(2) for j in range(12))
    # Nested mode 0: ((2,2),3):((1,4),2) -> rows are the 4 coordinates of mode 0.
    g = layout_grid(parse_layout("((2,2),3):((1,4),2)"))
    assert g.shape == (4, 3)
    assert g.labels[3, 2] == str(1 + 4 + 2 * 2)


def test_tv_grid_matches_ptx_accumulator_fragment() -> None:
    g = tv_grid(parse_layout(C_16x8), (16, 8))
    assert g.shape == (16, 8)
    seen = set()
    for lane in range(32):
        grp, t = lane >> 2, lane % 4
        for i in range(4):  # PTX ISA: row = g + 8*(i >= 2), col = 2t + (i & 1)
            row, col = grp + 8 * (i >= 2), 2 * t + (i & 1)
            assert g.labels[row, col] == f"T{lane}\nV{i}"
            assert g.keys[row, col] == lane
            assert tuple(g.colors[row, col]) == pytest.approx(np.array(CUTE_TV_COLORS[lane % 8]) / 255)
            seen.add((row, col))
    assert len(seen) == 16 * 8


def test_thread_colours_cycle_every_eight_threads() -> None:
    assert thread_color(0) == thread_color(8) == thread_color(24)
    assert len({thread_color(t) for t in range(8)}) == 8
    assert thread_color(0) == (175 / 255, 175 / 255, 1.0)


def test_tv_grid_marks_unowned_cells_empty() -> None:
    # 4 threads, 1 value each, over a 2x4 tile: columns 0 and 1 only.
    g = tv_grid(Layout((4, 1), (1, 0)), (2, 4))
    assert g.labels[1, 1] == "T3\nV0"
    assert g.labels[0, 2] == "" and g.keys[0, 2] == -1
    assert tuple(g.colors[0, 2]) == (1.0, 1.0, 1.0)


def _swizzled_offset(r: int, c: int) -> int:
    """Sw<3,3,3> o (8,64):(64,1) written out: the 16-byte chunk index XOR the row."""
    return 64 * r + 8 * ((c // 8) ^ (r % 8)) + c % 8


def test_smem_grid_swizzle_offsets_banks_chunks() -> None:
    g = smem_grid(parse_layout("Sw<3,3,3> o 0 o (8,64):(64,1)"), elem_bits=16)
    assert g.shape == (8, 64)
    for r in range(8):
        for c in range(64):
            off = _swizzled_offset(r, c)
            assert g.labels[r, c] == str(off)
            assert g.keys[r, c] == (off * 2 // 4) % 32
    g = smem_grid(parse_layout("Sw<3,3,3> o 0 o (8,64):(64,1)"), elem_bits=16, label="chunk")
    assert g.labels[3, 9] == str((64 * 3 + 8 * (1 ^ 3)) // 8)
    g32 = smem_grid(parse_layout("(4,32):(32,1)"), elem_bits=32, label="bank")
    # 32 words per row: row 1 starts at bank 0 again.
    assert [g32.labels[1, j] for j in range(3)] == ["0", "1", "2"]


def test_smem_access_wavefronts_and_row_groups() -> None:
    phases = column_chunk_phases(8, 8, chunk=0)
    assert len(phases) == 1 and len(phases[0]) == 64
    plain = smem_grid(parse_layout("(8,64):(64,1)"), 16, access=phases)
    swz = smem_grid(parse_layout("Sw<3,3,3> o 0 o (8,64):(64,1)"), 16, access=phases)
    assert plain.meta["wavefronts"] == [8]  # every row's chunk 0 is in banks 0-3
    assert swz.meta["wavefronts"] == [1]
    assert plain.row_notes == ["groups 0"] * 8
    assert swz.row_notes == [f"groups {r}" for r in range(8)]
    assert plain.highlight is not None and int(plain.highlight.sum()) == 64
    assert "8 wavefronts" in plain.footer and "1 wavefront" in swz.footer


def test_wavefronts_basic_cases() -> None:
    assert wavefronts([4 * i for i in range(32)], 4) == 1  # 32 consecutive words
    assert wavefronts([128 * i for i in range(32)], 4) == 32  # one bank, 32 words
    assert wavefronts([0] * 32, 4) == 1  # broadcast
    assert wavefronts([0, 2], 2) == 1  # same word
    assert wavefronts([], 4) == 0


def test_wavefronts_agree_with_arch_bank_model() -> None:
    arch = _arch()
    rng = np.random.default_rng(0)
    for _ in range(50):
        rows = rng.integers(0, 64, size=8) * 16
        assert wavefronts(rows, 16) == arch.bank_conflicts(rows, 16).wavefronts


def test_atom_grid_mma_a_b_c_match_ptx_fragments() -> None:
    arch = _arch()
    atom = arch.get_atom("SM80_16x8x16_F32F16F16F32_TN")
    a, b, c = (atom_grid(atom, op) for op in "abc")
    assert a.shape == (16, 16) and b.shape == (16, 8) and c.shape == (16, 8)  # B drawn K x N
    assert "K x N" in b.title and atom.name in b.title
    for lane in range(32):
        g, t = lane >> 2, lane % 4
        for i in range(8):
            row, col = g + 8 * ((i >> 1) & 1), 2 * t + (i & 1) + 8 * (i >= 4)
            assert a.labels[row, col] == f"T{lane}\nV{i}"
        for i in range(4):
            k, n = 2 * t + (i & 1) + 8 * (i >= 2), g
            assert b.labels[k, n] == f"T{lane}\nV{i}"
            assert c.labels[g + 8 * (i >= 2), 2 * t + (i & 1)] == f"T{lane}\nV{i}"


def test_atom_grid_ldmatrix_dst_in_16bit_elements() -> None:
    arch = _arch()
    g = atom_grid(arch.get_atom("SM75_U32x4_LDSM_N"), "dst", elem_bits=16)
    assert g.shape == (32, 8)  # 4 matrices of 8 rows x 8 16-bit elements, 16-byte rows
    for lane in range(32):
        for j in range(4):  # register j of lane l: row l/4, cols 2(l%4), 2(l%4)+1 of matrix j
            for e in range(2):
                assert g.meta["threads"][8 * j + lane // 4, 2 * (lane % 4) + e] == lane
    with pytest.raises(ValueError, match="src or dst"):
        atom_grid(arch.get_atom("SM75_U32x4_LDSM_N"), "a")
    with pytest.raises(ValueError, match="a, b, c"):
        atom_grid(arch.get_atom("SM80_16x8x16_F32F16F16F32_TN"), "src")


# --- files ------------------------------------------------------------------------------

def _rgb_set(path: Path) -> set[tuple[int, int, int]]:
    from PIL import Image

    with Image.open(path) as im:
        im.load()
        arr = np.asarray(im.convert("RGB")).reshape(-1, 3).astype(np.int64)
    packed = np.unique((arr[:, 0] << 16) | (arr[:, 1] << 8) | arr[:, 2])
    return {(int(v >> 16), int((v >> 8) & 255), int(v & 255)) for v in packed}


def test_tv_png_is_valid_and_shows_all_eight_thread_colours(tmp_path: Path) -> None:
    from PIL import Image

    out = draw_tv(parse_layout(C_16x8), (16, 8), tmp_path / "c.png")
    with Image.open(out) as im:
        assert im.format == "PNG"
        w, h = im.size
        assert 300 < w < 3000 and 300 < h < 3000
        assert h > w  # 16 rows x 8 columns
    colours = _rgb_set(out)
    assert all(c in colours for c in CUTE_TV_COLORS)


def test_plain_layout_png_differs_from_tv_png(tmp_path: Path) -> None:
    p1 = draw_layout(parse_layout("(4,8):(8,1)"), tmp_path / "l.png")
    colours = _rgb_set(p1)
    assert not any(c in colours for c in CUTE_TV_COLORS[:4])  # grey shades, not thread colours
    assert len(colours) > 4


def test_svg_parses_and_contains_labels(tmp_path: Path) -> None:
    out = draw_tv(parse_layout(C_16x8), (16, 8), tmp_path / "c.svg")
    root = ET.parse(out).getroot()
    assert root.tag.endswith("svg")
    texts = [t.text for t in root.iter() if t.tag.endswith("text") and t.text]
    assert texts.count("T5") == 4 and "V3" in texts
    assert any(C_16x8 in t for t in texts)


def test_smem_png_and_dispatch(tmp_path: Path) -> None:
    out = draw("Sw<2,3,3> o 0 o (4,32):(32,1)", tmp_path / "s.png")  # dispatch: swizzled -> smem, 16-bit
    assert len(_rgb_set(out)) > 16  # 16 banks used
    out = draw_smem(parse_layout("(8,64):(64,1)"), tmp_path / "sub" / "p.svg",
                    access=column_chunk_phases(8, 8), label="chunk")
    texts = [t.text for t in ET.parse(out).getroot().iter() if t.tag.endswith("text") and t.text]
    assert "groups 0" in texts and any("8 wavefronts" in t for t in texts)
    assert texts.count("41") == 1  # chunk 41 (row 5, columns 8-15) labelled once over its 8 cells


def test_draw_atom_by_name(tmp_path: Path) -> None:
    _arch()
    out = draw_atom("SM80_16x8x16_F32F16F16F32_TN", "a", tmp_path / "a.png")
    assert all(c in _rgb_set(out) for c in CUTE_TV_COLORS)


def test_large_tile_is_fast_and_unlabelled(tmp_path: Path) -> None:
    from PIL import Image

    t = time.perf_counter()
    out = draw_tv(parse_layout("(128,32):(1,128)"), (64, 64), tmp_path / "big.png")
    assert time.perf_counter() - t < 5
    with Image.open(out) as im:
        assert max(im.size) <= 2500
    svg = draw_tv(parse_layout("(128,32):(1,128)"), (64, 64), tmp_path / "big.svg")
    texts = [t.text for t in ET.parse(svg).getroot().iter() if t.tag.endswith("text") and t.text]
    assert not any(t.startswith("T1") and t[1:].isdigit() for t in texts)
    assert any("labels omitted" in t for t in texts)


def test_bad_suffix_is_a_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="suffix"):
        draw_layout(Layout(4), tmp_path / "x.jpg")


def test_importing_draw_does_not_import_matplotlib() -> None:
    code = "import sys, hexlayout.draw; print('matplotlib' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
