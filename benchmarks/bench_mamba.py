"""Mamba benchmark (issue 24, "Performance"): the scan, decode-step and convolution ops against
mamba_ssm's and vLLM's kernels and the HBM roofline.

These kernels are memory-bound, so each is measured as achieved bandwidth: the bytes an ideal
kernel moves (every input read once, every output written once; a decode step reads and writes
its state rows) over the median time, and as ``roofline``, the fraction of the device's peak
HBM bandwidth (``--peak-gbps`` or a table by device name; 1.0 = at peak):
``roofline = (bytes / peak) / time``.

- **selective_scan** (Mamba-1 prefill, ``hexlayout.ops.selective_scan``): batch 1 .. 64 x
  seqlen 1k .. 8k x dim 1536 / 5120 (Mamba-790M / Mamba-2.8B's inner width), N = 16, with
  ``D``, ``z``, ``delta_bias`` and softplus (a Mamba-1 layer's call). Peers: mamba_ssm's
  ``selective_scan_fn``; vLLM's ``selective_scan_fn`` (batch layout, its own state buffer and copy of ``z``).
  bytes = (4 [u, delta, z, out] * B * dim * L + 2 [B, C] * B * G * N * L) * esize
  + (dim * N + 2 * dim) * 4.
- **state_update** (one decode step, ``hexlayout.ops.selective_state_update``), batch 1 .. 256,
  both forms: Mamba-1 (dim 5120, N 16) and Mamba-2 (a Nemotron-H-8B-like layer: H 128, P 64,
  G 8, N 128), states in a larger cache addressed by ``state_batch_indices`` (vLLM's layout).
  Peers: mamba_ssm's and vLLM's ``selective_state_update``.
  bytes = 2 * |state rows| * state esize + (x, dt, z, y, B, C) bytes + A / D / dt_bias.
- **ssd_scan** (Mamba-2 prefill, ``hexlayout.ops.ssd_scan``) on the same Mamba-2 layer, batch
  1 .. 8 x seqlen 1k .. 8k, chunk 256. Peers: mamba_ssm's ``mamba_chunk_scan_combined``; vLLM's
  ``mamba_chunk_scan_combined`` where its version still has it.
  bytes = (3 [x, z, y] * B * L * H * P + B * L * H [dt] + 2 * B * L * G * N) * esize + 3 H * 4.
- **causal_conv1d** (prefill) and **conv1d_update** (decode) on that layer's convolution
  (dim = H * P + 2 G N = 10240, width 4, SiLU). Peers: ``causal_conv1d_fn`` /
  ``causal_conv1d_update`` of the ``causal_conv1d`` package (mamba_ssm's dependency) and vLLM's.

Targets on an H100 (SXM, 3.35 TB/s): selective scan and state update >= 80 % of HBM bandwidth at
batch >= 8. Every implementation is checked on its first call against a float64 sequential
recurrence written in this script (on a slice of the problem on the GPU: batch row 0 and the
first channels / heads, which do not depend on the others), then timed with CUDA events (median
of ``--iters`` after ``--warmup``, L2 flushed between iterations, ``benchmarks/timing.py``).
A peer that cannot be imported is listed in the JSON's ``meta.unavailable`` with the reason; a
peer that fails on a shape records the error in its row. Writes
``benchmarks/results/mamba_<device>.json`` / ``.md`` / ``.png``.

``python benchmarks/bench_mamba.py [--dtype bf16] [--quick] [--what scan] [--peak-gbps N]`` on a
CUDA GPU. ``--dry-run [--out DIR]``: no GPU: tiny shapes on CPU tensors through the emulator
(``HEXLAYOUT_EMULATE=1`` is set), hexlayout checked against the float64 references; wall-clock
times mean nothing there, the run shows the script works end to end (tested).
"""

from __future__ import annotations

import argparse
import datetime as dt
import inspect
import json
import platform
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from roofline import max_rel_err, peak_gbps  # noqa: E402 - sibling modules, found when loaded by path too
from timing import run_benchmark, time_ms  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"
KINDS = ("selective_scan", "state_update", "ssd_scan", "causal_conv1d", "conv1d_update")
WHAT = {"scan": ("selective_scan", "ssd_scan", "causal_conv1d"), "decode": ("state_update", "conv1d_update")}
MAX_BYTES = 24 << 30  # problems moving more than this are left out
REF_DIM = 64  # GPU: the reference covers batch row 0 and this many channels (Mamba-1, conv)
M1 = {"N": 16, "G": 1, "decode_dim": 5120}  # Mamba-1 (Mamba-2.8B's decode width)
M2 = {"H": 128, "P": 64, "G": 8, "N": 128, "width": 4, "chunk": 256}  # Nemotron-H-8B-like layer

#: GPU shapes; ``--quick`` takes the second of each pair
FULL = {
    "scan": ((1, 8, 64), (1024, 4096, 8192), (1536, 5120)),
    "decode": (1, 8, 32, 64, 128, 256),
    "ssd": ((1, 4, 8), (1024, 4096, 8192)),
}
QUICK = {"scan": ((1, 8, 64), (4096,), (5120,)), "decode": (1, 8, 64, 256), "ssd": ((1, 8), (4096,))}
#: --dry-run: the same structure, emulator-sized (chunk 8 does not divide seqlen 20)
DRY = {"scan": ((2,), (24,), (8,)), "decode": (2,), "ssd": ((1,), (20,))}
DRY_M1 = {"N": 4, "G": 2, "decode_dim": 8}
DRY_M2 = {"H": 4, "P": 4, "G": 2, "N": 4, "width": 4, "chunk": 8}


