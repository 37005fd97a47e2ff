"""hexlayout kernels written in the tile language (GEMM, attention, MoE) and their torch ops.

Installed as ``hexlayout.ops``. Empty until the language and code generator exist.
"""
