"""The persisted build cache: a new process loads the synthesized, compiled build instead of
redoing it; a damaged entry is rebuilt, never used; a different program gets another entry."""

from __future__ import annotations

import subprocess
import sys

import pytest

CODE = """
import json
from hexlayout.runtime import build
from hexlayout.lang.examples.explicit import gemm_sm80_explicit
b = build(gemm_sm80_explicit(BK={bk}), "sm_80", compile=False)
print(json.dumps(sorted(b.seconds), separators=(",", ":")), b.generated.name, len(b.generated.source))
"""


def _run(tmp_path, bk: int = 32) -> list[str]:
    out = subprocess.run([sys.executable, "-c", CODE.format(bk=bk)], capture_output=True, text=True,
                         env={**__import__("os").environ, "HEXLAYOUT_CACHE_DIR": str(tmp_path)}, timeout=300)
    assert out.returncode == 0, out.stderr
    return out.stdout.split(maxsplit=1)


@pytest.fixture
def cache(tmp_path):
    return tmp_path


def test_second_process_loads_the_build(cache) -> None:
    first = _run(cache)
    second = _run(cache)
    assert "synthesize" in first[0] and "load" not in first[0]
    assert "load" in second[0] and "synthesize" not in second[0]
    assert first[1] == second[1]                        # same kernel, same generated source length
    assert len(list((cache / "builds").glob("*.hlb"))) == 1


def test_damaged_entry_is_rebuilt(cache) -> None:
    _run(cache)
    (entry,) = (cache / "builds").glob("*.hlb")
    data = bytearray(entry.read_bytes())
    data[-10] ^= 0xFF
    entry.write_bytes(bytes(data))
    again = _run(cache)
    assert "synthesize" in again[0]
    assert len(list((cache / "builds").glob("*.hlb"))) == 1


def test_another_program_gets_another_entry(cache) -> None:
    _run(cache, 32)
    _run(cache, 64)
    assert len(list((cache / "builds").glob("*.hlb"))) == 2


# --- in process: what is read, what a damaged or forged entry does, what the key covers -------------

import hashlib  # noqa: E402
import json  # noqa: E402
import pickle  # noqa: E402
import struct  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

import hexlayout.runtime.cache as rc  # noqa: E402
import hexlayout.runtime.compile as rcomp  # noqa: E402
from hexlayout.lang.examples import gemm_sm80  # noqa: E402
from hexlayout.lang.examples.explicit import gemm_sm80_explicit  # noqa: E402
from hexlayout.runtime import CacheWarning, build, clear_builds, emulate  # noqa: E402
from hexlayout.runtime.build import build_key  # noqa: E402


@pytest.fixture
def fresh(tmp_path, monkeypatch):
    """An empty cache directory, empty in-process memos, warnings shown every time."""
    d = tmp_path / "cache"
    monkeypatch.setenv("HEXLAYOUT_CACHE_DIR", str(d))
    clear_builds()
    rcomp.clear_memory_cache()
    rc._WARNED.clear()
    yield d
    clear_builds()
    rcomp.clear_memory_cache()
    rc._WARNED.clear()


def _kernel():
    return gemm_sm80_explicit(BM=64, BN=64, BK=32)


def _entry(d: Path) -> Path:
    (entry,) = (d / "builds").glob("*.hlb")
    return entry


def _reseal(body: bytes) -> bytes:
    """An entry whose checksum matches ``body`` (what a forger with write access can do)."""
    return b"HLB2" + hashlib.sha256(body).digest() + body


def test_a_loaded_build_emulates_like_the_fresh_one(fresh) -> None:
    first = build(_kernel(), "sm_80", compile=False)
    clear_builds()
    loaded = build(_kernel(), "sm_80", compile=False)
    assert "load" in loaded.seconds and loaded is not first
    assert loaded.generated.source == first.generated.source
    chosen = [str(d.chosen) for d in first.synthesis.decisions]
    assert [str(d.chosen) for d in loaded.synthesis.decisions] == chosen
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(72, 40, generator=g).half(), torch.randn(100, 40, generator=g).half()
    c = torch.full((72, 100), float("nan"), dtype=torch.float16)
    emulate(loaded, a, b, c)
    torch.testing.assert_close(c.double(), a.double() @ b.double().T, rtol=1e-2, atol=1e-2)
    assert not _entry(fresh).read_bytes()[36:].count(b"\x80\x05")     # no pickle stream inside


