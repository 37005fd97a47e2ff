"""hexlayout.lang: the kernel language. ``import hexlayout.lang as hl``.

A kernel states the dataflow of tiles between global, shared and register memory, the
pipelining and the mapping of tasks to blocks; layouts (``hl.auto``) and instructions
are left to synthesis. Tracing a kernel builds the tile IR (``hexlayout.ir.tile``)::

    import hexlayout.lang as hl
    from hexlayout.lang import f16, f32

    @hl.kernel(threads=128)
    def gemm(a: f16["M", "K"], b: f16["N", "K"], c: f16["M", "N"], *, BM: int = 128, BN: int = 128,
             BK: int = 32):
        M, K = a.shape
        N = b.shape[0]
        pid_m, pid_n = hl.grid(hl.spatial(hl.cdiv(M, BM), hl.cdiv(N, BN)))
        acc = hl.zeros((BM, BN), f32)
        for k in hl.range(hl.cdiv(K, BK)):
            ra = hl.register(f16, (BM, BK))
            rb = hl.register(f16, (BN, BK))
            hl.copy(a.tile((BM, BK), (pid_m * BM, k * BK)), ra)
            hl.copy(b.tile((BN, BK), (pid_n * BN, k * BK)), rb)
            hl.mma(ra, rb, acc)
        hl.copy(hl.cast(acc, f16), c.tile((BM, BN), (pid_m * BM, pid_n * BN)))

    tk = gemm.trace(BK=64)      # a hexlayout.ir.tile.TileKernel; print(tk) shows it

API (each name's docstring states its semantics, arguments, errors and an example):

- kernels (``kernel``): ``@hl.kernel(threads=, cluster=)``, ``.trace(**consts)``; argument
  types ``hl.f16["M", "K"]`` (or ``M, K = hl.dims("M K")``; ``hl.f16[M, K]``, which linters
  accept), ``.strides(...)``, ``hl.Tensor(dtype, shape, stride)``; ``hl.offline(hl.u4[R, K])``
  (``offline``: a weight whose tile storage order synthesis chooses with the register fragment
  it feeds; ``build.offline_layouts``);
  element types ``f16 bf16 f32 f64 tf32 e4m3 e5m2 e2m1 ue4m3 i4 u4 i8 u8 i32 u32 i64 b16 bool_``
  (``e2m1``: OCP FP4, packed two per byte in global memory like ``u4``; cast to f16 / bf16;
  ``ue4m3``: NVFP4's block scale factors, only copied and given to ``mma(scale_a=, scale_b=)``).
- launch (``launch``): ``grid``, ``spatial``, ``repeat``, ``cdiv``, ``thread_index``,
  ``warp_index``, ``lane_index``, ``warp_group_index``, ``cluster_rank``.
- tiles (``memory``, ``views``, ``tensor``, ``indirect``): ``view`` (global windows with ragged-edge
  extents, gathered rows), ``load`` and ``a[i, j]`` (scalars from global memory), ``a[idx, :]``
  (gathers through index tiles), ``shared``, ``register``, ``auto`` (layout hints); slicing
  ``x[:, :, s]``, ``x.tile(shape, origin)``, ``x.T``, ``x.permute``.
- operations (``ops``, ``math``, ``atomics``): ``copy``, ``atomic_add``, ``mma``, ``cast``, ``fill``,
  ``full``, ``zeros``, ``reduce`` / ``sum`` / ``max_reduce`` / ``min_reduce``, ``scan``, ``rearrange``,
  ``iota``, ``assign``; elementwise operators and ``abs maximum minimum max min where equal
  not_equal logical_and logical_or logical_not``, ``gelu(x, approximate="none" | "tanh")`` (as
  torch's ``F.gelu``), and one unary function per ALU function
  with a language name (``exp exp2 exp2_approx log log2 rsqrt sqrt silu erf tanh softplus``, generated
  from ``hexlayout.ir.functions``).
- control (``control``): ``range``, ``if_``, ``else_``, ``warp_group``.
- synchronization (``sync``): ``syncthreads``, ``commit_group``, ``wait_group``,
  ``mbarrier``, ``mbarrier_init``, ``arrive``, ``wait``, ``wgmma_fence``,
  ``wgmma_commit``, ``wgmma_wait``, ``fence_proxy_async``, ``setmaxnreg``, ``cluster_sync``.
- errors: ``KernelError`` (a ``ValueError``) names kernel, operation, tensors and line.
- re-exports: ``Layout``, ``Swizzle``, ``ComposedLayout``, ``composition``,
  ``make_layout_tv`` (hexlayout.layout), ``TaskMapping``.

``hl.range``, ``hl.max``, ``hl.min``, ``hl.sum``, ``hl.abs`` shadow Python built-ins
inside the ``hl`` namespace only. Example kernels: ``hexlayout.lang.examples``.
"""

