"""hexlayout's MLA decode as a vLLM attention backend on CUDA (``HEXLAYOUT_MLA``).

An MLA layer (DeepSeek-V2 / V3 / R1) caches one latent row ``[c_j, k_pe_j]`` per token
(``kv_lora_rank`` + ``qk_rope_head_dim`` wide, 512 + 64 for DeepSeek-V3) in a paged cache
``[num_blocks, block_size, rank + rope]``. vLLM's MLA backends share one common implementation
(``MLACommonImpl``): prefill requests run multi-head attention on the up-projected keys and
values, decode requests run multi-query attention with the absorbed query ``q = [W_UK^T q_nope,
q_pe]`` over the latent rows, ``out_b = sum_j softmax_j(scale * q_b . kv_j) c_j``
(``forward_mqa``), which the common code projects with ``W_UV``.

:class:`HexlayoutCUDAMLABackend` is vLLM's Triton MLA backend (its selector view, prefill,
metadata and fallback) with:

- ``forward_mqa``: ``torch.ops.hexlayout.mla_decode`` over the layer's latent cache
  (:func:`.mla.hexlayout_decode`), one query per decode request;
- ``do_kv_cache_update``: ``torch.ops.hexlayout.mla_reshape_and_cache``
  (:func:`.mla.write_latent_cache`) where the common impl calls ``concat_and_cache_mla``;
- :class:`HexlayoutMLAMetadataBuilder`: Triton MLA's builder whose decode metadata also carries
  the decode requests' ``query_start_loc`` (vLLM's persistent buffer: no copy, no host
  synchronization), so decode batches are captured in full CUDA graphs
  (``AttentionCGSupport.UNIFORM_BATCH``; vLLM's eager warm-up of each capture size builds the
  kernels before capture).

FP8 latent caches (``kv_cache_dtype`` "fp8" / "fp8_e4m3", as Triton MLA declares them) are
written as ``fp8(x / k_scale)`` and read as ``k_scale * fp8`` with the layer's ``_k_scale`` (a
device tensor: no host synchronization); Triton MLA's constructor, which the impl inherits,
refuses an FP8 MLA cache below compute capability 8.9. What hexlayout does not serve runs
Triton MLA and is logged once per reason: other cache formats (``fp8_ds_mla``), latent / rope
widths other than ``LATENTS`` / ``ROPES`` of ``hexlayout.ops.attention.mla`` (at construction,
:func:`.mla.mla_unsupported_reason`), and per batch several queries per decode request
(speculative decoding), non-causal decode blocks, decode context parallelism and float32
queries.

The plugin registers the backend as a new member of vLLM's ``AttentionBackendEnum``
(``AttentionBackendEnum.register("HEXLAYOUT_MLA", ...)``, :func:`register_cuda_mla`); the user
selects it with ``attention_backend="HEXLAYOUT_MLA"`` / ``--attention-backend HEXLAYOUT_MLA``
(for a model with both MLA and regular attention layers: ``attention_config={"backend_per_kind":
{"mla_attention": "HEXLAYOUT_MLA"}}``; vLLM parses the ``attention_config`` dict before the plugin
loads, so name the backend through ``attention_backend`` where a single one is selected). The
member pickles by name through :func:`backend_member`, so a config naming it reaches processes
the plugin has not run in yet.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import hexlayout.ops  # noqa: F401 - registers torch.ops.hexlayout.*
import torch
from vllm.model_executor.layers.attention.mla_attention import MLACommonDecodeMetadata
from vllm.v1.attention.backend import AttentionCGSupport
from vllm.v1.attention.backends.mla.triton_mla import (
    TritonMLABackend,
    TritonMLAImpl,
    TritonMLAMetadataBuilder,
)

from .log import logger
from .mla import HALVES, hexlayout_decode, mla_unsupported_reason, write_latent_cache

__all__ = [
    "BACKEND_NAME",
    "HexlayoutMLADecodeMetadata",
    "HexlayoutMLAMetadataBuilder",
    "HexlayoutCUDAMLAImpl",
    "HexlayoutCUDAMLABackend",
    "backend_member",
    "decode_fallback_reason",
    "register_cuda_mla",
]

#: The backend's name in vLLM's ``AttentionBackendEnum`` (what the user selects).
BACKEND_NAME = "HEXLAYOUT_MLA"

#: The per-batch fallback reasons this process has logged.
_logged_reasons: set[str] = set()


@dataclass
class HexlayoutMLADecodeMetadata(MLACommonDecodeMetadata):
    """vLLM's MLA decode metadata (``block_table [B, max_blocks]``, ``seq_lens [B]`` of the decode
    requests) and their ``query_start_loc [B+1]`` (int32, request ``b``'s queries are
    ``q[query_start_loc[b]:query_start_loc[b+1]]``)."""

    query_start_loc: torch.Tensor | None = None


class HexlayoutMLAMetadataBuilder(TritonMLAMetadataBuilder):
    """Triton MLA's metadata builder (vLLM's common MLA split of decode and prefill requests,
    decode requests first) whose decode metadata is :class:`HexlayoutMLADecodeMetadata`: views of
    vLLM's persistent input buffers only, so a captured decode graph replays with the lengths,
    block tables and slots of each step."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def _build_decode(self, block_table_tensor: torch.Tensor, seq_lens_device: torch.Tensor, max_seq_len: int,
                      query_start_loc_cpu: torch.Tensor, query_start_loc_device: torch.Tensor,
                      num_decode_tokens: int, max_query_len: int,
                      dcp_tot_seq_lens_device: torch.Tensor | None) -> HexlayoutMLADecodeMetadata:
        return HexlayoutMLADecodeMetadata(block_table=block_table_tensor, seq_lens=seq_lens_device,
                                          dcp_tot_seq_lens=dcp_tot_seq_lens_device,
                                          query_start_loc=query_start_loc_device)


