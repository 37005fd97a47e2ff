"""The epilogue of a ``tcgen05`` kernel (sm_100a), read from its SASS: the instructions that bring
the accumulator from tensor memory (``LDTM``, ``tcgen05.ld``) to its output stores, per
accumulator value a thread loads.

Definitions (per warp instruction stream, as :mod:`hexlayout.runtime.stats`):

- **accumulator loads**: the executed ``LDTM`` instructions outside the main loop. Registers per
  thread of one (``tmem_load_values``): ``.xN`` times the shape's: 1 for ``32x32b`` (no shape
  suffix in the SASS) and ``16x64b`` / ``16x32bx2`` (``16dp64bit`` / ``16dp32bit``), 2 for
  ``16x128b`` (``16dp128bit``), 4 for ``16x256b`` (``16dp256bit``).
- **the epilogue**: when the first accumulator load lies in a loop holding no MMA (an epilogue
  walking the accumulator in sub-tiles, or an epilogue warp role's loop over tiles), one
  iteration of the innermost such loop, its ``values`` the registers its loads fill; otherwise
  the straight span from the first accumulator load to the last output store (``STG`` / ``ST`` /
  ``UTMASTG`` / ``UBLKCP`` / ``UTMAREDG``) after the last load, the main loop's instructions
  excluded, its ``values`` those of every load in it. Either way without the side paths a
  conditional forward branch in it jumps over that store nothing (the accumulator's fill for an
  empty K range, say).
- **instructions per value** = the epilogue's executed instructions (``@!PT`` padding excluded,
  the loads included) ÷ ``values``: what the kernel spends per accumulator element a thread holds,
  comparable across tile shapes and load shapes.

It is a static count: the span's branches are counted once each, whichever a thread takes.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .sass_listing import branch_target, unconditional

if TYPE_CHECKING:
    from .sass_listing import Instruction, Loop

__all__ = ["Epilogue", "tmem_epilogue", "tmem_load_values"]

#: registers per thread of one ``.x1`` TMEM load or store, by its SASS shape suffix
_SHAPE_REGS = {"16dp256bit": 4, "16dp128bit": 2, "16dp64bit": 1, "16dp32bit": 1}
#: the output stores an epilogue ends with
_OUTPUT_STORES = frozenset({"STG", "ST", "UTMASTG", "UBLKCP", "UTMAREDG"})


@dataclass(frozen=True)
class Epilogue:
    """The epilogue (module docstring): its address span, executed instructions, accumulator
    values per thread, whether it is one iteration of a loop, and its opcode mix."""

    start: int
    end: int
    instructions: int
    values: int
    looped: bool
    mix: dict[str, int]

    @property
    def per_value(self) -> float:
        """Executed instructions per accumulator value a thread loads."""
        return self.instructions / self.values


def tmem_load_values(op: str) -> int:
    """Registers per thread an ``LDTM`` / ``STTM`` with opcode ``op`` moves
    (``LDTM.x128`` -> 128, ``LDTM.16dp256bit.x2`` -> 8)."""
    mods = op.split(".")[1:]
    num = next((int(m[1:]) for m in mods if m.startswith("x") and m[1:].isdigit()), 1)
    shape = next((_SHAPE_REGS[k] for m in mods for k in _SHAPE_REGS if m.startswith(k)), 1)
    return num * shape


def _side_paths(code: list[Instruction], first: int, last: int) -> set[int]:
    """Indices in ``[first, last]`` that a conditional forward branch there jumps over when
    nothing between it and its target stores (``ST*`` / ``UTMASTG`` / ...)."""
    index = {ins.addr: j for j, ins in enumerate(code)}
    out: set[int] = set()
    for b in range(first, last + 1):
        t = branch_target(code[b])
        if t is None or unconditional(code[b]) or t <= code[b].addr or index.get(t, last + 1) > last:
            continue
        region = range(b + 1, index[t])
        if not any(code[j].base.startswith("ST") or code[j].base in _OUTPUT_STORES for j in region):
            out.update(region)
    return out


def tmem_epilogue(code: list[Instruction], main: Loop | None, spans: list[Loop]) -> Epilogue | None:
    """The epilogue of ``code`` (module docstring) given its main loop and loop spans
    (``sass_listing.find_main_loop`` / ``sass_listing.loops``); ``None`` without accumulator loads."""
    in_main = range(main.first, main.last + 1) if main is not None else range(0)
    loads = [j for j, ins in enumerate(code) if ins.base == "LDTM" and not ins.never and j not in in_main]
    if not loads:
        return None
    first = loads[0]
    around = [lp for lp in spans if lp.first <= first <= lp.last and not lp.mma]
    if around:
        lp = min(around, key=lambda s: s.last - s.first)
        idx = [j for j in range(lp.first, lp.last + 1) if j not in _side_paths(code, lp.first, lp.last)]
    else:
        stores = [j for j, ins in enumerate(code) if ins.base in _OUTPUT_STORES and not ins.never
                  and j > loads[-1]]
        idx = [j for j in range(first, max(stores, default=loads[-1]) + 1) if j not in in_main]
        idx = [j for j in idx if j not in _side_paths(code, idx[0], idx[-1])]
    body = [code[j] for j in idx if not code[j].never]
    values = sum(tmem_load_values(code[j].op) for j in set(idx) & set(loads))
    return Epilogue(code[idx[0]].addr, code[idx[-1]].addr, len(body), values, bool(around),
                    dict(Counter(i.base for i in body).most_common()))
