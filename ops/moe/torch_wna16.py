"""``torch.ops.hexlayout.fused_moe_wna16``: the fused MoE with W4A16 / W8A16 experts, registered
with torch.library.

Schema: ``fused_moe_wna16(Tensor hidden_states, Tensor w13_qweight, Tensor w13_scales, Tensor?
w13_zeros, Tensor w2_qweight, Tensor w2_scales, Tensor? w2_zeros, Tensor topk_weights, Tensor
topk_ids, str quant_format, int bits, int w13_group_size, int w2_group_size, str
activation="silu", bool apply_router_weight_on_input=False, Tensor? expert_map=None, int?
global_num_experts=None) -> Tensor``: the tensors of two ``prepare_wna16`` objects and their
format constants; semantics in ``hexlayout.ops.moe_wna16``. Every path (CUDA, CPU under
``HEXLAYOUT_EMULATE=1``, fake) first runs ``check_fused_moe_wna16``; the fake implementation
gives the ``[T, H]`` output of the activations' dtype.
"""

from __future__ import annotations

from hexlayout.runtime.torch_ops import define_op

from .torch_op import moe_output_fake
from .wna16 import check_fused_moe_wna16, run_fused_moe_wna16

__all__ = ["fused_moe_wna16_op"]

SCHEMA = (
    "(Tensor hidden_states, Tensor w13_qweight, Tensor w13_scales, Tensor? w13_zeros, Tensor w2_qweight, "
    "Tensor w2_scales, Tensor? w2_zeros, Tensor topk_weights, Tensor topk_ids, str quant_format, int bits, "
    'int w13_group_size, int w2_group_size, str activation="silu", bool apply_router_weight_on_input=False, '
    "Tensor? expert_map=None, int? global_num_experts=None) -> Tensor"
)


fused_moe_wna16_op = define_op(
    "fused_moe_wna16", SCHEMA, fake=moe_output_fake, impl=run_fused_moe_wna16, check=check_fused_moe_wna16
)
