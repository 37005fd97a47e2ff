"""Text form of a ``TileKernel``: ``format_kernel(tk)`` (also ``str(tk)``).

    kernel gemm(a: f16[M, K] stride (K, 1), b: ..., n: s32)  # gemm.py:10
      consts BM=128, BN=128
      launch grid=((N + 127) / 128, (M + 127) / 128) threads=128 blockIdx=(blockIdx.x, blockIdx.y)
      %acc: register<f32(128,128), ?L0> = alloc  # gemm.py:14
      fill %acc, 0.0  # gemm.py:14
      for k in range(0, (K + 31) / 32, 1):  # gemm.py:15
        %ga: global<f16(128,32), auto> = view %a[blockIdx.y * 128, k * 32] extent (...)  # gemm.py:16
        ...

One op per line, nested bodies indented by two spaces, a ``# file:line`` comment at the
end. Layouts print in CuTe notation; an unknown layout prints as ``?L<n>`` (numbered per
kernel in order of appearance, hints in brackets) or ``auto`` (global views with
symbolic strides). Output is deterministic: it depends on nothing but the kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .expr import Expr, to_c
from .registry import OpRegistry
from .tile import (
    TEXT_FORM,
    Alloc,
    AsyncCommit,
    AsyncWait,
    Block,
    Cast,
    ClusterSync,
    Copy,
    Elementwise,
    FenceProxyAsync,
    Fill,
    For,
    GlobalParam,
    GlobalView,
    If,
    Iota,
    Mbarrier,
    MbarrierArrive,
    MbarrierInit,
    MbarrierWait,
    Mma,
    Op,
    Permute,
    Rearrange,
    Reduce,
    Scan,
    SetMaxNReg,
    Slice,
    SourceLoc,
    SubTile,
    Sync,
    TileKernel,
    Value,
    WgmmaCommit,
    WgmmaFence,
    WgmmaWait,
)
from .types import LayoutVar, TileType

__all__ = ["format_kernel", "format_op", "Printer", "PRINTING", "defines"]


def format_kernel(tk: TileKernel) -> str:
    """The text form of ``tk`` (see the module docstring)."""
    return Printer().kernel(tk)


TEXT_FORM[0] = format_kernel


def format_op(op: Op) -> str:
    """One op (and its nested bodies) on its own, layout variables numbered from 0."""
    p = Printer()
    out: list[str] = []
    p.op(op, 0, out)
    return "\n".join(out)


def _e(x: Any) -> str:
    if isinstance(x, Expr):
        return to_c(x)
    if x is None:
        return ":"
    return str(x)


def _loc(loc: SourceLoc | None) -> str:
    return f"  # {loc.format()}" if loc is not None else ""


def _scalar(x: Any) -> str:
    if isinstance(x, Value):
        return f"%{x.name}"
    if isinstance(x, Expr):
        return to_c(x)
    if isinstance(x, float):
        return repr(x)
    return str(x)


class Printer:
    """Stateful printer: numbers layout variables in order of appearance."""

    def __init__(self) -> None:
        self._lvars: dict[int, int] = {}

    def layout(self, lay: Any) -> str:
        if lay is None:
            return "auto"
        if isinstance(lay, LayoutVar):
            n = self._lvars.setdefault(lay.id, len(self._lvars))
            hints = {k: v for k, v in lay.hints.items() if k != "view_of"}
            h = ""
            if hints:
                h = "[" + ", ".join(f"{k}={_hint(v)}" for k, v in sorted(hints.items())) + "]"
            if "view_of" in lay.hints:
                h += f"[view of {self.layout(lay.hints['view_of'])}]"
            return f"?L{n}{h}"
        return str(lay)

    def type(self, t: TileType) -> str:
        shape = "(" + ",".join(str(s) for s in t.shape) + ")"
        return f"{t.scope}<{t.dtype}{shape}, {self.layout(t.layout)}>"

    def val(self, v: Value) -> str:
        return f"%{v.name}: {self.type(v.type)}"

    def kernel(self, tk: TileKernel) -> str:
        out: list[str] = []
        params = ", ".join(_param(p) for p in tk.params)
        out.append(f"kernel {tk.name}({params}){_loc(tk.loc)}")
        if tk.consts:
            out.append("  consts " + ", ".join(f"{k}={v!r}" for k, v in tk.consts.items()))
        ln = tk.launch
        line = f"  launch grid=({_list(ln.grid)}) threads={ln.threads}"
        if ln.cluster is not None:
            line += f" cluster={tuple(ln.cluster)}"
        if ln.min_blocks is not None:
            line += f" min_blocks={ln.min_blocks}"
        if ln.block_index:
            line += " blockIdx=(" + ", ".join(v.name for v in ln.block_index) + ")"
        out.append(line)
        for b in tk.mbarriers:
            out.append(f"  mbarrier %{b.name}[{b.count}]{_loc(b.loc)}")
        self.block(tk.body, 1, out)
        return "\n".join(out)

    def block(self, block: Block, depth: int, out: list[str]) -> None:
        for op in block.ops:
            self.op(op, depth, out)

    def op(self, op: Op, depth: int, out: list[str]) -> None:
        """Append ``op``'s lines at indentation ``depth`` (its nested blocks one deeper)."""
        ind = "  " * depth
        form = self.text(op)
        if isinstance(form, str):
            out.append(f"{ind}{form}{_loc(op.loc)}")
            return
        for k, part in enumerate(form):
            if isinstance(part, Block):
                self.block(part, depth + 1, out)
            else:
                out.append(f"{ind}{part}{_loc(op.loc) if k == 0 else ''}")

    def text(self, op: Op) -> OpText:
        """The printed form of ``op`` (its printing rule in ``PRINTING``)."""
        fn = PRINTING.rule(type(op))
        if fn is None:
            fields = ", ".join(f"{k}={_scalar(v)}" for k, v in op.__dict__.items() if k not in ("loc", "uid"))
            return f"{op.name.lower()} {fields}"
        return fn(self, op)


