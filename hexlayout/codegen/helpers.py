"""Device helper functions the generated code calls, emitted only where used.

Each helper is a few lines of inline PTX or a reinterpretation; keeping them as named
functions makes the kernel body read like the lowered program.
"""

from __future__ import annotations

__all__ = ["HELPERS", "helper_source"]

#: ``hl_mbar_wait``: loop on ``mbarrier.<wait>.parity`` until the phase has completed
_MBAR_WAIT = """\
// Wait until the mbarrier phase with this parity has completed.
__device__ __forceinline__ void hl_mbar_wait(unsigned bar, unsigned parity) {
  unsigned done;
  do {
    asm volatile("{\\n.reg .pred p;\\nmbarrier.<wait>.parity.shared::cta.b64 p, [%1], %2;\\n"
                 "selp.u32 %0, 1, 0, p;\\n}\\n" : "=r"(done) : "r"(bar), "r"(parity) : "memory");
  } while (!done);
}"""


HELPERS: dict[str, str] = {
    "elect_one": """\
// elect.sync over the whole (converged) warp: true in one lane, its lowest (lane 0).
__device__ __forceinline__ bool hl_elect_one() {
  unsigned elected;
  asm volatile("{\\n.reg .pred p;\\nelect.sync _|p, 0xffffffff;\\nselp.u32 %0, 1, 0, p;\\n}\\n"
               : "=r"(elected));
  return elected != 0;
}""",
    "u32": """\
// 32-bit view of a register-array element (fragment register j of a 16/8-bit array).
template <typename T>
__device__ __forceinline__ unsigned& hl_u32(T& x) { return *reinterpret_cast<unsigned*>(&x); }""",
    "gmma_desc": """\
// wgmma shared-memory matrix descriptor: start address, leading / stride byte offsets (bytes),
// layout type (0 none, 1 128B, 2 64B, 3 32B swizzle) in bits 62-63.
__device__ __forceinline__ unsigned long long hl_gmma_desc(unsigned addr, unsigned lbo, unsigned sbo,
                                                           unsigned layout_type) {
  return static_cast<unsigned long long>((addr >> 4) & 0x3FFFu)
       | static_cast<unsigned long long>((lbo >> 4) & 0x3FFFu) << 16
       | static_cast<unsigned long long>((sbo >> 4) & 0x3FFFu) << 32
       | static_cast<unsigned long long>(layout_type & 3u) << 62;
}""",
    "umma_desc": """\
// tcgen05 (sm_100a) shared-memory descriptor: start address, leading / stride byte offsets
// (bytes), the fixed version 1 at bit 46, layout type (0 none, 2 128B, 4 64B, 6 32B) in bits 61-63.
__device__ __forceinline__ unsigned long long hl_umma_desc(unsigned addr, unsigned lbo, unsigned sbo,
                                                           unsigned layout_type) {
  return static_cast<unsigned long long>((addr >> 4) & 0x3FFFu)
       | static_cast<unsigned long long>((lbo >> 4) & 0x3FFFu) << 16
       | static_cast<unsigned long long>((sbo >> 4) & 0x3FFFu) << 32
       | 1ull << 46
       | static_cast<unsigned long long>(layout_type & 7u) << 61;
}""",
    "gmma_desc_add": """\
// A descriptor whose start address is `units` 16-byte units further: added to the low word
// (the 14-bit address field; shared-window addresses stay below 2^18 bytes, so no carry
// leaves it), as CUTLASS's descriptor iterator advances its descriptors.
__device__ __forceinline__ unsigned long long hl_gmma_desc_add(unsigned long long desc, int units) {
  const unsigned lo = static_cast<unsigned>(desc) + static_cast<unsigned>(units);
  return (desc & 0xFFFFFFFF00000000ull) | lo;
}""",
    # sm_90 waits with try_wait (the hardware suspends the thread a while), sm_80 polls test_wait
    "mbar_wait_sm90": _MBAR_WAIT.replace("<wait>", "try_wait"),
    "mbar_wait_sm80": _MBAR_WAIT.replace("<wait>", "test_wait"),
    "shfl": """\
// shfl.sync of an element narrower than 32 bits (moved as its bit pattern).
template <typename T>
__device__ __forceinline__ T hl_shfl(T x, int arg, int width, int mode) {
  unsigned u = 0;
  *reinterpret_cast<T*>(&u) = x;
  // mode: 0 bfly, 1 idx, 2 up, 3 down (as hexlayout.codegen.alu._SHFL_FN)
  u = mode == 0 ? __shfl_xor_sync(0xffffffffu, u, arg, width)
    : mode == 1 ? __shfl_sync(0xffffffffu, u, arg, width)
    : mode == 2 ? __shfl_up_sync(0xffffffffu, u, arg, width)
    : __shfl_down_sync(0xffffffffu, u, arg, width);
  return *reinterpret_cast<T*>(&u);
}""",
    "ex2_approx_ftz": """\
// 2**x by the hardware approximation (MUFU.EX2), subnormal inputs and results flushed to zero.
__device__ __forceinline__ float hl_ex2_approx_ftz(float x) {
  float r;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(r) : "f"(x));
  return r;
}""",
    "lop3_and_or": """\
// (a & MASK) | OR as one LOP3 with both constants as immediates of the PTX instruction: ptxas
// keeps the constant it cannot encode in one register (a C expression gets it re-materialized
// by an IMAD.MOV before each use).
template <unsigned MASK, unsigned OR>
__device__ __forceinline__ unsigned hl_lop3_and_or(unsigned a) {
  unsigned r;
  asm("lop3.b32 %0, %1, %2, %3, 0xea;" : "=r"(r) : "r"(a), "n"(MASK), "n"(OR));
  return r;
}""",
    "tensor_map": """\
// The 128-byte tensor map of cuda.h (encoded on the host by cuTensorMapEncodeTiled).
typedef struct __align__(64) CUtensorMap_st { unsigned long long opaque[16]; } CUtensorMap;""",
}

_ORDER = ("tensor_map", "u32", "gmma_desc", "umma_desc", "gmma_desc_add", "mbar_wait_sm90", "mbar_wait_sm80",
          "shfl", "ex2_approx_ftz", "lop3_and_or", "elect_one")


def helper_source(used: set[str]) -> str:
    """The helpers in ``used``, in a fixed order."""
    unknown = used - set(HELPERS)
    if unknown:
        raise KeyError(f"unknown helpers {sorted(unknown)}")
    return "\n\n".join(HELPERS[h] for h in _ORDER if h in used)
