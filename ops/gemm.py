"""``hexlayout.ops.gemm``: the GEMM with a fused epilogue, as a function and a torch op.

``gemm(a, b, bias=None, residual=None, activation="none", scale=None, b_layout="nk")``
returns ``c = act(scale * (a @ B) + bias) + residual`` with ``B = b^T`` for ``b`` of shape
``N x K`` (``b_layout="nk"``) or ``B = b`` for ``K x N`` (``"kn"``); f16 or bf16 inputs
(all tensors the same type), fp32 accumulation, output in the input type.

- CUDA tensors: the kernel for the device's architecture (sm_80 / sm_89: multistage
  cp.async + ldmatrix + mma.sync; sm_90a: warp-specialized persistent TMA + wgmma) is
  synthesized, compiled and cached on first use per (dtype, B layout, epilogue, config),
  then launched on torch's current stream. The config comes from the autotuner's
  persisted choice when there is one, else from the shape heuristic; ``autotune=True``
  times the config space once for the shape and remembers the winner.
- CPU tensors: run in the thread-level emulator when ``HEXLAYOUT_EMULATE=1`` (small
  sizes, for tests; ``HEXLAYOUT_EMULATE_ARCH`` picks the architecture, default sm_80);
  otherwise a clear error.

Requirements checked before launch: 2-D tensors of one dtype on one device; shapes that
agree; row-major contiguous operands whose rows are 16-byte aligned (K, and N for
``"kn"``, multiples of 8) as the 16-byte vector / TMA copies need.
"""

from __future__ import annotations

import os
from typing import Any

from .gemm_config import CONFIGS, Autotuner, GemmConfig, choose_config
from .gemm_kernels import ACTIVATIONS, gemm_sm80_kernel, gemm_sm90_kernel

__all__ = ["gemm", "gemm_build", "device_arch"]

_FACTORY = {"sm_80": gemm_sm80_kernel, "sm_89": gemm_sm80_kernel, "sm_90a": gemm_sm90_kernel}
_LAUNCHERS: dict[tuple, Any] = {}


def device_arch(capability: tuple[int, int]) -> str:
    """The hexlayout target for a CUDA compute capability."""
    major, minor = capability
    if major == 9:
        return "sm_90a"
    if (major, minor) == (8, 9):
        return "sm_89"
    if major == 8:
        return "sm_80"
    raise ValueError(f"hexlayout.gemm: compute capability {major}.{minor} is not supported "
                     "(supported: 8.0-8.9 (sm_80, sm_89) and 9.0 (sm_90a))")


def _dtype(t: Any) -> Any:
    import torch

    from hexlayout.lang import bf16, f16

    table = {torch.float16: f16, torch.bfloat16: bf16}
    if t.dtype not in table:
        raise ValueError(f"hexlayout.gemm: a has dtype {t.dtype}; supported: torch.float16, torch.bfloat16")
    return table[t.dtype]


def _check(a: Any, b: Any, bias: Any, residual: Any, activation: str, b_layout: str) -> tuple[int, int, int]:
    if b_layout not in ("nk", "kn"):
        raise ValueError(f"hexlayout.gemm: b_layout must be 'nk' (b is N x K) or 'kn' (b is K x N), "
                         f"not {b_layout!r}")
    if activation not in ACTIVATIONS:
        raise ValueError(f"hexlayout.gemm: activation must be one of {', '.join(ACTIVATIONS)}, "
                         f"not {activation!r}")
    for name, t in (("a", a), ("b", b)):
        if t.dim() != 2:
            raise ValueError(f"hexlayout.gemm: {name} must be a matrix (2 dimensions), got shape "
                             f"{tuple(t.shape)}")
    m, k = a.shape
    n, kb = (b.shape[0], b.shape[1]) if b_layout == "nk" else (b.shape[1], b.shape[0])
    if kb != k:
        raise ValueError(f"hexlayout.gemm: a is {m} x {k} but b ({b_layout}) has K = {kb}")
    for name, t, shape in (("b", b, None), ("bias", bias, (n,)), ("residual", residual, (m, n))):
        if t is None:
            continue
        if t.dtype != a.dtype:
            raise ValueError(f"hexlayout.gemm: {name} has dtype {t.dtype}, a has {a.dtype}")
        if t.device != a.device:
            raise ValueError(f"hexlayout.gemm: {name} is on {t.device}, a on {a.device}")
        if shape is not None and tuple(t.shape) != shape:
            raise ValueError(f"hexlayout.gemm: {name} must have shape {shape}, got {tuple(t.shape)}")
    return m, n, k