# An op prints as one line, or as a header line followed by nested blocks (printed one level
# deeper) and further lines between them (``else:``).
OpText = str | tuple[str | Block, ...]

PRINTING: OpRegistry[Callable[[Printer, Any], OpText]] = OpRegistry("printing")
"""The printing rule of each tile-op class: ``rule(printer, op) -> OpText``."""


@PRINTING.register(For)
def _for(p: Printer, op: For) -> OpText:
    unroll = "" if op.unroll is False else (" unroll" if op.unroll is True else f" unroll={op.unroll}")
    return (f"for {op.var.name} in range({_e(op.start)}, {_e(op.stop)}, {op.step}){unroll}:", op.body)


@PRINTING.register(If)
def _if(p: Printer, op: If) -> OpText:
    wg = "" if op.warp_groups is None else f"  [warp_group {', '.join(map(str, op.warp_groups))}]"
    head = f"if {to_c(op.cond)}:{wg}"
    return (head, op.then_body) if op.else_body is None else (head, op.then_body, "else:", op.else_body)


def defines(rhs: Callable[[Any], str]) -> Callable[[Printer, Any], OpText]:
    """The printing rule of an op that defines one value, ``op.result``:
    ``%result: <type> = <rhs(op)>``."""
    def rule(p: Printer, op: Any) -> OpText:
        return f"{p.val(op.result)} = {rhs(op)}"
    return rule


def _statement(text: Callable[[Any], str]) -> Callable[[Printer, Any], OpText]:
    def rule(p: Printer, op: Any) -> OpText:
        return text(op)
    return rule


def _list(xs: Any) -> str:
    return ", ".join(_e(x) for x in xs)


def _opts(**opts: str | None) -> str:
    """`` name=value`` for each option given (``value`` not None), in order."""
    return "".join(f" {k}={v}" for k, v in opts.items() if v is not None)


def _maybe(fmt: Callable[[Any], str], x: Any) -> str | None:
    return None if x is None else fmt(x)


def _global_view(op: GlobalView) -> str:
    rows = "" if op.gather is None else f" rows %{op.gather.name}"
    gather = "" if op.index_map is None else f" gather {op.index_map.text([v.name for v in op.indices])}"
    return f"view %{op.param.name}[{_list(op.origin)}] extent ({_list(op.extent)}){rows}{gather}"


def _copy(op: Copy) -> str:
    mbarrier = (f"%{op.mbarrier.name}[{_e(op.mbarrier_index)}]" if isinstance(op.mbarrier, Mbarrier)
                else _maybe(_scalar, op.mbarrier))
    return f"copy %{op.src.name} -> %{op.dst.name}" + _opts(
        instruction=op.instruction or None, mask=_maybe(_scalar, op.mask), mbarrier=mbarrier,
        multicast=_maybe(_e, op.multicast), other=_maybe(repr, op.other))


