"""Run tiny models through vLLM's offline ``LLM`` and write their greedy tokens and logprobs.

``python vllm_run.py OUT.json MODEL_DIR [MODEL_DIR ...]`` (inside the vLLM environment): for each
model, the same fixed prompts (token ids: no tokenizer), greedy, ``LOGPROBS`` top logprobs per
step, written as ``{model_dir: [{"tokens": [...], "logprobs": [{token: logprob}, ...]}, ...]}``.
The batch is built so that prefill is chunked and steps mix prefill and decode sequences
(``max_num_batched_tokens`` below the prompts' total). ``HEXLAYOUT_VLLM_INPROC=1`` keeps the
engine in this process (vLLM's ``VLLM_ENABLE_V1_MULTIPROCESSING=0``); otherwise vLLM spawns its
engine-core process, where the worker (``uni`` executor) runs the model. Extra keyword
arguments for ``LLM`` come as JSON in ``HEXLAYOUT_VLLM_LLM_ARGS`` (for every model of the process)
and from a model's own :data:`LLM_ARGS_FILE` (for that model only, e.g. ``{"kv_cache_dtype":
"fp8"}``: one process runs models with different caches), the model's winning; the number of
greedy tokens comes in ``HEXLAYOUT_VLLM_MAX_TOKENS`` (default 8); ``HEXLAYOUT_VLLM_PLANT`` names a
wrong kernel to plant (:mod:`planted`; in-process engine only).
"""

from __future__ import annotations

import json
import os
import sys

PROMPT_LENS = (7, 13, 3, 21)
#: Greedy tokens per prompt (``HEXLAYOUT_VLLM_MAX_TOKENS`` overrides it: a stage that needs fewer).
MAX_TOKENS = int(os.environ.get("HEXLAYOUT_VLLM_MAX_TOKENS", "8"))
LOGPROBS = 5
SEED = 1234
#: A model directory's own ``LLM`` keyword arguments (JSON), read by :func:`run`.
LLM_ARGS_FILE = "hexlayout_llm_args.json"


def prompts() -> list[list[int]]:
    """Fixed random prompts (token ids 3..VOCAB-1)."""
    import torch
    from tiny_models import VOCAB

    g = torch.Generator().manual_seed(SEED)
    return [torch.randint(3, VOCAB, (n,), generator=g).tolist() for n in PROMPT_LENS]


def model_llm_args(model: str) -> dict:
    """The ``LLM`` keyword arguments of model directory ``model`` (its :data:`LLM_ARGS_FILE`;
    ``{}`` when it has none)."""
    path = os.path.join(model, LLM_ARGS_FILE)
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)


def write_llm_args(model: str | os.PathLike, args: dict) -> None:
    """Give model directory ``model`` its own ``LLM`` keyword arguments (:func:`model_llm_args`)."""
    with open(os.path.join(model, LLM_ARGS_FILE), "w") as f:
        json.dump(args, f)


def run(model: str) -> list[dict]:
    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    kwargs = {
        "model": model,
        "skip_tokenizer_init": True,
        "enforce_eager": True,
        "max_model_len": 128,
        "max_num_seqs": 4,
        "max_num_batched_tokens": 16,
        "enable_chunked_prefill": True,
        "block_size": 32,
        "kv_cache_memory_bytes": 4 << 20,
        "gpu_memory_utilization": 0.2,
        "distributed_executor_backend": "uni",
        "seed": 0,
    }
    kwargs.update(json.loads(os.environ.get("HEXLAYOUT_VLLM_LLM_ARGS", "{}")))
    kwargs.update(model_llm_args(model))
    llm = LLM(**kwargs)
    params = SamplingParams(max_tokens=MAX_TOKENS, temperature=0.0, logprobs=LOGPROBS, detokenize=False)
    outs = llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts()], params, use_tqdm=False)
    result = []
    for o in outs:
        c = o.outputs[0]
        result.append(
            {
                "tokens": list(c.token_ids),
                "logprobs": [{str(t): lp.logprob for t, lp in step.items()} for step in c.logprobs],
            }
        )
    del llm
    return result


def main() -> None:
    if os.environ.get("HEXLAYOUT_VLLM_INPROC") == "1":
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    plant = os.environ.get("HEXLAYOUT_VLLM_PLANT")
    if plant:  # a wrong kernel the stage must catch (planted.py)
        import planted

        planted.install(plant)
        print(f"planted wrong kernel: {plant}", flush=True)
    out, models = sys.argv[1], sys.argv[2:]
    results = {m: run(m) for m in models}
    with open(out, "w") as f:
        json.dump(results, f)


if __name__ == "__main__":
    main()
