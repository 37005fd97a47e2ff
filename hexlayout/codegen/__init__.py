"""The CUDA C++ backend: a ``LoweredKernel`` printed as CUDA C++ with inline PTX.

* ``generate_cuda(kernel) -> str``: the source text (deterministic).
* ``generate(kernel) -> GeneratedKernel``: the source with what a launcher needs (symbol
  name, ordered ``KernelArg`` list, dynamic shared-memory bytes including mbarriers).
* ``CodegenError``: an instruction that cannot be printed, with its source line.

Not imported by ``import hexlayout``; compiling is ``hexlayout.runtime``'s job.
"""

from .errors import CodegenError
from .kernel import GeneratedKernel, KernelArg, generate, generate_cuda

__all__ = ["generate_cuda", "generate", "GeneratedKernel", "KernelArg", "CodegenError"]
