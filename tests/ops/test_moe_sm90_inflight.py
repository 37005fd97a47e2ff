"""The pipelined Hopper mixed-type MoE main loops (issue 23, item 3): the sm_90a W4A16 / W8A16
swap-AB kernels (register A: the dequantized weights) and the FP8 swap-AB kernels keep a wgmma
group in flight while the next k-tile is waited for, staged and dequantized
(``blocks.wgmma_pipeline``: the W4A16 / W8A16 loop unrolled by ``sm90_unroll`` (4) k-tiles, each
with its own register A tiles, ``wgmma.wait_group 1``; FP8 block scales: unrolled by 2; FP8
per-expert scales: ``hl.pipeline`` with one group in flight).

Checked here, without a GPU:

- (a) the SASS main loop (``runtime.stats``' main loop of the NVRTC cubin) waits for the wgmma
  pipeline only with ``WARPGROUP.DEPBAR.LE gsb0, 0x1`` (``wgmma.wait_group 1``), one per
  k-tile, never with ``0x0``: a group stays in flight across the loop's back edge. The FP8
  block-scaled forms read each k-tile's partial to scale it, and ptxas serializes every wgmma
  (C7514) when a group is in flight across the back edge while an accumulator is read in the
  loop: their loop issues two k-tiles, scales the first while the second runs and waits with
  ``0x0`` once per two k-tiles;
- (b) no spills, no local memory and no ptxas wgmma-serialization message (C75xx) over a
  config matrix where every value of each factor appears for both GEMMs (BM 16 / 32 / 64, WG
  1 / 2, 4 / 8 bits, f16 / bf16, split and not; FP8 BM 16 / 32, per-expert and 128 x 128 block
  scales, split and not);
- (c) the op in the emulator against the float64 reference on several k-tiles, odd and even
  counts, the 4-stage ring wrapping, ragged K and N, forced K splits;
- the emulator's wgmma hazard check: the same loop with one register A tile (rewritten while
  the previous k-tile's wgmma still reads it) is an error naming the wgmma.
"""

from __future__ import annotations

import re

import pytest
from hexlayout.ops.moe.fp8_kernels_sm90 import moe_fp8_down_sm90_kernel, moe_fp8_gate_up_sm90_kernel
from hexlayout.ops.moe.wna16_kernels_sm90 import moe_wna16_down_sm90_kernel, moe_wna16_gate_up_sm90_kernel

from hexlayout.lang import bf16, f16
from hexlayout.runtime import build
from hexlayout.runtime.stats import SERIALIZATION_CODES, parse_sass

WNA16 = {"gate_up": moe_wna16_gate_up_sm90_kernel, "down": moe_wna16_down_sm90_kernel}
FP8 = {"gate_up": moe_fp8_gate_up_sm90_kernel, "down": moe_fp8_down_sm90_kernel}
DTYPES = {"f16": f16, "bf16": bf16}

#: (kernel, bits, dtype, BM, WG, split): every value of each factor appears, for both kernels
WNA16_MATRIX = [
    ("gate_up", 4, "f16", 16, 1, False),  # decode
    ("down", 4, "f16", 16, 1, False),
    ("gate_up", 8, "bf16", 16, 1, True),
    ("down", 8, "bf16", 16, 1, True),
    ("gate_up", 4, "bf16", 32, 1, True),
    ("down", 8, "f16", 32, 1, False),
    ("gate_up", 8, "f16", 64, 2, False),  # large-token: two warp groups
    ("down", 4, "bf16", 64, 2, True),
    ("down", 4, "f16", 64, 1, False),
]
#: (kernel, dtype, BM, block scales, split)
FP8_MATRIX = [
    ("gate_up", "bf16", 16, False, False),
    ("down", "bf16", 16, False, False),
    ("gate_up", "bf16", 16, True, True),
    ("down", "f16", 16, True, True),
    ("gate_up", "f16", 32, True, False),
    ("down", "bf16", 32, True, False),
    ("gate_up", "f16", 32, False, True),
    ("down", "f16", 32, False, True),
]


