"""Every PTX opcode in every shipped build, and whether the PTX executor handles it.

Builds: ``bench_static``'s serving cases (every kernel the serving ops launch for its
problems: GEMM, MoE bf16 / W4A16 / W8A16 / FP8 incl. split-K and large-token, paged and
varlen attention, ``reshape_and_cache``, on sm_80 / sm_89 / sm_90a / sm_100a) and its GEMM and
attention cases (incl. the persistent and 2-CTA cluster sm_90a GEMMs and the sm_100a GEMMs with
tcgen05, one CTA or a CTA pair per MMA). Each build's printed
source is compiled by NVRTC with ``-lineinfo`` (``hexlayout.runtime.emulate_ptx.ptx_of``,
cached like every compile) and its entry parsed; an opcode is the full dotted form.

Writes ``results/ptx_opcodes.json`` (``tests/ptx/test_opcode_coverage.py`` reads it) and
``results/ptx_opcodes.md``: opcode, architectures, families, builds, handled, and with
``--executed FILE`` whether the PTX-mode tests executed it (``FILE`` from
``HEXLAYOUT_PTX_EXECUTED=FILE python -m pytest -p no:xdist tests/ptx``).

    python benchmarks/ptx_opcodes.py                 # every architecture and family
    python benchmarks/ptx_opcodes.py --arch sm_90a   # one architecture (prints, writes nothing)
    python benchmarks/ptx_opcodes.py --arch sm_100a --merge  # one architecture, replacing its rows
    python benchmarks/ptx_opcodes.py --table results/ptx_opcodes.json --executed NEW.json --add-executed
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent))

import bench_static as bs  # noqa: E402


def _builds(archs: list[str]) -> list[tuple[str, str, str, Any]]:
    """``(arch, family, kernel name, build)`` of every shipped build for ``archs``."""
    from hexlayout.runtime import build

    out = []
    for case in bs.serving_cases(archs=archs):
        out.append(
            (
                case.arch,
                case.family,
                case.name,
                lambda c=case: build(c.kernel, c.arch, compile=False, **dict(c.consts)),
            )
        )
    for case in bs.cases():
        if case.arch in archs:
            out.append((case.arch, case.kernel, case.label, lambda c=case: bs.hexlayout_build(c)))
    return out


def collect(archs: list[str]) -> dict[str, Any]:
    from hexlayout.ptx import handled, parse_ptx
    from hexlayout.runtime.emulate_ptx import ptx_of

    ops: dict[str, dict[str, set[str]]] = defaultdict(
        lambda: {"archs": set(), "families": set(), "builds": set()}
    )
    n = 0
    per: dict[str, int] = defaultdict(int)
    t0 = time.perf_counter()
    for arch, family, name, make in _builds(archs):
        ptx = ptx_of(make()).ptx
        n += 1
        per[arch] += 1
        for ins in parse_ptx(ptx).entry().body:
            e = ops[ins.opcode]
            e["archs"].add(arch)
            e["families"].add(family)
            e["builds"].add(f"{arch}:{name}")
        print(f"{n:4d} {arch} {family} {name}", flush=True)
    return {
        "date": datetime.date.today().isoformat(),
        "machine": platform.platform(),
        "seconds": round(time.perf_counter() - t0, 1),
        "archs": sorted(archs),
        "builds": n,
        "builds_per_arch": dict(sorted(per.items())),
        "opcodes": {
            o: {
                "archs": sorted(e["archs"]),
                "families": sorted(e["families"]),
                "builds": len(e["builds"]),
                "handled": handled(o),
            }
            for o, e in sorted(ops.items())
        },
    }


def add_executed(table: dict[str, Any], executed: dict[str, int], add: bool = False) -> None:
    """Mark each opcode with the thread-instructions the PTX-mode tests executed of it (``add``:
    added to the table's counts, for tests run since the table's were counted)."""
    table["tested_by"] = "tests/ptx (HEXLAYOUT_PTX_EXECUTED)"
    for o, e in table["opcodes"].items():
        e["executed"] = int(executed.get(o, 0)) + (int(e.get("executed", 0)) if add else 0)


def merge(table: dict[str, Any], part: dict[str, Any]) -> dict[str, Any]:
    """``table`` with ``part``'s architectures replaced by ``part``'s rows (builds and opcodes)."""
    archs = set(part["archs"])
    out = dict(table)
    ops: dict[str, Any] = {}
    for o, e in table["opcodes"].items():
        keep = [a for a in e["archs"] if a not in archs]
        if keep:
            ops[o] = dict(e, archs=keep)
    for o, e in part["opcodes"].items():
        if o in ops:
            old = ops[o]
            ops[o] = dict(old, archs=sorted(set(old["archs"]) | set(e["archs"])),
                          families=sorted(set(old["families"]) | set(e["families"])),
                          builds=old["builds"] + e["builds"], handled=e["handled"])
        else:
            ops[o] = dict(e)
    per = dict(table.get("builds_per_arch", {}))
    if archs & set(table["archs"]) and not per:
        raise SystemExit("--merge: the table does not count its builds per architecture; rebuild it whole")
    for a in archs:
        per.pop(a, None)
    builds = table["builds"] - sum(n for a, n in table.get("builds_per_arch", {}).items() if a in archs)
    per.update(part["builds_per_arch"])
    out.update(date=part["date"], machine=part["machine"], archs=sorted(set(table["archs"]) | archs),
               builds=builds + part["builds"], builds_per_arch=dict(sorted(per.items())),
               opcodes=dict(sorted(ops.items())))
    return out


def markdown(table: dict[str, Any]) -> str:
    rows = [
        f"# PTX opcodes of the shipped builds ({table['date']})",
        "",
        f"{table['builds']} builds for {', '.join(table['archs'])}; machine: {table['machine']}.",
        "Written by `python benchmarks/ptx_opcodes.py`; `tests/ptx/test_opcode_coverage.py` fails on an "
        "opcode that is not handled.",
        "",
        "| opcode | architectures | families | builds | handled | thread-instrs run in tests/ptx |",
        "| --- | --- | --- | ---: | --- | ---: |",
    ]
    for o, e in table["opcodes"].items():
        rows.append(
            f"| `{o}` | {', '.join(e['archs'])} | {', '.join(e['families'])} | {e['builds']} | "
            f"{'yes' if e['handled'] else '**no**'} | {e.get('executed', '-')} |"
        )
    return "\n".join(rows) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--arch", action="append", help="only this architecture (repeatable); writes nothing")
    ap.add_argument("--executed", help="opcodes the PTX-mode tests executed (HEXLAYOUT_PTX_EXECUTED JSON)")
    ap.add_argument("--add-executed", action="store_true",
                    help="add --executed's counts to the table's (tests run since the table's were counted)")
    ap.add_argument("--merge", action="store_true",
                    help="with --arch: replace those architectures' rows of results/ptx_opcodes.json")
    ap.add_argument("--table", help="re-render this ptx_opcodes.json instead of compiling the builds again")
    args = ap.parse_args()
    archs = args.arch or ["sm_80", "sm_89", "sm_90a", "sm_100a"]
    table = json.loads(Path(args.table).read_text()) if args.table else collect(archs)
    if args.merge:
        table = merge(json.loads((HERE / "results" / "ptx_opcodes.json").read_text()), table)
    if args.executed:
        add_executed(table, json.loads(Path(args.executed).read_text()), args.add_executed)
    missing = [o for o, e in table["opcodes"].items() if not e["handled"]]
    print(f"{table['builds']} builds, {len(table['opcodes'])} opcodes, not handled: {missing or 'none'}")
    if args.arch and not args.merge:
        return
    (HERE / "results" / "ptx_opcodes.json").write_text(json.dumps(table, indent=1) + "\n")
    (HERE / "results" / "ptx_opcodes.md").write_text(markdown(table))


if __name__ == "__main__":
    main()
