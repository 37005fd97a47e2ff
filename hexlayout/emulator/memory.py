"""Global and shared memory as flat byte arrays, and vectorized byte gather / scatter.

* A global tensor argument is the user's numpy array, viewed as a flat buffer of its
  elements: a C-contiguous array as it is, a strided one (a transpose, a slice of a bigger
  array) as the span of memory from its first element to its last, sharing its memory; its
  in-bounds extent is the span its ``GlobalParam`` shape and strides address, evaluated with
  the scalar arguments: ``1 + sum((shape_i - 1) * stride_i)`` elements (0 if any extent is
  0). A symbolic extent takes the array's extent and a symbolic stride (a bare size
  variable) the array's element stride. Writes go straight into the user's array.
* Shared memory is one byte array of the kernel's dynamic shared-memory size; the
  dynamic shared window starts at shared address 0, so a ``SmemBuffer`` at byte
  ``offset`` has absolute shared addresses ``[offset, offset + nbytes)`` (swizzles of
  wgmma descriptors and TMA act on these absolute addresses).
* It starts filled with ``0xFF`` bytes (NaN for floats) unless asked otherwise, so a read
  of never-written shared memory shows up in results.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from hexlayout.ir.expr import Var, evaluate
from hexlayout.ir.lowered import LoweredKernel, SmemBuffer
from hexlayout.ir.tile import GlobalParam, ScalarParam

from .errors import ArgumentError

__all__ = ["GlobalTensor", "bind_arguments", "SharedMemory", "gather_bytes", "scatter_bytes", "byte_index"]


@dataclass
class GlobalTensor:
    """A bound global tensor: ``flat`` elements, ``raw`` bytes, ``extent`` elements in bounds."""

    param: GlobalParam
    array: np.ndarray
    flat: np.ndarray
    raw: np.ndarray
    extent: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]

    @property
    def name(self) -> str:
        return self.param.name

    @property
    def esize(self) -> int:
        return self.flat.itemsize


def bind_arguments(
    kernel: LoweredKernel, args: Mapping[str, Any]
) -> tuple[dict[int, GlobalTensor], dict[Var, int]]:
    """Check ``args`` against the kernel's parameters; returns ``(tensors by id(param), scalars)``."""
    scalars: dict[Var, int] = {}
    names = {p.name for p in kernel.params}
    extra = sorted(set(args) - names)
    if extra:
        raise ArgumentError(
            f"unknown argument(s) {', '.join(extra)}; parameters: {', '.join(sorted(names))}",
            kernel=kernel.name,
        )
    for p in kernel.params:
        if isinstance(p, ScalarParam):
            if p.name not in args:
                raise ArgumentError(f"missing scalar argument {p.name!r}", kernel=kernel.name)
            v = args[p.name]
            if isinstance(v, np.ndarray):
                v = v.item()
            scalars[p.var] = float(v) if p.dtype.is_float else int(v)
    _bind_sizes(kernel, args, scalars)
    tensors: dict[int, GlobalTensor] = {}
    for p in kernel.params:
        if not isinstance(p, GlobalParam):
            continue
        if p.name not in args:
            raise ArgumentError(f"missing tensor argument {p.name!r}", kernel=kernel.name)
        arr = args[p.name]
        if not isinstance(arr, np.ndarray):
            raise ArgumentError(
                f"argument {p.name!r} must be a numpy array, got {type(arr).__name__}", kernel=kernel.name
            )
        want = np.dtype(p.dtype.numpy())
        if arr.dtype != want:
            raise ArgumentError(
                f"argument {p.name!r} has dtype {arr.dtype}, the parameter is {p.dtype} ({want})",
                kernel=kernel.name,
                buffer=p.name,
            )
        shape = tuple(int(evaluate(s, scalars)) for s in p.shape)
        strides = tuple(int(evaluate(s, scalars)) for s in p.stride)
        extent = (
            0 if any(s == 0 for s in shape) else 1 + sum((s - 1) * abs(d) for s, d in zip(shape, strides))
        )
        flat = arr.reshape(-1) if arr.flags.c_contiguous else _span(kernel, p, arr, shape, strides)
        if flat.size < extent:
            raise ArgumentError(
                f"argument {p.name!r} has {flat.size} elements, its shape {shape} and strides "
                f"{strides} address {extent}",
                kernel=kernel.name,
                buffer=p.name,
            )
        tensors[id(p)] = GlobalTensor(p, arr, flat, flat.view(np.uint8), extent, shape, strides)
    return tensors, scalars


