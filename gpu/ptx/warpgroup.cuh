// warpgroup.cuh: what warp-specialized kernels need beyond copies and matmuls: named barriers
// (over any multiple of 32 threads, and one per consumer warpgroup), the per-warpgroup register
// budget (setmaxnreg), and two ways to keep the compiler and ptxas from moving code where a
// kernel's schedule needs it kept (opaque_u32, nsmid_nonzero).
#ifndef PTX_WARPGROUP_CUH
#define PTX_WARPGROUP_CUH

#include <stdint.h>  // uint32_t

// Named barrier ID (1..15; 0 is __syncthreads') over N threads (a multiple of 32). Immediate
// operands, so that ptxas reserves only the barriers a kernel names.
template <int ID, int N>
__device__ __forceinline__ void named_bar_sync() { asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(N) : "memory"); }
template <int ID, int N>
__device__ __forceinline__ void named_bar_arrive() { asm volatile("bar.arrive %0, %1;\n" ::"n"(ID), "n"(N) : "memory"); }
// Named barrier BASE + wg over the 128 threads of consumer warpgroup wg (0 or 1): each
// warpgroup's own, with immediate ids.
template <int BASE>
__device__ __forceinline__ void wg_bar_sync(int wg) {
    if (wg == 0) named_bar_sync<BASE, 128>();
    else named_bar_sync<BASE + 1, 128>();
}
// Register budget per thread of the executing warpgroup (needs a register cap at kernel entry:
// __launch_bounds__(threads, 1)).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }
// x itself, opaque to the compiler: addresses and descriptors derived from it inside a loop body
// are recomputed there (a few integer adds) instead of hoisted out of the loop into registers, of
// which the attention kernels have none to spare.
__device__ __forceinline__ uint32_t opaque_u32(uint32_t x) {
    asm volatile("mov.b32 %0, %0;\n" : "+r"(x));
    return x;
}
// True on every GPU (the number of SMs), but neither the compiler nor ptxas can know it: code
// under `if (nsmid_nonzero())` lies in a basic block of its own, and ptxas moves no instruction
// of the code after it (a wgmma wait, say) up into it or above it. The kernels use it where
// ptxas's scheduler would otherwise hoist a wait for a wgmma group above the work meant to
// overlap that group. Measure each use: it pays in tile_p_dp (attention/bwd_fp8_tile.cuh) and
// costs in the delta pass, which does without it.
__device__ __forceinline__ bool nsmid_nonzero(void) {
    uint32_t n;
    asm volatile("mov.u32 %0, %%nsmid;\n" : "=r"(n));
    return n != 0;
}

#endif  // PTX_WARPGROUP_CUH
