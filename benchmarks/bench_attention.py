"""Serving-attention benchmark (issue 12): prefill and decode, hexlayout against the references.

**Prefill** (``torch.ops.hexlayout.attention_varlen``): sequence lengths 512 .. 16k with a
batch of ``16k / seq`` sequences (16k tokens per call), head sizes 64 and 128 (``2048 / hd``
heads), causal and not, f16 / bf16. Against torch SDPA with the FlashAttention backend and with
the cuDNN backend (``torch.nn.attention.sdpa_kernel``; ``[B, H, S, D]`` views of the same
tensors) and a Triton FlashAttention-2 forward written after Triton's fused-attention tutorial
(``python/tutorials/06-fused-attention.py`` in triton-lang/triton: the tutorial is not part of
the installed package, so ``triton_attention`` below is this repository's own kernel in its
style: online softmax in the log2 domain, off-diagonal key blocks unmasked and the diagonal
blocks masked for causal, autotuned block sizes). TFLOP/s count ``4 B H S^2 D`` (half for
causal).

**Decode** (``torch.ops.hexlayout.paged_attention``, query length 1): batch 1 .. 256, context
1k .. 32k, Llama-3-8B's attention (32 query heads, 8 KV heads, head size 128), block size 16,
NHD caches, a shuffled block table, split-KV chosen by the op. Against vLLM's
FlashAttention-backend kernel (``vllm.vllm_flash_attn.flash_attn_varlen_func`` with a block
table) when vLLM is importable, and the HBM roofline: the K/V bytes read (plus q and out) over
the device's peak bandwidth (``--peak-gbps`` or a table by device name); ``roofline`` is the
fraction of it reached (1.0 = at peak bandwidth).

Targets on an H100 (SXM, 3.35 TB/s): prefill head size 128 at >= 1.0x cuDNN SDPA's
throughput; decode at >= 80 % of HBM bandwidth. Each implementation is checked against torch's
SDPA (math backend, float32) on its first call, then timed with CUDA events (median of
``--iters`` after ``--warmup``, L2 flushed between iterations). Writes
``benchmarks/results/attention_<device>.json`` / ``.md`` / ``.png`` (device, versions,
date in the JSON's ``meta``).

``python benchmarks/bench_attention.py [--dtype bf16] [--quick] [--peak-gbps N]`` on a CUDA GPU.
``--dry-run [--out DIR]``: no GPU: tiny shapes on CPU tensors through the emulator
(``HEXLAYOUT_EMULATE=1`` is set), SDPA's math backend as the only baseline; wall-clock times
mean nothing there, the run shows the script works end to end (tested).
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

PREFILL_SEQS = (512, 1024, 2048, 4096, 8192, 16384)
QUICK_PREFILL_SEQS = (1024, 4096, 16384)
PREFILL_TOKENS = 16384
PREFILL_HDS = (64, 128)
DECODE_BATCHES = (1, 4, 16, 64, 256)
QUICK_DECODE_BATCHES = (1, 16, 256)
DECODE_CONTEXTS = (1024, 4096, 16384, 32768)
QUICK_DECODE_CONTEXTS = (1024, 16384)
DECODE_HEADS = (32, 8, 128)  # H, KVH, D (Llama-3-8B)
BLOCK_SIZE = 16
MAX_KV_BYTES = 24 << 30  # decode problems whose caches exceed this are left out

#: --dry-run: the same structure, emulator-sized
DRY_PREFILL = {"seqs": (64,), "hds": (64,), "causal": (True,), "tokens": 64, "heads": 2}
DRY_DECODE = {"batches": (2,), "contexts": (40,), "heads": (4, 2, 64)}


# ------------------------------------------------------------------------------------ references
def sdpa_reference(q: Any, k: Any, v: Any, cu_q: list[int], cu_k: list[int], causal: bool) -> Any:
    """float32 SDPA (math backend) per sequence, ``[total_q, H, D]``; GQA by repeating K/V heads;
    causal bottom-right aligned (the explicit mask)."""
    import torch
    import torch.nn.functional as F

    tq, h, d = q.shape
    kvh = k.shape[1]
    out = torch.zeros(tq, h, d, dtype=torch.float32, device=q.device)
    for s in range(len(cu_q) - 1):
        qs = q[cu_q[s] : cu_q[s + 1]].float().transpose(0, 1)
        ks = k[cu_k[s] : cu_k[s + 1]].float().transpose(0, 1).repeat_interleave(h // kvh, 0)
        vs = v[cu_k[s] : cu_k[s + 1]].float().transpose(0, 1).repeat_interleave(h // kvh, 0)
        sq, sk = qs.shape[1], ks.shape[1]
        mask = None
        if causal:
            i = torch.arange(sq, device=q.device)[:, None]
            mask = torch.arange(sk, device=q.device)[None, :] <= i + sk - sq
        with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.MATH):
            out[cu_q[s] : cu_q[s + 1]] = F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask).transpose(
                0, 1
            )
    return out


# --------------------------------------------------------------------------------- Triton kernel
_attn_block: Any = None  # triton_attention's key-block loop, once built


def triton_attention(tune: bool = True) -> Callable[..., Any]:  # pragma: no cover - needs triton
    """A FlashAttention-2 forward in the style of Triton's fused-attention tutorial (see the
    module docstring), for ``[B, S, H, D]`` tensors of equal query / key length, ``S`` a
    multiple of 128: ``run(q, k, v, causal) -> o``. ``tune=False``: one fixed config (64 x 64
    blocks, 4 warps), no autotuner (which needs a GPU driver; Triton's interpreter checks it)."""
    import torch
    import triton
    import triton.language as tl

    def _block(
        acc,
        l_i,
        m_i,
        q,
        k_base,
        v_base,
        s_k,
        lo,
        hi,
        rm,
        rd,
        qk_scale,
        MASKED: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
    ):
        for n0 in range(lo, hi, BN):
            cols = n0 + tl.arange(0, BN)
            kt = tl.load(k_base + cols[None, :] * s_k + rd[:, None])
            s = tl.dot(q, kt)
            if MASKED:
                s = tl.where(cols[None, :] <= rm[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
            p = tl.math.exp2(s * qk_scale - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            v = tl.load(v_base + cols[:, None] * s_k + rd[None, :])
            acc = tl.dot(p.to(v.dtype), v, acc)
            m_i = m_new
        return acc, l_i, m_i

    global _attn_block  # _fwd calls it by a module-level name (Triton resolves calls through globals)
    _attn_block = triton.jit(_block)

    def _fwd(
        q_ptr,
        k_ptr,
        v_ptr,
        o_ptr,
        qk_scale,
        S,
        H,
        KVH,
        s_qb,
        s_qs,
        s_qh,
        s_kb,
        s_ks,
        s_kh,
        s_ob,
        s_os,
        s_oh,
        HD: tl.constexpr,
        CAUSAL: tl.constexpr,
        BM: tl.constexpr,
        BN: tl.constexpr,
    ):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        kvh = h // (H // KVH)
        rm = pid_m * BM + tl.arange(0, BM)
        rd = tl.arange(0, HD)
        q = tl.load(q_ptr + b * s_qb + h * s_qh + rm[:, None] * s_qs + rd[None, :])
        k_base = k_ptr + b * s_kb + kvh * s_kh
        v_base = v_ptr + b * s_kb + kvh * s_kh
        m_i = tl.full((BM,), float("-inf"), tl.float32)
        l_i = tl.zeros((BM,), tl.float32)
        acc = tl.zeros((BM, HD), tl.float32)
        if CAUSAL:  # key blocks left of the diagonal unmasked, the diagonal's masked
            acc, l_i, m_i = _attn_block(
                acc, l_i, m_i, q, k_base, v_base, s_ks, 0, pid_m * BM, rm, rd, qk_scale, False, BM, BN
            )
            acc, l_i, m_i = _attn_block(
                acc,
                l_i,
                m_i,
                q,
                k_base,
                v_base,
                s_ks,
                pid_m * BM,
                pid_m * BM + BM,
                rm,
                rd,
                qk_scale,
                True,
                BM,
                BN,
            )
        else:
            acc, l_i, m_i = _attn_block(
                acc, l_i, m_i, q, k_base, v_base, s_ks, 0, S, rm, rd, qk_scale, False, BM, BN
            )
        acc = acc / l_i[:, None]
        tl.store(
            o_ptr + b * s_ob + h * s_oh + rm[:, None] * s_os + rd[None, :], acc.to(o_ptr.dtype.element_ty)
        )

    configs = [
        triton.Config({"BM": bm, "BN": bn}, num_stages=st, num_warps=w)
        for bm, bn, st, w in ((128, 64, 3, 8), (128, 128, 3, 8), (128, 64, 4, 4), (64, 64, 3, 4))
    ]
    kernel = triton.jit(_fwd)
    if tune:
        kernel = triton.autotune(configs=configs, key=["S", "HD", "CAUSAL"])(kernel)
    fixed = {} if tune else {"BM": 64, "BN": 64, "num_warps": 4}

    def run(q: Any, k: Any, v: Any, causal: bool) -> Any:
        bsz, s, h, d = q.shape
        o = torch.empty((bsz, s, h, d), dtype=q.dtype, device=q.device)  # q may be a strided view
        grid = lambda meta: (triton.cdiv(s, meta["BM"]), bsz * h)  # noqa: E731
        kernel[grid](
            q,
            k,
            v,
            o,
            d**-0.5 * 1.4426950408889634,
            s,
            h,
            k.shape[2],
            q.stride(0),
            q.stride(1),
            q.stride(2),
            k.stride(0),
            k.stride(1),
            k.stride(2),
            o.stride(0),
            o.stride(1),
            o.stride(2),
            HD=d,
            CAUSAL=causal,
            **fixed,
        )
        return o

    return run


def _measure(
    fns: dict[str, Callable[[], Any]],
    ref: Any,
    args: argparse.Namespace,
    cuda: bool,
    work: Callable[[float], dict[str, float]],
) -> dict[str, Any]:
    """Each implementation: checked against ``ref``, timed, ``work(ms)``'s figures added; a
    failure is recorded as the implementation's error, not fatal."""
    out: dict[str, Any] = {}
    for name, fn in fns.items():
        try:
            err = max_rel_err(fn(), ref)
            ms = time_ms(fn, args.warmup, args.iters, cuda)
            out[name] = {"ms": ms, "max_rel_err": err, **work(ms)}
        except Exception as ex:  # noqa: BLE001 - a failing implementation is reported, not fatal
            out[name] = {"error": f"{type(ex).__name__}: {ex}"[:300]}
    return out


# --------------------------------------------------------------------------------------- prefill
def prefill_fns(
    q: Any, k: Any, v: Any, cu: Any, s: int, causal: bool, cuda: bool, tri: Any, unavailable: dict[str, str]
) -> dict[str, Callable[[], Any]]:
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    bsz = cu.shape[0] - 1
    h, d = q.shape[1], q.shape[2]
    q4, k4, v4 = (t.view(bsz, s, t.shape[1], d) for t in (q, k, v))

    def hexlayout_fn() -> Any:
        return torch.ops.hexlayout.attention_varlen(q, k, v, cu, cu, s, s, causal=causal)[0]

    fns: dict[str, Callable[[], Any]] = {"hexlayout": hexlayout_fn}

    def sdpa(backend: Any) -> Callable[[], Any]:
        def fn() -> Any:
            with sdpa_kernel(backend):
                o = F.scaled_dot_product_attention(
                    q4.transpose(1, 2),
                    k4.transpose(1, 2),
                    v4.transpose(1, 2),
                    is_causal=causal,
                    enable_gqa=k.shape[1] != h,
                )
            return o.transpose(1, 2).reshape(q.shape)

        return fn

    if cuda:  # pragma: no cover - GPU only
        fns["sdpa-flash"] = sdpa(SDPBackend.FLASH_ATTENTION)
        fns["sdpa-cudnn"] = sdpa(SDPBackend.CUDNN_ATTENTION)
        if tri is not None:
            fns["triton"] = lambda: tri(q4, k4, v4, causal).reshape(q.shape)
    else:
        fns["sdpa-math"] = sdpa(SDPBackend.MATH)
        for name in ("sdpa-flash", "sdpa-cudnn", "triton"):
            unavailable.setdefault(name, "needs a CUDA GPU")
    return fns


def run_prefill(
    args: argparse.Namespace, dtype: Any, device: str, tri: Any, unavailable: dict[str, str]
) -> list[dict]:
    import torch

    cuda = device == "cuda"
    if args.dry_run:
        seqs, hds, causals = DRY_PREFILL["seqs"], DRY_PREFILL["hds"], DRY_PREFILL["causal"]
        tokens = DRY_PREFILL["tokens"]
    else:  # pragma: no cover - GPU only
        seqs = QUICK_PREFILL_SEQS if args.quick else PREFILL_SEQS
        hds, causals, tokens = PREFILL_HDS, (False, True), PREFILL_TOKENS
    rows = []
    g = torch.Generator().manual_seed(0)
    for hd in hds:
        h = DRY_PREFILL["heads"] if args.dry_run else 2048 // hd
        for s in seqs:
            bsz = max(1, tokens // s)
            qkv = torch.randn(bsz * s, 3 * h, hd, generator=g).to(dtype).to(device)
            q, k, v = qkv[:, :h], qkv[:, h : 2 * h], qkv[:, 2 * h :]  # views of one fused QKV
            cu = torch.arange(0, (bsz + 1) * s, s, dtype=torch.int32, device=device)
            cu_l = cu.tolist()
            for causal in causals:
                ref = sdpa_reference(q, k, v, cu_l, cu_l, causal)
                flops = 4 * bsz * h * s * s * hd / (2 if causal else 1)
                row = {
                    "kind": "prefill",
                    "batch": bsz,
                    "seq": s,
                    "H": h,
                    "D": hd,
                    "causal": causal,
                    "flops": flops,
                }
                fns = prefill_fns(q, k, v, cu, s, causal, cuda, tri, unavailable)
                row.update(_measure(fns, ref, args, cuda, lambda ms, f=flops: {"tflops": f / ms / 1e9}))
                base = row.get("sdpa-cudnn", row.get("sdpa-math", {}))
                if "ms" in row["hexlayout"] and "ms" in base:
                    row["hexlayout"]["vs_cudnn" if cuda else "vs_math"] = base["ms"] / row["hexlayout"]["ms"]
                rows.append(row)
                print(json.dumps(row), flush=True)
    return rows


# ---------------------------------------------------------------------------------------- decode
def make_decode(bsz: int, ctx: int, h: int, kvh: int, d: int, dtype: Any, device: str, seed: int = 0) -> dict:
    """q ``[B, H, D]``, NHD caches holding every sequence's ``ctx`` keys in shuffled blocks."""
    import torch

    g = torch.Generator().manual_seed(seed)
    per = -(-ctx // BLOCK_SIZE)
    nb = bsz * per
    table = torch.randperm(nb, generator=g).to(torch.int32).view(bsz, per)
    kc = torch.randn(nb, BLOCK_SIZE, kvh, d, generator=g).to(dtype)
    vc = torch.randn(nb, BLOCK_SIZE, kvh, d, generator=g).to(dtype)
    q = torch.randn(bsz, h, d, generator=g).to(dtype)
    return {
        "q": q.to(device),
        "key_cache": kc.to(device),
        "value_cache": vc.to(device),
        "cu_seqlens_q": torch.arange(bsz + 1, dtype=torch.int32, device=device),
        "seqused_k": torch.full((bsz,), ctx, dtype=torch.int32, device=device),
        "block_table": table.to(device),
        "max_seqlen_q": 1,
        "max_seqlen_k": ctx,
    }


def decode_reference(p: dict) -> Any:
    """The cached keys gathered per sequence, then ``sdpa_reference`` (the query sees every key)."""

    bsz, per = p["block_table"].shape
    ctx = int(p["max_seqlen_k"])
    kc, vc, table = p["key_cache"], p["value_cache"], p["block_table"].long()
    k = kc[table].reshape(bsz, per * BLOCK_SIZE, *kc.shape[2:])[:, :ctx].reshape(bsz * ctx, *kc.shape[2:])
    v = vc[table].reshape(bsz, per * BLOCK_SIZE, *vc.shape[2:])[:, :ctx].reshape(bsz * ctx, *vc.shape[2:])
    cu_k = list(range(0, (bsz + 1) * ctx, ctx))
    return sdpa_reference(p["q"], k, v, list(range(bsz + 1)), cu_k, False)


def vllm_decode(p: dict) -> Callable[[], Any]:  # pragma: no cover - needs vLLM and a GPU
    """vLLM's FlashAttention-backend kernel on the same caches and block table."""
    from vllm.vllm_flash_attn import flash_attn_varlen_func

    q = p["q"]
    return lambda: flash_attn_varlen_func(
        q,
        p["key_cache"],
        p["value_cache"],
        max_seqlen_q=1,
        cu_seqlens_q=p["cu_seqlens_q"],
        max_seqlen_k=p["max_seqlen_k"],
        seqused_k=p["seqused_k"],
        block_table=p["block_table"],
        causal=True,
        softmax_scale=q.shape[-1] ** -0.5,
    )


def run_decode(
    args: argparse.Namespace, dtype: Any, device: str, peak: float | None, unavailable: dict[str, str]
) -> list[dict]:
    import torch

    cuda = device == "cuda"
    if args.dry_run:
        batches, contexts, (h, kvh, d) = DRY_DECODE["batches"], DRY_DECODE["contexts"], DRY_DECODE["heads"]
    else:  # pragma: no cover - GPU only
        batches = QUICK_DECODE_BATCHES if args.quick else DECODE_BATCHES
        contexts = QUICK_DECODE_CONTEXTS if args.quick else DECODE_CONTEXTS
        h, kvh, d = DECODE_HEADS
    vllm_ok = False
    if cuda:  # pragma: no cover - GPU only
        try:
            import vllm.vllm_flash_attn  # noqa: F401

            vllm_ok = True
        except Exception as ex:  # noqa: BLE001 - not installed / not importable
            unavailable["vllm"] = f"{type(ex).__name__}: {ex}"[:200]
    else:
        unavailable.setdefault("vllm", "needs a CUDA GPU")
    rows = []
    for bsz in batches:
        for ctx in contexts:
            kv_bytes = 2 * bsz * ctx * kvh * d * torch.finfo(dtype).bits // 8
            if kv_bytes > MAX_KV_BYTES:
                continue
            p = make_decode(bsz, ctx, h, kvh, d, dtype, device)
            ref = decode_reference(p)
            nbytes = kv_bytes + 2 * p["q"].numel() * p["q"].element_size() + bsz * -(-ctx // BLOCK_SIZE) * 4

            def work(ms: float, n: int = nbytes) -> dict[str, float]:
                w = {"gbps": n / ms / 1e6}
                if peak:
                    w["roofline"] = (n / (peak * 1e9) * 1e3) / ms
                return w

            fns = {"hexlayout": lambda p=p: torch.ops.hexlayout.paged_attention(**p)[0]}
            if vllm_ok:  # pragma: no cover - GPU only
                fns["vllm"] = vllm_decode(p)
            row = {
                "kind": "decode",
                "batch": bsz,
                "context": ctx,
                "H": h,
                "KVH": kvh,
                "D": d,
                "bytes": nbytes,
            }
            row.update(_measure(fns, ref, args, cuda, work))
            rows.append(row)
            print(json.dumps(row), flush=True)
    return rows


# ------------------------------------------------------------------------------------------ main
def run(args: argparse.Namespace) -> dict:
    import hexlayout.ops  # noqa: F401 - registers torch.ops.hexlayout.*
    import torch

    import hexlayout

    cuda = not args.dry_run
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if args.dtype == "bf16" else torch.float16
    dev_name = torch.cuda.get_device_name() if cuda else f"CPU emulator ({platform.machine()})"
    peak = peak_gbps(dev_name, args.peak_gbps if cuda else (args.peak_gbps or 1.0))
    unavailable: dict[str, str] = {}
    tri = None
    if cuda and not args.no_triton:  # pragma: no cover - GPU only
        try:
            tri = triton_attention()
        except Exception as ex:  # noqa: BLE001 - report and go on without triton
            unavailable["triton"] = f"{type(ex).__name__}: {ex}"[:200]
    rows = []
    if args.what in ("all", "prefill"):
        rows += run_prefill(args, dtype, device, tri, unavailable)
    if args.what in ("all", "decode"):
        rows += run_decode(args, dtype, device, peak, unavailable)
    meta: dict[str, Any] = {
        "device": dev_name,
        "capability": list(torch.cuda.get_device_capability()) if cuda else None,
        "torch": torch.__version__,
        "hexlayout": getattr(hexlayout, "__version__", "-"),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "dtype": args.dtype,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "peak_gbps": peak,
        "dry_run": bool(args.dry_run),
        "unavailable": unavailable,
        "targets": {"prefill_hd128_vs_cudnn": 1.0, "decode_roofline": 0.8},
    }
    for mod in ("triton", "vllm"):
        try:
            meta[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - not installed / not importable
            meta[mod] = None
    return {"meta": meta, "rows": rows}


def _f(r: dict, name: str, key: str, fmt: str = "{:.2f}") -> str:
    v = r.get(name, {}).get(key)
    return "-" if v is None else fmt.format(v)


def write_results(res: dict, out: Path) -> list[Path]:
    """JSON, markdown tables (prefill, decode) and a PNG (prefill TFLOP/s per implementation,
    decode fraction of the HBM roofline)."""
    meta, rows = res["meta"], res["rows"]
    out.mkdir(parents=True, exist_ok=True)
    dev = "".join(c if c.isalnum() or c in "-_." else "_" for c in meta["device"])
    stem = f"attention_{dev}{'_dry' if meta['dry_run'] else ''}"
    paths = [out / f"{stem}.json", out / f"{stem}.md", out / f"{stem}.png"]
    paths[0].write_text(json.dumps(res, indent=1))
    pre = [r for r in rows if r["kind"] == "prefill"]
    dec = [r for r in rows if r["kind"] == "decode"]
    impls = [
        n
        for n in ("hexlayout", "sdpa-cudnn", "sdpa-flash", "triton", "sdpa-math")
        if any(n in r for r in pre)
    ]
    lines = [
        f"# Attention {meta['dtype']} on {meta['device']} ({meta['date']})"
        + (" (dry run: CPU emulator, wall-clock times mean nothing)" if meta["dry_run"] else ""),
        "",
        f"torch {meta['torch']}, CUDA {meta['cuda']}, triton {meta.get('triton') or '-'}, "
        f"vLLM {meta.get('vllm') or '-'}, peak {meta['peak_gbps']} GB/s. Targets (H100): prefill hd 128 "
        ">= 1.0x cuDNN SDPA, decode >= 80 % of HBM bandwidth.",
        "",
    ]
    if meta["unavailable"]:
        lines += ["Not run: " + "; ".join(f"{k} ({v})" for k, v in meta["unavailable"].items()), ""]
    if pre:
        lines += [
            "## Prefill (TFLOP/s)",
            "",
            "| seq | batch | H | D | causal | " + " | ".join(impls) + " | hexlayout x baseline |",
            "|---|---|---|---|---|" + "---|" * (len(impls) + 1),
        ]
        for r in pre:
            ratio = (
                _f(r, "hexlayout", "vs_cudnn")
                if "vs_cudnn" in r["hexlayout"]
                else _f(r, "hexlayout", "vs_math")
            )
            lines.append(
                f"| {r['seq']} | {r['batch']} | {r['H']} | {r['D']} | {r['causal']} | "
                + " | ".join(_f(r, n, "tflops", "{:.3g}") for n in impls)
                + f" | {ratio} |"
            )
        lines.append("")
    if dec:
        lines += [
            "## Decode (query length 1)",
            "",
            "| batch | context | hexlayout ms | hexlayout GB/s | roofline | vLLM ms | vLLM roofline |",
            "|---|---|---|---|---|---|---|",
        ]
        for r in dec:
            lines.append(
                f"| {r['batch']} | {r['context']} | {_f(r, 'hexlayout', 'ms', '{:.4g}')} | "
                f"{_f(r, 'hexlayout', 'gbps', '{:.4g}')} | {_f(r, 'hexlayout', 'roofline')} | "
                f"{_f(r, 'vllm', 'ms', '{:.4g}')} | {_f(r, 'vllm', 'roofline')} |"
            )
        lines.append("")
    errs = [(r, n) for r in rows for n, v in r.items() if isinstance(v, dict) and "error" in v]
    if errs:
        lines += ["## Errors", ""] + [f"- {r['kind']} {n}: {r[n]['error']}" for r, n in errs] + [""]
    paths[1].write_text("\n".join(lines))

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(13, 5))
    ax = fig.add_subplot(1, 2, 1)
    labels = [f"{r['seq']}/{r['D']}{'c' if r['causal'] else ''}" for r in pre]
    for j, name in enumerate(impls):
        w = 0.8 / max(1, len(impls))
        ax.bar(
            [i + w * j for i in range(len(pre))],
            [r.get(name, {}).get("tflops", 0.0) for r in pre],
            width=w,
            label=name,
        )
    ax.set_xticks([i + 0.4 for i in range(len(pre))])
    ax.set_xticklabels(labels, rotation=90, fontsize=7)
    ax.set_ylabel("TFLOP/s")
    ax.set_title("prefill (seq / head size, c = causal)")
    ax.legend(fontsize=7)
    ax2 = fig.add_subplot(1, 2, 2)
    for name in ("hexlayout", "vllm"):
        pts = [(f"{r['batch']}x{r['context']}", r[name].get("roofline", 0.0)) for r in dec if name in r]
        if pts:
            ax2.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
    ax2.axhline(0.8, color="gray", linestyle="--", label="target 80 %")
    ax2.set_ylabel("fraction of HBM bandwidth")
    ax2.set_title("decode (batch x context)")
    ax2.tick_params(axis="x", rotation=90, labelsize=7)
    ax2.legend(fontsize=7)
    fig.suptitle(f"attention {meta['dtype']} on {meta['device']}")
    fig.tight_layout()
    fig.savefig(paths[2], dpi=120)
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    ap.add_argument("--what", default="all", choices=("all", "prefill", "decode"))
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--no-triton", action="store_true")
    ap.add_argument("--peak-gbps", type=float, default=None, help="HBM peak bandwidth for the roofline")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU through the emulator (no GPU)")
    args = ap.parse_args(argv)
    return run_benchmark("bench_attention", args, run, write_results)


if __name__ == "__main__":
    sys.exit(main())
