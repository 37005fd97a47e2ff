"""The GEMM anchor kernel with a fusion plan fused, built: what ``op.gemm`` (its own epilogue)
and the fusion records (``fusion``) share. The fused program is memoized on the structure
(no sizes in the key), its build by the runtime."""

from __future__ import annotations

import re
import threading
from typing import Any

from hexlayout.fusion.aten import dtype_name
from hexlayout.fusion.mechanism import FusedProgram, TilePlan, fuse

from .kernels import gemm_anchor

__all__ = ["gemm_fused_build", "clear_fused_programs"]

_LOCK = threading.Lock()
_PROGRAMS: dict[tuple, FusedProgram] = {}


def gemm_fused_build(arch: str, dtype: Any, b_layout: str, consts: dict[str, Any], plan: TilePlan,
                     name: str, *, anchor: str, prologue_ops: tuple[str, ...] = (),
                     epilogue_ops: tuple[str, ...] = (), staged: bool = False,
                     compile: bool = True, a_layout: str = "mk",
                     ld: tuple[bool, bool] = (False, False)) -> tuple[Any, FusedProgram]:
    """The GEMM anchor (``dtype``, ``a_layout`` / ``b_layout``: the stored operands, ``ld``:
    which take a free leading stride (``kernels.leading_dims``), tile ``consts``) for ``arch``
    with ``plan`` fused, built (the fused program is memoized on the structure - no sizes in
    the key - and its build by the runtime). ``anchor`` /
    ``prologue_ops`` / ``epilogue_ops``: the aten names launch records show.
    Returns ``(build, fused program)``; the program's ``sources`` say what each parameter
    after ``a`` / ``b`` receives."""
    import hexlayout.lang as hl
    from hexlayout.runtime import build
    from hexlayout.runtime.launch_log import describe

    dname = dtype_name(dtype)
    ld = (bool(ld[0]), bool(ld[1]))
    key = (arch, dname, a_layout, b_layout, ld, staged, tuple(sorted(consts.items())), plan, name, compile)
    with _LOCK:
        prog = _PROGRAMS.get(key)
    if prog is None:
        kernel = gemm_anchor(arch, getattr(hl, dname), b_layout, staged=staged, a_layout=a_layout, ld=ld)
        tk = kernel.trace(**consts)
        prog = fuse(tk, plan, f"{re.sub(r'[^0-9a-zA-Z_]', '_', name)[:80]}__{tk.name}")
        with _LOCK:
            _PROGRAMS[key] = prog
    # the runtime memoizes the build of this program object (and its disk cache backs that)
    bld = build(prog.kernel, arch, compile=compile)
    describe(bld, anchor=anchor, prologue=prologue_ops, epilogue=epilogue_ops)
    return bld, prog



def clear_fused_programs() -> None:
    """Forget the memoized fused GEMM programs."""
    with _LOCK:
        _PROGRAMS.clear()
