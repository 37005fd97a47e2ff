"""Every op the README's op table names works under exactly that name, as documented.

The table of README.md's ``## Ops`` section is parsed (so a renamed or removed function fails
here): each ``hexlayout.ops.<name>(...)`` is callable, its signature there and on its page
``docs/ops/<name>.md`` is ``inspect.signature`` of the function, and it is called on small CPU
tensors in the emulator (``HEXLAYOUT_EMULATE=1``; fp8 as ``sm_89``) and compared loosely with a
float64 torch reference; where the table names a torch op, ``torch.ops.hexlayout.<name>`` is
called too. The op tests check the numerics in depth; here the point is the documented names.
"""

from __future__ import annotations

import ast
import inspect
import math
import re
from pathlib import Path
from typing import Any

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

import hexlayout.ops  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"


def _section(text: str, heading: str) -> str:
    start = text.index(f"\n{heading}\n")
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else None]


def readme_ops() -> dict[str, dict[str, str]]:
    """``{name: {"signature", "torch_op", "page"}}`` from the rows of the README's op table."""
    rows: dict[str, dict[str, str]] = {}
    for line in _section(README.read_text(), "## Ops").splitlines():
        m = re.match(r"\|\s*`(hexlayout\.ops\.(\w+)\(.*?\))`\s*\|(.*)", line)
        if not m:
            continue
        cells = [c.strip() for c in m.group(3).split("|")]
        torch_op = re.search(r"`torch\.ops\.hexlayout\.(\w+)`", line)
        page = re.search(r"\]\((docs/ops/[\w.]+\.md)\)", line)
        assert page, f"README op table: no docs/ops link in {line!r}"
        assert cells, line
        rows[m.group(2)] = {"signature": m.group(1), "torch_op": torch_op.group(1) if torch_op else "",
                            "page": page.group(1)}
    return rows


OPS = readme_ops()
# the calls below, one per documented name; a name added to the README needs one here
CALLED = {"gemm", "paged_attention", "attention_varlen", "reshape_and_cache", "fused_moe", "fused_moe_wna16",
          "gemm_fp8", "fused_moe_fp8", "moe_align", "prepare_wna16", "prepare_mxfp4", "prepare_fp8"}
CALLED |= {"mla_decode", "mla_reshape_and_cache"}
CALLED |= {"selective_scan", "selective_state_update"}
CALLED |= {"causal_conv1d", "causal_conv1d_update", "ssd_scan"}


def _literal(node: ast.expr) -> Any:
    """A default as written: a literal, where ``math.inf`` stands for infinity."""
    return ast.literal_eval(ast.unparse(node).replace("math.inf", "1e999"))


def _parse_signature(text: str) -> inspect.Signature:
    """``hexlayout.ops.f(a, b=1, *, c=None) -> T`` as an ``inspect.Signature`` (defaults as literals)."""
    src = re.sub(r"^hexlayout\.ops\.", "", text.strip())
    fn = ast.parse(f"def {src}: pass").body[0]
    assert isinstance(fn, ast.FunctionDef)
    args = fn.args
    params = []
    empty = inspect.Parameter.empty
    pos_defaults = [None] * (len(args.args) - len(args.defaults)) + list(args.defaults)
    for a, d in zip(args.args, pos_defaults, strict=True):
        params.append(inspect.Parameter(a.arg, inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                        default=empty if d is None else _literal(d)))
    for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True):
        params.append(inspect.Parameter(a.arg, inspect.Parameter.KEYWORD_ONLY,
                                        default=empty if d is None else _literal(d)))
    return inspect.Signature(params)


def _bare(sig: inspect.Signature) -> inspect.Signature:
    """``sig`` without annotations (the docs spell types in prose)."""
    params = [p.replace(annotation=inspect.Parameter.empty) for p in sig.parameters.values()]
    return sig.replace(parameters=params, return_annotation=inspect.Signature.empty)


def page_signature(page: Path, name: str) -> str:
    """The ``hexlayout.ops.<name>(...)`` line(s) of the first Python block under ``## Signature``."""
    block = re.search(r"```python\n(.*?)```", _section(page.read_text(), "## Signature"), flags=re.S)
    assert block, f"{page.name}: no python block under '## Signature'"
    code = " ".join(block.group(1).split())
    assert code.startswith(f"hexlayout.ops.{name}("), f"{page.name}: not the signature of {name}: {code[:60]}"
    return code


