"""``hexlayout.ops.gemm``: the GEMM with a fused epilogue, as a function and a torch op.

``gemm(a, b, bias=None, residual=None, activation="none", scale=None, b_layout="nk")``
returns ``c = act(scale * (a @ B) + bias) + residual`` with ``B = b^T`` for ``b`` of shape
``N x K`` (``b_layout="nk"``) or ``B = b`` for ``K x N`` (``"kn"``); f16 or bf16 inputs
(all tensors the same type), fp32 accumulation, output in the input type. ``activation``:
``"none"``, ``"relu"``, ``"gelu"`` (exact: ``z / 2 * (1 + erf(z / sqrt 2))``, torch's
``F.gelu(z)``), ``"gelu_tanh"`` (``0.5 z (1 + tanh(sqrt(2/pi) (z + 0.044715 z^3)))``, torch's
``F.gelu(z, approximate="tanh")``) or ``"silu"`` (``z * sigmoid(z)``).

- CUDA tensors: the kernel for the device's architecture (sm_80 / sm_89: multistage
  cp.async + ldmatrix + mma.sync; sm_90a: warp-specialized persistent TMA + wgmma; sm_100a:
  the same kernel source with tcgen05, the accumulator in tensor memory) is
  synthesized, compiled and cached on first use per (dtype, stored A and B layouts,
  epilogue, config),
  then launched on torch's current stream. The output tile goes through shared memory
  (16-byte stores; stmatrix + TMA stores on sm_90a) when ``N % 8 == 0``, else it is stored
  from registers in 4-byte pieces (``stage_epilogue``). The config comes from the autotuner's
  persisted choice when there is one, else from the shape heuristic; ``autotune=True``
  times the config space once for the shape and remembers the winner.
- CPU tensors: run in the thread-level emulator when ``HEXLAYOUT_EMULATE=1`` (small
  sizes, for tests; ``HEXLAYOUT_EMULATE_ARCH`` picks the architecture, default sm_80);
  otherwise a clear error.

Strides (either order, as ``torch.mm``): ``a`` (``M x K``) and ``b`` (``N x K`` for
``"nk"``, ``K x N`` for ``"kn"``) may each be K-major (stride 1 along K) or M / N-major (stride
1 along M / N: a transposed view), with any leading stride at least the contiguous extent
(slices of bigger tensors, ``big[:, :K]``, ``big.t()[:M]``): the kernel of that stored
layout (``stored_operands``; an MN-major operand is read with ldmatrix.trans on sm_80 /
sm_89, by TMA into an MN-major wgmma stage on sm_90a) reads the view in place, its leading
strides bound at launch (``LDA`` / ``LDB``; an operand whose leading stride is its row
length takes the dense variant, which addresses rows with ``K`` / ``M`` / ``N``:
``kernels.leading_dims``, part of every build and launcher key). Its 16-byte vector / TMA
copies need the contiguous extent and the leading stride to be multiples of 8 elements: an
operand that has a stride-1 dimension but not that runs from a dense copy of the major-ness
whose contiguous extent is a multiple of 8
(K first, then M / N; ``operand_major``), so e.g. K = 36 runs when M and N are multiples of
8. ``bias`` must have stride 1; ``residual`` any strides with one dimension of stride 1 (a
residual that is not row-major with rows of N elements is copied row-major for the fused
epilogue). The output is a new row-major contiguous ``M x N`` tensor.

Requirements, checked by ``check_gemm`` - the one check the eager call, the torch op's
CUDA / CPU kernels and its fake (meta, torch.compile) implementation all run, raising a
``hexlayout.runtime.args.ArgumentError`` (``ValueError``) or ``ArgumentTypeError``
(``TypeError``) that names the argument: tensors (``bias`` / ``residual`` may be ``None``)
of one dtype (f16 or bf16) on one device; ``a`` and ``b`` matrices whose shapes agree,
``bias`` of shape ``(N,)``, ``residual`` ``(M, N)``; every tensor with a dimension of stride
1 (or extent 1); ``a`` / ``b`` with K or M / N a multiple of 8 (see above), and N even (the
epilogue stores 2-element vectors); ``a`` / ``b`` 16-byte aligned, ``bias`` / ``residual``
4-byte aligned (a view with an element offset is not: pass ``.clone()``); ``b`` addressable
with 32-bit indices (N * K < 2^31; a view spanning more is copied dense); ``activation``
and ``b_layout`` one of their strings, ``scale`` a real number or ``None`` (NaN and
infinities propagate as in torch).

A cached call - plain tensors with the shapes, strides, dtypes and devices, and the other
arguments' values, of a call already made and checked, one launch under the same autotuning
state - takes ``gemm_cached``: one dictionary lookup stands for the check's verdict and the
config / launcher lookup, then the pointers' alignment, the output and the pre-packed launch
(the torch op's ``fast`` path, and ``gemm``'s).

Any M: a problem whose launch grid would exceed CUDA's limits (on sm_80 / sm_89 the row
tiles are ``grid.y``, at most 65,535, i.e. M <= 8,388,480 with 128-row tiles) or whose ``a``,
``c`` or ``residual`` would exceed 32-bit indexing runs as several launches over row slices
(``rows_per_launch``).

K = 0: the product is zero and the epilogue runs in torch: ``act(scale * 0 + bias) +
residual`` (``scale`` NaN or infinite gives NaN, as torch's ``scale * (a @ B)``).
"""

from __future__ import annotations

import numbers
import operator
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any, NamedTuple

from hexlayout.runtime.args import GRID_LIMITS, INT32_MAX, ArgumentError, ArgumentTypeError

