"""The compiler driver: kernel definition -> tile program -> synthesis -> CUDA C++ -> cubin.

``build(kernel, arch, **consts)`` traces a ``hexlayout.lang`` kernel (or takes a traced
``TileKernel``), synthesizes every layout and instruction for ``arch``, prints the
lowered program as CUDA C++ and (unless ``compile=False``) compiles it. Results are
memoized per (kernel, arch, constants) in the process, and on disk in
``$HEXLAYOUT_CACHE_DIR/builds/<sha256>.hlb``.

The disk key (``build_key``) covers a hash of hexlayout's own sources (so a change to the
synthesizer or code generator invalidates it), the architecture, whether it was compiled,
the compiler and its version and the compile options (``compiler_identity``,
``DEFAULT_OPTIONS``), and the tile program (``program_key``).

An entry is ``MAGIC | sha256(payload) | payload``; the payload is a JSON header (format, key,
kernel, architecture, compiler, section sizes), the ``Build`` as a plain-data JSON document
(``plaindata``: no pickle, reading it runs no code chosen by the file) and its byte blobs
(the cubin). A read checks the magic, checksum, header schema, key, architecture and every
size; an entry that fails any check is removed (a ``CacheWarning`` when it cannot be) and
rebuilt, never used. Entries are written atomically in a ``trusted_dir`` (see ``cache``:
the cache directory is trusted like ``~/.cache``; one writable by other users is refused
with a warning, and an unwritable one never fails a build).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import struct
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexlayout.codegen import GeneratedKernel, generate
from hexlayout.ir.tile import TileKernel
from hexlayout.synth.solve import Synthesis, synthesize

from . import plaindata
from .cache import (
    default_cache_dir,
    read_entry,
    remove_damaged,
    source_hash,
    trusted_dir,
    warn_cache,
    write_atomic,
)
from .capture import refuse_during_capture
from .compile import DEFAULT_OPTIONS, CompiledKernel, compile_generated, compiler_identity

__all__ = ["Build", "build", "clear_builds", "build_key", "program_key"]


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
    def offline_layouts(self) -> dict[str, Any]:
        """The ``OfflineLayout`` synthesis chose for each ``hl.offline`` argument, by name
        (``hexlayout.ir.offline``)."""
        return dict(getattr(self.synthesis.lowered, "offline", {}))

    @property
    def stats(self) -> Any:
        """The static quality report of the cubin (``runtime.stats.KernelStats``; computed on
        first use, memoized per cubin; needs cuobjdump)."""
        from .stats import build_stats

        return build_stats(self)


_BUILDS: dict[tuple, tuple[Any, Build]] = {}


def _key(kernel: Any, arch: str, consts: dict[str, Any], compile: bool) -> tuple:
    return (id(kernel), arch, tuple(sorted((k, repr(v)) for k, v in consts.items())), compile)


_MAGIC = b"HLB2"
_FORMAT = 2
_SUFFIX = ".hlb"


def program_key(tk: TileKernel) -> str:
    """The tile program's part of the build key: its structural hash (``hexlayout.ir.structural``:
    ops, types, layouts, constants, launch and loop structure, and the source lines the
    generated code quotes; not value or object ids)."""
    from hexlayout.ir.structural import structural_hash

    return structural_hash(tk)


def build_key(tk: TileKernel, arch: str, compile: bool) -> str:
    """sha256 over everything that determines a persisted build: hexlayout's sources, the
    architecture, whether it is compiled, the compiler with its version and the options
    (when compiled), the kernel's name and its tile program."""
    compiler = (compiler_identity() or "no compiler") if compile else "not compiled"
    h = hashlib.sha256()
    for part in (f"hexlayout-build-v{_FORMAT}", source_hash(), arch, str(compile), compiler,
                 "\0".join(DEFAULT_OPTIONS), tk.name, program_key(tk)):
        b = part.encode()
        h.update(struct.pack("<Q", len(b)))
        h.update(b)
    return h.hexdigest()


