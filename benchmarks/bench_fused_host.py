"""Host cost of a cached ``hexlayout.fusion.run_fused`` call, up to the driver launch (no GPU).

The fused kernel is built (NVRTC) and launched once; then the timed calls take the path a
CUDA call takes: planning (the memoized plan of the spec and the arguments' shapes), the
build lookup, output allocation, the launch. The GPU parts are stubbed as in
``bench_host.py`` (``stub_gpu``: ``is_cuda``, the device capability, the stream, the driver
launch). Rows: ``run_fused`` of a linear -> GELU -> residual-add kernel (the MLP block's
first half) and of a concatenated gate/up projection with ``silu(gate) * up`` (column
halves), and the compiled graph's ``torch.ops.hexlayout.fused_kernel`` call of the former.
Writes ``benchmarks/results/fused_host[-tag].md`` and ``.json``.

    python benchmarks/bench_fused_host.py [--iters N] [--repeats R] [--tag T]
"""

from __future__ import annotations

import argparse
import datetime as dt
import importlib.util
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def _bench_host() -> Any:
    path = Path(__file__).resolve().parent / "bench_host.py"
    spec = importlib.util.spec_from_file_location("bench_host", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def measure(iters: int, repeats: int, m: int = 128, n: int = 256, k: int = 512) -> dict[str, Any]:
    os.environ["HEXLAYOUT_EMULATE"] = "1"
    import hexlayout.ops  # noqa: F401 - registers the anchor kernels
    import torch

    from hexlayout.fusion import Epilogue, FusedSpec, Node, run_fused

    bench = _bench_host()
    drv = bench.stub_gpu(torch)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(m, k, generator=g).half()
    w = torch.randn(n, k, generator=g).half()
    bias = torch.randn(n, generator=g).half()
    res = torch.randn(m, n, generator=g).half()
    a = ("anchor",)
    mlp = FusedSpec("aten.linear.default", epilogue=Epilogue(
        (Node("aten.gelu.default", (a,), (("approximate", "tanh"),)),
         Node("aten.add.Tensor", (("node", 0), ("input", 0)))), (("node", 1),)))
    gated = FusedSpec("aten.linear.default", epilogue=Epilogue(
        (Node("aten.slice.Tensor", (a, ("const", -1), ("const", 0), ("const", n // 2))),
         Node("aten.slice.Tensor", (a, ("const", -1), ("const", n // 2), ("const", n))),
         Node("aten.silu.default", (("node", 0),)),
         Node("aten.mul.Tensor", (("node", 2), ("node", 1)))), (("node", 3),)))
    t0 = time.perf_counter()
    run_fused(mlp, [x, w, bias], [res])
    run_fused(gated, [x, w], [])
    first_s = time.perf_counter() - t0

    # the compiled graph's call: torch.ops.hexlayout.fused_kernel of the same MLP half
    def f(x: Any) -> Any:
        return torch.nn.functional.gelu(torch.nn.functional.linear(x, w, bias), approximate="tanh") + res

    from hexlayout.fusion import fused_op

    seen: list = []
    real_impl = fused_op._impl
    def spy(key: str, tensors: list, ints: list) -> list:   # the call the compiled graph makes
        seen.append((key, tensors, ints))
        return real_impl(key, tensors, ints)

    fused_op._impl = spy
    with torch.no_grad():
        compiled = torch.compile(f, backend="hexlayout", options={"fallback": "eager"})
        compiled(x)
        fused_op._impl = real_impl
        (key, tensors, ints), = seen
        fk = fused_op.kernel(key)
        assert fk.fused_calls == 1 and fk.torch_calls == 0, "the compiled kernel did not run fused"
        op = torch.ops.hexlayout.fused_kernel
        before = drv.launches
        op(key, tensors, ints)
        assert drv.launches == before + 1

    fns = {
        "run_fused(linear -> gelu -> + residual)": lambda: run_fused(mlp, [x, w, bias], [res]),
        "run_fused(gate/up halves -> silu(gate) * up)": lambda: run_fused(gated, [x, w], []),
        "torch.ops.hexlayout.fused_kernel (the compiled graph's call of the first)":
            lambda: op(key, tensors, ints),
        "for scale: torch.empty((M, N)) (one output)": lambda: torch.empty((m, n), dtype=x.dtype),
    }
    with torch.no_grad():
        rows = bench._time(fns, iters, repeats)
    return {"rows": rows, "first_call_s": first_s, "shape": [m, n, k], "launches": drv.launches}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=500)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--tag", default="")
    args = ap.parse_args(argv)
    import torch

    import hexlayout

    load = os.getloadavg()[0]
    res = measure(args.iters, args.repeats)
    load2 = os.getloadavg()[0]
    m, n, k = res["shape"]
    today = dt.date.today().isoformat()
    name = "fused_host" + (f"-{args.tag}" if args.tag else "")
    cpu = platform.processor() or platform.machine()
    head = (f"# Host cost per cached fused-kernel call ({today}{', ' + args.tag if args.tag else ''})\n\n"
            f"{cpu} ({os.cpu_count()} CPUs, load average {load:.1f} before, {load2:.1f} after), "
            f"{platform.platform()}; python {platform.python_version()}, torch {torch.__version__}, "
            f"hexlayout {hexlayout.__version__}.\n\nNo GPU: stubbed is_cuda, get_device_capability, "
            "current_stream, the driver launch (bench_host.stub_gpu). "
            f"M x N x K = {m} x {n} x {k}, f16. Mean of {args.iters} calls, median (min) of {args.repeats} "
            "repeats, GC off while timing.\n\n| path | us per call |\n|---|---|\n")
    body = "".join(f"| {p} | {r['median_us']:.2f} ({r['min_us']:.2f}) |\n" for p, r in res["rows"].items())
    RESULTS.mkdir(exist_ok=True)
    (RESULTS / f"{name}.md").write_text(head + body)
    (RESULTS / f"{name}.json").write_text(json.dumps(res, indent=1))
    sys.stdout.write(head + body)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
