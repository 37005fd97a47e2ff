"""Property test: random invalid arguments thrown at every torch op hexlayout registers.

Each op has an entry in ``TABLE`` (a test asserts the table covers exactly the ops that
``import hexlayout.ops`` registers, every argument of each schema, and nothing else): a
valid argument set drawn at random, and mutations that each make one or more arguments
invalid (wrong dtypes, shapes, ranks, devices, non-contiguous or misaligned views,
non-tensors, bad strings, numbers given as strings, ...) and say which arguments the error
may blame. On top of one to three mutations a case gets harmless noise - a NaN or infinite
``scale``, inputs that require grad - which must not hide the error.

Every case runs eagerly (CPU tensors, ``HEXLAYOUT_EMULATE=1``) through ``torch.ops``, the
``Op`` object and the Python function, and under ``FakeTensorMode``; a smaller sample runs
under ``torch.compile(backend="eager")``. Each must raise a hexlayout error that is a
``ValueError`` or ``TypeError`` and names (``.arg``) a blamed argument - no crash, hang,
internal exception or result. Two reports come from torch itself and are accepted as such:
a value ``torch.ops`` cannot bind to the schema (a string for a ``Tensor`` or ``float``) is
torch's ``RuntimeError`` "... for argument 'x'", and under ``torch.compile`` dynamo reports
an error raised while tracing as a ``TorchRuntimeError`` quoting it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from types import SimpleNamespace
from typing import Any

import pytest

torch = pytest.importorskip("torch")
hypothesis = pytest.importorskip("hypothesis")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from hexlayout.errors import HexlayoutError  # noqa: E402
from hexlayout.runtime.torch_ops import defined_ops  # noqa: E402

# --- tensors described as data, built inside the mode under test ------------------------------------


@dataclass(frozen=True)
class T:
    """A tensor to build: shape, dtype, device and layout (``contiguous``, ``transposed``: a
    transposed matrix, ``strided``: every other element of a wider one, ``offset``: a
    contiguous view one element into its storage); ``rows``: a contiguous one's last dimension
    is the first ``shape[-1]`` of ``rows`` (prepare_wna16's scales: views of padded rows)."""

    shape: tuple[int, ...]
    dtype: Any
    device: str = "cpu"
    layout: str = "contiguous"
    requires_grad: bool = False
    rows: int = 0

    def build(self) -> Any:
        kw = {"dtype": self.dtype, "device": self.device}
        n = 1
        for s in self.shape:
            n *= s
        if self.layout == "offset":
            t = torch.zeros(n + 1, **kw)[1:].view(self.shape)
        elif self.layout == "transposed" and len(self.shape) == 2:
            t = torch.zeros(self.shape[::-1], **kw).t()
        elif self.layout in ("strided", "transposed") and self.shape:
            t = torch.zeros(*self.shape[:-1], 2 * self.shape[-1], **kw)[..., ::2]
        elif self.shape and self.rows > self.shape[-1]:
            t = torch.zeros(*self.shape[:-1], self.rows, **kw)[..., :self.shape[-1]]
        else:
            t = torch.zeros(self.shape, **kw)
        if self.requires_grad and self.dtype.is_floating_point:
            t.requires_grad_()
        return t


def _build(args: dict[str, Any]) -> dict[str, Any]:
    return {k: v.build() if isinstance(v, T) else v for k, v in args.items()}


@dataclass
class Case:
    args: dict[str, Any]
    blame: set[str] = field(default_factory=set)     # arguments the error may name
    kinds: set[str] = field(default_factory=set)     # arguments of a kind torch.ops cannot bind
    what: list[str] = field(default_factory=list)


F16, BF16 = torch.float16, torch.bfloat16
F32, F64 = torch.float32, torch.float64
I32, I64 = torch.int32, torch.int64


@dataclass
class OpTable:
    valid: Callable[[], Any]
    mutations: list[Callable[[Case, Any], bool]]
    exclusive: list[set[Callable[..., None]]]        # at most one mutation of each group per case
    noise: Callable[[Case, Any], None]
    covers: dict[str, list[Callable[..., None]]]     # schema argument -> mutations that break it
    module: Any = None                               # where the mutations are (by name)
    fallback: Callable[[Case, Any], bool] | None = None   # when no mutation applied


TABLE: dict[str, OpTable] = {}


def _ops() -> dict[str, Any]:
    """The ops ``import hexlayout.ops`` registered (test modules define toy ops of their own)."""
    return {op.name: op for op in defined_ops() if op.module.startswith("hexlayout.ops")}


# --- shared by the Mamba and MLA tables: mutations made from a description of the op -------------------

#: dtype rules: the dtypes a tensor may not have ("like:u": must be u's dtype)
BAD_DTYPES = {
    "half": [F32, F64, torch.int8],
    "float": [F64, torch.int8, torch.int32],
    "f32": [F16, BF16, F64, torch.int32],
    "floating": [torch.int8, torch.int32, torch.bool],
    "i32": [torch.int64, torch.int16, F16],
    "i64": [torch.int32, torch.int16, F16],
    "index": [torch.int16, F16, torch.uint8],
    "half_any": [F32, F64, torch.int8, torch.bool, torch.int32],
    "half_not_fp8": [F32, torch.int8, torch.int32, torch.float8_e4m3fn],
    "fp8": [F16, BF16, torch.float8_e5m2, torch.int8],
    "words": [torch.int32, torch.int8, F16],
}


@dataclass(frozen=True)
class Spec:
    """One op's tensors for the shared mutations: ``ranks`` (every rank a tensor has in some form
    of the op), ``dtypes`` (a ``BAD_DTYPES`` rule or ``like:<tensor>``), ``optional`` tensors
    (None is valid), ``refused`` layouts (the others are copied or read through strides),
    ``shape_blame`` (who the error may name when a tensor's size changes; default the tensor),
    ``free`` dims (sizes that may grow: cache rows, table widths; a negative one counts from the
    end), ``blame`` (per mutation kind, ``dtype`` or ``device``: who the error may name when that
    tensor is broken; default the tensor), ``required_if`` (optional tensors for which None is
    invalid when the predicate holds on the arguments)."""

    ranks: dict[str, tuple[int, ...]]
    dtypes: dict[str, str]
    optional: frozenset[str] = frozenset()
    refused: dict[str, tuple[str, ...]] = field(default_factory=dict)
    shape_blame: dict[str, set[str]] = field(default_factory=dict)
    free: dict[str, tuple[int, ...]] = field(default_factory=dict)
    blame: dict[str, dict[str, set[str]]] = field(default_factory=dict)
    required_if: dict[str, Callable[[dict[str, Any]], bool]] = field(default_factory=dict)

    @property
    def tensors(self) -> tuple[str, ...]:
        return tuple(self.ranks)

    def present(self, c: Case) -> list[str]:
        return [x for x in self.tensors if isinstance(c.args.get(x), T)]

    def blamed(self, kind: str, x: str) -> set[str]:
        """Who the error may name when mutation ``kind`` breaks tensor ``x``."""
        return self.blame.get(kind, {}).get(x, {x})

    def nullable(self, c: Case, x: str) -> bool:
        """None is a valid ``x`` for the arguments at hand."""
        return x in self.optional and not (x in self.required_if and self.required_if[x](c.args))


def _named(fn: Callable[..., Any], name: str) -> Callable[..., Any]:
    fn.__name__ = fn.__qualname__ = name
    return fn


def _bad_dtypes(spec: Spec, c: Case, x: str) -> list[Any]:
    rule = spec.dtypes[x]
    if not rule.startswith("like:"):
        return BAD_DTYPES[rule]
    ref = c.args.get(rule[5:])
    ok = ref.dtype if isinstance(ref, T) else None
    return [F64, torch.int8] + [d for d in (F16, BF16, F32) if ok is not None and d != ok]


def common_mutations(prefix: str, spec: Spec) -> list[Callable[[Case, Any], bool]]:
    """``<prefix>_dtype``, ``_rank``, ``_shape``, ``_layout``, ``_device``, ``_not_a_tensor`` for
    the op ``spec`` describes; ``_shape`` grows one dimension of a tensor by 8 while every tensor
    has its rank (no rank of another form: the sizes still disagree)."""

    def dtype(c: Case, draw: Any) -> bool:
        if not spec.present(c):
            return False
        x = draw(st.sampled_from(spec.present(c)))
        c.args[x] = replace(c.args[x], dtype=draw(st.sampled_from(_bad_dtypes(spec, c, x))))
        c.blame |= spec.blamed("dtype", x)
        return True

    def rank(c: Case, draw: Any) -> bool:
        if not spec.present(c):
            return False
        x = draw(st.sampled_from(spec.present(c)))
        r = draw(st.sampled_from([r for r in range(6) if r not in spec.ranks[x]]))
        c.args[x] = replace(c.args[x], shape=(2, 2, 2, 2, 16)[5 - r :])
        c.blame.add(x)
        return True

    def shape(c: Case, draw: Any) -> bool:
        present = spec.present(c)
        if any(len(c.args[x].shape) not in spec.ranks[x] for x in present):
            return False
        cands = [
            (x, d)
            for x in present
            for d, n in enumerate(c.args[x].shape)
            if d not in spec.free.get(x, ()) and d - len(c.args[x].shape) not in spec.free.get(x, ())
        ]
        if not cands:
            return False
        x, d = draw(st.sampled_from(cands))
        sh = list(c.args[x].shape)
        sh[d] += 8
        c.args[x] = replace(c.args[x], shape=tuple(sh))
        c.blame |= spec.shape_blame.get(x, {x})
        return True

    def layout(c: Case, draw: Any) -> bool:
        cands = [
            x for x in spec.present(c) if spec.refused.get(x) and c.args[x].shape and c.args[x].shape[-1] > 1
        ]
        if not cands:
            return False
        x = draw(st.sampled_from(cands))
        c.args[x] = replace(c.args[x], layout=draw(st.sampled_from(spec.refused[x])))
        c.blame.add(x)
        return True

    def device(c: Case, draw: Any) -> bool:
        present = spec.present(c)
        if not present:
            return False
        x = draw(st.sampled_from(present))
        c.args[x] = replace(c.args[x], device="meta")
        c.blame |= set(present) if x == spec.tensors[0] else spec.blamed("device", x)
        return True

    def not_a_tensor(c: Case, draw: Any) -> bool:
        x = draw(st.sampled_from(spec.tensors))
        c.args[x] = draw(st.sampled_from(["a", 1.5, [1.0, 2.0], 3] + ([] if spec.nullable(c, x) else [None])))
        c.blame.add(x)
        c.kinds.add(x)
        return True

    fns = {
        "dtype": dtype,
        "rank": rank,
        "shape": shape,
        "layout": layout,
        "device": device,
        "not_a_tensor": not_a_tensor,
    }
    return [_named(f, f"{prefix}_{k}") for k, f in fns.items()]


def scalar_mutations(prefix: str, values: dict[str, list[Any]], kinds: dict[str, list[Any]]
                     ) -> list[Callable[[Case, Any], bool]]:  # fmt: skip
    """``<prefix>_bad_value`` (a value of the right kind the op refuses) over the scalar arguments
    in ``values`` and ``<prefix>_bad_kind`` (a value of a kind the schema cannot bind) over those
    in ``kinds``; only those with arguments to break."""

    def bad_value(c: Case, draw: Any) -> bool:
        x = draw(st.sampled_from(sorted(values)))
        c.args[x] = draw(st.sampled_from(values[x]))
        c.blame.add(x)
        return True

    def bad_kind(c: Case, draw: Any) -> bool:
        x = draw(st.sampled_from(sorted(kinds)))
        c.args[x] = draw(st.sampled_from(kinds[x]))
        c.blame.add(x)
        c.kinds.add(x)
        return True

    return [_named(f, f"{prefix}_{f.__name__}") for f, d in ((bad_value, values), (bad_kind, kinds)) if d]


def grad_noise(floats: tuple[str, ...]) -> Callable[[Case, Any], None]:
    """Harmless on its own: the float tensors ``floats`` that require grad."""

    def noise(c: Case, draw: Any) -> None:
        for x in floats:
            if isinstance(c.args.get(x), T) and draw(st.booleans()):
                c.args[x] = replace(c.args[x], requires_grad=True)

    return noise


def spec_table(
    prefix: str,
    spec: Spec,
    valid: Callable[[], Any],
    floats: tuple[str, ...],
    values: dict[str, list[Any]] | None = None,
    kinds: dict[str, list[Any]] | None = None,
    *,
    extra: dict[Callable[[Case, Any], bool], tuple[str, ...]] | None = None,
    generic_shape: bool = True,
    exclusive: tuple[set[Callable[..., Any]], ...] = (),
    noise: Callable[[Case, Any], None] | None = None,
    fallback: Callable[[Case, Any], bool] | None = None,
) -> OpTable:
    """The ``OpTable`` of the op ``spec`` describes: the common mutations cover the tensors they
    can break (a shape change where a size is checked, a layout where one is refused), the scalar
    ones the scalar arguments in ``values`` / ``kinds``, and the op's own mutations in ``extra``
    the arguments each is listed with. ``generic_shape=False``: the op's own shape mutations in
    ``extra`` replace ``<prefix>_shape`` (sizes whose blame depends on the dimension);
    ``exclusive``: more groups of mutations at most one of which a case takes; ``noise`` replaces
    the grad noise over ``floats``; ``fallback`` (when no mutation applied) the first scalar one.
    The mutations are found by name in a namespace of their own (``invalid_case`` reads
    ``module``)."""
    values, kinds, extra = values or {}, kinds or {}, extra or {}
    common = common_mutations(prefix, spec)
    dtype, rank, shape, layout, device, not_a_tensor = common
    if not generic_shape:
        common.remove(shape)
    scalars = scalar_mutations(prefix, values, kinds)
    covers: dict[str, list[Callable[..., Any]]] = {}
    for x in spec.tensors:
        covers[x] = [m for m in (dtype, rank, shape, device, not_a_tensor) if m in common]
        covers[x] += [layout] * bool(spec.refused.get(x))
    for f in scalars:
        for x in values if f.__name__.endswith("bad_value") else kinds:
            covers.setdefault(x, []).append(f)
    for f, args in extra.items():
        for x in args:
            covers.setdefault(x, []).append(f)
    mutations = [*common, *scalars, *extra]
    return OpTable(
        valid=valid,
        mutations=mutations,
        exclusive=[{device}, {shape}, *exclusive],  # (two size changes may agree again)
        noise=noise or grad_noise(floats),
        covers=covers,
        module=SimpleNamespace(**{f.__name__: f for f in mutations}),
        fallback=fallback or (scalars[0] if scalars else not_a_tensor),
    )


# --- the GEMM ------------------------------------------------------------------------------------------

GEMM = Spec(
    ranks={"a": (2,), "b": (2,), "bias": (1,), "residual": (2,)},
    dtypes={"a": "half_any", "b": "like:a", "bias": "like:a", "residual": "like:a"},
    optional=frozenset({"bias", "residual"}),
    # an element offset breaks the 16-byte / 4-byte alignment, every other element leaves no
    # unit-stride dimension; a transposed matrix is legal (either stride order), and so is a
    # strided ``residual`` (copied)
    refused={"a": ("offset", "strided"), "b": ("offset", "strided"), "bias": ("offset", "strided"),
             "residual": ("offset",)},
)


@st.composite
def gemm_valid(draw: Any) -> dict[str, Any]:
    m = draw(st.integers(2, 5))
    n = 8 * draw(st.integers(1, 3))
    k = 8 * draw(st.integers(1, 3))
    dt = draw(st.sampled_from([F16, BF16]))
    b_layout = draw(st.sampled_from(["nk", "kn"]))
    args: dict[str, Any] = {"a": T((m, k), dt), "b": T((n, k) if b_layout == "nk" else (k, n), dt),
                            "bias": draw(st.sampled_from([None, T((n,), dt)])),
                            "residual": draw(st.sampled_from([None, T((m, n), dt)])),
                            "activation": draw(st.sampled_from(["none", "relu", "gelu", "silu"])),
                            "scale": draw(st.sampled_from([None, 0.5, -2.0])), "b_layout": b_layout}
    return args


def _matrices(c: Case) -> bool:
    """``a`` and ``b`` are matrices and ``b_layout`` is valid: shapes can be changed consistently."""
    return all(isinstance(c.args.get(x), T) and len(c.args[x].shape) == 2 for x in ("a", "b")) and \
        c.args["b_layout"] in ("nk", "kn")


def _mnk(c: Case) -> tuple[int, int, int]:
    m, k = c.args["a"].shape
    b = c.args["b"].shape
    return m, (b[0] if c.args["b_layout"] == "nk" else b[1]), k


def _dtype(c: Case) -> Any:
    a = c.args.get("a")
    return a.dtype if isinstance(a, T) else F16


def _set_mnk(c: Case, m: int, n: int, k: int) -> None:
    """Reshape every tensor consistently for (m, n, k)."""
    a = c.args
    a["a"] = replace(a["a"], shape=(m, k))
    a["b"] = replace(a["b"], shape=(n, k) if a["b_layout"] == "nk" else (k, n))
    if isinstance(a["bias"], T):
        a["bias"] = replace(a["bias"], shape=(n,))
    if isinstance(a["residual"], T):
        a["residual"] = replace(a["residual"], shape=(m, n))


# Each mutation makes the case invalid whatever was done before (or returns False when it does
# not apply) and adds the arguments the error may name to ``blame``.

def m_k_mismatch(c: Case, draw: Any) -> bool:
    if not _matrices(c):
        return False
    m, n, k = _mnk(c)
    k2 = k + 8 * draw(st.integers(1, 2))
    c.args["b"] = replace(c.args["b"], shape=(n, k2) if c.args["b_layout"] == "nk" else (k2, n))
    c.blame |= {"a", "b"}
    return True


def m_epilogue_shape(c: Case, draw: Any) -> bool:
    if not _matrices(c):
        return False
    m, n, _ = _mnk(c)
    x = draw(st.sampled_from(["bias", "residual"]))
    shapes = [(n + 2,), (n - 2,), (1,)] if x == "bias" else [(m + 1, n), (m, n + 2), (n, m + 3)]
    c.args[x] = T(draw(st.sampled_from(shapes)), _dtype(c))
    c.blame.add(x)
    return True


def m_k_not_multiple_of_8(c: Case, draw: Any) -> bool:
    """K and M (and N) not multiples of 8: no order of ``a`` (or ``b``) has 16-byte rows, in place
    or as a dense copy (a K that is not a multiple of 8 alone runs from an M- or N-major copy)."""
    if not _matrices(c):
        return False
    _set_mnk(c, draw(st.sampled_from([1, 3, 5])), draw(st.sampled_from([2, 6, 10])),
             draw(st.sampled_from([1, 4, 12, 36])))
    c.blame |= {"a", "b"}
    return True


def m_n_odd(c: Case, draw: Any) -> bool:
    if not _matrices(c):
        return False
    m, _, k = _mnk(c)
    _set_mnk(c, m, draw(st.sampled_from([1, 5, 9, 27])), k)
    c.blame.add("b")
    return True


def gemm_noise(c: Case, draw: Any) -> None:
    """Harmless on its own: a NaN or infinite scale, inputs that require grad."""
    if draw(st.booleans()) and "scale" not in c.blame:
        c.args["scale"] = draw(st.sampled_from([float("nan"), float("inf"), float("-inf"), 0.0]))
    grad_noise(GEMM.tensors)(c, draw)


TABLE["gemm"] = spec_table(
    "m", GEMM, gemm_valid, GEMM.tensors,
    values={"activation": ["RELU", "tanh", "", "none ", "gelu_erf", "GELU"],
            "b_layout": ["NK", "mk", "", "n k"]},
    # (not bytes: torch.ops binds b"relu" to a str argument as "relu")
    kinds={"activation": [None, 3, ["relu"], 0.5], "b_layout": [None, 1, ("nk",)],
           "scale": ["0.5", "nan", "abc", [0.5], "1e3"]},
    extra={m_k_mismatch: ("a", "b"), m_epilogue_shape: ("bias", "residual"), m_k_not_multiple_of_8: ("a",),
           m_n_odd: ("b",)},
    generic_shape=False, exclusive=({m_k_not_multiple_of_8, m_n_odd},), noise=gemm_noise)


# --- the paged KV cache: reshape_and_cache, paged_attention, attention_varlen ---------------------------

# key, value, q, k and v have no refused layout: the ops read them from a contiguous copy when
# 16-byte row vectors cannot read them in place (``hexlayout.ops.host.launch.rows_input``).
#: layouts a cache or an index tensor refuses (an index tensor: only "strided", an offset int32 /
#: int64 view stays aligned)
CACHE_LAYOUTS, INDEX_LAYOUTS = ("offset", "strided"), ("strided",)
KV_LAYOUT_VALUES = ["nhd", "", "HDN", "NHD "]


def _rc_cache_shape(layout: str, nb: int, bs: int, kvh: int, d: int) -> tuple[int, ...]:
    return (nb, bs, kvh, d) if layout == "NHD" else (nb, kvh, bs, d)


def _kv_cache_kind(draw: Any, dt: Any) -> tuple[Any, dict[str, Any]]:
    """The caches' dtype and the arguments that say it: the keys' dtype ("auto"), or an FP8 cache
    (uint8) with scales (none, numbers for the Python API are not tensors: one f32 element)."""
    if not draw(st.booleans()):
        return dt, {"kv_cache_dtype": "auto"}
    scale = st.sampled_from([None, T((1,), F32), T((), F32)])
    return torch.uint8, {"kv_cache_dtype": draw(st.sampled_from(["fp8", "fp8_e4m3", "fp8_e5m2"])),
                         "k_scale": draw(scale), "v_scale": draw(scale)}


def _consistent(spec: Spec, c: Case) -> bool:
    """Every tensor of ``spec`` present with its rank and, where the case has one, a valid
    ``kv_layout``: shapes can be rebuilt."""
    ranks = all(isinstance(c.args.get(x), T) and len(c.args[x].shape) in r for x, r in spec.ranks.items())
    return ranks and c.args.get("kv_layout", "NHD") in ("NHD", "HND")


def m_sinks(c: Case, draw: Any) -> bool:
    """``sinks`` that cannot be one f32 logit per query head: another dtype, length or rank,
    another device, or not a tensor."""
    q = c.args.get("q")
    h = q.shape[1] if isinstance(q, T) and len(q.shape) == 3 else 2
    bad = draw(st.sampled_from(["dtype", "shape", "device", "kind"]))
    if bad == "kind":
        c.args["sinks"] = draw(st.sampled_from(["a", 1.5, [1.0, 2.0]]))
        c.kinds.add("sinks")
    else:
        c.args["sinks"] = {"dtype": T((h,), draw(st.sampled_from([F16, BF16, F64]))),
                           "shape": T(draw(st.sampled_from([(h + 1,), (h, 1), ()])), F32),
                           "device": T((h,), F32, device="meta")}[bad]
    c.blame.add("sinks")
    return True


def m_kv_cache_dtype(c: Case, draw: Any) -> bool:
    """A ``kv_cache_dtype`` vLLM does not have, or an FP8 one for caches in the keys' dtype."""
    fp8 = c.args.get("kv_cache_dtype", "auto") != "auto"   # (then the caches are uint8)
    v = draw(st.sampled_from(["fp16", "FP8", "", "auto ", "fp8_e4m3fn", 3, ["auto"]]
                             + (["auto"] if fp8 else ["fp8", "fp8_e5m2"])))
    c.args["kv_cache_dtype"] = v
    c.blame.add("kv_cache_dtype")
    if not isinstance(v, str):
        c.kinds.add("kv_cache_dtype")
    elif v in ("auto", "fp8", "fp8_e5m2"):
        c.blame |= {"key_cache", "value_cache"}
    return True


def m_kv_scale(c: Case, draw: Any) -> bool:
    """A ``k_scale`` / ``v_scale`` that is not one f32 element on the caches' device."""
    x = draw(st.sampled_from(["k_scale", "v_scale"]))
    v = draw(st.sampled_from([T((2,), F32), T((1,), F16), T((), torch.int32), T((1,), F32, device="meta"),
                              "a", [1.0]]))
    c.args[x] = v
    c.blame.add(x)
    if not isinstance(v, T):
        c.kinds.add(x)
    return True


FP8_KV = {m_kv_cache_dtype: ("kv_cache_dtype",), m_kv_scale: ("k_scale", "v_scale")}


RC = Spec(
    ranks={"key": (3,), "value": (3,), "key_cache": (4,), "value_cache": (4,), "slot_mapping": (1,)},
    dtypes={"key": "half_any", "value": "like:key", "key_cache": "like:key", "value_cache": "like:key",
            "slot_mapping": "i64"},
    refused={"key_cache": CACHE_LAYOUTS, "value_cache": CACHE_LAYOUTS, "slot_mapping": INDEX_LAYOUTS},
)


@st.composite
def rc_valid(draw: Any) -> dict[str, Any]:
    t, kvh, nb = draw(st.integers(2, 4)), draw(st.integers(1, 2)), draw(st.integers(1, 3))
    d, bs = draw(st.sampled_from([64, 128])), draw(st.sampled_from([16, 32]))
    dt, layout = draw(st.sampled_from([F16, BF16])), draw(st.sampled_from(["NHD", "HND"]))
    cache, (cdt, fp8) = _rc_cache_shape(layout, nb, bs, kvh, d), _kv_cache_kind(draw, dt)
    return {"key": T((t, kvh, d), dt), "value": T((t, kvh, d), dt), "key_cache": T(cache, cdt),
            "value_cache": T(cache, cdt), "slot_mapping": T((t,), I64), "kv_layout": layout, **fp8}


def _rc_set(c: Case, bs: int | None = None, d: int | None = None) -> None:
    a = c.args
    t, kvh, d0 = a["key"].shape
    d = d0 if d is None else d
    nb = a["key_cache"].shape[0]
    if bs is None:
        bs = a["key_cache"].shape[1] if a["kv_layout"] == "NHD" else a["key_cache"].shape[2]
    for x in ("key", "value"):
        a[x] = replace(a[x], shape=(t, kvh, d))
    for x in ("key_cache", "value_cache"):
        a[x] = replace(a[x], shape=_rc_cache_shape(a["kv_layout"], nb, bs, kvh, d))


def rc_shape_mismatch(c: Case, draw: Any) -> bool:
    if not _consistent(RC, c):
        return False
    a = c.args
    t, kvh, d = a["key"].shape
    x = draw(st.sampled_from(["value", "slot_mapping", "value_cache", "key_kvh"]))
    if x == "value":
        a["value"] = replace(a["value"], shape=(t + 1, kvh, d))
        c.blame.add("value")
    elif x == "slot_mapping":
        a["slot_mapping"] = replace(a["slot_mapping"], shape=(t + draw(st.sampled_from([-1, 1, 3])),))
        c.blame.add("slot_mapping")
    elif x == "value_cache":
        s = list(a["value_cache"].shape)
        s[draw(st.integers(0, 3))] += 8
        a["value_cache"] = replace(a["value_cache"], shape=tuple(s))
        c.blame |= {"value_cache", "key_cache"}
    else:
        for y in ("key", "value"):
            a[y] = replace(a[y], shape=(t, kvh + 1, d))
        c.blame |= {"key", "value"}
    return True


def rc_block_or_head_size(c: Case, draw: Any) -> bool:
    if not _consistent(RC, c):
        return False
    if draw(st.booleans()):
        _rc_set(c, bs=draw(st.sampled_from([8, 12, 24, 256])))
    else:
        _rc_set(c, d=draw(st.sampled_from([264, 320, 12, 4])))
    c.blame |= {"key", "value", "key_cache", "value_cache"}
    return True


TABLE["reshape_and_cache"] = spec_table(
    "rc", RC, rc_valid, ("key", "value", "key_cache", "value_cache"),
    values={"kv_layout": [*KV_LAYOUT_VALUES, "NDH"]}, kinds={"kv_layout": [None, 1, ("NHD",), 0.5]},
    extra={rc_shape_mismatch: ("key", "value", "value_cache", "slot_mapping"),
           rc_block_or_head_size: ("key_cache",), **FP8_KV},
    generic_shape=False)


PA = Spec(
    ranks={"q": (3,), "key_cache": (4,), "value_cache": (4,), "cu_seqlens_q": (1,), "seqused_k": (1,),
           "block_table": (2,)},
    dtypes={"q": "half_any", "key_cache": "like:q", "value_cache": "like:q", "cu_seqlens_q": "i32",
            "seqused_k": "i32", "block_table": "i32"},
    refused={"key_cache": CACHE_LAYOUTS, "value_cache": CACHE_LAYOUTS, "cu_seqlens_q": INDEX_LAYOUTS,
             "seqused_k": INDEX_LAYOUTS, "block_table": INDEX_LAYOUTS},
)


@st.composite
def pa_valid(draw: Any) -> dict[str, Any]:
    """Valid arguments whose index tensors are zeros: every sequence empty (nothing to compute)."""
    b, kvh, grp, nb = draw(st.integers(2, 3)), 2, draw(st.integers(1, 2)), draw(st.integers(1, 3))
    d, bs = draw(st.sampled_from([64, 128])), draw(st.sampled_from([16, 32]))
    dt, layout = draw(st.sampled_from([F16, BF16])), draw(st.sampled_from(["NHD", "HND"]))
    cache, (cdt, fp8) = _rc_cache_shape(layout, nb, bs, kvh, d), _kv_cache_kind(draw, dt)
    return {"q": T((draw(st.integers(1, 4)), kvh * grp, d), dt), "key_cache": T(cache, cdt),
            "value_cache": T(cache, cdt), "cu_seqlens_q": T((b + 1,), I32), "seqused_k": T((b,), I32),
            "block_table": T((b, draw(st.integers(2, 3))), I32), "max_seqlen_q": draw(st.integers(0, 4)),
            "max_seqlen_k": draw(st.integers(0, 64)), "softmax_scale": draw(st.sampled_from([None, 0.125])),
            "causal": draw(st.booleans()), "window_size": draw(st.sampled_from([(-1, -1), (4, 0), [2, 3]])),
            "softcap": draw(st.sampled_from([0.0, 30.0])), "kv_layout": layout,
            "num_splits": draw(st.sampled_from([0, 1])),
            "sinks": draw(st.sampled_from([None, T((kvh * grp,), F32)])), **fp8}


def pa_shape_mismatch(c: Case, draw: Any) -> bool:
    if not _consistent(PA, c):
        return False
    a = c.args
    tq, h, d = a["q"].shape
    b = a["seqused_k"].shape[0]
    x = draw(st.sampled_from(["q_heads", "q_dim", "cu", "table", "value_cache"]))
    if x == "q_heads":                       # not a multiple of the caches' KVH (2 or more)
        kvh = a["key_cache"].shape[2] if a["kv_layout"] == "NHD" else a["key_cache"].shape[1]
        if kvh < 2:
            return False
        a["q"] = replace(a["q"], shape=(tq, kvh * (h // kvh + 1) + 1, d))
        c.blame |= {"q", "sinks"}              # (sinks: one per query head)
    elif x == "q_dim":
        a["q"] = replace(a["q"], shape=(tq, h, d + 8))
        c.blame.add("q")
    elif x == "cu":
        a["cu_seqlens_q"] = replace(a["cu_seqlens_q"], shape=(b + draw(st.sampled_from([0, 2])),))
        c.blame |= {"cu_seqlens_q", "seqused_k"}
    elif x == "table":
        a["block_table"] = replace(a["block_table"], shape=(b + 1, a["block_table"].shape[1]))
        c.blame |= {"block_table", "seqused_k"}
    else:
        sh = list(a["value_cache"].shape)
        sh[draw(st.integers(0, 3))] += 8
        a["value_cache"] = replace(a["value_cache"], shape=tuple(sh))
        c.blame |= {"value_cache", "key_cache"}
    return True


def pa_block_or_head_size(c: Case, draw: Any) -> bool:
    if not _consistent(PA, c):
        return False
    a = c.args
    nb = a["key_cache"].shape[0]
    kvh = a["key_cache"].shape[2] if a["kv_layout"] == "NHD" else a["key_cache"].shape[1]
    bs, d = draw(st.sampled_from([(8, 64), (12, 64), (256, 64), (16, 320), (16, 12), (16, 264)]))
    for x in ("key_cache", "value_cache"):
        a[x] = replace(a[x], shape=_rc_cache_shape(a["kv_layout"], nb, bs, kvh, d))
    a["q"] = replace(a["q"], shape=(*a["q"].shape[:2], d))
    c.blame |= {"key_cache", "value_cache", "q"}
    return True


PA_BAD_VALUES = {"max_seqlen_q": [-1, -5], "max_seqlen_k": [-1],
                 "softmax_scale": [-1.0, 0.0, float("nan"), float("inf")], "window_size": [(-2, 0), (0, -3)],
                 "softcap": [-1.0, float("nan"), float("-inf")], "num_splits": [-1, 17, 100],
                 "kv_layout": KV_LAYOUT_VALUES}
PA_BAD_KINDS = {"max_seqlen_q": ["3", 2.5, None], "max_seqlen_k": ["3", 2.5], "softmax_scale": ["0.5", [0.5]],
                "causal": ["yes", "true"], "window_size": ["ab", (1, 2, 3), [1.5, 2.0]],
                "softcap": ["x"], "kv_layout": [1, ("NHD",)], "num_splits": ["2", 1.5]}
# (None for an argument with a default is torch.ops' way of asking for the default, and a float for
# a bool is converted under torch.compile: neither is invalid there)

TABLE["paged_attention"] = spec_table(
    "pa", PA, pa_valid, ("q", "key_cache", "value_cache"), values=PA_BAD_VALUES, kinds=PA_BAD_KINDS,
    extra={pa_shape_mismatch: ("q", "value_cache", "cu_seqlens_q", "block_table"),
           pa_block_or_head_size: ("key_cache", "value_cache"), m_sinks: ("sinks",), **FP8_KV},
    generic_shape=False)


AV = Spec(
    ranks={"q": (3,), "k": (3,), "v": (3,), "cu_seqlens_q": (1,), "cu_seqlens_k": (1,)},
    dtypes={"q": "half_any", "k": "like:q", "v": "like:q", "cu_seqlens_q": "i32", "cu_seqlens_k": "i32"},
    refused={"cu_seqlens_q": INDEX_LAYOUTS, "cu_seqlens_k": INDEX_LAYOUTS},
)


@st.composite
def av_valid(draw: Any) -> dict[str, Any]:
    """Valid arguments whose cu_seqlens are zeros: every sequence empty (nothing to compute)."""
    b, kvh, grp = draw(st.integers(1, 3)), draw(st.integers(1, 2)), draw(st.integers(1, 2))
    d, dt = draw(st.sampled_from([64, 128])), draw(st.sampled_from([F16, BF16]))
    tk = draw(st.integers(1, 4))
    return {"q": T((draw(st.integers(1, 4)), kvh * grp, d), dt), "k": T((tk, kvh, d), dt),
            "v": T((tk, kvh, d), dt), "cu_seqlens_q": T((b + 1,), I32), "cu_seqlens_k": T((b + 1,), I32),
            "max_seqlen_q": draw(st.integers(0, 4)), "max_seqlen_k": draw(st.integers(0, 64)),
            "softmax_scale": draw(st.sampled_from([None, 0.125])), "causal": draw(st.booleans()),
            "window_size": draw(st.sampled_from([(-1, -1), (4, 0), [2, 3]])),
            "softcap": draw(st.sampled_from([0.0, 30.0])),
            "sinks": draw(st.sampled_from([None, T((kvh * grp,), F32)]))}


def av_shape_mismatch(c: Case, draw: Any) -> bool:
    """Heads not a multiple of KVH, head sizes or K / V rows that disagree, cu_seqlens of
    different lengths, a head size past 256 or not a multiple of 8."""
    if not _consistent(AV, c):
        return False
    a = c.args
    tq, h, d = a["q"].shape
    tk, kvh, _ = a["k"].shape
    x = draw(st.sampled_from(["q_heads", "q_dim", "cu", "v", "head_size"]))
    if x == "q_heads":
        if kvh < 2:
            return False
        a["q"] = replace(a["q"], shape=(tq, kvh * (h // kvh + 1) + 1, d))
        c.blame |= {"q", "sinks"}              # (sinks: one per query head)
    elif x == "q_dim":
        a["q"] = replace(a["q"], shape=(tq, h, d + 8))
        c.blame |= {"q", "k"}
    elif x == "cu":
        y = draw(st.sampled_from(("cu_seqlens_q", "cu_seqlens_k")))
        a[y] = replace(a[y], shape=(a[y].shape[0] + draw(st.sampled_from([1, 2])),))
        c.blame |= {"cu_seqlens_q", "cu_seqlens_k"}
    elif x == "v":
        sh = list(a["v"].shape)
        sh[draw(st.integers(0, 2))] += 8
        a["v"] = replace(a["v"], shape=tuple(sh))
        c.blame |= {"v", "k"}
    else:
        d2 = draw(st.sampled_from([264, 320, 12]))
        for y in ("q", "k", "v"):
            a[y] = replace(a[y], shape=(*a[y].shape[:2], d2))
        c.blame |= {"q", "k", "v"}
    return True


TABLE["attention_varlen"] = spec_table(
    "av", AV, av_valid, ("q", "k", "v"),
    values={x: v for x, v in PA_BAD_VALUES.items() if x not in ("kv_layout", "num_splits")},
    kinds={x: v for x, v in PA_BAD_KINDS.items() if x not in ("kv_layout", "num_splits")},
    extra={av_shape_mismatch: ("q", "v", "cu_seqlens_q", "cu_seqlens_k"), m_sinks: ("sinks",)},
    generic_shape=False)


# --- the fused MoE: bf16 / f16, fp8 (e4m3) and W4A16 / W8A16 experts -----------------------------------

#: the router arguments every fused MoE takes, and the values of a kind the schema cannot bind
MOE_KINDS = {"activation": [None, 3, ["silu"]], "apply_router_weight_on_input": ["yes", [True]],
             "global_num_experts": ["8", 2.5, [4]]}
ROUTER = ("activation", "apply_router_weight_on_input", "global_num_experts")
#: the routing tensors' dtypes (``topk_weights`` f32, the ids and the expert map int32)
ROUTING = {"topk_weights": "f32", "topk_ids": "i32", "expert_map": "i32"}
ALL_LAYOUTS = ("offset", "strided")


def _refused(tensors: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    return dict.fromkeys(tensors, ALL_LAYOUTS)


def _routing(draw: Any, t: int, k: int, experts: int) -> dict[str, Any]:
    """top-k weights and ids for ``t`` tokens, the router arguments, and an expert map over
    ``experts`` local experts (or none)."""
    mapped = draw(st.booleans())
    g = experts + draw(st.integers(0, 3))
    return {"topk_weights": T((t, k), torch.float32), "topk_ids": T((t, k), I32),
            "activation": draw(st.sampled_from(["silu", "gelu"])),
            "apply_router_weight_on_input": k == 1 and draw(st.booleans()),
            "expert_map": T((g,), I32) if mapped else None,
            "global_num_experts": draw(st.sampled_from([None, g if mapped else experts]))}


def _router_mismatch(c: Case, draw: Any, t: int) -> bool:
    """top-k rows that are not ``t`` tokens, or weights and ids of different widths."""
    a = c.args
    if draw(st.booleans()):
        for y in ("topk_ids", "topk_weights"):
            a[y] = replace(a[y], shape=(t + 1, a[y].shape[1]))
        c.blame |= {"topk_ids", "topk_weights", "hidden_states"}
    else:
        a["topk_weights"] = replace(a["topk_weights"], shape=(t, a["topk_weights"].shape[1] + 1))
        c.blame |= {"topk_ids", "topk_weights"}
    return True


MOE = Spec(
    ranks={"hidden_states": (2,), "w13": (3,), "w2": (3,), "topk_weights": (2,), "topk_ids": (2,),
           "expert_map": (1,)},
    dtypes={"hidden_states": "half_any", "w13": "like:hidden_states", "w2": "like:hidden_states", **ROUTING},
    optional=frozenset({"expert_map"}),
    refused=_refused(("hidden_states", "w13", "w2", "topk_weights", "topk_ids", "expert_map")),
    blame={"dtype": {"hidden_states": {"hidden_states", "w13", "w2"}}},
)


@st.composite
def moe_valid(draw: Any) -> dict[str, Any]:
    t, h, i = draw(st.integers(1, 4)), draw(st.sampled_from([16, 64])), draw(st.sampled_from([8, 32]))
    e, k, dt = draw(st.integers(2, 4)), draw(st.integers(1, 2)), draw(st.sampled_from([F16, BF16]))
    return {"hidden_states": T((t, h), dt), "w13": T((e, 2 * i, h), dt), "w2": T((e, h, i), dt),
            **_routing(draw, t, k, e)}


def _moe_consistent(spec: Spec, c: Case) -> bool:
    return all(isinstance(c.args.get(x), T) and len(c.args[x].shape) in r
               for x, r in spec.ranks.items() if x != "expert_map")


def moe_shape_mismatch(c: Case, draw: Any) -> bool:
    """w13's H or 2I, w2's shape, top-k rows or widths that disagree, H not a multiple of 8."""
    if not _moe_consistent(MOE, c):
        return False
    a = c.args
    t, h = a["hidden_states"].shape
    e, n2, _ = a["w13"].shape
    x = draw(st.sampled_from(["w13_h", "w13_odd", "w2", "router", "h8"]))
    if x == "w13_h":
        a["w13"] = replace(a["w13"], shape=(e, n2, h + 8))
        c.blame |= {"w13", "hidden_states"}
    elif x == "w13_odd":
        a["w13"] = replace(a["w13"], shape=(e, n2 + 1, h))
        c.blame |= {"w13", "w2"}
    elif x == "w2":
        sh = list(a["w2"].shape)
        sh[draw(st.integers(0, 2))] += 8
        a["w2"] = replace(a["w2"], shape=tuple(sh))
        c.blame |= {"w2", "w13"}
    elif x == "router":
        return _router_mismatch(c, draw, t)
    else:
        a["hidden_states"] = replace(a["hidden_states"], shape=(t, 12))
        a["w13"] = replace(a["w13"], shape=(e, n2, 12))
        a["w2"] = replace(a["w2"], shape=(e, 12, n2 // 2))
        c.blame |= {"hidden_states", "w13", "w2"}
    return True


def moe_bad_value(c: Case, draw: Any) -> bool:
    """Always applies (a table's fallback): a bad ``activation`` where the other two cannot be
    made invalid from the shapes at hand."""
    a = c.args
    x = draw(st.sampled_from(ROUTER))
    ids, emap, w13 = a["topk_ids"], a.get("expert_map"), a["w13"]
    if x == "apply_router_weight_on_input" and isinstance(ids, T) and len(ids.shape) == 2 \
            and ids.shape[1] >= 2:
        a[x] = True
        c.blame.add(x)
    elif x == "global_num_experts" and isinstance(emap, T) and len(emap.shape) == 1:
        a[x] = emap.shape[0] + 1
        c.blame |= {x, "expert_map"}
    elif x == "global_num_experts" and emap is None and isinstance(w13, T) and len(w13.shape) == 3:
        a[x] = w13.shape[0] + draw(st.integers(1, 3))
        c.blame |= {x, "expert_map"}
    else:
        a["activation"] = draw(st.sampled_from(["relu", "SILU", "", "gelu_tanh"]))
        c.blame.add("activation")
    return True


TABLE["fused_moe"] = spec_table(
    "moe", MOE, moe_valid, ("hidden_states", "w13", "w2"), kinds=MOE_KINDS,
    extra={moe_shape_mismatch: ("hidden_states", "w13", "w2", "topk_weights", "topk_ids"),
           moe_bad_value: ROUTER},
    generic_shape=False, fallback=moe_bad_value)


# The fp8 table runs with HEXLAYOUT_EMULATE_ARCH=sm_89 (``emulate``): sm_80 refuses fp8 experts,
# which would turn every case into that one error.

FP8 = torch.float8_e4m3fn
FP8_SCALE_OF = {"w13": "w13_scale", "w2": "w2_scale", "w13_scale": "w13", "w2_scale": "w2"}
FP8_SPEC = Spec(
    ranks={"hidden_states": (2,), "w13": (3,), "w13_scale": (1, 3), "w2": (3,), "w2_scale": (1, 3),
           "topk_weights": (2,), "topk_ids": (2,), "expert_map": (1,)},
    dtypes={"hidden_states": "half_not_fp8", "w13": "fp8", "w13_scale": "f32", "w2": "fp8", "w2_scale": "f32",
            **ROUTING},
    optional=frozenset({"expert_map"}),
    refused=_refused(("hidden_states", "w13", "w13_scale", "w2", "w2_scale", "topk_weights", "topk_ids",
                      "expert_map")),
    # (a weight and its scale are compared first)
    blame={"device": {x: {x, y} for x, y in FP8_SCALE_OF.items()}},
)


def _fp8_scale_shape(block: Any, e: int, n: int, k: int) -> tuple[int, ...]:
    return (e,) if not block else (e, -(-n // 128), -(-k // 128))


@st.composite
def fp8_valid(draw: Any) -> dict[str, Any]:
    t, h, i = draw(st.integers(1, 4)), draw(st.sampled_from([16, 64])), draw(st.sampled_from([16, 32]))
    e, k, dt = draw(st.integers(2, 4)), draw(st.integers(1, 2)), draw(st.sampled_from([F16, BF16]))
    block = draw(st.sampled_from([[], [128, 128]]))
    return {"hidden_states": T((t, h), dt), "w13": T((e, 2 * i, h), FP8),
            "w13_scale": T(_fp8_scale_shape(block, e, 2 * i, h), torch.float32), "w2": T((e, h, i), FP8),
            "w2_scale": T(_fp8_scale_shape(block, e, h, i), torch.float32), "block": block,
            **_routing(draw, t, k, e)}


def _fp8_consistent(c: Case) -> bool:
    """Every tensor but ``expert_map`` of its rank (the scales: of the rank ``block`` wants)."""
    a = c.args
    if a["block"] not in ([], [128, 128]):
        return False
    form = (3,) if a["block"] else (1,)
    return _moe_consistent(replace(FP8_SPEC, ranks={**FP8_SPEC.ranks, "w13_scale": form,
                                                     "w2_scale": form}), c)


def fp8_scale_rank(c: Case, draw: Any) -> bool:
    """A scale of the rank of the other scale form than ``block`` says."""
    x = draw(st.sampled_from(["w13_scale", "w2_scale"]))
    if not isinstance(c.args.get(x), T) or c.args["block"] not in ([], [128, 128]):
        return False
    c.args[x] = replace(c.args[x], shape=(2, 2, 64) if not c.args["block"] else (2,))
    c.blame.add(x)
    return True


def fp8_shape_mismatch(c: Case, draw: Any) -> bool:
    """w13's H or 2I, w2's shape or experts, scale shapes, top-k rows or widths that disagree, H or I
    not a multiple of 16."""
    if not _fp8_consistent(c):
        return False
    a = c.args
    t, h = a["hidden_states"].shape
    e, n2, _ = a["w13"].shape
    blk = a["block"]
    x = draw(st.sampled_from(["w13_h", "w13_odd", "w2", "experts", "scale", "router", "h16", "i16"]))
    if x == "w13_h":
        a["w13"] = replace(a["w13"], shape=(e, n2, h + 16))
        c.blame |= {"w13", "w13_scale", "hidden_states"}
    elif x == "w13_odd":
        a["w13"] = replace(a["w13"], shape=(e, n2 + 1, h))
        c.blame |= {"w13", "w13_scale", "w2"}
    elif x == "w2":
        sh = list(a["w2"].shape)
        sh[draw(st.integers(0, 2))] += 16
        a["w2"] = replace(a["w2"], shape=tuple(sh))
        c.blame |= {"w2", "w2_scale", "w13"}
    elif x == "experts":
        _, wn, wk = a["w2"].shape
        a["w2"] = replace(a["w2"], shape=(e + 1, wn, wk))
        a["w2_scale"] = replace(a["w2_scale"], shape=_fp8_scale_shape(blk, e + 1, wn, wk))
        c.blame |= {"w2", "w13"}
    elif x == "scale":
        y = draw(st.sampled_from(["w13_scale", "w2_scale"]))
        sh = list(a[y].shape)
        sh[draw(st.integers(0, len(sh) - 1))] += draw(st.integers(1, 2))
        a[y] = replace(a[y], shape=tuple(sh))
        c.blame.add(y)
    elif x == "router":
        return _router_mismatch(c, draw, t)
    else:
        hh, ii = (24, n2 // 2) if x == "h16" else (h, 24)
        a["hidden_states"] = replace(a["hidden_states"], shape=(t, hh))
        a["w13"] = replace(a["w13"], shape=(e, 2 * ii, hh))
        a["w2"] = replace(a["w2"], shape=(e, hh, ii))
        a["w13_scale"] = replace(a["w13_scale"], shape=_fp8_scale_shape(blk, e, 2 * ii, hh))
        a["w2_scale"] = replace(a["w2_scale"], shape=_fp8_scale_shape(blk, e, hh, ii))
        c.blame |= {"hidden_states", "w13", "w2"}
    return True


def fp8_block(c: Case, draw: Any) -> bool:
    """``block`` not (128, 128), or the other scale form than the scales have."""
    a = c.args
    v = draw(st.sampled_from([[64, 64], [128, 64], [0, 0], [256, 256], [128], [128, 128, 1], "flip"]))
    if v == "flip":   # the form w13_scale does not have (not a tensor: invalid already)
        s13 = a["w13_scale"]
        v = [] if isinstance(s13, T) and len(s13.shape) == 3 else [128, 128]
        c.blame |= {"w13_scale", "w2_scale"}
    a["block"] = v
    c.blame.add("block")
    return True


def fp8_scale_format(c: Case, draw: Any) -> bool:
    """``scale_format`` not '' / 'ue8m0', or 'ue8m0' for one scale per expert."""
    v = draw(st.sampled_from(["e8m0", "UE8M0", "ue8m0"]))
    c.args["scale_format"] = "e8m0" if v == "ue8m0" and c.args["block"] else v
    c.blame.add("scale_format")
    return True


TABLE["fused_moe_fp8"] = spec_table(
    "fp8", FP8_SPEC, fp8_valid, ("hidden_states", "w13", "w13_scale", "w2", "w2_scale"),
    kinds={**MOE_KINDS, "block": ["128", ["128", "128"], 1.5, [1.5, 2.0]]},
    extra={fp8_shape_mismatch: ("hidden_states", "w13", "w13_scale", "w2", "w2_scale", "topk_weights",
                                "topk_ids"),
           fp8_scale_rank: ("w13_scale", "w2_scale"), fp8_block: ("block",), moe_bad_value: ROUTER,
           fp8_scale_format: ("scale_format",)},
    generic_shape=False, fallback=fp8_block)


# The dense FP8 GEMM (``gemm_fp8``); runs with HEXLAYOUT_EMULATE_ARCH=sm_89 as the fp8 MoE table.

G8 = Spec(
    ranks={"a": (2,), "b": (2,), "a_scale": (2,), "b_scale": (2,), "bias": (1,)},
    dtypes={"a": "fp8", "b": "fp8", "a_scale": "f32", "b_scale": "f32", "bias": "float"},
    optional=frozenset({"bias"}),
    refused=_refused(("a", "b", "a_scale", "b_scale", "bias")),
)


@st.composite
def g8_valid(draw: Any) -> dict[str, Any]:
    m, n, k = draw(st.integers(1, 4)), draw(st.sampled_from([16, 24, 136])), draw(st.sampled_from([16, 144]))
    odt = draw(st.sampled_from([F16, BF16]))
    kb, nb = -(-k // 128), -(-n // 128)
    return {"a": T((m, k), torch.float8_e4m3fn), "b": T((n, k), torch.float8_e4m3fn),
            "a_scale": T((m, kb), F32), "b_scale": T((nb, kb), F32), "out_dtype": odt,
            "bias": draw(st.sampled_from([None, T((n,), odt), T((n,), F32)])),
            "scale_format": draw(st.sampled_from(["", "auto"]))}


def g8_shape_mismatch(c: Case, draw: Any) -> bool:
    """b's K not a's, K not a multiple of 16, a scale of another shape, a bias of another length."""
    a = c.args
    if any(not isinstance(a[x], T) or len(a[x].shape) != 2 for x in ("a", "b", "a_scale", "b_scale")):
        return False
    (m, k), n = a["a"].shape, a["b"].shape[0]
    x = draw(st.sampled_from(["k", "k16", "a_scale", "b_scale", "bias"]))
    if x == "k":
        a["b"] = replace(a["b"], shape=(n, k + 16))
        c.blame.add("b")
    elif x == "k16":
        a["a"], a["b"] = replace(a["a"], shape=(m, 24)), replace(a["b"], shape=(n, 24))
        a["a_scale"] = replace(a["a_scale"], shape=(m, 1))
        a["b_scale"] = replace(a["b_scale"], shape=(-(-n // 128), 1))
        c.blame |= {"a", "b"}
    elif x in ("a_scale", "b_scale"):
        sh = list(a[x].shape)
        sh[draw(st.integers(0, 1))] += draw(st.integers(1, 2))
        a[x] = replace(a[x], shape=tuple(sh))
        c.blame.add(x)
    else:
        a["bias"] = T((n + draw(st.sampled_from([-8, 2, 128])),), F32)
        c.blame.add("bias")
    return True


TABLE["gemm_fp8"] = spec_table(
    "g8", G8, g8_valid, ("a_scale", "b_scale", "bias"),
    values={"out_dtype": [F32, F64, torch.int8, torch.float8_e4m3fn],
            "scale_format": ["e8m0", "UE8M0", " auto", "none"]},
    kinds={"out_dtype": ["bf16", 1.5, [BF16]], "scale_format": [None, 1, ["ue8m0"]]},
    extra={g8_shape_mismatch: ("a", "b", "a_scale", "b_scale", "bias")},
    generic_shape=False)


# The W4A16 / W8A16 experts: prepare_wna16's tensors.

WQ = Spec(
    ranks={"hidden_states": (2,), "w13_qweight": (2,), "w13_scales": (3,), "w13_zeros": (3,),
           "w2_qweight": (2,), "w2_scales": (3,), "w2_zeros": (3,), "topk_weights": (2,), "topk_ids": (2,),
           "expert_map": (1,)},
    # (qweight: the checkpoint's int32 words, not prepare_wna16's bytes)
    dtypes={"hidden_states": "half_any", **{f"{p}_{x}": "like:hidden_states" if x != "qweight" else "words"
                                            for p in ("w13", "w2") for x in ("qweight", "scales", "zeros")},
            **ROUTING},
    # None: invalid for AWQ's zero points (GPTQ's are None)
    optional=frozenset({"w13_zeros", "w2_zeros", "expert_map"}),
    required_if=dict.fromkeys(("w13_zeros", "w2_zeros"), lambda a: a["quant_format"] == "awq"),
    refused=_refused(("hidden_states", "w13_qweight", "w13_scales", "w13_zeros", "w2_qweight", "w2_scales",
                      "w2_zeros", "topk_weights", "topk_ids", "expert_map")),
)
WQ_GROUPS = (32, 64, 128, -1)
WQ_CONSTANTS = ("quant_format", "bits", "w13_group_size", "w2_group_size", *ROUTER)


def _wq_prepared(fmt: str, bits: int, e: int, k: int, n: int, group: int, dt: Any,
                 gate_up: bool = False) -> dict[str, T]:
    """The tensors ``prepare_wna16`` makes of a checkpoint of ``y = x @ W`` (``K = k``, ``N = n``):
    AWQ ``qweight`` [E, K, N/8] and ``qzeros`` [E, K/G, N/8], GPTQ ``qweight`` [E, K bits/32, N];
    ``scales`` [E, K/G, N] (prepared on meta tensors: only the shapes and the padded rows are kept)."""
    from hexlayout.ops.moe.wna16 import prepare_wna16

    g = 1 if group == -1 else k // group
    qw = (e, k, n // 8) if fmt == "awq" else (e, k * bits // 32, n)
    z = torch.zeros(e, g, n // 8, dtype=I32, device="meta") if fmt == "awq" else None
    s = torch.zeros(e, g, n, dtype=dt, device="meta")
    w = prepare_wna16(torch.zeros(qw, dtype=I32, device="meta"), s, z, quant_format=fmt, bits=bits,
                      group_size=group, gate_up=gate_up)
    rows = w.scales.stride(1)   # the padded rows NP of the offline [E * NP, G] tensors they view
    return {"qweight": T(tuple(w.qweight.shape), w.qweight.dtype),
            "scales": T(tuple(w.scales.shape), dt, rows=rows),
            "zeros": None if w.zeros is None else T(tuple(w.zeros.shape), w.zeros.dtype, rows=rows)}


@st.composite
def wq_valid(draw: Any) -> dict[str, Any]:
    t, h, i = draw(st.integers(1, 4)), draw(st.sampled_from([32, 64, 128])), draw(st.sampled_from([32, 64]))
    e, k, dt = draw(st.integers(2, 4)), draw(st.integers(1, 2)), draw(st.sampled_from([F16, BF16]))
    fmt = draw(st.sampled_from(["awq", "gptq"]))
    bits = 4 if fmt == "awq" else draw(st.sampled_from([4, 8]))
    g13 = draw(st.sampled_from([g for g in WQ_GROUPS if g == -1 or h % g == 0]))
    g2 = draw(st.sampled_from([g for g in WQ_GROUPS if g == -1 or i % g == 0]))
    w13, w2 = _wq_prepared(fmt, bits, e, h, 2 * i, g13, dt, True), _wq_prepared(fmt, bits, e, i, h, g2, dt)
    return {"hidden_states": T((t, h), dt), **{f"w13_{x}": v for x, v in w13.items()},
            **{f"w2_{x}": v for x, v in w2.items()},
            "quant_format": fmt, "bits": bits, "w13_group_size": g13, "w2_group_size": g2,
            **_routing(draw, t, k, e)}


def _wq_consistent(c: Case) -> bool:
    """Every tensor but the optional ones present with its rank (the optional ones: absent or so)."""
    return all(isinstance(c.args.get(x), T) and len(c.args[x].shape) in r or
               x in WQ.optional and c.args.get(x) is None for x, r in WQ.ranks.items())


def _wq_shape(c: Case, x: str, dim: int, size: int) -> None:
    sh = list(c.args[x].shape)
    sh[dim] = size
    c.args[x] = replace(c.args[x], shape=tuple(sh))


def wq_shape_mismatch(c: Case, draw: Any) -> bool:
    """H of the activations, experts, packed sizes, groups, N of w13 / w2 or top-k rows / widths
    that disagree with the others."""
    if not _wq_consistent(c):
        return False
    a = c.args
    t, h = a["hidden_states"].shape
    e, _, n2 = a["w13_scales"].shape
    pre = draw(st.sampled_from(["w13", "w2"]))
    zeros = [z for z in (f"{pre}_zeros",) if isinstance(a[z], T)]
    x = draw(st.sampled_from(["h", "experts", "qweight", "zeros", "groups", "w2_n", "w13_odd", "router"]))
    if x == "h":
        _wq_shape(c, "hidden_states", 1, draw(st.sampled_from([h + 32, h + 8, 12, 8])))
        c.blame |= {"hidden_states", "w13_qweight", "w13_scales", "w13_group_size", "w2_scales"}
    elif x == "experts":  # w2 consistently for one more expert than w13
        _wq_shape(c, "w2_qweight", 0, (e + 1) * h)
        for y in ("w2_scales", "w2_zeros"):
            if isinstance(a[y], T):
                _wq_shape(c, y, 0, e + 1)
        c.blame |= {"w2_scales", "w2_qweight", "w2_zeros", "w13_scales"}
    elif x == "qweight":
        dim = draw(st.integers(0, 1))
        _wq_shape(c, f"{pre}_qweight", dim, a[f"{pre}_qweight"].shape[dim] * 2 + (dim == 0))
        c.blame.add(f"{pre}_qweight")
    elif x == "zeros":
        if not zeros:
            return False
        dim = draw(st.integers(0, 2))
        _wq_shape(c, zeros[0], dim, a[zeros[0]].shape[dim] + 1)
        c.blame.add(zeros[0])
    elif x == "groups":
        for y in (f"{pre}_scales", *zeros):
            _wq_shape(c, y, 1, a[y].shape[1] + 1)
        c.blame |= {f"{pre}_scales", f"{pre}_group_size"}
    elif x == "w2_n":
        for y in ("w2_scales", *[z for z in ("w2_zeros",) if isinstance(a[z], T)]):
            _wq_shape(c, y, 2, h + 8)
        c.blame.add("w2_scales")
    elif x == "w13_odd":  # w13 consistently for an odd N (not 2I)
        odd = n2 + 1 + n2 % 2
        _wq_shape(c, "w13_qweight", 0, e * odd)
        for y in ("w13_scales", "w13_zeros"):
            if isinstance(a[y], T):
                _wq_shape(c, y, 2, odd)
        c.blame |= {"w13_scales", "w13_qweight", "w13_zeros"}
    else:
        return _router_mismatch(c, draw, t)
    return True


def _wq_bad_group_size(c: Case, draw: Any, x: str) -> None:
    """A group size the kernels do not have, or a valid one that does not match the scales' groups."""
    a = c.args
    pool: list[Any] = [16, 0, 256, -2, 48]
    pre = x[: -len("_group_size")]
    hs, s13, scales = a["hidden_states"], a["w13_scales"], a[f"{pre}_scales"]
    if _wq_consistent(c):
        k = hs.shape[1] if pre == "w13" else s13.shape[2] // 2
        pool += [g for g in WQ_GROUPS if g != -1 and k % g or (1 if g == -1 else k // g) != scales.shape[1]]
    a[x] = draw(st.sampled_from(pool))
    c.blame.add(x)


def wq_bad_value(c: Case, draw: Any) -> bool:
    """A quantization format, bit width or group size the op refuses, or a router argument that
    disagrees with the shapes (``moe_bad_value``'s rules, which do not always apply here)."""
    a = c.args
    x = draw(st.sampled_from(WQ_CONSTANTS))
    if x == "quant_format":
        a[x] = draw(st.sampled_from(["AWQ", "gptq_v2", "", "marlin", "fp8"]))
        c.blame.add(x)
    elif x == "bits":
        a[x] = draw(st.sampled_from([2, 3, 0, 16, -4] + ([8] if a["quant_format"] == "awq" else [])))
        c.blame.add(x)
    elif x.endswith("group_size"):
        _wq_bad_group_size(c, draw, x)
    elif x == "activation":
        a[x] = draw(st.sampled_from(["relu", "SILU", "", "gelu_tanh"]))
        c.blame.add(x)
    elif x == "apply_router_weight_on_input":
        ids = a["topk_ids"]
        if not isinstance(ids, T) or len(ids.shape) != 2 or ids.shape[1] < 2:
            return False
        a[x] = True
        c.blame.add(x)
    else:
        emap, s13 = a.get("expert_map"), a["w13_scales"]
        if isinstance(emap, T) and len(emap.shape) == 1:
            a[x] = emap.shape[0] + 1
        elif emap is None and isinstance(s13, T) and len(s13.shape) == 3:
            a[x] = s13.shape[0] + draw(st.integers(1, 3))
        else:
            return False
        c.blame |= {x, "expert_map"}
    return True


def wq_perm(c: Case, draw: Any) -> bool:
    """An act-order permutation that cannot be one: of AWQ weights, not int32 ``[E, K]``, or not a
    tensor."""
    a = c.args
    pre = draw(st.sampled_from(["w13", "w2"]))
    x = f"{pre}_perm"
    s13, hs = a["w13_scales"], a["hidden_states"]
    if not (isinstance(s13, T) and len(s13.shape) == 3 and isinstance(hs, T) and len(hs.shape) == 2):
        return False
    e, k = s13.shape[0], hs.shape[1] if pre == "w13" else s13.shape[2] // 2
    kind = draw(st.sampled_from(["dtype", "shape", "kind"] + (["awq"] if a["quant_format"] == "awq" else [])))
    if kind == "kind":
        a[x] = draw(st.sampled_from(["a", 1.5, [0, 1]]))
        c.kinds.add(x)
    else:
        a[x] = T((e, k + 8) if kind == "shape" else (e, k), torch.int64 if kind == "dtype" else I32)
    c.blame.add(x)
    return True


def wq_layout_key(c: Case, draw: Any) -> bool:
    """An offline layout key that is not the one of the kernel the op runs: the prepared weights'
    ``w13_qweight`` / ``w2_qweight`` are named."""
    pre = draw(st.sampled_from(["w13", "w2"]))
    c.args[f"{pre}_layout"] = draw(st.sampled_from(["u4/64x64/t128x16B/0000000000", "natural", "x"]))
    c.blame |= {f"{pre}_qweight", f"{pre}_layout"}
    return True


TABLE["fused_moe_wna16"] = spec_table(
    "wq", WQ, wq_valid, ("hidden_states", "w13_scales", "w13_zeros", "w2_scales", "w2_zeros"),
    kinds={"quant_format": [None, 4, ["awq"]], "bits": ["4", 4.5, None, [4]],
           "w13_group_size": ["32", 32.5, None, [32]], "w2_group_size": ["-1", 64.5, None, [-1]],
           **MOE_KINDS},
    extra={wq_shape_mismatch: tuple(x for x in WQ.tensors if x != "expert_map"), wq_bad_value: WQ_CONSTANTS,
           wq_perm: ("w13_perm", "w2_perm"), wq_layout_key: ("w13_layout", "w2_layout")},
    generic_shape=False)


# --- the Mamba ops ---------------------------------------------------------------------------------------

FLOATS = [F16, BF16, F32]
BOOL_KINDS = ["yes", [True]]


def _opt(draw: Any, t: T) -> T | None:
    return draw(st.sampled_from([None, t]))


@st.composite
def ss_valid(draw: Any) -> dict[str, Any]:
    """selective_scan: u / delta / z ``[batch, dim, L]``, A ``[dim, N]`` f32, B / C ``[batch, N, L]``
    or ``[batch, G, N, L]``, D / delta_bias ``[dim]`` f32, initial_states ``[S, dim, N]`` f32;
    cu_seqlens (zeros: empty sequences) only with batch 1."""
    b, dim, n, length = (
        draw(st.integers(1, 2)),
        draw(st.sampled_from([4, 8])),
        draw(st.sampled_from([2, 4])),
        draw(st.integers(1, 4)),
    )
    dt, g = draw(st.sampled_from(FLOATS)), draw(st.sampled_from([None, 1, 2]))
    bc = (b, n, length) if g is None else (b, g, n, length)
    cu = T((draw(st.integers(2, 3)),), I32) if b == 1 and draw(st.booleans()) else None
    seqs = b if cu is None else cu.shape[0] - 1
    return {
        "u": T((b, dim, length), dt),
        "delta": T((b, dim, length), dt),
        "A": T((dim, n), F32),
        "B": T(bc, dt),
        "C": T(bc, dt),
        "D": _opt(draw, T((dim,), F32)),
        "z": _opt(draw, T((b, dim, length), dt)),
        "delta_bias": _opt(draw, T((dim,), F32)),
        "delta_softplus": draw(st.booleans()),
        "initial_states": _opt(draw, T((seqs, dim, n), F32)),
        "cu_seqlens": cu,
        "return_last_state": draw(st.booleans()),
    }


SS = Spec(
    ranks={
        "u": (2, 3),
        "delta": (2, 3),
        "A": (2,),
        "B": (2, 3, 4),
        "C": (2, 3, 4),
        "D": (1,),
        "z": (2, 3),
        "delta_bias": (1,),
        "initial_states": (3,),
        "cu_seqlens": (1,),
    },
    dtypes={
        "u": "float",
        "delta": "like:u",
        "A": "f32",
        "B": "like:u",
        "C": "like:u",
        "D": "f32",
        "z": "like:u",
        "delta_bias": "f32",
        "initial_states": "f32",
        "cu_seqlens": "i32",
    },
    optional=frozenset({"D", "z", "delta_bias", "initial_states", "cu_seqlens"}),
    refused={"cu_seqlens": ("strided",)},
    shape_blame={
        "u": {"u", "delta", "A", "B", "C", "D", "z", "delta_bias", "initial_states", "cu_seqlens"},
        "A": {"A", "B", "C", "initial_states"},
        "B": {"B", "C", "initial_states"},
    },
    free={"cu_seqlens": (0,)},
)
TABLE["selective_scan"] = spec_table(
    "ss",
    SS,
    ss_valid,
    ("u", "delta", "B", "C", "z", "initial_states"),
    kinds={"delta_softplus": BOOL_KINDS, "return_last_state": BOOL_KINDS},
)


@st.composite
def su_valid(draw: Any) -> dict[str, Any]:
    """selective_state_update, Mamba-1 (state ``[S, dim, N]``, x / dt / z ``[batch, dim]``, A
    ``[dim, N]``, B / C ``[batch, N]`` or ``[batch, G, N]``) or Mamba-2 (state ``[S, H, P, N]``, x / z
    ``[batch, H, P]``, dt ``[batch, H, P]`` or ``[batch, H]``, A ``[H]`` or ``[H, P, N]``, B / C
    ``[batch, G, N]``, D / dt_bias ``[H]`` or ``[H, P]``); S = batch without indices."""
    b, h, p, n, g = (
        draw(st.integers(1, 2)),
        2,
        draw(st.sampled_from([2, 4])),
        draw(st.sampled_from([2, 4])),
        draw(st.sampled_from([1, 2])),
    )
    dt, sdt = draw(st.sampled_from(FLOATS)), draw(st.sampled_from(FLOATS))
    indexed = draw(st.booleans())
    s = b + draw(st.integers(0, 2)) if indexed else b
    if draw(st.booleans()):  # Mamba-2
        xs = (b, h, p)
        state, a = (s, h, p, n), draw(st.sampled_from([(h,), (h, p, n)]))
        dts, bc, dd = draw(st.sampled_from([xs, (b, h)])), (b, g, n), draw(st.sampled_from([(h,), (h, p)]))
    else:
        xs, state, a, dts, dd = (b, h * p), (s, h * p, n), (h * p, n), (b, h * p), (h * p,)
        bc = draw(st.sampled_from([(b, n), (b, g, n)]))
    return {
        "state": T(state, sdt),
        "x": T(xs, dt),
        "dt": T(dts, dt),
        "A": T(a, F32),
        "B": T(bc, dt),
        "C": T(bc, dt),
        "D": _opt(draw, T(dd, F32)),
        "z": _opt(draw, T(xs, dt)),
        "dt_bias": _opt(draw, T(dd, F32)),
        "dt_softplus": draw(st.booleans()),
        "state_batch_indices": T((b,), draw(st.sampled_from([I32, I64]))) if indexed else None,
    }


SU = Spec(
    ranks={
        "state": (3, 4),
        "x": (2, 3),
        "dt": (2, 3),
        "A": (1, 2, 3),
        "B": (2, 3),
        "C": (2, 3),
        "D": (1, 2),
        "z": (2, 3),
        "dt_bias": (1, 2),
        "state_batch_indices": (1,),
    },
    dtypes={
        "state": "float",
        "x": "float",
        "dt": "like:x",
        "A": "f32",
        "B": "like:x",
        "C": "like:x",
        "D": "f32",
        "z": "like:x",
        "dt_bias": "f32",
        "state_batch_indices": "index",
    },
    optional=frozenset({"D", "z", "dt_bias", "state_batch_indices"}),
    refused={"state": ("strided",), "state_batch_indices": ("strided",)},
    shape_blame={
        "state": {"state", "x", "dt", "A", "B", "C", "D", "z", "dt_bias"},
        "x": {"x", "dt", "z", "B", "C", "state", "state_batch_indices"},
        "B": {"B", "C"},
    },
    free={"state": (0,)},
)
TABLE["selective_state_update"] = spec_table(
    "su", SU, su_valid, ("state", "x", "dt", "B", "C", "z"), kinds={"dt_softplus": BOOL_KINDS}
)


@st.composite
def sd_valid(draw: Any) -> dict[str, Any]:
    """ssd_scan: x / z ``[batch, L, H, P]`` f16 / bf16, dt ``[batch, L, H]``, A / dt_bias ``[H]``,
    B / C ``[batch, L, G, N]``, D ``[H]`` or ``[H, P]``, initial_states ``[S, H, P, N]``; cu_seqlens
    (zeros: empty sequences) only with batch 1."""
    b, length, h, p = draw(st.integers(1, 2)), draw(st.integers(1, 4)), draw(st.sampled_from([2, 4])), 4
    g, n, dt = (
        draw(st.sampled_from([1, 2])),
        draw(st.sampled_from([4, 8])),
        draw(st.sampled_from([F16, BF16])),
    )
    cu = T((draw(st.integers(2, 3)),), I32) if b == 1 and draw(st.booleans()) else None
    seqs = b if cu is None else cu.shape[0] - 1
    return {
        "x": T((b, length, h, p), dt),
        "dt": T((b, length, h), F32),
        "A": T((h,), F32),
        "B": T((b, length, g, n), dt),
        "C": T((b, length, g, n), dt),
        "chunk_size": draw(st.sampled_from([256, 4])),
        "D": _opt(draw, T(draw(st.sampled_from([(h,), (h, p)])), F32)),
        "z": _opt(draw, T((b, length, h, p), dt)),
        "dt_bias": _opt(draw, T((h,), F32)),
        "dt_softplus": draw(st.booleans()),
        "dt_min": draw(st.sampled_from([0.0, 0.001])),
        "dt_max": draw(st.sampled_from([None, 0.1, float("inf")])),
        "initial_states": _opt(draw, T((seqs, h, p, n), F32)),
        "cu_seqlens": cu,
    }


SD = Spec(
    ranks={
        "x": (4,),
        "dt": (3,),
        "A": (1,),
        "B": (4,),
        "C": (4,),
        "D": (1, 2),
        "z": (4,),
        "dt_bias": (1,),
        "initial_states": (4,),
        "cu_seqlens": (1,),
    },
    dtypes={
        "x": "half",
        "dt": "floating",
        "A": "floating",
        "B": "like:x",
        "C": "like:x",
        "D": "floating",
        "z": "like:x",
        "dt_bias": "floating",
        "initial_states": "floating",
        "cu_seqlens": "i32",
    },
    optional=frozenset({"D", "z", "dt_bias", "initial_states", "cu_seqlens"}),
    refused={"cu_seqlens": ("strided",)},
    shape_blame={
        "x": {"x", "dt", "A", "B", "C", "D", "z", "dt_bias", "initial_states", "cu_seqlens"},
        "B": {"B", "C", "initial_states"},
    },
    free={"cu_seqlens": (0,)},
)
TABLE["ssd_scan"] = spec_table(
    "sd",
    SD,
    sd_valid,
    ("x", "dt", "B", "C", "z", "initial_states"),
    values={
        "chunk_size": [0, -4],
        "dt_min": [float("nan"), float("inf")],
        "dt_max": [float("nan"), -1.0, float("-inf")],
    },
    kinds={
        "chunk_size": ["4", 2.5],
        "dt_softplus": BOOL_KINDS,
        "dt_min": ["0.1", [0.0]],
        "dt_max": ["1e3", [1.0]],
    },
)

ACTIVATION_VALUES, ACTIVATION_KINDS = (
    {"activation": ["relu", "SILU", "", "silu "]},
    {"activation": [3, ["silu"]]},
)


@st.composite
def cc_valid(draw: Any) -> dict[str, Any]:
    """causal_conv1d: x ``[batch, dim, L]`` f16 / bf16, or ``[dim, T]`` with cu_seqlens (zeros);
    weight ``[dim, width]`` (width 2-4), bias ``[dim]``, initial_states ``[S, dim, width-1]``."""
    dim, width, dt = (
        draw(st.sampled_from([8, 16])),
        draw(st.integers(2, 4)),
        draw(st.sampled_from([F16, BF16])),
    )
    if draw(st.booleans()):
        seqs = draw(st.integers(1, 2))
        x, cu = T((dim, draw(st.integers(1, 4))), dt), T((seqs + 1,), I32)
    else:
        seqs = draw(st.integers(1, 2))
        x, cu = T((seqs, dim, draw(st.integers(1, 4))), dt), None
    return {
        "x": x,
        "weight": T((dim, width), dt),
        "bias": _opt(draw, T((dim,), dt)),
        "activation": draw(st.sampled_from([None, "silu"])),
        "initial_states": _opt(draw, T((seqs, dim, width - 1), dt)),
        "cu_seqlens": cu,
    }


CC = Spec(
    ranks={"x": (2, 3), "weight": (2,), "bias": (1,), "initial_states": (3,), "cu_seqlens": (1,)},
    dtypes={
        "x": "half",
        "weight": "like:x",
        "bias": "like:x",
        "initial_states": "like:x",
        "cu_seqlens": "i32",
    },
    optional=frozenset({"bias", "initial_states", "cu_seqlens"}),
    refused={"cu_seqlens": ("strided",)},
    shape_blame={
        "x": {"x", "weight", "bias", "initial_states", "cu_seqlens"},
        "weight": {"weight", "initial_states"},
    },
    free={"x": (-1, -3), "cu_seqlens": (0,)},
)
TABLE["causal_conv1d"] = spec_table(
    "cc",
    CC,
    cc_valid,
    ("x", "weight", "bias", "initial_states"),
    values=ACTIVATION_VALUES,
    kinds=ACTIVATION_KINDS,
)


@st.composite
def cu_valid(draw: Any) -> dict[str, Any]:
    """causal_conv1d_update: x ``[batch, dim]`` or ``[batch, dim, L]`` f16 / bf16, conv_state
    ``[n, dim, SL]`` (SL >= width-1; n >= batch without indices), weight ``[dim, width]``, bias
    ``[dim]``, conv_state_indices ``[batch]`` int32 (zeros)."""
    b, dim, width, dt = (
        draw(st.integers(1, 2)),
        draw(st.sampled_from([8, 16])),
        draw(st.integers(2, 4)),
        draw(st.sampled_from([F16, BF16])),
    )
    x = (b, dim) if draw(st.booleans()) else (b, dim, draw(st.integers(1, 3)))
    indexed = draw(st.booleans())
    return {
        "x": T(x, dt),
        "conv_state": T((b + draw(st.integers(0, 1)), dim, width - 1 + draw(st.integers(0, 2))), dt),
        "weight": T((dim, width), dt),
        "bias": _opt(draw, T((dim,), dt)),
        "activation": draw(st.sampled_from([None, "silu"])),
        "conv_state_indices": T((b,), I32) if indexed else None,
    }


CU = Spec(
    ranks={"x": (2, 3), "conv_state": (3,), "weight": (2,), "bias": (1,), "conv_state_indices": (1,)},
    dtypes={
        "x": "half",
        "conv_state": "like:x",
        "weight": "like:x",
        "bias": "like:x",
        "conv_state_indices": "i32",
    },
    optional=frozenset({"bias", "conv_state_indices"}),
    refused={"conv_state_indices": ("strided",)},
    shape_blame={"x": {"x", "conv_state", "weight", "bias", "conv_state_indices"}},
    free={"x": (2,), "conv_state": (0, 2)},
)
TABLE["causal_conv1d_update"] = spec_table(
    "cu",
    CU,
    cu_valid,
    ("x", "conv_state", "weight", "bias"),
    values=ACTIVATION_VALUES,
    kinds=ACTIVATION_KINDS,
)


# --- MLA: the latent cache and its decode ----------------------------------------------------------------


def _mla_cache(draw: Any, d: int, dt: Any) -> T:
    nb, bs = draw(st.integers(1, 3)), draw(st.sampled_from([16, 32]))
    return T((nb, bs, d) if draw(st.booleans()) else (nb, bs, 1, d), dt)


@st.composite
def md_valid(draw: Any) -> dict[str, Any]:
    """mla_decode: q ``[T, H, rank + rope]`` f16 / bf16, kv_cache ``[NB, BS, rank + rope]`` or
    ``[NB, BS, 1, rank + rope]``, int32 index tensors of zeros (every sequence empty)."""
    b, h, rank, rope = draw(st.integers(2, 3)), draw(st.integers(1, 2)), 128, draw(st.sampled_from([16, 64]))
    dt = draw(st.sampled_from([F16, BF16]))
    return {
        "q": T((draw(st.integers(1, 4)), h, rank + rope), dt),
        "kv_cache": _mla_cache(draw, rank + rope, dt),
        "cu_seqlens_q": T((b + 1,), I32),
        "seqused_k": T((b,), I32),
        "block_table": T((b, draw(st.integers(2, 3))), I32),
        "max_seqlen_q": draw(st.integers(0, 4)),
        "max_seqlen_k": draw(st.integers(0, 64)),
        "softmax_scale": draw(st.sampled_from([None, 0.125])),
        "kv_lora_rank": rank,
    }


MD = Spec(
    ranks={"q": (3,), "kv_cache": (3, 4), "cu_seqlens_q": (1,), "seqused_k": (1,), "block_table": (2,)},
    dtypes={
        "q": "half",
        "kv_cache": "like:q",
        "cu_seqlens_q": "i32",
        "seqused_k": "i32",
        "block_table": "i32",
    },
    refused={
        "kv_cache": ("strided", "offset"),
        "cu_seqlens_q": ("strided",),
        "seqused_k": ("strided",),
        "block_table": ("strided",),
    },
    shape_blame={
        "q": {"q", "kv_cache", "kv_lora_rank"},
        "seqused_k": {"seqused_k", "cu_seqlens_q", "block_table"},
    },
    free={"q": (0, 1), "kv_cache": (0, 1), "block_table": (1,)},
)
TABLE["mla_decode"] = spec_table(
    "md",
    MD,
    md_valid,
    ("q", "kv_cache"),
    values={
        "max_seqlen_q": [-1, -5],
        "max_seqlen_k": [-1],
        "softmax_scale": [-1.0, 0.0, float("nan"), float("inf")],
        "kv_lora_rank": [256, 64, 0, -1, 512],
    },
    kinds={
        "max_seqlen_q": ["3", 2.5, None],
        "max_seqlen_k": ["3", 2.5],
        "softmax_scale": ["0.5", [0.5]],
        "kv_lora_rank": ["128", 128.5],
    },
)


@st.composite
def mc_valid(draw: Any) -> dict[str, Any]:
    """mla_reshape_and_cache: kv_c ``[T, rank]`` f16 / bf16, k_pe ``[T, rope]``, kv_cache as for
    ``mla_decode``, slot_mapping ``[T]`` int64 (zeros)."""
    t, rank, rope, dt = (
        draw(st.integers(1, 4)),
        128,
        draw(st.sampled_from([16, 64])),
        draw(st.sampled_from([F16, BF16])),
    )
    return {
        "kv_c": T((t, rank), dt),
        "k_pe": T((t, rope), dt),
        "kv_cache": _mla_cache(draw, rank + rope, dt),
        "slot_mapping": T((t,), I64),
    }


MC = Spec(
    ranks={"kv_c": (2,), "k_pe": (2,), "kv_cache": (3, 4), "slot_mapping": (1,)},
    dtypes={"kv_c": "half", "k_pe": "like:kv_c", "kv_cache": "like:kv_c", "slot_mapping": "i64"},
    refused={"kv_cache": ("strided",), "slot_mapping": ("strided",)},  # (kv_c, k_pe: copied)
    shape_blame={"kv_c": {"kv_c", "k_pe", "slot_mapping", "kv_cache"}, "k_pe": {"k_pe", "kv_cache"}},
    free={"kv_cache": (0, 1)},
)
TABLE["mla_reshape_and_cache"] = spec_table("mc", MC, mc_valid, ("kv_c", "k_pe", "kv_cache"))


def m_mla_kv_cache_dtype(c: Case, draw: Any) -> bool:
    """paged attention's ``kv_cache_dtype`` mutation for the one latent cache (in the inputs'
    dtype: an FP8 string blames it)."""
    m_kv_cache_dtype(c, draw)
    if c.blame & {"key_cache", "value_cache"}:
        c.blame = (c.blame - {"key_cache", "value_cache"}) | {"kv_cache"}
    return True


def m_mla_k_scale(c: Case, draw: Any) -> bool:
    """A ``k_scale`` that is not one f32 element on the cache's device."""
    v = draw(st.sampled_from([T((2,), F32), T((1,), F16), T((), torch.int32), T((1,), F32, device="meta"),
                              "a", [1.0]]))
    c.args["k_scale"] = v
    c.blame.add("k_scale")
    if not isinstance(v, T):
        c.kinds.add("k_scale")
    return True


for _name in ("mla_decode", "mla_reshape_and_cache"):
    TABLE[_name].mutations += [m_mla_kv_cache_dtype, m_mla_k_scale]
    for _m in (m_mla_kv_cache_dtype, m_mla_k_scale):          # (found by name: invalid_case)
        setattr(TABLE[_name].module, _m.__name__, _m)
    TABLE[_name].covers["kv_cache_dtype"] = [m_mla_kv_cache_dtype]
    TABLE[_name].covers["k_scale"] = [m_mla_k_scale]


def test_table_covers_every_registered_op_and_argument() -> None:
    ops = _ops()
    assert set(ops) == set(TABLE) and ops
    for name, op in ops.items():
        assert set(TABLE[name].covers) == {n for n, _, _ in op.arguments()}, name
        assert all(TABLE[name].covers.values()), name


@st.composite
def invalid_case(draw: Any, name: str) -> Case:
    table = TABLE[name]
    case = Case(draw(table.valid()))
    for _ in range(draw(st.integers(1, 3))):
        mut = draw(st.sampled_from(table.mutations))
        chosen = {getattr(table.module, w) for w in case.what}
        if mut in chosen or any(mut in group and group & chosen for group in table.exclusive):
            continue                   # once each: a second draw may undo the first (dtype back)
        if mut(case, draw):
            case.what.append(mut.__name__)
    if not case.what:
        fallback = table.fallback
        fallback(case, draw)
        case.what.append(fallback.__name__)
    table.noise(case, draw)
    return case


# --- running a case -----------------------------------------------------------------------------------

def _assert_named(e: BaseException, case: Case, via_torch_ops: bool) -> None:
    """A hexlayout ValueError / TypeError naming a blamed argument; for ``torch.ops``, torch's
    schema binding error naming an argument of a kind it cannot bind."""
    if isinstance(e, HexlayoutError) and isinstance(e, (ValueError, TypeError)):
        assert getattr(e, "arg", None) in case.blame, (str(e), case)
        return
    if via_torch_ops and type(e) is RuntimeError:
        assert any(f"for argument '{x}'" in str(e) for x in case.kinds), (str(e), case)
        return
    raise AssertionError(f"{type(e).__name__}: {e} for {case}") from e


def _expect_error(fn: Callable[[], Any], case: Case, via_torch_ops: bool) -> None:
    try:
        out = fn()
    except Exception as e:  # noqa: BLE001 - every kind is judged below
        _assert_named(e, case, via_torch_ops)
    else:
        raise AssertionError(f"accepted invalid arguments {case}: returned {type(out).__name__}")


@pytest.fixture
def emulate(monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    if request.node.callspec.params.get("name") in ("fused_moe_fp8", "gemm_fp8"):
        monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_89")   # sm_80 refuses fp8 experts


PATHS = {"gemm": {"Op": lambda: _ops()["gemm"], "function": lambda: hexlayout.ops.gemm},
         "gemm_fp8": {"Op": lambda: _ops()["gemm_fp8"], "function": lambda: hexlayout.ops.gemm_fp8},
         "reshape_and_cache": {"Op": lambda: _ops()["reshape_and_cache"],
                               "function": lambda: hexlayout.ops.reshape_and_cache},
         "paged_attention": {"Op": lambda: _ops()["paged_attention"],
                             "function": lambda: hexlayout.ops.paged_attention},
         "attention_varlen": {"Op": lambda: _ops()["attention_varlen"],
                              "function": lambda: hexlayout.ops.attention_varlen},
         "fused_moe": {"Op": lambda: _ops()["fused_moe"], "function": lambda: hexlayout.ops.fused_moe},
         # (the Python fused_moe_fp8 takes prepare_fp8 objects, not these arguments)
         "fused_moe_fp8": {"Op": lambda: _ops()["fused_moe_fp8"]},
         # (the Python fused_moe_wna16 takes prepare_wna16 objects, not these arguments)
         "fused_moe_wna16": {"Op": lambda: _ops()["fused_moe_wna16"]},
         # (the Python ssd_scan takes dt_limit = (dt_min, dt_max), not these arguments)
         "ssd_scan": {"Op": lambda: _ops()["ssd_scan"]}}
PATHS.update({name: {"Op": lambda name=name: _ops()[name],
                      "function": lambda name=name: getattr(hexlayout.ops, name)}
              for name in ("selective_scan", "selective_state_update", "causal_conv1d",
                           "causal_conv1d_update", "mla_decode", "mla_reshape_and_cache")})


@pytest.mark.parametrize("name", sorted(TABLE))
def test_random_invalid_arguments_eager_and_fake(emulate, name: str) -> None:
    op = getattr(torch.ops.hexlayout, name)
    others = [get() for get in PATHS[name].values()]
    count = [0]

    @settings(max_examples=250, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(invalid_case(name))
    def run(case: Case) -> None:
        count[0] += 1
        for w in case.what:
            event(w)                     # pytest --hypothesis-show-statistics shows the mix
        _expect_error(lambda: op(**_build(case.args)), case, via_torch_ops=True)
        for fn in others:
            _expect_error(lambda fn=fn: fn(**_build(case.args)), case, via_torch_ops=False)
        with FakeTensorMode():
            _expect_error(lambda: op(**_build(case.args)), case, via_torch_ops=True)

    run()
    assert count[0] >= 200


def _compiled_error(e: BaseException, case: Case) -> None:
    """Under torch.compile: the error itself (eager fallback after a graph break) or dynamo's
    ``TorchRuntimeError`` quoting it."""
    if isinstance(e, HexlayoutError) or type(e) is RuntimeError:
        _assert_named(e, case, via_torch_ops=True)
        return
    msg = str(e)
    named = any(f"argument '{x}'" in msg or f"argument \\'{x}\\'" in msg for x in case.blame)
    assert type(e).__module__.startswith("torch._dynamo") and named, (type(e), msg[:500], case)
    quoted = "ArgumentError(" in msg or "ArgumentTypeError(" in msg or \
        any(f"for argument \\'{x}\\'" in msg or f"for argument '{x}'" in msg for x in case.kinds)
    assert quoted, (msg[:500], case)


@pytest.mark.parametrize("name", sorted(TABLE))
def test_random_invalid_arguments_under_torch_compile(emulate, name: str) -> None:
    op = getattr(torch.ops.hexlayout, name)

    @settings(max_examples=20, deadline=None, database=None,
              suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
    @given(invalid_case(name))
    def run(case: Case) -> None:
        torch._dynamo.reset()
        f = torch.compile(lambda kw: op(**kw), backend="eager")
        try:
            f(_build(case.args))
        except Exception as e:  # noqa: BLE001 - judged below
            _compiled_error(e, case)
        else:
            raise AssertionError(f"accepted invalid arguments under torch.compile: {case}")

    run()