from ..host.device import device_arch
from ..host.launch import fresh_like
from ..host.torch import require_torch
from .config import CONFIGS, WARP_SPECIALIZED, GemmConfig, autotuner, choose_config, tuning_token
from .kernels import ARCH_KERNELS, leading_dims

__all__ = ["gemm", "gemm_cached", "check_gemm", "check_arguments", "gemm_build", "gemm_fused",
           "gemm_epilogue", "rows_per_launch", "stage_epilogue", "ACTIVATIONS", "GELU_APPROXIMATE"]

_OP = "hexlayout.gemm"

#: ``activation`` values and the aten op each one is in the fused epilogue.
ACTIVATIONS = ("none", "relu", "gelu", "gelu_tanh", "silu")
#: the GELU ``activation`` values -> torch's ``approximate`` (``F.gelu(z, approximate=...)``)
GELU_APPROXIMATE = {"gelu": "none", "gelu_tanh": "tanh"}
_ACT_NODES = {"relu": ("aten.relu.default", ()), "gelu": ("aten.gelu.default", ()),
              "gelu_tanh": ("aten.gelu.default", (("approximate", "tanh"),)),
              "silu": ("aten.silu.default", ())}

_FACTORY = ARCH_KERNELS


_LAUNCHERS: dict[tuple, Any] = {}
#: CUDA device -> hexlayout architecture (``torch.cuda.get_device_capability`` is slow).
_ARCHS: dict[Any, str] = {}
#: One-launch calls: (dtype, device, B layout, activation, bias / residual / scale absent, M,
#: N, K, row strides when M = 1) -> (launcher, the checked arguments of the first call
#: (template), parameter order, the pre-packed launch, the ``tuning_token`` it was chosen
#: under, ``_fast_launch``); the hit path of a cached call: no config search, no key text,
#: only data pointers and scale re-read (``Launcher.prepared``, else ``Launcher.call_like``).
_FAST: dict[tuple, Any] = {}
_FAST_LIMIT = 4096
#: ``gemm_cached``'s table: ``_verdict_key`` of a call -> (the (argument position, alignment)
#: pairs check_gemm re-checks, M, N, the call's ``_FAST`` entry): the check's verdict and the
#: prepared launch in one lookup, filled from ``_VERDICTS`` and ``_FAST`` on a call that finds
#: both; an entry whose ``tuning_token`` is stale is dropped.
_HOT: dict[tuple, tuple] = {}


def _kind(x: Any) -> str:
    return f"{type(x).__name__} {x!r}"[:80]


def _is_real(t: Any) -> bool:
    """Whether ``t`` has real storage (a data pointer); meta and fake tensors have not."""
    import torch

    return (type(t) is torch.Tensor or isinstance(t, torch.nn.Parameter)) and t.device.type != "meta"


#: check_gemm's memo: the arguments' (shapes, strides, dtypes, devices, kinds) of accepted
#: calls on real plain tensors (``_PLAIN``) -> ((M, N, K), (argument position, alignment) of
#: each non-empty tensor): a later call with the same key differs only in data pointers.
_VERDICTS: dict[tuple, tuple] = {}
_VERDICTS_LIMIT = 4096
#: The tensor types memoized: ``torch.Tensor`` and ``torch.nn.Parameter`` exactly (a weight is
#: usually a Parameter; the checks read the same of both); set by the first check.
_PLAIN: frozenset = frozenset()


def _tensor_key(t: Any) -> Any:
    return (t.shape, t.stride(), t.dtype, t.device) if type(t) in _PLAIN else ()


def _verdict_key(a: Any, b: Any, bias: Any, residual: Any, activation: Any, scale: Any,
                 b_layout: Any) -> tuple:
    """The key of ``_VERDICTS`` (and ``_HOT``) for plain tensors ``a``, ``b``: everything
    ``check_arguments`` reads but the data pointers (shapes, strides, dtypes, devices, the
    kinds and values of the non-tensor arguments; ``scale``'s kind only). Raises
    ``TypeError`` for an unhashable argument."""
    return (a.shape, a.stride(), a.dtype, a.device, b.shape, b.stride(), b.dtype, b.device,
            None if bias is None else _tensor_key(bias),
            None if residual is None else _tensor_key(residual),
            type(activation), activation, type(scale), type(b_layout), b_layout)


def check_gemm(a: Any, b: Any, bias: Any = None, residual: Any = None, activation: str = "none",
               scale: float | None = None, b_layout: str = "nk") -> tuple[int, int, int]:
    """Check the arguments of ``gemm`` (see the module docstring) and return ``(M, N, K)``.

    Works on real, meta and fake tensors (alignment: the data pointer, or for tensors
    without storage the element offset). Raises ``ArgumentTypeError`` / ``ArgumentError``
    naming the argument.

    Memoized for plain tensors (``torch.Tensor``, ``torch.nn.Parameter``) on a real device:
    the verdict of ``check_arguments`` (the checks) for the same shapes, strides, dtypes,
    devices and argument kinds is reused and only the data pointers' alignment is checked
    again; anything else (fake and meta tensors, other subclasses, a first call, a misaligned
    pointer) runs ``check_arguments``.
    """
    if type(a) in _PLAIN and type(b) in _PLAIN:
        try:
            key = _verdict_key(a, b, bias, residual, activation, scale, b_layout)
            hit = _VERDICTS.get(key)
        except TypeError:                    # an unhashable argument: the checks name it
            hit = key = None
        if hit is not None:
            ts = (a, b, bias, residual)
            for i, align in hit[1]:
                if ts[i].data_ptr() % align:
                    return check_arguments(a, b, bias, residual, activation, scale, b_layout)
            return hit[0]
        mnk = check_arguments(a, b, bias, residual, activation, scale, b_layout)
        if key is not None and a.device.type != "meta" and all(
                t is None or type(t) in _PLAIN for t in (bias, residual)):
            if len(_VERDICTS) >= _VERDICTS_LIMIT:
                _VERDICTS.clear()
            aligns = tuple((i, al) for i, (t, al) in enumerate(((a, 16), (b, 16), (bias, 4), (residual, 4)))
                           if t is not None and t.numel())
            _VERDICTS[key] = (mnk, aligns)
        return mnk
    return check_arguments(a, b, bias, residual, activation, scale, b_layout)


