"""What a ``FusedSpec`` means: its nodes run as the aten ops they name.

``reference(spec, anchor_args, extra_inputs)`` computes the spec with torch (eager tensors,
or meta tensors for shapes and dtypes): prologues give their operands, the anchor runs,
then the epilogue; it returns the outputs in ``spec.epilogue.outputs`` order. A ``dtype``
keyword or constant given by name (``"f16"``) is the torch dtype.
"""

from __future__ import annotations

from typing import Any

from .spec import FusedSpec, Node

__all__ = ["reference", "aten_op", "eval_nodes"]


def aten_op(op: str) -> Any:
    """The torch op an aten name as FX prints it denotes (``aten.add.Tensor``)."""
    import torch

    parts = op.split(".")
    if parts[0] == "hexlayout":
        from .rope import ROPE, rope_op

        if op == ROPE:
            return rope_op()
    ns = torch.ops.prims if parts[0] == "prims" else torch.ops.aten
    return getattr(getattr(ns, parts[1]), parts[2] if len(parts) > 2 else "default")


def _value(ref: tuple, env: list, anchor: Any, inputs: list) -> Any:
    kind = ref[0]
    if kind == "anchor":
        return anchor
    if kind == "node":
        return env[ref[1]]
    if kind == "input":
        return inputs[ref[1]]
    v = ref[1]
    if isinstance(v, str):
        try:
            from .aten import torch_dtype

            return torch_dtype(v)
        except (KeyError, ValueError):
            return v
    return v


def eval_nodes(nodes: tuple[Node, ...], anchor: Any, inputs: list) -> list:
    """Each node's value, with ``anchor`` and ``inputs`` for the anchor / input refs."""
    env: list = []
    for n in nodes:
        args = [_value(a, env, anchor, inputs) if isinstance(a, tuple) and a and a[0] in
                ("anchor", "node", "input", "const") else a for a in n.args]
        kw = {k: (_value(("const", v), env, anchor, inputs) if k == "dtype" else v) for k, v in n.kwargs}
        env.append(aten_op(n.op)(*args, **kw))
    return env


def reference(spec: FusedSpec, anchor_args: list[Any], extra_inputs: list[Any]) -> list[Any]:
    """What ``spec`` computes, with torch's aten ops (eager; meta tensors give shapes/dtypes)."""
    args = list(anchor_args)
    for p in spec.prologues:
        args[p.operand] = eval_nodes(p.nodes, None, extra_inputs)[p.output]
    kwargs = dict(spec.anchor_kwargs)
    from .anchors import record_of_op

    record = record_of_op(spec.anchor)
    if record is not None and record.eager is not None:     # the anchor's own eager meaning
        y = record.eager(spec.anchor, args, kwargs)
    else:
        y = aten_op(spec.anchor)(*args, **kwargs)
    if isinstance(y, tuple):                   # an anchor whose result is a tuple: its output first
        y = y[0]
    env = eval_nodes(spec.epilogue.nodes, y, extra_inputs)
    return [y if o[0] == "anchor" else env[o[1]] for o in spec.epilogue.outputs]
