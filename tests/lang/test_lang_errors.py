"""Every class of user mistake is a KernelError naming the kernel, the op and the line."""

from __future__ import annotations

import os

import pytest

import hexlayout.lang as hl
from hexlayout.lang import KernelError, Layout, Swizzle, composition, f16, f32

from .kernels import K, M, line_of


def _check(err: KernelError, kernel: hl.Kernel, op: str, snippet: str, *words: str) -> None:
    line = line_of(kernel, snippet)
    msg = str(err)
    assert isinstance(err, ValueError)
    assert err.kernel == kernel.name and err.op == op
    assert err.loc is not None and err.loc.line == line, msg
    assert msg.startswith(f"{kernel.name}: {op} at {os.path.basename(__file__)}:{line} `")
    assert snippet in msg
    for w in words:
        assert w in msg, msg


def test_mma_shape_mismatch() -> None:
    @hl.kernel(threads=128)
    def bad_mma(a: f16[M, K]):
        ra = hl.register(f16, (128, 32))
        rb = hl.register(f16, (64, 16))
        acc = hl.zeros((128, 64), f32)
        hl.mma(ra, rb, acc)

    with pytest.raises(KernelError) as e:
        bad_mma.trace()
    _check(e.value, bad_mma, "mma", "hl.mma(ra, rb, acc)", "%ra", "%rb", "(128,32)", "(64,16)", "K differs")


def test_mma_accumulator_shape() -> None:
    @hl.kernel(threads=128)
    def bad_acc(a: f16[M, K]):
        ra = hl.register(f16, (128, 32))
        rb = hl.register(f16, (64, 32))
        acc = hl.zeros((64, 64), f32)
        hl.mma(ra, rb, acc)

    with pytest.raises(KernelError) as e:
        bad_acc.trace()
    _check(e.value, bad_acc, "mma", "hl.mma(ra, rb, acc)", "M differs", "%acc")


def test_copy_dtype_mismatch() -> None:
    @hl.kernel(threads=128)
    def bad_dtype(a: f16[M, K]):
        r = hl.register(f32, (64, 32))
        hl.copy(a.tile((64, 32), (0, 0)), r)

    with pytest.raises(KernelError) as e:
        bad_dtype.trace()
    _check(e.value, bad_dtype, "copy", "hl.copy(a.tile((64, 32), (0, 0)), r)", "element types differ",
           "%a_tile", "%r ", "hl.cast")


def test_copy_shape_mismatch() -> None:
    @hl.kernel(threads=128)
    def bad_shape(a: f16[M, K]):
        s = hl.shared(f16, (64, 64))
        hl.copy(a.tile((64, 32)), s)

    with pytest.raises(KernelError) as e:
        bad_shape.trace()
    _check(e.value, bad_shape, "copy", "hl.copy(a.tile((64, 32)), s)", "shapes differ", "(64,64)")


def test_copy_wrong_scope_pair() -> None:
    @hl.kernel(threads=128)
    def bad_scope(a: f16[M, K]):
        s1 = hl.shared(f16, (64, 32))
        s2 = hl.shared(f16, (64, 32))
        hl.copy(s1, s2)

    with pytest.raises(KernelError) as e:
        bad_scope.trace()
    _check(e.value, bad_scope, "copy", "hl.copy(s1, s2)", "shared -> shared", "%s1", "%s2")


def test_copy_global_to_global_and_register_to_register() -> None:
    @hl.kernel(threads=128)
    def bad_rr(a: f16[M, K]):
        r1 = hl.register(f16, (64, 32))
        r2 = hl.register(f16, (64, 32))
        hl.copy(r1, r2)

    with pytest.raises(KernelError, match="register -> register.*hl.rearrange"):
        bad_rr.trace()


def test_bad_explicit_layout_size() -> None:
    @hl.kernel(threads=128)
    def bad_layout(a: f16[M, K]):
        hl.shared(f16, (64, 32), layout=composition(Swizzle(3, 3, 3), Layout((64, 64), (64, 1))))

    with pytest.raises(KernelError) as e:
        bad_layout.trace()
    _check(e.value, bad_layout, "shared", "hl.shared(f16, (64, 32), layout=", "size 4096", "2048",
           "tensor %t")


def test_bad_explicit_layout_not_injective_and_mode_sizes() -> None:
    @hl.kernel(threads=128)
    def bad_inj(a: f16[M, K]):
        sa = hl.shared(f16, (8, 8), layout=Layout((8, 8), (1, 1)))  # noqa: F841

    with pytest.raises(KernelError, match="not injective") as e:
        bad_inj.trace()
    assert "%sa" in str(e.value)

    @hl.kernel(threads=128)
    def bad_modes(a: f16[M, K]):
        sa = hl.shared(f16, (8, 8), layout=Layout((4, 16), (16, 1)))  # noqa: F841

    with pytest.raises(KernelError, match="mode 0"):
        bad_modes.trace()


