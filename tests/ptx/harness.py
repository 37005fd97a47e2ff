"""Run a few hand-written PTX instructions on one warp: each lane's ``%r10`` / ``%r11``
(and 64-bit ``%rd10``, split into them when ``wide``) land in ``out[lane]``."""

from __future__ import annotations

import numpy as np

from hexlayout.ptx import GlobalRegion, run_ptx

HEAD = """
.version 8.0
.target sm_80
.address_size 64

.visible .entry k(
    .param .u64 k_out,
    .param .u64 k_in
)
{
    .reg .pred %p<8>;
    .reg .b16 %rs<8>;
    .reg .b32 %r<32>;
    .reg .f32 %f<16>;
    .reg .b64 %rd<16>;
    .reg .f64 %fd<4>;
    ld.param.u64 %rd1, [k_out];
    ld.param.u64 %rd2, [k_in];
    mov.u32 %r0, %tid.x;
    mul.wide.u32 %rd3, %r0, 8;
    add.s64 %rd4, %rd1, %rd3;
    mov.u32 %r10, 0;
    mov.u32 %r11, 0;
"""
TAIL = """
    st.global.v2.u32 [%rd4], {%r10, %r11};
    ret;
}
"""


def ptx_of(body: str, wide: bool = False) -> str:
    return HEAD + body + ("\n    mov.b64 {%r10, %r11}, %rd10;" if wide else "") + TAIL


def run_body(body: str, wide: bool = False, threads: int = 32, inp: np.ndarray | None = None) -> np.ndarray:
    """``out[threads, 2]`` uint32 after running ``body`` (``inp``: bytes at ``%rd2``)."""
    out = np.zeros((threads, 2), dtype=np.uint32)
    inp = np.zeros(16, dtype=np.uint8) if inp is None else inp
    regions = [GlobalRegion("out", out.ctypes.data, out.reshape(-1).view(np.uint8), out.nbytes),
               GlobalRegion("in", inp.ctypes.data, inp.reshape(-1).view(np.uint8), inp.nbytes)]
    run_ptx(ptx_of(body, wide), [out.ctypes.data, inp.ctypes.data], regions, (1,), threads)
    return out


def f32(bits: int) -> float:
    return float(np.array(bits, dtype=np.uint32).view(np.float32))


def bits32(x: float) -> int:
    return int(np.array(x, dtype=np.float32).view(np.uint32))
