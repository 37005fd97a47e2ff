"""RoPE into the QKV GEMM's epilogue: a graph pass before partitioning (the GEMM record's
``prepare``) that finds rotary position embeddings applied to head views of a projection's
product and rewrites them into one ``hexlayout::rope`` of the product
(``hexlayout.fusion.rope``), which the GEMM computes in its epilogue.

A **site** is ``t * C + rot(t) * S`` (the products in either order) where

- ``t`` is a view of a column range of a 2-D ``mm`` / ``addmm`` product ``Y[M, N]`` into
  heads of ``D`` columns (``split`` / ``chunk`` / slicing, then ``view(..., H, D)`` and
  ``transpose`` / ``permute``, as HF writes it): ``t[..., d]`` is ``Y[row, c0 + h*D + d]``;
- ``rot(t)`` is rotate-half ``cat(-t[..., D/2:], t[..., :D/2])`` or interleaved
  ``stack(-t[..., 1::2], t[..., ::2], -1).flatten(-2)``;
- ``C`` and ``S`` are tables of ``D`` columns broadcast over the heads: views (``unsqueeze``,
  ``[:, :, None]``) and a cast to ``Y``'s dtype of either ``cache[position_ids]`` (a
  ``[max_pos, D]`` cache gathered by ids, one per row of ``Y``) or a tensor whose rows are
  those of ``Y`` (``[B, S, D]`` already gathered) or repeat every ``T`` rows (``[S, D]``
  shared by the batch).

The pass reads the views' strides on meta tensors: row ``r`` of ``Y`` must take table row
``r mod T`` and column ``d`` at every element of ``t``. The sites of one product must
rotate the columns ``[0, R)`` together (q and k first, v after), with one form and one
pair of tables, and nothing else may read the unrotated columns. Then
``Y' = rope(Y, cos, sin, ids, D, R, interleaved)`` replaces ``Y`` for every reader (v's
columns are ``Y``'s) and each site becomes its ``t`` read from ``Y'``: the q / k / v parts
are views of the one stored output. Where a site does not fit, the plan's notes say why
(``rope: left to torch ...``) and its ops stay in torch.
"""

from __future__ import annotations

import contextlib
from typing import Any

from .fusion_plan import rope_unsupported

__all__ = ["fuse_rope"]

_PRODUCTS = ("aten.mm.default", "aten.addmm.default")
#: ops whose result is a view of their first argument (walked from a product to its head views)
_VIEWS = frozenset({"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
                    "aten.permute.default", "aten.transpose.int", "aten.t.default", "aten.unsqueeze.default",
                    "aten.squeeze.dim", "aten.squeeze.default", "aten.expand.default", "aten.slice.Tensor",
                    "aten.split.Tensor", "aten.split_with_sizes.default", "aten.unbind.int",
                    "aten.select.int", "aten.alias.default", "getitem"})
_CASTS = ("aten._to_copy.default", "prims.convert_element_type.default", "aten.to.dtype")
_BIG = 2 ** 62


class _NoRope(Exception):
    """Why the sites of a product are not fused (a plan note)."""


def _op(n: Any) -> str:
    from hexlayout.fusion.partition import op_name

    return op_name(n.target) if getattr(n, "op", None) == "call_function" else getattr(n, "op", "")


def _val(n: Any) -> Any:
    return n.meta.get("val") if hasattr(n, "meta") else None


def _hint(x: Any) -> Any:
    """A size as an int (a symbolic size by its example value)."""
    import torch

    if isinstance(x, torch.SymInt):
        return int(x.node.hint) if x.node.hint is not None else int(x.node.maybe_as_int())
    if isinstance(x, (list, tuple)):
        return type(x)(_hint(a) for a in x)
    return x


def _shape(n: Any) -> tuple[int, ...]:
    return tuple(_hint(s) for s in _val(n).shape)


def _slice_args(n: Any) -> tuple[int, int, int, int] | None:
    """``(dim, start, end, step)`` of a ``slice.Tensor`` node (defaults filled in)."""
    if _op(n) != "aten.slice.Tensor":
        return None
    a = list(n.args[1:]) + [None] * 4
    dim, start, end, step = (a[0] if a[0] is not None else 0), a[1] or 0, a[2], a[3] or 1
    rank = len(_val(n.args[0]).shape)
    return dim % rank, _hint(start), _BIG if end is None else _hint(end), _hint(step)


def _last_slice(n: Any, start: int, stop_at_least: int | None, step: int, stop: int | None = None) -> Any:
    """``x`` when ``n`` is ``x[..., start:end:step]`` over the last dimension (``end`` as
    given, or ``>= stop_at_least``), else None."""
    s = _slice_args(n)
    if s is None:
        return None
    x = n.args[0]
    rank = len(_val(x).shape)
    dim, st, end, sp = s
    if dim != rank - 1 or st != start or sp != step:
        return None
    if stop is not None and end != stop:
        return None
    if stop_at_least is not None and end < stop_at_least:
        return None
    return x