def test_bad_tv_layout() -> None:
    @hl.kernel(threads=64)
    def bad_tv(a: f16[M, K]):
        r = hl.register(f32, (16, 8), layout=Layout((128, 1), (1, 0)))  # noqa: F841

    with pytest.raises(KernelError, match="uses 128 threads, the block has 64"):
        bad_tv.trace()

    @hl.kernel(threads=128)
    def bad_tv2(a: f16[M, K]):
        r = hl.register(f32, (16, 16), layout=Layout((32, 4), (1, 32)))  # noqa: F841

    with pytest.raises(KernelError, match="covers a tile of 128 elements, the tensor has 256"):
        bad_tv2.trace()


def test_slice_out_of_range() -> None:
    @hl.kernel(threads=128)
    def bad_slice(a: f16[M, K]):
        sa = hl.shared(f16, (64, 32, 3))
        x = sa[:, :, 3]  # noqa: F841

    with pytest.raises(KernelError) as e:
        bad_slice.trace()
    _check(e.value, bad_slice, "slice", "x = sa[:, :, 3]", "index 3 out of range for mode 2", "%sa",
           "extent 3")


def test_subtile_out_of_range() -> None:
    @hl.kernel(threads=128)
    def bad_sub(a: f16[M, K]):
        r = hl.register(f32, (64, 64))
        x = r.tile((16, 16), (56, 0))  # noqa: F841

    with pytest.raises(KernelError, match=r"window \[56, 72\) out of range"):
        bad_sub.trace()


def test_unknown_atom() -> None:
    @hl.kernel(threads=128)
    def bad_atom(a: f16[M, K]):
        ra = hl.register(f16, (64, 16))
        rb = hl.register(f16, (64, 16))
        acc = hl.zeros((64, 64), f32)
        hl.mma(ra, rb, acc, atom="SM80_16x8x16_F32F16F16F32_TX")

    with pytest.raises(KernelError) as e:
        bad_atom.trace()
    _check(e.value, bad_atom, "mma", "hl.mma(ra, rb, acc, atom=", "unknown atom",
           "SM80_16x8x16_F32F16F16F32_TN")


def test_atom_dtype_mismatch() -> None:
    @hl.kernel(threads=128)
    def bad_atom_dt(a: f16[M, K]):
        ra = hl.register(f16, (64, 16))
        rb = hl.register(f16, (64, 16))
        acc = hl.zeros((64, 64), f32)
        hl.mma(ra, rb, acc, atom="SM80_16x8x16_F32BF16BF16F32_TN")

    with pytest.raises(KernelError, match="takes a as bf16, but a is %ra f16"):
        bad_atom_dt.trace()


def test_break_inside_range() -> None:
    @hl.kernel(threads=128)
    def bad_break(a: f16[M, K]):
        acc = hl.zeros((64, 64), f32)
        for k in hl.range(4):  # noqa: B007
            hl.fill(acc, 1.0)
            break
        hl.syncthreads()

    with pytest.raises(KernelError) as e:
        bad_break.trace()
    _check(e.value, bad_break, "range", "for k in hl.range(4):  # noqa: B007", "break")


def test_return_inside_range() -> None:
    @hl.kernel(threads=128)
    def bad_return(a: f16[M, K]):
        for k in hl.range(4):  # noqa: B007
            return

    with pytest.raises(KernelError, match="`break` or `return`"):
        bad_return.trace()


def test_exception_inside_range_propagates() -> None:
    @hl.kernel(threads=128)
    def raises(a: f16[M, K]):
        for k in hl.range(4):  # noqa: B007
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        raises.trace()


def test_expression_used_as_python_bool() -> None:
    @hl.kernel(threads=128)
    def bad_bool(a: f16[M, K]):
        pid = hl.grid(hl.spatial(hl.cdiv(a.shape[0], 64)))
        if pid < 3:
            hl.syncthreads()

    with pytest.raises(KernelError) as e:
        bad_bool.trace()
    _check(e.value, bad_bool, "bool", "if pid < 3:", "no Python truth value", "hl.if_")


