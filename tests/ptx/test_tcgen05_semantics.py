"""Hand-written tcgen05 PTX on one warp: tensor memory allocation and its errors, the
``tcgen05.st`` / ``tcgen05.ld`` fragment maps, lane quarters, and an MMA's result readable only
once its commit landed."""

from __future__ import annotations

import numpy as np
import pytest

from hexlayout.ptx import GlobalRegion, PtxError, run_ptx

HEAD = """
.version 8.7
.target sm_100a
.address_size 64

.visible .entry k(
    .param .u64 k_out
)
{
    .reg .pred %p<4>;
    .reg .b32 %r<64>;
    .reg .b64 %rd<8>;
    .shared .align 1024 .b8 sm[32768];
    ld.param.u64 %rd1, [k_out];
    mov.u32 %r0, %tid.x;
    mul.wide.u32 %rd2, %r0, 8;
    add.s64 %rd3, %rd1, %rd2;
    mov.u32 %r1, sm;
    tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r1], 64;
    tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;
    ld.shared.u32 %r2, [sm];
"""
TAIL = """
    st.global.v2.u32 [%rd3], {%r10, %r11};
    ret;
}
"""


def _run(body: str) -> np.ndarray:
    out = np.zeros((32, 2), dtype=np.uint32)
    regions = [GlobalRegion("out", out.ctypes.data, out.reshape(-1).view(np.uint8), out.nbytes)]
    run_ptx(HEAD + body + TAIL, [out.ctypes.data], regions, (1,), 32)
    return out


_DEALLOC = "    tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r2, 64;\n"


def test_alloc_writes_the_address_and_st_ld_round_trip_through_the_16x64b_map() -> None:
    """Lane ``l`` stores ``100 l + r`` to register ``r`` of ``16x64b.x2`` at column 8; a
    ``32x32b.x4`` load of columns 8..11 then reads, in lane ``L`` register ``c``, what the
    fragment map put in TMEM cell (lane ``L``, column ``8 + c``)."""
    body = (
        """
    mad.lo.u32 %r20, %r0, 100, 0;
    add.u32 %r21, %r20, 1;
    add.u32 %r30, %r2, 8;
    tcgen05.st.sync.aligned.16x64b.x2.b32 [%r30], {%r20, %r21};
    tcgen05.wait::st.sync.aligned;
    tcgen05.ld.sync.aligned.32x32b.x4.b32 {%r40, %r41, %r42, %r43}, [%r30];
    tcgen05.wait::ld.sync.aligned;
    mov.u32 %r10, %r2;
    setp.lt.u32 %p1, %r0, 16;
    selp.u32 %r11, %r40, 0, %p1;
"""
        + _DEALLOC
    )
    out = _run(body)
    assert (out[:, 0] == 0).all()  # the lowest free block: column 0
    want = np.zeros(16, dtype=np.int64)
    for lane in range(32):  # 16x64b: lane l//4 + 8(l%2), column (l//2)%2 + 2r
        if (lane // 2) % 2 == 0:
            want[lane // 4 + 8 * (lane % 2)] = 100 * lane
    np.testing.assert_array_equal(out[:16, 1], want)


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (
            "    add.u32 %r30, %r2, 64;\n    tcgen05.ld.sync.aligned.32x32b.x1.b32 {%r40}, [%r30];\n"
            + _DEALLOC,
            "TMEM column 64 is not allocated",
        ),
        (_DEALLOC + _DEALLOC, r"64 columns at 0x0: not an allocated block \(allocated: none\)"),
        ("", r"exits with TMEM columns \[0, 64\) still allocated"),
        (
            "    add.u32 %r30, %r2, 2097152;\n    tcgen05.ld.sync.aligned.32x32b.x1.b32 {%r40}, [%r30];\n"
            + _DEALLOC,
            r"accesses TMEM lane 32, outside its lane quarter \[0, 32\)",
        ),
        (
            "    tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r1], 32;\n" + _DEALLOC,
            "alloc after tcgen05.relinquish_alloc_permit",
        ),
        (
            "    tcgen05.ld.sync.aligned.32x32b.x2.b32 {%r40}, [%r2];\n" + _DEALLOC,
            "1 registers, .32x32b.x2 moves 2",
        ),
        (   # the load's registers in flight until tcgen05.wait::ld
            "    tcgen05.ld.sync.aligned.32x32b.x1.b32 {%r40}, [%r2];\n    mov.u32 %r10, %r40;\n" + _DEALLOC,
            r"reads register %r40, which the tcgen05\.ld\.sync\.aligned\.32x32b\.x1\.b32 at PTX line \d+ "
            r"still writes \(tcgen05\.wait::ld first\)",
        ),
        (
            "    tcgen05.ld.sync.aligned.32x32b.x1.b32 {%r40}, [%r2];\n" + _DEALLOC,
            r"columns \[0, 64\) before the tcgen05\.ld of warp 0 \(PTX line \d+\) that reads them completed",
        ),
        (   # A in TMEM written by a tcgen05.st its warp has not waited for
            "    add.u32 %r30, %r2, 32;\n    tcgen05.st.sync.aligned.32x32b.x8.b32 [%r30], "
            "{%r0, %r0, %r0, %r0, %r0, %r0, %r0, %r0};\n    mov.u32 %r50, 0x4100490;\n    mov.b64 %rd4, "
            "0x4000404000010000;\n    tcgen05.mma.cta_group::1.kind::f16 [%r2], [%r30], %rd4, %r50, 0;\n"
            + _DEALLOC,
            r"A: reads TMEM cell \(lane 0, column 32\) written by a tcgen05\.st of thread 0 whose warp has "
            r"not run tcgen05\.wait::st",
        ),
    ],
)
def test_tensor_memory_errors(body: str, match: str) -> None:
    with pytest.raises(PtxError, match=match):
        _run(body)


