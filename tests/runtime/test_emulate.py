"""``emulate``: builds run thread by thread on CPU torch tensors (or numpy arrays), checked
like a launch, results written in place."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import hexlayout.lang as hl
from hexlayout.lang.examples.explicit import gemm_sm80_explicit
from hexlayout.runtime import ArgumentError, emulate
from hexlayout.synth.solve import synthesize


def _ref(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    return a.double() @ b.double().T


@pytest.mark.parametrize(("m", "n", "k"), [(64, 64, 32), (100, 72, 40), (7, 130, 24)])
def test_gemm_on_cpu_tensors_matches_torch(gemm80, m: int, n: int, k: int) -> None:
    g = torch.Generator().manual_seed(m * n + k)
    a = torch.randn(m, k, generator=g).half()
    b = torch.randn(n, k, generator=g).half()
    c = torch.full((m, n), float("nan"), dtype=torch.float16)
    report = emulate(gemm80, a, b, c)
    torch.testing.assert_close(c.double(), _ref(a, b), rtol=1e-2, atol=1e-2)
    assert report.blocks and report.seconds > 0


def test_bf16_through_ml_dtypes_views() -> None:
    prog = synthesize(gemm_sm80_explicit(hl.bf16, BM=64, BN=64).trace(), "sm_80").lowered
    g = torch.Generator().manual_seed(3)
    a, b = torch.randn(72, 40, generator=g).bfloat16(), torch.randn(136, 40, generator=g).bfloat16()
    c = torch.full((72, 136), float("nan"), dtype=torch.bfloat16)
    emulate(prog, a=a, b=b, c=c)
    torch.testing.assert_close(c.double(), _ref(a, b), rtol=2e-2, atol=1e-1)


def test_numpy_arrays(gemm80) -> None:
    rng = np.random.default_rng(1)
    a, b = rng.standard_normal((40, 16)).astype(np.float16), rng.standard_normal((24, 16)).astype(np.float16)
    c = np.zeros((40, 24), np.float16)
    emulate(gemm80, a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64).T, rtol=1e-2, atol=1e-2)


def test_checks_run_before_emulation(gemm80) -> None:
    a, b, c = torch.randn(8, 16).half(), torch.randn(8, 16).half(), torch.empty(8, 8).half()
    with pytest.raises(ArgumentError, match="'b': is on meta, expected the CPU"):
        emulate(gemm80, a, b.to("meta"), c)
    with pytest.raises(ArgumentError, match="has dtype torch.float32"):
        emulate(gemm80, a.float(), b, c)
    # rows of 12 elements break the build's 16-byte vectors: a build of the kernel runs them as
    # the build specialized on the call's alignment; the bare lowered kernel refuses them
    a, b = torch.randn(8, 12).half(), torch.randn(8, 12).half()
    emulate(gemm80, a, b, c)
    torch.testing.assert_close(c.double(), _ref(a, b), rtol=1e-2, atol=1e-2)
    with pytest.raises(ArgumentError, match="stride 0 is 12 elements, expected a multiple of 8"):
        emulate(gemm80.synthesis.lowered, a, b, c)


def test_empty_problem_runs_no_block(gemm80) -> None:
    report = emulate(gemm80, torch.empty(0, 16).half(), torch.randn(8, 16).half(), torch.empty(0, 8).half())
    assert report.blocks == []


def test_misaligned_base_is_refused_like_a_launch(gemm80) -> None:
    """A view 2 bytes off 16-byte alignment under the kernel's 16-byte cp.async faults on a GPU:
    refused before running, naming the argument, where the requirements are known but no
    build can be specialized (``emulate`` of the bare lowered program) or they are not
    known (``emulate`` of a bare lowered kernel, ``emulator.run``); a build runs it as the
    build specialized on the call's alignment."""
    from hexlayout.emulator import ArgumentError as EmulatorArgumentError
    from hexlayout.emulator import run

    a = torch.randn(64 * 32 + 1).half()[1:].view(64, 32)              # data pointer 2 bytes off
    assert a.data_ptr() % 16 == 2
    b, c = torch.randn(64, 32).half(), torch.zeros(64, 64).half()
    with pytest.raises(ArgumentError, match=r"argument 'a'.*not 16-byte aligned.*\.clone\(\)"):
        emulate(gemm80.synthesis.lowered, a, b, c)
    emulate(gemm80, a, b, c)
    torch.testing.assert_close(c.double(), _ref(a, b), rtol=1e-2, atol=1e-2)
    c.zero_()
    kernel = gemm80.synthesis.lowered.kernel
    with pytest.raises(EmulatorArgumentError, match=r"'a'.*2 bytes off 16-byte alignment.*cp\.async"):
        emulate(kernel, a, b, c)
    arrays = {"a": a.numpy(), "b": b.numpy(), "c": c.numpy()}
    with pytest.raises(EmulatorArgumentError, match=r"argument 'a'.*2 bytes off 16-byte alignment"):
        run(kernel, arrays)
    emulate(kernel, a.clone(), b, c)                                 # the copy the message suggests runs
    torch.testing.assert_close(c.double(), _ref(a, b), rtol=1e-2, atol=1e-2)


