"""vLLM's Mamba-2 layers (``MambaMixer2``: Mamba2, NemotronH, Bamba, Granite-4, Falcon-H1, ...)
with their convolution and state-space scan computed by hexlayout's ops.

``MambaMixer2.register_oot(HexlayoutMambaMixer2)`` (vLLM's out-of-tree replacement of pluggable
layers, at instantiation) makes vLLM build :class:`HexlayoutMambaMixer2` wherever it builds its
layer. Weights, loading, ``in_proj``, the gated RMS norm and ``out_proj`` stay vLLM's; only
``conv_ssm_forward`` changes. For one step's batch (vLLM puts the decode tokens first, then the
prefill chunks), with ``xBC`` the convolution's input, ``S`` its state (``conv_state``, the last
``W-1`` inputs of each sequence) and ``h`` the SSM state (``ssm_state`` [slots, H, P, N]) at the
rows ``state_indices_tensor_{p,d}`` name:

- prefill chunks (one packed ``cu_seqlens = query_start_loc_p`` call each):
  ``xBC' = causal_conv1d(xBC, w, b, activation, initial_states=S or 0, cu_seqlens)`` and
  ``y = ssd_scan(x, dt, A, B, C, D=D, dt_bias=dt_bias, dt_softplus=True,
  initial_states=h or 0, cu_seqlens)``, where ``h_t = exp(Δ_t A) h_{t-1} + Δ_t x_t B_tᵀ``,
  ``y_t = h_t C_t + D x_t``, ``Δ = softplus(dt + dt_bias)``; the final conv and SSM states are
  written back to the sequences' rows ("or 0": a sequence without ``has_initial_states_p``
  starts from zeros, its first chunk);
- decodes: ``causal_conv1d_update`` and ``selective_state_update`` update the rows in place
  (a row index of -1, CUDA-graph padding, is skipped).

The cache layout (``self.kv_cache``: ``conv_state`` [slots, W-1, dim] or dim-first, ``ssm_state``)
and the metadata (``Mamba2AttentionMetadata``) are vLLM's. What the ops do not cover runs the
parent's ``conv_ssm_forward`` (vLLM's kernels) and the layer logs why, once (:func:`unserved_reason`).
Every call is traced as ``conv1d``, ``mamba_prefill`` or ``mamba_decode`` (:mod:`.trace`).
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.forward_context import get_forward_context
from vllm.model_executor.layers.mamba.mamba_mixer2 import MambaMixer2
from vllm.model_executor.layers.mamba.mamba_utils import is_conv_state_dim_first

from .log import flush, logger
from .pluggable import register_layer
from .trace import record, trace_dir

__all__ = ["HexlayoutMambaMixer2", "register_mamba", "unserved_reason", "runtime_reason"]

#: The activations hexlayout's ``causal_conv1d`` applies (vLLM passes ``"silu"`` / ``"swish"``).
_ACTIVATIONS = {None: None, "silu": "silu", "swish": "silu"}


def unserved_reason(layer: Any) -> str | None:
    """Why hexlayout's ops cannot serve ``layer`` (a ``MambaMixer2``) in this configuration, or
    ``None``: speculative decoding (several tokens a decode), ReplaySSM's extra caches, prefix
    caching of Mamba states (``mamba_cache_mode`` "all" / "align": per-block state indices and
    checkpoints), an activation other than SiLU, a conv width outside 2-4."""
    if getattr(layer, "use_replayssm", False):
        return "ReplaySSM (use_replayssm) keeps x/dt/B ring caches hexlayout's ops do not update"
    if getattr(layer, "num_spec", 0):
        return f"speculative decoding ({layer.num_spec} speculative tokens a decode step)"
    mode = getattr(layer.cache_config, "mamba_cache_mode", "none") if layer.cache_config else "none"
    if mode != "none":
        return (f"mamba_cache_mode={mode!r} (prefix caching of Mamba states: per-block state "
                f"indices and chunk checkpoints)")
    if layer.activation not in _ACTIVATIONS:
        return f"activation {layer.activation!r} (hexlayout's causal_conv1d: None or silu)"
    if not 2 <= layer.conv_kernel_size <= 4:
        return f"conv width {layer.conv_kernel_size} (hexlayout's causal_conv1d: 2-4)"
    return None


def runtime_reason(md: Any) -> str | None:
    """Why one step's metadata ``md`` (``Mamba2AttentionMetadata``) cannot be served, or ``None``
    (checkpoints of prefix caching, several tokens a decode, 2-D state indices)."""
    if getattr(md, "checkpoint_chunk_idx", None) is not None:
        return "prefill checkpoints (prefix caching)"
    if md.num_decodes and md.num_decode_tokens != md.num_decodes:
        return f"{md.num_decode_tokens} decode tokens for {md.num_decodes} decodes (speculative)"
    for name in ("state_indices_tensor_p", "state_indices_tensor_d"):
        t = getattr(md, name, None)
        if t is not None and t.dim() != 1 and tuple(t.shape[1:]) != (1,):
            return f"{name} of shape {tuple(t.shape)} (per-block state indices)"
    return None


def _rows(t: torch.Tensor, n: int) -> torch.Tensor:
    """The first ``n`` state rows of vLLM's indices ``[n', 1]`` or ``[n']`` as a ``[n]`` vector."""
    return (t[:, 0] if t.dim() == 2 else t)[:n]


def _initial(has: torch.Tensor | None, rows: torch.Tensor) -> torch.Tensor:
    """``rows`` where ``has`` (per sequence) holds, zeros elsewhere (all of them when ``has`` is
    ``None``: no sequence continues a state)."""
    if has is None:
        return torch.zeros_like(rows)
    return torch.where(has.view(-1, *([1] * (rows.dim() - 1))), rows, torch.zeros_like(rows))


class HexlayoutMambaMixer2(MambaMixer2):
    """vLLM's ``MambaMixer2`` whose ``conv_ssm_forward`` runs hexlayout's ``causal_conv1d``,
    ``causal_conv1d_update``, ``ssd_scan`` and ``selective_state_update`` (module docstring)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        flush()
        self.hexlayout_reason = unserved_reason(self)
        self._hexlayout_logged_runtime = False
        if self.hexlayout_reason is None:
            logger.info("hexlayout: %s: Mamba-2 conv + SSM run hexlayout's causal_conv1d, ssd_scan "
                        "and selective_state_update", self.prefix)
        else:
            logger.info("hexlayout: %s: keeping vLLM's Mamba-2 kernels (%s)", self.prefix,
                        self.hexlayout_reason)

    def _metadata(self) -> Any:
        raw = get_forward_context().attn_metadata
        return raw.get(self.prefix) if isinstance(raw, dict) else None

    def conv_ssm_forward(self, projected_states: torch.Tensor, output: torch.Tensor) -> Any:
        """``output[:T] = SSM(conv(xBC))`` for this step's tokens with the cache rows updated (the
        module docstring); vLLM's own method where hexlayout cannot serve the step."""
        md = self._metadata() if self.hexlayout_reason is None else None
        if md is None:  # a layer hexlayout does not serve, or vLLM's profile run
            return super().conv_ssm_forward(projected_states, output)
        reason = runtime_reason(md)
        if reason is not None:
            if not self._hexlayout_logged_runtime:
                self._hexlayout_logged_runtime = True
                logger.info("hexlayout: %s: keeping vLLM's Mamba-2 kernels for steps with %s",
                            self.prefix, reason)
            return super().conv_ssm_forward(projected_states, output)
        xbc, dt = torch.split(projected_states[..., self.tped_intermediate_size:],
                              [self.tped_conv_size, self.tped_dt_size], dim=-1)
        nd, np_ = md.num_decode_tokens, md.num_prefill_tokens
        conv_state = self.kv_cache[0] if is_conv_state_dim_first() else self.kv_cache[0].transpose(-1, -2)
        ssm_state = self.kv_cache[1]
        if md.num_prefills > 0:
            self._prefill(md, xbc[nd:nd + np_], dt[nd:nd + np_], output[nd:nd + np_], conv_state, ssm_state)
        if md.num_decodes > 0:
            self._decode(md, xbc[:nd], dt[:nd], output[:nd], conv_state, ssm_state)
        return None

    def _split(self, xbc: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(x [T, H, P], B [T, G, N], C [T, G, N])`` of the convolution's output ``xbc``."""
        x, b, c = self.split_hidden_states_B_C_fn(xbc)
        g = self.n_groups // self.tp_size
        return x.reshape(-1, self.tped_dt_size, self.head_dim), b.reshape(-1, g, self.ssm_state_size), \
            c.reshape(-1, g, self.ssm_state_size)

    def _prefill(self, md: Any, xbc: torch.Tensor, dt: torch.Tensor, out: torch.Tensor,
                 conv_state: torch.Tensor, ssm_state: torch.Tensor) -> None:
        """The prefill chunks: packed convolution and SSD scan from each sequence's states (or
        zeros), final states written to its rows."""
        from hexlayout.ops import causal_conv1d, ssd_scan

        cu, has = md.query_start_loc_p, md.has_initial_states_p
        rows = _rows(md.state_indices_tensor_p, md.num_prefills)
        if trace_dir() is not None:  # reads `has` (a host sync) only when tracing
            self._trace("prefill", xbc, cu.numel() - 1, step_decodes=md.num_decodes,
                        continuing=0 if has is None else int(has[: md.num_prefills].sum()))
        conv0 = _initial(has, conv_state[rows])
        conv_out, conv_final = causal_conv1d(
            xbc.transpose(0, 1), self.conv_weights, self.conv1d.bias,
            activation=_ACTIVATIONS[self.activation], initial_states=conv0, cu_seqlens=cu,
            return_final_states=True)
        conv_state[rows] = conv_final.to(conv_state.dtype)
        x, b, c = self._split(conv_out.transpose(0, 1))
        h0 = _initial(has, ssm_state[rows]).float()
        y, h = ssd_scan(x[None], dt[None], self.A, b[None], c[None], chunk_size=md.chunk_size,
                        D=self.D.float(), dt_bias=self.dt_bias.float(), dt_softplus=True,
                        initial_states=h0, cu_seqlens=cu, return_final_states=True)
        ssm_state[rows] = h.to(ssm_state.dtype)
        out.view(-1, self.tped_dt_size, self.head_dim).copy_(y[0])

    def _decode(self, md: Any, xbc: torch.Tensor, dt: torch.Tensor, out: torch.Tensor,
                conv_state: torch.Tensor, ssm_state: torch.Tensor) -> None:
        """One token a decode: the convolution and SSM states advanced in place at their rows."""
        from hexlayout.ops import causal_conv1d_update, selective_state_update

        rows = _rows(md.state_indices_tensor_d, md.num_decodes)
        if trace_dir() is not None:
            self._trace("decode", xbc, md.num_decodes)
        conv_out = causal_conv1d_update(xbc, conv_state, self.conv_weights, self.conv1d.bias,
                                        activation=_ACTIVATIONS[self.activation], conv_state_indices=rows)
        x, b, c = self._split(conv_out)
        y = selective_state_update(ssm_state, x, dt, self.A, b, c, D=self.D.float(),
                                   dt_bias=self.dt_bias.float(), dt_softplus=True, state_batch_indices=rows)
        out.view(-1, self.tped_dt_size, self.head_dim).copy_(y)

    def _trace(self, part: str, xbc: torch.Tensor, seqs: int, **extra: int) -> None:
        """The trace lines of one part (``prefill`` / ``decode``): ``conv1d`` and the scan (a
        prefill's ``extra``: ``step_decodes``, the decodes of the same step, and ``continuing``,
        the sequences continuing cached states: later chunks of chunked prefills)."""
        tokens, dim = xbc.shape
        record("conv1d", {"num_seqs": seqs, "num_tokens": tokens, "dim": dim,
                          "width": self.conv_kernel_size}, xbc.dtype)
        record(f"mamba_{part}", {"num_seqs": seqs, "num_tokens": tokens, "num_heads": self.tped_dt_size,
                                 "head_dim": self.head_dim, "n_groups": self.n_groups // self.tp_size,
                                 "d_state": self.ssm_state_size, **extra}, xbc.dtype)


def register_mamba() -> str:
    """Register :class:`HexlayoutMambaMixer2` for vLLM's ``MambaMixer2``; returns what was
    swapped, for the log."""
    return register_layer(MambaMixer2, HexlayoutMambaMixer2)
