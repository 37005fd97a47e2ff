"""Argument checks of ``bind_args``: every kind of mismatch is an ``ArgumentError`` naming the
kernel, the argument and what was expected; grids and kernel argument values."""

from __future__ import annotations

import subprocess
import sys
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from hexlayout.ir.lower.copy import Requirement
from hexlayout.runtime import ArgumentError, bind_args
from hexlayout.runtime.tensormap import TensorMapParams


def _gemm_args(m: int, n: int, k: int, dtype: torch.dtype = torch.float16):
    return (torch.randn(m, k).to(dtype), torch.randn(n, k).to(dtype), torch.empty(m, n, dtype=dtype))


def _error(build, tensors, scalars=None, lowered=None, device: str = "cpu") -> ArgumentError:
    with pytest.raises(ArgumentError) as info:
        bind_args(build, lowered, tensors, scalars, device=device)
    err = info.value
    assert isinstance(err, ValueError)
    assert str(err).startswith(f"{err.kernel}: ")
    return err


# --- what a successful bind gives ------------------------------------------------------------------

def test_values_follow_generated_args_and_grid_from_sizes(gemm80) -> None:
    a, b, c = _gemm_args(100, 72, 64)
    bound = bind_args(gemm80, None, (a, b, c), device="cpu")
    kinds = [x.kind for x in gemm80.generated.args]
    assert kinds == ["tensor"] * 3 + ["size"] * 3
    assert bound.values == [a.data_ptr(), b.data_ptr(), c.data_ptr(), 100, 64, 72]
    assert bound.sizes == {"M": 100, "K": 64, "N": 72}
    assert bound.grid == (2, 2, 1)          # (cdiv(N, 64), cdiv(M, 64))
    assert bound.device == "cpu" and not bound.empty
    assert set(bound.tensors) == {"a", "b", "c"}


def test_mapping_sequence_and_scalars_forms_agree(gemm80) -> None:
    a, b, c = _gemm_args(33, 18, 32)
    by_pos = bind_args(gemm80, None, (a, b, c), device="cpu")
    by_name = bind_args(gemm80, None, {"c": c, "a": a, "b": b}, device="cpu")
    mixed = bind_args(gemm80, None, (a,), {"b": b, "c": c}, device="cpu")
    assert by_pos.values == by_name.values == mixed.values
    assert by_pos.grid == (1, 1, 1)


def test_grid_of_a_3d_launch_and_float_scalar(attention) -> None:
    q = torch.randn(2, 130, 4, 128).half()
    kv = torch.randn(2, 64, 4, 128).half()
    o = torch.empty_like(q)
    bound = bind_args(attention, None, (q, kv, kv.clone(), o, 0.125), device="cpu")
    assert bound.grid == (2, 4, 2)          # (cdiv(Sq, 128), H, B)
    assert bound.scalars == {"qk_scale": 0.125}
    assert bound.sizes == {"B": 2, "Sq": 130, "H": 4, "D": 128, "Sk": 64, "KVH": 4, "qk_scale": 0.125}


def test_zero_sized_grid_is_empty(gemm80) -> None:
    bound = bind_args(gemm80, None, _gemm_args(0, 8, 8), device="cpu")
    assert bound.empty and bound.grid[1] == 0


def test_fast_path_rechecks_pointers_and_scalars(gemm80, scalars_kernel) -> None:
    a, b, c = _gemm_args(64, 64, 64)
    first = bind_args(gemm80, None, (a, b, c), device="cpu")
    a2, b2, c2 = _gemm_args(64, 64, 64)
    second = bind_args(gemm80, None, (a2, b2, c2), device="cpu")   # same shapes: cached plan entry
    assert second.values[:3] == [a2.data_ptr(), b2.data_ptr(), c2.data_ptr()]
    assert second.grid == first.grid
    off = torch.empty(64 * 64 + 1, dtype=torch.float16)[1:].view(64, 64)
    err = _error(gemm80, (off, b2, c2))
    assert err.arg == "a" and "not 16-byte aligned" in str(err)
    x, y = torch.zeros(5, 16), torch.zeros(3, 5)
    bind_args(scalars_kernel, None, (x, 5, 1.0, y), device="cpu")
    err = _error(scalars_kernel, (x, 5, "one", y))
    assert err.arg == "alpha" and "float scalar" in str(err)
    for bad in ("0.5", None, True):                   # a numeric string is not a number either
        err = _error(scalars_kernel, (x, 5, bad, y))
        assert err.arg == "alpha" and "float scalar" in str(err) and repr(bad) in str(err)


