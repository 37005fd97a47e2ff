"""Which PTX opcodes the shipped kernels contain, and whether the executor handles them.

For the kernel families PTX mode claims (the sm_80 / sm_89 families run in the other tests
of this package), every opcode in their PTX must be handled; a new unhandled opcode fails
here before it fails a kernel. For the sm_90a families (TMA, mbarrier, wgmma: not executed
yet) the unhandled opcodes must be the known ones, listed in ``SM90_GAPS``.
"""

from __future__ import annotations

import functools

import pytest

import hexlayout.lang as hl
from hexlayout.ptx import handled, parse_ptx
from hexlayout.runtime import build
from hexlayout.runtime.emulate_ptx import ptx_of


def _codegen(name: str, *args):
    from types import SimpleNamespace

    from hexlayout.codegen import generate
    from tests.codegen import kernels

    return SimpleNamespace(generated=generate(getattr(kernels, name)(*args)))


def _example(name: str, arch: str, **consts):
    from hexlayout.lang import examples

    return build(getattr(examples, name), arch, compile=False, **consts)


def _gemm_op(arch: str):
    from hexlayout.ops.gemm.config import CONFIGS
    from hexlayout.ops.gemm.kernels import gemm_sm80_kernel, gemm_sm90_kernel

    cfg = CONFIGS[arch][0]
    fn = gemm_sm80_kernel if arch == "sm_80" else gemm_sm90_kernel
    return build(fn(hl.f16, "nk"), arch, compile=False, **cfg.consts(4096, 4096))


def _paged(arch: str):
    from hexlayout.ops.attention.paged import paged_attention_consts
    from hexlayout.ops.attention.paged_kernels_sm80 import paged_attention_kernel

    return build(paged_attention_kernel(hl.f16), arch, compile=False,
                 **paged_attention_consts(64, 16, 8, 1, True, False, False))


def _kv_cache():
    from hexlayout.ops.kv_cache.op import reshape_and_cache_consts, reshape_and_cache_kernel

    consts = reshape_and_cache_consts(128, 16)
    return build(reshape_and_cache_kernel(hl.bf16), "sm_80", compile=False, **consts)


CLAIMED = {
    "codegen gemm_sm80": lambda: _codegen("gemm_sm80"),
    "codegen row_reduce": lambda: _codegen("row_reduce", "sm_80", "sum"),
    "codegen elementwise sm_89": lambda: _codegen("elementwise", "sm_89"),
    "example gemm_sm80": lambda: _example("gemm_sm80", "sm_80", BM=64, BN=64),
    "example flash_attention sm_80": lambda: _example("flash_attention_fwd", "sm_80", BM=64, BN=32,
                                                      HEAD_DIM=64, WARPS=4, CAUSAL=True),
    "op gemm sm_80": lambda: _gemm_op("sm_80"),
    "op reshape_and_cache": _kv_cache,
    "op paged_attention sm_80": lambda: _paged("sm_80"),
}
SM90 = {
    "codegen gemm_sm90": lambda: _codegen("gemm_sm90"),
    "example gemm_sm90": lambda: _example("gemm_sm90", "sm_90a"),
}
#: opcodes of the sm_90a kernels the executor does not implement yet (first component + form)
SM90_GAPS = {"mbarrier", "cp.async.bulk", "wgmma", "setmaxnreg", "fence.proxy", "elect"}


@functools.cache
def _opcodes(name: str) -> tuple[str, ...]:
    fn = {**CLAIMED, **SM90}[name]
    return tuple(sorted({i.opcode for i in parse_ptx(ptx_of(fn()).ptx).entry().body}))


@pytest.mark.parametrize("name", sorted(CLAIMED))
def test_claimed_family_has_no_unhandled_opcode(name: str) -> None:
    ops = _opcodes(name)
    assert len(ops) > 10
    missing = [o for o in ops if not handled(o)]
    assert not missing, f"{name}: the PTX executor does not handle {missing}"


@pytest.mark.parametrize("name", sorted(SM90))
def test_sm90_gaps_are_the_known_ones(name: str) -> None:
    missing = {o for o in _opcodes(name) if not handled(o)}
    assert missing, f"{name}: every opcode is handled now: move it to CLAIMED with a kernel test"
    unknown = {o for o in missing if not any(o.startswith(g) for g in SM90_GAPS)}
    assert not unknown, f"{name}: unhandled opcodes outside SM90_GAPS: {sorted(unknown)}"


def test_handled_is_not_everything() -> None:
    assert handled("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") and handled("cp.async.wait_group")
    assert not handled("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16")
    assert not handled("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes")
    assert not handled("mbarrier.try_wait.parity.shared::cta.b64") and not handled("tcgen05.mma")
