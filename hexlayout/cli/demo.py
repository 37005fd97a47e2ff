"""``hexlayout demo``: a tour of what hexlayout knows, printed and drawn.

1. The sm_80 mma atom ``SM80_16x8x16_F32F16F16F32_TN``: its A, B, C TV layouts in CuTe
   notation and a table of which thread/value holds each element of C.
2. The 8 x 64 fp16 shared-memory tile ``Sw<3,3,3> o 0 o (8,64):(64,1)`` next to the
   unswizzled ``(8,64):(64,1)``: the wavefronts of an ldmatrix phase (8 rows reading one
   16-byte chunk column each) with and without the swizzle.
3. The explicit-layout GEMMs (``hexlayout.lang.examples.explicit``) traced, lowered and run
   thread by thread in the emulator on a ragged problem: the sm_80 kernel (cp.async,
   ldmatrix, mma.sync) and the warp-specialized sm_90a kernel (TMA, mbarriers, wgmma), each
   checked against a float64 reference, with the emulator's counters (shared-memory
   wavefronts and bank conflicts, global sectors) per instruction; the sm_80 kernel again
   with unswizzled stages to show the conflicts the swizzle removes.
4. The production GEMM of ``hexlayout.ops`` (layout-free) synthesized and compiled for
   sm_80 and sm_90a (decisions, registers, SASS instruction mix), verified in the emulator,
   and on a GPU timed beside cuBLAS (``demo_gemm``).
5. Pictures of all of them, written as PNGs into ``--out`` (default ``./hexlayout-out``).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

__all__ = ["register", "run", "MMA_ATOM", "SMEM_SWIZZLED", "SMEM_PLAIN"]

MMA_ATOM = "SM80_16x8x16_F32F16F16F32_TN"
SMEM_SWIZZLED = "Sw<3,3,3> o 0 o (8,64):(64,1)"
SMEM_PLAIN = "(8,64):(64,1)"
ELEM_BITS = 16


def register(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser("demo", help="a tour: atom and swizzle layouts, GEMMs emulated thread by thread, "
                       "the synthesized production GEMM",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="hexlayout-out", metavar="DIR",
                   help="directory for the pictures (default ./hexlayout-out)")
    p.add_argument("--no-draw", action="store_true", help="print only, draw no pictures")
    p.set_defaults(func=run)
    return p


def tv_text_table(threads: Any, values: Any, row_name: str = "m", col_name: str = "n") -> str:
    """A text table of ``T{t}V{v}`` per tile cell (rows ``row_name``, columns ``col_name``)."""
    rows, cols = threads.shape
    cells = [[f"T{threads[i, j]}V{values[i, j]}" if threads[i, j] >= 0 else "-" for j in range(cols)]
             for i in range(rows)]
    w = max(max(len(c) for r in cells for c in r), len(str(cols - 1))) + 1
    head = f"{row_name}\\{col_name}".rjust(5) + "".join(str(j).rjust(w) for j in range(cols))
    lines = [head] + [str(i).rjust(5) + "".join(c.rjust(w) for c in r) for i, r in enumerate(cells)]
    return "\n".join(lines)


def ldmatrix_wavefronts(layout: Any, elem_bits: int) -> list[int]:
    """Wavefronts of an ``ldmatrix.x1`` reading 16-byte chunk column ``c`` of the 8 rows of
    ``layout`` (cell (r, j) at element offset ``layout(r, j)``; lane r gives the address of
    row r's chunk ``c``), for every chunk column ``c``. Uses ``hexlayout.arch``'s bank model."""
    from hexlayout.arch import ldmatrix_bank_conflicts
    from hexlayout.draw import layout_values

    offs = layout_values(layout)
    ebytes = elem_bits // 8
    chunk_elems = 16 // ebytes
    out = []
    for chunk in range(offs.shape[1] // chunk_elems):
        rows = offs[:8, chunk * chunk_elems] * ebytes
        out.append(int(ldmatrix_bank_conflicts(rows, num=1).wavefronts))
    return out


GEMM_SHAPE = (200, 136, 256)


def _emulate(kernel: Any, arch: str, shape: tuple[int, int, int], seed: int = 0) -> tuple[Any, Any, float]:
    """Trace, lower and emulate ``kernel`` on random f16 data; returns (program, report, rel. error)."""
    import numpy as np

    from hexlayout.emulator import run as emulate
    from hexlayout.synth.solve import synthesize

    m, n, k = shape
    prog = synthesize(kernel.trace(), arch).lowered
    rng = np.random.default_rng(seed)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    c = np.zeros((m, n), np.float16)
    report = emulate(prog.kernel, {"a": a, "b": b, "c": c})
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    err = float((np.abs(c - ref) / (np.abs(ref) + 1)).max())
    return prog, report, err


def _summary(report: Any) -> list[str]:
    """One line per instruction kind that touches memory: executions, wavefronts, sectors."""
    rows: dict[str, list[int]] = {}
    for s in report.sites:
        r = rows.setdefault(s.kind, [0, 0, 0, 0, 0, 0])
        r[0] += s.warp_executions
        r[1] += s.smem_wavefronts
        r[2] += s.smem_ideal_wavefronts
        r[3] += s.bank_conflicts
        r[4] += s.gmem_sectors
        r[5] += s.gmem_ideal_sectors
    out = [f"    {'instruction':14s} {'warp execs':>10s} {'smem wavefronts':>16s} {'ideal':>7s} "
           f"{'conflicts':>9s} {'gmem sectors':>13s} {'ideal':>7s}"]
    for kind, r in rows.items():
        if r[1] or r[4] or kind in ("MmaSync", "Wgmma"):
            out.append(f"    {kind:14s} {r[0]:10d} {r[1]:16d} {r[2]:7d} {r[3]:9d} {r[4]:13d} {r[5]:7d}")
    return out


def emulate_gemms() -> None:
    from hexlayout.lang.examples.explicit import gemm_sm80_explicit, gemm_sm90_ws_explicit

    m, n, k = GEMM_SHAPE
    print(f"\n== explicit-layout GEMMs run thread by thread in the emulator, C = A @ B^T with "
          f"M, N, K = {m}, {n}, {k} (ragged), f16")
    for title, kernel, arch in (
        ("sm_80: cp.async 16 B + ldmatrix.x4 + mma.sync.m16n8k16, 3 stages, Swizzle<2,3,3>",
         gemm_sm80_explicit(), "sm_80"),
        ("sm_80, stages not swizzled", gemm_sm80_explicit(swizzle=False), "sm_80"),
        ("sm_90a: warp-specialized TMA (128 B swizzle) + mbarriers + wgmma.m64n128k16",
         gemm_sm90_ws_explicit(), "sm_90a"),
    ):
        prog, report, err = _emulate(kernel, arch, GEMM_SHAPE)
        status = "matches" if err < 1e-2 else "DOES NOT MATCH"
        print(f"  {title}")
        print(f"    {status} float64 (max relative error {err:.1e}); {report.totals['bank_conflicts']} "
              f"bank conflicts; {len(report.sites)} instruction sites; "
              f"{prog.kernel.smem_bytes // 1024} KiB shared memory")
        print("\n".join(_summary(report)))


def run(args: argparse.Namespace) -> int:
    from hexlayout import draw as hd
    from hexlayout.layout.parse import parse_layout

    from .common import load_atom

    out = Path(args.out)
    drawn: list[Path] = []
    draw = not args.no_draw

    # 1. mma atom
    atom = load_atom(MMA_ATOM)
    m, n, k = atom.shape_mnk
    print(f"== mma atom {MMA_ATOM}: M x N x K = {m} x {n} x {k}, "
          f"{getattr(atom, 'num_threads', '?')} threads (CuTe TV layouts, thread mode first)")
    print(f"  A  (T,V) -> m + {m}*k : {atom.a_layout}")
    print(f"  B  (T,V) -> n + {n}*k : {atom.b_layout}")
    print(f"  C  (T,V) -> m + {m}*n : {atom.c_layout}")
    grid_c = hd.atom_grid(atom, "c")
    print(f"\n  C ({m} x {n}): thread T and value V holding each element (row m, column n)")
    print("\n".join("  " + line for line in tv_text_table(grid_c.meta["threads"], grid_c.meta["values"])
                    .split("\n")))
    if draw:
        for op in ("a", "b", "c"):
            drawn.append(hd.render(hd.atom_grid(atom, op), out / f"{MMA_ATOM}_{op.upper()}.png"))

    # 2. shared-memory tile with and without the swizzle
    sw = parse_layout(SMEM_SWIZZLED)
    plain = parse_layout(SMEM_PLAIN)
    print(f"\n== shared-memory tile, fp16 ({ELEM_BITS}-bit) elements, 8 rows of 128 bytes")
    print("  ldmatrix.x1 reads one 16-byte chunk column of the 8 rows in one phase; ideal: 1 wavefront")
    for name, layout in (("unswizzled", plain), ("swizzled  ", sw)):
        waves = ldmatrix_wavefronts(layout, ELEM_BITS)
        worst = max(waves)
        verdict = "conflict-free" if worst == 1 else f"{worst}-way bank conflict"
        print(f"  {name} {str(layout):32s} wavefronts by chunk column {waves}: {verdict}")
    emulate_gemms()
    from .demo_gemm import gemm_section

    gemm_section()

    if draw:
        phases = hd.column_chunk_phases(8, 128 // ELEM_BITS, 0)
        drawn.append(hd.render(hd.smem_grid(plain, ELEM_BITS, "chunk", phases), out / "smem_unswizzled.png"))
        drawn.append(hd.render(hd.smem_grid(sw, ELEM_BITS, "chunk", phases), out / "smem_swizzled.png"))
        print(f"\n== {len(drawn)} pictures in {out.resolve()}:")
        for p in drawn:
            print(f"  {p}")
    return 0
