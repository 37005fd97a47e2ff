"""The float64 check of :mod:`agreement` on synthetic runs: what it accepts and what it flags."""

from __future__ import annotations

import math

import torch
from agreement import LOGPROB_TOL, ROUTER_TIE, TIE_TOL, check
from float64_reference import Reference

VOCAB = 16


def _reference(steps: int, seed: int, margins: list[float] | None = None) -> Reference:
    g = torch.Generator().manual_seed(seed)
    lp = torch.log_softmax(torch.randn(steps, VOCAB, generator=g, dtype=torch.float64) * 3, dim=-1)
    m = torch.tensor(margins if margins is not None else [1.0] * steps, dtype=torch.float64)
    return Reference(lp, m)


def _greedy_run(ref: Reference, noise: float = 0.0, seed: int = 0) -> dict:
    """The run a correct kernel gives: the argmax each step, top-5 logprobs within ``noise``."""
    g = torch.Generator().manual_seed(seed)
    tokens, logprobs = [], []
    for row in ref.logprobs:
        top = row.topk(5).indices.tolist()
        tokens.append(top[0])
        jitter = (torch.rand(5, generator=g, dtype=torch.float64) * 2 - 1) * noise
        logprobs.append({str(t): float(row[t] + j) for t, j in zip(top, jitter)})
    return {"tokens": tokens, "logprobs": logprobs}


def test_a_run_within_bf16_noise_passes_and_every_step_is_checked() -> None:
    refs = [_reference(8, s) for s in range(4)]
    runs = [_greedy_run(r, noise=0.9 * LOGPROB_TOL, seed=s) for s, r in enumerate(refs)]
    a = check(runs, refs)
    assert not a.problems and a.checked == a.total == 32, a.problems
    assert 0.5 * LOGPROB_TOL < a.max_diff <= LOGPROB_TOL


def test_a_logprob_off_by_more_than_the_tolerance_is_flagged_with_its_step() -> None:
    refs = [_reference(8, s) for s in range(2)]
    runs = [_greedy_run(r) for r in refs]
    tok = str(runs[1]["tokens"][5])
    runs[1]["logprobs"][5][tok] -= 2 * LOGPROB_TOL
    a = check(runs, refs)
    assert len(a.problems) == 1 and "sequence 1 step 5" in a.problems[0], a.problems


def test_a_clearly_worse_token_is_flagged_a_near_tie_is_not() -> None:
    ref = _reference(4, 7)
    row = ref.logprobs[2]
    order = row.argsort(descending=True).tolist()
    best, second = order[0], order[1]
    # a near tie: the runner-up within TIE_TOL of the argmax is an acceptable greedy choice
    near = ref.logprobs.clone()
    near[2, second] = near[2, best] - 0.5 * TIE_TOL
    ref_near = Reference(near, ref.margins)
    run = _greedy_run(ref_near)
    run["tokens"][2] = second
    assert not check([run], [ref_near]).problems
    # a token 1 nat below the argmax is not
    far = ref.logprobs.clone()
    far[2, second] = far[2, best] - 1.0
    ref_far = Reference(far, ref.margins)
    run = _greedy_run(ref_far)
    run["tokens"][2] = second
    probs = check([run], [ref_far]).problems
    assert len(probs) == 1 and f"chose token {second}" in probs[0], probs


def test_a_routing_near_tie_stops_its_sequence_and_too_few_checked_steps_fail() -> None:
    refs = [_reference(8, 0, [1.0, 1.0, 0.5 * ROUTER_TIE] + [1.0] * 5), _reference(8, 1)]
    runs = [_greedy_run(r) for r in refs]
    runs[0]["logprobs"][4][str(runs[0]["tokens"][4])] -= 3.0      # after the tie: not checked
    a = check(runs, refs)
    assert not a.problems and a.checked == 2 + 8 and len(a.routing_ties) == 1, (a.problems, a.checked)
    # every sequence stopping at its first step leaves too little checked
    refs = [_reference(8, s, [0.0] + [1.0] * 7) for s in range(2)]
    a = check([_greedy_run(r) for r in refs], refs)
    assert a.checked == 0 and any("tokens checked" in p for p in a.problems), a.problems


def test_models_without_experts_have_no_routing_margin() -> None:
    from float64_reference import _margins

    assert torch.all(_margins(None, 3, 0) == math.inf)
    layer = torch.tensor([[3.0, 1.0, 0.9, 0.0], [2.0, 2.0, 1.9, 0.0]])
    assert torch.allclose(_margins((layer, layer + torch.tensor([0.0, 0.0, 0.5, 0.0])), 2, 2),
                          torch.tensor([0.1, 0.0], dtype=torch.float64))  # per position, the smaller layer


def test_runs_compared_until_they_diverge() -> None:
    """``check_runs``: two runs of one checkpoint agree within the tolerance until their tokens
    differ; a divergence at a near tie ends the sequence, elsewhere it is a problem."""
    from agreement import RUN_TOL, check_runs

    refs = [_reference(8, s) for s in range(2)]
    ref_runs = [_greedy_run(r) for r in refs]
    runs = [_greedy_run(r, noise=0.9 * RUN_TOL, seed=5 + s) for s, r in enumerate(refs)]
    a = check_runs(runs, ref_runs)
    assert not a.problems and a.checked == a.total == 16, a.problems
    assert LOGPROB_TOL < a.max_diff <= RUN_TOL
    # a logprob off by more than the tolerance is flagged with its step
    runs[1]["logprobs"][3][str(runs[1]["tokens"][3])] -= 2 * RUN_TOL
    probs = check_runs(runs, ref_runs).problems
    assert len(probs) == 1 and "sequence 1 step 3" in probs[0], probs
    # choosing the reference's runner-up at a near tie ends the sequence, not a problem
    runs = [_greedy_run(r) for r in refs]
    top = ref_runs[0]["logprobs"][2]
    first, second = sorted(top, key=top.get, reverse=True)[:2]
    top[second] = runs[0]["logprobs"][2][second] = top[first] - 0.5 * TIE_TOL
    runs[0]["tokens"][2] = int(second)
    a = check_runs(runs, ref_runs)
    assert not a.problems and a.checked == 3 + 8 and len(a.routing_ties) == 1, (a.problems, a.checked)
    # a clearly worse choice is a problem
    top[second] = runs[0]["logprobs"][2][second] = top[first] - 1.0
    probs = check_runs(runs, ref_runs).problems
    assert len(probs) == 1 and f"chose token {second}" in probs[0], probs
