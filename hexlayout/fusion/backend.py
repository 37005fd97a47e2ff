"""``torch.compile(model, backend="hexlayout")``: the graph front end of the fusion layer.

Found by torch through the ``torch_dynamo_backends`` entry point, which names the kernels
layer's ``hexlayout.ops.compile_backend:hexlayout_backend`` (it registers the anchor kernels
with ``fusion.anchors`` and calls this function), so ``torch.compile(..., backend="hexlayout")``
works without importing hexlayout first and this layer never imports the one above it.

``hexlayout_backend(gm, example_inputs, options=None, mode=None)``:

1. a graph that needs gradients (grad mode on and an input - a parameter included - that
   requires grad) goes to torch whole: hexlayout fuses for inference only (its plan lists
   every op with that reason: aten names with ``"eager"``, dynamo's with inductor, which
   traces the graph itself);
2. otherwise ``aot_autograd`` turns dynamo's graph into its aten inference graph (the op
   names ``explain`` reports; the anchor records' ``decompositions`` first - a softmax over
   rows the row reductions fuse becomes two reduction kernels and the math between them),
   ``partition`` groups every
   anchor with its prologues and epilogues, and each group becomes one call of
   ``torch.ops.hexlayout.fused_kernel`` (the fused hexlayout kernel; the group's own aten
   ops in torch when the mechanism cannot fuse it, with the reason);
3. the rest of the graph is torch's: compiled by inductor (default) or run eagerly with
   ``options={"fallback": "eager"}``.

Options (``torch.compile(..., options={...})``): ``"fallback"``: ``"inductor"`` (default) or
``"eager"``; ``"on_plan"``: a callable given the ``GraphPlan`` of each compiled graph
(``explain`` uses it); ``"report"``: ``True`` prints the plan of each compiled graph to stderr
(``FusionPlan.report``: the kernels with their prologues and epilogues, the ops left to torch
grouped by reason, each reason once with its count) after the graph's first run, so it states
what ran: a group the mechanism refuses only when it runs (a dtype the anchor does not take -
an f32 GEMM after ``w.to(x.dtype)`` of an f32 ``x`` -, CPU tensors without
``HEXLAYOUT_EMULATE=1``) is listed as its ops left to torch with the mechanism's reason, not
as a fused kernel; a later run that changes what runs (a kernel refuses new arguments, or
runs after a refusal: ``HEXLAYOUT_EMULATE=1`` set later) prints the plan again. The
environment variable ``HEXLAYOUT_FUSION_REPORT=1`` turns it on for every compile (``0`` or
unset: off; the option wins over the variable). A group whose kernel fails to
build runs in torch with a ``FusionWarning``. Sizes that dynamo marks dynamic stay
symbolic in the specs, so one kernel serves every size.
"""

from __future__ import annotations

import itertools
import operator
import os
import sys
from collections.abc import Callable
from typing import Any

from hexlayout.errors import HexlayoutError

from .fused_op import FusedKernel, fused_kernel_op, register_kernel
from .partition import Partition, op_name, partition
from .plan import Fallback, GraphPlan

__all__ = ["hexlayout_backend", "BackendOptionError", "FALLBACKS", "GRAD_REASON", "REPORT_ENV"]

#: Where the ops hexlayout does not fuse run.
FALLBACKS = ("inductor", "eager")
GRAD_REASON = ("the graph needs gradients (grad mode is on and an input or parameter requires grad); "
               "hexlayout fuses for inference only")
#: the environment variable that turns ``options={"report": True}`` on for every compile
REPORT_ENV = "HEXLAYOUT_FUSION_REPORT"
_GRAPHS = itertools.count(1)


class BackendOptionError(HexlayoutError, ValueError):
    """An option of ``torch.compile(..., backend="hexlayout", options=...)`` is not valid."""


def _report_default() -> bool:
    v = os.environ.get(REPORT_ENV, "").strip()
    if v in ("", "0"):
        return False
    if v == "1":
        return True
    raise BackendOptionError(f"hexlayout backend: {REPORT_ENV}={v!r} must be '1' (print each compiled "
                             "graph's fusion plan) or '0'")


def _print_plan(plan: GraphPlan, title: str) -> None:
    print(plan.resolve().report(title), file=sys.stderr, flush=True)


