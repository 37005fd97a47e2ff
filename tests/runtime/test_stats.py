"""``hexlayout.runtime.stats``: the loop finder, counting and register extents on hand-written
SASS, then structural facts of the shipped GEMM configs' real cubins (NVRTC + cuobjdump;
skipped without them)."""

from __future__ import annotations

import json
import textwrap
from typing import Any

import pytest

from hexlayout.runtime.stats import (
    Instruction,
    StatsError,
    find_main_loop,
    highest_register,
    kernel_stats,
    loops,
    mma_per_ktile_for_tile,
    mma_per_ktile_from_bk,
    parse_sass,
    ptxas_warnings,
    register_extents,
    setmaxnreg_regions,
)


def _sass(body: str, name: str = "k", arch: str = "sm_80") -> str:
    """A cuobjdump-style listing of ``body``: one instruction per line, addresses added."""
    lines = [f"\tcode for {arch}", f"\t\tFunction : {name}", '\t.headerflags\t@"EF_CUDA_SM80"']
    for i, text in enumerate(t.strip() for t in textwrap.dedent(body).strip().splitlines()):
        lines.append(f"        /*{16 * i:04x}*/                   {text} ;   /* 0x000000000000 */")
        lines.append("                                                          /* 0x000fe20000000000 */")
    return "\n".join(lines) + "\n"


def _code(body: str) -> list[Instruction]:
    return next(iter(parse_sass(_sass(body)).values()))[1]


# 0x00 .. : prologue; loop [0x30, 0xa0] with 3 HMMA, 2 @!PT padding, 4 other instructions + branch
LOOP = """
    S2R R0, SR_TID.X
    IMAD.MOV.U32 R2, RZ, RZ, c[0x0][0x160]
    MOV R3, RZ
    LDSM.16.M88.4 R8, [R0]
    HMMA.16816.F32.BF16 R12, R8, R4, R12
    @!PT LDS RZ, [RZ]
    HMMA.16816.F32.BF16 R16, R8, R6, R16
    @!PT LDS RZ, [RZ]
    IADD3 R3, R3, 0x1, RZ
    HMMA.16816.F32.BF16 R20, R10, R4, R20
    ISETP.GE.AND P0, PT, R3, c[0x0][0x164], PT
    @!P0 BRA 0x30
    STG.E.128 [R2.64], R12
    STG.E [R2.64+0x10], R16
    EXIT
"""


def test_main_loop_span_and_counts() -> None:
    st = kernel_stats(sass=_sass(LOOP), mma_per_ktile=1.5)
    lp = st.main_loop
    assert lp is not None and (lp.start, lp.end) == (0x30, 0xb0)
    assert lp.instructions == 9 and lp.mma == 3 and lp.padding == 2
    assert lp.non_mma == 9 - 3 - 2
    assert lp.k_tiles == pytest.approx(2.0) and lp.non_mma_per_ktile == pytest.approx(2.0)
    assert lp.non_mma_per_mma == pytest.approx(4 / 3)
    assert lp.mma_opcode == "HMMA.16816.F32.BF16"
    assert lp.mix["LDSM"] == 1 and "LDS" not in lp.mix          # padding is not in the mix
    assert lp.categories["mma"] == 3 and lp.categories["shared"] == 1 and lp.categories["control"] == 1
    assert lp.constant_reads == 1
    assert st.epilogue_stores == {"STG.128": 1, "STG.32": 1}
    assert st.instructions == 15 and st.mma == 3 and st.counts["LDSM"] == 1
    assert st.local_memory_instructions == 0 and not st.spills


