"""The ``hexlayout`` command line: ``hexlayout <subcommand> ...``.

Each subcommand lives in its own module under ``hexlayout.cli`` and exposes
``register(subparsers) -> argparse.ArgumentParser`` (adding its parser, whose ``func``
default is the function to run with the parsed arguments, returning an exit status).
New subcommands (``explain``, ``compile``, ...) are added by listing their module in
``SUBCOMMANDS``.

User errors (a malformed layout, an unknown atom, a bad file name) are reported as one
``hexlayout <cmd>: error: ...`` message on stderr with exit status 1, without a traceback
(``--traceback`` shows it); usage errors exit with argparse's status 2.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from hexlayout.errors import HexlayoutError

__all__ = ["main", "build_parser", "CLIError", "SUBCOMMANDS"]

# Module names under hexlayout.cli, in the order ``--help`` lists them.
SUBCOMMANDS = ("explain", "compile", "draw", "demo")


class CLIError(HexlayoutError):
    """An error in the user's input: printed as a message, exit status 1."""


def build_parser() -> argparse.ArgumentParser:
    from hexlayout import __version__

    parser = argparse.ArgumentParser(
        prog="hexlayout",
        description="hexlayout: GPU kernels whose layouts are synthesized. Layouts are written "
                    "in CuTe notation, e.g. '(4,8):(8,1)' or 'Sw<3,3,3> o 0 o (8,64):(64,1)'.",
    )
    parser.add_argument("--version", action="version", version=f"hexlayout {__version__}")
    parser.add_argument("--traceback", action="store_true", help="show the Python traceback on errors")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", title="commands")
    for name in SUBCOMMANDS:
        importlib.import_module(f"{__name__}.{name}").register(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if getattr(args, "func", None) is None:
        parser.print_help()
        return 2
    try:
        return int(args.func(args) or 0)
    except BrokenPipeError:
        # the reader went away (e.g. `hexlayout explain gemm | head`): stop quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (CLIError, ValueError, KeyError, OSError) as e:
        if args.traceback:
            raise
        msg = e.args[0] if isinstance(e, KeyError) and e.args else str(e)
        print(f"hexlayout {args.command}: error: {msg}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
