"""Named kernels for the command line (``hexlayout explain gemm``, ``hexlayout compile attention``).

A kernel argument is one of

- a registered name (:data:`REGISTRY`): ``gemm``, ``attention`` (alias ``flash_attention``),
  ``gemm_explicit``; each picks the variant written for the target architecture and has
  default constants that synthesize;
- ``package.module:attr`` or ``path/to/file.py:attr``: a user kernel. ``attr`` may be an
  ``hl.kernel`` definition (traced with the ``-D`` constants), a traced ``TileKernel``, or a
  function returning either (called with the ``-D`` constants as keyword arguments).
  ``path/to/file.py`` alone picks the file's only ``hl.kernel``.

``-D NAME=VALUE`` constants are parsed as ints (``128``, ``0x80``), bools (``true``/``false``),
floats (``0.5``), dtype names (``f16``, ``bf16``, ... from ``hexlayout.lang``), else strings.

:func:`synthesize_kernel` traces and synthesizes a resolved kernel; a kernel whose layouts
and instructions are all written out is lowered directly if synthesis has nothing to decide.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import CLIError

__all__ = ["KernelSpec", "ResolvedKernel", "REGISTRY", "ALIASES", "ARCHS", "arch_arg", "parse_define",
           "parse_defines", "resolve", "known_names", "synthesize_kernel", "SynthesisResult"]

ARCHS = ("sm_80", "sm_89", "sm_90a", "sm_100a")


@dataclass(frozen=True)
class KernelSpec:
    """A registered kernel: one factory per architecture (returning an ``hl.kernel``
    definition), the constants used unless ``-D`` overrides them, and whether the constants
    go to ``Kernel.trace`` (``"trace"``) or to the factory itself (``"factory"``); a variant
    whose kernel has other constants has its own defaults in ``arch_defaults``."""

    name: str
    description: str
    variants: dict[str, Callable[..., Any]]
    defaults: dict[str, Any] = field(default_factory=dict)
    constants_to: str = "trace"
    #: per architecture, constants used instead of ``defaults`` (a variant with other constants)
    arch_defaults: dict[str, dict[str, Any]] = field(default_factory=dict)


@dataclass
class ResolvedKernel:
    """A kernel argument resolved for one architecture: ``kernel`` is an ``hl.kernel``
    definition or a ``TileKernel``; ``constants`` are what ``trace`` receives and
    ``factory_constants`` what the kernel's factory was called with (explicit kernels)."""

    name: str
    arch: str
    kernel: Any
    constants: dict[str, Any]
    source: str
    factory_constants: dict[str, Any] = field(default_factory=dict)

    def trace(self) -> Any:
        """The ``TileKernel`` (``Kernel.trace(**constants)``; a ``TileKernel`` as it is)."""
        from hexlayout.ir.tile import TileKernel

        if isinstance(self.kernel, TileKernel):
            return self.kernel
        return self.kernel.trace(**self.constants)


def _gemm_sm80(**_: Any) -> Any:
    from hexlayout.lang.examples.gemm_sm80 import gemm_sm80

    return gemm_sm80


def _gemm_sm90(**_: Any) -> Any:
    from hexlayout.lang.examples.gemm_sm90 import gemm_sm90

    return gemm_sm90


def _gemm_sm100(**_: Any) -> Any:
    """The GEMM of ``hexlayout.ops`` for sm_100a (f16): the warp-specialized sm_90a source,
    tcgen05 with the accumulator in tensor memory synthesized."""
    from hexlayout.lang import f16
    from hexlayout.ops.gemm.kernels import gemm_sm100_kernel

    return gemm_sm100_kernel(f16, "nk")


def _attention(**_: Any) -> Any:
    from hexlayout.lang.examples.flash_attention import flash_attention_fwd

    return flash_attention_fwd


def _attention_sm90(**_: Any) -> Any:
    """The sm_90a prefill attention kernel of ``hexlayout.ops`` (f16): FlashAttention-3's
    structure, TMA loads into a K/V stage ring by a producer warp group, wgmma in two consumer
    warp groups (the Hopper kernel the README describes)."""
    from hexlayout.lang import f16
    from hexlayout.ops.attention.kernels_sm90 import attention_varlen_sm90_kernel

    return attention_varlen_sm90_kernel(f16)


def _moe_wna16(**_: Any) -> Any:
    """The W4A16 fused-MoE gate-up kernel of ``hexlayout.ops`` (f16 activations, 4-bit weights
    declared ``hl.offline``: ``explain`` shows the offline layout synthesis chose)."""
    from hexlayout.lang import f16
    from hexlayout.ops.moe.wna16_kernels_sm80 import moe_wna16_gate_up_kernel

    return moe_wna16_gate_up_kernel(f16, 4, 64)


def _moe_wna16_sm90(**_: Any) -> Any:
    from hexlayout.lang import f16
    from hexlayout.ops.moe.wna16_kernels_sm90 import moe_wna16_gate_up_sm90_kernel

    return moe_wna16_gate_up_sm90_kernel(f16, 4, 64)


