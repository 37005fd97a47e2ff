"""The host path of a cached CUDA ``gemm`` call, run on CPU tensors with the GPU parts stubbed
as in ``benchmarks/bench_host.py`` (``is_cuda``, device capability, stream, driver launch,
the first bind's device check): a cached call launches once per call, asks the device for
its capability once per process, reads no file, and follows the autotuner when its
persisted choice changes. Timing is the benchmark's job, not a test's."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import hexlayout.ops  # noqa: F401 - registers torch.ops.hexlayout.gemm
import pytest
import torch
from hexlayout.ops.gemm import config as gc_mod
from hexlayout.ops.gemm import op as gemm_mod

import hexlayout.runtime.cache as rc

BENCH = Path(__file__).resolve().parents[2] / "benchmarks" / "bench_host.py"


def _bench_module():
    spec = importlib.util.spec_from_file_location("bench_host", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def stubbed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setenv("HEXLAYOUT_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    for d in (gemm_mod._FAST, gemm_mod._HOT, gemm_mod._ARCHS, gemm_mod._LAUNCHERS, gc_mod._TABLES):
        d.clear()
    rc._WARNED.clear()
    drv = _bench_module().stub_gpu(torch, monkeypatch.setattr)
    capability_calls = []
    cap = torch.cuda.get_device_capability
    monkeypatch.setattr(torch.cuda, "get_device_capability",
                        lambda d=None: capability_calls.append(d) or cap(d))
    yield drv, capability_calls
    for d in (gemm_mod._FAST, gemm_mod._HOT, gemm_mod._ARCHS, gemm_mod._LAUNCHERS, gc_mod._TABLES):
        d.clear()


@pytest.mark.nvrtc
def test_cached_calls_launch_without_lookups_or_file_reads(stubbed, monkeypatch: pytest.MonkeyPatch) -> None:
    drv, capability_calls = stubbed
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(64, 64, generator=g).half(), torch.randn(128, 64, generator=g).half()
    torch.ops.hexlayout.gemm(a, b)
    assert drv.launches == 1 and len(gemm_mod._FAST) == 1
    reads = []
    with monkeypatch.context() as mp:
        mp.setattr(gc_mod._Table, "_read", lambda self: reads.append(1) or ({}, {}))
        mp.setattr(gemm_mod, "choose_config", lambda *a: pytest.fail("config searched on a cached call"))
        for _ in range(50):
            c = torch.ops.hexlayout.gemm(a, b)
            assert c.shape == (64, 128) and c.dtype == torch.float16
    assert drv.launches == 51
    assert len(capability_calls) == 1 and not reads
    # another shape is another entry; the first stays cached
    torch.ops.hexlayout.gemm(a[:32].clone(), b)
    assert drv.launches == 52 and len(gemm_mod._FAST) == 2


@pytest.mark.nvrtc
def test_a_new_autotuning_result_is_followed(stubbed) -> None:
    drv, _ = stubbed
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(64, 64, generator=g).half(), torch.randn(128, 64, generator=g).half()
    torch.ops.hexlayout.gemm(a, b)
    (entry,) = gemm_mod._FAST.values()
    first = entry[0]
    heuristic = gc_mod.choose_config("sm_80", 64, 128, 64)
    other = next(c for c in gc_mod.CONFIGS["sm_80"] if c != heuristic and c.BM == 64)
    key = "gemm/torch.float16/nk/none/000"
    gc_mod.autotuner().tune(key, 64, 128, 64, [other], lambda cfg: 1e-5)
    torch.ops.hexlayout.gemm(a, b)
    used = [v[0] if isinstance(v, tuple) else v for k, v in gemm_mod._LAUNCHERS.items() if k[2] == other]
    assert drv.launches == 2 and len(used) == 1 and used[0] is not first
    assert gemm_mod._FAST[next(reversed(gemm_mod._FAST))][0] is used[0]


@pytest.mark.nvrtc
def test_cached_calls_bind_each_calls_own_pointers_scale_and_row_strides(stubbed, monkeypatch) -> None:
    """The fast path re-reads what may differ between calls with one key: data pointers, the
    scale, and for M = 1 the row strides check_gemm leaves free. Each launch gets the values a
    full check of its own arguments gives: the first call's ``BoundArgs``; a cached call's
    parameter bytes as the driver reads them (the pre-packed ``Launcher.prepared`` buffer)."""
    import ctypes

    import hexlayout.runtime.launch as launch

    drv, _ = stubbed
    seen = []
    real = launch.Launcher.launch
    monkeypatch.setattr(launch.Launcher, "launch", lambda self, bound, stream=None: seen.append((self, bound))
                        or real(self, bound, stream))
    params = []
    real_launch = drv.cuLaunchKernelEx
    monkeypatch.setattr(drv, "cuLaunchKernelEx", lambda cfg, fn, p, extra: params.append(
        (p, (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ))) or real_launch(cfg, fn, p, extra))
    real_prepared = launch.Launcher.prepared

    def prepared(self, template):
        go = real_prepared(self, template)

        def recorded(args):
            ok = go(args)
            if ok:                             # the bytes now, before another call rewrites them
                p, grid = params[-1]
                slots = [ctypes.string_at(ctypes.c_void_p.from_address(p + 8 * i).value, 8)
                         for i in range(len(self.build.generated.args))]
                seen.append((self, list(args), slots, grid))
            return ok
        return recorded

    monkeypatch.setattr(launch.Launcher, "prepared", prepared)

    def check(a, c, scale):
        if isinstance(seen[-1][1], list):      # a cached call: the packed bytes
            lau, args, slots, grid = seen[-1]
            assert any(t is a for t in args) and any(t is c for t in args)
            assert scale in [x for x in args if isinstance(x, float)]
            ref = lau.plan._bind_slow(args, "cpu")
            packer = launch.ArgPacker(lau.build.generated.args)
            packer.pack(ref.values)
            assert slots == [packer.slot_bytes(i) for i in range(len(slots))] and grid == ref.grid
            return
        lau, bound = seen[-1]
        given = {**bound.tensors, **bound.scalars}
        assert any(t is a for t in bound.tensors.values()) and any(t is c for t in bound.tensors.values())
        assert scale in bound.scalars.values()
        ref = lau.plan._bind_slow([given[name] for name in lau.plan.names], "cpu")
        assert (bound.values, bound.grid, bound.sizes) == (ref.values, ref.grid, ref.sizes)

    g = torch.Generator().manual_seed(2)
    b = torch.randn(128, 64, generator=g).half()
    for i in range(3):
        a = torch.randn(64, 64, generator=g).half()
        check(a, torch.ops.hexlayout.gemm(a, b, scale=0.5 + i), 0.5 + i)
    wide = torch.randn(1, 128, generator=g).half()
    for a in (torch.randn(1, 64, generator=g).half(), wide[:, :64], torch.randn(1, 64, generator=g).half()):
        check(a, torch.ops.hexlayout.gemm(a, b, scale=2.0), 2.0)
    assert len(seen) == 6


@pytest.mark.nvrtc
def test_the_caches_keep_no_tensor_of_a_call_alive(stubbed) -> None:
    import gc
    import weakref

    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(64, 64, generator=g).half(), torch.randn(128, 64, generator=g).half()
    c = torch.ops.hexlayout.gemm(a, b)
    refs = [weakref.ref(t) for t in (a, b, c)]
    del a, b, c
    gc.collect()
    assert [r() for r in refs] == [None, None, None]


@pytest.mark.nvrtc
def test_cached_op_calls_take_the_one_lookup_path(stubbed, monkeypatch) -> None:
    """After the first calls, ``torch.ops.hexlayout.gemm`` (grad mode, no_grad, inference mode)
    launches through ``gemm_cached``: no check_arguments, no run_checked; each call gets its
    own output, its own pointers and scale; a misaligned pointer with a cached key still gets
    check_gemm's error, naming the argument, and launches nothing."""
    from hexlayout.ops.gemm import torch_op as tg

    from hexlayout.runtime.args import ArgumentError

    drv, _ = stubbed
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(64, 64, generator=g).half(), torch.randn(128, 64, generator=g).half()
    bias = torch.randn(128, generator=g).half()
    op = torch.ops.hexlayout.gemm
    for _ in range(2):
        op(a, b)
        op(a, b, bias, activation="relu", scale=0.5)
    assert drv.launches == 4
    pointers = []
    with monkeypatch.context() as mp:
        mp.setattr(gemm_mod, "check_arguments", lambda *a, **k: pytest.fail("checked again"))
        mp.setattr(tg, "run_checked", lambda *a, **k: pytest.fail("run_checked on a cached call"))
        for key, e in list(gemm_mod._FAST.items()):   # record what each cached launch is given
            gemm_mod._FAST[key] = (*e[:5], (lambda launch: lambda *args: pointers.append(
                (args[0].data_ptr(), args[2].data_ptr(), args[5])) or launch(*args))(e[5]))
        gemm_mod._HOT.clear()                  # refilled from _FAST (the recording launches)
        outs = []
        for mode in (torch.enable_grad, torch.no_grad, torch.inference_mode):
            x = torch.randn(64, 64, generator=g).half()
            with mode():
                c = op(x, b)
                d = op(x, b, bias, activation="relu", scale=2.0)
            assert c.shape == d.shape == (64, 128) and c.dtype == torch.float16 and not c.requires_grad
            assert pointers[-2:] == [(x.data_ptr(), c.data_ptr(), None), (x.data_ptr(), d.data_ptr(), 2.0)]
            outs += [c, d]
        assert len({t.data_ptr() for t in outs}) == len(outs)
        assert drv.launches == 10 and len(gemm_mod._HOT) == 2
    off = torch.randn(64 * 64 + 1, generator=g).half()[1:].view(64, 64)
    with pytest.raises(ArgumentError, match=r"argument 'a': starts 2 bytes off 16-byte alignment"):
        op(off, b)
    assert drv.launches == 10


