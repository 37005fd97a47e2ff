"""Instruction semantics against values computed by hand from the PTX ISA."""

from __future__ import annotations

import numpy as np
import pytest

from .harness import bits32, run_body

NAN = "0f7FC00000"

# (body leaving the result in %r10 (or %rd10 when wide), expected 32-bit words (lo, hi) for lane 0)
CASES = {
    "add.s32 wraps": ("add.s32 %r10, 2147483647, 1;", (0x80000000, 0)),
    "sub.u32 wraps": ("sub.u32 %r10, 0, 1;", (0xFFFFFFFF, 0)),
    "mul.lo.s32": ("mul.lo.s32 %r10, -3, 5;", (0xFFFFFFF1, 0)),
    "mul.hi.s32": ("mul.hi.s32 %r10, -3, 1073741824;", (0xFFFFFFFF, 0)),
    "mul.hi.u32": ("mul.hi.u32 %r10, -1, 16;", (0xF, 0)),
    "mul.wide.s32": ("mul.wide.s32 %rd10, -2, 3;", (0xFFFFFFFA, 0xFFFFFFFF)),
    "mul.wide.u32": ("mul.wide.u32 %rd10, -1, 2;", (0xFFFFFFFE, 1)),
    "mul.wide.s16": ("mov.b16 %rs1, -3;\n mul.wide.s16 %r10, %rs1, 4096;", (0xFFFFD000, 0)),
    "mul.wide.u16": ("mov.b16 %rs1, 0xFFFF;\n mul.wide.u16 %r10, %rs1, 2;", (0x1FFFE, 0)),
    "mad.lo.s32": ("mad.lo.s32 %r10, 3, 4, 5;", (17, 0)),
    "mad.wide.s32": ("mad.wide.s32 %rd10, -1, 4, 10;", (6, 0)),
    "div.s32 truncates": ("div.s32 %r10, -7, 2;", (0xFFFFFFFD, 0)),
    "rem.s32 sign of dividend": ("rem.s32 %r10, -7, 2;", (0xFFFFFFFF, 0)),
    "div.u32": ("div.u32 %r10, -1, 16;", (0x0FFFFFFF, 0)),
    "shr.s32 arithmetic": ("shr.s32 %r10, -8, 1;", (0xFFFFFFFC, 0)),
    "shr.u32 logical": ("shr.u32 %r10, -8, 1;", (0x7FFFFFFC, 0)),
    "shl.b32 clamps": ("shl.b32 %r10, 1, 33;", (0, 0)),
    "shr.s32 clamps": ("shr.s32 %r10, -5, 40;", (0xFFFFFFFF, 0)),
    "shl.b64": ("mov.b64 %rd5, 1;\n shl.b64 %rd10, %rd5, 40;", (0, 0x100)),
    "bfe.u32": ("bfe.u32 %r10, 0xABCD1234, 8, 8;", (0x12, 0)),
    "bfe.s32 sign-extends": ("bfe.s32 %r10, 0xF000, 12, 4;", (0xFFFFFFFF, 0)),
    "bfi.b32": ("bfi.b32 %r10, 0xF, 0x12345678, 8, 4;", (0x12345F78, 0)),
    "prmt.b32 select": ("prmt.b32 %r10, 0x33221100, 0x77665544, 0x5410;", (0x55441100, 0)),
    "prmt.b32 sign replicate": ("prmt.b32 %r10, 0xF0, 0, 0x0008;", (0x000000FF | 0xF0F0F000, 0)),
    "lop3 xor3": ("lop3.b32 %r10, 0xF0F0F0F0, 0xCCCCCCCC, 0xAAAAAAAA, 0x96;", (0x96969696, 0)),
    "lop3 a&b|c": ("lop3.b32 %r10, 0xFF00FF00, 0x0FF00FF0, 0x1, 0xEA;", (0x0F000F01, 0)),
    "popc": ("popc.b32 %r10, 0xF0F0;", (8, 0)),
    "clz": ("clz.b32 %r10, 0x00010000;", (15, 0)),
    "brev": ("brev.b32 %r10, 1;", (0x80000000, 0)),
    "min.s32": ("min.s32 %r10, -1, 1;", (0xFFFFFFFF, 0)),
    "min.u32": ("min.u32 %r10, -1, 1;", (1, 0)),
    "max.f32 ignores NaN": (f"max.f32 %f1, {NAN}, 0f3F800000;\n mov.b32 %r10, %f1;", (bits32(1.0), 0)),
    "add.rn.f32": ("add.rn.f32 %f1, 0f3F800000, 0f40000000;\n mov.b32 %r10, %f1;", (bits32(3.0), 0)),
    "fma.rn.f32": ("fma.rn.f32 %f1, 0f40000000, 0f40400000, 0f3F800000;\n mov.b32 %r10, %f1;",
                   (bits32(7.0), 0)),
    "ex2.approx.f32": ("ex2.approx.ftz.f32 %f1, 0f40400000;\n mov.b32 %r10, %f1;", (bits32(8.0), 0)),
    "rcp.rn.f32": ("rcp.rn.f32 %f1, 0f40800000;\n mov.b32 %r10, %f1;", (bits32(0.25), 0)),
    "neg.f32": ("neg.f32 %f1, 0f3F800000;\n mov.b32 %r10, %f1;", (bits32(-1.0), 0)),
    "setp.lt.f32 NaN is false": (f"setp.lt.f32 %p1, {NAN}, 0f3F800000;\n selp.u32 %r10, 1, 2, %p1;", (2, 0)),
    "setp.ltu.f32 NaN is true": (f"setp.ltu.f32 %p1, {NAN}, 0f3F800000;\n selp.u32 %r10, 1, 2, %p1;", (1, 0)),
    "setp.ne.f32 NaN is false": (f"setp.ne.f32 %p1, {NAN}, {NAN};\n selp.u32 %r10, 1, 2, %p1;", (2, 0)),
    "setp.lo.u32 vs lt.s32": ("setp.lo.u32 %p1, -1, 1;\n setp.lt.s32 %p2, -1, 1;\n"
                              " selp.u32 %r1, 1, 0, %p1;\n selp.u32 %r2, 2, 0, %p2;\n or.b32 %r10, %r1, %r2;",
                              (2, 0)),
    "setp pair and .and": ("setp.gt.and.s32 %p1|%p2, 5, 3, 1;\n selp.u32 %r1, 1, 0, %p1;\n"
                           " selp.u32 %r2, 2, 0, %p2;\n or.b32 %r10, %r1, %r2;", (1, 0)),
    "cvt.rzi.s32.f32": ("cvt.rzi.s32.f32 %r10, 0fC02CCCCD;", (0xFFFFFFFE, 0)),
    "cvt.rni.s32.f32 half to even": ("cvt.rni.s32.f32 %r10, 0f40200000;", (2, 0)),
    "cvt.rzi.s32.f32 saturates": ("cvt.rzi.s32.f32 %r10, 0f51000000;", (0x7FFFFFFF, 0)),
    "cvt.rzi.s32.f32 NaN is 0": (f"cvt.rzi.s32.f32 %r10, {NAN};", (0, 0)),
    "cvt.rn.f16.f32 overflows to inf": ("cvt.rn.f16.f32 %rs1, 0f477FF000;\n cvt.u32.u16 %r10, %rs1;",
                                        (0x7C00, 0)),
    "cvt.f32.f16": ("mov.b16 %rs1, 0x3C00;\n cvt.f32.f16 %f1, %rs1;\n mov.b32 %r10, %f1;", (bits32(1.0), 0)),
    "cvt.rn.bf16x2.f32 hi is a": ("cvt.rn.bf16x2.f32 %r10, 0f3F800000, 0f40000000;", (0x3F804000, 0)),
    "cvt.rn.f16x2.f32 hi is a": ("cvt.rn.f16x2.f32 %r10, 0f3F800000, 0f40000000;", (0x3C004000, 0)),
    "cvt.s64.s32 sign-extends": ("cvt.s64.s32 %rd10, -2;", (0xFFFFFFFE, 0xFFFFFFFF)),
    "cvt.u64.u32 zero-extends": ("cvt.u64.u32 %rd10, -2;", (0xFFFFFFFE, 0)),
    "cvt.u16.u32 truncates": ("cvt.u16.u32 %rs1, 0x12345;\n cvt.u32.u16 %r10, %rs1;", (0x2345, 0)),
    "cvt.sat.u8.s32": ("cvt.sat.u8.s32 %rs1, 300;\n cvt.u32.u16 %r10, %rs1;", (255, 0)),
    "cvt.rn.satfinite.e4m3x2.f32": ("cvt.rn.satfinite.e4m3x2.f32 %rs1, 0f3F800000, 0f44000000;\n"
                                    " cvt.u32.u16 %r10, %rs1;", (0x387E, 0)),
    "cvt.rn.satfinite.e4m3x2.f16x2 half i to byte i": ("mov.b32 %r1, 0x3C006000;\n"
                                                        " cvt.rn.satfinite.e4m3x2.f16x2 %rs1, %r1;\n"
                                                        " cvt.u32.u16 %r10, %rs1;", (0x387E, 0)),
    "cvt.rn.satfinite.e5m2x2.f16x2 saturates": ("mov.b32 %r1, 0x7BFFBC00;\n"
                                                " cvt.rn.satfinite.e5m2x2.f16x2 %rs1, %r1;\n"
                                                " cvt.u32.u16 %r10, %rs1;", (0x7BBC, 0)),
    "add.f16x2": ("mov.b32 %r1, 0x3C004000;\n add.rn.f16x2 %r10, %r1, %r1;", (0x40004400, 0)),
    "mul.bf16x2": ("mov.b32 %r1, 0x3F804000;\n fma.rn.bf16x2 %r10, %r1, %r1, %r1;", (0x400040C0, 0)),
    "mov.b32 packs lo first": ("mov.b16 %rs1, 0x1111;\n mov.b16 %rs2, 0x2222;\n mov.b32 %r10, {%rs1, %rs2};",
                               (0x22221111, 0)),
    "mov.b64 unpacks": ("mov.b64 %rd5, 0x1122334455667788;\n mov.b64 {%r10, %r11}, %rd5;",
                        (0x55667788, 0x11223344)),
    "and.b16 on a 16-bit register": ("mov.b16 %rs1, 0xFF0F;\n and.b16 %rs2, %rs1, 0x0FF0;\n"
                                     " cvt.u32.u16 %r10, %rs2;", (0x0F00, 0)),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_instruction(name: str) -> None:
    body, want = CASES[name]
    out = run_body(body, wide="%rd10" in body)
    assert (int(out[0, 0]), int(out[0, 1])) == want, f"{name}: got {int(out[0, 0]):#x}, {int(out[0, 1]):#x}"
    assert (out == out[0]).all()          # every lane computed the same


def _lanes(body: str) -> np.ndarray:
    return run_body(body)[:, 0].astype(np.int64)


def test_shfl_bfly_down_up_idx() -> None:
    lane = np.arange(32)
    assert (_lanes("shfl.sync.bfly.b32 %r10, %r0, 1, 31, -1;") == lane ^ 1).all()
    assert (_lanes("shfl.sync.bfly.b32 %r10, %r0, 16, 31, -1;") == lane ^ 16).all()
    got = run_body("shfl.sync.down.b32 %r10|%p1, %r0, 4, 31, -1;\n selp.u32 %r11, 1, 0, %p1;")
    assert (got[:, 0] == np.where(lane + 4 <= 31, lane + 4, lane)).all()
    assert (got[:, 1] == (lane + 4 <= 31)).all()
    assert (_lanes("shfl.sync.up.b32 %r10, %r0, 1, 0, -1;") == np.where(lane >= 1, lane - 1, lane)).all()
    assert (_lanes("shfl.sync.idx.b32 %r10, %r0, 5, 31, -1;") == 5).all()
    # 8-lane segments: c = ((32 - 8) << 8) | 31; idx 2 reads lane 2 of the lane's segment
    assert (_lanes("shfl.sync.idx.b32 %r10, %r0, 2, 0x181f, -1;") == (lane & 0x18) | 2).all()


def test_special_registers_and_blocks() -> None:
    out = run_body("mov.u32 %r10, %laneid;\n mov.u32 %r1, %ntid.x;\n mov.u32 %r2, %ctaid.x;\n"
                   " mad.lo.u32 %r11, %r1, 100, %r2;", threads=64)
    assert (out[:, 0] == np.arange(64) % 32).all()
    assert (out[:, 1] == 6400).all()


def test_predicated_divergent_branch_reconverges() -> None:
    body = """
    and.b32 %r1, %r0, 1;
    setp.eq.u32 %p1, %r1, 0;
    @%p1 bra $EVEN;
    mov.u32 %r10, 100;
    bra.uni $JOIN;
$EVEN:
    mov.u32 %r10, 200;
$JOIN:
    shfl.sync.bfly.b32 %r11, %r10, 1, 31, -1;
"""
    out = run_body(body)
    lane = np.arange(32)
    assert (out[:, 0] == np.where(lane % 2 == 0, 200, 100)).all()
    assert (out[:, 1] == np.where(lane % 2 == 0, 100, 200)).all()     # the shuffle ran reconverged


def test_loop_with_per_thread_trip_count() -> None:
    body = """
    mov.u32 %r1, 0;
$LOOP:
    add.u32 %r10, %r10, 3;
    add.u32 %r1, %r1, 1;
    setp.lt.u32 %p1, %r1, %r0;
    @%p1 bra $LOOP;
"""
    out = run_body(body)
    assert (out[:, 0] == 3 * np.maximum(np.arange(32), 1)).all()


def test_shared_memory_and_barrier_exchange() -> None:
    body = """
    .shared .align 4 .b8 buf[256];
    mov.u32 %r1, buf;
    shl.b32 %r2, %r0, 2;
    add.u32 %r3, %r1, %r2;
    st.shared.u32 [%r3], %r0;
    bar.sync 0;
    xor.b32 %r4, %r0, 63;
    shl.b32 %r5, %r4, 2;
    add.u32 %r6, %r1, %r5;
    ld.shared.u32 %r10, [%r6];
"""
    out = run_body(body, threads=64)
    assert (out[:, 0] == np.arange(64) ^ 63).all()


def test_vector_global_load() -> None:
    inp = np.arange(8, dtype=np.uint32).view(np.uint8).copy()
    out = run_body("ld.global.nc.v2.u32 {%r10, %r11}, [%rd2+8];", inp=inp)
    assert (out == [2, 3]).all()