def _gemm_sm80_explicit(**kw: Any) -> Any:
    from hexlayout.lang.examples.explicit import gemm_sm80_explicit

    return gemm_sm80_explicit(**kw)


def _gemm_sm90_explicit(**kw: Any) -> Any:
    from hexlayout.lang.examples.explicit import gemm_sm90_ws_explicit

    return gemm_sm90_ws_explicit(**kw)


REGISTRY: dict[str, KernelSpec] = {
    "gemm": KernelSpec(
        "gemm", "C = A @ B^T, f16 in / f32 accumulate: multistage cp.async GEMM (sm_80, sm_89), "
        "warp-specialized TMA + wgmma GEMM (sm_90a), the same source with tcgen05 and the "
        "accumulator in tensor memory (sm_100a, hexlayout.ops's gemm_sm100); layouts synthesized",
        {"sm_80": _gemm_sm80, "sm_89": _gemm_sm80, "sm_90a": _gemm_sm90, "sm_100a": _gemm_sm100},
        arch_defaults={"sm_100a": {"BM": 128, "BN": 256, "BK": 64, "STAGES": 4, "CONSUMERS": 2}}),
    "attention": KernelSpec(
        "attention", "attention forward, f16: FlashAttention-2 (cp.async, mma.sync, online softmax) on "
        "sm_80 / sm_89; on sm_90a the warp-specialized prefill kernel of hexlayout.ops (TMA into a "
        "K/V stage ring, producer / consumer warp groups, wgmma; causal is -D RIGHT=true); layouts "
        "synthesized",
        {"sm_80": _attention, "sm_89": _attention, "sm_90a": _attention_sm90},
        {"BM": 64, "BN": 64, "HEAD_DIM": 64, "WARPS": 4, "CAUSAL": False},
        arch_defaults={"sm_90a": {"BM": 128, "BN": 64, "HEAD_DIM": 64, "STAGES": 4, "LEFT": False,
                                  "RIGHT": False, "SOFTCAP": False}}),
    "moe_wna16": KernelSpec(
        "moe_wna16", "W4A16 fused-MoE gate-up GEMM (f16, int4 weights dequantized in registers): "
        "mma.sync (sm_80, sm_89), swap-AB wgmma with the weights as register A (sm_90a); the weights' "
        "offline layout is synthesized with the fragment it feeds",
        {"sm_80": _moe_wna16, "sm_89": _moe_wna16, "sm_90a": _moe_wna16_sm90},
        {"BM": 16, "BN": 64, "BK": 64, "STAGES": 3, "WARPS": 4, "GROUP": 128},
        arch_defaults={"sm_90a": {"BM": 16, "BK": 64, "STAGES": 3, "WG": 1, "GROUP": 128}}),
    "gemm_explicit": KernelSpec(
        "gemm_explicit", "the GEMMs with every layout and instruction written out "
        "(explicit.gemm_sm80_explicit / gemm_sm90_ws_explicit)",
        {"sm_80": _gemm_sm80_explicit, "sm_89": _gemm_sm80_explicit, "sm_90a": _gemm_sm90_explicit},
        constants_to="factory"),
}
ALIASES = {"flash_attention": "attention"}


def known_names() -> list[str]:
    """Registered names and aliases, sorted."""
    return sorted([*REGISTRY, *ALIASES])


def arch_arg(text: str) -> str:
    """Normalize an architecture name (``sm80``, ``SM_90A``, ``sm_90``) to ``sm_80`` / ``sm_89`` /
    ``sm_90a`` (an ``argparse`` type: other names raise ``ArgumentTypeError``, a usage error, saying
    which build runs on that GPU: ``arch_advice``)."""
    t = text.strip().lower().replace("-", "_")
    if not t.startswith("sm_"):
        t = "sm_" + t.removeprefix("sm")
    if t == "sm_90":
        t = "sm_90a"
    if t not in ARCHS:
        from hexlayout.arch.targets import SUPPORTED_ARCHS, arch_advice

        if t in SUPPORTED_ARCHS:  # an architecture the atoms know whose kernels are not built yet
            raise argparse.ArgumentTypeError(f"{t}: the shipped kernels have no {t} build yet; the CLI "
                                             f"builds {', '.join(ARCHS)}")
        raise argparse.ArgumentTypeError(arch_advice(text))
    return t


def _parse_value(text: str) -> Any:
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    try:
        return int(text, 0)
    except ValueError:
        pass
    try:
        return float(text)
    except ValueError:
        pass
    import hexlayout.lang as hl
    from hexlayout.arch.dtypes import DType

    obj = getattr(hl, text.strip(), None)
    if isinstance(obj, DType):
        return obj
    return text


def parse_define(text: str) -> tuple[str, Any]:
    """``"BM=64"`` -> ``("BM", 64)``; ``"CAUSAL=true"`` -> ``("CAUSAL", True)``."""
    name, eq, value = text.partition("=")
    name = name.strip()
    if not eq or not name.isidentifier() or not value.strip():
        raise CLIError(f"bad constant {text!r}: expected NAME=VALUE, e.g. -D BM=64")
    return name, _parse_value(value.strip())


