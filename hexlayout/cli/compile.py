"""``hexlayout compile``: a kernel synthesized, printed as CUDA C++ and compiled; one artifact out.

    hexlayout compile gemm --arch sm_90a --emit sass -o gemm_sm90.sass
    hexlayout compile gemm --arch sm_80 --emit cuda -o gemm_sm80.cu
    hexlayout compile attention --arch sm_80 -D CAUSAL=true --emit cubin -o fa.cubin
    hexlayout compile my_kernels.py:gemm --arch sm_89 --emit ptx -o gemm.ptx
    hexlayout compile gemm --arch sm_90a --stats          # static quality report, no file
    hexlayout compile gemm --arch sm_80 --stats json      # the same as one JSON document

``--emit cuda`` writes the generated source (no compiler needed); ``ptx`` and ``cubin`` come
from NVRTC (or nvcc) through the on-disk cache; ``sass`` is the cubin disassembled with
cuobjdump. A one-line summary follows: registers, spills, shared memory, synthesis and
compile time, and whether the cubin came from the cache. No GPU is needed.

``--stats`` (with or without ``--emit``) prints the static quality report of the cubin
(``hexlayout.runtime.stats``): registers and the highest register per ``setmaxnreg`` region,
spills, shared memory, the main loop's instruction count and mix, MMA per iteration,
non-MMA instructions per k-tile (k-tiles per iteration = MMA in the SASS loop / MMA that one
iteration of the kernel's k-loop issues in the lowered program), epilogue store widths,
TMA / ldmatrix / stmatrix / cp.async use and ptxas' warnings. ``--stats json`` prints it as
JSON (the keys of ``KernelStats.to_dict``, documented in docs/explain-json.md under ``stats``).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from . import CLIError
from .kernels import ARCHS, arch_arg, known_names, parse_defines, resolve, synthesize_kernel

__all__ = ["register", "run", "EMITS", "summary_line"]

EMITS = ("cuda", "ptx", "cubin", "sass")

#: ids of the builds this process has reported (``build`` memoizes them: a second request is a hit)
_REPORTED: set[int] = set()


def register(sub: Any) -> argparse.ArgumentParser:
    """Add the ``compile`` subcommand to ``sub``."""
    p = sub.add_parser("compile", help="synthesize and compile a kernel; write CUDA C++, PTX, cubin or SASS",
                       description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("kernel", metavar="KERNEL",
                   help=f"a registered kernel ({', '.join(known_names())}), module:attr or file.py:attr")
    p.add_argument("--arch", type=arch_arg, required=True, metavar="ARCH",
                   help=f"target architecture: {', '.join(ARCHS)}")
    p.add_argument("--emit", choices=EMITS, help="what to write (required unless --stats)")
    p.add_argument("-D", dest="defines", action="append", default=[], metavar="NAME=VALUE",
                   help="a compile-time constant, e.g. -D BM=64 -D CAUSAL=true (repeatable)")
    p.add_argument("-o", "--output", metavar="FILE", help="output file ('-' for stdout, not for cubin); "
                   "required with --emit")
    p.add_argument("--stats", nargs="?", const="text", choices=("text", "json"), metavar="{text,json}",
                   help="print the static quality report of the cubin (registers, spills, main loop, "
                   "non-MMA per k-tile, stores, ptxas warnings); 'json' for one JSON document")
    p.add_argument("--no-cache", action="store_true", help="compile even if the cubin is in the disk cache")
    p.set_defaults(func=run)
    return p


def _kib(n: int) -> str:
    return f"{n / 1024:.1f} KiB" if n % 1024 else f"{n // 1024} KiB"


def summary_line(name: str, arch: str, output: str, nbytes: int, generated: Any, compiled: Any,
                 synth_s: float | None) -> str:
    """``name arch: wrote FILE (N bytes); R registers, no spills, S shared; ...`` on one line;
    ``synth_s`` None: the build was loaded from the persisted build cache (no synthesis, no
    compile)."""
    parts = [f"{name} {arch}: wrote {output} ({nbytes} bytes)"]
    smem = generated.smem_bytes
    if compiled is not None:
        res = compiled.resources
        if res is not None:
            spills = (f"spills {res.spill_stores} B stored / {res.spill_loads} B loaded" if res.spills
                      else "no spills")
            smem += res.shared_static
            parts.append(f"{res.registers} registers, {spills}")
        else:
            parts.append("registers unknown")
    parts.append(f"{_kib(smem)} shared memory")
    parts.append(f"{generated.threads} threads")
    if synth_s is None:
        parts.append("synthesis skipped, compile skipped: cache hit (persisted build)")
        return "; ".join(parts)
    parts.append(f"synthesis {synth_s:.2f} s")
    if compiled is not None:
        hit = f"cache hit ({compiled.cache})" if compiled.cache_hit else "cache miss"
        parts.append(f"compile {compiled.seconds:.2f} s, {hit}, {compiled.compiler}")
    return "; ".join(parts)


def _build(rk: Any, compile: bool, no_cache: bool) -> tuple[Any, Any, Any, float | None]:
    """``(lowered kernel, generated, compiled or None, synthesis seconds)`` of ``rk``: through
    ``hexlayout.runtime.build`` and its persisted build cache (a hit - or a build this process
    already made - skips synthesis and the compiler: seconds None), or with ``no_cache``
    synthesized and compiled afresh."""
    from hexlayout.codegen import generate
    from hexlayout.runtime import build, compile_generated

    if not no_cache:
        b = build(rk.trace(), rk.arch, compile=compile)
        reused = "load" in b.seconds or id(b) in _REPORTED      # persisted, or built earlier in-process
        _REPORTED.add(id(b))
        return b.lowered, b.generated, b.compiled, (None if reused else b.seconds["synthesize"])
    result = synthesize_kernel(rk)
    gen = generate(result.synthesis.lowered.kernel)
    compiled = compile_generated(gen, cache=False) if compile else None
    return result.synthesis.lowered.kernel, gen, compiled, result.synth_seconds


def run(args: argparse.Namespace) -> int:
    """Resolve, synthesize, generate, compile ``args.kernel`` and write the ``--emit`` artifact."""
    from hexlayout.runtime import CompileError, ToolchainError

    if args.emit is None and args.stats is None:
        raise CLIError("nothing to do: give --emit cuda|ptx|cubin|sass with -o FILE, or --stats")
    if (args.emit is None) != (args.output is None):
        raise CLIError("--emit and -o go together: --emit says what to write, -o where")
    rk = resolve(args.kernel, args.arch, parse_defines(args.defines))
    t = time.perf_counter()
    try:
        lowered, gen, compiled, synth_s = _build(rk, args.emit != "cuda", args.no_cache)
    except (CompileError, ToolchainError) as e:
        raise CLIError(str(e)) from None
    gen_s = time.perf_counter() - t
    data: bytes
    if args.emit is None:
        return _print_stats(args, gen, lowered, compiled)
    if args.emit == "cuda":
        data = gen.source.encode()
    elif args.emit == "ptx":
        data = compiled.ptx.encode()
    elif args.emit == "cubin":
        data = compiled.cubin
    else:
        try:
            data = compiled.sass().encode()
        except (CompileError, ToolchainError) as e:
            raise CLIError(str(e)) from None
    if not data:
        raise CLIError(f"the {args.emit} output of {gen.name} is empty")
    if args.output == "-":
        if args.emit == "cubin":
            raise CLIError("a cubin is binary: give a file name with -o")
        sys.stdout.write(data.decode())
        out_name = "stdout"
    else:
        out = Path(args.output)
        if out.parent and not out.parent.exists():
            raise CLIError(f"directory {out.parent} does not exist")
        out.write_bytes(data)
        out_name = str(out)
    line = summary_line(gen.name, args.arch, out_name, len(data), gen, compiled, synth_s)
    line += f"; total {gen_s:.2f} s"
    print(line, file=sys.stderr if args.output == "-" else sys.stdout)
    if args.stats is not None:
        return _print_stats(args, gen, lowered, compiled)
    return 0


def _print_stats(args: argparse.Namespace, gen: Any, lowered: Any, compiled: Any = None) -> int:
    """Compile (if not done) and print ``KernelStats`` as text or JSON on stdout (stderr when
    the artifact went to stdout)."""
    import json

    from hexlayout.runtime import CompileError, ToolchainError, compile_generated
    from hexlayout.runtime.stats import StatsError, kernel_stats, mma_per_source_iteration

    try:
        if compiled is None:
            compiled = compile_generated(gen, cache=not args.no_cache)
        st = kernel_stats(compiled.cubin, sass=compiled.sass(), log=compiled.log, name=compiled.name,
                          resources=compiled.resources,
                          mma_per_ktile=mma_per_source_iteration(lowered),
                          shared_dynamic=gen.smem_bytes)
    except (CompileError, ToolchainError, StatsError) as e:
        raise CLIError(str(e)) from None
    text = json.dumps(st.to_dict(), indent=2) if args.stats == "json" else st.summary()
    print(text, file=sys.stderr if args.output == "-" else sys.stdout)
    return 0
