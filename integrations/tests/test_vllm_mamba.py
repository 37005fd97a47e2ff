"""vLLM's Mamba layers served by hexlayout (``HexlayoutMambaMixer`` for Mamba-1,
``HexlayoutMambaMixer2`` for Mamba-2), end to end in vLLM's CPU build: a tiny ``MambaForCausalLM``
(Mamba-1), a tiny ``Mamba2ForCausalLM`` (2 groups) and a tiny ``NemotronHForCausalLM`` hybrid (a
Mamba-2, an attention and an MLP layer) from :mod:`tiny_mamba`, plugin off vs on (kernels in the
emulator), all models in one vLLM process per run, ``MAX_TOKENS`` greedy tokens each (enough for
several decode steps after the chunked prefill). vLLM's CPU build cannot run Mamba-1 with its own
kernels (``AttributeError: '_OpNamespace' '_C' object has no attribute 'selective_scan_fwd'``,
``MAMBA_PLUGIN_ONLY``): the Mamba-1 model runs with the plugin on only and is checked against the
float64 reference.

The batch configuration is :mod:`vllm_run`'s (a 16-token budget over prompts of 3-21 tokens:
chunked prefill, steps mixing prefill chunks and decodes, sequences continuing their conv and
SSM states across chunks), with prefix caching off: vLLM turns it on for NemotronH, with Mamba
cache mode "align", which the plugin leaves to vLLM's kernels (``unserved_reason``; tested
below without an engine). NemotronH's runs (plugin off and on) are each checked against the
float64 teacher-forced reference (:func:`check`); Mamba2's run against vLLM's own
(:func:`check_runs`, ``MAMBA_VLLM_REFERENCED``); Mamba-1's (plugin on) against float64.
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from agreement import check, check_runs
from vllm_harness import MAMBA_MODELS, MAMBA_PLUGIN_ONLY, MAMBA_VLLM_REFERENCED, Run, run_models

#: Greedy tokens per prompt: 3 decode steps after each prompt's (chunked) prefill.
MAX_TOKENS = 4
#: Prefix caching off: vLLM would cache NemotronH's Mamba states per block ("align" mode).
ARGS = {"HEXLAYOUT_VLLM_LLM_ARGS": json.dumps({"enable_prefix_caching": False}),
        "HEXLAYOUT_VLLM_MAX_TOKENS": str(MAX_TOKENS)}
#: (model, run) pairs checked against float64: vLLM's own run only where its CPU build has the kernels.
FLOAT64 = [(n, w) for n in sorted(set(MAMBA_MODELS) - MAMBA_VLLM_REFERENCED) for w in ("hexlayout", "vllm")
           if w == "hexlayout" or n not in MAMBA_PLUGIN_ONLY]


@pytest.fixture(scope="module")
def mamba_runs(models, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Run]:
    """``(vLLM's own kernels, hexlayout's)``: all models in one process each (vLLM's own: those
    its CPU build can run)."""
    paths = {n: models[n] for n in MAMBA_MODELS}
    off = run_models(tmp_path_factory.mktemp("mamba_off"),
                     {n: p for n, p in paths.items() if n not in MAMBA_PLUGIN_ONLY},
                     {"HEXLAYOUT_VLLM": "0", "HEXLAYOUT_EMULATE": "1", **ARGS})
    on = run_models(tmp_path_factory.mktemp("mamba_on"), paths, {"HEXLAYOUT_EMULATE": "1", **ARGS})
    return off, on


@pytest.mark.parametrize(("name", "which"), FLOAT64)
def test_tokens_and_logprobs_match_float64(name: str, which: str, mamba_runs: tuple[Run, Run],
                                           float64) -> None:
    """Each run against the float64 teacher-forced reference (transformers) along its own
    tokens; vLLM's own kernels pass the same check (a greedy bf16 run may take either side of a
    near tie: here one prompt's first token, 0.06 nats from the float64 argmax)."""
    run = mamba_runs[1] if which == "hexlayout" else mamba_runs[0]
    assert max(len(r["tokens"]) for r in run.results[name]) == MAX_TOKENS   # (a sequence may stop at EOS)
    report = check(run.results[name], float64(name, run.results[name]))
    print(f"{name} ({which}): {report.summary()}")
    assert not report.problems, f"{name} ({which}): {report.summary()}\n" + "\n".join(report.problems)


@pytest.mark.parametrize("name", sorted(MAMBA_VLLM_REFERENCED))
def test_tokens_and_logprobs_match_vllms_own_kernels(name: str, mamba_runs: tuple[Run, Run]) -> None:
    """Mamba2 (2 groups): the plugin's run against vLLM's own (:func:`check_runs`; the float64
    reference does not describe vLLM's Mamba2, ``MAMBA_VLLM_REFERENCED``)."""
    off, on = mamba_runs
    report = check_runs(on.results[name], off.results[name])
    print(f"{name} (hexlayout vs vLLM's own): {report.summary()}")
    assert not report.problems, f"{name}: {report.summary()}\n" + "\n".join(report.problems)


