"""Dense FP8 GEMM benchmark: ``hexlayout.ops.gemm_fp8`` (e4m3, per-token-group activation scales,
128 x 128 weight block scales) against cuBLAS and the block-FP8 peers, in one run.

``c[m, n] = sum_k a[m, k] a_scale[m, k // 128] b[n, k] b_scale[n // 128, k // 128]``, bf16 out,
on DeepSeek-V3's dense linear layers (N, K): ``q_b_proj`` (24576, 1536), ``o_proj`` (7168, 16384),
the dense MLP's ``gate_up`` (36864, 7168) and ``down`` (7168, 18432), for M (tokens) in 1, 16,
64, 256, 1024, 4096 (``--quick``: 1, 64, 1024).

Variants:

- ``hexlayout``: ``gemm_fp8`` with general scales; ``hexlayout-ue8m0`` the same call with the
  scales rounded to powers of two and ``scale_format="ue8m0"`` (on sm_100a the block-scaled MMA);
- ``cublas-fp8-rowwise``: ``torch._scaled_mm`` with one scale per row of ``a`` and per row of
  ``b`` (a coarser scaling than the op's, the same FP8 tensor-core work: cuBLAS' speed of light);
- ``cublas-bf16``: ``torch.matmul`` of the dequantized bf16 operands;
- ``deepgemm``: ``deep_gemm.gemm_fp8_fp8_bf16_nt`` (the same block scaling; when installed);
- ``vllm-triton``: vLLM's ``w8a8_block_fp8_matmul`` (the same block scaling; when installed).

A missing peer is reported as unavailable. Every variant is checked against float32 torch on
the dequantized operands (its own scaling), then timed with CUDA events (``timing.time_ms``,
median of ``--iters`` after ``--warmup``, L2 flushed between). Roofline: the bytes read and
written (``a``, ``b``, scales, ``c``) over the peak HBM bandwidth; TFLOP/s = ``2 M N K / t``.

Targets on H100 / H200 (for when a GPU runs it): hexlayout >= 1.0x ``vllm-triton`` at every M,
>= 70 % of the HBM roofline for M <= 64 (decode, memory-bound), >= 60 % of
``cublas-fp8-rowwise``'s TFLOP/s at M >= 1024 (above 64 rows the op runs 128 x 128 warp-specialized
tiles, not persistent, one CTA per tile, the rows of ``a`` by cp.async: the prefill target may be
missed).

Writes ``gemm_fp8_<device>.json`` / ``.md`` to ``benchmarks/results`` (or ``--out``).
``--dry-run``: no GPU: tiny shapes on CPU tensors through the emulator (``HEXLAYOUT_EMULATE=1``,
``HEXLAYOUT_EMULATE_ARCH=sm_90a``), wall-clock times that mean nothing; the run proves the
script.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from roofline import max_rel_err, peak_gbps  # noqa: E402 - sibling modules, found when loaded by path too
from timing import run_benchmark, time_ms  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
SHAPES = {"q_b_proj": (24576, 1536), "o_proj": (7168, 16384), "mlp_gate_up": (36864, 7168),
          "mlp_down": (7168, 18432)}
TOKENS = (1, 16, 64, 256, 1024, 4096)
QUICK_TOKENS = (1, 64, 1024)
DRY_SHAPES = {"tiny": (192, 400)}
DRY_TOKENS = (3, 40)
VARIANTS = ("hexlayout", "hexlayout-ue8m0", "cublas-fp8-rowwise", "cublas-bf16", "deepgemm", "vllm-triton")


def make_problem(m: int, n: int, k: int, device: str, seed: int = 0) -> dict[str, Any]:
    """Random e4m3 operands with positive scales (per 128-column group of ``a``, per 128 x 128 block
    of ``b``) and their dequantized float32 values."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    kb, nb = -(-k // 128), -(-n // 128)
    a = (torch.randn(m, k, generator=g) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    b = (torch.randn(n, k, generator=g) * 64).clamp(-448, 448).to(torch.float8_e4m3fn)
    sa = torch.rand(m, kb, generator=g) / 256 + 1e-4
    sb = torch.rand(nb, kb, generator=g) / 256 + 1e-4
    p = {"a": a, "b": b, "sa": sa, "sb": sb, "sa2": torch.exp2(torch.round(torch.log2(sa))),
         "sb2": torch.exp2(torch.round(torch.log2(sb)))}
    return {key: v.to(device) for key, v in p.items()}


def dequant(a: Any, sa: Any, b: Any, sb: Any) -> tuple[Any, Any]:
    k = a.shape[1]
    ad = a.float() * sa.repeat_interleave(128, 1)[:, :k]
    bd = b.float() * sb.repeat_interleave(128, 0)[: b.shape[0]].repeat_interleave(128, 1)[:, :k]
    return ad, bd


def variant_fns(p: dict[str, Any], variants: list[str]) -> tuple[dict[str, tuple[Callable[[], Any], Any]],
                                                                   dict[str, str]]:
    """``{variant: (call, float32 reference of its own scaling)}`` and ``{variant: why missing}``."""
    import hexlayout.ops
    import torch

    a, b, sa, sb = p["a"], p["b"], p["sa"], p["sb"]
    fns: dict[str, tuple[Callable[[], Any], Any]] = {}
    missing: dict[str, str] = {}

    def ref(a_, sa_, b_, sb_):
        ad, bd = dequant(a_, sa_, b_, sb_)
        return lambda: ad @ bd.T

    if "hexlayout" in variants:
        fns["hexlayout"] = (lambda: hexlayout.ops.gemm_fp8(a, b, sa, sb), ref(a, sa, b, sb))
    if "hexlayout-ue8m0" in variants:
        sa2, sb2 = p["sa2"], p["sb2"]
        fns["hexlayout-ue8m0"] = (lambda: hexlayout.ops.gemm_fp8(a, b, sa2, sb2, scale_format="ue8m0"),
                                  ref(a, sa2, b, sb2))
    if "cublas-fp8-rowwise" in variants:
        if a.is_cuda and hasattr(torch, "_scaled_mm"):
            ra, rb = sa.amax(1, keepdim=True), sb.amax(1).repeat_interleave(128)[: b.shape[0]][None]
            bt = b.t()

            def rowwise():
                return torch._scaled_mm(a, bt, scale_a=ra, scale_b=rb, out_dtype=torch.bfloat16)

            fns["cublas-fp8-rowwise"] = (rowwise, lambda: (a.float() * ra) @ (b.float() * rb.T).T)
        else:
            missing["cublas-fp8-rowwise"] = "torch._scaled_mm needs a CUDA FP8 GPU"
    if "cublas-bf16" in variants:
        ad, bd = dequant(a, sa, b, sb)
        ab, bb = ad.bfloat16(), bd.bfloat16()
        fns["cublas-bf16"] = (lambda: ab @ bb.T, lambda: ab.float() @ bb.float().T)
    if "deepgemm" in variants:
        try:
            import deep_gemm  # type: ignore[import-not-found]

            out = torch.empty(a.shape[0], b.shape[0], dtype=torch.bfloat16, device=a.device)
            sa_dg = deep_gemm.get_col_major_tma_aligned_tensor(sa)   # the layout DeepGEMM reads

            def dg():
                deep_gemm.gemm_fp8_fp8_bf16_nt((a, sa_dg), (b, sb), out)
                return out

            fns["deepgemm"] = (dg, ref(a, sa, b, sb))
        except Exception as ex:  # noqa: BLE001 - not installed / not importable
            missing["deepgemm"] = f"{type(ex).__name__}: {ex}"[:200]
    if "vllm-triton" in variants:
        try:
            from vllm.model_executor.layers.quantization.utils.fp8_utils import w8a8_block_fp8_matmul

            fns["vllm-triton"] = (lambda: w8a8_block_fp8_matmul(a, b, sa, sb, [128, 128], torch.bfloat16),
                                  ref(a, sa, b, sb))
        except Exception as ex:  # noqa: BLE001 - not installed / not importable
            missing["vllm-triton"] = f"{type(ex).__name__}: {ex}"[:200]
    return fns, missing


def run(args: argparse.Namespace) -> dict:
    import torch

    cuda = not args.dry_run
    device = "cuda" if cuda else "cpu"
    shapes = DRY_SHAPES if args.dry_run else SHAPES
    tokens = args.tokens or (DRY_TOKENS if args.dry_run else QUICK_TOKENS if args.quick else TOKENS)
    variants = args.variants or list(VARIANTS)
    dev_name = torch.cuda.get_device_name() if cuda else f"CPU emulator ({platform.machine()})"
    peak = peak_gbps(dev_name, args.peak_gbps if not args.dry_run else (args.peak_gbps or 1.0))
    rows: list[dict] = []
    unavailable: dict[str, str] = {}
    for name, (n, k) in shapes.items():
        for m in tokens:
            p = make_problem(m, n, k, device)
            fns, missing = variant_fns(p, variants)
            unavailable.update({v: why for v, why in missing.items() if v not in unavailable})
            kb, nb = -(-k // 128), -(-n // 128)
            nbytes = m * k + n * k + 4 * (m * kb + nb * kb) + 2 * m * n
            row: dict[str, Any] = {"layer": name, "M": m, "N": n, "K": k}
            for v, (fn, ref) in fns.items():
                try:
                    err = max_rel_err(fn().double(), ref().double())
                    ms = time_ms(fn, args.warmup, args.iters, cuda)
                    r = {"ms": ms, "max_rel_err": err, "tflops": 2 * m * n * k / ms / 1e9,
                         "gbps": nbytes / ms / 1e6}
                    if peak:
                        r["roofline"] = (nbytes / (peak * 1e9) * 1e3) / ms
                    row[v] = r
                except Exception as ex:  # noqa: BLE001 - a failing variant is reported, not fatal
                    row[v] = {"error": f"{type(ex).__name__}: {ex}"[:300]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    date = dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds")
    meta = {"device": dev_name, "torch": torch.__version__, "cuda": torch.version.cuda,
            "python": platform.python_version(), "date": date, "peak_gbps": peak,
            "dry_run": bool(args.dry_run), "variants": variants, "unavailable": unavailable}
    return {"meta": meta, "rows": rows}


def write_results(res: dict, out: Path) -> list[Path]:
    """JSON and a markdown table (per layer and M: each variant's time, TFLOP/s, roofline fraction)."""
    meta, rows = res["meta"], res["rows"]
    out.mkdir(parents=True, exist_ok=True)
    dev = "".join(c if c.isalnum() or c in "-_." else "_" for c in meta["device"])
    stem = f"gemm_fp8_{dev}{'_dry' if meta['dry_run'] else ''}"
    paths = [out / f"{stem}.json", out / f"{stem}.md"]
    paths[0].write_text(json.dumps(res, indent=1))
    vs = [v for v in meta["variants"] if any(v in r for r in rows)]
    lines = [f"# Dense FP8 GEMM (bf16 out) on {meta['device']} ({meta['date']})", "",
             f"torch {meta['torch']}, CUDA {meta['cuda']}; peak HBM {meta['peak_gbps'] or '-'} GB/s"
             f"{' (dry run: CPU emulator, wall-clock times mean nothing)' if meta['dry_run'] else ''}", "",
             "Each cell: ms / TFLOP/s / fraction of the HBM roofline.", "",
             "| layer | M | N | K | " + " | ".join(vs) + " |", "|---|---|---|---|" + "---|" * len(vs)]
    for r in rows:
        cells = []
        for v in vs:
            c = r.get(v)
            cells.append("-" if c is None else "error" if "error" in c else
                         f"{c['ms']:.3f} / {c['tflops']:.0f} / {c.get('roofline', 0):.0%}")
        lines.append(f"| {r['layer']} | {r['M']} | {r['N']} | {r['K']} | " + " | ".join(cells) + " |")
    if meta["unavailable"]:
        lines += ["", "Unavailable variants:", ""]
        lines += [f"- {v}: {why}" for v, why in meta["unavailable"].items()]
    errs = [(r["layer"], r["M"], v, r[v]["error"]) for r in rows for v in vs if "error" in r.get(v, {})]
    if errs:
        lines += ["", "Errors:", ""] + [f"- {la} M={m} {v}: {e}" for la, m, v, e in errs]
    paths[1].write_text("\n".join(lines) + "\n")
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help=f"M in {QUICK_TOKENS}")
    ap.add_argument("--tokens", nargs="*", type=int, help=f"rows M (default {TOKENS})")
    ap.add_argument("--variants", nargs="*", choices=VARIANTS, help="subset of the variants")
    ap.add_argument("--peak-gbps", type=float,
                    help="peak HBM bandwidth in GB/s (default: from the device name)")
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for the JSON / md")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU through the emulator (no GPU)")
    args = ap.parse_args(argv)
    return run_benchmark("bench_gemm_fp8", args, run, write_results, "sm_90a")


if __name__ == "__main__":
    sys.exit(main())
