"""A PTX executor: the PTX that NVRTC made from a build's printed CUDA source, run on the CPU
for every thread of every block with PTX ISA semantics (``HEXLAYOUT_EMULATE=ptx``).

The IR emulator (``hexlayout.emulator``) runs the lowered program, the object the code
generator prints; this package runs what was printed and compiled, so a printing bug (a
wrong shuffle offset, loop bound, swizzle constant, register order, a dropped predicate)
shows up as a wrong result or an error here. It shares the emulator's memory model (tensors
as flat byte buffers whose in-bounds span is their shape and strides; shared memory per
block filled with 0xFF; its error kinds), not its instruction semantics.

* ``parse_ptx(text) -> Module`` (``parse``): directives, entries with ``.param`` lists,
  ``.reg`` / ``.shared`` / ``.local`` declarations, scoped ``{ }`` blocks, labels, guards,
  operands, ``.loc`` (with ``inlined_at``) per instruction.
* ``run_ptx(ptx, params, regions, grid, block, ...)`` (``execute``): runs an entry; threads
  of a batch of blocks are vectorized with numpy (``machine``: registers as per-thread
  arrays, address spaces, checked accesses); lowest-PC-first scheduling with per-thread
  PCs handles divergence and reconvergence, and a warp (warpgroup) collective waits for
  all of its live lanes to reach it (a GPU's convergence barrier); ``bar.sync`` is a block
  barrier; the CTAs of a cluster run in one batch; deadlocks (block barriers, mbarriers,
  cluster barriers) and runaway loops are errors; shared-memory races between warps (no
  barrier or completed mbarrier phase between a write and another warp's access to the
  same byte) are errors (``machine.SharedRaces``), and so is touching shared bytes a TMA
  copy has not yet landed.
* Errors (``errors``) name the kernel, block, thread, PTX line and text, the CUDA line of
  the ``.loc`` and the kernel source line of the generated comment above it (``srcmap``).
* ``hexlayout.runtime.emulate(..., mode="ptx")`` (or ``HEXLAYOUT_EMULATE=ptx``) compiles the
  printed source with ``-lineinfo`` and runs it here on the call's tensors; a TMA tensor map
  parameter receives the launcher's ``TensorMapParams`` in this package's encoding
  (``bulk.encode_tensor_map``).

Opcodes (first component; ``handled(opcode)``), with the forms implemented:

opcode -- forms implemented -- module:

- ``add sub mul mad fma div rem min max abs neg`` -- integer (``.lo .hi .wide .sat``), f32 /
  f64, f16 / bf16 and their ``x2`` packed forms -- alu
- ``rcp sqrt rsqrt ex2 lg2 sin cos tanh`` -- ``.rn .approx .ftz``; f32 / f64 / f16 / x2 -- alu
- ``and or xor not cnot shl shr lop3 prmt bfe bfi popc clz brev bfind`` -- b16 / b32 / b64,
  ``.pred`` logic; prmt in its default mode -- alu
- ``setp set selp`` -- every comparison incl. unordered ones, ``.and .or .xor``, ``p|q`` -- alu
- ``mov cvta cvt copysign`` -- vector pack / unpack, symbols, special registers (incl. the
  cluster ones); cvt between integers and floats, f16x2 / bf16x2 / e4m3x2 / e5m2x2, ``.rni
  .rzi .rmi .rpi .sat .satfinite`` -- alu
- ``ld ldu st`` -- ``.global .shared .local .param`` and generic, ``.v2 .v4`` (cache hints
  ignored) -- memops
- ``atom red`` -- add min max exch cas and or xor inc dec on scalar types -- memops
- ``cp.async`` -- ``.ca .cg`` with src-size or ignore-src, ``commit_group``, ``wait_group``,
  ``wait_all`` -- memops
- ``cp.async.bulk`` / ``cp.reduce.async.bulk.tensor`` -- TMA tensor loads (1-5d, swizzle
  none / 32 / 64 / 128 B, out-of-bounds fill, ``.multicast::cluster``) completing on an
  mbarrier, plain bulk loads, tensor stores and add-reductions, bulk groups -- bulk
- ``mbarrier`` -- init, arrive (``.expect_tx``, ``shared::cluster`` remote), arrive_drop,
  expect_tx, complete_tx, try_wait / test_wait (parity or state token), inval -- mbarrier
- ``wgmma setmaxnreg`` -- wgmma.mma_async m64nNk16 f16 / bf16 and m64nNk32 e4m3 / e5m2 / s8
  / u8, A from a descriptor or registers, f32 / f16 / s32 D, descriptor swizzle modes and
  transposes; fence / commit_group / wait_group -- wgmma
- ``tcgen05`` -- tensor memory per CTA (alloc / dealloc / relinquish_alloc_permit, cta_group::1
  and ::2, the exit check); ``mma`` kind::f16, kind::f8f6f4, kind::mxf8f6f4.block_scale
  (UE8M0) and the FP4 kind::mxf4 / mxf4nvf4.block_scale (packed e2m1, UE8M0 / UE4M3 factors,
  scale_vec 2X / 4X), cta_group::1 and ::2, A from a descriptor or TMEM, the shared-memory and instruction
  descriptors decoded from the register bits, in flight until ``commit`` (incl.
  ``.multicast::cluster``) lands on its mbarrier; ``ld`` / ``st`` 32x32b / 16x64b / 16x128b /
  16x256b ``.xN``; ``cp`` (the shapes of ``arch.tcgen05_cp``, cta_group::1); ``wait::ld/st``;
  ``fence::before/after_thread_sync``; the IR emulator's TMEM ordering rules by vector clocks
  (``clocks``): an MMA overwriting cells whose ``tcgen05.ld`` is not waited, fenced and released
  to its issuer, a ``tcgen05.ld`` that did not observe its MMA's commit, an MMA reading A cells
  a ``tcgen05.st`` wrote unwaited or unordered, a dealloc before ``wait::ld`` -- tcgen05
- ``mapa barrier.cluster`` -- ``mapa.shared::cluster``, cluster arrive / wait -- cluster
- ``shfl vote ldmatrix stmatrix mma elect`` -- shfl.sync up / down / bfly / idx; vote all /
  any / uni / ballot; ldmatrix / stmatrix m8n8 .x1 .x2 .x4 (.trans) .b16; mma.sync m16n8k8
  and m16n8k16 f16 / bf16, m16n8k32 s8 / u8 / e4m3 / e5m2; elect.sync -- warp
- ``bra ret exit bar barrier trap`` -- ``bar.sync a{, b}``, ``bar.arrive``, ``barrier.sync``,
  ``bar.warp.sync`` -- execute
- ``membar fence prefetch nanosleep griddepcontrol`` -- no effect on the CPU (every write is
  visible at once) -- execute

Not implemented (``UnsupportedInstructionError`` naming the PTX line when executed):
``bar.red``, ``call``, ``mma`` shapes other than the above, sparse
wgmma, descriptors with a base offset, ``prmt`` modes other than the default; of tcgen05: sparse and
``.ws`` MMAs, f16 accumulators, kind::tf32 / i8 / mxf4 / mxf4nvf4, block-scaled cta_group::2,
``tcgen05.cp`` with cta_group::2 or decompression, ``ld`` / ``st`` ``16x32bx2`` and ``.pack``,
``tcgen05.shift``.

Where they occur: ``benchmarks/results/ptx_opcodes.md`` lists every opcode of every shipped
build (sm_80, sm_89, sm_90a, sm_100a) with its families; all are handled (``test_opcode_coverage``),
and every family runs in PTX mode in ``tests/ptx``.

Limits: warps run in lockstep with per-thread masks, so a missing ``__syncwarp`` is not
seen in shared memory (for tensor memory it is: a warp's clocks join only at ``bar.warp.sync``);
race detection compares accesses of different warps only, and not atomics; a wgmma
computes when issued (one legal completion order), so reading its accumulators before
``wgmma.wait_group`` is not seen (a ``tcgen05.ld`` register read before ``tcgen05.wait::ld``
is an error). Happens-before by vector clocks (``clocks``) exists in kernels with
tcgen05 instructions only, and orders tensor-memory accesses only (shared memory keeps its
barrier epochs).
"""

from .errors import (
    PtxDeadlockError,
    PtxDivergenceError,
    PtxError,
    PtxIllegalInstructionError,
    PtxMisalignedAccessError,
    PtxOutOfBoundsError,
    PtxRaceError,
    PtxSite,
    UnsupportedInstructionError,
)
from .execute import PtxRunReport, handled, run_ptx
from .machine import GlobalRegion
from .parse import Module, PtxSyntaxError, parse_ptx

__all__ = [
    "parse_ptx",
    "run_ptx",
    "handled",
    "Module",
    "GlobalRegion",
    "PtxRunReport",
    "PtxError",
    "PtxOutOfBoundsError",
    "PtxMisalignedAccessError",
    "PtxRaceError",
    "PtxDeadlockError",
    "PtxDivergenceError",
    "PtxIllegalInstructionError",
    "UnsupportedInstructionError",
    "PtxSyntaxError",
    "PtxSite",
]
