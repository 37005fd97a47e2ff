"""A Python file loaded by its path as a module: the benchmark scripts (not a package) and test
modules whose helpers other tests reuse. ``load_script(path, name)`` registers the module under
``name`` in ``sys.modules`` (dataclasses look their module up there) and runs it."""

from __future__ import annotations

import importlib.util
import pathlib
import sys
from types import ModuleType

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_script(path: str | pathlib.Path, name: str) -> ModuleType:
    """The module ``name`` run from ``path`` (relative paths are from the repository root)."""
    path = pathlib.Path(path)
    spec = importlib.util.spec_from_file_location(name, path if path.is_absolute() else ROOT / path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod
