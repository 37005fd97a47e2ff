"""``hexlayout draw``: a picture of a layout, a TV layout, a shared-memory tile or an atom.

    hexlayout draw '(4,8):(8,1)' -o layout.png                 # plain layout, cells L(i + M*j)
    hexlayout draw '((4,8),(2,2)):((32,1),(16,8))' --tile 16x8 -o c.png   # TV layout over M x N
    hexlayout draw 'Sw<3,3,3> o 0 o (8,64):(64,1)' --elem-bits 16 --access ldmatrix -o s.svg
    hexlayout draw --atom SM80_16x8x16_F32F16F16F32_TN --operand a -o a.png
    hexlayout draw --atom SM75_U32x4_LDSM_N --operand dst --elem-bits 16 -o ldsm.png

A picture has at most 65,536 cells and 1,024 a side (a TV layout at most 2^20 points);
larger layouts are refused: draw a tile of them.
"""

from __future__ import annotations

import argparse
from typing import Any

from . import CLIError
from .common import elem_bits_arg, layout_arg, load_atom, tile_arg

__all__ = ["register", "run"]


def register(sub: Any) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "draw", help="draw a layout, TV layout, shared-memory tile or atom as a PNG/SVG picture",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("layout", nargs="?", metavar="LAYOUT",
                   help="CuTe notation, e.g. '(4,8):(8,1)' or 'Sw<3,3,3> o 0 o (8,64):(64,1)'")
    p.add_argument("-o", "--output", required=True, metavar="FILE", help="output file: .png, .svg or .pdf")
    p.add_argument("--tile", metavar="MxN",
                   help="draw LAYOUT as a TV layout (t,v) -> m + M*n over an MxN tile")
    p.add_argument("--elem-bits", metavar="BITS",
                   help="draw LAYOUT as a shared-memory tile of BITS-bit elements coloured by bank "
                        "(default 16 for a swizzled layout); for copy atoms: the element width. "
                        "A power of two from 1 to 128 (8 or more for a shared-memory tile)")
    p.add_argument("--label", choices=("offset", "chunk", "bank"), default="offset",
                   help="shared-memory cells: element offset, 16-byte chunk, or bank (default offset)")
    p.add_argument("--access", metavar="PATTERN",
                   help="shared-memory access to highlight: 'ldmatrix' or 'ldmatrix:C' (8 rows per phase "
                        "reading 16-byte chunk column C, default 0)")
    p.add_argument("--atom", metavar="NAME",
                   help="draw an instruction atom, e.g. SM80_16x8x16_F32F16F16F32_TN")
    p.add_argument("--operand", metavar="OP", help="atom operand: a, b, c (mma) or src, dst (copy)")
    p.add_argument("--labels", action=argparse.BooleanOptionalAction, default=None,
                   help="force cell labels on/off (default: on when readable)")
    p.set_defaults(func=run)
    return p


def _access(spec: str, rows: int, elem_bits: int) -> list[list[tuple[int, int]]]:
    from hexlayout.draw import column_chunk_phases

    name, _, arg = spec.partition(":")
    if name != "ldmatrix":
        raise CLIError(f"unknown access pattern {spec!r}: expected 'ldmatrix' or 'ldmatrix:C'")
    try:
        chunk = int(arg) if arg else 0
    except ValueError:
        raise CLIError(f"bad chunk column in access pattern {spec!r}") from None
    return column_chunk_phases(rows, max(1, 128 // elem_bits), chunk)


def run(args: argparse.Namespace) -> int:
    from hexlayout import draw as hd
    from hexlayout.layout import ComposedLayout, Layout

    elem_bits = None if args.elem_bits is None else elem_bits_arg(args.elem_bits)
    if args.atom:
        if args.layout:
            raise CLIError("give either LAYOUT or --atom, not both")
        atom = load_atom(args.atom)
        if not args.operand:
            raise CLIError("--atom needs --operand (a, b, c for an mma atom; src, dst for a copy atom)")
        grid = hd.atom_grid(atom, args.operand, 16 if elem_bits is None else elem_bits)
    elif not args.layout:
        raise CLIError("nothing to draw: give a LAYOUT or --atom NAME")
    else:
        layout = layout_arg(args.layout)
        if args.tile:
            if not isinstance(layout, Layout):
                raise CLIError(f"a TV layout must be a plain layout, not {layout}")
            m, n = tile_arg(args.tile)
            if layout.rank < 2:
                raise CLIError(f"TV layout {layout} needs a thread mode and a value mode (rank 2)")
            hd.check_evaluable(layout, "TV layout")
            cos = int(layout.indices().max()) + 1
            if cos > m * n:
                raise CLIError(f"TV layout {layout} reaches index {cos - 1}, outside the {m}x{n} tile")
            grid = hd.tv_grid(layout, (m, n))
        elif elem_bits is not None or isinstance(layout, ComposedLayout) or args.access:
            bits = 16 if elem_bits is None else elem_bits
            access = _access(args.access, hd.layout_values(layout).shape[0], bits) if args.access else None
            grid = hd.smem_grid(layout, bits, args.label, access)
        else:
            grid = hd.layout_grid(layout)
    out = hd.render(grid, args.output, labels=args.labels)
    print(f"wrote {out}")
    return 0