def _reporting(on_plan: Callable[[GraphPlan], Any] | None) -> Callable[[GraphPlan], Any]:
    """``on_plan`` that also prints the plan of a graph that runs no fused kernel (every op
    left to torch: known when it is compiled) to stderr, once."""
    def report(plan: GraphPlan) -> None:
        _print_plan(plan, f"hexlayout fusion plan of compiled graph {next(_GRAPHS)}")
        if on_plan is not None:
            on_plan(plan)
    return report


def _ran(plan: GraphPlan) -> tuple[str | None, ...]:
    """Why each of the plan's fused kernels ran in torch on its latest call (None: fused)."""
    return tuple(k.fallback_reason() for k in plan.kernels)


def reported(compiled: Callable[..., Any], plan: GraphPlan) -> Callable[..., Any]:
    """``compiled`` (a graph's compiled forward) that prints ``plan`` as it ran
    (``GraphPlan.resolve``: a kernel refused at run time is listed as its ops left to torch)
    after its first call, and again after a call that changed what ran (a kernel refused
    new arguments, or runs again: ``HEXLAYOUT_EMULATE=1`` set after a refusal without it).

    The plan cannot be printed when the graph is compiled: whether the mechanism takes a
    group (its dtypes, the device, ``HEXLAYOUT_EMULATE``) is decided when it first runs."""
    title = f"hexlayout fusion plan of compiled graph {next(_GRAPHS)}"
    seen: list[tuple] = []                 # what ran when the plan was last printed

    def run(*args: Any) -> Any:
        out = compiled(*args)
        ran = _ran(plan)
        if not seen or seen[-1] != ran:
            _print_plan(plan, title if not seen else f"{title} (what runs changed)")
            seen.append(ran)
        return out
    if getattr(compiled, "_boxed_call", False):   # aot_autograd's boxed calling convention
        run._boxed_call = True  # type: ignore[attr-defined]
    return run


def _options(options: dict[str, Any] | None) -> tuple[str, Callable[[GraphPlan], Any] | None, bool]:
    options = dict(options or {})
    fallback = options.pop("fallback", "inductor")
    on_plan = options.pop("on_plan", None)
    report = options.pop("report", None)
    if options:
        raise BackendOptionError(f"hexlayout backend: unknown option(s) {', '.join(map(repr, options))}; "
                                 "options: 'fallback' ('inductor' or 'eager'), 'on_plan' (a callable), "
                                 "'report' (a bool)")
    if report is not None and not isinstance(report, bool):
        raise BackendOptionError(f"hexlayout backend: option 'report' must be True or False, not {report!r}")
    if fallback not in FALLBACKS:
        raise BackendOptionError(f"hexlayout backend: option 'fallback' must be 'inductor' or 'eager', "
                                 f"not {fallback!r}")
    if on_plan is not None and not callable(on_plan):
        raise BackendOptionError(f"hexlayout backend: option 'on_plan' must be callable, not {on_plan!r}")
    return fallback, on_plan, report if report is not None else _report_default()


def _needs_grad(example_inputs: list[Any]) -> bool:
    import torch

    return torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                           for t in example_inputs)


def _torch_compiler(fallback: str, mode: str | None) -> Callable[[Any, list[Any]], Any]:
    """Compile an aten graph (inside aot_autograd) with torch's ``fallback``."""
    if fallback == "eager":
        return lambda gm, inputs: gm
    from torch._inductor import list_mode_options
    from torch._inductor.compile_fx import compile_fx_inner

    patches = list_mode_options(mode) if mode else {}

    def inductor(gm: Any, inputs: list[Any]) -> Any:
        import contextlib

        import torch
        from torch._guards import detect_fake_mode
        from torch._inductor.decomposition import select_decomp_table
        from torch.fx.experimental.proxy_tensor import make_fx

        # inductor lowers its own decompositions of what is left (after the partition, so
        # the fused groups were found on the plain aten graph)
        fake = detect_fake_mode(inputs)
        with fake if fake is not None else contextlib.nullcontext():
            decomposed = make_fx(gm, decomposition_table=select_decomp_table())(*inputs)
        with torch._inductor.config.patch(patches):
            return compile_fx_inner(decomposed, inputs)
    return inductor