def test_trace_shows_conv_prefill_and_decode(mamba_runs: tuple[Run, Run]) -> None:
    off, on = mamba_runs
    assert off.trace == []
    mamba = [r for r in on.trace if r["kernel"] in ("conv1d", "mamba_prefill", "mamba_decode")]
    assert {r["kernel"] for r in mamba} == {"conv1d", "mamba_prefill", "mamba_decode"}, mamba
    for r in mamba:
        s = r["shapes"]
        assert r["dtype"] == "bfloat16" and s["num_seqs"] >= 1 and s["num_tokens"] >= s["num_seqs"], r
        if r["kernel"] == "conv1d":   # Mamba-1: d_inner; Mamba-2: d_inner + 2 G N
            assert s["width"] == 4 and s["dim"] in (128, 128 + 2 * 2 * 16, 128 + 2 * 16), s
        elif s["head_dim"] == 1:      # Mamba-1: one head per channel
            assert (s["num_heads"], s["d_state"], s["n_groups"]) == (128, 16, 1), s
        else:
            assert (s["num_heads"], s["head_dim"], s["d_state"]) == (8, 16, 16) and s["n_groups"] in (1, 2), s
        if r["kernel"] == "mamba_decode":
            assert s["num_tokens"] == s["num_seqs"], s
    # the three models: Mamba2's 2 groups, NemotronH's 1, Mamba-1's 128 one-channel heads
    assert {r["shapes"]["n_groups"] for r in mamba if r["kernel"] != "conv1d"} == {1, 2}
    for form in (lambda s: s["head_dim"] == 1, lambda s: s["head_dim"] == 16):
        scans = [r for r in mamba if r["kernel"] != "conv1d" and form(r["shapes"])]
        assert {r["kernel"] for r in scans} == {"mamba_prefill", "mamba_decode"}, scans
        # prefill chunks continuing sequences' cached states, and steps with prefill chunks and decodes
        prefills = [r["shapes"] for r in scans if r["kernel"] == "mamba_prefill"]
        assert any(s["continuing"] > 0 for s in prefills), prefills
        assert any(s["step_decodes"] > 0 for s in prefills), prefills
    # the hybrid's attention layer ran hexlayout's paged attention
    assert any(r["kernel"].startswith("attention") and r["shapes"]["head_size"] == 64 for r in on.trace)


def test_plugin_logs_the_mamba_layers(mamba_runs: tuple[Run, Run]) -> None:
    off, on = mamba_runs
    swapped = [x for x in on.output.splitlines() if "hexlayout (emulate): swapped " in x]
    assert len(swapped) == 1, on.output[-20000:]
    assert "MambaMixer2 -> hexlayout.integrations.vllm.mamba.HexlayoutMambaMixer2" in swapped[0]
    assert "MambaMixer -> hexlayout.integrations.vllm.mamba1.HexlayoutMambaMixer;" in swapped[0] + ";"
    served = "Mamba-2 conv + SSM run hexlayout's causal_conv1d, ssd_scan and selective_state_update"
    for layer in ("backbone.layers.0.mixer", "backbone.layers.1.mixer", "model.layers.0.mixer"):
        assert f"hexlayout: {layer}: {served}" in on.output
    served1 = "Mamba-1 conv + SSM run hexlayout's causal_conv1d, selective_scan and selective_state_update"
    for layer in ("backbone.layers.0.mixer", "backbone.layers.1.mixer"):
        assert f"hexlayout: {layer}: {served1}" in on.output
    assert "keeping vLLM's Mamba-2 kernels" not in on.output and "keeping vLLM's Mamba-1" not in on.output
    assert "hexlayout" not in off.output.replace("hexlayout/", "")


def _layer(**kw) -> SimpleNamespace:
    base = {"use_replayssm": False, "num_spec": 0, "activation": "silu", "conv_kernel_size": 4,
            "cache_config": SimpleNamespace(mamba_cache_mode="none")}
    return SimpleNamespace(**{**base, **kw})


