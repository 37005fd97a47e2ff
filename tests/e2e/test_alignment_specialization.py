"""Alignment is specialized, not assumed (issue 20 item 7): a kernel traced without alignment
declarations runs on any legal tensor - odd row lengths, storage offsets off 16 bytes - as
the build specialized on the launch's divisibility facts (pointers in bytes, sizes and
strides in elements, powers of two up to 16), with vectors no wider than those allow; the
specialized build is cached beside the aligned one, which aligned launches keep using."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import hexlayout.lang as hl  # noqa: E402
from hexlayout.ir.divisibility import (  # noqa: E402
    DivisibilityFacts,
    expr_divisibility,
    pow2_divisor,
    specialization,
    specialize,
)
from hexlayout.ir.expr import Var  # noqa: E402
from hexlayout.lang import bf16, f16, f32  # noqa: E402
from hexlayout.runtime import build, clear_builds, emulate, launch_log  # noqa: E402
from hexlayout.runtime.args import kernel_plan  # noqa: E402
from hexlayout.runtime.specialize import clear_specialized, specialized_build  # noqa: E402

T, I, S = hl.dims("T I S")
DTYPES = {"f16": (f16, torch.float16, 1e-2), "bf16": (bf16, torch.bfloat16, 1e-2),
          "f32": (f32, torch.float32, 1e-5)}


def silu_mul(dt, name: str = "silu_mul", row_stride: bool = False):
    """``out[t, i] = silu(x[t, i]) * x[t, I + i]`` with no alignment declaration (the default:
    16-byte vectors when the launch allows them); ``row_stride``: ``x``'s rows ``S`` apart."""

    def silu_mul(x, out, *, BT: int = 4, BI: int = 256):
        t0, i0 = hl.grid(hl.spatial(hl.cdiv(x.shape[0], BT), hl.cdiv(out.shape[1], BI)))
        n = out.shape[1]
        gate = hl.register(dt, (BT, BI))
        up = hl.register(dt, (BT, BI))
        hl.copy(hl.view(x, tile=(BT, BI), origin=(t0 * BT, i0 * BI)), gate)
        hl.copy(hl.view(x, tile=(BT, BI), origin=(t0 * BT, n + i0 * BI)), up)
        y = hl.silu(hl.cast(gate, f32)) * hl.cast(up, f32)
        hl.copy(hl.cast(y, dt), hl.view(out, tile=(BT, BI), origin=(t0 * BT, i0 * BI)))

    x = dt[T, 2 * I].strides(S, 1) if row_stride else dt[T, 2 * I]
    silu_mul.__annotations__ = {"x": x, "out": dt[T, I]}
    return hl.kernel(threads=128, name=name)(silu_mul)


def _reference(x: torch.Tensor) -> torch.Tensor:
    n = x.shape[1] // 2
    xd = x.double()
    return torch.nn.functional.silu(xd[:, :n]) * xd[:, n:]


def _choices(b) -> list[str]:
    return [ins for _, ins in b.synthesis.lowered.choices]


@pytest.fixture(autouse=True)
def _fresh_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HEXLAYOUT_CACHE_DIR", str(tmp_path))
    clear_builds()
    clear_specialized()
    yield
    clear_specialized()


# --- the divisibility computation --------------------------------------------------------------

