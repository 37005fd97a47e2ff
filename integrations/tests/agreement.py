"""A vLLM run's greedy tokens and logprobs checked against the float64 teacher-forced reference
(:mod:`float64_reference`) within bf16-calibrated tolerances.

A run computes the bf16 model, so its hidden states differ from float64 by bf16 roundings (2^-8
relative, here and there) and so do its logits: at logits of magnitude 8-16 one unit in the last
place is 0.0625. Per sequence, every step is checked until the first step whose position has a
routing near tie (see below); at a checked step ``i``:

- every token of the run's top logprobs is within :data:`LOGPROB_TOL` = 0.2 nats of its float64
  logprob (about three units of the largest logits; measured here: 0.10-0.13 for single-process
  runs, 0.145 with tensor parallelism 2, whose all-reduce of bf16 partial sums rounds once more;
  a wrong attention or expert changes logprobs by whole nats: the planted swapped K/V, 14);
- the token the run chose is the float64 argmax or within :data:`TIE_TOL` = 0.4 nats of it (a
  greedy bf16 run may take either side of a near tie, never a clearly worse token).

A routing near tie: at the step's position, some MoE layer's ``k``-th and ``(k+1)``-th router
logits are within :data:`ROUTER_TIE` = 0.05 in float64. Top-k routing is discontinuous there:
a correct bf16 run may route the token to the other expert, and from then on the sequence (the
flipped position's keys and values stay in its context) leaves float64 by more than bf16 noise
(measured on these models: 1.35 and 3.61 nats at margins 0.034 and 0.002, 0.3 nats on the steps
after). At least :data:`MIN_CHECKED` of all generated tokens must be checked. The reference and
the margins are the run's own (teacher-forced on its tokens), so nothing depends on another
run's near ties or on the host's vector ISA.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from float64_reference import Reference

LOGPROB_TOL = 0.2
TIE_TOL = 2 * LOGPROB_TOL
#: Two bf16 runs each within LOGPROB_TOL of float64 are within twice that of each other
#: (measured, DeepSeek-V3 hexlayout vs vLLM's own: 0.05-0.10 typical, 0.19 at most).
RUN_TOL = 2 * LOGPROB_TOL
ROUTER_TIE = 0.05
MIN_CHECKED = 0.5
#: The logprob tolerance of a run with an FP8 (E4M3) KV cache against float64 with the same
#: rounding of K and V: E4M3 keeps 3 mantissa bits (relative steps of 2^-4, 16 times bf16's), so
#: the run's bf16 noise before rounding moves elements across rounding boundaries: the run is as
#: far from the FP8-rounded float64 model as the rounding itself moves float64 (measured on the
#: tiny Mixtral: the rounding moves top-5 logprobs by up to 0.34, the run sits 0.33 from it) and
#: this allows half again; a wrong attention is whole nats away (the planted swapped K/V: 14).
FP8_LOGPROB_TOL = 0.5


@dataclass
class Agreement:
    """Steps checked, their largest logprob difference, routing near ties met and problems."""

    checked: int = 0
    total: int = 0
    max_diff: float = 0.0
    worst_choice: float = 0.0
    routing_ties: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    against: str = "float64"
    tolerance: float = LOGPROB_TOL
    tie_tolerance: float = TIE_TOL

    def summary(self) -> str:
        return (
            f"{self.checked}/{self.total} tokens checked against {self.against}, max |logprob diff| "
            f"{self.max_diff:.4f} (tolerance {self.tolerance}), chosen tokens at most "
            f"{self.worst_choice:.4f} below the argmax (tolerance {self.tie_tolerance}), "
            f"{len(self.routing_ties)} sequences stopped at a routing near tie"
        )


def check(results: list[dict], refs: list[Reference], tolerance: float = LOGPROB_TOL) -> Agreement:
    """Check a run's per-sequence ``{"tokens", "logprobs"}`` (``vllm_run``) against ``refs``
    (``float64_reference.teacher_forced`` of the same tokens): logprobs within ``tolerance``,
    chosen tokens within twice that of the argmax (:data:`TIE_TOL` at the default)."""
    a = Agreement(tolerance=tolerance, tie_tolerance=2 * tolerance)
    if len(results) != len(refs):
        a.problems.append(f"{len(results)} sequences vs {len(refs)} references")
        return a
    for s, (r, ref) in enumerate(zip(results, refs)):
        a.total += len(r["tokens"])
        for i, (tok, top) in enumerate(zip(r["tokens"], r["logprobs"])):
            margin = float(ref.margins[i])
            if margin < ROUTER_TIE:
                a.routing_ties.append(f"sequence {s} step {i}: routing margin {margin:.4f}")
                break
            lp = ref.logprobs[i]
            a.checked += 1
            for t, got in top.items():
                d = abs(got - float(lp[int(t)]))
                a.max_diff = max(a.max_diff, d)
                if d > tolerance:
                    a.problems.append(
                        f"sequence {s} step {i}: token {t} logprob {got:.4f}, float64 {float(lp[int(t)]):.4f}"
                    )
            best = int(lp.argmax())
            gap = float(lp[best] - lp[tok])
            a.worst_choice = max(a.worst_choice, gap)
            if gap > a.tie_tolerance:
                a.problems.append(
                    f"sequence {s} step {i}: chose token {tok} (float64 logprob {float(lp[tok]):.4f}), "
                    f"the float64 argmax is {best} ({float(lp[best]):.4f})"
                )
    if a.total and a.checked < MIN_CHECKED * a.total:
        a.problems.append(f"only {a.checked} of {a.total} tokens checked before routing near ties")
    return a


def check_runs(results: list[dict], reference: list[dict]) -> Agreement:
    """Check a run against another run of the same bf16 checkpoint (vLLM's own kernels), for a
    model whose float64 reference does not describe vLLM (DeepSeek-V3: vLLM's CPU MLA differs
    from transformers' by nats, whatever kernels serve the experts). Per sequence, along the
    steps whose context (prompt and earlier tokens) is the same in both runs: every token in
    both top logprobs within :data:`RUN_TOL` (both runs carry bf16 noise); a step where the
    runs choose different tokens must be a near tie in the reference (the run's token within
    :data:`TIE_TOL` of the reference's choice, else it is a problem) and ends the comparison of
    that sequence (its contexts differ from then on, recorded in ``routing_ties``). At least
    :data:`MIN_CHECKED` of the tokens must be checked."""
    a = Agreement(against="the reference run", tolerance=RUN_TOL)
    if len(results) != len(reference):
        a.problems.append(f"{len(results)} sequences vs {len(reference)} in the reference run")
        return a
    for s, (r, ref) in enumerate(zip(results, reference)):
        a.total += len(r["tokens"])
        for i, (tok, top, ref_tok, ref_top) in enumerate(zip(r["tokens"], r["logprobs"], ref["tokens"],
                                                             ref["logprobs"])):
            a.checked += 1
            for t in top.keys() & ref_top.keys():
                d = abs(top[t] - ref_top[t])
                a.max_diff = max(a.max_diff, d)
                if d > RUN_TOL:
                    a.problems.append(
                        f"sequence {s} step {i}: token {t} logprob {top[t]:.4f}, "
                        f"reference run {ref_top[t]:.4f}"
                    )
            if tok == ref_tok:
                continue
            gap = ref_top[str(ref_tok)] - ref_top.get(str(tok), -float("inf"))
            a.worst_choice = max(a.worst_choice, gap)
            if gap > TIE_TOL:
                a.problems.append(
                    f"sequence {s} step {i}: chose token {tok}, the reference run chose {ref_tok} "
                    f"({gap:.4f} nats better by its logprobs)"
                )
            a.routing_ties.append(f"sequence {s} step {i}: the runs chose {tok} and {ref_tok}")
            break
    if a.total and a.checked < MIN_CHECKED * a.total:
        a.problems.append(f"only {a.checked} of {a.total} tokens checked before the runs diverged")
    return a
