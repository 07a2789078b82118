// attention_bwd_fp8.cu: fused causal flash attention backward in FP8 (docs/fp8-attention.md §3:
// fp8_naive, fp8_dm, fp8_dm_approx) on FP8 wgmma (QGMMA in SASS). Interface and operand layouts:
// attention_quant.h. Numerics, as attn_cpu_backward emulates them with block_q = 64,
// block_k = 128 (ATTN_FP8_BWD_BLOCK_Q/K; a query block lies in one 128-token scale block, a key
// block is one scale block, so every tile has one scale per operand):
//   S^T = K̂ Q̂^T (codes) / (s_k s_q) * tau,  P = exp(S - LSE)   FP32, against the final LSE
//   dP^T = V̂ dÔ^T (codes) / (s_v s_do)                          FP32 (dÔ in the grad format)
//   dS = P (dP - D)                                              FP32 (the P above, not P̂)
//   dŜ = fmt(dS s_ds), s_ds from the amax of the 64 x 128 tile;  P̂ = E4M3(P p_scale)
//   dV += P̂^T dÔ / (p_scale s_do),  dK += dŜ^T Q̂ / (s_ds s_q),  dQ += dŜ K̂ / (s_ds s_k)
// Each tile's product goes to a fresh wgmma accumulator and is added in FP32 (registers for dK,
// dV; FP32 atomics for dQ): the tensor cores' reduced-precision accumulation never runs over
// more than 128 elements (spec §3). dK, dQ get tau at the end, as in the emulation.
//
// D (spec "Computing the matched D"): fp8_naive rowsum(dO ∘ O) with the BF16 dO and stored O;
// fp8_dm_approx rowsum(dÔ ∘ O); fp8_dm the delta pass, attn_bwd_fp8_delta_kernel: per query
// block it walks the key blocks through tile_p_dp, the one device routine that also produces
// the main kernel's P and dP (same tiles, same thread-to-element map, same wgmma sequence, and
// FP32 arithmetic by explicitly rounded intrinsics that the compiler may not contract or
// reorder), so sum_j dS_ij = 0 up to FP32 rounding.
//
// Kernels: attn_bwd_fp8_pre_kernel (D for naive/approx; zeroes the dQ accumulator and the row
// diagnostics), attn_bwd_fp8_delta_kernel (fp8_dm), attn_bwd_fp8_kernel (main), and
// attn_bwd_fp8_dq_kernel (dQ = BF16(tau * acc)).
//
// Layout of the main kernel: 256 threads = 2 warpgroups; warpgroup w owns keys k0+64w..+63 of
// the CTA's 128-key block (M = keys for S^T, dP^T, dK, dV, so dK and dV stay in registers), the
// query block (64) is N. All FP8 wgmma operands are K-major tiles in shared memory with the
// forward's conventions (attention_fwd_fp8.cu): 128-byte rows, 128-byte swizzle (16-byte chunk
// c of row r at c ^ (r % 8)), regions 1024-byte aligned, a k32 step = +32 bytes of the
// descriptor; a tile whose reduction is 64 long (queries) uses the first 64 bytes of each row.
// The K-major operands for the reductions over tokens come from the transposed codes of the
// quantize kernel (Q̂^T, K̂^T, dÔ^T); P̂^T, dŜ^T and dŜ are written to shared memory by the
// threads that computed them. First version: no pipelining, one tile at a time.
#include "attention_quant.h"

#include <cuda_runtime.h>  // launches, cudaFuncSetAttribute
#include <math.h>          // expf, sqrtf
#include <stddef.h>        // size_t
#include <stdint.h>        // uint8_t, uint32_t, uint64_t

#include "attention_gpu_common.cuh"  // bf16, CUDA_OK, cp.async, wgmma fences/descriptors, check_args
#include "common.h"                  // FATAL
#include "fp8.h"                     // encoders, fp8_scale_for_amax, fp8_to_f32
#include "gpu_sizes.h"               // gpu_attn_bwd_workspace_bytes (same scratch as the BF16 backward)

#define B8_BQ ATTN_FP8_BWD_BLOCK_Q  // 64 queries per tile
#define B8_BK ATTN_FP8_BWD_BLOCK_K  // 128 keys per tile = per CTA
#define B8_THREADS 256
static_assert(B8_BK == ATTN_SCALE_BLOCK, "a key block must be one scale block");
static_assert(ATTN_SCALE_BLOCK % B8_BQ == 0, "a query block must lie in one scale block");
static_assert(B8_BQ == 64 && B8_BK == 128, "the warpgroup layout assumes 64 x 128 tiles");