def test_unserved_configurations_name_the_reason() -> None:
    """What falls back to vLLM's kernels (and the reason the layer logs), without an engine."""
    from hexlayout.integrations.vllm.mamba import runtime_reason, unserved_reason

    assert unserved_reason(_layer()) is None
    assert unserved_reason(_layer(activation="swish")) is None
    assert "ReplaySSM" in unserved_reason(_layer(use_replayssm=True))
    assert "speculative decoding (2 " in unserved_reason(_layer(num_spec=2))
    assert "mamba_cache_mode='align'" in unserved_reason(
        _layer(cache_config=SimpleNamespace(mamba_cache_mode="align")))
    assert "activation 'gelu'" in unserved_reason(_layer(activation="gelu"))
    assert "conv width 5" in unserved_reason(_layer(conv_kernel_size=5))
    step = {"checkpoint_chunk_idx": None, "num_decodes": 2, "num_decode_tokens": 2,
            "state_indices_tensor_p": torch.tensor([3]), "state_indices_tensor_d": torch.tensor([[1], [2]])}
    assert runtime_reason(SimpleNamespace(**step)) is None
    assert "speculative" in runtime_reason(SimpleNamespace(**{**step, "num_decode_tokens": 4}))
    assert "per-block state indices" in runtime_reason(
        SimpleNamespace(**{**step, "state_indices_tensor_d": torch.tensor([[1, 5], [2, 6]])}))
    assert "checkpoints" in runtime_reason(
        SimpleNamespace(**{**step, "checkpoint_chunk_idx": torch.tensor([0])}))


def test_unserved_mamba1_configurations_name_the_reason() -> None:
    """What of Mamba-1 falls back to vLLM's kernels (and the reason the layer logs)."""
    from hexlayout.integrations.vllm.mamba1 import unserved_reason

    assert unserved_reason(_layer(is_lora_enabled=False)) is None
    assert "LoRA" in unserved_reason(_layer(is_lora_enabled=True))
    assert "mamba_cache_mode='all'" in unserved_reason(
        _layer(cache_config=SimpleNamespace(mamba_cache_mode="all")))
    assert "activation 'gelu'" in unserved_reason(_layer(activation="gelu"))
    assert "conv width 1" in unserved_reason(_layer(conv_kernel_size=1))


