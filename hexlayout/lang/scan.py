"""``hl.scan``: inclusive scans along one axis of register tiles.

- ``hl.scan(x, axis, fn="add" | "mul" | "max" | "min", reverse=False, init=None, carry=False)``:
  the running sum / product / maximum / minimum along ``axis`` (``carry=True``: and each
  row's last element, the ``init`` of a next chunk);
- ``hl.scan((a, b), axis, fn="linear", reverse=False, init=None, carry=False)``: the first-order linear
  recurrence ``h_i = a_i * h_{i-1} + b_i`` (Mamba's), a scan of the pairs ``(a, b)`` under
  ``(a1, b1) then (a2, b2) = (a2 * a1, a2 * b1 + b2)``.

Layouts and the in-thread / shuffle / shared-memory sequence are synthesized as for
``hl.reduce`` (``hexlayout.ir.lower.scan``); a ragged view's padding takes part as the
identity (``hexlayout.ir.padding``).
"""

from __future__ import annotations

from typing import Any

from hexlayout.ir.tile import Scan
from hexlayout.ir.types import LayoutVar, Scope, TileType

from .checks import as_tile, begin, require_scope, static_int
from .tensor import Tile, describe, shape_str

__all__ = ["scan"]

#: ``"sum"`` is accepted for ``"add"``, as ``hl.reduce`` spells it
_ALIASES = {"sum": "add"}


