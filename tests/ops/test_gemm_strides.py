"""``hexlayout.ops.gemm`` takes operands in either stride order, as ``torch.mm`` does.

``a`` (``M x K``) and ``b`` (``N x K`` for ``b_layout="nk"``, ``K x N`` for ``"kn"``) may each
be K-major or M / N-major (transposed views), with any leading stride (slices of bigger
tensors): the host picks the kernel variant of the stored layouts (``stored_operands``: the
sm_80 kernel reads an MN-major operand with ldmatrix.trans, the sm_90a one by TMA into an
MN-major wgmma stage) and binds the leading strides at launch; dense operands take the kernel
variant without them (``kernels.leading_dims``). Checked in the emulator
against float64 on random data (the memory around each view filled with NaN, so a read past
the view shows), for all four stride orders x f16 / bf16 x epilogues on sm_80 and sm_90a;
each variant compiles with NVRTC without spills; the fake implementation and autograd take
transposed inputs; what is refused names the argument."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import hexlayout.ops  # noqa: E402,F401 - registers the op
from hexlayout.ops.gemm import op as G  # noqa: E402

ATOL = {torch.float16: 1e-2, torch.bfloat16: 3e-2}
ORDERS = [("k", "k"), ("k", "mn"), ("mn", "k"), ("mn", "mn")]


def _ref(a, b, bias=None, residual=None, activation="none", scale=None, b_layout="nk"):
    y = a.double() @ (b.double().t() if b_layout == "nk" else b.double())
    if scale is not None:
        y = y * scale
    if bias is not None:
        y = y + bias.double()
    y = {"none": y, "relu": torch.relu(y), "gelu": torch.nn.functional.gelu(y, approximate="tanh"),
         "silu": torch.nn.functional.silu(y)}[activation]
    if residual is not None:
        y = y + residual.double()
    return y


def _close(c, want, dtype):
    assert not c.isnan().any()
    rel = ((c.double() - want).abs() / (want.abs() + 1)).max().item()
    assert rel < ATOL[dtype], rel


def _matrix(rows, cols, major, pad, dtype, g):
    """A random ``rows x cols`` view, contiguous along ``cols`` (``major="row"``) or along
    ``rows`` (``"col"``), whose leading stride is ``pad`` elements more than dense: a slice of a
    bigger NaN-filled tensor."""
    if major == "row":
        big = torch.full((rows, cols + pad), float("nan"), dtype=dtype)
        v = big[:, :cols]
    else:
        big = torch.full((cols, rows + pad), float("nan"), dtype=dtype)
        v = big[:, :rows].t()
    v.copy_(torch.randn(rows, cols, generator=g).to(dtype))
    return v


def _operands(m, n, k, a_major, b_major, b_layout, pad, dtype, g):
    a = _matrix(m, k, "row" if a_major == "k" else "col", pad, dtype, g)
    bl = _matrix(n, k, "row" if b_major == "k" else "col", pad, dtype, g)     # N x K, logical
    return a, (bl if b_layout == "nk" else bl.t())


@pytest.fixture
def emulate(monkeypatch):
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


def _arch(monkeypatch, arch):
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)


# (M, N, K): ragged in every mode against the tiles; M and N multiples of 8 where an M / N-major
# operand is read in place (16-byte vectors along M / N); N = 50 (a K-major b): the epilogue
# stores from registers, else through shared memory
SHAPES = {"sm_80": [(72, 50, 40), (40, 72, 88)], "sm_90a": [(72, 50, 72), (80, 72, 40)]}
EPILOGUES = [{}, {"bias": True, "residual": True, "activation": "gelu", "scale": 0.5}]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize(("a_major", "b_major"), ORDERS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
def test_every_stride_order_matches_float64(monkeypatch, arch, a_major, b_major, dtype) -> None:
    """All four stride orders, each epilogue on one shape; leading strides not dense (the
    views are slices, 8 or 16 elements wider); the kernel reads the views in place."""
    _arch(monkeypatch, arch)
    i = ORDERS.index((a_major, b_major)) + (dtype == torch.bfloat16)
    m, n, k = SHAPES[arch][i % 2]
    n = 56 if n == 50 and b_major == "mn" else n
    ep = dict(EPILOGUES[i % 2])
    b_layout = ("nk", "kn")[(i // 2) % 2]
    g = torch.Generator().manual_seed(100 * i + m)
    a, b = _operands(m, n, k, a_major, b_major, b_layout, 8 * (1 + i % 2), dtype, g)
    if ep.pop("bias", False):
        ep["bias"] = torch.randn(n, generator=g).to(dtype)
    if ep.pop("residual", False):
        ep["residual"] = torch.randn(m, n, generator=g).to(dtype)
    a_layout, kb, a_st, b_st, copied = G.stored_operands(a, b, b_layout)
    assert (a_layout, kb) == ("mk" if a_major == "k" else "km", "nk" if b_major == "k" else "kn")
    assert not copied and a_st.data_ptr() == a.data_ptr() and b_st.data_ptr() == b.data_ptr()
    c = hexlayout.ops.gemm(a, b, b_layout=b_layout, **ep)
    assert c.shape == (m, n) and c.dtype == dtype and c.is_contiguous()
    _close(c, _ref(a, b, b_layout=b_layout, **ep), dtype)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_torch_op_transposed_relu_and_silu(monkeypatch, arch) -> None:
    """Through ``torch.ops.hexlayout.gemm``: dense transposes (``x.t()``) of both operands, with
    the other activations; a residual given transposed (copied to row-major for the epilogue)."""
    _arch(monkeypatch, arch)
    g = torch.Generator().manual_seed(5)
    m, n, k = 64, 34, 48
    a = torch.randn(k, m, generator=g).half().t()
    b = torch.randn(k, n, generator=g).half()            # 'nk' given as the transpose of K x N
    res = torch.randn(n, m, generator=g).half().t()
    for act in ("relu", "silu"):
        c = torch.ops.hexlayout.gemm(a, b.t(), None, res, act)
        _close(c, _ref(a, b.t(), residual=res, activation=act), torch.float16)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_unaligned_strides_and_extents_run_on_a_dense_copy(monkeypatch, arch) -> None:
    """Odd M (an M-major a cannot be read in 16-byte vectors along M), a leading stride of
    K + 3 (rows not 16-byte aligned) and a K-major b with K = 36 when N is a multiple of 8:
    each such operand is read from a dense copy of the major-ness that is aligned."""
    _arch(monkeypatch, arch)
    g = torch.Generator().manual_seed(11)
    dt = torch.bfloat16
    # odd M, M-major a: copied K-major; b sliced with a leading stride of K + 3: copied
    a = _matrix(37, 40, "col", 8, dt, g)
    b = _matrix(66, 40, "row", 3, dt, g)
    assert G.stored_operands(a, b, "nk")[:2] == ("mk", "nk") and G.stored_operands(a, b, "nk")[4]
    _close(hexlayout.ops.gemm(a, b), _ref(a, b), dt)
    # K = 36: a (M = 48) and b (N = 64) read from M-major / N-major copies
    a, b = _matrix(48, 36, "row", 0, dt, g), _matrix(64, 36, "row", 0, dt, g)
    assert G.stored_operands(a, b, "nk")[:2] == ("km", "kn")
    bias = torch.randn(64, generator=g).to(dt)
    _close(hexlayout.ops.gemm(a, b, bias=bias), _ref(a, b, bias=bias), dt)


@pytest.mark.parametrize(("make", "arg", "match"), [
    # no dimension of stride 1
    (lambda d: (torch.empty(16, 64, device=d).half()[:, ::2], torch.empty(8, 32, device=d).half()), "a",
     r"no dimension of stride 1.*a\.contiguous\(\)"),
    (lambda d: (torch.empty(16, 32, device=d).half(), torch.empty(8, 64, device=d).half()[:, ::2]), "b",
     r"no dimension of stride 1.*b\.contiguous\(\)"),
    # neither contiguous extent a multiple of 8
    (lambda d: (torch.empty(13, 36, device=d).half(), torch.empty(8, 36, device=d).half()), "a",
     "neither K = 36 nor M = 13 is a multiple of 8"),
    (lambda d: (torch.empty(16, 12, device=d).half(), torch.empty(14, 6, device=d).half()[:12].t()), "b",
     "neither K = 12 nor N = 6"),
    (lambda d: (torch.empty(8, 8, device=d).half(), torch.empty(8, 8, device=d).half(),
                torch.empty(16, device=d).half()[::2]), "bias", r"no dimension of stride 1.*bias"),
])
def test_refusals_name_the_argument_eager_meta_and_fake(emulate, make, arg, match) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    errors = []
    for device in ("cpu", "meta"):
        with pytest.raises(ValueError, match=match) as e:
            torch.ops.hexlayout.gemm(*make(device))
        errors.append(e.value)
    with FakeTensorMode(), pytest.raises(ValueError, match=match) as e:
        torch.ops.hexlayout.gemm(*make("cpu"))
    errors.append(e.value)
    assert all(x.arg == arg for x in errors)
    assert len({str(x) for x in errors}) == 1


def test_fake_tensors_and_torch_compile_with_transposed_inputs(emulate) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(4096, 1000, dtype=torch.bfloat16).t()
        y = torch.empty(4096, 512, dtype=torch.bfloat16)
        out = torch.ops.hexlayout.gemm(x, y.t())
        assert out.shape == (1000, 512) and out.dtype == torch.bfloat16
    f = torch.compile(lambda a, b: torch.ops.hexlayout.gemm(a.t(), b, activation="relu") + 1,
                      backend="eager", fullgraph=True)
    a, b = torch.randn(64, 40).half(), torch.randn(24, 64).half()
    _close(f(a, b), _ref(a.t(), b, activation="relu") + 1, torch.float16)


@pytest.mark.parametrize("b_layout", ["nk", "kn"])
def test_backward_with_transposed_inputs_matches_float64(emulate, b_layout) -> None:
    """Gradients of leaves used transposed (``a0.t()``, ``b0.t()``) against float64 autograd."""
    g = torch.Generator().manual_seed(3)
    m, n, k = 24, 16, 32
    a0 = torch.randn(k, m, generator=g).half()
    b0 = torch.randn(n, k, generator=g).half() if b_layout == "kn" else torch.randn(k, n, generator=g).half()
    bias = torch.randn(n, generator=g).half()
    dc = torch.randn(m, n, generator=g).half()
    ours = [x.clone().requires_grad_() for x in (a0, b0, bias)]
    ref = [x.double().requires_grad_() for x in (a0, b0, bias)]
    torch.ops.hexlayout.gemm(ours[0].t(), ours[1].t(), ours[2], None, "silu", 0.5, b_layout).backward(dc)
    _ref(ref[0].t(), ref[1].t(), ref[2], None, "silu", 0.5, b_layout).backward(dc.double())
    for name, x, y in zip(("a", "b", "bias"), ours, ref):
        assert x.grad is not None and x.grad.shape == y.shape, name
        err = ((x.grad.double() - y.grad).abs().max() / y.grad.abs().max()).item()
        assert err < 1e-2, (name, err)


@pytest.mark.nvrtc
@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize(("a_layout", "b_layout"), [("mk", "nk"), ("mk", "kn"), ("km", "nk"), ("km", "kn")])
@pytest.mark.parametrize("ld", [(False, False), (True, True)], ids=["dense", "ldab"])
def test_each_stored_layout_compiles_without_spills(arch, a_layout, b_layout, ld) -> None:
    """The fused kernel of each stored-layout variant (bias, residual, gelu, scale; staged
    epilogue), dense or with free leading strides, compiles for its architecture without
    spills; an MN-major operand on sm_80 is read from shared memory by transposing ldmatrix
    (LDSM...MT88)."""
    from hexlayout.ops.gemm.config import choose_config

    import hexlayout.lang as hl

    cfg = choose_config(arch, 4096, 4096, 4096)
    b = G.gemm_build(hl.f16, b_layout, (True, True, "gelu", True), arch, cfg, 4096, 4096, a_layout=a_layout,
                     ld=ld)
    assert ("LDA" in b.generated.source, "LDB" in b.generated.source) == ld
    res = b.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0, res
    assert 0 < res.registers <= 255
    counts = b.compiled.sass_counts()
    want = {"sm_80": ("HMMA.16816", "LDGSTS"), "sm_90a": ("HGMMA", "UTMALDG")}[arch]
    for prefix in want:
        assert any(op.startswith(prefix) for op in counts), (prefix, sorted(counts))
    if arch == "sm_80":
        trans = any(op.startswith("LDSM") and ".MT88" in op for op in counts)
        assert trans == (a_layout == "km" or b_layout == "kn"), sorted(counts)


@pytest.mark.nvrtc
def test_cuda_host_path_binds_the_views_and_their_strides(tmp_path, monkeypatch) -> None:
    """The CUDA host path (GPU stubbed as in benchmarks/bench_host.py, sm_80): an M-major ``a``
    and an N-major ``b``, both slices with wider leading strides, launch the ``km_kn`` kernel
    on the views themselves (their data pointers, ``LDA`` / ``LDB`` their leading strides); a
    second call with other tensors of the same strides takes the cached launch, which hands the
    kernel the same transposed views (a full bind of what it is given agrees)."""
    import importlib.util
    from pathlib import Path

    from hexlayout.ops.gemm import config as gc

    import hexlayout.runtime.launch as launch

    monkeypatch.setenv("HEXLAYOUT_CACHE_DIR", str(tmp_path / "cache"))
    spec = importlib.util.spec_from_file_location(
        "bench_host", Path(__file__).resolve().parents[2] / "benchmarks" / "bench_host.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    tables = (G._FAST, G._HOT, G._ARCHS, G._LAUNCHERS, gc._TABLES)
    for d in tables:
        d.clear()
    drv = bench.stub_gpu(torch, monkeypatch.setattr)
    first, cached = [], []
    real = launch.Launcher.launch
    monkeypatch.setattr(launch.Launcher, "launch",
                        lambda self, bound, stream=None: first.append(bound) or real(self, bound, stream))
    real_prepared = launch.Launcher.prepared

    def prepared(self, template):
        go = real_prepared(self, template)
        return lambda args: cached.append((self, list(args))) or go(args)

    monkeypatch.setattr(launch.Launcher, "prepared", prepared)
    g = torch.Generator().manual_seed(9)
    try:
        def views():
            a = torch.randn(64, 72, generator=g).half()[:, :64].t()       # M x K = 64 x 64, strides (1, 72)
            b = torch.randn(64, 136, generator=g).half()[:, :128].t()     # N x K = 128 x 64, strides (1, 136)
            return a, b

        a, b = views()
        c = hexlayout.ops.gemm(a, b)
        assert c.shape == (64, 128) and drv.launches == 1
        (bound,) = first
        assert bound.kernel.endswith("gemm_sm80_f16_km_kn_ldab"), bound.kernel
        assert bound.sizes["LDA"] == 72 and bound.sizes["LDB"] == 136
        assert bound.tensors["a"].data_ptr() == a.data_ptr() and bound.tensors["b"].data_ptr() == b.data_ptr()
        a2, b2 = views()
        hexlayout.ops.gemm(a2, b2)
        assert drv.launches == 2 and len(first) == 1
        lau, args = cached[-1]
        assert args[0].data_ptr() == a2.data_ptr() and tuple(args[0].shape) == (64, 64)   # K x M
        assert args[1].data_ptr() == b2.data_ptr() and tuple(args[1].shape) == (64, 128)  # K x N
        ref = lau.plan._bind_slow(args, "cpu")
        assert ref.sizes["LDA"] == 72 and ref.sizes["LDB"] == 136
        # dense transposes of the same shapes: the dense variant, another launcher, no LDA / LDB
        a3 = torch.randn(64, 64, generator=g).half().t()
        b3 = torch.randn(64, 128, generator=g).half().t()
        hexlayout.ops.gemm(a3, b3)
        assert drv.launches == 3 and len(first) == 2
        assert first[-1].kernel.endswith("gemm_sm80_f16_km_kn"), first[-1].kernel
        assert not {"LDA", "LDB"} & set(first[-1].sizes), first[-1].sizes
    finally:
        for d in tables:
            d.clear()


def test_cluster_config_takes_an_m_major_a_as_a_k_major_copy(monkeypatch) -> None:
    """The 2-CTA cluster config multicasts K-major A tiles: its kernel refuses an M-major A,
    and the op given that config with a transposed ``a`` runs it on a K-major copy."""
    from hexlayout.ops.gemm.config import CONFIGS
    from hexlayout.ops.gemm.kernels import gemm_sm90_kernel

    import hexlayout.lang as hl

    with pytest.raises(ValueError, match="CLUSTER=2: .*a K-major A"):
        gemm_sm90_kernel(hl.f16, "nk", a_layout="km").trace(CLUSTER=2)
    _arch(monkeypatch, "sm_90a")
    cfg = next(c for c in CONFIGS["sm_90a"] if c.cluster == 2)
    g = torch.Generator().manual_seed(21)
    a = torch.randn(40, 64, generator=g).half().t()                  # 64 x 40, M-major
    b = torch.randn(72, 40, generator=g).half()
    c = hexlayout.ops.gemm(a, b, activation="relu", config=cfg)
    _close(c, _ref(a, b, activation="relu"), torch.float16)


# (a's logical major-ness, its padding, b's, its padding, b_layout) -> the stored operands'
# leading-stride flags ``ld`` and the kernel name's suffix
LEAD_CASES = [
    (("k", 0, "k", 0, "nk"), (False, False), "nk"),
    (("mn", 0, "mn", 0, "kn"), (False, False), "km_kn"),      # dense transposes: dense stored
    (("k", 8, "k", 0, "nk"), (True, False), "nk_lda"),
    (("k", 0, "mn", 16, "kn"), (False, True), "kn_ldb"),
    (("mn", 8, "k", 8, "nk"), (True, True), "km_nk_ldab"),
]


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize(("case", "ld", "suffix"), LEAD_CASES, ids=[c[2] for c in LEAD_CASES])
def test_dense_operands_take_the_kernel_without_leading_strides(monkeypatch, arch, case, ld, suffix) -> None:
    """``kernels.leading_dims`` picks the variant: a stored operand whose leading stride is its
    row length (dense, transposed dense views too) is a dense parameter of the launched kernel
    (no ``LDA`` / ``LDB``: not in its parameter types, its size variables or its CUDA); a slice
    with a wider leading stride takes the free-stride one. The emulated results (NaN-filled
    output, NaN around the slices) match float64."""
    import importlib

    from hexlayout.ops.gemm.kernels import leading_dims

    E = importlib.import_module("hexlayout.runtime.emulate")   # (the package exports the function)

    _arch(monkeypatch, arch)
    builds = []
    real = E.emulate
    monkeypatch.setattr(E, "emulate", lambda bld, *args, **kw: builds.append(bld) or real(bld, *args, **kw))
    a_major, a_pad, b_major, b_pad, b_layout = case
    m, n, k = (72, 48, 40) if arch == "sm_80" else (80, 56, 72)
    g = torch.Generator().manual_seed(7 * m + sum(ld) + len(suffix))
    dt = torch.bfloat16 if sum(ld) % 2 else torch.float16
    a = _matrix(m, k, "row" if a_major == "k" else "col", a_pad, dt, g)
    bl = _matrix(n, k, "row" if b_major == "k" else "col", b_pad, dt, g)
    b = bl if b_layout == "nk" else bl.t()
    _, _, a_st, b_st, copied = G.stored_operands(a, b, b_layout)
    assert not copied and leading_dims(a_st, b_st) == ld
    bias = torch.randn(n, generator=g).to(dt)
    c = hexlayout.ops.gemm(a, b, bias=bias, activation="relu", b_layout=b_layout)
    _close(c, _ref(a, b, bias=bias, activation="relu", b_layout=b_layout), dt)
    (bld,) = builds
    tk = bld.tile_kernel
    kname = f"gemm_{arch.replace('_', '').rstrip('a')}_{'bf16' if dt == torch.bfloat16 else 'f16'}_{suffix}"
    assert tk.name.endswith(f"__{kname}"), tk.name
    params = {p.name: p for p in tk.params}
    for name, lead, free in (("a", "LDA", ld[0]), ("b", "LDB", ld[1])):
        assert (lead in str(params[name].stride)) == free, (name, params[name].stride)
        assert (lead in bld.generated.source) == free, name


def test_leading_dims_of_matrices_batches_and_prologue_operands() -> None:
    """Dense: leading stride == row length, or one row (its leading stride is never used);
    batches by their last two modes; ``None`` (a prologue's operand) dense."""
    from hexlayout.ops.gemm.kernels import leading_dims

    x = torch.empty(16, 40)
    assert leading_dims(x, x.t().contiguous()) == (False, False)
    assert leading_dims(x[:, :32], x.t()) == (True, True)
    assert leading_dims(x[:1, :8], None) == (False, False)
    assert leading_dims(torch.empty(3, 16, 40), torch.empty(3, 16, 48)[:, :, :40]) == (False, True)


@pytest.mark.parametrize("pad", [0, 8])
def test_fused_gemm_takes_the_variant_of_its_operands(emulate, pad) -> None:
    """A fused GEMM (``torch.compile(backend="hexlayout")`` of ``relu(x @ w.t() + bias)``) runs
    the anchor's dense variant on a dense ``x`` and the ``LDA`` one on a column slice of a
    wider tensor (NaN past the slice), both matching float64."""
    import warnings

    from hexlayout.fusion.fused_op import FusionWarning
    from hexlayout.runtime.launch_log import launch_log

    torch._dynamo.reset()
    g = torch.Generator().manual_seed(21 + pad)
    x = _matrix(40, 64, "row", pad, torch.float16, g)
    w = torch.randn(48, 64, generator=g).half()
    bias = torch.randn(48, generator=g).half()
    f = torch.compile(lambda x, w, bias: torch.relu(x @ w.t() + bias), backend="hexlayout",
                      options={"fallback": "eager"})
    with warnings.catch_warnings(), launch_log() as log:
        warnings.simplefilter("error", FusionWarning)     # a kernel that fails to build is a bug
        out = f(x, w, bias)
    _close(out, _ref(x, w, bias=bias, activation="relu"), torch.float16)
    (rec,) = list(log)
    assert rec.name.endswith("gemm_sm80_f16_nk_lda" if pad else "gemm_sm80_f16_nk"), rec.name