_MMA = """
    mov.b64 %rd4, 0x4000404000010000;
    mov.u32 %r50, 0x4100490;
    setp.eq.u32 %p2, %r0, 0;
    @%p2 tcgen05.mma.cta_group::1.kind::f16 [%r2], %rd4, %rd4, %r50, 0;
"""


def test_reading_an_mma_result_before_its_commit_landed_is_an_error() -> None:
    """An MMA (M=128, N=64, bf16, 128-byte swizzled K-major operands at shared address 0) into
    columns 0..63: the warp's
    ``tcgen05.ld`` of them with no commit at all reads cells still in flight."""
    body = _MMA + "    tcgen05.ld.sync.aligned.32x32b.x1.b32 {%r40}, [%r2];\n" + _DEALLOC
    with pytest.raises(PtxError, match="whose tcgen05.commit has not arrived"):
        _run(body)


def test_dealloc_while_an_mma_is_in_flight_is_an_error() -> None:
    with pytest.raises(PtxError, match=r"columns \[0, 64\) while a tcgen05.mma / cp into them is in flight"):
        _run(_MMA + _DEALLOC)


MMA_PTX = """
.version 8.7
.target sm_100a
.address_size 64

.visible .entry mma(
    .param .u64 p_out,
    .param .u64 p_a,
    .param .u64 p_b,
    .param .u64 p_baddr
)
{
    .reg .pred %p<4>;
    .reg .b16 %h<2>;
    .reg .b32 %r<80>;
    .reg .b64 %rd<16>;
    .shared .align 1024 .b8 sm[4096];
    ld.param.u64 %rd1, [p_out];
    ld.param.u64 %rd2, [p_a];
    ld.param.u64 %rd3, [p_b];
    ld.param.u64 %rd5, [p_baddr];
    mov.u32 %r0, %tid.x;
    mov.u32 %r1, sm;
    setp.lt.u32 %p1, %r0, 32;
    @%p1 tcgen05.alloc.cta_group::1.sync.aligned.shared::cta.b32 [%r1], 128;
    @%p1 tcgen05.relinquish_alloc_permit.cta_group::1.sync.aligned;
    setp.eq.u32 %p2, %r0, 0;
    @%p2 mbarrier.init.shared::cta.b64 [sm+8], 1;
    // B: thread t stores elements t and t + 128 at the shared addresses the descriptor names
    mul.wide.u32 %rd6, %r0, 2;
    add.s64 %rd7, %rd3, %rd6;
    mul.wide.u32 %rd8, %r0, 4;
    add.s64 %rd9, %rd5, %rd8;
    ld.global.u16 %h1, [%rd7];
    ld.global.u32 %r3, [%rd9];
    st.shared.u16 [%r3], %h1;
    ld.global.u16 %h1, [%rd7+256];
    ld.global.u32 %r3, [%rd9+512];
    st.shared.u16 [%r3], %h1;
    tcgen05.fence::before_thread_sync;
    bar.sync 0;
    tcgen05.fence::after_thread_sync;
    ld.shared.u32 %r2, [sm];
    // A: row t (16 bf16 = 8 words) into TMEM lane t, columns 64..71
    mul.wide.u32 %rd10, %r0, 32;
    add.s64 %rd11, %rd2, %rd10;
    ld.global.v4.u32 {%r10, %r11, %r12, %r13}, [%rd11];
    ld.global.v4.u32 {%r14, %r15, %r16, %r17}, [%rd11+16];
    shr.u32 %r4, %r0, 5;
    shl.b32 %r5, %r4, 21;
    add.u32 %r6, %r2, %r5;
    add.u32 %r7, %r6, 64;
    tcgen05.st.sync.aligned.32x32b.x8.b32 [%r7], {%r10, %r11, %r12, %r13, %r14, %r15, %r16, %r17};
    tcgen05.wait::st.sync.aligned;
    tcgen05.fence::before_thread_sync;
    bar.sync 0;
    tcgen05.fence::after_thread_sync;
    mov.b64 %rd4, DESC;
    mov.u32 %r50, IDESC;
    add.u32 %r51, %r2, 64;
    @%p2 tcgen05.mma.cta_group::1.kind::f16 [%r2], [%r51], %rd4, %r50, 0;
    @%p2 tcgen05.commit.cta_group::1.mbarrier::arrive::one.shared::cluster.b64 [sm+8];
WAIT:
    mbarrier.try_wait.parity.shared::cta.b64 %p1, [sm+8], 0;
    @!%p1 bra WAIT;
    tcgen05.fence::after_thread_sync;
    tcgen05.ld.sync.aligned.32x32b.x16.b32 {%r20, %r21, %r22, %r23, %r24, %r25, %r26, %r27,
        %r28, %r29, %r30, %r31, %r32, %r33, %r34, %r35}, [%r6];
    tcgen05.wait::ld.sync.aligned;
    mul.wide.u32 %rd12, %r0, 64;
    add.s64 %rd13, %rd1, %rd12;
    st.global.v4.u32 [%rd13], {%r20, %r21, %r22, %r23};
    st.global.v4.u32 [%rd13+16], {%r24, %r25, %r26, %r27};
    st.global.v4.u32 [%rd13+32], {%r28, %r29, %r30, %r31};
    st.global.v4.u32 [%rd13+48], {%r32, %r33, %r34, %r35};
    tcgen05.fence::before_thread_sync;
    bar.sync 0;
    tcgen05.fence::after_thread_sync;
    @%p2 mbarrier.inval.shared::cta.b64 [sm+8];
    setp.lt.u32 %p1, %r0, 32;
    @%p1 tcgen05.dealloc.cta_group::1.sync.aligned.b32 %r2, 128;
    ret;
}
"""


