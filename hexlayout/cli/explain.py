"""``hexlayout explain``: what synthesis chose for a kernel, and why.

    hexlayout explain gemm --arch sm_80             # the sm_80 multistage GEMM
    hexlayout explain gemm --arch sm_90a --json     # warp-specialized TMA + wgmma GEMM, as JSON
    hexlayout explain gemm --arch sm_100a --draw pics/   # the same with tcgen05: TMEM drawn
    hexlayout explain attention -D CAUSAL=true --draw pics/
    hexlayout explain my_kernels.py:gemm -D BM=64 --arch sm_89

Prints every tile tensor with its synthesized layout in CuTe notation (register tiles: the
thread-value layout (t, v) -> m + M*n; shared tiles: the layout with its swizzle; views of a
shared buffer: the buffer's layout at the view's offset), every operation's instruction
(copies: cp.async / ldmatrix / TMA / ld.global ...; mma: the TiledMma with its atom and warp
arrangement), the shared-memory buffers and swizzles, the predicted cost, the alternatives
synthesis rejected or ranked lower with their reasons, the requirements the arguments must
meet, the synthesis time and the source lines; on sm_100a the tensor memory of each tcgen05
accumulator (its TMEM layout, the ``tcgen05.ld`` chosen, the register layout it gives).
``--json`` prints the same as one JSON document (keys documented in docs/explain-json.md);
``--draw DIR`` writes PNG pictures of the register TV layouts, the shared tiles (coloured by
bank) and the tensor memory of tcgen05 accumulators (each cell labelled with the thread and
register it is loaded into).

A program without a consistent layout assignment prints the diagnostic (naming the
operations and source lines in conflict) and exits with status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import re
from pathlib import Path
from typing import Any

from . import CLIError
from .kernels import ARCHS, arch_arg, known_names, parse_defines, resolve, synthesize_kernel

__all__ = ["register", "run", "explain_report", "format_report", "draw_report", "JSON_VERSION"]

JSON_VERSION = 1


def register(sub: Any) -> argparse.ArgumentParser:
    """Add the ``explain`` subcommand to ``sub``."""
    p = sub.add_parser("explain",
                       help="show the layouts, instructions and costs synthesis chose for a kernel",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kernel", metavar="KERNEL",
                   help=f"a registered kernel ({', '.join(known_names())}), module:attr or file.py:attr")
    p.add_argument("--arch", type=arch_arg, default="sm_80", metavar="ARCH",
                   help=f"target architecture: {', '.join(ARCHS)} (default sm_80)")
    p.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                   help="a compile-time constant, e.g. -D BM=64 -D CAUSAL=true (repeatable)")
    p.add_argument("--json", action="store_true", help="print one JSON document (see docs/explain-json.md)")
    p.add_argument("--draw", metavar="DIR", help="write PNG pictures of the synthesized layouts into DIR")
    p.add_argument("--stats", action="store_true", help="also compile the kernel and report the cubin's "
                   "static quality (registers, spills, main loop, non-MMA per k-tile; key 'stats')")
    p.set_defaults(func=run)
    return p


# --- the report (one dict; the text output is printed from it) -------------------------------

def _jsonable(v: Any) -> Any:
    if isinstance(v, (bool, int, float, str)) or v is None:
        return v
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    return str(v)


def _file(loc: Any) -> str | None:
    return loc.filename if loc is not None else None


def _line(loc: Any) -> int | None:
    return loc.line if loc is not None else None


def _code(loc: Any) -> str | None:
    return (loc.text or None) if loc is not None else None


def _cute_shape(shape: Any) -> str:
    from hexlayout.layout.inttuple import fmt

    return fmt(tuple(shape))


def swizzle_bytes(sw: Any, elem_bits: int) -> int:
    """Width in bytes of the rows a ``Swizzle<B,M,S>`` acting on ``elem_bits``-bit elements
    permutes: ``2^(B+M)`` elements, e.g. 128 for ``Sw<3,3,3>`` on 16-bit elements (Hopper's
    128-byte mode, ``Swizzle<3,4,3>`` in bytes)."""
    return (1 << (sw.bits + sw.base)) * elem_bits // 8


def _swizzle_text(sw: Any, elem_bits: int) -> str:
    nbytes = swizzle_bytes(sw, elem_bits)
    unit = (1 << sw.base) * elem_bits // 8
    return (f"{sw} on {elem_bits}-bit elements: {nbytes}-byte swizzle (XORs {unit}-byte chunk bits with "
            f"row bits; Swizzle<{sw.bits},{sw.base + elem_bits.bit_length() - 4},{sw.shift}> in bytes)")


def _view_layout(view: Any) -> str:
    """``Sw<..> o base o layout`` of a shared-tile view (``base`` an expression in parentheses)."""
    base = _offset_text(view.base)
    if view.swizzle is None:
        return str(view.layout) if base == "0" else f"{base} + {view.layout}"
    return f"{view.swizzle} o {base} o {view.layout}"


def _offset_text(base: Any) -> str:
    """A view's element offset: a number, or an expression in parentheses."""
    from hexlayout.ir.expr import const_value, is_const

    if is_const(base):
        return str(const_value(base))
    return f"({base})"