def check_arguments(a: Any, b: Any, bias: Any = None, residual: Any = None, activation: str = "none",
                    scale: float | None = None, b_layout: str = "nk") -> tuple[int, int, int]:
    """The checks of ``check_gemm`` (every one, every call; see ``check_gemm``)."""
    global _PLAIN
    import torch

    _PLAIN = frozenset((torch.Tensor, torch.nn.Parameter))

    for name, t, optional in (("a", a, False), ("b", b, False), ("bias", bias, True),
                              ("residual", residual, True)):
        if not isinstance(t, torch.Tensor) and not (optional and t is None):
            raise ArgumentTypeError(_OP, name, f"expected a tensor{' or None' if optional else ''}, "
                                    f"got {_kind(t)}")
    for name, v, allowed in (("activation", activation, ACTIVATIONS), ("b_layout", b_layout, ("nk", "kn"))):
        if not isinstance(v, str):
            raise ArgumentTypeError(_OP, name, f"expected a string ({', '.join(map(repr, allowed))}), "
                                    f"got {_kind(v)}")
        if v not in allowed:
            what = " ('nk': b is N x K, 'kn': b is K x N)" if name == "b_layout" else ""
            raise ArgumentError(_OP, name, f"must be one of {', '.join(map(repr, allowed))}{what}, not {v!r}")
    if scale is not None and (not isinstance(scale, numbers.Real) or isinstance(scale, bool)):
        raise ArgumentTypeError(_OP, "scale", f"expected a real number or None, got {_kind(scale)}")
    if a.dtype not in (torch.float16, torch.bfloat16):
        raise ArgumentError(_OP, "a", f"has dtype {a.dtype}; supported: torch.float16, torch.bfloat16")
    dev = a.device
    if dev.type not in ("cuda", "cpu", "meta"):
        raise ArgumentError(_OP, "a", f"is on {dev}; supported: CUDA, CPU (HEXLAYOUT_EMULATE=1), meta")
    tensors = [("a", a, 2), ("b", b, 2), ("bias", bias, 1), ("residual", residual, 2)]
    for name, t, rank in tensors:
        if t is None:
            continue
        if t.dtype != a.dtype:
            raise ArgumentError(_OP, name, f"has dtype {t.dtype}, a has {a.dtype}; all tensors must have one "
                                "dtype")
        if t.device != dev:
            raise ArgumentError(_OP, name, f"is on {t.device}, a on {dev}; all tensors must be on one device")
        if t.dim() != rank:
            what = "a matrix (2 dimensions)" if rank == 2 else "a vector (1 dimension)"
            raise ArgumentError(_OP, name, f"must be {what}, got shape {tuple(t.shape)}")
    m, k = a.shape
    n, kb = (b.shape[0], b.shape[1]) if b_layout == "nk" else (b.shape[1], b.shape[0])
    if kb != k:
        raise ArgumentError(_OP, "b", f"a is {m} x {k} but b ({b_layout}) has K = {kb}")
    for name, t, shape in (("bias", bias, (n,)), ("residual", residual, (m, n))):
        if t is not None and tuple(t.shape) != shape:
            raise ArgumentError(_OP, name, f"must have shape {shape} (M = {m}, N = {n}), got "
                                f"{tuple(t.shape)}")
    if n % 2:
        raise ArgumentError(_OP, "b", f"N = {n} is odd: the epilogue stores c in 2-element vectors, so N "
                            "must be even")
    if n * k > INT32_MAX:
        raise ArgumentError(_OP, "b", f"has {n} x {k} elements; the kernel indexes b with 32-bit int "
                            "(N * K < 2^31)")
    operand_major("a", a, "M")
    operand_major("b", b if b_layout == "nk" else b.t(), "N")
    for name, t, align in (("a", a, 16), ("b", b, 16), ("bias", bias, 4), ("residual", residual, 4)):
        if t is None or t.numel() == 0:
            continue
        if name in ("bias", "residual") and not any(s == 1 or e == 1 for s, e in zip(t.stride(), t.shape)):
            raise ArgumentError(_OP, name, f"has strides {tuple(t.stride())}: no dimension of stride 1 (the "
                                "kernel reads rows or columns of contiguous elements); pass "
                                f"{name}.contiguous()")
        off = t.data_ptr() % align if _is_real(t) else t.storage_offset() * t.element_size() % align
        if off:
            raise ArgumentError(_OP, name, f"starts {off} bytes off {align}-byte alignment (a view with an "
                                f"element offset); pass {name}.clone() (.contiguous() keeps the offset)")
    return m, n, k


#: Elements of one 16-byte vector of the f16 / bf16 operands: the contiguous extent and the
#: leading stride of an operand read in place must be multiples of it (cp.async / TMA).
_VEC = 8


