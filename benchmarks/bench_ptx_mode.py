"""PTX mode against IR mode: the time of one op call in each emulator (a CPU benchmark).

    python benchmarks/bench_ptx_mode.py              # every family, results/ptx_mode.*
    python benchmarks/bench_ptx_mode.py --only moe   # families whose name contains "moe"

For each kernel family and architecture, one call of the serving op at a size no test uses
(ragged where the op allows it) runs under ``HEXLAYOUT_EMULATE=1`` (the IR emulator) and
``HEXLAYOUT_EMULATE=ptx`` (the PTX executor on NVRTC's PTX of the printed source), each
first once to build, compile and warm caches, then ``--runs`` times; the minimum is
reported, with the ratio. Target (issue 22): PTX mode at most 10x IR mode. Both runs are
checked against the same float64 / exact reference, so a fast wrong run is not reported.

Writes ``benchmarks/results/ptx_mode.json`` and ``.md`` (date, machine, versions).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

TARGET = 10.0


def _gemm() -> Callable[[], None]:
    from hexlayout.ops.gemm import gemm

    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(200, 264, generator=g).half(), torch.randn(330, 264, generator=g).half()
    bias = torch.randn(330, generator=g).half()
    ref = torch.relu(a.double() @ b.double().T + bias.double())

    def run() -> None:
        c = gemm(a, b, bias=bias, activation="relu")
        assert (c.double() - ref).abs().max() < 0.1

    return run


def _paged() -> Callable[[], None]:
    from hexlayout.ops.attention import paged_attention

    from tests.ops.test_paged_attention_op import _check, make_case, reference

    a = make_case(3, [1, 4, 2], [90, 33, 140], 8, 2, 64, 16, "HND", torch.float16)
    want = reference(a)

    def run() -> None:
        out, lse = paged_attention(**a, return_lse=True)
        _check(out, lse, want, a["q"].shape[0], 2e-3)

    return run


def _varlen() -> Callable[[], None]:
    from hexlayout.ops import attention_varlen

    from tests.ops.test_attention_varlen_op import _check, make_case, reference

    a = make_case(4, [37, 90], [37, 90], 4, 2, 64, torch.float16)
    want = reference(a, causal=True)

    def run() -> None:
        out, lse = attention_varlen(**a, causal=True, return_lse=True)
        _check(out, lse, want, a["q"].shape[0], 2e-3)

    return run


def _kv_cache() -> Callable[[], None]:
    from hexlayout.ops.kv_cache import reshape_and_cache

    from tests.ops.test_kv_cache import _caches, _reference

    g = torch.Generator().manual_seed(2)
    t, kvh, nb, bs, d = 45, 4, 6, 16, 128
    key, value = torch.randn(t, kvh, d, generator=g).half(), torch.randn(t, kvh, d, generator=g).half()
    slots = torch.randperm(nb * bs, generator=g)[:t]

    def run() -> None:
        kc, vc = _caches("NHD", nb, bs, kvh, d, torch.float16)
        want = _reference(kc, key, slots, "NHD")
        reshape_and_cache(key, value, kc, vc, slots)
        assert torch.equal(kc, want)

    return run


def _moe() -> Callable[[], None]:
    from hexlayout.ops import fused_moe

    from tests.ops.test_moe_op import close, make, reference

    x, w13, w2, tw, ids = make(37, 136, 80, 8, 2, torch.bfloat16, seed=3, experts_used=7)
    want = reference(x, w13, w2, tw, ids, "silu")

    def run() -> None:
        close(fused_moe(x, w13, w2, tw, ids, activation="silu"), want, torch.bfloat16)

    return run


def _wna16() -> Callable[[], None]:
    from tests.ops.test_moe_wna16 import _bound, _run

    def run() -> None:
        out, want = _run("awq", 4, 64, torch.float16, 9, 4, 2, "silu", "random", seed=21)
        assert (out.double() - want).abs().max().item() <= _bound(torch.float16) * want.abs().max().item()

    return run


def _fp8() -> Callable[[], None]:
    import hexlayout.ops
    from hexlayout.ops.moe.fp8 import prepare_fp8

    from tests.ops.test_moe_fp8 import check, make, reference

    x, w13, s13, w2, s2, tw, ids = make(2, 40, 128, 64, 4, 2, torch.bfloat16, True)
    p13, p2 = prepare_fp8(w13, s13, block=(128, 128)), prepare_fp8(w2, s2, block=(128, 128))
    want = reference(x, w13, s13, w2, s2, tw, ids, True, "silu")

    def run() -> None:
        check(hexlayout.ops.fused_moe(x, p13, p2, tw, ids, activation="silu"), *want)

    return run


FAMILIES: list[tuple[str, str, Callable[[], Callable[[], None]]]] = [
    ("gemm", "sm_80", _gemm),
    ("gemm", "sm_90a", _gemm),
    ("paged_attention", "sm_80", _paged),
    ("paged_attention", "sm_90a", _paged),
    ("attention_varlen", "sm_80", _varlen),
    ("attention_varlen", "sm_90a", _varlen),
    ("reshape_and_cache", "sm_80", _kv_cache),
    ("moe", "sm_80", _moe),
    ("moe", "sm_90a", _moe),
    ("moe_wna16", "sm_80", _wna16),
    ("moe_wna16", "sm_90a", _wna16),
    ("moe_fp8", "sm_89", _fp8),
    ("moe_fp8", "sm_90a", _fp8),
]


def _timed(run: Callable[[], None], mode: str, runs: int) -> float:
    os.environ["HEXLAYOUT_EMULATE"] = mode
    run()  # build, compile, warm caches
    best = float("inf")
    for _ in range(runs):
        t = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--only", default="")
    ap.add_argument("--runs", type=int, default=2)
    args = ap.parse_args()
    rows: list[dict[str, Any]] = []
    for fam, arch, make in FAMILIES:
        if args.only not in fam:
            continue
        os.environ["HEXLAYOUT_EMULATE_ARCH"] = arch
        run = make()
        ir = _timed(run, "1", args.runs)
        ptx = _timed(run, "ptx", args.runs)
        rows.append(
            {
                "family": fam,
                "arch": arch,
                "ir_s": round(ir, 3),
                "ptx_s": round(ptx, 3),
                "ratio": round(ptx / ir, 2),
            }
        )
        print(f"{fam:20s} {arch:7s} IR {ir:7.2f} s  PTX {ptx:7.2f} s  {ptx / ir:5.2f}x", flush=True)
    if args.only:
        return
    import numpy

    meta = {
        "date": datetime.date.today().isoformat(),
        "machine": platform.platform(),
        "cpu": platform.processor() or platform.machine(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "numpy": numpy.__version__,
        "target_ratio": TARGET,
    }
    out = ROOT / "benchmarks" / "results"
    (out / "ptx_mode.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    md = [
        f"# PTX mode against IR mode ({meta['date']})",
        "",
        f"Machine: {meta['machine']}; Python {meta['python']}, torch {meta['torch']}, numpy {meta['numpy']}.",
        f"One op call at a size no test uses, the best of {args.runs} after a warm-up; "
        f"target: PTX mode at most {TARGET:g}x IR mode. Written by `python benchmarks/bench_ptx_mode.py`.",
        "",
        "| family | arch | IR mode (s) | PTX mode (s) | PTX / IR |",
        "| --- | --- | ---: | ---: | ---: |",
    ]
    md += [
        f"| {r['family']} | {r['arch']} | {r['ir_s']:.2f} | {r['ptx_s']:.2f} | {r['ratio']:.2f}x |"
        for r in rows
    ]
    (out / "ptx_mode.md").write_text("\n".join(md) + "\n")


if __name__ == "__main__":
    main()