namespace {

// --- FP8 wgmma: d (64 x N, FP32) (+)= A (64 x 32, smem, K-major) * B (32 x N, smem, K-major) ----
// AT/BT: 0 = e4m3, 1 = e5m2. accumulate = 0 starts a fresh accumulator.
template <int N, int AT, int BT>
__device__ void wg_fp8(float (&d)[N / 2], uint64_t da, uint64_t db, int accumulate);

#define B8_REGS16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define B8_WGMMA(N, AT, BT, ATS, BTS, REGS, IA, IB, IP, ...)                                       \
    template <>                                                                                    \
    __device__ __forceinline__ void wg_fp8<N, AT, BT>(float (&d)[N / 2], uint64_t da, uint64_t db, \
                                                      int accumulate) {                            \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IP ", 0;\n"                            \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32." ATS "." BTS " {" REGS       \
                     "}, %" #IA ", %" #IB ", p, 1, 1;\n}\n"                                        \
                     : __VA_ARGS__                                                                 \
                     : "l"(da), "l"(db), "r"(accumulate));                                         \
    }
// the type pairs used: S^T (e4m3.e4m3), dP^T and dV (e4m3.grad), dK and dQ (grad.e4m3)
#define B8_WGMMA_TYPES(N, REGS, IA, IB, IP, ...)                      \
    B8_WGMMA(N, 0, 0, "e4m3", "e4m3", REGS, IA, IB, IP, __VA_ARGS__)  \
    B8_WGMMA(N, 0, 1, "e4m3", "e5m2", REGS, IA, IB, IP, __VA_ARGS__)  \
    B8_WGMMA(N, 1, 0, "e5m2", "e4m3", REGS, IA, IB, IP, __VA_ARGS__)
B8_WGMMA(32, 0, 0, "e4m3", "e4m3", B8_REGS16, 16, 17, 18, WG_ACC8(0), WG_ACC8(8))  // dQ, d = 64
B8_WGMMA(32, 1, 0, "e5m2", "e4m3", B8_REGS16, 16, 17, 18, WG_ACC8(0), WG_ACC8(8))
B8_WGMMA_TYPES(64, WG_REGS32, 32, 33, 34, WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24))
B8_WGMMA_TYPES(128, WG_REGS64, 64, 65, 66, WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24), WG_ACC8(32),
               WG_ACC8(40), WG_ACC8(48), WG_ACC8(56))
#undef B8_WGMMA_TYPES
#undef B8_WGMMA

// Scale blocks of a sequence of T tokens (attn_quant_n_blocks, for device code).
__device__ __forceinline__ int b8_nblk(int T) { return (T + ATTN_SCALE_BLOCK - 1) / ATTN_SCALE_BLOCK; }

// Byte offset of (row r, byte column c) in a 128-byte-swizzled tile of 128-byte rows.
__device__ __forceinline__ uint32_t b8_sw(int r, int c) {
    return (uint32_t)(r * 128 + ((((c >> 4) ^ (r & 7)) << 4) | (c & 15)));
}

// Copies ROWS rows of CHUNKS 16-byte chunks (row pitch `pitch` bytes in global memory) into a
// swizzled tile. Every source byte exists (the quantized layouts are padded to whole blocks).
template <int ROWS, int CHUNKS>
__device__ __forceinline__ void b8_load(uint8_t *s, const uint8_t *g, long pitch, int tid) {
    static_assert(ROWS * CHUNKS % B8_THREADS == 0, "tile copy must split evenly over the threads");
#pragma unroll
    for (int i = 0; i < ROWS * CHUNKS / B8_THREADS; i++) {
        const int c = tid + i * B8_THREADS, r = c / CHUNKS, ch = c % CHUNKS;
        cp_async16(s + b8_sw(r, ch * 16), g + (long)r * pitch + ch * 16, true);
    }
}

// K-major descriptor of a swizzled tile, advanced by k32 step kk.
__device__ __forceinline__ uint64_t b8_desc(const uint8_t *tile, int kk) {
    return wgmma_desc(tile + kk * 32, 16, 1024);
}

template <bool E5>
__device__ __forceinline__ uint8_t grad_code(float x) {
    return E5 ? fp8_e5m2_from_f32(x) : fp8_e4m3_from_f32(x);
}

// Fragment map of a 64 x N wgmma accumulator (this thread's element i = 4n + e):
// row (M) = warp*16 + g + 8*(e>>1) within the warpgroup's 64, column (N) = 8n + 2*t4 + (e&1).

