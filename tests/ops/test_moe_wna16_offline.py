"""Synthesized offline weight layouts (``hl.offline``, ``hexlayout.ir.offline``) of the W4A16 /
W8A16 MoE kernels: the layout is derived (the arch or the warps change it), its permutation is a
bijection that gives each thread's fragment one contiguous run, the kernels run in the emulator on
sm_80 and sm_90a against float64 references dequantized from the checkpoint tensors (AWQ, GPTQ-4,
GPTQ-8; ragged K and N; five k-tiles: the three-stage ring wraps; outputs NaN-prefilled by the
CPU allocator), weights prepared for another layout are refused naming the argument (eager and
fake), and the kernels' source has no view op that matches a fragment order."""

from __future__ import annotations

import ast
import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from hexlayout.ops.moe.wna16 import fused_moe_wna16, prepare_wna16  # noqa: E402
from hexlayout.ops.moe.wna16_layout import wna16_offline_layout  # noqa: E402
from test_moe_wna16 import _bound, checkpoint, reference, reference_alignment, routing  # noqa: E402

import hexlayout.lang as hl  # noqa: E402
from hexlayout.errors import HexlayoutError  # noqa: E402
from hexlayout.runtime import build  # noqa: E402

MOE = pathlib.Path(__file__).resolve().parents[2] / "ops" / "moe"


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.setattr("hexlayout.ops.moe.pipeline.run_moe_align", reference_alignment)


def _layouts() -> list:
    return [wna16_offline_layout(a, hl.f16, b, 128, 128, False) for a in ("sm_80", "sm_90a") for b in (4, 8)]


def test_the_layout_is_derived_from_the_arch_and_the_warps() -> None:
    from hexlayout.ops.moe.wna16_kernels_sm80 import moe_wna16_down_kernel

    keys = {lay.key for lay in _layouts()}
    assert len(keys) == 4  # sm_80 mma.sync B fragments differ from sm_90a wgmma register-A ones
    four = wna16_offline_layout("sm_80", hl.f16, 4, 128, 128, False)
    two = build(moe_wna16_down_kernel(hl.f16, 4, 64), "sm_80", compile=False, BM=16, BN=64, BK=64,
                WARPS=2).offline_layouts["q"]
    assert (four.threads, two.threads) == (128, 64) and four.key != two.key
    assert (four.thread_bytes, two.thread_bytes) == (16, 32)  # one, resp. two 16-byte vectors
    # the gate-up and the down kernel (and decode / prefill BM) share the weight tile's layout
    assert four.key == wna16_offline_layout("sm_80", hl.f16, 4, 128, 128, True).key
    prefill = build(moe_wna16_down_kernel(hl.f16, 4, 64), "sm_80", compile=False, BM=64, BN=64, BK=64,
                    WARPS=4).offline_layouts["q"]
    assert prefill.key == four.key


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a", "sm_100a"])
def test_bf16_and_other_group_sizes_share_the_synthesized_layouts(arch: str) -> None:
    """``wna16_offline_layouts`` synthesizes the f16 kernel with groups of 128 for every 16-bit
    activation type and group size: the bf16 AWQ kernel with groups of 64 (BK 64) and of 32 (BK
    32) built here chooses the same layouts for ``q``, ``s`` and ``z``."""
    from hexlayout.ops.moe import wna16_kernels_sm80, wna16_kernels_sm90, wna16_kernels_sm100
    from hexlayout.ops.moe.wna16_layout import kernel_tiles, offline_key, wna16_offline_layouts

    fac = {"sm_80": wna16_kernels_sm80.moe_wna16_down_kernel,
           "sm_90a": wna16_kernels_sm90.moe_wna16_down_sm90_kernel,
           "sm_100a": wna16_kernels_sm100.moe_wna16_down_sm100_kernel}[arch]
    for group, bk in ((64, 64), (32, 32)):
        built = build(fac(hl.bf16, 4, bk, False, hl.u4), arch, compile=False,
                      **kernel_tiles(arch, bk, group, 0)).offline_layouts
        shared = wna16_offline_layouts(arch, hl.bf16, 4, 256, group, False, zero=0)
        assert set(built) == {"q", "s", "z"} and offline_key(built) == offline_key(shared)