# an sm_100a MMA issuer's loop as ptxas prints it (CuTe DSL's Blackwell dense GEMM): four
# tcgen05.mma (UTCHMMA, operands are descriptors and TMEM addresses), then tcgen05.commit (UTCBAR)
TCGEN05_LOOP = """
    ELECT P0, URZ, PT
    SYNCS.PHASECHK.TRANS64.TRYWAIT P1, [UR8], R3
    UTCHMMA gdesc[UR44], gdesc[UR42], tmem[UR16], tmem[UR40], idesc[UR41], UR4, UP4
    UIADD3 UR42, UPT, UPT, UR42, 0x2, URZ
    UTCHMMA gdesc[UR54], gdesc[UR56], tmem[UR16], tmem[UR34], idesc[UR35], UR4, UPT
    UTCHMMA gdesc[UR50], gdesc[UR52], tmem[UR16], tmem[UR32], idesc[UR33], UR4, UPT
    UTCHMMA gdesc[UR46], gdesc[UR48], tmem[UR16], tmem[UR30], idesc[UR31], UR4, UPT
    UTCBAR [UR10], URZ
    UISETP.NE.AND UP0, UPT, UR5, UR6, UPT
    BRA.U UP0, 0x0
    LDTM.x32 R4, tmem[UR7]
    EXIT
"""


def test_tcgen05_mma_loop_and_tensor_memory_loads() -> None:
    """sm_100a: UTCHMMA counts as MMA (the issuer's loop is the main loop), LDTM / UTCBAR are
    tracked, and the loop's k-tile is its four K-16 MMAs."""
    st = kernel_stats(sass=_sass(TCGEN05_LOOP, arch="sm_100a"), mma_per_ktile=4)
    lp = st.main_loop
    assert lp is not None and (lp.start, lp.end) == (0x0, 0x90)
    assert lp.mma == 4 and lp.mma_opcode == "UTCHMMA" and lp.non_mma == 6
    assert lp.non_mma_per_ktile == pytest.approx(6.0)
    assert st.counts["UTCHMMA"] == 4 and st.counts["UTCBAR"] == 1 and st.counts["LDTM"] == 1
    assert st.arch == "sm_100a"


def test_no_tile_gives_no_ktile_number() -> None:
    lp = kernel_stats(sass=_sass(LOOP)).main_loop
    assert lp is not None and lp.k_tiles is None and lp.non_mma_per_ktile is None


def test_innermost_loop_with_most_mma_wins() -> None:
    # outer loop [0x00, 0x70] around inner loop [0x10, 0x40]; both hold the same 2 HMMA
    code = _code("""
        IADD3 R1, R1, 0x1, RZ
        HMMA.16816.F32 R4, R8, R12, R4
        HMMA.16816.F32 R4, R8, R12, R4
        ISETP.NE.AND P1, PT, R2, RZ, PT
        @P1 BRA 0x10
        ISETP.NE.AND P0, PT, R1, RZ, PT
        NOP
        @P0 BRA 0x0
        EXIT
    """)
    spans = {(lp.start, lp.end) for lp in loops(code)}
    assert spans == {(0x10, 0x40), (0x0, 0x70)}
    main = find_main_loop(code)
    assert main is not None and (main.start, main.end) == (0x10, 0x40)


def test_outer_loop_with_more_mma_is_not_the_main_loop() -> None:
    # an outer loop [0x00, 0x60] around two inner k-loops (as two warp groups' code, or a
    # k-loop plus a tail): the innermost MMA loops are candidates, the outer one is not
    code = _code("""
        HMMA.16816.F32 R4, R8, R12, R4
        HMMA.16816.F32 R4, R8, R12, R4
        @P1 BRA 0x0
        HMMA.16816.F32 R16, R8, R12, R16
        @P2 BRA 0x30
        @P0 BRA 0x0
        EXIT
    """)
    assert {(lp.start, lp.end, lp.mma) for lp in loops(code)} == {(0x0, 0x50, 3), (0x30, 0x40, 1)}
    main = find_main_loop(code)
    assert main is not None and (main.start, main.end) == (0x30, 0x40)


def test_retry_cycle_through_an_out_of_line_block_holds_no_mma() -> None:
    # the retry block at 0x90 jumps back to the wait itself (0x10): a real cycle, but the
    # span [0x10, 0xb0] holds loop B's 2 HMMA only by address, not on the cycle
    code = _code("""
        MOV R1, RZ
        SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R2], R3
        @!P0 BRA 0x90
        HMMA.16816.F32 R4, R8, R12, R4
        @P1 BRA 0x0
        HMMA.16816.F32 R4, R8, R12, R4
        HMMA.16816.F32 R4, R8, R12, R4
        @P1 BRA 0x50
        EXIT
        NANOSLEEP 0x20
        BRA 0x10
    """)
    by_start = {lp.start: lp for lp in loops(code)}
    assert by_start[0x10].end == 0xa0 and by_start[0x10].mma == 0
    main = find_main_loop(code)
    assert main is not None and (main.start, main.end, main.mma) == (0x50, 0x70, 2)


