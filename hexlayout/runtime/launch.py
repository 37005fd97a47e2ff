"""Launch a compiled ``Build`` on torch's current CUDA stream through the driver API.

``Launcher(build)`` is created once per build; ``launcher(*args, **kwargs)`` per call:

1. ``bind_args`` checks the arguments (``ArgumentError`` before anything runs) and gives the
   grid and the kernel argument values (cached per argument shapes: microseconds); a call
   that breaks the build's alignment assumptions runs the build specialized on its
   divisibility facts (``specialize``) through that build's own launcher;
2. tensor maps are encoded with ``cuTensorMapEncodeTiled`` (cached per parameters, so a
   repeated call with the same tensors costs a dictionary lookup);
3. the values are packed into one preallocated parameter block (``ArgPacker``: one
   ``struct.pack_into`` for pointers, scalars and sizes, a 128-byte copy per
   ``__grid_constant__ CUtensorMap``), addressed by a fixed ``void*`` array;
4. ``cuLaunchKernelEx`` runs the kernel on ``torch.cuda.current_stream(device)`` (or
   ``stream=``), with the cluster dimensions when the kernel has them.

The cubin is loaded once with ``cuLibraryLoadData`` (context-independent: the kernel lands
in the context of the stream it is launched on); per device, the launcher checks the
compute capability against the build's architecture (``UnsupportedDeviceError``) and the
opt-in shared-memory limit, and raises ``MAX_DYNAMIC_SHARED_SIZE_BYTES`` when the kernel
needs more than 48 KB. ``measure_host_overhead`` times the host side (GPU machines).
"""

from __future__ import annotations

import ctypes
import struct
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from hexlayout.arch.targets import RUNS_ON, SUPPORTED_ARCHS
from hexlayout.errors import HexlayoutError

from .args import ArgumentError, BoundArgs, MisalignedArgumentError, _new_tuple, _scalar_value, kernel_plan
from .capture import prebuilding, refuse_during_capture
from .launch_log import _LOGS as _LAUNCH_LOGS
from .launch_log import launched, profiled
from .tensormap import L2_PROMOTIONS, TENSOR_MAP_BYTES, TensorMapParams, encode_tensor_map, tensor_map_bytes

__all__ = ["Launcher", "ArgPacker", "UnsupportedDeviceError", "LaunchError", "check_device_arch",
           "measure_host_overhead", "DEFAULT_SMEM_LIMIT"]

#: Dynamic shared memory a kernel gets without opting in.
DEFAULT_SMEM_LIMIT = 48 * 1024

#: C type of a scalar / size kernel argument -> struct format character.
_STRUCT_CHARS = {
    "float": "f", "double": "d", "int": "i", "unsigned": "I", "long long": "q", "half": "H",
    "__nv_bfloat16": "H", "unsigned short": "H", "signed char": "b", "unsigned char": "B", "bool": "?",
    "__nv_fp8_e4m3": "B", "__nv_fp8_e5m2": "B",
}


class UnsupportedDeviceError(HexlayoutError, RuntimeError):
    """The build's architecture cannot run on the device (or the device lacks a resource)."""


class LaunchError(HexlayoutError, RuntimeError):
    """A CUDA driver call failed while loading or launching a kernel."""


def check_device_arch(kernel: str, arch: str, capability: tuple[int, int],
                      device: str = "the device") -> None:
    """Raise ``UnsupportedDeviceError`` unless a cubin for ``arch`` runs on ``capability``.

    A cubin runs on devices of its major version with an equal or higher minor version;
    arch-specific targets (``sm_90a``) run only on exactly their version.
    """
    digits = arch.removeprefix("sm_")
    specific = digits.endswith("a")
    digits = digits.rstrip("a")
    want = (int(digits[:-1]), int(digits[-1]))
    major, minor = capability
    ok = (major, minor) == want if specific else (major == want[0] and minor >= want[1])
    if not ok:
        have = f"sm_{major}{minor}"
        hint = have if have in SUPPORTED_ARCHS else RUNS_ON.get(have)
        fix = f"; build it for {hint!r}" if hint else "; hexlayout targets sm_80, sm_89 and sm_90a"
        raise UnsupportedDeviceError(f"{kernel}: built for {arch}, but {device} is {have} "
                                     f"(compute capability {major}.{minor}){fix}")


