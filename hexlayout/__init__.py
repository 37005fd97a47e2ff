"""hexlayout: GPU kernels whose layouts are synthesized.

Layers (each imports only those below it): ``hexlayout.layout`` (CuTe layout algebra),
``hexlayout.arch`` (mma / copy atoms, shared-memory banks, limits per architecture).
``import hexlayout`` loads neither torch nor CUDA.
"""

__version__ = "0.1.0"
