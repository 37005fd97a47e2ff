"""Static code quality of every shipped kernel, from its cubin; with ``--peers``, Triton side by side.

No GPU is needed: hexlayout's kernels are compiled with NVRTC (or nvcc), Triton's with
``triton.compile`` for a ``GPUTarget("cuda", 80 | 90, 32)``; both cubins are read with
cuobjdump by ``hexlayout.runtime.stats`` (definitions in its docstring: main loop, non-MMA
per k-tile = (loop instructions - MMA - ``@!PT`` padding) / k-tiles per iteration, per warp
instruction stream).

Kernels: the GEMM config space of ``hexlayout.ops.gemm.config`` (bf16, ``b`` given N x K,
no epilogue, the build ``hexlayout.ops.gemm`` launches for 4096 x 4096: output staged
through shared memory) for sm_80 and sm_90a (128x256x64 and 256x128x64 included), the
FlashAttention example at head dim 128 on sm_80 (its defaults BM=128, BN=32, 8 warps, and
BN=64), and the shipped paged attention kernel (``hexlayout.ops.attention.paged_kernels_sm80``, sm_80,
head sizes 64 / 128 / 256 with ``paged_attention_consts``: causal, block size 16, GQA 8,
decode; no Triton peer).

Serving kernels (``serving_cases``; ``--only serving``, or a family: ``--only moe``,
``moe_wna16``, ``moe_fp8``, ``gemm_fp8``, ``paged_attention``, ``attention_varlen``, ``kv_cache``,
``mamba1``): every
build the serving ops launch, traced from the ops' own launch code on ``meta`` tensors with the
build and launch recorded instead of run, for a grid of problems (bench_moe's Mixtral-8x7B and
DeepSeek-V3 TP8 shapes at T = 1..4096; attention head sizes 64 / 128 / 256), so the constants are
those the ops' config choosers pick and a new config or kernel module an op dispatches to shows
up by itself: the MoE alignment, gate-up / down (bf16, W4A16 / W8A16 AWQ / GPTQ, FP8; sm_80 /
sm_89 mma.sync and the sm_90a kernels), split-K, quantization and sum kernels, paged attention
(whole and split-KV, with its combine kernel) and varlen attention on sm_80 and sm_90a, the
KV-cache writer, the Mamba-1 selective scan and state update; the dense FP8 GEMM (``gemm_fp8``:
DeepSeek-V3's dense down and output projections, decode and prefill rows, general and, on sm_100a,
UE8M0 scales). Their table adds shared memory and
the problems that launch each build; no Triton peer (vLLM's Triton fused MoE is not part of Triton).

Peers (``--peers``, needs ``pip install triton``; the ``bench`` extra): written here after the
Triton tutorials' semantics, compiled for the same tiles, warps and stages:

- ``tt_matmul``: the tutorial matmul (grouped tile order, pointer blocks advanced by
  ``BK`` each k-step, K-masked loads, fp32 accumulator, masked store), specialized as
  Triton's JIT would for contiguous 4096 x 4096 operands (unit strides constant, the rest
  divisible by 16); ``b`` is N x K (``stride_bk = 1``) as hexlayout's ops default (two
  rows repeat the main tiles with ``b`` K x N, the tutorial's own layout, for both). sm_80.
- ``tt_matmul_tma`` / ``tt_matmul_tma_persistent`` (sm_90a): the persistent-matmul tutorial's
  descriptor kernel: TMA tensor descriptors, ``tl.range(..., warp_specialize=True)`` (Triton
  adds producer and consumer warp groups to ``num_warps=4``), one program per tile, or a
  persistent tile loop over ``GRID = 132`` programs for hexlayout's persistent config (not
  ``flatten``-ed: a flattened loop carries the epilogue in its body).
- ``tt_attention``: FlashAttention-2 forward as in the fused-attention tutorial (online
  softmax in base 2, ``q`` block resident, K / V blocks streamed), same ``[B, S, H, D]``
  layout, GQA and key masking as hexlayout's example (non-causal).

k-tiles per iteration: hexlayout counts MMA per iteration of its k-loop in the lowered
program; Triton's GEMM from its loop's SASS and ``BK`` (distinct MMA accumulators x
``BK / k``, ``stats.mma_per_ktile_from_bk``), its attention from the tile
(``2 BM·BN·HD / (16·8·16 · warps)``). Triton's ptxas log (``-v``, registers, spills, warnings)
is captured through ``TRITON_DUMP_PTXAS_LOG``.

Writes ``benchmarks/results/static[-<tag>].json`` and ``.md`` (machine, versions,
date) and prints the table.

    python benchmarks/bench_static.py            # hexlayout only
    python benchmarks/bench_static.py --peers    # and Triton side by side
    python benchmarks/bench_static.py --only serving --tag serving   # the serving kernels only
    python benchmarks/bench_static.py --only moe --arch sm_90a       # one family, one architecture
    python benchmarks/bench_static.py --only dequant   # W4A16 per dequantized weight beside Marlin
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import io
import itertools
import json
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))     # its sibling modules (peers_sm100, dequant_cost)
RESULTS = Path(__file__).resolve().parent / "results"


@dataclass(frozen=True)
class Case:
    """One kernel configuration measured for hexlayout (and a Triton peer of the same tile)."""

    kernel: str                # "gemm", "attention" (the FlashAttention example) or "paged_attention"
    arch: str
    BM: int
    BN: int
    BK: int                    # head dim for attention
    stages: int
    warps: int                 # sm_80: warps; sm_90a: consumer warp groups x 4
    persistent: bool = False
    shipped: bool = True
    b_layout: str = "nk"       # GEMM: b is N x K ("nk") or K x N ("kn")
    chunk: tuple[int, int] = (0, 0)   # attention: (CHUNK, DCHUNK) of the example (0 = whole block)
    cluster: int = 1           # GEMM: CTAs per cluster (sm_90a 2: A multicast; sm_100a 2: a CTA pair per MMA)

    @property
    def label(self) -> str:
        if self.kernel == "paged_attention":
            return f"paged hd{self.BK} BM{self.BM} BN{self.BN} {self.warps}w"
        if self.kernel == "attention":
            ch = f" chunk {self.chunk[0]}x{self.chunk[1]}" if any(self.chunk) else ""
            return f"FA fwd hd{self.BK} BM{self.BM} BN{self.BN} {self.warps}w{ch}"
        extra = " persistent" if self.persistent else ""
        extra += f" cluster {self.cluster}" if self.cluster > 1 else ""
        who = f"{self.warps // 4} consumers" if self.arch in ("sm_90a", "sm_100a") else f"{self.warps} warps"
        cand = "" if self.shipped else " (candidate)"
        lay = "" if self.b_layout == "nk" else " B KxN"
        return f"{self.BM}x{self.BN}x{self.BK} {self.stages}st {who}{extra}{cand}{lay}"


def cases() -> list[Case]:
    from hexlayout.ops.gemm.config import CONFIGS

    out = [Case("gemm", "sm_80", c.BM, c.BN, c.BK, c.STAGES, c.WARPS) for c in CONFIGS["sm_80"]]
    out += [Case("gemm", "sm_90a", c.BM, c.BN, c.BK, c.STAGES, 4 * c.CONSUMERS, c.persistent,
                 cluster=c.cluster) for c in CONFIGS["sm_90a"]]
    # sm_100a: the same kernel source with tcgen05 (peers: CuTe DSL's Blackwell examples,
    # benchmarks/peers_sm100.py; the markdown puts them beside these rows)
    out += [Case("gemm", "sm_100a", c.BM, c.BN, c.BK, c.STAGES, 4 * c.CONSUMERS, c.persistent,
                 cluster=c.cluster) for c in CONFIGS["sm_100a"]]
    # the example's defaults: BN=64 with S per 32-key sub-block and q per 64 columns
    out.append(Case("attention", "sm_80", 128, 32, 128, 2, 8, shipped=False))
    out.append(Case("attention", "sm_80", 128, 64, 128, 2, 8, shipped=False))
    out.append(Case("attention", "sm_80", 128, 64, 128, 2, 8, chunk=(32, 64)))
    # b given K x N (the Triton tutorial's own layout), for the two main tiles
    out.append(Case("gemm", "sm_80", 128, 128, 32, 3, 4, b_layout="kn"))
    h = CONFIGS["sm_90a"][1]
    out.append(Case("gemm", "sm_90a", h.BM, h.BN, h.BK, h.STAGES, 4 * h.CONSUMERS, b_layout="kn"))
    # the shipped paged attention kernel (sm_80), as the op configures it for a decode step
    from hexlayout.ops.attention.paged import paged_attention_consts

    for hd in (64, 128, 256):
        c = paged_attention_consts(hd, *PAGED)
        out.append(Case("paged_attention", "sm_80", c["BM"], c["BN"], c["HEAD_DIM"], 1, c["WARPS"]))
    return out


#: ``paged_attention_consts`` arguments after the head size: block size, GQA group, max
#: query length, causal, window, softcap
PAGED = (16, 8, 1, True, False, False)


# --- serving kernels: cases traced from the ops' own launch code ---------------------------------
#
# Every kernel the serving ops (fused MoE: bf16 / f16, W4A16 / W8A16, FP8; paged and varlen
# attention; the KV-cache writer) launch, with the constants the ops choose: each op's launch code
# (``run_fused_moe``, ``run_paged_attention``, ...) runs on ``meta`` tensors for a grid of problem
# sizes with ``build_for`` / ``run_kernel`` replaced by a recorder (no memory, no compile, no
# launch; the architecture is the one the ops build for off CUDA, ``HEXLAYOUT_EMULATE_ARCH``).
# Configs come from the ops' own choosers (``moe_config``, ``wna16_config``,
# ``wna16_sm90_config``, ``fp8_block_m``, ``choose_split_k``, ``paged_attention_consts``,
# ``attention_varlen_consts``, ...), so a new config, or a new kernel module an op dispatches to
# (by architecture or size), appears here without an edit. A new op is one line of ``SERVING``.

#: MoE problem shapes, name -> (E, k, H, I): bench_moe's models (Mixtral-8x7B, DeepSeek-V3 TP8 slice)
MOE_MODELS = {"mixtral-8x7b": (8, 2, 4096, 14336), "deepseek-v3-tp8": (256, 8, 7168, 256)}
#: token counts of the MoE problems (decode to prefill: every size range a chooser splits)
MOE_TOKENS = tuple(1 << i for i in range(13))
#: activation dtypes: bf16 for every model, f16 too for these (the kernels' f16 code differs:
#: conversions, the W4A16 / W8A16 dequantization)
MOE_F16_MODELS = ("mixtral-8x7b",)
#: W4A16 / W8A16 checkpoint formats: (quant_format, bits); group sizes traced (32: BK 32)
WNA16_FORMATS = (("awq", 4), ("gptq", 4), ("gptq", 8))
WNA16_GROUPS = (32, 128)
#: attention problems: head sizes, query heads / KV heads (GQA 8), KV block size
ATTN_HEAD_SIZES = (64, 128, 256)
ATTN_HEADS = (32, 4)
ATTN_BLOCK = 16
#: split-KV count of the traced split decode (the op picks up to 8 on a GPU: ``choose_splits``)
PAGED_SPLITS = 4


@dataclass(frozen=True)
class ServingCase:
    """One build of a serving kernel: the kernel (``module.factory(...)``), architecture and
    constants, with the op families and traced problems that launch it."""

    family: str                       # the op family of the first problem that launches it
    arch: str
    module: str                       # e.g. "hexlayout.ops.moe.kernels_sm80"
    factory: str                      # e.g. "moe_gate_up_kernel"
    name: str                         # the kernel's name, e.g. "moe_gate_up_bf16_silu"
    consts: tuple[tuple[str, Any], ...]
    kernel: Any = field(compare=False, repr=False)
    problems: tuple[str, ...] = field(default=(), compare=False)
    families: tuple[str, ...] = field(default=(), compare=False)

    @property
    def label(self) -> str:
        return f"{self.name} " + " ".join(f"{k}={_short(v)}" for k, v in self.consts)

    def to_dict(self) -> dict[str, Any]:
        return {"family": self.family, "families": list(self.families), "arch": self.arch,
                "module": self.module, "factory": self.factory, "name": self.name,
                "consts": dict(self.consts), "problems": list(self.problems)}


def _short(v: Any) -> str:
    return str(int(v)) if isinstance(v, bool) else str(v)


def _meta_tensor(shape: tuple[int, ...], dtype: Any) -> Any:
    import torch

    return torch.empty(shape, dtype=dtype, device="meta")


def _routing(t: int, k: int, h: int, dtype: Any) -> tuple[Any, Any, Any]:
    import torch

    return _meta_tensor((t, h), dtype), _meta_tensor((t, k), torch.float32), _meta_tensor((t, k), torch.int32)


def _moe_dtypes(model: str) -> list[tuple[Any, str]]:
    """``(torch dtype, problem-label suffix)`` of the activations traced for ``model``."""
    import torch

    return [(torch.bfloat16, "")] + ([(torch.float16, " f16")] if model in MOE_F16_MODELS else [])


def _moe_problems(arch: str) -> Iterator[tuple[str, Callable[[], Any]]]:
    """``fused_moe`` with bf16 weights (``run_fused_moe``); then, where ``choose_split_k`` splits
    a grouped GEMM for the architecture's SM count, the same problem with that ``SPLIT_K``
    forced (off CUDA the op never splits; ``HEXLAYOUT_MOE_SPLIT_K`` forces it for every GEMM
    that can split, so a forced problem may also build the other GEMM's split kernel)."""
    import inspect

    from hexlayout.ops.gemm.config import SM_COUNT
    from hexlayout.ops.moe.op import run_fused_moe
    from hexlayout.ops.moe.splitk import SPLIT_K_ENV, choose_split_k

    per_gemm = "gemm" in inspect.signature(choose_split_k).parameters
    for model, (e, k, h, i) in MOE_MODELS.items():
        for act, dname in _moe_dtypes(model):
            w13, w2 = _meta_tensor((e, 2 * i, h), act), _meta_tensor((e, h, i), act)
            for t in MOE_TOKENS:
                x, tw, ids = _routing(t, k, h, act)
                gemms = ("gate_up", "down") if per_gemm else ("gate_up",)
                splits = {choose_split_k(t, k, e, h, i, SM_COUNT[arch], **({"gemm": g} if per_gemm else {}))
                          for g in gemms}
                for split in sorted(splits | {1}):
                    def call(x=x, w13=w13, w2=w2, tw=tw, ids=ids, split=split) -> Any:
                        with _env(SPLIT_K_ENV, str(split)):
                            return run_fused_moe(x, w13, w2, tw, ids)

                    yield f"{model} T={t}{dname}" + (f" split-K {split} (forced)" if split > 1 else ""), call


def _wna16_problems(arch: str) -> Iterator[tuple[str, Callable[[], Any]]]:
    """``fused_moe_wna16`` (``run_fused_moe_wna16``) for AWQ 4-bit, GPTQ 4 / 8-bit and the group
    sizes ``WNA16_GROUPS``, with ``prepare_wna16``'s weight shapes."""
    import torch
    from hexlayout.ops.moe.splitk import SPLIT_K_ENV
    from hexlayout.ops.moe.wna16 import k_tile, run_fused_moe_wna16
    from hexlayout.ops.moe.wna16_layout import padded_rows

    def weights(e: int, kk: int, n: int, bits: int, group: int, awq: bool, act: Any,
                gate_up: bool = False) -> tuple[Any, Any, Any]:
        bk = k_tile(kk, group)
        g = 1 if group == -1 else kk // group
        # the offline layout's shape: N padded to 64-row tiles (gate and up apart), K to k-tiles
        q = _meta_tensor((e * padded_rows(n, 64, gate_up), -(-kk // bk) * bk * bits // 8), torch.uint8)
        s = _meta_tensor((e, g, n), act)
        return q, s, (_meta_tensor((e, g, n), torch.uint8) if awq else None)  # AWQ: a byte per zero

    for model, (e, k, h, i) in MOE_MODELS.items():
        variants = itertools.product(WNA16_FORMATS, WNA16_GROUPS, _moe_dtypes(model))
        for (fmt, bits), group, (act, dname) in variants:
            w13 = weights(e, h, 2 * i, bits, group, fmt == "awq", act, gate_up=True)
            w2 = weights(e, i, h, bits, group, fmt == "awq", act)
            for t in MOE_TOKENS:
                x, tw, ids = _routing(t, k, h, act)
                splits = {_wna16_split(arch, t, k, e, kk, n, group) for kk, n in ((h, i), (i, h))}
                for split in sorted(splits | {1}):
                    def call(x=x, tw=tw, ids=ids, w13=w13, w2=w2, fmt=fmt, bits=bits, group=group,
                             split=split) -> Any:
                        with _env(SPLIT_K_ENV, str(split)):
                            return run_fused_moe_wna16(x, *w13, *w2, tw, ids, fmt, bits, group, group)

                    yield (f"{model} T={t}{dname} {fmt} w{bits} g{group}"
                           + (f" split-K {split} (forced)" if split > 1 else "")), call


def _wna16_split(arch: str, t: int, k: int, e: int, size_k: int, size_n: int, group: int) -> int:
    """``wna16_split_k`` for a W4A16 / W8A16 GEMM on ``arch``'s SM count, with the tiles the op
    gives it (``wna16_config``; on sm_90a / sm_100a ``BM`` from ``wna16_sm90_config`` and 64
    columns per warp group)."""
    from hexlayout.ops.gemm.config import SM_COUNT
    from hexlayout.ops.moe.wna16 import wna16_config, wna16_sm90_config, wna16_split_k

    cfg = wna16_config(t * k, e, size_k, group)
    if arch in ("sm_90a", "sm_100a"):
        sm90 = wna16_sm90_config(t * k, e, size_n)
        cfg.update(BM=sm90["BM"], BN=64 * sm90["WG"])
    return wna16_split_k(t, k, e, size_k, size_n, SM_COUNT[arch], {c: cfg[c] for c in ("BM", "BN", "BK")})


def _fp8_problems(arch: str) -> Iterator[tuple[str, Callable[[], Any]]]:
    """``fused_moe_fp8`` (``run_fused_moe_fp8``) with per-expert and 128 x 128 block scales (on
    sm_100a also UE8M0 block scales, the block-scaled-MMA kernels); split-K where ``fp8_split_k``
    splits a GEMM for the architecture's SM count (forced, as for bf16)."""
    import torch
    from hexlayout.ops.gemm.config import SM_COUNT
    from hexlayout.ops.moe.fp8 import fp8_block_m, fp8_split_k, run_fused_moe_fp8
    from hexlayout.ops.moe.splitk import SPLIT_K_ENV

    formats = [((), ""), ((128, 128), "")] + ([((128, 128), "ue8m0")] if arch == "sm_100a" else [])
    for model, (e, k, h, i) in MOE_MODELS.items():
        for (block, fmt), (act, dname) in itertools.product(formats, _moe_dtypes(model)):
            fp8 = torch.float8_e4m3fn
            w13, w2 = _meta_tensor((e, 2 * i, h), fp8), _meta_tensor((e, h, i), fp8)
            if block:
                s13 = _meta_tensor((e, -(-2 * i // 128), -(-h // 128)), torch.float32)
                s2 = _meta_tensor((e, -(-h // 128), -(-i // 128)), torch.float32)
            else:
                s13 = s2 = _meta_tensor((e,), torch.float32)
            for t in MOE_TOKENS:
                x, tw, ids = _routing(t, k, h, act)
                bm = fp8_block_m(t * k, e, arch)
                splits = {fp8_split_k(t, k, e, h, i, SM_COUNT[arch], bm, g) for g in ("gate_up", "down")}
                for split in sorted(splits | {1}):
                    def call(x=x, tw=tw, ids=ids, w13=w13, w2=w2, s13=s13, s2=s2, block=block,
                             split=split, fmt=fmt) -> Any:
                        with _env(SPLIT_K_ENV, str(split)):
                            return run_fused_moe_fp8(x, w13, s13, w2, s2, tw, ids, list(block),
                                                     scale_format=fmt)

                    scales = f"block 128x128{' UE8M0' if fmt else ''}" if block else "per-expert"
                    yield (f"{model} T={t}{dname} {scales} scales"
                           + (f" split-K {split} (forced)" if split > 1 else "")), call


#: ``gemm_fp8`` shapes (N, K): DeepSeek-V3's dense MLP down projection and attention output projection
GEMM_FP8_SHAPES = {"DeepSeek-V3 dense down": (7168, 18432), "DeepSeek-V3 o_proj": (7168, 16384)}
#: rows of ``a`` (tokens): decode (16-row tiles), 64 (the swap-AB kernel's largest tile), prefill
#: (the warp-specialized 128-row kernel on sm_90a / sm_100a)
GEMM_FP8_TOKENS = (1, 64, 512)


def _gemm_fp8_problems(arch: str) -> Iterator[tuple[str, Callable[[], Any]]]:
    """``gemm_fp8`` (``run_gemm_fp8``) with general scales and, on sm_100a, UE8M0 scales (the
    block-scaled-MMA kernel)."""
    import torch
    from hexlayout.ops.gemm.fp8 import run_gemm_fp8

    formats = ("", "ue8m0") if arch == "sm_100a" else ("",)
    for (model, (n, k)), m, fmt in itertools.product(GEMM_FP8_SHAPES.items(), GEMM_FP8_TOKENS, formats):
        fp8 = torch.float8_e4m3fn
        a, b = _meta_tensor((m, k), fp8), _meta_tensor((n, k), fp8)
        sa = _meta_tensor((m, -(-k // 128)), torch.float32)
        sb = _meta_tensor((-(-n // 128), -(-k // 128)), torch.float32)

        def call(a=a, b=b, sa=sa, sb=sb, fmt=fmt) -> Any:
            return run_gemm_fp8(a, b, sa, sb, torch.bfloat16, None, fmt)

        yield f"{model} M={m} bf16 {'UE8M0' if fmt else 'general'} scales", call


def _paged_problems(arch: str) -> Iterator[tuple[str, Callable[[], Any]]]:
    """``paged_attention`` (``run_paged_attention``): a causal decode step (4 sequences, one
    query each, 4096 keys), whole and split-KV (``PAGED_SPLITS``, with the combine kernel)."""
    import torch
    from hexlayout.ops.attention.paged import run_paged_attention

    h, kvh = ATTN_HEADS
    b, blocks = 4, 4096 // ATTN_BLOCK
    for d in ATTN_HEAD_SIZES:
        q = _meta_tensor((b, h, d), torch.float16)
        kc, vc = (_meta_tensor((b * blocks, ATTN_BLOCK, kvh, d), torch.float16) for _ in range(2))
        cu, used = _meta_tensor((b + 1,), torch.int32), _meta_tensor((b,), torch.int32)
        table = _meta_tensor((b, blocks), torch.int32)
        for splits in (1, PAGED_SPLITS):
            def call(q=q, kc=kc, vc=vc, cu=cu, used=used, table=table, splits=splits) -> Any:
                return run_paged_attention(q, kc, vc, cu, used, table, 1, 4096, None, True, (-1, -1), 0.0,
                                           "NHD", splits)

            yield f"decode hd{d} GQA {h // kvh}" + (f" split-KV {splits}" if splits > 1 else ""), call


def _varlen_problems(arch: str) -> Iterator[tuple[str, Callable[[], Any]]]:
    """``attention_varlen`` (``run_attention_varlen``): causal prefill, and a sliding window
    with softcap (the heavier constants); TMA-compatible tensors (sm_90a: the wgmma kernel)."""
    import torch
    from hexlayout.ops.attention.varlen import run_attention_varlen

    h, kvh = ATTN_HEADS
    b, tq = 4, 4096
    for d in ATTN_HEAD_SIZES:
        q = _meta_tensor((tq, h, d), torch.float16)
        kv = _meta_tensor((tq, kvh, d), torch.float16)
        cu = _meta_tensor((b + 1,), torch.int32)
        for name, window, cap in (("causal", (-1, -1), 0.0), ("window 256 softcap", (256, 0), 30.0)):
            def call(q=q, kv=kv, cu=cu, window=window, cap=cap) -> Any:
                return run_attention_varlen(q, kv, kv, cu, cu, tq // b, tq // b, None, True, window, cap)

            yield f"prefill hd{d} GQA {h // kvh} {name}", call


def _mla_problems(arch: str) -> Iterator[tuple[str, Callable[[], Any]]]:
    """``mla_decode`` (DeepSeek's latent 512 + rope 64, 16 heads, block 64: 64 decode queries over
    a 4096-key context) and ``mla_reshape_and_cache`` (256 tokens), through their host paths."""
    import torch
    from hexlayout.ops.attention.mla import run_mla_decode
    from hexlayout.ops.attention.mla_cache import run_mla_reshape_and_cache

    b, h, bs = 64, 16, 64
    q = _meta_tensor((b, h, 576), torch.bfloat16)
    cache = _meta_tensor((b * 4096 // bs, bs, 576), torch.bfloat16)
    cu, used = _meta_tensor((b + 1,), torch.int32), _meta_tensor((b,), torch.int32)
    table = _meta_tensor((b, 4096 // bs), torch.int32)

    def decode() -> Any:
        return run_mla_decode(q, cache, cu, used, table, 1, 4096, None, 512)

    yield "mla_decode H 16 latent 512 + rope 64", decode
    kv_c, k_pe, slots = (_meta_tensor((256, 512), torch.bfloat16), _meta_tensor((256, 64), torch.bfloat16),
                         _meta_tensor((256,), torch.int64))

    def write() -> Any:
        return run_mla_reshape_and_cache(kv_c, k_pe, cache, slots)

    yield "mla_reshape_and_cache 256 tokens", write


def _kv_cache_problems(arch: str) -> Iterator[tuple[str, Callable[[], Any]]]:
    """``reshape_and_cache`` (``run_reshape_and_cache``): 256 new tokens into NHD caches."""
    import torch
    from hexlayout.ops.kv_cache.op import run_reshape_and_cache

    _, kvh = ATTN_HEADS
    t = 256
    for d in ATTN_HEAD_SIZES:
        key = _meta_tensor((t, kvh, d), torch.float16)
        cache = _meta_tensor((1024, ATTN_BLOCK, kvh, d), torch.float16)
        slots = _meta_tensor((t,), torch.int64)

        def call(key=key, cache=cache, slots=slots) -> Any:
            return run_reshape_and_cache(key, key, cache, cache, slots, "NHD")

        yield f"hd{d} block {ATTN_BLOCK}", call


def _mamba1_problems(arch: str) -> Iterator[tuple[str, Callable[[], Any]]]:
    """``selective_scan`` (Mamba-130m's d_inner 1536, N 16, batch 8 x L 2048, bf16, every option)
    and ``selective_state_update`` (Mamba-1: dim 1536, N 16, f32 state; Mamba-2: 80 heads x 64,
    N 128, bf16 state), through their ``run_*`` host paths."""
    import torch
    from hexlayout.ops.mamba.selective_scan import run_selective_scan
    from hexlayout.ops.mamba.state_update import run_selective_state_update

    bf, f32 = torch.bfloat16, torch.float32
    u = _meta_tensor((8, 1536, 2048), bf)
    a, bc, d = _meta_tensor((1536, 16), f32), _meta_tensor((8, 16, 2048), bf), _meta_tensor((1536,), f32)

    def scan() -> Any:
        return run_selective_scan(u, u, a, bc, bc, d, u, d, True, True)

    yield "selective_scan dim 1536 N 16 L 2048", scan
    idx = _meta_tensor((8,), torch.int32)
    for what, state, x, dts_, A, B, D in (
        ("Mamba-1 dim 1536 N 16", (16, 1536, 16), (8, 1536), (8, 1536), (1536, 16), (8, 16), (1536,)),
        ("Mamba-2 H 80 P 64 N 128", (16, 80, 64, 128), (8, 80, 64), (8, 80), (80,), (8, 1, 128), (80,)),
    ):
        st = _meta_tensor(state, f32 if len(state) == 3 else bf)
        xs, dts, As, Bs, Ds = (_meta_tensor(x, bf), _meta_tensor(dts_, bf), _meta_tensor(A, f32),
                               _meta_tensor(B, bf), _meta_tensor(D, f32))

        def update(st=st, xs=xs, dts=dts, As=As, Bs=Bs, Ds=Ds) -> Any:
            return run_selective_state_update(st, xs, dts, As, Bs, Bs, Ds, xs, Ds, True, idx)

        yield f"selective_state_update {what}", update
def _mamba_problems(arch: str) -> Iterator[tuple[str, Callable[[], Any]]]:
    """Mamba-2's kernels (a Nemotron-H-like layer: dim 4096 + 2·G·N for the convolution, H 64,
    P 64, G 8, N 128): ``causal_conv1d`` over 2048 packed positions of 4 sequences,
    ``causal_conv1d_update`` for 64 rows, ``ssd_scan`` over the same packed positions."""
    import torch
    from hexlayout.ops.mamba.conv1d import run_causal_conv1d, run_causal_conv1d_update
    from hexlayout.ops.mamba.ssd import run_ssd_scan

    t, dim, h, p, g, n = 2048, 6144, 64, 64, 8, 128
    x = _meta_tensor((t, dim), torch.bfloat16).t()          # vLLM: the projection's columns
    w = _meta_tensor((dim, 4), torch.bfloat16)
    cu = _meta_tensor((5,), torch.int32)
    state = _meta_tensor((256, 3, dim), torch.bfloat16).transpose(1, 2)
    xd, idx = _meta_tensor((64, dim), torch.bfloat16), _meta_tensor((64,), torch.int32)
    xs, bc = _meta_tensor((1, t, h, p), torch.bfloat16), _meta_tensor((1, t, g, n), torch.bfloat16)
    dt, a = _meta_tensor((1, t, h), torch.float32), _meta_tensor((h,), torch.float32)
    yield "conv1d packed 4 seqs width 4 silu", lambda: run_causal_conv1d(x, w, None, "silu", None, cu)
    yield "conv1d update batch 64 width 4 silu", lambda: run_causal_conv1d_update(xd, state, w, None, "silu",
                                                                                  idx)
    yield "ssd packed 4 seqs softplus D z", lambda: run_ssd_scan(xs, dt, a, bc, bc, a, xs, a, True,
                                                                 (0.0, float("inf")), None, cu)


#: The serving op families: name -> (architectures, problems). The architectures are those the
#: op builds distinct code for (sm_80 code runs on sm_89; the fp8 kernels need sm_89). A new op
#: is one line here; a kernel module an existing op dispatches to needs none.
SERVING: dict[str, tuple[tuple[str, ...], Callable[[str], Iterator[tuple[str, Callable[[], Any]]]]]] = {
    "moe": (("sm_80", "sm_90a"), _moe_problems),
    "moe_wna16": (("sm_80", "sm_90a", "sm_100a"), _wna16_problems),
    "moe_fp8": (("sm_89", "sm_90a", "sm_100a"), _fp8_problems),
    "gemm_fp8": (("sm_89", "sm_90a", "sm_100a"), _gemm_fp8_problems),
    "paged_attention": (("sm_80", "sm_90a"), _paged_problems),
    "attention_varlen": (("sm_80", "sm_90a"), _varlen_problems),
    "kv_cache": (("sm_80", "sm_90a"), _kv_cache_problems),
    "mla": (("sm_80", "sm_90a"), _mla_problems),
    "mamba1": (("sm_80", "sm_90a"), _mamba1_problems),
    "mamba": (("sm_80", "sm_90a"), _mamba_problems),
}


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


@contextlib.contextmanager
def _recording(arch: str) -> Iterator[list[tuple[Any, dict[str, Any]]]]:
    """Inside: the ops' ``build_for`` records ``(kernel, constants)`` and ``run_kernel`` does
    nothing, in every ``hexlayout.ops`` module that imported them; the ops build for ``arch``."""
    from hexlayout.ops.host import launch as aa

    seen: list[tuple[Any, dict[str, Any]]] = []
    real = {"build_for": aa.build_for, "run_kernel": aa.run_kernel}

    def build_for(kernel: Any, device: Any, consts: dict[str, Any]) -> Any:
        seen.append((kernel, dict(consts)))
        return None

    def run_kernel(*args: Any, **kwargs: Any) -> None:
        return None

    fake = {"build_for": build_for, "run_kernel": run_kernel}

    def swap(old: dict[str, Any], new: dict[str, Any]) -> None:
        for name, mod in list(sys.modules.items()):
            if name.startswith("hexlayout.ops") and mod is not None:
                for attr in old:
                    if getattr(mod, attr, None) is old[attr]:
                        setattr(mod, attr, new[attr])

    swap(real, fake)
    try:
        with _env("HEXLAYOUT_EMULATE_ARCH", arch):
            yield seen
    finally:   # modules first imported inside got the recorder from host.launch: restored too
        swap(fake, real)


def _import_ops() -> None:
    """Import every ``hexlayout.ops`` module, so ``_recording`` patches all of them."""
    import importlib
    import pkgutil

    import hexlayout.ops as ops

    for info in pkgutil.walk_packages(ops.__path__, prefix="hexlayout.ops."):
        importlib.import_module(info.name)


def serving_cases(families: list[str] | None = None, archs: list[str] | None = None) -> list[ServingCase]:
    """The builds the serving ops launch for ``SERVING``'s problems (all families / their
    architectures unless narrowed), one case per (architecture, kernel, constants), in
    first-launch order; each lists the families and problems that launch it."""
    _import_ops()
    found: dict[tuple[Any, ...], dict[str, Any]] = {}
    for fam, (fam_archs, problems) in SERVING.items():
        if families is not None and fam not in families:
            continue
        for arch in fam_archs:
            if archs is not None and arch not in archs:
                continue
            for what, call in problems(arch):
                with _recording(arch) as seen:
                    call()
                for kernel, consts in seen:
                    items = tuple(sorted(consts.items()))
                    key = (arch, kernel.fn.__module__, kernel.fn.__qualname__, kernel.name, items)
                    entry = found.setdefault(key, {"family": fam, "kernel": kernel, "problems": [],
                                                   "families": []})
                    if what not in entry["problems"]:
                        entry["problems"].append(what)
                    if fam not in entry["families"]:
                        entry["families"].append(fam)
    out = []
    for (arch, module, qualname, name, items), entry in found.items():
        out.append(ServingCase(entry["family"], arch, module, qualname.split(".<locals>")[0], name, items,
                               entry["kernel"], tuple(entry["problems"]), tuple(entry["families"])))
    return out


def serving_stats(case: ServingCase) -> dict[str, Any]:
    """``Build.stats`` of ``case`` compiled for its architecture (NVRTC or nvcc, no GPU)."""
    from hexlayout.runtime import build

    t = time.perf_counter()
    d = build(case.kernel, case.arch, **dict(case.consts)).stats.to_dict()
    d["seconds"] = time.perf_counter() - t
    return d


# --- hexlayout ----------------------------------------------------------------------------------

def hexlayout_build(case: Case) -> Any:
    """hexlayout's build of ``case`` (compiled for its architecture)."""
    from hexlayout.runtime import build

    if case.kernel == "gemm":
        from hexlayout.ops.gemm.config import GemmConfig
        from hexlayout.ops.gemm.op import gemm_build

        from hexlayout.lang import bf16

        if case.arch in ("sm_90a", "sm_100a"):
            cfg = GemmConfig(case.arch, case.BM, case.BN, case.BK, case.stages, CONSUMERS=case.warps // 4,
                             persistent=case.persistent, cluster=case.cluster)
        else:
            cfg = GemmConfig(case.arch, case.BM, case.BN, case.BK, case.stages, case.warps)
        return gemm_build(bf16, case.b_layout, (False, False, "none", False), case.arch, cfg, 4096, 4096)
    if case.kernel == "paged_attention":
        from hexlayout.ops.attention.paged import paged_attention_consts, paged_whole_pages
        from hexlayout.ops.attention.paged_kernels_sm80 import paged_attention_kernel

        from hexlayout.lang import f16

        # the op's kernel for this head size (64 / 128 / 256, no padding)
        kernel = paged_attention_kernel(f16, False, None, paged_whole_pages(PAGED[0], case.BK))
        return build(kernel, case.arch, **paged_attention_consts(case.BK, *PAGED))
    from hexlayout.lang.examples.flash_attention import flash_attention_fwd

    return build(flash_attention_fwd, case.arch, BM=case.BM, BN=case.BN, HEAD_DIM=case.BK, WARPS=case.warps,
                 CHUNK=case.chunk[0], DCHUNK=case.chunk[1])


def hexlayout_stats(case: Case) -> dict[str, Any]:
    """``Build.stats`` of hexlayout's kernel for ``case``."""
    t = time.perf_counter()
    d = hexlayout_build(case).stats.to_dict()
    d["seconds"] = time.perf_counter() - t
    return d


# --- Triton peers -------------------------------------------------------------------------------

def _triton_kernels() -> tuple[Any, Any, Any, Any]:
    import triton
    import triton.language as tl

    @triton.jit
    def tt_matmul(a_ptr, b_ptr, c_ptr, M, N, K, stride_am, stride_ak, stride_bk, stride_bn, stride_cm,
                  stride_cn, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, GROUP_M: tl.constexpr):
        # grouped ("super-tile") order of output tiles, for L2 reuse
        pid = tl.program_id(0)
        tiles_m = tl.cdiv(M, BM)
        tiles_n = tl.cdiv(N, BN)
        per_group = GROUP_M * tiles_n
        first_m = (pid // per_group) * GROUP_M
        rows_in_group = min(tiles_m - first_m, GROUP_M)
        tile_m = first_m + (pid % per_group) % rows_in_group
        tile_n = (pid % per_group) // rows_in_group
        rm = (tile_m * BM + tl.arange(0, BM)) % M
        rn = (tile_n * BN + tl.arange(0, BN)) % N
        rk = tl.arange(0, BK)
        pa = a_ptr + rm[:, None] * stride_am + rk[None, :] * stride_ak
        pb = b_ptr + rk[:, None] * stride_bk + rn[None, :] * stride_bn
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kt in range(0, tl.cdiv(K, BK)):
            left = K - kt * BK
            a = tl.load(pa, mask=rk[None, :] < left, other=0.0)
            b = tl.load(pb, mask=rk[:, None] < left, other=0.0)
            acc = tl.dot(a, b, acc)
            pa += BK * stride_ak
            pb += BK * stride_bk
        cm = tile_m * BM + tl.arange(0, BM)
        cn = tile_n * BN + tl.arange(0, BN)
        pc = c_ptr + cm[:, None] * stride_cm + cn[None, :] * stride_cn
        tl.store(pc, acc.to(c_ptr.dtype.element_ty), mask=(cm[:, None] < M) & (cn[None, :] < N))

    @triton.jit
    def tt_attention(q_ptr, k_ptr, v_ptr, o_ptr, qk_scale, Sq, Sk, H, KVH, sqb, sqs, sqh, skb, sks, skh,
                     BM: tl.constexpr, BN: tl.constexpr, HD: tl.constexpr):
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
        b = bh // H
        h = bh % H
        kvh = h // (H // KVH)
        rm = pid_m * BM + tl.arange(0, BM)
        rn = tl.arange(0, BN)
        rd = tl.arange(0, HD)
        q_base = q_ptr + b * sqb + h * sqh
        q = tl.load(q_base + rm[:, None] * sqs + rd[None, :], mask=rm[:, None] < Sq, other=0.0)
        k_base = k_ptr + b * skb + kvh * skh
        v_base = v_ptr + b * skb + kvh * skh
        m_i = tl.full((BM,), float("-inf"), tl.float32)
        l_i = tl.zeros((BM,), tl.float32)
        acc = tl.zeros((BM, HD), tl.float32)
        for n0 in range(0, Sk, BN):
            cols = n0 + rn
            kt = tl.load(k_base + cols[None, :] * sks + rd[:, None], mask=cols[None, :] < Sk, other=0.0)
            s = tl.dot(q, kt) * qk_scale
            s = tl.where(cols[None, :] < Sk, s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            p = tl.math.exp2(s - m_new[:, None])
            alpha = tl.math.exp2(m_i - m_new)
            l_i = l_i * alpha + tl.sum(p, 1)
            acc = acc * alpha[:, None]
            v = tl.load(v_base + cols[:, None] * sks + rd[None, :], mask=cols[:, None] < Sk, other=0.0)
            acc = tl.dot(p.to(tl.float16), v, acc)
            m_i = m_new
        acc = acc / l_i[:, None]
        o_base = o_ptr + b * sqb + h * sqh
        tl.store(o_base + rm[:, None] * sqs + rd[None, :], acc.to(tl.float16), mask=rm[:, None] < Sq)

    @triton.jit
    def tt_matmul_tma(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                      B_NK: tl.constexpr):
        # one output tile per program; TMA descriptors; Triton warp-specializes the k-loop
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
        if B_NK:
            b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
        else:
            b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
        pid = tl.program_id(0)
        tiles_n = tl.cdiv(N, BN)
        m0 = (pid // tiles_n) * BM
        n0 = (pid % tiles_n) * BN
        acc = tl.zeros((BM, BN), dtype=tl.float32)
        for kt in tl.range(0, tl.cdiv(K, BK), warp_specialize=True):
            a = a_desc.load([m0, kt * BK])
            if B_NK:
                acc = tl.dot(a, b_desc.load([n0, kt * BK]).T, acc)
            else:
                acc = tl.dot(a, b_desc.load([kt * BK, n0]), acc)
        c_desc.store([m0, n0], acc.to(tl.bfloat16))

    @triton.jit
    def tt_matmul_tma_persistent(a_ptr, b_ptr, c_ptr, M, N, K, BM: tl.constexpr, BN: tl.constexpr,
                                 BK: tl.constexpr, B_NK: tl.constexpr, GRID: tl.constexpr):
        # persistent: each program walks tiles pid, pid + GRID, ...; the tile loop is
        # warp-specialized (tutorial 09's descriptor kernel, without flattening the k-loop into it)
        a_desc = tl.make_tensor_descriptor(a_ptr, shape=[M, K], strides=[K, 1], block_shape=[BM, BK])
        if B_NK:
            b_desc = tl.make_tensor_descriptor(b_ptr, shape=[N, K], strides=[K, 1], block_shape=[BN, BK])
        else:
            b_desc = tl.make_tensor_descriptor(b_ptr, shape=[K, N], strides=[N, 1], block_shape=[BK, BN])
        c_desc = tl.make_tensor_descriptor(c_ptr, shape=[M, N], strides=[N, 1], block_shape=[BM, BN])
        tiles_n = tl.cdiv(N, BN)
        num_tiles = tl.cdiv(M, BM) * tiles_n
        k_tiles = tl.cdiv(K, BK)
        for tile in tl.range(tl.program_id(0), num_tiles, GRID, warp_specialize=True):
            m0 = (tile // tiles_n) * BM
            n0 = (tile % tiles_n) * BN
            acc = tl.zeros((BM, BN), dtype=tl.float32)
            for kt in range(k_tiles):
                a = a_desc.load([m0, kt * BK])
                if B_NK:
                    acc = tl.dot(a, b_desc.load([n0, kt * BK]).T, acc)
                else:
                    acc = tl.dot(a, b_desc.load([kt * BK, n0]), acc)
            c_desc.store([m0, n0], acc.to(tl.bfloat16))

    return tt_matmul, tt_attention, tt_matmul_tma, tt_matmul_tma_persistent


def _div16(names: list[str], sig: dict[str, str]) -> dict[tuple[int, ...], list[list[Any]]]:
    """``tt.divisibility = 16`` on the given (non-constexpr) parameters, as the JIT specializes
    16-byte aligned pointers and sizes divisible by 16."""
    order = list(sig)
    return {(order.index(n),): [["tt.divisibility", 16]] for n in names}


def triton_compile(case: Case, cache: str | None = None) -> tuple[Any, str]:
    """Triton's cubin for ``case`` and ptxas' ``-v`` log of it, with a fresh cache directory
    (or ``cache``, which a later call may hit)."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    tt_matmul, tt_attention, tt_tma, tt_tma_persistent = _triton_kernels()
    warps = case.warps
    if case.kernel == "gemm" and case.arch == "sm_90a":
        sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
               "BM": "constexpr", "BN": "constexpr", "BK": "constexpr", "B_NK": "constexpr"}
        consts = {"BM": case.BM, "BN": case.BN, "BK": case.BK, "B_NK": case.b_layout == "nk"}
        fn = tt_tma
        if case.persistent:
            from hexlayout.ops.gemm.config import SM_COUNT

            sig["GRID"] = "constexpr"
            consts["GRID"] = SM_COUNT["sm_90a"]
            fn = tt_tma_persistent
        src = ASTSource(fn=fn, signature=sig, constexprs=consts,
                        attrs=_div16(["a_ptr", "b_ptr", "c_ptr", "M", "N", "K"], sig))
        warps = 4            # Triton's warp specialization adds the producer and consumer warp groups
    elif case.kernel == "gemm":
        sig = {"a_ptr": "*bf16", "b_ptr": "*bf16", "c_ptr": "*bf16", "M": "i32", "N": "i32", "K": "i32",
               "stride_am": "i32", "stride_ak": "constexpr", "stride_bk": "constexpr", "stride_bn": "i32",
               "stride_cm": "i32", "stride_cn": "constexpr", "BM": "constexpr", "BN": "constexpr",
               "BK": "constexpr", "GROUP_M": "constexpr"}
        unit, strided = ("stride_bk", "stride_bn") if case.b_layout == "nk" else ("stride_bn", "stride_bk")
        sig[unit], sig[strided] = "constexpr", "i32"
        consts = {"stride_ak": 1, unit: 1, "stride_cn": 1, "BM": case.BM, "BN": case.BN, "BK": case.BK,
                  "GROUP_M": 8}
        attrs = _div16(["a_ptr", "b_ptr", "c_ptr", "M", "N", "K", "stride_am", strided, "stride_cm"], sig)
        src = ASTSource(fn=tt_matmul, signature=sig, constexprs=consts, attrs=attrs)
    else:
        sig = {"q_ptr": "*fp16", "k_ptr": "*fp16", "v_ptr": "*fp16", "o_ptr": "*fp16", "qk_scale": "fp32",
               "Sq": "i32", "Sk": "i32", "H": "i32", "KVH": "i32", "sqb": "i32", "sqs": "i32", "sqh": "i32",
               "skb": "i32", "sks": "i32", "skh": "i32", "BM": "constexpr", "BN": "constexpr",
               "HD": "constexpr"}
        consts = {"BM": case.BM, "BN": case.BN, "HD": case.BK}
        attrs = _div16(["q_ptr", "k_ptr", "v_ptr", "o_ptr", "sqb", "sqs", "sqh", "skb", "sks", "skh"], sig)
        src = ASTSource(fn=tt_attention, signature=sig, constexprs=consts, attrs=attrs)
    cap = 90 if case.arch == "sm_90a" else int(case.arch[3:])
    out = io.StringIO()
    with contextlib.ExitStack() as stack:
        cache_dir = cache or stack.enter_context(tempfile.TemporaryDirectory(prefix="bench-static-triton-"))
        old = {k: os.environ.get(k) for k in ("TRITON_CACHE_DIR", "TRITON_DUMP_PTXAS_LOG")}
        os.environ.update(TRITON_CACHE_DIR=cache_dir, TRITON_DUMP_PTXAS_LOG="1")
        try:
            with contextlib.redirect_stdout(out):
                compiled = triton.compile(src, target=GPUTarget("cuda", cap, 32),
                                          options={"num_warps": warps, "num_stages": case.stages})
        finally:
            for k, v in old.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return compiled, out.getvalue()


def triton_stats(case: Case) -> dict[str, Any]:
    """``KernelStats`` of Triton's kernel for ``case``; k-tiles from the tile (module docstring)."""
    from hexlayout.runtime.sass import disassemble
    from hexlayout.runtime.stats import kernel_stats, mma_per_ktile_for_tile

    t = time.perf_counter()
    compiled, log = triton_compile(case)
    cubin = compiled.asm["cubin"]
    name = compiled.metadata.name
    sass = disassemble(cubin)
    shared = int(compiled.metadata.shared)
    if case.kernel == "gemm":   # k-tiles from the loop's accumulators and BK
        st = kernel_stats(cubin, sass=sass, log=log, name=name, bk=case.BK, shared_dynamic=shared)
    else:                       # a "k-tile" is one key block: S = Q K^T and O += P V, all warps
        per = 2 * mma_per_ktile_for_tile(case.BM, case.BN, case.BK, (16, 8, 16), case.warps)
        st = kernel_stats(cubin, sass=sass, log=log, name=name, mma_per_ktile=per, shared_dynamic=shared)
    d = st.to_dict()
    d["seconds"] = time.perf_counter() - t
    return d


# --- report -------------------------------------------------------------------------------------

def _regs(d: dict[str, Any] | None) -> str:
    if d is None:
        return "-"
    hi = d["highest_register"]
    alloc = [r for r in d["setmaxnreg"] if r["kind"] == "alloc"]
    if alloc:
        hi = max(r["highest_register"] for r in alloc)
    return f"{d['registers']}, R{hi}"


def _spills(d: dict[str, Any] | None) -> str:
    if d is None:
        return "-"
    if d["spill_stores"] is None:
        return f"{d['local_memory_instructions']} LDL/STL"
    return f"{d['spill_stores']}/{d['spill_loads']} B" if d["spills"] else "0"


def _per(d: dict[str, Any] | None, key: str) -> str:
    if d is None or d["main_loop"] is None or d["main_loop"][key] is None:
        return "-"
    return f"{d['main_loop'][key]:.2f}" if key == "non_mma_per_mma" else f"{d['main_loop'][key]:.1f}"


def _loop(d: dict[str, Any] | None) -> str:
    if d is None or d["main_loop"] is None:
        return "-"
    lp = d["main_loop"]
    text = f"{lp['instructions']} ({lp['mma']} MMA, {lp['k_tiles']:g} kt)" if lp["k_tiles"] else str(
        lp["instructions"])
    return text + (f", {lp['overlapped']} beside wgmma" if lp.get("overlapped") else "")


def _warn(d: dict[str, Any] | None) -> str:
    if d is None:
        return "-"
    if d["serialization"]:
        return " ".join(d["serialization"])
    return f"{len(d['warnings'])} other" if d["warnings"] else "none"


def _stores(d: dict[str, Any] | None) -> str:
    if d is None:
        return "-"
    return " ".join(f"{k}x{v}" for k, v in d["epilogue_stores"].items()) or "-"


def _mem(d: dict[str, Any] | None) -> str:
    if d is None:
        return "-"
    c = d["counts"]
    used = [f"{k}:{c[k]}" for k in ("LDGSTS", "LDSM", "STSM", "UTMALDG", "UTMASTG") if c.get(k)]
    return " ".join(used) or "-"


#: The static targets of issue 10 ("Done when"), per case label prefix.
TARGETS = {
    ("sm_80", "128x128x32 3st 4 warps"): "≤ 100 / k-tile",
    ("sm_80", "128x128x64 3st 8 warps"): "≤ 110 / k-tile",
    ("sm_90a", "128x128x64"): "≤ 50 / k-tile, no C7515",
    ("sm_90a", "128x256x64"): "≤ 50 / k-tile, no spills, no C7515",
    ("sm_80", "FA fwd hd128 BM128 BN64"): "≤ 4 / MMA, no spills",
    ("sm_80", "paged hd128"): "≤ 4 / MMA, no spills",
}


def _target(r: dict[str, Any]) -> str:
    for (arch, prefix), t in TARGETS.items():
        if r["arch"] == arch and r["config"].startswith(prefix):
            return t
    return "no C7515" if r["arch"] == "sm_90a" else ""


def markdown(rows: list[dict[str, Any]], meta: dict[str, Any], peers: bool) -> str:
    lines = [f"# Static code quality from the cubin ({meta['date']})", "",
             f"{meta['machine']}; Python {meta['python']}; hexlayout {meta['hexlayout_commit']}, compiled "
             f"with {meta['hexlayout_compiler']}"
             + (f"; Triton {meta['triton']} (its ptxas: {meta['triton_ptxas']})" if peers else "")
             + ". No GPU: the SASS is read with cuobjdump by `hexlayout.runtime.stats` "
             "(`" + meta.get("command", "python benchmarks/bench_static.py" + (" --peers" if peers else ""))
             + "`).", "",
             "*Non-MMA / k-tile* = (main-loop instructions − MMA − `@!PT` padding) ÷ k-tiles per iteration, "
             "per warp instruction stream; the main loop is the innermost backward-branch span holding the "
             "most HMMA/HGMMA. *Registers*: ptxas' count per thread at launch, then the highest register "
             "used (under setmaxnreg: the highest in the consumer warp groups' code). *Serialization*: ptxas "
             "C75xx wgmma-serialization messages. *Beside wgmma*: the main loop's non-MMA instructions "
             "issued while a wgmma group is in flight. Attention: a k-tile is one key block "
             "(S = QKᵀ and O += PV); *non-MMA / MMA* is its per-HMMA figure.", ""]
    legacy = [r for r in rows if not r.get("serving")]
    if peers and legacy:
        lines += ["Triton's peers are written in `benchmarks/bench_static.py` after its tutorials: sm_80 the "
                  "pointer-based matmul (cp.async), sm_90a the TMA-descriptor matmul with warp "
                  "specialization (persistent for the persistent config), attention a FlashAttention-2 "
                  "forward. Same tile, "
                  "stages and (sm_80) warps; bf16 GEMM with B given N x K unless *B KxN*.", ""]
    tools = ["hexlayout", "Triton"] if peers else ["hexlayout"]
    metrics = [("non-MMA / k-tile", lambda d: _per(d, "non_mma_per_ktile")),
               ("non-MMA / MMA", lambda d: _per(d, "non_mma_per_mma")),
               ("main loop", _loop), ("registers", _regs), ("spills", _spills),
               ("serialization", _warn), ("epilogue stores", _stores), ("TMA / LDSM / STSM / LDGSTS", _mem)]
    if legacy:
        head = ["arch", "kernel, config", "target (issue 10)"]
        for name, _ in metrics:
            head += [f"{name} {t}" if peers else name for t in tools]
        lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in legacy:
            cells = [r["arch"], f"{r['kernel']} {r['config']}", _target(r)]
            for _, f in metrics:
                cells.append(f(r["hexlayout"]))
                if peers:
                    cells.append(f(r.get("triton")))
            lines.append("| " + " | ".join(cells) + " |")
        errors = [(r["config"], r.get("triton_error")) for r in legacy if r.get("triton_error")]
        if errors:
            lines += ["", "Triton failed on: " + "; ".join(f"{c}: {e}" for c, e in errors)]
    lines += _sm100_beside_peers([r for r in legacy if r["arch"] == "sm_100a"])
    serving = [r for r in rows if r.get("serving")]
    if serving:
        lines += _serving_markdown(serving, metrics, peers)
    lines += ["", "Per-kernel details (the loop's opcode mix and categories, setmaxnreg regions, ptxas' "
              "messages, counts) are in the JSON file of the same name."]
    return "\n".join(lines) + "\n"


def _sm100_beside_peers(rows: list[dict[str, Any]]) -> list[str]:
    """hexlayout's sm_100a GEMM rows beside CuTe DSL's Blackwell examples as
    ``benchmarks/peers_sm100.py`` measured them (``static-sm100-peers.json``, same reader), in one
    table: registers, MMA loop non-MMA per k-tile (a 64-deep k-tile: 4 UTCHMMA), the epilogue's
    instructions per accumulator value (``runtime.tmem_epilogue``), instruction counts."""
    from peers_sm100 import epilogue_cell

    if not rows:
        return []
    path = RESULTS / "static-sm100-peers.json"
    peers = json.loads(path.read_text())["rows"] if path.exists() else []
    out = ["", "## sm_100a beside CuTe DSL's Blackwell GEMM examples",
           "", "hexlayout: the warp-specialized GEMM source built for sm_100a (tcgen05 synthesized, one "
           "CTA per MMA, or with cluster 2 a pair of CTAs per MMA, cta_group::2, whose tile is the pair's: "
           "each CTA 128 rows, half of B, one CTA's code counted); its MMA loop is the consumer warp "
           "group's k-loop, in the persistent builds the MMA warp group's, which fills one of two TMEM "
           "accumulator stages while the epilogue warp groups (a pair's: both CTAs') drain the other "
           "(the full-barrier wait - a pair's: the even CTA's, on which both CTAs' TMA "
           "loads complete -, then in one elected thread's branch 4 UTCHMMA and the tcgen05.commit that "
           "releases the stage when they complete; no wait on the MMAs in the loop). CuTe DSL: "
           "`static-sm100-peers.md` (`benchmarks/peers_sm100.py`)"
           + ("" if peers else " — not found, peers left out") + ".", "",
           "| kernel | tile | cta_group | registers | spill (LDL/STL) | MMA loop: non-MMA / k-tile | "
           "epilogue: instr / value | UTCHMMA / LDTM / UTCBAR / UTMALDG / UTMASTG |",
           "|---|---|---|---|---|---|---|---|"]
    keys = ("UTCHMMA", "LDTM", "UTCBAR", "UTMALDG", "UTMASTG")
    for r in rows:
        d = r["hexlayout"]
        lp, c = d["main_loop"], d["counts"]
        loop = (f"{lp['non_mma_per_ktile']:.1f} ({lp['instructions']} instr, {lp['mma']} MMA)"
                if lp and lp["non_mma_per_ktile"] is not None else "-")
        g = int(r["case"].get("cluster", 1)) if r["case"].get("kernel") == "gemm" else 1
        tile = f"{g * r['case']['BM']}x{r['case']['BN']}x{r['case']['BK']}"
        out.append(f"| hexlayout {r['config']} | {tile} | {g} | "
                   f"{_regs(d)} | {d['local_memory_instructions']} | {loop} | "
                   f"{epilogue_cell(d.get('epilogue'))} | "
                   + " / ".join(str(c.get(k, 0)) for k in keys) + " |")
    for p in peers:
        m, c = p["main_loop"], p["counts"]
        loop = f"{m['non_mma_per_ktile']:.1f} ({m['instructions']} instr, {m['mma']} MMA)" if m else "-"
        out.append(f"| CuTe DSL {p['peer']} (cluster {p['cluster']}) | {p['tile']} | {p['cta_group']} | "
                   f"{p['registers']}, R{p['highest_register']} | {p['local_memory_instructions']} | "
                   f"{loop} | {epilogue_cell(p.get('epilogue'))} | "
                   + " / ".join(str(c.get(k, 0)) for k in keys) + " |")
    return out


def _problems(problems: list[str]) -> str:
    """Traced problems, compressed per model: ``model T=a..b`` (and how many variants: formats,
    scales, split-K) for ``model T=t rest`` problems, the others as they are."""
    import re

    groups: dict[str, tuple[list[int], set[str]]] = {}
    other: list[str] = []
    for p in problems:
        m = re.match(r"^(\S+) T=(\d+)(.*)$", p)
        if m:
            ts, rest = groups.setdefault(m[1], ([], set()))
            ts.append(int(m[2]))
            rest.add(m[3].strip())
        else:
            other.append(p)
    out = []
    for model, (ts, rest) in groups.items():
        span = f"{min(ts)}..{max(ts)}" if len(set(ts)) > 1 else str(ts[0])
        var = [r for r in sorted(rest) if r]
        out.append(f"{model} T={span}" + (f" ({', '.join(var)})" if 0 < len(var) <= 2 and len(rest) == 1
                                          else f" ({len(rest)} variants)" if len(rest) > 1 else ""))
    return "; ".join(out + other)


def _shared(d: dict[str, Any] | None) -> str:
    if d is None:
        return "-"
    return str(d["shared_static"] + d["shared_dynamic"])


def _serving_markdown(rows: list[dict[str, Any]], metrics: list[tuple[str, Any]], peers: bool) -> list[str]:
    """The serving kernels' table: one row per build the ops launch (``serving_cases``)."""
    lines = ["", "## Serving kernels", "",
             "Every build the serving ops launch (fused MoE bf16 / W4A16 / W8A16 / FP8 with its alignment, "
             "split-K and sum kernels; paged and varlen attention; the KV-cache writer), with the constants "
             "the ops' own choosers pick for the traced problems: MoE "
             + ", ".join(f"{m} (E, k, H, I) = {v}" for m, v in MOE_MODELS.items())
             + f", T = {MOE_TOKENS[0]}..{MOE_TOKENS[-1]} by powers of two, bf16 activations (f16 too for "
             + ", ".join(MOE_F16_MODELS) + ") "
             f"(W4A16 / W8A16: {', '.join(f'{f} {b}-bit' for f, b in WNA16_FORMATS)}, groups "
             f"{', '.join(map(str, WNA16_GROUPS))}); attention f16, head sizes "
             f"{', '.join(map(str, ATTN_HEAD_SIZES))}, {ATTN_HEADS[0]} query / {ATTN_HEADS[1]} KV heads, "
             f"KV blocks of {ATTN_BLOCK}. Split-K builds: the problems where `choose_split_k` splits a "
             "GEMM for the architecture's SM count, traced with that `HEXLAYOUT_MOE_SPLIT_K` (which "
             "splits both GEMMs: *(forced)*). A k-tile is one iteration of the kernel's k-loop (MoE: one BK "
             "slice of the gate and up, or down, products; attention: one key block); *non-MMA / MMA* "
             "divides by the loop's MMA instructions. Kernels without an MMA loop show '-'."
             + (" No Triton peer (column left empty): vLLM's Triton fused MoE is not compiled here." if peers
                else ""), ""]
    head = ["arch", "family", "kernel", "constants", "problems", "shared B"] + [n for n, _ in metrics]
    if peers:
        head.append("Triton")
    lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        c = r["case"]
        consts = " ".join(f"{k}={_short(v)}" for k, v in c["consts"].items())
        cells = [r["arch"], ", ".join(c["families"]), r["kernel"], consts, _problems(c["problems"]),
                 _shared(r["hexlayout"])] + [f(r["hexlayout"]) for _, f in metrics]
        if peers:
            cells.append("")
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def _commit() -> str:
    """``git describe --always --dirty`` of the checkout (``dirty``: uncommitted changes were measured)."""
    import subprocess

    try:
        out = subprocess.run(["git", "describe", "--always", "--dirty"], capture_output=True, text=True,
                             cwd=Path(__file__).resolve().parent, timeout=30)
        return out.stdout.strip() or "unknown"
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _meta(peers: bool) -> dict[str, Any]:
    from hexlayout.runtime.compile import available_backends
    from hexlayout.runtime.toolchain import nvrtc_version

    meta: dict[str, Any] = {
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "machine": f"{platform.platform()}, {os.cpu_count()} CPUs", "python": platform.python_version(),
        "hexlayout_compiler": (nvrtc_version() if "nvrtc" in available_backends() else "nvcc"),
        "gpu": None, "hexlayout_commit": _commit(),
    }
    if peers:
        import subprocess

        import triton
        from triton.backends.nvidia.compiler import get_ptxas

        meta["triton"] = triton.__version__
        try:
            out = subprocess.run([get_ptxas(90).path, "--version"], capture_output=True, text=True).stdout
            meta["triton_ptxas"] = out.strip().splitlines()[-1]
        except Exception as e:  # noqa: BLE001 - a version string is informative only
            meta["triton_ptxas"] = f"unknown ({e})"
    return meta


def _selected(terms: list[str], names: list[str]) -> bool:
    """``--only``: no terms, or a term contained in one of ``names`` (label, kernel, family, ...)."""
    return not terms or any(t in n for t in terms for n in names)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--peers", action="store_true", help="also compile Triton's kernels for the same tiles")
    ap.add_argument("--out", default=str(RESULTS), help="directory for static.md / .json")
    ap.add_argument("--only", default="", help="comma-separated terms: run only the cases whose label, "
                    "kernel or family contains one (families: gemm, attention, paged_attention, serving, "
                    + ", ".join(SERVING) + "; e.g. --only moe)")
    ap.add_argument("--arch", default="", help="comma-separated architectures to run (default: all)")
    ap.add_argument("--tag", default="", help="suffix of the result files (static-<tag>.md)")
    args = ap.parse_args(argv)
    terms = [t.strip() for t in args.only.split(",") if t.strip()]
    archs = [a.strip() for a in args.arch.split(",") if a.strip()] or None
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    if args.peers:
        try:
            import triton  # noqa: F401
        except ImportError:
            print("bench_static --peers needs Triton: pip install triton (or pip install -e '.[bench]')",
                  file=sys.stderr)
            return 2
    meta = _meta(args.peers)
    given = sys.argv[1:] if argv is None else argv
    meta["command"] = " ".join(["python benchmarks/bench_static.py", *given])
    if terms == ["dequant"]:   # the W4A16 / W8A16 main loop per weight beside Marlin (dequant_cost)
        from dequant_cost import dequant_markdown, dequant_rows

        drows = dequant_rows(archs)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        stem = "static-dequant" + (f"-{args.tag}" if args.tag else "")
        (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": drows}, indent=1))
        (out / f"{stem}.md").write_text(dequant_markdown(drows, meta))
        print(dequant_markdown(drows, meta))
        return 0
    rows = []
    for case in cases():
        if not _selected(terms, [case.label, case.kernel]) or (archs and case.arch not in archs):
            continue
        row: dict[str, Any] = {"kernel": case.kernel, "arch": case.arch, "config": case.label,
                               "shipped": case.shipped, "case": case.__dict__}
        row["hexlayout"] = hexlayout_stats(case)
        if args.peers and (case.kernel == "paged_attention" or case.arch == "sm_100a"):
            row["triton"] = None               # no Triton peer for the paged kernel; sm_100a: CuTe DSL's
        elif args.peers:
            try:
                row["triton"] = triton_stats(case)
            except Exception as e:  # noqa: BLE001 - a peer that fails to compile is reported, not fatal
                row["triton"] = None
                row["triton_error"] = f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"
        rows.append(row)
        h, t = row["hexlayout"], row.get("triton")
        print(f"{case.arch} {case.label}: hexlayout {_per(h, 'non_mma_per_ktile')} non-MMA/k-tile, "
              f"{_regs(h)}, spills {_spills(h)}, {_warn(h)}"
              + (f" | Triton {_per(t, 'non_mma_per_ktile')}, {_regs(t)}, spills {_spills(t)}, {_warn(t)}"
                 if args.peers else ""), flush=True)
    fams = [f for f in SERVING if _selected(terms, [f, "serving"])]
    for case in serving_cases(None, archs):
        if not (set(case.families) & set(fams)
                or _selected(terms, [case.label, case.module, case.factory])):
            continue
        row = {"kernel": case.name, "family": case.family, "arch": case.arch, "config": case.label,
               "shipped": True, "serving": True, "case": case.to_dict(), "hexlayout": serving_stats(case)}
        if args.peers:
            row["triton"] = None               # no Triton peer for the serving kernels (module docstring)
        rows.append(row)
        h = row["hexlayout"]
        print(f"{case.arch} {case.label}: {_per(h, 'non_mma_per_ktile')} non-MMA/k-tile, "
              f"{_per(h, 'non_mma_per_mma')} non-MMA/MMA, {_regs(h)}, spills {_spills(h)}, {_warn(h)}",
              flush=True)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    stem = "static" + (f"-{args.tag}" if args.tag else "")
    (out / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    md = markdown(rows, meta, args.peers)
    (out / f"{stem}.md").write_text(md)
    print(md)
    return 0


if __name__ == "__main__":
    sys.exit(main())
