"""Mamba's state-space layers as ``hexlayout.ops.*`` and ``torch.ops.hexlayout.*``:
``selective_scan`` (Mamba-1 prefill), ``selective_state_update`` (one decode step, Mamba-1 and
Mamba-2), ``ssd_scan`` (Mamba-2 prefill), and the depthwise causal convolution
(``causal_conv1d``, ``causal_conv1d_update``).

- ``selective_scan_args`` / ``state_update_args`` / ``conv1d_args`` / ``ssd_args``: the
  argument checks;
- ``selective_scan`` / ``state_update`` / ``conv1d`` / ``ssd``: host dispatch;
  ``*_kernel(s)``: the kernels in the language;
- ``torch_selective`` / ``torch_conv1d`` / ``torch_ssd``: the torch.library registrations.
"""

from ..host.torch import HAVE_TORCH
from .conv1d import causal_conv1d, causal_conv1d_update
from .selective_scan import selective_scan
from .ssd import ssd_scan
from .state_update import selective_state_update

if HAVE_TORCH:
    from . import (
        torch_conv1d,  # noqa: F401 - registers torch.ops.hexlayout.causal_conv1d(_update)
        torch_selective,  # noqa: F401 - registers torch.ops.hexlayout.selective_scan / _state_update
        torch_ssd,  # noqa: F401 - registers torch.ops.hexlayout.ssd_scan
    )

__all__ = ["selective_scan", "selective_state_update", "ssd_scan", "causal_conv1d", "causal_conv1d_update"]
