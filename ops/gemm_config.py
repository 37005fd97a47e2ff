"""GEMM configurations: the hardware-centric config space, shape heuristics, an autotuner.

A ``GemmConfig`` fixes the tile constants of one schedule:

- sm_80 / sm_89 (``gemm_sm80_kernel``): block tile ``BM x BN``, k-tile ``BK``, pipeline
  ``STAGES``, ``WARPS`` warps (the warp arrangement is synthesized);
- sm_90a (``gemm_sm90_kernel``): ``BM x BN`` per block, ``BK``, ``STAGES``,
  ``CONSUMERS`` consumer warp groups (plus one producer), ``persistent`` blocks walking
  the tiles (``GRID`` = number of SMs) or one block per tile.

``choose_config(arch, m, n, k)`` is the heuristic: small ``M`` (decode-like) shapes get
short tiles, large ones the big tiles; Hopper goes persistent when there are more tiles
than SMs. ``Autotuner`` times every config of the space with a caller-given timer (CUDA
events on a GPU), shows a progress bar, and persists the winner per shape bucket in
``$HEXLAYOUT_CACHE_DIR/autotune.json``.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

__all__ = ["GemmConfig", "CONFIGS", "choose_config", "Autotuner", "SM_COUNT"]

#: Streaming multiprocessors per architecture's flagship part (persistent grid size).
SM_COUNT = {"sm_80": 108, "sm_89": 128, "sm_90a": 132}


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

    def consts(self, m: int = 0, n: int = 0) -> dict[str, int]:
        """The kernel's keyword constants (``GRID`` for a persistent Hopper kernel)."""
        if self.arch == "sm_90a":
            grid = 0
            if self.persistent:
                tiles = -(-m // self.BM) * -(-n // self.BN) if m and n else SM_COUNT[self.arch]
                grid = min(tiles, SM_COUNT[self.arch])
            return {"BM": self.BM, "BN": self.BN, "BK": self.BK, "STAGES": self.STAGES,
                    "CONSUMERS": self.CONSUMERS, "GRID": grid}
        return {"BM": self.BM, "BN": self.BN, "BK": self.BK, "STAGES": self.STAGES, "WARPS": self.WARPS}

    def __str__(self) -> str:
        if self.arch == "sm_90a":
            p = " persistent" if self.persistent else ""
            return f"{self.BM}x{self.BN}x{self.BK} {self.STAGES} stages {self.CONSUMERS} consumers{p}"
        return f"{self.BM}x{self.BN}x{self.BK} {self.STAGES} stages {self.WARPS} warps"


_SM80 = [
    GemmConfig("sm_80", 128, 128, 32, 3, 4),
    GemmConfig("sm_80", 128, 128, 64, 3, 8),
    GemmConfig("sm_80", 128, 64, 32, 4, 4),
    GemmConfig("sm_80", 64, 128, 32, 4, 4),
    GemmConfig("sm_80", 64, 64, 64, 4, 4),
    GemmConfig("sm_80", 16, 64, 64, 4, 2),
]
# 128x256 tiles (64x256 fp32 accumulators per consumer warp group) spill under the 168
# registers per thread a 384-thread block starts with; they stay out until the register
# budget after setmaxnreg is used by the compiler.
_SM90 = [
    GemmConfig("sm_90a", 128, 128, 64, 4, CONSUMERS=2, persistent=True),
    GemmConfig("sm_90a", 128, 128, 64, 4, CONSUMERS=2),
    GemmConfig("sm_90a", 64, 128, 64, 4, CONSUMERS=1),
    GemmConfig("sm_90a", 64, 64, 64, 4, CONSUMERS=1),
]

#: The shipped config space per architecture.
CONFIGS: dict[str, list[GemmConfig]] = {
    "sm_80": _SM80,
    "sm_89": [GemmConfig("sm_89", c.BM, c.BN, c.BK, c.STAGES, c.WARPS) for c in _SM80],
    "sm_90a": _SM90,
}


def choose_config(arch: str, m: int, n: int, k: int) -> GemmConfig:
    """The heuristic choice for an ``m x n x k`` problem."""
    if arch not in CONFIGS:
        raise ValueError(f"hexlayout gemm: unsupported architecture {arch!r}; "
                         f"supported: {', '.join(CONFIGS)}")
    space = CONFIGS[arch]
    if arch == "sm_90a":
        if m <= 64:
            return space[2] if n >= 128 else space[3]
        tiles = -(-m // 128) * -(-n // 128)
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


class Autotuner:
    """Time each config with ``timer(config) -> seconds`` and remember the fastest per
    (key, shape bucket); ``M`` is bucketed to the next power of two."""

    def __init__(self, path: str | os.PathLike[str] | None = None, stream: Any = None) -> None:
        if path is None:
            base = os.environ.get("HEXLAYOUT_CACHE_DIR") or os.path.join(Path.home(), ".cache", "hexlayout")
            path = os.path.join(base, "autotune.json")
        self.path = Path(path)
        self.stream = stream if stream is not None else sys.stderr
        self._table: dict[str, Any] | None = None

    def _load(self) -> dict[str, Any]:
        if self._table is None:
            try:
                self._table = json.loads(self.path.read_text())
            except (OSError, ValueError):
                self._table = {}
        return self._table

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, prefix=".autotune-")
        with os.fdopen(fd, "w") as f:
            json.dump(self._load(), f, indent=1, sort_keys=True)
        os.replace(tmp, self.path)

    def lookup(self, key: str, m: int, n: int, k: int) -> GemmConfig | None:
        hit = self._load().get(f"{key}/{_bucket(m, n, k)}")
        return GemmConfig(**hit["config"]) if hit else None

    def tune(self, key: str, m: int, n: int, k: int, configs: list[GemmConfig],
             timer: Callable[[GemmConfig], float]) -> GemmConfig:
        """Time ``configs`` (skipping ones that fail to build), persist and return the fastest."""
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
            if best is None or t < best[0]:
                best = (t, cfg)
        if best is None:
            raise RuntimeError(f"autotune {key} {m}x{n}x{k}: every config failed: {results}")
        self._load()[f"{key}/{_bucket(m, n, k)}"] = {"config": asdict(best[1]), "seconds": best[0],
                                                     "tried": results}
        self._save()
        return best[1]
