"""torch.ops.hexlayout.gemm: eager through the emulator (HEXLAYOUT_EMULATE=1), argument
errors, the fake implementation and torch.compile; on a GPU, correctness against
torch.matmul over many shapes including Llama-3 projections."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import hexlayout.ops  # noqa: E402,F401 - registers the op

ATOL = {torch.float16: 1e-2, torch.bfloat16: 3e-2}


def _ref(a, b, bias=None, residual=None, activation="none", scale=None, b_layout="nk"):
    bb = b.double().t() if b_layout == "nk" else b.double()
    y = a.double() @ bb
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
    rel = ((c.double() - want).abs() / (want.abs() + 1)).max().item()
    assert rel < ATOL[dtype], rel


@pytest.fixture
def emulate(monkeypatch):
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("m", "n", "k", "b_layout", "ep"), [
    (100, 136, 72, "nk", {}),
    (64, 72, 40, "kn", {"activation": "gelu", "scale": 0.25}),
    (7, 96, 64, "nk", {"bias": True, "residual": True, "activation": "relu"}),
])
def test_emulated_op_matches_torch(emulate, dtype, m, n, k, b_layout, ep) -> None:
    g = torch.Generator().manual_seed(m + n + k)
    a = torch.randn(m, k, generator=g).to(dtype)
    b = torch.randn(n, k, generator=g).to(dtype)
    if b_layout == "kn":
        b = b.t().contiguous()
    kw = dict(ep)
    if kw.pop("bias", False):
        kw["bias"] = torch.randn(n, generator=g).to(dtype)
    if kw.pop("residual", False):
        kw["residual"] = torch.randn(m, n, generator=g).to(dtype)
    c = torch.ops.hexlayout.gemm(a, b, b_layout=b_layout, **kw)
    assert c.shape == (m, n) and c.dtype == dtype
    _close(c, _ref(a, b, b_layout=b_layout, **kw), dtype)


def test_sm90a_schedule_through_the_op(emulate, monkeypatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")
    a, b = torch.randn(130, 64).half(), torch.randn(200, 64).half()
    _close(torch.ops.hexlayout.gemm(a, b), _ref(a, b), torch.float16)


def test_cpu_without_emulation_is_a_clear_error(monkeypatch) -> None:
    monkeypatch.delenv("HEXLAYOUT_EMULATE", raising=False)
    a = torch.randn(16, 64).half()
    with pytest.raises(RuntimeError, match="HEXLAYOUT_EMULATE=1"):
        torch.ops.hexlayout.gemm(a, a)


@pytest.mark.parametrize(("args", "match"), [
    (lambda: (torch.randn(4, 8).half(), torch.randn(4, 16).half()), "K = 16"),
    (lambda: (torch.randn(4, 8).half(), torch.randn(4, 8).bfloat16()), "dtype"),
    (lambda: (torch.randn(4, 8).float(), torch.randn(4, 8).float()), "torch.float16"),
    (lambda: (torch.randn(2, 4, 8).half(), torch.randn(4, 8).half()), "matrix"),
])
def test_bad_arguments_name_the_problem(emulate, args, match) -> None:
    a, b = args()
    with pytest.raises((ValueError, RuntimeError), match=match):
        torch.ops.hexlayout.gemm(a, b)


def test_misaligned_rows_are_rejected_before_running(emulate) -> None:
    a, b = torch.randn(16, 36).half(), torch.randn(32, 36).half()     # K = 36: rows of 72 bytes
    with pytest.raises(ValueError, match=r"argument 'a': stride 0 is 36 elements, expected a multiple of 8"):
        torch.ops.hexlayout.gemm(a, b)


def test_fake_tensors_and_torch_compile(emulate) -> None:
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        x = torch.empty(1000, 4096, dtype=torch.bfloat16)
        y = torch.empty(4096, 512, dtype=torch.bfloat16)
        out = torch.ops.hexlayout.gemm(x, y, b_layout="kn")
        assert out.shape == (1000, 512) and out.dtype == torch.bfloat16
    meta = torch.ops.hexlayout.gemm(torch.empty(3, 64, device="meta", dtype=torch.float16),
                                    torch.empty(6, 64, device="meta", dtype=torch.float16))
    assert meta.shape == (3, 6) and meta.device.type == "meta"
    f = torch.compile(lambda a, b: torch.ops.hexlayout.gemm(a, b, activation="relu") + 1,
                      backend="eager", fullgraph=True)
    a, b = torch.randn(32, 64).half(), torch.randn(40, 64).half()
    _close(f(a, b), _ref(a, b, activation="relu") + 1, torch.float16)


LLAMA = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336), (10240, 8192), (8192, 8192),
         (57344, 8192), (8192, 28672)]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("m", [1, 16, 128, 4096])
@pytest.mark.parametrize(("n", "k"), LLAMA)
def test_gpu_llama_projection_shapes(dtype, m, n, k) -> None:
    a = torch.randn(m, k, device="cuda", dtype=dtype)
    b = torch.randn(n, k, device="cuda", dtype=dtype)
    c = torch.ops.hexlayout.gemm(a, b)
    want = torch.matmul(a.float(), b.float().t())
    rel = ((c.float() - want).abs() / (want.abs() + 1)).max().item()
    assert rel < ATOL[dtype]


@pytest.mark.gpu
@pytest.mark.parametrize(("m", "n", "k"), [(1, 2, 8), (33, 66, 72), (255, 258, 264), (1000, 3000, 520),
                                           (8192, 8192, 8192)])
@pytest.mark.parametrize("b_layout", ["nk", "kn"])
def test_gpu_ragged_shapes_and_epilogues(m, n, k, b_layout) -> None:
    a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    if b_layout == "kn":
        b = b.t().contiguous()
    bias = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    res = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    c = torch.ops.hexlayout.gemm(a, b, bias, res, "gelu", 0.5, b_layout)
    want = _ref(a.cpu(), b.cpu(), bias.cpu(), res.cpu(), "gelu", 0.5, b_layout)
    _close(c.cpu(), want, torch.bfloat16)


@pytest.mark.gpu
def test_gpu_cuda_graph_capture() -> None:
    a = torch.randn(256, 512, device="cuda", dtype=torch.float16)
    b = torch.randn(384, 512, device="cuda", dtype=torch.float16)
    torch.ops.hexlayout.gemm(a, b)           # build and load outside the capture
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = torch.ops.hexlayout.gemm(a, b)
    a.normal_()
    g.replay()
    torch.cuda.synchronize()
    _close(out.cpu(), _ref(a.cpu(), b.cpu()), torch.float16)