// THE shared recomputation (main pass and delta pass): for this warpgroup's 64 keys
// (key0 = first of them; sKw, sVw their K̂, V̂ rows) and the 64 queries of sQ, sdO (first query
// q0), P^T and dP^T in FP32, 0 where masked (key > query, or query >= T). sLse: the 64 LSEs.
// Every FP32 operation is an explicitly rounded intrinsic (never contracted into an FMA or
// reordered) and expf is one fixed instruction sequence, so both kernels get bitwise the same
// p and dp from the same codes.
template <int D, bool E5>
__device__ __forceinline__ void tile_p_dp(const uint8_t *sKw, const uint8_t *sVw, const uint8_t *sQ,
                                          const uint8_t *sdO, const float *sLse, float inv_q, float inv_k,
                                          float inv_do, float inv_v, float tau, int key0, int q0, int T,
                                          float (&p)[32], float (&dp)[32]) {
    const int tid = threadIdx.x, warp = (tid % 128) / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
    reg_fence(p);
    reg_fence(dp);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < D / 32; kk++) wg_fp8<64, 0, 0>(p, b8_desc(sKw, kk), b8_desc(sQ, kk), kk > 0);
#pragma unroll
    for (int kk = 0; kk < D / 32; kk++) wg_fp8<64, 0, E5 ? 1 : 0>(dp, b8_desc(sVw, kk), b8_desc(sdO, kk), kk > 0);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(p);
    reg_fence(dp);
#pragma unroll
    for (int n = 0; n < 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = 4 * n + e;
            const int key = key0 + warp * 16 + g + 8 * (e >> 1), ql = 8 * n + 2 * t4 + (e & 1), q = q0 + ql;
            const bool masked = key > q || q >= T;
            const float s = __fmul_rn(tau, __fmul_rn(__fmul_rn(p[i], inv_q), inv_k));  // exact but for tau
            p[i] = masked ? 0.0f : expf(__fsub_rn(s, sLse[ql]));
            dp[i] = masked ? 0.0f : __fmul_rn(__fmul_rn(dp[i], inv_do), inv_v);
        }
}

// Sum over the 16 keys of a warp (rows g, g+8 of every lane) per query column: v[2n + c] holds
// this thread's column 8n + 2*t4 + c; afterwards every lane holds its quad column's warp sum.
__device__ __forceinline__ void col_sum_warp(float (&v)[16]) {
#pragma unroll
    for (int i = 0; i < 16; i++) {
        v[i] += __shfl_xor_sync(0xffffffffu, v[i], 4);
        v[i] += __shfl_xor_sync(0xffffffffu, v[i], 8);
        v[i] += __shfl_xor_sync(0xffffffffu, v[i], 16);
    }
}

}  // namespace

// --- D for fp8_naive / fp8_dm_approx; zeroes the dQ accumulator and the row diagnostics -------
// One warp per (b, h, t) row of (B, H, T).
template <int D>
__global__ void attn_bwd_fp8_pre_kernel(const bf16 *__restrict__ o, const bf16 *__restrict__ dout, int o_stride,
                                        const uint8_t *__restrict__ do_codes, const float *__restrict__ do_scales,
                                        Fp8Format gfmt, int mode, float *__restrict__ dlt, float *__restrict__ dq_acc,
                                        float *__restrict__ row_ds_sum, float *__restrict__ row_cancel, int B,
                                        int H, int T) {
    const long row = (long)blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32;  // (b*H + h)*T + t
    const int lane = threadIdx.x % 32;
    if (row >= (long)B * H * T) return;
    const int t = (int)(row % T);
    const long bh = row / T;
    const int b = (int)(bh / H), h = (int)(bh % H);
    const int nblk = b8_nblk(T), Tp = nblk * ATTN_SCALE_BLOCK;
    if (mode != ATTN_FP8_DM) {
        const long off = ((long)b * T + t) * o_stride + (long)h * D;
        const float inv_s = 1.0f / do_scales[bh * nblk + t / ATTN_SCALE_BLOCK];
        const uint8_t *crow = do_codes + (bh * Tp + t) * D;
        float acc = 0.f;
        for (int c = lane; c < D; c += 32) {
            const float of = __bfloat162float(o[off + c]);
            const float g = mode == ATTN_FP8_NAIVE ? __bfloat162float(dout[off + c]) : fp8_to_f32(gfmt, crow[c]) * inv_s;
            acc += g * of;
        }
#pragma unroll
        for (int s = 16; s > 0; s >>= 1) acc += __shfl_xor_sync(0xffffffffu, acc, s);
        if (lane == 0) dlt[row] = acc;
    }
    for (int c = lane; c < D; c += 32) dq_acc[row * D + c] = 0.f;
    if (lane == 0 && row_ds_sum) {
        row_ds_sum[row] = 0.f;
        row_cancel[row] = 0.f;
    }
}

