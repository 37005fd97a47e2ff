"""Greedy tokens and logprobs of two vLLM runs compared within bf16-calibrated tolerances.

Both runs compute the same bf16 model with different kernels, so their hidden states differ by
bf16 roundings (one unit in the last place, 2^-8 relative, here and there) and so do the bf16
logits: at logits of magnitude 8-16 one unit is 0.0625. Tolerances:

- :data:`LOGPROB_TOL` = 0.15 nats on the logprob of every token both runs chose while their
  sequences agree (a little over two units of the largest logits, so one flipped rounding of
  the logit and one of the normalizer pass, a wrong kernel does not: a wrong attention or
  expert changes logprobs by whole nats);
- a sequence may leave the other only at a near tie: the two tokens are in both runs' top
  logprobs and 2 x :data:`LOGPROB_TOL` apart at most in each; the rest of that sequence is not
  compared (its context differs);
- at least :data:`MIN_COMPARED` of all generated tokens are compared (runs that diverge early
  everywhere do not pass on ties).
"""

from __future__ import annotations

from dataclasses import dataclass, field

LOGPROB_TOL = 0.15
MIN_COMPARED = 0.75


@dataclass
class Agreement:
    """Tokens compared, their largest logprob difference, divergences (near ties) and problems."""

    compared: int = 0
    total: int = 0
    max_diff: float = 0.0
    divergences: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)

    def summary(self) -> str:
        return (
            f"{self.compared}/{self.total} tokens agree, max |logprob diff| {self.max_diff:.4f} "
            f"(tolerance {LOGPROB_TOL}), {len(self.divergences)} near-tie divergences"
        )


def compare(ref: list[dict], got: list[dict]) -> Agreement:
    """Compare per-sequence ``{"tokens", "logprobs"}`` results (``vllm_run``)."""
    a = Agreement()
    if len(ref) != len(got):
        a.problems.append(f"{len(ref)} sequences vs {len(got)}")
        return a
    for s, (r, g) in enumerate(zip(ref, got)):
        a.total += len(r["tokens"])
        if len(r["tokens"]) != len(g["tokens"]):
            a.problems.append(f"sequence {s}: {len(r['tokens'])} tokens vs {len(g['tokens'])}")
            continue
        for i, (tr, tg) in enumerate(zip(r["tokens"], g["tokens"])):
            lr, lg = r["logprobs"][i], g["logprobs"][i]
            if tr == tg:
                d = abs(lr[str(tr)] - lg[str(tg)])
                a.max_diff = max(a.max_diff, d)
                a.compared += 1
                if d > LOGPROB_TOL:
                    a.problems.append(
                        f"sequence {s} step {i}: token {tr} logprob {lr[str(tr)]:.4f} vs {lg[str(tg)]:.4f}"
                    )
                continue
            ok = all(str(t) in lp for t in (tr, tg) for lp in (lr, lg)) and all(
                abs(lp[str(tr)] - lp[str(tg)]) <= 2 * LOGPROB_TOL for lp in (lr, lg)
            )
            what = f"sequence {s} step {i}: token {tr} vs {tg} (reference top logprobs {lr}, other {lg})"
            (a.divergences if ok else a.problems).append(what)
            break
    if a.total and a.compared < MIN_COMPARED * a.total:
        a.problems.append(f"only {a.compared} of {a.total} tokens compared before divergences")
    return a
