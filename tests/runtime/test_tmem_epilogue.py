"""``hexlayout.runtime.tmem_epilogue``: the epilogue of a tcgen05 kernel read from its SASS, on
hand-written listings (a straight epilogue with a side path for an empty K range, one walking
the accumulator in a sub-tile loop), then on the real cubin of a shipped sm_100a GEMM config."""

from __future__ import annotations

import pytest

from hexlayout.runtime.stats import kernel_stats, parse_sass, register_extents
from hexlayout.runtime.tmem_epilogue import tmem_load_values

from .test_stats import LOOP, _sass

# main loop [0x20, 0x50] (1 UTCHMMA); the epilogue: LDTM.x4 at 0x70, a side path [0xa0, 0xb0]
# that zeroes the 4 values (jumped over when K > 0: nothing stored there), conversion, store
STRAIGHT = """
    S2R R0, SR_TID.X
    MOV R1, RZ
    SYNCS.PHASECHK.TRANS64 P0, [UR4], R1
    UTCHMMA gdesc[UR8], gdesc[UR10], tmem[UR6], tmem[UR12], idesc[UR13], UPT
    IADD3 R1, R1, 0x1, RZ
    @P0 BRA 0x20
    NOP
    LDTM.x4 R4, tmem[UR5]
    BAR.SYNC.DEFER_BLOCKING 0x2, 0x80
    BRA.U UP0, 0xc0
    CS2R R4, SRZ
    CS2R R6, SRZ
    F2FP.BF16.F32.PACK_AB R4, R5, R4
    F2FP.BF16.F32.PACK_AB R5, R7, R6
    STG.E.64 [R2.64], R4
    EXIT
"""

# the accumulator walked in a loop of LDTM.16dp256bit.x1 (4 values per thread) per iteration
LOOPED = """
    S2R R0, SR_TID.X
    UTCHMMA gdesc[UR8], gdesc[UR10], tmem[UR6], tmem[UR12], idesc[UR13], UPT
    @P1 BRA 0x10
    MOV R1, RZ
    LDTM.16dp256bit R4, tmem[UR5]
    F2FP.BF16.F32.PACK_AB R4, R5, R4
    F2FP.BF16.F32.PACK_AB R5, R7, R6
    STG.E.64 [R2.64], R4
    IADD3 R1, R1, 0x1, RZ
    ISETP.GE.AND P0, PT, R1, 0x8, PT
    @!P0 BRA 0x40
    EXIT
"""


@pytest.mark.parametrize(("op", "values"), [("LDTM.x128", 128), ("LDTM.x1", 1), ("LDTM.16dp256bit.x2", 8),
                                            ("LDTM.16dp128bit.x4", 8), ("LDTM.16dp64bit.x16", 16),
                                            ("STTM.16dp32bit_t0_t15.x2", 2), ("LDTM", 1)])
def test_registers_of_a_tmem_load_or_store(op, values) -> None:
    assert tmem_load_values(op) == values


def test_an_ldtm_fills_all_of_its_registers() -> None:
    code = next(iter(parse_sass(_sass(STRAIGHT, arch="sm_100a")).values()))[1]
    ldtm = next(i for i in code if i.base == "LDTM")
    assert register_extents(ldtm)[0] == (4, 4)
    assert kernel_stats(sass=_sass(STRAIGHT, arch="sm_100a"), mma_per_ktile=1).highest_register == 7


def test_straight_epilogue_spans_the_load_to_the_store_without_the_empty_k_fill() -> None:
    ep = kernel_stats(sass=_sass(STRAIGHT, arch="sm_100a"), mma_per_ktile=1).epilogue
    assert ep is not None and not ep.looped
    assert (ep.start, ep.end) == (0x70, 0xe0)
    # LDTM, BAR, BRA.U, 2 F2FP, STG: the CS2R side path is jumped over and stores nothing
    assert ep.instructions == 6 and ep.values == 4 and ep.per_value == pytest.approx(1.5)
    assert "CS2R" not in ep.mix and ep.mix["F2FP"] == 2


def test_looped_epilogue_is_one_iteration() -> None:
    ep = kernel_stats(sass=_sass(LOOPED, arch="sm_100a"), mma_per_ktile=1).epilogue
    assert ep is not None and ep.looped
    assert (ep.start, ep.end) == (0x40, 0xa0)
    assert ep.instructions == 7 and ep.values == 4


def test_no_tmem_load_no_epilogue() -> None:
    assert kernel_stats(sass=_sass(LOOP), mma_per_ktile=1.5).epilogue is None


@pytest.mark.nvrtc
def test_shipped_sm100_gemm_epilogue_reads_the_whole_tile() -> None:
    """128x128 tile, one consumer warp group (128 threads): 128 f32 values per thread, each
    loaded once, converted (F2FP packs two) and stored; nothing else per value is spent twice."""
    from hexlayout.ops.gemm.config import GemmConfig
    from hexlayout.ops.gemm.op import gemm_build

    from hexlayout.lang import bf16

    cfg = GemmConfig("sm_100a", 128, 128, 64, 6, CONSUMERS=1)
    st = gemm_build(bf16, "nk", (False, False, "none", False), "sm_100a", cfg, 4096, 4096).stats
    ep = st.epilogue
    assert ep is not None and ep.values == 128 * 128 // 128, st.summary()
    assert ep.mix.get("F2FP", 0) == 128 // 2 and ep.mix.get("LDTM", 0) >= 1
    assert "CS2R" not in ep.mix                      # the K = 0 fill is a side path
    assert 1.0 < ep.per_value < 2.0, st.summary()
