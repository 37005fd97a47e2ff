"""``torch.ops.hexlayout.fused_moe_fp8``: the fused MoE with fp8 (e4m3) experts, registered with
torch.library.

Schema: ``fused_moe_fp8(Tensor hidden_states, Tensor w13, Tensor w13_scale, Tensor w2, Tensor
w2_scale, Tensor topk_weights, Tensor topk_ids, int[] block=[], str activation="silu", bool
apply_router_weight_on_input=False, Tensor? expert_map=None, int? global_num_experts=None) ->
Tensor``: the tensors of two ``prepare_fp8`` objects (``block=[]``: one scale per expert;
``[128, 128]``: block scales); semantics in ``hexlayout.ops.moe_fp8``. Every path (CUDA, CPU
under ``HEXLAYOUT_EMULATE=1``, fake) first runs ``check_fused_moe_fp8``; the fake implementation
gives the ``[T, H]`` output of the activations' dtype.
"""

from __future__ import annotations

from hexlayout.runtime.torch_ops import define_op

from .fp8 import check_fused_moe_fp8, run_fused_moe_fp8
from .torch_op import moe_output_fake

__all__ = ["fused_moe_fp8_op"]

SCHEMA = (
    "(Tensor hidden_states, Tensor w13, Tensor w13_scale, Tensor w2, Tensor w2_scale, Tensor topk_weights, "
    'Tensor topk_ids, int[] block=[], str activation="silu", bool apply_router_weight_on_input=False, '
    "Tensor? expert_map=None, int? global_num_experts=None) -> Tensor"
)


fused_moe_fp8_op = define_op(
    "fused_moe_fp8", SCHEMA, fake=moe_output_fake, impl=run_fused_moe_fp8, check=check_fused_moe_fp8
)
