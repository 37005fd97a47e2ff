"""The production GEMM in ``hexlayout demo``: synthesized, compiled, verified, and on a GPU timed.

Without a GPU: the layout-free GEMM of ``hexlayout.ops`` is synthesized for sm_80 and
sm_90a, compiled to a cubin (registers, spills, the SASS instruction mix) and checked
thread by thread in the emulator on a ragged problem. With a GPU: ``torch.ops.hexlayout.gemm``
is timed beside ``torch.matmul`` (cuBLAS) for bf16 at 4096 and 8192 cubed.
"""

from __future__ import annotations

from typing import Any

__all__ = ["gemm_section"]

_SASS = ("HMMA", "HGMMA", "LDSM", "LDGSTS", "UTMALDG", "STSM", "LDG", "STG", "LDS", "SHFL", "BAR", "SYNCS")


def _mix(counts: dict[str, int]) -> str:
    groups: dict[str, int] = {}
    for op, n in counts.items():
        for g in _SASS:
            if op.startswith(g + ".") or op == g:
                groups[g] = groups.get(g, 0) + n
                break
    total = sum(counts.values())
    return ", ".join(f"{g} {n}" for g, n in sorted(groups.items(), key=lambda x: -x[1])) + f" (of {total})"


def _emulate(bld: Any, m: int, n: int, k: int) -> float:
    import numpy as np

    from hexlayout.emulator import run

    rng = np.random.default_rng(1)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    c = np.zeros((m, n), np.float16)
    run(bld.lowered, {"a": a, "b": b, "c": c})
    ref = a.astype(np.float64) @ b.astype(np.float64).T
    return float((np.abs(c - ref) / (np.abs(ref) + 1)).max())


def _gpu_section() -> None:  # pragma: no cover - needs a GPU
    import torch

    import hexlayout.ops  # noqa: F401 - registers torch.ops.hexlayout.gemm

    print(f"  on {torch.cuda.get_device_name()}: bf16 C = A @ B^T, TFLOP/s (median of 20)")
    for size in (4096, 8192):
        a = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")
        b = torch.randn(size, size, dtype=torch.bfloat16, device="cuda")
        res = {}
        for name, fn in (("hexlayout", lambda a=a, b=b: torch.ops.hexlayout.gemm(a, b)),
                         ("cuBLAS", lambda a=a, b=b: torch.matmul(a, b.t()))):
            for _ in range(5):
                fn()
            times = []
            for _ in range(20):
                s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                s.record()
                fn()
                e.record()
                torch.cuda.synchronize()
                times.append(s.elapsed_time(e))
            times.sort()
            res[name] = 2 * size ** 3 / times[len(times) // 2] / 1e9
        print(f"    {size}^3: hexlayout {res['hexlayout']:.0f} TFLOP/s, cuBLAS {res['cuBLAS']:.0f} TFLOP/s "
              f"({res['hexlayout'] / res['cuBLAS']:.2f}x)")


def gemm_section() -> None:
    import hexlayout.lang as hl
    from hexlayout.ops.gemm.config import choose_config
    from hexlayout.ops.gemm.kernels import gemm_sm80_kernel, gemm_sm90_kernel
    from hexlayout.runtime import ToolchainError, build

    print("\n== the production GEMM (hexlayout.ops), written without layouts, synthesized and compiled")
    for arch, factory in (("sm_80", gemm_sm80_kernel), ("sm_90a", gemm_sm90_kernel)):
        cfg = choose_config(arch, 4096, 4096, 4096)
        try:
            bld = build(factory(hl.f16), arch, **cfg.consts(4096, 4096))
            counts = bld.compiled.sass_counts()
        except ToolchainError as e:
            print(f"  {arch}: not compiled here ({e})")
            bld, counts = build(factory(hl.f16), arch, compile=False, **cfg.consts(4096, 4096)), None
        syn = bld.synthesis
        if "load" in bld.seconds:
            how = f"loaded from the build cache in {bld.seconds['load']:.2f} s (synthesized earlier)"
        elif bld.compiled is None:
            how = f"synthesized in {bld.seconds['synthesize']:.2f} s"
        else:
            how = (f"synthesized in {bld.seconds['synthesize']:.2f} s, compiled in "
                   f"{bld.seconds.get('compile', 0.0):.2f} s ({bld.compiled.cache or 'fresh'})")
        print(f"  {arch}, {cfg}: {how}")
        for d in syn.decisions:
            if d.subject.startswith(("mma", "shared")):
                print(f"    {d.subject}: {d.chosen}")
        instrs = sorted({ins for _, ins in syn.lowered.choices if not ins.startswith("TiledMma")})
        print(f"    copies: {', '.join(instrs)}")
        if counts is not None:
            res = bld.compiled.resources
            print(f"    cubin: {res.registers} registers, {res.spill_stores} spills; SASS: {_mix(counts)}")
        small = build(factory(hl.f16), arch, compile=False, **cfg.consts(200, 136))
        err = _emulate(small, 200, 136, 264)
        print(f"    emulated on 200 x 136 x 264: {'matches' if err < 1e-2 else 'DOES NOT MATCH'} float64 "
              f"(max relative error {err:.1e})")
    try:
        import torch

        has_gpu = torch.cuda.is_available()
    except ImportError:
        has_gpu = False
    if has_gpu:
        _gpu_section()
    else:
        print("  no GPU here: timings against cuBLAS come from benchmarks/bench_gemm.py on a GPU machine")