def test_jump_back_from_an_out_of_line_block_is_not_a_loop() -> None:
    # loop A [0x00, 0x50] (1 HMMA) waits at 0x10 with its retry block at 0xa0 that jumps back
    # to 0x20; loop B [0x60, 0x80] holds 2 HMMA. Counted as a span, [0x20, 0xc0] would hold 3.
    code = _code("""
        MOV R1, RZ
        SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R2], R3
        @!P0 BRA 0xa0
        HMMA.16816.F32 R4, R8, R12, R4
        ISETP.NE.AND P1, PT, R1, RZ, PT
        @P1 BRA 0x0
        HMMA.16816.F32 R4, R8, R12, R4
        HMMA.16816.F32 R4, R8, R12, R4
        @P1 BRA 0x60
        EXIT
        SYNCS.PHASECHK.TRANS64.TRYWAIT P0, [R2], R3
        @!P0 BRA 0xa0
        BRA 0x30
    """)
    spans = {(lp.start, lp.end) for lp in loops(code)}
    assert (0x30, 0xc0) not in spans
    assert spans == {(0x0, 0x50), (0x60, 0x80), (0xa0, 0xb0)}
    main = find_main_loop(code)
    assert main is not None and (main.start, main.end, main.mma) == (0x60, 0x80, 2)


def test_no_loop_no_main_loop() -> None:
    st = kernel_stats(sass=_sass("HMMA.16816.F32 R4, R8, R12, R4\nEXIT"))
    assert st.main_loop is None and st.mma == 1
    assert "main loop: none" in st.summary()


def test_register_extents_count_wide_operands() -> None:
    def ext(text: str) -> list[tuple[int, int]]:
        return register_extents(_code(text)[0])

    # m16n8k16: f32 accumulator 16*8/32 = 4 registers, A 16*16 halves = 4, B 16*8 halves = 2
    assert ext("HMMA.16816.F32.BF16 R4, R8, R12, R4") == [(4, 4), (8, 4), (12, 2), (4, 4)]
    assert ext("HMMA.16816.F16 R4, R8, R12, R4") == [(4, 2), (8, 4), (12, 2), (4, 2)]
    assert ext("LDS.128 R4, [R2+0x10]") == [(4, 4), (2, 1)]
    assert ext("STG.E.64 desc[UR4][R2.64], R6") == [(2, 2), (6, 2)]
    assert ext("LDSM.16.MT88.2 R8, [R3]") == [(8, 2), (3, 1)]
    assert ext("STSM.16.M88.4 [R3], R8") == [(3, 1), (8, 4)]
    assert ext("IMAD.WIDE R2, R5, 0x2, R6") == [(2, 2), (5, 1), (6, 2)]
    # a 64x128 f32 wgmma accumulator: 64*128 / 128 threads = 64 registers, R24..R87
    hg = _code("HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], R24, gsb0")
    assert register_extents(hg[0]) == [(24, 64), (24, 64)] and highest_register(hg) == 87
    assert highest_register(_code("HGMMA.64x64x16.F32 R0, R88, gdesc[UR4], R0")) == 91   # A: R88..R91


def test_setmaxnreg_regions_are_what_each_warp_group_reaches() -> None:
    code = _code("""
        ISETP.NE.AND P0, PT, R0, RZ, PT
        @P0 BRA 0x60
        USETMAXREG.DEALLOC.CTAPOOL 0x28
        MOV R7, RZ
        STS [R7], R6
        EXIT
        USETMAXREG.TRY_ALLOC.CTAPOOL UP0, 0xe8
        HGMMA.64x128x16.F32.BF16 R24, gdesc[UR12], R24, gsb0
        MOV R150, RZ
        EXIT
    """)
    regions = {r["kind"]: r for r in setmaxnreg_regions(code)}
    assert regions["dealloc"]["limit"] == 40 and regions["dealloc"]["highest_register"] == 7
    assert regions["alloc"]["limit"] == 232 and regions["alloc"]["highest_register"] == 150
    assert regions["dealloc"]["instructions"] == 4 and regions["alloc"]["instructions"] == 4