// --- fp8_dm's delta pass: grid (ceil(T/64), B*H), block 256 ----------------------------------
// D_i = sum_j P_ij dP_ij / sum_j P_ij over the key blocks 0 .. (last row of the query block)/128,
// P and dP from tile_p_dp exactly as the main kernel gets them.
template <int D, bool E5>
__global__ void __launch_bounds__(B8_THREADS, 1)
    attn_bwd_fp8_delta_kernel(const uint8_t *__restrict__ qc, const uint8_t *__restrict__ kc,
                              const uint8_t *__restrict__ vc, const uint8_t *__restrict__ doc,
                              const float *__restrict__ q_scales, const float *__restrict__ k_scales,
                              const float *__restrict__ v_scales, const float *__restrict__ do_scales,
                              const float *__restrict__ lse, float *__restrict__ dlt, int T, float tau) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint8_t *smem = reinterpret_cast<uint8_t *>(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sK = smem;               // (128 keys x 128 B)
    uint8_t *sV = sK + B8_BK * 128;   // (128 keys x 128 B)
    uint8_t *sQ = sV + B8_BK * 128;   // (64 queries x 128 B)
    uint8_t *sdO = sQ + B8_BQ * 128;  // (64 queries x 128 B)
    float *sLse = reinterpret_cast<float *>(sdO + B8_BQ * 128);  // (64)
    float *sRed = sLse + B8_BQ;                                  // (2, 8 warps, 64)

    const int qb = blockIdx.x, bh = blockIdx.y, tid = threadIdx.x;
    const int wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32, t4 = lane & 3;
    const int nblk = b8_nblk(T), Tp = nblk * ATTN_SCALE_BLOCK;
    const int q0 = qb * B8_BQ, q_last = min(q0 + B8_BQ, T) - 1;
    const float inv_q = 1.0f / q_scales[(long)bh * nblk + q0 / ATTN_SCALE_BLOCK];
    const float inv_do = 1.0f / do_scales[(long)bh * nblk + q0 / ATTN_SCALE_BLOCK];
    b8_load<B8_BQ, D / 16>(sQ, qc + ((long)bh * Tp + q0) * D, D, tid);
    b8_load<B8_BQ, D / 16>(sdO, doc + ((long)bh * Tp + q0) * D, D, tid);
    if (tid < B8_BQ) sLse[tid] = q0 + tid < T ? lse[(long)bh * T + q0 + tid] : 0.f;

    float pd[16], ps[16];  // this thread's column partial sums, [2n + c] -> column 8n + 2*t4 + c
#pragma unroll
    for (int i = 0; i < 16; i++) pd[i] = ps[i] = 0.f;
    float p[32], dp[32];
    for (int kb = 0; kb * B8_BK <= q_last; kb++) {
        const int k0 = kb * B8_BK;
        __syncthreads();  // everyone is done with sK, sV
        b8_load<B8_BK, D / 16>(sK, kc + ((long)bh * Tp + k0) * D, D, tid);
        b8_load<B8_BK, D / 16>(sV, vc + ((long)bh * Tp + k0) * D, D, tid);
        cp_async_commit();
        cp_async_wait_all();
        fence_proxy_async();
        __syncthreads();
        const float inv_k = 1.0f / k_scales[(long)bh * nblk + kb], inv_v = 1.0f / v_scales[(long)bh * nblk + kb];
        tile_p_dp<D, E5>(sK + wg * 64 * 128, sV + wg * 64 * 128, sQ, sdO, sLse, inv_q, inv_k, inv_do, inv_v, tau,
                         k0 + wg * 64, q0, T, p, dp);
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                pd[2 * n + (e & 1)] += p[4 * n + e] * dp[4 * n + e];
                ps[2 * n + (e & 1)] += p[4 * n + e];
            }
    }
    col_sum_warp(pd);
    col_sum_warp(ps);
    const int wi = wg * 4 + warp;  // 0..7
    if (lane < 4)
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int c = 0; c < 2; c++) {
                sRed[wi * B8_BQ + 8 * n + 2 * t4 + c] = pd[2 * n + c];
                sRed[(8 + wi) * B8_BQ + 8 * n + 2 * t4 + c] = ps[2 * n + c];
            }
    __syncthreads();
    if (tid < B8_BQ && q0 + tid < T) {
        float a = 0.f, s = 0.f;
        for (int w = 0; w < 8; w++) {
            a += sRed[w * B8_BQ + tid];
            s += sRed[(8 + w) * B8_BQ + tid];
        }
        dlt[(long)bh * T + q0 + tid] = a / s;
    }
}

