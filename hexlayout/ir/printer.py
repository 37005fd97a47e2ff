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

from typing import Any

from .expr import Expr, to_c
from .tile import (
    Alloc,
    AsyncCommit,
    AsyncWait,
    Block,
    Cast,
    Copy,
    Elementwise,
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

__all__ = ["format_kernel", "format_op", "Printer"]


def format_kernel(tk: TileKernel) -> str:
    """The text form of ``tk`` (see the module docstring)."""
    return Printer().kernel(tk)


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
        grid = ", ".join(_e(g) for g in ln.grid)
        line = f"  launch grid=({grid}) threads={ln.threads}"
        if ln.cluster is not None:
            line += f" cluster={tuple(ln.cluster)}"
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
        ind = "  " * depth
        if isinstance(op, For):
            unroll = "" if op.unroll is False else \
                (" unroll" if op.unroll is True else f" unroll={op.unroll}")
            out.append(f"{ind}for {op.var.name} in range({_e(op.start)}, {_e(op.stop)}, {op.step}){unroll}:"
                       f"{_loc(op.loc)}")
            self.block(op.body, depth + 1, out)
            return
        if isinstance(op, If):
            wg = "" if op.warp_groups is None else f"  [warp_group {', '.join(map(str, op.warp_groups))}]"
            out.append(f"{ind}if {to_c(op.cond)}:{wg}{_loc(op.loc)}")
            self.block(op.then_body, depth + 1, out)
            if op.else_body is not None:
                out.append(f"{ind}else:")
                self.block(op.else_body, depth + 1, out)
            return
        out.append(f"{ind}{self.text(op)}{_loc(op.loc)}")

    def text(self, op: Op) -> str:  # noqa: C901 - one case per op
        if isinstance(op, GlobalView):
            org = ", ".join(_e(o) for o in op.origin)
            ext = ", ".join(_e(e) for e in op.extent)
            s = f"{self.val(op.result)} = view %{op.param.name}[{org}] extent ({ext})"
            if op.gather is not None:
                s += f" rows %{op.gather.name}"
            return s
        if isinstance(op, Alloc):
            return f"{self.val(op.result)} = alloc"
        if isinstance(op, Slice):
            return f"{self.val(op.result)} = slice %{op.src.name}[{', '.join(_e(i) for i in op.index)}]"
        if isinstance(op, SubTile):
            return f"{self.val(op.result)} = subtile %{op.src.name}[{', '.join(_e(o) for o in op.offset)}]"
        if isinstance(op, Permute):
            return f"{self.val(op.result)} = permute %{op.src.name} ({', '.join(map(str, op.perm))})"
        if isinstance(op, Iota):
            return f"{self.val(op.result)} = iota axis={op.axis}"
        if isinstance(op, Copy):
            s = f"copy %{op.src.name} -> %{op.dst.name}"
            if op.instruction:
                s += f" instruction={op.instruction}"
            if op.mask is not None:
                s += f" mask={_scalar(op.mask)}"
            if isinstance(op.mbarrier, Mbarrier):
                s += f" mbarrier=%{op.mbarrier.name}[{_e(op.mbarrier_index)}]"
            elif op.mbarrier is not None:
                s += f" mbarrier={_scalar(op.mbarrier)}"
            return s
        if isinstance(op, Mma):
            s = f"mma %{op.a.name}, %{op.b.name} -> %{op.c.name}"
            if op.atom:
                s += f" atom={op.atom}"
            if op.warps is not None:
                s += f" warps={op.warps}"
            if not op.k_inner:
                s += " k_outer"
            return s
        if isinstance(op, Cast):
            return f"{self.val(op.result)} = cast %{op.src.name}"
        if isinstance(op, Elementwise):
            args = ", ".join(_scalar(a) for a in op.args)
            return f"{self.val(op.result)} = {op.fn}({args})"
        if isinstance(op, Fill):
            return f"fill %{op.dst.name}, {op.value!r}"
        if isinstance(op, Reduce):
            return f"{self.val(op.result)} = reduce.{op.fn} %{op.src.name} axis={op.axis}"
        if isinstance(op, Rearrange):
            return f"{self.val(op.result)} = rearrange %{op.src.name}"
        if isinstance(op, Sync):
            return "syncthreads"
        if isinstance(op, AsyncCommit):
            return "cp.async.commit_group"
        if isinstance(op, AsyncWait):
            return f"cp.async.wait_group {op.pending}"
        if isinstance(op, MbarrierInit):
            return f"mbarrier.init %{op.bar.name}[{_e(op.index)}] arrivals={op.arrivals}"
        if isinstance(op, MbarrierArrive):
            s = f"mbarrier.arrive %{op.bar.name}[{_e(op.index)}]"
            if op.tx_bytes:
                s += f" tx_bytes={op.tx_bytes}"
            if op.who != "thread":
                s += f" by={op.who}"
            return s
        if isinstance(op, MbarrierWait):
            return f"mbarrier.wait %{op.bar.name}[{_e(op.index)}] phase={_e(op.phase)}"
        if isinstance(op, WgmmaFence):
            return "wgmma.fence"
        if isinstance(op, WgmmaCommit):
            return "wgmma.commit_group"
        if isinstance(op, WgmmaWait):
            return f"wgmma.wait_group {op.pending}"
        if isinstance(op, SetMaxNReg):
            return f"setmaxnreg.{'inc' if op.increase else 'dec'} {op.count}"
        fields = ", ".join(f"{k}={_scalar(v)}" for k, v in op.__dict__.items() if k != "loc")
        return f"{op.name.lower()} {fields}"


def _hint(v: Any) -> str:
    if isinstance(v, tuple):
        return "(" + ",".join("_" if x is None else str(x) for x in v) + ")"
    return str(v)


def _param(p: Any) -> str:
    if isinstance(p, GlobalParam):
        shape = ", ".join(_e(s) for s in p.shape)
        stride = ", ".join(_e(s) for s in p.stride)
        return f"{p.name}: {p.dtype}[{shape}] stride ({stride})"
    return f"{p.name}: {p.dtype}"
