"""Post-scheduling fusion: prologues into an anchor kernel's operand loads, epilogues into
its store (see ``spec`` for what a fused kernel computes); the graph front end
(``torch.compile(model, backend="hexlayout")``, ``explain``) that finds them in models."""

from .explain import explain
from .fused_op import FusionWarning
from .plan import Fallback, FusionPlan, KernelPlan
from .run import clear_fused_builds, reference, run_fused
from .spec import Epilogue, FusedSpec, FusionUnsupported, Node, Prologue

__all__ = ["ANCHORS", "Node", "Prologue", "Epilogue", "FusedSpec", "FusionUnsupported", "run_fused",
           "reference", "clear_fused_builds", "explain", "FusionPlan", "KernelPlan", "Fallback",
           "FusionWarning"]


def __getattr__(name: str) -> object:
    """``ANCHORS``: the spec anchors the registered anchor records run (``anchors.spec_anchors``)."""
    if name == "ANCHORS":
        from .anchors import spec_anchors

        return spec_anchors()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