// --- main backward: grid (ceil(T/128), B*H), block 256 (2 warpgroups) -------------------------
template <int D, bool E5>
__global__ void __launch_bounds__(B8_THREADS, 1)
    attn_bwd_fp8_kernel(const uint8_t *__restrict__ qc, const uint8_t *__restrict__ qtc,
                        const uint8_t *__restrict__ kc, const uint8_t *__restrict__ ktc,
                        const uint8_t *__restrict__ vc, const uint8_t *__restrict__ doc,
                        const uint8_t *__restrict__ dotc, const float *__restrict__ q_scales,
                        const float *__restrict__ k_scales, const float *__restrict__ v_scales,
                        const float *__restrict__ do_scales, float p_scale, const float *__restrict__ lse,
                        const float *__restrict__ dlt, float *__restrict__ dq_acc, bf16 *__restrict__ dk,
                        bf16 *__restrict__ dv, int dqkv_stride, float *__restrict__ row_ds_sum,
                        float *__restrict__ row_cancel, int H, int T, float tau) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint8_t *smem = reinterpret_cast<uint8_t *>(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sK = smem;                // (128 keys x 128 B)  K̂, reduction over d
    uint8_t *sV = sK + B8_BK * 128;    // (128 keys x 128 B)  V̂
    uint8_t *sKt = sV + B8_BK * 128;   // (D x 128 keys)      K̂^T, for dQ
    uint8_t *sQ = sKt + D * 128;       // (64 queries x 128 B) Q̂
    uint8_t *sdO = sQ + B8_BQ * 128;   // (64 queries x 128 B) dÔ
    uint8_t *sQt = sdO + B8_BQ * 128;  // (D x 64 queries, 128-byte rows) Q̂^T, for dK
    uint8_t *sdOt = sQt + D * 128;     // (D x 64 queries) dÔ^T, for dV
    uint8_t *sPt = sdOt + D * 128;     // (128 keys x 64 queries) P̂^T
    uint8_t *sdSt = sPt + B8_BK * 128; // (128 keys x 64 queries) dŜ^T
    uint8_t *sdS = sdSt + B8_BK * 128; // (64 queries x 128 keys) dŜ
    float *sLse = reinterpret_cast<float *>(sdS + B8_BQ * 128);  // (64)
    float *sDl = sLse + B8_BQ;                                   // (64) D
    float *sAmax = sDl + B8_BQ;                                  // (8) per-warp |dS| max

    const int kb = blockIdx.x, bh = blockIdx.y, b = bh / H, h = bh % H;
    const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const int nblk = b8_nblk(T), Tp = nblk * ATTN_SCALE_BLOCK;
    const int k0 = kb * B8_BK, key0 = k0 + wg * 64;  // the warpgroup's first key
    const int n_qb = (T + B8_BQ - 1) / B8_BQ;
    const float inv_k = 1.0f / k_scales[(long)bh * nblk + kb], inv_v = 1.0f / v_scales[(long)bh * nblk + kb];
    const float inv_p = 1.0f / p_scale;
    const Fp8Format gfmt = E5 ? FP8_E5M2 : FP8_E4M3;
    float *gdq = dq_acc + (long)bh * T * D;

    b8_load<B8_BK, D / 16>(sK, kc + ((long)bh * Tp + k0) * D, D, tid);
    b8_load<B8_BK, D / 16>(sV, vc + ((long)bh * Tp + k0) * D, D, tid);
    b8_load<D, B8_BK / 16>(sKt, ktc + (long)bh * D * Tp + k0, Tp, tid);

    float dka[D / 2], dva[D / 2];  // FP32 dK, dV of the warpgroup's 64 keys (wgmma layout)
#pragma unroll
    for (int i = 0; i < D / 2; i++) dka[i] = dva[i] = 0.f;

    for (int qb = k0 / B8_BQ; qb < n_qb; qb++) {
        const int q0 = qb * B8_BQ;
        __syncthreads();  // everyone is done with the previous query block's tiles
        b8_load<B8_BQ, D / 16>(sQ, qc + ((long)bh * Tp + q0) * D, D, tid);
        b8_load<B8_BQ, D / 16>(sdO, doc + ((long)bh * Tp + q0) * D, D, tid);
        b8_load<D, B8_BQ / 16>(sQt, qtc + (long)bh * D * Tp + q0, Tp, tid);
        b8_load<D, B8_BQ / 16>(sdOt, dotc + (long)bh * D * Tp + q0, Tp, tid);
        if (tid < B8_BQ) {
            const bool ok = q0 + tid < T;
            sLse[tid] = ok ? lse[(long)bh * T + q0 + tid] : 0.f;
            sDl[tid] = ok ? dlt[(long)bh * T + q0 + tid] : 0.f;
        }
        cp_async_commit();
        cp_async_wait_all();
        fence_proxy_async();
        __syncthreads();
        const float inv_q = 1.0f / q_scales[(long)bh * nblk + q0 / ATTN_SCALE_BLOCK];
        const float inv_do = 1.0f / do_scales[(long)bh * nblk + q0 / ATTN_SCALE_BLOCK];

        float p[32], ds[32];
        tile_p_dp<D, E5>(sK + wg * 64 * 128, sV + wg * 64 * 128, sQ, sdO, sLse, inv_q, inv_k, inv_do, inv_v, tau,
                         key0, q0, T, p, ds);

        // optional row diagnostics (spec §4.1) over the FP32 dS, column by column (few live
        // registers): sum_j dS_ij (the same rounded products as below) and sum_j P (|dP| + |D|)
        if (row_ds_sum) {
#pragma unroll
            for (int n = 0; n < 8; n++) {
                float rs[2] = {0.f, 0.f}, rc[2] = {0.f, 0.f};
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int i = 4 * n + e;
                    const float dl = sDl[8 * n + 2 * t4 + (e & 1)];
                    rc[e & 1] += p[i] * (fabsf(ds[i]) + fabsf(dl));
                    rs[e & 1] += __fmul_rn(p[i], __fsub_rn(ds[i], dl));
                }
#pragma unroll
                for (int c = 0; c < 2; c++)
#pragma unroll
                    for (int o = 4; o < 32; o <<= 1) {
                        rs[c] += __shfl_xor_sync(0xffffffffu, rs[c], o);
                        rc[c] += __shfl_xor_sync(0xffffffffu, rc[c], o);
                    }
                const int q = q0 + 8 * n + 2 * t4;
                if (lane < 4)
#pragma unroll
                    for (int c = 0; c < 2; c++)
                        if (q + c < T) {
                            atomicAdd(row_ds_sum + (long)bh * T + q + c, rs[c]);
                            atomicAdd(row_cancel + (long)bh * T + q + c, rc[c]);
                        }
            }
        }
        // dS = P (dP - D) in FP32 (masked entries: P = dP = 0 -> 0), its tile amax; P̂^T codes
        float amax = 0.f;
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = 4 * n + e;
                ds[i] = __fmul_rn(p[i], __fsub_rn(ds[i], sDl[8 * n + 2 * t4 + (e & 1)]));
                amax = fmaxf(amax, fabsf(ds[i]));
            }
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int r = 0; r < 2; r++) {  // key row g + 8r, query columns 8n + 2t4, +1
                const int kr = wg * 64 + warp * 16 + g + 8 * r, ql = 8 * n + 2 * t4;
                const uint32_t c0 = fp8_e4m3_from_f32(p[4 * n + 2 * r] * p_scale);
                const uint32_t c1 = fp8_e4m3_from_f32(p[4 * n + 2 * r + 1] * p_scale);
                *reinterpret_cast<uint16_t *>(sPt + b8_sw(kr, ql)) = (uint16_t)(c0 | (c1 << 8));
            }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
        if (lane == 0) sAmax[wg * 4 + warp] = amax;
        __syncthreads();
        float tmax = sAmax[0];