def _tensors(s: Any, views: dict[int, Any]) -> list[dict[str, Any]]:
    from hexlayout.ir.types import Scope

    out = []
    for v, lay in s.layouts():
        entry: dict[str, Any] = {
            "name": v.name, "scope": str(v.type.scope), "dtype": str(v.type.dtype),
            "shape": list(v.type.shape), "layout": None, "kind": None, "view_of": None, "offset": None,
            "file": _file(v.loc), "line": _line(v.loc), "code": _code(v.loc),
        }
        if v.type.scope == Scope.REGISTER:
            entry["kind"] = "tv"
            entry["layout"] = str(lay) if lay is not None and not _is_var(lay) else None
        elif v.root is v:
            entry["kind"] = "shared"
            entry["layout"] = str(lay)
        else:
            entry["kind"] = "view"
            entry["view_of"] = v.root.name
            view = views.get(v.id)
            if view is not None:
                entry["layout"] = _view_layout(view)
                entry["offset"] = _offset_text(view.base).strip("()")
        out.append(entry)
    return out


def _is_var(lay: Any) -> bool:
    from hexlayout.ir.types import LayoutVar

    return isinstance(lay, LayoutVar)


def _alts(alts: list[Any]) -> list[dict[str, Any]]:
    return [{"what": a.what, "status": a.status, "reason": a.reason or "", "cost": a.cost} for a in alts]


def _operands(op: Any) -> list[str]:
    names = []
    for fld in ("src", "dst", "a", "b", "c"):
        v = getattr(op, fld, None)
        if v is not None and hasattr(v, "type"):
            names.append(f"{fld}=%{v.name}:{v.type.scope}")
    return names


def _ops(s: Any) -> list[dict[str, Any]]:
    by_op: dict[int, Any] = {}
    for d in s.decisions:
        if d.op is not None:
            by_op.setdefault(id(d.op), d)
    out = []
    for op, instr in s.lowered.choices:
        d = by_op.get(id(op))
        out.append({
            "op": type(op).__name__.lower(),
            "file": _file(op.loc), "line": _line(op.loc), "code": _code(op.loc),
            "operands": _operands(op), "instruction": str(instr),
            "alternatives": _alts(d.alternatives) if d is not None else [],
        })
    return out


