// attention_bwd_bf16_1_mma.cu: lab version 1 of the fused causal BF16 attention backward:
// FlashAttention-2 on mma.sync (m16n8k16), one CTA of 4 warps per 64 keys (16 per warp, their dK
// and dV rows in registers) walking the query blocks of 64 from the diagonal down, dQ added into
// an FP32 accumulator with atomics, between the library's D preprocess and its dQ conversion
// (copied here, and called: attn_bwd_convert_dq). Version 2 is the library's
// (attention/bwd_bf16.cu: wgmma, 128 keys per CTA, a TMA producer warpgroup). The program runs
// the library's forward, then both backwards on its O and LSE, checks dQ, dK, dV against the
// library's (the same numerics in other tiles, dQ's FP32 atomics in any order: a tolerance) and
// times both.
//
//   make -C dev/cuda && build/dev/attention_bwd_bf16_1_mma [d=128] [T ...]
#include <cuda_runtime.h>  // launches, cudaFuncSetAttribute
#include <math.h>          // sqrtf
#include <stdint.h>        // uint16_t, uint32_t

#include "attention/common.cuh"       // cp_async4, ldmatrix_x4(_trans), mma_bf16, pack_bf16, attn_bwd_convert_dq
#include "attention/kernels_bf16.h"   // attn_gpu_forward, attn_gpu_backward: the library's version
#include "dev/cuda/attention_lab.cuh"  // LabShapes, lab_diff_*, lab_report, timing
#include "dev/cuda/mma_tiles.cuh"      // load_tile, mma_frag_rowtile

// Tiles: 64 keys per CTA (4 warps x 16 keys), query blocks of 64.
#define BWD_BQ 64
#define BWD_BK 64
#define BWD_WARPS 4

// --- D and the zeroed dQ accumulator (a copy of the library's preprocess kernel) ------------------
// One warp per (b, t, h) row: Dlt[b,h,t] = sum_c dO*O (FP32), and zero the row of the FP32 dQ
// accumulator (B, H, T, D).
template <int D>
__global__ void lab_bwd_preprocess_kernel(const bf16 *__restrict__ o, const bf16 *__restrict__ dout,
                                           int o_stride, float *__restrict__ dlt,
                                           float *__restrict__ dq_acc, int B, int H, int T) {
    const long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // (b*T + t)*H + h
    const int lane = threadIdx.x % 32;
    if (row >= (long)B * T * H) return;
    const int h = (int)(row % H);
    const long bt = row / H;
    const int t = (int)(bt % T), b = (int)(bt / T);
    const long off = bt * o_stride + (long)h * D;
    float acc = 0.f;
#pragma unroll
    for (int c = lane * 2; c < D; c += 64) {
        float2 of = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(o + off + c));
        float2 df = __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162 *>(dout + off + c));
        acc += of.x * df.x + of.y * df.y;
    }
#pragma unroll
    for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
    const long bht = ((long)b * H + h) * T + t;
    if (lane == 0) dlt[bht] = acc;
    float *dqrow = dq_acc + bht * D;
#pragma unroll
    for (int c = lane * 4; c < D; c += 128) *reinterpret_cast<float4 *>(dqrow + c) = make_float4(0, 0, 0, 0);
}