@pytest.mark.nvrtc
def test_inputs_that_require_grad_on_a_cached_key_get_gradients(stubbed) -> None:
    """A cached key does not bypass autograd: with grad mode on, an input that requires grad
    gets the registered backward's gradient (compared with float64); under no_grad the same
    call takes the cached path and its output does not require grad."""
    drv, _ = stubbed
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(64, 64, generator=g).half(), torch.randn(128, 64, generator=g).half()
    for _ in range(3):
        torch.ops.hexlayout.gemm(a, b)
    w = b.clone().requires_grad_()
    out = torch.ops.hexlayout.gemm(a, w)
    assert out.requires_grad and out.grad_fn is not None and drv.launches == 4
    dc = torch.randn(64, 128, generator=g)
    out.backward(dc.half())
    ref = b.double().requires_grad_()
    (a.double() @ ref.T).backward(dc.half().double())
    torch.testing.assert_close(w.grad.double(), ref.grad, rtol=1e-2, atol=1e-2)
    with torch.no_grad():
        assert not torch.ops.hexlayout.gemm(a, w).requires_grad
    assert drv.launches == 5


@pytest.mark.nvrtc
def test_a_parameter_weight_is_a_cached_call_too(stubbed, monkeypatch) -> None:
    """A weight held as ``torch.nn.Parameter`` (as models hold it) takes the cached path like
    a plain tensor: its check's verdict is memoized (the checks read the same of both)."""
    from hexlayout.ops.gemm import torch_op as tg

    drv, _ = stubbed
    g = torch.Generator().manual_seed(6)
    a = torch.randn(64, 64, generator=g).half()
    w = torch.nn.Parameter(torch.randn(128, 64, generator=g).half(), requires_grad=False)
    for _ in range(2):
        torch.ops.hexlayout.gemm(a, w)
    with monkeypatch.context() as mp:
        mp.setattr(gemm_mod, "check_arguments", lambda *a, **k: pytest.fail("checked again"))
        mp.setattr(tg, "run_checked", lambda *a, **k: pytest.fail("run_checked on a cached call"))
        for _ in range(3):
            assert torch.ops.hexlayout.gemm(torch.randn(64, 64, generator=g).half(), w).shape == (64, 128)
    assert drv.launches == 5


