"""The compiler driver: kernel definition -> tile program -> synthesis -> CUDA C++ -> cubin.

``build(kernel, arch, **consts)`` traces a ``hexlayout.lang`` kernel (or takes a traced
``TileKernel``), synthesizes every layout and instruction for ``arch``, prints the
lowered program as CUDA C++ and (unless ``compile=False``) compiles it. Results are
memoized per (kernel, arch, constants) in the process, and on disk per the printed tile
program: ``$HEXLAYOUT_CACHE_DIR/builds/<sha256>.pkl`` keyed by the tile program's text,
the architecture, whether it was compiled, and a hash of hexlayout's own sources (so a
change to the synthesizer or code generator invalidates it). Entries carry a checksum
and are written atomically; a damaged entry is rebuilt, never used.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexlayout.codegen import GeneratedKernel, generate
from hexlayout.ir.tile import TileKernel
from hexlayout.synth.solve import Synthesis, synthesize

from .cache import default_cache_dir
from .compile import CompiledKernel, compile_generated

__all__ = ["Build", "build", "clear_builds"]


@dataclass
class Build:
    tile_kernel: TileKernel
    synthesis: Synthesis
    generated: GeneratedKernel
    compiled: CompiledKernel | None
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def lowered(self) -> Any:
        return self.synthesis.lowered.kernel

    @property
    def stats(self) -> Any:
        """The static quality report of the cubin (``runtime.stats.KernelStats``; computed on
        first use, memoized per cubin; needs cuobjdump)."""
        from .stats import build_stats

        return build_stats(self)


_BUILDS: dict[tuple, Build] = {}


def _key(kernel: Any, arch: str, consts: dict[str, Any], compile: bool) -> tuple:
    return (id(kernel), arch, tuple(sorted((k, repr(v)) for k, v in consts.items())), compile)


_SOURCE_HASH: str | None = None
_MAGIC = b"HLB1"


def _source_hash() -> str:
    """sha256 of hexlayout's Python sources (the synthesizer and code generator included)."""
    global _SOURCE_HASH
    if _SOURCE_HASH is None:
        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
        _SOURCE_HASH = h.hexdigest()
    return _SOURCE_HASH


def _disk_path(tk: TileKernel, arch: str, compile: bool) -> Path:
    h = hashlib.sha256()
    for part in (_source_hash(), arch, str(compile), tk.name, str(tk)):
        h.update(part.encode())
        h.update(b"\0")
    return default_cache_dir() / "builds" / f"{h.hexdigest()}.pkl"


def _load(path: Path) -> Build | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    body = data[len(_MAGIC) + 32:]
    if data[:len(_MAGIC)] != _MAGIC or hashlib.sha256(body).digest() != data[len(_MAGIC):len(_MAGIC) + 32]:
        path.unlink(missing_ok=True)
        return None
    try:
        out = pickle.loads(body)
    except Exception:  # noqa: BLE001 - an unreadable entry is rebuilt
        path.unlink(missing_ok=True)
        return None
    return out if isinstance(out, Build) else None


def _store(path: Path, b: Build) -> None:
    try:
        body = pickle.dumps(b, protocol=pickle.HIGHEST_PROTOCOL)
    except Exception:  # noqa: BLE001 - a build that cannot be pickled is simply not persisted
        return
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".build-")
        with os.fdopen(fd, "wb") as f:
            f.write(_MAGIC + hashlib.sha256(body).digest() + body)
        os.replace(tmp, path)
    except OSError:
        return


def build(kernel: Any, arch: str, *, compile: bool = True, **consts: Any) -> Build:
    """Trace (if needed), synthesize, generate and compile ``kernel`` for ``arch``."""
    key = _key(kernel, arch, consts, compile)
    if key in _BUILDS:
        return _BUILDS[key]
    times: dict[str, float] = {}
    t = time.perf_counter()
    tk = kernel if isinstance(kernel, TileKernel) else kernel.trace(**consts)
    times["trace"] = time.perf_counter() - t
    path = _disk_path(tk, arch, compile) if os.environ.get("HEXLAYOUT_BUILD_CACHE", "1") != "0" else None
    if path is not None:
        t = time.perf_counter()
        hit = _load(path)
        if hit is not None:
            hit.seconds = {"trace": times["trace"], "load": time.perf_counter() - t}
            _BUILDS[key] = hit
            return hit
    t = time.perf_counter()
    syn = synthesize(tk, arch)
    times["synthesize"] = time.perf_counter() - t
    t = time.perf_counter()
    gen = generate(syn.lowered.kernel)
    times["generate"] = time.perf_counter() - t
    compiled = None
    if compile:
        t = time.perf_counter()
        compiled = compile_generated(gen)
        times["compile"] = time.perf_counter() - t
    out = Build(tk, syn, gen, compiled, times)
    _BUILDS[key] = out
    if path is not None:
        _store(path, out)
    return out


def clear_builds() -> None:
    _BUILDS.clear()
