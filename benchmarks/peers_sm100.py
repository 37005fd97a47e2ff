"""Static code quality of CuTe DSL's Blackwell (sm_100a) GEMM examples, the peers of hexlayout's
sm_100a builds in the static report, compiled here without a GPU.

``python benchmarks/peers_sm100.py --cutlass PATH [--out DIR] [--only dense,persistent,grouped]``
loads the examples from a CUTLASS checkout (``examples/python/CuTeDSL/cute/blackwell/kernel/``:
``dense_gemm/dense_gemm.py``, ``dense_gemm/dense_gemm_persistent.py``,
``grouped_gemm/grouped_gemm.py``; nothing of them is copied here), builds each configuration with
``cute.compile`` on fake tensors (f16 A/B/C, f32 accumulation, K-major A and B, a 4096³
problem; 4 groups of 1024³ for the grouped GEMM) under ``CUTE_DSL_ARCH=sm_100a``, keeps the
cubin and reads its SASS with :func:`hexlayout.runtime.stats.kernel_stats`: registers (ptxas'
count from ``cuobjdump -res-usage``, then the highest register used), local-memory
instructions, the MMA issuer's main loop (the innermost backward-branch span holding the most
``UTCHMMA``: its non-MMA instructions per k-tile, a k-tile being the example's 64-deep K block =
4 ``tcgen05.mma`` of K 16), the epilogue (``hexlayout.runtime.tmem_epilogue``: instructions per
accumulator value a thread loads from TMEM), and the counts of ``UTCHMMA`` / ``LDTM`` (``tcgen05.ld``) /
``UTCBAR`` (``tcgen05.commit``) / TMA instructions. Each configuration compiles in its own
process (``cute.compile`` keeps state per process). Results: ``static-sm100-peers.{json,md}``.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import subprocess
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"
EXAMPLES = "examples/python/CuTeDSL/cute/blackwell/kernel"

#: name -> (example file, kernel class)
PEERS = {
    "dense": ("dense_gemm/dense_gemm.py", "DenseGemmKernel"),
    "persistent": ("dense_gemm/dense_gemm_persistent.py", "PersistentDenseGemmKernel"),
    "grouped": ("grouped_gemm/grouped_gemm.py", "GroupedGemmKernel"),
}
#: (peer, MMA tile M x N, cluster M x N, 2-CTA instructions)
CONFIGS = [
    ("dense", (128, 128), (1, 1), False),
    ("dense", (128, 256), (1, 1), False),
    ("dense", (256, 128), (2, 1), True),
    ("persistent", (128, 128), (1, 1), False),
    ("persistent", (256, 256), (2, 1), True),
    ("grouped", (128, 128), (1, 1), False),
    ("grouped", (256, 128), (2, 1), True),
]
K_TILE_MMAS = 4  # the examples' 64-deep K block of f16: 4 tcgen05.mma of K 16

# The compile step, run in a child process: argv = example path, class, peer, M, N, cm, cn, 2cta.
_CHILD = r"""
import importlib.util, os, sys
import cutlass, cutlass.cute as cute
from cutlass.cute.runtime import make_fake_compact_tensor, make_fake_stream, make_fake_tensor
path, cls_name, peer = sys.argv[1:4]
m, n, cm, cn, two = (int(x) for x in sys.argv[4:9])
sys.path.insert(0, os.path.dirname(path))
spec = importlib.util.spec_from_file_location("peer_example", path)
ex = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ex)
cls = getattr(ex, cls_name)
f16, f32 = cutlass.Float16, cutlass.Float32
S = 4096 if peer != "grouped" else 1024
def mat(r, c):
    return make_fake_compact_tensor(f16, (r, c, 1), stride_order=(1, 0, 2), assumed_align=16)
a, b, c = mat(S, S), mat(S, S), mat(S, S)
stream = make_fake_stream()
if peer == "dense":
    cute.compile(cls(f32, bool(two), (m, n), (cm, cn), True), a, b, c, stream)
