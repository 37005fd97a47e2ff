"""Where the CUDA tools and headers are: NVRTC (cuda-bindings + the nvidia-cuda-nvrtc wheel),
the CUDA headers (nvidia-cuda-runtime wheel, else an nvcc installation), nvcc, cuobjdump.

Lookups are memoized per process. ``HEXLAYOUT_CUDA_INCLUDE`` overrides the header directory;
``CUDA_HOME`` / ``CUDA_PATH`` name an installation to search besides ``nvcc`` on ``PATH``
and ``/usr/local/cuda*``.
"""

from __future__ import annotations

import functools
import glob
import importlib.util
import os
import re
import shutil
import subprocess
from pathlib import Path

from .errors import ToolchainError

__all__ = ["include_dirs", "nvcc_path", "nvcc_version", "nvrtc_version", "tool_path", "INSTALL_HINT"]

INSTALL_HINT = ("install the CUDA extras (pip install 'hexlayout[cuda]': cuda-bindings, nvidia-cuda-nvrtc, "
                "nvidia-cuda-runtime for the headers, nvidia-cuda-cuobjdump for SASS) or put a CUDA "
                "toolkit's nvcc on PATH (or set CUDA_HOME)")


def _wheel_roots() -> list[Path]:
    """``site-packages/nvidia/<x>`` directories of the NVIDIA wheels (cu13 and cu12 layouts)."""
    spec = importlib.util.find_spec("nvidia")
    if spec is None or not spec.submodule_search_locations:
        return []
    roots: list[Path] = []
    for loc in spec.submodule_search_locations:
        base = Path(loc)
        for sub in ("cu13", "cu12", "cuda_runtime", "cuda_nvrtc", "cuda_cuobjdump", "cuda_nvdisasm",
                    "cuda_nvcc", "cuda_cccl"):
            if (base / sub).is_dir():
                roots.append(base / sub)
    return roots


def _toolkit_roots() -> list[Path]:
    roots: list[Path] = []
    for var in ("CUDA_HOME", "CUDA_PATH"):
        if os.environ.get(var):
            roots.append(Path(os.environ[var]))
    nvcc = shutil.which("nvcc")
    if nvcc:
        roots.append(Path(os.path.realpath(nvcc)).parent.parent)
    roots += [Path(p) for p in sorted(glob.glob("/usr/local/cuda*"), reverse=True)]
    return roots


@functools.lru_cache(maxsize=1)
def include_dirs() -> tuple[str, ...]:
    """Directories holding ``cuda_fp16.h`` (and CCCL where separate), best first."""
    if os.environ.get("HEXLAYOUT_CUDA_INCLUDE"):
        return tuple(os.environ["HEXLAYOUT_CUDA_INCLUDE"].split(os.pathsep))
    out: list[str] = []
    for root in _wheel_roots() + _toolkit_roots():
        inc = root / "include"
        if (inc / "cuda_fp16.h").is_file() and str(inc) not in out:
            out.append(str(inc))
            break
    if not out:
        raise ToolchainError(f"the CUDA headers (cuda_fp16.h) were not found; {INSTALL_HINT}")
    return tuple(out)


@functools.cache
def tool_path(name: str) -> str | None:
    """A CUDA binary (``cuobjdump``, ``nvdisasm``, ``nvcc``): wheel, PATH or toolkit."""
    for root in _wheel_roots():
        p = root / "bin" / name
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    found = shutil.which(name)
    if found:
        return found
    for root in _toolkit_roots():
        p = root / "bin" / name
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return None


def nvcc_path() -> str:
    p = tool_path("nvcc")
    if p is None:
        raise ToolchainError(f"nvcc was not found; {INSTALL_HINT}")
    return p


@functools.lru_cache(maxsize=1)
def nvcc_version() -> str:
    """``"nvcc 13.0.88"``."""
    out = subprocess.run([nvcc_path(), "--version"], capture_output=True, text=True, timeout=60).stdout
    m = re.search(r"V(\d+\.\d+\.\d+)", out)
    return f"nvcc {m.group(1) if m else out.strip().splitlines()[-1]}"


@functools.lru_cache(maxsize=1)
def nvrtc_version() -> str:
    """``"nvrtc 13.5"``; raises ``ToolchainError`` when NVRTC cannot be loaded."""
    try:
        from cuda.bindings import nvrtc
    except ImportError as e:
        raise ToolchainError(f"cuda-bindings is not installed ({e}); {INSTALL_HINT}") from None
    try:
        err, major, minor = nvrtc.nvrtcVersion()
    except Exception as e:  # the bindings raise when libnvrtc cannot be loaded
        raise ToolchainError(f"NVRTC could not be loaded ({e}); {INSTALL_HINT}") from None
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise ToolchainError(f"nvrtcVersion failed: {err}; {INSTALL_HINT}")
    return f"nvrtc {major}.{minor}"
