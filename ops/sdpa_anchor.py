"""The attention anchor of post-scheduling fusion: the FlashAttention-2 forward of
``hexlayout.lang.examples.flash_attention`` (``o[B, Sq, H, D] = softmax(q k^T * scale
[+ causal mask]) v``, f16, grouped-query heads), with tile constants per problem.
Importing this module registers it with ``hexlayout.fusion`` (``register_attention``).
"""

from __future__ import annotations

from typing import Any

__all__ = ["sdpa_anchor", "sdpa_consts"]


def sdpa_anchor() -> Any:
    """The anchor kernel (parameters ``q``, ``k``, ``v``, ``o`` in ``[B, S, heads, D]`` and
    ``qk_scale = scale * log2(e)``; constant ``CAUSAL``)."""
    from hexlayout.lang.examples.flash_attention import flash_attention_fwd

    return flash_attention_fwd


def sdpa_consts(sq: int, sk: int, d: int, causal: bool, emulated: bool) -> dict[str, Any]:
    """Tile constants: the example's compiled configuration on a GPU (``HEAD_DIM = 128``,
    so ``d <= 128``); small tiles in the emulator (one warp, 16 query rows, ``HEAD_DIM``
    the next power of two >= ``d``, at least 16)."""
    if not emulated:
        return {"BM": 128, "BN": 32, "HEAD_DIM": 128, "WARPS": 8, "CAUSAL": causal}
    hd = 16
    while hd < d:
        hd *= 2
    return {"BM": 16, "BN": 16, "HEAD_DIM": hd, "WARPS": 1, "CAUSAL": causal}


def _register() -> None:
    from hexlayout.fusion.anchors import register_attention

    register_attention(sdpa_anchor, sdpa_consts)


_register()
