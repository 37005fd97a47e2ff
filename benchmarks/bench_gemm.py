"""GEMM benchmark: hexlayout vs cuBLAS (torch.matmul) vs a Triton matmul, in one run.

Shapes: square 4096/8192, and the projection GEMMs of Llama-3-8B and Llama-3-70B (qkv, o,
gate_up, down) with M (tokens) in {1, 16, 128, 4096}. Each implementation is timed with
CUDA events (median of ``--iters`` after ``--warmup``, L2 flushed between iterations),
checked against torch.matmul first, and reported as TFLOP/s and as a ratio to cuBLAS.
Writes ``benchmarks/results/gemm_<device>.json`` / ``.md`` / ``.png``.

Needs a CUDA GPU (sm_80 / sm_89 / sm_90a), torch and (optionally) triton.
``python benchmarks/bench_gemm.py [--dtype bf16] [--quick]``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from timing import time_ms  # noqa: E402 - the sibling module, found when loaded by path too

RESULTS = Path(__file__).resolve().parent / "results"

LLAMA = {
    "llama3-8b": {"qkv": (6144, 4096), "o": (4096, 4096), "gate_up": (28672, 4096), "down": (4096, 14336)},
    "llama3-70b": {"qkv": (10240, 8192), "o": (8192, 8192), "gate_up": (57344, 8192), "down": (8192, 28672)},
}


def shapes(quick: bool) -> list[tuple[str, int, int, int]]:
    out = [("square", 4096, 4096, 4096), ("square", 8192, 8192, 8192)]
    ms = (16, 4096) if quick else (1, 16, 128, 4096)
    for model, projs in LLAMA.items():
        for name, (n, k) in projs.items():
            for m in ms:
                out.append((f"{model}.{name}", m, n, k))
    return out


def triton_matmul():  # pragma: no cover - GPU only
    import triton
    import triton.language as tl

    @triton.autotune(
        configs=[
            triton.Config({"BM": 128, "BN": 256, "BK": 64, "G": 8}, num_stages=3, num_warps=8),
            triton.Config({"BM": 128, "BN": 128, "BK": 64, "G": 8}, num_stages=4, num_warps=4),
            triton.Config({"BM": 64, "BN": 128, "BK": 64, "G": 8}, num_stages=4, num_warps=4),
            triton.Config({"BM": 16, "BN": 128, "BK": 128, "G": 1}, num_stages=4, num_warps=4),
        ],
        key=["M", "N", "K"],
    )
    @triton.jit
    def kernel(a, b, c, M, N, K, sam, sak, sbn, sbk, scm, scn, BM: tl.constexpr, BN: tl.constexpr,
               BK: tl.constexpr, G: tl.constexpr):
        pid = tl.program_id(0)
        grid_m = tl.cdiv(M, BM)
        grid_n = tl.cdiv(N, BN)
        group = pid // (G * grid_n)
        first_m = group * G
        size_m = min(grid_m - first_m, G)
        pm = first_m + (pid % (G * grid_n)) % size_m
        pn = (pid % (G * grid_n)) // size_m
        rm = pm * BM + tl.arange(0, BM)
        rn = pn * BN + tl.arange(0, BN)
        rk = tl.arange(0, BK)
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for k0 in range(0, tl.cdiv(K, BK)):
            kk = k0 * BK + rk
            x = tl.load(a + rm[:, None] * sam + kk[None, :] * sak,
                        mask=(rm[:, None] < M) & (kk[None, :] < K), other=0.0)
            y = tl.load(b + rn[None, :] * sbn + kk[:, None] * sbk,
                        mask=(rn[None, :] < N) & (kk[:, None] < K), other=0.0)
            acc += tl.dot(x, y)
        tl.store(c + rm[:, None] * scm + rn[None, :] * scn, acc.to(c.dtype.element_ty),
                 mask=(rm[:, None] < M) & (rn[None, :] < N))

    def run(a, b):
        import torch

        m, k = a.shape
        n = b.shape[0]
        c = torch.empty((m, n), dtype=a.dtype, device=a.device)
        grid = lambda meta: (triton.cdiv(m, meta["BM"]) * triton.cdiv(n, meta["BN"]),)  # noqa: E731
        kernel[grid](a, b, c, m, n, k, a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0),
                     c.stride(1))
        return c

    return run


def main() -> int:  # pragma: no cover - GPU only
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--no-triton", action="store_true")
    args = ap.parse_args()

    import hexlayout.ops  # noqa: F401 - registers torch.ops.hexlayout.*
    import torch

    if not torch.cuda.is_available():
        print("bench_gemm: needs a CUDA GPU", file=sys.stderr)
        return 2
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    tri = None
    if not args.no_triton:
        try:
            tri = triton_matmul()
        except Exception as e:  # noqa: BLE001 - report and go on without triton
            print(f"bench_gemm: triton unavailable: {e}", file=sys.stderr)
    dev = torch.cuda.get_device_name()
    rows = []
    for label, m, n, k in shapes(args.quick):
        a = torch.randn(m, k, dtype=dtype, device="cuda")
        b = torch.randn(n, k, dtype=dtype, device="cuda")
        ref = torch.matmul(a, b.t())
        impls = {"cublas": lambda a=a, b=b: torch.matmul(a, b.t()),
                 "hexlayout": lambda a=a, b=b: torch.ops.hexlayout.gemm(a, b)}
        if tri is not None:
            impls["triton"] = lambda a=a, b=b: tri(a, b)
        row = {"shape": label, "m": m, "n": n, "k": k}
        for name, fn in impls.items():
            try:
                out = fn()
                err = ((out.float() - ref.float()).abs().max() / (ref.float().abs().max() + 1)).item()
                ms = time_ms(fn, args.warmup, args.iters, cuda=True)
                row[name] = {"ms": ms, "tflops": 2 * m * n * k / ms / 1e9, "max_rel_err": err}
            except Exception as e:  # noqa: BLE001 - a failing implementation is reported, not fatal
                row[name] = {"error": f"{type(e).__name__}: {e}"}
        for name in ("hexlayout", "triton"):
            if "ms" in row.get(name, {}) and "ms" in row["cublas"]:
                row[name]["vs_cublas"] = row["cublas"]["ms"] / row[name]["ms"]
        rows.append(row)
        print(json.dumps(row), flush=True)
    meta = {"device": dev, "capability": torch.cuda.get_device_capability(), "torch": torch.__version__,
            "cuda": torch.version.cuda, "python": platform.python_version(), "dtype": args.dtype,
            "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")}
    try:
        import triton

        meta["triton"] = triton.__version__
    except ImportError:
        pass
    write_results(meta, rows)
    return 0


def write_results(meta: dict, rows: list[dict]) -> None:  # pragma: no cover - GPU only
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = f"gemm_{meta['device'].replace(' ', '_')}"
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    lines = [f"# GEMM {meta['dtype']} on {meta['device']} ({meta['date']})", "",
             f"torch {meta['torch']}, CUDA {meta['cuda']}, triton {meta.get('triton', '-')}", "",
             "| shape | M | N | K | cuBLAS TFLOP/s | hexlayout TFLOP/s | x cuBLAS | Triton TFLOP/s "
             "| x cuBLAS |",
             "|---|---|---|---|---|---|---|---|---|"]
    def f(r: dict, name: str, key: str) -> str:
        v = r.get(name, {}).get(key)
        return "-" if v is None else f"{v:.2f}"

    for r in rows:
        lines.append(f"| {r['shape']} | {r['m']} | {r['n']} | {r['k']} | {f(r, 'cublas', 'tflops')} | "
                     f"{f(r, 'hexlayout', 'tflops')} | {f(r, 'hexlayout', 'vs_cublas')} | "
                     f"{f(r, 'triton', 'tflops')} | {f(r, 'triton', 'vs_cublas')} |")
    (RESULTS / f"{stem}.md").write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(12, 5))
    ax = fig.add_subplot(1, 1, 1)
    labels = [f"{r['shape']}\nM={r['m']}" for r in rows]
    for j, name in enumerate(("cublas", "hexlayout", "triton")):
        vals = [r.get(name, {}).get("tflops", 0.0) for r in rows]
        ax.bar([i + 0.27 * (j - 1) for i in range(len(rows))], vals, width=0.27, label=name)
    ax.set_xticks(range(len(rows)))
    ax.set_xticklabels(labels, rotation=90, fontsize=6)
    ax.set_ylabel("TFLOP/s")
    ax.set_title(f"GEMM {meta['dtype']} on {meta['device']}")
    ax.legend()
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}.png", dpi=120)


if __name__ == "__main__":
    sys.exit(main())
