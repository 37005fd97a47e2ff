"""Post-scheduling fusion: prologues into an anchor kernel's operand loads, epilogues into
its store (see ``spec`` for what a fused kernel computes); the graph front end
(``torch.compile(model, backend="hexlayout")``, ``explain``) that finds them in models."""

from .explain import explain
from .fused_op import FusionWarning
from .plan import Fallback, FusionPlan, KernelPlan
from .run import clear_fused_builds, reference, run_fused
from .spec import ANCHORS, Epilogue, FusedSpec, FusionUnsupported, Node, Prologue

__all__ = ["ANCHORS", "Node", "Prologue", "Epilogue", "FusedSpec", "FusionUnsupported", "run_fused",
           "reference", "clear_fused_builds", "explain", "FusionPlan", "KernelPlan", "Fallback",
           "FusionWarning"]