def _entry_path(key: str) -> Path:
    return default_cache_dir() / "builds" / f"{key}{_SUFFIX}"


def _encode(b: Build, key: str) -> bytes | None:
    """The entry's bytes, or ``None`` when the build holds something plain data cannot store."""
    try:
        doc, blobs = plaindata.encode(b)
    except (TypeError, ValueError, RecursionError):
        return None
    head = json.dumps({"format": _FORMAT, "key": key, "kernel": b.generated.name, "arch": b.generated.arch,
                       "compiler": b.compiled.compiler if b.compiled else None,
                       "document": len(doc), "blobs": [len(x) for x in blobs]}, sort_keys=True).encode()
    payload = struct.pack("<I", len(head)) + head + doc + b"".join(blobs)
    return _MAGIC + hashlib.sha256(payload).digest() + payload


def _decode(data: bytes, key: str, arch: str, compile: bool) -> Build | None:
    """The build in ``data`` when every check passes, else ``None``."""
    n_magic = len(_MAGIC)
    if len(data) < n_magic + 36 or data[:n_magic] != _MAGIC:
        return None
    digest, payload = data[n_magic:n_magic + 32], data[n_magic + 32:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    try:
        (n,) = struct.unpack_from("<I", payload)
        head = json.loads(payload[4:4 + n])
        if (type(head) is not dict or head.get("format") != _FORMAT or head.get("key") != key
                or head.get("arch") != arch):
            return None
        sizes = head["blobs"]
        doc_len = head["document"]
        if (type(doc_len) is not int or type(sizes) is not list
                or not all(type(x) is int and x >= 0 for x in [doc_len, *sizes])
                or 4 + n + doc_len + sum(sizes) != len(payload)):
            return None
        at = 4 + n
        doc = payload[at:at + doc_len]
        at += doc_len
        blobs = []
        for size in sizes:
            blobs.append(payload[at:at + size])
            at += size
        out = plaindata.decode(doc, blobs)
    except (ValueError, KeyError, TypeError, struct.error, RecursionError):
        return None
    if (not isinstance(out, Build) or not isinstance(out.generated, GeneratedKernel)
            or out.generated.name != head.get("kernel") or out.generated.arch != arch
            or not isinstance(out.synthesis, Synthesis) or not isinstance(out.tile_kernel, TileKernel)):
        return None
    if compile != (out.compiled is not None):
        return None
    if out.compiled is not None and (not isinstance(out.compiled, CompiledKernel)
                                     or type(out.compiled.cubin) is not bytes or not out.compiled.cubin):
        return None
    return out


def _load(path: Path, key: str, arch: str, compile: bool) -> Build | None:
    if trusted_dir(path.parents[1], path.parent.name) is None:
        return None
    data = read_entry(path, "build cache entry", "rebuilding")
    if data is None:
        return None
    out = _decode(data, key, arch, compile)
    if out is None:
        warn_cache(f"hexlayout: the build cache entry {path} is damaged or not a hexlayout build; "
                   "rebuilding it")
        remove_damaged(path, "build cache entry")
    return out


def _store(path: Path, b: Build, key: str) -> None:
    data = _encode(b, key)
    if data is None:
        return
    if trusted_dir(path.parents[1], path.parent.name, create=True) is None:
        return
    write_atomic(path, data, "build cache entry")


def build(kernel: Any, arch: str, *, compile: bool = True, **consts: Any) -> Build:
    """Trace (if needed), synthesize, generate and compile ``kernel`` for ``arch``."""
    key = _key(kernel, arch, consts, compile)
    memo = _BUILDS.get(key)
    if memo is not None and memo[0] is kernel:
        return memo[1]
    refuse_during_capture(f"kernel {getattr(kernel, 'name', kernel)!s} for {arch}", consts)
    times: dict[str, float] = {}
    t = time.perf_counter()
    tk = kernel if isinstance(kernel, TileKernel) else kernel.trace(**consts)
    times["trace"] = time.perf_counter() - t
    disk_key = build_key(tk, arch, compile) if os.environ.get("HEXLAYOUT_BUILD_CACHE", "1") != "0" else None
    path = _entry_path(disk_key) if disk_key is not None else None
    if path is None or disk_key is None:
        return _build_new(kernel, key, tk, arch, compile, times, path, disk_key)
    t = time.perf_counter()
    hit = _load(path, disk_key, arch, compile)
    if hit is None:
        with _building(path):       # a miss: wait for a process building the same entry, look again
            t = time.perf_counter()
            hit = _load(path, disk_key, arch, compile)
            if hit is None:
                return _build_new(kernel, key, tk, arch, compile, times, path, disk_key)
    hit.seconds = {"trace": times["trace"], "load": time.perf_counter() - t}
    _BUILDS[key] = (kernel, hit)
    return hit


#: how long a process waits for another one building the same entry before building it too
_LOCK_WAIT = 600.0


@contextlib.contextmanager
def _building(path: Path | None) -> Iterator[None]:
    """Held while this process looks up and builds the entry ``path``: a process that needs an
    entry another process is building waits for it (an exclusive ``flock`` on ``path``'s
    ``.lock`` beside it), then reads it from the cache instead of synthesizing it again (the
    workers of one test run share their kernels). Without the cache, ``fcntl`` or a writable
    cache folder it holds nothing; after ``_LOCK_WAIT`` seconds it builds without the lock
    (never a deadlock between processes building each other's entries)."""
    try:
        import fcntl
    except ImportError:                    # not POSIX
        fcntl = None
    if path is None or fcntl is None or trusted_dir(path.parents[1], path.parent.name, create=True) is None:
        yield
        return
    try:
        fd = os.open(path.with_suffix(".lock"), os.O_RDWR | os.O_CREAT, 0o600)
    except OSError:
        yield
        return
    locked = False
    try:
        deadline = time.monotonic() + _LOCK_WAIT
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                locked = True
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.05)
            except OSError:
                break
        yield
    finally:
        if locked:
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


