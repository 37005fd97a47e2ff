"""``hexlayout compile``: CUDA C++, PTX, cubin and SASS artifacts for sm_80 and sm_90a.

``--emit cuda`` needs no compiler; the others need NVRTC or nvcc (skipped without one) and
SASS also cuobjdump. The entry point runs once as a subprocess, the rest in process.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hexlayout.cli import main

ROOT = Path(__file__).resolve().parents[1]


def _toolchain() -> bool:
    try:
        from hexlayout.runtime import available_backends

        return bool(available_backends())
    except Exception:  # noqa: BLE001 - anything missing means: no compiler here
        return False


needs_compiler = pytest.mark.skipif(not _toolchain(), reason="no CUDA compiler (NVRTC or nvcc)")


def _sass_or_skip(path: Path, capsys: pytest.CaptureFixture[str], *args: str) -> str:
    rc = main(["compile", *args, "--emit", "sass", "-o", str(path)])
    if rc != 0:
        err = capsys.readouterr().err
        if "cuobjdump" in err:
            pytest.skip(f"no cuobjdump: {err.strip()}")
        pytest.fail(err)
    return path.read_text()


def test_emit_cuda_via_subprocess(tmp_path: Path) -> None:
    target = tmp_path / "gemm.cu"
    out = subprocess.run([sys.executable, "-m", "hexlayout", "compile", "gemm", "--arch", "sm_80",
                          "--emit", "cuda", "-o", str(target)], capture_output=True, text=True, timeout=300,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    src = target.read_text()
    assert "__global__" in src and "cp.async" in src and "mma.sync" in src
    line = out.stdout.strip()
    assert "\n" not in line and str(target) in line and "shared memory" in line and "synthesis" in line


@needs_compiler
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_emit_ptx_and_cubin(arch: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ptx, cubin = tmp_path / "k.ptx", tmp_path / "k.cubin"
    assert main(["compile", "gemm", "--arch", arch, "--emit", "ptx", "-o", str(ptx)]) == 0
    assert main(["compile", "gemm", "--arch", arch, "--emit", "cubin", "-o", str(cubin)]) == 0
    text = ptx.read_text()
    assert f".target {arch}" in text
    assert ("wgmma.mma_async" in text) if arch == "sm_90a" else ("mma.sync.aligned" in text)
    assert cubin.read_bytes()[:4] == b"\x7fELF"
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 2
    for line in lines:
        assert "registers" in line and "spills" in line and "shared memory" in line
        assert "compile" in line and "cache" in line
    assert "cache hit" in lines[1]                 # the cubin compiled for the ptx is reused


@needs_compiler
def test_sass_sm80_has_hmma_ldgsts_ldsm(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sass = _sass_or_skip(tmp_path / "k.sass", capsys, "gemm", "--arch", "sm_80")
    assert "HMMA" in sass and "LDGSTS" in sass and "LDSM" in sass


@needs_compiler
def test_sass_sm90a_has_hgmma_utmaldg(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    sass = _sass_or_skip(tmp_path / "k.sass", capsys, "gemm", "--arch", "sm_90a")
    assert "HGMMA" in sass and "UTMALDG" in sass


@needs_compiler
def test_compile_attention_with_defines(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "fa.cubin"
    assert main(["compile", "attention", "--arch", "sm_80", "-D", "CAUSAL=true", "--emit", "cubin",
                 "-o", str(out)]) == 0
    assert out.stat().st_size > 0
    assert "flash_attention_fwd sm_80" in capsys.readouterr().out


def test_cuda_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", "gemm", "--arch", "sm_90a", "--emit", "cuda", "-o", "-"]) == 0
    cap = capsys.readouterr()
    assert "__global__" in cap.out and "wgmma" in cap.out
    assert "wrote stdout" in cap.err


def test_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["compile", "nope", "--arch", "sm_80", "--emit", "cuda", "-o", str(tmp_path / "x")]) == 1
    assert "unknown kernel 'nope'" in capsys.readouterr().err
    assert main(["compile", "gemm", "--arch", "sm_80", "--emit", "cuda",
                 "-o", str(tmp_path / "missing" / "x.cu")]) == 1
    assert "does not exist" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["compile", "gemm", "--arch", "sm_80", "--emit", "elf", "-o", str(tmp_path / "x")])
    assert e.value.code == 2
    with pytest.raises(SystemExit) as e:                  # --arch is required
        main(["compile", "gemm", "--emit", "cuda", "-o", str(tmp_path / "x")])
    assert e.value.code == 2
