"""Integrations of hexlayout kernels with serving frameworks (the vLLM plugin).

Installed as ``hexlayout.integrations``. Empty until the kernels exist.
"""
