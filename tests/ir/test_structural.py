"""Structural identity of tile programs: equal for re-traces, different for any real change."""

from __future__ import annotations

import copy
import math
import subprocess
import sys
from collections.abc import Callable

import pytest

from hexlayout.ir.expr import Const
from hexlayout.ir.source import SourceLoc
from hexlayout.ir.structural import structural_hash, structural_key, structurally_equal
from hexlayout.ir.tile import Copy, Elementwise, Fill, For, GlobalView, Mma, TileKernel, Value
from hexlayout.ir.types import LayoutVar, f16
from hexlayout.ir.walk import walk
from hexlayout.lang.examples.flash_attention import flash_attention_fwd
from hexlayout.layout import Layout
from tests.lang.kernels import simple_gemm


def _retrace(kernel, **consts) -> TileKernel:  # type: ignore[no-untyped-def]
    kernel._cache.clear()
    return kernel.trace(**consts)


def _first(tk: TileKernel, cls: type) -> object:
    return next(op for op in walk(tk) if isinstance(op, cls))


def test_two_traces_of_one_kernel_are_equal_though_every_object_is_new() -> None:
    a, b = _retrace(simple_gemm), _retrace(simple_gemm)
    assert a is not b
    assert not {v.id for v in a.values()} & {v.id for v in b.values()}
    assert structurally_equal(a, b) and structural_key(a) == structural_key(b)
    assert structural_hash(a) == structural_hash(b)
    assert structural_key(a) == structural_key(copy.deepcopy(a))


