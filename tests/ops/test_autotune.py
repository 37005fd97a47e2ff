"""Persisted autotuning: the winner survives a new process; the file is validated (schema,
checksum, configs of the shipped space) and refused whole, with a warning, when damaged or
edited; it is read once per process and again only when it changes on disk."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
from hexlayout.ops.gemm import config as gc_mod
from hexlayout.ops.gemm.config import CONFIGS, Autotuner

import hexlayout.runtime.cache as rc
from hexlayout.runtime import CacheWarning

SPACE = CONFIGS["sm_80"]
KEY = "gemm/torch.float16/nk/none/000"


@pytest.fixture(autouse=True)
def _fresh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """A new 'process': no table loaded, no warning given yet, a private cache directory."""
    monkeypatch.setenv("HEXLAYOUT_CACHE_DIR", str(tmp_path / "cache"))
    gc_mod._TABLES.clear()
    rc._WARNED.clear()
    yield
    gc_mod._TABLES.clear()
    rc._WARNED.clear()


def _timer(fastest: int):
    """Seconds per config: the config at index ``fastest`` wins; one config fails to run."""
    def t(cfg):
        i = SPACE.index(cfg)
        if i == (fastest + 1) % len(SPACE):
            raise RuntimeError("does not fit")
        return 1e-4 * (1 + i) if i != fastest else 3e-5
    return t


def _tuned(fastest: int = 2) -> tuple[Autotuner, Path]:
    tuner = Autotuner(stream=io.StringIO())
    best = tuner.tune(KEY, 200, 256, 512, SPACE, _timer(fastest))
    assert best == SPACE[fastest]
    return tuner, tuner.path


def _new_process_lookup(m: int = 200) -> object:
    gc_mod._TABLES.clear()
    return Autotuner().lookup(KEY, m, 256, 512)


def test_winner_persists_and_is_found_for_the_bucket(tmp_path: Path) -> None:
    _, path = _tuned(2)
    assert path == tmp_path / "cache" / "autotune.json"
    assert _new_process_lookup(200) == SPACE[2]
    assert _new_process_lookup(129) == SPACE[2]            # same power-of-two bucket of M
    assert _new_process_lookup(257) is None
    doc = json.loads(path.read_text())
    assert doc["format"] == gc_mod.AUTOTUNE_FORMAT and len(doc["sha256"]) == 64
    (entry,) = doc["entries"].values()
    assert any("error" in r for r in entry["tried"])        # the failing config is recorded


def _edit(path: Path, fn, reseal: bool) -> None:
    doc = json.loads(path.read_text())
    fn(doc)
    if reseal:
        doc["sha256"] = gc_mod._digest(doc["entries"])
    path.write_text(json.dumps(doc))


@pytest.mark.parametrize(("case", "match"), [
    ("flip a digit of BM", "checksum"),
    ("flip a digit of the time", "checksum"),
    ("truncated", "not valid JSON"),
    ("old format (plain dict)", "format"),
    ("no checksum", "expected fields"),
])
def test_a_damaged_or_edited_file_is_refused_with_a_warning(case: str, match: str) -> None:
    _, path = _tuned(2)
    text = path.read_text()
    if case == "flip a digit of BM":
        _edit(path, lambda d: next(iter(d["entries"].values()))["config"].update(BM=64), reseal=False)
    elif case == "flip a digit of the time":
        _edit(path, lambda d: next(iter(d["entries"].values())).update(seconds=4e-5), reseal=False)
    elif case == "truncated":
        path.write_text(text[: len(text) // 2])
    elif case == "old format (plain dict)":
        path.write_text(json.dumps(json.loads(text)["entries"]))
    else:
        _edit(path, lambda d: d.pop("sha256"), reseal=False)
    with pytest.warns(CacheWarning, match=match) as rec:
        assert _new_process_lookup() is None
    assert str(path) in str(rec[0].message)


@pytest.mark.parametrize("change", [{"BM": 129}, {"BM": "128"}, {"arch": "sm_70"}, {"STAGES": 3.0},
                                    {"extra": 1}])
def test_an_entry_outside_the_config_space_is_dropped_even_with_a_valid_checksum(change: dict) -> None:
    _, path = _tuned(2)
    _edit(path, lambda d: next(iter(d["entries"].values()))["config"].update(change), reseal=True)
    with pytest.warns(CacheWarning, match="not a shipped config"):
        assert _new_process_lookup() is None


@pytest.mark.parametrize(("corrupt", "entry"), [
    ("key", "gemm/torch.float16/nk/none/000/2o0x256x512"),     # a damaged shape bucket
    ("key", "gemm/torch.float16/nk/none/000/200x256x512"),     # M not a power-of-two bucket
    ("key", "gemm/torch.float16/nk/none/\u0000\x00/256x256x512"),
    ("value", "not an entry"),
    ("config", None),
])
def test_a_corrupted_entry_is_dropped_with_a_warning_naming_file_and_entry(corrupt: str,
                                                                           entry: str | None) -> None:
    """Of two entries, the corrupted one (a key tune never writes, a value that is not an
    entry, no config; the checksum resealed, so only the entry is wrong) is dropped with a
    CacheWarning naming the file and the entry; the other is still used."""
    tuner, path = _tuned(2)
    tuner.tune(KEY, 1000, 256, 512, SPACE, _timer(3))
    bad = f"{KEY}/256x256x512"                                  # M = 200; 1000 is the good one

    def edit(d: dict) -> None:
        if corrupt == "key":
            d["entries"][entry] = d["entries"].pop(bad)
        elif corrupt == "value":
            d["entries"][bad] = entry
        else:
            del d["entries"][bad]["config"]

    _edit(path, edit, reseal=True)
    named = entry if corrupt == "key" else bad
    with pytest.warns(CacheWarning) as rec:
        assert _new_process_lookup() is None
    (w,) = [w for w in rec if issubclass(w.category, CacheWarning)]
    msg = str(w.message)
    assert str(path) in msg and repr(named)[:100] in msg and "ignoring it" in msg, msg
    gc_mod._TABLES.clear()
    rc._WARNED.clear()
    with pytest.warns(CacheWarning):
        assert Autotuner().lookup(KEY, 1000, 256, 512) == SPACE[3]


def test_tune_refuses_a_key_it_could_not_read_back() -> None:
    with pytest.raises(ValueError, match="not an autotuning key"):
        Autotuner(stream=io.StringIO()).tune("moe/x y", 64, 64, 64, SPACE, _timer(2))


def test_a_negative_time_is_dropped() -> None:
    _, path = _tuned(2)
    _edit(path, lambda d: next(iter(d["entries"].values())).update(seconds=-1.0), reseal=True)
    with pytest.warns(CacheWarning, match="positive time"):
        assert _new_process_lookup() is None


def test_read_once_per_process_and_again_only_when_the_file_changes(monkeypatch: pytest.MonkeyPatch) -> None:
    _tuned(2)
    gc_mod._TABLES.clear()
    reads = []
    real_read = gc_mod._Table._read
    monkeypatch.setattr(gc_mod._Table, "_read", lambda self: reads.append(1) or real_read(self))
    stats = []
    real_stat = gc_mod._Table._stat
    monkeypatch.setattr(gc_mod._Table, "_stat", lambda self: stats.append(1) or real_stat(self))
    for _ in range(1000):
        assert gc_mod.autotuner().lookup(KEY, 200, 256, 512) == SPACE[2]
    assert len(reads) == 1 and len(stats) == 1                 # not per call
    # another process writes a new winner: seen after REFRESH_SECONDS (0 here), read once
    other = json.loads(Autotuner().path.read_text())
    (k,) = other["entries"]
    other["entries"][k]["config"] = json.loads(json.dumps(gc_mod.asdict(SPACE[4])))
    other["sha256"] = gc_mod._digest(other["entries"])
    path = Autotuner().path
    path.write_text(json.dumps(other, indent=2))
    os.utime(path, ns=(1, 1))
    monkeypatch.setattr(gc_mod, "REFRESH_SECONDS", 0.0)
    assert gc_mod.autotuner().lookup(KEY, 200, 256, 512) == SPACE[4]
    assert gc_mod.autotuner().lookup(KEY, 200, 256, 512) == SPACE[4]
    assert len(reads) == 2


def test_tuning_with_an_unwritable_cache_still_returns_the_winner(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "file"
    f.write_text("")
    monkeypatch.setenv("HEXLAYOUT_CACHE_DIR", str(f))
    with pytest.warns(CacheWarning, match=str(f)):
        tuner, _ = _tuned(3)
    assert tuner.lookup(KEY, 200, 256, 512) == SPACE[3]         # kept in memory for this process


def test_a_group_writable_cache_dir_is_not_read(tmp_path: Path) -> None:
    _, path = _tuned(2)
    os.chmod(path.parent, 0o775)
    with pytest.warns(CacheWarning, match="writable by other users"):
        assert _new_process_lookup() is None


def test_processes_tuning_at_once_lose_no_result(tmp_path: Path) -> None:
    import subprocess
    import sys

    script = """
import io, sys
from hexlayout.ops.gemm.config import CONFIGS, Autotuner
space = CONFIGS["sm_80"]
for i in range(8):
    Autotuner(stream=io.StringIO()).tune(f"gemm/p{sys.argv[1]}/{i}", 64, 64, 64, space[:2],
                                         lambda cfg: 1e-5 if cfg == space[1] else 2e-5)
"""
    env = {**os.environ, "HEXLAYOUT_CACHE_DIR": str(tmp_path / "cache")}
    procs = [subprocess.Popen([sys.executable, "-c", script, str(p)], env=env, stderr=subprocess.PIPE,
                              text=True) for p in range(3)]
    for p in procs:
        assert p.wait(timeout=300) == 0, p.stderr.read()
    doc = json.loads((tmp_path / "cache" / "autotune.json").read_text())
    assert len(doc["entries"]) == 24 and doc["sha256"] == gc_mod._digest(doc["entries"])
    assert _new_process_lookup() is None                     # other keys; and the file validates
    assert Autotuner().lookup("gemm/p2/7", 64, 64, 64) == SPACE[1]