def test_ptxas_warnings_per_function_and_serialization_codes() -> None:
    log = textwrap.dedent("""\
        ptxas info    : (C7515) Potential Performance Loss: wgmma.mma_async instructions are serialized \
due to non wgmma instructions defining accumulator registers in the function 'k' in line 7
        ptxas info    : (C7510) Potential Performance Loss: wgmma.mma_async instructions are serialized in \
the function 'other'
        ptxas warning : Registers are spilled to local memory in function 'k', 8 bytes spill stores
        ptxas info    : Compiling entry function 'k' for 'sm_90a'
        ptxas info    : Used 90 registers, used 1 barriers
    """)
    got = ptxas_warnings(log, "k")
    assert len(got) == 2 and "(C7515)" in got[0] and "spilled" in got[1]
    st = kernel_stats(sass=_sass("HMMA.16816.F32 R4, R8, R12, R4\nEXIT"), log=log, name="k")
    assert st.serialization == ["C7515"] and st.registers == 90


def test_unknown_kernel_is_a_clear_error() -> None:
    with pytest.raises(StatsError, match="'nope' is not in the cubin .*it has k"):
        kernel_stats(sass=_sass(LOOP), name="nope")
    with pytest.raises(StatsError, match="needs a cubin"):
        kernel_stats()


def test_mma_per_ktile_from_bk_counts_accumulation_chains() -> None:
    # two output tiles, accumulators renamed along their chains (R4 -> R20, R6 -> R22): 2 chains
    # x BK 32 / k 16 = 4 MMA per k-tile; the loop has 4, so 1 k-tile per iteration
    code = _code("""
        HMMA.16816.F32.BF16 R20, R8, R12, R4
        HMMA.16816.F32.BF16 R22, R8, R14, R6
        HMMA.16816.F32.BF16 R4, R10, R12, R20
        HMMA.16816.F32.BF16 R6, R10, R14, R22
        @P0 BRA 0x0
        EXIT
    """)
    assert mma_per_ktile_from_bk(code, 32) == 4
    assert mma_per_ktile_from_bk(code, 64) == 8
    # LOOP: three chains (R12, R16, R20) of one MMA each: 6 per 32-deep k-tile, half a k-tile
    lp = kernel_stats(sass=_sass(LOOP), bk=32).main_loop
    assert lp is not None and lp.mma_per_ktile == 6 and lp.k_tiles == pytest.approx(0.5)
    hg = _code("""
        HGMMA.64x256x16.F32.BF16 R24, gdesc[UR4], RZ, !UPT
        HGMMA.64x256x16.F32.BF16 R24, gdesc[UR8], R24
    """)
    assert mma_per_ktile_from_bk(hg, 64) == 4


def test_mma_per_ktile_for_tile_counts_instruction_tiles() -> None:
    # 128x128x32 over 4 warps (2x2): each warp 64x64x32 = 4 m16 x 8 n8 x 2 k16 mma.sync
    assert mma_per_ktile_for_tile(128, 128, 32, (16, 8, 16), 4) == 4 * 8 * 2
    # 128x128x64 over 2 warp groups: each 64x128x64 = 4 wgmma m64n128k16
    assert mma_per_ktile_for_tile(128, 128, 64, (64, 128, 16), 2) == 4


# --- real cubins of the shipped GEMM configs --------------------------------------------------

def _toolchain() -> bool:
    try:
        from hexlayout.runtime import available_backends
        from hexlayout.runtime.toolchain import tool_path

        return bool(available_backends()) and tool_path("cuobjdump") is not None
    except Exception:  # noqa: BLE001 - anything missing means: no toolchain here
        return False


needs_toolchain = pytest.mark.skipif(not _toolchain(), reason="needs NVRTC or nvcc and cuobjdump")


def _configs() -> list[Any]:
    from hexlayout.ops.gemm.config import CONFIGS

    return [*CONFIGS["sm_80"], *CONFIGS["sm_90a"]]


