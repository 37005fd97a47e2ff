"""Which executions of an ``mma`` op may still be in flight (MMAs issued, not known to be
complete) at a point of a kernel: the flow that sizes the ring of a register A operand of
``tcgen05.mma`` (its TMEM column sets or its shared buffers, ``ir.lower.umma``) and decides which
A operands may share TMEM columns.

An *execution* of a tracked op starts when the op runs. The flow carries, per tracked op, the
executions that may be in flight, latest first, each as ``(commits, marks)``: the
``wgmma_commit``\\ s since it, and the barriers the tensor cores arrived on since it:

* ``wgmma_commit`` adds one commit to each execution; ``wgmma_wait(n)`` retires those with more
  than ``n`` commits (at most ``n`` commit groups still run: every older one completed);
* ``hl.arrive(bar, i, who="mma")`` (a ``tcgen05.commit`` onto ``bar[i]``: the phase completes once
  every MMA issued before it completed) marks each execution with the barrier ``bar[i]``;
  ``hl.wait(bar, i, phase)`` retires the executions marked with ``bar[i]``. The wait is taken to be
  for the latest arrival onto ``bar[i]`` before it (the phase that arrival completes, as
  ``hl.wait_stage_free`` and the MoE pipelines wait); a wait for an earlier phase retires fewer
  executions than counted here, which the emulator and the PTX executor report (an A rewritten
  under the MMA that reads it). The index is a constant, or ``(v + c) % S`` with ``v`` the
  variable of an enclosing loop (``c``, ``S`` constants: a ring of barriers, as ``hl.pipeline``'s
  ``mma_release`` stages): the mark is then kept relative to ``v`` - residue ``c mod S`` - and
  each back edge of that loop (``v`` grows by its step) moves it to ``c - step mod S``, so a wait
  at ``(v + c') % S`` retires what an arrival ``(c - c') mod S`` iterations back marked (plus
  whole turns). Marks relative to a loop's variable are dropped when the loop ends. An arrive or a
  wait at any other index marks or retires nothing (no static pairing of the two);
* a loop: the least fixpoint of its entry joined with its back edge (a loop may run zero times);
  a branch: its paths joined (a branch of some warp groups with the path of the others, which
  skip it). The join keeps, per position (``i``-th latest execution), the fewer commits and the
  marks both paths have, and the longer list.

Counts saturate: an op's list holds at most ``MAX_RING`` executions (a longer one: unboundedly
many may be in flight), an execution's commits at the largest ``n`` of the kernel's
``wgmma_wait(n)`` plus one (every wait retires it alike from there).

``in_flight(ops, tracked, cap)`` runs the flow over a block and returns, per tracked op, the
states reaching each of its executions (``ring_depths``: one more than the most executions of the
op in flight at its start; ``conflicts``: ops in flight at another's start).

Example:
    >>> import hexlayout.lang as hl
    >>> M, K = hl.dims("M K")
    >>> @hl.kernel(threads=128, name="doc_ring")
    ... def k(a: hl.f16[M, K], c: hl.f32[M, M]):
    ...     sb = hl.shared(hl.f16, (16, 32))
    ...     acc = hl.zeros((64, 16), hl.f32)
    ...     for kt in hl.range(4):
    ...         w = hl.register(hl.f16, (64, 32))
    ...         hl.copy(a.tile((64, 32), (0, kt * 32)), w)
    ...         hl.mma(w, sb, acc)
    ...         hl.wgmma_commit()
    ...         hl.wgmma_wait(1)
    >>> from hexlayout.ir.tile import Mma
    >>> tk = k.trace()
    >>> list(ring_depths(tk.body.ops, lambda o: isinstance(o, Mma), commit_cap(tk.body)).values())
    [2]
"""

from __future__ import annotations

from collections.abc import Callable

from .expr import BinOp, Const, Var, const_value, is_const
from .tile import Block, For, If, MbarrierArrive, MbarrierWait, Op, WgmmaCommit, WgmmaWait

__all__ = ["Execution", "InFlight", "MAX_RING", "commit_cap", "in_flight", "ring_depths", "conflicts"]

#: one execution in flight: (commits since it, the barriers the MMAs arrived on since: ``_key``)
Execution = tuple[int, frozenset[tuple[int, ...]]]
#: per tracked op uid: its executions that may be in flight, latest first (absent: none)
InFlight = dict[int, tuple[Execution, ...]]
#: executions of one op in flight the flow counts (a ring holds at most this many)
MAX_RING = 8
_MAX_COMMITS = 64


def commit_cap(body: Block) -> int:
    """Commits past which an execution's count need not grow: one more than the largest ``n`` of
    the ``wgmma_wait(n)`` in ``body`` (every wait retires it alike from there)."""
    waits = [int(o.pending) for o in body.walk() if isinstance(o, WgmmaWait)]
    return min(_MAX_COMMITS, max(waits, default=0) + 1)


