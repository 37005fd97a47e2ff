"""The launcher: parameter packing, architecture checks and argument errors without a GPU;
launches against torch.matmul, TMA kernels, host overhead and CUDA graphs on a GPU."""

from __future__ import annotations

import ctypes
import struct

import pytest
import torch

import hexlayout.runtime as rt
from hexlayout.lang.examples import gemm_sm80, gemm_sm90
from hexlayout.runtime import ArgumentError, Launcher, UnsupportedDeviceError
from hexlayout.runtime.launch import ArgPacker, check_device_arch


@pytest.fixture(scope="module")
def compiled80():
    return rt.build(gemm_sm80, "sm_80", BM=64, BN=64)


@pytest.fixture(scope="module")
def compiled90():
    return rt.build(gemm_sm90, "sm_90a")


# --- without a GPU -----------------------------------------------------------------------------------

def test_packer_slots_follow_the_kernel_arguments(compiled90) -> None:
    p = ArgPacker(compiled90.generated.args)
    kinds = [a.kind for a in compiled90.generated.args]
    assert kinds == ["tensor"] * 3 + ["size"] * 3 + ["tensor_map"] * 2
    assert p.offsets == (0, 8, 16, 24, 32, 40, 64, 192)
    assert p.address % 64 == 0 and all(p._ptrs[i] % 64 == 0 for i, _ in p.map_slots)
    maps = [bytes(range(128)), bytes(range(128, 256))]
    p.pack([0x7F0000001000, 0x7F0000002000, 0x7F0000003000, 100, 64, 72, None, None], maps)
    assert struct.unpack("<Q", p.slot_bytes(1)) == (0x7F0000002000,)
    assert struct.unpack("<i", p.slot_bytes(4, 4)) == (64,)
    assert p.slot_bytes(6, 128) == maps[0] and p.slot_bytes(7, 128) == maps[1]
    # the void* array the driver reads
    ptrs = (ctypes.c_void_p * 8).from_address(p.kernel_params)
    assert [ptrs[i] - p.address for i in range(8)] == list(p.offsets)


def test_packer_scalar_types(scalars_kernel) -> None:
    gen = scalars_kernel.generated
    assert [(a.kind, a.c_type) for a in gen.args] == [
        ("tensor", "const float*"), ("scalar", "int"), ("scalar", "half"), ("tensor", "const float*"),
        ("size", "int"), ("size", "int")]
    p = ArgPacker(gen.args)
    bound = rt.bind_args(scalars_kernel, None, (torch.zeros(5, 16), 5, -2.0, torch.zeros(3, 5)), device="cpu")
    p.pack(bound.values)
    assert struct.unpack("<i", p.slot_bytes(1, 4)) == (5,)
    assert struct.unpack("<e", p.slot_bytes(2, 2)) == (-2.0,)
    assert struct.unpack("<ii", p.slot_bytes(4, 4) + p.slot_bytes(5, 4)) == (3, 5)


@pytest.mark.parametrize(("arch", "cc", "ok"), [
    ("sm_80", (8, 0), True), ("sm_80", (8, 6), True), ("sm_80", (8, 9), True), ("sm_80", (9, 0), False),
    ("sm_89", (8, 9), True), ("sm_89", (8, 6), False), ("sm_90a", (9, 0), True), ("sm_90a", (8, 0), False),
    ("sm_90a", (10, 0), False),
])
def test_device_architecture(arch: str, cc: tuple[int, int], ok: bool) -> None:
    if ok:
        check_device_arch("k", arch, cc)
        return
    want = f"k: built for {arch}, but cuda:0 .* is sm_{cc[0]}{cc[1]}"
    with pytest.raises(UnsupportedDeviceError, match=want):
        check_device_arch("k", arch, cc, "cuda:0 (GPU)")


def test_hint_names_the_architecture_to_build_for() -> None:
    with pytest.raises(UnsupportedDeviceError, match="build it for 'sm_90a'"):
        check_device_arch("gemm", "sm_80", (9, 0))


def test_launcher_needs_a_cubin(gemm80) -> None:
    with pytest.raises(ValueError, match="no cubin"):
        Launcher(gemm80)


def test_launcher_checks_arguments_before_touching_the_driver(compiled80) -> None:
    launch = Launcher(compiled80)              # loads nothing yet
    a, b, c = torch.randn(64, 64).half(), torch.randn(64, 64).half(), torch.empty(64, 64).half()
    with pytest.raises(ArgumentError, match="'a': is on cpu, expected a CUDA device"):
        launch(a, b, c)
    assert launch._kernel is None