#pragma unroll
        for (int w = 1; w < 8; w++) tmax = fmaxf(tmax, sAmax[w]);
        const float s_ds = fp8_scale_for_amax(gfmt, tmax), inv_ds = 1.0f / s_ds;

        // dŜ codes, both orientations (dŜ^T for dK, dŜ for dQ)
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int r = 0; r < 2; r++) {
                const int kr = wg * 64 + warp * 16 + g + 8 * r, ql = 8 * n + 2 * t4;
                const uint32_t c0 = grad_code<E5>(ds[4 * n + 2 * r] * s_ds);
                const uint32_t c1 = grad_code<E5>(ds[4 * n + 2 * r + 1] * s_ds);
                *reinterpret_cast<uint16_t *>(sdSt + b8_sw(kr, ql)) = (uint16_t)(c0 | (c1 << 8));
                sdS[b8_sw(ql, kr)] = (uint8_t)c0;
                sdS[b8_sw(ql + 1, kr)] = (uint8_t)c1;
            }
        fence_proxy_async();  // generic-proxy stores -> wgmma reads
        __syncthreads();

        // dV += P̂^T dÔ (keys x d, reduction over the 64 queries), fresh accumulator
        {
            float t[D / 2];
            reg_fence(t);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < B8_BQ / 32; kk++)
                wg_fp8<D, 0, E5 ? 1 : 0>(t, b8_desc(sPt + wg * 64 * 128, kk), b8_desc(sdOt, kk), kk > 0);
            wgmma_commit();
            wgmma_wait<0>();
            reg_fence(t);
            const float f = inv_p * inv_do;