def _build_new(kernel: Any, key: Any, tk: TileKernel, arch: str, compile: bool, times: dict[str, float],
               path: Path | None, disk_key: str | None) -> Build:
    """Synthesize, generate and compile ``tk`` (not in the cache), memoize and store it."""
    t = time.perf_counter()
    syn = synthesize(tk, arch)
    times["synthesize"] = time.perf_counter() - t
    t = time.perf_counter()
    gen = generate(syn.lowered.kernel)
    times["generate"] = time.perf_counter() - t
    compiled = None
    if compile:
        t = time.perf_counter()
        gen, compiled = _compile_fewest_spills(syn.lowered.kernel, gen)
        times["compile"] = time.perf_counter() - t
    out = Build(tk, syn, gen, compiled, times)
    _BUILDS[key] = (kernel, out)
    if path is not None and disk_key is not None:
        _store(path, out, disk_key)
    return out


def _spilled(c: CompiledKernel) -> int:
    r = c.resources
    return 0 if r is None else r.spill_stores + r.spill_loads


def _compile_fewest_spills(kernel: Any, gen: Any) -> tuple[Any, CompiledKernel]:
    """Compile ``gen``; where ptxas spilled and the kernel leaves ``min_blocks`` to the
    compiler, compile it again with ``__launch_bounds__(threads, 1)`` and keep the one that
    spills fewer bytes. (ptxas picks its register target differently with and without
    minBlocks, and neither is always better: a gated-MLP fused GEMM spills 4 B at ptxas's
    own 128 registers and none with minBlocks 1 at 189; a transposed-operand GEMM none at 191
    without and 24 B with at 255.)"""
    compiled = compile_generated(gen)
    if not _spilled(compiled) or kernel.min_blocks is not None:
        return gen, compiled
    alt_gen = generate(dataclasses.replace(kernel, min_blocks=1))
    if alt_gen.source == gen.source:
        return gen, compiled
    alt = compile_generated(alt_gen)
    return (alt_gen, alt) if _spilled(alt) < _spilled(compiled) else (gen, compiled)


def clear_builds() -> None:
    _BUILDS.clear()
