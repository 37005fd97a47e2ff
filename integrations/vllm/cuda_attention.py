"""hexlayout's paged attention as a vLLM attention backend on CUDA (``AttentionBackendEnum.CUSTOM``).

vLLM's CUDA platform picks its own backends (FlashAttention, FlashInfer, Triton) unless the user
selects one, so the plugin registers :class:`HexlayoutCUDAAttentionBackend` under the ``CUSTOM``
entry (``register_backend``) and the user selects it: ``--attention-backend CUSTOM`` or
``LLM(..., attention_backend="CUSTOM")`` (``attention_config={"backend": "CUSTOM"}``).

The backend follows vLLM's FlashAttention backend interface (the KV cache update is a separate
step, ``forward_includes_kv_cache_update = False``), with its own metadata
(:class:`HexlayoutAttentionMetadata`, built from vLLM's ``CommonAttentionMetadata``) and impl
(:class:`HexlayoutCUDAAttentionImpl`):

- the cache vLLM hands a layer is its logical ``[num_blocks, KVH, block_size, 2*D]`` view (any
  physical layout); hexlayout reads it as vLLM's FlashAttention does, ``transpose(1, 2)`` then
  K = ``[..., :D]``, V = ``[..., D:]``: two ``[NB, BS, KVH, D]`` ("NHD") strided views whose
  last dimension is contiguous (:func:`split_kv_cache`);
- ``do_kv_cache_update`` writes the step's keys and values with
  ``torch.ops.hexlayout.reshape_and_cache`` (slot ``s`` = row ``s % BS`` of block ``s // BS``;
  negative slots skipped);
- ``forward`` runs ``torch.ops.hexlayout.paged_attention`` once over the whole batch, prefill
  and decode sequences mixed: for sequence ``b`` with queries ``q[cu[b]:cu[b+1]]`` and
  ``k = seq_lens[b]`` keys read through ``block_table[b]``,
  ``out_i = sum_j softmax_j(scale * q_i . k_j) v_j`` over the keys ``j <= i + k - n_q``
  (causal bottom-right; a sliding window ``w`` also drops ``j < i + k - n_q - (w - 1)``; a
  softcap ``c`` replaces the logits ``s`` by ``c * tanh(s / c)``), written into
  ``output[:num_actual_tokens]``; ``attn_metadata is None`` (the profile run) writes nothing.

Attention sinks (gpt-oss) go to the kernels as f32 ``sinks``; an FP8 KV cache
(``kv_cache_dtype`` "fp8", "fp8_e4m3", "fp8_e5m2": vLLM allocates it as uint8) is written with
``fp8(x / layer._k_scale)`` / ``fp8(x / layer._v_scale)`` and read as ``scale * fp8`` (the scales
stay tensors on the device: no host synchronization).

What hexlayout cannot serve (non-decoder attention, float32, a head size past 256 or not a
multiple of 8, or of 16 with an FP8 cache) the backend declares to vLLM's selector
(``validate_configuration`` then names the reason); ALiBi raises when a layer is built. The
builder supports full CUDA graphs of uniform (decode) batches (``AttentionCGSupport.UNIFORM_BATCH``,
see :class:`HexlayoutAttentionMetadataBuilder`); mixed batches run attention eagerly between
vLLM's piecewise graphs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import hexlayout.ops  # noqa: F401 - registers torch.ops.hexlayout.*
import torch
from hexlayout.ops.attention.args import BLOCK_SIZES, KV_CACHE_DTYPES
from vllm.v1.attention.backend import (
    AttentionBackend,
    AttentionCGSupport,
    AttentionImpl,
    AttentionMetadataBuilder,
    AttentionType,
    CommonAttentionMetadata,
)

from hexlayout.errors import HexlayoutError
from hexlayout.runtime.capture import capturing

from .log import flush, logger
from .trace import record_attention, trace_dir

__all__ = [
    "HexlayoutAttentionMetadata",
    "HexlayoutAttentionMetadataBuilder",
    "HexlayoutCUDAAttentionImpl",
    "HexlayoutCUDAAttentionBackend",
    "HexlayoutAttentionUnsupported",
    "kv_cache_dtype_of",
    "kv_scales",
    "sinks_f32",
    "split_kv_cache",
    "register_cuda_attention",
]


#: vLLM's ``kv_cache_dtype`` strings the backend serves: the model's dtype, and FP8 caches.
SUPPORTED_KV_CACHE_DTYPES = ("auto", "float16", "bfloat16", "fp8", "fp8_e4m3", "fp8_e5m2")


class HexlayoutAttentionUnsupported(HexlayoutError, NotImplementedError):
    """A layer asks the CUSTOM (hexlayout) backend for something its kernels do not do."""


def kv_cache_dtype_of(impl: Any) -> str:
    """The ``kv_cache_dtype`` hexlayout's ops take for a layer: vLLM's FP8 strings as they are,
    anything else (a cache in the model's dtype) "auto"."""
    return impl.kv_cache_dtype if impl.kv_cache_dtype in KV_CACHE_DTYPES else "auto"


def sinks_f32(impl: Any) -> torch.Tensor | None:
    """The layer's attention sinks ``[H]`` as float32 (converted once, after the weights are
    loaded: at the first forward), or None."""
    sinks = getattr(impl, "sinks", None)
    if sinks is None or sinks.dtype == torch.float32:
        return sinks
    cached = getattr(impl, "_hexlayout_sinks", None)
    if cached is None or cached[0] is not sinks:
        cached = (sinks, sinks.detach().float().contiguous())
        impl._hexlayout_sinks = cached
    return cached[1]


def kv_scales(impl: Any, layer: Any) -> tuple[Any, Any]:
    """The layer's FP8 cache scales ``(layer._k_scale, layer._v_scale)`` (one-element float32
    tensors on the device) when its cache is FP8, else ``(None, None)``."""
    if kv_cache_dtype_of(impl) == "auto":
        return None, None
    return layer._k_scale, layer._v_scale


def split_kv_cache(kv_cache: torch.Tensor, head_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """K and V ``[NB, BS, KVH, D]`` views of a layer's cache, vLLM's logical
    ``[NB, KVH, BS, 2*D]`` view (K: the first ``D`` elements of each (block, head, row), V the
    next ``D``)."""
    k, v = kv_cache.transpose(1, 2).split(head_size, dim=-1)
    return k, v


@dataclass
class HexlayoutAttentionMetadata:
    """The batch as hexlayout's paged attention takes it (FlashAttention's fields):
    ``query_start_loc [B+1]`` (cumulative query lengths), ``seq_lens [B]`` (keys per sequence,
    cached and new), ``block_table [B, max_blocks]``, ``slot_mapping [T]`` (cache slot of each new
    token, -1: padding), the maxima of both lengths, ``num_actual_tokens`` (tokens past it are
    padding) and ``causal``."""

    num_actual_tokens: int
    max_query_len: int
    query_start_loc: torch.Tensor
    max_seq_len: int
    seq_lens: torch.Tensor
    block_table: torch.Tensor
    slot_mapping: torch.Tensor
    causal: bool = True
    num_splits: int = 0


def graph_num_splits(max_model_len: int) -> int:
    """The split-KV count of every batch a full CUDA graph may replay (fixed at capture: the
    splits share each sequence's key blocks on the device, so one count serves any length):
    one split per 1024 keys of the longest context the model allows, at most 16."""
    return max(1, min(16, -(-int(max_model_len) // 1024)))


class HexlayoutAttentionMetadataBuilder(AttentionMetadataBuilder[HexlayoutAttentionMetadata]):
    """:class:`HexlayoutAttentionMetadata` from vLLM's ``CommonAttentionMetadata`` (no reorder:
    the kernel takes prefill and decode sequences in any order).

    Full CUDA graphs of uniform batches (``AttentionCGSupport.UNIFORM_BATCH``: decode steps,
    every sequence the same query count): the metadata are vLLM's persistent input buffers
    (``query_start_loc``, ``seq_lens``, ``block_table``, ``slot_mapping``; nothing copied, no
    host synchronization), the grid depends on the batch's size and query count only, and a
    batch that fits the largest capture size gets the fixed split count
    :func:`graph_num_splits` (never one chosen from ``max_seq_len``), so a graph captured at one
    context length replays correctly at any other. vLLM's eager warm-up runs of each capture
    size build every kernel the capture needs (a build inside the capture would raise
    ``hexlayout.runtime.CaptureError``)."""

    _cudagraph_support: ClassVar[AttentionCGSupport] = AttentionCGSupport.UNIFORM_BATCH

    def __init__(
        self, kv_cache_spec: Any, layer_names: list[str], vllm_config: Any, device: torch.device
    ) -> None:
        super().__init__(kv_cache_spec, layer_names, vllm_config, device)
        cc = getattr(vllm_config, "compilation_config", None)
        mode = getattr(cc, "cudagraph_mode", None)
        full = bool(mode is not None and mode.has_full_cudagraphs())
        self.graph_tokens = int(getattr(cc, "max_cudagraph_capture_size", 0) or 0) if full else 0
        model = getattr(vllm_config, "model_config", None)
        self.graph_splits = graph_num_splits(getattr(model, "max_model_len", 1024) or 1024)

    def build(
        self, common_prefix_len: int, common_attn_metadata: CommonAttentionMetadata, fast_build: bool = False
    ) -> HexlayoutAttentionMetadata:
        cm = common_attn_metadata
        if not isinstance(cm.causal, bool):
            raise HexlayoutAttentionUnsupported(
                "hexlayout attention (CUSTOM backend): per-request causal masks are not supported"
            )
        return HexlayoutAttentionMetadata(
            num_actual_tokens=cm.num_actual_tokens,
            max_query_len=cm.max_query_len,
            query_start_loc=cm.query_start_loc,
            max_seq_len=cm.max_seq_len,
            seq_lens=cm.seq_lens,
            block_table=cm.block_table_tensor,
            slot_mapping=cm.slot_mapping,
            causal=cm.causal,
            num_splits=self.graph_splits if cm.num_actual_tokens <= self.graph_tokens else 0,
        )


class HexlayoutCUDAAttentionImpl(AttentionImpl[HexlayoutAttentionMetadata]):
    """Attention through hexlayout's ``reshape_and_cache`` and ``paged_attention`` (see the
    module docstring)."""

    def __init__(
        self,
        num_heads: int,
        head_size: int,
        scale: float,
        num_kv_heads: int,
        alibi_slopes: list[float] | None,
        sliding_window: int | None,
        kv_cache_dtype: str,
        logits_soft_cap: float | None = None,
        attn_type: str = AttentionType.DECODER,
        kv_sharing_target_layer_name: str | None = None,
        sinks: torch.Tensor | None = None,
    ) -> None:
        flush()
        what = None
        if attn_type != AttentionType.DECODER:
            what = f"{getattr(attn_type, 'value', attn_type)} attention"
        elif alibi_slopes is not None:
            what = "ALiBi slopes"
        elif kv_cache_dtype not in SUPPORTED_KV_CACHE_DTYPES:
            what = f"KV cache dtype {kv_cache_dtype}"
        elif head_size > 256 or head_size % 8:
            what = f"head size {head_size} (hexlayout: multiples of 8 up to 256)"
        elif kv_cache_dtype in KV_CACHE_DTYPES[1:] and head_size % 16:
            what = f"head size {head_size} with an FP8 KV cache (hexlayout: multiples of 16)"
        elif sinks is not None and sinks.shape != (num_heads,):
            what = f"sinks of shape {tuple(sinks.shape)} (expected [num_heads] = [{num_heads}])"
        if what is not None:
            raise HexlayoutAttentionUnsupported(
                f"hexlayout attention (CUSTOM backend): {what} is not supported; select another "
                f"attention backend"
            )
        self.num_heads = num_heads
        self.head_size = head_size
        self.scale = float(scale)
        self.num_kv_heads = num_kv_heads
        self.alibi_slopes = None
        self.sliding_window = (-1, -1) if sliding_window is None else (sliding_window - 1, 0)
        self.kv_cache_dtype = kv_cache_dtype
        self.cache_dtype = kv_cache_dtype_of(self)
        self.logits_soft_cap = float(logits_soft_cap or 0.0)
        self.attn_type = attn_type
        self.kv_sharing_target_layer_name = kv_sharing_target_layer_name
        self.sinks = sinks
        self._logged = False

    def do_kv_cache_update(
        self,
        layer: torch.nn.Module,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        slot_mapping: torch.Tensor,
    ) -> None:
        """Write the step's keys and values ``[T, KVH, D]`` into the cache at ``slot_mapping``
        (keys past the slots are padding)."""
        n = min(key.shape[0], slot_mapping.shape[0])
        kc, vc = split_kv_cache(kv_cache, self.head_size)
        torch.ops.hexlayout.reshape_and_cache(
            key[:n], value[:n], kc, vc, slot_mapping[:n], "NHD", self.cache_dtype, *kv_scales(self, layer)
        )

    def forward(
        self,
        layer: Any,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        kv_cache: torch.Tensor,
        attn_metadata: HexlayoutAttentionMetadata | None,
        output: torch.Tensor | None = None,
        output_scale: torch.Tensor | None = None,
        output_block_scale: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Attention of ``query [T, H, D]`` over the cache for the whole batch, into
        ``output[:num_actual_tokens]`` (the cache update ran before, in
        :meth:`do_kv_cache_update`)."""
        if output is None:
            raise HexlayoutAttentionUnsupported(
                "hexlayout attention (CUSTOM backend): forward needs an output tensor"
            )
        if output_scale is not None or output_block_scale is not None:
            raise HexlayoutAttentionUnsupported(
                "hexlayout attention (CUSTOM backend): fused output quantization is not supported"
            )
        if attn_metadata is None:  # the profile run
            return output.fill_(0)
        if not self._logged:
            self._logged = True
            logger.info("hexlayout: %s: attention runs hexlayout's paged_attention",
                        getattr(layer, "layer_name", "?"))
        md = attn_metadata
        n = md.num_actual_tokens
        kc, vc = split_kv_cache(kv_cache, self.head_size)
        q = query[:n].view(n, self.num_heads, self.head_size)
        out, _ = torch.ops.hexlayout.paged_attention(
            q,
            kc,
            vc,
            md.query_start_loc,
            md.seq_lens,
            md.block_table,
            md.max_query_len,
            md.max_seq_len,
            self.scale,
            bool(md.causal),
            list(self.sliding_window),
            self.logits_soft_cap,
            "NHD",
            md.num_splits,
            sinks_f32(self),
            self.cache_dtype,
            *kv_scales(self, layer),
        )
        output[:n].view(n, self.num_heads, self.head_size).copy_(out)
        if trace_dir() is not None and not capturing():      # the trace reads the lengths: a sync
            record_attention(q, kc.shape[2], kc.shape[1], md)
        return output

    def process_weights_after_loading(self, act_dtype: torch.dtype) -> None:
        """The sinks' float32 copy, made once after loading (never inside a CUDA-graph capture)."""
        sinks_f32(self)


class HexlayoutCUDAAttentionBackend(AttentionBackend):
    """The CUSTOM attention backend: hexlayout's kernels on CUDA devices of compute capability
    8.x / 9.0 / 10.0 (10.0 runs the mma.sync kernels) -- what vLLM's selector sees: dtypes, head
    sizes, block sizes, decoder only, sinks, KV cache dtypes (the model's, FP8 E4M3 / E5M2)."""

    supported_dtypes: ClassVar[list[torch.dtype]] = [torch.float16, torch.bfloat16]
    supported_kv_cache_dtypes: ClassVar[list[Any]] = list(SUPPORTED_KV_CACHE_DTYPES)
    forward_includes_kv_cache_update: bool = False

    @staticmethod
    def get_name() -> str:
        return "CUSTOM"

    @staticmethod
    def get_impl_cls() -> type[HexlayoutCUDAAttentionImpl]:
        return HexlayoutCUDAAttentionImpl

    @staticmethod
    def get_builder_cls() -> type[HexlayoutAttentionMetadataBuilder]:
        return HexlayoutAttentionMetadataBuilder

    @staticmethod
    def get_supported_kernel_block_sizes(kv_cache_spec: Any = None) -> list[Any]:
        return list(BLOCK_SIZES)

    @classmethod
    def supports_head_size(cls, head_size: int) -> bool:
        return 0 < head_size <= 256 and head_size % 8 == 0

    @classmethod
    def supports_attn_type(cls, attn_type: str) -> bool:
        return attn_type == AttentionType.DECODER

    @classmethod
    def supports_sliding_window(cls) -> bool:
        return True

    @classmethod
    def supports_sink(cls) -> bool:
        return True

    @classmethod
    def supports_combination(cls, head_size: int, dtype: torch.dtype, kv_cache_dtype: Any, block_size: Any,
                             use_mla: bool, has_sink: bool, use_sparse: bool, use_mm_prefix: bool,
                             device_capability: Any) -> str | None:
        """Why vLLM's selector may not pick the backend for this combination, or None: an FP8
        cache needs a head size that is a multiple of 16 (16-byte rows of one-byte values)."""
        if kv_cache_dtype in KV_CACHE_DTYPES[1:] and head_size % 16:
            return f"head size {head_size} with an FP8 KV cache (hexlayout: multiples of 16)"
        return None

    @classmethod
    def supports_compute_capability(cls, capability: Any) -> bool:
        return capability.major == 8 or (capability.major, capability.minor) in ((9, 0), (10, 0))


def register_cuda_attention() -> str:
    """Register :class:`HexlayoutCUDAAttentionBackend` as vLLM's ``CUSTOM`` attention backend;
    returns what was swapped, for the log."""
    from vllm.v1.attention.backends.registry import AttentionBackendEnum, register_backend

    path = f"{HexlayoutCUDAAttentionBackend.__module__}.{HexlayoutCUDAAttentionBackend.__qualname__}"
    register_backend(AttentionBackendEnum.CUSTOM, path)
    return f"attention backend CUSTOM -> {path} (select it with attention_backend=CUSTOM)"
