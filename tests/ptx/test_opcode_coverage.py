"""Which PTX opcodes the shipped kernels contain, and whether the executor handles them.

Every opcode in the PTX of a representative build of each family (sm_80, sm_89, sm_90a and
sm_100a, the families run in the other tests of this package) must be handled, and so must every
opcode of every shipped build listed in ``benchmarks/results/ptx_opcodes.json`` (written by
``benchmarks/ptx_opcodes.py`` from all of ``bench_static``'s builds); a new unhandled opcode
fails here before it fails a kernel.
"""

from __future__ import annotations

import functools
import json
from pathlib import Path

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

    if arch == "sm_90a":
        from hexlayout.ops.attention.kernels_sm90 import paged_attention_sm90_kernel
        from hexlayout.ops.attention.paged import paged_attention_sm90_consts

        return build(paged_attention_sm90_kernel(hl.f16), arch, compile=False,
                     **paged_attention_sm90_consts(64, 16, 8, 1, True, False, False))
    return build(paged_attention_kernel(hl.f16), arch, compile=False,
                 **paged_attention_consts(64, 16, 8, 1, True, False, False))


def _gemm_cluster():
    from hexlayout.ops.gemm.config import CONFIGS
    from hexlayout.ops.gemm.kernels import gemm_sm90_kernel

    cfg = next(c for c in CONFIGS["sm_90a"] if c.cluster == 2)
    return build(gemm_sm90_kernel(hl.f16, "nk"), "sm_90a", compile=False, **cfg.consts(4096, 4096))


def _gemm_sm100(cluster: int):
    from hexlayout.ops.gemm.config import CONFIGS
    from hexlayout.ops.gemm.kernels import gemm_sm100_kernel

    cfg = next(c for c in CONFIGS["sm_100a"] if c.cluster == cluster and not c.persistent)
    return build(gemm_sm100_kernel(hl.bf16, "nk"), "sm_100a", compile=False, **cfg.consts(4096, 4096))


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
    "codegen gemm_sm90": lambda: _codegen("gemm_sm90"),
    "example gemm_sm90": lambda: _example("gemm_sm90", "sm_90a"),
    "op gemm sm_90a cluster": _gemm_cluster,
    "op paged_attention sm_90a": lambda: _paged("sm_90a"),
    "op gemm sm_100a": lambda: _gemm_sm100(1),
    "op gemm sm_100a cta pair": lambda: _gemm_sm100(2),
}
TABLE = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "ptx_opcodes.json"


@functools.cache
def _opcodes(name: str) -> tuple[str, ...]:
    fn = CLAIMED[name]
    return tuple(sorted({i.opcode for i in parse_ptx(ptx_of(fn()).ptx).entry().body}))


@pytest.mark.parametrize("name", sorted(CLAIMED))
def test_claimed_family_has_no_unhandled_opcode(name: str) -> None:
    ops = _opcodes(name)
    assert len(ops) > 10
    missing = [o for o in ops if not handled(o)]
    assert not missing, f"{name}: the PTX executor does not handle {missing}"


def test_every_shipped_build_has_only_handled_opcodes() -> None:
    """The table of every opcode in every shipped build's PTX (sm_80, sm_89, sm_90a, sm_100a)."""
    table = json.loads(TABLE.read_text())
    assert {"sm_80", "sm_89", "sm_90a", "sm_100a"} <= set(table["archs"]) and table["builds"] > 500
    ops = table["opcodes"]
    assert any(o.startswith("wgmma.mma_async") for o in ops) and any(o.startswith("mma.sync") for o in ops)
    assert any(o.startswith("tcgen05.mma.cta_group::2") for o in ops) and any("block_scale" in o for o in ops)
    missing = sorted(o for o in ops if not handled(o))
    where = [ops[o]["families"] for o in missing]
    assert not missing, f"the PTX executor does not handle {missing} (in {where})"


def test_handled_is_not_everything() -> None:
    assert handled("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32") and handled("cp.async.wait_group")
    assert handled("wgmma.mma_async.sync.aligned.m64n64k16.f32.f16.f16")
    assert handled("cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes")
    assert handled("mbarrier.try_wait.parity.shared::cta.b64") and handled("mapa.shared::cluster.u32")
    assert handled("tcgen05.mma.cta_group::1.kind::f16") and handled("tcgen05.alloc")
    assert not handled("wmma.mma.sync.aligned.row.col.m16n16k16.f32.f32") and not handled("call")