def gemm_build(dtype: Any, b_layout: str, epilogue: tuple[bool, bool, str, bool], arch: str,
               config: GemmConfig, m: int, n: int, compile: bool = True) -> Any:
    """The build of the GEMM kernel specialized as given (memoized by ``runtime.build``)."""
    from hexlayout.runtime import build

    kernel = _FACTORY[arch](dtype, b_layout, epilogue)
    return build(kernel, "sm_90a" if arch == "sm_90a" else arch, compile=compile, **config.consts(m, n))


def _config(key: str, arch: str, m: int, n: int, k: int, autotune: bool, timer: Any) -> GemmConfig:
    tuner = Autotuner()
    hit = tuner.lookup(key, m, n, k)
    if hit is not None and hit.arch == arch:
        return hit
    if autotune and timer is not None:
        return tuner.tune(key, m, n, k, CONFIGS[arch], timer)
    return choose_config(arch, m, n, k)


def gemm(a: Any, b: Any, bias: Any = None, residual: Any = None, activation: str = "none",
         scale: float | None = None, b_layout: str = "nk", *, config: GemmConfig | None = None,
         autotune: bool = False) -> Any:
    """``act(scale * (a @ B) + bias) + residual`` (see the module docstring)."""
    import torch

    m, n, k = _check(a, b, bias, residual, activation, b_layout)
    dtype = _dtype(a)
    ep = (bias is not None, residual is not None, activation, scale is not None)
    c = torch.empty((m, n), dtype=a.dtype, device=a.device)
    if m == 0 or n == 0:
        return c
    if k == 0:
        return _epilogue_only(c.zero_(), bias, residual, activation, scale)
    bias_arg = bias if bias is not None else c[0] if m else c.new_empty(n)
    res_arg = residual if residual is not None else c
    scale_arg = float(scale) if scale is not None else 1.0
    key = f"gemm/{a.dtype}/{b_layout}/{activation}/{int(ep[0])}{int(ep[1])}{int(ep[3])}"
    if a.is_cuda:
        from hexlayout.runtime.launch import Launcher

        arch = device_arch(torch.cuda.get_device_capability(a.device))

        def timer(cfg: GemmConfig) -> float:  # pragma: no cover - GPU only
            lau = Launcher(gemm_build(dtype, b_layout, ep, arch, cfg, m, n))
            args = (a, b, c, bias_arg, res_arg, scale_arg)
            for _ in range(3):
                lau(*args)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(10):
                lau(*args)
            end.record()
            torch.cuda.synchronize()
            return start.elapsed_time(end) / 10 / 1e3

        cfg = config or _config(key, arch, m, n, k, autotune, timer)
        lkey = (key, arch, cfg, cfg.consts(m, n).get("GRID", 0))
        if lkey not in _LAUNCHERS:
            _LAUNCHERS[lkey] = Launcher(gemm_build(dtype, b_layout, ep, arch, cfg, m, n))
        _LAUNCHERS[lkey](a, b, c, bias_arg, res_arg, scale_arg)
        return c
    if os.environ.get("HEXLAYOUT_EMULATE") != "1":
        raise RuntimeError("hexlayout.gemm: CPU tensors need HEXLAYOUT_EMULATE=1 (thread-level emulator, "
                           "small "
                           "sizes) or CUDA tensors on an sm_80 / sm_89 / sm_90a GPU")
    from hexlayout.runtime.emulate import emulate

    arch = os.environ.get("HEXLAYOUT_EMULATE_ARCH", "sm_80")
    if arch not in _FACTORY:
        raise ValueError(f"hexlayout.gemm: HEXLAYOUT_EMULATE_ARCH={arch!r}; "
                         f"supported: {', '.join(_FACTORY)}")
    cfg = config or choose_config(arch, m, n, k)
    bld = gemm_build(dtype, b_layout, ep, arch, cfg, m, n, compile=False)
    emulate(bld, a.contiguous(), b.contiguous(), c, bias_arg.contiguous(), res_arg.contiguous(), scale_arg)
    return c


def _epilogue_only(c: Any, bias: Any, residual: Any, activation: str, scale: float | None) -> Any:
    """K = 0: the product is zero; apply the epilogue in torch (no kernel launch needed)."""
    import torch

    y = c.float()
    if bias is not None:
        y = y + bias.float()
    if activation == "relu":
        y = torch.relu(y)
    elif activation == "gelu":
        y = torch.nn.functional.gelu(y, approximate="tanh")
    elif activation == "silu":
        y = torch.nn.functional.silu(y)
    if residual is not None:
        y = y + residual.float()
    del scale
    return y.to(c.dtype)