def test_scalar_that_is_a_size_and_free_stride_variable(scalars_kernel) -> None:
    x = torch.zeros(5, 16)
    base = torch.zeros(3, 8)
    y = base[:, :5]                                   # strides (8, 1): the free stride LDY = 8
    bound = bind_args(scalars_kernel, None, (x, 5, 0.5, y), device="cpu")
    assert bound.sizes == {"n": 5, "alpha": bound.scalars["alpha"], "R": 3, "LDY": 8}
    assert bound.grid == (1, 3, 1)
    assert bound.scalars["alpha"] == 0x3800         # f16 0.5 as its bit pattern
    err = _error(scalars_kernel, (x, 6, 0.5, y))
    assert err.arg == "x" and "size n is 6 from scalar 'n'" in str(err)


# --- each kind of error ------------------------------------------------------------------------------

def test_tensor_vs_scalar(gemm80, scalars_kernel) -> None:
    a, b, _ = _gemm_args(8, 8, 8)
    err = _error(gemm80, (a, b, 3))
    assert err.arg == "c" and "expected a tensor (c: f16[M, N]), got the scalar 3" in str(err)
    x, y = torch.zeros(5, 16), torch.zeros(3, 5)
    err = _error(scalars_kernel, (x, torch.tensor([5]), 1.0, y))
    assert err.arg == "n" and "expected a scalar (s32)" in str(err)
    err = _error(scalars_kernel, (x, 5.5, 1.0, y))
    assert err.arg == "n" and "integer scalar" in str(err)
    err = _error(scalars_kernel, (x, 2**31, 1.0, y))
    assert err.arg == "n" and "outside the range of s32" in str(err)


def test_missing_unknown_repeated_and_extra_arguments(gemm80) -> None:
    a, b, c = _gemm_args(8, 8, 8)
    err = _error(gemm80, (a, b))
    assert err.arg == "c" and "missing; the kernel takes a, b, c" in str(err)
    err = _error(gemm80, {"a": a, "b": b, "c": c, "d": c})
    assert err.arg == "d" and "no such parameter" in str(err)
    err = _error(gemm80, (a, b, c), {"a": a})
    assert err.arg == "a" and "given twice" in str(err)
    err = _error(gemm80, (a, b, c, c))
    assert "4 positional arguments" in str(err)


def test_device(gemm80) -> None:
    a, b, c = _gemm_args(8, 8, 8)
    err = _error(gemm80, (a, b, c), device="cuda")
    assert err.arg == "a" and "is on cpu, expected a CUDA device" in str(err)
    err = _error(gemm80, (a, b.to("meta"), c))
    assert err.arg == "b" and "is on meta, expected the CPU" in str(err)
    err = _error(gemm80, (a.numpy(), b.numpy(), c.numpy()), device="cuda")
    assert "numpy array (host memory)" in str(err)


def test_dtype_and_rank(gemm80) -> None:
    a, b, c = _gemm_args(8, 8, 8)
    err = _error(gemm80, (a.float(), b, c))
    assert err.arg == "a" and "has dtype torch.float32, expected torch.float16 (f16)" in str(err)
    err = _error(gemm80, (a, b.bfloat16(), c))
    assert err.arg == "b" and "torch.bfloat16" in str(err)
    err = _error(gemm80, (a, b, c[None]))
    assert err.arg == "c" and "has 3 dimensions (shape (1, 8, 8)), expected 2 (c: f16[M, N])" in str(err)
    err = _error(gemm80, (a.numpy().astype(np.float32), b.numpy(), c.numpy()))
    assert err.arg == "a" and "expected float16" in str(err)


def test_shared_sizes_must_agree(gemm80) -> None:
    a, b, _ = _gemm_args(100, 72, 64)
    err = _error(gemm80, (a, b, torch.empty(101, 72, dtype=torch.float16)))
    assert err.arg == "c"
    assert "dimension 0 is 101 but size M is 100 from dimension 0 of 'a' (c: f16[M, N])" in str(err)
    err = _error(gemm80, (a, torch.empty(72, 32, dtype=torch.float16), torch.empty(100, 72).half()))
    assert err.arg == "b" and "size K is 64" in str(err)


def test_static_extents(scalars_kernel) -> None:
    err = _error(scalars_kernel, (torch.zeros(5, 8), 5, 1.0, torch.zeros(3, 5)))
    assert err.arg == "x" and "has shape (5, 8), expected (n, 16) = (5, 16) (x: f32[n, 16])" in str(err)


def test_strides_follow_the_parameter(gemm80) -> None:
    a, b, c = _gemm_args(64, 64, 64)
    err = _error(gemm80, (a.t(), b, c))                          # same shape, column-major
    assert err.arg == "a"
    assert "has strides (1, 64) (elements), expected (K, 1) = (64, 1)" in str(err)
    assert "row-major contiguous" in str(err)
    # dimensions of extent 1 may have any stride, as in torch
    row = torch.empty(64, 2, dtype=torch.float16)[:, :1].t()     # shape (1, 64), strides (1, 2)
    wide = torch.empty(1, 128, dtype=torch.float16)[:, ::2]      # shape (1, 64), strides (128, 2)
    bind_args(gemm80, None, (torch.empty(1, 64).half(), b, torch.empty(1, 64).half()), device="cpu")
    assert row.shape == wide.shape == (1, 64)
    err = _error(gemm80, (wide, b, torch.empty(1, 64).half()))
    assert "expected (K, 1) = (64, 1)" in str(err)


