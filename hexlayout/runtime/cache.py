"""On-disk cache of compiled kernels, safe for concurrent processes.

Directory: ``HEXLAYOUT_CACHE_DIR``, else ``~/.cache/hexlayout`` (``kernels/<k[:2]>/<k>.hlk``).
An entry is ``MAGIC | sha256(payload) | payload`` where the payload is a JSON header
(its key, lengths, log, compiler, options, resources) followed by the cubin and PTX bytes. Writes go
to a temporary file in the same directory and are published with ``os.replace`` (atomic), so
a reader sees a whole entry or none; an entry whose checksum does not match (truncated,
corrupted) is deleted and reported as a miss, never loaded.

Threat model: the cache directory is trusted like ``~/.cache``. The checksum detects damage,
not forgery: whoever can write the directory can place a cubin that the next launch runs.
So the cache is used only when every directory from the cache root down to the entry is
owned by the current user and writable by no one else (no group / other write bit);
otherwise ``trusted_dir`` warns once (``CacheWarning``, naming the directory) and the
compile goes on without a persistent cache. Directories hexlayout creates are ``0o700``.
A cache that cannot be read or written (a read-only directory, a cache path that is a file,
a directory that cannot be created, a damaged entry that cannot be removed) never fails a
compile either: it warns once, naming the path, and goes on.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat
import struct
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DiskCache", "CacheEntry", "default_cache_dir", "cache_key", "FORMAT_VERSION", "CacheWarning",
           "trusted_dir", "warn_cache", "write_atomic", "remove_damaged", "source_hash"]

MAGIC = b"HLK1"
FORMAT_VERSION = 1


class CacheWarning(UserWarning):
    """The persistent cache (or a part of it) is not used: unsafe permissions, unwritable,
    or a damaged entry. The operation goes on without it."""


_WARNED: set[str] = set()


def warn_cache(message: str) -> None:
    """Warn (``CacheWarning``) once per process and message."""
    if message not in _WARNED:
        _WARNED.add(message)
        warnings.warn(message, CacheWarning, stacklevel=3)


def default_cache_dir() -> Path:
    """``HEXLAYOUT_CACHE_DIR``, else ``~/.cache/hexlayout``; without a home directory, a
    per-user directory in the system's temporary directory (checked like any cache directory:
    one that another user created first is refused)."""
    env = os.environ.get("HEXLAYOUT_CACHE_DIR")
    if env:
        return Path(env)
    try:
        return Path.home() / ".cache" / "hexlayout"
    except (RuntimeError, KeyError, OSError):
        uid = getattr(os, "getuid", lambda: "user")()
        return Path(tempfile.gettempdir()) / f"hexlayout-cache-{uid}"


def _unsafe(st: os.stat_result) -> str | None:
    """Why a directory with status ``st`` must not hold cached code, or ``None``."""
    if not stat.S_ISDIR(st.st_mode):
        return "is not a directory"
    if os.name != "posix":            # no owner / mode bits to check (Windows: ACLs)
        return None
    if st.st_uid != os.getuid():
        return f"is owned by uid {st.st_uid}, not by the current user (uid {os.getuid()})"
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        return f"is writable by other users (mode {stat.filemode(st.st_mode)})"
    return None


def trusted_dir(root: Path, sub: Path | str | None = None, *, create: bool = False) -> Path | None:
    """``root / sub`` when it can hold cached code, else ``None``.

    Every directory from ``root`` down to ``root / sub`` must be owned by the current user and
    not group- or other-writable; with ``create``, missing ones are made with mode ``0o700``.
    A missing directory without ``create`` is ``None`` silently (a cache miss); an unsafe or
    uncreatable one is ``None`` with a ``CacheWarning`` (once) naming it.
    """
    d = Path(root)
    parts = Path(sub).parts if sub is not None else ()
    for i in range(len(parts) + 1):
        if i:
            d = d / parts[i - 1]
        try:
            st = d.stat()
        except FileNotFoundError:
            if not create:
                return None
            try:
                d.mkdir(mode=0o700, parents=True, exist_ok=True)
                st = d.stat()
            except OSError as e:
                warn_cache(f"hexlayout: cache directory {d} cannot be created ({e.strerror or e}); "
                           "going on without a persistent cache")
                return None
        except OSError as e:
            warn_cache(f"hexlayout: cache directory {d} cannot be used ({e.strerror or e}); "
                       "going on without a persistent cache")
            return None
        why = _unsafe(st)
        if why is not None:
            warn_cache(f"hexlayout: cache directory {d} {why}; refusing to load or store compiled code "
                       "there (see docs/caching.md); going on without a persistent cache")
            return None
    return d


def write_atomic(path: Path, data: bytes, what: str = "cache entry") -> bool:
    """Write ``data`` to ``path`` through a temporary file and ``os.replace``; the parent must be a
    ``trusted_dir``. ``False`` with a ``CacheWarning`` (once) when it cannot be written."""
    tmp = None
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.stem[:16]}.", suffix=".tmp", dir=path.parent)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return True
    except OSError as e:
        if tmp is not None:
            try:
                os.unlink(tmp)
            except OSError:
                pass
        warn_cache(f"hexlayout: cannot write the {what} {path} ({e.strerror or e}); going on without "
                   "storing it")
        return False


def read_entry(path: Path, what: str, then: str) -> bytes | None:
    """The bytes of the cache file ``path``; None when it is missing, or unreadable (warned:
    "cannot read the ``what`` ...; ``then``")."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        return None
    except OSError as e:
        warn_cache(f"hexlayout: cannot read the {what} {path} ({e.strerror or e}); {then}")
        return None


