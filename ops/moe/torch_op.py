"""``torch.ops.hexlayout.fused_moe``: the bf16 / f16 fused MoE registered with torch.library.

Schema: ``fused_moe(Tensor hidden_states, Tensor w13, Tensor w2, Tensor topk_weights, Tensor
topk_ids, str activation="silu", bool apply_router_weight_on_input=False, Tensor?
expert_map=None, int? global_num_experts=None) -> Tensor`` (semantics in
``hexlayout.ops.moe``). Every path (CUDA, CPU under ``HEXLAYOUT_EMULATE=1``, fake) first runs
``hexlayout.ops.moe_args.check_fused_moe``; the fake implementation returns ``[T, H]`` in the
activations' dtype (the buffers inside depend on T, k, E and the block size only).
"""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.torch_ops import define_op

from .args import check_fused_moe
from .op import run_fused_moe

__all__ = ["fused_moe_op", "SCHEMA", "moe_output_fake"]

SCHEMA = (
    "(Tensor hidden_states, Tensor w13, Tensor w2, Tensor topk_weights, Tensor topk_ids, "
    'str activation="silu", bool apply_router_weight_on_input=False, Tensor? expert_map=None, '
    "int? global_num_experts=None) -> Tensor"
)


def moe_output_fake(hidden_states: Any, *_: Any, **__: Any) -> Any:
    """The fake implementation of every fused MoE op: the ``[T, H]`` output, shaped and typed
    like ``hidden_states`` (the other arguments do not matter)."""
    return hidden_states.new_empty(tuple(hidden_states.shape))


fused_moe_op = define_op("fused_moe", SCHEMA, fake=moe_output_fake, impl=run_fused_moe, check=check_fused_moe)