def _mamba1_layer(dim: int = 16, n: int = 4, rank: int = 2, width: int = 4) -> tuple[SimpleNamespace, dict]:
    """A stand-in for vLLM's ``MambaMixer`` (the attributes ``HexlayoutMambaMixer``'s prefill and
    decode read, ``_ssm_transform`` = x_proj then dt_proj without its bias) and its f32 weights."""
    from hexlayout.integrations.vllm.mamba1 import HexlayoutMambaMixer

    g = torch.Generator().manual_seed(3)
    w = {"conv": torch.randn(dim, 1, width, generator=g) * 0.5, "cb": 0.1 * torch.randn(dim, generator=g),
         "x": torch.randn(dim, rank + 2 * n, generator=g) / dim**0.5,
         "dt": torch.randn(rank, dim, generator=g) / rank**0.5,
         "dtb": torch.empty(dim).uniform_(-2.0, 0.5, generator=g),
         "A": -torch.empty(dim, n).uniform_(0.5, 2.0, generator=g),
         "D": 1 + 0.1 * torch.randn(dim, generator=g)}
    bf = torch.bfloat16

    def ssm_transform(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        # vLLM's CPU linears (oneDNN, on AVX-512 hosts) require a unit inner stride
        assert x.stride(-1) == 1, f"x_proj input of strides {x.stride()}"
        p = (x.float() @ w["x"]).to(bf)
        t, b, c = torch.split(p, [rank, n, n], dim=-1)
        return (t.float() @ w["dt"]).to(bf).transpose(-2, -1), b, c

    layer = SimpleNamespace(activation="silu", conv_kernel_size=width, ssm_state_size=n, prefix="t",
                            A=w["A"], D=w["D"],
                            conv1d=SimpleNamespace(weight=w["conv"].to(bf), bias=w["cb"].to(bf)),
                            _time_proj_bias=lambda: w["dtb"], _ssm_transform=ssm_transform)
    layer._conv_weights = lambda: HexlayoutMambaMixer._conv_weights(layer)
    return layer, w


def _mamba1_reference(w: dict, x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """One sequence ``x``, ``gate`` [dim, L] through the Mamba-1 mixer in float64 from zero states:
    causal conv + SiLU, x_proj / dt_proj, Δ = softplus(dt + bias), h_t = exp(Δ_t A) h + Δ_t B_t u_t,
    y_t = (C_t · h_t + D u_t) · silu(gate_t)."""
    f = torch.float64
    dim, length = x.shape
    width = w["conv"].shape[-1]
    xp = torch.cat([torch.zeros(dim, width - 1, dtype=f), x.to(f)], 1)
    wc = w["conv"].to(torch.bfloat16).to(f)[:, 0]
    u = torch.stack([(xp[:, t:t + width] * wc).sum(1) for t in range(length)], 1)
    u = torch.nn.functional.silu(u + w["cb"].to(torch.bfloat16).to(f)[:, None])
    rank, n = w["dt"].shape[0], w["A"].shape[1]
    t, b, c = torch.split(u.T @ w["x"].to(f), [rank, n, n], dim=-1)
    delta = torch.nn.functional.softplus((t @ w["dt"].to(f)).T + w["dtb"].to(f)[:, None])
    h = torch.zeros(dim, n, dtype=f)
    ys = []
    for s in range(length):
        h = torch.exp(delta[:, s, None] * w["A"].to(f)) * h + (delta[:, s] * u[:, s])[:, None] * b[s]
        ys.append((h * c[s]).sum(-1) + w["D"].to(f) * u[:, s])
    return torch.stack(ys, 1) * torch.nn.functional.silu(gate.to(f))


@pytest.mark.parametrize("prepacked", [False, True])
def test_mamba1_layer_chunked_prefill_and_decode(monkeypatch: pytest.MonkeyPatch, prepacked: bool) -> None:
    """``HexlayoutMambaMixer``'s prefill and decode directly (no engine), with vLLM's metadata and
    cache layout: two sequences prefilled in chunks (the second chunk continuing the first's
    cached conv and SSM states, rows 2 and 0 of 3), then one decode step each; every output
    against the float64 mixer over the whole sequence. ``prepacked``: the filter as vLLM's CPU
    build leaves it on hosts with AVX-512 BF16 (``weight`` replaced by its kernel's packed 2-D
    form, here NaN, and the ``[dim, W]`` filter kept as ``_cpu_unpacked_conv_weight``)."""
    from hexlayout.integrations.vllm.mamba1 import HexlayoutMambaMixer

    monkeypatch.setenv("HEXLAYOUT_EMULATE", "1")
    monkeypatch.delenv("HEXLAYOUT_VLLM_TRACE", raising=False)
    layer, w = _mamba1_layer()
    if prepacked:
        conv = layer.conv1d
        conv._cpu_unpacked_conv_weight = conv.weight.view(conv.weight.size(0), -1).contiguous().clone()
        packed = (conv.weight.size(2), conv.weight.size(0))
        conv.weight = torch.full(packed, float("nan"), dtype=torch.bfloat16)
    g = torch.Generator().manual_seed(4)
    lens = (9, 4)
    xs = [torch.randn(16, n, generator=g).to(torch.bfloat16) for n in lens]
    gates = [torch.randn(16, n, generator=g).to(torch.bfloat16) for n in lens]
    # vLLM's default layout: [slots, W-1, dim] in memory, seen as [slots, dim, W-1]
    conv_state = torch.full((3, 3, 16), float("nan")).to(torch.bfloat16).transpose(-1, -2)
    ssm_state = torch.full((3, 16, 4), float("nan"))
    rows = torch.tensor([2, 0], dtype=torch.int32)
    got: list[list[torch.Tensor]] = [[], []]

    def prefill(spans: list[tuple[int, int]], has: list[bool]) -> None:
        cu = torch.tensor([0, *torch.tensor([b - a for a, b in spans]).cumsum(0).tolist()], dtype=torch.int32)
        md = SimpleNamespace(query_start_loc_p=cu, has_initial_states_p=torch.tensor(has), num_prefills=2,
                             num_decodes=0, state_indices_tensor_p=rows)
        x = torch.cat([xs[i][:, a:b] for i, (a, b) in enumerate(spans)], 1)
        z = torch.cat([gates[i][:, a:b] for i, (a, b) in enumerate(spans)], 1)
        y = HexlayoutMambaMixer._prefill(layer, md, x, z, conv_state, ssm_state)
        for i, part in enumerate(torch.split(y, [b - a for a, b in spans], 1)):
            got[i].append(part)

    prefill([(0, 5), (0, 1)], [False, False])       # first chunks
    prefill([(5, 8), (1, 3)], [True, True])          # continuing the cached states
    md = SimpleNamespace(num_decodes=2, state_indices_tensor_d=rows)
    y = HexlayoutMambaMixer._decode(layer, md, torch.stack([xs[0][:, 8], xs[1][:, 3]], 1),
                                    torch.stack([gates[0][:, 8], gates[1][:, 3]], 1), conv_state, ssm_state)
    for i in range(2):
        got[i].append(y[:, i:i + 1])
        out = torch.cat(got[i], 1)
        want = _mamba1_reference(w, xs[i], gates[i])
        assert out.shape == want.shape and out.dtype == torch.bfloat16
        err = (out.double() - want).abs().max().item()
        assert err <= 3e-2 * max(1.0, want.abs().max().item()), (i, err)
    assert conv_state[1].isnan().all() and ssm_state[1].isnan().all()  # row 1 untouched