# ------------------------------------------------------------------------------------ references
def _softplus(x: Any) -> Any:
    import torch

    return torch.where(x > 20, x, torch.log1p(torch.exp(x)))


def ref_selective_scan(u: Any, delta: Any, A: Any, B: Any, C: Any, D: Any, z: Any, delta_bias: Any) -> Any:
    """float64, step by step: ``Δ = softplus(delta + delta_bias)``, ``h_t = exp(Δ_t A) ⊙ h_{t-1}
    + Δ_t B_t u_t``, ``y_t = C_t · h_t + D u_t``, ``out = y · silu(z)``; B, C ``[b, G, N, L]``."""
    import torch

    if B.dim() == 3:  # [b, N, L]: one group
        B, C = B[:, None], C[:, None]
    u, delta, z, A, D = (t.double() for t in (u, delta, z, A, D))
    b, dim, L = u.shape
    rep = dim // B.shape[1]
    Bx, Cx = (t.double().repeat_interleave(rep, 1) for t in (B, C))  # [b, dim, N, L]
    d = _softplus(delta + delta_bias.double()[:, None])
    h = torch.zeros(b, dim, A.shape[1], dtype=torch.float64, device=u.device)
    ys = []
    for t in range(L):
        h = torch.exp(d[:, :, t, None] * A) * h + (d[:, :, t] * u[:, :, t])[..., None] * Bx[..., t]
        ys.append((h * Cx[..., t]).sum(-1) + D * u[:, :, t])
    y = torch.stack(ys, -1)
    return y * z * torch.sigmoid(z)


def ref_state_update(state: Any, x: Any, dt_: Any, A: Any, B: Any, C: Any, D: Any, dt_bias: Any) -> tuple:
    """float64 decode step of both forms (Mamba-1 ``state [b, dim, N]``, Mamba-2 ``[b, H, P, N]``
    with ``dt [b, H]``, ``A [H]``), softplus on: ``state' = exp(Δ A) ⊙ state + Δ x Bᵀ``,
    ``y = state' C + D x``; returns ``(y, state')``."""
    import torch

    s, x, A, D = state.double(), x.double(), A.double(), D.double()
    d = _softplus(dt_.double() + dt_bias.double())
    rep = x.shape[1] // B.shape[1]
    Bx, Cx = (t.double().repeat_interleave(rep, 1) for t in (B, C))  # [b, dim or H, N]
    if s.dim() == 3:
        new = torch.exp(d[..., None] * A) * s + (d * x)[..., None] * Bx
        return (new * Cx).sum(-1) + D * x, new
    dA = torch.exp(d * A)[..., None, None]  # [b, H, 1, 1]
    new = dA * s + (d[..., None] * x)[..., None] * Bx[:, :, None, :]
    return (new * Cx[:, :, None, :]).sum(-1) + D[:, None] * x, new


def ref_ssd(x: Any, dt_: Any, A: Any, B: Any, C: Any, D: Any, z: Any, dt_bias: Any) -> Any:
    """float64 sequential recurrence (not the chunked algorithm) per head: ``Δ = softplus(dt +
    dt_bias)``, ``h_t = exp(Δ_t A_h) h_{t-1} + Δ_t x_t B_tᵀ`` (P x N), ``y_t = h_t C_t + D x_t``,
    ``· silu(z)``; x ``[b, L, H, P]``, B, C ``[b, L, G, N]``."""
    import torch

    x, z = x.double(), z.double()
    b, L, H, P = x.shape
    rep = H // B.shape[2]
    Bx, Cx = (t.double().repeat_interleave(rep, 2) for t in (B, C))  # [b, L, H, N]
    d = _softplus(dt_.double() + dt_bias.double())
    h = torch.zeros(b, H, P, B.shape[3], dtype=torch.float64, device=x.device)
    ys = []
    for t in range(L):
        dA = torch.exp(d[:, t] * A.double())[..., None, None]
        h = dA * h + (d[:, t, :, None] * x[:, t])[..., None] * Bx[:, t, :, None, :]
        ys.append((h * Cx[:, t, :, None, :]).sum(-1) + D.double()[:, None] * x[:, t])
    y = torch.stack(ys, 1)
    return y * z * torch.sigmoid(z)


def ref_conv1d(x: Any, weight: Any, bias: Any, state: Any = None) -> Any:
    """float64 ``silu(bias[d] + Σ_k weight[d, k] x[d, t - (W-1) + k])``, ``x [b, dim, L]``, the
    ``W-1`` positions before 0 from ``state`` (zeros without it)."""
    import torch

    w = weight.shape[1]
    x = x.double()
    pre = state[..., -(w - 1) :].double() if state is not None else x.new_zeros(*x.shape[:2], w - 1)
    full = torch.cat([pre, x], -1)
    out = bias.double()[:, None] + sum(
        weight.double()[:, k, None] * full[..., k : k + x.shape[-1]] for k in range(w)
    )
    return out * torch.sigmoid(out)