def _span(kernel: LoweredKernel, p: GlobalParam, arr: np.ndarray, shape: tuple[int, ...],
          strides: tuple[int, ...]) -> np.ndarray:
    """The flat buffer of a strided (not C-contiguous) ``arr``: the memory from its first
    element to its last, sharing ``arr``'s memory; its element strides must be the
    parameter's (``strides``) in every mode of extent > 1."""
    got = tuple(s // arr.itemsize for s in arr.strides)
    if arr.ndim != len(shape) or any(g * arr.itemsize != b or g < 0 for g, b in zip(got, arr.strides)) or any(
            g != d and n > 1 for g, d, n in zip(got, strides, arr.shape)):
        raise ArgumentError(
            f"argument {p.name!r} has element strides {got}, the parameter {strides}",
            kernel=kernel.name,
            buffer=p.name,
        )
    span = 0 if arr.size == 0 else 1 + sum((n - 1) * g for n, g in zip(arr.shape, got))
    return np.lib.stride_tricks.as_strided(arr, (span,), (arr.itemsize,), writeable=arr.flags.writeable)


def _bind_sizes(kernel: LoweredKernel, args: Mapping[str, Any], scalars: dict[Var, int]) -> None:
    """Symbolic extents (size variables in a parameter's shape) take the array's extents;
    a size shared by several tensors must agree. Then a stride that is a size variable not
    bound so takes the array's element stride in that mode."""
    for p in kernel.params:
        if not isinstance(p, GlobalParam) or not isinstance(args.get(p.name), np.ndarray):
            continue
        arr = args[p.name]
        if arr.ndim != len(p.shape):
            raise ArgumentError(f"argument {p.name!r} has {arr.ndim} dimensions, the parameter "
                                f"{len(p.shape)}", kernel=kernel.name, buffer=p.name)
        for i, s in enumerate(p.shape):
            if isinstance(s, Var):
                got = int(arr.shape[i])
                if s in scalars and scalars[s] != got:
                    raise ArgumentError(f"size {s.name} is {scalars[s]} elsewhere but dimension {i} of "
                                        f"{p.name!r} is {got}", kernel=kernel.name, buffer=p.name)
                scalars[s] = got
    for p in kernel.params:
        if isinstance(p, GlobalParam) and isinstance(args.get(p.name), np.ndarray):
            arr = args[p.name]
            for i, s in enumerate(p.stride):
                if isinstance(s, Var) and s not in scalars:
                    scalars[s] = int(arr.strides[i]) // arr.itemsize


class SharedMemory:
    """The block's shared memory: ``raw`` bytes, absolute addresses from 0."""

    def __init__(self, kernel: LoweredKernel, fill: int = 0xFF) -> None:
        self.nbytes = kernel.smem_bytes
        self.raw = np.full(max(self.nbytes, 1), fill, dtype=np.uint8)
        self.buffers: list[SmemBuffer] = list(kernel.smem)

    def buffer_at(self, addr: int) -> str:
        for b in self.buffers:
            if b.offset <= addr < b.offset + b.nbytes:
                return b.name
        return "<no buffer>"


def byte_index(addr: np.ndarray, nbytes: int) -> np.ndarray:
    """``[n, nbytes]`` byte addresses ``addr[i] + j``."""
    return addr.reshape(-1, 1) + np.arange(nbytes, dtype=np.int64)


def gather_bytes(raw: np.ndarray, addr: np.ndarray, nbytes: int) -> np.ndarray:
    """``raw[addr[i] : addr[i] + nbytes]`` for every ``i`` as a ``[n, nbytes]`` uint8 array."""
    return raw[byte_index(addr, nbytes)]


def scatter_bytes(raw: np.ndarray, addr: np.ndarray, data: np.ndarray) -> None:
    """``raw[addr[i] : addr[i] + nbytes] = data[i]`` (later rows win on overlap)."""
    raw[byte_index(addr, data.shape[1])] = data
