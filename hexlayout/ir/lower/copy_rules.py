"""Copy lowering rules: one rule per copy-instruction family, found through a registry.

A copy ``src -> dst`` between two scopes (global, shared, register) is lowered by one of
the legal instructions the registered rules offer: synthesis takes the cheapest under its
static cost model (ties in preference order), a plain lowering the first in preference order:

- ``TmaRule`` (``SM90_TMA_LOAD``): global -> shared when the copy completes on an mbarrier
  (or asks for a TMA instruction); then it is the only rule tried;
- ``CpAsyncRule`` (``cp.async``): global -> shared, the widest of 16, 8, 4 bytes;
- ``MatrixRule`` (``ldmatrix`` shared -> register, ``stmatrix`` register -> shared on
  architectures that have it), the widest ``.x4 / .x2 / .x1``, non-transposed first;
- ``VectorRule`` (``ld/st.global``, ``ld/st.shared``): register <-> memory vectors;
- ``TmaStoreRule`` (``SM90_TMA_STORE``, ``hexlayout.ir.lower.tma_store``): shared -> global
  by TMA box stores with their proxy fence, barrier, commit and wait (architectures with
  TMA; registered by that module ahead of ``ViaRegistersRule``);
- ``ViaRegistersRule`` (``ld.global+st.shared``, ``ld.shared+st.global``): memory to
  memory through temporary registers.

Each rule owns its **legality check and its lowering in one function**, ``lower(ctx, name)``:
it returns a ``CopyPlan`` (the instructions, which are the proof of legality: every address
is the composition of the tile's layouts with the instruction's TV layouts, checked over all
threads and values) or a ``Rejection`` saying which requirement fails. Its **cost** is that
of its instructions under the static cost model (``hexlayout.synth.cost``), and its
**preference** is its place in the registry and the order of ``instructions(ctx)``.

``legal_copies(ctx)`` is the question synthesis asks: the legal choices, in preference order, or
the ``Rejection`` naming why each instruction was refused. It reads the views it is given
and mutates nothing. Adding a copy instruction is one atom in ``hexlayout.arch`` plus one
rule here (``COPY_RULES.register(rule)``), see docs/adding-an-op.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from hexlayout.arch import get_atom

from ..expr import ExprLike, Var
from ..lowered import MbarRef, RegArray
from .copy import (
    CopyPlan,
    lower_gmem_to_smem,
    lower_ldmatrix,
    lower_mem_to_mem,
    lower_reg_mem,
    lower_stmatrix,
    lower_tma_load,
)
from .offline import is_offline, lower_offline_load
from .rejection import Rejection
from .views import GlobalTileView, RegisterTile, SharedTileView

__all__ = ["CopyContext", "CopyChoice", "CopyRule", "CopyRules", "COPY_RULES", "legal_copies", "lower_choice",
           "TmaRule", "CpAsyncRule", "MatrixRule", "VectorRule", "ViaRegistersRule"]

# ldmatrix / stmatrix in preference order: widest first, non-transposed before transposed
LDSM = ("SM75_U32x4_LDSM_N", "SM75_U16x8_LDSM_T", "SM75_U32x2_LDSM_N", "SM75_U16x4_LDSM_T",
        "SM75_U32x1_LDSM_N", "SM75_U16x2_LDSM_T")
STSM = ("SM90_U32x4_STSM_N", "SM90_U16x8_STSM_T", "SM90_U32x2_STSM_N", "SM90_U16x4_STSM_T",
        "SM90_U32x1_STSM_N", "SM90_U16x2_STSM_T")


@dataclass(frozen=True)
class CopyContext:
    """Everything a copy rule may look at (read only).

    ``src`` / ``dst``: where the elements live (``GlobalTileView``, ``SharedTileView`` or
    ``RegisterTile``); ``tid`` / ``threads``: the thread index and count of the region that
    runs the copy; ``elem_bits``: element width; ``arch``: the ``ArchInfo``; ``want``: the
    instruction the program asked for (``instruction=``) or ``None``; ``mbarrier``: the
    mbarrier the copy completes on (TMA); ``elect``: the predicate of the one thread that
    issues single-thread instructions; ``names``: ``(src, dst)`` value names (for messages
    and scratch registers); ``scratch``: makes a temporary register array from ``(dtype,
    count)`` (not yet part of the kernel: a plan lists the ones it uses); ``barrier``: makes a
    barrier of the threads running the copy (``None`` where the copy may not synchronize, e.g.
    under a condition)."""

    src: Any
    dst: Any
    tid: ExprLike
    threads: int
    elem_bits: int
    arch: Any
    want: str | None = None
    mbarrier: MbarRef | None = None
    elect: ExprLike = 1
    names: tuple[str, str] = ("src", "dst")
    scratch: Callable[[Any, int], RegArray] | None = None
    barrier: Callable[[], Any] | None = None   # a barrier of the region's threads (None: none may be used)

    @property
    def scopes(self) -> tuple[str, str]:
        return _scope(self.src), _scope(self.dst)


def _scope(view: Any) -> str:
    if isinstance(view, GlobalTileView):
        return "global"
    if isinstance(view, SharedTileView):
        return "shared"
    if isinstance(view, RegisterTile):
        return "register"
    return type(view).__name__


@dataclass(frozen=True)
class CopyChoice:
    """A legal instruction for a copy: the rule (family) that offers it, the name the rule
    was asked to lower (``name``, what an ``Assignment`` records), the instruction as the
    plan spells it (e.g. ``cp.async.cg.16``) and the plan."""

    rule: str
    name: str
    instruction: str
    plan: CopyPlan = field(compare=False)


class CopyRule:
    """One copy-instruction family. Subclasses set ``family`` and implement ``instructions``
    (the names this rule may try for ``ctx``, best first; empty when it does not apply) and
    ``lower`` (legality and lowering of one of them). ``exclusive(ctx)``: this rule alone
    handles the copy (its rejection is the copy's)."""

    family: str = "?"

    def instructions(self, ctx: CopyContext) -> list[str]:
        raise NotImplementedError

    def lower(self, ctx: CopyContext, name: str) -> CopyPlan | str:
        raise NotImplementedError

    def exclusive(self, ctx: CopyContext) -> bool:
        return False

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.family})"