def test_the_table_names_every_public_function() -> None:
    functions = {n for n in hexlayout.ops.__all__ if inspect.isfunction(getattr(hexlayout.ops, n))}
    assert set(OPS) == functions, set(OPS) ^ functions
    assert set(OPS) == CALLED, set(OPS) ^ CALLED
    classes = {n for n in hexlayout.ops.__all__ if inspect.isclass(getattr(hexlayout.ops, n))}
    pages = " ".join((ROOT / p["page"]).read_text() for p in OPS.values())
    for cls in classes:  # the weight containers are documented on the pages of the functions returning them
        assert f"`hexlayout.ops.{cls}`" in pages, f"no docs/ops page documents hexlayout.ops.{cls}"


@pytest.mark.parametrize("name", sorted(OPS))
def test_documented_signatures_are_the_functions(name: str) -> None:
    fn = getattr(hexlayout.ops, name, None)
    assert inspect.isfunction(fn), f"hexlayout.ops.{name} is {type(fn).__name__}, not a function"
    want = _bare(inspect.signature(fn))
    readme = OPS[name]["signature"]
    assert _parse_signature(readme) == want, f"README: {readme} != {name}{want}"
    page = ROOT / OPS[name]["page"]
    assert page.name == f"{name}.md" and page.exists(), page
    assert _parse_signature(page_signature(page, name)) == want, f"{page.name}: signature != {name}{want}"
    if OPS[name]["torch_op"]:
        assert OPS[name]["torch_op"] == name
        assert f"torch.ops.hexlayout.{name}" in page.read_text()
        assert hasattr(torch.ops.hexlayout, name)
    else:
        assert name not in dir(torch.ops.hexlayout), f"{name} is a torch op: say so in the README's table"


def test_user_documentation_names_no_issue_or_build_history() -> None:
    """README.md and docs/ describe what is, not how it came to be."""
    pattern = re.compile(r"\bissues? #?\d+|#\d{1,4}\b|part of it is built|not built yet", re.I)
    for path in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        for i, line in enumerate(path.read_text().splitlines(), 1):
            assert not pattern.search(line), f"{path.relative_to(ROOT)}:{i}: {line.strip()}"


