"""Compile CUDA C++ to cubin in-process with NVRTC (``cuda.bindings.nvrtc``); no driver needed."""

from __future__ import annotations

from .errors import CompileError, ToolchainError, explain_log
from .toolchain import INSTALL_HINT, include_dirs, nvrtc_version

__all__ = ["compile_nvrtc", "nvrtc_arch_options"]


def nvrtc_arch_options(arch: str) -> list[str]:
    return [f"--gpu-architecture={arch}"]


def _check(nvrtc, result, what: str) -> None:  # type: ignore[no-untyped-def]
    err = result[0] if isinstance(result, tuple) else result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise ToolchainError(f"NVRTC {what} failed: {err}")


def compile_nvrtc(source: str, arch: str, options: list[str], filename: str = "kernel.cu"
                  ) -> tuple[bytes, str, str]:
    """``(cubin, ptx, log)``; raises ``CompileError`` with the log when compilation fails."""
    nvrtc_version()  # raises ToolchainError with an install hint if NVRTC is unusable
    from cuda.bindings import nvrtc

    opts = nvrtc_arch_options(arch) + [f"-I{d}" for d in include_dirs()] + list(options)
    err, prog = nvrtc.nvrtcCreateProgram(source.encode(), filename.encode(), 0, [], [])
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise ToolchainError(f"nvrtcCreateProgram failed: {err}; {INSTALL_HINT}")
    try:
        (res,) = nvrtc.nvrtcCompileProgram(prog, len(opts), [o.encode() for o in opts])
        _, n = nvrtc.nvrtcGetProgramLogSize(prog)
        buf = b" " * n
        nvrtc.nvrtcGetProgramLog(prog, buf)
        log = buf.rstrip(b"\0 ").decode(errors="replace")
        if res != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            detail = explain_log(log, source)
            raise CompileError(f"NVRTC could not compile {filename} for {arch} ({res.name}):\n"
                               + (detail + "\n" if detail else "") + "full log:\n" + log,
                               log, source, arch, "nvrtc")
        _, n = nvrtc.nvrtcGetCUBINSize(prog)
        cubin = b" " * n
        _check(nvrtc, nvrtc.nvrtcGetCUBIN(prog, cubin), "nvrtcGetCUBIN")
        _, n = nvrtc.nvrtcGetPTXSize(prog)
        ptx = b" " * n
        _check(nvrtc, nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        return bytes(cubin), ptx.rstrip(b"\0").decode(errors="replace"), log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)
