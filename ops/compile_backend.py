"""``torch.compile(model, backend="hexlayout")``: the backend with this layer's anchor kernels.

The fusion layer (``hexlayout.fusion``) fuses prologues and epilogues into anchor kernels it
does not own: the GEMMs (``gemm.fusion``), the row reductions (``row_reduce.fusion``),
attention (``attention.sdpa_fusion``) and the MoE experts (``moe.fusion``) are this layer's,
and each module registers its anchor records (``hexlayout.fusion.anchors.AnchorRecord``) when
it is imported. This module imports the four (so
importing it - or ``hexlayout.ops`` - makes every anchor available) and is what torch's
``torch_dynamo_backends`` entry point names (``hexlayout =
"hexlayout.ops.compile_backend:hexlayout_backend"`` in ``pyproject.toml``): torch finds the
backend by name without hexlayout being imported first, and the fusion layer never imports
the kernels layer above it. Importing this module does not import torch.
"""

from __future__ import annotations

from typing import Any

from hexlayout.fusion.backend import hexlayout_backend as _fusion_backend

# the MoE record first: its graph pass (``prepare``) must see each expert's gate / up GEMMs
# before the GEMM record's pass makes each pair one GEMM
from .moe import fusion as _moe_fusion  # noqa: F401 - registers the MoE experts anchor

# isort: split
from .attention import sdpa_fusion as _sdpa_fusion  # noqa: F401 - registers the attention anchor
from .gemm import fusion as _gemm_fusion  # noqa: F401 - registers the GEMM anchors
from .row_reduce import fusion as _row_reduce_fusion  # noqa: F401 - registers the row reductions

__all__ = ["hexlayout_backend"]


def hexlayout_backend(gm: Any, example_inputs: list[Any], options: dict[str, Any] | None = None,
                      mode: str | None = None) -> Any:
    """The ``torch.compile`` backend: ``hexlayout.fusion.backend.hexlayout_backend`` with the
    anchors of ``hexlayout.ops`` registered (options ``"fallback"``: ``"inductor"`` or
    ``"eager"``, ``"on_plan"``: a callable given each graph's plan)."""
    return _fusion_backend(gm, example_inputs, options=options, mode=mode)
