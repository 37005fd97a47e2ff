"""``compile_cuda``: CUDA C++ source to a ``CompiledKernel`` (cubin, PTX, log, resources),
through NVRTC when available, else nvcc, with an on-disk cache and a per-process memo.

The cache key covers hexlayout's own sources, the CUDA source, the architecture, the
compiler and its version
(``compiler_identity``: NVRTC version and header directories, or nvcc's version) and the
options, so a compiler upgrade recompiles. A cache that cannot be used warns and the
compile goes on (see ``cache``)."""

from __future__ import annotations

import functools
import time
from dataclasses import dataclass, field
from typing import Any

from .cache import CacheEntry, DiskCache, cache_key
from .errors import ToolchainError
from .nvcc import compile_nvcc
from .nvrtc import compile_nvrtc
from .resources import ResourceUsage, parse_ptxas, parse_res_usage
from .toolchain import INSTALL_HINT, include_dirs, nvcc_version, nvrtc_version

__all__ = ["compile_cuda", "compile_generated", "CompiledKernel", "available_backends", "clear_memory_cache",
           "SUPPORTED_ARCHS", "compiler_identity", "DEFAULT_OPTIONS"]

SUPPORTED_ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a", "sm_100a")
DEFAULT_OPTIONS = ("-std=c++17",)
_VERBOSE = "--ptxas-options=-v"
_MEMO: dict[str, CompiledKernel] = {}


@dataclass
class CompiledKernel:
    """A compiled translation unit. ``cache`` is "" (compiled now), "memory" or "disk"."""

    name: str | None
    arch: str
    cubin: bytes
    ptx: str
    log: str
    compiler: str
    options: tuple[str, ...]
    resources: ResourceUsage | None
    key: str
    seconds: float
    cache: str = ""
    _sass: str | None = field(default=None, repr=False)

    @property
    def cache_hit(self) -> bool:
        return bool(self.cache)

    def sass(self) -> str:
        """SASS listing (``cuobjdump -sass``; needs the nvidia-cuda-cuobjdump wheel or a toolkit)."""
        if self._sass is None:
            from .sass import disassemble

            self._sass = disassemble(self.cubin)
        return self._sass

    def sass_counts(self) -> Any:
        """``Counter`` of SASS opcodes."""
        from .sass import opcode_counts

        return opcode_counts(self.sass())


def _nvrtc_ok() -> bool:
    try:
        nvrtc_version()
        include_dirs()
        return True
    except ToolchainError:
        return False


def _nvcc_ok() -> bool:
    try:
        nvcc_version()
        return True
    except (ToolchainError, OSError):
        return False


def available_backends() -> list[str]:
    """The usable compilers, preferred first ("nvrtc", "nvcc")."""
    return [b for b, ok in (("nvrtc", _nvrtc_ok), ("nvcc", _nvcc_ok)) if ok()]


@functools.lru_cache(maxsize=4)
def _compiler_id(backend: str) -> str:
    if backend == "nvrtc":
        return nvrtc_version() + " " + " ".join(include_dirs())
    return nvcc_version()


def compiler_identity(backend: str = "auto") -> str | None:
    """What identifies the compiler ``compile_cuda(backend=backend)`` would use: its name and
    version (``"nvrtc 13.0 <include dirs>"``, ``"nvcc 13.0.88"``); ``None`` when none is usable.
    Part of every persisted artifact's key."""
    if backend == "auto":
        avail = available_backends()
        if not avail:
            return None
        backend = avail[0]
    try:
        return _compiler_id(backend)
    except (ToolchainError, OSError):
        return None


def clear_memory_cache() -> None:
    _MEMO.clear()


def compile_cuda(source: str, arch: str = "sm_80", options: list[str] | tuple[str, ...] = (), *,
                 name: str | None = None, backend: str = "auto", cache: bool | DiskCache = True
                 ) -> CompiledKernel:
    """Compile ``source`` for ``arch`` (sm_80, sm_86, sm_89, sm_90a, sm_100a) to a cubin.

    ``options`` are passed to the compiler after ``-std=c++17`` and the architecture (NVRTC
    spellings, which nvcc understands too, e.g. ``--use_fast_math``, ``-lineinfo``).
    ``backend``: "auto" (NVRTC, else nvcc), "nvrtc" or "nvcc". ``cache``: ``True`` for the
    default ``DiskCache``, a ``DiskCache``, or ``False``. ``name`` is the kernel symbol whose
    resource usage is reported. Raises ``CompileError`` (with the offending generated line and
    the kernel source line) or ``ToolchainError`` (with what to install).
    """
    if arch not in SUPPORTED_ARCHS:
        raise ValueError(f"architecture {arch!r} is not one of {', '.join(SUPPORTED_ARCHS)}")
    if backend == "auto":
        avail = available_backends()
        if not avail:
            raise ToolchainError(f"no CUDA compiler is usable; {INSTALL_HINT}")
        backend = avail[0]
    if backend not in ("nvrtc", "nvcc"):
        raise ValueError(f"backend {backend!r} is not 'auto', 'nvrtc' or 'nvcc'")
    opts = tuple(DEFAULT_OPTIONS) + tuple(options)
    compiler = _compiler_id(backend)
    key = cache_key(source, arch, compiler, opts)
    t0 = time.perf_counter()
    if cache is not False and key in _MEMO:
        hit = _MEMO[key]
        return CompiledKernel(hit.name, hit.arch, hit.cubin, hit.ptx, hit.log, hit.compiler, hit.options,
                              hit.resources, key, time.perf_counter() - t0, "memory", hit._sass)
    disk = (cache if isinstance(cache, DiskCache) else DiskCache()) if cache is not False else None
    if disk is not None:
        entry = disk.get(key)
        if entry is not None:
            m = entry.meta
            res = ResourceUsage.from_dict(m["resources"]) if m.get("resources") else None
            ck = CompiledKernel(m.get("name"), arch, entry.cubin, entry.ptx, m.get("log", ""), m["compiler"],
                                opts, res, key, time.perf_counter() - t0, "disk")
            _MEMO[key] = ck
            return ck
    filename = f"{name or 'kernel'}.cu"
    flags = list(opts) + [_VERBOSE]
    if backend == "nvrtc":
        cubin, ptx, log = compile_nvrtc(source, arch, flags, filename)
    else:
        cubin, ptx, log = compile_nvcc(source, arch, flags, filename)
    res = parse_ptxas(log, name)
    if res is None:
        try:
            from .sass import res_usage

            res = parse_res_usage(res_usage(cubin), name)
        except ToolchainError:
            res = None
    ck = CompiledKernel(name, arch, cubin, ptx, log, compiler.split(" /")[0], opts, res, key,
                        time.perf_counter() - t0)
    if disk is not None:   # never raises: an unusable cache warns (CacheWarning) and is skipped
        disk.put(key, CacheEntry(cubin, ptx, {"name": name, "log": log, "compiler": ck.compiler,
                                              "resources": res.to_dict() if res else None}))
    _MEMO[key] = ck
    return ck


def compile_generated(kernel: Any, options: list[str] | tuple[str, ...] = (), **kw: Any) -> CompiledKernel:
    """Compile a ``hexlayout.codegen.GeneratedKernel`` for its own architecture."""
    return compile_cuda(kernel.source, kernel.arch, options, name=kernel.name, **kw)
