import torch, hexlayout.ops  # noqa
torch.backends.cuda.matmul.allow_tf32 = False
print("tf32", torch.backends.cuda.matmul.allow_tf32, torch.get_float32_matmul_precision())
for (m, n, k) in ((4096, 8192, 28672), (4096, 4096, 14336), (128, 8192, 28672)):
    for dt in (torch.float16, torch.bfloat16):
        g = torch.Generator(device="cuda").manual_seed(1)
        a = torch.randn(m, k, device="cuda", dtype=dt, generator=g)
        b = torch.randn(n, k, device="cuda", dtype=dt, generator=g)
        c = torch.ops.hexlayout.gemm(a, b)
        cb = a @ b.t()
        ref = a.double() @ b.double().t()
        f32 = a.float() @ b.float().t()
        def rel(x):
            r = (x.double() - ref).abs() / (ref.abs() + 1)
            i = int(r.argmax())
            return f"{r.max().item():.2e} mean {r.mean().item():.1e} at {divmod(i, n)} x={x.flatten()[i].item():.3f} ref={ref.flatten()[i].item():.3f}"
        print(m, n, k, dt, "hex", rel(c), "| cublas", rel(cb), "| f32ref", rel(f32), flush=True)
        bad = ((c.double() - ref).abs() / (ref.abs() + 1) > 4e-3)
        if bad.any():
            rows, cols = bad.nonzero(as_tuple=True)
            print("  bad count", int(bad.sum()), "rows", rows.unique()[:10].tolist(), "cols mod 128", (cols % 128).unique()[:10].tolist(), "col blocks", (cols // 128).unique()[:10].tolist(), "row blocks", (rows//128).unique()[:10].tolist())
