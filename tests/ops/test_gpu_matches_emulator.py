"""On a GPU: every serving op's CUDA result equals the emulator's on the same inputs (the emulated
architecture set to the device's, so both run the same kernels), and a CUDA-graph capture of it
replays new inputs right. ``gpu``-marked (skipped without a GPU); ``benchmarks/gpu_session.sh``
runs them. ``test_cases_run_in_the_emulator`` checks the cases themselves on any machine.

A case is ``(op, args, outputs)``: ``torch.ops.hexlayout.<op>(*args)``, and the tensors it
writes (``outputs(result, args)``: its result, or the caches it fills).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import hexlayout.ops  # noqa: F401 - registers torch.ops.hexlayout.*
import pytest
import torch

Case = tuple[str, list[Any], Callable[[Any, list[Any]], list[torch.Tensor]]]


def _result(res: Any, args: list[Any]) -> list[torch.Tensor]:
    return [res] if isinstance(res, torch.Tensor) else [r for r in res if isinstance(r, torch.Tensor)]


def _routing(g: torch.Generator, t: int, e: int, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    weights, ids = torch.randn(t, e, generator=g).softmax(-1).topk(k)
    return weights, ids.int()


def _gemm(g: torch.Generator) -> Case:
    a, b = torch.randn(70, 96, generator=g).half(), torch.randn(40, 96, generator=g).half()
    return "gemm", [a, b, torch.randn(40, generator=g).half(), None, "gelu", 0.5, "nk"], _result


def _paged(g: torch.Generator) -> Case:
    h, kvh, d, bs, nb = 4, 2, 64, 16, 6
    q = torch.randn(9, h, d, generator=g).half()
    kc, vc = torch.randn(nb, bs, kvh, d, generator=g).half(), torch.randn(nb, bs, kvh, d, generator=g).half()
    cu_q = torch.tensor([0, 1, 9], dtype=torch.int32)                    # a decode and a prefill of 8
    seqused_k = torch.tensor([37, 20], dtype=torch.int32)
    table = torch.tensor([[5, 0, 3], [1, 4, 2]], dtype=torch.int32)
    return "paged_attention", [q, kc, vc, cu_q, seqused_k, table, 8, 37], _result


def _varlen(g: torch.Generator) -> Case:
    h, kvh, d = 4, 1, 64
    q = torch.randn(21, h, d, generator=g).half()
    k, v = torch.randn(33, kvh, d, generator=g).half(), torch.randn(33, kvh, d, generator=g).half()
    cu_q, cu_k = torch.tensor([0, 5, 21], dtype=torch.int32), torch.tensor([0, 12, 33], dtype=torch.int32)
    return "attention_varlen", [q, k, v, cu_q, cu_k, 16, 21], _result


def _cache(g: torch.Generator) -> Case:
    key, value = torch.randn(5, 2, 64, generator=g).half(), torch.randn(5, 2, 64, generator=g).half()
    kc, vc = torch.randn(3, 16, 2, 64, generator=g).half(), torch.randn(3, 16, 2, 64, generator=g).half()
    slots = torch.tensor([0, 17, -1, 47, 5], dtype=torch.int64)
    return "reshape_and_cache", [key, value, kc, vc, slots], lambda res, args: [args[2], args[3]]


def _moe(g: torch.Generator) -> Case:
    t, h, inter, e, k = 7, 128, 64, 4, 2
    x = torch.randn(t, h, generator=g).bfloat16()
    w13 = (torch.randn(e, 2 * inter, h, generator=g) / 8).bfloat16()
    w2 = (torch.randn(e, h, inter, generator=g) / 8).bfloat16()
    tw, ids = _routing(g, t, e, k)
    return "fused_moe", [x, w13, w2, tw, ids], _result


def _moe_wna16(g: torch.Generator) -> Case:
    from hexlayout.ops import prepare_wna16

    t, h, inter, e, k, group = 7, 128, 64, 4, 2, 32

    def prepared(kk: int, nn: int) -> Any:
        q = torch.randint(0, 256, (e, kk, nn), generator=g).to(torch.int64)
        w = torch.zeros(e, kk // 4, nn, dtype=torch.int64)
        for i in range(4):
            w |= q[:, i::4, :] << (8 * i)
        packed = torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)
        scales = (torch.rand(e, kk // group, nn, generator=g) / 256).half()
        return prepare_wna16(packed, scales, quant_format="gptq", bits=8, group_size=group)

    w13, w2 = prepared(h, 2 * inter), prepared(inter, h)
    x = torch.randn(t, h, generator=g).half()
    tw, ids = _routing(g, t, e, k)
    args = [x, w13.qweight, w13.scales, w13.zeros, w2.qweight, w2.scales, w2.zeros, tw, ids,
            w13.quant_format, w13.bits, w13.group_size, w2.group_size]
    return "fused_moe_wna16", args, _result


def _moe_fp8(g: torch.Generator) -> Case:
    from hexlayout.ops import prepare_fp8

    t, h, inter, e, k = 7, 128, 64, 4, 2
    w13 = prepare_fp8((torch.randn(e, 2 * inter, h, generator=g) * 0.5).to(torch.float8_e4m3fn),
                      torch.rand(e, generator=g) * 0.05 + 0.01)
    w2 = prepare_fp8((torch.randn(e, h, inter, generator=g) * 0.5).to(torch.float8_e4m3fn),
                     torch.rand(e, generator=g) * 0.05 + 0.01)
    x = torch.randn(t, h, generator=g).bfloat16()
    tw, ids = _routing(g, t, e, k)
    return "fused_moe_fp8", [x, w13.w, w13.scale, w2.w, w2.scale, tw, ids], _result


CASES: dict[str, Callable[[torch.Generator], Case]] = {
    "gemm": _gemm, "paged_attention": _paged, "attention_varlen": _varlen, "reshape_and_cache": _cache,
    "fused_moe": _moe, "fused_moe_wna16": _moe_wna16, "fused_moe_fp8": _moe_fp8,
}
#: ops whose kernels need sm_89 (FP8 mma)
MIN_ARCH = {"fused_moe_fp8": "sm_89"}


def _build(name: str, seed: int = 0) -> Case:
    return CASES[name](torch.Generator().manual_seed(seed))


def _to(args: list[Any], device: str) -> list[Any]:
    return [a.clone().to(device) if isinstance(a, torch.Tensor) else a for a in args]


def _run(name: str, op: str, args: list[Any], outputs: Callable) -> list[torch.Tensor]:
    return [t.float().cpu() for t in outputs(getattr(torch.ops.hexlayout, op)(*args), args)]


def _assert_close(got: list[torch.Tensor], want: list[torch.Tensor], what: str) -> None:
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape, (what, i, a.shape, b.shape)
        both_nan = a.isnan() & b.isnan()
        err = ((a - b).abs().masked_fill(both_nan, 0)).max().item() if a.numel() else 0.0
        scale = max(b.masked_fill(b.isnan(), 0).abs().max().item(), 1.0) if b.numel() else 1.0
        assert err <= 1e-2 * scale, f"{what}: output {i} differs by {err:.3g} (scale {scale:.3g})"


@pytest.mark.parametrize("name", ["gemm", "reshape_and_cache", "paged_attention"])
def test_cases_run_in_the_emulator(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The cases themselves: they run on CPU in the emulator, twice to the same result (a case
    the GPU tests could not even call would be found only on a GPU)."""
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    op, args, outputs = _build(name)
    first = _run(name, op, _to(args, "cpu"), outputs)
    _assert_close(_run(name, op, _to(args, "cpu"), outputs), first, name)