def test_requirement_modes_refer_to_the_tensor(attention) -> None:
    # the copies are of (Sq, D) tiles of (B, Sq, H, D) tensors: the vector mode is D, not Sq
    q, kv = torch.randn(1, 130, 2, 128).half(), torch.randn(1, 72, 2, 128).half()
    bind_args(attention, None, (q, kv, kv, torch.empty_like(q), 1.0), device="cpu")
    q = torch.randn(1, 64, 2, 132).half()
    err = _error(attention, (q, q, q, q, 1.0))
    assert err.arg == "q" and "expected a multiple of 8" in str(err)


def test_requirements_alignment_vector_strides_and_extents(gemm80) -> None:
    a, b, c = _gemm_args(64, 64, 60)
    err = _error(gemm80, (a, b, c))
    assert err.arg == "a"
    assert "stride 0 is 60 elements, expected a multiple of 8 (8-element vectors start aligned" in str(err)
    a, b, c = _gemm_args(64, 64, 64)
    mis = torch.empty(64 * 64 + 4, dtype=torch.float16)[4:].view(64, 64)     # 8-byte aligned only
    err = _error(gemm80, (mis, b, c))
    assert err.arg == "a" and "is not 16-byte aligned (needed for 8-element vector accesses)" in str(err)
    # the hint is one that works: .contiguous() returns the misaligned view itself, .clone() a fresh copy
    assert ".clone()" in str(err)
    assert mis.contiguous().data_ptr() == mis.data_ptr()
    bind_args(gemm80, None, (mis.clone(), b, c), device="cpu")
    reqs = [Requirement("c", "extent_multiple", 16, 1, "a test requirement")]
    prog = SimpleNamespace(kernel=gemm80.lowered, requirements=reqs)
    args = (a, torch.empty(40, 64).half(), torch.empty(64, 40).half())
    err = _error(gemm80.generated, args, lowered=prog)
    assert err.arg == "c" and "dimension 1 is 40, expected a multiple of 16 (a test requirement)" in str(err)
    # the cached plan of the plain build is not confused with the one carrying extra requirements
    bind_args(gemm80, None, args, device="cpu")


def test_tma_requirements_and_tensor_maps(gemm90) -> None:
    a, b, c = _gemm_args(100, 72, 64)
    bound = bind_args(gemm90, None, (a, b, c), device="cpu")
    maps = [v for v in bound.values if isinstance(v, TensorMapParams)]
    assert [m.name for m in maps] == ["tma_a", "tma_b"] and maps == bound.tensor_maps
    assert maps[0].global_address == a.data_ptr() and maps[0].global_dims == (64, 100)
    assert maps[0].global_strides == (128,) and all(m.problems() == () for m in maps)
    a, b, c = _gemm_args(100, 72, 60)
    err = _error(gemm90, (a, b, c))
    assert err.arg == "a" and "stride 0 is 120 bytes, expected a multiple of 16 bytes (TMA global strides)" \
        in str(err)
    # a new pointer on the fast path re-addresses the tensor maps
    a, b, c = _gemm_args(100, 72, 64)
    again = bind_args(gemm90, None, (a, b, c), device="cpu")
    assert again.tensor_maps[0].global_address == a.data_ptr()
    assert again.tensor_maps[0]._replace(global_address=0) == bound.tensor_maps[0]._replace(global_address=0)


def test_32_bit_index_limit(gemm80) -> None:
    base = np.zeros(8, dtype=np.float16)
    huge = np.lib.stride_tricks.as_strided(base, shape=(2**28, 8), strides=(16, 2))
    b, c = np.zeros((8, 8), np.float16), np.zeros((2**28, 8), np.float16)[:0]
    err = _error(gemm80, {"a": huge, "b": b, "c": np.lib.stride_tricks.as_strided(base, (2**28, 8), (16, 2))})
    assert err.arg == "a" and "32-bit int" in str(err)
    assert c.shape == (0, 8)


def test_numpy_arrays_bind_on_cpu(gemm80) -> None:
    a, b, c = (x.numpy() for x in _gemm_args(16, 16, 16))
    bound = bind_args(gemm80, None, (a, b, c), device="cpu")
    assert bound.values[0] == a.ctypes.data and bound.sizes["M"] == 16


def test_importing_the_runtime_imports_neither_torch_nor_the_driver() -> None:
    code = ("import sys, hexlayout, hexlayout.runtime; "
            "assert 'torch' not in sys.modules, 'torch'; "
            "assert 'cuda.bindings.driver' not in sys.modules, 'driver'")
    subprocess.run([sys.executable, "-c", code], check=True)
