"""The runtime: compile generated CUDA C++ (NVRTC through cuda-bindings, nvcc as fallback)
with an on-disk cache; SASS and resource reports for checking what was compiled.

* ``build(kernel, arch, **consts) -> Build``: trace, synthesize, generate, compile.
* ``compile_cuda(source, arch, options) -> CompiledKernel`` (cubin, ptx, log, resources).
* ``DiskCache``: ``HEXLAYOUT_CACHE_DIR`` or ``~/.cache/hexlayout``; atomic, checksummed; a cache
  directory writable by other users, or one that cannot be written, gives a ``CacheWarning``.
* ``CompileError`` / ``ToolchainError``.
* ``bind_args`` / ``ArgumentError``: launch arguments checked against a kernel (``args``).
* ``Launcher(build)``: ``cuLaunchKernelEx`` on torch's current stream (``launch``; GPU only).
* ``emulate(build, *args)``: the CPU emulator on CPU torch tensors / numpy arrays.
* ``specialize``: a call that breaks a build's alignment assumptions (odd rows, offset views)
  runs the build specialized on its divisibility facts, cached beside the aligned one.
* ``capturing`` / ``mock_capture`` / ``prebuild`` / ``CaptureError``: CUDA-graph capture: no
  build or module load inside one; ``prebuild()`` warms builds up before it (``capture``).
* ``launch_log()`` / ``LaunchRecord``: what ran (every launch, CUDA or emulated; ``launch_log``).
* ``tensormap_params``: TMA tensor-map parameters of a ``TmaDesc`` (``tensormap``).
* ``define_op`` / ``run_build``: ``torch.ops.hexlayout.<name>`` registration (``torch_ops``).
* ``alloc.fresh`` / ``alloc.zeroed``: outputs and workspaces (uninitialised on CUDA, NaN-filled
  on the CPU; zeros on every device where the contract says so), for the ops and fusion.

Not imported by ``import hexlayout``; importing it imports neither torch nor the CUDA driver
(both are imported inside the functions that need them).
"""

from .args import ArgumentError, BoundArgs, bind_args
from .build import Build, build, clear_builds
from .cache import CacheWarning, DiskCache, default_cache_dir
from .capture import CaptureError, capturing, mock_capture, prebuild
from .compile import (
    SUPPORTED_ARCHS,
    CompiledKernel,
    available_backends,
    clear_memory_cache,
    compile_cuda,
    compile_generated,
)
from .emulate import emulate
from .errors import CompileError, ToolchainError
from .launch import Launcher, LaunchError, UnsupportedDeviceError, measure_host_overhead
from .launch_log import LaunchRecord, launch_log
from .resources import ResourceUsage
from .tensormap import TensorMapParams, tensormap_params
from .torch_ops import EmulationDisabledError, Op, define_op, run_build

__all__ = ["compile_cuda", "compile_generated", "CompiledKernel", "DiskCache", "default_cache_dir",
           "CompileError", "ToolchainError", "ResourceUsage", "available_backends", "clear_memory_cache",
           "SUPPORTED_ARCHS", "build", "Build", "clear_builds", "ArgumentError", "BoundArgs", "bind_args",
           "Launcher", "LaunchError", "UnsupportedDeviceError", "measure_host_overhead", "emulate",
           "TensorMapParams", "tensormap_params", "define_op", "Op", "run_build", "EmulationDisabledError",
           "CacheWarning", "launch_log", "LaunchRecord", "CaptureError", "capturing", "mock_capture",
           "prebuild"]