def _device_arch() -> str:
    from hexlayout.ops.host.device import kernel_arch

    return kernel_arch(torch.device("cuda"))


def _skip_below(name: str, arch: str) -> None:
    need = MIN_ARCH.get(name)
    if need is not None and int(arch[3:5]) < int(need[3:5]):
        pytest.skip(f"{name} needs {need}; this GPU is {arch}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_gpu_matches_the_emulator(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    arch = _device_arch()
    _skip_below(name, arch)
    op, args, outputs = _build(name)
    got = _run(name, op, _to(args, "cuda"), outputs)
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    want = _run(name, op, _to(args, "cpu"), outputs)
    _assert_close(got, want, f"{name} on {arch}: GPU vs emulator")


@pytest.mark.gpu
@pytest.mark.parametrize("name", sorted(CASES))
def test_cuda_graph_replays_new_inputs(name: str) -> None:
    """Capture the op once, refill its inputs in place with another case's data, replay: the
    outputs equal an eager call on that data."""
    arch = _device_arch()
    _skip_below(name, arch)
    op, args, outputs = _build(name, seed=0)
    _, fresh, _ = _build(name, seed=1)
    static = _to(args, "cuda")
    fn = getattr(torch.ops.hexlayout, op)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn(*_to(args, "cuda"))                       # warm-up: builds and loads outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        res = fn(*static)
    for dst, src in zip(static, fresh):
        if isinstance(dst, torch.Tensor):
            dst.copy_(src)
    graph.replay()
    torch.cuda.synchronize()
    got = [t.float().cpu() for t in outputs(res, static)]
    want = _run(name, op, _to(fresh, "cuda"), outputs)
    _assert_close(got, want, f"{name}: graph replay vs eager")
