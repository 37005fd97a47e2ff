"""On-disk cache of compiled kernels, safe for concurrent processes.

Directory: ``HEXLAYOUT_CACHE_DIR``, else ``~/.cache/hexlayout`` (``kernels/<k[:2]>/<k>.hlk``).
An entry is ``MAGIC | sha256(payload) | payload`` where the payload is a JSON header
(lengths, log, compiler, options, resources) followed by the cubin and PTX bytes. Writes go
to a temporary file in the same directory and are published with ``os.replace`` (atomic), so
a reader sees a whole entry or none; an entry whose checksum does not match (truncated,
corrupted) is deleted and reported as a miss, never loaded.
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["DiskCache", "CacheEntry", "default_cache_dir", "cache_key", "FORMAT_VERSION"]

MAGIC = b"HLK1"
FORMAT_VERSION = 1


def default_cache_dir() -> Path:
    env = os.environ.get("HEXLAYOUT_CACHE_DIR")
    return Path(env) if env else Path.home() / ".cache" / "hexlayout"


def cache_key(source: str, arch: str, compiler: str, options: list[str] | tuple[str, ...]) -> str:
    """sha256 over everything that determines the compiled bytes."""
    h = hashlib.sha256()
    for part in (f"hexlayout-cache-v{FORMAT_VERSION}", source, arch, compiler, "\0".join(options)):
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
        """The entry, or ``None`` when absent or damaged (a damaged file is removed)."""
        p = self.path(key)
        try:
            data = p.read_bytes()
        except OSError:
            return None
        entry = _decode(data)
        if entry is None:
            try:
                p.unlink()
            except OSError:
                pass
        return entry

    def put(self, key: str, entry: CacheEntry) -> Path:
        p = self.path(key)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{key[:16]}.", suffix=".tmp", dir=p.parent)
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(_encode(entry))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, p)
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        return p

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
