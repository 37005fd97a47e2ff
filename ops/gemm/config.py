"""GEMM configurations: the hardware-centric config space, shape heuristics, an autotuner.

A ``GemmConfig`` fixes the tile constants of one schedule:

- sm_80 / sm_89 (``gemm_sm80_kernel``): block tile ``BM x BN``, k-tile ``BK``, pipeline
  ``STAGES``, ``WARPS`` warps (the warp arrangement is synthesized);
- sm_90a (``gemm_sm90_kernel``): ``BM x BN`` per block, ``BK``, ``STAGES`` (as many as
  the shared memory holds, at most 7: ``sm90_stages``), ``CONSUMERS`` consumer warp groups
  (plus one producer), ``persistent`` blocks walking the tiles (``GRID`` = number of SMs)
  or one block per tile; tiles 64x64 to 128x256 / 256x128; ``cluster=2``: one block per
  tile in 2-CTA clusters whose two N-neighbour tiles share the A tile, loaded half by each
  CTA and multicast to both (``CLUSTER=2``).

``choose_config(arch, m, n, k)`` is the heuristic: small ``M`` (decode-like) shapes get
short tiles, large ones the big tiles; Hopper goes persistent when there are more tiles
than SMs. ``Autotuner`` times every config of the space with a caller-given timer (CUDA
events on a GPU), shows a progress bar, and persists the winner per shape bucket in
``$HEXLAYOUT_CACHE_DIR/autotune.json``.

The persisted file is ``{"format": 2, "entries": {...}, "sha256": ...}`` with the checksum
over the canonical JSON of ``entries``. It is read once per process (per path) and re-read
only when its modification time, size or inode changed (checked at most every
``REFRESH_SECONDS``), never per call. A file that fails any check (JSON, schema, checksum: one
flipped digit) is refused whole with a ``CacheWarning`` naming it; an entry whose key is not
one ``tune`` writes or whose config is not in the shipped config space (``CONFIGS``) is
dropped with a ``CacheWarning`` naming the file and the entry. The file lives in a
``trusted_dir`` (see ``hexlayout.runtime.cache``); a directory writable by other users is
refused, and a file that cannot be written never fails a tuning run (a warning, the result
is still returned and kept in memory).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import re
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import Any

__all__ = ["GemmConfig", "CONFIGS", "choose_config", "Autotuner", "SM_COUNT", "autotuner", "AUTOTUNE_FORMAT",
           "REFRESH_SECONDS", "tuning_token", "sm90_stages", "SM90_MAX_STAGES", "SM90_EPILOGUE_SMEM"]

#: Streaming multiprocessors per architecture's flagship part (persistent grid size).
SM_COUNT = {"sm_80": 108, "sm_89": 128, "sm_90a": 132, "sm_100a": 148}
#: Architectures that run the warp-specialized kernel (TMA producer, MMA consumers; sm_90a: wgmma,
#: sm_100a: tcgen05 with the accumulator in tensor memory).
WARP_SPECIALIZED = ("sm_90a", "sm_100a")


@dataclass(frozen=True)
class GemmConfig:
    arch: str
    BM: int
    BN: int
    BK: int
    STAGES: int
    WARPS: int = 4           # sm_80 / sm_89
    CONSUMERS: int = 2       # sm_90a
    persistent: bool = False
    cluster: int = 1         # sm_90a: CTAs per cluster sharing the A tile by TMA multicast (1 or 2);
    #                          sm_100a: 2 = a pair of CTAs per tcgen05.mma (cta_group::2), BN the pair's N

    def consts(self, m: int = 0, n: int = 0) -> dict[str, int]:
        """The kernel's keyword constants (``GRID`` for a persistent Hopper kernel)."""
        if self.arch in WARP_SPECIALIZED:
            grid = 0
            if self.persistent:      # GRID: blocks, or for a pair of CTAs per MMA (sm_100a) pairs
                rows = self.BM * (self.cluster if self.arch == "sm_100a" else 1)
                slots = SM_COUNT[self.arch] // (self.cluster if self.arch == "sm_100a" else 1)
                tiles = -(-m // rows) * -(-n // self.BN) if m and n else slots
                grid = min(tiles, slots)
            out = {"BM": self.BM, "BN": self.BN, "BK": self.BK, "STAGES": self.STAGES,
                   "CONSUMERS": self.CONSUMERS, "GRID": grid}
            if self.cluster > 1:
                out["CLUSTER"] = self.cluster
            return out
        return {"BM": self.BM, "BN": self.BN, "BK": self.BK, "STAGES": self.STAGES, "WARPS": self.WARPS}

    def __str__(self) -> str:
        if self.arch in WARP_SPECIALIZED:
            p = " persistent" if self.persistent else ""
            c = f" cluster {self.cluster}" if self.cluster > 1 else ""
            return f"{self.BM}x{self.BN}x{self.BK} {self.STAGES} stages {self.CONSUMERS} consumers{p}{c}"
        return f"{self.BM}x{self.BN}x{self.BK} {self.STAGES} stages {self.WARPS} warps"


_SM80 = [
    GemmConfig("sm_80", 128, 128, 32, 3, 4),
    GemmConfig("sm_80", 128, 128, 64, 3, 8),
    GemmConfig("sm_80", 128, 64, 32, 4, 4),
    GemmConfig("sm_80", 64, 128, 32, 4, 4),
    GemmConfig("sm_80", 64, 64, 64, 4, 4),
    GemmConfig("sm_80", 16, 64, 64, 4, 2),
]
#: Most pipeline stages of a Hopper config (peers use 6-7; more buys no latency hiding).
SM90_MAX_STAGES = 7
#: Shared memory kept for the epilogue's staging of the output tile (a tile of at most
#: this many bytes, or sub-tiles of it), besides the pipeline stages.
SM90_EPILOGUE_SMEM = 32 << 10


def sm90_stages(bm: int, bn: int, bk: int, elem_bytes: int = 2) -> int:
    """Pipeline stages of a Hopper ``bm x bn x bk`` config from the shared-memory budget:
    ``(smem_per_block_max - min(bm*bn*elem_bytes, SM90_EPILOGUE_SMEM)) // stage_bytes``,
    with ``stage_bytes = (bm + bn) * bk * elem_bytes + 16`` (the A and B tiles and the
    stage's two 8-byte mbarriers), at most ``SM90_MAX_STAGES``; e.g. 227 KiB gives 6 stages
    for 128x128x64 bf16 (32 KiB each), 7 for 64x128x64, 4 for 128x256x64 (48 KiB each)."""
    from hexlayout.arch import get_arch

    budget = get_arch("sm_90a").smem_per_block_max - min(bm * bn * elem_bytes, SM90_EPILOGUE_SMEM)
    stages = budget // ((bm + bn) * bk * elem_bytes + 16)
    if stages < 2:
        raise ValueError(f"hexlayout gemm: a {bm}x{bn}x{bk} sm_90a tile leaves room for {stages} "
                         "pipeline stage(s) in shared memory; at least 2 are needed")
    return min(stages, SM90_MAX_STAGES)


def _sm90(bm: int, bn: int, consumers: int, persistent: bool = False, cluster: int = 1) -> GemmConfig:
    return GemmConfig("sm_90a", bm, bn, 64, sm90_stages(bm, bn, 64), CONSUMERS=consumers,
                      persistent=persistent, cluster=cluster)


# Consumers keep their 64 x BN (128x256) or 2 x 64 x 128 (256x128) fp32 accumulators under
# the 232 registers setmaxnreg gives them (ptxas: highest register R151 / R154, no spills).
_SM90 = [
    _sm90(128, 128, 2, persistent=True),
    _sm90(128, 128, 2),
    _sm90(64, 128, 1),
    _sm90(64, 64, 1),
    _sm90(128, 256, 2),
    _sm90(256, 128, 2),
    # 2-CTA clusters multicasting A (each CTA loads 64 of its 128 rows): ptxas R153 in the
    # consumers, no spills, no C7515, 45 non-MMA per k-tile (the non-cluster 128x256: 40);
    # in the autotuned space, not chosen by the heuristic (no GPU timing against the
    # persistent 128x128 yet)
    _sm90(128, 256, 2, cluster=2),
]

def _sm100(bm: int, bn: int, consumers: int, persistent: bool = False, cluster: int = 1) -> GemmConfig:
    # the shared-memory budget of sm_100a is sm_90a's (227 KiB per block); a CTA of a pair
    # stages half of the pair's B tile
    return GemmConfig("sm_100a", bm, bn, 64, sm90_stages(bm, bn // cluster, 64), CONSUMERS=consumers,
                      persistent=persistent, cluster=cluster)


# sm_100a: the accumulator lives in tensor memory (BN columns); the consumer warp groups only
# hold it in registers for the epilogue (BM*BN/(128*CONSUMERS) f32 each: 128 at most). One CTA
# per MMA (cta_group::1: BM 64 or 128). The order of the sm_90a space, so that the heuristic
# picks by the same indices.
_SM100 = [
    _sm100(128, 128, 1, persistent=True),
    _sm100(128, 128, 1),
    _sm100(64, 128, 1),
    _sm100(64, 64, 1),
    _sm100(128, 256, 2),
    # a pair of CTAs per MMA (cta_group::2): the pair computes 256x256, each CTA 128x256 from its
    # 128 rows of A and 128 of B's 256 rows: 32 KiB staged per k-tile (the one-CTA 128x256: 48 KiB,
    # 128x128: 32 KiB for half the outputs), 6 stages, and one MMA instruction for both CTAs
    _sm100(128, 256, 2, cluster=2),
    _sm100(128, 256, 2, persistent=True, cluster=2),     # GRID pairs walk the 256x256 tiles
]

#: The shipped config space per architecture.
CONFIGS: dict[str, list[GemmConfig]] = {
    "sm_80": _SM80,
    "sm_89": [GemmConfig("sm_89", c.BM, c.BN, c.BK, c.STAGES, c.WARPS) for c in _SM80],
    "sm_90a": _SM90,
    "sm_100a": _SM100,
}


def choose_config(arch: str, m: int, n: int, k: int) -> GemmConfig:
    """The heuristic choice for an ``m x n x k`` problem."""
    if arch not in CONFIGS:
        raise ValueError(f"hexlayout gemm: unsupported architecture {arch!r}; "
                         f"supported: {', '.join(CONFIGS)}")
    space = CONFIGS[arch]
    if arch in WARP_SPECIALIZED:
        if m <= 64:
            return space[2] if n >= 128 else space[3]
        tiles = -(-m // 128) * -(-n // 128)
        if arch == "sm_100a" and tiles > SM_COUNT[arch] and n >= 256:
            # more 128x128 tiles than SMs: persistent pairs walking 256x256 tiles fill every SM,
            # and per output each CTA stages half the bytes of a one-CTA 128x128 tile
            return space[6]
        return space[0] if tiles > SM_COUNT[arch] else space[1]
    if m <= 16:
        return space[5]
    if m <= 64:
        return space[3] if n >= 128 else space[4]
    if k >= 4096 and m * n >= 4096 * 4096:
        return space[1]
    return space[0] if n >= 128 else space[2]


def _bucket(m: int, n: int, k: int) -> str:
    def up(x: int) -> int:
        return 1 << max(0, (x - 1).bit_length())

    return f"{up(m)}x{n}x{k}"


#: An entry's key as ``tune`` writes it: the op's key (``gemm/<dtype>/<b layout>/<activation>/
#: <epilogue flags>`` from ``gemm.py``: ``gemm`` and names) and the shape bucket ``<M>x<N>x<K>``
#: (``_bucket``).
_ENTRY_KEY = re.compile(r"gemm(?:/[\w.]+)+/(?P<m>[1-9]\d*)x[1-9]\d*x[1-9]\d*")


def _valid_key(key: Any) -> bool:
    """``key`` is one ``Autotuner.tune`` writes (its M a power-of-two bucket)."""
    if type(key) is not str or len(key) > 200:
        return False
    hit = _ENTRY_KEY.fullmatch(key)
    return hit is not None and (int(hit["m"]) & (int(hit["m"]) - 1)) == 0


#: Version of the persisted autotuning file.
AUTOTUNE_FORMAT = 2
#: At most this often (seconds) a lookup checks whether the file changed on disk.
REFRESH_SECONDS = 1.0
_MAX_FILE_BYTES = 16 << 20
_CONFIG_FIELDS = {f.name: f.type for f in fields(GemmConfig)}


def _digest(entries: dict[str, Any]) -> str:
    return hashlib.sha256(json.dumps(entries, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def _parse_config(raw: Any) -> GemmConfig | None:
    """The ``GemmConfig`` of a persisted entry when it is one of the shipped configs, else ``None``."""
    if type(raw) is not dict:
        return None
    raw = {"cluster": 1, **raw}        # entries persisted before configs had a cluster size
    if set(raw) != set(_CONFIG_FIELDS):
        return None
    for name, value in raw.items():
        want = bool if name == "persistent" else str if name == "arch" else int
        if type(value) is not want:
            return None
    cfg = GemmConfig(**raw)
    return cfg if cfg in CONFIGS.get(cfg.arch, ()) else None


class _Table:
    """The validated contents of one autotuning file, shared by every ``Autotuner`` of its path."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.raw: dict[str, Any] = {}              # as persisted (validated entries only)
        self.configs: dict[str, GemmConfig] = {}
        self.stamp: tuple[int, int, int] | None = None
        self.checked = -math.inf
        self.generation = 0                        # bumped whenever ``configs`` may have changed
        self.lock = threading.Lock()

    def _stat(self) -> tuple[int, int, int] | None:
        try:
            st = self.path.stat()
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def refresh(self, force: bool = False) -> None:
        """Re-read the file when it changed (checked at most every ``REFRESH_SECONDS``)."""
        now = time.monotonic()
        if not force and now - self.checked < REFRESH_SECONDS:
            return
        self.checked = now
        stamp = self._stat()
        if stamp == self.stamp and not force:
            return
        self.stamp = stamp
        self.raw, self.configs = self._read() if stamp is not None else ({}, {})
        self.generation += 1

    def _refuse(self, why: str) -> tuple[dict[str, Any], dict[str, GemmConfig]]:
        from hexlayout.runtime.cache import warn_cache

        warn_cache(f"hexlayout: autotuning file {self.path} {why}; ignoring it (configs come from the "
                   "heuristic until it is tuned again)")
        return {}, {}

    def _read(self) -> tuple[dict[str, Any], dict[str, GemmConfig]]:
        from hexlayout.runtime.cache import trusted_dir, warn_cache

        if trusted_dir(self.path.parent) is None:
            return {}, {}
        try:
            with open(self.path, "rb") as f:
                data = f.read(_MAX_FILE_BYTES + 1)
        except OSError as e:
            return self._refuse(f"cannot be read ({e.strerror or e})")
        if len(data) > _MAX_FILE_BYTES:
            return self._refuse(f"is larger than {_MAX_FILE_BYTES} bytes")
        try:
            doc = json.loads(data)
        except (ValueError, RecursionError):
            return self._refuse("is not valid JSON (damaged)")
        if type(doc) is not dict or doc.get("format") != AUTOTUNE_FORMAT:
            return self._refuse(f"is not an autotuning file of format {AUTOTUNE_FORMAT} (an older hexlayout "
                                "wrote it, or it is damaged)")
        entries = doc.get("entries")
        if type(entries) is not dict or type(doc.get("sha256")) is not str:
            return self._refuse("does not have the expected fields (entries, sha256)")
        if _digest(entries) != doc["sha256"]:
            return self._refuse("does not match its checksum (damaged or edited)")
        raw: dict[str, Any] = {}
        configs: dict[str, GemmConfig] = {}
        for key, e in entries.items():
            if not _valid_key(key):
                warn_cache(f"hexlayout: autotuning file {self.path}: entry {key!r:.100} does not have a "
                           "key hexlayout writes (gemm/<dtype>/<b_layout>/<activation>/<epilogue>/"
                           "<M>x<N>x<K>, M a power of two; damaged or edited); ignoring it")
                continue
            cfg = _parse_config(e.get("config")) if type(e) is dict else None
            seconds = e.get("seconds") if type(e) is dict else None
            if cfg is None or type(seconds) is not float or not 0 < seconds < math.inf:
                warn_cache(f"hexlayout: autotuning file {self.path}: entry {key!r:.100} is not a shipped "
                           "config with a positive time; ignoring it")
                continue
            raw[key] = e
            configs[key] = cfg
        return raw, configs

    def store(self, key: str, entry: dict[str, Any], cfg: GemmConfig) -> None:
        """Add ``entry`` (merged with what the file holds now) and write the file atomically."""
        from hexlayout.runtime.cache import trusted_dir, write_atomic

        with self.lock:
            trusted = trusted_dir(self.path.parent, create=True) is not None
            with _file_lock(self.path) if trusted else contextlib.nullcontext():
                self.refresh(force=True)              # what other processes stored meanwhile
                self.raw[key] = entry
                self.configs[key] = cfg
                self.generation += 1
                doc = {"format": AUTOTUNE_FORMAT, "entries": self.raw, "sha256": _digest(self.raw)}
                if trusted and write_atomic(self.path, json.dumps(doc, indent=1, sort_keys=True).encode(),
                                            "autotuning file"):
                    self.stamp = self._stat()


@contextlib.contextmanager
def _file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock between processes (``flock`` on ``<path>.lock``) around a read-merge-
    write of ``path``; without ``fcntl`` or a lock file, no lock (the write is still atomic)."""
    try:
        import fcntl
        fd = os.open(f"{path}.lock", os.O_RDWR | os.O_CREAT, 0o600)
    except (ImportError, OSError):
        yield
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


_TABLES: dict[Path, _Table] = {}


def _table(path: Path) -> _Table:
    t = _TABLES.get(path)
    if t is None:
        t = _TABLES.setdefault(path, _Table(path))
    return t


def _default_path() -> Path:
    from hexlayout.runtime.cache import default_cache_dir

    return default_cache_dir() / "autotune.json"


_DEFAULT: tuple[Any, Autotuner] | None = None
_CACHE_ENV = "HEXLAYOUT_CACHE_DIR"
_ENVIRON_TYPE = type(os.environ)
try:                                      # the variable's key in os.environ's own (encoded) mapping
    _CACHE_ENV_RAW: Any = os.environ.encodekey(_CACHE_ENV)  # type: ignore[attr-defined]
except AttributeError:                    # pragma: no cover - an os.environ without encodekey
    _CACHE_ENV_RAW = None


def _cache_env() -> Any:
    """The value of ``HEXLAYOUT_CACHE_DIR`` as ``os.environ`` holds it (its encoded form, read
    without decoding when ``os.environ`` is the standard mapping: a dictionary lookup), or
    ``None``; any change of the variable through ``os.environ`` changes the answer."""
    env = os.environ
    if type(env) is _ENVIRON_TYPE and _CACHE_ENV_RAW is not None:
        return env._data.get(_CACHE_ENV_RAW)  # type: ignore[attr-defined]
    return env.get(_CACHE_ENV)


def autotuner() -> Autotuner:
    """The process's ``Autotuner`` of ``$HEXLAYOUT_CACHE_DIR/autotune.json`` (reused while the
    variable keeps its value; the value is compared on each call, not re-parsed)."""
    global _DEFAULT
    env = _cache_env()
    hit = _DEFAULT
    if hit is None or hit[0] != env:
        hit = _DEFAULT = (env, Autotuner())
    return hit[1]


def tuning_token() -> tuple[Any, int]:
    """A value that changes whenever the persisted choice of a config may change: the autotuning
    table in use (``HEXLAYOUT_CACHE_DIR``) and its generation (bumped when the file is re-read
    or a result stored; the file is checked at most every ``REFRESH_SECONDS``). Callers memoize
    config choices under it."""
    hit, env = _DEFAULT, os.environ
    raw = env._data.get(_CACHE_ENV_RAW) if type(env) is _ENVIRON_TYPE and _CACHE_ENV_RAW is not None \
        else env.get(_CACHE_ENV)  # type: ignore[attr-defined]
    t = (hit[1] if hit is not None and hit[0] == raw else autotuner())._table
    if time.monotonic() - t.checked >= REFRESH_SECONDS:
        t.refresh()
    return (t, t.generation)


class Autotuner:
    """Time each config with ``timer(config) -> seconds`` and remember the fastest per
    (key, shape bucket); ``M`` is bucketed to the next power of two. The persisted file is
    validated and loaded once per process (see the module docstring)."""

    def __init__(self, path: str | os.PathLike[str] | None = None, stream: Any = None) -> None:
        self.path = Path(path) if path is not None else _default_path()
        self.stream = stream if stream is not None else sys.stderr
        self._table = _table(self.path)

    def lookup(self, key: str, m: int, n: int, k: int) -> GemmConfig | None:
        """The persisted winner for ``key`` and the shape's bucket, or ``None``."""
        t = self._table
        if time.monotonic() - t.checked >= REFRESH_SECONDS:
            t.refresh()
        return t.configs.get(f"{key}/{_bucket(m, n, k)}")

    def generation(self) -> int:
        """A number that changes whenever a lookup may answer differently (the file was
        re-read or a result was stored); callers memoize lookups under it."""
        t = self._table
        if time.monotonic() - t.checked >= REFRESH_SECONDS:
            t.refresh()
        return t.generation

    def tune(self, key: str, m: int, n: int, k: int, configs: list[GemmConfig],
             timer: Callable[[GemmConfig], float]) -> GemmConfig:
        """Time ``configs`` (skipping ones that fail to build), persist and return the fastest
        (persisted only when it is a config of the shipped space, ``CONFIGS``: a file entry
        outside it is refused on reading)."""
        full = f"{key}/{_bucket(m, n, k)}"
        if not _valid_key(full):             # it would be dropped on reading
            raise ValueError(f"autotune: {full!r} is not an autotuning key (gemm/<names>/<M>x<N>x<K>)")
        best: tuple[float, GemmConfig] | None = None
        results = []
        for i, cfg in enumerate(configs):
            bar = "#" * (20 * (i + 1) // len(configs))
            try:
                t = float(timer(cfg))
            except Exception as e:  # noqa: BLE001 - a config that cannot run is skipped, and said so
                results.append({"config": asdict(cfg), "error": f"{type(e).__name__}: {e}"})
                print(f"\rautotune {key} {m}x{n}x{k} [{bar:<20}] {i + 1}/{len(configs)} {cfg}: failed",
                      file=self.stream, flush=True)
                continue
            results.append({"config": asdict(cfg), "seconds": t})
            print(f"\rautotune {key} {m}x{n}x{k} [{bar:<20}] {i + 1}/{len(configs)} {cfg}: {t * 1e6:.1f} us",
                  file=self.stream, flush=True)
            if (best is None or t < best[0]) and 0 < t < math.inf:
                best = (t, cfg)
        if best is None:
            raise RuntimeError(f"autotune {key} {m}x{n}x{k}: every config failed: {results}")
        entry = {"config": asdict(best[1]), "seconds": best[0], "tried": results}
        if _parse_config(entry["config"]) is not None:
            self._table.store(full, entry, best[1])
        return best[1]