def _damage_cases(data: bytes) -> dict[str, bytes]:
    body = data[36:]
    (n,) = struct.unpack_from("<I", body)
    head = json.loads(body[4:4 + n])
    rest = body[4 + n:]

    def with_head(**changes) -> bytes:
        h = json.dumps({**head, **changes}).encode()
        return _reseal(struct.pack("<I", len(h)) + h + rest)

    doc = rest[:head["document"]]
    evil = doc.replace(b'"hexlayout.runtime.build:Build"', b'"os:system"', 1)
    return {
        "flipped": data[:-10] + bytes([data[-10] ^ 0xFF]) + data[-9:],
        "truncated": data[: len(data) // 2],
        "empty": b"",
        "other key (resealed)": with_head(key="0" * 64),
        "size mismatch (resealed)": with_head(document=head["document"] + 1),
        "format (resealed)": with_head(format=1),
        "foreign class (resealed)": _reseal(struct.pack("<I", n) + body[4:4 + n] + evil + rest[len(doc):]),
        "old pickle format": b"HLB1" + hashlib.sha256(b"x").digest() + b"x",
    }


@pytest.mark.parametrize("case", ["flipped", "truncated", "empty", "other key (resealed)",
                                  "size mismatch (resealed)", "format (resealed)", "foreign class (resealed)",
                                  "old pickle format"])
def test_a_damaged_or_forged_entry_is_rebuilt_with_a_warning(fresh, case: str) -> None:
    build(_kernel(), "sm_80", compile=False)
    entry = _entry(fresh)
    entry.write_bytes(_damage_cases(entry.read_bytes())[case])
    clear_builds()
    with pytest.warns(CacheWarning, match=str(entry.name)):
        again = build(_kernel(), "sm_80", compile=False)
    assert "synthesize" in again.seconds and "load" not in again.seconds
    assert _entry(fresh).read_bytes()[:4] == b"HLB2"                    # rewritten whole


def test_a_pickle_payload_never_runs(fresh, tmp_path) -> None:
    marker = tmp_path / "pwned"
    build(_kernel(), "sm_80", compile=False)
    entry = _entry(fresh)
    payload = pickle.dumps(type("X", (), {"__reduce__": lambda self: (Path.touch, (marker,))})())
    for blob in (_reseal(payload), b"HLB1" + hashlib.sha256(payload).digest() + payload):
        entry.write_bytes(blob)
        clear_builds()
        rc._WARNED.clear()
        with pytest.warns(CacheWarning):
            build(_kernel(), "sm_80", compile=False)
        assert not marker.exists()


@pytest.mark.nvrtc
def test_a_new_compiler_version_changes_the_key_and_recompiles(fresh, monkeypatch) -> None:
    k = gemm_sm80
    first = build(k, "sm_80", BM=64, BN=64)
    assert "compile" in first.seconds
    tk = first.tile_kernel
    key_before = build_key(tk, "sm_80", True)
    real = rcomp._compiler_id
    monkeypatch.setattr(rcomp, "_compiler_id", lambda backend: real(backend).replace("nvrtc ", "nvrtc 99.", 1)
                        .replace("nvcc ", "nvcc 99.", 1))
    assert build_key(tk, "sm_80", True) != key_before
    assert build_key(tk, "sm_80", False) == build_key(tk, "sm_80", False)
    clear_builds()
    rcomp.clear_memory_cache()
    again = build(k, "sm_80", BM=64, BN=64)
    assert "compile" in again.seconds and "load" not in again.seconds
    assert again.compiled.cache == ""                                   # compiled, not served from kernels/
    assert len(list((fresh / "builds").glob("*.hlb"))) == 2
    assert len(list((fresh / "kernels").glob("*/*.hlk"))) == 2


def test_keys_cover_hexlayout_sources_compiler_options_and_program(fresh, monkeypatch) -> None:
    from hexlayout.runtime.cache import cache_key

    tk = _kernel().trace()
    tk64 = gemm_sm80_explicit(BM=64, BN=64, BK=64).trace()
    base = (build_key(tk, "sm_80", True), cache_key("src", "sm_80", "nvrtc 13.0", ("-O3",)))
    assert build_key(tk64, "sm_80", True) != base[0] and build_key(tk, "sm_90a", True) != base[0]
    assert cache_key("src", "sm_80", "nvrtc 13.1", ("-O3",)) != base[1]
    assert cache_key("src", "sm_80", "nvrtc 13.0", ("-O2",)) != base[1]
    with monkeypatch.context() as mp:                                    # other default options
        mp.setattr(sys.modules["hexlayout.runtime.build"], "DEFAULT_OPTIONS", ("-std=c++20",))
        assert build_key(tk, "sm_80", True) != base[0]
    with monkeypatch.context() as mp:                                    # another hexlayout version
        mp.setattr(rc, "_SOURCE_HASH", "0" * 64)
        assert build_key(tk, "sm_80", True) != base[0]
        assert cache_key("src", "sm_80", "nvrtc 13.0", ("-O3",)) != base[1]
    assert build_key(tk, "sm_80", True) == base[0]


def test_processes_building_one_entry_at_once_synthesize_it_once(cache) -> None:
    """Two processes that need the same missing entry at the same time: one builds it while
    the other waits on the entry's lock and loads what the first stored (xdist workers share
    their kernels instead of synthesizing each twice)."""
    import os

    env = {**os.environ, "HEXLAYOUT_CACHE_DIR": str(cache)}
    procs = [subprocess.Popen([sys.executable, "-c", CODE.format(bk=64)], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e for _, e in outs]
    kinds = sorted(o.split(maxsplit=1)[0] for o, _ in outs)
    assert sum("synthesize" in k for k in kinds) == 1 and sum("load" in k for k in kinds) == 1, kinds
    assert len(list((cache / "builds").glob("*.hlb"))) == 1
