"""``HEXLAYOUT_PTX_EXECUTED=path``: after the session, ``path`` holds the opcodes the PTX
executor ran in this package's tests (opcode -> thread-instructions; run serially), the
"tested" column of ``benchmarks/results/ptx_opcodes.md``."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator

import pytest


@pytest.fixture(scope="session", autouse=True)
def _executed_opcodes() -> Iterator[None]:
    out = os.environ.get("HEXLAYOUT_PTX_EXECUTED")
    if not out:
        yield
        return
    import hexlayout.ptx.execute as X

    seen: list[X.PtxRunReport] = []
    init = X.PtxRunReport.__init__

    def recording(self: X.PtxRunReport, kernel: str) -> None:
        init(self, kernel)
        seen.append(self)

    X.PtxRunReport.__init__ = recording  # type: ignore[method-assign]
    try:
        yield
    finally:
        X.PtxRunReport.__init__ = init  # type: ignore[method-assign]
        ops: dict[str, int] = {}
        for r in seen:
            for o, n in r.opcodes.items():
                if n:
                    ops[o] = ops.get(o, 0) + n
        with open(out, "w") as f:
            json.dump(dict(sorted(ops.items())), f, indent=1)
