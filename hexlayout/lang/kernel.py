"""``@hl.kernel``: a kernel definition, traced into a ``TileKernel``.

    @hl.kernel(threads=128)
    def gemm(a: hl.f16["M", "K"], b: hl.f16["N", "K"], c: hl.f16["M", "N"], *, BM: int = 128):
        ...

Parameters (before ``*``) are global tensors annotated with ``hl.Tensor`` types
(``hl.f16["M", "K"]``) or scalars annotated with an element type (``n: hl.i32``; a
scalar named like a symbolic size *is* that size). Keyword-only parameters are
compile-time constants (a default, or a value given to ``trace``).

``gemm.trace(**consts)`` runs the function once on proxies (``GlobalTensor`` for
tensors, ``Var`` for scalars) and returns the ``TileKernel``; results are cached per
constants. ``gemm.trace(a=hl.f16[4096, 4096])`` also specializes an argument's type
(static sizes or strides). ``threads`` may be a function of the constants
(``threads=lambda c: 32 * c["WARPS"]``).

Errors: ``KernelError`` for mistakes in the use of ``hexlayout.lang`` (including a
Python ``if``/``and``/``while`` on a symbolic expression); other Python exceptions raised
by the function propagate unchanged.
"""

from __future__ import annotations

import inspect
import numbers
from collections.abc import Callable
from typing import Any

from hexlayout.arch.dtypes import DType
from hexlayout.ir.expr import Var
from hexlayout.ir.padding import PaddingError, annotate_padding
from hexlayout.ir.tile import GlobalParam, LaunchConfig, ScalarParam, SourceLoc, TileKernel

from . import source
from .context import TraceContext
from .dtypes import canonical
from .errors import KernelError
from .packed_global import HELD_AS, PackedGlobalTensor, packed_param
from .spec import Tensor, resolve_dim
from .tensor import GlobalTensor

__all__ = ["kernel", "Kernel"]


def _constant_type_problem(value: Any, annotation: Any) -> str | None:
    """What a constant annotated ``annotation`` must be when ``value`` does not fit it
    (``None`` when it fits or the annotation is not one of int, float, bool, str, DType)."""
    if annotation is bool:
        return None if isinstance(value, bool) else "a bool (true or false)"
    if annotation is int:
        return None if isinstance(value, numbers.Integral) and not isinstance(value, bool) else "an int"
    if annotation is float:
        return None if isinstance(value, numbers.Real) and not isinstance(value, bool) else "a number"
    if annotation is str:
        return None if isinstance(value, str) else "a str"
    if annotation is DType:
        return None if isinstance(value, DType) else "an element type (e.g. f16)"
    return None