def _shared(s: Any, views: dict[int, Any]) -> list[dict[str, Any]]:
    from hexlayout.ir.tile import Alloc
    from hexlayout.ir.types import Scope

    decisions = {d.value.id: d for d in s.decisions if d.value is not None}
    out = []
    for op in s.kernel.body.walk():
        if not (isinstance(op, Alloc) and op.result.type.scope == Scope.SHARED):
            continue
        v = op.result
        view = views.get(v.id)
        bits = v.type.dtype.bits
        sw = getattr(view, "swizzle", None)
        d = decisions.get(v.id)
        note = ""
        if d is not None:
            rest = d.chosen.removeprefix(str(v.type.layout)).strip()
            note = rest[1:-1] if rest.startswith("(") and rest.endswith(")") else rest
        elif view is not None:
            note = "given explicitly"
        out.append({
            "name": v.name, "dtype": str(v.type.dtype), "shape": list(v.type.shape),
            "layout": str(v.type.layout),
            "swizzle": str(sw) if sw is not None else None,
            "swizzle_bytes": swizzle_bytes(sw, bits) if sw is not None else None,
            "swizzle_description": _swizzle_text(sw, bits) if sw is not None else None,
            "offset_bytes": view.buffer.offset if view is not None else None,
            "bytes": view.buffer.nbytes if view is not None else None,
            "note": note, "file": _file(v.loc), "line": _line(v.loc),
            "alternatives": _alts(d.alternatives) if d is not None else [],
        })
    return out


def _tmem(s: Any, regions: dict[int, Any]) -> list[dict[str, Any]]:
    """The tensor memory of the tcgen05 mmas (sm_100a): per accumulator its TMEM layout
    ``(row, col) -> lane << 16 | column``, the ``tcgen05.ld`` synthesis chose and the register
    TV layout the epilogue works in; ``readers``: the threads of another warp role that read it
    (``ir.accumulator_handoff``), ``fits``: how many accumulators of its columns fit in TMEM
    (the stages a rotation can take, ``arch.tmem.accumulator_stages``); ``a_in_tmem``: the mmas
    into it whose register A is written to TMEM, each with its columns per set and its sets ``R``
    (one per execution in flight at its store plus one, ``ir.mma_in_flight``); ``allocated``: the
    kernel's TMEM allocation in columns."""
    from hexlayout.ir.accumulator_handoff import handoff_regions
    from hexlayout.ir.lowered_tcgen05 import TmemAlloc

    handoff = handoff_regions(s.kernel, regions)
    from hexlayout.arch.tmem import TMEM_COLUMNS, accumulator_layout
    from hexlayout.ir.lowered import walk_instrs
    from hexlayout.ir.tile import Mma
    from hexlayout.ir.tiled_umma import TiledUmma

    allocs = [i.ncols for i in walk_instrs(s.lowered.kernel.body) if isinstance(i, TmemAlloc)]
    allocated = max(allocs, default=0)
    a_in: dict[int, list[dict[str, Any]]] = {}
    for op in s.kernel.body.walk():
        tu = s.assignment.mma.get(op.uid) if isinstance(op, Mma) else None
        if isinstance(tu, TiledUmma) and tu.a_store is not None:
            a_in.setdefault(op.c.root.id, []).append({"columns": tu.a_columns, "sets": tu.a_sets,
                                                      "file": _file(op.loc), "line": _line(op.loc)})
    out = []
    tiles: list[int] = []
    for op in s.kernel.body.walk():
        tu = s.assignment.mma.get(op.uid) if isinstance(op, Mma) else None
        if not isinstance(tu, TiledUmma) or op.c.root.id in tiles:
            continue
        tiles.append(op.c.root.id)
        m, n, _ = tu.tile_mnk
        readers = handoff.get(op.uid)
        out.append({"fits": TMEM_COLUMNS // tu.columns, "readers": list(readers) if readers else None,
            "accumulator": op.c.root.name, "atom": tu.atom.name, "atoms_n": tu.n_atoms, "k_steps": tu.k_tiles,
            "shape": [m, n], "lanes": 128, "columns": tu.columns, "cta_group": tu.cta_group,
            "tmem_layout": str(accumulator_layout(m * tu.cta_group, n, tu.cta_group)),
            "load": f"tcgen05.ld.{tu.ld_shape}.x{tu.ld_num}", "loads_per_warp": len(tu.loads),
            "registers_per_load": tu.regs_per_load, "threads": tu.threads, "column_block": tu.chunk,
            "register_tv": str(tu.register_tv), "file": _file(op.loc), "line": _line(op.loc),
            "a_in_tmem": a_in.get(op.c.root.id, []), "allocated": allocated,
        })
    return out


