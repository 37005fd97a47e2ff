"""``torch.ops.hexlayout.selective_scan`` and ``torch.ops.hexlayout.selective_state_update``:
the Mamba-1 scan and the decode step registered with torch.library.

Schemas::

    selective_scan(Tensor u, Tensor delta, Tensor A, Tensor B, Tensor C, Tensor? D=None,
        Tensor? z=None, Tensor? delta_bias=None, bool delta_softplus=False,
        bool return_last_state=False) -> (Tensor out, Tensor last_state)
    selective_state_update(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C,
        Tensor? D=None, Tensor? z=None, Tensor? dt_bias=None, bool dt_softplus=False,
        Tensor? state_batch_indices=None) -> Tensor

The torch op of ``selective_scan`` always returns ``last_state`` (``[batch, dim, N]`` f32; its
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
    "Tensor? delta_bias=None, bool delta_softplus=False, bool return_last_state=False) -> (Tensor, Tensor)"
)
UPDATE_SCHEMA = (
    "(Tensor(a!) state, Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, Tensor? D=None, Tensor? z=None, "
    "Tensor? dt_bias=None, bool dt_softplus=False, Tensor? state_batch_indices=None) -> Tensor"
)


def _scan_fake(
    u: Any,
    delta: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    z: Any = None,
    delta_bias: Any = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
) -> tuple[Any, Any]:
    return u.new_empty(u.shape), A.new_empty((u.shape[0], u.shape[1], A.shape[1]))


def _scan_impl(
    u: Any,
    delta: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    z: Any = None,
    delta_bias: Any = None,
    delta_softplus: bool = False,
    return_last_state: bool = False,
) -> tuple[Any, Any]:
    return run_selective_scan(u, delta, A, B, C, D, z, delta_bias, delta_softplus, return_last_state)


def _update_fake(
    state: Any,
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    z: Any = None,
    dt_bias: Any = None,
    dt_softplus: bool = False,
    state_batch_indices: Any = None,
) -> Any:
    return x.new_empty(x.shape)


def _update_impl(
    state: Any,
    x: Any,
    dt: Any,
    A: Any,
    B: Any,
    C: Any,
    D: Any = None,
    z: Any = None,
    dt_bias: Any = None,
    dt_softplus: bool = False,
    state_batch_indices: Any = None,
) -> Any:
    return run_selective_state_update(state, x, dt, A, B, C, D, z, dt_bias, dt_softplus, state_batch_indices)


selective_scan_op = define_op(
    "selective_scan", SCAN_SCHEMA, fake=_scan_fake, impl=_scan_impl, check=check_selective_scan
)
selective_state_update_op = define_op(
    "selective_state_update",
    UPDATE_SCHEMA,
    fake=_update_fake,
    impl=_update_impl,
    check=check_selective_state_update,
)
