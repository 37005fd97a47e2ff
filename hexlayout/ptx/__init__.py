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
  PCs handles divergence and reconvergence; ``bar.sync`` is a block barrier; deadlocks and
  runaway loops are errors; shared-memory races between warps (no barrier between a write
  and another warp's access to the same byte) are errors (``machine.SharedRaces``).
* Errors (``errors``) name the kernel, block, thread, PTX line and text, the CUDA line of
  the ``.loc`` and the kernel source line of the generated comment above it (``srcmap``).
* ``hexlayout.runtime.emulate(..., mode="ptx")`` (or ``HEXLAYOUT_EMULATE=ptx``) compiles the
  printed source with ``-lineinfo`` and runs it here on the call's tensors.

Opcodes (first component; ``handled(opcode)``), with the forms implemented:

opcode -- forms implemented -- module:

- ``add sub mul mad fma div rem min max abs neg`` -- integer (``.lo .hi .wide .sat``), f32 /
  f64, f16 / bf16 and their ``x2`` packed forms -- alu
- ``rcp sqrt rsqrt ex2 lg2 sin cos tanh`` -- ``.rn .approx .ftz``; f32 / f64 / f16 / x2 -- alu
- ``and or xor not cnot shl shr lop3 prmt bfe bfi popc clz brev bfind`` -- b16 / b32 / b64,
  ``.pred`` logic; prmt in its default mode -- alu
- ``setp set selp`` -- every comparison incl. unordered ones, ``.and .or .xor``, ``p|q`` -- alu
- ``mov cvta cvt copysign`` -- vector pack / unpack, symbols, special registers; cvt between
  integers and floats, f16x2 / bf16x2 / e4m3x2 / e5m2x2, ``.rni .rzi .rmi .rpi .sat
  .satfinite`` -- alu
- ``ld ldu st`` -- ``.global .shared .local .param`` and generic, ``.v2 .v4`` (cache hints
  ignored) -- memops
- ``atom red`` -- add min max exch cas and or xor inc dec on scalar types -- memops
- ``cp.async`` -- ``.ca .cg`` with src-size or ignore-src, ``commit_group``, ``wait_group``,
  ``wait_all`` -- memops
- ``shfl vote ldmatrix stmatrix mma`` -- shfl.sync up / down / bfly / idx; vote all / any /
  uni / ballot; ldmatrix / stmatrix m8n8 .x1 .x2 .x4 (.trans) .b16; mma.sync m16n8k8 and
  m16n8k16 f16 / bf16, m16n8k32 s8 / u8 / e4m3 / e5m2 -- warp
- ``bra ret exit bar barrier trap`` -- ``bar.sync a{, b}``, ``bar.arrive``, ``barrier.sync``,
  ``bar.warp.sync`` -- execute
- ``membar fence prefetch nanosleep griddepcontrol`` -- no effect on the CPU (every write is
  visible at once) -- execute

Not implemented (``UnsupportedInstructionError`` naming the PTX line when executed):
mbarrier, cp.async.bulk (TMA), wgmma, setmaxnreg, elect, cluster instructions, ``bar.red``,
``call``, ``mma`` shapes other than the above, ``prmt`` modes other than the default.

Where they occur: the PTX of the sm_80 / sm_89 builds of GEMM, paged attention (and its
split-KV combine), ``reshape_and_cache``, MoE (align, gate-up, down, sum, split-K), W4A16 /
W8A16 MoE and FP8 MoE holds only handled opcodes, and those ops run in PTX mode in
``tests/ptx`` (``test_opcode_coverage`` checks the opcode sets). Every sm_90a GEMM,
attention and MoE kernel uses wgmma (and TMA / mbarrier), so none runs here yet.

Limits: warps run in lockstep with per-thread masks, so a missing ``__syncwarp`` is not
seen; race detection compares accesses of different warps only, and not atomics.
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
