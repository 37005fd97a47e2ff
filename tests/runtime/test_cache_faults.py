"""A cache that cannot be used never fails a compile, a build or a torch op: it warns once
(``CacheWarning``, naming the path) and goes on. A cache directory writable by other users
(or owned by another user) is refused the same way, so nobody else can plant code in it.

These tests run as root on this machine, where ``chmod`` does not stop writes; a read-only
directory and an undeletable entry are therefore simulated by making the OS calls raise
``PermissionError`` (``tempfile.mkstemp`` / ``Path.unlink``), which is what the kernel gives
a normal user there. A cache path that is a file, and one below a file, are real.
"""

from __future__ import annotations

import os
import tempfile
import uuid
import warnings
from pathlib import Path

import pytest
import torch

import hexlayout.runtime.cache as rc
from hexlayout.lang.examples.explicit import gemm_sm80_explicit
from hexlayout.runtime import CacheWarning, build, clear_builds, clear_memory_cache, compile_cuda

SRC = 'extern "C" __global__ void k(float* x) {{ x[threadIdx.x] = {v}f; }}\n'


@pytest.fixture(autouse=True)
def _fresh_memos():
    clear_builds()
    clear_memory_cache()
    rc._WARNED.clear()
    yield
    clear_builds()
    clear_memory_cache()
    rc._WARNED.clear()


def _src() -> str:
    return f"// {uuid.uuid4()}\n" + SRC.format(v=1.5)


def _cache_warnings(record: list[warnings.WarningMessage]) -> list[str]:
    return [str(w.message) for w in record if issubclass(w.category, CacheWarning)]


def _compile_twice(monkeypatch: pytest.MonkeyPatch, cache: Path) -> list[str]:
    monkeypatch.setenv("HEXLAYOUT_CACHE_DIR", str(cache))
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        for _ in range(2):
            ck = compile_cuda(_src(), "sm_80", name="k")
            assert ck.cubin and ck.cache == ""
    return _cache_warnings(record)


@pytest.mark.nvrtc
def test_cache_path_is_a_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "not-a-dir"
    f.write_text("x")
    msgs = _compile_twice(monkeypatch, f)
    assert len(msgs) == 1 and str(f) in msgs[0] and "not a directory" in msgs[0]
    assert f.read_text() == "x"


@pytest.mark.nvrtc
def test_cache_dir_cannot_be_created(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "file"
    f.write_text("x")
    msgs = _compile_twice(monkeypatch, f / "cache")                 # below a file
    assert len(msgs) == 1 and str(f / "cache") in msgs[0] and "Not a directory" in msgs[0]
    rc._WARNED.clear()
    monkeypatch.setattr(Path, "mkdir", _deny)                          # a parent we may not write
    msgs = _compile_twice(monkeypatch, tmp_path / "new")
    assert len(msgs) == 1 and str(tmp_path / "new") in msgs[0] and "cannot be created" in msgs[0]


def _deny(*args, **kwargs):
    raise PermissionError(13, "Permission denied")


@pytest.mark.nvrtc
def test_read_only_cache_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tempfile, "mkstemp", _deny)          # what a read-only directory answers
    msgs = _compile_twice(monkeypatch, tmp_path / "ro")
    assert len(msgs) == 2                                    # two entries, one warning each
    assert all("cannot write" in m and "Permission denied" in m and str(tmp_path / "ro") in m for m in msgs)
    assert not list((tmp_path / "ro").rglob("*.hlk"))


@pytest.mark.nvrtc
def test_damaged_entry_in_a_read_only_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_CACHE_DIR", str(tmp_path))
    src = _src()
    first = compile_cuda(src, "sm_80", name="k")
    (entry,) = tmp_path.glob("kernels/*/*.hlk")
    entry.write_bytes(entry.read_bytes()[:50])
    clear_memory_cache()
    monkeypatch.setattr(Path, "unlink", _deny)
    monkeypatch.setattr(tempfile, "mkstemp", _deny)
    with pytest.warns(CacheWarning, match="cannot be removed"):
        again = compile_cuda(src, "sm_80", name="k")
    assert again.cache == "" and again.cubin == first.cubin


@pytest.mark.parametrize("how", ["group-writable", "other-writable", "owned by another user"])
@pytest.mark.nvrtc
def test_cache_writable_by_others_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             how: str) -> None:
    d = tmp_path / "shared"
    d.mkdir()
    if how == "owned by another user":
        if os.geteuid() != 0:
            pytest.skip("only root can give a directory to another user")
        os.chown(d, 12345, 12345)
        os.chmod(d, 0o755)
    else:
        os.chmod(d, 0o770 if how == "group-writable" else 0o707)
    msgs = _compile_twice(monkeypatch, d)
    assert len(msgs) == 1 and str(d) in msgs[0] and "refusing" in msgs[0]
    assert ("uid 12345" if how.startswith("owned") else "writable by other users") in msgs[0]
    assert not list(d.rglob("*.hlk"))