@needs_toolchain
@pytest.mark.parametrize("cfg", _configs(), ids=str)
def test_shipped_gemm_config_structure(cfg: Any) -> None:
    from hexlayout.ops.gemm.op import gemm_build

    from hexlayout.lang import bf16

    b = gemm_build(bf16, "nk", (False, False, "none", False), cfg.arch, cfg, 4096, 4096)
    st = b.stats
    assert st is b.stats                                   # memoized
    lp = st.main_loop
    assert lp is not None, st.summary()
    assert not st.spills and st.spill_stores == 0 and st.local_memory_instructions == 0
    assert st.registers is not None and st.shared_dynamic and st.shared_dynamic > 0
    assert st.epilogue_stores and st.counts["STL"] == 0
    if cfg.arch == "sm_80":
        assert lp.mma_opcode.startswith("HMMA.16816.F32")
        # the loop's MMA per k-tile counted in the lowered program = the tile over the warps
        assert lp.mma_per_ktile == mma_per_ktile_for_tile(cfg.BM, cfg.BN, cfg.BK, (16, 8, 16), cfg.WARPS)
        assert lp.mix.get("LDSM", 0) > 0 and lp.mix.get("LDGSTS", 0) > 0
        assert st.highest_register < st.registers            # widths never overshoot the allocation
        assert st.setmaxnreg == []
    else:
        assert lp.mma_opcode.startswith("HGMMA.64x")
        n = int(lp.mma_opcode.split(".")[1].split("x")[1])
        assert lp.mma_per_ktile == mma_per_ktile_for_tile(cfg.BM, cfg.BN, cfg.BK, (64, n, 16), cfg.CONSUMERS)
        assert st.counts["UTMALDG"] > 0 and lp.categories.get("sync", 0) > 0
        kinds = {r["kind"]: r for r in st.setmaxnreg}
        assert set(kinds) == {"alloc", "dealloc"}
        for r in st.setmaxnreg:
            assert 0 <= r["highest_register"] < r["limit"], r
        c7515 = any("(C7515)" in line for line in b.compiled.log.splitlines())
        assert ("C7515" in st.serialization) == c7515
    assert lp.k_tiles is not None and lp.k_tiles >= 1 and float(lp.k_tiles).is_integer()
    # the same k-tiles from the SASS alone: the loop's accumulators and BK
    body = [i for i in parse_sass(b.compiled.sass())[st.kernel][1] if lp.start <= i.addr <= lp.end]
    assert mma_per_ktile_from_bk(body, cfg.BK) == lp.mma_per_ktile
    assert lp.non_mma == lp.instructions - lp.mma - lp.padding > 0
    json.dumps(st.to_dict())                                 # JSON-able


@needs_toolchain
def test_cli_stats_json_matches_build_stats(capsys: pytest.CaptureFixture[str]) -> None:
    from hexlayout.cli import main

    assert main(["compile", "gemm", "--arch", "sm_80", "--stats", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["main_loop"]["mma"] > 0 and doc["spills"] is False
    assert doc["main_loop"]["non_mma_per_ktile"] is not None
    assert main(["explain", "gemm", "--arch", "sm_80", "--stats", "--json"]) == 0
    rep = json.loads(capsys.readouterr().out)
    assert rep["stats"]["main_loop"]["non_mma"] == doc["main_loop"]["non_mma"]


def test_compile_without_emit_or_stats_is_an_error(capsys: pytest.CaptureFixture[str]) -> None:
    from hexlayout.cli import main

    assert main(["compile", "gemm", "--arch", "sm_80"]) != 0
    assert "--stats" in capsys.readouterr().err
    assert main(["compile", "gemm", "--arch", "sm_80", "--emit", "sass"]) != 0
    assert "-o" in capsys.readouterr().err


def test_build_without_cubin_has_no_stats() -> None:
    from hexlayout.lang.examples import gemm_sm80
    from hexlayout.runtime import build

    b = build(gemm_sm80, "sm_80", compile=False, BM=64, BN=64)
    with pytest.raises(StatsError, match="compile=False"):
        _ = b.stats