# -------------------------------------------------------------------------------------- measuring
def _measure(
    fns: dict[str, Callable[[bool], tuple]],
    refs: tuple,
    view: Callable[[tuple], tuple],
    args: argparse.Namespace,
    cuda: bool,
    nbytes: int,
    peak: float | None,
) -> dict[str, Any]:
    """Each implementation: its first call (``fn(True)``, outputs to check) compared with
    ``refs`` through ``view`` (the reference's slice), then ``fn(False)`` timed; GB/s and the
    roofline fraction from ``nbytes``. A failure is the implementation's error, not fatal."""
    out: dict[str, Any] = {}
    for name, fn in fns.items():
        try:
            err = max(max_rel_err(o, r) for o, r in zip(view(fn(True)), refs, strict=True))
            ms = time_ms(lambda fn=fn: fn(False), args.warmup, args.iters, cuda)
            res = {"ms": ms, "max_rel_err": err, "gbps": nbytes / ms / 1e6}
            if peak:
                res["roofline"] = (nbytes / (peak * 1e9) * 1e3) / ms
            out[name] = res
        except Exception as ex:  # noqa: BLE001 - a failing implementation is reported, not fatal
            out[name] = {"error": f"{type(ex).__name__}: {ex}"[:300]}
    return out


def _import(name: str, attr: str, unavailable: dict[str, str], key: str) -> Any:
    """``name.attr``, or None with the reason recorded under ``unavailable[key]``."""
    try:
        return getattr(__import__(name, fromlist=[attr]), attr)
    except Exception as ex:  # noqa: BLE001 - not installed / not importable / renamed
        unavailable.setdefault(key, f"{name}.{attr}: {type(ex).__name__}: {ex}"[:200])
        return None


def load_peers(cuda: bool, unavailable: dict[str, str]) -> dict[str, Any]:
    """The peer kernels by ``<kind>/<peer>``: mamba_ssm's (and the ``causal_conv1d`` package's)
    and vLLM's, each when importable on a CUDA machine."""
    vm = "vllm.model_executor.layers.mamba.ops"
    table = {
        "selective_scan/mamba_ssm": ("mamba_ssm.ops.selective_scan_interface", "selective_scan_fn"),
        "selective_scan/vllm": (f"{vm}.mamba_ssm", "selective_scan_fn"),
        "state_update/mamba_ssm": ("mamba_ssm.ops.triton.selective_state_update", "selective_state_update"),
        "state_update/vllm": (f"{vm}.mamba_ssm", "selective_state_update"),
        "ssd_scan/mamba_ssm": ("mamba_ssm.ops.triton.ssd_combined", "mamba_chunk_scan_combined"),
        "ssd_scan/vllm": (f"{vm}.ssd_combined", "mamba_chunk_scan_combined"),
        "causal_conv1d/mamba_ssm": ("causal_conv1d", "causal_conv1d_fn"),
        "causal_conv1d/vllm": (f"{vm}.causal_conv1d", "causal_conv1d_fn"),
        "conv1d_update/mamba_ssm": ("causal_conv1d", "causal_conv1d_update"),
        "conv1d_update/vllm": (f"{vm}.causal_conv1d", "causal_conv1d_update"),
    }
    if not cuda:
        for key in ("mamba_ssm", "causal_conv1d", "vllm"):
            unavailable.setdefault(key, "needs a CUDA GPU")
        return {}
    peers = {}  # pragma: no cover - GPU only
    for key, (mod, attr) in table.items():  # pragma: no cover - GPU only
        fn = _import(mod, attr, unavailable, key)
        if fn is not None:
            peers[key] = fn
    return peers  # pragma: no cover - GPU only


def _kw(fn: Any, **kw: Any) -> dict[str, Any]:
    """``kw`` restricted to the parameters ``fn`` takes (peer signatures differ by version)."""
    try:
        params = inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return kw
    return {k: v for k, v in kw.items() if k in params}


def _work(args: argparse.Namespace, nbytes: int) -> bool:
    return args.dry_run or nbytes <= MAX_BYTES


def _rand(g: Any, *shape: int, dtype: Any, device: str, kind: str = "n") -> Any:
    """Random inputs drawn on ``device`` from ``g`` (a generator of that device): ``n`` normal,
    ``r`` uniform [0, 1) (``D``, biases), ``a`` uniform (-1, 0] (decay rates ``A``), ``u``
    uniform [-1, -0.5) (``delta`` / ``dt`` before the softplus: with a bias in [0, 1),
    ``Δ = softplus(t + bias)`` lies in about (0.31, 0.97))."""
    import torch

    if kind == "n":
        t = torch.randn(*shape, generator=g, device=device)
    else:
        t = torch.rand(*shape, generator=g, device=device)
    if kind == "a":
        t = -t
    elif kind == "u":
        t = t * 0.5 - 1.0
    return t.to(dtype)


def _row(
    kind: str,
    fns: dict,
    refs: tuple,
    view: Callable,
    args: argparse.Namespace,
    cuda: bool,
    nbytes: int,
    peak: float | None,
    **shape: Any,
) -> dict:
    row = {"kind": kind, **shape, "bytes": nbytes}
    row.update(_measure(fns, refs, view, args, cuda, nbytes, peak))
    print(json.dumps(row), flush=True)
    return row