def test_the_hash_is_the_same_in_another_process() -> None:
    code = ("from tests.lang.kernels import simple_gemm\n"
            "from hexlayout.ir.structural import structural_hash\n"
            "print(structural_hash(simple_gemm.trace()))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"PYTHONHASHSEED": "123", **__import__("os").environ})
    assert out.stdout.strip() == structural_hash(_retrace(simple_gemm))


def _mutations() -> dict[str, Callable[[TileKernel], None]]:
    def copy_instruction(tk: TileKernel) -> None:
        _first(tk, Copy).instruction = "ld.global.v4"  # type: ignore[attr-defined]

    def value_dtype(tk: TileKernel) -> None:
        v = _first(tk, Mma).a  # type: ignore[attr-defined]
        v.type = v.type.__class__(v.type.dtype.__class__(**{**v.type.dtype.__dict__, "name": "bf16"}),
                                  v.type.shape, v.type.scope, v.type.layout)

    def value_shape(tk: TileKernel) -> None:
        v = _first(tk, Mma).b  # type: ignore[attr-defined]
        v.type = v.type.__class__(v.type.dtype, (v.type.shape[0], 2 * v.type.shape[1]), v.type.scope,
                                  v.type.layout)

    def layout_given(tk: TileKernel) -> None:
        v = _first(tk, Mma).a  # type: ignore[attr-defined]
        v.type = v.type.with_layout(Layout((32, 4), (1, 32)))

    def layout_var_hint(tk: TileKernel) -> None:
        v = _first(tk, Mma).a  # type: ignore[attr-defined]
        v.type = v.type.with_layout(LayoutVar(hints={"stride": (None, 1)}))

    def two_values_share_a_layout_var(tk: TileKernel) -> None:
        m = _first(tk, Mma)
        m.b.type = m.b.type.with_layout(m.a.type.layout)  # type: ignore[attr-defined]

    def fill_constant(tk: TileKernel) -> None:
        _first(tk, Fill).value = -0.0  # type: ignore[attr-defined]

    def view_origin(tk: TileKernel) -> None:
        g = _first(tk, GlobalView)
        g.origin = (g.origin[0] + 1,) + tuple(g.origin[1:])  # type: ignore[attr-defined]

    def loop_step(tk: TileKernel) -> None:
        _first(tk, For).step = 2  # type: ignore[attr-defined]

    def loop_unroll(tk: TileKernel) -> None:
        _first(tk, For).unroll = True  # type: ignore[attr-defined]

    def op_moved_out_of_the_loop(tk: TileKernel) -> None:
        loop = _first(tk, For)
        i = tk.body.ops.index(loop)
        tk.body.ops.insert(i + 1, loop.body.ops.pop())  # type: ignore[attr-defined]

    def op_removed(tk: TileKernel) -> None:
        tk.body.ops.pop()

    def operands_swapped(tk: TileKernel) -> None:
        m = _first(tk, Mma)
        m.a, m.b = m.b, m.a  # type: ignore[attr-defined]

    def mma_atom(tk: TileKernel) -> None:
        _first(tk, Mma).atom = "SM80_16x8x16_F32F16F16F32_TN"  # type: ignore[attr-defined]

    def value_renamed(tk: TileKernel) -> None:
        _first(tk, Mma).c.name = "other"  # type: ignore[attr-defined]

    def threads(tk: TileKernel) -> None:
        tk.launch.threads = 256

    def grid(tk: TileKernel) -> None:
        tk.launch.grid = tuple(tk.launch.grid[:-1]) + (tk.launch.grid[-1] + 1,)

    def cluster(tk: TileKernel) -> None:
        tk.launch.cluster = (2, 1, 1)

    def constant(tk: TileKernel) -> None:
        tk.consts["BK"] = 16

    def param_stride(tk: TileKernel) -> None:
        p = tk.params[0]
        p.stride = (Const(1),) + tuple(p.stride[1:])  # type: ignore[union-attr]

    def param_dtype(tk: TileKernel) -> None:
        tk.params[2].dtype = f16.__class__(**{**f16.__dict__, "name": "e4m3"})  # type: ignore[union-attr]

    def kernel_name(tk: TileKernel) -> None:
        tk.name = "renamed"

    def source_line(tk: TileKernel) -> None:
        m = _first(tk, Mma)
        m.loc = SourceLoc(m.loc.file, m.loc.line + 1, m.loc.func, m.loc.code)  # type: ignore[union-attr]

    def source_code(tk: TileKernel) -> None:
        m = _first(tk, Mma)
        m.loc = SourceLoc(m.loc.file, m.loc.line, m.loc.func, "hl.mma(x, y, z)")  # type: ignore[union-attr]

    def source_file(tk: TileKernel) -> None:
        m = _first(tk, Mma)
        m.loc = SourceLoc("/elsewhere/other.py", m.loc.line, m.loc.func, m.loc.code)  # type: ignore[union-attr]

    return {f.__name__: f for f in (
        copy_instruction, value_dtype, value_shape, layout_given, layout_var_hint,
        two_values_share_a_layout_var, fill_constant, view_origin, loop_step, loop_unroll,
        op_moved_out_of_the_loop, op_removed, operands_swapped, mma_atom, value_renamed, threads, grid,
        cluster, constant, param_stride, param_dtype, kernel_name, source_line, source_code, source_file)}


MUTATIONS = _mutations()


@pytest.mark.parametrize("name", sorted(MUTATIONS))
def test_any_change_to_the_program_changes_the_key(name: str) -> None:
    ref = _retrace(simple_gemm)
    tk = _retrace(simple_gemm)
    MUTATIONS[name](tk)
    assert not structurally_equal(ref, tk)
    assert structural_hash(ref) != structural_hash(tk)


def test_different_constants_and_options_give_different_programs() -> None:
    keys = {structural_hash(_retrace(simple_gemm, BM=bm)) for bm in (32, 64, 128)}
    assert len(keys) == 3
    a = _retrace(flash_attention_fwd, CAUSAL=True)
    b = _retrace(flash_attention_fwd, CAUSAL=False)
    c = _retrace(flash_attention_fwd, CAUSAL=True, BN=32)
    assert len({structural_hash(t) for t in (a, b, c)}) == 3


def test_elementwise_constants_count_bit_for_bit() -> None:
    a, b = _retrace(flash_attention_fwd), _retrace(flash_attention_fwd)
    def finite(x: object) -> bool:
        return isinstance(x, float) and math.isfinite(x) and x != 0.0

    op = next(o for o in walk(b) if isinstance(o, Elementwise) and any(finite(x) for x in o.args))
    op.args = tuple(math.nextafter(x, math.inf) if finite(x) else x for x in op.args)
    assert not structurally_equal(a, b)


def test_what_does_not_count_directory_function_and_value_locations() -> None:
    ref, tk = _retrace(simple_gemm), _retrace(simple_gemm)
    for op in walk(tk):
        if op.loc is not None:
            op.loc = SourceLoc("/another/checkout/" + op.loc.filename, op.loc.line, "renamed_fn", op.loc.code)
        for v in op.values():
            v.loc = None
    assert structurally_equal(ref, tk)


def test_value_identity_pattern_counts() -> None:
    """Two values reading the same buffer differ from two distinct buffers of the same type."""
    ref, tk = _retrace(simple_gemm), _retrace(simple_gemm)
    m = _first(tk, Mma)
    twin = Value(m.c.name, m.c.type, m.c.loc)   # type: ignore[attr-defined]
    m.c = twin  # same name and type, but no longer the buffer the other ops use
    assert not structurally_equal(ref, tk)
