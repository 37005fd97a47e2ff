"""What the graph front end did with a model: ``FusionPlan`` (fused kernels and the ops
left to torch, with reasons), built from the plans of each compiled graph."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["FusionPlan", "KernelPlan", "Fallback", "GraphPlan", "REPORT_REASON_CHARS"]

#: a reason in ``FusionPlan.report`` is cut to this many characters
REPORT_REASON_CHARS = 200


@dataclass(frozen=True)
class KernelPlan:
    """One fused hexlayout kernel: its ``name``, its ``anchor`` (the graph's aten op as FX
    prints it), and the graph's aten ops fused into it as ``prologue`` (operand by operand)
    and ``epilogue`` (in order) - views of inputs among them are applied by the host, for
    free. ``spec`` is what the fusion mechanism runs (the anchor record's ``to_spec`` may
    name another spec anchor: ``nn.Linear``'s matmul of a transposed weight reads the weight
    as it is); launch records (``hexlayout.runtime.launch_log``) name the spec's ops."""

    name: str
    anchor: str
    prologue: list[str]
    epilogue: list[str]
    spec: Any = field(default=None, compare=False, repr=False)

    def __str__(self) -> str:
        return (f"kernel {self.name}: anchor {self.anchor}; prologue [{', '.join(self.prologue)}]; "
                f"epilogue [{', '.join(self.epilogue)}]")


@dataclass(frozen=True)
class Fallback:
    """One op left to torch (``op``: aten name) and why (``reason``)."""

    op: str
    reason: str

    def __str__(self) -> str:
        reason = self.reason if len(self.reason) <= 300 else self.reason[:297] + "..."
        return f"torch {self.op}: {reason}"


@dataclass
class FusionPlan:
    """``kernels``: the fused hexlayout kernels; ``fallbacks``: every op left to torch with
    its reason; ``notes``: planning decisions worth knowing (``norm: two kernels (K=4096 >
    128) ...``: a norm that could not be a GEMM's A prologue). ``str(plan)`` lists them."""

    kernels: list[KernelPlan] = field(default_factory=list)
    fallbacks: list[Fallback] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"FusionPlan: {len(self.kernels)} fused kernel(s), "
                 f"{len(self.fallbacks)} op(s) left to torch"]
        lines += [f"  {k}" for k in self.kernels]
        lines += [f"  {f}" for f in self.fallbacks]
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)

    __repr__ = __str__

    def report(self, title: str = "hexlayout fusion plan") -> str:
        """The plan as ``torch.compile(..., options={"report": True})`` prints it: a header
        (``k`` kernels, ``f`` ops left to torch, so ``k + f`` launches at most where every
        fallback op is its own torch kernel), each kernel with its prologue and epilogue, then
        the fallbacks grouped by reason - each reason once (cut to ``REPORT_REASON_CHARS``),
        with its count and the ops it covers (``op x n`` for repeats), groups by count,
        largest first.

        Example::

            >>> p = FusionPlan([KernelPlan("fused_k_gelu", "aten.k.default", [], ["aten.gelu.default"])],
            ...                [Fallback("aten.select.int", "not fusible"),
            ...                 Fallback("aten.select.int", "not fusible")])
            >>> print(p.report())
            hexlayout fusion plan: 1 fused kernel(s), 2 op(s) left to torch
              kernel fused_k_gelu: anchor aten.k.default; prologue []; epilogue [aten.gelu.default]
              left to torch (1 reason(s)):
                2 op(s) [aten.select.int x 2]: not fusible
        """
        lines = [f"{title}: {len(self.kernels)} fused kernel(s), {len(self.fallbacks)} op(s) left to torch"]
        lines += [f"  {k}" for k in self.kernels]
        groups: dict[str, list[str]] = {}
        for f in self.fallbacks:
            groups.setdefault(f.reason, []).append(f.op)
        if groups:
            lines.append(f"  left to torch ({len(groups)} reason(s)):")
        for reason, ops in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            counts: dict[str, int] = {}
            for op in ops:
                counts[op] = counts.get(op, 0) + 1
            names = ", ".join(op if n == 1 else f"{op} x {n}" for op, n in counts.items())
            short = reason if len(reason) <= REPORT_REASON_CHARS else reason[:REPORT_REASON_CHARS - 3] + "..."
            lines.append(f"    {len(ops)} op(s) [{names}]: {short}")
        lines += [f"  note: {n}" for n in self.notes]
        return "\n".join(lines)


@dataclass
class GraphPlan:
    """The plan of one compiled FX graph: its fused kernels (``FusedKernel`` objects, whose
    run-time fallbacks are read when the plan is resolved), its static fallbacks and the
    partition's ``notes``."""

    kernels: list[Any] = field(default_factory=list)
    fallbacks: list[Fallback] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def resolve(self) -> FusionPlan:
        """The plan as it stands: a kernel whose latest call fell back to torch is listed
        as its aten ops left to torch with that reason."""
        plan = FusionPlan([], list(self.fallbacks), list(self.notes))
        for k in self.kernels:
            reason = k.fallback_reason()
            anchor, prologue, epilogue = k.ops
            if reason is None:
                plan.kernels.append(KernelPlan(k.spec.name, anchor, list(prologue), list(epilogue), k.spec))
            else:
                why = f"hexlayout could not fuse kernel {k.spec.name}: {reason}"
                plan.fallbacks += [Fallback(op, why) for op in [*prologue, anchor, *epilogue]]
        return plan

    @staticmethod
    def merge(plans: list[GraphPlan]) -> FusionPlan:
        """One ``FusionPlan`` of several graphs' plans, in compile order."""
        out = FusionPlan()
        for p in plans:
            r = p.resolve()
            out.kernels += r.kernels
            out.fallbacks += r.fallbacks
            out.notes += r.notes
        return out