# --- on a GPU ------------------------------------------------------------------------------------------

def _gpu_build():
    major, minor = torch.cuda.get_device_capability()
    return rt.build(gemm_sm90, "sm_90a") if (major, minor) == (9, 0) else rt.build(gemm_sm80, "sm_80")


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(128, 256, 64), (1000, 520, 264), (65, 72, 8), (1, 8, 64)])
def test_gemm_matches_torch(m: int, n: int, k: int) -> None:
    launch = Launcher(_gpu_build())
    g = torch.Generator(device="cuda").manual_seed(m + n + k)
    a = torch.randn(m, k, device="cuda", generator=g).half()
    b = torch.randn(n, k, device="cuda", generator=g).half()
    c = torch.full((m, n), float("nan"), device="cuda", dtype=torch.float16)
    launch(a, b, c)
    torch.cuda.synchronize()
    torch.testing.assert_close(c.float(), a.float() @ b.float().T, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_sm80_gemm_on_any_gpu_and_side_stream(compiled80) -> None:
    if torch.cuda.get_device_capability()[0] != 8:
        with pytest.raises(UnsupportedDeviceError):
            Launcher(compiled80)(*(torch.zeros(64, 64, device="cuda").half() for _ in range(3)))
        return
    launch = Launcher(compiled80)
    a, b = torch.randn(200, 96, device="cuda").half(), torch.randn(136, 96, device="cuda").half()
    c = torch.empty(200, 136, device="cuda").half()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        launch(a, b, c)
    s.synchronize()
    torch.testing.assert_close(c.float(), a.float() @ b.float().T, rtol=2e-2, atol=2e-2)


@pytest.mark.gpu
def test_host_overhead_is_microseconds() -> None:
    launch = Launcher(_gpu_build())
    a, b = torch.randn(256, 256, device="cuda").half(), torch.randn(256, 256, device="cuda").half()
    c = torch.empty(256, 256, device="cuda").half()
    t = rt.measure_host_overhead(launch, a, b, c, iters=500)
    print("host overhead (us):", t)
    assert t["bind"] < 50 and t["call"] < 100


@pytest.mark.gpu
def test_cuda_graph_replays_the_launch() -> None:
    launch = Launcher(_gpu_build())
    a, b = torch.randn(128, 64, device="cuda").half(), torch.randn(256, 64, device="cuda").half()
    c = torch.zeros(128, 256, device="cuda").half()
    launch(a, b, c)                                 # warm-up outside the capture (loads, attributes)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        launch(a, b, c)
    c.zero_()
    a.copy_(torch.randn_like(a))
    graph.replay()
    torch.cuda.synchronize()
    torch.testing.assert_close(c.float(), a.float() @ b.float().T, rtol=2e-2, atol=2e-2)


# --- the driver call sequence, against a recording stand-in for cuda.bindings.driver --------------------

class _FakeDriver:
    """``cuda.bindings.driver`` with its types and enums but recording functions."""

    def __init__(self, capability: tuple[int, int] = (9, 0), optin: int = 227 * 1024) -> None:
        from cuda.bindings import driver

        self._real = driver
        self.capability = capability
        self.optin = optin
        self.calls: list[tuple] = []
        self.launches: list[dict] = []

    def __getattr__(self, name: str):
        return getattr(self._real, name)

    def _ok(self, *rest):
        return (self._real.CUresult.CUDA_SUCCESS, *rest)

    def cuInit(self, flags):
        self.calls.append(("cuInit",))
        return self._ok()

    def cuLibraryLoadData(self, code, *opts):
        self.calls.append(("cuLibraryLoadData", len(code)))
        return self._ok("lib")

    def cuLibraryGetKernel(self, lib, name):
        self.calls.append(("cuLibraryGetKernel", name))
        return self._ok(self._real.CUkernel(0x1234))

    def cuDeviceGet(self, ordinal):
        return self._ok(ordinal)

    def cuDeviceGetAttribute(self, attr, dev):
        a = self._real.CUdevice_attribute
        return self._ok({a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: self.capability[0],
                         a.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: self.capability[1],
                         a.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN: self.optin}[attr])

    def cuDeviceGetName(self, n, dev):
        return self._ok(b"Fake GPU\x00\x00")

    def cuKernelSetAttribute(self, attr, value, kernel, dev):
        self.calls.append(("cuKernelSetAttribute", attr.name, value))
        return self._ok()

    def cuDevicePrimaryCtxRetain(self, dev):
        return self._ok("ctx")

    def cuCtxPushCurrent(self, ctx):
        self.calls.append(("push",))
        return self._ok()

    def cuKernelGetFunction(self, kernel):
        self.calls.append(("cuKernelGetFunction",))
        return self._ok(0x5678)

    def cuCtxPopCurrent(self):
        self.calls.append(("pop",))
        return self._ok("ctx")

    def cuLaunchKernelEx(self, cfg, f, params, extra):
        ptrs = (ctypes.c_void_p * 8).from_address(params)
        self.launches.append({
            "grid": (cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ), "block": cfg.blockDimX,
            "smem": cfg.sharedMemBytes, "stream": int(cfg.hStream), "kernel": int(f),
            "ptrs": [struct.unpack("<Q", ctypes.string_at(ptrs[i], 8))[0] for i in range(3)],
            "sizes": [struct.unpack("<i", ctypes.string_at(ptrs[i], 4))[0] for i in range(3, 6)],
            "maps": [ctypes.string_at(ptrs[i], 128) for i in (6, 7)]})
        return self._ok()


def test_driver_sequence_with_a_stand_in_driver(compiled90, monkeypatch: pytest.MonkeyPatch) -> None:
    import hexlayout.runtime.launch as launch_mod

    fake = _FakeDriver()
    monkeypatch.setattr(launch_mod, "_drv", lambda: fake)
    encoded: list = []
    monkeypatch.setattr(launch_mod, "encode_tensor_map", lambda p: encoded.append(p) or p)
    monkeypatch.setattr(launch_mod, "tensor_map_bytes", lambda p: p.name.encode().ljust(128, b"\0"))
    launcher = Launcher(compiled90)
    a, b, c = torch.randn(300, 64).half(), torch.randn(520, 64).half(), torch.empty(300, 520).half()
    bound = rt.bind_args(compiled90, None, (a, b, c), device="cpu")
    bound.device = 0
    monkeypatch.setattr(launcher, "bind", lambda *args, **kw: bound)
    monkeypatch.setattr(launcher.plan, "bind", lambda vals, device: bound)
    for _ in range(2):
        launcher(a, b, c, stream=0x77)
    names = [c[0] for c in fake.calls]
    assert names == ["cuInit", "cuLibraryLoadData", "cuLibraryGetKernel", "cuKernelSetAttribute", "push",
                     "cuKernelGetFunction", "pop"]                 # once, not per call
    assert fake.calls[2][1] == compiled90.generated.name.encode()
    assert fake.calls[3][1:] == ("CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES", launcher.smem_bytes)
    assert len(encoded) == 2                                      # tensor maps encoded once, then cached
    first = fake.launches[0]
    assert first["grid"] == bound.grid == (3, 3, 1) and first["block"] == 384
    assert first["smem"] == compiled90.generated.smem_bytes and first["stream"] == 0x77
    assert first["kernel"] == 0x5678                               # the CUfunction of the primary context
    assert first["ptrs"] == [a.data_ptr(), b.data_ptr(), c.data_ptr()] and first["sizes"] == [300, 64, 520]
    assert [m.rstrip(b"\0") for m in first["maps"]] == [b"tma_a", b"tma_b"]
    assert fake.launches[1] == first


def test_stand_in_driver_reports_an_unsupported_device(compiled90, monkeypatch: pytest.MonkeyPatch) -> None:
    import hexlayout.runtime.launch as launch_mod

    old = _FakeDriver(capability=(8, 0))
    monkeypatch.setattr(launch_mod, "_drv", lambda: old)
    with pytest.raises(UnsupportedDeviceError, match=r"built for sm_90a, but cuda:0 \(Fake GPU\) is sm_80"):
        Launcher(compiled90).prepare(0)
    # refused before the cubin is loaded (a real driver answers a bare CUDA_ERROR_NO_BINARY_FOR_GPU)
    assert "cuLibraryLoadData" not in [c[0] for c in old.calls]
    monkeypatch.setattr(launch_mod, "_drv", lambda: _FakeDriver(optin=100 * 1024))
    with pytest.raises(UnsupportedDeviceError, match="bytes of shared memory per block"):
        Launcher(compiled90).prepare(0)