def test_python_range_over_symbolic_size() -> None:
    @hl.kernel(threads=128)
    def bad_range(a: f16[M, K]):
        for _k in range(a.shape[1] // 32):
            hl.syncthreads()

    with pytest.raises(KernelError) as e:
        bad_range.trace()
    _check(e.value, bad_range, "range", "for _k in range(a.shape[1] // 32):", "K / 32",
           "not a Python integer", "use hl.range")


def test_symbolic_size_used_as_python_int() -> None:
    @hl.kernel(threads=128)
    def bad_int(a: f16[M, K]):
        tile_m = (64, 128)[a.shape[0] % 2]
        hl.zeros((tile_m, 16), f32)

    with pytest.raises(KernelError) as e:
        bad_int.trace()
    _check(e.value, bad_int, "int", "tile_m = (64, 128)[a.shape[0] % 2]", "M % 2 is not a Python integer",
           "hl.range")


def test_tile_used_as_python_bool() -> None:
    @hl.kernel(threads=128)
    def bad_tile_bool(a: f16[M, K]):
        r = hl.zeros((16, 16), f32)
        if r > 0:
            pass

    with pytest.raises(KernelError) as e:
        bad_tile_bool.trace()
    _check(e.value, bad_tile_bool, "bool", "if r > 0:", "hl.where")


def test_python_errors_propagate_unchanged() -> None:
    @hl.kernel(threads=128)
    def typo(a: f16[M, K]):
        hl.zeros((16, 16), f32)
        return undefined_name  # noqa: F821

    with pytest.raises(NameError):
        typo.trace()


def test_else_without_if() -> None:
    @hl.kernel(threads=128)
    def bad_else(a: f16[M, K]):
        with hl.if_(hl.thread_index() < 32):
            hl.syncthreads()
        hl.syncthreads()
        with hl.else_():
            pass

    with pytest.raises(KernelError) as e:
        bad_else.trace()
    _check(e.value, bad_else, "else_", "with hl.else_():", "directly follow")


def test_elementwise_errors() -> None:
    @hl.kernel(threads=128)
    def bad_bcast(a: f16[M, K]):
        x = hl.zeros((16, 8), f32)
        y = hl.zeros((16, 4), f32)
        z = x + y  # noqa: F841

    with pytest.raises(KernelError) as e:
        bad_bcast.trace()
    _check(e.value, bad_bcast, "+", "z = x + y", "do not broadcast", "%x f32(16,8)", "%y f32(16,4)")

    @hl.kernel(threads=128)
    def bad_types(a: f16[M, K]):
        x = hl.zeros((16, 8), f32)
        y = hl.zeros((16, 8), f16)
        z = x * y  # noqa: F841

    with pytest.raises(KernelError, match="element types differ.*hl.cast"):
        bad_types.trace()

    @hl.kernel(threads=128)
    def bad_scope_math(a: f16[M, K]):
        s = hl.shared(f32, (16, 8))
        z = s * 2.0  # noqa: F841

    with pytest.raises(KernelError, match="register tiles.*%s f32\\(16,8\\) shared"):
        bad_scope_math.trace()


def test_misc_errors() -> None:
    @hl.kernel(threads=128)
    def dyn_shape(a: f16[M, K]):
        hl.register(f16, (a.shape[0], 16))

    with pytest.raises(KernelError, match="static integers"):
        dyn_shape.trace()

    @hl.kernel(threads=128)
    def twice(a: f16[M, K]):
        hl.grid(hl.spatial(4))
        hl.grid(hl.spatial(4))

    with pytest.raises(KernelError, match="already called"):
        twice.trace()

    @hl.kernel(threads=128)
    def bad_view(a: f16[M, K]):
        a.tile((64,), (0,))

    with pytest.raises(KernelError, match="1 modes, tensor a has 2"):
        bad_view.trace()

    @hl.kernel(threads=128)
    def bad_wg(a: f16[M, K]):
        with hl.warp_group(1):
            pass

    with pytest.raises(KernelError, match="warp group 1 out of range"):
        bad_wg.trace()

    @hl.kernel(threads=128)
    def bad_nreg(a: f16[M, K]):
        hl.setmaxnreg(100)

    with pytest.raises(KernelError, match="multiple of 8"):
        bad_nreg.trace()

    @hl.kernel(threads=128)
    def bad_tma(a: f16[M, K]):
        bars = hl.mbarrier(2)
        r = hl.register(f16, (64, 32))
        hl.copy(a.tile((64, 32)), r, mbarrier=bars[1])

    with pytest.raises(KernelError, match="global->shared bulk"):
        bad_tma.trace()

    @hl.kernel(threads=128)
    def bad_bar(a: f16[M, K]):
        bars = hl.mbarrier(2)
        hl.wait(bars, 2, 0)

    with pytest.raises(KernelError, match="index 2 out of range for mbarrier %bars of 2"):
        bad_bar.trace()


def test_signature_errors() -> None:
    def untyped(a, *, BM: int = 1):
        pass

    with pytest.raises(KernelError, match="needs a tensor type"):
        hl.kernel(untyped)

    @hl.kernel(threads=128)
    def needs_const(a: f16[M, K], *, BM: int):
        pass

    with pytest.raises(KernelError, match="BM has no default"):
        needs_const.trace()
    with pytest.raises(KernelError, match="unknown constant"):
        needs_const.trace(BM=1, BX=2)
    @hl.kernel(threads=100)
    def odd_threads(a: f16[M, K]):
        pass

    with pytest.raises(KernelError, match="threads=100"):
        odd_threads.trace()
    assert issubclass(KernelError, ValueError)


def test_ops_outside_a_kernel() -> None:
    with pytest.raises(KernelError, match="outside a kernel"):
        hl.syncthreads()


def test_expr_on_the_left_of_a_tile() -> None:
    @hl.kernel(threads=128)
    def expr_left(a: f16[M, K]):
        cols = hl.iota((16, 16), 1)
        shifted = hl.thread_index() + cols  # noqa: F841

    with pytest.raises(KernelError) as e:
        expr_left.trace()
    _check(e.value, expr_left, "expression", "shifted = hl.thread_index() + cols", "tile + expr")
