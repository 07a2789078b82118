// attention_fwd_bf16_1_mma.cu: lab version 1 of the fused causal BF16 attention forward:
// FlashAttention-2 on mma.sync (m16n8k16), one CTA of 8 warps per 128 query rows (16 per warp),
// key blocks of 64, K and V double-buffered by cp.async in padded tiles, P fed from the S
// accumulators to P V in registers. Version 2 (attention_fwd_bf16_2_pipe.cu) moves to wgmma with
// 128 x 128 tiles; version 3 is the library's (attention/fwd_bf16.cu: a TMA producer warpgroup).
// The program checks this kernel's O and LSE against the library's on the same inputs (P is
// rounded to BF16 against a running max per key block, and the key blocks differ: a tolerance)
// and times both.
//
//   make -C dev/cuda && build/dev/attention_fwd_bf16_1_mma [d=128] [T ...]
#include <cuda_runtime.h>  // launches, cudaFuncSetAttribute
#include <math.h>          // INFINITY, sqrtf
#include <stdint.h>        // uint16_t, uint32_t

#include "attention/common.cuh"       // quad_sum, online_max_step, fwd_store_rows, ldmatrix_x4, mma_bf16
#include "attention/kernels_bf16.h"   // attn_gpu_forward: the library's version
#include "dev/cuda/attention_lab.cuh"  // LabShapes, lab_diff_*, lab_report, timing
#include "dev/cuda/mma_tiles.cuh"      // load_tile, mma_frag_rowtile

#define FWD_BQ 128   // query rows per CTA: 8 warps x 16
#define FWD_BK 64    // keys per block
#define FWD_WARPS 8