#pragma unroll
            for (int i = 0; i < D / 2; i++) dva[i] += t[i] * f;
        }
        // dK += dŜ^T Q̂ (tau at the end)
        {
            float t[D / 2];
            reg_fence(t);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < B8_BQ / 32; kk++)
                wg_fp8<D, E5 ? 1 : 0, 0>(t, b8_desc(sdSt + wg * 64 * 128, kk), b8_desc(sQt, kk), kk > 0);
            wgmma_commit();
            wgmma_wait<0>();
            reg_fence(t);
            const float f = inv_ds * inv_q;
#pragma unroll
            for (int i = 0; i < D / 2; i++) dka[i] += t[i] * f;
        }
        // dQ (64 queries x this warpgroup's D/2 columns) += dŜ K̂ over the 128 keys -> FP32 atomics
        {
            float t[D / 4];
            reg_fence(t);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < B8_BK / 32; kk++)
                wg_fp8<D / 2, E5 ? 1 : 0, 0>(t, b8_desc(sdS, kk), b8_desc(sKt + wg * (D / 2) * 128, kk), kk > 0);
            wgmma_commit();
            wgmma_wait<0>();
            reg_fence(t);
            const float f = inv_ds * inv_k;
#pragma unroll
            for (int n = 0; n < D / 16; n++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int q = q0 + warp * 16 + g + 8 * r, col = wg * (D / 2) + 8 * n + 2 * t4;
                    if (q < T)
                        atomicAdd(reinterpret_cast<float2 *>(gdq + (long)q * D + col),
                                  make_float2(t[4 * n + 2 * r] * f, t[4 * n + 2 * r + 1] * f));
                }
        }
    }

    // epilogue: dV, tau dK in BF16
    const long gbase = (long)b * T * dqkv_stride + (long)h * D;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int key = key0 + warp * 16 + g + 8 * r;
        if (key >= T) continue;
        bf16 *dkrow = dk + gbase + (long)key * dqkv_stride, *dvrow = dv + gbase + (long)key * dqkv_stride;
#pragma unroll
        for (int n = 0; n < D / 8; n++) {
            *reinterpret_cast<uint32_t *>(dvrow + 8 * n + 2 * t4) = pack_bf16(dva[4 * n + 2 * r], dva[4 * n + 2 * r + 1]);
            *reinterpret_cast<uint32_t *>(dkrow + 8 * n + 2 * t4) =
                pack_bf16(dka[4 * n + 2 * r] * tau, dka[4 * n + 2 * r + 1] * tau);
        }
    }
}

// dq[b,t,h,:] = BF16(tau * dq_acc[b,h,t,:]); one thread per 4 elements.
template <int D>
__global__ void attn_bwd_fp8_dq_kernel(const float *__restrict__ dq_acc, bf16 *__restrict__ dq, int dqkv_stride,
                                       int B, int H, int T, float tau) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;  // over B*H*T*D/4
    if (i >= (long)B * H * T * (D / 4)) return;
    const int c = (int)(i % (D / 4)) * 4;
    const long bht = i / (D / 4);
    const int t = (int)(bht % T);
    const long bh = bht / T;
    const int h = (int)(bh % H), b = (int)(bh / H);
    const float4 a = *reinterpret_cast<const float4 *>(dq_acc + bht * D + c);
    *reinterpret_cast<uint2 *>(dq + ((long)b * T + t) * dqkv_stride + (long)h * D + c) =
        make_uint2(pack_bf16(a.x * tau, a.y * tau), pack_bf16(a.z * tau, a.w * tau));
}

// --- launchers ---------------------------------------------------------------------------------
extern "C" size_t attn_gpu_backward_fp8_workspace_bytes(int B, int H, int T, int d) {
    return gpu_attn_bwd_workspace_bytes((size_t)B, (size_t)H, (size_t)T, (size_t)d);  // the BF16 backward's layout
}