class TmaRule(CopyRule):
    """``SM90_TMA_LOAD``: a global tile into shared memory by box loads completing on an mbarrier."""

    family = "tma"

    def exclusive(self, ctx: CopyContext) -> bool:
        return ctx.scopes == ("global", "shared") and (
            ctx.mbarrier is not None or (ctx.want or "").startswith("SM90_TMA"))

    def instructions(self, ctx: CopyContext) -> list[str]:
        return ["SM90_TMA_LOAD"] if self.exclusive(ctx) else []

    def lower(self, ctx: CopyContext, name: str) -> CopyPlan | str:
        if ctx.mbarrier is None:
            return Rejection("a TMA copy completes on an mbarrier: pass mbarrier=")
        res = lower_tma_load(ctx.src, ctx.dst, ctx.mbarrier, ctx.elect, ctx.elem_bits,
                             f"tma_{ctx.src.param.name}")
        if isinstance(res, str):
            return Rejection(f"TMA load of %{ctx.names[0]} into %{ctx.names[1]}: {res}",
                             layouts=(("shared", ctx.dst.full_layout),))
        plan, desc = res
        plan.desc = desc
        return plan


class CpAsyncRule(CopyRule):
    """``cp.async``: global -> shared, coalesced, the widest legal vector (16, 8 or 4 bytes)."""

    family = "cp.async"

    def instructions(self, ctx: CopyContext) -> list[str]:
        return ["cp.async"] if ctx.scopes == ("global", "shared") else []

    def lower(self, ctx: CopyContext, name: str) -> CopyPlan | str:
        return lower_gmem_to_smem(ctx.src, ctx.dst, ctx.tid, ctx.threads, ctx.elem_bits)


class MatrixRule(CopyRule):
    """``ldmatrix`` (shared -> register) and ``stmatrix`` (register -> shared, sm_90a)."""

    family = "ldmatrix/stmatrix"

    def instructions(self, ctx: CopyContext) -> list[str]:
        if ctx.want is not None:
            return [ctx.want] if self._owns(ctx, ctx.want) else []
        if ctx.scopes == ("shared", "register"):
            return list(LDSM)
        if ctx.scopes == ("register", "shared") and ctx.arch.has_stmatrix:
            return list(STSM)
        return []

    @staticmethod
    def _owns(ctx: CopyContext, name: str) -> bool:
        return ((ctx.scopes == ("shared", "register") and name.startswith("SM75"))
                or (ctx.scopes == ("register", "shared") and name.startswith("SM90")))

    def lower(self, ctx: CopyContext, name: str) -> CopyPlan | str:
        if ctx.scopes == ("shared", "register"):
            return lower_ldmatrix(ctx.dst, ctx.src, get_atom(name), ctx.tid, ctx.elem_bits)
        return lower_stmatrix(ctx.src, ctx.dst, get_atom(name), ctx.tid, ctx.elem_bits)


class VectorRule(CopyRule):
    """Plain vector loads and stores between registers and global or shared memory."""

    family = "ld/st"

    _NAMES = {("shared", "register"): "ld.shared", ("register", "shared"): "st.shared",
              ("global", "register"): "ld.global", ("register", "global"): "st.global"}

    def instructions(self, ctx: CopyContext) -> list[str]:
        name = self._NAMES.get(ctx.scopes)
        if name is None:
            return []
        if ctx.want is not None and ctx.scopes[0] != "global" and ctx.scopes[1] != "global":
            # an instruction asked for on a shared <-> register copy: this rule takes what
            # MatrixRule does not own (under the name asked for)
            return [] if MatrixRule._owns(ctx, ctx.want) else [ctx.want]
        return [name]

    def lower(self, ctx: CopyContext, name: str) -> CopyPlan | str:
        if isinstance(ctx.dst, RegisterTile):
            if is_offline(ctx.src):  # an hl.offline tensor: its storage order is the tile's layout
                return lower_offline_load(ctx.dst, ctx.src, True, ctx.tid, ctx.elem_bits, ctx.scratch)
            return lower_reg_mem(ctx.dst, ctx.src, True, ctx.tid, ctx.elem_bits)
        if is_offline(ctx.dst):
            return lower_offline_load(ctx.src, ctx.dst, False, ctx.tid, ctx.elem_bits)
        return lower_reg_mem(ctx.src, ctx.dst, False, ctx.tid, ctx.elem_bits)


