"""hexlayout's kernels in vLLM: the ``vllm.general_plugins`` entry point ``hexlayout``.

vLLM calls :func:`register` in every process it starts (the front end, the engine core, each
worker). It reads ``HEXLAYOUT_VLLM`` (:mod:`.config`), decides whether hexlayout's kernels can
run on the platform (CPU: only under ``HEXLAYOUT_EMULATE=1``, in the emulator; CUDA: compute
capability 8.x / 9.0 / 10.0), and swaps through vLLM's own registration APIs only:

- ``attention``: ``register_backend(AttentionBackendEnum.CPU_ATTN, ...)`` on vLLM's CPU build
  (:mod:`.attention`); on CUDA ``register_backend(AttentionBackendEnum.CUSTOM, ...)``
  (:mod:`.cuda_attention`), which the user selects with ``attention_backend="CUSTOM"``; MLA
  layers: ``register_backend(AttentionBackendEnum.CPU_MLA, ...)`` on the CPU build (:mod:`.mla`),
  on CUDA a new ``AttentionBackendEnum.HEXLAYOUT_MLA`` (:mod:`.cuda_mla`), which the user selects
  with ``attention_backend="HEXLAYOUT_MLA"``, and one log line saying which runs;
- ``moe``: ``CustomOp.register_oot(..., name="UnquantizedFusedMoEMethod")`` (:mod:`.moe`) and
  ``register_quantization_config`` for ``awq`` (:mod:`.awq`), ``auto_gptq`` (GPTQ, act-order
  included: :mod:`.gptq`) and ``mxfp4`` (:mod:`.mxfp4`), each when hexlayout has the op that
  prepares its weights;
- ``mamba``: ``MambaMixer2.register_oot(...)`` (:mod:`.mamba`): Mamba-2 layers' convolution and
  scan run hexlayout's ``causal_conv1d`` / ``ssd_scan`` / ``selective_state_update``;
  ``MambaMixer.register_oot(...)`` (:mod:`.mamba1`): Mamba-1 layers' convolution and scan run
  hexlayout's ``causal_conv1d`` / ``selective_scan`` / ``selective_state_update``.

It logs through vLLM's logger what it swapped, or one line saying why it swapped nothing.
Calling it again does nothing (it is idempotent and cheap); ``HEXLAYOUT_VLLM=0`` makes it do
nothing at all. Every kernel call through the plugin can be traced (:mod:`.trace`).
"""

from __future__ import annotations

from .config import device_decision, selected_kernels

__all__ = ["register", "registered"]

#: What the first :func:`register` call in this process did (``None`` before it).
_STATE: tuple[str, ...] | None = None


def registered() -> tuple[str, ...] | None:
    """What :func:`register` swapped in this process (empty: nothing), ``None`` before it ran."""
    return _STATE


def register() -> None:
    """Swap vLLM's kernels for hexlayout's (see the module docstring); idempotent."""
    global _STATE
    if _STATE is not None:
        return
    kernels = selected_kernels()
    if not kernels:
        _STATE = ()
        return
    from . import config
    from .log import announce, logger

    platform, capability = config.vllm_platform()
    decision = device_decision(platform, capability)
    if not decision.run:
        _STATE = ()
        # A warning: the plugin was asked to swap kernels and cannot (printed even before vLLM
        # sets up its log handlers).
        logger.warning("hexlayout: %s", decision.reason)
        return
    swapped: list[str] = []
    if "attention" in kernels:
        from .mla import register_mla

        swapped.append(register_mla())
        if platform == "cpu":
            from .attention import register_attention
            from .mla import register_cpu_mla

            swapped.append(register_attention())
            swapped.append(register_cpu_mla())
        else:
            from .cuda_attention import register_cuda_attention
            from .cuda_mla import register_cuda_mla

            swapped.append(register_cuda_attention())
            swapped.append(register_cuda_mla())
    if "moe" in kernels:
        from .awq import register_awq
        from .gptq import register_gptq
        from .moe import register_moe
        from .mxfp4 import register_mxfp4

        swapped.extend(register_moe() + register_awq() + register_gptq() + register_mxfp4())
    if "mamba" in kernels:
        from .mamba import register_mamba
        from .mamba1 import register_mamba1

        swapped.extend([register_mamba(), register_mamba1()])
    _STATE = tuple(swapped)
    announce(f"hexlayout ({decision.mode}): swapped {'; '.join(swapped) if swapped else 'nothing'}")