def test_pow2_divisor_and_expression_divisibility() -> None:
    assert [pow2_divisor(n) for n in (0, 1, 2, 6, 8, 24, 48, 343, 686, 4099, 4096)] == \
        [16, 1, 2, 2, 8, 8, 16, 1, 2, 1, 16]
    assert pow2_divisor(0x7F0002, cap=16) == 2 and pow2_divisor(-12) == 4
    v, w = Var("I"), Var("S")
    facts = {"I": 1, "S": 4}
    assert expr_divisibility(2 * v, facts) == 2                 # 2 * odd
    assert expr_divisibility(v * 8 + 16, facts) == 8
    assert expr_divisibility(w * 8, facts) == 16                # capped at 16
    assert expr_divisibility(v + w, facts) == 1
    assert expr_divisibility(v // 2, facts) == 1                # unknown operation: 1
    assert expr_divisibility(Var("unknown"), facts) == 1


def test_launch_facts_of_pointers_sizes_and_strides() -> None:
    """The launcher's facts: data pointers in bytes (a storage offset of one f16 element is 2
    bytes off), sizes in elements, each the largest power of two up to 16."""
    k = silu_mul(f16)
    b = build(k, "sm_80", compile=False)
    plan = kernel_plan(b)
    x = torch.zeros(3, 2 * 343 + 1, dtype=torch.float16)
    xv = x.view(-1)[1:1 + 3 * 686].view(3, 686)               # storage offset 1: 2-byte pointer
    out = torch.zeros(3, 343, dtype=torch.float16)
    facts = plan.facts(plan.collect([xv, out], {}), "cpu")
    assert facts.pointer("x") == 2 and facts.pointer("out") == 16
    assert dict(facts.sizes) == {"T": 1, "I": 1}
    facts = plan.facts(plan.collect([torch.zeros(8, 2 * 344, dtype=torch.float16),
                                     torch.zeros(8, 344, dtype=torch.float16)], {}), "cpu")
    assert dict(facts.sizes) == {"T": 8, "I": 8} and facts.pointer("x") == 16


def test_specialization_is_what_the_facts_weaken() -> None:
    tk = silu_mul(f16).trace()
    aligned = DivisibilityFacts.of({"x": 4096, "out": 64}, {"T": 5, "I": 4096})
    assert specialization(tk, aligned) == () and specialize(tk, aligned) is tk   # T moves no vector
    odd = DivisibilityFacts.of({"x": 4096, "out": 64}, {"T": 5, "I": 343})
    # x: rows of 2I (2-element multiple: 4 bytes), origin column I (odd); out: rows of I (2 bytes)
    assert specialization(tk, odd) == (("x", 4, (("I", 1),)), ("out", 2, ()))
    sk = specialize(tk, odd)
    assert sk is not tk and [p.align_bytes for p in sk.params] == [4, 2]
    assert [p.align_bytes for p in tk.params] == [16, 16]               # the original is unchanged
    off = DivisibilityFacts.of({"x": 4098, "out": 64}, {"T": 5, "I": 4096})
    assert specialization(tk, off) == (("x", 2, ()),)


# --- odd row lengths run in the emulator --------------------------------------------------------

@pytest.mark.parametrize("dtn", list(DTYPES))
def test_silu_mul_over_odd_rows_matches_torch(dtn: str) -> None:
    dt, tdt, tol = DTYPES[dtn]
    b = build(silu_mul(dt), "sm_80", compile=False)
    widest = 128 // dt.bits
    assert _choices(b) == [f"ld.global.b{widest * dt.bits}"] * 2 + [f"st.global.b{widest * dt.bits}"]
    g = torch.Generator().manual_seed(7)
    for t, i in ((5, 343), (3, 1), (2, 7), (2, 4096 + 3)):
        x = (2 * torch.randn(t, 2 * i, generator=g)).to(tdt)
        out = torch.full((t, i), float("nan"), dtype=tdt)
        emulate(b, x, out)
        want = _reference(x)
        err = ((out.double() - want).abs().max() / want.abs().max()).item()
        assert err <= tol, (i, err)
    special = specialized_build(b, DivisibilityFacts.of({"x": 4096, "out": 4096}, {"T": 5, "I": 343}))
    assert special is not b
    # origin column I odd and rows of I: one element per access there
    assert _choices(special)[1:] == [f"ld.global.b{dt.bits}", f"st.global.b{dt.bits}"]


def test_offset_storage_view_runs_with_narrower_vectors() -> None:
    """A contiguous view whose storage offset breaks 16-byte alignment (``buf[1:]``), and rows
    of an even length: no refusal, no fault; the aligned build is not used for it."""
    b = build(silu_mul(f16), "sm_80", compile=False)
    g = torch.Generator().manual_seed(8)
    buf = torch.randn(4 * 2 * 304 + 1, generator=g).half()
    x = buf[1:].view(4, 2 * 304)
    assert x.data_ptr() % 16 == 2
    out = torch.zeros(4, 304, dtype=torch.float16)
    with launch_log() as log:
        emulate(b, x, out)
        emulate(b, x.clone(), out)
    assert (out.double() - _reference(x)).abs().max().item() <= 1e-2 * _reference(x).abs().max().item()
    assert log[0].build_key != log[1].build_key
    assert log[1].build_key == _key(b)


@pytest.mark.parametrize("i", [304, 343])
def test_offset_column_view_runs(i: int) -> None:
    """``x[:, 1:]`` of a ``[T, 2I + 1]`` tensor: rows of odd stride ``S = 2I + 1``, a data
    pointer 2 bytes off; read in place (the emulator addresses the strided view as a span of
    the memory it lies in), with one-element accesses of ``x``."""
    b = build(silu_mul(f16, "silu_mul_strided", row_stride=True), "sm_80", compile=False)
    assert _choices(b) == ["ld.global.b128"] * 2 + ["st.global.b128"]
    g = torch.Generator().manual_seed(i)
    base = torch.randn(3, 2 * i + 1, generator=g).half()
    x = base[:, 1:]
    assert not x.is_contiguous() and x.data_ptr() % 16 == 2
    out = torch.full((3, i), float("nan"), dtype=torch.float16)
    with launch_log() as log:
        emulate(b, x, out)
    want = _reference(x)
    assert (out.double() - want).abs().max().item() <= 1e-2 * want.abs().max().item()
    assert log[0].build_key != _key(b)
    special = specialized_build(b, DivisibilityFacts.of({"x": 2}, {"T": 3, "I": i, "S": 2 * i + 1}))
    assert _choices(special)[:2] == ["ld.global.b16"] * 2


def _key(b) -> str:
    from hexlayout.runtime.build import build_key

    return build_key(b.tile_kernel, b.generated.arch, b.compiled is not None)


def test_aligned_unaligned_aligned_give_two_builds_side_by_side(tmp_path) -> None:
    b = build(silu_mul(f16, "silu_mul_cache"), "sm_80", compile=False)
    g = torch.Generator().manual_seed(9)
    keys = []
    for i in (304, 343, 304, 343):
        x = torch.randn(3, 2 * i, generator=g).half()
        out = torch.zeros(3, i, dtype=torch.float16)
        with launch_log() as log:
            emulate(b, x, out)
        keys.append(log[0].build_key)
        assert (out.double() - _reference(x)).abs().max().item() <= 1e-2 * _reference(x).abs().max().item()
    assert keys[0] == keys[2] == _key(b) and keys[1] == keys[3] != keys[0]
    entries = sorted(p.stem for p in (tmp_path / "builds").glob("*.hlb"))
    assert entries == sorted({keys[0], keys[1]})
    # a new process (memory forgotten) loads the specialized build from disk
    clear_builds()
    clear_specialized()
    b = build(silu_mul(f16, "silu_mul_cache"), "sm_80", compile=False)
    special = specialized_build(b, DivisibilityFacts.of({}, {"T": 3, "I": 343}))
    assert "load" in special.seconds and "synthesize" not in special.seconds
    assert _key(special) == keys[1]


def test_a_build_with_weaker_facts_never_serves_a_launch_it_does_not_fit() -> None:
    """The build specialized for I % 2 == 0 (4-byte vectors) is not reused for odd I."""
    b = build(silu_mul(f16), "sm_80", compile=False)
    s2 = specialized_build(b, DivisibilityFacts.of({}, {"T": 1, "I": 342}))
    s1 = specialized_build(b, DivisibilityFacts.of({}, {"T": 1, "I": 343}))
    assert _choices(s2) == ["ld.global.b32"] * 2 + ["st.global.b32"]
    assert s1 is not s2 and _choices(s1)[1:] == ["ld.global.b16", "st.global.b16"]
    x = torch.randn(2, 2 * 343).half()
    out = torch.zeros(2, 343, dtype=torch.float16)
    with launch_log() as log:
        emulate(s2, x, out)                       # s2's own requirements send it to s1's facts
    assert log[0].build_key == _key(s1)
    assert (out.double() - _reference(x)).abs().max().item() <= 1e-2 * _reference(x).abs().max().item()


@pytest.mark.nvrtc
@pytest.mark.parametrize("dtn", ["f16", "bf16"])
def test_the_narrow_variant_compiles(dtn: str) -> None:
    dt = DTYPES[dtn][0]
    b = build(silu_mul(dt), "sm_80", compile=False)
    special = specialized_build(b, DivisibilityFacts.of({}, {"T": 5, "I": 343}))
    compiled = build(special.tile_kernel, "sm_80")
    assert compiled.compiled is not None and compiled.compiled.cubin
    assert compiled.compiled.resources.spill_stores == 0
    src = compiled.generated.source
    assert "reinterpret_cast<const uint4*>(x" in b.generated.source         # the aligned build: 16 B
    assert "uint4" not in src and "reinterpret_cast<const unsigned short*>(x" in src   # one element


@pytest.mark.nvrtc
def test_the_launcher_hands_a_misaligned_call_to_the_specialized_build(monkeypatch) -> None:
    """``Launcher``: a call its build's requirements refuse gets the launcher of the build
    specialized on the call's facts (one per specialization, cached); without a GPU the facts
    are taken from CPU tensors."""
    from hexlayout.runtime import Launcher
    from hexlayout.runtime.args import MisalignedArgumentError

    b = build(silu_mul(f16), "sm_80")
    lau = Launcher(b)
    plan = lau.plan
    vals = plan.collect([torch.zeros(2, 2 * 343).half(), torch.zeros(2, 343).half()], {})
    with pytest.raises(MisalignedArgumentError, match=r"'x'.*stride 0 is 686 elements") as e:
        plan.bind(vals, "cpu")
    monkeypatch.setattr(plan, "facts", lambda vals, device: type(plan).facts(plan, vals, "cpu"))
    special = lau.specialized(plan, vals, e.value)
    assert special is not lau and special.build is not b and special.build.compiled is not None
    assert _choices(special.build)[1:] == ["ld.global.b16", "st.global.b16"]
    assert lau.specialized(plan, vals, e.value) is special


@pytest.mark.gpu
def test_odd_rows_and_offset_views_on_a_gpu() -> None:
    from hexlayout.ops.host.device import kernel_arch

    from hexlayout.runtime import Launcher

    lau = Launcher(build(silu_mul(f16), kernel_arch(torch.device("cuda"))))
    g = torch.Generator(device="cuda").manual_seed(10)
    for i, offset in ((304, 0), (343, 0), (304, 1), (304, 0), (4099, 0)):
        buf = torch.randn(3 * 2 * i + offset, device="cuda", generator=g).half()
        x = buf[offset:].view(3, 2 * i)
        out = torch.full((3, i), float("nan"), device="cuda", dtype=torch.float16)
        lau(x, out)
        torch.cuda.synchronize()
        want = _reference(x.cpu())
        assert (out.cpu().double() - want).abs().max().item() <= 1e-2 * want.abs().max().item()
    assert len(lau._special) == 2            # odd I; a 2-byte data pointer