class ViaRegistersRule(CopyRule):
    """Memory to memory through temporary registers: vector loads, then vector stores."""

    family = "via registers"

    def instructions(self, ctx: CopyContext) -> list[str]:
        if ctx.scopes == ("shared", "global"):
            return ["ld.shared+st.global"]
        if ctx.scopes == ("global", "shared") and ctx.want is None and ctx.src.gather is None:
            return ["ld.global+st.shared"]
        return []

    def lower(self, ctx: CopyContext, name: str) -> CopyPlan | str:
        if ctx.scratch is None:
            return Rejection("no temporary registers are available", instruction=name)
        n = 1
        for s in ctx.src.shape:
            n *= s
        tmp = ctx.scratch(ctx.src.dtype, -(-n // ctx.threads))
        plan = lower_mem_to_mem(ctx.src, ctx.dst, ctx.tid, ctx.threads, ctx.elem_bits, tmp)
        if not isinstance(plan, str):
            plan.scratch.append(tmp)
        return plan


class CopyRules:
    """The ordered registry of copy rules (earlier rules are preferred)."""

    def __init__(self, rules: list[CopyRule]) -> None:
        self._rules = list(rules)

    def __iter__(self) -> Iterator[CopyRule]:
        return iter(list(self._rules))

    def register(self, rule: CopyRule, *, before: type[CopyRule] | None = None) -> CopyRule:
        """Add ``rule`` (before the first rule of class ``before``, else first of all: a new
        instruction family is preferred to the built-in ones where both apply)."""
        at = 0
        if before is not None:
            at = next((i for i, r in enumerate(self._rules) if isinstance(r, before)), len(self._rules))
        self._rules.insert(at, rule)
        return rule

    def remove(self, rule: CopyRule) -> None:
        self._rules.remove(rule)

    @contextmanager
    def added(self, rule: CopyRule, *, before: type[CopyRule] | None = None) -> Iterator[CopyRule]:
        """``rule`` registered for the duration of a ``with`` block."""
        self.register(rule, before=before)
        try:
            yield rule
        finally:
            self.remove(rule)


COPY_RULES = CopyRules([TmaRule(), CpAsyncRule(), MatrixRule(), VectorRule(), ViaRegistersRule()])


def legal_copies(ctx: CopyContext, *, limit: int | None = None, per_rule: int | None = None,
                 rules: CopyRules | None = None) -> list[CopyChoice] | Rejection:
    """The legal instructions for the copy ``ctx`` describes, in preference order (at most
    ``limit``, at most ``per_rule`` of each rule: a rule lists its instructions best first),
    or a ``Rejection`` listing why each instruction tried was refused. Pure: nothing in the
    views or the program changes (a plan's scratch registers are not yet the kernel's)."""
    rules = rules if rules is not None else COPY_RULES
    out: list[CopyChoice] = []
    tried: list[Rejection] = []
    for rule in rules:
        if rule.exclusive(ctx):
            for name in rule.instructions(ctx):
                res = rule.lower(ctx, name)
                if isinstance(res, str):
                    return Rejection.of(res)
                return [CopyChoice(rule.family, name, res.instruction, res)]
    for rule in rules:
        found = 0
        for name in rule.instructions(ctx):
            if per_rule is not None and found >= per_rule:
                break
            res = rule.lower(ctx, name)
            if isinstance(res, str):
                tried.append(Rejection.of(res).tried(name))
                continue
            out.append(CopyChoice(rule.family, name, res.instruction, res))
            found += 1
            if limit is not None and len(out) >= limit:
                return out
    if out:
        return out
    src, dst = ctx.names
    return Rejection(f"no instruction can copy %{src} into %{dst}", alternatives=tuple(tried))


def lower_choice(ctx: CopyContext, family: str, name: str, *,
                 rules: CopyRules | None = None) -> list[CopyChoice] | Rejection:
    """Lower the copy with the instruction ``name`` of the rule ``family`` that synthesis chose
    (no search): ``[choice]``, or the ``Rejection`` if it is not legal here."""
    for rule in rules if rules is not None else COPY_RULES:
        if rule.family == family:
            res = rule.lower(ctx, name)
            if isinstance(res, str):
                return Rejection.of(res).tried(name)
            return [CopyChoice(family, name, res.instruction, res)]
    return Rejection(f"no copy rule of family {family!r} is registered", instruction=name)


def copy_context(src: Any, dst: Any, tid: Var | ExprLike, threads: int, elem_bits: int, arch: Any,
                 **kw: Any) -> CopyContext:
    """A ``CopyContext`` (keyword arguments as its fields)."""
    return CopyContext(src, dst, tid, threads, elem_bits, arch, **kw)