def _requirements(s: Any) -> list[dict[str, Any]]:
    return [{"param": r.param, "kind": r.kind, "value": _jsonable(r.value), "mode": r.mode,
             "reason": r.reason} for r in s.lowered.requirements]


def explain_report(result: Any, spec: str, arch: str) -> dict[str, Any]:
    """The JSON-able report of a :class:`~hexlayout.cli.kernels.SynthesisResult`."""
    from hexlayout.ir.lower.legality import Legality

    s = result.synthesis
    tk = s.kernel
    leg = Legality(tk, arch, s.assignment)
    views = leg.views()      # the views of exactly what synthesis chose
    cost = s.cost.as_dict() if result.cost_computed else dict.fromkeys(s.cost.as_dict())
    return {
        "version": JSON_VERSION,
        "kernel": tk.name,
        "spec": spec,
        "arch": arch,
        "source": tk.loc.file if tk.loc is not None else None,
        "constants": _jsonable(result.constants),
        "threads": tk.launch.threads,
        "grid": [str(g) for g in tk.launch.grid],
        "smem_bytes": s.lowered.kernel.smem_bytes,
        "seconds": s.seconds,
        "trace_seconds": result.trace_seconds,
        "tensors": _tensors(s, views),
        "ops": _ops(s),
        "shared": _shared(s, views),
        "decisions": [{"subject": d.subject, "chosen": d.chosen, "file": _file(d.op.loc if d.op else None),
                       "line": _line(d.op.loc if d.op else None), "alternatives": _alts(d.alternatives)}
                      for d in s.decisions if len(d.alternatives) > 1],
        "cost": cost,
        "requirements": _requirements(s),
        "tmem": _tmem(s, leg.regions),
        "offline": [lay.describe() for lay in getattr(s.lowered, "offline", {}).values()],
        "notes": list(result.notes),
        "pictures": [],
    }


# --- text ------------------------------------------------------------------------------------

def _where(e: dict[str, Any]) -> str:
    return f"{e['file']}:{e['line']}" if e.get("line") is not None else "-"


def _fmt_cost(c: Any) -> str:
    return "-" if c is None else (f"{c:.0f}" if float(c).is_integer() else f"{c:.1f}")