// --- backward: main ----------------------------------------------------------------------------
// grid (ceil(T/BWD_BK), B*H), block BWD_WARPS*32. Warp w owns keys k0+16w .. k0+16w+15 and keeps
// their dK, dV rows in registers. Per query block (from the diagonal down): S^T = K Q^T,
// P^T = 2^(S^T*scale_log2 - LSE*log2e), dP^T = V dO^T, dS^T = P^T (dP^T - D);
// dV += P^T dO (P in BF16), dK += dS^T Q (dS in BF16), and dQ += dS K through shared memory and
// FP32 atomics into dq_acc.
template <int D>
__global__ void __launch_bounds__(BWD_WARPS * 32, 2)
    attn_bwd_kernel(const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                    const bf16 *__restrict__ v, int qkv_stride, const bf16 *__restrict__ dout,
                    int o_stride, const float *__restrict__ lse, const float *__restrict__ dlt,
                    float *__restrict__ dq_acc, bf16 *__restrict__ dk, bf16 *__restrict__ dv,
                    int dqkv_stride, int H, int T, float scale_log2, float tau) {
    constexpr int P = D + 8;           // pitch of Q, K, V, dO tiles
    constexpr int PS = BWD_BQ + 8;     // pitch of the dS^T tile
    extern __shared__ __align__(16) unsigned char smem_raw[];
    bf16 *sK = reinterpret_cast<bf16 *>(smem_raw);  // (BWD_BK, P)
    bf16 *sV = sK + BWD_BK * P;                     // (BWD_BK, P)
    bf16 *sQ = sV + BWD_BK * P;                     // 2 x (BWD_BQ, P)
    bf16 *sdO = sQ + 2 * BWD_BQ * P;                // 2 x (BWD_BQ, P)
    bf16 *sdS = sdO + 2 * BWD_BQ * P;               // (BWD_BK, PS): dS^T, keys x queries
    float *sL = reinterpret_cast<float *>(sdS + BWD_BK * PS);  // 2 x BWD_BQ: LSE (natural log)
    float *sDl = sL + 2 * BWD_BQ;                              // 2 x BWD_BQ: D

    const int kb = blockIdx.x;
    const int bh = blockIdx.y, b = bh / H, h = bh % H;
    const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const long base = (long)b * T * qkv_stride + (long)h * D;
    const long obase = (long)b * T * o_stride + (long)h * D;
    const bf16 *gq = q + base, *gk = k + base, *gv = v + base, *gdo = dout + obase;
    const float *glse = lse + (long)bh * T, *gdl = dlt + (long)bh * T;
    float *gdq = dq_acc + (long)bh * T * D;
    const int k0 = kb * BWD_BK;
    const int kw0 = k0 + warp * 16;  // warp's first key
    const int qb0 = k0 / BWD_BQ, n_qb = (T + BWD_BQ - 1) / BWD_BQ;
    constexpr float LOG2E = 1.4426950408889634f;

    auto load_q_block = [&](int qb, int buf) {
        load_tile<BWD_BQ, D, BWD_WARPS * 32>(sQ + buf * BWD_BQ * P, gq, qkv_stride, qb * BWD_BQ, T, tid);
        load_tile<BWD_BQ, D, BWD_WARPS * 32>(sdO + buf * BWD_BQ * P, gdo, o_stride, qb * BWD_BQ, T, tid);
        for (int i = tid; i < BWD_BQ; i += BWD_WARPS * 32) {
            int t = qb * BWD_BQ + i;
            bool ok = t < T;  // rows past T: LSE = D = 0 with Q = dO = 0, so they add nothing
            cp_async4(sL + buf * BWD_BQ + i, glse + (ok ? t : 0), ok);
            cp_async4(sDl + buf * BWD_BQ + i, gdl + (ok ? t : 0), ok);
        }
    };
    load_tile<BWD_BK, D, BWD_WARPS * 32>(sK, gk, qkv_stride, k0, T, tid);
    load_tile<BWD_BK, D, BWD_WARPS * 32>(sV, gv, qkv_stride, k0, T, tid);
    load_q_block(qb0, 0);
    cp_async_commit();

    float dka[D / 8][4], dva[D / 8][4];  // (16 keys, D) each
#pragma unroll
    for (int i = 0; i < D / 8; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) dka[i][e] = dva[i][e] = 0.f;

    for (int qb = qb0; qb < n_qb; qb++) {
        const int buf = (qb - qb0) & 1;
        cp_async_wait_all();
        __syncthreads();  // block qb visible; buffer buf^1 and sdS free
        if (qb + 1 < n_qb) {
            load_q_block(qb + 1, buf ^ 1);
            cp_async_commit();
        }
        const bf16 *cQ = sQ + buf * BWD_BQ * P, *cdO = sdO + buf * BWD_BQ * P;
        const float *cL = sL + buf * BWD_BQ, *cD = sDl + buf * BWD_BQ;
        const int q0 = qb * BWD_BQ;

        // S^T = K Q^T: (16 keys, BWD_BQ queries)
        float s[BWD_BQ / 8][4];
#pragma unroll
        for (int i = 0; i < BWD_BQ / 8; i++) s[i][0] = s[i][1] = s[i][2] = s[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t ka[4];
            ldmatrix_x4(ka, sK + (warp * 16 + (lane & 15)) * P + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int n2 = 0; n2 < BWD_BQ / 16; n2++) {
                uint32_t bq[4];
                ldmatrix_x4(bq, cQ + (n2 * 16 + (lane & 7) + ((lane >> 4) << 3)) * P + kk * 16 +
                                    ((lane >> 3) & 1) * 8);
                mma_bf16(s[2 * n2], ka, bq[0], bq[1]);
                mma_bf16(s[2 * n2 + 1], ka, bq[2], bq[3]);
            }
        }
        // P^T from the saved LSE; causal mask (key > query) only on the diagonal block
        const bool diag = q0 < kw0 + 15;
#pragma unroll
        for (int n = 0; n < BWD_BQ / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int ql = n * 8 + 2 * t4 + (e & 1);
                int key = kw0 + g + (e >> 1) * 8;
                float p = exp2f(fminf(s[n][e] * scale_log2 - cL[ql] * LOG2E, 0.f));  // P <= 1 (see the wgmma kernel)
                s[n][e] = (diag && key > q0 + ql) ? 0.f : p;
            }
        mma_frag_rowtile<BWD_BQ, D>(dva, s, cdO, P, lane);  // dV += P^T dO (P in BF16)
        // dP^T = V dO^T
        float dp[BWD_BQ / 8][4];
#pragma unroll
        for (int i = 0; i < BWD_BQ / 8; i++) dp[i][0] = dp[i][1] = dp[i][2] = dp[i][3] = 0.f;
#pragma unroll
        for (int kk = 0; kk < D / 16; kk++) {
            uint32_t va[4];
            ldmatrix_x4(va, sV + (warp * 16 + (lane & 15)) * P + kk * 16 + (lane >> 4) * 8);
#pragma unroll
            for (int n2 = 0; n2 < BWD_BQ / 16; n2++) {
                uint32_t bo[4];
                ldmatrix_x4(bo, cdO + (n2 * 16 + (lane & 7) + ((lane >> 4) << 3)) * P + kk * 16 +
                                    ((lane >> 3) & 1) * 8);
                mma_bf16(dp[2 * n2], va, bo[0], bo[1]);
                mma_bf16(dp[2 * n2 + 1], va, bo[2], bo[3]);
            }
        }
        // dS^T = P^T (dP^T - D), rounded to BF16; also written to shared memory for dQ
#pragma unroll
        for (int n = 0; n < BWD_BQ / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) dp[n][e] = s[n][e] * (dp[n][e] - cD[n * 8 + 2 * t4 + (e & 1)]);
#pragma unroll
        for (int n = 0; n < BWD_BQ / 8; n++) {
            *reinterpret_cast<uint32_t *>(sdS + (warp * 16 + g) * PS + n * 8 + 2 * t4) =
                pack_bf16(dp[n][0], dp[n][1]);
            *reinterpret_cast<uint32_t *>(sdS + (warp * 16 + g + 8) * PS + n * 8 + 2 * t4) =
                pack_bf16(dp[n][2], dp[n][3]);
        }
        mma_frag_rowtile<BWD_BQ, D>(dka, dp, cQ, P, lane);  // dK += dS^T Q (dS in BF16)
        __syncthreads();  // the whole dS^T tile is in shared memory
        // dQ (queries 16w..16w+15 of this block) += dS K, A fragments from dS^T transposed
        uint32_t dsa[BWD_BK / 16][4];
#pragma unroll
        for (int kk = 0; kk < BWD_BK / 16; kk++)
            ldmatrix_x4_trans(dsa[kk], sdS + (kk * 16 + (lane & 7) + ((lane >> 4) << 3)) * PS +
                                           warp * 16 + ((lane >> 3) & 1) * 8);
        const int qrow0 = q0 + warp * 16 + g;
#pragma unroll
        for (int n2 = 0; n2 < D / 16; n2++) {
            float acc[2][4] = {{0.f, 0.f, 0.f, 0.f}, {0.f, 0.f, 0.f, 0.f}};
#pragma unroll
            for (int kk = 0; kk < BWD_BK / 16; kk++) {
                uint32_t bk[4];
                ldmatrix_x4_trans(bk, sK + (kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3)) * P +
                                          n2 * 16 + (lane >> 4) * 8);
                mma_bf16(acc[0], dsa[kk], bk[0], bk[1]);
                mma_bf16(acc[1], dsa[kk], bk[2], bk[3]);
            }
#pragma unroll
            for (int j = 0; j < 2; j++) {
                const int col = n2 * 16 + j * 8 + 2 * t4;
                if (qrow0 < T)
                    atomicAdd(reinterpret_cast<float2 *>(gdq + (long)qrow0 * D + col),
                              make_float2(acc[j][0], acc[j][1]));
                if (qrow0 + 8 < T)
                    atomicAdd(reinterpret_cast<float2 *>(gdq + (long)(qrow0 + 8) * D + col),
                              make_float2(acc[j][2], acc[j][3]));
            }
        }
    }

    // epilogue: dV, and dK scaled by tau, in BF16
    const long gbase = (long)b * T * dqkv_stride + (long)h * D;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = kw0 + g + r * 8;
        if (key >= T) continue;
        bf16 *dkrow = dk + gbase + (long)key * dqkv_stride, *dvrow = dv + gbase + (long)key * dqkv_stride;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            *reinterpret_cast<uint32_t *>(dvrow + n * 8 + 2 * t4) = pack_bf16(dva[n][2 * r], dva[n][2 * r + 1]);
            *reinterpret_cast<uint32_t *>(dkrow + n * 8 + 2 * t4) =
                pack_bf16(dka[n][2 * r] * tau, dka[n][2 * r + 1] * tau);
        }
    }
}

