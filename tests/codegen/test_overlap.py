"""Work placed beside an in-flight wgmma group (``hexlayout.codegen.overlap``), a copy within one
element type, and the SASS measure of the overlap (``hexlayout.runtime.stats.wgmma_overlap``).

- ``plan_overlap`` ties, before a ``wgmma.wait_group``, the register arrays written since the
  last commit (or a wait that left groups in flight) that something outside that region reads;
  temporaries read only inside it are not tied; a region a new wgmma, a fence or a ``wait 0``
  closes ties nothing.
- The printer puts those ties before the wait's ``asm`` and the wgmma operands' after it.
- ``mov`` / ``cvt`` between arrays of one 16-bit float type print a plain copy (no round trip
  through float, which ptxas keeps).
- ``wgmma_overlap`` counts the loop's non-MMA instructions issued while a group is in flight,
  following the loop around its back edge."""

from __future__ import annotations

from hexlayout.arch.dtypes import F16, F32
from hexlayout.codegen.alu import alu as print_alu
from hexlayout.codegen.emitter import Emitter
from hexlayout.codegen.fold_zero import array_uses
from hexlayout.codegen.mma import wgmma_wait
from hexlayout.codegen.overlap import plan_overlap
from hexlayout.ir import lowered as L
from hexlayout.ir.expr import Var
from hexlayout.runtime.stats import Instruction, wgmma_overlap


def _ref(a: L.RegArray) -> L.RegRef:
    return L.RegRef(a, 0, a.count)


def _softmax_like():
    """commit; wait 1; t = s * 2; p = exp2(t); l = l + p[0]; wait 0; q = cvt(p): ``p`` and ``l``
    are read after the region, ``t`` only inside it; ``acc`` is the in-flight operand."""
    s, t, p, q, l, acc = (L.RegArray(n, F32, c) for n, c in (("s", 8), ("t", 8), ("p", 8), ("q", 8),
                                                              ("l", 1), ("acc", 8)))
    q = L.RegArray("q", F16, 8)
    w1, w0 = L.WgmmaWait(1), L.WgmmaWait(0)
    body = [L.WgmmaCommit(), w1,
            L.Alu("mul", _ref(t), (_ref(s), 2.0)),
            L.Alu("exp2", _ref(p), (_ref(t),)),
            L.Alu("add", _ref(l), (_ref(l), L.RegRef(p, 0, 1))),
            w0,
            L.Alu("cvt", _ref(q), (_ref(p),)),
            L.Alu("add", _ref(l), (_ref(l), 1.0))]
    return body, (s, t, p, q, l, acc), w1, w0


def test_the_region_s_results_are_tied_before_the_wait_and_its_temporaries_not() -> None:
    body, (s, t, p, q, l, acc), w1, w0 = _softmax_like()
    plans = plan_overlap(body, array_uses(body), [acc])
    assert id(w1) not in plans                     # nothing between the commit and wait 1
    assert [a.name for a in plans[id(w0)]] == ["p", "l"]


def test_the_wgmma_operands_are_not_tied_twice_and_a_closed_region_ties_nothing() -> None:
    body, (s, t, p, q, l, acc), w1, w0 = _softmax_like()
    assert [a.name for a in plan_overlap(body, array_uses(body), [acc, p])[id(w0)]] == ["l"]
    for closer in (L.WgmmaFence(), L.WgmmaWait(0)):
        cut = body[:5] + [closer] + body[5:]
        assert id(w0) not in plan_overlap(cut, array_uses(cut), [acc])


def test_the_printed_wait_ties_before_and_fences_the_operands_after() -> None:
    body, (s, t, p, q, l, acc), w1, w0 = _softmax_like()
    arrays = [s, t, p, q, l, acc]
    k = L.LoweredKernel("w", [], (1,), 128, Var("t", 0, 128, kind="thread"), (), [], registers=arrays,
                        arch="sm_90a")
    em = Emitter(k)
    for a in arrays:
        em.add_name(a, a.name)
    em.wgmma_arrays.append(acc)
    em.overlap.update(plan_overlap(body, array_uses(body), em.wgmma_arrays))
    text = "\n".join(wgmma_wait(em, w0))
    wait = text.index("wgmma.wait_group.sync.aligned 0")
    assert '"+f"(p[v])' in text[:wait] and '"+f"(l[v])' in text[:wait] and "(t[v])" not in text
    assert '"+f"(acc[v])' in text[wait:] and '"+f"(acc[v])' not in text[:wait]


def test_a_copy_within_one_16_bit_type_is_a_plain_copy() -> None:
    a, b, f = L.RegArray("a", F16, 8), L.RegArray("b", F16, 8), L.RegArray("f", F32, 8)
    k = L.LoweredKernel("c", [], (1,), 1, Var("t", 0, 1, kind="thread"), (), [], registers=[a, b, f])
    em = Emitter(k)
    for x in (a, b, f):
        em.add_name(x, x.name)
    for op in ("mov", "cvt"):
        lines = print_alu(em, L.Alu(op, _ref(b), (_ref(a),)))
        assert lines[-1].endswith("b[v] = a[v];"), lines
    lines = print_alu(em, L.Alu("cvt", _ref(b), (_ref(f),)))  # a real conversion still rounds
    assert "__float2half_rn(f[v])" in lines[-1], lines


def _sass(*ops: str) -> list[Instruction]:
    out = []
    for i, text in enumerate(ops):
        op, _, args = text.partition(" ")
        out.append(Instruction(16 * i, "", op, args))
    return out


def test_wgmma_overlap_counts_what_runs_beside_an_in_flight_group() -> None:
    waited_at_once = _sass("WARPGROUP.ARRIVE", "HGMMA.64x64x16.F32 R8, gdesc[UR4], RZ, gsb0",
                           "WARPGROUP.DEPBAR.LE gsb0, 0x0", "FMUL R1, R1, R2", "FADD R1, R1, R2", "BRA 0x0")
    assert wgmma_overlap(waited_at_once) == 0
    beside = _sass("HGMMA.64x64x16.F32 R8, gdesc[UR4], RZ, gsb0",
                   "HGMMA.64x128x16.F32 R24, R40, gdesc[UR8], R24, gsb0",
                   "WARPGROUP.DEPBAR.LE gsb0, 0x1", "FMNMX R1, R8, R9", "MUFU.EX2 R2, R1",
                   "WARPGROUP.DEPBAR.LE gsb0, 0x0", "FMUL R24, R24, R2", "BRA 0x0")
    assert wgmma_overlap(beside) == 2                 # FMNMX, MUFU (the waits are not counted)
    # a group left in flight across the back edge: the loop's head runs beside it too
    across = _sass("FADD R1, R1, R2", "WARPGROUP.DEPBAR.LE gsb0, 0x1", "FMUL R3, R3, R3",
                   "HGMMA.64x64x16.F32 R8, gdesc[UR4], R8, gsb0", "IADD3 R5, R5, 1, RZ", "BRA 0x0")
    assert wgmma_overlap(across) == 4                 # FADD, FMUL, IADD3, BRA
