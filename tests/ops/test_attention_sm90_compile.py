"""Compile evidence for the sm_90a paged attention kernel (wgmma): the shipped configurations
(head sizes 64 / 128 / 256, f16 / bf16, the split-KV variant) compile with NVRTC for sm_90a
without spills or local memory, with no ptxas wgmma-serialization message (C75xx), and the
SASS holds HGMMA for both products (Q K^T from shared memory, P V with P in registers) and
the cp.async gathers of the K / V pages."""

from __future__ import annotations

import re

import pytest

from hexlayout.runtime.stats import SERIALIZATION_CODES, parse_sass


@pytest.mark.nvrtc
@pytest.mark.parametrize(
    ("hd", "dtype", "split"), [(64, "f16", False), (128, "bf16", True), (256, "bf16", False)]
)
def test_sm90_paged_kernel_compiles_without_spills_or_serialization(hd: int, dtype: str, split: bool) -> None:
    from hexlayout.ops.attention.kernels_sm90 import paged_attention_sm90_kernel
    from hexlayout.ops.attention.paged import paged_attention_sm90_consts

    import hexlayout.lang as hl
    from hexlayout.runtime import build

    consts = paged_attention_sm90_consts(hd, 16, 8, 1, True, False, False)
    if split:
        consts["SPLITS"] = 4
    b = build(paged_attention_sm90_kernel(getattr(hl, dtype), split), "sm_90a", **consts)
    res = b.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, res
    st = b.stats
    assert st.local_memory_instructions == 0 and not st.serialization, st.summary()
    assert not re.findall(r"\((C75\d\d)\)", b.compiled.log)
    assert not any(c in w for w in st.warnings for c in SERIALIZATION_CODES), st.warnings
    counts = b.compiled.sass_counts()
    assert any(op.startswith("LDGSTS") for op in counts)
    assert not any(op.startswith("HMMA") for op in counts)
    # per 64-key step and warp group: hd/16 Q K^T wgmma (64x64x16) and 4 P V wgmma (64 x hd x 16)
    lp = st.main_loop
    assert lp is not None and lp.mma == hd // 16 + 4, st.summary()
    pv = [op for op in counts if op.startswith(f"HGMMA.64x{hd}x16")]
    assert pv and (hd == 64 or any(op.startswith("HGMMA.64x64x16") for op in counts)), counts
    # up to head size 128 two consumer warp groups over alternate key blocks (KSPLIT); OVERLAP
    # where the shared memory holds three buffers per warp group: block j's Q K^T and block
    # j - 1's P V in flight together while block j + 1's gather is issued and p_j computed
    assert (consts["KSPLIT"], consts["OVERLAP"]) == {64: (2, True), 128: (2, False), 256: (1, False)}[hd]
    assert b.generated.threads == 128 * consts["KSPLIT"]
    if consts["OVERLAP"]:
        assert loop_waits(b) == [1, 0] and lp.overlapped >= lp.non_mma / 4, st.summary()
    else:
        assert loop_waits(b) == [0, 0], st.summary()


@pytest.mark.nvrtc
@pytest.mark.parametrize(
    ("hd", "left", "right", "softcap"),
    [(64, False, False, False), (128, False, True, False), (256, True, True, True)],
)
def test_sm90_varlen_kernel_is_warp_specialized_tma_wgmma(
    hd: int, left: bool, right: bool, softcap: bool
) -> None:
    """The FA3-structured varlen kernel: TMA loads (UTMALDG), HGMMA only, setmaxnreg regions
    within their budgets, no spills, no local memory, no wgmma serialization."""
    from hexlayout.ops.attention.kernels_sm90 import (
        attention_varlen_sm90_consts,
        attention_varlen_sm90_kernel,
    )

    import hexlayout.lang as hl
    from hexlayout.runtime import build

    b = build(
        attention_varlen_sm90_kernel(hl.bf16),
        "sm_90a",
        **attention_varlen_sm90_consts(hd, left, right, softcap),
    )
    res = b.compiled.resources
    assert res.spill_stores == 0 and res.spill_loads == 0 and res.stack_frame == 0, res
    st = b.stats
    assert st.local_memory_instructions == 0 and not st.serialization, st.summary()
    assert not re.findall(r"\((C75\d\d)\)", b.compiled.log)
    regions = {r["kind"]: r for r in st.setmaxnreg}
    assert set(regions) == {"alloc", "dealloc"}, st.setmaxnreg
    assert all(r["highest_register"] < r["limit"] for r in st.setmaxnreg), st.setmaxnreg
    counts = b.compiled.sass_counts()
    assert any(op.startswith("UTMALDG") for op in counts) and not any(
        op.startswith("LDGSTS") for op in counts
    )
    assert not any(op.startswith("HMMA") for op in counts)
    lp = st.main_loop
    consts = attention_varlen_sm90_consts(hd, left, right, softcap)
    bn = consts["BN"]
    # per key block and consumer warp group: hd/16 Q K^T wgmma (64 x BN x 16), BN/16 P V wgmma (64 x hd x 16)
    assert lp is not None and lp.mma == hd // 16 + bn // 16 and lp.mma_opcode.startswith("HGMMA.64x"), (
        st.summary()
    )
    # FlashAttention-3's intra-warpgroup overlap (OVERLAP): block j's Q K^T and block j - 1's P V
    # in flight together, ``wait_group 1`` then ``0`` per key block, and at least a quarter of
    # the loop's work issued beside an in-flight group (each product waited for at once: ~1/8)
    assert consts.get("OVERLAP", True)
    assert loop_waits(b) == [1, 0] and lp.overlapped >= lp.non_mma / 4, st.summary()


def loop_waits(b) -> list[int]:
    """The ``wgmma.wait_group`` depths (``WARPGROUP.DEPBAR.LE gsb0, N``) in the main loop, in order."""
    lp = b.stats.main_loop
    code = next(ins for _, ins in parse_sass(b.compiled.sass()).values() if ins)
    return [int(i.args.split(",")[1].strip().rstrip(";"), 0) for i in code
            if lp.start <= i.addr <= lp.end and i.op.startswith("WARPGROUP.DEPBAR")]
