"""Fixtures of the vLLM tests (run inside the vLLM environment by tests/integrations/test_vllm_stage.py).

``models``: the tiny checkpoints (:mod:`tiny_models`), each written once per session when a test
first asks for it (the stage runs these tests as several pytest processes, each needing a few
of them; every checkpoint is seeded, so the order does not matter); ``reference`` /
``hexlayout_run``: the session's plugin-off and plugin-on runs of every model of ``MODELS``
(the reference of a quantized model runs its dequantized checkpoint; ``PLUGIN_ON_ONLY`` models
run with the plugin on only), each in one process with an in-process engine: the worker is the
runner process itself; ``float64``: the float64 teacher-forced reference
(:mod:`float64_reference`) of a model along a run's tokens, its keys and values rounded as the
model's KV cache (``LLM_ARGS``) stores them.
"""

from __future__ import annotations

import pathlib
import sys
from collections.abc import Iterator, Mapping

import pytest
import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))

import float64_reference  # noqa: E402
import tiny_models  # noqa: E402
from vllm_harness import (  # noqa: E402
    CHECKPOINTS,
    LLM_ARGS,
    MODELS,
    PLUGIN_ON_ONLY,
    REFERENCES,
    Run,
    run_models,
)
from vllm_run import prompts, write_llm_args  # noqa: E402


class Checkpoints(Mapping[str, pathlib.Path]):
    """The checkpoint directory of each model of ``CHECKPOINTS`` under ``root``, written (with
    its ``LLM_ARGS``) on first use."""

    def __init__(self, root: pathlib.Path) -> None:
        self.root = root
        self.paths: dict[str, pathlib.Path] = {}

    def __getitem__(self, name: str) -> pathlib.Path:
        if name not in self.paths:
            config, tensors = CHECKPOINTS[name]()
            path = tiny_models.write_model(self.root / name, config, tensors, torch.bfloat16)
            if name in LLM_ARGS:
                write_llm_args(path, LLM_ARGS[name])
            self.paths[name] = path
        return self.paths[name]

    def __iter__(self) -> Iterator[str]:
        return iter(CHECKPOINTS)

    def __len__(self) -> int:
        return len(CHECKPOINTS)


@pytest.fixture(scope="session")
def models(tmp_path_factory: pytest.TempPathFactory) -> Checkpoints:
    return Checkpoints(tmp_path_factory.mktemp("models"))


@pytest.fixture(scope="session")
def reference(models: Mapping[str, pathlib.Path], tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Every model with the plugin off (``HEXLAYOUT_VLLM=0``): vLLM's own CPU kernels."""
    env = {"HEXLAYOUT_VLLM": "0", "HEXLAYOUT_EMULATE": "1"}
    todo = {n: models[r] for n, r in MODELS.items() if n not in PLUGIN_ON_ONLY}
    return run_models(tmp_path_factory.mktemp("off"), todo, env)


@pytest.fixture(scope="session")
def hexlayout_run(models: Mapping[str, pathlib.Path], tmp_path_factory: pytest.TempPathFactory) -> Run:
    """Every model with the plugin on (``HEXLAYOUT_VLLM`` unset, ``HEXLAYOUT_EMULATE=1``)."""
    env = {"HEXLAYOUT_EMULATE": "1"}
    return run_models(tmp_path_factory.mktemp("on"), {n: models[n] for n in MODELS}, env)


@pytest.fixture(scope="session")
def float64(models: Mapping[str, pathlib.Path]):
    """``float64(name, results)``: the float64 teacher-forced reference of model ``name`` (its
    reference checkpoint: the dequantized one for a quantized model, the same weights exactly;
    keys and values rounded as its KV cache stores them) along a run's ``results`` for it."""
    loaded: dict[tuple[str, str], torch.nn.Module] = {}

    def reference(name: str, results: list[dict]) -> list[float64_reference.Reference]:
        key = (REFERENCES[name], LLM_ARGS.get(name, {}).get("kv_cache_dtype", "auto"))
        if key not in loaded:
            loaded[key] = float64_reference.load(models[key[0]], kv_cache_dtype=key[1])
        return float64_reference.teacher_forced(loaded[key], prompts(), results)

    return reference
