// mma_tiles.cuh: the tile helpers of the mma.sync lab versions (attention_fwd_bf16_1_mma.cu,
// attention_bwd_bf16_1_mma.cu): padded shared-memory tiles loaded by cp.async (rows padded by 8
// elements, 16 bytes, which makes every ldmatrix and 16-byte cp.async free of bank conflicts) and
// one warp's product of its FP32 fragments, rounded to BF16, with such a tile.
#pragma once

#include <stdint.h>  // uint32_t

#include "attention/common.cuh"  // bf16, cp_async16, ldmatrix_x4_trans, mma_bf16, pack_bf16

// Copies rows [row0, row0+ROWS) of a (T, stride) BF16 matrix (D columns used) into a shared
// tile with row pitch D+8; rows >= T become zeros (so masked keys never bring NaN into PV).
template <int ROWS, int D, int NTHREADS>
__device__ __forceinline__ void load_tile(bf16 *s, const bf16 *g, long stride, int row0, int T,
                                          int tid) {
    constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
    static_assert(ROWS * CHUNKS % NTHREADS == 0, "tile copy must split evenly over the threads");
#pragma unroll
    for (int i = 0; i < ROWS * CHUNKS / NTHREADS; i++) {
        int c = tid + i * NTHREADS;
        int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        int t = row0 + r;
        bool ok = t < T;
        cp_async16(s + r * (D + 8) + col, g + (long)(ok ? t : 0) * stride + col, ok);
    }
}

// acc (16 x N) += A (16 x K) * B (K x N) for one warp of the mma.sync kernels: A is the BF16
// rounding of this warp's FP32 m16n8 accumulator fragments a (K/8 of them: P, P^T or dS^T, fed
// to the next product straight from registers), B a row-major BF16 tile in shared memory (K rows
// of pitch elements: V, dO or Q) read transposed by ldmatrix. The O += P V of the forward and the
// dV += P^T dO, dK += dS^T Q of the backward.
template <int K, int N>
__device__ __forceinline__ void mma_frag_rowtile(float (&acc)[N / 8][4], const float (&a)[K / 8][4], const bf16 *b,
                                                 int pitch, int lane) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        const uint32_t pa[4] = {pack_bf16(a[2 * kk][0], a[2 * kk][1]), pack_bf16(a[2 * kk][2], a[2 * kk][3]),
                                pack_bf16(a[2 * kk + 1][0], a[2 * kk + 1][1]),
                                pack_bf16(a[2 * kk + 1][2], a[2 * kk + 1][3])};
#pragma unroll
        for (int n2 = 0; n2 < N / 16; n2++) {
            uint32_t bt[4];
            ldmatrix_x4_trans(bt, b + (kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3)) * pitch + n2 * 16 +
                                      (lane >> 4) * 8);
            mma_bf16(acc[2 * n2], pa, bt[0], bt[1]);
            mma_bf16(acc[2 * n2 + 1], pa, bt[2], bt[3]);
        }
    }
}
