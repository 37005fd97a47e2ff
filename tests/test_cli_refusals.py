"""Bad input to ``hexlayout draw`` / ``explain`` / ``compile`` is refused with one line naming the
argument (exit status 1, no traceback): huge layouts (before anything is allocated), invalid
``--elem-bits``, ``-D`` constants of the wrong type, output files that cannot be written."""

from __future__ import annotations

import resource
import subprocess
import sys
from pathlib import Path

import pytest

import hexlayout.draw as hd
from hexlayout.cli import main
from hexlayout.draw import DrawError, DrawOutputError
from hexlayout.layout.parse import parse_layout

ROOT = Path(__file__).resolve().parents[1]
MEMORY_LIMIT = 3 << 30  # bytes of address space for a child run (the huge layouts need tens of GB)


def _limit_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _run(*args: str, limit_memory: bool = False) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hexlayout", *args], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, preexec_fn=_limit_memory if limit_memory else None)


def _refused(out: subprocess.CompletedProcess[str], *needles: str) -> str:
    """The one-line error of a refused command; it must contain every needle."""
    assert out.returncode == 1, (out.returncode, out.stdout, out.stderr)
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1, out.stderr
    assert "Traceback" not in out.stderr
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


# --- huge layouts -------------------------------------------------------------------------

@pytest.mark.parametrize("layout, extra", [
    ("(100000,100000):(1,100000)", []),                       # 10^10 cells
    ("(4096,4096):(4096,1)", ["--elem-bits", "16"]),          # a shared-memory tile of 16M cells
    ("(1048576):(1)", []),                                    # one row of a million cells
    ("((32,1000000),4):((1,32),0)", ["--tile", "64x64"]),     # a TV layout of 128M points
    ("((32,4),4):((1,32),128)", ["--tile", "100000x100000"]),  # a tile of 10^10 cells
])
def test_huge_layouts_are_refused_naming_the_limit(tmp_path: Path, layout: str, extra: list[str]) -> None:
    target = tmp_path / "huge.png"
    out = _run("draw", layout, *extra, "-o", str(target), limit_memory=True)
    line = _refused(out, "too ")
    assert str(hd.MAX_DRAW_CELLS) in line or str(hd.MAX_EVALUATED_POINTS) in line
    assert layout in line or "100000x100000" in line
    assert not target.exists()


def test_the_drawable_limits_are_exact() -> None:
    side = int(hd.MAX_DRAW_CELLS ** 0.5)
    assert hd.layout_values(parse_layout(f"({side},{side}):(1,{side})")).shape == (side, side)
    with pytest.raises(DrawError, match=str(hd.MAX_DRAW_CELLS)):
        hd.layout_values(parse_layout(f"({side + 1},{side}):(1,{side + 1})"))
    row = hd.MAX_DRAW_SIDE
    assert hd.layout_values(parse_layout(f"({row}):(1)")).shape == (1, row)
    with pytest.raises(DrawError, match=f"{row} per side"):
        hd.layout_values(parse_layout(f"({row + 1}):(1)"))
    with pytest.raises(DrawError, match="points"):
        hd.tv_grid(parse_layout(f"(32,{hd.MAX_EVALUATED_POINTS // 32 + 1}):(1,0)"), (4, 8))


# --- element widths -----------------------------------------------------------------------

@pytest.mark.parametrize("bits", ["0", "-8", "3", "256", "abc", "1.5"])
def test_invalid_elem_bits_are_refused(tmp_path: Path, bits: str) -> None:
    for target in (["Sw<3,3,3> o 0 o (8,64):(64,1)"], ["--atom", "SM75_U32x4_LDSM_N", "--operand", "dst"]):
        out = tmp_path / "e.png"
        assert main(["draw", *target, f"--elem-bits={bits}", "-o", str(out)]) == 1
        assert not out.exists()
    line = _refused(_run("draw", "(4,8):(8,1)", f"--elem-bits={bits}", "-o", str(tmp_path / "e.png")),
                    "--elem-bits", repr(bits) if bits in ("abc", "1.5") else bits)
    assert "power of two" in line


