// mma.cuh: warp-level matrix PTX: ldmatrix / stmatrix (8x8 b16 tiles between shared memory and
// registers), mma.sync m16n8k16 in BF16, and the packing of FP32 values into BF16 pairs and into
// the A fragments of a register-sourced wgmma.
//
// Fragment layouts of mma.m16n8k16 (g = lane/4, t = lane%4):
//   A (16x16, row): a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B (16x8, col):  b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
//   C (16x8):       c0,c1 (g, 2t..2t+1)   c2,c3 (g+8, 2t..2t+1)
// so the C fragments of two neighbouring n-tiles of S are the A fragment of P for PV (no
// shuffles). The wgmma accumulator layout is, per warp of the warpgroup, that of C repeated over
// the N/8 n-tiles.
#ifndef PTX_MMA_CUH
#define PTX_MMA_CUH

#include <cuda_bf16.h>  // __nv_bfloat162, __floats2bfloat162_rn
#include <stdint.h>     // uint32_t

#include "gpu/ptx/smem.cuh"  // smem_addr

// Four 8x8 b16 tiles to shared memory (the inverse of ldmatrix_x4): lanes 8i .. 8i+7 give the row
// addresses of tile i, and every lane's r[i] holds its fragment of tile i (row lane / 4, columns
// 2 (lane % 4), +1: the mma / wgmma accumulator layout of an 8-column slice, packed).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// c += a * b, BF16 inputs, FP32 accumulators.
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> packed BF16 pair (lo in the low half), round to nearest even.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// FP32 accumulator layout (m64nN, N/2 values per thread) -> the BF16 A fragments of an RS wgmma
// over the same N (k16 step kk: elements 8kk .. 8kk + 7, paired).
template <int N>
__device__ __forceinline__ void pack_bf16_afrags(uint32_t (&a)[N / 16][4], const float (&s)[N / 2]) {
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++)
#pragma unroll
        for (int e = 0; e < 4; e++) a[kk][e] = pack_bf16(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
}

#endif  // PTX_MMA_CUH
