"""GEMM kernels in the tile language, layout-free, with a fused epilogue.

``c[M, N] = act(scale * (a[M, K] @ B) + bias[N]) + residual[M, N]`` where ``B`` is
``b[N, K]^T`` (``b_layout="nk"``, K-major) or ``b[K, N]`` (``b_layout="kn"``, N-major),
f16 or bf16 inputs, f32 accumulation, output in the input type. The epilogue is applied
to the accumulator in registers before the single store (post-scheduling fusion of a
bijective epilogue into the anchor's store).

- ``gemm_sm80_kernel``: multistage cp.async pipeline (``STAGES`` shared buffers, one
  barrier per k-tile), shared -> register copies and mma.sync; synthesis picks the
  swizzles, ldmatrix (.trans for an N-major B), the mma atom and the warp arrangement.
- ``gemm_sm90_kernel``: warp-specialized: warp group 0 issues TMA copies into
  ``STAGES`` stages (``full``/``empty`` mbarriers), the consumer warp groups run wgmma
  from shared memory and the epilogue; register budgets move with setmaxnreg. Persistent
  over output tiles: ``GRID`` blocks walk the tiles (``GRID = 0``: one block per tile).

Kernels are built by factories specialized on the dtype, the B layout and the epilogue
(these change the signature); tile shapes are keyword constants of the kernel.
"""

# Annotations are evaluated when a kernel is defined (no ``from __future__ import annotations``):
# the tensor types depend on the factory's arguments.
from functools import cache
from typing import Any

import hexlayout.lang as hl
from hexlayout.arch.dtypes import DType
from hexlayout.lang import f32

__all__ = ["gemm_sm80_kernel", "gemm_sm90_kernel", "ACTIVATIONS", "Epilogue"]

M, N, K = hl.dims("M N K")

ACTIVATIONS = ("none", "relu", "gelu", "silu")

Epilogue = tuple[bool, bool, str, bool]   # (has_bias, has_residual, activation, has_scale)


def _epilogue(acc: Any, ep: Epilogue, bias: Any, residual: Any, scale: Any, m0: Any, n0: Any,
              bm: int, bn: int, dt: DType) -> Any:
    has_bias, has_res, act, has_scale = ep
    y = acc
    if has_scale:
        y = y * scale
    if has_bias:
        rb = hl.register(dt, (bn,))
        hl.copy(hl.view(bias, tile=(bn,), origin=(n0,)), rb)
        y = y + hl.cast(rb, f32)
    if act == "relu":
        y = hl.where(y < 0.0, 0.0, y)       # NaN stays NaN, as torch.relu (max.f32 would give 0)
    elif act == "gelu":
        y = hl.gelu(y)
    elif act == "silu":
        y = hl.silu(y)
    if has_res:
        rr = hl.register(dt, (bm, bn))
        hl.copy(hl.view(residual, tile=(bm, bn), origin=(m0, n0)), rr)
        y = y + hl.cast(rr, f32)
    return y


def _check(dtype: DType, b_layout: str, ep: Epilogue) -> None:
    if dtype.name not in ("f16", "bf16"):
        raise ValueError(f"hexlayout gemm: inputs must be f16 or bf16, not {dtype}")
    if b_layout not in ("nk", "kn"):
        raise ValueError(f"hexlayout gemm: b_layout must be 'nk' (b is N x K) or 'kn' (b is K x N), "
                         f"not {b_layout!r}")
    if ep[2] not in ACTIVATIONS:
        raise ValueError(f"hexlayout gemm: activation must be one of {', '.join(ACTIVATIONS)}, not {ep[2]!r}")


@cache
def gemm_sm80_kernel(dtype: DType, b_layout: str = "nk", ep: Epilogue = (False, False, "none", False)) -> Any:
    """The Ampere multistage GEMM for ``dtype`` / ``b_layout`` / epilogue ``ep``."""
    _check(dtype, b_layout, ep)
    dt = dtype
    b_shape = (N, K) if b_layout == "nk" else (K, N)

    @hl.kernel(threads=lambda c: 32 * c["WARPS"], name=f"gemm_sm80_{dt}_{b_layout}_{_ep_name(ep)}")
    def gemm(a: dt[M, K], b: dt[b_shape], c: dt[M, N], bias: dt[N], residual: dt[M, N],  # type: ignore
             scale: f32, *, BM: int = 128, BN: int = 128, BK: int = 32, STAGES: int = 3, WARPS: int = 4):
        Mx, Kx = a.shape
        Nx = c.shape[1]
        pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(Mx, BM), hl.cdiv(Nx, BN)))
        m0, n0 = pid_m * BM, pid_n * BN
        num_k = hl.cdiv(Kx, BK)
        sa = hl.shared(dt, (BM, BK, STAGES))
        sb = hl.shared(dt, (BN, BK, STAGES) if b_layout == "nk" else (BK, BN, STAGES))
        acc = hl.zeros((BM, BN), f32)

        def load(kt: Any, s: Any) -> None:
            hl.copy(hl.view(a, tile=(BM, BK), origin=(m0, kt * BK)), sa[:, :, s])
            if b_layout == "nk":
                hl.copy(hl.view(b, tile=(BN, BK), origin=(n0, kt * BK)), sb[:, :, s])
            else:
                hl.copy(hl.view(b, tile=(BK, BN), origin=(kt * BK, n0)), sb[:, :, s])

        for s in range(STAGES - 1):
            load(s, s)
            hl.commit_group()
        for k in hl.range(num_k):
            hl.wait_group(STAGES - 2)
            hl.syncthreads()
            kn = k + (STAGES - 1)
            load(kn, kn % STAGES)
            hl.commit_group()
            s = k % STAGES
            ra = hl.register(dt, (BM, BK))
            rb = hl.register(dt, (BN, BK))
            hl.copy(sa[:, :, s], ra)
            hl.copy(sb[:, :, s] if b_layout == "nk" else sb[:, :, s].T, rb)
            hl.mma(ra, rb, acc)
        hl.wait_group(0)
        y = _epilogue(acc, ep, bias, residual, scale, m0, n0, BM, BN, dt)
        hl.copy(hl.cast(y, dt), hl.view(c, tile=(BM, BN), origin=(m0, n0)))

    return gemm


