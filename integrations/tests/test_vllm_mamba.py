"""vLLM's Mamba-2 layers served by hexlayout (``HexlayoutMambaMixer2``), end to end in vLLM's CPU
build: a tiny ``Mamba2ForCausalLM`` (2 groups) and a tiny ``NemotronHForCausalLM`` hybrid (a
Mamba-2, an attention and an MLP layer) from :mod:`tiny_mamba`, plugin off vs on (kernels in the
emulator), both models in one vLLM process per run.

The batch configuration is :mod:`vllm_run`'s (a 16-token budget over prompts of 3-21 tokens:
chunked prefill, steps mixing prefill chunks and decodes, sequences continuing their conv and
SSM states across chunks), with prefix caching off: vLLM turns it on for NemotronH, with Mamba
cache mode "align", which the plugin leaves to vLLM's kernels (``unserved_reason``; tested
below without an engine). NemotronH's runs (plugin off and on) are each checked against the
float64 teacher-forced reference (:func:`check`); Mamba2's run against vLLM's own
(:func:`check_runs`, ``MAMBA_VLLM_REFERENCED``).
"""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest
import torch
from agreement import check, check_runs
from vllm_harness import MAMBA_MODELS, MAMBA_VLLM_REFERENCED, Run, run_models

#: Prefix caching off: vLLM would cache NemotronH's Mamba states per block ("align" mode).
ARGS = {"HEXLAYOUT_VLLM_LLM_ARGS": json.dumps({"enable_prefix_caching": False})}


@pytest.fixture(scope="module")
def mamba_runs(models, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Run]:
    """``(vLLM's own kernels, hexlayout's)``: both models in one process each."""
    paths = {n: models[n] for n in MAMBA_MODELS}
    off = run_models(tmp_path_factory.mktemp("mamba_off"), paths,
                     {"HEXLAYOUT_VLLM": "0", "HEXLAYOUT_EMULATE": "1", **ARGS})
    on = run_models(tmp_path_factory.mktemp("mamba_on"), paths, {"HEXLAYOUT_EMULATE": "1", **ARGS})
    return off, on


@pytest.mark.parametrize("name", sorted(set(MAMBA_MODELS) - MAMBA_VLLM_REFERENCED))
@pytest.mark.parametrize("which", ["hexlayout", "vllm"])
def test_tokens_and_logprobs_match_float64(name: str, which: str, mamba_runs: tuple[Run, Run],
                                           float64) -> None:
    """Each run against the float64 teacher-forced reference (transformers) along its own
    tokens; vLLM's own kernels pass the same check (a greedy bf16 run may take either side of a
    near tie: here one prompt's first token, 0.06 nats from the float64 argmax)."""
    run = mamba_runs[1] if which == "hexlayout" else mamba_runs[0]
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
        if r["kernel"] == "conv1d":
            assert s["width"] == 4 and s["dim"] in (128 + 2 * 2 * 16, 128 + 2 * 16), s
        else:
            assert (s["num_heads"], s["head_dim"], s["d_state"]) == (8, 16, 16) and s["n_groups"] in (1, 2), s
        if r["kernel"] == "mamba_decode":
            assert s["num_tokens"] == s["num_seqs"], s
    # both models: Mamba2's 2 groups and NemotronH's 1
    assert {r["shapes"]["n_groups"] for r in mamba if r["kernel"] != "conv1d"} == {1, 2}
    # prefill chunks continuing sequences' cached states, and steps with prefill chunks and decodes
    prefills = [r["shapes"] for r in mamba if r["kernel"] == "mamba_prefill"]
    assert any(s["continuing"] > 0 for s in prefills), prefills
    assert any(s["step_decodes"] > 0 for s in prefills), prefills
    # the hybrid's attention layer ran hexlayout's paged attention
    assert any(r["kernel"].startswith("attention") and r["shapes"]["head_size"] == 64 for r in on.trace)


def test_plugin_logs_the_mamba_layers(mamba_runs: tuple[Run, Run]) -> None:
    off, on = mamba_runs
    swapped = [x for x in on.output.splitlines() if "hexlayout (emulate): swapped " in x]
    assert len(swapped) == 1, on.output[-20000:]
    assert "MambaMixer2 -> hexlayout.integrations.vllm.mamba.HexlayoutMambaMixer2" in swapped[0]
    served = "Mamba-2 conv + SSM run hexlayout's causal_conv1d, ssd_scan and selective_state_update"
    for layer in ("backbone.layers.0.mixer", "backbone.layers.1.mixer", "model.layers.0.mixer"):
        assert f"hexlayout: {layer}: {served}" in on.output
    assert "keeping vLLM's Mamba-2 kernels" not in on.output
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