def operand_major(name: str, t: Any, outer: str) -> tuple[str, bool]:
    """How the kernel reads operand ``t``, given as its logical ``outer x K`` matrix (``a``:
    ``M x K``; ``b``: ``N x K``, i.e. ``b`` or ``b.t()`` by ``b_layout``): ``(major, copy)``
    with ``major`` ``"k"`` (stride 1 along K, the kernel's ``"mk"`` A / ``"nk"`` B) or ``"mn"``
    (stride 1 along M / N: ``"km"`` A / ``"kn"`` B), and ``copy`` whether the kernel reads a
    dense copy of that major-ness rather than ``t`` itself.

    ``t`` is read in place when one mode has stride 1 (or extent 1), its extent is a multiple
    of 8 and the other mode's stride is a multiple of 8 (16-byte rows) at least that extent
    (no overlap); the given major-ness first, then the other. Otherwise a dense copy of the
    major-ness whose contiguous extent is a multiple of 8 (K first); neither: raises
    ``ArgumentError`` naming ``name``. (16-byte aligned data pointers are checked apart.)"""
    (o, k), (so, sk) = t.shape, t.stride()
    if o == 0 or k == 0:                      # nothing to read (run_checked launches nothing)
        return "k", False

    def fits(major: str) -> bool:
        (ec, sc), (el, sl) = ((k, sk), (o, so)) if major == "k" else ((o, so), (k, sk))
        return (ec <= 1 or sc == 1) and ec % _VEC == 0 and (el <= 1 or (sl % _VEC == 0 and sl >= ec))

    first = "mn" if (k > 1 and sk != 1) and (o <= 1 or so == 1) else "k"
    for major in (first, "mn" if first == "k" else "k"):
        if fits(major):
            return major, False
    if o > 1 and k > 1 and so != 1 and sk != 1:
        raise ArgumentError(_OP, name, f"has strides {tuple(t.stride())} ({outer} x K = {o} x {k}): no "
                            "dimension of stride 1; the kernel reads rows or columns of contiguous elements: "
                            f"pass {name}.contiguous()")
    if k % _VEC == 0:
        return "k", True
    if o % _VEC == 0:
        return "mn", True
    raise ArgumentError(_OP, name, f"is {o} x {k} ({outer} x K): neither K = {k} nor {outer} = {o} is a "
                        "multiple of 8; the kernel's 16-byte vector / TMA copies read rows of 8-element "
                        "multiples along the contiguous dimension")


def _span(t: Any) -> int:
    """Elements from the first to the last element ``t`` addresses."""
    return 1 + sum((e - 1) * st for e, st in zip(t.shape, t.stride())) if t.numel() else 0


def _lead_dense(t: Any) -> Any:
    """A stored matrix of one row whose leading stride (torch lets a mode of extent 1 have any;
    the kernel takes it dense, ``leading_dims``, but sm_90a's TMA descriptors are made from the
    tensor's strides) is not one a multi-row view could have (a multiple of 8 at least the
    row's length) as the same row with the dense one; else ``t``."""
    if t.shape[0] == 1 and (t.stride(0) % _VEC or t.stride(0) < t.shape[1]):
        return t.as_strided(t.shape, (t.shape[1], 1))
    return t


def stored_operands(a: Any, b: Any, b_layout: str) -> tuple[str, str, Any, Any, bool]:
    """The operands as the kernel takes them, for arguments ``check_gemm`` accepted:
    ``(a_layout, kernel b_layout, a, b, copied)`` with ``a`` the stored ``M x K`` (``"mk"``)
    or ``K x M`` (``"km"``) matrix and ``b`` the stored ``N x K`` (``"nk"``) or ``K x N``
    (``"kn"``) one - views of the arguments (transposes, any leading stride), or dense copies
    where ``operand_major`` says so or the view would span 2^31 elements; ``copied``: whether
    either is a copy."""
    out: list[Any] = []
    copied = False
    for name, t, outer in (("a", a, "M"), ("b", b if b_layout == "nk" else b.t(), "N")):
        major, copy = operand_major(name, t, outer)
        stored = t if major == "k" else t.t()
        if not copy and _span(stored) > INT32_MAX and major == "mn" and t.shape[1] % _VEC == 0:
            major, copy = "k", True               # a K-major row slice spans less (rows_per_launch)
            stored = t
        if copy:
            stored = stored.contiguous()
            copied = True
        out += [major, _lead_dense(stored)]
    return ("mk" if out[0] == "k" else "km"), ("nk" if out[2] == "k" else "kn"), out[1], out[3], copied