// grid (ceil(T/FWD_BQ), B*H), block FWD_WARPS*32. Warp w owns query rows q0+16w .. q0+16w+15.
// Online softmax in the log2 domain: p = 2^(s*scale_log2 - m*scale_log2), scale_log2 =
// tau*log2(e); the running max m advances once per key block; P is rounded to BF16 for PV,
// the row sum l accumulates the FP32 P.
template <int D>
__global__ void __launch_bounds__(FWD_WARPS * 32, 1)
    attn_fwd_kernel(const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                    const bf16 *__restrict__ v, int qkv_stride, bf16 *__restrict__ o,
                    int o_stride, float *__restrict__ lse, int H, int T, float scale_log2) {
    constexpr int P = D + 8;  // shared row pitch
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *sQ = reinterpret_cast<bf16 *>(smem_raw);  // (FWD_BQ, P)
    bf16 *sK = sQ + FWD_BQ * P;                     // 2 x (FWD_BK, P)
    bf16 *sV = sK + 2 * FWD_BK * P;                 // 2 x (FWD_BK, P)

    const int qb = gridDim.x - 1 - blockIdx.x;  // heaviest (last) query blocks start first
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const long base = (long)b * T * qkv_stride + (long)h * D;
    const bf16 *gq = q + base, *gk = k + base, *gv = v + base;
    const int q0 = qb * FWD_BQ;
    const int row_w0 = q0 + warp * 16;                         // warp's first query row
    const int n_kb = (min(q0 + FWD_BQ, T) - 1) / FWD_BK + 1;  // key blocks with a visible key

    load_tile<FWD_BQ, D, FWD_WARPS * 32>(sQ, gq, qkv_stride, q0, T, tid);
    load_tile<FWD_BK, D, FWD_WARPS * 32>(sK, gk, qkv_stride, 0, T, tid);
    load_tile<FWD_BK, D, FWD_WARPS * 32>(sV, gv, qkv_stride, 0, T, tid);
    cp_async_commit();

    uint32_t qf[D / 16][4];  // this warp's 16 query rows as A fragments
    float oacc[D / 8][4];    // (16, D) output accumulator
#pragma unroll
    for (int i = 0; i < D / 8; i++) oacc[i][0] = oacc[i][1] = oacc[i][2] = oacc[i][3] = 0.f;
    float m[2] = {-INFINITY, -INFINITY};  // running max (raw score units) of rows g, g+8
    float l[2] = {0.f, 0.f};              // this thread's part of the row sums

    for (int kb = 0; kb < n_kb; kb++) {
        const int buf = kb & 1;
        cp_async_wait_all();
        __syncthreads();  // tile kb is visible; everyone is done with buffer buf^1
        if (kb == 0) {
#pragma unroll
            for (int kk = 0; kk < D / 16; kk++)
                ldmatrix_x4(qf[kk], sQ + (warp * 16 + (lane & 15)) * P + kk * 16 + (lane >> 4) * 8);
        }
        if (kb + 1 < n_kb) {
            load_tile<FWD_BK, D, FWD_WARPS * 32>(sK + (buf ^ 1) * FWD_BK * P, gk, qkv_stride,
                                                 (kb + 1) * FWD_BK, T, tid);
            load_tile<FWD_BK, D, FWD_WARPS * 32>(sV + (buf ^ 1) * FWD_BK * P, gv, qkv_stride,
                                                 (kb + 1) * FWD_BK, T, tid);
            cp_async_commit();
        }
        const int k0 = kb * FWD_BK;
        if (k0 > row_w0 + 15) continue;  // every key of this block is after this warp's rows
        const bf16 *cK = sK + buf * FWD_BK * P, *cV = sV + buf * FWD_BK * P;

        // S = Q K^T for (16, FWD_BK)
        float s[FWD_BK / 8][4];
#pragma unroll
        for (int i = 0; i < FWD_BK / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
#pragma unroll
            for (int n2 = 0; n2 < FWD_BK / 16; n2++) {
                uint32_t bk[4];
                ldmatrix_x4(bk, cK + (n2 * 16 + (lane & 7) + ((lane >> 4) << 3)) * P + kk * 16 +
                                    ((lane >> 3) & 1) * 8);
                mma_bf16(s[2 * n2], qf[kk], bk[0], bk[1]);
                mma_bf16(s[2 * n2 + 1], qf[kk], bk[2], bk[3]);
            }
        }
        // causal mask (and keys past T) on blocks that reach the diagonal or the end
        if (k0 + FWD_BK - 1 > row_w0 || k0 + FWD_BK > T) {
#pragma unroll
            for (int n = 0; n < FWD_BK / 8; n++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int col = k0 + n * 8 + 2 * t4 + (e & 1), row = row_w0 + g + (e >> 1) * 8;
                    if (col > row || col >= T) s[n][e] = -INFINITY;
                }
        }
        // online softmax. Block 0 always has key 0 visible to every row, so m is finite from
        // then on and fully masked rows of later blocks give p = 0, alpha = 1.
        float mx[2] = {m[0], m[1]};
#pragma unroll
        for (int n = 0; n < FWD_BK / 8; n++) {
            mx[0] = fmaxf(mx[0], fmaxf(s[n][0], s[n][1]));
            mx[1] = fmaxf(mx[1], fmaxf(s[n][2], s[n][3]));
        }
        float ms[2], alpha[2];
        online_max_step(mx, m, ms, alpha, scale_log2);
        float rs[2] = {0.f, 0.f};
#pragma unroll
        for (int n = 0; n < FWD_BK / 8; n++) {
            s[n][0] = exp2f(s[n][0] * scale_log2 - ms[0]);
            s[n][1] = exp2f(s[n][1] * scale_log2 - ms[0]);
            s[n][2] = exp2f(s[n][2] * scale_log2 - ms[1]);
            s[n][3] = exp2f(s[n][3] * scale_log2 - ms[1]);
            rs[0] += s[n][0] + s[n][1];
            rs[1] += s[n][2] + s[n][3];
        }
        l[0] = l[0] * alpha[0] + rs[0];
        l[1] = l[1] * alpha[1] + rs[1];
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            oacc[n][0] *= alpha[0];
            oacc[n][1] *= alpha[0];
            oacc[n][2] *= alpha[1];
            oacc[n][3] *= alpha[1];
        }
        mma_frag_rowtile<FWD_BK, D>(oacc, s, cV, P, lane);  // O += P V, P from the S accumulators
    }

    // epilogue: full row sums, O = acc / l in BF16, LSE in natural log
    quad_sum(l);
    const float inv_l[2] = {1.f / l[0], 1.f / l[1]};
    fwd_store_rows<D>(reinterpret_cast<const float(&)[D / 2]>(oacc), inv_l, o + (long)b * T * o_stride + (long)h * D,
                      o_stride, lse + (long)bh * T, row_w0 + g, T, t4,
                      [&](int r) { return (m[r] * scale_log2 + log2f(l[r])) * 0.69314718056f; });
}

template <int D>
static void forward_mma(const bf16 *q, const bf16 *k, const bf16 *v, int qkv_stride, bf16 *o, int o_stride,
                        float *lse, int B, int H, int T) {
    const size_t smem = (size_t)(FWD_BQ + 4 * FWD_BK) * (D + 8) * sizeof(bf16);
    CU(cudaFuncSetAttribute(attn_fwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)D);
    dim3 grid((T + FWD_BQ - 1) / FWD_BQ, B * H);
    attn_fwd_kernel<D><<<grid, FWD_WARPS * 32, smem>>>(q, k, v, qkv_stride, o, o_stride, lse, H, T, scale_log2);
    CU(cudaGetLastError());
}

int main(int argc, char **argv) {
    return lab_forward_main(argc, argv, "library (wgmma, TMA)", "lab 1 (mma.sync)", false, 1e-2,
                            [](int d, const uint16_t *q, const uint16_t *k, const uint16_t *v, int ld, uint16_t *o,
                               int ldo, float *lse, int B, int H, int T) {
                                const bf16 *bq = (const bf16 *)q, *bk = (const bf16 *)k, *bv = (const bf16 *)v;
                                if (d == 64) forward_mma<64>(bq, bk, bv, ld, (bf16 *)o, ldo, lse, B, H, T);
                                else forward_mma<128>(bq, bk, bv, ld, (bf16 *)o, ldo, lse, B, H, T);
                            });
}
