"""The compiler driver: kernel definition -> tile program -> synthesis -> CUDA C++ -> cubin.

``build(kernel, arch, **consts)`` traces a ``hexlayout.lang`` kernel (or takes a traced
``TileKernel``), synthesizes every layout and instruction for ``arch``, prints the
lowered program as CUDA C++ and (unless ``compile=False``) compiles it. Results are
memoized per (kernel, arch, constants, argument specializations) in the process, and the
cubin in the on-disk cache of ``compile_cuda``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from hexlayout.codegen import GeneratedKernel, generate
from hexlayout.ir.tile import TileKernel
from hexlayout.synth.solve import Synthesis, synthesize

from .compile import CompiledKernel, compile_generated

__all__ = ["Build", "build", "clear_builds"]


@dataclass
class Build:
    tile_kernel: TileKernel
    synthesis: Synthesis
    generated: GeneratedKernel
    compiled: CompiledKernel | None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def lowered(self) -> Any:
        return self.synthesis.lowered.kernel


_BUILDS: dict[tuple, Build] = {}


def _key(kernel: Any, arch: str, consts: dict[str, Any], compile: bool) -> tuple:
    return (id(kernel), arch, tuple(sorted((k, repr(v)) for k, v in consts.items())), compile)


def build(kernel: Any, arch: str, *, compile: bool = True, **consts: Any) -> Build:
    """Trace (if needed), synthesize, generate and compile ``kernel`` for ``arch``."""
    key = _key(kernel, arch, consts, compile)
    if key in _BUILDS:
        return _BUILDS[key]
    times: dict[str, float] = {}
    t = time.perf_counter()
    tk = kernel if isinstance(kernel, TileKernel) else kernel.trace(**consts)
    times["trace"] = time.perf_counter() - t
    t = time.perf_counter()
    syn = synthesize(tk, arch)
    times["synthesize"] = time.perf_counter() - t
    t = time.perf_counter()
    gen = generate(syn.lowered.kernel)
    times["generate"] = time.perf_counter() - t
    compiled = None
    if compile:
        t = time.perf_counter()
        compiled = compile_generated(gen)
        times["compile"] = time.perf_counter() - t
    out = Build(tk, syn, gen, compiled, times)
    _BUILDS[key] = out
    return out


def clear_builds() -> None:
    _BUILDS.clear()
