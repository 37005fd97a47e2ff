"""Fused MoE benchmark: hexlayout (bf16, W4A16, FP8) vs vLLM's Triton ``fused_moe`` /
``fused_marlin_moe`` and the HBM roofline, in one run.

Shapes (``out[t] = sum_j w_tj * W2[e] (act(W13[e, :I] x_t) * W13[e, I:] x_t)``):

- ``mixtral-8x7b``: E = 8, k = 2, H = 4096, I = 14336 (one GPU, no tensor parallelism);
- ``deepseek-v3-tp8``: E = 256, k = 8, H = 7168, I = 256 (DeepSeek-V3's and DeepSeek-R1's
  routed experts (one architecture: R1 is a V3 checkpoint), ``moe_intermediate_size`` 2048 split
  over 8 GPUs by tensor parallelism: each GPU holds all 256 experts with a 256-wide slice of I;
  the shared expert is not part of this op);

with T (tokens) in 1, 2, 4, ..., 4096 (``--quick``: 1, 16, 256, 4096) and a random routing
(top-k of Gaussian logits: distinct experts per token, every variant sees the same one).

Variants: ``hexlayout-bf16`` (``hexlayout.ops.fused_moe`` on bf16 weights),
``hexlayout-w4a16`` (``prepare_wna16``, GPTQ 4-bit, group 128), ``hexlayout-fp8``
(``prepare_fp8``, 128 x 128 block scales), and when vLLM is importable ``vllm-triton-bf16`` /
``vllm-triton-fp8`` / ``vllm-triton-w4a16`` (``fused_experts``; the W4A16 one on the same GPTQ
values, repacked as vLLM's ``int4_w4a16`` uint8 ``[E, N, K/2]``) and ``vllm-marlin-w4a16``
(``fused_marlin_moe`` on ``gptq_marlin_moe_repack``'d weights and Marlin-permuted scales, quant
type ``uint4b8``; the call adapts to the installed vLLM's signatures). A
variant whose op or library is missing is reported as unavailable (the run goes on). Each
variant is checked against a float32 torch computation of the same (dequantized) weights,
then timed with CUDA events (median of ``--iters`` after ``--warmup``, L2 flushed between).

Roofline: the bytes of the experts the routing touches (``#distinct experts x (3 H I)``
weights in the variant's storage, scales and zero points included, plus activations in and
out) divided by the peak HBM bandwidth (from the device name, or ``--peak-gbps``); a
variant's ``roofline`` is that time over its measured time.

Targets on H100 SXM (for when a GPU runs it): hexlayout >= 70 % of the roofline at T >= 16,
W4A16 >= 1.0x Marlin-MoE and >= 6x Triton W4A16.

Writes ``moe_<device>.json`` / ``.md`` / ``.png`` to ``benchmarks/results`` (or
``--out``). ``python benchmarks/bench_moe.py [--quick] [--models mixtral-8x7b]``.

``--dry-run``: no GPU: tiny shapes of the same structure on CPU tensors through the emulator
(``HEXLAYOUT_EMULATE=1``, ``HEXLAYOUT_EMULATE_ARCH=sm_89``), timed with the wall clock (the
numbers mean nothing; the run proves the script and the variants' plumbing), a nominal 1
GB/s peak, results in ``--out``.
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
from roofline import peak_gbps  # noqa: E402 - sibling modules, found when loaded by path too
from timing import run_benchmark, time_ms  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"

#: name -> (E, k, H, I)
MODELS = {
    "mixtral-8x7b": (8, 2, 4096, 14336),
    "deepseek-v3-tp8": (256, 8, 7168, 256),
}
#: --dry-run: the same structure (few experts / many experts), emulator-sized
DRY_MODELS = {
    "tiny-mixtral": (4, 2, 128, 128),
    "tiny-deepseek": (16, 4, 128, 128),
}
TOKENS = [1 << i for i in range(13)]
QUICK_TOKENS = [1, 16, 256, 4096]
DRY_TOKENS = [1, 3]


VARIANTS = (
    "hexlayout-bf16",
    "hexlayout-w4a16",
    "hexlayout-fp8",
    "vllm-triton-bf16",
    "vllm-triton-fp8",
    "vllm-triton-w4a16",
    "vllm-marlin-w4a16",
)
GROUP = 128
FP8_BLOCK = 128


# ---------------------------------------------------------------------------------------- weights
def make_problem(e: int, k: int, h: int, inter: int, t: int, dtype: Any, device: str, seed: int = 0) -> dict:
    """bf16 weights, a routing, and the activations."""
    import torch

    g = torch.Generator(device="cpu").manual_seed(seed)
    w13 = (torch.randn(e, 2 * inter, h, generator=g) * h**-0.5).to(dtype)
    w2 = (torch.randn(e, h, inter, generator=g) * inter**-0.5).to(dtype)
    x = torch.randn(t, h, generator=g).to(dtype)
    logits = torch.randn(t, e, generator=g)
    tw, ids = torch.topk(torch.softmax(logits, -1), k, dim=-1)
    return {
        "x": x.to(device),
        "w13": w13.to(device),
        "w2": w2.to(device),
        "tw": tw.float().to(device),
        "ids": ids.to(torch.int32).to(device),
    }


def quant_fp8(w: Any) -> tuple[Any, Any, Any]:
    """Block-scaled e4m3 weights: ``(w_fp8 [E, N, K], scale [E, N/128, K/128], dequantized f32)``."""
    import torch

    e, n, kk = w.shape
    nb, kb = -(-n // FP8_BLOCK), -(-kk // FP8_BLOCK)
    wp = torch.zeros(e, nb * FP8_BLOCK, kb * FP8_BLOCK, dtype=torch.float32, device=w.device)
    wp[:, :n, :kk] = w.float()
    blocks = wp.reshape(e, nb, FP8_BLOCK, kb, FP8_BLOCK)
    scale = blocks.abs().amax(dim=(2, 4)).clamp_min(1e-12) / 448.0
    q = (blocks / scale[:, :, None, :, None]).to(torch.float8_e4m3fn)
    deq = (q.float() * scale[:, :, None, :, None]).reshape(e, nb * FP8_BLOCK, kb * FP8_BLOCK)[:, :n, :kk]
    return q.reshape(e, nb * FP8_BLOCK, kb * FP8_BLOCK)[:, :n, :kk].contiguous(), scale.contiguous(), deq


def quant_gptq4(w: Any) -> tuple[Any, Any, Any]:
    """Symmetric GPTQ 4-bit, group 128, for ``y = x @ W^T`` of ``w [E, N, K]``: ``qweight [E,
    K/8, N]`` int32 (nibble i of word r: row 8r + i), ``scales [E, K/128, N]`` in w's dtype, and
    the dequantized ``[E, N, K]`` f32."""
    import torch

    e, n, kk = w.shape
    wt = w.float().transpose(1, 2)  # [E, K, N]
    grp = wt.reshape(e, kk // GROUP, GROUP, n)
    scale = (grp.abs().amax(2) / 7.0).clamp_min(1e-8)  # [E, K/G, N]
    q = torch.clamp(torch.round(grp / scale[:, :, None]), -8, 7) + 8  # 0..15
    deq = ((q - 8) * scale[:, :, None]).reshape(e, kk, n).transpose(1, 2)
    qi = q.reshape(e, kk // 8, 8, n).to(torch.int64)
    packed = torch.zeros(e, kk // 8, n, dtype=torch.int64, device=w.device)
    for i in range(8):
        packed |= qi[:, :, i] << (4 * i)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed).to(torch.int32)
    return packed.contiguous(), scale.to(w.dtype).contiguous(), deq.contiguous()


def reference(x: Any, w13: Any, w2: Any, tw: Any, ids: Any) -> Any:
    """float32 torch MoE (SiLU) of f32 weights ``w13 [E, 2I, H]``, ``w2 [E, H, I]``."""
    import torch

    xf = x.float()
    out = torch.zeros_like(xf)
    inter = w2.shape[2]
    for e in ids.unique().tolist():
        tok, j = (ids == e).nonzero(as_tuple=True)
        y = xf[tok] @ w13[e].t()
        hmid = torch.nn.functional.silu(y[:, :inter]) * y[:, inter:]
        out.index_add_(0, tok, (hmid @ w2[e].t()) * tw[tok, j][:, None])
    return out


# ---------------------------------------------------------------------------------------- variants
def variant_fns(
    p: dict, names: list[str]
) -> tuple[dict[str, tuple[Callable[[], Any], Any, int]], dict[str, str]]:
    """name -> (call, dequantized f32 (w13, w2) for the check, bytes of one expert's weights);
    and name -> why a variant is unavailable."""
    import torch

    fns: dict[str, tuple[Callable[[], Any], Any, int]] = {}
    missing: dict[str, str] = {}
    x, w13, w2, tw, ids = p["x"], p["w13"], p["w2"], p["tw"], p["ids"]
    e, n2, h = w13.shape
    inter = n2 // 2
    per_expert_bf16 = 3 * h * inter * x.element_size()
    fp8 = gptq = None

    def want(name: str) -> bool:
        return name in names

    def fp8_weights() -> Any:
        nonlocal fp8
        if fp8 is None:
            fp8 = (quant_fp8(w13), quant_fp8(w2))
        return fp8

    def gptq_weights() -> Any:
        nonlocal gptq
        if gptq is None:
            gptq = (quant_gptq4(w13), quant_gptq4(w2))
        return gptq

    fp8_bytes = 3 * h * inter + 4 * (-(-n2 // 128) * -(-h // 128) + -(-h // 128) * -(-inter // 128))
    w4_bytes = 3 * h * inter // 2 + 2 * (n2 * h // GROUP + h * inter // GROUP)
    import hexlayout.ops as hops

    if want("hexlayout-bf16"):
        if hasattr(hops, "fused_moe"):
            fns["hexlayout-bf16"] = (
                lambda: hops.fused_moe(x, w13, w2, tw, ids),
                (w13.float(), w2.float()),
                per_expert_bf16,
            )
        else:
            missing["hexlayout-bf16"] = "hexlayout.ops.fused_moe is not built"
    if want("hexlayout-fp8"):
        if hasattr(hops, "prepare_fp8") or _has("hexlayout.ops.moe.fp8"):
            from hexlayout.ops.moe.fp8 import fused_moe_fp8, prepare_fp8

            (q13, s13, d13), (q2, s2, d2) = fp8_weights()
            a = prepare_fp8(q13, s13, block=(FP8_BLOCK, FP8_BLOCK))
            b = prepare_fp8(q2, s2, block=(FP8_BLOCK, FP8_BLOCK))
            call = (
                (lambda a=a, b=b: hops.fused_moe(x, a, b, tw, ids))
                if hasattr(hops, "fused_moe")
                else (lambda a=a, b=b: fused_moe_fp8(x, a, b, tw, ids))
            )
            fns["hexlayout-fp8"] = (call, (d13, d2), fp8_bytes)
        else:
            missing["hexlayout-fp8"] = "hexlayout.ops.moe.fp8 is not built"
    if want("hexlayout-w4a16"):
        if hasattr(hops, "prepare_wna16") and hasattr(hops, "fused_moe"):
            (q13, s13, d13), (q2, s2, d2) = gptq_weights()
            a = hops.prepare_wna16(q13, s13, quant_format="gptq", bits=4, group_size=GROUP)
            b = hops.prepare_wna16(q2, s2, quant_format="gptq", bits=4, group_size=GROUP)
            fns["hexlayout-w4a16"] = (lambda a=a, b=b: hops.fused_moe(x, a, b, tw, ids), (d13, d2), w4_bytes)
        else:
            missing["hexlayout-w4a16"] = "hexlayout.ops.prepare_wna16 / fused_moe is not built"
    vllm_names = [v for v in names if v.startswith("vllm")]
    if vllm_names:
        if x.device.type != "cuda":
            for v in vllm_names:
                missing[v] = "vLLM kernels need a CUDA device"
        else:
            try:
                from vllm.model_executor.layers.fused_moe import fused_experts
            except Exception as ex:  # noqa: BLE001 - any import failure: vLLM is unavailable
                for v in vllm_names:
                    missing[v] = f"vllm not importable: {type(ex).__name__}: {ex}"[:200]
            else:
                if want("vllm-triton-bf16"):
                    fns["vllm-triton-bf16"] = (
                        lambda: triton_experts(fused_experts, x, w13, w2, tw, ids),
                        (w13.float(), w2.float()),
                        per_expert_bf16,
                    )
                peers = (
                    ("vllm-triton-fp8", fp8_weights,
                     lambda w: triton_fp8(fused_experts, w, x, tw, ids), fp8_bytes),
                    ("vllm-triton-w4a16", gptq_weights,
                     lambda w: triton_w4a16(fused_experts, w, x, tw, ids), w4_bytes),
                    ("vllm-marlin-w4a16", gptq_weights, lambda w: marlin(w, x, tw, ids, h, inter), w4_bytes),
                )
                for name, weights, make, nbytes in peers:
                    if want(name):
                        try:
                            wq = weights()
                            fns[name] = (make(wq), (wq[0][2], wq[1][2]), nbytes)
                        except Exception as ex:  # noqa: BLE001 - vLLM's APIs differ across versions
                            missing[name] = f"{type(ex).__name__}: {ex}"[:200]
    del torch
    return fns, missing


def _has(module: str) -> bool:
    import importlib.util

    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        return False


def triton_experts(fused_experts: Callable[..., Any], x: Any, w13: Any, w2: Any, tw: Any, ids: Any,
                   config: tuple[str, dict[str, Any]] | None = None, legacy: dict[str, Any] | None = None
                   ) -> Any:  # pragma: no cover - needs a CUDA device
    """vLLM's Triton ``fused_experts``: with a ``quant_config`` parameter (vLLM >= 0.11) the
    config built by ``vllm.model_executor.layers.fused_moe.config.<config[0]>(**config[1])``,
    else the older flat keyword arguments ``legacy``."""
    import inspect

    if config is not None and "quant_config" in inspect.signature(fused_experts).parameters:
        from vllm.model_executor.layers.fused_moe import config as moe_config

        return fused_experts(x, w13, w2, tw, ids, quant_config=getattr(moe_config, config[0])(**config[1]))
    return fused_experts(x, w13, w2, tw, ids, **(legacy or {}))


def triton_fp8(fused_experts: Callable[..., Any], fp8: Any, x: Any, tw: Any, ids: Any) -> Callable[[], Any]:
    """The FP8 Triton peer on ``quant_fp8``'s block-scaled weights."""
    (q13, s13, _), (q2, s2, _) = fp8
    scales = {"w1_scale": s13, "w2_scale": s2, "block_shape": [FP8_BLOCK, FP8_BLOCK]}
    cfg = ("fp8_w8a8_moe_quant_config", scales)
    return lambda: triton_experts(fused_experts, x, q13, q2, tw, ids, cfg, {"use_fp8_w8a8": True, **scales})


def int4_w4a16_weights(qweight: Any, scales: Any) -> tuple[Any, Any]:
    """GPTQ 4-bit ``qweight [E, K/8, N]`` (nibble i of word r: row 8r + i) and ``scales [E, K/G, N]``
    as vLLM's Triton ``int4_w4a16`` takes them: uint8 ``[E, N, K/2]`` (value k in byte k // 2, even k
    in the low nibble; zero point 8 when none is given) and scales ``[E, N, K/G]``."""
    import torch

    e, r, n = qweight.shape
    shifts = torch.arange(8, device=qweight.device, dtype=torch.int32) * 4
    q = ((qweight.unsqueeze(2) >> shifts[None, None, :, None]) & 15).reshape(e, 8 * r, n)  # [E, K, N]
    q = q.transpose(1, 2).to(torch.uint8)  # [E, N, K]
    return (q[..., 0::2] | (q[..., 1::2] << 4)).contiguous(), scales.transpose(1, 2).contiguous()


def triton_w4a16(fused_experts: Callable[..., Any], gptq: Any, x: Any, tw: Any,
                 ids: Any) -> Callable[[], Any]:
    """The W4A16 Triton peer (``use_int4_w4a16``, group ``GROUP``) on the GPTQ weights."""
    (q13, s13, _), (q2, s2, _) = gptq
    (b13, t13), (b2, t2) = int4_w4a16_weights(q13, s13), int4_w4a16_weights(q2, s2)
    scales = {"w1_scale": t13, "w2_scale": t2, "block_shape": [0, GROUP]}
    cfg = ("int4_w4a16_moe_quant_config", scales)
    return lambda: triton_experts(fused_experts, x, b13, b2, tw, ids, cfg, {"use_int4_w4a16": True, **scales})


def marlin_args(gptq: Any, x: Any, tw: Any, ids: Any, h: int, inter: int,
                fused_marlin_moe: Callable[..., Any], repack: Callable[..., Any],
                permute_scales: Callable[..., Any],
                quant_type_id: int) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The arguments of vLLM's ``fused_marlin_moe`` on the GPTQ weights: each projection repacked
    by ``gptq_marlin_moe_repack`` (``repack``; older vLLMs take an empty act-order ``perm`` second),
    its scales by ``marlin_moe_permute_scales``, quant type ``quant_type_id`` (``uint4b8``); an
    older signature's ``gating_output`` / ``num_bits`` / ``is_k_full`` when present."""
    import inspect

    import torch

    (q13, s13, _), (q2, s2, _) = gptq
    e = q13.shape[0]
    if "perm" in inspect.signature(repack).parameters:
        perm = torch.empty(e, 0, dtype=torch.int32, device=x.device)
        m13, m2 = repack(q13, perm, h, 2 * inter, 4), repack(q2, perm, inter, h, 4)
    else:
        m13, m2 = repack(q13, h, 2 * inter, 4), repack(q2, inter, h, 4)
    kw: dict[str, Any] = {
        "w1_scale": permute_scales(s13, h, 2 * inter, GROUP),
        "w2_scale": permute_scales(s2, inter, h, GROUP),
        "topk_weights": tw,
        "topk_ids": ids,
        "quant_type_id": quant_type_id,
    }
    params = inspect.signature(fused_marlin_moe).parameters
    extra = {"gating_output": torch.zeros(x.shape[0], e, dtype=x.dtype, device=x.device), "num_bits": 4,
             "is_k_full": True}
    kw.update({k: v for k, v in extra.items() if k in params})
    return (x, m13, m2, None, None), kw


def marlin(gptq: Any, x: Any, tw: Any, ids: Any, h: int, inter: int) -> Callable[[], Any]:  # pragma: no cover
    """vLLM's ``fused_marlin_moe`` on the GPTQ weights (``marlin_args``)."""
    from vllm import _custom_ops as vops
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_moe_permute_scales
    from vllm.scalar_type import scalar_types

    try:
        from vllm.model_executor.layers.fused_moe.fused_marlin_moe import fused_marlin_moe
    except ImportError:  # vLLM >= 0.30 moved it
        from vllm.model_executor.layers.fused_moe.experts.marlin_moe import fused_marlin_moe
    args, kw = marlin_args(gptq, x, tw, ids, h, inter, fused_marlin_moe, vops.gptq_marlin_moe_repack,
                           marlin_moe_permute_scales, scalar_types.uint4b8.id)
    return lambda: fused_marlin_moe(*args, **kw)


def run(args: argparse.Namespace) -> dict:
    """Every (model, T, variant): the result rows and the run's metadata."""
    import torch

    import hexlayout

    cuda = not args.dry_run
    device = "cuda" if cuda else "cpu"
    models = DRY_MODELS if args.dry_run else MODELS
    names = [m for m in (args.models or list(models))]
    tokens = args.tokens or (DRY_TOKENS if args.dry_run else QUICK_TOKENS if args.quick else TOKENS)
    variants = args.variants or list(VARIANTS)
    dev_name = torch.cuda.get_device_name() if cuda else f"CPU emulator ({platform.machine()})"
    peak = peak_gbps(dev_name, args.peak_gbps if not args.dry_run else (args.peak_gbps or 1.0))
    rows: list[dict] = []
    unavailable: dict[str, str] = {}
    for model in names:
        e, k, h, inter = models[model]
        for t in tokens:
            p = make_problem(e, k, h, inter, t, torch.bfloat16, device)
            fns, missing = variant_fns(p, variants)
            unavailable.update({v: why for v, why in missing.items() if v not in unavailable})
            touched = int(p["ids"].unique().numel())
            act_bytes = 2 * t * h * p["x"].element_size()
            row: dict[str, Any] = {
                "model": model,
                "E": e,
                "k": k,
                "H": h,
                "I": inter,
                "T": t,
                "experts_touched": touched,
            }
            for v, (fn, (d13, d2), per_expert) in fns.items():
                try:
                    out = fn()
                    ref = reference(p["x"], d13, d2, p["tw"], p["ids"])
                    err = ((out.float() - ref).abs().max() / (ref.abs().max() + 1e-6)).item()
                    ms = time_ms(fn, args.warmup, args.iters, cuda)
                    nbytes = touched * per_expert + act_bytes
                    r = {"ms": ms, "max_rel_err": err, "bytes": nbytes, "gbps": nbytes / ms / 1e6}
                    if peak:
                        r["roofline"] = (nbytes / (peak * 1e9) * 1e3) / ms
                    row[v] = r
                except Exception as ex:  # noqa: BLE001 - a failing variant is reported, not fatal
                    row[v] = {"error": f"{type(ex).__name__}: {ex}"[:300]}
            rows.append(row)
            print(json.dumps(row), flush=True)
    meta = {
        "device": dev_name,
        "torch": torch.__version__,
        "hexlayout": getattr(hexlayout, "__version__", "-"),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "dtype": "bf16",
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "peak_gbps": peak,
        "dry_run": bool(args.dry_run),
        "variants": variants,
        "unavailable": unavailable,
    }
    for mod in ("triton", "vllm"):
        try:
            meta[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - not installed / not importable
            meta[mod] = None
    return {"meta": meta, "rows": rows}


def write_results(res: dict, out: Path) -> list[Path]:
    """JSON, markdown table and PNG plot (time per variant against T, one panel per model)."""
    meta, rows = res["meta"], res["rows"]
    out.mkdir(parents=True, exist_ok=True)
    dev = "".join(c if c.isalnum() or c in "-_." else "_" for c in meta["device"])
    stem = f"moe_{dev}{'_dry' if meta['dry_run'] else ''}"
    paths = [out / f"{stem}.json", out / f"{stem}.md", out / f"{stem}.png"]
    paths[0].write_text(json.dumps(res, indent=1))
    vs = [v for v in meta["variants"] if any(v in r for r in rows)]
    lines = [
        f"# Fused MoE (bf16 activations) on {meta['device']} ({meta['date']})",
        "",
        f"torch {meta['torch']}, CUDA {meta['cuda']}, triton {meta.get('triton') or '-'}, "
        f"vllm {meta.get('vllm') or '-'}; peak HBM {meta['peak_gbps'] or '-'} GB/s"
        f"{' (dry run: CPU emulator, wall-clock times mean nothing)' if meta['dry_run'] else ''}",
        "",
        "Each cell: time in ms / fraction of the HBM roofline (bytes of the touched experts / peak).",
        "",
        "| model | T | experts | " + " | ".join(vs) + " |",
        "|---|---|---|" + "---|" * len(vs),
    ]
    for r in rows:
        cells = []
        for v in vs:
            c = r.get(v)
            if c is None:
                cells.append("-")
            elif "error" in c:
                cells.append("error")
            else:
                cells.append(f"{c['ms']:.3f} / {c['roofline']:.0%}" if "roofline" in c else f"{c['ms']:.3f}")
        lines.append(f"| {r['model']} | {r['T']} | {r['experts_touched']} | " + " | ".join(cells) + " |")
    if meta["unavailable"]:
        lines += ["", "Unavailable variants:", ""] + [
            f"- {v}: {why}" for v, why in meta["unavailable"].items()
        ]
    errs = [(r["model"], r["T"], v, r[v]["error"]) for r in rows for v in vs if "error" in r.get(v, {})]
    if errs:
        lines += ["", "Errors:", ""] + [f"- {m} T={t} {v}: {e}" for m, t, v, e in errs]
    paths[1].write_text("\n".join(lines) + "\n")
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig = Figure(figsize=(6 * max(1, len(models)), 4.5))
    for i, m in enumerate(models):
        ax = fig.add_subplot(1, len(models), i + 1)
        mr = [r for r in rows if r["model"] == m]
        for v in vs:
            pts = [(r["T"], r[v]["ms"]) for r in mr if "ms" in r.get(v, {})]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=v)
        if meta["peak_gbps"]:
            ts = [r["T"] for r in mr]
            ideal = [
                min((r[v]["bytes"] for v in vs if "bytes" in r.get(v, {})), default=0)
                / (meta["peak_gbps"] * 1e9)
                * 1e3
                for r in mr
            ]
            ax.plot(ts, ideal, "k--", label="roofline (fewest bytes)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("tokens T")
        ax.set_ylabel("ms")
        ax.set_title(m)
        ax.legend(fontsize=7)
    fig.suptitle(f"fused MoE on {meta['device']} ({meta['date'][:10]})")
    fig.tight_layout()
    fig.savefig(paths[2], dpi=110)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="T in 1, 16, 256, 4096")
    ap.add_argument(
        "--models", nargs="*", help=f"subset of {list(MODELS)} ({list(DRY_MODELS)} with --dry-run)"
    )
    ap.add_argument("--tokens", nargs="*", type=int, help="token counts (default 1..4096 by powers of two)")
    ap.add_argument("--variants", nargs="*", choices=VARIANTS, help="subset of the variants")
    ap.add_argument(
        "--peak-gbps", type=float, help="peak HBM bandwidth in GB/s (default: from the device name)"
    )
    ap.add_argument("--warmup", type=int, default=10)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--out", type=Path, default=RESULTS, help="directory for the JSON / md / PNG")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU through the emulator (no GPU)")
    args = ap.parse_args(argv)
    return run_benchmark("bench_moe", args, run, write_results, "sm_89")


if __name__ == "__main__":
    sys.exit(main())