def test_documentation_links_resolve() -> None:
    """Every relative link of README.md and docs/ names a file or folder that exists (anchors of
    the form ``page.md#heading`` name a heading of that page)."""
    for path in [README, *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)\s]+)\)", path.read_text()):
            if re.match(r"\w+://", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (path.parent / file).resolve() if file else path
            assert dest.exists(), f"{path.relative_to(ROOT)}: link to a missing {target}"
            if anchor:
                headings = {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-")
                            for h in re.findall(r"^#+ (.*)$", dest.read_text(), re.M)}
                assert anchor in headings, f"{path.relative_to(ROOT)}: no heading #{anchor} in {file}"


def _python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def test_the_readme_kernel_runs() -> None:
    """The README's layout-free kernel synthesizes and runs right in the emulator, as printed."""
    (code,) = _python_blocks(_section(README.read_text(), "## A kernel, without layouts"))
    exec(compile(code, "README.md[kernel]", "exec"), {"__name__": "readme_kernel"})  # noqa: S102


# prepare_wna16.md's example runs in tests/ops/test_moe_wna16.py::test_the_documented_example_runs
PAGES = sorted(p for p in (ROOT / "docs" / "ops").glob("*.md") if p.stem != "prepare_wna16")


@pytest.mark.parametrize("page", PAGES, ids=[p.stem for p in PAGES])
def test_op_page_example_runs(page: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ``## Example`` of every docs/ops page runs (its environment changes are undone)."""
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")     # recorded, so the page's own setting is undone
    monkeypatch.delenv("HEXLAYOUT_EMULATE_ARCH", raising=False)
    (code,) = _python_blocks(_section(page.read_text(), "## Example"))
    exec(compile(code, f"{page.name}[Example]", "exec"), {"__name__": f"doc_{page.stem}"})  # noqa: S102


# ---------------------------------------------------------------------------------------------
# calls


@pytest.fixture(autouse=True)
def _emulate(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.delenv("HEXLAYOUT_EMULATE_ARCH", raising=False)
    monkeypatch.delenv("HEXLAYOUT_MOE_SPLIT_K", raising=False)


def _close(got: Any, want: torch.Tensor, rel: float, what: str) -> None:
    err = (got.double() - want).abs().max().item()
    scale = want.abs().max().item()
    assert scale > 0 and err <= rel * scale, f"{what}: max error {err:.3g}, |reference| max {scale:.3g}"


def _documented(name: str) -> Any:
    """``hexlayout.ops.<name>`` as the README spells it; the test is skipped by none."""
    assert name in OPS, f"the README's op table does not name hexlayout.ops.{name}"
    return getattr(hexlayout.ops, name)


def _torch_op(name: str) -> Any:
    assert OPS[name]["torch_op"] == name, f"the README's table gives no torch op for {name}"
    return getattr(torch.ops.hexlayout, name)


def test_gemm() -> None:
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(16, 16, generator=g).half(), torch.randn(16, 16, generator=g).half()
    bias = torch.randn(16, generator=g).half()
    want = F.relu(a.double() @ b.double().T + bias.double())
    _close(_documented("gemm")(a, b, bias, activation="relu"), want, 1e-2, "hexlayout.ops.gemm")
    _close(_torch_op("gemm")(a, b, bias, activation="relu"), want, 1e-2, "torch.ops.hexlayout.gemm")


def test_gemm_fp8(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_89")
    g = torch.Generator().manual_seed(2)
    a = torch.randn(3, 144, generator=g).to(torch.float8_e4m3fn)
    b = torch.randn(24, 144, generator=g).to(torch.float8_e4m3fn)
    sa, sb = torch.rand(3, 2, generator=g) + 0.1, torch.rand(1, 2, generator=g) + 0.1
    want = (a.double() * sa.double().repeat_interleave(128, 1)[:, :144]) @ (
        b.double() * sb.double().repeat_interleave(128, 1)[:, :144]).T
    _close(_documented("gemm_fp8")(a, b, sa, sb), want, 1e-2, "hexlayout.ops.gemm_fp8")
    out = _torch_op("gemm_fp8")(a, b, sa, sb, out_dtype=torch.float16)
    _close(out, want, 1e-2, "torch.ops.hexlayout.gemm_fp8")


def _attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """float64 attention of one sequence, ``q`` [M, H, D], ``k`` / ``v`` [N, KVH, D], causal
    bottom-right aligned; ``[M, H, D]``."""
    m, h, d = q.shape
    n, kvh = k.shape[:2]
    rep = h // kvh
    kk, vv = k.double().repeat_interleave(rep, 1), v.double().repeat_interleave(rep, 1)
    s = torch.einsum("mhd,nhd->hmn", q.double(), kk) / math.sqrt(d)
    if causal:
        visible = torch.arange(n)[None, :] <= torch.arange(m)[:, None] + (n - m)
        s = s.masked_fill(~visible, float("-inf"))
    return torch.einsum("hmn,nhd->mhd", s.softmax(-1), vv)


def test_paged_attention() -> None:
    g = torch.Generator().manual_seed(2)
    h, kvh, d, bs, nk, nq = 2, 1, 64, 16, 5, 2
    q = torch.randn(nq, h, d, generator=g).half()
    kc, vc = torch.randn(1, bs, kvh, d, generator=g).half(), torch.randn(1, bs, kvh, d, generator=g).half()
    cu_q = torch.tensor([0, nq], dtype=torch.int32)
    seqused_k = torch.tensor([nk], dtype=torch.int32)
    table = torch.zeros(1, 1, dtype=torch.int32)
    want = _attention(q, kc[0, :nk], vc[0, :nk], causal=True)
    out = _documented("paged_attention")(q, kc, vc, cu_q, seqused_k, table, nq, nk)
    _close(out, want, 1e-2, "hexlayout.ops.paged_attention")
    out, lse = _torch_op("paged_attention")(q, kc, vc, cu_q, seqused_k, table, nq, nk)
    _close(out, want, 1e-2, "torch.ops.hexlayout.paged_attention")
    assert lse.shape == (h, nq) and lse.dtype == torch.float32


def test_attention_varlen() -> None:
    g = torch.Generator().manual_seed(3)
    h, kvh, d, nq, nk = 2, 1, 64, 3, 5
    q = torch.randn(nq, h, d, generator=g).half()
    k, v = torch.randn(nk, kvh, d, generator=g).half(), torch.randn(nk, kvh, d, generator=g).half()
    cu_q, cu_k = torch.tensor([0, nq], dtype=torch.int32), torch.tensor([0, nk], dtype=torch.int32)
    want = _attention(q, k, v, causal=False)
    _close(_documented("attention_varlen")(q, k, v, cu_q, cu_k, nq, nk), want, 1e-2,
           "hexlayout.ops.attention_varlen")
    out, lse = _torch_op("attention_varlen")(q, k, v, cu_q, cu_k, nq, nk)
    _close(out, want, 1e-2, "torch.ops.hexlayout.attention_varlen")
    assert lse.shape == (h, nq)


def test_reshape_and_cache() -> None:
    g = torch.Generator().manual_seed(4)
    key, value = torch.randn(3, 1, 64, generator=g).half(), torch.randn(3, 1, 64, generator=g).half()
    slots = torch.tensor([0, 17, -1], dtype=torch.int64)
    for fn, what in ((_documented("reshape_and_cache"), "hexlayout.ops"),
                     (_torch_op("reshape_and_cache"), "torch.ops.hexlayout")):
        kc, vc = torch.randn(2, 16, 1, 64, generator=g).half(), torch.randn(2, 16, 1, 64, generator=g).half()
        want_k, want_v = kc.clone(), vc.clone()
        want_k[0, 0], want_k[1, 1], want_v[0, 0], want_v[1, 1] = key[0], key[1], value[0], value[1]
        assert fn(key, value, kc, vc, slots) is None, what
        assert torch.equal(kc, want_k) and torch.equal(vc, want_v), f"{what}.reshape_and_cache"


def test_mla_decode() -> None:
    g = torch.Generator().manual_seed(6)
    cache = torch.randn(3, 16, 160, generator=g).bfloat16()
    q = torch.randn(1, 2, 160, generator=g).bfloat16()
    cu, used, bt = torch.tensor([0, 1]).int(), torch.tensor([20]).int(), torch.tensor([[2, 0]]).int()
    rows = torch.cat([cache[2], cache[0, :4]]).double()       # keys 0..19
    want = torch.softmax(q[0].double() @ rows.T / math.sqrt(160), -1) @ rows[:, :128]
    got = _documented("mla_decode")(q, cache, cu, used, bt, 1, 20, kv_lora_rank=128)
    _close(got[0], want, 1e-2, "hexlayout.ops.mla_decode")
    out, lse = _torch_op("mla_decode")(q, cache, cu, used, bt, 1, 20, None, 128)
    _close(out[0], want, 1e-2, "torch.ops.hexlayout.mla_decode")


def test_mla_reshape_and_cache() -> None:
    g = torch.Generator().manual_seed(7)
    kv_c, k_pe = torch.randn(2, 128, generator=g).half(), torch.randn(2, 16, generator=g).half()
    for fn, what in ((_documented("mla_reshape_and_cache"), "hexlayout.ops"),
                     (_torch_op("mla_reshape_and_cache"), "torch.ops.hexlayout")):
        cache = torch.zeros(2, 16, 144).half()
        assert fn(kv_c, k_pe, cache, torch.tensor([17, -1])) is None, what
        assert torch.equal(cache[1, 1], torch.cat([kv_c[0], k_pe[0]])) and cache.count_nonzero() == 144, what


def _routing(t: int, e: int, k: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    weights, ids = torch.randn(t, e, generator=g).softmax(-1).topk(k)
    return weights, ids.int()


def _moe_reference(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, tw: torch.Tensor,
                   ids: torch.Tensor) -> torch.Tensor:
    """float64 ``sum_j tw[t, j] * w2[e] @ (silu(w13[e, :I] @ x_t) * (w13[e, I:] @ x_t))``,
    ``w13`` [E, 2I, H], ``w2`` [E, H, I]."""
    inter = w2.shape[2]
    out = torch.zeros(x.shape[0], w2.shape[1], dtype=torch.float64)
    for t in range(x.shape[0]):
        for j in range(ids.shape[1]):
            e = int(ids[t, j])
            y = w13[e].double() @ x[t].double()
            out[t] += float(tw[t, j]) * (w2[e].double() @ (F.silu(y[:inter]) * y[inter:]))
    return out


def test_fused_moe() -> None:
    g = torch.Generator().manual_seed(5)
    t, h, inter, e, k = 3, 64, 32, 2, 2
    x = torch.randn(t, h, generator=g).bfloat16()
    w13 = (torch.randn(e, 2 * inter, h, generator=g) / 8).bfloat16()
    w2 = (torch.randn(e, h, inter, generator=g) / 8).bfloat16()
    tw, ids = _routing(t, e, k, 5)
    want = _moe_reference(x, w13, w2, tw, ids)
    _close(_documented("fused_moe")(x, w13, w2, tw, ids), want, 2e-2, "hexlayout.ops.fused_moe")
    _close(_torch_op("fused_moe")(x, w13, w2, tw, ids), want, 2e-2, "torch.ops.hexlayout.fused_moe")


def test_moe_align() -> None:
    ids = torch.tensor([[1, 0], [1, 0], [0, 1]], dtype=torch.int32)
    sorted_ids, expert_ids, total = _documented("moe_align")(ids, num_experts=2, block_m=16)
    assert int(total[0]) == 32
    assert expert_ids[:2].tolist() == [0, 1] and (expert_ids[2:] == -1).all()
    flat = ids.flatten()
    for b, expert in enumerate(expert_ids[:2].tolist()):
        block = sorted_ids[16 * b:16 * (b + 1)]
        real = block[block < flat.numel()]
        assert sorted(real.tolist()) == torch.nonzero(flat == expert).flatten().tolist()
        assert (block[real.numel():] == flat.numel()).all()      # padding slots


def _pack_gptq8(q: torch.Tensor) -> torch.Tensor:
    """``[E, K, N]`` values in [0, 256) -> GPTQ 8-bit words ``[E, K / 4, N]`` (value i of word r:
    row 4 r + i, bits 8 i .. 8 i + 7)."""
    q = q.to(torch.int64)
    w = torch.zeros(q.shape[0], q.shape[1] // 4, q.shape[2], dtype=torch.int64)
    for i in range(4):
        w |= q[:, i::4, :] << (8 * i)
    return torch.where(w >= 2**31, w - 2**32, w).to(torch.int32)


def test_prepare_wna16_and_fused_moe_wna16() -> None:
    g = torch.Generator().manual_seed(6)
    t, h, inter, e, k, group = 3, 64, 64, 2, 2, 32

    def checkpoint(kk: int, nn: int) -> tuple[Any, torch.Tensor]:
        """GPTQ 8-bit tensors of ``y = x @ W`` (W [K, N]), prepared; and W^T [E, N, K] in float64."""
        q = torch.randint(0, 256, (e, kk, nn), generator=g)
        scales = (torch.rand(e, kk // group, nn, generator=g) / 256).half()
        w = (q - 128).double() * scales.double().repeat_interleave(group, 1)
        prepared = _documented("prepare_wna16")(_pack_gptq8(q), scales, quant_format="gptq", bits=8,
                                                 group_size=group)
        return prepared, w.transpose(1, 2)

    w13, w13_ref = checkpoint(h, 2 * inter)
    w2, w2_ref = checkpoint(inter, h)
    assert isinstance(w13, hexlayout.ops.WNA16Weights)
    x = torch.randn(t, h, generator=g).half()
    tw, ids = _routing(t, e, k, 6)
    want = _moe_reference(x, w13_ref, w2_ref, tw, ids)
    _close(_documented("fused_moe_wna16")(x, w13, w2, tw, ids), want, 2e-2, "hexlayout.ops.fused_moe_wna16")
    _close(hexlayout.ops.fused_moe(x, w13, w2, tw, ids), want, 2e-2, "hexlayout.ops.fused_moe (WNA16Weights)")
    out = _torch_op("fused_moe_wna16")(x, w13.qweight, w13.scales, w13.zeros, w2.qweight, w2.scales, w2.zeros,
                                       tw, ids, w13.quant_format, w13.bits, w13.group_size, w2.group_size)
    _close(out, want, 2e-2, "torch.ops.hexlayout.fused_moe_wna16")


def test_prepare_mxfp4_and_fused_moe() -> None:
    g = torch.Generator().manual_seed(8)
    t, h, inter, e, k = 3, 64, 64, 2, 2
    e2m1 = torch.tensor([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6],
                        dtype=torch.float64)                        # OCP MX FP4: code -> value

    def checkpoint(kk: int, nn: int) -> tuple[Any, torch.Tensor]:
        """MXFP4 tensors of ``y = x @ W`` (``W^T`` codes [E, N, K/2], e8m0 [E, N, K/32]), prepared;
        and W^T [E, N, K] in float64."""
        c = torch.randint(0, 16, (e, nn, kk), generator=g)
        s = torch.randint(118, 124, (e, nn, kk // 32), generator=g)
        w = e2m1[c] * torch.exp2(s.double() - 127).repeat_interleave(32, 2)
        prepared = _documented("prepare_mxfp4")((c[..., 0::2] | (c[..., 1::2] << 4)).to(torch.uint8),
                                                 s.to(torch.uint8), dtype=torch.float16)
        return prepared, w

    w13, w13_ref = checkpoint(h, 2 * inter)
    w2, w2_ref = checkpoint(inter, h)
    assert isinstance(w13, hexlayout.ops.WNA16Weights) and w13.quant_format == "mxfp4"
    x = torch.randn(t, h, generator=g).half()
    tw, ids = _routing(t, e, k, 8)
    want = _moe_reference(x, w13_ref, w2_ref, tw, ids)
    _close(hexlayout.ops.fused_moe(x, w13, w2, tw, ids), want, 2e-2, "hexlayout.ops.fused_moe (MXFP4)")


def _fp8_quant(x: torch.Tensor) -> torch.Tensor:
    """Per-row e4m3 quantization as the op does it: ``s = max|x| / 448``, ``e4m3(x / s) * s``."""
    s = x.abs().amax(-1, keepdim=True).clamp_min(1e-12) / 448
    return (x / s).to(torch.float8_e4m3fn).double() * s


def test_prepare_fp8_and_fused_moe_fp8(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HEXLAYOUT_EMULATE_ARCH", "sm_89")
    g = torch.Generator().manual_seed(7)
    t, h, inter, e, k = 3, 128, 64, 2, 2
    w13_q = (torch.randn(e, 2 * inter, h, generator=g) * 0.5).to(torch.float8_e4m3fn)
    w2_q = (torch.randn(e, h, inter, generator=g) * 0.5).to(torch.float8_e4m3fn)
    s13, s2 = torch.rand(e, generator=g) * 0.05 + 0.01, torch.rand(e, generator=g) * 0.05 + 0.01
    w13 = _documented("prepare_fp8")(w13_q, s13)
    w2 = _documented("prepare_fp8")(w2_q, s2)
    assert isinstance(w13, hexlayout.ops.Fp8MoEWeights)
    x = torch.randn(t, h, generator=g).bfloat16()
    tw, ids = _routing(t, e, k, 7)
    w13_ref = w13_q.double() * s13.double()[:, None, None]
    w2_ref = w2_q.double() * s2.double()[:, None, None]
    want = torch.zeros(t, h, dtype=torch.float64)
    xq = _fp8_quant(x.double())
    for i in range(t):                 # the op's quantization of x and of the intermediate, in float64
        for j in range(k):
            ex = int(ids[i, j])
            y = w13_ref[ex] @ xq[i]
            mid = (F.silu(y[:inter]) * y[inter:]).to(torch.bfloat16).double()
            want[i] += float(tw[i, j]) * (w2_ref[ex] @ _fp8_quant(mid[None])[0])
    _close(_documented("fused_moe_fp8")(x, w13, w2, tw, ids), want, 3e-2, "hexlayout.ops.fused_moe_fp8")
    out = _torch_op("fused_moe_fp8")(x, w13.w, w13.scale, w2.w, w2.scale, tw, ids)
    _close(out, want, 3e-2, "torch.ops.hexlayout.fused_moe_fp8")


def test_selective_scan() -> None:
    g = torch.Generator().manual_seed(8)
    u, delta = torch.randn(1, 8, 19, generator=g).half(), (torch.rand(1, 8, 19, generator=g) * 0.5).half()
    A = -torch.rand(8, 4, generator=g)
    B, C = torch.randn(1, 4, 19, generator=g).half(), torch.randn(1, 4, 19, generator=g).half()
    h, ys = torch.zeros(1, 8, 4, dtype=torch.float64), []
    for t in range(19):
        d = delta[..., t].double()
        bt = B[:, None, :, t].double()
        h = torch.exp(d[..., None] * A.double()) * h + (d * u[..., t].double())[..., None] * bt
        ys.append((h * C[:, None, :, t].double()).sum(-1))
    want = torch.stack(ys, -1)
    out, last = _documented("selective_scan")(u, delta, A, B, C, return_last_state=True)
    _close(out, want, 1e-2, "hexlayout.ops.selective_scan")
    _close(last, h, 1e-3, "hexlayout.ops.selective_scan last_state")
    out, last = _torch_op("selective_scan")(u, delta, A, B, C, None, None, None, False, True)
    _close(out, want, 1e-2, "torch.ops.hexlayout.selective_scan")


def test_selective_state_update() -> None:
    g = torch.Generator().manual_seed(9)
    x, dt = torch.randn(2, 16, generator=g).half(), torch.rand(2, 16, generator=g).half()
    A = -torch.rand(16, 8, generator=g)
    B, C = torch.randn(2, 8, generator=g).half(), torch.randn(2, 8, generator=g).half()
    init = torch.randn(3, 16, 8, generator=g)
    idx = torch.tensor([2, -1], dtype=torch.int32)
    new = torch.exp(dt[0].double()[:, None] * A.double()) * init[2].double() \
        + (dt[0].double() * x[0].double())[:, None] * B[0].double()
    want_y = torch.stack([(new * C[0].double()).sum(-1), torch.zeros(16, dtype=torch.float64)])
    for fn, what in ((_documented("selective_state_update"), "hexlayout.ops"),
                     (_torch_op("selective_state_update"), "torch.ops.hexlayout")):
        state = init.clone()
        y = fn(state, x, dt, A, B, C, state_batch_indices=idx) if what == "hexlayout.ops" else \
            fn(state, x, dt, A, B, C, None, None, None, False, idx)
        _close(y, want_y, 1e-2, f"{what}.selective_state_update")
        _close(state[2], new, 1e-4, f"{what}.selective_state_update state")
        assert torch.equal(state[:2], init[:2]), what
def test_causal_conv1d_and_update() -> None:
    g = torch.Generator().manual_seed(8)
    x, w = torch.randn(2, 8, 5, generator=g).half(), torch.randn(8, 3, generator=g).half()
    want = F.conv1d(F.pad(x.double(), (2, 0)), w.double().unsqueeze(1), groups=8)
    _close(_documented("causal_conv1d")(x, w), want, 1e-2, "hexlayout.ops.causal_conv1d")
    out, final = _torch_op("causal_conv1d")(x, w)
    _close(out, want, 1e-2, "torch.ops.hexlayout.causal_conv1d")
    assert torch.equal(final, x[:, :, -2:])
    for fn, what in ((_documented("causal_conv1d_update"), "hexlayout.ops"),
                     (_torch_op("causal_conv1d_update"), "torch.ops.hexlayout")):
        state = x[:, :, :2].clone()
        y = fn(x[:, :, 2], state, w)
        _close(y, want[:, :, 2], 1e-2, f"{what}.causal_conv1d_update")
        assert torch.equal(state, x[:, :, 1:3])


def test_ssd_scan() -> None:
    g = torch.Generator().manual_seed(9)
    x, dt, A = torch.randn(1, 3, 2, 8, generator=g).half(), torch.rand(1, 3, 2, generator=g), -torch.rand(2)
    B, C = torch.randn(1, 3, 1, 16, generator=g).half(), torch.randn(1, 3, 1, 16, generator=g).half()
    h = torch.zeros(2, 8, 16, dtype=torch.float64)
    want = torch.zeros(1, 3, 2, 8, dtype=torch.float64)
    for t in range(3):
        d = dt[0, t].double()[:, None, None]
        inp = d * x[0, t].double()[:, :, None] * B[0, t, 0].double()
        h = torch.exp(d * A.double()[:, None, None]) * h + inp
        want[0, t] = h @ C[0, t, 0].double()
    _close(_documented("ssd_scan")(x, dt, A, B, C, chunk_size=2), want, 1e-2, "hexlayout.ops.ssd_scan")
    _close(_torch_op("ssd_scan")(x, dt, A, B, C)[0], want, 1e-2, "torch.ops.hexlayout.ssd_scan")
