"""Attention masks computed from positions: a mask the graph builds from ``arange`` s of the
query and key positions (a causal mask restricted to the last ``W`` keys - Mistral's sliding
window -, a causal mask with an offset, ...) is computed by the attention kernel from its
row and column indices instead of being materialized and read.

The mask is ``m[b, h, i, j] = f(i, j)`` where ``f`` is a program of

- ``arange(start, end, step)`` (an index along the query axis ``i`` or the key axis ``j``;
  which one is found from where its dimension lands in the mask ``[.., Sq, Sk]``, through the
  views after it: ``cache_position[None, None, :, None]`` is a query index,
  ``arange(Sk)[None, None, None, :]`` a key index), ``full`` and ``scalar_tensor`` (constants);
- views that add, drop or broadcast dimensions of extent 1 (``view``, ``reshape``,
  ``unsqueeze``, ``expand``, ``permute``, ...);
- integer and boolean elementwise math: ``add`` / ``sub`` / ``mul``, comparisons (``lt``,
  ``le``, ``gt``, ``ge``, ``eq``, ``ne``), ``bitwise_and`` / ``bitwise_or`` / ``bitwise_not``
  (and their ``logical_`` forms), ``where``, casts.

A boolean ``f`` (``True``: attend) is ANDed with the kernel's own validity; torch's graphs turn
it into the additive ``where(m, 0, -inf)`` first, which is read as ``m``. A floating ``f``
(HF's additive ``full(min) * (j > i)`` form) is added to the scores like an additive mask.

``index_mask_nodes(g, n)`` finds such a program producing attention node ``n``'s mask in an
aten graph (or None); ``IndexMask.of(nodes, output)`` reads it back from a fused spec's
prologue (None when the prologue is not one) and ``IndexMask(rows, cols)`` traces it on the
kernel's ``i32`` tiles of query and key positions. Sizes (``arange`` ends, ``full`` shapes)
may be symbolic (dynamic shapes; None in the spec): the kernel needs only the starts and
steps, so one build serves every length.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

__all__ = ["IndexMask", "index_mask_nodes", "INDEX_OPS"]

_ARANGES = frozenset({"aten.arange.default", "aten.arange.start",
                      "aten.arange.start_step"})
_CONSTS = frozenset({"aten.full.default", "aten.scalar_tensor.default"})
_VIEWS = frozenset({"aten.view.default", "aten._unsafe_view.default", "aten.reshape.default",
                    "aten.unsqueeze.default", "aten.squeeze.dim", "aten.squeeze.default",
                    "aten.expand.default",
                    "aten.permute.default", "aten.transpose.int", "aten.t.default", "aten.clone.default",
                    "aten.slice.Tensor",
                    "aten.alias.default", "aten.detach.default"})
_CASTS = frozenset({"aten._to_copy.default", "prims.convert_element_type.default"})
_COMPARE = {"lt": "__lt__", "le": "__le__", "gt": "__gt__", "ge": "__ge__"}
_FLIP = {"lt": "gt", "le": "ge", "gt": "lt", "ge": "le", "eq": "eq", "ne": "ne"}
_MATH = {"add", "sub", "mul", "rsub", "lt", "le", "gt", "ge", "eq", "ne", "bitwise_and", "bitwise_or",
         "logical_and", "logical_or", "bitwise_not", "logical_not", "where"}
#: the aten ops a mask program may hold
INDEX_OPS = frozenset(_ARANGES | _CONSTS | _VIEWS | _CASTS | {
    f"aten.{b}.{o}" for b in _MATH
    for o in ("Tensor", "Scalar", "default", "self", "ScalarSelf", "ScalarOther")})


def _base(op: str) -> str:
    return op.split(".")[1]


def _c(a: tuple) -> Any:
    return a[1] if isinstance(a, tuple) and a and a[0] == "const" else None


#: a symbolic size (dynamic shapes: a spec holds it as None)
_SYM = "s"


def _size(x: Any) -> Any:
    return _SYM if x is None else x


def _bshape(*shapes: tuple) -> tuple:
    """The broadcast shape (a symbolic size matches any other size but 1)."""
    n = max((len(s) for s in shapes), default=0)
    out = []
    for d in range(n):
        sizes = {s[len(s) - n + d] for s in shapes if len(s) - n + d >= 0} - {1}
        ints = sizes - {_SYM}
        if len(ints) > 1:
            raise ValueError(f"shapes {shapes} do not broadcast")
        out.append(ints.pop() if ints else _SYM if sizes else 1)
    return tuple(out)


def _view_shape(src: tuple, sizes: tuple) -> tuple:
    sizes = tuple(_size(x) for x in sizes)
    if -1 in sizes:
        big = [x for x in src if x != 1]
        known = [x for x in sizes if x not in (-1, 1)]
        if _SYM in src or _SYM in known:
            rest = _SYM if len(big) == len(known) + 1 else None
            if rest is None:
                raise ValueError("a reshape of symbolic sizes")
        else:
            rest = math.prod(big) // max(math.prod(known), 1)
        sizes = tuple(rest if x == -1 else x for x in sizes)
    return sizes


def _same_sizes(a: list, b: list) -> bool:
    return len(a) == len(b) and all(x == y or _SYM in (x, y) for x, y in zip(a, b))


@dataclass(frozen=True)
class IndexMask:
    """A mask program (spec nodes, no inputs) and its output node; ``axes[j]`` is ``"q"`` or
    ``"k"`` for each ``arange`` node ``j`` (``None`` for other nodes), ``kinds[j]`` the value's
    kind (``"bool"``, ``"int"``, ``"float"``)."""

    nodes: tuple
    output: int
    axes: tuple
    kinds: tuple

    @staticmethod
    def of(nodes: tuple, output: int) -> IndexMask | None:
        """The mask program of a prologue's ``nodes`` (output ``output``), or None when it is
        not one (an input tensor read, an op outside ``INDEX_OPS``, a dimension of the mask
        other than the query and key ones that varies, an index on both axes)."""
        try:
            return _analyse(tuple(nodes[: output + 1]), output)
        except (ValueError, TypeError, KeyError, IndexError):
            return None

    @property
    def boolean(self) -> bool:
        """Whether the mask is boolean (``True``: attend), else additive."""
        return self.kinds[self.output] == "bool" or self._where_bool() is not None

    def _where_bool(self) -> int | None:
        """The boolean node of an output ``where(m, 0, -inf)`` (read as ``m``), or None."""
        n = self.nodes[self.output]
        if _base(n.op) != "where" or len(n.args) != 3 or n.args[0][0] != "node":
            return None
        vals = [self._scalar(a) for a in n.args[1:]]
        return n.args[0][1] if vals == [0.0, float("-inf")] else None

    def key_bounds(self) -> tuple[int | None, int | None]:
        """``(lo, hi)``: every key ``j`` a query ``i`` attends satisfies ``i + lo <= j <= i +
        hi`` (None: no bound found). Read from a boolean mask that is a conjunction of
        comparisons of ``j - i`` with a constant (``j <= i``, ``j > i - W``), or from an
        additive one ``c * hidden`` (``c`` below -1e4: a key it adds ``c`` to has no weight)
        whose ``hidden`` is a disjunction of such comparisons; (None, None) otherwise. The
        kernel skips the key blocks outside these bounds."""
        out = self._where_bool()
        if out is not None or self.kinds[self.output] == "bool":
            return self._bounds(self.output if out is None else out, False)
        n = self.nodes[self.output]
        while n.op in _VIEWS and n.args[0][0] == "node":
            n = self.nodes[n.args[0][1]]
        if _base(n.op) != "mul" or len(n.args) != 2:
            return None, None
        for c, b in (n.args, n.args[::-1]):
            v = self._scalar(c) if c[0] == "const" or self.nodes[c[1]].op in _CONSTS else None
            if v is None and c[0] == "node" and self.nodes[c[1]].op == "aten.full.default":
                v = _c(self.nodes[c[1]].args[1])
            if isinstance(v, (int, float)) and v < -1e4 and b[0] == "node" and self.kinds[b[1]] == "bool":
                return self._bounds(b[1], True)
        return None, None

    def _bounds(self, j: int, negate: bool) -> tuple[int | None, int | None]:
        """Bounds of ``j - i`` where node ``j`` (negated: where it is false) holds."""
        n = self.nodes[j]
        base = _base(n.op)
        if n.op in _VIEWS or n.op in _CASTS and self.kinds[j] == "bool":
            return self._bounds(n.args[0][1], negate) if n.args[0][0] == "node" else (None, None)
        if base in ("bitwise_not", "logical_not"):
            return self._bounds(n.args[0][1], not negate)
        conj = base in ("bitwise_and", "logical_and") and not negate or \
            base in ("bitwise_or", "logical_or") and negate
        if conj:
            lo, hi = None, None
            for a in n.args[:2]:
                if a[0] != "node":
                    continue
                alo, ahi = self._bounds(a[1], negate)
                lo = alo if lo is None else lo if alo is None else max(lo, alo)
                hi = ahi if hi is None else hi if ahi is None else min(hi, ahi)
            return lo, hi
        if base not in _COMPARE or len(n.args) != 2:
            return None, None
        x, y = (self._affine(a) for a in n.args)
        if x is None or y is None:
            return None, None
        d0, dq, dk = x[0] - y[0], x[1] - y[1], x[2] - y[2]       # x - y = d0 + dq i + dk j
        if dk not in (1, -1) or dq != -dk:
            return None, None
        op = base
        if dk == -1:                          # j - i - d0 ... : compare the negation
            d0, op = -d0, _FLIP[op]
        if negate:
            op = {"lt": "ge", "le": "gt", "gt": "le", "ge": "lt"}[op]
        # (j - i) + d0  op  0
        return {"lt": (None, -d0 - 1), "le": (None, -d0), "gt": (-d0 + 1, None), "ge": (-d0, None)}[op]

    def _affine(self, a: tuple) -> tuple | None:
        """``(c0, cq, ck)`` with the value ``c0 + cq i + ck j``, or None when it is not affine."""
        if a[0] == "const":
            v = a[1]
            return (v, 0, 0) if isinstance(v, int) and not isinstance(v, bool) else None
        j = a[1]
        n = self.nodes[j]
        base = _base(n.op)
        if n.op in _ARANGES:
            args = [_c(x) for x in n.args]
            start, step = (args[0], args[2] if len(args) > 2 else 1) if len(args) > 1 else (0, 1)
            if self.axes[j] is None:
                return (start, 0, 0)
            return (start, step, 0) if self.axes[j] == "q" else (start, 0, step)
        if n.op in _VIEWS or n.op in _CASTS and self.kinds[j] == "int":
            return self._affine(n.args[0])
        if base in ("add", "sub", "rsub") and len(n.args) >= 2:
            x, y = self._affine(n.args[0]), self._affine(n.args[1])
            if x is None or y is None:
                return None
            alpha = dict(n.kwargs).get("alpha", 1)
            if base == "rsub":
                x, y = y, x
            sign = alpha if base == "add" else -alpha
            return tuple(p + sign * q for p, q in zip(x, y))
        return None

    def _scalar(self, a: tuple) -> Any:
        if a[0] == "const":
            return a[1]
        n = self.nodes[a[1]]
        if n.op == "aten.scalar_tensor.default":
            return float(_c(n.args[0]))
        if n.op in _CASTS:
            return self._scalar(n.args[0])
        return None

    def __call__(self, rows: Any, cols: Any) -> Any:
        """The mask on the kernel's ``i32`` position tiles: a predicate tile (boolean masks) or
        an f32 tile to add to the scores."""
        import hexlayout.lang as hl

        out = self._where_bool()
        out = self.output if out is None else out
        env: list = []
        for j, n in enumerate(self.nodes[: out + 1]):
            env.append(self._emit(j, n, env, rows, cols, hl))
        v = env[out]
        if self.kinds[out] == "bool":
            return v
        return hl.cast(v, hl.f32) if not isinstance(v, (int, float)) else v

    def _emit(self, j: int, n: Any, env: list, rows: Any, cols: Any, hl: Any) -> Any:
        op, base = n.op, _base(n.op)
        args = [env[a[1]] if a[0] == "node" else a[1] for a in n.args]
        if op in _ARANGES:
            start, step = (args[0], args[2] if len(args) > 2 else 1) if len(args) > 1 else (0, 1)
            if self.axes[j] is None:             # one position (a dimension of extent 1)
                return int(start)
            idx = rows if self.axes[j] == "q" else cols
            idx = idx * int(step) if step != 1 else idx
            return idx + int(start) if start else idx
        if op == "aten.full.default":
            return args[1]
        if op == "aten.scalar_tensor.default":
            return args[0]
        if op in _VIEWS:
            return args[0]
        if op in _CASTS:
            to = dict(n.kwargs).get("dtype") if op != "prims.convert_element_type.default" else args[1]
            x = args[0]
            if isinstance(x, (int, float, bool)):
                return float(x) if self.kinds[j] == "float" else x
            if self.kinds[j] == "float" and self.kinds[n.args[0][1]] != "float":
                return _select(hl, x, 1.0, 0.0) if self.kinds[n.args[0][1]] == "bool" else hl.cast(x, hl.f32)
            if self.kinds[j] == "bool" and self.kinds[n.args[0][1]] != "bool":
                return x.ne(0)
            del to
            return x
        x, y = (args + [None])[:2]
        if base in ("bitwise_not", "logical_not"):
            return ~x if self.kinds[n.args[0][1]] == "bool" else x.eq(0)
        if base == "where":
            return _select(hl, x, args[1], args[2])
        if base == "rsub":
            x, y = y, x
            base = "sub"
        tile_x = not isinstance(x, (int, float, bool))
        if base in ("add", "sub"):
            alpha = dict(n.kwargs).get("alpha", 1)
            y = y * alpha if alpha != 1 else y
            if base == "add":
                return x + y if tile_x else y + x
            return x - y if tile_x else (y * -1) + x
        if base == "mul":
            kx, ky = (self._kind_of(n.args[i]) for i in (0, 1))
            if kx == "bool" or ky == "bool":        # (float or int) * bool: a select
                b, v = (x, y) if kx == "bool" else (y, x)
                return _select(hl, b, v, 0.0 if self.kinds[j] == "float" else 0)
            return x * y if tile_x else y * x
        if base in _COMPARE or base in ("eq", "ne"):
            if not tile_x:
                x, y, base = y, x, _FLIP[base]
            return getattr(x, _COMPARE[base])(y) if base in _COMPARE else getattr(x, base)(y)
        if base in ("bitwise_and", "logical_and"):
            return x & y if tile_x else y & x
        if base in ("bitwise_or", "logical_or"):
            return x | y if tile_x else y | x
        raise ValueError(f"index mask: {op} is not traced")

    def _kind_of(self, a: tuple) -> str:
        if a[0] == "node":
            return self.kinds[a[1]]
        v = a[1]
        return "bool" if isinstance(v, bool) else "int" if isinstance(v, int) else "float"


def _select(hl: Any, cond: Any, a: Any, b: Any) -> Any:
    """``where(cond, a, b)`` with at least one tile among the choices (a number is broadcast)."""
    if isinstance(a, (int, float, bool)) and isinstance(b, (int, float, bool)):
        dt = hl.f32 if isinstance(a, float) or isinstance(b, float) else hl.i32
        a = hl.zeros(cond.shape, dt) + a
    return hl.where(cond, a, b)


def _analyse(nodes: tuple, output: int) -> IndexMask:
    """Shapes, dimension sources and kinds of a mask program (see ``IndexMask.of``)."""
    shapes: list[tuple] = []
    srcs: list[tuple] = []          # per dim of each value: the set of arange nodes indexing it
    kinds: list[str] = []
    for j, n in enumerate(nodes):
        op, base = n.op, _base(n.op)
        if op not in INDEX_OPS:
            raise ValueError(f"{op} is not a mask op")
        if any(a[0] in ("input", "anchor") for a in n.args if isinstance(a, tuple) and a):
            raise ValueError("the mask reads a tensor")
        kw = dict(n.kwargs)
        dt = kw.get("dtype")
        if op in _ARANGES:
            a = [_c(x) for x in n.args]
            start, end, step = (0, a[0], 1) if len(a) == 1 else (a[0], a[1], a[2] if len(a) > 2 else 1)
            if not all(isinstance(v, int) and not isinstance(v, bool) for v in (start, step)) or \
                    not (end is None or isinstance(end, int) and not isinstance(end, bool)):
                raise ValueError("an arange of non-integers")
            shapes.append((_SYM if end is None else max(0, -(-(end - start) // step)),))
            srcs.append((frozenset({j}),))
            kinds.append("float" if dt in ("f16", "bf16", "f32", "f64") else "int")
            continue
        if op in _CONSTS:
            size = tuple(_size(x) for x in _c(n.args[0])) if op == "aten.full.default" else ()
            v = _c(n.args[1]) if op == "aten.full.default" else _c(n.args[0])
            shapes.append(size)
            srcs.append(tuple(frozenset() for _ in size))
            kinds.append("bool" if isinstance(v, bool) or dt == "pred" else
                         "float" if isinstance(v, float) or dt in ("f16", "bf16", "f32", "f64") else "int")
            continue
        ins = [a[1] for a in n.args if isinstance(a, tuple) and a and a[0] == "node"]
        if op in _VIEWS:
            s, src = shapes[ins[0]], srcs[ins[0]]
            shp, sv = _view(op, n, s, src)
            shapes.append(shp)
            srcs.append(sv)
            kinds.append(kinds[ins[0]])
            continue
        if op in _CASTS:
            shapes.append(shapes[ins[0]])
            srcs.append(srcs[ins[0]])
            to = dt if op != "prims.convert_element_type.default" else _c(n.args[1])
            kinds.append("bool" if to == "pred" else
                         "float" if to in ("f16", "bf16", "f32", "f64") else "int")
            continue
        shp = _bshape(*(shapes[i] for i in ins))
        sv = []
        for d in range(len(shp)):
            acc: frozenset = frozenset()
            for i in ins:
                k = len(shapes[i]) - len(shp) + d
                if k >= 0:
                    acc |= srcs[i][k]
            sv.append(acc)
        shapes.append(shp)
        srcs.append(tuple(sv))
        operand_kinds = [kinds[i] for i in ins] + [
            "bool" if isinstance(_c(a), bool) else "int" if isinstance(_c(a), int) else "float"
            for a in n.args if isinstance(a, tuple) and a and a[0] == "const" and _c(a) is not None]
        if base in ("lt", "le", "gt", "ge", "eq", "ne", "logical_and", "logical_or", "logical_not"):
            kinds.append("bool")
        elif base == "where":
            kinds.append(next((k for k in ("float", "int") if k in operand_kinds[1:]), "bool"))
        else:
            kinds.append(next((k for k in ("float", "int", "bool") if k in operand_kinds), "int"))
    out = srcs[output]
    axes: list = [None] * len(nodes)
    for d, s in enumerate(out):
        pos = len(out) - d           # 1: the key axis, 2: the query axis
        for a in s:
            ax = "k" if pos == 1 else "q" if pos == 2 else None
            if ax is None or axes[a] not in (None, ax):
                raise ValueError("an index on a mask dimension other than queries and keys, or on both")
            axes[a] = ax
    if not any(axes) or len(shapes[output]) > 4 or any(
            nodes[j].op in _ARANGES and axes[j] is None and shapes[j] != (1,) for j in range(len(nodes))):
        raise ValueError("a mask that does not depend on positions")
    return IndexMask(nodes, output, tuple(axes), tuple(kinds))


def _view(op: str, n: Any, s: tuple, src: tuple) -> tuple[tuple, tuple]:
    """A view's shape and dimension sources (dimensions of extent > 1 keep their order)."""
    if op in ("aten.clone.default", "aten.alias.default", "aten.detach.default"):
        return s, src
    if op == "aten.slice.Tensor":                  # only the whole dimension: ``x[:, :]``
        a = [_c(x) for x in n.args[1:]] + [None] * 4
        d, start, end, step = a[0] % len(s), a[1] or 0, a[2], a[3] or 1
        if start != 0 or step != 1 or not (end is None or end >= 2 ** 62 or s[d] != _SYM and end >= s[d]):
            raise ValueError("a slice of a mask dimension")
        return s, src
    if op == "aten.permute.default":
        p = [d % len(s) for d in _c(n.args[1])]
        return tuple(s[d] for d in p), tuple(src[d] for d in p)
    if op in ("aten.transpose.int", "aten.t.default"):
        p = list(range(len(s)))
        a, b = (_c(n.args[1]) % len(s), _c(n.args[2]) % len(s)) if op == "aten.transpose.int" else (0, 1)
        p[a], p[b] = p[b], p[a]
        return tuple(s[d] for d in p), tuple(src[d] for d in p)
    if op == "aten.expand.default":
        sizes = tuple(_c(n.args[1]))
        lead = len(sizes) - len(s)
        shp = tuple(sizes[d] if sizes[d] != -1 else s[d - lead] for d in range(len(sizes)))
        return shp, tuple(frozenset() if d < lead else src[d - lead] for d in range(len(sizes)))
    if op == "aten.unsqueeze.default":
        d = _c(n.args[1]) % (len(s) + 1)
        return s[:d] + (1,) + s[d:], src[:d] + (frozenset(),) + src[d:]
    if op == "aten.squeeze.default":
        keep = [d for d in range(len(s)) if s[d] != 1]
    elif op == "aten.squeeze.dim":
        dims = _c(n.args[1])
        dims = {x % len(s) for x in (dims if isinstance(dims, (tuple, list)) else (dims,))}
        keep = [d for d in range(len(s)) if d not in dims or s[d] != 1]
    else:
        shp = _view_shape(s, _c(n.args[1]))
        big = [(s[d], src[d]) for d in range(len(s)) if s[d] != 1]
        if not _same_sizes([x for x in shp if x != 1], [x for x, _ in big]):
            raise ValueError("a reshape that merges or splits dimensions")
        it = iter(big)
        return shp, tuple(next(it)[1] if x != 1 else frozenset() for x in shp)
    return tuple(s[d] for d in keep), tuple(src[d] for d in keep)


def index_mask_nodes(g: Any, n: Any, mask: Any) -> list | None:
    """The producers of attention ``n``'s mask ``mask`` (graph order) when they are a mask
    program of positions read by nothing else (each one's users in the program or ``n``),
    with every argument a constant or a size (a symbolic one of a dynamic shape: the spec
    holds it as None); else None."""
    import torch

    def tensor(a: Any) -> bool:
        return isinstance(g.value(a), torch.Tensor)

    taken = {mask}
    work = [mask]
    while work:
        p = work.pop()
        if p.op != "call_function" or g.op(p) not in INDEX_OPS or not g.unclaimed(p):
            return None
        for a in [*p.args, *p.kwargs.values()]:
            if hasattr(a, "op") and tensor(a):
                if a not in taken:
                    taken.add(a)
                    work.append(a)
            elif isinstance(a, (list, tuple)) and any(hasattr(x, "op") and tensor(x) for x in a):
                return None             # (symbolic sizes - nodes of SymInts - are kept as sizes)
    if any(u not in taken and u is not n for p in taken for u in p.users):
        return None
    return sorted(taken, key=g.order.__getitem__)