def scan(x: Tile | tuple[Tile, Tile], axis: int, fn: str = "add", reverse: bool = False,
         init: Tile | None = None, carry: bool = False) -> Tile | tuple[Tile, Tile]:
    """The inclusive scan of a register tile along one axis.

    For ``fn`` in ``"add"`` (also ``"sum"``), ``"mul"``, ``"max"``, ``"min"``:
    ``y[..., i, ...] = init (+) x[..., 0, ...] (+) ... (+) x[..., i, ...]`` where ``(+)`` is
    ``fn`` (``init`` left out when not given). For ``fn="linear"`` ``x`` is a pair ``(a, b)``
    of tiles of one shape and type and ``y[..., i, ...] = h_i`` with
    ``h_i = a_i * h_{i-1} + b_i`` and ``h_{-1} = init`` (0 when not given): the scan of the
    pairs under the associative ``(a1, b1) then (a2, b2) = (a2 * a1, a2 * b1 + b2)``, so
    ``h_i = sum_{j<=i} (prod_{j<k<=i} a_k) b_j + (prod_{k<=i} a_k) init``.
    ``reverse=True``: ``i`` runs from the last element to the first (``h_i = a_i * h_{i+1} + b_i``,
    ``init`` is ``h_n``). The result has ``x``'s shape, element type and layout; ``init`` has
    that shape with ``axis`` of extent 1 (a per-row carry, e.g. the state a chunked kernel
    carries from one chunk to the next). Elements that hold the padding of a ragged view take
    part as the identity (0; 1; -inf; +inf; the pair (1, 0)), as in ``hl.reduce``: the outputs
    there are the scan of the in-bounds part and a store through the view skips them.
    ``carry=True`` also returns the scan's last element per row (``y[..., n-1, ...]``, reversed
    ``y[..., 0, ...]``; on a ragged view the scan of the whole in-bounds part), in ``init``'s
    shape: the ``init`` of the next chunk of a chunked scan.
    Arithmetic is in the element type. Synthesis keeps the source's layout and routes the
    scan through the thread's own values in order, then warp shuffles across the lanes, then
    shared memory across warps.

    Args:
        x (Tile | tuple[Tile, Tile]): a register tile; for ``"linear"`` the pair ``(a, b)``.
        axis (int): the mode scanned, static; negative counts from the end.
        fn (str): ``"add"``, ``"mul"``, ``"max"``, ``"min"`` or ``"linear"``.
        reverse (bool): scan from the end of ``axis``.
        init (Tile | None): the element before the first, a register tile of the result's
            shape with ``axis`` of extent 1 and its element type.
        carry (bool): also return each row's last element.

    Returns:
        Tile | tuple[Tile, Tile]: a new register tile of ``x``'s shape and element type; with
        ``carry``, ``(y, last)`` where ``last`` has ``init``'s shape.

    Raises:
        KernelError: called outside a kernel trace; ``fn`` is not one of the five; ``x`` is
            not a register tile (a pair of register tiles of one shape and type for
            ``"linear"``); ``axis`` is not a static mode; ``init`` has another shape or type.

    Example:
        Running sums of rows, and ``h_i = 0.5 h_{i-1} + x_i`` from the right with the state
        ``h_0`` of each row for the chunk before::

            @hl.kernel(threads=128)
            def prefix():
                x = hl.full((64, 32), 1.0, hl.f32)
                s = hl.scan(x, axis=1)
                h, h0 = hl.scan((hl.full((64, 32), 0.5, hl.f32), x), axis=1, fn="linear", reverse=True,
                                init=hl.zeros((64, 1), hl.f32), carry=True)
                assert s.shape == h.shape == (64, 32) and h0.shape == (64, 1)

            prefix.trace()
    """
    ctx, loc = begin("scan")
    fn = _ALIASES.get(fn, fn) if isinstance(fn, str) else fn
    if fn not in Scan.FUNCTIONS:
        raise ctx.error("scan", loc, f"unknown scan function {fn!r}; use one of {', '.join(Scan.FUNCTIONS)}")
    srcs = _sources(ctx, loc, x, fn)
    t = srcs[0]
    ax = static_int(axis)
    if ax is None or not -t.ndim <= ax < t.ndim:
        raise ctx.error("scan", loc, f"axis {axis!r} out of range for {describe(t.value)}")
    ax %= t.ndim
    if not isinstance(reverse, bool):
        raise ctx.error("scan", loc, f"reverse must be True or False, got {reverse!r}")
    if not isinstance(carry, bool):
        raise ctx.error("scan", loc, f"carry must be True or False, got {carry!r}")
    iv = None
    want = tuple(1 if i == ax else s for i, s in enumerate(t.shape))
    if init is not None:
        it = as_tile(ctx, "scan", loc, init, "init")
        require_scope(ctx, "scan", loc, it, "init", (Scope.REGISTER,))
        if tuple(it.shape) != want or it.dtype != t.dtype:
            raise ctx.error("scan", loc, f"init {describe(it.value)} must be a {t.dtype.name}"
                            f"{shape_str(want)} tile (the result's shape with axis {ax} of extent 1)")
        iv = it.value
    v = ctx.new_value(TileType(t.dtype, tuple(t.shape), Scope.REGISTER, LayoutVar()), loc,
                      tuple(s.value for s in srcs))
    cv = None
    if carry:
        cv = ctx.new_value(TileType(t.dtype, want, Scope.REGISTER, LayoutVar()), loc, (v,),
                           name=f"{v.name}_carry")
    ctx.emit(Scan(v, tuple(s.value for s in srcs), fn, ax, reverse, iv, carry=cv, loc=loc))
    return (Tile(v, ctx), Tile(cv, ctx)) if cv is not None else Tile(v, ctx)


def _sources(ctx: Any, loc: Any, x: Any, fn: str) -> list[Tile]:
    """The register tiles scanned: ``[x]``, or ``[a, b]`` of one shape and type for ``"linear"``."""
    if fn == "linear":
        if not isinstance(x, (tuple, list)) or len(x) != 2:
            raise ctx.error("scan", loc, f"fn='linear' scans a pair of tiles (a, b), got {type(x).__name__}")
        roles = ("a", "b")
    else:
        if isinstance(x, (tuple, list)):
            raise ctx.error("scan", loc, f"fn={fn!r} scans one tile; a pair (a, b) is for fn='linear'")
        x, roles = (x,), ("x",)
    out = []
    for xi, role in zip(x, roles):
        t = as_tile(ctx, "scan", loc, xi, role)
        require_scope(ctx, "scan", loc, t, role, (Scope.REGISTER,))
        out.append(t)
    if len(out) == 2 and (tuple(out[0].shape) != tuple(out[1].shape) or out[0].dtype != out[1].dtype):
        raise ctx.error("scan", loc, f"a {describe(out[0].value)} and b {describe(out[1].value)} must have "
                        "one shape and element type")
    return out
