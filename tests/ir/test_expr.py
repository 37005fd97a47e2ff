"""Symbolic expressions: simplification keeps values; C printing means the same thing in C."""

from __future__ import annotations

import shutil
import subprocess

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from hexlayout.ir.expr import Const, Var, evaluate, select, substitute, to_c
from hexlayout.layout import Layout, Swizzle, composition
from hexlayout.layout.inttuple import crd2idx

T = Var("t", 0, 256)
K = Var("k", 0, 64)
OPS = ["+", "-", "*", "//", "%", "&", "^", ">>", "<<"]


def _build(draw: st.DrawFn, depth: int) -> tuple[object, object]:
    """Return (expr, python function of (t, k)) built side by side."""
    if depth == 0 or draw(st.booleans()):
        choice = draw(st.integers(0, 2))
        if choice == 0:
            return T, lambda t, k: t
        if choice == 1:
            return K, lambda t, k: k
        c = draw(st.integers(1, 40))
        return Const(c), lambda t, k, c=c: c
    op = draw(st.sampled_from(OPS))
    a, fa = _build(draw, depth - 1)
    if op in ("//", "%"):
        c = draw(st.integers(1, 16))
        b, fb = Const(c), (lambda t, k, c=c: c)
    elif op in (">>", "<<"):
        c = draw(st.integers(0, 4))
        b, fb = Const(c), (lambda t, k, c=c: c)
    else:
        b, fb = _build(draw, depth - 1)
    if op == "-":
        # keep values non-negative (C and Python agree there): a + b - b
        return (a + b) - b, (lambda t, k: fa(t, k))
    py = {"+": lambda x, y: x + y, "*": lambda x, y: x * y, "//": lambda x, y: x // y,
          "%": lambda x, y: x % y, "&": lambda x, y: x & y, "^": lambda x, y: x ^ y,
          ">>": lambda x, y: x >> y, "<<": lambda x, y: x << y}[op]
    return py(a, b), (lambda t, k: py(fa(t, k), fb(t, k)))


@st.composite
def exprs(draw: st.DrawFn) -> tuple[object, object]:
    return _build(draw, 3)


@settings(max_examples=200, deadline=None)
@given(exprs())
def test_simplified_expression_keeps_its_value(pair: tuple[object, object]) -> None:
    e, f = pair
    t = np.arange(256)
    for k in (0, 5, 63):
        got = evaluate(e, {T: t, K: k})
        want = np.array([f(int(ti), k) for ti in t])
        np.testing.assert_array_equal(np.broadcast_to(got, want.shape), want)


def test_bounds_simplifications() -> None:
    lane = T % 32
    assert to_c(lane % 4) == "t % 4"
    assert to_c(lane // 32) == "0"
    assert to_c(T % 256) == "t"
    assert to_c((T * 8) // 4) == "t * 2"
    assert to_c(select(Const(1), T, K)) == "t"
    assert to_c(substitute(T * 2 + K, {K: 3})) == "t * 2 + 3"


def test_layout_and_swizzle_evaluate_symbolically() -> None:
    tv = Layout(((4, 8), (2, 2, 2)), ((32, 1), (16, 8, 128)))
    lane = T % 32
    sym = crd2idx(lane, tv[0].shape, tv[0].stride)
    smem = composition(Swizzle(3, 3, 3), Layout((8, 64), (64, 1)))
    addr = smem.layout_a(sym * 2 + 64)
    got = evaluate(addr, {T: np.arange(64)})
    want = [smem.layout_a(tv[0](i % 32) * 2 + 64) for i in range(64)]
    np.testing.assert_array_equal(got, want)


def test_expressions_have_no_python_truth_value() -> None:
    with pytest.raises(TypeError, match="no Python truth value"):
        bool(T < 3)


STEPS = ["+", "*", "//", "%", "&", "^", ">>", "<<", "lt", "sel"]


def _step(e: object, op: str, c: int) -> object:
    if op == "+":
        return e + K * c
    if op == "*":
        return e * c
    if op == "//":
        return e // c
    if op == "%":
        return e % (c + 1)
    if op == "&":
        return e & (c * 7)
    if op == "^":
        return e ^ (K + c)
    if op == ">>":
        return e >> (c % 3)
    if op == "<<":
        return e << (c % 3)
    if op == "lt":
        return e + (K < c)
    return select(K < c, e, e + 1)


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to check the C printing")
def test_c_printing_matches_evaluation(tmp_path) -> None:
    import random

    rng = random.Random(0)
    cases = []
    for _ in range(60):
        e = T
        for _ in range(4):
            e = _step(e, rng.choice(STEPS), rng.randint(1, 9))
        cases.append(e)
    src = ["#include <stdio.h>", "int main(){",
           "for (int t = 0; t < 256; t += 7) for (int k = 0; k < 64; k += 5) {"]
    for e in cases:
        src.append(f'printf("%d ", (int)({to_c(e)}));')
    src += ['printf("\\n");', "}", "return 0;}"]
    (tmp_path / "e.c").write_text("\n".join(src))
    subprocess.run(["gcc", "-O0", "-o", str(tmp_path / "e"), str(tmp_path / "e.c")], check=True)
    out = subprocess.run([str(tmp_path / "e")], capture_output=True, text=True, check=True).stdout.split("\n")
    row = 0
    for t in range(0, 256, 7):
        for k in range(0, 64, 5):
            got = [int(x) for x in out[row].split()]
            want = [int(evaluate(e, {T: t, K: k})) for e in cases]
            assert got == want, (t, k)
            row += 1


def test_equality_with_a_number_is_refused_for_symbolic_expressions() -> None:
    with pytest.raises(TypeError, match="no Python truth value"):
        _ = T == 0
    with pytest.raises(TypeError, match="no Python truth value"):
        _ = (T + 1) == 3
    assert Const(3) == 3 and (T + 1).eq(3) is not None


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc to check the C printing")
def test_floor_division_of_possibly_negative_operands_prints_floor_semantics(tmp_path) -> None:
    """C's / and % truncate; the printed code must floor like evaluate() (and the emulator) does
    when an operand may be negative, with constant and variable divisors of either sign."""
    s = Var("s", -50, 50)        # a signed value (e.g. a loaded slot that may be -1)
    d = Var("d", -7, 8)          # a divisor of either sign (0 skipped below)
    cases = [s // 4, s % 4, (s - 3) // 5, (s + 1) % 16, s // d, s % d, (s * 3) // d, T // d]
    src = ["#include <stdio.h>", "int main(){",
           "for (int s = -50; s < 50; s += 3) for (int d = -7; d < 8; d++) { if (!d) continue;",
           "int t = s + 60;"]
    for e in cases:
        src.append(f'printf("%d ", (int)({to_c(e)}));')
    src += ['printf("\\n");', "}", "return 0;}"]
    (tmp_path / "f.c").write_text("\n".join(src))
    subprocess.run(["gcc", "-O0", "-o", str(tmp_path / "f"), str(tmp_path / "f.c")], check=True)
    out = subprocess.run([str(tmp_path / "f")], capture_output=True, text=True, check=True).stdout.split("\n")
    row = 0
    for sv in range(-50, 50, 3):
        for dv in range(-7, 8):
            if dv == 0:
                continue
            got = [int(x) for x in out[row].split()]
            want = [int(evaluate(e, {s: sv, d: dv, T: sv + 60})) for e in cases]
            assert got == want, (sv, dv, got, want)
            row += 1
    # provably non-negative operands keep the plain (cheaper) C operators
    assert to_c(T // 4) == "t / 4" and to_c(T % K) == "t % k"
