"""Compile CUDA C++ to cubin with the ``nvcc`` executable (fallback when NVRTC is absent)."""

from __future__ import annotations

import subprocess
import tempfile
from pathlib import Path

from .errors import CompileError, explain_log
from .toolchain import nvcc_path

__all__ = ["compile_nvcc", "nvcc_arch_options"]


def nvcc_arch_options(arch: str) -> list[str]:
    """``-arch=sm_80``; arch-specific targets (``sm_90a``) need an explicit ``-gencode``."""
    if arch.endswith("a"):
        return [f"-gencode=arch=compute_{arch[3:]},code={arch}"]
    return [f"-arch={arch}"]


def _translate(options: list[str]) -> list[str]:
    """NVRTC-style options to nvcc spellings (``--ptxas-options=-v`` is understood by both)."""
    out = []
    for o in options:
        if o in ("-default-device", "--device-as-default-execution-space"):
            continue
        out.append(o)
    return out


def compile_nvcc(source: str, arch: str, options: list[str], filename: str = "kernel.cu",
                 timeout: float = 600.0) -> tuple[bytes, str, str]:
    """``(cubin, ptx, log)``; raises ``CompileError`` with the log when compilation fails."""
    exe = nvcc_path()
    with tempfile.TemporaryDirectory(prefix="hexlayout-nvcc-") as tmp:
        src = Path(tmp) / filename
        src.write_text(source)
        cubin, ptx = Path(tmp) / "out.cubin", Path(tmp) / "out.ptx"
        base = [exe, *nvcc_arch_options(arch), *_translate(options)]
        r = subprocess.run(base + ["-cubin", "-o", str(cubin), str(src)], capture_output=True, text=True,
                           timeout=timeout, cwd=tmp)
        log = (r.stdout + r.stderr).replace(str(src), filename)
        if r.returncode != 0:
            detail = explain_log(log, source)
            raise CompileError(f"nvcc could not compile {filename} for {arch} (exit {r.returncode}):\n"
                               + (detail + "\n" if detail else "") + "full log:\n" + log, log, source, arch,
                               "nvcc")
        p = subprocess.run(base + ["-ptx", "-o", str(ptx), str(src)], capture_output=True, text=True,
                           timeout=timeout, cwd=tmp)
        ptx_text = ptx.read_text() if p.returncode == 0 and ptx.exists() else ""
        return cubin.read_bytes(), ptx_text, log