@pytest.mark.parametrize("idx", range(4))
def test_the_permutation_is_a_bijection_giving_each_thread_one_run(idx: int) -> None:
    lay = _layouts()[idx]
    tr, tk = lay.tile
    shape = (2 * tr, 3 * tk)
    perm = lay.permutation(shape)
    assert np.array_equal(np.sort(perm), np.arange(perm.size))
    # thread t's value v of tile (i, j) is unit t * V + v of that tile's block; 4-bit: the unit's
    # nibble h (unpacked value n = 2 v + h) is stored at nibble 8 (n // 8) + (0,4,1,5,2,6,3,7)[n % 8]
    # of the thread's run (the words hold the values 0, 2, 4, 6, 1, 3, 5, 7: one LOP3 per f16 pair)
    pu, v_count, threads = lay.per_unit, lay.values, lay.threads
    assert lay.nibbles == ((0, 4, 1, 5, 2, 6, 3, 7) if lay.bits == 4 else ())
    assert lay.key.endswith("/n04152637") == (lay.bits == 4)
    table = lay.tv.indices().reshape(v_count, threads).T  # [t, v] -> colex unit index
    run = np.arange(threads * v_count).reshape(threads, v_count)
    for i, j in ((0, 0), (1, 2)):
        r = i * tr + table % tr
        block = (i * 3 + j) * tr * tk // pu
        for h in range(pu):
            k = (j * tk // pu + table // tr) * pu + h
            phys = perm[(r * shape[1] + k).reshape(-1)].reshape(threads, v_count)
            n = pu * np.arange(v_count) + h        # the unpacked value in the thread's run
            if lay.nibbles:
                n = n - n % 8 + np.asarray(lay.nibbles)[n % 8]
            want = (block + run - run % v_count) * pu + n
            assert np.array_equal(phys, want)
    assert lay.vector_bytes == 16 and lay.thread_bytes % 16 == 0
    # apply packs the logical values in that order
    vals = torch.randint(0, 2**lay.bits, shape)
    phys_t = lay.apply(vals)
    flat = phys_t.reshape(-1).to(torch.int64)
    if lay.bits == 4:
        flat = torch.stack([flat & 15, flat >> 4], -1).reshape(-1)
    assert torch.equal(flat[torch.from_numpy(perm)], vals.reshape(-1))


def _moe(fmt, bits, group, dtype, arch, t, e, k, h, i, seed):
    gen = torch.Generator().manual_seed(seed)
    ck13, w13 = checkpoint(fmt, bits, e, h, 2 * i, group, dtype, gen)
    ck2, w2 = checkpoint(fmt, bits, e, i, h, group, dtype, gen)
    p13 = prepare_wna16(*ck13, quant_format=fmt, bits=bits, group_size=group, gate_up=True, arch=arch)
    p2 = prepare_wna16(*ck2, quant_format=fmt, bits=bits, group_size=group, arch=arch)
    x = torch.randn(t, h, generator=gen).to(dtype)
    ids = routing("random", t, e, k, gen)
    tw = torch.rand(t, k, generator=gen)
    return x, p13, p2, tw, ids, reference(x, w13, w2, tw, ids, "silu", False, None)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
@pytest.mark.parametrize(("fmt", "bits", "group"), [("awq", 4, -1), ("gptq", 4, -1), ("gptq", 8, -1)])
def test_ragged_k_and_n_over_five_k_tiles_match_float64(monkeypatch, arch, fmt, bits, group) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    # H = 320 = 5 k-tiles of 64 (the 3-stage ring wraps); I = 40 and H's 320 output columns are
    # not multiples of the 64-row tile (N padded); the down GEMM's K = I = 40: one padded k-tile
    x, p13, p2, tw, ids, want = _moe(fmt, bits, group, torch.float16, arch, 5, 4, 2, 320, 40, seed=bits)
    assert p13.qweight.shape == (4 * 128, 320 * bits // 8) and p2.qweight.shape == (4 * 320, 64 * bits // 8)
    out = fused_moe_wna16(x, p13, p2, tw, ids)
    assert out.isfinite().all()
    err = (out.double() - want).abs().max().item()
    assert err <= _bound(torch.float16) * want.abs().max().item(), err


def test_weights_prepared_for_another_arch_are_refused_eager_and_fake(monkeypatch) -> None:
    x, p13, p2, tw, ids, _ = _moe("awq", 4, 64, torch.float16, "sm_80", 2, 4, 2, 64, 64, seed=3)
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")
    with pytest.raises(HexlayoutError, match=r"\bw13_qweight\b.*offline layout.*sm_90a"):
        fused_moe_wna16(x, p13, p2, tw, ids)
    from torch._subclasses.fake_tensor import FakeTensorMode

    tensors, consts = p13.op_args(p2)
    with FakeTensorMode() as mode:
        fake = [mode.from_tensor(a) if isinstance(a, torch.Tensor) else a
                for a in (x, *tensors, tw, ids, *consts)]
        with pytest.raises(HexlayoutError, match=r"\bw13_qweight\b.*offline layout"):
            torch.ops.hexlayout.fused_moe_wna16(*fake, **p13.op_kwargs(p2))
        # the right key passes the fake path (the weights' layout is sm_80's; the check is the arch's)
        monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_80")
        out = torch.ops.hexlayout.fused_moe_wna16(*fake, **p13.op_kwargs(p2))
        assert out.shape == x.shape
        monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_90a")
    # w2 alone from another arch: named
    gen = torch.Generator().manual_seed(2)
    p13_90 = prepare_wna16(*checkpoint("awq", 4, 4, 64, 128, 64, torch.float16, gen)[0],
                           quant_format="awq", bits=4, group_size=64, gate_up=True, arch="sm_90a")
    with pytest.raises(HexlayoutError, match=r"\bw2_qweight\b.*offline layout"):
        fused_moe_wna16(x, p13_90, p2, tw, ids)
    assert p13_90.layout_key != p13.layout_key


_FRAGMENT_VIEWS = {"reshape", "permute", "pack", "interleave", "unpack"}


@pytest.mark.parametrize("name", sorted(p.name for p in MOE.glob("*kernels*.py")))
def test_the_kernels_have_no_fragment_order_view_ops(name: str) -> None:
    """Every MoE kernel source (bf16, FP8, W4A16 / W8A16; sm_80 to sm_100a) reads its operands
    in logical coordinates: no view op that would reorder a tile into a fragment's order."""
    tree = ast.parse((MOE / name).read_text())
    calls = [n.func for n in ast.walk(tree) if isinstance(n, ast.Call)]
    called = {f.attr for f in calls if isinstance(f, ast.Attribute)}
    called |= {f.id for f in calls if isinstance(f, ast.Name)}
    assert not called & _FRAGMENT_VIEWS, called & _FRAGMENT_VIEWS
    assert not {"_weight_tile", "_rows_in_order"} & called


def test_explain_shows_and_draws_the_offline_layout(tmp_path) -> None:
    """``explain`` of the CLI's ``moe_wna16`` on sm_80 shows and draws the offline layout that
    ``prepare_wna16`` gives the weights. The synthesis explained is the build of the kernel the
    CLI resolves (``build``: the same program and constants as the layout's own build, so the
    cached synthesis, not a second one of ~30 s; ``synthesize_kernel`` is the same ``synthesize``
    call, tested by ``tests/test_cli_explain.py``)."""
    from hexlayout.cli.explain import draw_report, explain_report, format_report
    from hexlayout.cli.kernels import SynthesisResult, resolve

    lay = wna16_offline_layout("sm_80", hl.f16, 4, 128, 128, True)
    rk = resolve("moe_wna16", "sm_80")
    tk = rk.trace()
    result = SynthesisResult(tk, build(tk, "sm_80", compile=False).synthesis, 0.0, 0.0, dict(rk.constants))
    report = explain_report(result, "moe_wna16", "sm_80")
    offs = {o["param"]: o for o in report["offline"]}
    off = offs["q"]
    assert off["key"] == lay.key and off["tile"] == [64, 64] and off["thread_bytes"] == 16
    assert off["in_tile"] == str(lay.in_tile)
    # the scales (and AWQ's zero points): (64, 1) columns, each owner's two columns one run,
    # read by the 4 threads of a fragment that share them
    sc = offs["s"]
    assert sc["tile"] == [64, 1] and sc["threads"] == 32 and sc["values_per_thread"] == 2
    assert sc["replicas"] == 4 and sc["thread_bytes"] == 4
    text = format_report(report)
    assert "offline layouts" in text and "q: u4 tiles 64x64" in text and lay.key in text
    pics = draw_report(result, tmp_path)
    assert any(p["path"].endswith("offline_q.png") for p in pics)
    assert (tmp_path / "offline_q.png").stat().st_size > 1000