@pytest.mark.nvrtc
def test_forged_entry_in_a_group_writable_kernels_dir_is_not_served(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_CACHE_DIR", str(tmp_path))
    src = _src()
    compile_cuda(src, "sm_80", name="k")
    clear_memory_cache()
    os.chmod(tmp_path / "kernels", 0o775)        # someone in the group could now rewrite entries
    with pytest.warns(CacheWarning, match="writable by other users"):
        again = compile_cuda(src, "sm_80", name="k")
    assert again.cache == ""


def test_torch_op_and_build_with_a_read_only_damaged_build_cache(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    import hexlayout.ops  # noqa: F401 - registers torch.ops.hexlayout.gemm

    monkeypatch.setenv("HEXLAYOUT_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    kernel = gemm_sm80_explicit(BM=64, BN=64)
    build(kernel, "sm_80", compile=False)
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(24, 32, generator=g).half(), torch.randn(40, 32, generator=g).half()
    torch.ops.hexlayout.gemm(a, b)
    entries = list(tmp_path.glob("builds/*.hlb"))
    assert len(entries) >= 2
    for e in entries:
        e.write_bytes(e.read_bytes()[:-7] + b"garbage")
    clear_builds()
    monkeypatch.setattr(Path, "unlink", _deny)                 # what a read-only directory answers
    monkeypatch.setattr(tempfile, "mkstemp", _deny)
    with warnings.catch_warnings(record=True) as record:
        warnings.simplefilter("always")
        bld = build(kernel, "sm_80", compile=False)           # reads its damaged entry
        c = torch.ops.hexlayout.gemm(a, b)                    # whatever it reads, it must not die
    msgs = _cache_warnings(record)
    assert "synthesize" in bld.seconds
    assert any("cannot be removed" in m and "Permission denied" in m for m in msgs), msgs
    torch.testing.assert_close(c.double(), a.double() @ b.double().T, rtol=1e-2, atol=1e-2)
    # and build() with the cache path a file
    f = tmp_path / "file"
    f.write_text("")
    monkeypatch.setenv("HEXLAYOUT_CACHE_DIR", str(f))
    clear_builds()
    with pytest.warns(CacheWarning, match=str(f)):
        bld = build(kernel, "sm_80", compile=False)
    assert "synthesize" in bld.seconds


@pytest.mark.nvrtc
def test_cli_compile_with_an_unwritable_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    from hexlayout.cli import main

    f = tmp_path / "cache-is-a-file"
    f.write_text("")
    monkeypatch.setenv("HEXLAYOUT_CACHE_DIR", str(f))
    out = tmp_path / "k.cubin"
    with pytest.warns(CacheWarning, match=str(f)):
        rc_ = main(["compile", "gemm_explicit", "--arch", "sm_80", "--emit", "cubin", "-o", str(out)])
    assert rc_ == 0, capsys.readouterr().err
    assert out.read_bytes()[:4] == b"\x7fELF"


def test_no_home_directory_falls_back_to_a_private_temporary_cache(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("HEXLAYOUT_CACHE_DIR", raising=False)

    def no_home() -> Path:
        raise RuntimeError("Could not determine home directory.")

    monkeypatch.setattr(Path, "home", staticmethod(no_home))
    d = rc.default_cache_dir()
    assert d.parent == Path(tempfile.gettempdir()) and str(os.getuid()) in d.name


@pytest.mark.nvrtc
def test_an_entry_copied_under_another_key_is_not_served(tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from hexlayout.runtime import DiskCache

    monkeypatch.setenv("HEXLAYOUT_CACHE_DIR", str(tmp_path))
    one, two = SRC.format(v=1.0), SRC.format(v=2.0)
    first = compile_cuda(one, "sm_80", name="k")
    second = compile_cuda(two, "sm_80", name="k")
    assert first.cubin != second.cubin
    cache = DiskCache()
    cache.path(second.key).write_bytes(cache.path(first.key).read_bytes())   # a valid entry, wrong name
    clear_memory_cache()
    with pytest.warns(CacheWarning, match="not of its key"):
        again = compile_cuda(two, "sm_80", name="k")
    assert again.cache == "" and again.cubin == second.cubin
    assert compile_cuda(one, "sm_80", name="k").cache == "disk"