@cache
def gemm_sm90_kernel(dtype: DType, b_layout: str = "nk", ep: Epilogue = (False, False, "none", False)) -> Any:
    """The Hopper warp-specialized, persistent TMA + wgmma GEMM."""
    _check(dtype, b_layout, ep)
    dt = dtype
    b_shape = (N, K) if b_layout == "nk" else (K, N)

    @hl.kernel(threads=lambda c: 128 * (1 + c["CONSUMERS"]), name=f"gemm_sm90_{dt}_{b_layout}_{_ep_name(ep)}")
    def gemm(a: dt[M, K], b: dt[b_shape], c: dt[M, N], bias: dt[N], residual: dt[M, N],  # type: ignore
             scale: f32, *, BM: int = 128, BN: int = 256, BK: int = 64, STAGES: int = 4, CONSUMERS: int = 2,
             GRID: int = 0):
        Mx, Kx = a.shape
        Nx = c.shape[1]
        tiles_m, tiles_n = hl.cdiv(Mx, BM), hl.cdiv(Nx, BN)
        num_tiles = tiles_m * tiles_n
        num_k = hl.cdiv(Kx, BK)
        sa = hl.shared(dt, (BM, BK, STAGES))
        sb = hl.shared(dt, (BN, BK, STAGES) if b_layout == "nk" else (BK, BN, STAGES))
        full = hl.mbarrier(STAGES)
        empty = hl.mbarrier(STAGES)
        for s in range(STAGES):
            hl.mbarrier_init(full, s, arrivals=1)
            hl.mbarrier_init(empty, s, arrivals=CONSUMERS)
        hl.syncthreads()
        if GRID:
            pid = hl.grid(hl.spatial(GRID))
            my_tiles = hl.cdiv(hl.maximum(num_tiles - pid, 0), GRID)
        else:
            pid = hl.grid(hl.spatial(num_tiles))
            my_tiles = 1
        stage_bytes = sa[:, :, 0].nbytes + sb[:, :, 0].nbytes
        with hl.warp_group(0):
            hl.setmaxnreg(40, increase=False)
            for t in hl.range(my_tiles):
                tile = pid + t * (GRID or 1)
                m0, n0 = (tile // tiles_n) * BM, (tile % tiles_n) * BN
                for k in hl.range(num_k):
                    it = t * num_k + k
                    s = it % STAGES
                    hl.wait(empty, s, phase=((it // STAGES) % 2) ^ 1)
                    hl.arrive(full, s, tx_bytes=stage_bytes, who="one")
                    hl.copy(hl.view(a, tile=(BM, BK), origin=(m0, k * BK)), sa[:, :, s], mbarrier=full[s])
                    if b_layout == "nk":
                        hl.copy(hl.view(b, tile=(BN, BK), origin=(n0, k * BK)), sb[:, :, s], mbarrier=full[s])
                    else:
                        hl.copy(hl.view(b, tile=(BK, BN), origin=(k * BK, n0)), sb[:, :, s], mbarrier=full[s])
        with hl.else_():
            hl.setmaxnreg(232, increase=True)
            for t in hl.range(my_tiles):
                tile = pid + t * (GRID or 1)
                m0, n0 = (tile // tiles_n) * BM, (tile % tiles_n) * BN
                acc = hl.zeros((BM, BN), f32)
                for k in hl.range(num_k):
                    it = t * num_k + k
                    s = it % STAGES
                    hl.wait(full, s, phase=(it // STAGES) % 2)
                    hl.wgmma_fence()
                    hl.mma(sa[:, :, s], sb[:, :, s] if b_layout == "nk" else sb[:, :, s].T, acc,
                           warps=hl.spatial(CONSUMERS, 1))
                    hl.wgmma_commit()
                    # keep one wgmma group in flight: the previous k-tile's has retired, release its stage
                    hl.wgmma_wait(1)
                    with hl.if_(k > 0):
                        hl.arrive(empty, (it + STAGES - 1) % STAGES, who="warpgroup")
                hl.wgmma_wait(0)
                with hl.if_(num_k > 0):
                    hl.arrive(empty, (t * num_k + num_k - 1) % STAGES, who="warpgroup")
                y = _epilogue(acc, ep, bias, residual, scale, m0, n0, BM, BN, dt)
                hl.copy(hl.cast(y, dt), hl.view(c, tile=(BM, BN), origin=(m0, n0)))

    return gemm


def _ep_name(ep: Epilogue) -> str:
    has_bias, has_res, act, has_scale = ep
    parts = [act] + ["bias"] * has_bias + ["res"] * has_res + ["scale"] * has_scale
    return "_".join(parts)