def test_scalars_are_numbers_of_their_kind(scalars_kernel) -> None:
    """``emulator.run`` refuses a string (also ``'0.5'``), ``None`` or a bool for a float scalar
    and a float for an integer one, naming the argument."""
    from hexlayout.emulator import ArgumentError as EmulatorArgumentError
    from hexlayout.emulator import run
    from hexlayout.emulator.run import check_scalars

    kernel = scalars_kernel.lowered
    x, y = np.zeros((5, 16), np.float32), np.zeros((3, 5), np.float32)
    for bad in ("0.5", None, True, "abc"):
        with pytest.raises(EmulatorArgumentError, match=rf"'alpha': expected a real number.*{bad!r}"):
            run(kernel, {"x": x, "n": 5, "alpha": bad, "y": y})
        with pytest.raises(ArgumentError, match="argument 'alpha'"):
            emulate(scalars_kernel, x, 5, bad, y)
    with pytest.raises(EmulatorArgumentError, match=r"argument 'n': expected an integer.*2\.5"):
        run(kernel, {"x": x, "n": 2.5, "alpha": 0.5, "y": y})
    check_scalars(kernel, {"x": x, "n": np.int32(5), "alpha": np.float16(0.5), "y": y})   # numpy numbers pass


def test_read_only_output_is_refused_naming_it(gemm80) -> None:
    """A read-only numpy array for a tensor the kernel writes is refused before running, naming
    the argument and the kernel (not numpy's "assignment destination is read-only" from inside
    the emulator); read-only inputs are fine."""
    from hexlayout.emulator import ArgumentError as EmulatorArgumentError
    from hexlayout.emulator import run

    rng = np.random.default_rng(7)
    a, b = rng.standard_normal((40, 16)).astype(np.float16), rng.standard_normal((24, 16)).astype(np.float16)
    c = np.zeros((40, 24), np.float16)
    c.setflags(write=False)
    kernel = gemm80.synthesis.lowered.kernel
    assert [p.name for p in kernel.written_params()] == ["c"]
    for call in (lambda: emulate(gemm80, a, b, c), lambda: run(kernel, {"a": a, "b": b, "c": c})):
        with pytest.raises(EmulatorArgumentError) as e:
            call()
        msg = str(e.value)
        assert e.value.kernel == kernel.name and kernel.name in msg, msg
        assert "argument 'c' is read-only" in msg and "x.copy()" in msg, msg
        assert "assignment destination" not in msg
    a.setflags(write=False)
    b = np.broadcast_to(b, (24, 16))                  # read-only view, same strides
    assert not b.flags.writeable
    c = np.zeros((40, 24), np.float16)
    emulate(gemm80, a, b, c)
    np.testing.assert_allclose(c, a.astype(np.float64) @ b.astype(np.float64).T, rtol=1e-2, atol=1e-2)


_M, _N = hl.dims("M N")


@hl.kernel(threads=32)
def _copy_colmajor(x: hl.f16[_M, _N].strides(1, "LDX"), y: hl.f16[_M, _N]):
    r = hl.register(hl.f16, (16, 16))
    hl.copy(hl.view(x, tile=(16, 16), origin=(0, 0)), r)
    hl.copy(r, hl.view(y, tile=(16, 16), origin=(0, 0)))


def test_strided_views_run_in_place_with_their_strides() -> None:
    """A transposed slice of a bigger tensor (strides (1, 24)) runs as it is: the emulator reads
    it by its strides (``LDX`` bound from them) and never the NaN memory around it; numpy
    strides that differ from the parameter's are an error naming it."""
    from hexlayout.emulator import run
    from hexlayout.emulator.errors import ArgumentError as EmulatorArgumentError
    from hexlayout.runtime import build

    bld = build(_copy_colmajor, "sm_80", compile=False)
    big = torch.full((10, 24), float("nan"), dtype=torch.float16)
    x = big[:, :16].t()                                          # 16 x 10, strides (1, 24)
    x.copy_(torch.randn(16, 10, generator=torch.Generator().manual_seed(0)).half())
    y = torch.full((16, 10), float("nan"), dtype=torch.float16)
    emulate(bld, x, y)
    assert torch.equal(y, x)
    xs = np.full((20, 24), np.nan, np.float16)[::2, :10]       # 10 x 10, element strides (48, 1)
    with pytest.raises(EmulatorArgumentError, match=r"'x' has element strides \(48, 1\), the parameter"):
        run(bld.synthesis.lowered.kernel, {"x": xs, "y": np.zeros((10, 10), np.float16)})