def _wna16_build(kernel: str, bits: int, dtype: str, bm: int, wg: int, split: bool):
    consts = {"BM": bm, "WG": wg, "ZERO": 0 if bits == 4 else 128}
    if kernel == "gate_up":
        consts["TOPK"] = 2
    if split:
        consts["SPLIT_K"] = 4
    return build(WNA16[kernel](DTYPES[dtype], bits, 64, split), "sm_90a", **consts)


def _fp8_build(kernel: str, dtype: str, bm: int, block: bool, split: bool):
    consts = {"BM": bm, "BLOCK_SCALE": block, "STAGES": 4}
    if kernel == "gate_up":
        consts.update(TOPK=2, UNIFORM=block)
    if split:
        consts["SPLIT_K"] = 4
    return build(FP8[kernel](DTYPES[dtype], split), "sm_90a", **consts)


def loop_waits(b) -> tuple[list[int], int]:
    """The ``wgmma.wait_group`` depths (``WARPGROUP.DEPBAR.LE gsb0, N``) in the SASS main loop,
    in order, and its MMA count."""
    lp = b.stats.main_loop
    assert lp is not None, b.stats.summary()
    code = next(ins for _, ins in parse_sass(b.compiled.sass()).values() if ins)
    waits = [int(ins.args.split(",")[1].strip().rstrip(";"), 0) for ins in code
             if lp.start <= ins.addr <= lp.end and ins.op.startswith("WARPGROUP.DEPBAR")]
    return waits, lp.mma


def assert_clean(b) -> None:
    """(b): no spills, no local memory, no C75xx (wgmma serialization) from ptxas."""
    st = b.stats
    assert not st.spills and st.local_memory_instructions == 0, st.summary()
    assert not re.findall(r"\((C75\d\d)\)", b.compiled.log), b.compiled.log
    assert not st.serialization, st.warnings
    assert not any(c in w for w in st.warnings for c in SERIALIZATION_CODES), st.warnings


