"""Launching a fused build: its arguments in the fused program's parameter order, one launch
on CUDA (through a cached ``Launcher``) or one emulation on CPU, and the check that CPU
tensors may be emulated."""

from __future__ import annotations

from typing import Any

from .mechanism import FusedProgram
from .spec import FusedSpec, FusionUnsupported

__all__ = ["LAUNCHERS", "check_emulation", "kernel_args", "launch_args"]


#: the ``Launcher`` of each fused build (by the build's id)
LAUNCHERS: dict[int, Any] = {}


def check_emulation(spec: FusedSpec) -> None:
    """Raise ``EmulationDisabledError`` unless ``HEXLAYOUT_EMULATE=1`` lets CPU tensors run."""
    from hexlayout.runtime.torch_ops import EmulationDisabledError, emulation_enabled

    if not emulation_enabled():
        raise EmulationDisabledError(f"hexlayout fused kernel {spec.display_name()}: CPU tensors need "
                                     "HEXLAYOUT_EMULATE=1 (the thread-level emulator) or CUDA tensors")


def kernel_args(prog: FusedProgram, named: dict[str, Any], inputs: list[Any], outs: list[Any]) -> list[Any]:
    """The fused program's arguments: the kept anchor parameters (``named``), then each new
    parameter's source (an extra input of ``inputs`` or an output)."""
    from hexlayout.ir.tile import GlobalParam

    args: list[Any] = []
    for p in prog.kernel.params[: len(prog.kernel.params) - len(prog.sources)]:
        t = named.get(p.name)
        if t is None:
            raise FusionUnsupported(f"{prog.kernel.name}: no value for the anchor parameter {p.name}")
        if isinstance(p, GlobalParam) and not t.is_contiguous():
            t = t.contiguous()
        args.append(t)
    for src in prog.sources:
        args.append(outs[src[1]] if src[0] == "output" else inputs[src[1]])
    return args


def launch_args(bld: Any, prog: FusedProgram, named: dict[str, Any], inputs: list[Any], outs: list[Any],
                 cuda: bool) -> Any:
    """One launch (or emulation) of a fused build; on CUDA the launcher's bound arguments."""
    args = kernel_args(prog, named, inputs, outs)
    if cuda:
        from hexlayout.runtime.launch import Launcher

        lau = LAUNCHERS.get(id(bld))
        if lau is None or lau.build is not bld:
            lau = LAUNCHERS[id(bld)] = Launcher(bld)
        return lau(*args)
    from hexlayout.runtime.emulate import emulate

    emulate(bld, *args)
    return None
