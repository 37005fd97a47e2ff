"""``explain(fn, *example_inputs)``: what ``torch.compile(fn, backend="hexlayout")`` fuses.

It compiles ``fn`` with the hexlayout backend - by its name, ``backend="hexlayout"``, which
torch resolves through the ``torch_dynamo_backends`` entry point (the kernels layer's
``compile_backend``, which registers the anchor kernels) - with the rest in torch eager, runs
it once on the example inputs (so a kernel that the fusion mechanism refuses for these
shapes or dtypes is reported with the mechanism's reason) and returns the ``FusionPlan``: ``kernels`` (name,
anchor, prologue and epilogue aten ops) and ``fallbacks`` (each op left to torch, with its
reason). Grad mode is the caller's: under grad with parameters that require grad, every
op is left to torch for that reason (wrap the call in ``torch.no_grad()`` to see the
inference plan).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .plan import FusionPlan, GraphPlan

__all__ = ["explain"]


def explain(fn: Callable[..., Any], *example_inputs: Any, **example_kwargs: Any) -> FusionPlan:
    """The ``FusionPlan`` of ``fn`` (a function or ``nn.Module``) on ``example_inputs``."""
    import torch

    plans: list[GraphPlan] = []
    compiled = torch.compile(fn, backend="hexlayout",
                             options={"fallback": "eager", "on_plan": plans.append})
    compiled(*example_inputs, **example_kwargs)
    return GraphPlan.merge(plans)