def decode_fallback_reason(impl: Any, q: Any, attn_metadata: Any) -> str | None:
    """Why this batch's decode requests cannot run hexlayout's ``mla_decode`` (shapes and flags
    only: no host synchronization), or None."""
    first = q[0] if isinstance(q, tuple) else q
    dec = attn_metadata.decode
    if impl.hexlayout_reason is not None:
        return impl.hexlayout_reason
    if getattr(dec, "query_start_loc", None) is None:
        return "decode metadata from another builder"
    if first.dtype not in HALVES:
        return f"queries in {first.dtype}"
    if first.shape[0] != dec.seq_lens.shape[0]:
        return f"{first.shape[0]} queries for {dec.seq_lens.shape[0]} decode requests (speculative decoding)"
    if attn_metadata.causal is False:
        return "a non-causal decode block"
    if getattr(impl, "dcp_world_size", 1) > 1:
        return "decode context parallelism"
    return None


class HexlayoutCUDAMLAImpl(TritonMLAImpl):
    """Triton MLA's impl whose decode and latent-cache write are hexlayout's kernels (see the
    module docstring); the prefill and every fallback are vLLM's."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hexlayout_reason = mla_unsupported_reason(self)

    def forward_mqa(self, q: Any, kv_c_and_k_pe_cache: torch.Tensor, attn_metadata: Any,
                    layer: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(out [B, H, kv_lora_rank], lse [B, H])`` of the decode requests by
        :func:`.mla.hexlayout_decode`; Triton MLA's where :func:`decode_fallback_reason` says why."""
        why = decode_fallback_reason(self, q, attn_metadata)
        if why is not None:
            if why not in _logged_reasons:
                _logged_reasons.add(why)
                logger.info("hexlayout: MLA decode runs vLLM's Triton MLA (%s)", why)
            return super().forward_mqa(q, kv_c_and_k_pe_cache, attn_metadata, layer)
        dec = attn_metadata.decode
        return hexlayout_decode(self, q, kv_c_and_k_pe_cache, dec.query_start_loc, dec.seq_lens,
                                dec.block_table, layer)

    def do_kv_cache_update(self, kv_c_normed: torch.Tensor, k_pe: torch.Tensor, kv_cache: torch.Tensor,
                           slot_mapping: torch.Tensor, kv_cache_dtype: str, k_scale: torch.Tensor) -> None:
        """The step's latents and rope keys into the cache (:func:`.mla.write_latent_cache`),
        else vLLM's ``concat_and_cache_mla``."""
        if not write_latent_cache(self, kv_c_normed, k_pe, kv_cache, slot_mapping, k_scale):
            super().do_kv_cache_update(kv_c_normed, k_pe, kv_cache, slot_mapping, kv_cache_dtype, k_scale)


class HexlayoutCUDAMLABackend(TritonMLABackend):
    """The ``HEXLAYOUT_MLA`` backend: Triton MLA's selector view (dtypes f16 / bf16, cache dtypes,
    block sizes multiples of 16) on devices of compute capability 8.x / 9.0 / 10.0, with
    :class:`HexlayoutCUDAMLAImpl` and :class:`HexlayoutMLAMetadataBuilder`."""

    @staticmethod
    def get_name() -> str:
        return BACKEND_NAME

    @staticmethod
    def get_impl_cls() -> type[HexlayoutCUDAMLAImpl]:
        return HexlayoutCUDAMLAImpl

    @staticmethod
    def get_builder_cls() -> type[HexlayoutMLAMetadataBuilder]:
        return HexlayoutMLAMetadataBuilder

    @classmethod
    def supports_compute_capability(cls, capability: Any) -> bool:
        return capability.major == 8 or (capability.major, capability.minor) in ((9, 0), (10, 0))


def backend_path() -> str:
    """The backend class's qualified name (the enum member's value)."""
    return f"{HexlayoutCUDAMLABackend.__module__}.{HexlayoutCUDAMLABackend.__qualname__}"


def backend_member() -> Any:
    """vLLM's ``AttentionBackendEnum.HEXLAYOUT_MLA``, registered on first use. The member pickles
    as a call of this function (an enum member pickles by value, which a process without the
    member could not resolve)."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum

    if BACKEND_NAME not in AttentionBackendEnum.__members__:
        member = AttentionBackendEnum.register(BACKEND_NAME, backend_path())
        member.__reduce_ex__ = lambda protocol: (backend_member, ())
    return AttentionBackendEnum[BACKEND_NAME]


def register_cuda_mla() -> str:
    """Register :class:`HexlayoutCUDAMLABackend` as vLLM's ``HEXLAYOUT_MLA`` attention backend
    (idempotent); returns what was added, for the log."""
    backend_member()
    return (f"attention backend {BACKEND_NAME} -> {backend_path()} (select it with "
            f"attention_backend={BACKEND_NAME})")
