"""Regenerate ``cute_cpp_golden.json``: layout-algebra results computed by CuTe C++.

Needs nvcc and a CUTLASS checkout (``--cutlass DIR`` with ``include/cute``). Each case is
compiled with static integers (``Int<n>``) into its own function; cases that CuTe
rejects at compile time (its static asserts) are dropped and recorded as rejected.
Usage: ``python gen_golden.py --cutlass /path/to/cutlass``. Not run by the tests.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE.parent.parent.parent))

from _dsl_cases import enc, make_cases  # noqa: E402

from hexlayout.layout import Layout, Swizzle  # noqa: E402


def cx(t: object) -> str:
    if isinstance(t, tuple):
        return "make_tuple(" + ",".join(cx(e) for e in t) + ")" if t else "make_tuple()"
    return f"Int<{t}>{{}}"


def cl(x: object) -> str:
    if isinstance(x, Layout):
        return f"make_layout({cx(x.shape)},{cx(x.stride)})"
    if isinstance(x, Swizzle):
        return f"Swizzle<{x.bits},{x.base},{x.shift}>{{}}"
    if x is None:
        return "_{}"
    if isinstance(x, tuple):
        return "make_tile(" + ",".join(cl(e) for e in x) + ")"
    return f"Int<{x}>{{}}"


def expr(case: tuple) -> str:
    op, *a = case
    if op == "complement":
        return f"complement({cl(a[0])})" if len(a) == 1 else f"complement({cl(a[0])},{cx(a[1])})"
    if op == "recast_layout":
        lay, old, new = a
        return f"recast_layout<uint_bit_t<{old}>,uint_bit_t<{new}>>({cl(lay)})"
    if op == "make_layout_tv":
        thr, val = a
        return (f"composition(right_inverse(raked_product({cl(thr)},{cl(val)})),"
                f"make_layout(make_shape(size({cl(thr)}),size({cl(val)}))))")
    if op == "slice":
        return f"{cl(a[0])}({','.join(cl(c) for c in a[1])})"
    return f"{op}(" + ",".join(cl(x) for x in a) + ")"


def doc_cases() -> list[tuple]:
    L = Layout
    return [
        ("coalesce", L((2, (1, 6)), (1, (6, 2)))),
        ("composition", L((6, 2), (8, 2)), L((4, 3), (3, 1))),
        ("composition", L(20, 2), L((5, 4), (4, 1))),
        ("composition", L((10, 2), (16, 4)), L((5, 4), (1, 5))),
        ("composition", L((12, (4, 8)), (59, (13, 1))), (L(3, 4), L(8, 2))),
        ("complement", L(4, 1), 24),
        ("complement", L(6, 4), 24),
        ("complement", L((4, 6), (1, 4)), 24),
        ("complement", L(4, 2), 24),
        ("complement", L((2, 4), (1, 6)), 24),
        ("complement", L((2, 2), (1, 6)), 24),
        ("logical_divide", L((4, 2, 3), (2, 1, 8)), L(4, 2)),
        ("logical_divide", L((9, (4, 8)), (59, (13, 1))), (L(3, 3), L((2, 4), (1, 8)))),
        ("zipped_divide", L((9, (4, 8)), (59, (13, 1))), (L(3, 3), L((2, 4), (1, 8)))),
        ("tiled_divide", L((9, (4, 8)), (59, (13, 1))), (L(3, 3), L((2, 4), (1, 8)))),
        ("flat_divide", L((9, (4, 8)), (59, (13, 1))), (L(3, 3), L((2, 4), (1, 8)))),
        ("logical_product", L((2, 2), (4, 1)), L(6, 1)),
        ("logical_product", L((2, 2), (4, 1)), L((4, 2), (2, 1))),
        ("blocked_product", L((2, 5), (5, 1)), L((3, 4), (1, 3))),
        ("raked_product", L((2, 5), (5, 1)), L((3, 4), (1, 3))),
        ("logical_product", L((2, 5), (5, 1)), (L(3, 5), L(4, 6))),
        ("zipped_product", L((2, 5), (5, 1)), (L(3, 5), L(4, 6))),
        ("tiled_product", L((2, 5), (5, 1)), (L(3, 5), L(4, 6))),
        ("flat_product", L((2, 5), (5, 1)), (L(3, 5), L(4, 6))),
        ("left_inverse", L((4, 2), (2, 1))),
        ("right_inverse", L((4, 2), (2, 1))),
        ("right_inverse", L((4, 2), (1, -4))),
        ("make_layout_tv", L((4, 8), (8, 1)), L((2, 2), (2, 1))),
        ("make_layout_tv", L((2, 3), (3, 1)), L((2, 2), (2, 1))),
        ("make_layout_tv", L((32, 4), (1, 32)), L((1, 8), (0, 1))),
        ("flat_divide", L((6, 4), (1, 10)), (2,)),
        ("tiled_divide", L((6, 4), (1, 10)), (2,)),
        ("raked_product", L((2, 2), (1, 2)), L(3, 1)),
        ("blocked_product", L(4, 1), L(3, 1)),
        ("slice", L((4, (3, 5)), (1, (4, 12))), (None, (2, None))),
        ("slice", L((4, 8), (1, 4)), (None, 2)),
        ("recast_layout", L((4, 8), (8, 1)), 16, 32),
        ("recast_layout", L((4, 8), (8, 1)), 16, 8),
    ]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--cutlass", required=True)
    ap.add_argument("--n-per-op", type=int, default=8)
    args = ap.parse_args()
    cases = doc_cases() + [c for c in make_cases(seed=7, n_per_op=args.n_per_op)]
    alive = list(range(len(cases)))
    rejected: list[int] = []
    tmp = Path(tempfile.mkdtemp())
    while True:
        src = ["#include <cute/tensor.hpp>", "#include <cute/swizzle_layout.hpp>", "using namespace cute;"]
        line_of: dict[int, int] = {}
        for i in alive:
            line_of[len(src) + 1] = i
            src.append(f"void case_{i}() {{ print({expr(cases[i])}); }}")
        src.append("int main() {")
        for i in alive:
            src.append(f'  printf("@{i}@"); case_{i}(); printf("\\n");')
        src.append("}")
        (tmp / "g.cu").write_text("\n".join(src) + "\n")
        p = subprocess.run(["nvcc", "-std=c++17", "-I", f"{args.cutlass}/include", "-o", str(tmp / "g"),
                            str(tmp / "g.cu")], capture_output=True, text=True)
        if p.returncode == 0:
            break
        lines = re.findall(r"g\.cu\((\d+)\)", p.stderr) + re.findall(r"at line (\d+) of \S*g\.cu", p.stderr)
        bad = {line_of[int(m)] for m in lines if int(m) in line_of}
        if not bad:
            sys.exit(p.stderr[-4000:])
        rejected += sorted(bad)
        alive = [i for i in alive if i not in bad]
    out = subprocess.run([str(tmp / "g")], capture_output=True, text=True, check=True).stdout
    results = {int(m.group(1)): m.group(2) for m in re.finditer(r"@(\d+)@(.*)", out)}
    golden = []
    for i, c in enumerate(cases):
        res = "REJECTED" if i in rejected else re.sub(r"_(-?\d)", r"\1", results[i])
        golden.append({"case": [c[0]] + [enc(a) for a in c[1:]], "cpp": res})
    (HERE / "cute_cpp_golden.json").write_text(json.dumps(golden, indent=0) + "\n")
    print(f"{len(golden)} cases, {len(rejected)} rejected by C++")


if __name__ == "__main__":
    main()
