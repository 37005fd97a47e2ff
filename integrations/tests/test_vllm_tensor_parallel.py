"""Tensor parallelism 2 on vLLM's CPU build: two worker processes (vLLM's ``mp`` executor), each
with half the query heads (GQA's single KV head replicated) and half of every expert's
intermediate size, run hexlayout's kernels; tokens and logprobs match the float64
teacher-forced reference within the same tolerances as the unsharded runs."""

from __future__ import annotations

import json
import os
import pathlib

import pytest
from agreement import check
from vllm_harness import Run, run_models


@pytest.fixture(scope="module")
def tp2_run(models: dict[str, pathlib.Path], tmp_path_factory: pytest.TempPathFactory) -> Run:
    cpus = sorted(os.sched_getaffinity(0))
    env = {
        "HEXLAYOUT_EMULATE": "1",
        "HEXLAYOUT_VLLM_LLM_ARGS": json.dumps(
            {"tensor_parallel_size": 2, "distributed_executor_backend": "mp"}
        ),
        # One core per worker (vLLM's CPU build binds each worker's threads to a NUMA node
        # otherwise, and refuses two workers on one node).
        "VLLM_CPU_OMP_THREADS_BIND": f"{cpus[0]}|{cpus[1 % len(cpus)]}",
    }
    return run_models(tmp_path_factory.mktemp("tp2"), {"mixtral": models["mixtral"]}, env, inproc=False)


def test_tp2_matches_float64(tp2_run: Run, float64) -> None:
    report = check(tp2_run.results["mixtral"], float64("mixtral", tp2_run.results["mixtral"]))
    print(f"mixtral TP=2: {report.summary()}")
    assert not report.problems, report.summary() + "\n" + "\n".join(report.problems)


def test_tp2_kernels_run_in_both_workers_on_their_shards(tp2_run: Run) -> None:
    pids = {row["pid"] for row in tp2_run.trace}
    assert len(pids) == 2 and tp2_run.pid not in pids, pids  # two workers, not the front end
    for pid in pids:
        rows = [r for r in tp2_run.trace if r["pid"] == pid]
        assert {r["kernel"] for r in rows} == {"attention_prefill", "attention_decode", "moe"}
        for r in rows:
            if r["kernel"].startswith("attention"):
                # 2 query heads / TP 2; the one KV head is replicated.
                assert (r["shapes"]["num_heads"], r["shapes"]["num_kv_heads"]) == (1, 1)
            else:
                # Every expert on each rank, half of its intermediate size (256 / 2).
                assert (r["shapes"]["local_experts"], r["shapes"]["intermediate"]) == (4, 128)
