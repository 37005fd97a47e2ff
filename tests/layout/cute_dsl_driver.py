"""Evaluate CuTe layout-algebra cases with NVIDIA's CuTe DSL (``cutlass.cute``).

Run as ``python cute_dsl_driver.py < cases.json``: the input is a JSON list of cases
``[op, arg, ...]`` where a layout is ``{"L": [shape, stride]}``, a swizzle
``{"S": [B, M, S]}``, a composed layout ``{"C": [swizzle, offset, layout]}``, lists are
tuples and ``null`` is ``_``. The output (one JSON list on the last stdout line) holds
for each case the CuTe-form string of the result, normalized to C++'s printing
(no spaces, ``Sw<B,M,S>``), or ``"ERR: ..."`` if CuTe DSL rejected it.

All cases are traced inside one ``@cute.jit`` function, so one run costs one import
(~0.6 s) and one trace. Layouts are static (Python ints), so CuTe DSL evaluates the
algebra at trace time with CuTe's C++ semantics.
"""

from __future__ import annotations

import json
import re
import sys


def _tup(x):
    if isinstance(x, list):
        return tuple(_tup(e) for e in x)
    return x


def normalize(s: str) -> str:
    s = s.replace(" ", "")
    s = re.sub(r"\bS<", "Sw<", s)
    return s


def main() -> None:
    import cutlass.cute as cute

    cases = json.loads(sys.stdin.read())
    out: list[str] = []

    def dec(a):
        if isinstance(a, dict):
            if "L" in a:
                return cute.make_layout(_tup(a["L"][0]), stride=_tup(a["L"][1]))
            if "S" in a:
                return cute.make_swizzle(*a["S"])
            if "C" in a:
                return cute.make_composed_layout(dec(a["C"][0]), a["C"][1], dec(a["C"][2]))
        if isinstance(a, list):
            return tuple(dec(e) for e in a)
        return a

    ops = {
        "composition": lambda a, b: cute.composition(a, b),
        "complement": lambda a, c=None: cute.complement(a) if c is None else cute.complement(a, c),
        "right_inverse": cute.right_inverse,
        "left_inverse": cute.left_inverse,
        "coalesce": cute.coalesce,
        "filter": cute.filter,
        "filter_zeros": cute.filter_zeros,
        "logical_divide": cute.logical_divide,
        "zipped_divide": cute.zipped_divide,
        "tiled_divide": cute.tiled_divide,
        "flat_divide": cute.flat_divide,
        "logical_product": cute.logical_product,
        "zipped_product": cute.zipped_product,
        "tiled_product": cute.tiled_product,
        "flat_product": cute.flat_product,
        "blocked_product": cute.blocked_product,
        "raked_product": cute.raked_product,
        # CuTe DSL's argument order is (new_bits, old_bits, layout)
        "recast_layout": lambda lay, old, new: cute.recast_layout(new, old, lay),
        "make_layout_tv": lambda t, v: cute.make_layout_tv(t, v)[1],
        "make_layout_tv_tiler": lambda t, v: cute.make_layout_tv(t, v)[0],
        "slice": lambda lay, crd: cute.slice_(lay, crd),
        "eval": lambda lay, crd: lay(crd),
    }

    @cute.jit
    def run():
        for case in cases:
            try:
                args = [dec(a) for a in case[1:]]
                out.append(normalize(str(ops[case[0]](*args))))
            except Exception as e:  # noqa: BLE001 - report every rejection as a result
                msg = " ".join(str(e).split())[:300]
                out.append(f"ERR: {type(e).__name__}: {msg}")

    run()
    print(json.dumps(out))


if __name__ == "__main__":
    main()
