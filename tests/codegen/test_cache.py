"""The compile cache: a second compile hits (in a new process too), a corrupted entry is
recompiled and never loaded, two processes compiling the same kernel at once both succeed;
compile errors point at the generated line and the kernel source line; a missing toolchain
says what to install."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from hexlayout.codegen import generate
from hexlayout.runtime import (
    CompileError,
    DiskCache,
    ToolchainError,
    clear_memory_cache,
    compile_cuda,
    compile_generated,
)

from .kernels import gemm_sm80

REPO = Path(__file__).resolve().parents[2]


def _unique_source() -> str:
    # a comment makes the key unique, so the first compile is a miss
    return f"// {uuid.uuid4()}\n" + generate(gemm_sm80()).source


@pytest.mark.nvrtc
def test_second_compile_hits_disk_then_memory(cache_dir: Path) -> None:
    src = _unique_source()
    first = compile_cuda(src, "sm_80", name="gemm_sm80")
    assert first.cache == "" and first.resources is not None
    entries = list(cache_dir.glob("kernels/*/*.hlk"))
    assert len(entries) == 1 and entries[0].stem == first.key
    clear_memory_cache()
    second = compile_cuda(src, "sm_80", name="gemm_sm80")
    assert second.cache == "disk" and second.cubin == first.cubin and second.ptx == first.ptx
    assert second.resources == first.resources and second.log == first.log
    third = compile_cuda(src, "sm_80", name="gemm_sm80")
    assert third.cache == "memory"
    assert second.seconds < first.seconds / 5
    # a different architecture or option is another entry
    assert compile_cuda(src, "sm_90a", name="gemm_sm80").cache == ""
    assert compile_cuda(src, "sm_80", ["-lineinfo"], name="gemm_sm80").cache == ""


@pytest.mark.nvrtc
@pytest.mark.parametrize("damage", ["truncate", "flip", "empty"])
def test_corrupted_entry_is_recompiled(cache_dir: Path, damage: str) -> None:
    src = _unique_source()
    first = compile_cuda(src, "sm_80")
    path = DiskCache().path(first.key)
    data = path.read_bytes()
    if damage == "truncate":
        path.write_bytes(data[: len(data) // 2])
    elif damage == "flip":
        path.write_bytes(data[:100] + bytes([data[100] ^ 0xFF]) + data[101:])
    else:
        path.write_bytes(b"")
    assert DiskCache().get(first.key) is None
    clear_memory_cache()
    again = compile_cuda(src, "sm_80")
    assert again.cache == "" and again.cubin == first.cubin
    assert DiskCache().get(first.key) is not None                 # rewritten whole


@pytest.mark.nvrtc
def test_two_processes_compiling_at_once_both_succeed(cache_dir: Path, tmp_path: Path) -> None:
    src_file = tmp_path / "k.cu"
    src_file.write_text(_unique_source())
    script = textwrap.dedent(f"""
        import hashlib, sys
        from hexlayout.runtime import compile_cuda
        ck = compile_cuda(open({str(src_file)!r}).read(), "sm_80", name="gemm_sm80")
        print(ck.cache or "compiled", hashlib.sha256(ck.cubin).hexdigest())
    """)
    env = {**os.environ, "HEXLAYOUT_CACHE_DIR": str(cache_dir), "PYTHONPATH": str(REPO)}
    procs = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    digests = {o.split()[1] for o, _ in outs}
    assert len(digests) == 1
    entries = list(cache_dir.glob("kernels/*/*"))
    assert len(entries) == 1 and entries[0].suffix == ".hlk"       # no temporary file left behind
    # a third process hits the disk cache
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=300)
    assert r.returncode == 0 and r.stdout.split()[0] == "disk", r.stderr
    assert time.perf_counter() - t0 < 30


@pytest.mark.nvrtc
@pytest.mark.nvcc
@pytest.mark.parametrize("backend", ["nvrtc", "nvcc"])
def test_compile_error_names_generated_and_kernel_lines(cache_dir: Path, backend: str) -> None:
    src = generate(gemm_sm80()).source
    assert "acc[v] = 0.0f;" in src
    bad = src.replace("acc[v] = 0.0f;", "acc[v] = no_such_value;")
    with pytest.raises(CompileError) as e:
        compile_cuda(bad, "sm_80", name="gemm_sm80", backend=backend)
    msg = str(e.value)
    assert "no_such_value" in msg and "generated line" in msg
    assert "from kernel source kernels_src.py:10  [fill]" in msg
    assert e.value.log and e.value.arch == "sm_80"


def test_missing_toolchain_says_what_to_install(monkeypatch: pytest.MonkeyPatch) -> None:
    import hexlayout.runtime.compile as comp

    monkeypatch.setattr(comp, "available_backends", lambda: [])
    with pytest.raises(ToolchainError, match=r"pip install 'hexlayout\[cuda\]'.*nvcc"):
        compile_cuda("extern \"C\" __global__ void k() {}", "sm_80", cache=False)


def test_unknown_arch_and_backend() -> None:
    with pytest.raises(ValueError, match="sm_70"):
        compile_cuda("", "sm_70")
    with pytest.raises(ValueError, match="backend"):
        compile_cuda("", "sm_80", backend="clang", cache=False)


@pytest.mark.nvrtc
def test_compile_generated_uses_the_kernels_arch(cache_dir: Path) -> None:
    g = generate(gemm_sm80())
    ck = compile_generated(g)
    assert ck.arch == "sm_80" and ck.name == "gemm_sm80"