class Kernel:
    """A kernel definition made by ``@hl.kernel``: the function, its launch shape and its traces.

    Parameters before ``*`` are global tensors (annotated ``hl.f16["M", "K"]``) or scalars
    (annotated with an element type: ``n: hl.i32``; a scalar named like a symbolic size
    *is* that size); keyword-only parameters are compile-time constants. ``trace``
    runs the function on proxies and returns the tile IR; the runtime compiles traces.
    Attributes: ``fn``, ``name``, ``threads``, ``cluster``, ``loc`` (the ``def`` line).

    Example:
        >>> @hl.kernel(threads=128)
        ... def copy_rows(x: hl.f32["M", "N"], y: hl.f32["M", "N"], *, BM: int = 64):
        ...     t = hl.register(hl.f32, (BM, 32))
        ...     hl.copy(x.tile((BM, 32), (0, 0)), t)
        ...     hl.copy(t, y.tile((BM, 32), (0, 0)))
        >>> copy_rows.name, copy_rows.trace(BM=32).consts
        ('copy_rows', {'BM': 32})
    """

    def __init__(self, fn: Callable[..., Any], threads: int | Callable[[dict[str, Any]], int],
                 cluster: tuple[int, ...] | Callable[[dict[str, Any]], tuple[int, ...] | None] | None = None,
                 name: str | None = None,
                 min_blocks: int | Callable[[dict[str, Any]], int | None] | None = None) -> None:
        self.fn = fn
        self.name = name or fn.__name__
        self.threads = threads
        self.min_blocks = min_blocks
        self.cluster = cluster if cluster is None or callable(cluster) else tuple(cluster)
        self.__doc__ = fn.__doc__
        self.__wrapped__ = fn
        code = fn.__code__
        line = code.co_firstlineno
        if source.loc_of_frame_line(code.co_filename, line).startswith("@"):
            for k in range(line, line + 20):  # skip decorators: point at the `def` line
                if source.loc_of_frame_line(code.co_filename, k).startswith(("def ", "async def ")):
                    line = k
                    break
        text = source.loc_of_frame_line(code.co_filename, line)
        self.loc = SourceLoc(code.co_filename, line, code.co_name, text)
        self._cache: dict[Any, TileKernel] = {}
        self._params, self._consts = self._signature()
        ann = self._annotations()
        self._const_types = {k: ann.get(k) for k in self._consts}

    # --- signature ------------------------------------------------------------------------
    def _error(self, detail: str) -> KernelError:
        return KernelError(self.name, "kernel", self.loc, detail)

    def _annotations(self) -> dict[str, Any]:
        try:
            return inspect.get_annotations(self.fn, eval_str=True)
        except Exception:  # noqa: BLE001 - fall back to evaluating with the closure too
            raw = inspect.get_annotations(self.fn)
            env = dict(self.fn.__globals__)
            if self.fn.__closure__:
                env.update(zip(self.fn.__code__.co_freevars, (c.cell_contents for c in self.fn.__closure__)))
            out = {}
            for k, v in raw.items():
                try:
                    out[k] = eval(v, env) if isinstance(v, str) else v  # noqa: S307 - the author's own code
                except Exception as e:  # noqa: BLE001
                    raise self._error(f"cannot evaluate the annotation of {k}: {v!r} ({e})") from None
            return out

    def _signature(self) -> tuple[list[tuple[str, Any]], dict[str, inspect.Parameter]]:
        sig = inspect.signature(self.fn)
        ann = self._annotations()
        params: list[tuple[str, Any]] = []
        consts: dict[str, inspect.Parameter] = {}
        for p in sig.parameters.values():
            if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
                raise self._error(f"*{p.name} / **{p.name} parameters are not supported")
            if p.kind == p.KEYWORD_ONLY:
                consts[p.name] = p
                continue
            a = ann.get(p.name)
            if isinstance(a, Tensor) or isinstance(a, DType):
                params.append((p.name, a))
            else:
                raise self._error(f"parameter {p.name} needs a tensor type (hl.f16['M', 'K']) or a scalar "
                                  "type "
                                  f"(hl.i32) annotation; compile-time constants go after `*`")
        return params, consts

    # --- tracing --------------------------------------------------------------------------
    def trace(self, **kwargs: Any) -> TileKernel:
        """Trace the kernel for the given constants and argument types; the ``TileKernel``.

        Runs the function once with a ``GlobalTensor`` per tensor argument and a ``Var`` per
        scalar, recording every ``hl`` operation (with its source line) into the tile IR.
        Constants not given take their defaults. An argument name given a tensor type
        specializes that argument (static sizes or strides: ``a=hl.f16[4096, 4096]``).
        Results are cached per (constants, types).

        Args:
            **kwargs (Any): compile-time constants by name, and tensor types for arguments.

        Returns:
            TileKernel: the traced kernel (``print`` shows it).

        Raises:
            KernelError: an unknown constant; a constant without default not given; an
                invalid ``threads``; an invalid argument type; any misuse of ``hl`` in the
                body (naming the line), including a Python ``if`` / ``while`` on a symbolic
                value or a runtime loop left by ``break``.
            Exception: other exceptions raised by the function propagate unchanged.

        Example:
            >>> @hl.kernel(threads=128)
            ... def fill_tile(y: hl.f32["M", "N"], *, V: float = 1.0):
            ...     hl.copy(hl.full((64, 64), V), y.tile((64, 64), (0, 0)))
            >>> tk = fill_tile.trace(V=2.0, y=hl.f32[256, 256])
            >>> tk.params[0].shape, tk.consts
            ((256, 256), {'V': 2.0})
        """
        specs = {k: v for k, v in kwargs.items() if k in dict(self._params)}
        consts = {k: v for k, v in kwargs.items() if k not in specs}
        unknown = [k for k in consts if k not in self._consts]
        if unknown:
            raise self._error(f"unknown constant(s) {', '.join(unknown)}; constants: "
                              f"{', '.join(self._consts) or 'none'}")
        for name, value in consts.items():
            expected = _constant_type_problem(value, self._const_types.get(name))
            if expected:
                raise self._error(f"the constant {name} must be {expected}, not {value!r} "
                                  f"({type(value).__name__})")
        values: dict[str, Any] = {}
        for name, p in self._consts.items():
            if name in consts:
                values[name] = consts[name]
            elif p.default is not inspect.Parameter.empty:
                values[name] = p.default
            else:
                raise self._error(f"the constant {name} has no default; pass it: .trace({name}=...)")
        try:
            key = (tuple(sorted(values.items())), tuple(sorted(specs.items(), key=lambda kv: kv[0])))
            hash(key)
        except TypeError:
            key = None
        if key is not None and key in self._cache:
            return self._cache[key]
        tk = self._trace(values, specs)
        if key is not None:
            self._cache[key] = tk
        return tk

    def _threads(self, consts: dict[str, Any]) -> int:
        t = self.threads(consts) if callable(self.threads) else self.threads
        if not isinstance(t, int) or isinstance(t, bool) or t <= 0 or t % 32 or t > 1024:
            raise self._error(f"threads={t!r} must be a positive multiple of 32, at most 1024")
        return t

    def _min_blocks(self, consts: dict[str, Any]) -> int | None:
        b = self.min_blocks(consts) if callable(self.min_blocks) else self.min_blocks
        if b is not None and (not isinstance(b, int) or isinstance(b, bool) or not 1 <= b <= 32):
            raise self._error(f"min_blocks={b!r} must be None or a block count from 1 to 32")
        return b

    def _cluster(self, consts: dict[str, Any]) -> tuple[int, ...] | None:
        c = self.cluster(consts) if callable(self.cluster) else self.cluster
        if c is None:
            return None
        c = tuple(c)
        n = 1
        for d in c:
            if not isinstance(d, int) or isinstance(d, bool) or d <= 0:
                n = 0
                break
            n *= d
        if not 1 <= len(c) <= 3 or not 1 <= n <= 8:
            raise self._error(f"cluster={c!r} must be 1 to 3 positive extents of at most 8 blocks in all")
        return c

    def _trace(self, consts: dict[str, Any], specs: dict[str, Any]) -> TileKernel:
        threads = self._threads(consts)
        cluster = self._cluster(consts)
        ctx = TraceContext(self.name, self.fn.__code__, threads, cluster)
        sizes: dict[str, Var] = {}
        scalar_params: dict[str, ScalarParam] = {}
        # scalars first, so that a size named like a scalar is that scalar
        for name, ann in self._params:
            ann = specs.get(name, ann)
            if isinstance(ann, DType) and not isinstance(ann, Tensor):
                var = Var(name, None, None, kind="scalar")
                ctx.reserve_var_name(name)
                sizes[name] = var
                scalar_params[name] = ScalarParam(name, canonical(ann), var)
        params: list[GlobalParam | ScalarParam] = []
        args: list[Any] = []
        for name, ann in self._params:
            ann = specs.get(name, ann)
            if name in scalar_params:
                params.append(scalar_params[name])
                args.append(scalar_params[name].var)
                continue
            if not isinstance(ann, Tensor):
                raise self._error(f"argument {name}: {ann!r} is not a tensor type")
            try:
                shape = tuple(resolve_dim(s, sizes) for s in ann.shape)
                if ann.stride is None:
                    stride_l: list[Any] = []
                    acc: Any = 1
                    for s in reversed(shape):
                        stride_l.append(acc)
                        acc = acc * s
                    stride = tuple(reversed(stride_l))
                else:
                    stride = tuple(resolve_dim(s, sizes) for s in ann.stride)
                dt = canonical(ann.dtype)
                if dt.name in HELD_AS:     # u4 / s4: the kernel's argument is the packed bytes
                    gp, elems = packed_param(name, dt, shape, tuple(ann.shape), ann.stride, ann.align_bytes,
                                             sizes)
                    gp.offline = 4 if ann.offline else 0
                    params.append(gp)
                    args.append(PackedGlobalTensor(gp, ctx, dt, elems))
                    continue
            except ValueError as e:
                raise self._error(f"argument {name}: {e}") from None
            gp = GlobalParam(name, dt, shape, stride, ann.align_bytes, offline=dt.bits if ann.offline else 0)
            params.append(gp)
            args.append(GlobalTensor(gp, ctx))
        for v in sizes.values():
            ctx.reserve_var_name(v.name)
        with ctx:
            try:
                self.fn(*args, **consts)
            except TypeError as e:
                if "has no Python truth value" in str(e):
                    raise self._user_error(e, "bool", f"{e}. Python `if`, `and`, `or`, `not` and `while` "
                                           "need values known at trace time") from e
                if "is not a Python integer" in str(e) and str(e).startswith("the symbolic expression"):
                    err = self._user_error(e, "range", str(e))
                    if err.loc is not None and "range(" not in err.loc.code:
                        err = KernelError(self.name, "int", err.loc, str(e))
                    raise err from e
                if str(e).startswith("Tile(%") and "is not an integer expression" in str(e):
                    raise self._user_error(e, "expression", f"{e}: a tile operand must come first when the "
                                           "other is an Expr (write `tile + expr`, `tile > expr`)") from e
                raise
            if ctx.broken_loop is not None:
                ctx.check_open("range", None)
            if len(ctx.blocks) != 1:
                raise KernelError(self.name, "range", None, "a runtime loop or branch was not closed")
        launch = LaunchConfig(ctx.grid if ctx.grid is not None else (1,), threads, cluster,
                              ctx.block_index, ctx.thread_var, self._min_blocks(consts))
        if ctx.grid is None:
            launch.block_index = (Var("blockIdx.x", 0, 1, kind="block"),)
        tk = TileKernel(self.name, params, launch, ctx.body, self.loc, dict(consts), list(ctx.mbarriers))
        try:
            annotate_padding(tk)       # ragged views' padding never reaches a reduction
        except PaddingError as e:
            raise KernelError(e.kernel, e.op, e.loc, e.detail) from None
        return tk

    def _user_error(self, e: TypeError, op: str, detail: str) -> KernelError:
        """A ``KernelError`` at the innermost kernel line of ``e``'s traceback."""
        loc = None
        tb = e.__traceback__
        while tb is not None:
            code = tb.tb_frame.f_code
            if code is self.fn.__code__:
                loc = SourceLoc(code.co_filename, tb.tb_lineno, code.co_name,
                                source.loc_of_frame_line(code.co_filename, tb.tb_lineno))
            tb = tb.tb_next
        return KernelError(self.name, op, loc, detail)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Refuse a direct call: a kernel is a definition, not a Python function.

        Args:
            *args (Any): ignored.
            **kwargs (Any): ignored.

        Returns:
            Any: never returns.

        Raises:
            TypeError: always; trace it with ``.trace(...)`` and compile it with the runtime.

        Example:
            >>> @hl.kernel
            ... def noop():
            ...     pass
            >>> noop()
            Traceback (most recent call last):
            ...
            TypeError: kernel noop is a definition: trace it with noop.trace(...) ...runtime
        """
        raise TypeError(f"kernel {self.name} is a definition: trace it with {self.name}.trace(...) and "
                        "compile "
                        "it with hexlayout's runtime")

    def __repr__(self) -> str:
        return f"<hl.kernel {self.name} at {self.loc.format()}>"


def kernel(fn: Callable[..., Any] | None = None, *, threads: int | Callable[[dict[str, Any]], int] = 128,
           cluster: tuple[int, ...] | Callable[[dict[str, Any]], tuple[int, ...] | None] | None = None,
           name: str | None = None,
           min_blocks: int | Callable[[dict[str, Any]], int | None] | None = None) -> Any:
    """Decorator that makes a Python function a kernel definition (a ``Kernel``).

    ``@hl.kernel(threads=128)`` or bare ``@hl.kernel`` (128 threads). The function states
    the dataflow of one thread block: parameters before ``*`` are global tensors
    (``a: hl.f16["M", "K"]``; see ``hl.Tensor``) or scalars (``n: hl.i32``),
    keyword-only parameters are compile-time constants. Nothing runs at decoration
    time except reading the signature; ``.trace(**consts)`` builds the tile IR.

    Args:
        fn (Callable | None): the function (when used without parentheses).
        threads (int | Callable[[dict], int]): threads per block, a positive multiple of
            32 up to 1024, or a function of the constants (``lambda c: 32 * c["WARPS"]``).
        cluster (tuple[int, ...] | Callable[[dict], tuple | None] | None): the thread-block
            cluster shape (sm_90a; at most 8 blocks), a function of the constants giving it
            (``lambda c: (c["CLUSTER"], 1, 1) if c["CLUSTER"] > 1 else None``), or ``None``.
        name (str | None): the kernel's name (default: the function's name).
        min_blocks (int | Callable[[dict], int | None] | None): blocks that must fit on one
            SM at once (CUDA's ``__launch_bounds__(threads, min_blocks)``): registers per
            thread are capped at ``65536 / (threads * min_blocks)``. ``None`` (default) lets
            the compiler choose (a build that spills is compiled again with 1, and the one
            spilling less is kept).

    Returns:
        Kernel | Callable[[Callable], Kernel]: the ``Kernel``, or a decorator making one.

    Raises:
        KernelError: a ``*args`` / ``**kwargs`` parameter; a positional parameter
            without a tensor or scalar annotation; an annotation that does not evaluate.

    Example:
        >>> @hl.kernel(threads=lambda c: 32 * c["WARPS"])
        ... def scale(x: hl.f32["M", "N"], *, WARPS: int = 4):
        ...     t = hl.register(hl.f32, (64, 64))
        ...     hl.copy(x.tile((64, 64), (0, 0)), t)
        ...     t *= 2.0
        ...     hl.copy(t, x.tile((64, 64), (0, 0)))
        >>> scale.trace(WARPS=8).launch.threads
        256
    """
    if fn is not None:
        return Kernel(fn, threads, cluster, name, min_blocks)

    def wrap(f: Callable[..., Any]) -> Kernel:
        return Kernel(f, threads, cluster, name, min_blocks)

    return wrap