def format_report(r: dict[str, Any], *, max_alternatives: int = 6) -> str:
    """The human-readable form of :func:`explain_report`'s dict."""
    consts = " ".join(f"{k}={v}" for k, v in r["constants"].items()) or "none"
    lines = [
        f"kernel {r['kernel']} ({r['spec']}) for {r['arch']}: {r['threads']} threads, "
        f"grid ({', '.join(r['grid'])}), {r['smem_bytes']} bytes of shared memory",
        f"  source     {r['source']}",
        f"  constants  {consts}",
        f"  synthesis  {r['seconds']:.3f} s (trace {r['trace_seconds']:.3f} s)",
    ]
    lines += [f"  note       {n}" for n in r["notes"]]

    lines.append("\ntensors (register: TV layout (thread, value) -> m + M*n; shared: layout in elements)")
    width = max((len(t["name"]) for t in r["tensors"]), default=4) + 1
    for t in r["tensors"]:
        head = f"  %{t['name']:<{width}} {t['scope']:<8} {t['dtype']:<4} {_cute_shape(t['shape']):<12}"
        if t["kind"] == "view":
            lay = f"view of %{t['view_of']}: {t['layout']}"
        elif t["kind"] == "tv":
            lay = f"TV {t['layout']}"
        else:
            lay = str(t["layout"])
        lines.append(f"{head} {lay}  [{_where(t)}]")

    lines.append("\noperations and instructions")
    for o in r["ops"]:
        lines.append(f"  {_where(o):<22} {o['op']:<5} {o['instruction']}")
        if o["code"]:
            lines.append(f"  {'':<22}       `{o['code']}`  ({', '.join(o['operands'])})")

    lines.append("\nshared memory")
    for sh in r["shared"]:
        off = sh["offset_bytes"]
        where = f"bytes [{off}, {off + sh['bytes']})" if off is not None else ""
        lines.append(f"  %{sh['name']} {sh['dtype']} {_cute_shape(sh['shape'])}: {sh['layout']}  {where}  "
                     f"[{_where(sh)}]")
        if sh["swizzle"]:
            lines.append(f"      swizzle {sh['swizzle_description']}")
        else:
            lines.append("      no swizzle")
        if sh["note"]:
            lines.append(f"      chosen as: {sh['note']}")

    c = r["cost"]
    lines.append("\npredicted cost (static model: issue slots + shared wavefronts + global sectors, "
                 "weighted 8^loop depth)")
    if c.get("total") is None:
        lines.append("  not computed")
    else:
        lines.append(f"  total {_fmt_cost(c['total'])} = issue {_fmt_cost(c['issue'])} + smem wavefronts "
                     f"{_fmt_cost(c['smem_wavefronts'])} + gmem sectors {_fmt_cost(c['gmem_sectors'])}; "
                     f"bank conflicts {_fmt_cost(c['bank_conflicts'])}")

    lines.append("\ndecisions and alternatives")
    if not r["decisions"]:
        lines.append("  none (a single candidate everywhere)")
    for d in r["decisions"]:
        lines.append(f"  {d['subject']}: chose {d['chosen']}")
        shown = [a for a in d["alternatives"] if a["status"] != "chosen"]
        for a in shown[:max_alternatives]:
            extra = f" cost {_fmt_cost(a['cost'])}" if a["cost"] is not None else ""
            why = f": {a['reason']}" if a["reason"] else ""
            lines.append(f"    {a['status']:<9} {a['what']}{extra}{why}")
        if len(shown) > max_alternatives:
            lines.append(f"    ... {len(shown) - max_alternatives} more (see --json)")

    lines += _offline_lines(r.get("offline", []))
    lines += _tmem_lines(r.get("tmem", []))
    lines.append("\nrequirements on the arguments")
    for q in r["requirements"]:
        mode = f" (mode {q['mode']})" if q["mode"] is not None and q["mode"] >= 0 else ""
        lines.append(f"  {q['param']}: {q['kind']} {q['value']}{mode}: {q['reason']}")
    if not r["requirements"]:
        lines.append("  none")
    if r["pictures"]:
        lines.append(f"\n{len(r['pictures'])} pictures:")
        lines += [f"  {p['path']}  ({p['what']})" for p in r["pictures"]]
    return "\n".join(lines)


def _offline_lines(offline: list[dict[str, Any]]) -> list[str]:
    """The text of the synthesized offline layouts (``hl.offline`` arguments)."""
    if not offline:
        return []
    lines = ["\noffline layouts (hl.offline arguments: storage order chosen with the register fragment)"]
    for o in offline:
        unit = "bytes (two 4-bit values each)" if o["bits"] == 4 else f"{o['bits']}-bit elements"
        tile = f"{o['tile'][0]}x{o['tile'][1]}"
        lines.append(f"  {o['param']}: u{o['bits']} tiles {tile} (row tiles outer, k tiles "
                     f"inner), {o['threads']} threads x {o['values_per_thread']} {unit}: {o['thread_bytes']} "
                     f"contiguous bytes per thread, {o['vector_bytes']}-byte loads")
        lines.append(f"      register TV layout {o['tv']}; in-tile order (unit r + TR*k -> t*V + v) "
                     f"{o['in_tile']}")
        lines.append(f"      key {o['key']}")
    return lines