class ArgPacker:
    """The kernel's parameter block: one slot per ``GeneratedKernel.args`` entry (8 bytes for
    pointers, scalars and sizes; 128 bytes, 64-byte aligned, per ``CUtensorMap``) and the
    ``void*`` array ``cuLaunchKernel`` reads (``kernel_params``, its address as an int)."""

    def __init__(self, args: Sequence[Any]) -> None:
        fmt = ["<"]
        offsets: list[int] = []
        self.map_slots: list[tuple[int, int]] = []     # (argument position, byte offset)
        self.value_positions: list[int] = []
        off = 0
        for pos, a in enumerate(args):
            if a.kind == "tensor_map":
                off = -(-off // 64) * 64
                offsets.append(off)
                self.map_slots.append((pos, off))
                off += TENSOR_MAP_BYTES
                continue
            if self.map_slots:
                raise ValueError("tensor maps must come after every other kernel argument")
            char = "Q" if a.kind == "tensor" else _STRUCT_CHARS.get(a.c_type)
            if char is None:
                raise ValueError(f"kernel argument {a.name}: no packing for C type {a.c_type!r}")
            offsets.append(off)
            fmt.append(char)
            size = struct.calcsize("<" + char)
            fmt.append(f"{8 - size}x" if size < 8 else "")
            self.value_positions.append(pos)
            off += 8
        self.size = max(off, 8)
        self.offsets = tuple(offsets)
        self.struct = struct.Struct("".join(fmt))
        self._raw = bytearray(self.size + 64)
        self._cbuf = (ctypes.c_char * len(self._raw)).from_buffer(self._raw)
        addr = ctypes.addressof(self._cbuf)
        self.base = -addr % 64                              # 64-byte aligned start in _raw
        self.address = addr + self.base
        n = max(len(offsets), 1)
        self._ptrs = (ctypes.c_void_p * n)(*[self.address + o for o in offsets] or [0])
        self.kernel_params = ctypes.addressof(self._ptrs)

    def pack(self, values: Sequence[Any], maps: Sequence[bytes] = ()) -> None:
        """Write one call's values (tensor maps given as their 128 encoded bytes)."""
        self.struct.pack_into(self._raw, self.base, *[values[p] for p in self.value_positions])
        for (_, off), blob in zip(self.map_slots, maps):
            s = self.base + off
            self._raw[s:s + TENSOR_MAP_BYTES] = blob

    def slot_bytes(self, position: int, nbytes: int = 8) -> bytes:
        """The bytes of argument ``position`` as the driver will read them (for tests)."""
        return ctypes.string_at(self._ptrs[position], nbytes)


_DRIVER: Any = None


def _drv() -> Any:
    """``cuda.bindings.driver`` (imported once: this runs on every launch)."""
    global _DRIVER
    if _DRIVER is None:
        try:
            from cuda.bindings import driver
        except ImportError as e:  # pragma: no cover - depends on the installation
            raise LaunchError("launching needs cuda-bindings (pip install 'hexlayout[cuda]')") from e
        _DRIVER = driver
    return _DRIVER


def _check(drv: Any, result: Any, what: str) -> Any:
    err, *rest = result if isinstance(result, tuple) else (result,)
    if err != drv.CUresult.CUDA_SUCCESS:
        name = getattr(err, "name", str(err))
        raise LaunchError(f"{what} failed: {name}")
    return rest[0] if len(rest) == 1 else tuple(rest)


class Launcher:
    """Callable launcher of a compiled ``Build`` (see the module docstring).

    ``launcher(*args, stream=None, **kwargs)``: the kernel's parameters positionally (declaration
    order) or by name - CUDA torch tensors and Python scalars. ``stream``: a
    ``torch.cuda.Stream`` or a raw ``CUstream`` handle (default: torch's current stream of the
    tensors' device). Returns the ``BoundArgs`` of the call.
    """

    def __init__(self, build: Any, *, l2_promotion: int = 128) -> None:
        gen = build.generated
        if build.compiled is None or not getattr(build.compiled, "cubin", None):
            raise ValueError(f"{gen.name}: the build has no cubin (built with compile=False?); "
                             "use hexlayout.runtime.build(kernel, arch) with compile=True")
        self.build = build
        self.name = gen.name
        self.arch = gen.arch
        self.threads = gen.threads
        self.smem_bytes = gen.smem_bytes
        self.cluster = tuple(gen.cluster) + (1,) * (3 - len(gen.cluster)) if gen.cluster else None
        self.plan = kernel_plan(build)
        self.packer = ArgPacker(gen.args)
        self.l2_promotion = l2_promotion
        self._cubin = bytes(build.compiled.cubin)
        self._lock = threading.Lock()
        self._library: Any = None
        self._kernel: Any = None
        self._devices: set[int] = set()
        self._functions: dict[int, Any] = {}
        self._maps: dict[TensorMapParams, bytes] = {}
        self._config: Any = None
        self._ctx_ok = threading.local()
        self._special: dict[int, Launcher] = {}          # specialized builds' launchers by id
        self._special_calls: dict[tuple, Launcher] = {}   # ... by the calls that need them

    # --- loading ----------------------------------------------------------------------------
    def _load(self) -> None:
        drv = _drv()  # cuInit: by ``prepare``
        lib = _check(drv, drv.cuLibraryLoadData(self._cubin, [], [], 0, [], [], 0),
                     f"{self.name}: cuLibraryLoadData")
        self._kernel = _check(drv, drv.cuLibraryGetKernel(lib, self.name.encode()),
                              f"{self.name}: cuLibraryGetKernel")
        self._library = lib
        cfg = drv.CUlaunchConfig()
        cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = self.threads, 1, 1
        cfg.sharedMemBytes = self.smem_bytes
        if self.cluster:
            attr = drv.CUlaunchAttribute()
            attr.id = drv.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
            attr.value.clusterDim.x, attr.value.clusterDim.y, attr.value.clusterDim.z = self.cluster
            cfg.attrs = [attr]
            cfg.numAttrs = 1
        else:
            cfg.numAttrs = 0
        self._config = cfg

    def prepare(self, device: int) -> None:
        """Load the cubin (once) and set up ``device``: architecture and shared-memory checks,
        the dynamic shared-memory opt-in. Called by the first launch on each device."""
        if device in self._devices:
            return
        refuse_during_capture(f"{self.name}: loading its module on cuda:{device}")
        with self._lock:
            if device in self._devices:
                return
            drv = _drv()
            _check(drv, drv.cuInit(0), "cuInit")
            dev = _check(drv, drv.cuDeviceGet(device), f"cuDeviceGet({device})")
            attr = drv.CUdevice_attribute
            major, minor = (_check(drv, drv.cuDeviceGetAttribute(a, dev), "cuDeviceGetAttribute")
                            for a in (attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR,
                                      attr.CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR))
            raw = _check(drv, drv.cuDeviceGetName(256, dev), "cuDeviceGetName")
            name = raw.split(b"\x00", 1)[0].decode(errors="replace")
            label = f"cuda:{device} ({name})"
            # before loading: a cubin of another architecture fails to load with a bare
            # CUDA_ERROR_NO_BINARY_FOR_GPU
            check_device_arch(self.name, self.arch, (int(major), int(minor)), label)
            if self._kernel is None:
                self._load()
            if self.smem_bytes > DEFAULT_SMEM_LIMIT:
                optin = _check(drv, drv.cuDeviceGetAttribute(
                    attr.CU_DEVICE_ATTRIBUTE_MAX_SHARED_MEMORY_PER_BLOCK_OPTIN, dev), "cuDeviceGetAttribute")
                if self.smem_bytes > int(optin):
                    raise UnsupportedDeviceError(f"{self.name}: needs {self.smem_bytes} bytes of shared "
                                                 f"memory per block, {label} allows {int(optin)}")
                _check(drv, drv.cuKernelSetAttribute(
                    drv.CUfunction_attribute.CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, self.smem_bytes,
                    self._kernel, dev), f"{self.name}: cuKernelSetAttribute(MAX_DYNAMIC_SHARED_SIZE_BYTES)")
            # load the kernel into the device's primary context now, not lazily at the first
            # launch (which may happen inside a CUDA-graph capture)
            ctx = _check(drv, drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            _check(drv, drv.cuCtxPushCurrent(ctx), "cuCtxPushCurrent")
            try:
                # a CUfunction of the primary context (launches take a CUfunction; torch runs on
                # the primary context)
                self._functions[device] = _check(drv, drv.cuKernelGetFunction(self._kernel),
                                                 f"{self.name}: cuKernelGetFunction")
            finally:
                _check(drv, drv.cuCtxPopCurrent(), "cuCtxPopCurrent")
            self._devices.add(device)

    def _ensure_context(self, device: int) -> None:
        """A current context for launches on the legacy default stream (handle 0)."""
        if getattr(self._ctx_ok, "device", None) == device:
            return
        drv = _drv()
        cur = _check(drv, drv.cuCtxGetCurrent(), "cuCtxGetCurrent")
        if cur is None or int(cur) == 0:
            dev = _check(drv, drv.cuDeviceGet(device), "cuDeviceGet")
            ctx = _check(drv, drv.cuDevicePrimaryCtxRetain(dev), "cuDevicePrimaryCtxRetain")
            _check(drv, drv.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")
        self._ctx_ok.device = device

    # --- per call -----------------------------------------------------------------------------
    def bind(self, *args: Any, **kwargs: Any) -> BoundArgs:
        """Check one call's arguments (no launch)."""
        plan = self.plan
        return plan.bind(plan.collect(args, kwargs), "cuda")

    def tensor_map(self, params: TensorMapParams) -> bytes:
        """The encoded 128 bytes of ``params`` (cached)."""
        blob = self._maps.get(params)
        if blob is None:
            enc = params if self.l2_promotion == 128 else params._replace(
                l2_promotion=L2_PROMOTIONS[self.l2_promotion])
            blob = tensor_map_bytes(encode_tensor_map(enc))
            if len(self._maps) > 4096:
                self._maps.clear()
            self._maps[params] = blob
        return blob

    def __call__(self, *args: Any, stream: Any = None, **kwargs: Any) -> BoundArgs:
        plan = self.plan
        vals = plan.collect(args, kwargs)
        try:
            bound = plan.bind(vals, "cuda")
        except MisalignedArgumentError as e:        # a build specialized on the call's alignment
            return self.specialized(plan, vals, e)(*args, stream=stream, **kwargs)
        return self.launch(bound, stream)

    def specialized(self, plan: Any, vals: list[Any], err: MisalignedArgumentError) -> Launcher:
        """The launcher of the build specialized on the divisibility facts of a call that
        breaks this build's alignment assumptions (``specialize.build_for_call``; cached)."""
        from .specialize import build_for_call

        key = plan._key(vals, "cuda")               # dtypes, shapes, strides, structural scalars
        if key is not None:                         # + the pointers' residues: the call's facts
            key += tuple(vals[t.index].data_ptr() % 16 for t in plan.tensors)
            hit = self._special_calls.get(key)
            if hit is not None:
                return hit
        b = build_for_call(self.build, plan, vals, "cuda", err)
        hit = self._special.get(id(b))
        if hit is None or hit.build is not b:
            hit = self._special[id(b)] = Launcher(b, l2_promotion=self.l2_promotion)
        if key is not None:
            if len(self._special_calls) > 4096:
                self._special_calls.clear()
            self._special_calls[key] = hit
        return hit

    def call_like(self, template: BoundArgs, args: Sequence[Any], stream: Any = None) -> BoundArgs:
        """Launch with ``args`` (every parameter, positionally) when the caller knows they have
        the dtypes, device, shapes and strides of the earlier call that gave ``template``: only
        the data pointers (alignment) and scalars are checked, as on ``bind``'s fast path.
        Anything else goes through the full check (``launcher(*args)``)."""
        bound = self.plan._from_template(template, args)
        if bound is None:
            return self(*args, stream=stream)
        return self.launch(bound, stream)

    def prepared(self, template: BoundArgs) -> Callable[[Sequence[Any]], bool]:
        """A launch of calls like ``template``'s (same dtypes, device, shapes and strides, as
        for ``call_like``) on torch's current stream, with the template's parameter block packed
        once into a buffer of its own: per call only the data pointers (checked for the
        alignment ``bind`` checks), the free scalars and the tensor maps' addresses are
        rewritten. ``go(args)`` (every parameter, positionally) launches and returns ``True``,
        or returns ``False`` without launching when the call needs more than that - a
        misaligned pointer (``call_like`` then names it), launch logging or torch's profiler on
        - so the caller falls back to ``call_like``."""
        import sys

        plan = self.plan
        if template.empty or template.device not in self._devices:
            return lambda args: False
        device, grid = template.device, template.grid
        if self.cluster and any(g % c for g, c in zip(grid, self.cluster)):
            return lambda args: False
        packer = ArgPacker(self.build.generated.args)
        maps = [self.tensor_map(p) for p in template.tensor_maps]
        packer.pack(template.values, maps)
        raw, base, offsets = packer._raw, packer.base, packer.offsets
        q = struct.Struct("<Q")
        checks = [(t.index, t.max_align) for t in plan.tensors]
        ptr_writes = [(base + offsets[pos], k) for pos, k in plan.ptr_slots]
        scalar_writes = []
        kargs = self.build.generated.args
        for pos, sc in plan.free_scalars:
            at = None
            if pos is not None:
                at = (base + offsets[pos], struct.Struct("<" + _STRUCT_CHARS[kargs[pos].c_type]))
            scalar_writes.append((at, sc))
        map_writes = [(base + offsets[pos], tpl_map, k) for (pos, mi, k), tpl_map
                      in zip(plan.map_slots, template.tensor_maps)]
        name, fn, params, lock = self.name, self._functions[device], packer.kernel_params, self._lock
        cfg, tensor_map, scalar_value = self._config, self.tensor_map, _scalar_value
        torch = sys.modules["torch"]
        # the raw handle of torch's current stream (what inductor's generated code reads):
        # no Stream object per call; CPU builds of torch lack it and take current_stream
        raw_stream = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw_stream is not None and isinstance(device, int):
            def current_handle() -> int:
                return raw_stream(device)
        else:
            def current_handle() -> int:
                return torch.cuda.current_stream(device).cuda_stream
        profiler = torch.autograd.profiler
        if not isinstance(getattr(profiler, "_is_profiler_enabled", None), bool):   # pragma: no cover
            return lambda args: False

        def go(args: Sequence[Any], _keep: ArgPacker = packer) -> bool:   # _keep: params points into it
            if _LAUNCH_LOGS or profiler._is_profiler_enabled or prebuilding():
                return False
            ptrs = []
            for i, align in checks:
                ptr = args[i].data_ptr()
                if ptr % align:
                    return False
                ptrs.append(ptr)
            handle = current_handle()
            if handle == 0:
                self._ensure_context(device)
            drv = _drv()
            with lock:
                for at, k in ptr_writes:
                    q.pack_into(raw, at, ptrs[k])
                for at, sc in scalar_writes:
                    x = scalar_value(name, sc.param, args[sc.index])
                    if at is not None:
                        at[1].pack_into(raw, at[0], x)
                for at, mp, k in map_writes:
                    raw[at:at + TENSOR_MAP_BYTES] = tensor_map(_new_tuple(TensorMapParams,
                                                                          mp[:5] + (ptrs[k],) + mp[6:]))
                cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
                cfg.hStream = handle
                err = drv.cuLaunchKernelEx(cfg, fn, params, 0)[0]
            if err != drv.CUresult.CUDA_SUCCESS:
                raise LaunchError(f"{name}: cuLaunchKernelEx(grid {grid}, {self.threads} threads, "
                                  f"{self.smem_bytes} B shared) failed: {getattr(err, 'name', err)}")
            return True

        return go

    def launch(self, bound: BoundArgs, stream: Any = None) -> BoundArgs:
        """Launch one call whose arguments ``bind`` checked (``bound``)."""
        if bound.empty:
            return bound
        device = bound.device
        if device not in self._devices:
            self.prepare(device)
        if prebuilding():  # warm-up: built and loaded, nothing launched
            return bound
        grid = bound.grid
        if self.cluster and any(g % c for g, c in zip(grid, self.cluster)):
            raise ArgumentError(self.name, None,
                                f"grid {grid} is not a multiple of the cluster {self.cluster}")
        if stream is None:
            import torch

            handle = torch.cuda.current_stream(device).cuda_stream
        else:
            handle = int(getattr(stream, "cuda_stream", stream))
        if handle == 0:
            self._ensure_context(device)
        maps = [self.tensor_map(p) for p in bound.tensor_maps] if bound.tensor_maps else ()
        drv = _drv()
        if _LAUNCH_LOGS:
            launched(self.build, self.name, bound, "cuda")
        with profiled(self.name), self._lock:
            self.packer.pack(bound.values, maps)
            cfg = self._config
            cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = grid
            cfg.hStream = handle
            err = drv.cuLaunchKernelEx(cfg, self._functions[device], self.packer.kernel_params, 0)[0]
        if err != drv.CUresult.CUDA_SUCCESS:
            raise LaunchError(f"{self.name}: cuLaunchKernelEx(grid {grid}, {self.threads} threads, "
                              f"{self.smem_bytes} B shared) failed: {getattr(err, 'name', err)}")
        return bound


def measure_host_overhead(launcher: Launcher, *args: Any, iters: int = 2000, warmup: int = 20,
                          **kwargs: Any) -> dict[str, float]:
    """Host-side cost of one call in microseconds (GPU machines): ``bind`` (argument checks),
    ``call`` (a whole ``launcher(...)``: checks, packing, ``cuLaunchKernelEx``), ``launch``
    (only ``cuLaunchKernelEx`` with prepacked parameters) and ``torch_op`` (a trivial torch
    CUDA op, ``x.add_(0)`` on one element, for scale). The GPU is synchronized before timing;
    launches queue asynchronously, so ``iters`` is kept below the launch-queue depth."""
    import torch

    for _ in range(warmup):
        launcher(*args, **kwargs)
    torch.cuda.synchronize()

    def per_call(fn: Any) -> float:
        torch.cuda.synchronize()
        t = time.perf_counter()
        for _ in range(iters):
            fn()
        dt = time.perf_counter() - t
        torch.cuda.synchronize()
        return dt / iters * 1e6

    bound = launcher.bind(*args, **kwargs)
    drv = _drv()
    device = bound.device if isinstance(bound.device, int) else 0
    launcher.prepare(device)
    cfg, kern, params = launcher._config, launcher._functions[device], launcher.packer.kernel_params
    x = torch.zeros(1, device=f"cuda:{device}")
    return {
        "bind": per_call(lambda: launcher.bind(*args, **kwargs)),
        "call": per_call(lambda: launcher(*args, **kwargs)),
        "launch": per_call(lambda: drv.cuLaunchKernelEx(cfg, kern, params, 0)),
        "torch_op": per_call(lambda: x.add_(0)),
    }