@pytest.mark.parametrize(("b_major", "swizzle", "negate_b"), [("K", 0, False), ("MN", 32, True)])
def test_mma_from_the_descriptor_bits(b_major: str, swizzle: int, negate_b: bool) -> None:
    """``D = A @ (+-B)^T`` (M=128, N=16, K=16, bf16 -> f32) with A from TMEM (``tcgen05.st``) and
    B through a shared-memory descriptor and the instruction descriptor given as bits (those of
    ``arch.tcgen05``'s encoders); B is placed at the byte addresses the descriptor names
    (``umma_desc_addresses``), the result read after the commit landed on the mbarrier."""
    import ml_dtypes

    from hexlayout.arch.dtypes import BF16, F32
    from hexlayout.arch.tcgen05 import InstrDescriptor, UmmaDescriptor, umma_desc_addresses

    rng = np.random.default_rng(3)
    a = rng.standard_normal((128, 16)).astype(ml_dtypes.bfloat16)
    b = rng.standard_normal((16, 16)).astype(ml_dtypes.bfloat16)
    lbo, sbo = (128, 256) if swizzle == 0 else (64, 256)
    desc = UmmaDescriptor(1024, lbo, sbo, swizzle)
    addr = umma_desc_addresses(desc, b_major, 16, 16, 16).astype(np.uint32)
    assert len(np.unique(addr)) == 256 and addr.max() < 4096
    idesc = InstrDescriptor(BF16, BF16, F32, 128, 16, b_major=b_major, negate_b=negate_b).encode()
    ptx = MMA_PTX.replace("IDESC", str(idesc)).replace("DESC", str(desc.encode()))
    out = np.zeros((128, 16), dtype=np.float32)
    arrays = {
        "out": out,
        "a": np.ascontiguousarray(a),
        "b": np.ascontiguousarray(b).reshape(-1),
        "baddr": np.ascontiguousarray(addr.reshape(-1)),
    }
    regions = [
        GlobalRegion(n, x.ctypes.data, x.reshape(-1).view(np.uint8), x.nbytes) for n, x in arrays.items()
    ]
    run_ptx(ptx, [x.ctypes.data for x in arrays.values()], regions, (1,), 128)
    want = a.astype(np.float64) @ (b.astype(np.float64).T * (-1 if negate_b else 1))
    np.testing.assert_allclose(out, want, rtol=1e-5, atol=1e-5)
