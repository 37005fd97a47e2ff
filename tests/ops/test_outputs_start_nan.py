"""On the CPU every output and workspace reaches its kernel NaN-filled (``hexlayout.runtime.alloc``:
``fresh``), so an element a kernel should write but does not cannot pass for a plausible 0. Per op
family - paged attention (sm_80, split-KV, sm_90a), varlen attention (sm_80, sm_90a), the fused
MoE with bf16, FP8 and W4A16 weights (plain, split-K, an expert map) - a spy on
``host.launch.run_kernel`` records what each tensor a kernel writes held the first time a kernel
was handed it: all poison (NaN; int32's most negative value for the alignment's buffers), or all
zeros only where the contract says so (``zeroed``: the split-K f32 workspaces, which atomics add
into, and the MoE's ``y`` under an expert map, whose remote slots read 0). Then every defined
output position is finite and matches the float64 reference (attention: rows with no visible key
written as 0 / -inf), and an unwritten one (attention's padding rows) is still NaN."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import Any

import pytest

torch = pytest.importorskip("torch")
import hexlayout.ops  # noqa: E402,F401 - registers the ops
from hexlayout.ops.attention.paged import paged_attention  # noqa: E402
from hexlayout.ops.attention.varlen import attention_varlen  # noqa: E402
from hexlayout.ops.host import launch  # noqa: E402
from hexlayout.ops.moe.fp8 import prepare_fp8  # noqa: E402
from hexlayout.ops.moe.splitk import SPLIT_K_ENV  # noqa: E402
from test_attention_varlen_op import make_case as varlen_case  # noqa: E402
from test_attention_varlen_op import reference as varlen_reference  # noqa: E402
from test_moe_fp8 import check as fp8_check  # noqa: E402
from test_moe_fp8 import make as fp8_make  # noqa: E402
from test_moe_fp8 import reference as fp8_reference  # noqa: E402
from test_moe_op import close as bf16_close  # noqa: E402
from test_moe_op import make as bf16_make  # noqa: E402
from test_moe_op import reference as bf16_reference  # noqa: E402
from test_moe_wna16 import _bound as wna16_bound  # noqa: E402
from test_moe_wna16 import _run as wna16_run  # noqa: E402
from test_paged_attention_op import make_case as paged_case  # noqa: E402
from test_paged_attention_op import reference as paged_reference  # noqa: E402

from hexlayout.runtime.alloc import poison_value  # noqa: E402


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.delenv("HEXLAYOUT_EMULATE_ARCH", raising=False)
    monkeypatch.delenv(SPLIT_K_ENV, raising=False)


def _state(t: torch.Tensor) -> str:
    """What ``t`` holds: ``"poison"`` (fresh's fill throughout), ``"zero"`` or ``"other"``."""
    if t.numel() == 0:
        return "poison"
    v = t.float() if t.dtype.is_floating_point else t
    if t.dtype.is_floating_point and v.isnan().all() or not t.dtype.is_floating_point and \
            (t == poison_value(t.dtype)).all():
        return "poison"
    return "zero" if (v == 0).all() else "other"


@pytest.fixture
def arrivals(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, int, str]]]:
    """``(kernel, output index, state)`` for each tensor a kernel writes, when a kernel is first
    handed it (the storages are held, so no later tensor reuses one's address)."""
    real = launch.run_kernel
    seen: list[Any] = []
    got: list[tuple[str, int, str]] = []

    def spy(bld: Any, args: tuple[Any, ...], outputs: tuple[int, ...], strides: tuple[int, ...] = ()) -> None:
        for i in outputs:
            st = args[i].untyped_storage()
            if any(s.data_ptr() == st.data_ptr() for s in seen):
                continue
            seen.append(st)
            got.append((bld.tile_kernel.name, i, _state(args[i])))
        real(bld, args, outputs, strides)

    for name, mod in list(sys.modules.items()):
        if name.startswith("hexlayout.ops") and getattr(mod, "run_kernel", None) is real:
            monkeypatch.setattr(mod, "run_kernel", spy)
    yield got


def _all_poison(got: list[tuple[str, int, str]], zero_ok: Any = lambda name: False) -> None:
    assert got, "no kernel ran"
    bad = [g for g in got if g[2] != "poison" and not (g[2] == "zero" and zero_ok(g[0]))]
    assert not bad, f"outputs that reached their kernel not NaN-filled: {bad}"


def _check_attention(out: torch.Tensor, lse: torch.Tensor, want: tuple, rows: int, tol: float) -> None:
    """Defined rows: finite, 0 / -inf exactly where no key is visible, the reference elsewhere;
    padding rows: never written (still NaN)."""
    o, wl = want[0][:rows], want[1][:, :rows]
    fin = torch.isfinite(wl)
    assert torch.isfinite(out[:rows]).all()
    assert torch.equal(torch.isfinite(lse[:, :rows]), fin) and torch.isneginf(lse[:, :rows][~fin]).all()
    assert (~fin).any(), "the case should hold rows that see no key"
    assert not out[:rows][~fin.T].any()                             # such rows: exactly 0
    assert (out[:rows].double() - o).abs().max().item() <= tol
    assert (lse[:, :rows][fin].double() - wl[fin]).abs().max().item() <= 1e-3
    assert out[rows:].isnan().all() and lse[:, rows:].isnan().all()


