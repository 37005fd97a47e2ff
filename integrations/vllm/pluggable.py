"""Out-of-tree replacement of vLLM's pluggable layers, once per process.

``PluggableLayer.register_oot`` maps a layer's class name to a replacement that vLLM builds
instead (at instantiation) and refuses a second registration of the name; the plugin's
``register()`` may run its registrations more than once in a process (it is idempotent), so
:func:`register_layer` registers only when the name does not map to the replacement yet.
"""

from __future__ import annotations

from typing import Any

__all__ = ["register_layer"]


def register_layer(base: Any, replacement: type, note: str = "") -> str:
    """Make vLLM build ``replacement`` wherever it builds ``base`` (a ``PluggableLayer``
    subclass); returns ``"<base> -> <module>.<replacement><note>"`` for the plugin's log."""
    from vllm.model_executor.custom_op import op_registry_oot

    if op_registry_oot.get(base.__name__) is not replacement:
        base.register_oot(replacement)
    return f"{base.__name__} -> {replacement.__module__}.{replacement.__qualname__}{note}"
