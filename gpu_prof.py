import sys, time, torch
sys.path.insert(0, "benchmarks")
import bench_moe as bm
import hexlayout.ops as hops
from torch.profiler import profile, ProfilerActivity
e, k, h, inter = bm.MODELS["deepseek-v3-tp8"]
for t in (1, 16):
    p = bm.make_problem(e, k, h, inter, t, torch.bfloat16, "cuda")
    x, w13, w2, tw, ids = p["x"], p["w13"], p["w2"], p["tw"], p["ids"]
    (q13, s13, _), (q2, s2, _) = bm.quant_gptq4(w13), bm.quant_gptq4(w2)
    a = hops.prepare_wna16(q13, s13, quant_format="gptq", bits=4, group_size=128)
    b = hops.prepare_wna16(q2, s2, quant_format="gptq", bits=4, group_size=128)
    fns = {"bf16": lambda: hops.fused_moe(x, w13, w2, tw, ids), "w4a16": lambda: hops.fused_moe(x, a, b, tw, ids)}
    for name, fn in fns.items():
        for _ in range(5): fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(20): fn()
        host = (time.perf_counter() - t0) / 20
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / 20
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5): fn()
            torch.cuda.synchronize()
        print(f"== T={t} {name}: host {host*1e3:.3f} ms/call, wall {wall*1e3:.3f} ms/call", flush=True)
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=8, max_name_column_width=60), flush=True)