def test_library_refuses_zero_elem_bits(tmp_path: Path) -> None:
    """``elem_bits=0`` is not silently drawn as 16-bit elements."""
    lay = parse_layout("(8,64):(64,1)")
    with pytest.raises(DrawError, match="elem_bits 0"):
        hd.smem_grid(lay, 0)
    with pytest.raises(DrawError, match="elem_bits 0"):
        hd.draw(lay, tmp_path / "z.png", elem_bits=0)
    assert not (tmp_path / "z.png").exists()
    # the valid widths give the byte-address banks of independent arithmetic
    for bits in (8, 16, 32, 64, 128):
        g = hd.smem_grid(lay, bits)
        offs = g.meta["offsets"]
        assert (g.meta["banks"] == (offs * (bits // 8) // 4) % 32).all()


# --- -D constants -------------------------------------------------------------------------

@pytest.mark.parametrize("cmd, kernel, define, name, expected", [
    (["explain"], "gemm", "BM=abc", "BM", "an int"),
    (["compile", "--arch", "sm_80", "--emit", "cuda", "-o", "OUT"], "gemm", "BK=1.5", "BK", "an int"),
    (["explain"], "attention", "CAUSAL=3", "CAUSAL", "a bool"),
])
def test_define_of_the_wrong_type_names_the_constant(tmp_path: Path, cmd: list[str], kernel: str,
                                                     define: str, name: str, expected: str) -> None:
    args = [a if a != "OUT" else str(tmp_path / "k.cu") for a in cmd]
    line = _refused(_run(args[0], kernel, *args[1:], "-D", define), f"constant {name} ", expected)
    assert repr(define.split("=")[1]) in line or define.split("=")[1] in line
    assert not (tmp_path / "k.cu").exists()


def test_trace_with_a_constant_of_the_wrong_type_names_it() -> None:
    from hexlayout.lang.errors import KernelError
    from hexlayout.lang.examples.gemm_sm80 import gemm_sm80

    with pytest.raises(KernelError, match=r"constant STAGES must be an int, not '3' \(str\)"):
        gemm_sm80.trace(STAGES="3")
    with pytest.raises(KernelError, match="constant BM must be an int, not True"):
        gemm_sm80.trace(BM=True)


# --- output files -------------------------------------------------------------------------

def test_output_that_is_a_directory_is_named(tmp_path: Path) -> None:
    target = tmp_path / "pic.png"
    target.mkdir()
    _refused(_run("draw", "(4,8):(8,1)", "-o", str(target)), str(target), "is a directory")


def test_output_under_a_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "plain").write_text("x")
    target = tmp_path / "plain" / "sub" / "pic.png"
    _refused(_run("draw", "(4,8):(8,1)", "-o", str(target)), str(target), "is not a directory")


def test_missing_directory_is_created_or_named(tmp_path: Path) -> None:
    target = tmp_path / "new" / "dir" / "pic.svg"
    assert main(["draw", "(4,8):(8,1)", "-o", str(target)]) == 0
    assert target.read_text().lstrip().startswith("<?xml")
    # /proc refuses new directories even to root
    _refused(_run("draw", "(4,8):(8,1)", "-o", "/proc/hexlayout-no-such/pic.png"),
             "/proc/hexlayout-no-such/pic.png", "cannot create its directory")


def test_unwritable_output_is_named(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                    capsys: pytest.CaptureFixture[str]) -> None:
    """A write refused by the OS (e.g. permission; faked, as root may write anywhere)."""
    from matplotlib.figure import Figure

    target = tmp_path / "pic.png"

    def refuse(self: Figure, fname: object, **_: object) -> None:
        raise PermissionError(13, "Permission denied", str(fname))

    monkeypatch.setattr(Figure, "savefig", refuse)
    with pytest.raises(DrawOutputError, match="Permission denied") as err:
        hd.draw("(4,8):(8,1)", target)
    assert str(target) in str(err.value) and isinstance(err.value, OSError)
    assert main(["draw", "(4,8):(8,1)", "-o", str(target)]) == 1
    msg = capsys.readouterr().err.strip()
    assert msg.count("\n") == 0 and str(target) in msg and "Permission denied" in msg


def test_deeply_nested_layout_is_refused() -> None:
    _refused(_run("draw", "(" * 3000 + "1" + ")" * 3000, "-o", "/tmp/never.png"), "nested too deeply")


def test_draw_help_states_the_limits() -> None:
    import hexlayout.cli.draw as draw_cli

    doc = " ".join(draw_cli.__doc__.split())
    assert f"{hd.MAX_DRAW_CELLS:,} cells" in doc and f"{hd.MAX_DRAW_SIDE:,} a side" in doc
    assert hd.MAX_EVALUATED_POINTS == 2 ** 20 and "2^20 points" in doc


def test_forced_labels_on_a_huge_grid_are_refused(tmp_path: Path) -> None:
    from hexlayout.draw.render import MAX_FORCED_LABELS

    target = tmp_path / "labels.png"
    rows = MAX_FORCED_LABELS // 128 + 1                       # one row of 128 cells too many
    line = _refused(_run("draw", f"({rows},128):(128,1)", "--labels", "-o", str(target)),
                    f"{rows}x128", str(MAX_FORCED_LABELS))
    assert "labels" in line and not target.exists()
    # the same grid without forced labels is drawn (colours only)
    assert main(["draw", f"({rows},128):(128,1)", "-o", str(target)]) == 0 and target.stat().st_size > 0