def parse_defines(items: Sequence[str] | None) -> dict[str, Any]:
    """All ``-D`` arguments as a dict (later ones win)."""
    return dict(parse_define(t) for t in items or ())


def _load_module(target: str) -> Any:
    if target.endswith(".py") or os.sep in target or "/" in target:
        path = Path(target)
        if not path.is_file():
            raise CLIError(f"no kernel file {target!r}")
        mod_name = f"_hexlayout_user_{abs(hash(str(path.resolve())))}"
        spec = importlib.util.spec_from_file_location(mod_name, path)
        if spec is None or spec.loader is None:
            raise CLIError(f"cannot import {target!r}")
        module = importlib.util.module_from_spec(spec)
        sys.modules[mod_name] = module
        sys.path.insert(0, str(path.resolve().parent))
        try:
            spec.loader.exec_module(module)
        finally:
            sys.path.pop(0)
        return module
    try:
        return importlib.import_module(target)
    except ImportError as e:
        raise CLIError(f"cannot import module {target!r}: {e}") from None


def _user_kernel(text: str, arch: str, consts: dict[str, Any]) -> ResolvedKernel:
    from hexlayout.ir.tile import TileKernel
    from hexlayout.lang.kernel import Kernel

    target, sep, attr = text.rpartition(":")
    if not sep or (len(target) == 1 and target.isalpha()):   # "file.py" alone (or a drive letter)
        target, attr = text, ""
    module = _load_module(target)
    if not attr:
        found = [k for k, v in vars(module).items() if isinstance(v, Kernel)]
        if len(found) != 1:
            raise CLIError(f"{target} defines {len(found)} hl.kernel objects"
                           f"{' (' + ', '.join(found) + ')' if found else ''}; name one: {target}:NAME")
        attr = found[0]
    obj = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            raise CLIError(f"{target} has no attribute {attr!r}")
        obj = getattr(obj, part)
    if isinstance(obj, (Kernel, TileKernel)):
        if isinstance(obj, TileKernel) and consts:
            raise CLIError(f"{text} is a traced TileKernel: constants (-D) cannot change it")
        return ResolvedKernel(getattr(obj, "name", attr), arch, obj, consts, text)
    if callable(obj):
        made = obj(**consts)
        if not isinstance(made, (Kernel, TileKernel)):
            raise CLIError(f"{text}() returned {type(made).__name__}, not an hl.kernel or TileKernel")
        return ResolvedKernel(getattr(made, "name", attr), arch, made, {}, text)
    raise CLIError(f"{text} is a {type(obj).__name__}, not an hl.kernel, a TileKernel or a function "
                   "making one")


def resolve(text: str, arch: str, consts: dict[str, Any] | None = None) -> ResolvedKernel:
    """The kernel named ``text`` for ``arch`` with ``consts`` over the registered defaults."""
    consts = dict(consts or {})
    name = ALIASES.get(text, text)
    spec = REGISTRY.get(name)
    if spec is None:
        if ":" in text or text.endswith(".py"):
            return _user_kernel(text, arch, consts)
        raise CLIError(f"unknown kernel {text!r}; known kernels: {', '.join(known_names())} "
                       "(or module:attr, path/to/file.py:attr)")
    factory = spec.variants.get(arch)
    if factory is None:
        raise CLIError(f"kernel {name!r} has no variant for {arch}; it has {', '.join(spec.variants)}")
    values = {**spec.arch_defaults.get(arch, spec.defaults), **consts}
    if spec.constants_to == "factory":
        try:
            kernel = factory(**values)
        except TypeError as e:
            raise CLIError(f"kernel {name!r}: bad constants {values}: {e}") from None
        return ResolvedKernel(name, arch, kernel, {}, f"{name} ({_describe(kernel)})", values)
    kernel = factory()
    return ResolvedKernel(name, arch, kernel, values, f"{name} ({_describe(kernel)})")


def _describe(obj: Any) -> str:
    fn = getattr(obj, "fn", None) or obj
    mod = getattr(fn, "__module__", "?")
    return f"{mod}.{getattr(fn, '__name__', getattr(obj, 'name', '?'))}"


@dataclass
class SynthesisResult:
    """What :func:`synthesize_kernel` returns: the traced kernel, its synthesis, timings and notes."""

    tile_kernel: Any
    synthesis: Any
    trace_seconds: float
    synth_seconds: float
    constants: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    cost_computed: bool = True


def synthesize_kernel(rk: ResolvedKernel) -> SynthesisResult:
    """Trace and synthesize ``rk`` (``SynthesisError`` / ``KernelError`` propagate). A fully
    explicit kernel is synthesized like any other (its decisions are the program's own), so
    ``explain`` shows the same synthesis result that ``hexlayout.runtime.build`` compiles."""
    from hexlayout.synth.solve import synthesize

    t = time.perf_counter()
    tk = rk.trace()
    trace_s = time.perf_counter() - t
    consts = dict(getattr(tk, "consts", {}) or {})
    consts.update(rk.factory_constants)
    t = time.perf_counter()
    syn = synthesize(tk, rk.arch)
    return SynthesisResult(tk, syn, trace_s, time.perf_counter() - t, consts)
