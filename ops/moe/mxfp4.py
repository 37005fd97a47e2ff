"""MXFP4 expert weights (OCP microscaling, as gpt-oss ships its experts) for the fused MoE:
``prepare_mxfp4`` re-lays them out once into ``WNA16Weights`` of format ``"mxfp4"``, which
``fused_moe`` runs as W4A16 through the W4A16 kernels (sm_80 / sm_89 mma.sync, sm_90a swap-AB
wgmma), the 4-bit values declared ``e2m1`` and converted by ``hl.cast`` (a bit trick, no table).

The checkpoint of a projection ``y = x @ W`` (input dim ``K``, output dim ``N``; ``w13``: ``K =
H``, ``N = 2I`` rows ``[gate | up]``; ``w2``: ``K = I``, ``N = H``) stacked over ``E`` experts,
as vLLM and gpt-oss store it, transposed (``W^T`` row ``n``):

- ``weight`` uint8 ``[E, N, K/2]``: value ``k`` of row ``n`` in byte ``k // 2``, the low nibble
  for even ``k``; an e2m1 code ``c`` (sign ``c >> 3``, exponent ``(c >> 1) & 3`` with bias 1,
  mantissa ``c & 1``) is ``0, 0.5, 1, 1.5, 2, 3, 4, 6`` for ``c = 0 .. 7`` and their negatives
  for ``8 .. 15``;
- ``scales`` uint8 e8m0 ``[E, N, K/32]``: ``2^(s - 127)``, one per 32 consecutive values of a
  row (255 is NaN);

    W^T[e, n, k] = e2m1(q[e, n, k]) * 2^(s[e, n, k // 32] - 127)

The scales stay e8m0 bytes (one byte per 32 weights, as the checkpoint stores them: the prepared
tensors take the checkpoint's bytes), transposed once to ``[E, K/32, N]`` as the W4A16 kernels
read them (group 32, no zero point); the kernels convert each group's bytes once to the
activations' dtype (``dtype``): ``2^(s - 127)`` by its exponent bits (``wna16_kernels_sm80._e8m0``).
That is exact in bf16 (every ``2^(s-127)``, ``s < 255``, is a bf16 number); in f16 only
``2^-24 .. 2^15`` exist, another scale is an ``ArgumentError`` naming ``scales`` at preparation
(a product ``e2m1 * scale`` beyond f16's range is ``inf``, as the f16 dequantized weight is).
The kernels' product ``e2m1 * scale`` is then exact (a 2-bit significand times a power of two)
but where it leaves the dtype's normal range.
"""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.args import ArgumentError, ArgumentTypeError

from ..host.torch import require_torch
from .wna16 import WNA16Weights, _relayout

__all__ = ["prepare_mxfp4", "MXFP4_GROUP", "E2M1_VALUES"]

OP = "hexlayout.prepare_mxfp4"
#: values of one e8m0 scale along K
MXFP4_GROUP = 32
#: the e2m1 value of each code 0 .. 15 (OCP Microscaling Formats spec v1.0, FP4 E2M1)
E2M1_VALUES = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
#: the e8m0 exponents ``s - 127`` of the scales each activation dtype represents exactly
_EXPONENTS = {"float16": (-24, 15), "bfloat16": (-127, 127)}


def _fail(name: str, msg: str) -> ArgumentError:
    return ArgumentError(OP, name, msg)


def _uint8_3d(name: str, t: Any, what: str) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        raise ArgumentTypeError(OP, name, f"expected a uint8 tensor {what}, got {type(t).__name__}")
    if t.dtype != torch.uint8 or t.dim() != 3:
        raise _fail(name, f"must be a uint8 tensor {what}, got a {t.dtype} tensor of shape {tuple(t.shape)}")


def _check(weight: Any, scales: Any, dtype: Any) -> tuple[int, int, int]:
    """``(E, N, K)`` of valid checkpoint tensors (see ``prepare_mxfp4``)."""
    import torch

    if dtype not in (torch.float16, torch.bfloat16):
        raise _fail("dtype", f"must be torch.float16 or torch.bfloat16 (the activations' dtype), got "
                    f"{dtype!r}")
    _uint8_3d("weight", weight, "[E, N, K/2] (two e2m1 values per byte)")
    _uint8_3d("scales", scales, "[E, N, K/32] (e8m0 exponents)")
    e, n, k = weight.shape[0], weight.shape[1], 2 * weight.shape[2]
    if e == 0 or n == 0 or k == 0:
        raise _fail("weight", f"has an empty dimension: shape {tuple(weight.shape)}")
    if k % MXFP4_GROUP or n % 8:
        raise _fail("weight", f"K = {k} must be a multiple of 32 (one scale per 32 values) and N = {n} of 8 "
                    f"(16-byte rows): shape {tuple(weight.shape)}")
    if tuple(scales.shape) != (e, n, k // MXFP4_GROUP):
        raise _fail("scales", f"must have shape [E, N, K/32] = {[e, n, k // MXFP4_GROUP]} for weight "
                    f"{tuple(weight.shape)}, got {list(scales.shape)}")
    if scales.device != weight.device:
        raise _fail("scales", f"is on {scales.device}, weight on {weight.device}")
    return e, n, k


def _scales(scales: Any, dtype: Any) -> Any:
    """The e8m0 bytes ``[E, K/32, N]`` (uint8), after checking every ``2^(s - 127)`` is exact
    in ``dtype``."""
    lo, hi = _EXPONENTS[str(dtype).replace("torch.", "")]
    if scales.numel():
        smin, smax = int(scales.min()), int(scales.max())
        if smax == 255:
            raise _fail("scales", "holds 255, e8m0's NaN: a checkpoint scale must be a power of two")
        if smin - 127 < lo or smax - 127 > hi:
            raise _fail("scales", f"holds exponents 2^{smin - 127} .. 2^{smax - 127}; {dtype} represents "
                        f"2^{lo} .. 2^{hi} exactly (bfloat16 activations take every e8m0 scale)")
    return scales.transpose(1, 2).contiguous()


def prepare_mxfp4(weight: Any, scales: Any, *, dtype: Any, gate_up: bool = False,
                  arch: str | None = None) -> WNA16Weights:
    """MXFP4 expert weights (see the module docstring) re-laid out for ``fused_moe``: a
    ``WNA16Weights`` of format ``"mxfp4"`` (4-bit e2m1 codes in ``prepare_wna16``'s layout,
    group 32, no zero point), its ``scales`` the e8m0 bytes ``[E, K/32, N]`` (uint8; the kernels
    convert them to ``dtype``, the weights' ``dtype``). ``gate_up`` / ``arch``
    as ``prepare_wna16``'s: the weights take the offline layout synthesized for ``arch``'s kernel
    (pass ``gate_up=True`` for the ``w13`` projection).

    Raises ``ArgumentError`` / ``ArgumentTypeError`` naming the argument: ``dtype`` not float16 /
    bfloat16; ``weight`` / ``scales`` not uint8 3-d tensors, of mismatched shapes or devices, K
    not a multiple of 32 or N of 8; a scale of 255 (NaN) or, for float16, outside ``2^-24 ..
    2^15``."""
    require_torch("hexlayout.ops.prepare_mxfp4")
    import torch

    e, n, k = _check(weight, scales, dtype)
    s = _scales(scales, dtype)
    codes = torch.stack([weight & 15, weight >> 4], dim=-1).reshape(e, n, k)   # even k: the low nibble
    return _relayout(codes.transpose(1, 2), s, None, "mxfp4", 4, MXFP4_GROUP, gate_up, arch, None, dtype)