def rewrite(gm: Any, part: Partition) -> list[FusedKernel]:
    """Replace each group of ``part`` in ``gm`` by a ``hexlayout.fused_kernel`` call (and
    ``getitem`` s for its outputs); return the registered kernels."""
    from torch.fx.passes.tools_common import legalize_graph

    op = fused_kernel_op()
    graph = gm.graph
    kernels = []
    replaced: dict[Any, Any] = {}          # an erased group output -> the getitem that replaced it
    shared = {n for i, g in enumerate(part.groups) for n in g.nodes
              if any(n in h.nodes for h in part.groups[i + 1:])}   # a norm several kernels recompute
    for g in part.groups:
        k = FusedKernel(g)
        key = register_kernel(k)
        kernels.append(k)
        members = set(g.nodes)
        with graph.inserting_after(g.nodes[-1]):
            inputs = [replaced.get(a, a) for a in g.inputs]
            call = graph.call_function(op, (key, inputs[:g.n_tensors], inputs[g.n_tensors:]))
        vals = []
        last = call
        for i, out in enumerate(g.outputs):
            with graph.inserting_after(last):
                item = graph.call_function(operator.getitem, (call, i))
            v = out.meta.get("val")
            if v is not None:
                v = v.contiguous()
                item.meta["val"] = v
            vals.append(v)
            out.replace_all_uses_with(item, delete_user_cb=lambda user, m=members: user not in m)
            replaced[out] = item
            last = item
        call.meta["val"] = vals
        for n in reversed(g.nodes):
            if n.users and n in shared:
                continue                   # still read by another kernel's copy of it: erased with that one
            graph.erase_node(n)
    legalize_graph(gm)                     # (a new graph: the groups' calls in dependency order)
    gm.graph.lint()
    gm.recompile()
    return kernels


def _aten_fallbacks(reason: str, on_plan: Callable[[GraphPlan], Any] | None) -> Callable[..., Any]:
    def record(gm: Any, inputs: list[Any]) -> Any:
        if on_plan is not None:
            on_plan(GraphPlan([], [Fallback(op_name(n.target), reason) for n in gm.graph.nodes
                                   if n.op == "call_function" and op_name(n.target) != "getitem"]))
        return gm
    return record


def _decompositions() -> dict[Any, Any]:
    """The aten decompositions the registered anchor records ask for (``decompositions``:
    the softmax the row reductions fuse, ...), applied before the partition."""
    from .anchors import anchor_records

    out: dict[Any, Any] = {}
    for record in anchor_records():
        if record.decompositions is not None:
            out.update(record.decompositions())
    return out


def hexlayout_backend(gm: Any, example_inputs: list[Any], options: dict[str, Any] | None = None,
                      mode: str | None = None) -> Any:
    """The ``torch.compile`` backend (see the module docstring): fused hexlayout kernels
    for the anchors of ``gm`` and their prologues / epilogues, torch for the rest."""
    from torch._functorch.aot_autograd import aot_module_simplified

    fallback, on_plan, report = _options(options)
    if _needs_grad(example_inputs):
        if report:
            on_plan = _reporting(on_plan)
        if fallback == "inductor":
            from torch._inductor.compile_fx import compile_fx

            if on_plan is not None:
                on_plan(GraphPlan([], [Fallback(op_name(n.target), GRAD_REASON) for n in gm.graph.nodes
                                       if n.op in ("call_function", "call_method", "call_module")]))
            return compile_fx(gm, example_inputs)
        record = _aten_fallbacks(GRAD_REASON, on_plan)
        return aot_module_simplified(gm, example_inputs, fw_compiler=record,
                                     bw_compiler=lambda g, _: g)
    inner = _torch_compiler(fallback, mode)

    def forward_compiler(aten_gm: Any, inputs: list[Any]) -> Any:
        part = partition(aten_gm)
        plan = GraphPlan([], [Fallback(op_name(n.target), why) for n, why in part.fallbacks],
                         list(part.notes))
        if part.groups:
            plan.kernels = rewrite(aten_gm, part)
        if on_plan is not None:
            on_plan(plan)
        compiled = inner(aten_gm, inputs)
        return reported(compiled, plan) if report else compiled

    return aot_module_simplified(gm, example_inputs, fw_compiler=forward_compiler,
                                 decompositions=_decompositions())