template <int D, bool E5>
static void backward_fp8_d(const AttnFp8BwdArgs *a, int B, int H, int T, cudaStream_t stream) {
    float *dq_acc = (float *)a->workspace;                                   // (B, H, T, D)
    float *dlt = a->delta_out ? a->delta_out : dq_acc + (size_t)B * H * T * D;  // (B, H, T)
    const float tau = 1.0f / sqrtf((float)D);
    const long rows = (long)B * H * T;
    attn_bwd_fp8_pre_kernel<D><<<(unsigned)((rows + 7) / 8), 256, 0, stream>>>(
        (const bf16 *)a->o, (const bf16 *)a->dout, a->o_stride, a->do_codes, a->do_scales, a->grad_format,
        (int)a->precision, dlt, dq_acc, a->row_ds_sum, a->row_cancel, B, H, T);
    CUDA_OK(cudaGetLastError());

    if (a->precision == ATTN_FP8_DM) {
        const size_t smem = (size_t)(2 * B8_BK + 2 * B8_BQ) * 128 + 17 * B8_BQ * sizeof(float) + 1024;
        static bool attr_set = false;  // one device per process (one GPU per rank)
        if (!attr_set) {
            CUDA_OK(cudaFuncSetAttribute(attn_bwd_fp8_delta_kernel<D, E5>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                         (int)smem));
            attr_set = true;
        }
        dim3 grid((T + B8_BQ - 1) / B8_BQ, B * H);
        attn_bwd_fp8_delta_kernel<D, E5><<<grid, B8_THREADS, smem, stream>>>(
            a->q_codes, a->k_codes, a->v_codes, a->do_codes, a->q_scales, a->k_scales, a->v_scales, a->do_scales,
            a->lse, dlt, T, tau);
        CUDA_OK(cudaGetLastError());
    }

    const size_t smem = (size_t)(4 * B8_BK + 3 * B8_BQ + 3 * D) * 128 + (2 * B8_BQ + 8) * sizeof(float) + 1024;
    static bool attr_set = false;
    if (!attr_set) {
        CUDA_OK(cudaFuncSetAttribute(attn_bwd_fp8_kernel<D, E5>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr_set = true;
    }
    dim3 grid(attn_quant_n_blocks(T), B * H);
    attn_bwd_fp8_kernel<D, E5><<<grid, B8_THREADS, smem, stream>>>(
        a->q_codes, a->qt_codes, a->k_codes, a->kt_codes, a->v_codes, a->do_codes, a->dot_codes, a->q_scales,
        a->k_scales, a->v_scales, a->do_scales, a->p_scale, a->lse, dlt, dq_acc, (bf16 *)a->dk, (bf16 *)a->dv,
        a->dqkv_stride, a->row_ds_sum, a->row_cancel, H, T, tau);
    CUDA_OK(cudaGetLastError());

    const long n4 = (long)B * H * T * (D / 4);
    attn_bwd_fp8_dq_kernel<D><<<(unsigned)((n4 + 255) / 256), 256, 0, stream>>>(dq_acc, (bf16 *)a->dq, a->dqkv_stride,
                                                                                B, H, T, tau);
    CUDA_OK(cudaGetLastError());
}

extern "C" void attn_gpu_backward_fp8(const AttnFp8BwdArgs *a, int B, int H, int T, int d, cudaStream_t stream) {
    const void *ptrs[] = {a->q_codes, a->qt_codes, a->k_codes, a->kt_codes, a->v_codes, a->do_codes,
                          a->dot_codes, a->dq,      a->dk,      a->dv,       a->workspace};
    const int strides[] = {a->dqkv_stride};
    check_args("attn_gpu_backward_fp8", ptrs, 11, strides, 1, B, H, T, d);
    if (a->precision != ATTN_FP8_NAIVE && a->precision != ATTN_FP8_DM && a->precision != ATTN_FP8_DM_APPROX)
        FATAL("attn_gpu_backward_fp8: precision %d is not fp8_naive, fp8_dm or fp8_dm_approx", (int)a->precision);
    if (a->grad_format != FP8_E4M3 && a->grad_format != FP8_E5M2)
        FATAL("attn_gpu_backward_fp8: grad format %d", (int)a->grad_format);
    if (!a->q_scales || !a->k_scales || !a->v_scales || !a->do_scales || !a->lse)
        FATAL("attn_gpu_backward_fp8: missing scales or lse");
    if (!(a->p_scale > 0.0f)) FATAL("attn_gpu_backward_fp8: p_scale must be positive, got %g", a->p_scale);
    if (a->precision != ATTN_FP8_DM) {
        if (!a->o || a->o_stride % 2 || a->o_stride < H * d)
            FATAL("attn_gpu_backward_fp8: fp8_naive / fp8_dm_approx need O with a row stride >= H*d (got %d)",
                  a->o_stride);
        if (a->precision == ATTN_FP8_NAIVE && !a->dout) FATAL("attn_gpu_backward_fp8: fp8_naive needs the BF16 dO");
    }
    if (!a->row_ds_sum != !a->row_cancel)
        FATAL("attn_gpu_backward_fp8: row_ds_sum and row_cancel are both given or both NULL");
    const bool e5 = a->grad_format == FP8_E5M2;
    if (d == 64) {
        if (e5) backward_fp8_d<64, true>(a, B, H, T, stream);
        else backward_fp8_d<64, false>(a, B, H, T, stream);
    } else {
        if (e5) backward_fp8_d<128, true>(a, B, H, T, stream);
        else backward_fp8_d<128, false>(a, B, H, T, stream);
    }
}
