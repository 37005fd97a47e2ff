"""Mamba's kernels: the depthwise causal convolution (``causal_conv1d``, ``causal_conv1d_update``)
and the Mamba-2 SSD scan (``ssd_scan``) as ``hexlayout.ops.*`` and ``torch.ops.hexlayout.*``.

- ``conv1d_kernels`` / ``conv1d_args`` / ``conv1d`` / ``torch_conv1d``: the convolution's
  kernels, argument checks, host dispatch and torch.library registration;
- ``ssd_kernels`` / ``ssd_args`` / ``ssd`` / ``torch_ssd``: the same for the SSD scan.
"""

from ..host.torch import HAVE_TORCH
from .conv1d import causal_conv1d, causal_conv1d_update
from .ssd import ssd_scan

if HAVE_TORCH:
    from . import (
        torch_conv1d,  # noqa: F401 - registers torch.ops.hexlayout.causal_conv1d(_update)
        torch_ssd,  # noqa: F401 - registers torch.ops.hexlayout.ssd_scan
    )

__all__ = ["causal_conv1d", "causal_conv1d_update", "ssd_scan"]
