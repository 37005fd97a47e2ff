"""PTX mode of ``emulate``: run the PTX that NVRTC made from a build's printed CUDA source.

``ptx_of(build)`` compiles ``build.generated.source`` for its architecture with
``-lineinfo`` (so the PTX carries ``.loc`` lines back to the CUDA text; memoized and cached
on disk like every compile) and returns the ``CompiledKernel``. ``emulate_ptx`` binds the
call's arguments as the GPU launcher does (``BoundArgs.values``: data pointers, scalars,
sizes in the kernel's parameter order), describes each tensor to the executor as a
``GlobalRegion`` (its host address and the in-bounds span of its shape and strides, the
emulator's memory model) and runs ``hexlayout.ptx.run_ptx`` on the launch grid.

``source=`` replaces the printed CUDA text (the mutation tests alter it before NVRTC).
"""

from __future__ import annotations

from typing import Any

from .compile import CompiledKernel, compile_cuda
from .tensormap import TensorMapParams

__all__ = ["ptx_of", "emulate_ptx", "PTX_OPTIONS"]

#: compile options of PTX mode: line info for ``.loc``
PTX_OPTIONS = ("-lineinfo",)


def ptx_of(build: Any, source: str | None = None) -> CompiledKernel:
    """The ``CompiledKernel`` (with ``.ptx``) of ``build``'s printed source (or ``source``)."""
    gen = build.generated
    return compile_cuda(source if source is not None else gen.source, gen.arch, PTX_OPTIONS, name=gen.name)


def emulate_ptx(build: Any, kernel: Any, bound: Any, arrays: dict[str, Any], *, blocks: Any = None,
                source: str | None = None, check_races: bool = True) -> Any:
    """Run ``build``'s PTX on the bound arguments; tensors in ``arrays`` are written in place.
    Returns the ``PtxRunReport``."""
    from hexlayout.emulator.memory import bind_arguments
    from hexlayout.ptx import GlobalRegion, run_ptx
    from hexlayout.ptx.bulk import encode_tensor_map

    tensors, _ = bind_arguments(kernel, arrays)
    regions = [GlobalRegion(gt.name, int(gt.array.ctypes.data), gt.raw, gt.extent * gt.esize)
               for gt in tensors.values()]
    # a tensor map: the launcher's parameters, in the executor's encoding of them
    values = [encode_tensor_map(v) if isinstance(v, TensorMapParams) else v for v in bound.values]
    gen = build.generated
    ck = ptx_of(build, source)
    return run_ptx(ck.ptx, values, regions, bound.grid, gen.threads, dynamic_smem=gen.smem_bytes,
                   entry=gen.name, cuda_source=source if source is not None else gen.source, blocks=blocks,
                   kernel=gen.name, check_races=check_races)