def _tmem_lines(tmem: list[dict[str, Any]]) -> list[str]:
    """The text of the tensor-memory accumulators (tcgen05, sm_100a)."""
    if not tmem:
        return []
    lines = ["\ntensor memory (tcgen05 accumulators: TMEM layout (row, col) -> lane << 16 | column; "
             f"{tmem[0].get('allocated', 0)} columns allocated)"]
    for t in tmem:
        m, n = t["shape"]
        who = ("one thread of the pair's even CTA (cta_group::2: the pair's M = "
               f"{2 * m}, each CTA's {m} rows in its own TMEM, half of B in each CTA)"
               if t.get("cta_group", 1) == 2 else "one thread")
        lines.append(f"  %{t['accumulator']} f32 {m}x{n}: {t['atom']} x{t['atoms_n']} along N, "
                     f"{t['k_steps']} k-steps per mma, issued by {who}  [{_where(t)}]")
        lines.append(f"      TMEM {t['tmem_layout']}: {t['lanes']} lanes x {t['columns']} columns (allocated "
                     "by the kernel, a power of two >= 32)")
        split = (f", warp groups take blocks of {t['column_block']} columns in turn"
                 if t["column_block"] * (t["threads"] // 128) != n else "")
        lines.append(f"      read by {t['threads']} threads with {t['load']} ({t['loads_per_warp']} per "
                     f"warp, {t['registers_per_load']} registers each{split}); warp w reads lanes "
                     "32*(w%4)..+31")
        lines.append(f"      register TV layout of the epilogue {t['register_tv']}")
        for a in t.get("a_in_tmem", []):
            sets = (f"{a['sets']} sets of {a['columns']} columns (one per execution of the mma in flight at "
                    f"its tcgen05.st, plus one; execution e writes set e % {a['sets']})" if a["sets"] > 1
                    else f"{a['columns']} columns (no earlier execution in flight at its tcgen05.st)")
            lines.append(f"      register A of the mma at line {a['line']} written to TMEM: {sets}")
        if t.get("readers"):
            lo, hi = t["readers"]
            lines.append(f"      handed off: issued by another warp role, read by threads [{lo}, {hi}) after "
                         "the author's barrier wait")
    handed = [t for t in tmem if t.get("readers")]
    if handed:
        used = sum(t["columns"] for t in tmem)
        lines.append(f"  {len(handed)} accumulator stage(s) handed to readers, {used} of 512 columns in use; "
                     f"{handed[0]['fits']} accumulators of {handed[0]['columns']} columns fit")
    return lines


# --- pictures --------------------------------------------------------------------------------

def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)


def draw_report(result: Any, out_dir: str | os.PathLike[str]) -> list[dict[str, str]]:
    """PNG pictures of the synthesized layouts: one per distinct register TV layout (over its
    M x N tile), one per offline argument (its tile, the thread owning each unit) and one per
    shared buffer (its first stage, cells coloured by bank)."""
    from hexlayout import draw as hd
    from hexlayout.ir.lower.legality import Legality
    from hexlayout.ir.types import Scope
    from hexlayout.layout import Layout

    s = result.synthesis
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    views = Legality(s.kernel, s.arch, s.assignment).views()
    pictures: list[dict[str, str]] = []
    groups: dict[tuple[str, tuple[int, ...]], list[Any]] = {}
    for v, lay in s.layouts():
        if v.type.scope == Scope.REGISTER and isinstance(lay, Layout) and len(v.type.shape) <= 2:
            groups.setdefault((str(lay), tuple(v.type.shape)), []).append(v)
    for (lay_s, shape), vs in groups.items():
        lay = vs[0].type.layout
        names = ", ".join(f"%{v.name}" for v in vs[:6]) + (" ..." if len(vs) > 6 else "")
        tile = shape if len(shape) == 2 else (1, shape[0])
        title = f"{names}: {vs[0].type.dtype} {_cute_shape(shape)} register TV layout {lay_s}"
        path = out / f"reg_{_safe(vs[0].name)}.png"
        hd.render(hd.tv_grid(lay, tile, title), path)
        pictures.append({"path": str(path),
                         "what": f"register TV layout of {names} over {tile[0]}x{tile[1]}"})
    for lay in getattr(s.lowered, "offline", {}).values():
        tr, tu = lay.unit_tile
        unit = "bytes" if lay.bits == 4 else "elements"
        title = (f"offline {lay.param}: u{lay.bits} tile {lay.tile[0]}x{lay.tile[1]} ({tr}x{tu} {unit}), "
                 f"the thread owning each (stored thread-major: T*{lay.values} + V)")
        path = out / f"offline_{_safe(lay.param)}.png"
        hd.render(hd.tv_grid(lay.tv, (tr, tu), title, "row", "k"), path)
        pictures.append({"path": str(path), "what": f"offline layout of {lay.param}: {tr}x{tu} {unit} "
                         "tile, the owning thread of each"})
    pictures += _draw_tmem(s, out)
    for v, _ in s.layouts():
        if v.type.scope != Scope.SHARED or v.root is not v or v.id not in views:
            continue
        view = views[v.id]
        if len(view.shape) > 2:
            view = view.slice((None, None) + (0,) * (len(view.shape) - 2))
            what = "stage 0"
        else:
            what = ""
        lay = view.full_layout
        bits = v.type.dtype.bits
        title = f"shared %{v.name}, {what or 'the whole tile'}: {lay}, {bits}-bit elements, colour = bank"
        path = out / f"smem_{_safe(v.name)}.png"
        hd.render(hd.smem_grid(lay, bits, "bank", None, title), path)
        pictures.append({"path": str(path),
                         "what": f"shared %{v.name} {what or 'tile'} {lay}, coloured by bank"})
    return pictures


def _draw_tmem(s: Any, out: Path) -> list[dict[str, str]]:
    """One picture per tcgen05 accumulator: its TMEM lanes x columns, each cell labelled with
    the thread and register ``tcgen05.ld`` brings it to."""
    from hexlayout import draw as hd
    from hexlayout.arch.tmem import accumulator_layout
    from hexlayout.ir.tile import Mma
    from hexlayout.ir.tiled_umma import TiledUmma

    pictures: list[dict[str, str]] = []
    done: set[int] = set()
    for op in s.kernel.body.walk():
        tu = s.assignment.mma.get(op.uid) if isinstance(op, Mma) else None
        if not isinstance(tu, TiledUmma) or op.c.root.id in done:
            continue
        done.add(op.c.root.id)
        m, n, _ = tu.tile_mnk
        name = op.c.root.name
        title = (f"TMEM of %{name} ({m}x{n} f32, {tu.atom.name}): 128 lanes x {tu.columns} columns, "
                 f"loaded by tcgen05.ld.{tu.ld_shape}.x{tu.ld_num} into (thread, register)")
        path = out / f"tmem_{_safe(name)}.png"
        acc = accumulator_layout(m * tu.cta_group, n, tu.cta_group)
        hd.render(hd.tmem_grid(acc, tu.register_tv, (m, n), tu.columns, title), path)
        pictures.append({"path": str(path), "what": f"tensor memory of %{name}: lanes x columns, the "
                         "thread and register each cell is loaded into"})
    return pictures


def _static_stats(result: Any) -> Any:
    """The ``KernelStats`` of the synthesized kernel's cubin (compiled through the cache)."""
    from hexlayout.codegen import generate
    from hexlayout.runtime import CompileError, ToolchainError, compile_generated
    from hexlayout.runtime.stats import StatsError, kernel_stats, mma_per_source_iteration

    lowered = result.synthesis.lowered.kernel
    gen = generate(lowered)
    try:
        c = compile_generated(gen)
        return kernel_stats(c.cubin, sass=c.sass(), log=c.log, name=c.name, resources=c.resources,
                            mma_per_ktile=mma_per_source_iteration(lowered),
                            shared_dynamic=gen.smem_bytes)
    except (CompileError, ToolchainError, StatsError) as e:
        raise CLIError(str(e)) from None


def run(args: argparse.Namespace) -> int:
    """Resolve, synthesize and explain ``args.kernel``; print text or JSON."""
    rk = resolve(args.kernel, args.arch, parse_defines(args.defines))
    result = synthesize_kernel(rk)
    report = explain_report(result, args.kernel, args.arch)
    if args.draw:
        report["pictures"] = draw_report(result, args.draw)
    stats = _static_stats(result) if args.stats else None
    report["stats"] = stats.to_dict() if stats is not None else None
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print(format_report(report))
        if stats is not None:
            print(stats.summary())
    return 0