// The whole backward: D and the zeroed dQ accumulator, the main kernel, dQ in BF16. workspace:
// attn_gpu_backward_workspace_bytes (dQ accumulator (B, H, T, D), then D (B, H, T)).
template <int D>
static void backward_mma(const bf16 *q, const bf16 *k, const bf16 *v, int qkv_stride, const bf16 *o,
                         const bf16 *dout, int o_stride, const float *lse, bf16 *dq, bf16 *dk, bf16 *dv,
                         int dqkv_stride, void *workspace, int B, int H, int T) {
    float *dq_acc = (float *)workspace;           // (B, H, T, D)
    float *dlt = dq_acc + (size_t)B * H * T * D;  // (B, H, T)
    const long rows = (long)B * T * H;
    lab_bwd_preprocess_kernel<D><<<(unsigned)((rows + 7) / 8), 256>>>(o, dout, o_stride, dlt, dq_acc, B, H, T);
    CU(cudaGetLastError());
    const float tau = 1.f / sqrtf((float)D);
    const size_t smem = (size_t)(2 * BWD_BK + 4 * BWD_BQ) * (D + 8) * sizeof(bf16) +
                        (size_t)BWD_BK * (BWD_BQ + 8) * sizeof(bf16) + 4 * BWD_BQ * sizeof(float);
    CU(cudaFuncSetAttribute(attn_bwd_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    dim3 grid((T + BWD_BK - 1) / BWD_BK, B * H);
    attn_bwd_kernel<D><<<grid, BWD_WARPS * 32, smem>>>(q, k, v, qkv_stride, dout, o_stride, lse, dlt, dq_acc, dk, dv,
                                                       dqkv_stride, H, T, 1.4426950408889634f * tau, tau);
    CU(cudaGetLastError());
    attn_bwd_convert_dq(dq_acc, dq, dqkv_stride, B, H, T, D, tau, 0);
}

int main(int argc, char **argv) {
    const LabShapes sh(argc, argv);
    const int d = sh.d, H = sh.H, C = H * d;
    bool ok = true;
    for (int T : sh.Ts) {
        const int B = sh.batch(T);
        const size_t n_tok = (size_t)B * T;
        uint16_t *qkv = random_bf16(n_tok * 3 * C, 1234u + T), *dout = random_bf16(n_tok * C, 99u + T), *o;
        uint16_t *dqkv_ref, *dqkv_lab;
        float *lse;
        void *ws;
        CU(cudaMalloc(&o, n_tok * C * 2));
        CU(cudaMalloc(&dqkv_ref, n_tok * 3 * C * 2));
        CU(cudaMalloc(&dqkv_lab, n_tok * 3 * C * 2));
        CU(cudaMalloc(&lse, (size_t)B * H * T * 4));
        CU(cudaMalloc(&ws, attn_gpu_backward_workspace_bytes(B, H, T, d)));
        const uint16_t *q = qkv, *k = qkv + C, *v = qkv + 2 * C;
        attn_gpu_forward(q, k, v, 3 * C, o, C, lse, B, H, T, d, 0);
        auto lib = [&] {
            attn_gpu_backward(q, k, v, 3 * C, o, dout, C, lse, dqkv_ref, dqkv_ref + C, dqkv_ref + 2 * C, 3 * C, ws, B,
                              H, T, d, 0);
        };
        auto lab = [&] {
            const bf16 *bq = (const bf16 *)q, *bk = (const bf16 *)k, *bv = (const bf16 *)v, *bo = (const bf16 *)o,
                       *bdo = (const bf16 *)dout;
            bf16 *g = (bf16 *)dqkv_lab;
            if (d == 64) backward_mma<64>(bq, bk, bv, 3 * C, bo, bdo, C, lse, g, g + C, g + 2 * C, 3 * C, ws, B, H, T);
            else backward_mma<128>(bq, bk, bv, 3 * C, bo, bdo, C, lse, g, g + C, g + 2 * C, 3 * C, ws, B, H, T);
        };
        lib();
        lab();
        CU(cudaDeviceSynchronize());
        printf("T=%d B=%d H=%d d=%d\n", T, B, H, d);
        const char *names[3] = {"dQ against the library's", "dK against the library's", "dV against the library's"};
        for (int i = 0; i < 3; i++) {
            LabDiff dd;
            lab_diff_bf16(&dd, dqkv_lab + i * C, 3 * C, dqkv_ref + i * C, 3 * C, n_tok, C);
            ok &= lab_report(names[i], dd, false, 1e-2);
        }
        const double flops = 2.5 * lab_fwd_flops(B, H, T, d);
        lab_time_line("library (wgmma, TMA)", T, B, H, d, bench_time_ms(lib), flops);
        lab_time_line("lab 1 (mma.sync)", T, B, H, d, bench_time_ms(lab), flops);
        cudaFree(qkv); cudaFree(dout); cudaFree(o); cudaFree(dqkv_ref); cudaFree(dqkv_lab); cudaFree(lse); cudaFree(ws);
    }
    return ok ? 0 : 1;
}
