"""Host cost of a cached ``torch.ops.hexlayout.gemm`` call, up to the driver launch (no GPU).

What runs is the production path of a call whose kernel is already built and launched
(a few times): the torch dispatcher, the op's Autograd kernel (no input requires grad, so
it calls the backend's work directly) or, under ``torch.inference_mode()``, its CPU kernel,
then ``hexlayout.ops.gemm.gemm_cached`` (one lookup standing for the argument check's
verdict and the config / launcher lookup, the pointers' alignment, output allocation, the
pre-packed launch: pointers and scale written into the packed parameters). Only what needs
a GPU is stubbed, and said so in the results:

- ``torch.Tensor.is_cuda`` reports ``True`` for the CPU tensors, so ``gemm`` takes its CUDA
  branch (the tensors stay CPU tensors: ``torch.empty`` allocates on the CPU);
- ``torch.cuda.get_device_capability`` answers (8, 0) and ``torch.cuda.current_stream``
  a stream object with a nonzero handle;
- the driver (``launch._drv``) is a stub whose ``cuLaunchKernelEx`` returns success, and the
  launcher's per-device preparation (cubin load) is marked done;
- the argument plan's first (slow) bind of each shape is made for ``"cpu"`` and stored under
  the call's ``"cuda"`` key, because its device check refuses CPU tensors; every timed call
  then takes the same cached fast path a CUDA call takes (through one wrapper call);
- the op is dispatched to its CPU kernel (``HEXLAYOUT_EMULATE=1``), which reads one
  environment variable more than the CUDA kernel does.

The same calls are timed in grad mode and under ``torch.inference_mode()`` (as vLLM runs
them). Also timed: each stage alone (the dispatcher into a trivial op, ``gemm`` called
directly, the usual (uncached) path's check and ``run_checked``, the launcher alone); with
``--runs R`` the whole set R times (the load average of each run reported); with
``--baseline COMMIT``, the
``ops/gemm.py`` of that commit beside the current one in the same process (repeats
interleaved, so both see the same machine load). Writes
``benchmarks/results/host.md`` and ``.json``. Target (issue 10): at most 10 us per
cached call; Triton 3.9's ``JITFunction.run`` costs about 10 us here (REFERENCE.md).

    python benchmarks/bench_host.py [--iters N] [--repeats R] [--runs R] [--tag T] [--baseline COMMIT]
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import gc
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"

TOTAL = "torch.ops.hexlayout.gemm(a, b)"
TOTAL_EP = "torch.ops.hexlayout.gemm(a, b, bias, activation='relu')"
INF = " under torch.inference_mode()"
CACHED = "gemm_cached(a, b) (the op's cached call: one lookup, alignment, token, output, launch)"
NEW_EMPTY = "fresh_like(a, (M, N)) (the output, as gemm_cached allocates it: a.new_empty)"
DIRECT = "hexlayout.ops.gemm(a, b) (no dispatcher)"
CHECK = "check_gemm(a, b) (argument checks)"
RUN = "run_checked(...) (allocation, cached lookup, launch)"
LAUNCH = "Launcher.call_like (cached arguments: pointers, scalars, packing, stub launch)"
PREPARED = "Launcher.prepared(template) launch (the cached call's: pre-packed, pointers and scale rewritten)"
EMPTY = "torch.empty((M, N)), for comparison"
HOLLOW = "torch.ops.hexlayout.gemm(a, b) with check, fast path and impl emptied (dispatcher, op kernel)"
NOOP = "for scale: a define_op op returning a tensor (dispatcher into Python)"
NOOP_AG = "for scale: the same op with a backward registered (torch's Python autograd wrapper)"


class _Driver:
    """The driver calls ``Launcher.__call__`` makes, answering success."""

    class CUresult:
        CUDA_SUCCESS = 0

    def __init__(self) -> None:
        self.launches, self.stream = 0, None

    def cuLaunchKernelEx(self, cfg: Any, fn: Any, params: int, extra: int) -> tuple[int]:  # noqa: N802
        self.launches += 1
        self.stream = cfg.hStream
        return (0,)


def _time(fns: dict[str, Any], iters: int, repeats: int) -> dict[str, dict[str, float]]:
    """Per function: median and min over ``repeats`` of the mean time of ``iters`` calls, in
    microseconds. The repeats go round-robin over the functions, so a change of machine load
    during the run touches every row alike; the garbage collector is off while timing. A
    function given as ``(fn, mode)`` runs inside the context ``mode()`` (entered around each
    timed loop, so its own cost is not counted)."""
    fns = {name: f if isinstance(f, tuple) else (f, contextlib.nullcontext) for name, f in fns.items()}
    for fn, mode in fns.values():
        with mode():
            for _ in range(min(iters, 200)):
                fn()
    means: dict[str, list[float]] = {name: [] for name in fns}
    gc_was = gc.isenabled()
    gc.disable()
    try:
        for _ in range(repeats):
            for name, (fn, mode) in fns.items():
                with mode():
                    t = time.perf_counter()
                    for _ in range(iters):
                        fn()
                    means[name].append((time.perf_counter() - t) / iters * 1e6)
    finally:
        if gc_was:
            gc.enable()
    return {name: {"median_us": statistics.median(v), "min_us": min(v)} for name, v in means.items()}


def stub_gpu(torch: Any, set_attr: Any = setattr) -> _Driver:
    """Make ``gemm``'s CUDA path run on CPU tensors up to the driver launch (see the module
    docstring); ``set_attr`` is ``setattr`` or a test's ``monkeypatch.setattr``. Returns the
    driver stub (it counts launches)."""
    import hexlayout.runtime.launch as launch
    from hexlayout.runtime.args import ArgumentError

    drv = _Driver()
    stream = SimpleNamespace(cuda_stream=0x5EED)
    set_attr(torch.Tensor, "is_cuda", property(lambda self: True))
    set_attr(torch.cuda, "get_device_capability", lambda device=None: (8, 0))
    set_attr(torch.cuda, "current_stream", lambda device=None: stream)
    set_attr(launch, "_drv", lambda: drv)
    real_init = launch.Launcher.__init__

    def init(self: Any, build: Any, **kw: Any) -> None:
        real_init(self, build, **kw)
        self._devices.add(0)
        self._functions[0] = "CUfunction"
        self._config = SimpleNamespace()
        plan = self.plan
        real_bind = plan.bind

        def bind(vals: list[Any], device: str) -> Any:
            try:
                return real_bind(vals, device)       # cached shapes: the fast path, as on a GPU
            except ArgumentError:                    # new shapes: the device check refuses CPU tensors
                key = plan._key(vals, device)
                ba = plan._bind_slow(vals, "cpu")
                ba.device = 0
                plan.cache[key] = ba
                return real_bind(vals, device)

        plan.bind = bind
    set_attr(launch.Launcher, "__init__", init)
    return drv


def gemm_mod_op() -> Any:
    """The ``Op`` of ``torch.ops.hexlayout.gemm``."""
    from hexlayout.ops.gemm.torch_op import gemm_op

    return gemm_op


def baseline_modules(commit: str) -> Any:
    """``hexlayout.ops.gemm`` and its ``gemm_config`` as they were at ``commit`` (``git show``),
    loaded beside the current ones (as ``hexlayout.ops.gemm_at_<commit>``; the old module's
    relative import of ``gemm_config`` goes to the old copy), for timing both in one process:
    the same machine load for both, the repeats interleaved."""
    import importlib.util
    import subprocess

    root = Path(__file__).resolve().parents[1]
    tag = "".join(ch for ch in commit if ch.isalnum())[:12]

    def show(path: str) -> str | None:
        out = subprocess.run(["git", "show", f"{commit}:{path}"], cwd=root, capture_output=True, text=True)
        return out.stdout if out.returncode == 0 else None

    # the op package (ops/gemm/op.py, config.py) or, before it, the flat ops/gemm.py, gemm_config.py
    if show("ops/gemm/op.py") is not None:
        files = {"gemm_config": "ops/gemm/config.py", "gemm": "ops/gemm/op.py"}
        package, config_import = "hexlayout.ops.gemm", "from .config import"
    else:
        files = {"gemm_config": "ops/gemm_config.py", "gemm": "ops/gemm.py"}
        package, config_import = "hexlayout.ops", "from .gemm_config import"
    mods = {}
    for name, path in files.items():
        src = show(path)
        if src is None:
            raise SystemExit(f"bench_host: {path} does not exist at {commit}")
        src = src.replace(config_import, f"from .gemm_config_at_{tag} import")
        full = f"{package}.{name}_at_{tag}"
        spec = importlib.util.spec_from_loader(full, loader=None)
        mod = importlib.util.module_from_spec(spec)
        mod.__package__ = package
        sys.modules[full] = mod
        exec(compile(src, f"<{commit}:{path}>", "exec"), mod.__dict__)
        mods[name] = mod
    return mods["gemm"]


def measure(iters: int, repeats: int, m: int = 128, n: int = 256, k: int = 512,
            baseline: str = "", runs: int = 1) -> dict[str, Any]:
    """Time every row ``runs`` times (each: ``repeats`` round-robin repeats of ``iters`` calls);
    ``rows``: per row the median of the runs' medians and the least min; ``runs``: each run's
    rows and the load average after it."""
    os.environ["HEXLAYOUT_EMULATE"] = "1"
    import hexlayout.ops  # noqa: F401 - registers torch.ops.hexlayout.gemm
    import torch
    from hexlayout.ops.gemm import op as gemm_mod

    from hexlayout.runtime.alloc import fresh_like

    drv = stub_gpu(torch)
    g = torch.Generator().manual_seed(0)
    a = torch.randn(m, k, generator=g).half()
    b = torch.randn(n, k, generator=g).half()
    bias = torch.randn(n, generator=g).half()
    op = torch.ops.hexlayout.gemm
    t0 = time.perf_counter()
    op(a, b)                                   # builds (or loads) and compiles the kernel once
    op(a, b, bias, activation="relu")
    first_s = time.perf_counter() - t0
    for _ in range(2):                         # the cached-call tables filled
        op(a, b)
        op(a, b, bias, activation="relu")
    before = drv.launches
    op(a, b)
    assert drv.launches == before + 1, "the stubbed launch did not run"
    assert len(gemm_mod._HOT) == 2, "the op's calls are not on the cached-call path"

    entry = next(iter(gemm_mod._FAST.values()))       # (launcher, template[, parameter order])
    lau, template = entry[0], entry[1]
    c = torch.empty(m, n, dtype=torch.float16)
    vals = (a, b, c, c[0], c, 1.0)                     # a, b, c, bias, residual, scale
    args = [vals[i] for i in entry[2]] if len(entry) > 2 else list(vals)
    one = torch.zeros(1)
    from hexlayout.runtime.torch_ops import define_op

    out = torch.zeros(1)
    plain = define_op("noop", "(Tensor a) -> Tensor", fake=lambda x: x.new_empty(1), impl=lambda x: out,
                      namespace="hexlayout_bench")
    with_ag = define_op("noop_autograd", "(Tensor a) -> Tensor", fake=lambda x: x.new_empty(1),
                        impl=lambda x: out, backward=lambda ctx, g: g,
                        setup_context=lambda ctx, inputs, output: None, namespace="hexlayout_bench")
    fns: dict[str, Any] = {
        TOTAL: lambda: op(a, b),
        TOTAL_EP: lambda: op(a, b, bias, None, "relu"),
        TOTAL + INF: (lambda: op(a, b), torch.inference_mode),
        TOTAL_EP + INF: (lambda: op(a, b, bias, None, "relu"), torch.inference_mode),
        CACHED: lambda: gemm_mod.gemm_cached(a, b),
        NEW_EMPTY: lambda: fresh_like(a, (m, n)),
        DIRECT: lambda: gemm_mod.gemm(a, b),
        CHECK: lambda: gemm_mod.check_gemm(a, b),
        RUN: lambda: gemm_mod.run_checked(a, b, None, None, "none", None, "nk", m, n, k),
        LAUNCH: lambda: lau.call_like(template, args),
        PREPARED: (lambda go: lambda: go(args))(lau.prepared(template)),
        "Launcher(...) with the full bind (its shape cache), for comparison": lambda: lau(*args),
        EMPTY: lambda: torch.empty((m, n), dtype=a.dtype, device=a.device),
        "for scale: x.add_(0) on a 1-element CPU tensor (an aten op)": lambda: one.add_(0),
        NOOP: lambda: plain.op(one),
        NOOP_AG: lambda: with_ag.op(one),
    }
    gop = gemm_mod_op()
    saved = (gop._check, gop._impl, gop._fast)

    def hollow() -> Any:                      # the op's own dispatch: check, fast path, impl emptied
        gop._check, gop._impl, gop._fast = None, lambda *a, **kw: c, None
        try:
            return op(a, b)
        finally:
            gop._check, gop._impl, gop._fast = saved

    fns[HOLLOW] = hollow
    fns[HOLLOW + INF] = (hollow, torch.inference_mode)
    if baseline:
        old = baseline_modules(baseline)
        old.gemm(a, b)                                  # its own caches filled (the build is shared)
        old.gemm(a, b)
        fns[f"baseline {baseline}: {DIRECT}"] = lambda: old.gemm(a, b)
        fns[f"baseline {baseline}: {CHECK}"] = lambda: old.check_gemm(a, b)
        fns[f"baseline {baseline}: {RUN}"] = lambda: old.run_checked(a, b, None, None, "none", None, "nk",
                                                                       m, n, k)
    per_run = []
    for _ in range(runs):
        per_run.append({"rows": _time(fns, iters, repeats), "load_average": os.getloadavg()[0]})
    rows = {name: {"median_us": statistics.median(r["rows"][name]["median_us"] for r in per_run),
                   "min_us": min(r["rows"][name]["min_us"] for r in per_run)} for name in fns}
    return {"rows": rows, "runs": per_run, "first_call_s": first_s, "shape": [m, n, k],
            "launches": drv.launches}


def _versions() -> dict[str, str]:
    import torch

    out = {"python": platform.python_version(), "torch": torch.__version__}
    try:
        from importlib.metadata import version

        out["hexlayout"] = version("hexlayout")
        out["cuda-bindings"] = version("cuda-bindings")
    except Exception:  # noqa: BLE001 - versions are informative only
        pass
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20000)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--runs", type=int, default=1, help="time the whole set this many times")
    ap.add_argument("--tag", default="", help="suffix of the result files (host-<tag>.md)")
    ap.add_argument("--baseline", default="", help="a git commit whose ops/gemm.py is timed beside the "
                    "current one (same process, interleaved repeats)")
    ns = ap.parse_args(argv)
    load_before = os.getloadavg()[0]
    res = measure(ns.iters, ns.repeats, baseline=ns.baseline, runs=ns.runs)
    cpu = ""
    try:
        cpu = next(ln.split(":", 1)[1].strip() for ln in open("/proc/cpuinfo") if ln.startswith("model name"))
    except (OSError, StopIteration):
        pass
    meta = {"date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
            "machine": platform.platform(), "cpu": cpu, "cpus": os.cpu_count(),
            "load_average": os.getloadavg()[0], "load_average_before": load_before, "iters": ns.iters,
            "repeats": ns.repeats, "runs": ns.runs,
            "versions": _versions(), "stubbed": "is_cuda, get_device_capability, current_stream, the driver "
                                                "launch, the first bind's device check (see bench_host.py)"}
    for name, r in res["rows"].items():
        print(f"{r['median_us']:8.2f} us (min {r['min_us']:.2f})  {name}")
    RESULTS.mkdir(parents=True, exist_ok=True)
    stem = "host" + (f"-{ns.tag}" if ns.tag else "")
    (RESULTS / f"{stem}.json").write_text(json.dumps({"meta": meta, **res}, indent=1))
    lines = [f"# Host cost per cached torch-op call ({meta['date'][:10]})", "",
             f"{meta['cpu']} ({meta['cpus']} CPUs, load average {load_before:.1f} before, "
             f"{meta['load_average']:.1f} after), {meta['machine']}; "
             + ", ".join(f"{k} {v}" for k, v in meta["versions"].items()) + ".", "",
             f"No GPU: stubbed {meta['stubbed']}. M x N x K = {' x '.join(map(str, res['shape']))}, f16. "
             f"Mean of {ns.iters} calls, median (min) of {ns.repeats} repeats, GC off while timing"
             + (f"; {ns.runs} runs: the median of the runs' medians (the least min)" if ns.runs > 1 else "")
             + ".", "",
             "| path | us per call |", "|---|---|"]
    lines += [f"| {name} | {r['median_us']:.2f} ({r['min_us']:.2f}) |" for name, r in res["rows"].items()]
    if ns.runs > 1:
        lines += ["", "## Each run (median (min) us; load average after the run)", "",
                  "| run | load | " + " | ".join((TOTAL, TOTAL_EP, TOTAL + INF, TOTAL_EP + INF)) + " |",
                  "|---|---|---|---|---|---|"]
        for i, run in enumerate(res["runs"]):
            cells = [f"{run['rows'][x]['median_us']:.2f} ({run['rows'][x]['min_us']:.2f})"
                     for x in (TOTAL, TOTAL_EP, TOTAL + INF, TOTAL_EP + INF)]
            lines.append(f"| {i + 1} | {run['load_average']:.1f} | " + " | ".join(cells) + " |")
    med = {name: r["median_us"] for name, r in res["rows"].items()}
    for mode in ("", INF):
        split = [("torch dispatcher, the op's " + ("CPU kernel" if mode else "Autograd kernel")
                  + " (the key set's backend, the environment check)", med[HOLLOW + mode]),
                 ("gemm_cached: the key, one lookup, alignment, tuning token",
                  med[CACHED] - med[NEW_EMPTY] - med[PREPARED]),
                 ("gemm_cached: the output (fresh_like: a.new_empty)", med[NEW_EMPTY]),
                 ("gemm_cached: the pre-packed launch (Launcher.prepared: pointers, scale, stub launch)",
                  med[PREPARED]),
                 ("the rest (the op minus the rows above: the calls between them)",
                  med[TOTAL + mode] - med[HOLLOW + mode] - med[CACHED])]
        lines += ["", f"## Where the time of {TOTAL}{mode} goes (medians)", "",
                  "| part | us |", "|---|---|"]
        lines += [f"| {what} | {us:.2f} |" for what, us in split]
        lines += [f"| the op | {med[TOTAL + mode]:.2f} |"]
    lines += ["", "Target (issue 10): <= 10 us per cached `torch.ops.hexlayout.gemm` call up to the driver "
              "launch. Triton 3.9 `JITFunction.run`: about 10 us on this machine (REFERENCE.md).", ""]
    (RESULTS / f"{stem}.md").write_text("\n".join(lines))
    print(f"wrote {RESULTS / stem}.md and .json", file=sys.stderr)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
