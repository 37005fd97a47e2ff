"""hexlayout's mixed-type (W4A16 / W8A16) fused MoE as vLLM experts, shared by the plugin's
quantized MoE methods (AWQ :mod:`.awq`, GPTQ :mod:`.gptq`, MXFP4 :mod:`.mxfp4`).

Each method keeps vLLM's ``create_weights`` and loader, prepares the loaded weights once
(``hexlayout.ops.prepare_wna16`` / ``prepare_mxfp4``: :class:`WNA16Weights` for ``w13`` and
``w2``) and builds the layer's ``FusedMoEKernel`` itself with :func:`install_prepared_experts`:
vLLM's prepare / finalize and :class:`HexlayoutWNA16Experts`, whose ``apply`` runs
``hexlayout.ops.fused_moe`` on the prepared weights. vLLM's WNA16 kernel factory accepts only its
in-tree experts, so the plugin never constructs vLLM's quantized MoE methods (on a CPU without
AMX their ``__init__`` raises: no WNA16 MoE backend). Activations enter unquantized
(``FusedMoEQuantConfig.make()``): the prepared weights hold their own dequantization constants.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.model_executor.layers.fused_moe import RoutedExperts
from vllm.model_executor.layers.fused_moe.all2all_utils import maybe_make_prepare_finalize
from vllm.model_executor.layers.fused_moe.config import FusedMoEQuantConfig
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.layers.fused_moe.modular_kernel import FusedMoEKernel
from vllm.model_executor.layers.quantization import register_quantization_config
from vllm.model_executor.utils import replace_parameter

from .log import flush
from .moe import HexlayoutExperts, prebuild_experts
from .trace import record, trace_dir

__all__ = ["HexlayoutWNA16Experts", "PreparedExpertsMethod", "install_prepared_experts", "register_prepared",
           "release_packed", "storage_bytes"]


class HexlayoutWNA16Experts(HexlayoutExperts):
    """vLLM's modular MoE experts computed by ``hexlayout.ops.fused_moe`` on prepared weights
    (``prepared``, set by :func:`install_prepared_experts`; the packed tensors vLLM hands to
    ``apply`` give only their shapes): ``apply`` is the parent's, with these weights."""

    prepared: tuple[Any, Any] | None = None

    def expert_weights(self, hidden_states: torch.Tensor | None, w1: torch.Tensor,
                       w2: torch.Tensor) -> tuple[str, Any, Any, dict[str, int]]:
        """``("moe_w<bits>a16", w13, w2, shapes)``: the prepared weights (vLLM's packed ``w1`` /
        ``w2`` give only the local expert count)."""
        assert self.prepared is not None, "hexlayout quantized MoE: weights were not prepared"
        w13, w2p = self.prepared
        shapes = {
            "local_experts": int(w1.shape[0]),
            "hidden": int(w2p.size_n),
            "intermediate": int(w13.size_n // 2),
            "group_size": int(w13.group_size),
        }
        return f"moe_w{int(w13.bits)}a16", w13, w2p, shapes


def storage_bytes(tensors: Any) -> int:
    """The bytes of the distinct storages behind ``tensors`` (a view and its base count once)."""
    seen: dict[tuple[str, int], int] = {}
    for t in tensors:
        if isinstance(t, torch.Tensor):
            st = t.untyped_storage()
            seen[(str(t.device), st.data_ptr())] = st.nbytes()
    return sum(seen.values())


def _prepared_tensors(w: Any) -> tuple[Any, ...]:
    """``(qweight, scales, zeros, perm)`` of prepared weights, ``qweight`` viewed
    ``[E, rows, bytes]`` (vLLM's modular kernel reads its expert count from dimension 0)."""
    q = w.qweight
    return q.view(w.num_experts, -1, q.shape[-1]), w.scales, w.zeros, w.perm


def release_packed(layer: RoutedExperts, packed: tuple[str | None, ...], w13: Any,
                   w2: Any) -> tuple[int, int]:
    """Replace the layer's checkpoint parameters by the prepared tensors that supersede them, so
    vLLM's packed copies are released. ``packed`` names the layer's parameters (without the
    ``w13_`` / ``w2_`` prefix) that ``qweight``, ``scales``, ``zeros`` and ``perm`` of the
    prepared weights replace (``None``: the format has none); a replaced parameter the prepared
    weights have no tensor for becomes empty. Returns the layer's parameter bytes before and
    after, counting the prepared tensors (distinct storages)."""
    before = storage_bytes(layer.parameters())
    for prefix, w in (("w13", w13), ("w2", w2)):
        for name, new in zip(packed, _prepared_tensors(w)):
            if name is None:
                continue
            old = getattr(layer, f"{prefix}_{name}")
            tensor = new if new is not None else old.new_empty((0,))
            replace_parameter(layer, f"{prefix}_{name}", tensor)
    held = [t for w in (w13, w2) for t in _prepared_tensors(w)]
    return before, storage_bytes([*layer.parameters(), *held])


def install_prepared_experts(method: Any, layer: RoutedExperts, w13: Any, w2: Any) -> None:
    """Give ``method`` (a vLLM ``FusedMoEMethodBase`` with ``PACKED``, see
    :func:`release_packed`) the ``FusedMoEKernel`` that runs ``layer`` on the prepared weights
    ``w13`` / ``w2``: vLLM's prepare / finalize for the layer's routing tables,
    :class:`HexlayoutWNA16Experts` holding the weights. The checkpoint parameters are replaced
    by the prepared tensors first (one trace line ``moe_prepare`` with the bytes before and
    after). The layer's ``w13_weight`` / ``w2_weight`` (which vLLM's modular kernel reads, for
    its expert count only) are its ``w13_qweight`` / ``w2_qweight`` where it has no
    ``w13_weight`` of its own."""
    before, after = release_packed(layer, method.PACKED, w13, w2)
    if trace_dir() is not None:
        shapes = {"quant_format": w13.quant_format, "bytes_before": before, "bytes_after": after}
        record("moe_prepare", shapes, w13.dtype)
    if "w13_weight" not in layer._parameters:
        layer.w13_weight = layer.w13_qweight
        layer.w2_weight = layer.w2_qweight
    method.moe_quant_config = method.get_fused_moe_quant_config(layer)
    prepare_finalize = maybe_make_prepare_finalize(
        moe=method.moe,
        quant_config=method.moe_quant_config,
        routing_tables=layer._expert_routing_tables(),
        allow_new_interface=True,
        use_monolithic=False,
    )
    experts = HexlayoutWNA16Experts(moe_config=method.moe, quant_config=method.moe_quant_config)
    experts.prepared = (w13, w2)
    method.moe_kernel = FusedMoEKernel(prepare_finalize, experts)
    prebuild_experts(experts, layer)


class PreparedExpertsMethod:
    """Mixin of the plugin's quantized MoE methods: activations enter unquantized (the
    prepared weights hold their own dequantization constants). ``PACKED``: the checkpoint
    parameters the prepared tensors replace (:func:`release_packed`)."""

    PACKED: tuple[str | None, ...] = ("qweight", "scales", "qzeros", None)

    def init_prepared(self, moe: Any) -> None:
        """The base method's state only: not the vLLM quantized method's ``__init__``, which
        selects vLLM's own WNA16 / MXFP4 backend (replaced here; on CPUs without one it raises)."""
        FusedMoEMethodBase.__init__(self, moe)
        flush()
        self.experts_cls = HexlayoutWNA16Experts

    def get_fused_moe_quant_config(self, layer: RoutedExperts) -> FusedMoEQuantConfig:
        return FusedMoEQuantConfig.make()


def register_prepared(name: str, config_cls: type, op: str, shown: str | None = None) -> list[str]:
    """Register ``config_cls`` as vLLM's ``name`` quantization when ``hexlayout.ops`` has
    ``op`` (the preparation it runs); returns what was swapped (``shown``, default ``name``,
    for the log)."""
    import hexlayout.ops

    if not hasattr(hexlayout.ops, op):
        return []
    register_quantization_config(name)(config_cls)
    return [f"quantization {shown or name} -> {config_cls.__module__}.{config_cls.__qualname__}"]