from hexlayout.ir.mapping import TaskMapping
from hexlayout.layout import ComposedLayout, Layout, Swizzle, composition, make_layout_tv

from .atomics import atomic_add
from .control import else_, if_, warp_group
from .control import range_ as range  # noqa: A004 - the language's runtime loop
from .dtypes import (
    b16,
    bf16,
    bool_,
    e2m1,
    e4m3,
    e5m2,
    f16,
    f32,
    f64,
    i4,
    i8,
    i32,
    i64,
    s8,
    s32,
    s64,
    tf32,
    u4,
    u8,
    u32,
    ue4m3,
)
from .errors import KernelError
from .indirect import load
from .kernel import Kernel, kernel
from .launch import (
    cdiv,
    cluster_rank,
    grid,
    lane_index,
    repeat,
    spatial,
    thread_index,
    warp_group_index,
    warp_index,
)
from .layouts import auto
from .math import FUNCTIONS as _FUNCTIONS
from .math import abs_ as abs  # noqa: A004
from .math import (
    equal,
    gelu,
    logical_and,
    logical_not,
    logical_or,
    maximum,
    minimum,
    not_equal,
    where,
)
from .math import maximum as max  # noqa: A004
from .math import minimum as min  # noqa: A004
from .memory import register, shared, view
from .offline import offline
from .ops import assign, cast, copy, fill, full, iota, max_reduce, min_reduce, mma, rearrange, reduce, zeros
from .ops import sum_ as sum  # noqa: A004
from .packed import bitcast, pack, unpack
from .pipeline import OnlineSoftmax, Ring, mma_stages, pipeline, wait_stage_free
from .regroup import concat, interleave, reshape
from .scan import scan
from .spec import Dim, Tensor, dims
from .sync import (
    arrive,
    cluster_sync,
    commit_group,
    fence_proxy_async,
    mbarrier,
    mbarrier_init,
    setmaxnreg,
    syncthreads,
    wait,
    wait_group,
    wgmma_commit,
    wgmma_fence,
    wgmma_wait,
)
from .tensor import GlobalTensor, Tile
from .views import getitem as _getitem  # noqa: F401 - the ops behind a[i], t.T, t.permute, t.tile

__all__ = [
    "pipeline", "mma_stages", "wait_stage_free", "Ring", "OnlineSoftmax",
    "kernel", "Kernel", "KernelError", "Tensor", "Dim", "dims", "offline", "GlobalTensor", "Tile",
    "TaskMapping",
    "f16", "bf16", "f32", "f64", "tf32", "e4m3", "e5m2", "e2m1", "ue4m3", "i4", "u4", "i8", "u8", "i32",
    "u32", "i64", "s8",
    "s32", "s64", "b16", "bool_",
    "grid", "spatial", "repeat", "cdiv", "thread_index", "warp_index", "lane_index", "warp_group_index",
    "cluster_rank",
    "view", "shared", "register", "load", "auto", "Layout", "Swizzle", "ComposedLayout", "composition",
    "make_layout_tv",
    "copy", "mma", "cast", "fill", "full", "zeros", "reduce", "sum", "max_reduce", "min_reduce", "rearrange",
    "scan", "iota", "assign", "atomic_add", "bitcast", "unpack", "pack", "reshape", "concat", "interleave",
    "abs", "maximum", "minimum", "max", "min",
    "where", "equal", "not_equal", "gelu", "logical_and", "logical_or", "logical_not",
    "range", "if_", "else_", "warp_group",
    "syncthreads", "commit_group", "wait_group", "mbarrier", "mbarrier_init", "arrive", "wait",
    "wgmma_fence", "wgmma_commit", "wgmma_wait", "fence_proxy_async", "setmaxnreg", "cluster_sync",
]

# hl.exp, hl.silu, ...: one unary function per ALU function with a language name
globals().update(_FUNCTIONS)
__all__ += list(_FUNCTIONS)


def __getattr__(name: str) -> object:
    """``hl.<name>`` of an ALU function defined after this package was imported."""
    from .math import function

    try:
        return function(name)
    except LookupError:
        raise AttributeError(f"module 'hexlayout.lang' has no attribute {name!r}") from None
