"""Mamba's state-space layers: ``selective_scan`` (Mamba-1 prefill) and ``selective_state_update``
(one decode step, Mamba-1 and Mamba-2) (``hexlayout.ops.*``, ``torch.ops.hexlayout.*``).

- ``selective_scan_args`` / ``state_update_args``: the argument checks;
- ``selective_scan`` / ``state_update``: host dispatch; ``selective_scan_kernel`` /
  ``state_update_kernel``: the kernels in the language (one kernel for every architecture);
- ``torch_selective``: the torch.library registrations.
"""

from ..host.torch import HAVE_TORCH
from .selective_scan import selective_scan
from .state_update import selective_state_update

if HAVE_TORCH:
    from . import torch_selective  # noqa: F401 - registers torch.ops.hexlayout.selective_scan / _state_update

__all__ = ["selective_scan", "selective_state_update"]