def remove_damaged(path: Path, what: str = "cache entry") -> None:
    """Delete a damaged entry; a ``CacheWarning`` (once) when that is not possible."""
    try:
        path.unlink(missing_ok=True)
    except OSError as e:
        warn_cache(f"hexlayout: damaged {what} {path} cannot be removed ({e.strerror or e}); it is "
                   "ignored and rebuilt in memory")


_SOURCE_HASH: str | None = None


def source_hash() -> str:
    """sha256 of hexlayout's Python sources (paths and contents; computed once per process).
    Part of every persisted artifact's key, so a hexlayout upgrade never reads what an older
    one wrote (generated code, resource parsing, the build format)."""
    global _SOURCE_HASH
    if _SOURCE_HASH is None:
        root = Path(__file__).resolve().parents[1]
        h = hashlib.sha256()
        for f in sorted(root.rglob("*.py")):
            h.update(str(f.relative_to(root)).encode())
            h.update(f.read_bytes())
        _SOURCE_HASH = h.hexdigest()
    return _SOURCE_HASH


def cache_key(source: str, arch: str, compiler: str, options: list[str] | tuple[str, ...]) -> str:
    """sha256 over everything that determines the compiled bytes and what hexlayout stores with
    them: hexlayout's sources, the CUDA source, architecture, compiler (with its version) and
    options."""
    h = hashlib.sha256()
    for part in (f"hexlayout-cache-v{FORMAT_VERSION}", source_hash(), source, arch, compiler,
                 "\0".join(options)):
        b = part.encode()
        h.update(struct.pack("<Q", len(b)))
        h.update(b)
    return h.hexdigest()


@dataclass
class CacheEntry:
    cubin: bytes
    ptx: str
    meta: dict[str, Any]


class DiskCache:
    """A directory of compiled kernels keyed by ``cache_key``."""

    def __init__(self, directory: str | os.PathLike[str] | None = None) -> None:
        self.directory = Path(directory) if directory is not None else default_cache_dir()

    def path(self, key: str) -> Path:
        return self.directory / "kernels" / key[:2] / f"{key}.hlk"

    def get(self, key: str) -> CacheEntry | None:
        """The entry, or ``None`` when absent, damaged (a damaged file is removed) or in a
        directory that is not trusted (``trusted_dir``)."""
        p = self.path(key)
        if trusted_dir(self.directory, p.parent.relative_to(self.directory)) is None:
            return None
        data = read_entry(p, "cache entry", "recompiling")
        if data is None:
            return None
        entry = _decode(data)
        if entry is not None and entry.meta.pop("key", None) != key:
            entry = None                  # a whole entry, but of another key (copied or renamed)
        if entry is None:
            warn_cache(f"hexlayout: the cache entry {p} is damaged or not of its key; recompiling")
            remove_damaged(p)
        return entry

    def put(self, key: str, entry: CacheEntry) -> Path | None:
        """Store ``entry``; its path, or ``None`` (with a ``CacheWarning``) when the cache directory
        is not trusted or cannot be written - never an exception."""
        p = self.path(key)
        if trusted_dir(self.directory, p.parent.relative_to(self.directory), create=True) is None:
            return None
        stored = CacheEntry(entry.cubin, entry.ptx, {**entry.meta, "key": key})
        return p if write_atomic(p, _encode(stored)) else None

    def clear(self) -> None:
        """Remove every entry."""
        root = self.directory / "kernels"
        if not root.is_dir():
            return
        for f in root.glob("*/*.hlk"):
            try:
                f.unlink()
            except OSError:
                pass


def _encode(e: CacheEntry) -> bytes:
    ptx = e.ptx.encode()
    head = json.dumps({**e.meta, "cubin_len": len(e.cubin), "ptx_len": len(ptx)}, sort_keys=True).encode()
    payload = struct.pack("<I", len(head)) + head + e.cubin + ptx
    return MAGIC + hashlib.sha256(payload).digest() + payload


def _decode(data: bytes) -> CacheEntry | None:
    if len(data) < 40 or data[:4] != MAGIC:
        return None
    digest, payload = data[4:36], data[36:]
    if hashlib.sha256(payload).digest() != digest:
        return None
    try:
        (n,) = struct.unpack("<I", payload[:4])
        meta = json.loads(payload[4:4 + n])
        c0 = 4 + n
        c1 = c0 + int(meta.pop("cubin_len"))
        p1 = c1 + int(meta.pop("ptx_len"))
        if p1 != len(payload):
            return None
        return CacheEntry(payload[c0:c1], payload[c1:p1].decode(), meta)
    except (ValueError, KeyError, struct.error, UnicodeDecodeError):
        return None