def _rotated(r: Any) -> tuple[Any, bool] | None:
    """``(t, interleaved)`` when ``r`` is ``rot(t)`` in one of the two forms."""
    op = _op(r)
    if op == "aten.cat.default":                        # rotate-half: cat(-t[.., h:], t[.., :h], -1)
        parts = r.args[0]
        dim = r.args[1] if len(r.args) > 1 else 0
        if len(parts) != 2 or _op(parts[0]) != "aten.neg.default" or dim % len(_val(r).shape) != \
                len(_val(r).shape) - 1:
            return None
        x2 = parts[0].args[0]
        hd = _shape(r)[-1]
        t = _last_slice(x2, hd // 2, hd, 1)
        if t is None or _last_slice(parts[1], 0, None, 1, hd // 2) is not t or _shape(t)[-1] != hd:
            return None
        return t, False
    if op in ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default"):
        st = r.args[0]                                  # interleaved: stack(-t[.., 1::2], t[.., ::2], -1)
        if _op(st) != "aten.stack.default":
            return None
        parts = st.args[0]
        dim = st.args[1] if len(st.args) > 1 else 0
        if len(parts) != 2 or _op(parts[0]) != "aten.neg.default" or dim % len(_val(st).shape) != \
                len(_val(st).shape) - 1:
            return None
        hd = _shape(r)[-1]
        t = _last_slice(parts[0].args[0], 1, hd, 2)
        if t is None or _last_slice(parts[1], 0, hd, 2) is not t or _shape(t) != _shape(r):
            return None
        return t, True
    return None


def _site(add: Any) -> tuple[Any, Any, Any, bool, list] | None:
    """``(t, C, S, interleaved, nodes)`` when ``add`` is ``t * C + rot(t) * S``."""
    if _op(add) != "aten.add.Tensor" or len(add.args) != 2 or add.kwargs:
        return None
    m1, m2 = add.args
    if _op(m1) != "aten.mul.Tensor" or _op(m2) != "aten.mul.Tensor":
        return None
    for a, b in ((m1, m2), (m2, m1)):
        for r, s in (b.args, b.args[::-1]):
            found = _rotated(r) if hasattr(r, "op") else None
            if found is None:
                continue
            t, inter = found
            for x, c in (a.args, a.args[::-1]):
                if x is t and hasattr(c, "op") and hasattr(s, "op"):
                    nodes = [add, a, b, r, *r.all_input_nodes]
                    if inter:
                        nodes += [*r.args[0].all_input_nodes, *(p for q in r.args[0].all_input_nodes
                                                                for p in q.all_input_nodes)]
                    else:
                        nodes += [p for q in r.all_input_nodes for p in q.all_input_nodes]
                    return t, c, s, inter, [n for n in nodes if n is not t]
    return None


def _product(t: Any) -> tuple[Any, list] | None:
    """The ``mm`` / ``addmm`` product ``t`` is a view of, and the view nodes from it to ``t``."""
    chain = []
    n = t
    while _op(n) in _VIEWS:
        chain.insert(0, n)
        n = n.args[0]
    if _op(n) not in _PRODUCTS or len(_val(n).shape) != 2:
        return None
    return n, chain


def _replay(chain: list, x: Any) -> Any:
    """The views ``chain`` (fx nodes, the first reading the chain's source) applied to ``x``
    (a meta tensor), symbolic sizes at their example values."""
    import operator

    from torch.fx.node import map_arg

    env: dict = {}
    src = chain[0].args[0] if chain else None
    for n in chain:
        def arg(a: Any) -> Any:
            if a is src and a not in env:
                return x
            return env[a] if a in env else _hint(_val(a))     # a symbolic size: its example value

        args = map_arg(n.args, arg)
        kwargs = map_arg(n.kwargs, arg)
        args = tuple(_hint(a) if not hasattr(a, "shape") else a for a in args)
        env[n] = operator.getitem(*args) if n.target is operator.getitem else n.target(*args, **kwargs)
    return env[chain[-1]] if chain else x


def _table(c: Any, dtype: Any, hd: int) -> tuple[Any, Any, list]:
    """The source of a table operand ``c``: ``(tensor node, position ids node | None, the view
    nodes from the gathered table to c)``; the casts on the way must be to ``dtype``."""
    views: list = []
    n = c
    while True:
        op = _op(n)
        if op in _CASTS:
            if _val(n).dtype != dtype:
                raise _NoRope(f"a table cast to {_val(n).dtype}, not the projection's {dtype}")
            n = n.args[0]
        elif op in _VIEWS - {"aten.slice.Tensor", "getitem", "aten.split.Tensor",
                             "aten.split_with_sizes.default", "aten.unbind.int", "aten.select.int"}:
            views.insert(0, n)
            n = n.args[0]
        else:
            break
    if _op(n) == "aten.index.Tensor" and len(n.args[1]) == 1 and n.args[1][0] is not None and \
            len(_val(n.args[0]).shape) == 2 and _shape(n.args[0])[-1] == hd:
        ids = n.args[1][0]
        if _val(ids).dtype.is_floating_point or _val(ids).dtype.is_complex:
            raise _NoRope("position ids that are not integers")
        return n.args[0], ids, views
    if _shape(n)[-1] != hd:
        raise _NoRope(f"a table of shape {list(_shape(n))}, not rows of the head size {hd}")
    return n, None, views


def _check(t: Any, c_meta: Any, m: int, n_cols: int, hd: int, rows: int, where: str) -> tuple[int, int]:
    """The column range ``[c0, c1)`` ``t`` (a meta view of ``Y[m, n_cols]``) covers, after
    checking that its element ``[..., d]`` is ``Y[r, c0 + h*hd + d]`` and the table ``c_meta``
    (broadcast to ``t``) gives it table row ``r mod rows``, column ``d``."""
    if t.shape[-1] != hd or t.stride(-1) != 1 or c_meta.stride(-1) != 1:
        raise _NoRope(f"{where}: the last dimension is not one head of {hd} contiguous columns")
    off = t.storage_offset()
    c0 = off % n_cols
    if off >= n_cols or c0 % hd or c_meta.storage_offset():
        raise _NoRope(f"{where}: the heads do not start at a head boundary of row 0")
    heads, reach = 1, 0
    for size, ts, cs in zip(t.shape[:-1], t.stride()[:-1], c_meta.stride()[:-1]):
        if size == 1:
            continue
        if ts % n_cols == 0 and ts:                  # a row dimension
            if cs * n_cols == ts * hd:
                reach += (size - 1) * ts // n_cols
            elif not (cs == 0 and (ts // n_cols) % rows == 0):
                raise _NoRope(f"{where}: a row of the product does not take its row of the tables")
        elif ts == hd and cs == 0 and heads == 1:
            heads = size                                # the head dimension (tables broadcast)
        else:
            raise _NoRope(f"{where}: not a view of whole heads of the product with tables broadcast "
                          "over the heads")
    if reach >= rows:
        raise _NoRope(f"{where}: the tables have {rows} rows, the product's rows reach {reach + 1}")
    return c0, c0 + heads * hd


def _columns(v: Any, n_cols: int) -> tuple[int, int]:
    """The columns ``[lo, hi)`` a meta view ``v`` of ``Y[:, n_cols]`` reads (a hull)."""
    lo = v.storage_offset() % n_cols
    span = sum((s - 1) * st for s, st in zip(v.shape, v.stride()) if s > 1 and st % n_cols)
    return lo, min(n_cols, lo + span + 1)


def _readers(p: Any, stop: set) -> list:
    """The view nodes reachable from ``p`` through views (not past those in ``stop``), and ``p``."""
    out, work = [p], [p]
    while work:
        n = work.pop()
        if n in stop:
            continue
        for u in n.users:
            if _op(u) in _VIEWS and u.args[0] is n and u not in out:
                out.append(u)
                work.append(u)
    return out


def fuse_rope(gm: Any) -> list[str]:
    """Rewrite the RoPE sites of each projection in ``gm`` into ``hexlayout::rope`` of its
    product (module docstring); the notes say which, and why any was left to torch."""
    by_product: dict[Any, list] = {}
    for n in gm.graph.nodes:
        site = _site(n)
        if site is None:
            continue
        found = _product(site[0])
        if found is not None:
            by_product.setdefault(found[0], []).append((n, found[1], *site))
    notes = []
    for p, sites in by_product.items():
        try:
            notes.append(_rewrite(gm, p, sites))
        except _NoRope as e:
            notes.append(f"rope: left to torch ({p.name}: {e})")
        except (RuntimeError, TypeError, ValueError, IndexError) as e:    # the views do not replay
            notes.append(f"rope: left to torch ({p.name}: its views do not replay on meta tensors: {e})")
    if any(not x.startswith("rope: left") for x in notes):
        gm.graph.eliminate_dead_code()
        gm.graph.lint()
        gm.recompile()
    return notes


def _rewrite(gm: Any, p: Any, sites: list) -> str:
    """One product's sites into one rope of it (raises ``_NoRope``)."""
    import torch
    from torch._guards import detect_fake_mode

    m, n_cols = _shape(p)
    dtype = _val(p).dtype
    if dtype not in (torch.float16, torch.bfloat16):
        raise _NoRope(f"a product of {dtype} (fused GEMMs take f16 or bf16)")
    y_meta = torch.empty((m, n_cols), dtype=dtype, device="meta")
    ranges, key = [], None
    site_nodes: set = set()
    for add, chain, t, c, s, inter, nodes in sites:
        hd = _shape(t)[-1]
        if _val(add).dtype != dtype or _shape(add) != _shape(t):
            raise _NoRope(f"{add.name} is not of the projection's dtype and shape (tables of another dtype?)")
        (cs, cpos, cviews), (ss, spos, sviews) = _table(c, dtype, hd), _table(s, dtype, hd)
        if cpos is not spos or _shape(cs) != _shape(ss):
            raise _NoRope("cos and sin tables of different forms")
        rows = m if cpos is not None else _hint(_val(cs).numel()) // hd
        if cpos is not None and _hint(_val(cpos).numel()) != m:
            raise _NoRope(f"{_hint(_val(cpos).numel())} position ids for {m} rows")
        if rows == 0 or m % rows:
            raise _NoRope(f"tables of {rows} rows for {m} rows of the product")
        t_meta = _replay(chain, y_meta)
        for tab_views, what in ((cviews, "cos"), (sviews, "sin")):
            g = torch.empty((*(_shape(cpos) if cpos is not None else _shape(cs)[:-1]), hd), dtype=dtype,
                            device="meta") if cpos is not None else torch.empty(_shape(cs), dtype=dtype,
                                                                                 device="meta")
            try:
                tab = _replay(tab_views, g).expand(t_meta.shape)
            except RuntimeError as e:
                raise _NoRope(f"the {what} table does not broadcast to {list(t_meta.shape)}: {e}") from None
            rng = _check(t_meta, tab, m, n_cols, hd, rows, f"{add.name}")
        ranges.append(rng)
        k = (cs, ss, cpos, inter, hd)
        if key is not None and k != key:
            raise _NoRope("its sites use different tables, forms or head sizes")
        key = k
        site_nodes.update(nodes)
        if any(u not in site_nodes and u not in nodes for u in t.users):
            raise _NoRope(f"the unrotated {t.name} is read outside the rotation")
    cs, ss, cpos, inter, hd = key
    why = rope_unsupported(hd, _val(cs).dtype, None if cpos is None else _val(cpos).dtype)
    if why:
        raise _NoRope(why)
    ranges.sort()
    r = 0
    for lo, hi in ranges:
        if lo != r:
            raise _NoRope(f"the rotated columns {ranges} are not one range from column 0 (q and k first)")
        r = hi
    heads_t = {s[2] for s in sites}
    for v in _readers(p, heads_t):
        if v in heads_t or all(_op(u) in _VIEWS and u.args[0] is v for u in v.users):
            continue
        lo, hi = _columns(_replay(_product(v)[1], y_meta) if v is not p else y_meta, n_cols)
        if lo < r:
            user = next(u for u in v.users)
            raise _NoRope(f"the unrotated columns [{lo}, {hi}) are read by {user.name}")
    sources = [x for x in (cs, ss, cpos) if x is not None]
    order = {x: i for i, x in enumerate(gm.graph.nodes)}
    _hoist(gm.graph, [x for x in sources if order[x] > order[p]], p, order)
    from hexlayout.fusion.rope import rope_op
    from hexlayout.runtime.alloc import fresh_like

    g = gm.graph
    with g.inserting_after(p):
        rope = g.call_function(rope_op(), (p, cs, ss, cpos, hd, r, inter))
    fake = detect_fake_mode([_val(p)]) or contextlib.nullcontext()
    with fake:
        rope.meta["val"] = fresh_like(_val(p), _val(p).shape)
    p.replace_all_uses_with(rope, delete_user_cb=lambda u: u is not rope)
    for add, _chain, t, *_ in sites:
        add.replace_all_uses_with(t)
    form = "interleaved" if inter else "rotate-half"
    return (f"rope: {form} RoPE of columns [0, {r}) ({r // hd} heads of {hd}) in the epilogue of {p.name} "
            f"(tables {cs.name}{f' gathered by {cpos.name}' if cpos is not None else ''})")


def _hoist(g: Any, nodes: list, p: Any, order: dict) -> None:
    """Move ``nodes`` (tables computed after the product ``p``) and their ancestors after
    ``p`` to just before ``p``, so the rope of ``p`` can read them (none may depend on ``p``)."""
    need: list = []
    work = list(nodes)
    while work:
        x = work.pop()
        if x in need or order[x] < order[p]:
            continue
        if x is p:
            raise _NoRope("a table computed from the projection itself")
        need.append(x)
        work.extend(x.all_input_nodes)
    for x in sorted(need, key=order.__getitem__):
        p.prepend(x)
