"""Look atoms up by their CuTe name: ``get_atom`` and ``list_atoms``.

Every atom family module (``sm80``, ``sm89``, ``sm90``, ``sm100``, ``ldsm``, ``copies``, ``tma``)
exposes a table ``name -> factory``; factories take the atom's keyword options (e.g.
``a_major="MN"`` for a wgmma SS atom) and are called once per distinct option set
(atoms are immutable and cached). Tables are built on first use so that importing
``hexlayout.arch`` stays cheap.

CuTe's template spellings are accepted too: ``UniversalCopy<uint128_t>`` is
``UniversalCopy_U128``, ``SM80_CP_ASYNC_CACHEGLOBAL<uint128_t>`` is
``SM80_CP_ASYNC_CACHEGLOBAL_U128``.
"""

from __future__ import annotations

import difflib
import inspect
import re
from collections.abc import Callable
from functools import cache, lru_cache
from typing import Any

from .copy_atom import CopyAtom
from .mma_atom import MmaAtom
from .targets import check_arch_name

__all__ = ["get_atom", "list_atoms", "Atom", "atom_spec"]

Atom = MmaAtom | CopyAtom

_KIND_FAMILY = {"mma.sync": "mma", "wgmma": "mma", "tcgen05": "mma", "universal": "copy", "cp.async": "copy",
                "ldmatrix": "copy", "stmatrix": "copy", "tma": "copy"}


@lru_cache(maxsize=1)
def _tables() -> dict[str, Callable[..., Atom]]:
    from . import copies, ldsm, sm80, sm89, sm90, sm100, tma

    out: dict[str, Callable[..., Atom]] = {}
    for table in (sm80.SM80_MMA, sm89.SM89_MMA, sm90.SM90_GMMA, sm100.SM100_UMMA, ldsm.LDSM_STSM,
                  copies.COPIES, tma.TMA_ATOMS):
        out.update(table)
    return out


_TEMPLATE = re.compile(r"^(\w+?)\s*<\s*(u?int(\d+)_t|uint128_t)\s*(,\s*u?int\d+_t\s*)?>$")


def _normalize(name: str) -> str:
    name = name.strip()
    m = _TEMPLATE.match(name)
    if m:
        base, tname = m.group(1), m.group(2)
        bits = re.search(r"(\d+)", tname).group(1)  # type: ignore[union-attr]
        return f"{base}_U{bits}"
    return name


@cache
def _build(name: str, options: tuple[tuple[str, Any], ...]) -> Atom:
    return _tables()[name](**dict(options))


_OPTIONS = re.compile(r"^(?P<name>[^\[\]]+)\[(?P<opts>[^\[\]]*)\]$")


def _split_options(name: str) -> tuple[str, dict[str, Any]]:
    """``"NAME[a_major=K,b_major=MN]"`` -> ``("NAME", {"a_major": "K", "b_major": "MN"})``."""
    m = _OPTIONS.match(name.strip())
    if not m:
        return name, {}
    opts: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in m.group("opts").split(","))):
        if "=" not in part:
            raise ValueError(f"atom {name!r}: option {part!r} is not key=value")
        k, v = (x.strip() for x in part.split("=", 1))
        opts[k] = int(v) if v.isdigit() else v
    return m.group("name").strip(), opts


def atom_spec(atom: Atom) -> str:
    """The string ``get_atom`` takes back to this atom: its name, with its options when they
    differ from the defaults (``SM90_64x128x16_F32F16F16_SS[a_major=K,b_major=MN]``)."""
    default = get_atom(atom.name)
    if default == atom:
        return atom.name
    return atom.name + "[" + ",".join(f"{k}={v}" for k, v in atom.options) + "]"


def get_atom(name: str, **options: Any) -> Atom:
    """The atom CuTe calls ``name``, e.g. ``get_atom("SM80_16x8x16_F32F16F16F32_TN")``.

    Options may also be written into the name: ``"SM90_64x128x16_F32F16F16_SS[b_major=MN]"``
    (``atom_spec`` gives that form for an atom).

    Options configure atoms that CuTe parameterizes by template arguments:
    wgmma SS atoms take ``a_major`` / ``b_major`` in {"K", "MN"}; ``UniversalCopy_*`` take
    ``src`` / ``dst`` memory spaces; TMA atoms take ``bits``. Unknown names raise a
    ``ValueError`` listing close matches; unknown options raise ``ValueError`` too.
    """
    name, named_options = _split_options(name)
    options = {**named_options, **options}
    key = _normalize(name)
    tables = _tables()
    if key not in tables:
        close = difflib.get_close_matches(key, tables.keys(), n=6, cutoff=0.6)
        hint = f"; close matches: {', '.join(close)}" if close else ""
        raise ValueError(f"unknown atom {name!r}{hint} (list_atoms() gives all {len(tables)} names)")
    factory = tables[key]
    params = inspect.signature(factory).parameters
    unknown = [k for k in options if k not in params]
    if unknown:
        allowed = ", ".join(params) or "none"
        raise ValueError(f"atom {key}: unknown option(s) {', '.join(unknown)} (allowed: {allowed})")
    return _build(key, tuple(sorted(options.items())))


def list_atoms(arch: str | None = None, kind: str | None = None) -> list[str]:
    """Sorted names of the atoms, optionally only those ``arch`` offers and of one ``kind``.

    ``kind`` is a family ("mma", "copy") or an instruction kind ("mma.sync", "wgmma", "tcgen05",
    "universal", "cp.async", "ldmatrix", "stmatrix", "tma").
    """
    if kind is not None and kind not in _KIND_FAMILY and kind not in ("mma", "copy"):
        raise ValueError(f"unknown atom kind {kind!r}; known: mma, copy, {', '.join(_KIND_FAMILY)}")
    target = check_arch_name(arch) if arch is not None else None
    from .sm100 import SM100_UMMA

    names = []
    for name in _tables():
        if target is None and kind is None:
            names.append(name)
            continue
        if name in SM100_UMMA and (target not in (None, "sm_100a") or kind not in (None, "mma", "tcgen05")):
            continue  # tcgen05 atoms run on sm_100a alone: not built for other queries
        atom = get_atom(name)
        if target is not None and target not in atom.archs:
            continue
        if kind is not None and kind not in (atom.kind, _KIND_FAMILY[atom.kind]):
            continue
        names.append(name)
    return sorted(names)
