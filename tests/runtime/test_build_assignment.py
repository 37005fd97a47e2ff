"""A build read back from the persisted cache carries a synthesis whose assignment still
resolves its own program: every mma and copy op of the loaded ``synthesis.kernel`` finds its
TiledMma / instruction by ``op.uid``, every value its layout by ``Value.id``, and ``explain``
reads the same decisions from the loaded build as from the fresh one (in process, through
plaindata's encode/decode, and in a new process, through the cache file)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

import hexlayout.runtime.cache as rc
from hexlayout.runtime import build, clear_builds, plaindata

# what a reader of a build sees of synthesis's choices, op by op (run here and in a new process)
DESCRIBE = """
from hexlayout.cli.explain import explain_report
from hexlayout.cli.kernels import SynthesisResult
from hexlayout.ir.tile import Copy, Mma
from hexlayout.ir.walk import walk


def describe(s):
    asg, ops, values = s.assignment, [], {}
    for op in walk(s.kernel):
        if isinstance(op, Mma):
            ops.append(["mma", str(asg.mma[op.uid]), str(s.mma[op.uid]), str(op.atom), str(op.warps)])
        elif isinstance(op, Copy):
            ops.append(["copy", *asg.copies[op.uid]])
        for v in op.values():
            values[v.id] = v
    assert set(asg.mma) == {op.uid for op in walk(s.kernel) if isinstance(op, Mma)}
    assert set(asg.copies) == {op.uid for op in walk(s.kernel) if isinstance(op, Copy)}
    assert set(asg.layouts) <= set(values)
    layouts = {values[k].name: str(lay) for k, lay in asg.layouts.items()}
    assert all(str(values[k].type.layout) == lay for k, lay in zip(asg.layouts, layouts.values()))
    report = explain_report(SynthesisResult(s.kernel, s, 0.0, 0.0, {}), "gemm", "sm_80")
    del report["seconds"]
    return {"ops": ops, "layouts": layouts, "explain": report}
"""

CODE = DESCRIBE + """
import json
from hexlayout.lang.examples import gemm_sm80
from hexlayout.runtime import build
b = build(gemm_sm80, "sm_80", compile=False, BM=64, BN=64, BK=32)
print(json.dumps({"load": "load" in b.seconds, "describe": describe(b.synthesis)}, default=str))
"""


def _describe(s) -> dict:
    ns: dict = {}
    exec(DESCRIBE, ns)
    return json.loads(json.dumps(ns["describe"](s), default=str))


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    d = tmp_path / "cache"
    monkeypatch.setenv("HEXLAYOUT_CACHE_DIR", str(d))
    monkeypatch.delenv("HEXLAYOUT_BUILD_CACHE", raising=False)
    # the sources' hash is memoized per process: hash them now, as the second process will
    monkeypatch.setattr(rc, "_SOURCE_HASH", None)
    clear_builds()
    yield d
    clear_builds()


def test_a_loaded_synthesis_resolves_its_ops_and_values(fresh) -> None:
    from hexlayout.lang.examples import gemm_sm80

    first = build(gemm_sm80, "sm_80", compile=False, BM=64, BN=64, BK=32)
    want = _describe(first.synthesis)
    kinds = [o[0] for o in want["ops"]]
    assert "mma" in kinds and kinds.count("copy") >= 3            # a program with real choices
    assert any(c[2].startswith("SM75_") for c in want["ops"] if c[0] == "copy")   # ldmatrix chosen

    # plaindata round trip in process: new op and value objects, the same answers
    loaded = plaindata.decode(*plaindata.encode(first.synthesis))
    assert loaded.kernel is not first.synthesis.kernel
    assert all(a is not b for a, b in zip(loaded.kernel.body.walk(), first.synthesis.kernel.body.walk()))
    assert _describe(loaded) == want

    # a new process loads the persisted build and reads the same choices
    out = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "HEXLAYOUT_CACHE_DIR": str(fresh)})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["load"], "the second process synthesized again instead of loading the build"
    assert got["describe"] == want
