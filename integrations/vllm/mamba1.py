"""vLLM's Mamba-1 layers (``MambaMixer``: Mamba, FalconMamba, Jamba) with their convolution and
selective scan computed by hexlayout's ops.

``MambaMixer.register_oot(HexlayoutMambaMixer)`` (vLLM's out-of-tree replacement of pluggable
layers, at instantiation) makes vLLM build :class:`HexlayoutMambaMixer` wherever it builds its
layer. Weights, loading and the projections (``in_proj``, ``_ssm_transform``: ``x_proj``, the
optional RMS norms and ``dt_proj`` without its bias; ``out_proj``) stay vLLM's; ``forward_impl``
calls them around hexlayout's kernels. For one step's batch (vLLM puts the decode tokens first,
then the prefill chunks), with ``[x, gate] = in_proj(hidden)`` ([dim, T] each), ``S`` the conv
state (``conv_state``, the last ``W-1`` inputs of each sequence), ``h`` the SSM state
(``ssm_state`` [slots, dim, N]) at the rows ``state_indices_tensor_{p,d}`` name:

- prefill chunks (one packed ``cu_seqlens = query_start_loc_p`` call each):
  ``u = causal_conv1d(x, w, b, activation, initial_states=S or 0, cu_seqlens)``,
  ``(Δ, B, C) = _ssm_transform(u)`` and ``y = selective_scan(u, Δ, A, B, C, D, z=gate,
  delta_bias=dt_proj.bias, delta_softplus=True, initial_states=h or 0, cu_seqlens)``, where
  ``h_t = exp(Δ_t A) ⊙ h_{t-1} + Δ_t B_t u_t``, ``y_t = (C_t · h_t + D u_t) · silu(gate_t)``,
  ``Δ = softplus(Δ + bias)``; the final conv and SSM states are written back to the sequences'
  rows ("or 0": a sequence without ``has_initial_states_p`` starts from zeros, its first chunk);
- decodes: ``causal_conv1d_update`` and ``selective_state_update`` update the rows in place
  (a row index of -1, CUDA-graph padding, is skipped);
- ``output[:T] = out_proj([y_decode, y_prefill])``.

The cache layout (``self.kv_cache``) and the metadata (``Mamba1AttentionMetadata``) are vLLM's.
What the ops do not cover (LoRA, prefix caching of Mamba states, speculative decoding, other
activations or widths: :func:`unserved_reason`, :func:`runtime_reason` of :mod:`.mamba`) runs the
parent's ``forward_impl`` (vLLM's kernels) and the layer logs why, once. Every call is traced as
``conv1d``, ``mamba_prefill`` or ``mamba_decode`` (:mod:`.trace`), as for Mamba-2.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba.mamba_mixer import MambaMixer
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

from .log import flush, logger
from .mamba import _ACTIVATIONS, _initial, _rows, runtime_reason
from .pluggable import register_layer
from .trace import record, trace_dir

__all__ = ["HexlayoutMambaMixer", "register_mamba1", "unserved_reason"]


def unserved_reason(layer: Any) -> str | None:
    """Why hexlayout's ops cannot serve ``layer`` (a ``MambaMixer``) in this configuration, or
    ``None``: LoRA (its projections need contiguous inputs vLLM's path arranges), prefix caching
    of Mamba states (``mamba_cache_mode`` "all" / "align": per-block state indices and chunk
    states, ``cu_chunk_seqlen_p``), an activation other than SiLU, a conv width outside 2-4."""
    if getattr(layer, "is_lora_enabled", False):
        return "LoRA (is_lora_enabled)"
    cfg = getattr(layer, "cache_config", None)
    mode = getattr(cfg, "mamba_cache_mode", "none") if cfg is not None else "none"
    if mode != "none":
        return (f"mamba_cache_mode={mode!r} (prefix caching of Mamba states: per-block state "
                f"indices and chunk states)")
    if layer.activation not in _ACTIVATIONS:
        return f"activation {layer.activation!r} (hexlayout's causal_conv1d: None or silu)"
    if not 2 <= layer.conv_kernel_size <= 4:
        return f"conv width {layer.conv_kernel_size} (hexlayout's causal_conv1d: 2-4)"
    return None


class HexlayoutMambaMixer(MambaMixer):
    """vLLM's ``MambaMixer`` whose ``forward_impl`` runs hexlayout's ``causal_conv1d``,
    ``causal_conv1d_update``, ``selective_scan`` and ``selective_state_update`` between vLLM's
    projections (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        flush()
        self.hexlayout_reason = unserved_reason(self)
        self._hexlayout_logged_runtime = False
        if self.hexlayout_reason is None:
            logger.info("hexlayout: %s: Mamba-1 conv + SSM run hexlayout's causal_conv1d, selective_scan "
                        "and selective_state_update", self.prefix)
        else:
            logger.info("hexlayout: %s: keeping vLLM's Mamba-1 kernels (%s)", self.prefix,
                        self.hexlayout_reason)

    def _metadata(self) -> Any:
        raw = get_forward_context().attn_metadata
        return raw.get(self.prefix) if isinstance(raw, dict) else None

    def forward_impl(self, hidden_states: torch.Tensor, output: torch.Tensor) -> Any:
        """``output[:T] = out_proj(SSM(conv(in_proj(hidden))))`` for this step's tokens with the
        cache rows updated (the module docstring); vLLM's own method where hexlayout cannot serve
        the step (and for vLLM's profile run, which has no metadata)."""
        md = self._metadata() if self.hexlayout_reason is None else None
        if md is None:
            return super().forward_impl(hidden_states, output)
        reason = runtime_reason(md)
        if reason is not None:
            if not self._hexlayout_logged_runtime:
                self._hexlayout_logged_runtime = True
                logger.info("hexlayout: %s: keeping vLLM's Mamba-1 kernels for steps with %s",
                            self.prefix, reason)
            return super().forward_impl(hidden_states, output)
        nd, np_ = md.num_decode_tokens, md.num_prefill_tokens
        x, gate = self.in_proj(hidden_states)[0][: nd + np_].transpose(-2, -1).chunk(2, dim=-2)
        conv_state = self.kv_cache[0] if is_conv_state_dim_first() else self.kv_cache[0].transpose(-1, -2)
        ssm_state = self.kv_cache[1]
        parts = []
        if md.num_decodes > 0:
            parts.append(self._decode(md, x[:, :nd], gate[:, :nd], conv_state, ssm_state))
        if md.num_prefills > 0:
            parts.append(self._prefill(md, x[:, nd:], gate[:, nd:], conv_state, ssm_state))
        y = parts[0] if len(parts) == 1 else torch.cat(parts, dim=-1)
        # row-major [T, dim] operands: vLLM's CPU linears (oneDNN) require a unit inner stride
        output[: nd + np_] = self.out_proj(y.transpose(-2, -1).contiguous())[0]
        return None

    def _conv_weights(self) -> torch.Tensor:
        """The depthwise filter ``[dim, W]``: vLLM keeps it as ``[dim, 1, W]``, except where its
        CPU build prepacks a bf16 width-4 filter for its own kernel (x86 with AVX-512 BF16, Arm
        with bf16: ``dispatch_cpu_unquantized_gemm``), keeping the ``[dim, W]`` filter as
        ``conv1d._cpu_unpacked_conv_weight``."""
        unpacked = getattr(self.conv1d, "_cpu_unpacked_conv_weight", None)
        if unpacked is not None:
            return unpacked
        w = self.conv1d.weight
        return w.view(w.size(0), w.size(2))

    def _prefill(self, md: Any, x: torch.Tensor, gate: torch.Tensor, conv_state: torch.Tensor,
                 ssm_state: torch.Tensor) -> torch.Tensor:
        """The prefill chunks (``x``, ``gate`` [dim, Tp]): packed convolution and selective scan
        from each sequence's states (or zeros), final states written to its rows; returns the
        scan's output [dim, Tp]."""
        from hexlayout.ops import causal_conv1d, selective_scan

        cu, has = md.query_start_loc_p, md.has_initial_states_p
        rows = _rows(md.state_indices_tensor_p, md.num_prefills)
        if trace_dir() is not None:  # reads `has` (a host sync) only when tracing
            self._trace("prefill", x, cu.numel() - 1, step_decodes=md.num_decodes,
                        continuing=0 if has is None else int(has[: md.num_prefills].sum()))
        u, conv_final = causal_conv1d(
            x, self._conv_weights(), self.conv1d.bias, activation=_ACTIVATIONS[self.activation],
            initial_states=_initial(has, conv_state[rows]), cu_seqlens=cu, return_final_states=True)
        conv_state[rows] = conv_final.to(conv_state.dtype)
        dt, b, c = self._ssm_transform(u.transpose(-2, -1).contiguous())
        y, h = selective_scan(u, dt.contiguous(), self.A, b.transpose(-2, -1), c.transpose(-2, -1),
                              D=self.D.float(), z=gate, delta_bias=self._time_proj_bias(),
                              delta_softplus=True, initial_states=_initial(has, ssm_state[rows]).float(),
                              cu_seqlens=cu, return_last_state=True)
        ssm_state[rows] = h.to(ssm_state.dtype)
        return y

    def _decode(self, md: Any, x: torch.Tensor, gate: torch.Tensor, conv_state: torch.Tensor,
                ssm_state: torch.Tensor) -> torch.Tensor:
        """One token a decode (``x``, ``gate`` [dim, nd]): the convolution and SSM states advanced
        in place at their rows; returns the output [dim, nd]."""
        from hexlayout.ops import causal_conv1d_update, selective_state_update

        rows = _rows(md.state_indices_tensor_d, md.num_decodes)
        if trace_dir() is not None:
            self._trace("decode", x, md.num_decodes)
        u = causal_conv1d_update(x.transpose(0, 1), conv_state, self._conv_weights(), self.conv1d.bias,
                                 activation=_ACTIVATIONS[self.activation], conv_state_indices=rows)
        dt, b, c = self._ssm_transform(u)
        y = selective_state_update(ssm_state, u, dt.transpose(0, 1), self.A, b, c, D=self.D.float(),
                                   z=gate.transpose(0, 1), dt_bias=self._time_proj_bias(),
                                   dt_softplus=True, state_batch_indices=rows)
        return y.transpose(0, 1)

    def _trace(self, part: str, x: torch.Tensor, seqs: int, **extra: int) -> None:
        """The trace lines of one part (``prefill`` / ``decode``): ``conv1d`` and the scan (a
        prefill's ``extra``: ``step_decodes`` and ``continuing``, as for Mamba-2). Mamba-1 has
        one head per channel: ``num_heads`` is dim, ``head_dim`` 1, ``n_groups`` 1."""
        dim, tokens = x.shape
        record("conv1d", {"num_seqs": seqs, "num_tokens": tokens, "dim": dim,
                          "width": self.conv_kernel_size}, x.dtype)
        record(f"mamba_{part}", {"num_seqs": seqs, "num_tokens": tokens, "num_heads": dim, "head_dim": 1,
                                 "n_groups": 1, "d_state": self.ssm_state_size, **extra}, x.dtype)


def register_mamba1() -> str:
    """Register :class:`HexlayoutMambaMixer` for vLLM's ``MambaMixer``; returns what was
    swapped, for the log."""
    return register_layer(MambaMixer, HexlayoutMambaMixer)