# ----------------------------------------------------------------------------------- Mamba-1 scan
def scan_row(
    b: int,
    dim: int,
    L: int,
    n: int,
    grp: int,
    dtype: Any,
    device: str,
    peers: dict,
    args: argparse.Namespace,
    peak: float | None,
) -> dict:
    """One selective-scan problem (``B``, ``C`` ``[b, N, L]`` for one group, else
    ``[b, G, N, L]``), its reference on batch row 0 and the first ``REF_DIM`` channels of group 0
    for the full-size shapes (channels and batch rows do not interact; the whole problem in the
    dry run), every implementation measured."""
    import hexlayout.ops as ho
    import torch

    cuda = device == "cuda"
    part = not args.dry_run  # the full-size shapes: the reference on a slice
    g = torch.Generator(device).manual_seed(0)
    u, z = (_rand(g, b, dim, L, dtype=dtype, device=device) for _ in range(2))
    delta = _rand(g, b, dim, L, dtype=dtype, device=device, kind="u")
    bc = (b, n, L) if grp == 1 else (b, grp, n, L)
    B, C = (_rand(g, *bc, dtype=dtype, device=device) for _ in range(2))
    A = _rand(g, dim, n, dtype=torch.float32, device=device, kind="a")
    D, bias = (_rand(g, dim, dtype=torch.float32, device=device, kind="r") for _ in range(2))
    k = min(dim // grp, REF_DIM) if part else dim  # a slice within group 0
    bs, cs = slice(0, 1 if part else b), slice(0, k)
    Bs, Cs = (B[bs, :1], C[bs, :1]) if grp > 1 and k < dim else (B[bs], C[bs])
    refs = (ref_selective_scan(u[bs, cs], delta[bs, cs], A[cs], Bs, Cs, D[cs], z[bs, cs], bias[cs]),)
    kw = {"D": D, "z": z, "delta_bias": bias, "delta_softplus": True}
    fns: dict[str, Callable[[bool], tuple]] = {
        "hexlayout": lambda c: (ho.selective_scan(u, delta, A, B, C, **kw),)
    }
    if "selective_scan/mamba_ssm" in peers:  # pragma: no cover - GPU only
        fn = peers["selective_scan/mamba_ssm"]
        fns["mamba_ssm"] = lambda c: (fn(u, delta, A, B, C, **kw),)
    if "selective_scan/vllm" in peers:  # pragma: no cover - GPU only
        fv = peers["selective_scan/vllm"]
        st = torch.zeros(b, dim, n, dtype=torch.float32, device=device)
        B4, C4 = (t if grp > 1 else t[:, None] for t in (B, C))
        vkw = _kw(fv, **{**kw, "z": z.clone()})  # vLLM's kernel writes its output over z
        fns["vllm"] = lambda c: (fv(u, st, delta, A, B4, C4, **vkw),)
    es = torch.finfo(dtype).bits // 8
    nbytes = (4 * b * dim * L + 2 * b * grp * n * L) * es + (dim * n + 2 * dim) * 4
    return _row(
        "selective_scan",
        fns,
        refs,
        lambda o: (o[0][bs, cs],),
        args,
        cuda,
        nbytes,
        peak,
        batch=b,
        seqlen=L,
        dim=dim,
        N=n,
        G=grp,
    )


def run_scan(
    args: argparse.Namespace, dtype: Any, device: str, peak: float | None, peers: dict
) -> list[dict]:
    import torch

    batches, seqs, dims = DRY["scan"] if args.dry_run else (QUICK if args.quick else FULL)["scan"]
    n, grp = (DRY_M1["N"], DRY_M1["G"]) if args.dry_run else (M1["N"], M1["G"])
    es = torch.finfo(dtype).bits // 8
    rows = []
    for dim in dims:
        for L in seqs:
            for b in batches:
                if _work(args, 4 * b * dim * L * es):
                    rows.append(scan_row(b, dim, L, n, grp, dtype, device, peers, args, peak))
    return rows


# ------------------------------------------------------------------------------- decode: the state
def _state_peer(
    fn: Any, cache: Any, idx: Any, x: Any, dt_: Any, A: Any, B: Any, C: Any, D: Any, bias: Any
) -> Callable[[bool], tuple]:  # pragma: no cover - GPU only
    """A peer's ``selective_state_update`` on its own copy of the cache: with
    ``state_batch_indices`` when it takes them, else on the batch's rows gathered once; a
    preallocated ``out`` when it asks for one (vLLM's newer signature)."""
    import torch

    params = inspect.signature(fn).parameters
    own = cache.clone() if "state_batch_indices" in params else cache[idx.long()].clone()
    kw = {"D": D, "dt_bias": bias, "dt_softplus": True}
    if "state_batch_indices" in params:
        kw["state_batch_indices"] = idx
    out = torch.empty_like(x) if "out" in params else None
    if out is not None:
        kw["out"] = out

    def call(check: bool) -> tuple:
        y = fn(own, x, dt_, A, B, C, **kw)
        y = out if out is not None else y
        if not check:
            return (y,)
        return y, (own[idx.long()] if "state_batch_indices" in params else own)

    return call


def state_row(
    form: int, b: int, dtype: Any, device: str, peers: dict, args: argparse.Namespace, peak: float | None
) -> dict:
    """One decode step, ``form`` 1 (Mamba-1: state ``[2b, dim, N]``) or 2 (Mamba-2: ``[2b, H, P,
    N]``); the batch's rows are a shuffled half of the cache (``state_batch_indices``). Checked:
    ``y`` and the updated rows (batch row 0 and the first channels / heads on the GPU). Peers get
    Mamba-2's per-head ``dt`` / ``A`` / ``D`` / ``dt_bias`` broadcast over ``P`` (and ``A`` over
    ``N``), as vLLM's layer passes them."""
    import hexlayout.ops as ho
    import torch

    cuda = device == "cuda"
    part = not args.dry_run  # the full-size shapes: the reference on a slice
    g = torch.Generator(device).manual_seed(form)
    m2 = DRY_M2 if args.dry_run else M2
    if form == 1:
        m1 = DRY_M1 if args.dry_run else M1
        dim, n, grp = m1["decode_dim"], m1["N"], m1["G"]
        inner, hd, head = (dim,), dim, ()
    else:
        dim, n, grp = m2["H"], m2["N"], m2["G"]
        inner, hd, head = (m2["H"], m2["P"]), m2["H"], (m2["P"],)
    cache = _rand(g, 2 * b, *inner, n, dtype=torch.float32, device=device)
    idx = torch.randperm(2 * b, generator=g, device=device)[:b].to(torch.int32)
    x = _rand(g, b, *inner, dtype=dtype, device=device)
    dt_ = _rand(g, b, hd, dtype=dtype, device=device, kind="u")
    A = _rand(g, *((dim, n) if form == 1 else (hd,)), dtype=torch.float32, device=device, kind="a")
    B, C = (_rand(g, b, grp, n, dtype=dtype, device=device) for _ in range(2))
    D, bias = (_rand(g, hd, dtype=torch.float32, device=device, kind="r") for _ in range(2))
    k = min(hd, (REF_DIM if form == 1 else hd // grp)) if part else hd
    bs, cs = slice(0, 1 if part else b), slice(0, k)
    gs = slice(0, grp if k == hd else 1)
    old = cache[idx.long()]
    refs = ref_state_update(old[bs, cs], x[bs, cs], dt_[bs, cs], A[cs], B[bs, gs], C[bs, gs], D[cs], bias[cs])
    mine = cache.clone()

    def hexlayout_fn(check: bool) -> tuple:
        y = ho.selective_state_update(
            mine, x, dt_, A, B, C, D=D, dt_bias=bias, dt_softplus=True, state_batch_indices=idx
        )
        return (y, mine[idx.long()]) if check else (y,)

    fns: dict[str, Callable[[bool], tuple]] = {"hexlayout": hexlayout_fn}
    pa = (A, dt_, D, bias)
    if form == 2:  # pragma: no branch - the peers' tied-head form: views with zero strides
        p = m2["P"]
        pa = (
            A[:, None, None].expand(-1, p, n),
            dt_[..., None].expand(-1, -1, p),
            D[:, None].expand(-1, p),
            bias[:, None].expand(-1, p),
        )
    for peer in ("mamba_ssm", "vllm"):  # pragma: no cover - GPU only
        if f"state_update/{peer}" in peers:
            fns[peer] = _state_peer(
                peers[f"state_update/{peer}"], cache, idx, x, pa[1], pa[0], B, C, pa[2], pa[3]
            )
    es = torch.finfo(dtype).bits // 8
    ne = b * dim * (head[0] if head else 1)  # x / y elements
    nbytes = (
        2 * b * cache[0].numel() * 4 + (2 * ne + b * hd + 2 * b * grp * n) * es + (A.numel() + 2 * hd) * 4
    )
    return _row(
        "state_update",
        fns,
        refs,
        lambda o: (o[0][bs, cs], o[1][bs, cs]),
        args,
        cuda,
        nbytes,
        peak,
        form=f"mamba{form}",
        batch=b,
        dim=dim,
        P=head[0] if head else None,
        N=n,
        G=grp,
    )


def run_state(
    args: argparse.Namespace, dtype: Any, device: str, peak: float | None, peers: dict
) -> list[dict]:
    batches = DRY["decode"] if args.dry_run else (QUICK if args.quick else FULL)["decode"]
    return [state_row(form, b, dtype, device, peers, args, peak) for form in (1, 2) for b in batches]


# ----------------------------------------------------------------------------------- Mamba-2 SSD
def ssd_row(
    b: int, L: int, dtype: Any, device: str, peers: dict, args: argparse.Namespace, peak: float | None
) -> dict:
    """One Mamba-2 prefill (``x [b, L, H, P]``, ``B``, ``C`` ``[b, L, G, N]``, ``D``, ``z``,
    ``dt_bias``, softplus); the reference on batch row 0 and group 0's heads on the GPU."""
    import hexlayout.ops as ho
    import torch

    cuda = device == "cuda"
    part = not args.dry_run  # the full-size shapes: the reference on a slice
    m = DRY_M2 if args.dry_run else M2
    h, p, grp, n = m["H"], m["P"], m["G"], m["N"]
    g = torch.Generator(device).manual_seed(1)
    x, z = (_rand(g, b, L, h, p, dtype=dtype, device=device) for _ in range(2))
    dt_ = _rand(g, b, L, h, dtype=dtype, device=device, kind="u")
    A = _rand(g, h, dtype=torch.float32, device=device, kind="a")
    B, C = (_rand(g, b, L, grp, n, dtype=dtype, device=device) for _ in range(2))
    D, bias = (_rand(g, h, dtype=torch.float32, device=device, kind="r") for _ in range(2))
    bs, hs, gs = (
        (slice(0, 1), slice(0, h // grp), slice(0, 1)) if part else (slice(0, b), slice(0, h), slice(0, grp))
    )
    refs = (
        ref_ssd(
            x[bs, :, hs], dt_[bs, :, hs], A[hs], B[bs, :, gs], C[bs, :, gs], D[hs], z[bs, :, hs], bias[hs]
        ),
    )
    kw = {"D": D, "z": z, "dt_bias": bias, "dt_softplus": True}
    fns: dict[str, Callable[[bool], tuple]] = {
        "hexlayout": lambda c: (ho.ssd_scan(x, dt_, A, B, C, chunk_size=m["chunk"], **kw),)
    }
    for peer in ("mamba_ssm", "vllm"):  # pragma: no cover - GPU only
        fn = peers.get(f"ssd_scan/{peer}")
        if fn is not None:
            out = torch.empty_like(x) if "out" in inspect.signature(fn).parameters else None
            pkw = _kw(fn, **kw, out=out) if out is not None else kw

            def call(c: bool, fn: Any = fn, out: Any = out, pkw: dict = pkw) -> tuple:
                y = fn(x, dt_, A, B, C, m["chunk"], **pkw)
                return (out if out is not None else y,)

            fns[peer] = call
    es = torch.finfo(dtype).bits // 8
    nbytes = (3 * b * L * h * p + b * L * h + 2 * b * L * grp * n) * es + 3 * h * 4
    return _row(
        "ssd_scan",
        fns,
        refs,
        lambda o: (o[0][bs, :, hs],),
        args,
        cuda,
        nbytes,
        peak,
        batch=b,
        seqlen=L,
        H=h,
        P=p,
        G=grp,
        N=n,
        chunk=m["chunk"],
    )


def run_ssd(args: argparse.Namespace, dtype: Any, device: str, peak: float | None, peers: dict) -> list[dict]:
    import torch

    batches, seqs = DRY["ssd"] if args.dry_run else (QUICK if args.quick else FULL)["ssd"]
    m = DRY_M2 if args.dry_run else M2
    es = torch.finfo(dtype).bits // 8
    return [
        ssd_row(b, L, dtype, device, peers, args, peak)
        for L in seqs
        for b in batches
        if _work(args, 3 * b * L * m["H"] * m["P"] * es)
    ]


# ---------------------------------------------------------------------------------- convolution
def conv_row(
    b: int, L: int, dtype: Any, device: str, peers: dict, args: argparse.Namespace, peak: float | None
) -> dict:
    """The Mamba-2 layer's depthwise convolution (``dim = H P + 2 G N``, SiLU) on a prefill
    ``x [b, dim, L]``; the reference on batch row 0 and the first ``REF_DIM`` channels on the
    GPU."""
    import hexlayout.ops as ho
    import torch

    cuda = device == "cuda"
    part = not args.dry_run  # the full-size shapes: the reference on a slice
    m = DRY_M2 if args.dry_run else M2
    dim, w = m["H"] * m["P"] + 2 * m["G"] * m["N"], m["width"]
    g = torch.Generator(device).manual_seed(2)
    x = _rand(g, b, dim, L, dtype=dtype, device=device)
    weight, bias = _rand(g, dim, w, dtype=dtype, device=device), _rand(g, dim, dtype=dtype, device=device)
    bs, cs = (slice(0, 1), slice(0, REF_DIM)) if part else (slice(0, b), slice(0, dim))
    es = torch.finfo(dtype).bits // 8
    fns: dict[str, Callable[[bool], tuple]] = {
        "hexlayout": lambda c: (ho.causal_conv1d(x, weight, bias, activation="silu"),)
    }
    fn = peers.get("causal_conv1d/mamba_ssm")
    if fn is not None:  # pragma: no cover - GPU only
        fns["mamba_ssm"] = lambda c: (fn(x, weight, bias, activation="silu"),)
    fv = peers.get("causal_conv1d/vllm")
    if fv is not None:  # pragma: no cover - GPU only
        fns["vllm"] = _vllm_conv(fv, x, weight, bias)
    refs = (ref_conv1d(x[bs, cs], weight[cs], bias[cs]),)
    return _row(
        "causal_conv1d",
        fns,
        refs,
        lambda o: (o[0][bs, cs],),
        args,
        cuda,
        2 * b * dim * L * es + (w + 1) * dim * es,
        peak,
        batch=b,
        seqlen=L,
        dim=dim,
        width=w,
    )


def _vllm_conv(fv: Any, x: Any, weight: Any, bias: Any) -> Callable[[bool], tuple]:  # pragma: no cover
    """vLLM's varlen ``causal_conv1d_fn`` on ``x`` packed to ``[dim, b L]`` (a transposed view
    of token-major ``[b L, dim]`` storage, as its Mamba-2 layer passes it; no initial states)."""
    import torch

    b, dim, L = x.shape
    xp = x.permute(0, 2, 1).reshape(b * L, dim).t()  # [dim, T] over token-major storage, as vLLM's layer
    qsl = torch.arange(0, (b + 1) * L, L, dtype=torch.int32, device=x.device)
    states = torch.zeros(b, dim, weight.shape[1] - 1, dtype=x.dtype, device=x.device)
    kw = _kw(
        fv,
        conv_states=states,
        query_start_loc=qsl,
        activation="silu",
        cache_indices=torch.arange(b, dtype=torch.int32, device=x.device),
        has_initial_state=torch.zeros(b, dtype=torch.bool, device=x.device),
    )

    def call(c: bool) -> tuple:
        out = fv(xp, weight, bias, **kw)
        return (out.reshape(dim, b, L).permute(1, 0, 2),)

    return call


def conv_update_row(
    b: int, dtype: Any, device: str, peers: dict, args: argparse.Namespace, peak: float | None
) -> dict:
    """One decode position ``x1 [b, dim]`` of the same convolution through
    ``causal_conv1d_update`` into the rows ``conv_state_indices`` (a shuffled half of a
    ``[2b, dim, W-1]`` cache); checked: the output and the shifted state rows."""
    import hexlayout.ops as ho
    import torch

    cuda = device == "cuda"
    part = not args.dry_run  # the full-size shapes: the reference on a slice
    m = DRY_M2 if args.dry_run else M2
    dim, w = m["H"] * m["P"] + 2 * m["G"] * m["N"], m["width"]
    g = torch.Generator(device).manual_seed(3)
    x1, bias = _rand(g, b, dim, dtype=dtype, device=device), _rand(g, dim, dtype=dtype, device=device)
    weight = _rand(g, dim, w, dtype=dtype, device=device)
    cache = _rand(g, 2 * b, dim, w - 1, dtype=dtype, device=device)
    idx = torch.randperm(2 * b, generator=g, device=device)[:b].to(torch.int32)
    bs, cs = (slice(0, 1), slice(0, REF_DIM)) if part else (slice(0, b), slice(0, dim))
    old = cache[idx.long()]
    full = torch.cat([old, x1[..., None]], -1)[bs, cs]
    refs = (
        ref_conv1d(x1[bs, cs, None], weight[cs], bias[cs], state=old[bs, cs])[..., 0],
        full[..., 1:].double(),
    )
    fns: dict[str, Callable[[bool], tuple]] = {}
    for name, fn in (
        ("hexlayout", ho.causal_conv1d_update),
        ("mamba_ssm", peers.get("conv1d_update/mamba_ssm")),
        ("vllm", peers.get("conv1d_update/vllm")),
    ):
        if fn is None:
            continue
        own = cache.clone()

        def call(c: bool, fn: Any = fn, own: Any = own) -> tuple:
            y = fn(x1, own, weight, bias, activation="silu", conv_state_indices=idx)
            return (y, own[idx.long()]) if c else (y,)

        fns[name] = call
    es = x1.element_size()
    nbytes = (2 * b * dim + 2 * b * dim * (w - 1) + (w + 1) * dim) * es + b * 4
    return _row(
        "conv1d_update",
        fns,
        refs,
        lambda o: (o[0][bs, cs], o[1][bs, cs]),
        args,
        cuda,
        nbytes,
        peak,
        batch=b,
        dim=dim,
        width=w,
    )


def run_conv(
    args: argparse.Namespace, dtype: Any, device: str, peak: float | None, peers: dict
) -> list[dict]:
    import torch

    batches, seqs = DRY["ssd"] if args.dry_run else (QUICK if args.quick else FULL)["ssd"]
    m = DRY_M2 if args.dry_run else M2
    dim = m["H"] * m["P"] + 2 * m["G"] * m["N"]
    es = torch.finfo(dtype).bits // 8
    return [
        conv_row(b, L, dtype, device, peers, args, peak)
        for L in seqs
        for b in batches
        if _work(args, 2 * b * dim * L * es)
    ]


def run_conv_update(
    args: argparse.Namespace, dtype: Any, device: str, peak: float | None, peers: dict
) -> list[dict]:
    batches = DRY["decode"] if args.dry_run else (QUICK if args.quick else FULL)["decode"]
    return [conv_update_row(b, dtype, device, peers, args, peak) for b in batches]


# ------------------------------------------------------------------------------------------ main
RUNNERS: dict[str, Callable[..., list[dict]]] = {
    "selective_scan": run_scan,
    "state_update": run_state,
    "ssd_scan": run_ssd,
    "causal_conv1d": run_conv,
    "conv1d_update": run_conv_update,
}
SHAPE_COLS = {
    "selective_scan": ("batch", "seqlen", "dim", "N", "G"),
    "state_update": ("form", "batch", "dim", "P", "N", "G"),
    "ssd_scan": ("batch", "seqlen", "H", "P", "G", "N", "chunk"),
    "causal_conv1d": ("batch", "seqlen", "dim", "width"),
    "conv1d_update": ("batch", "dim", "width"),
}
IMPLS = ("hexlayout", "mamba_ssm", "vllm")
TARGETS = {"selective_scan": 0.8, "state_update": 0.8}  # fraction of HBM bandwidth at batch >= 8 (H100)


def run(args: argparse.Namespace) -> dict:
    import hexlayout.ops  # noqa: F401 - registers torch.ops.hexlayout.*
    import torch

    import hexlayout

    cuda = not args.dry_run
    device = "cuda" if cuda else "cpu"
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16}[args.dtype]
    dev_name = torch.cuda.get_device_name() if cuda else f"CPU emulator ({platform.machine()})"
    peak = peak_gbps(dev_name, args.peak_gbps if cuda else (args.peak_gbps or 1.0))
    unavailable: dict[str, str] = {}
    peers = load_peers(cuda, unavailable)
    kinds = KINDS if args.what == "all" else WHAT.get(args.what, (args.what,))
    rows = [r for kind in KINDS if kind in kinds for r in RUNNERS[kind](args, dtype, device, peak, peers)]
    meta: dict[str, Any] = {
        "device": dev_name,
        "capability": list(torch.cuda.get_device_capability()) if cuda else None,
        "torch": torch.__version__,
        "hexlayout": getattr(hexlayout, "__version__", "-"),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "dtype": args.dtype,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "peak_gbps": peak,
        "dry_run": bool(args.dry_run),
        "unavailable": unavailable,
        "targets": {f"{k}_roofline_batch_ge_8": v for k, v in TARGETS.items()},
    }
    for mod in ("mamba_ssm", "causal_conv1d", "vllm", "triton"):
        try:
            meta[mod] = __import__(mod).__version__
        except Exception:  # noqa: BLE001 - not installed / not importable
            meta[mod] = None
    return {"meta": meta, "rows": rows}


def _f(r: dict, name: str, key: str, fmt: str = "{:.2f}") -> str:
    v = r.get(name, {}).get(key)
    return "-" if v is None else fmt.format(v)


def _table(kind: str, rows: list[dict]) -> list[str]:
    """One markdown table: the shape, MB moved, per implementation ms / GB/s / roofline /
    max relative error; the target's verdict for hexlayout at batch >= 8 where one is set."""
    impls = [n for n in IMPLS if any(n in r for r in rows)]
    cols = SHAPE_COLS[kind]
    head = [*cols, "MB"] + [f"{n} {k}" for n in impls for k in ("ms", "GB/s", "roofline", "err")]
    lines = [f"## {kind}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        cells = ["-" if r.get(c) is None else str(r[c]) for c in cols] + [f"{r['bytes'] / 1e6:.4g}"]
        for n in impls:
            cells += [
                _f(r, n, "ms", "{:.4g}"),
                _f(r, n, "gbps", "{:.4g}"),
                _f(r, n, "roofline"),
                _f(r, n, "max_rel_err", "{:.1e}"),
            ]
        lines.append("| " + " | ".join(cells) + " |")
    big = [
        r["hexlayout"]["roofline"] for r in rows if r["batch"] >= 8 and "roofline" in r.get("hexlayout", {})
    ]
    if kind in TARGETS and big:
        ok = "met" if min(big) >= TARGETS[kind] else "not met"
        lines += [
            "",
            f"hexlayout at batch >= 8: lowest roofline {min(big):.2f} (target {TARGETS[kind]:.2f}: {ok})",
        ]
    return lines + [""]


def write_results(res: dict, out: Path) -> list[Path]:
    """JSON, markdown (one table per op) and a PNG (fraction of the HBM roofline per op and
    implementation)."""
    meta, rows = res["meta"], res["rows"]
    out.mkdir(parents=True, exist_ok=True)
    dev = "".join(c if c.isalnum() or c in "-_." else "_" for c in meta["device"])
    stem = f"mamba_{dev}{'_dry' if meta['dry_run'] else ''}"
    paths = [out / f"{stem}.json", out / f"{stem}.md", out / f"{stem}.png"]
    paths[0].write_text(json.dumps(res, indent=1))
    lines = [
        f"# Mamba {meta['dtype']} on {meta['device']} ({meta['date']})"
        + (" (dry run: CPU emulator, wall-clock times mean nothing)" if meta["dry_run"] else ""),
        "",
        f"torch {meta['torch']}, CUDA {meta['cuda']}, mamba_ssm {meta.get('mamba_ssm') or '-'}, "
        f"causal_conv1d {meta.get('causal_conv1d') or '-'}, vLLM {meta.get('vllm') or '-'}, peak "
        f"{meta['peak_gbps']} GB/s. roofline = (bytes / peak bandwidth) / time. Targets (H100): "
        "selective scan and state update >= 80 % of HBM bandwidth at batch >= 8.",
        "",
    ]
    if meta["unavailable"]:
        lines += ["Not run: " + "; ".join(f"{k} ({v})" for k, v in meta["unavailable"].items()), ""]
    kinds = [k for k in KINDS if any(r["kind"] == k for r in rows)]
    for kind in kinds:
        lines += _table(kind, [r for r in rows if r["kind"] == kind])
    errs = [(r, n) for r in rows for n, v in r.items() if isinstance(v, dict) and "error" in v]
    if errs:
        lines += ["## Errors", ""] + [f"- {r['kind']} {n}: {r[n]['error']}" for r, n in errs] + [""]
    paths[1].write_text("\n".join(lines))
    _plot(meta, rows, kinds, paths[2])
    return paths


def _plot(meta: dict, rows: list[dict], kinds: list[str], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4 * max(1, len(kinds)), 4.5))
    for i, kind in enumerate(kinds):
        ax = fig.add_subplot(1, max(1, len(kinds)), i + 1)
        sel = [r for r in rows if r["kind"] == kind]
        labels = [
            "x".join(str(r.get(c)) for c in SHAPE_COLS[kind] if c in ("form", "batch", "seqlen", "dim"))
            for r in sel
        ]
        for name in IMPLS:
            pts = [(j, r[name].get("roofline", 0.0)) for j, r in enumerate(sel) if name in r]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=name)
        if kind in TARGETS:
            ax.axhline(TARGETS[kind], color="gray", linestyle="--", label="target (batch >= 8)")
        ax.set_xticks(range(len(sel)))
        ax.set_xticklabels(labels, rotation=90, fontsize=6)
        ax.set_ylabel("fraction of HBM bandwidth")
        ax.set_title(kind, fontsize=9)
        ax.legend(fontsize=6)
    fig.suptitle(f"Mamba {meta['dtype']} on {meta['device']}")
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--dtype", default="bf16", choices=("bf16", "f16"))
    ap.add_argument(
        "--what",
        default="all",
        choices=("all", "scan", "decode", *KINDS),
        help="scan: the prefill ops; decode: the decode-step ops; or one op",
    )
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--peak-gbps", type=float, default=None, help="HBM peak bandwidth for the roofline")
    ap.add_argument("--out", type=Path, default=RESULTS, help="results directory")
    ap.add_argument("--dry-run", action="store_true", help="tiny shapes on CPU through the emulator (no GPU)")
    args = ap.parse_args(argv)
    return run_benchmark("bench_mamba", args, run, write_results)


if __name__ == "__main__":
    sys.exit(main())
