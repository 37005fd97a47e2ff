"""The paged KV cache: ``reshape_and_cache`` scatters new K/V rows into the cache through a
slot mapping (``hexlayout.ops.reshape_and_cache``, ``torch.ops.hexlayout.reshape_and_cache``).

- ``args``: the argument check; ``op``: the kernel and host dispatch; ``torch_op``: the
  torch.library registration.
"""

from ..host.torch import HAVE_TORCH
from .op import reshape_and_cache

if HAVE_TORCH:
    from . import torch_op  # noqa: F401 - registers torch.ops.hexlayout.reshape_and_cache

__all__ = ["reshape_and_cache"]
