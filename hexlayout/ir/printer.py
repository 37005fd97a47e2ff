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

__all__ = ["format_kernel", "format_op", "Printer", "PRINTING"]


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
        grid = ", ".join(_e(g) for g in ln.grid)
        line = f"  launch grid=({grid}) threads={ln.threads}"
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


@PRINTING.register(GlobalView)
def _global_view(p: Printer, op: GlobalView) -> OpText:
    org = ", ".join(_e(o) for o in op.origin)
    ext = ", ".join(_e(e) for e in op.extent)
    s = f"{p.val(op.result)} = view %{op.param.name}[{org}] extent ({ext})"
    if op.gather is not None:
        s += f" rows %{op.gather.name}"
    if op.index_map is not None:
        s += f" gather {op.index_map.text([v.name for v in op.indices])}"
    return s


@PRINTING.register(Alloc)
def _alloc(p: Printer, op: Alloc) -> OpText:
    return f"{p.val(op.result)} = alloc"


@PRINTING.register(Slice)
def _slice(p: Printer, op: Slice) -> OpText:
    return f"{p.val(op.result)} = slice %{op.src.name}[{', '.join(_e(i) for i in op.index)}]"


@PRINTING.register(SubTile)
def _subtile(p: Printer, op: SubTile) -> OpText:
    return f"{p.val(op.result)} = subtile %{op.src.name}[{', '.join(_e(o) for o in op.offset)}]"


@PRINTING.register(Permute)
def _permute(p: Printer, op: Permute) -> OpText:
    return f"{p.val(op.result)} = permute %{op.src.name} ({', '.join(map(str, op.perm))})"


@PRINTING.register(Iota)
def _iota(p: Printer, op: Iota) -> OpText:
    return f"{p.val(op.result)} = iota axis={op.axis}"


@PRINTING.register(Copy)
def _copy(p: Printer, op: Copy) -> OpText:
    s = f"copy %{op.src.name} -> %{op.dst.name}"
    if op.instruction:
        s += f" instruction={op.instruction}"
    if op.mask is not None:
        s += f" mask={_scalar(op.mask)}"
    if isinstance(op.mbarrier, Mbarrier):
        s += f" mbarrier=%{op.mbarrier.name}[{_e(op.mbarrier_index)}]"
    elif op.mbarrier is not None:
        s += f" mbarrier={_scalar(op.mbarrier)}"
    if op.multicast is not None:
        s += f" multicast={_e(op.multicast)}"
    if op.other is not None:
        s += f" other={op.other!r}"
    return s


@PRINTING.register(Mma)
def _mma(p: Printer, op: Mma) -> OpText:
    s = f"mma %{op.a.name}, %{op.b.name} -> %{op.c.name}"
    if op.atom:
        s += f" atom={op.atom}"
    if op.warps is not None:
        s += f" warps={op.warps}"
    if not op.k_inner:
        s += " k_outer"
    if op.accumulate is not True:
        s += f" accumulate={_scalar(op.accumulate)}"
    return s


@PRINTING.register(Cast)
def _cast(p: Printer, op: Cast) -> OpText:
    return f"{p.val(op.result)} = cast %{op.src.name}"


@PRINTING.register(Elementwise)
def _elementwise(p: Printer, op: Elementwise) -> OpText:
    args = ", ".join(_scalar(a) for a in op.args)
    return f"{p.val(op.result)} = {op.fn}({args})"


@PRINTING.register(Fill)
def _fill(p: Printer, op: Fill) -> OpText:
    return f"fill %{op.dst.name}, {op.value!r}"


@PRINTING.register(Reduce)
def _reduce(p: Printer, op: Reduce) -> OpText:
    s = f"{p.val(op.result)} = reduce.{op.fn} %{op.src.name} axis={op.axis}"
    if op.valid is not None:
        s += f" valid={_e(op.valid)}" + (" overwrite" if op.overwrite else "")
    return s


@PRINTING.register(Rearrange)
def _rearrange(p: Printer, op: Rearrange) -> OpText:
    return f"{p.val(op.result)} = rearrange %{op.src.name}"


@PRINTING.register(MbarrierInit)
def _mbarrier_init(p: Printer, op: MbarrierInit) -> OpText:
    return f"mbarrier.init %{op.bar.name}[{_e(op.index)}] arrivals={op.arrivals}"


@PRINTING.register(MbarrierArrive)
def _mbarrier_arrive(p: Printer, op: MbarrierArrive) -> OpText:
    s = f"mbarrier.arrive %{op.bar.name}[{_e(op.index)}]"
    if op.tx_bytes:
        s += f" tx_bytes={op.tx_bytes}"
    if op.who != "thread":
        s += f" by={op.who}"
    if op.cta is not None:
        s += f" cta={_e(op.cta)}"
    return s


@PRINTING.register(MbarrierWait)
def _mbarrier_wait(p: Printer, op: MbarrierWait) -> OpText:
    return f"mbarrier.wait %{op.bar.name}[{_e(op.index)}] phase={_e(op.phase)}"


#: ops printed as fixed text
_FIXED = {Sync: "syncthreads", AsyncCommit: "cp.async.commit_group", WgmmaFence: "wgmma.fence",
          WgmmaCommit: "wgmma.commit_group", FenceProxyAsync: "fence.proxy.async",
          ClusterSync: "barrier.cluster"}
#: group waits, printed as ``<instruction> <pending>``
_WAITS = {AsyncWait: "cp.async.wait_group", WgmmaWait: "wgmma.wait_group"}


def _fixed_text(text: str) -> Callable[[Printer, Any], OpText]:
    def rule(p: Printer, op: Any) -> OpText:
        return text
    return rule


def _wait_text(text: str) -> Callable[[Printer, Any], OpText]:
    def rule(p: Printer, op: Any) -> OpText:
        return f"{text} {op.pending}"
    return rule


for _cls, _text in _FIXED.items():
    PRINTING.register(_cls)(_fixed_text(_text))
for _cls, _text in _WAITS.items():
    PRINTING.register(_cls)(_wait_text(_text))


@PRINTING.register(SetMaxNReg)
def _setmaxnreg(p: Printer, op: SetMaxNReg) -> OpText:
    return f"setmaxnreg.{'inc' if op.increase else 'dec'} {op.count}"


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