def _key(bar: object, index: object) -> tuple[int, ...] | None:
    """The mark of the barrier ``bar[index]``: ``(bar, index)`` at a constant index, ``(bar, v, S,
    c % S)`` at ``(v + c) % S`` (module docstring); None: an index the flow does not pair."""
    if is_const(index):
        return (id(bar), const_value(index))
    if not (isinstance(index, BinOp) and index.op == "%" and isinstance(index.b, Const)
            and index.b.value > 0):
        return None
    ring, x = index.b.value, index.a
    if isinstance(x, Var):
        return (id(bar), id(x), ring, 0)
    if isinstance(x, BinOp) and x.op in ("+", "-"):
        v, c = (x.a, x.b) if isinstance(x.a, Var) else (x.b, x.a)
        if isinstance(v, Var) and isinstance(c, Const) and (x.op == "+" or v is x.a):
            return (id(bar), id(v), ring, (c.value if x.op == "+" else -c.value) % ring)
    return None


def _next_iteration(f: InFlight, loop: For) -> InFlight:
    """The marks after the back edge of ``loop``: those relative to its variable move by its step
    (the same barrier is ``step`` fewer than the variable's new value)."""
    var = id(loop.var)

    def move(k: tuple[int, ...]) -> tuple[int, ...]:
        return (*k[:3], (k[3] - loop.step) % k[2]) if len(k) == 4 and k[1] == var else k

    return {u: tuple((c, frozenset(move(k) for k in m)) for c, m in es) for u, es in f.items()}


def _after_loop(f: InFlight, loop: For) -> InFlight:
    """The marks after ``loop``: those relative to its variable dropped (fewer retire later)."""
    var = id(loop.var)
    return {u: tuple((c, frozenset(k for k in m if not (len(k) == 4 and k[1] == var))) for c, m in es)
            for u, es in f.items()}


def _join(a: InFlight, b: InFlight) -> InFlight:
    """Either path's executions: per op the longer list, per position the fewer commits and the
    marks both paths have."""
    out = dict(a)
    for u, c in b.items():
        x = out.get(u, ())
        both = tuple((min(p[0], q[0]), p[1] & q[1]) for p, q in zip(x, c))
        out[u] = both + (x[len(c):] if len(x) > len(c) else c[len(x):])
    return out


def _flow(ops: list[Op], f: InFlight, record: dict[int, list[InFlight]] | None,
          tracked: Callable[[Op], bool], cap: int) -> InFlight:
    for o in ops:
        f = _flow_op(o, f, record, tracked, cap)
    return f


def _flow_op(op: Op, f: InFlight, record: dict[int, list[InFlight]] | None,
             tracked: Callable[[Op], bool], cap: int) -> InFlight:
    """The flow after ``op`` (module docstring); ``record``: each tracked op's state at its start."""
    if tracked(op):
        if record is not None:
            record.setdefault(op.uid, []).append(dict(f))
        return {**f, op.uid: (((0, frozenset()),) + f.get(op.uid, ()))[:MAX_RING]}
    if isinstance(op, WgmmaCommit):
        return {u: tuple((min(c + 1, cap), m) for c, m in es) for u, es in f.items()}
    if isinstance(op, WgmmaWait):
        kept = {u: tuple(e for e in es if e[0] <= int(op.pending)) for u, es in f.items()}
        return {u: es for u, es in kept.items() if es}
    if isinstance(op, MbarrierArrive) and op.who == "mma":
        key = _key(op.bar, op.index)
        if key is None:
            return f
        return {u: tuple((c, m | {key}) for c, m in es) for u, es in f.items()}
    if isinstance(op, MbarrierWait):
        key = _key(op.bar, op.index)
        if key is None:
            return f
        kept = {u: tuple(e for e in es if key not in e[1]) for u, es in f.items()}
        return {u: es for u, es in kept.items() if es}
    if isinstance(op, For):
        top = f
        for _ in range(4 * _MAX_COMMITS):
            nxt = _join(f, _next_iteration(_flow(op.body.ops, top, None, tracked, cap), op))
            if nxt == top:
                break
            top = nxt
        else:
            raise ValueError("the in-flight flow of a loop did not converge")
        return _after_loop(_join(f, _flow(op.body.ops, top, record, tracked, cap)), op)
    if isinstance(op, If):
        out = _flow(op.then_body.ops, f, record, tracked, cap)
        other = _flow(op.else_body.ops, f, record, tracked, cap) if op.else_body is not None else f
        return _join(out, other)
    return f


def in_flight(ops: list[Op], tracked: Callable[[Op], bool], cap: int) -> dict[int, list[InFlight]]:
    """Per tracked op uid (in program order): the flow's state at each place it runs."""
    record: dict[int, list[InFlight]] = {}
    _flow(ops, {}, record, tracked, cap)
    return record


def ring_depths(ops: list[Op], tracked: Callable[[Op], bool], cap: int,
                record: dict[int, list[InFlight]] | None = None) -> dict[int, int]:
    """Per tracked op uid: ``R`` = one more than the most of its own executions that may be in
    flight where it runs (``R > MAX_RING``: unboundedly many)."""
    rec = in_flight(ops, tracked, cap) if record is None else record
    return {u: 1 + max(len(st.get(u, ())) for st in states) for u, states in rec.items()}


def conflicts(record: dict[int, list[InFlight]], x: int, y: int) -> bool:
    """Whether op ``x`` runs while an execution of ``y`` may be in flight, or the reverse."""
    return any(y in st for st in record[x]) or any(x in st for st in record[y])