def _ref(v: Any) -> str:
    return f"%{v.name}"


def _mma(op: Mma) -> str:
    opts = _opts(atom=op.atom or None, warps=_maybe(str, op.warps)) + ("" if op.k_inner else " k_outer")
    opts += _opts(accumulate=None if op.accumulate is True else _scalar(op.accumulate),
                  scale_a=_maybe(_ref, op.scale_a), scale_b=_maybe(_ref, op.scale_b), packed=op.packed)
    return f"mma %{op.a.name}, %{op.b.name} -> %{op.c.name}{opts}"


def _reduce(op: Reduce) -> str:
    valid = "" if op.valid is None else f" valid={_e(op.valid)}" + (" overwrite" if op.overwrite else "")
    return f"reduce.{op.fn} %{op.src.name} axis={op.axis}{valid}"


def _scan(op: Scan) -> str:
    opts = (" reverse" if op.reverse else "") + ("" if op.init is None else f" init=%{op.init.name}")
    opts += "" if op.carry is None else f" carry=%{op.carry.name}"
    valid = "" if op.valid is None else f" valid={_e(op.valid)}"
    return f"scan.{op.fn} {', '.join(f'%{v.name}' for v in op.srcs)} axis={op.axis}{opts}{valid}"


def _mbarrier_arrive(op: MbarrierArrive) -> str:
    return f"mbarrier.arrive %{op.bar.name}[{_e(op.index)}]" + _opts(
        tx_bytes=str(op.tx_bytes) if op.tx_bytes else None, by=op.who if op.who != "thread" else None,
        cta=_maybe(_e, op.cta))


#: the ops that define one value, by the right-hand side of their line
_DEFINES: dict[type, Callable[[Any], str]] = {
    GlobalView: _global_view,
    Alloc: lambda op: "alloc",
    Slice: lambda op: f"slice %{op.src.name}[{_list(op.index)}]",
    SubTile: lambda op: f"subtile %{op.src.name}[{_list(op.offset)}]",
    Permute: lambda op: f"permute %{op.src.name} ({', '.join(map(str, op.perm))})",
    Iota: lambda op: f"iota axis={op.axis}",
    Cast: lambda op: f"cast %{op.src.name}",
    Elementwise: lambda op: f"{op.fn}({', '.join(_scalar(a) for a in op.args)})",
    Reduce: _reduce,
    Scan: _scan,
    Rearrange: lambda op: f"rearrange %{op.src.name}",
}
#: the ops printed as one statement of their fields
_STATEMENTS: dict[type, Callable[[Any], str]] = {
    Copy: _copy,
    Mma: _mma,
    Fill: lambda op: f"fill %{op.dst.name}, {op.value!r}",
    MbarrierInit: lambda op: f"mbarrier.init %{op.bar.name}[{_e(op.index)}] arrivals={op.arrivals}",
    MbarrierArrive: _mbarrier_arrive,
    MbarrierWait: lambda op: f"mbarrier.wait %{op.bar.name}[{_e(op.index)}] phase={_e(op.phase)}",
    Sync: lambda op: "syncthreads",
    AsyncCommit: lambda op: "cp.async.commit_group",
    AsyncWait: lambda op: f"cp.async.wait_group {op.pending}",
    WgmmaFence: lambda op: "wgmma.fence",
    WgmmaCommit: lambda op: "wgmma.commit_group",
    WgmmaWait: lambda op: f"wgmma.wait_group {op.pending}",
    FenceProxyAsync: lambda op: "fence.proxy.async",
    ClusterSync: lambda op: "barrier.cluster",
    SetMaxNReg: lambda op: f"setmaxnreg.{'inc' if op.increase else 'dec'} {op.count}",
}
for _cls, _rhs in _DEFINES.items():
    PRINTING.register(_cls)(defines(_rhs))
for _cls, _text in _STATEMENTS.items():
    PRINTING.register(_cls)(_statement(_text))


def _hint(v: Any) -> str:
    if isinstance(v, tuple):
        return "(" + ",".join("_" if x is None else str(x) for x in v) + ")"
    return str(v)


def _param(p: Any) -> str:
    if isinstance(p, GlobalParam):
        return f"{p.name}: {p.dtype}[{_list(p.shape)}] stride ({_list(p.stride)})"
    return f"{p.name}: {p.dtype}"
