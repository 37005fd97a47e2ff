"""``hl.offline``: a global input whose layout the op chooses once, ahead of time (a weight).

``q: hl.offline(hl.u4[R, K])`` declares a 2-d input the kernel indexes in *logical*
coordinates (row ``r``, column ``k``) but whose bytes the host stores in the order synthesis
chooses. The kernel copies ``(TR, TK)`` tiles at tile-aligned origins into register tiles::

    w = hl.copy(hl.view(q, (BN, BK), (row0, k0)))        # u4: the unpacked values, [0, 15]

Once synthesis has chosen the register tile's thread-value layout ``L`` (from the mma that
consumes the values), the tile's storage order is ``L``'s inverse, thread-major: each
thread's fragment is one contiguous run, loaded as 16-byte vectors (``hexlayout.ir.offline``).
Every copy of one offline tensor must take the same tile shape into the same layout. The
result is ``build.offline_layouts[name]``, an ``OfflineLayout`` whose ``apply(values)``
packs the logical integer values ``[R, K]`` into the tensor the kernel takes (same byte shape
``[R, K * bits / 8]``, ``R`` and ``K`` padded to whole tiles); the launch checks the extents
are multiples of the tile.

Element types: 4-bit (packed two per byte), 8-bit and wider (16-bit scales: ``apply`` keeps the
values' dtype). The register tile may be replicated (threads holding the same values: a ``(BN,
1)`` column of scales broadcast across a fragment's K threads): the order is that of its owners,
each thread reading its owner's run.

Restrictions: two modes, row-major (no explicit strides), read-only, copied only into register
tiles (no gathered rows, no shared-memory copies: those would read the logical order).
"""

from __future__ import annotations

from dataclasses import replace

from .spec import Tensor

__all__ = ["offline"]


def offline(t: Tensor) -> Tensor:
    """The type ``t`` (a 2-d global tensor type) stored in the order synthesis chooses.

    Args:
        t (Tensor): the logical type, e.g. ``hl.u4[EN, K]``.

    Returns:
        Tensor: ``t`` marked offline.

    Raises:
        TypeError: ``t`` is not a tensor type.
        ValueError: ``t`` has explicit strides or not two modes.

    Example:
        >>> str(hl.offline(hl.u4["R", "K"]))
        'offline(u4[R, K])'
    """
    if not isinstance(t, Tensor):
        raise TypeError(f"hl.offline takes a tensor type such as hl.u4[R, K], got {t!r}")
    if t.stride is not None or len(t.shape) != 2:
        raise ValueError(f"hl.offline({t}): an offline tensor has two row-major modes [R, K] (no strides)")
    return replace(t, offline=True)