elif peer == "persistent":
    cute.compile(cls(f32, bool(two), (m, n), (cm, cn), True), a, b, c, 148 // (cm * cn), stream)
else:
    g = 4
    k = cls(f32, bool(two), (m, n), (cm, cn))
    sizes = make_fake_compact_tensor(cutlass.Int32, (g, 4), stride_order=(1, 0))
    strides = make_fake_compact_tensor(cutlass.Int32, (g, 3, 2), stride_order=(2, 1, 0))
    ptrs = make_fake_compact_tensor(cutlass.Int64, (g, 3), stride_order=(1, 0))
    maps = make_fake_compact_tensor(cutlass.Int64, (148, cls.num_tensormaps, cls.bytes_per_tensormap // 8),
                                    stride_order=(2, 1, 0))
    clusters = g * (S // m) * (S // n)
    cute.compile(k, a, b, c, g, sizes, strides, ptrs, clusters, maps, 148 // (cm * cn), stream)
print("compiled")
"""


def compile_peer(cutlass_dir: Path, peer: str, tile: tuple[int, int], cluster: tuple[int, int], two: bool,
                 dump: Path) -> bytes:
    """The sm_100a cubin of one example configuration (compiled in a child process)."""
    rel, cls = PEERS[peer]
    env = {**os.environ, "CUTE_DSL_ARCH": "sm_100a", "CUTE_DSL_KEEP_CUBIN": "1",
           "CUTE_DSL_DUMP_DIR": str(dump)}
    args = [str(cutlass_dir / EXAMPLES / rel), cls, peer, *map(str, (*tile, *cluster, int(two)))]
    proc = subprocess.run([sys.executable, "-c", _CHILD, *args], env=env, capture_output=True, text=True,
                          timeout=900)
    cubins = sorted(dump.glob("*.sm_100a.cubin"))
    if proc.returncode or not cubins:
        raise RuntimeError(f"{peer} {tile} {cluster}: cute.compile failed:\n{proc.stderr[-3000:]}")
    return cubins[-1].read_bytes()


def row(peer: str, tile: tuple[int, int], cluster: tuple[int, int], two: bool,
        cubin: bytes) -> dict[str, Any]:
    """The static report of one compiled peer."""
    from hexlayout.runtime.stats import kernel_stats

    st = kernel_stats(cubin, mma_per_ktile=K_TILE_MMAS)
    m = st.main_loop
    return {
        "peer": peer, "tile": f"{tile[0]}x{tile[1]}x64", "cluster": f"{cluster[0]}x{cluster[1]}",
        "cta_group": 2 if two else 1, "registers": st.registers, "highest_register": st.highest_register,
        "local_memory_instructions": st.local_memory_instructions,
        "main_loop": None if m is None else {
            "instructions": m.instructions, "mma": m.mma, "mma_opcode": m.mma_opcode,
            "non_mma_per_ktile": m.non_mma_per_ktile, "mix": m.mix,
        },
        "counts": {k: v for k, v in st.counts.items() if v}, "epilogue_stores": st.epilogue_stores,
        "epilogue": None if (ep := st.epilogue) is None else {**asdict(ep), "per_value": ep.per_value},
    }


def versions() -> dict[str, str]:
    import cutlass

    return {"cutlass_dsl": getattr(cutlass, "__version__", "?"), "python": platform.python_version(),
            "machine": f"{platform.platform()}, {os.cpu_count()} CPUs, no GPU"}


def epilogue_cell(ep: dict[str, Any] | None) -> str:
    """The epilogue column: instructions per accumulator value (instructions / values per thread,
    ``per iteration`` when it is one iteration of a sub-tile loop)."""
    if not ep:
        return "-"
    return (f"{ep['instructions'] / ep['values']:.2f} ({ep['instructions']} / {ep['values']}"
            f"{' per iteration' if ep['looped'] else ''})")


def table(rows: list[dict[str, Any]]) -> list[str]:
    """The markdown table of the rows."""
    out = ["| peer | tile | cluster | cta_group | registers | spill (LDL/STL) | MMA loop: non-MMA / k-tile | "
           "epilogue: instr / value | UTCHMMA / LDTM / UTCBAR / UTMALDG / UTMASTG |",
           "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m, c = r["main_loop"], r["counts"]
        loop = f"{m['non_mma_per_ktile']:.1f} ({m['instructions']} instr, {m['mma']} MMA)" if m else "-"
        ops = " / ".join(str(c.get(k, 0)) for k in ("UTCHMMA", "LDTM", "UTCBAR", "UTMALDG", "UTMASTG"))
        out.append(f"| {r['peer']} | {r['tile']} | {r['cluster']} | {r['cta_group']} | {r['registers']}, "
                   f"R{r['highest_register']} | {r['local_memory_instructions']} | {loop} | "
                   f"{epilogue_cell(r.get('epilogue'))} | {ops} |")
    return out


#: what the table's MMA-loop column compares (written under the table)
NOTE = ("The dense example's MMA loop also issues the TMA loads (one warp does both); the persistent "
        "and grouped examples are warp-specialized (a TMA warp, an MMA warp, epilogue warps), so their MMA "
        "loop is the issuer's alone. The persistent loop holds two k-tiles (8 UTCHMMA). The epilogue column: "
        "`hexlayout.runtime.tmem_epilogue`, the instructions from the accumulator's TMEM loads to its "
        "output stores per accumulator value a thread loads.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cutlass", type=Path, required=True,
                    help="a CUTLASS checkout (its examples/python/CuTeDSL)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    ap.add_argument("--only", default="", help="comma-separated peers (dense, persistent, grouped)")
    ap.add_argument("--source", default="", help="where the checkout's examples come from (repository and "
                    "commit), recorded in the results")
    args = ap.parse_args(argv)
    only = {x for x in args.only.split(",") if x}
    rows, failed = [], []
    for peer, tile, cluster, two in CONFIGS:
        if only and peer not in only:
            continue
        with tempfile.TemporaryDirectory() as d:
            try:
                cubin = compile_peer(args.cutlass, peer, tile, cluster, two, Path(d))
                rows.append(row(peer, tile, cluster, two, cubin))
                print(table(rows[-1:])[-1], flush=True)
            except RuntimeError as e:
                failed.append(str(e).splitlines()[0])
                print(e, flush=True)
    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"), **versions(),
            "command": "python benchmarks/peers_sm100.py " + " ".join(argv or sys.argv[1:]),
            "cutlass_examples": args.source}
    args.out.mkdir(parents=True, exist_ok=True)
    res = {"meta": meta, "rows": rows, "failed": failed}
    (args.out / "static-sm100-peers.json").write_text(json.dumps(res, indent=1))
    md = [f"# CuTe DSL Blackwell GEMM examples, static (sm_100a) ({meta['date']})", "",
          f"CuTe DSL {meta['cutlass_dsl']}, Python {meta['python']}, {meta['machine']}. `{meta['command']}`. "
          + (f"The examples were taken from {args.source} (`git archive HEAD examples/python/CuTeDSL`). "
             if args.source else "")
          + "f16 in, f32 accumulate, f16 out, K-major A and B; a k-tile is one 64-deep K block "
          "(4 UTCHMMA).", "",
          *table(rows), "", NOTE, *(["", "Failed: " + "; ".join(failed)] if failed else [])]
    (args.out / "static-sm100-peers.md").write_text("\n".join(md) + "\n")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
