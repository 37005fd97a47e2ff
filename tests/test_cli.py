"""The ``hexlayout`` command line: subprocess runs of ``python -m hexlayout`` for the
entry point, in-process ``main([...])`` for the rest (faster)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hexlayout.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hexlayout", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd or ROOT)


def _is_png(path: Path) -> bool:
    from PIL import Image

    with Image.open(path) as im:
        im.verify()
        return im.format == "PNG"


def test_help_lists_subcommands() -> None:
    out = _run("--help")
    assert out.returncode == 0, out.stderr
    assert "draw" in out.stdout and "demo" in out.stdout


def test_draw_layout_png_via_subprocess(tmp_path: Path) -> None:
    target = tmp_path / "l.png"
    out = _run("draw", "(4,8):(8,1)", "-o", str(target))
    assert out.returncode == 0, out.stderr
    assert _is_png(target) and str(target) in out.stdout


def test_bad_layout_exits_nonzero_with_message(tmp_path: Path) -> None:
    out = _run("draw", "(4,8):(8,x)", "-o", str(tmp_path / "l.png"))
    assert out.returncode != 0
    assert "(4,8):(8,x)" in out.stderr and "position 9" in out.stderr
    assert "Traceback" not in out.stderr
    assert not (tmp_path / "l.png").exists()


def test_demo_prints_layouts_and_writes_pictures(tmp_path: Path) -> None:
    pytest.importorskip("hexlayout.arch")
    out = _run("demo", "--out", str(tmp_path / "pics"))
    assert out.returncode == 0, out.stderr
    text = out.stdout
    assert "SM80_16x8x16_F32F16F16F32_TN" in text
    assert "((4,8),(2,2)):((32,1),(16,8))" in text  # C
    assert "T0V0" in text and "T31V3" in text
    assert "8-way bank conflict" in text and "conflict-free" in text
    pngs = sorted((tmp_path / "pics").glob("*.png"))
    assert len(pngs) == 5 and all(_is_png(p) for p in pngs)
    assert str((tmp_path / "pics").resolve()) in text


# --- in process --------------------------------------------------------------------------

def test_draw_tv_svg_and_smem(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    svg = str(tmp_path / "c.svg")
    assert main(["draw", "((4,8),(2,2)):((32,1),(16,8))", "--tile", "16x8", "-o", svg]) == 0
    assert "T31" in (tmp_path / "c.svg").read_text()
    assert main(["draw", "Sw<3,3,3> o 0 o (8,64):(64,1)", "--elem-bits", "16", "--access", "ldmatrix:1",
                 "--label", "chunk", "-o", str(tmp_path / "s.png")]) == 0
    assert _is_png(tmp_path / "s.png")


def test_draw_atom(tmp_path: Path) -> None:
    pytest.importorskip("hexlayout.arch")
    assert main(["draw", "--atom", "SM80_16x8x16_F32F16F16F32_TN", "--operand", "b",
                 "-o", str(tmp_path / "b.png")]) == 0
    assert _is_png(tmp_path / "b.png")


@pytest.mark.parametrize(
    "argv, fragment",
    [
        (["draw", "(4,8", "-o", "x.png"], "'(4,8'"),
        (["draw", "(4,8):(8,1)", "-o", "x.txt"], "suffix"),
        (["draw", "--atom", "NO_SUCH_ATOM", "--operand", "a", "-o", "x.png"], "NO_SUCH_ATOM"),
        (["draw", "--atom", "SM80_16x8x16_F32F16F16F32_TN", "-o", "x.png"], "--operand"),
        (["draw", "--atom", "SM80_16x8x16_F32F16F16F32_TN", "--operand", "q", "-o", "x.png"], "'q'"),
        (["draw", "-o", "x.png"], "nothing to draw"),
        (["draw", "(4,8):(8,1)", "--tile", "4by8", "-o", "x.png"], "4by8"),
        (["draw", "(32,4):(1,32)", "--tile", "8x8", "-o", "x.png"], "outside the 8x8 tile"),
        (["draw", "(8,64):(64,1)", "--access", "zigzag", "-o", "x.png"], "zigzag"),
    ],
)
def test_user_errors_are_messages(argv: list[str], fragment: str, tmp_path: Path,
                                  capsys: pytest.CaptureFixture[str],
                                  monkeypatch: pytest.MonkeyPatch) -> None:
    if "--atom" in argv:
        pytest.importorskip("hexlayout.arch")
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.startswith("hexlayout draw: error:") and fragment in err
    assert not list(tmp_path.iterdir())


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["draw", "(4,8):(8,1)"])  # no -o
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:
        main(["frobnicate"])
    assert e.value.code == 2
    assert main([]) == 2  # no subcommand: help, status 2


@pytest.mark.parametrize(("arch", "words"), [
    ("sm_86", ["'sm_86' has no build of its own", "the sm_80 build runs on sm_86 GPUs", "use 'sm_80'"]),
    ("sm_87", ["the sm_80 build runs on sm_87 GPUs", "use 'sm_80'"]),
    ("sm_120", ["'sm_120' is not supported", "the builds are sm_80, sm_89, sm_90a, sm_100a",
                "none runs on sm_120"]),
])
@pytest.mark.parametrize("command", [["explain", "gemm"],
                                     ["compile", "gemm", "--emit", "cuda", "-o", "x.cu"]])
def test_arch_without_a_build_names_the_one_that_runs_there(
    arch: str, words: list[str], command: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """``--arch sm_86`` / ``sm_87`` say the sm_80 build runs there; ``sm_120`` that no build
    does and which builds exist (a usage error, status 2)."""
    with pytest.raises(SystemExit) as e:
        main([*command, "--arch", arch])
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "argument --arch:" in err and "Traceback" not in err
    for w in words:
        assert w in err, err