def rows_per_launch(arch: str, config: GemmConfig, n: int, k: int) -> int:
    """The most rows of ``a`` one launch may take: the grid within CUDA's limits (sm_80 /
    sm_89: ``cdiv(M, BM)`` row tiles in ``grid.y`` <= 65,535; sm_90a: ``cdiv(M, BM) *
    cdiv(N, BN)`` tiles in ``grid.x`` < 2^31) and every row slice of ``a``, ``c`` and
    ``residual``, with one tile of slack, addressable with 32-bit indices."""
    bm = config.BM
    if arch in WARP_SPECIALIZED:
        tiles = GRID_LIMITS[0] // max(1, -(-n // config.BN))
    else:
        tiles = GRID_LIMITS[1]
    rows = tiles * bm
    rows = min(rows, INT32_MAX // max(k, n, 1) - bm)
    if rows >= bm:
        rows -= rows % bm
    return max(rows, 1)


def _by_rows(launch: Callable[[Any, Any, Any, int], None], m: int, rows: int, a: Any, c: Any,
             res: Any) -> None:
    """``launch(a rows, c rows, residual rows, number of rows)`` over slices of at most ``rows`` rows."""
    if m <= rows:
        launch(a, c, res, m)
        return
    for r0 in range(0, m, rows):
        r1 = min(m, r0 + rows)
        launch(a[r0:r1], c[r0:r1], res[r0:r1], r1 - r0)


def gemm_epilogue(has_bias: bool, has_residual: bool, activation: str, has_scale: bool) -> Any:
    """The epilogue ``act(scale * Y + bias) + residual`` of the product ``Y`` as fusion nodes:
    ``(nodes, outputs, inputs)``. ``nodes``: aten ``mul`` (scale), ``add`` (bias), the
    activation (``relu``, ``gelu`` exact, ``gelu_tanh``, ``silu``), ``add`` (residual), those
    present; one output, the last node. ``inputs``, in order: ``scale`` (an ``InputSpec``
    of a runtime scalar), then ``("bias", (True, False))`` (a ``1 x N`` row broadcast over
    the rows) and ``("residual", (False, False))`` (``M x N``) for those present."""
    from hexlayout.fusion.mechanism import InputSpec
    from hexlayout.fusion.spec import Node

    nodes: list[Any] = []
    inputs: list[Any] = []
    y: tuple = ("anchor",)

    def add(op: str, *args: tuple, kwargs: tuple = ()) -> None:
        nonlocal y
        nodes.append(Node(op, (y, *args), kwargs))
        y = ("node", len(nodes) - 1)

    if has_scale:
        inputs.append(InputSpec("scalar"))
        add("aten.mul.Tensor", ("input", len(inputs) - 1))
    if has_bias:
        inputs.append(("bias", (True, False)))
        add("aten.add.Tensor", ("input", len(inputs) - 1))
    if activation != "none":
        op, kw = _ACT_NODES[activation]
        add(op, kwargs=kw)
    if has_residual:
        inputs.append(("residual", (False, False)))
        add("aten.add.Tensor", ("input", len(inputs) - 1))
    return tuple(nodes), (y,), tuple(inputs)


def gemm_build(dtype: Any, b_layout: str, epilogue: tuple[bool, bool, str, bool], arch: str,
               config: GemmConfig, m: int, n: int, compile: bool = True, a_layout: str = "mk",
               ld: tuple[bool, bool] = (False, False)) -> Any:
    """The build of the GEMM kernel (stored operands ``a_layout`` / ``b_layout``, see
    ``stored_operands``; ``ld``: which take a free leading stride, ``leading_dims`` - dense
    by default) with ``epilogue`` = ``(has_bias, has_residual, activation,
    has_scale)`` fused into its store by ``hexlayout.fusion`` (memoized there); the build's
    parameters are ``a, b`` then those of ``gemm_fused(...)[1].sources``."""
    return gemm_fused(dtype, b_layout, epilogue, arch, config, m, n, compile, a_layout, ld)[0]


def stage_epilogue(n: int) -> bool:
    """Whether the GEMM of ``N = n`` columns stores its output through shared memory (sm_80 /
    sm_89: 16-byte global stores; sm_90a: stmatrix + TMA stores): when rows of ``c`` are
    16-byte aligned, ``N % 8 == 0`` (``c`` is allocated contiguous, and every row slice of a
    launch then starts 16-byte aligned too); else the epilogue stores from registers."""
    return n % 8 == 0


def gemm_fused(dtype: Any, b_layout: str, epilogue: tuple[bool, bool, str, bool], arch: str,
               config: GemmConfig, m: int, n: int, compile: bool = True,
               a_layout: str = "mk", ld: tuple[bool, bool] = (False, False)) -> tuple[Any, Any]:
    """``(build, fused program)`` of ``gemm_build``; the output is staged through shared
    memory when ``stage_epilogue(n)``."""
    from hexlayout.fusion.mechanism import InputSpec, TilePlan

    from .fused_build import gemm_fused_build

    nodes, outputs, raw = gemm_epilogue(*epilogue)
    dname = dtype.name if hasattr(dtype, "name") else str(dtype)
    inputs = tuple(x if isinstance(x, InputSpec) else InputSpec("tensor", dname, x[1]) for x in raw)
    plan = TilePlan("c", ((0, "a"), (1, "b")), (), nodes, outputs, (dname,), inputs)
    name = "gemm" + "".join(f"_{n.op.split('.')[1]}" for n in nodes)
    consts = {**config.consts(m, n), "STAGE_EPILOGUE": stage_epilogue(n)}
    return gemm_fused_build(arch, dtype, b_layout, consts, plan, name, anchor="hexlayout.gemm",
                            epilogue_ops=tuple(x.op for x in nodes), compile=compile, a_layout=a_layout,
                            ld=ld)


def _arg_order(prog: Any, epilogue: tuple[bool, bool, str, bool]) -> tuple[int, ...]:
    """For the fused program, the positions in ``(a, b, c, bias, residual, scale)`` of its
    parameters, in parameter order."""
    _, _, raw = gemm_epilogue(*epilogue)
    where = {"bias": 3, "residual": 4}
    roles = [5 if not isinstance(x, tuple) else where[x[0]] for x in raw]
    order = [0, 1]
    for src in prog.sources:
        order.append(2 if src[0] == "output" else roles[src[1]])
    return tuple(order)


_TORCH: Any = None


def _load_torch() -> Any:
    global _TORCH
    import torch

    _TORCH = torch
    return torch


def _fast_key(a: Any, b: Any, bias: Any, residual: Any, activation: str, scale: Any, b_layout: str, m: int,
              n: int, k: int) -> tuple:
    """The key of ``_FAST``: everything a prepared launch fixes but the data pointers (the
    strides of every tensor: they pick the kernel's stored layouts and its leading strides)."""
    return (a.dtype, a.device, b_layout, activation, bias is None, residual is None, scale is None, m, n, k,
            a.stride(), b.stride(), None if bias is None else bias.stride(),
            None if residual is None else residual.stride())


def gemm_cached(a: Any, b: Any, bias: Any = None, residual: Any = None, activation: str = "none",
                scale: float | None = None, b_layout: str = "nk") -> Any:
    """``gemm(a, b, bias, residual, activation, scale, b_layout)`` for a call like one made
    before - plain tensors whose shapes, strides, dtypes and devices and whose other arguments'
    values (``scale``: its kind) ``check_gemm`` accepted, with a prepared single launch
    (``_FAST``) under the current ``tuning_token`` - or ``None`` for any other call (nothing
    launched, nothing raised: the caller takes the usual path, ``check_gemm`` then
    ``run_checked``). One dictionary lookup (``_HOT``) stands for both the check's verdict and
    the config / launcher lookup; the data pointers' alignment is checked as ``check_gemm``
    checks it (a misaligned one: ``None``, so the check names it)."""
    if type(a) not in _PLAIN or type(b) not in _PLAIN:
        return None
    try:
        key = _verdict_key(a, b, bias, residual, activation, scale, b_layout)
        hot = _HOT.get(key)
    except TypeError:                        # an unhashable argument: the check names it
        return None
    if hot is None:
        hot = _warm(key, a, b, bias, residual, activation, scale, b_layout)
        if hot is None:
            return None
    aligns, m, n, entry = hot
    if aligns:
        ts = (a, b, bias, residual)
        for i, align in aligns:
            if ts[i].data_ptr() % align:
                return None
    if entry[4] != tuning_token():           # the persisted choice may have changed
        _HOT.pop(key, None)
        return None
    c = fresh_like(a, (m, n))
    entry[5](a, b, c, bias, residual, scale)
    return c


def _warm(key: tuple, a: Any, b: Any, bias: Any, residual: Any, activation: str, scale: Any,
          b_layout: str) -> Any:
    """``_HOT``'s entry for ``key`` from ``_VERDICTS`` and ``_FAST`` (stored), or ``None``."""
    verdict = _VERDICTS.get(key)
    if verdict is None:
        return None
    m, n, k = verdict[0]
    if not (m and n and k):
        return None
    entry = _FAST.get(_fast_key(a, b, bias, residual, activation, scale, b_layout, m, n, k))
    if entry is None:
        return None
    if len(_HOT) >= _FAST_LIMIT:
        _HOT.clear()
    hot = _HOT[key] = (verdict[1], m, n, entry)
    return hot


def _fast_launch(lau: Any, template: Any, order: tuple[int, ...], go: Callable[[Any], bool],
                 n: int, a_t: bool = False, b_t: bool = False) -> Callable[..., None]:
    """The launch of a cached call: ``launch(a, b, c, bias, residual, scale)`` with the
    arguments of a call whose key matched ``template``'s (they differ only in data pointers
    and scale). The pre-packed launch ``go`` reads only the tensors' data pointers (so ``bias``
    is given as it is: the ``1 x N`` view of it has the same pointer) and the scale; when it
    declines (a misaligned pointer, launch logs, the profiler), ``call_like`` checks the
    arguments as the template's shapes give them. ``a_t`` / ``b_t``: the kernel takes the
    transpose of ``a`` / ``b`` (a view: the same data pointer; see ``stored_operands``)."""
    pick = operator.itemgetter(*order)

    def launch(a: Any, b: Any, c: Any, bias: Any, residual: Any, scale: Any) -> None:
        if a_t:
            a = a.t()
        if b_t:
            b = b.t()
        res = c if residual is None else residual
        sc = 1.0 if scale is None else float(scale)
        if not go(pick((a, b, c, bias, res, sc))):
            row = None if bias is None else bias.reshape(1, n)
            lau.call_like(template, list(pick((a, b, c, row, res, sc))))

    return launch


def _config(key: str, arch: str, m: int, n: int, k: int, autotune: bool, timer: Any,
            a_layout: str = "mk") -> GemmConfig:
    """The persisted choice for ``key`` and the shape, else (``autotune``) the fastest config
    timed now, else the heuristic's; an M-major A (``"km"``) leaves out the 2-CTA cluster
    configs, which multicast K-major A tiles."""
    tuner = autotuner()
    hit = tuner.lookup(key, m, n, k)
    if hit is not None and hit.arch == arch and (a_layout == "mk" or hit.cluster == 1):
        return hit
    if autotune and timer is not None:
        space = [c for c in CONFIGS[arch] if a_layout == "mk" or c.cluster == 1]
        return tuner.tune(key, m, n, k, space, timer)
    return choose_config(arch, m, n, k)


def gemm(a: Any, b: Any, bias: Any = None, residual: Any = None, activation: str = "none",
         scale: float | None = None, b_layout: str = "nk", *, config: GemmConfig | None = None,
         autotune: bool = False) -> Any:
    """``act(scale * (a @ B) + bias) + residual`` (see the module docstring), ``B = b^T``
    (``b_layout="nk"``, ``b`` is ``N x K``) or ``b`` (``"kn"``, ``K x N``).

    Accepted strides: ``a`` and ``b`` either K-major or M / N-major (``a.t()``-style views are
    fine), each with any leading stride (slices of bigger tensors); read in place when the
    contiguous extent and the leading stride are multiples of 8 elements, else from a dense
    copy of the order that has them; an operand without a stride-1 dimension is refused
    (pass ``.contiguous()``). ``bias``: stride 1. ``residual``: either order, any leading
    stride (copied row-major unless it is row-major dense). The output: a new row-major
    ``M x N`` tensor.

    Inputs that require grad (grad mode on) go through ``torch.ops.hexlayout.gemm``, whose
    registered backward gives their gradients; with ``config`` or ``autotune`` (not part of
    the op) they are refused, naming the argument, rather than left without a gradient.
    A call like one made before takes ``gemm_cached``.
    """
    if _TORCH is None:
        require_torch("hexlayout.ops.gemm")
    if config is None and not autotune:
        torch = _TORCH or _load_torch()
        if not (torch.is_grad_enabled() and torch._C._any_requires_grad(a, b, bias, residual)):
            c = gemm_cached(a, b, bias, residual, activation, scale, b_layout)
            if c is not None:
                return c
    m, n, k = check_gemm(a, b, bias, residual, activation, scale, b_layout)
    if a.requires_grad or b.requires_grad or (bias is not None and bias.requires_grad) or \
            (residual is not None and residual.requires_grad):
        import torch

        if torch.is_grad_enabled():
            if config is None and not autotune:
                return torch.ops.hexlayout.gemm(a, b, bias, residual, activation, scale, b_layout)
            name = next(x for x, t in (("a", a), ("b", b), ("bias", bias), ("residual", residual))
                        if t is not None and t.requires_grad)
            raise ArgumentError(_OP, name, "requires grad, but gemm(config=..., autotune=...) has no "
                                "backward; call it without them (torch.ops.hexlayout.gemm), under "
                                f"torch.no_grad(), or pass {name}.detach()")
    return run_checked(a, b, bias, residual, activation, scale, b_layout, m, n, k, config, autotune)


def run_checked(a: Any, b: Any, bias: Any, residual: Any, activation: str, scale: float | None, b_layout: str,
                m: int, n: int, k: int, config: GemmConfig | None = None, autotune: bool = False) -> Any:
    """``gemm`` on arguments ``check_gemm`` accepted (it gave ``m, n, k``)."""
    torch = _TORCH or _load_torch()
    if config is None and not autotune and m and n and k:
        # the fast path of a cached call: one dictionary lookup to a prepared launch
        hit = _FAST.get(_fast_key(a, b, bias, residual, activation, scale, b_layout, m, n, k))
        if hit is not None and hit[4] == tuning_token():
            c = fresh_like(a, (m, n))
            hit[5](a, b, c, bias, residual, scale)
            return c

    ep = (bias is not None, residual is not None, activation, scale is not None)
    c = fresh_like(a, (m, n))
    if m == 0 or n == 0:
        return c
    if k == 0:
        return _epilogue_only(c.zero_(), bias, residual, activation, scale)
    a_layout, kb_layout, a_st, b_st, copied = stored_operands(a, b, b_layout)
    if config is not None and config.cluster > 1 and a_layout == "km":
        a_layout, a_st, copied = "mk", a.contiguous(), True     # clusters multicast K-major A tiles
    # the fused epilogue reads a row-major residual with rows of N: anything else is copied so
    res_dense = residual is None or (residual.stride(1) == 1 and (m == 1 or residual.stride(0) == n))
    res_arg = c if residual is None else residual if res_dense else residual.contiguous()
    from hexlayout.lang import bf16, f16

    layouts = kb_layout if a_layout == "mk" else f"km_{kb_layout}"
    call = _Call(
        m=m, n=n, k=k, ep=ep, c=c, a_layout=a_layout, kb_layout=kb_layout, a_st=a_st, b_st=b_st,
        a_log=a_st if a_layout == "mk" else a_st.t(),         # M x K: _by_rows slices its rows
        bias_arg=bias.reshape(1, n) if bias is not None else None,     # a row broadcast over the rows
        res_arg=res_arg, scale_arg=float(scale) if scale is not None else 1.0,
        dtype=bf16 if a.dtype == torch.bfloat16 else f16,
        key=f"gemm/{a.dtype}/{layouts}/{activation}/{int(ep[0])}{int(ep[1])}{int(ep[3])}",
        # rows of a (K-major) and of residual: the pitch row slices are addressed with
        pitch=max(k, a_st.stride(0) if a_layout == "mk" else 0, res_arg.stride(0) if m > 1 else 0),
    )
    if a.is_cuda:
        fast = None
        if config is None and not autotune and not copied and res_dense:
            fast = _fast_key(a, b, bias, residual, activation, scale, b_layout, m, n, k)
        _run_on_gpu(call, a, b_layout, config, autotune, fast, torch)
    else:
        _run_emulated(call, a, config)
    return c


class _Call(NamedTuple):
    """One checked ``gemm`` call: the sizes, the epilogue flags ``ep``, the output ``c``, the
    operands as the kernel reads them (``a_st`` / ``b_st`` stored, ``a_log`` M x K), the kernel
    arguments of the epilogue, the element type, the cache ``key`` and the rows' ``pitch``."""

    m: int
    n: int
    k: int
    ep: tuple[bool, bool, str, bool]
    c: Any
    a_layout: str
    kb_layout: str
    a_st: Any
    b_st: Any
    a_log: Any
    bias_arg: Any
    res_arg: Any
    scale_arg: float
    dtype: Any
    key: str
    pitch: int


def _run_on_gpu(call: _Call, a: Any, b_layout: str, config: GemmConfig | None, autotune: bool, fast: Any,
                torch: Any) -> None:
    """Launch the call's kernels row slice by row slice on the GPU (config chosen, looked up or
    autotuned); with ``fast`` (a cacheable call in one launch) prepare the cached fast path."""
    from hexlayout.runtime.launch import Launcher

    m, n, c, key = call.m, call.n, call.c, call.key
    token = tuning_token()
    arch = _ARCHS.get(a.device)
    if arch is None:
        arch = _ARCHS[a.device] = device_arch(tuple(torch.cuda.get_device_capability(a.device)))

    def launch(cfg: GemmConfig) -> Callable[[Any, Any, Any, int], None]:
        def one(a_: Any, c_: Any, res_: Any, rows: int) -> None:
            a_arg = a_ if call.a_layout == "mk" else a_.t()
            ld = leading_dims(a_arg, call.b_st)          # (a row slice of an M-major a is strided)
            lkey = (key, arch, cfg, cfg.consts(rows, n).get("GRID", 0), stage_epilogue(n), ld)
            hit = _LAUNCHERS.get(lkey)
            if hit is None:
                bld, prog = gemm_fused(call.dtype, call.kb_layout, call.ep, arch, cfg, rows, n,
                                       a_layout=call.a_layout, ld=ld)
                hit = _LAUNCHERS[lkey] = (Launcher(bld), _arg_order(prog, call.ep))
            vals = (a_arg, call.b_st, c_, call.bias_arg, res_, call.scale_arg)
            hit[0](*[vals[i] for i in hit[1]])
        return one

    def timer(cfg: GemmConfig) -> float:  # pragma: no cover - GPU only
        one, rows = launch(cfg), rows_per_launch(arch, cfg, n, call.pitch)
        for _ in range(3):
            _by_rows(one, m, rows, call.a_log, c, call.res_arg)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(10):
            _by_rows(one, m, rows, call.a_log, c, call.res_arg)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 10 / 1e3

    cfg = config or _config(key, arch, m, n, call.k, autotune, timer, call.a_layout)
    rows = rows_per_launch(arch, cfg, n, call.pitch)
    _by_rows(launch(cfg), m, rows, call.a_log, c, call.res_arg)
    if fast is not None and m <= rows:
        if len(_FAST) >= _FAST_LIMIT:
            _FAST.clear()
        lau, order = _LAUNCHERS[(key, arch, cfg, cfg.consts(m, n).get("GRID", 0), stage_epilogue(n),
                                 leading_dims(call.a_st, call.b_st))]
        vals = (call.a_st, call.b_st, c, call.bias_arg, call.res_arg, call.scale_arg)
        # check_gemm fixed dtypes and device, and ``fast`` the shapes and strides:
        # later calls with this key differ from this one only in data pointers and scale
        # (the template keeps no tensor alive: only their pointers, shapes and strides)
        template = replace(lau.bind(*[vals[i] for i in order]), tensors={})
        go = lau.prepared(template)
        _FAST[fast] = (lau, template, order, go, token,
                       _fast_launch(lau, template, order, go, n, call.a_layout == "km",
                                    call.kb_layout != b_layout))


def _run_emulated(call: _Call, a: Any, config: GemmConfig | None) -> None:
    """Run the call's kernels in the emulator (``HEXLAYOUT_EMULATE``; ``HEXLAYOUT_EMULATE_ARCH``)."""
    from hexlayout.runtime.torch_ops import EmulationDisabledError, emulation_enabled

    if not emulation_enabled():
        raise EmulationDisabledError(f"{_OP}: CPU tensors need HEXLAYOUT_EMULATE=1 (thread-level emulator, "
                                     "small sizes) or CUDA tensors on an sm_80 / sm_89 / sm_90a / sm_100a "
                                     "GPU")
    from hexlayout.runtime.emulate import emulate

    arch = os.environ.get("HEXLAYOUT_EMULATE_ARCH", "sm_80")
    if arch not in _FACTORY:
        raise ArgumentError(_OP, None, f"HEXLAYOUT_EMULATE_ARCH={arch!r}; supported: {', '.join(_FACTORY)}")
    cfg = config or choose_config(arch, call.m, call.n, call.k)
    a_layout, a_log = call.a_layout, call.a_log
    if cfg.cluster > 1 and a_layout == "km":
        a_layout, a_log = "mk", a.contiguous()          # clusters multicast K-major A tiles

    def emulate_rows(a_: Any, c_: Any, res_: Any, rows: int) -> None:
        a_arg = a_ if a_layout == "mk" else a_.t()
        bld, prog = gemm_fused(call.dtype, call.kb_layout, call.ep, arch, cfg, rows, call.n, compile=False,
                               a_layout=a_layout, ld=leading_dims(a_arg, call.b_st))
        vals = (a_arg, call.b_st, c_, call.bias_arg, res_, call.scale_arg)
        emulate(bld, *[vals[i] for i in _arg_order(prog, call.ep)])

    rows = rows_per_launch(arch, cfg, call.n, call.pitch)
    _by_rows(emulate_rows, call.m, rows, a_log, call.c, call.res_arg)


def _epilogue_only(c: Any, bias: Any, residual: Any, activation: str, scale: float | None) -> Any:
    """K = 0: the product is zero; the epilogue in torch (no kernel launch), with torch's IEEE
    semantics: ``scale * 0`` is NaN for a NaN or infinite ``scale``."""
    import torch

    y = c.float()
    if scale is not None:
        y = y * float(scale)
    if bias is not None:
        y = y + bias.float()
    if activation == "relu":
        y = torch.relu(y)
    elif activation in GELU_APPROXIMATE:
        y = torch.nn.functional.gelu(y, approximate=GELU_APPROXIMATE[activation])
    elif activation == "silu":
        y = torch.nn.functional.silu(y)
    if residual is not None:
        y = y + residual.float()
    return y.to(c.dtype)
