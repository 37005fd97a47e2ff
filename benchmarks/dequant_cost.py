"""The W4A16 / W8A16 MoE main loop read from SASS beside Marlin's anchors (REFERENCE.md).

For each config (decode ``BM`` 16 and prefill ``BM`` 64; AWQ-4 g128, GPTQ-4 g128, GPTQ-4
per-channel, GPTQ-8 g128; f16; sm_80 mma.sync, sm_90a swap-AB wgmma and sm_100a swap-AB
tcgen05 kernels (the dequantized tile fed to the MMA from tensor memory); gate-up and down)
the kernel is built as the op builds it and its main loop read by ``hexlayout.runtime.stats``
(one warp's instruction stream):

    non-MMA per weight = non-MMA per k-tile / weights one thread dequantizes per k-tile
    weights per thread = calls * BN * BK / threads   (calls: 2 for gate-up, 1 for down; the
                                                      sm_80 and sm_90a decode down kernels: 2
                                                      column tiles)

the conversion, zero point and scale instructions alone per weight (``DEQUANT_OPS``: the
floating and byte-permute / mask instructions of the loop, which in these configs only the
dequantization issues; the rest is loop overhead: addressing, predicates, loads, ldmatrix),
and non-MMA per MMA instruction (HMMA.16816 on sm_80; on sm_90a an HGMMA does 64 x BM x 16,
so that column is not comparable with Marlin's). Marlin (IST-DASLab, sm_80, 16 rows, f16,
int4, its every-iteration path, the same reader): 2.19-2.30 per weight with group-128 scales
(8.8-9.2 per HMMA; dequantization 13.5 per 8 weights), 1.63-1.65 per channel (6.5 per HMMA;
9.1 per 8 weights).
"""

from __future__ import annotations

from typing import Any

__all__ = ["CONFIGS", "MARLIN", "dequant_markdown", "dequant_row", "dequant_rows"]

#: Marlin's anchors (REFERENCE.md): scales -> (non-MMA per weight, non-MMA per HMMA,
#: dequantization instructions per weight)
MARLIN = {"g128": (2.30, 9.2, 13.5 / 8), "channel": (1.65, 6.5, 9.1 / 8)}
#: the opcodes of the dequantization (conversion, zero point, scale) in the main loop
DEQUANT_OPS = ("PRMT", "LOP3", "HADD2", "HFMA2", "HMUL2", "FADD", "F2FP")
#: format -> (bits, ZERO, scales)
FORMATS = {"AWQ-4 g128": (4, 0, "g128"), "GPTQ-4 g128": (4, 8, "g128"),
           "GPTQ-4 channel": (4, 8, "channel"), "GPTQ-8 g128": (8, 128, "g128")}
#: (arch, phase) -> the op's tile constants (``wna16_config`` / ``wna16_sm90_config``)
CONFIGS = {("sm_80", "decode"): {"BM": 16}, ("sm_80", "prefill"): {"BM": 64},
           ("sm_90a", "decode"): {"BM": 16, "WG": 1}, ("sm_90a", "prefill"): {"BM": 64, "WG": 2},
           ("sm_100a", "decode"): {"BM": 16, "WG": 1}, ("sm_100a", "prefill"): {"BM": 64, "WG": 1}}
#: the swap-AB kernels (one MMA issuer per warp group: wgmma m64 x nBM x k16, tcgen05 M64 x BM x 16)
SWAP_AB = ("sm_90a", "sm_100a")
PER_CHANNEL = 1 << 30   # wna16.ONE_GROUP


def _kernel(arch: str, kind: str, bits: int) -> Any:
    from hexlayout.lang import f16

    if arch == "sm_90a":
        from hexlayout.ops.moe import wna16_kernels_sm90 as m

        fn = m.moe_wna16_gate_up_sm90_kernel if kind == "gate_up" else m.moe_wna16_down_sm90_kernel
        return fn(f16, bits, 64)
    if arch == "sm_100a":
        from hexlayout.ops.moe import wna16_kernels_sm100 as m100

        fn = m100.moe_wna16_gate_up_sm100_kernel if kind == "gate_up" else m100.moe_wna16_down_sm100_kernel
        return fn(f16, bits, 64)
    from hexlayout.ops.moe import wna16_kernels_sm80 as m

    return (m.moe_wna16_gate_up_kernel if kind == "gate_up" else m.moe_wna16_down_kernel)(f16, bits, 64)


def _column_tiles(bm: int) -> int:
    from hexlayout.ops.moe.wna16_kernels_sm80 import column_tiles

    return column_tiles(bm)


