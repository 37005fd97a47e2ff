"""Integrations of hexlayout kernels with serving frameworks.

Installed as ``hexlayout.integrations``: the top layer (it may import ``hexlayout.ops``).
``hexlayout.integrations.vllm`` is the vLLM plugin (entry point ``vllm.general_plugins`` ->
``hexlayout``); it imports vLLM only when vLLM calls its ``register()``.
"""