@pytest.mark.parametrize(("arch", "splits"), [("sm_80", 1), ("sm_80", 3), ("sm_90a", 2)])
def test_paged_attention(arrivals: list, monkeypatch: pytest.MonkeyPatch, arch: str, splits: int) -> None:
    """A sequence with more queries than keys (causal: its first rows see none), one with no key
    at all, padding rows; split-KV with more splits than some sequences have key blocks."""
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    a = paged_case(21, [3, 5, 1, 2], [40, 2, 0, 17], 4, 2, 64, 16, pad=2)
    out, lse = paged_attention(**a, num_splits=splits, return_lse=True)
    _all_poison(arrivals)
    assert len(arrivals) == (4 if splits > 1 else 2)               # out, lse (and the two partials)
    _check_attention(out, lse, paged_reference(a), 11, 2e-3)


@pytest.mark.parametrize("arch", ["sm_80", "sm_90a"])
def test_attention_varlen(arrivals: list, monkeypatch: pytest.MonkeyPatch, arch: str) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", arch)
    a = varlen_case(22, [3, 5, 0, 2], [9, 2, 4, 0], 4, 2, 64, pad=2)
    out, lse = attention_varlen(**a, causal=True, return_lse=True)
    _all_poison(arrivals)
    assert len(arrivals) == 2
    _check_attention(out, lse, varlen_reference(a, causal=True), 10, 2e-3)


def _splitk(name: str) -> bool:
    """A split-K GEMM (its f32 workspace: atomics add into it), not the act / cast kernels after it."""
    return "_splitk" in name and not name.startswith("moe_splitk_")


@pytest.mark.parametrize("mode", ["plain", "split_k", "expert_map"])
def test_fused_moe_bf16(arrivals: list, monkeypatch: pytest.MonkeyPatch, mode: str) -> None:
    x, w13, w2, tw, ids = bf16_make(5, 64, 64, 8, 2, torch.bfloat16, seed=23, experts_used=6)
    emap = None
    if mode == "split_k":
        monkeypatch.setenv(SPLIT_K_ENV, "2")
    if mode == "expert_map":      # 16 global experts, the odd ones remote
        emap = torch.where(torch.arange(16) % 2 == 0, torch.arange(16) // 2, -1).to(torch.int32)
        ids = torch.stack([torch.randperm(16, generator=torch.Generator().manual_seed(t))[:2]
                           for t in range(5)]).to(torch.int32)
    out = hexlayout.ops.fused_moe(x, w13, w2, tw, ids, expert_map=emap,
                                  global_num_experts=16 if emap is not None else None)
    zero_ok = _splitk if mode == "split_k" else (lambda n: n.startswith("moe_down")) if emap is not None \
        else (lambda n: False)
    _all_poison(arrivals, zero_ok)
    assert any(g[2] == "zero" for g in arrivals) == (mode != "plain")
    assert torch.isfinite(out).all()
    bf16_close(out, bf16_reference(x, w13, w2, tw, ids, emap=emap), torch.bfloat16)


@pytest.mark.parametrize("split", [1, 2])
def test_fused_moe_fp8(arrivals: list, monkeypatch: pytest.MonkeyPatch, split: int) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_89")
    monkeypatch.setenv(SPLIT_K_ENV, str(split))
    x, w13, s13, w2, s2, tw, ids = fp8_make(24, 3, 128, 64, 8, 2, block=True)
    blk = (128, 128)
    a, b = prepare_fp8(w13, s13, block=blk), prepare_fp8(w2, s2, block=blk)
    out = hexlayout.ops.fused_moe(x, a, b, tw, ids)
    _all_poison(arrivals, _splitk)
    assert any(g[2] == "zero" for g in arrivals) == (split > 1)
    assert any(g[0].startswith("moe_fp8_quant") for g in arrivals)  # activations and scales: fresh too
    assert torch.isfinite(out).all()
    fp8_check(out, *fp8_reference(x, w13, s13, w2, s2, tw, ids, True))


@pytest.mark.parametrize("split", [1, 2])
def test_fused_moe_w4a16(arrivals: list, monkeypatch: pytest.MonkeyPatch, split: int) -> None:
    monkeypatch.setenv(SPLIT_K_ENV, str(split))
    out, want = wna16_run("awq", 4, 64, torch.float16, 3, 8, 2, "silu", "random", seed=25)
    _all_poison(arrivals, _splitk)
    assert any(g[2] == "zero" for g in arrivals) == (split > 1)
    assert torch.isfinite(out).all()
    err = (out.double() - want).abs().max().item()
    assert err <= wna16_bound(torch.float16) * want.abs().max().item(), err