def dequant_row(arch: str, phase: str, fmt: str, kind: str) -> dict[str, Any]:
    """One row: the main loop of ``kind`` (``gate_up`` / ``down``) for ``fmt`` (a ``FORMATS``
    key) in the ``(arch, phase)`` config, per dequantized weight and per MMA."""
    from hexlayout.runtime import build
    from hexlayout.runtime.stats import mma_per_ktile_for_tile

    bits, zero, scales = FORMATS[fmt]
    consts = dict(CONFIGS[(arch, phase)], ZERO=zero, GROUP=128 if scales == "g128" else PER_CHANNEL)
    if not (arch in SWAP_AB and kind == "down"):     # (the swap-AB down kernels have no TOPK)
        consts["TOPK"] = 2
    b = build(_kernel(arch, kind, bits), arch, **consts)
    st, ml = b.stats, b.stats.main_loop
    threads = 128 * consts["WG"] if arch in SWAP_AB else 128
    bn = 64 * consts.get("WG", 1)
    # (BN, BK) weight tiles per k-tile: gate and up; the sm_80 / sm_90a down kernels' column tiles
    calls = 2 if kind == "gate_up" else 1 if arch == "sm_100a" else _column_tiles(consts["BM"])
    weights = calls * bn * 64 / threads
    # k-tiles per loop iteration from the MMA the tile takes (the swap-AB loops are unrolled)
    if arch in SWAP_AB:   # m64 x nBM x k16 per 64 weight rows, one issuer per warp group
        tile = mma_per_ktile_for_tile(bn, consts["BM"], 64, (64, consts["BM"], 16), consts["WG"])
    else:
        tile = mma_per_ktile_for_tile(consts["BM"], bn, 64, (16, 8, 16), 4)
    k_tiles = ml.mma / (calls * tile) if ml is not None else None
    per_ktile = ml.non_mma / k_tiles if k_tiles else None
    return {"arch": arch, "phase": phase, "format": fmt, "kernel": kind, "BM": consts["BM"],
            "weights_per_thread_ktile": weights, "non_mma_per_ktile": per_ktile,
            "non_mma_per_weight": None if per_ktile is None else round(per_ktile / weights, 3),
            "non_mma_per_mma": None if ml is None else round(ml.non_mma_per_mma, 2),
            "dequant_per_weight": None if not k_tiles else     # (mix: per iteration)
            round(sum(ml.mix.get(o, 0) for o in DEQUANT_OPS) / k_tiles / weights, 3),
            "k_tiles_per_iteration": k_tiles,
            "marlin_dequant_per_weight": round(MARLIN[scales][2], 3),
            "registers": getattr(st, "registers", None), "spills": bool(st.spills),
            "marlin_per_weight": MARLIN[scales][0], "marlin_per_hmma": MARLIN[scales][1],
            "mix": dict(ml.mix) if ml is not None else {}}


def dequant_rows(archs: list[str] | None = None) -> list[dict[str, Any]]:
    """Every config of the table (``archs``: only these)."""
    return [dequant_row(arch, phase, fmt, kind) for (arch, phase) in CONFIGS
            if archs is None or arch in archs for fmt in FORMATS for kind in ("gate_up", "down")]


def dequant_markdown(rows: list[dict[str, Any]], meta: dict[str, Any]) -> str:
    """The table beside Marlin's numbers, with the run's date, machine and versions."""
    head = [f"# W4A16 / W8A16 MoE main loop per dequantized weight ({meta.get('date', '')})", "",
            f"machine: {meta.get('machine', '')}; compiler: {meta.get('hexlayout_compiler', '')}; "
            f"python {meta.get('python', '')}; commit {meta.get('hexlayout_commit', '')}", "",
            "f16, TOPK 2. Marlin: sm_80, 16 rows, f16, int4 (REFERENCE.md). On sm_90a an MMA is "
            "one HGMMA (64 x BM x 16), on sm_100a one UTCHMMA (tcgen05, M64 x BM x 16, issued by one "
            "thread: the loop's other threads branch over it): their per-MMA column is not Marlin's "
            "per-HMMA; the sm_90a loops are unrolled by 4 k-tiles (``sm90_unroll``; decode: stages of 4 "
            "k-tiles, ``sm90_steps``), the sm_100a loops by 2, the sm_80 decode loops take 4 "
            "k-tiles per iteration "
            "(``k_steps``; k-tiles per iteration from the tile's MMA count), the sm_80 and sm_90a decode "
            "down kernels take two 64-column tiles per k-tile (``column_tiles``). Weights per "
            "thread count each weight once (every kernel's warps side by side along N: each weight "
            "dequantized by one warp).", "",
            "| arch | phase | format | kernel | BM | weights/thread/k-tile | non-MMA/k-tile | "
            "non-MMA/weight | Marlin/weight | dequant/weight | Marlin dequant/weight | non-MMA/MMA | "
            "Marlin/HMMA | registers | spills |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        head.append(f"| {r['arch']} | {r['phase']} | {r['format']} | {r['kernel']} | {r['BM']} | "
                    f"{r['weights_per_thread_ktile']:g} | {r['non_mma_per_ktile']} | "
                    f"{r['non_mma_per_weight']} | {r['marlin_per_weight']} | {r['dequant_per_weight']} | "
                    f"{r['marlin_dequant_per_weight']} | {r['non_mma_per_mma']} | {r['marlin_per_hmma']} | "
                    f"{r['registers']} | {'yes' if r['spills'] else 'no'} |")
    return "\n".join(head) + "\n"
