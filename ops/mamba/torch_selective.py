"""``torch.ops.hexlayout.selective_scan`` and ``torch.ops.hexlayout.selective_state_update``:
the Mamba-1 scan and the decode step registered with torch.library.

Schemas::

    selective_scan(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D=None,
        Tensor? z=None, Tensor? delta_bias=None, bool delta_softplus=False,
        bool return_last_state=False, Tensor? initial_states=None,
        Tensor? cu_seqlens=None) -> (Tensor out, Tensor last_state)
    selective_state_update(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C,
        Tensor? D=None, Tensor? z=None, Tensor? dt_bias=None, bool dt_softplus=False,
        Tensor? state_batch_indices=None) -> Tensor

The torch op of ``selective_scan`` always returns ``last_state`` (``[S, dim, N]`` f32, S = batch
or ``len(cu_seqlens) - 1``; its
contents are written only with ``return_last_state=True``), so the schema has one return type;
``hexlayout.ops.selective_scan`` returns ``out`` alone unless asked. ``selective_state_update``
mutates ``state``. Every path (CUDA, CPU under ``HEXLAYOUT_EMULATE=1``, fake) first runs the
argument check, so a bad argument gets the same error eagerly and while tracing.
"""

from __future__ import annotations

from typing import Any

from hexlayout.runtime.torch_ops import define_op

from .selective_scan import run_selective_scan
from .selective_scan_args import check_selective_scan
from .state_update import run_selective_state_update
from .state_update_args import check_selective_state_update

__all__ = ["selective_scan_op", "selective_state_update_op"]

SCAN_SCHEMA = (
    "(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D=None, Tensor? z=None, "
    "Tensor? delta_bias=None, bool delta_softplus=False, bool return_last_state=False, "
    "Tensor? initial_states=None, Tensor? cu_seqlens=None) -> (Tensor, Tensor)"
)
UPDATE_SCHEMA = (
    "(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor? D=None, Tensor? z=None, "
    "Tensor? dt_bias=None, bool dt_softplus=False, Tensor? state_batch_indices=None) -> Tensor"
)


def _scan_fake(u: Any, delta: Any, A: Any, B: Any, C: Any, D: Any = None, z: Any = None,
               delta_bias: Any = None, delta_softplus: bool = False, return_last_state: bool = False,
               initial_states: Any = None, cu_seqlens: Any = None) -> tuple[Any, Any]:  # fmt: skip
    seqs = u.shape[0] if cu_seqlens is None else cu_seqlens.shape[0] - 1
    return u.new_empty(u.shape), A.new_empty((seqs, u.shape[1], A.shape[1]))


def _update_fake(state: Any, x: Any, *args: Any, **kwargs: Any) -> Any:
    return x.new_empty(x.shape)


selective_scan_op = define_op(
    "selective_scan", SCAN_SCHEMA, fake=_scan_fake, impl=run_selective_scan, check=check_selective_scan
)
selective_state_update_op = define_op(
    "selective_state_update",
    UPDATE_SCHEMA,
    fake=_update_fake,
    impl=run_selective_state_update,
    check=check_selective_state_update,
)