@pytest.mark.nvrtc
@pytest.mark.parametrize(("kernel", "bits", "dtype", "bm", "wg", "split"), WNA16_MATRIX)
def test_wna16_loop_keeps_a_wgmma_group_in_flight(kernel, bits, dtype, bm, wg, split) -> None:
    b = _wna16_build(kernel, bits, dtype, bm, wg, split)
    assert_clean(b)
    waits, mma = loop_waits(b)
    # sm90_unroll(BM) k-tiles per iteration, each followed by wait_group 1; never 0 (the decode
    # down kernel's blocks take column_tiles(BM) weight tiles)
    from hexlayout.ops.moe.wna16_kernels_sm80 import column_tiles
    from hexlayout.ops.moe.wna16_kernels_sm90 import sm90_unroll

    per_ktile = (2 if kernel == "gate_up" else column_tiles(bm)) * (64 // 16)
    u = sm90_unroll(bm)
    assert mma == u * per_ktile, (mma, per_ktile, u)
    assert waits == [1] * u, waits


@pytest.mark.nvrtc
@pytest.mark.parametrize(("kernel", "dtype", "bm", "block", "split"), FP8_MATRIX)
def test_fp8_loop_waits_for_no_k_tile(kernel, dtype, bm, block, split) -> None:
    b = _fp8_build(kernel, dtype, bm, block, split)
    assert_clean(b)
    waits, mma = loop_waits(b)
    per_ktile = (2 if kernel == "gate_up" else 1) * (128 // 32)
    if block:  # two k-tiles: the first's partial scaled while the second runs, then drained
        assert mma == 2 * per_ktile and waits == [1, 0], (mma, waits)
    else:      # one group in flight across the back edge
        assert mma == per_ktile and waits == [1], (mma, waits)


# --- (c) numbers: the op in the emulator against float64 ------------------------------------------

torch = pytest.importorskip("torch")


@pytest.fixture
def sm90(monkeypatch: pytest.MonkeyPatch):
    from test_moe_wna16 import reference_alignment

    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")
    monkeypatch.setattr("hexlayout.ops.moe.pipeline.run_moe_align", reference_alignment)
    return monkeypatch


@pytest.mark.parametrize(
    ("fmt", "bits", "group", "dtype", "h", "i", "split"),
    [
        # K = 224 (BK 32: 7 k-tiles, odd, the ring of 4 wraps), N = 96 (half a 64-column block);
        # the down's K = 96: 3 k-tiles
        ("gptq", 4, -1, torch.float16, 224, 96, None),
        # 8 and 5 k-tiles of 32 (group 32), forced into 2 splits: 4 + 4 and 3 + 2 k-tiles
        ("awq", 4, 32, torch.bfloat16, 256, 160, "2"),
        # W8A16, K = 320 (5 k-tiles of 64), split into 3: 2 + 2 + 1
        ("gptq", 8, 64, torch.bfloat16, 320, 128, "3"),
    ],
)
def test_wna16_several_k_tiles_match_float64(sm90, fmt, bits, group, dtype, h, i, split) -> None:
    from test_moe_wna16 import _bound, _run

    if split:
        sm90.setenv("HEXLAYOUT_MOE_SPLIT_K", split)
    out, want = _run(fmt, bits, group, dtype, 3, 4, 2, "silu", "random", seed=h + i, h=h, i=i)
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(dtype) * want.abs().max().item(), err


@pytest.mark.parametrize(("h", "inter", "block", "split"), [(640, 192, True, None), (384, 176, True, "2"),
                                                            (640, 96, False, None)])
def test_fp8_several_k_tiles_match_float64(sm90, h, inter, block, split) -> None:
    import hexlayout.ops
    from hexlayout.ops.moe.fp8 import prepare_fp8
    from test_moe_fp8 import check, make, reference

    if split:
        sm90.setenv("HEXLAYOUT_MOE_SPLIT_K", split)
    x, w13, s13, w2, s2, tw, ids = make(5, 3, h, inter, 4, 2, torch.bfloat16, block)
    blk = (128, 128) if block else None
    w13p, w2p = prepare_fp8(w13, s13, block=blk), prepare_fp8(w2, s2, block=blk)
    out = hexlayout.ops.fused_moe(x, w13p, w2p, tw, ids, activation="silu")
    check(out, *reference(x, w13, s13, w2, s2, tw, ids, block, "silu"))


def test_one_register_a_tile_rewritten_in_flight_is_an_emulator_error(sm90) -> None:
    """Without the unrolled k-tiles (one traced A tile, ``wgmma.wait_group 1``), k-tile ``k + 1``'s
    dequantization rewrites the A registers k-tile ``k``'s wgmma still reads: the emulator stops
    there, naming both instructions."""
    import importlib

    import hexlayout.ops.moe.wna16_kernels_sm90 as k90
    from test_moe_wna16 import _run

    import hexlayout.lang as hl
    from hexlayout.emulator import AsyncHazardError

    def one_tile(_name, num_k, stages, load, step, finish=None, **_unrolled) -> None:
        for kt, st in hl.pipeline(num_k, stages, load, ahead=stages - 2, async_proxy=True,
                                  wgmma_in_flight=True):
            step(kt, st, 0)
            hl.wgmma_wait(1)

    launch = importlib.import_module("hexlayout.ops.host.launch")
    sm90.setattr(k90, "wgmma_pipeline", one_tile)
    # traced again: the kernels' trace caches emptied, the build memo (keyed by the kernel object)
    # bypassed by building the trace
    for factory in (k90.moe_wna16_gate_up_sm90_kernel, k90.moe_wna16_down_sm90_kernel):
        for wt in (None, hl.u4):  # (the op names the weight type)
            sm90.setattr(factory(f16, 4, 32, False, wt), "_cache", {})
    sm90.setattr(launch, "build_for", lambda kernel, device, consts: build(kernel.trace(**consts), "sm_90a",
                                                                           compile=False))
    with pytest.raises(AsyncHazardError) as e:
        _run("gptq", 4, -1, torch.float16, 3, 4, 2, "silu", "random", seed=1, h=224, i=96)
    assert e.value.other_instr.opname == "Wgmma", str(e.value)
    assert "moe_wna16_gate_up_sm90" in str(e.value), str(e.value)
