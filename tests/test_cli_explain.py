"""``hexlayout explain``: text, JSON (docs/explain-json.md), pictures, diagnostics; the kernel registry.

The text outputs come from subprocess runs of ``python -m hexlayout`` (one per architecture,
shared by the tests through module fixtures); the rest runs ``main([...])`` in process.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

from hexlayout.cli import CLIError, main
from hexlayout.cli.kernels import parse_define, resolve

ROOT = Path(__file__).resolve().parents[1]

TOP_KEYS = {"version", "kernel", "spec", "arch", "source", "constants", "threads", "grid", "smem_bytes",
            "seconds", "trace_seconds", "tensors", "ops", "shared", "decisions", "cost", "requirements",
            "offline", "notes", "pictures", "stats", "tmem"}
TENSOR_KEYS = {"name", "scope", "dtype", "shape", "layout", "kind", "view_of", "offset", "file", "line",
               "code"}
OP_KEYS = {"op", "file", "line", "code", "operands", "instruction", "alternatives"}
ALT_KEYS = {"what", "status", "reason", "cost"}
SHARED_KEYS = {"name", "dtype", "shape", "layout", "swizzle", "swizzle_bytes", "swizzle_description",
               "offset_bytes", "bytes", "note", "file", "line", "alternatives"}
COST_KEYS = {"total", "issue", "smem_wavefronts", "bank_conflicts", "gmem_sectors"}
REQ_KEYS = {"param", "kind", "value", "mode", "reason"}

BAD_KERNEL = textwrap.dedent('''\
    import hexlayout.lang as hl
    from hexlayout.lang import f16, f32

    M, N, K = hl.dims("M N K")


    @hl.kernel(threads=128)
    def bad(a: f16[M, K], b: f16[N, K], c: f32[M, N]):
        ra = hl.register(f16, (64, 64))
        rb = hl.register(f16, (64, 64))
        hl.copy(hl.view(a, tile=(64, 64), origin=(0, 0)), ra)
        hl.copy(hl.view(b, tile=(64, 64), origin=(0, 0)), rb)
        acc = hl.zeros((64, 64), f32)
        hl.mma(ra, rb, acc)
        acc2 = hl.zeros((64, 64), f32)
        hl.mma(rb, ra, acc2)
        hl.copy(acc + acc2, hl.view(c, tile=(64, 64), origin=(0, 0)))
    ''')


def _run(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "hexlayout", *args], capture_output=True, text=True,
                          timeout=300, cwd=cwd or ROOT)


def _main_json(capsys: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    assert main(["explain", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def sm80_text() -> str:
    out = _run("explain", "gemm", "--arch", "sm_80")
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def sm90_text() -> str:
    out = _run("explain", "gemm", "--arch", "sm_90a")
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.fixture(scope="module")
def sm80_json() -> dict[str, Any]:
    out = _run("explain", "gemm", "--arch", "sm_80", "--json")
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


# --- text ------------------------------------------------------------------------------------

def test_sm80_text_names_instructions_and_swizzle(sm80_text: str) -> None:
    assert "cp.async" in sm80_text
    assert "SM75_U32x4_LDSM_N" in sm80_text
    assert "SM80_16x8x16_F32F16F16F32_TN" in sm80_text
    assert re.search(r"Sw<\d,\d,\d>", sm80_text)
    for section in ("tensors", "operations and instructions", "shared memory", "predicted cost",
                    "decisions and alternatives", "requirements on the arguments"):
        assert section in sm80_text
    assert "gemm_sm80.py:53" in sm80_text            # the mma's source line
    assert "hl.mma(ra, rb, acc)" in sm80_text        # and its code
    assert re.search(r"synthesis\s+\d+\.\d+ s", sm80_text)
    assert "TV (((4,8)" in sm80_text                 # register TV layouts in CuTe notation


def test_sm90_text_names_tma_wgmma_and_128B_swizzle(sm90_text: str) -> None:
    assert "SM90_TMA_LOAD" in sm90_text
    assert re.search(r"SM90_64x\d+x16_F32F16F16_SS", sm90_text)
    assert "128-byte swizzle" in sm90_text
    assert "Sw<3,3,3>" in sm90_text


# --- JSON ------------------------------------------------------------------------------------

def test_json_has_documented_keys(sm80_json: dict[str, Any]) -> None:
    r = sm80_json
    assert set(r) == TOP_KEYS
    assert r["tmem"] == []          # tensor memory exists on sm_100a only
    assert r["kernel"] == "gemm_sm80" and r["arch"] == "sm_80" and r["spec"] == "gemm"
    assert r["constants"]["BM"] == 128 and r["threads"] == 128
    assert isinstance(r["seconds"], float) and r["seconds"] > 0
    assert r["tensors"] and all(set(t) == TENSOR_KEYS for t in r["tensors"])
    assert r["ops"] and all(set(o) == OP_KEYS for o in r["ops"])
    assert all(set(a) == ALT_KEYS for o in r["ops"] for a in o["alternatives"])
    assert r["shared"] and all(set(s) == SHARED_KEYS for s in r["shared"])
    assert set(r["cost"]) == COST_KEYS
    assert r["requirements"] and all(set(q) == REQ_KEYS for q in r["requirements"])
    statuses = {a["status"] for d in r["decisions"] for a in d["alternatives"]}
    assert statuses <= {"chosen", "legal", "rejected", "not tried"} and "chosen" in statuses


def test_json_is_consistent_with_text(sm80_json: dict[str, Any], sm80_text: str) -> None:
    r = sm80_json
    instrs = {o["instruction"] for o in r["ops"]}
    assert "cp.async.cg.16" in instrs and "SM75_U32x4_LDSM_N" in instrs
    mma = [o for o in r["ops"] if o["op"] == "mma"]
    assert len(mma) == 1 and "SM80_16x8x16_F32F16F16F32_TN" in mma[0]["instruction"]
    assert mma[0]["line"] == 53 and mma[0]["code"] == "hl.mma(ra, rb, acc)"
    for o in r["ops"]:
        assert o["instruction"] in sm80_text
    for t in r["tensors"]:
        assert t["layout"] and t["layout"] in sm80_text
        if t["scope"] == "register":
            assert t["kind"] == "tv"
    for s in r["shared"]:
        assert s["layout"] in sm80_text and s["swizzle"] and s["swizzle"] in s["layout"]
        assert s["swizzle_bytes"] == 64                  # Sw<2,3,3> on f16: 64-byte rows (BK = 32)
    assert f"total {r['cost']['total']:.0f}" in sm80_text
    assert r["cost"]["bank_conflicts"] == 0
    assert {q["param"] for q in r["requirements"]} == {"a", "b", "c"}


def test_json_sm90(capsys: pytest.CaptureFixture[str]) -> None:
    r = _main_json(capsys, "gemm", "--arch", "sm_90a")
    assert {o["instruction"] for o in r["ops"] if o["op"] == "copy"} >= {"SM90_TMA_LOAD"}
    assert all(s["swizzle_bytes"] == 128 for s in r["shared"])
    views = [t for t in r["tensors"] if t["kind"] == "view"]
    assert views and all(t["view_of"] in {"sa", "sb"} for t in views)


def test_attention_sm90a_is_the_hopper_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    """``explain attention --arch sm_90a`` shows the warp-specialized Hopper kernel (TMA loads into
    a K/V stage ring, wgmma from shared memory and with P from registers), not the mma.sync one."""
    assert main(["explain", "attention", "--arch", "sm_90a"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("kernel attention_varlen_sm90_f16 (attention) for sm_90a: 384 threads")
    assert "BM=128 BN=64 HEAD_DIM=64 STAGES=4" in text
    assert "wgmma" in text and "SM90_TMA_LOAD" in text
    assert "SM90_64x64x16_F32F16F16_SS" in text and "SM90_64x64x16_F32F16F16_RS" in text
    assert "SM80_16x8x16" not in text and "cp.async" not in text
    rk = resolve("attention", "sm_90a", {"HEAD_DIM": 128, "STAGES": 3})
    assert rk.constants["HEAD_DIM"] == 128 and "WARPS" not in rk.constants and "CAUSAL" not in rk.constants
    assert resolve("attention", "sm_80").constants["WARPS"] == 4


def test_attention_sm90a_defaults_are_the_ops_config() -> None:
    """The registered sm_90a constants are those the op launches for head size 64."""
    from hexlayout.ops.attention.kernels_sm90 import attention_varlen_sm90_consts

    from hexlayout.cli.kernels import REGISTRY

    want = attention_varlen_sm90_consts(64, False, False, False)
    assert REGISTRY["attention"].arch_defaults["sm_90a"] == want


# --- constants, registry, user kernels --------------------------------------------------------

def test_defines_reach_the_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    r = _main_json(capsys, "attention", "-D", "CAUSAL=true", "-D", "BM=64")
    assert r["kernel"] == "flash_attention_fwd"
    c = r["constants"]
    assert c["CAUSAL"] is True and c["BM"] == 64 and c["HEAD_DIM"] == 64
    assert any(o["op"] == "mma" for o in r["ops"])


@pytest.mark.parametrize(("text", "expected"), [
    ("BM=64", ("BM", 64)), ("X=0x10", ("X", 16)), ("CAUSAL=true", ("CAUSAL", True)),
    ("F=False", ("F", False)), ("S=0.5", ("S", 0.5)), ("N=abc", ("N", "abc")),
])
def test_parse_define(text: str, expected: tuple[str, Any]) -> None:
    assert parse_define(text) == expected


def test_parse_define_dtype() -> None:
    import hexlayout.lang as hl

    assert parse_define("dtype=bf16") == ("dtype", hl.bf16)


@pytest.mark.parametrize("bad", ["BM", "=3", "B M=3", "BM="])
def test_parse_define_rejects(bad: str) -> None:
    with pytest.raises(CLIError):
        parse_define(bad)


def test_registry_variants() -> None:
    assert resolve("gemm", "sm_80").kernel.name == "gemm_sm80"
    assert resolve("gemm", "sm_89").kernel.name == "gemm_sm80"
    assert resolve("gemm", "sm_90a").kernel.name == "gemm_sm90"
    assert resolve("flash_attention", "sm_80").kernel.name == "flash_attention_fwd"
    assert resolve("gemm_explicit", "sm_90a").kernel.name.startswith("gemm_sm90_ws")
    assert resolve("moe_wna16", "sm_80").kernel.name == "moe_wna16_gate_up_f16_w4_k64"
    assert resolve("moe_wna16", "sm_90a").kernel.name == "moe_wna16_gate_up_sm90_f16_w4_k64"


def test_unknown_kernel_lists_known(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["explain", "no_such_kernel"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("hexlayout explain: error: unknown kernel 'no_such_kernel'")
    for name in ("gemm", "attention", "flash_attention", "gemm_explicit"):
        assert name in err


def test_unknown_arch(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as e:
        main(["explain", "gemm", "--arch", "sm_70"])
    assert e.value.code == 2
    assert "sm_70" in capsys.readouterr().err


def test_module_attr_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    r = _main_json(capsys, "hexlayout.lang.examples.gemm_sm80:gemm_sm80", "-D", "BM=64")
    assert r["kernel"] == "gemm_sm80" and r["constants"]["BM"] == 64


def test_explicit_kernel(capsys: pytest.CaptureFixture[str]) -> None:
    r = _main_json(capsys, "gemm_explicit", "--arch", "sm_80")
    assert "SM75_U32x4_LDSM_N" in {o["instruction"] for o in r["ops"]}
    assert r["shared"][0]["swizzle"] == "Sw<2,3,3>"          # as written: Swizzle<log2(BK/8),3,3>
    # until synthesis accepts fully explicit programs the kernel is lowered as written (a note says so)
    assert r["cost"]["total"] is None or r["cost"]["total"] > 0


def test_file_kernel_and_contradiction(tmp_path: Path) -> None:
    path = tmp_path / "bad_kernel.py"
    path.write_text(BAD_KERNEL)
    out = _run("explain", f"{path}:bad", "--arch", "sm_80")
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert out.stderr.startswith("hexlayout explain: error:")
    assert "bad_kernel.py:14" in out.stderr and "bad_kernel.py:16" in out.stderr
    assert out.stdout == ""


def test_file_kernel_without_attr(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "one.py"
    path.write_text(BAD_KERNEL)
    assert main(["explain", str(path)]) == 1             # picks `bad`, which is contradictory
    err = capsys.readouterr().err
    assert "one.py:14" in err and "one.py:16" in err     # the diagnostic names this file's lines
    assert main(["explain", f"{path}:nothing"]) == 1
    assert "no attribute 'nothing'" in capsys.readouterr().err


# --- pictures --------------------------------------------------------------------------------

def test_draw_writes_pngs(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from PIL import Image

    r = _main_json(capsys, "gemm", "--arch", "sm_80", "--draw", str(tmp_path / "pics"))
    paths = [Path(p["path"]) for p in r["pictures"]]
    assert len(paths) >= 4
    assert any(p.name.startswith("reg_") for p in paths) and any(p.name.startswith("smem_") for p in paths)
    for p in paths:
        with Image.open(p) as im:
            im.verify()
            assert im.format == "PNG"
    assert sorted(paths) == sorted((tmp_path / "pics").glob("*.png"))


def test_sm100a_gemm_shows_and_draws_tensor_memory(capsys: pytest.CaptureFixture[str],
                                                   tmp_path: Path) -> None:
    """``explain gemm --arch sm_100a``: the tcgen05 atom, the accumulator's TMEM layout (row i in
    lane i, column j in column j), the tcgen05.ld chosen, and a picture of the tensor memory whose
    cell (lane, column) names the thread / register the load brings it to (32x32b: lane l of warp
    w is thread 32w + l; register v is column v)."""
    from hexlayout import draw as hd
    from hexlayout.arch.tmem import accumulator_layout
    from hexlayout.layout import Layout

    r = _main_json(capsys, "gemm", "--arch", "sm_100a", "-D", "BN=64", "-D", "CONSUMERS=1", "-D", "STAGES=2",
                   "--draw", str(tmp_path))
    assert r["kernel"].startswith("gemm_sm100_")
    (t,) = r["tmem"]
    assert t["atom"] == "SM100_128x64x16_F32F16F16_SS" and t["tmem_layout"] == "(128,64):(65536,1)"
    assert t["load"] == "tcgen05.ld.32x32b.x64" and t["threads"] == 128 and t["columns"] == 64
    assert any(p["path"].endswith("tmem_acc.png") and Path(p["path"]).stat().st_size > 0
               for p in r["pictures"])
    grid = hd.tmem_grid(accumulator_layout(128, 64), Layout((128, 64), (1, 128)), (128, 64), 64)
    assert grid.meta["threads"][37, 5] == 37 and grid.meta["values"][37, 5] == 5
    assert main(["explain", "gemm", "--arch", "sm_100a", "-D", "BN=64", "-D", "CONSUMERS=1", "-D",
                 "STAGES=2"]) == 0
    text = capsys.readouterr().out
    assert "tensor memory (tcgen05 accumulators" in text and "tcgen05.ld.32x32b.x64" in text
