"""The runtime: compile generated CUDA C++ (NVRTC through cuda-bindings, nvcc as fallback)
with an on-disk cache; SASS and resource reports for checking what was compiled.

* ``build(kernel, arch, **consts) -> Build``: trace, synthesize, generate, compile.
* ``compile_cuda(source, arch, options) -> CompiledKernel`` (cubin, ptx, log, resources).
* ``DiskCache``: ``HEXLAYOUT_CACHE_DIR`` or ``~/.cache/hexlayout``; atomic, checksummed.
* ``CompileError`` / ``ToolchainError``.

Not imported by ``import hexlayout``; nothing here needs a GPU or a driver.
"""

from .build import Build, build, clear_builds
from .cache import DiskCache, default_cache_dir
from .compile import (
    SUPPORTED_ARCHS,
    CompiledKernel,
    available_backends,
    clear_memory_cache,
    compile_cuda,
    compile_generated,
)
from .errors import CompileError, ToolchainError
from .resources import ResourceUsage

__all__ = ["compile_cuda", "compile_generated", "CompiledKernel", "DiskCache", "default_cache_dir",
           "CompileError", "ToolchainError", "ResourceUsage", "available_backends", "clear_memory_cache",
           "SUPPORTED_ARCHS", "build", "Build", "clear_builds"]
