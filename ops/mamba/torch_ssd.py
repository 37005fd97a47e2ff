"""``torch.ops.hexlayout.ssd_scan`` registered with torch.library.

Schema: ``ssd_scan(Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, int chunk_size=256,
Tensor? D=None, Tensor? z=None, Tensor? dt_bias=None, bool dt_softplus=False, float dt_min=0.,
float? dt_max=None, Tensor? initial_states=None, Tensor? cu_seqlens=None) -> (Tensor, Tensor)``:
``dt_limit = (dt_min, dt_max)`` with ``dt_max=None`` meaning ``inf`` (a schema default cannot
be ``inf``); it always returns ``(y, final_states)``. Every path (CUDA, CPU under
``HEXLAYOUT_EMULATE=1``, fake) first runs ``ssd_args.check_ssd_scan``; the fake implementation
allocates the outputs with the real path's shapes.
"""

from __future__ import annotations

import math
import numbers
from typing import Any

from hexlayout.runtime.args import ArgumentError, ArgumentTypeError
from hexlayout.runtime.torch_ops import define_op

from ..host.checks import kind
from .ssd import run_ssd_scan, ssd_outputs
from .ssd_args import OP, check_ssd_scan, ssd_sequences

__all__ = ["ssd_scan_op"]

SCHEMA = ("(Tensor x, Tensor dt, Tensor A, Tensor B, Tensor C, int chunk_size=256, Tensor? D=None, "
          "Tensor? z=None, Tensor? dt_bias=None, bool dt_softplus=False, float dt_min=0., "
          "float? dt_max=None, "
          "Tensor? initial_states=None, Tensor? cu_seqlens=None) -> (Tensor, Tensor)")


def _limit(dt_min: float, dt_max: float | None) -> tuple[float, float]:
    return (dt_min, math.inf if dt_max is None else dt_max)


def _check_dt_bounds(dt_min: Any, dt_max: Any) -> None:
    """``dt_min`` a real other than NaN / +inf, ``dt_max`` (None: inf) a real, not NaN, ``>= dt_min``:
    what ``check_dt_limit`` asks of ``(dt_min, dt_max)``, with the error naming the schema's bound."""
    for name, v in (("dt_min", dt_min), ("dt_max", dt_max)):
        if not (v is None and name == "dt_max" or isinstance(v, numbers.Real) and not isinstance(v, bool)):
            raise ArgumentTypeError(OP, name, f"expected a real number, got {kind(v)}")
    if math.isnan(dt_min) or dt_min == math.inf:
        raise ArgumentError(OP, "dt_min", f"is {dt_min}: expected a number below inf")
    if dt_max is not None and (math.isnan(dt_max) or dt_max < dt_min):
        raise ArgumentError(OP, "dt_max", f"is {dt_max}: expected a number >= dt_min = {dt_min} (None: inf)")


def _check(x: Any, dt: Any, A: Any, B: Any, C: Any, chunk_size: int = 256, D: Any = None, z: Any = None,
           dt_bias: Any = None, dt_softplus: bool = False, dt_min: float = 0.0, dt_max: float | None = None,
           initial_states: Any = None, cu_seqlens: Any = None) -> None:
    _check_dt_bounds(dt_min, dt_max)
    check_ssd_scan(x, dt, A, B, C, chunk_size, D, z, dt_bias, dt_softplus, _limit(dt_min, dt_max),
                   initial_states, cu_seqlens)


def _fake(x: Any, dt: Any, A: Any, B: Any, C: Any, chunk_size: int = 256, D: Any = None, z: Any = None,
          dt_bias: Any = None, dt_softplus: bool = False, dt_min: float = 0.0, dt_max: float | None = None,
          initial_states: Any = None, cu_seqlens: Any = None) -> tuple[Any, Any]:
    return ssd_outputs(x, B.shape[3], ssd_sequences(x, cu_seqlens))


def _impl(x: Any, dt: Any, A: Any, B: Any, C: Any, chunk_size: int = 256, D: Any = None, z: Any = None,
          dt_bias: Any = None, dt_softplus: bool = False, dt_min: float = 0.0, dt_max: float | None = None,
          initial_states: Any = None, cu_seqlens: Any = None) -> tuple[Any, Any]:
    return run_ssd_scan(x, dt, A, B, C, D, z, dt_bias, dt_softplus, _limit(dt_min, dt_max), initial_states,
                        cu_seqlens)


ssd_scan_op = define_op("ssd_scan", SCHEMA, fake=_fake, impl=_impl, check=_check)
