"""``torch.ops.hexlayout.fused_moe`` / ``fused_moe_wna16`` / ``fused_moe_fp8``: the fused MoE ops
registered with torch.library, one per weight kind (semantics in ``hexlayout.ops.moe``,
``moe_wna16``, ``moe_fp8``).

Schemas:

- ``fused_moe(Tensor hidden_states, Tensor w13, Tensor w2, Tensor topk_weights, Tensor
  topk_ids, str activation="silu", bool apply_router_weight_on_input=False, Tensor?
  expert_map=None, int? global_num_experts=None) -> Tensor`` (bf16 / f16 weights);
- ``fused_moe_wna16(Tensor hidden_states, Tensor w13_qweight, Tensor w13_scales, Tensor?
  w13_zeros, Tensor w2_qweight, Tensor w2_scales, Tensor? w2_zeros, Tensor topk_weights, Tensor
  topk_ids, str quant_format, int bits, int w13_group_size, int w2_group_size, str
  activation="silu", bool apply_router_weight_on_input=False, Tensor? expert_map=None, int?
  global_num_experts=None, Tensor? w13_perm=None, Tensor? w2_perm=None, str w13_layout="", str
  w2_layout="") -> Tensor``: the tensors of two ``prepare_wna16`` objects, their format
  constants (``*_perm``: GPTQ act-order's permutations of K, ``WNA16Weights.perm``) and offline
  layout keys ("": not checked);
- ``fused_moe_fp8(Tensor hidden_states, Tensor w13, Tensor w13_scale, Tensor w2, Tensor
  w2_scale, Tensor topk_weights, Tensor topk_ids, int[] block=[], str activation="silu", bool
  apply_router_weight_on_input=False, Tensor? expert_map=None, int? global_num_experts=None, str
  scale_format="") -> Tensor``: the tensors of two ``prepare_fp8`` objects (``block=[]``: one
  scale per expert; ``[128, 128]``: block scales; ``scale_format="ue8m0"``: every block scale a
  power of two, ``Fp8MoEWeights.scale_format``).

Every path (CUDA, CPU under ``HEXLAYOUT_EMULATE=1``, fake) first runs the op's check
(``moe_args.check_fused_moe``, ``check_fused_moe_wna16``, ``check_fused_moe_fp8``); the fake
implementation of each returns ``[T, H]`` in the activations' dtype (the buffers inside depend
on T, k, E and the block size only).
"""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.torch_ops import define_op

from .args import check_fused_moe
from .fp8 import check_fused_moe_fp8, run_fused_moe_fp8
from .op import run_fused_moe
from .wna16 import check_fused_moe_wna16, run_fused_moe_wna16

__all__ = ["fused_moe_op", "fused_moe_wna16_op", "fused_moe_fp8_op", "SCHEMA", "WNA16_SCHEMA", "FP8_SCHEMA",
           "moe_output_fake"]

#: the routing arguments every fused MoE op's schema ends with
_ROUTING_ARGS = ('str activation="silu", bool apply_router_weight_on_input=False, Tensor? expert_map=None, '
                 "int? global_num_experts=None")
_ROUTING = _ROUTING_ARGS + ") -> Tensor"

SCHEMA = "(Tensor hidden_states, Tensor w13, Tensor w2, Tensor topk_weights, Tensor topk_ids, " + _ROUTING
WNA16_SCHEMA = (
    "(Tensor hidden_states, Tensor w13_qweight, Tensor w13_scales, Tensor? w13_zeros, Tensor w2_qweight, "
    "Tensor w2_scales, Tensor? w2_zeros, Tensor topk_weights, Tensor topk_ids, str quant_format, int bits, "
    "int w13_group_size, int w2_group_size, " + _ROUTING_ARGS
    + ', Tensor? w13_perm=None, Tensor? w2_perm=None, str w13_layout="", str w2_layout="") -> Tensor'
)
FP8_SCHEMA = ("(Tensor hidden_states, Tensor w13, Tensor w13_scale, Tensor w2, Tensor w2_scale, "
              "Tensor topk_weights, Tensor topk_ids, int[] block=[], " + _ROUTING_ARGS
              + ', str scale_format="") -> Tensor')


def moe_output_fake(hidden_states: Any, *_: Any, **__: Any) -> Any:
    """The fake implementation of every fused MoE op: the ``[T, H]`` output, shaped and typed
    like ``hidden_states`` (the other arguments do not matter)."""
    return hidden_states.new_empty(tuple(hidden_states.shape))


fused_moe_op, fused_moe_wna16_op, fused_moe_fp8_op = (
    define_op(name, schema, fake=moe_output_fake, impl=impl, check=check)
    for name, schema, impl, check in (
        ("fused_moe", SCHEMA, run_fused_moe, check_fused_moe),
        ("fused_moe_wna16", WNA16_SCHEMA, run_fused_moe_wna16, check_fused_moe_wna16),
        ("fused_moe_fp8", FP8_SCHEMA, run_fused_moe_fp8, check_fused_moe_fp8),
    )
)
