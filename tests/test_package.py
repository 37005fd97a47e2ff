"""Package-level guarantees: light imports, layering, style."""

from __future__ import annotations

import ast
import os
import pathlib
import re
import shutil
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]

# Layers from DESIGN.md, bottom first. A package may import only those listed before it.
LAYERS = ["layout", "arch", "draw", "ir", "lang", "synth", "codegen", "emulator", "ptx", "runtime", "fusion",
          "ops", "integrations"]
#: layers installed as hexlayout.<name> from a top-level directory of the repository
_TOP_LEVEL = ("ops", "integrations")


def _probe(code: str, pycache: pathlib.Path | None = None) -> str:
    """Run ``code`` in a fresh interpreter; with ``pycache``, bytecode is written there and
    reused (as an installed package's is), whatever ``PYTHONDONTWRITEBYTECODE`` says."""
    env = dict(os.environ)
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT,
                         env=env)
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_core_imports_are_light_and_need_no_torch_or_cuda(tmp_path: pathlib.Path) -> None:
    code = (
        "import time, sys\n"
        "t = time.perf_counter()\n"
        "import hexlayout, hexlayout.layout, hexlayout.arch\n"
        "dt = time.perf_counter() - t\n"
        "heavy = sorted(m for m in ('torch', 'cuda', 'matplotlib', 'z3', 'constraint') if m in sys.modules)\n"
        "print(dt, ','.join(heavy))\n"
    )
    runs = [_probe(code, tmp_path).split() for _ in range(4)]    # the first one compiles
    best = min(float(r[0]) for r in runs)
    heavy = runs[0][1:]
    assert heavy == [], f"import hexlayout pulled in {heavy}"
    assert best < 0.2, f"import hexlayout, hexlayout.layout, hexlayout.arch took {best:.3f} s"


def _imports(path: pathlib.Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                found.add(node.module)
            elif node.level == 2 and node.module:
                found.add("hexlayout." + node.module)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and \
                re.fullmatch(r"hexlayout(\.\w+)+", node.value):
            found.add(node.value)       # a module named in code (importlib.import_module, a table)
    return found


def _layer_dir(name: str) -> pathlib.Path:
    return ROOT / name if name in _TOP_LEVEL else ROOT / "hexlayout" / name


@pytest.mark.parametrize("layer", [name for name in LAYERS if _layer_dir(name).is_dir()])
def test_layers_import_only_layers_below(layer: str) -> None:
    pkg = _layer_dir(layer)
    allowed = set(LAYERS[: LAYERS.index(layer) + 1])
    bad = []
    for f in sorted(pkg.rglob("*.py")):
        for mod in _imports(f):
            parts = mod.split(".")
            if parts[0] == "hexlayout" and len(parts) > 1 and parts[1] in LAYERS and parts[1] not in allowed:
                bad.append(f"{f.relative_to(ROOT)} imports {mod}")
    assert not bad, "layering violations:\n" + "\n".join(bad)


def test_ruff_clean() -> None:
    ruff = shutil.which("ruff")
    cmd = [ruff] if ruff else [sys.executable, "-m", "ruff"]
    out = subprocess.run([*cmd, "check", "hexlayout", "ops", "integrations", "tests", "benchmarks"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr


def test_every_package_is_listed_in_pyproject() -> None:
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {"hexlayout." + ".".join(p.parent.relative_to(ROOT / "hexlayout").parts)
             for p in (ROOT / "hexlayout").rglob("__init__.py")}
    found = {f.rstrip(".") for f in found}
    missing = sorted(found - listed)
    assert not missing, f"packages missing from pyproject.toml [tool.setuptools] packages: {missing}"