@pytest.mark.nvrtc
def test_cached_calls_launch_on_the_raw_current_stream(stubbed, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cached call reads torch's current stream as its raw handle
    (``torch._C._cuda_getCurrentRawStream(device)``, no ``Stream`` object per call) where torch
    has it (CUDA builds), ``torch.cuda.current_stream(device).cuda_stream`` where it does not."""
    drv, _ = stubbed
    g = torch.Generator().manual_seed(5)
    a, b = torch.randn(64, 64, generator=g).half(), torch.randn(128, 64, generator=g).half()
    asked = []
    monkeypatch.setattr(torch._C, "_cuda_getCurrentRawStream", lambda d: asked.append(d) or 0xCAFE,
                        raising=False)
    torch.ops.hexlayout.gemm(a, b)
    for _ in range(3):
        torch.ops.hexlayout.gemm(a, b)
        assert drv.stream == 0xCAFE
    assert asked and set(asked) == {0}
    monkeypatch.delattr(torch._C, "_cuda_getCurrentRawStream", raising=False)
    for d in (gemm_mod._FAST, gemm_mod._HOT, gemm_mod._LAUNCHERS):
        d.clear()
    torch.ops.hexlayout.gemm(a, b)
    torch.ops.hexlayout.gemm(a, b)
    assert drv.stream == 0x5EED          # bench_host's stubbed current_stream
