"""Planted wrong kernels: the stage must fail a run that uses one (``HEXLAYOUT_VLLM_PLANT``).

``install(name)`` makes the plugin's attention (hexlayout's own classes, not vLLM's) compute
something subtly wrong, as a kernel bug would:

- ``swap_kv``: paged attention reads each cache block's V half as K and its K half as V (the
  cache is written correctly; only the attention kernel's reads are swapped).
"""

from __future__ import annotations

from typing import Any

PLANTS = ("swap_kv",)


def _swapped_halves(kv_cache: Any) -> Any:
    """vLLM's CPU cache ``[NB, KVH, BS, 2*D]`` with each (block, head)'s K and V halves swapped."""
    import torch

    nb, kvh, bs, d2 = kv_cache.shape
    both = kv_cache.view(nb, kvh, 2 * bs, d2 // 2)
    return torch.cat([both[:, :, bs:], both[:, :, :bs]], dim=2).view(kv_cache.shape)


def install(name: str) -> None:
    if name not in PLANTS:
        raise ValueError(f"HEXLAYOUT_VLLM_PLANT={name!r}: not one of {', '.join(PLANTS)}")
    from hexlayout.integrations.vllm import attention

    class SwappedKV(attention.HexlayoutCPUAttentionImpl):
        def forward(self, layer: Any, query: Any, key: Any, value: Any, kv_cache: Any, *args: Any,
                    **kwargs: Any) -> Any:
            return super().forward(layer, query, key, value, _swapped_halves(kv_cache), *args, **kwargs)

    attention.HexlayoutCPUAttentionBackend.get_impl_cls = staticmethod(lambda: SwappedKV)
