// attention_fwd_fp8.cu: fused causal flash attention forward in FP8 (docs/fp8-attention.md §3:
// the forward of fp8_naive, fp8_hybrid and fp8_dm), on FP8 wgmma (QGMMA in SASS). Inputs are
// the quantized operands of attention_quant.cu: Q̂, K̂ codes (B, H, Tp, d), V̂^T codes
// (B, H, d, Tp) and their per-(b, h, 128-token block) scales. Interface: attention_quant.h.
//
// Numerics, as attn_cpu_forward emulates them with block_q = block_k = 128 (one key block = one
// scale block, so every S tile has one Q scale and one K scale and every PV step one V scale):
//   S = tau * (Q̂code · K̂code) / (s_q s_k)                     (FP8 wgmma, FP32 accumulators)
//   running max m advanced once per key block, alpha = exp(m_old - m_new)
//   P = exp(S - m_new) in FP32; l sums the unquantized P
//   P̂ = E4M3(P * p_scale)                                       (the static P scale, 2^8)
//   O = O * alpha + (P̂code · V̂code) / (p_scale s_v)             (FP8 wgmma into a fresh FP32
//       accumulator per key block, added in FP32 registers: the tensor cores' reduced-precision
//       accumulation never runs over more than 128 keys, spec §3)
//   O stored BF16 (acc / l), LSE = m + log(l) FP32.
// exp and log are the accurate expf/logf (not ex2.approx), to stay close to the emulation.
//
// This first version is deliberately simple: 2 warpgroups (64 query rows each) per 128-row query
// block, tiles by cp.async into 128-byte-swizzled shared memory, one key block at a time with no
// overlap of softmax and matmuls, and P̂ staged through shared memory (the FP8 A operand from
// registers needs a different fragment layout than the S accumulators; a register permute as in
// FlashAttention-3 is the next step). Both matmuls read both operands from shared memory, K-major
// (the only FP8 wgmma form): rows of 128 bytes (128 FP8 values along the reduction), 16-byte
// chunk c of row r at chunk c ^ (r % 8), regions 1024-byte aligned; a k32 step advances the
// descriptor by 32 bytes. For d = 64 the Q and K rows use only the first 64 bytes of each
// 128-byte row (2 k-steps instead of 4).
#include "attention_quant.h"

#include <cuda_runtime.h>  // launches, cudaFuncSetAttribute
#include <math.h>          // INFINITY, expf, logf
#include <stdint.h>        // uint8_t, uint32_t, uint64_t

#include "attention_gpu_common.cuh"  // bf16, CUDA_OK, cp.async, wgmma fences/descriptors, WG_* macros
#include "common.h"                  // FATAL

#define F8_BQ 128  // query rows per CTA (2 warpgroups x 64)
#define F8_BK 128  // keys per block = ATTN_SCALE_BLOCK
static_assert(F8_BK == ATTN_SCALE_BLOCK, "a key block must be one scale block");
static_assert(F8_BQ == F8_BK, "only the diagonal key block is masked");

// d (64 x 128, FP32) (+)= A (64 x 32 E4M3, smem, K-major) * B (32 x 128 E4M3, smem, K-major)
__device__ __forceinline__ void wgmma_fp8_m64n128(float (&d)[64], uint64_t desc_a, uint64_t desc_b,
                                                  int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 {" WG_REGS64 "}, %64, %65, p, 1, 1;\n}\n"
        : WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24), WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
// d (64 x 64) (+)= A (64 x 32 E4M3, smem) * B (32 x 64 E4M3, smem), both K-major
__device__ __forceinline__ void wgmma_fp8_m64n64(float (&d)[32], uint64_t desc_a, uint64_t desc_b,
                                                 int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 {" WG_REGS32 "}, %32, %33, p, 1, 1;\n}\n"
        : WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}

// Byte offset of (row r, byte column c) in a 128-byte-swizzled tile of 128-byte rows.
__device__ __forceinline__ uint32_t sw128(int r, int c) {
    return (uint32_t)(r * 128 + ((((c >> 4) ^ (r & 7)) << 4) | (c & 15)));
}

// Copies ROWS rows of CHUNKS 16-byte chunks (row pitch `pitch` bytes in global memory) into a
// swizzled tile. Every source byte exists (the quantized layouts are padded to whole blocks).
template <int ROWS, int CHUNKS>
__device__ __forceinline__ void load_fp8_tile(uint8_t *s, const uint8_t *g, long pitch, int tid) {
    static_assert(ROWS * CHUNKS % 256 == 0, "tile copy must split evenly over 256 threads");
#pragma unroll
    for (int i = 0; i < ROWS * CHUNKS / 256; i++) {
        const int c = tid + i * 256, r = c / CHUNKS, ch = c % CHUNKS;
        cp_async16(s + sw128(r, ch * 16), g + (long)r * pitch + ch * 16, true);
    }
}

// grid (n_qb * B * H), block 256 (2 warpgroups). Heaviest query blocks first.
template <int D>
__global__ void __launch_bounds__(256, 1)
    attn_fwd_fp8_kernel(const uint8_t *__restrict__ qc, const uint8_t *__restrict__ kc,
                        const uint8_t *__restrict__ vtc, const float *__restrict__ q_scales,
                        const float *__restrict__ k_scales, const float *__restrict__ v_scales,
                        float p_scale, bf16 *__restrict__ o, int o_stride, float *__restrict__ lse,
                        int H, int T, float tau) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint8_t *smem = reinterpret_cast<uint8_t *>(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    uint8_t *sQ = smem;                 // (128 rows x 128 B) Q̂ codes of the query block
    uint8_t *sK = sQ + F8_BQ * 128;     // (128 keys x 128 B) K̂ codes of the key block
    uint8_t *sVt = sK + F8_BK * 128;    // (D x 128 keys) V̂^T codes of the key block
    uint8_t *sP = sVt + D * 128;        // (128 rows x 128 keys) P̂ codes, 64 rows per warpgroup

    const int nblk = (T + F8_BK - 1) / F8_BK, Tp = nblk * F8_BK;
    const int n_bh = gridDim.x / nblk;
    const int qb = nblk - 1 - (int)blockIdx.x / n_bh, bh = (int)blockIdx.x % n_bh;
    const int b = bh / H, h = bh % H;
    const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const int q0 = qb * F8_BQ, row_w0 = q0 + wg * 64 + warp * 16;  // warp's first query row
    const int n_kb = qb + 1;                                          // causal: blocks 0..qb
    const uint8_t *sQw = sQ + wg * 64 * 128;  // this warpgroup's 64 query rows
    uint8_t *sPw = sP + wg * 64 * 128;         // and its 64 rows of P̂

    const float inv_q = 1.0f / q_scales[(long)bh * nblk + qb];
    const float inv_p = 1.0f / p_scale;
    load_fp8_tile<F8_BQ, D / 16>(sQ, qc + ((long)bh * Tp + q0) * D, D, tid);

    float oacc[D / 2], pv[D / 2], s[F8_BK / 2];  // O (FP32), one block's P̂V̂, S: wgmma layouts
#pragma unroll
    for (int i = 0; i < D / 2; i++) oacc[i] = pv[i] = 0.f;
#pragma unroll
    for (int i = 0; i < F8_BK / 2; i++) s[i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

    for (int kb = 0; kb < n_kb; kb++) {
        const int k0 = kb * F8_BK;
        __syncthreads();  // everyone is done with sK, sVt, sP of the previous block
        load_fp8_tile<F8_BK, D / 16>(sK, kc + ((long)bh * Tp + k0) * D, D, tid);
        load_fp8_tile<D, F8_BK / 16>(sVt, vtc + (long)bh * D * Tp + k0, Tp, tid);
        cp_async_commit();
        cp_async_wait_all();
        fence_proxy_async();  // cp.async writes (generic proxy) -> wgmma reads (async proxy)
        __syncthreads();

        // S = Q̂ K̂^T (codes)
        reg_fence(s);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < D / 32; kk++)
            wgmma_fp8_m64n128(s, wgmma_desc(sQw + kk * 32, 16, 1024), wgmma_desc(sK + kk * 32, 16, 1024), kk > 0);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(s);

        // dequantize, mask, online softmax (natural-log units, as the emulation)
        const float inv_k = 1.0f / k_scales[(long)bh * nblk + kb];
        const bool diag = kb == qb;
        float mx[2] = {-INFINITY, -INFINITY};
#pragma unroll
        for (int n = 0; n < F8_BK / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int col = k0 + n * 8 + 2 * t4 + (e & 1), row = row_w0 + g + (e >> 1) * 8;
                float x = tau * ((s[4 * n + e] * inv_q) * inv_k);  // exact but for tau
                if (diag && (col > row || col >= T)) x = -INFINITY;
                s[4 * n + e] = x;
                mx[e >> 1] = fmaxf(mx[e >> 1], x);
            }
        float alpha[2], mn[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 1));
            mx[r] = fmaxf(mx[r], __shfl_xor_sync(0xffffffffu, mx[r], 2));
            mn[r] = fmaxf(m[r], mx[r]);
            alpha[r] = m[r] == -INFINITY ? 0.0f : expf(m[r] - mn[r]);
            m[r] = mn[r];
        }
        float rs[2] = {0.f, 0.f};
#pragma unroll
        for (int n = 0; n < F8_BK / 8; n++)
#pragma unroll
            for (int e2 = 0; e2 < 2; e2++) {  // e2: row g or g + 8
                const float p0 = expf(s[4 * n + 2 * e2] - mn[e2]);
                const float p1 = expf(s[4 * n + 2 * e2 + 1] - mn[e2]);
                rs[e2] += p0 + p1;
                const uint32_t c0 = fp8_e4m3_from_f32(p0 * p_scale), c1 = fp8_e4m3_from_f32(p1 * p_scale);
                const int r = warp * 16 + g + 8 * e2, c = n * 8 + 2 * t4;
                *reinterpret_cast<uint16_t *>(sPw + sw128(r, c)) = (uint16_t)(c0 | (c1 << 8));
            }
        l[0] = l[0] * alpha[0] + rs[0];
        l[1] = l[1] * alpha[1] + rs[1];
        fence_proxy_async();  // P̂ stores (generic proxy) -> wgmma reads
        __syncthreads();

        // pv = P̂ V̂ (codes), a fresh accumulator for this key block
        reg_fence(pv);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < F8_BK / 32; kk++) {
            const uint64_t da = wgmma_desc(sPw + kk * 32, 16, 1024), db = wgmma_desc(sVt + kk * 32, 16, 1024);
            if constexpr (D == 128) wgmma_fp8_m64n128(pv, da, db, kk > 0);
            else wgmma_fp8_m64n64(pv, da, db, kk > 0);
        }
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(pv);
        const float fac_v = inv_p * (1.0f / v_scales[(long)bh * nblk + kb]);
#pragma unroll
        for (int i = 0; i < D / 2; i++) oacc[i] = oacc[i] * alpha[(i >> 1) & 1] + pv[i] * fac_v;
    }

    // epilogue: full row sums, O = acc / l in BF16, LSE natural log
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
    }
    const long obase = (long)b * T * o_stride + (long)h * D;
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row_w0 + g + r * 8;
        if (row >= T) continue;
        const float inv = 1.f / l[r];
        bf16 *orow = o + obase + (long)row * o_stride;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<uint32_t *>(orow + n * 8 + 2 * t4) =
                pack_bf16(oacc[4 * n + 2 * r] * inv, oacc[4 * n + 2 * r + 1] * inv);
        if (t4 == 0) lse[(long)bh * T + row] = m[r] + logf(l[r]);
    }
}

template <int D>
static void forward_fp8_d(const uint8_t *qc, const uint8_t *kc, const uint8_t *vtc, const float *qs,
                          const float *ks, const float *vs, float p_scale, bf16 *o, int o_stride,
                          float *lse, int B, int H, int T, cudaStream_t stream) {
    const size_t smem = (size_t)(F8_BQ + F8_BK + D + F8_BQ) * 128 + 1024;  // Q, K, V^T, P + alignment
    static bool attr_set = false;  // one device per process (one GPU per rank)
    if (!attr_set) {
        CUDA_OK(cudaFuncSetAttribute(attn_fwd_fp8_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr_set = true;
    }
    const long n_cta = (long)attn_quant_n_blocks(T) * B * H;
    if (n_cta > 0x7fffffffL) FATAL("attn_gpu_forward_fp8: B*H*ceil(T/128) = %ld CTAs is too many", n_cta);
    attn_fwd_fp8_kernel<D><<<(unsigned)n_cta, 256, smem, stream>>>(qc, kc, vtc, qs, ks, vs, p_scale, o, o_stride,
                                                                    lse, H, T, 1.0f / sqrtf((float)D));
    CUDA_OK(cudaGetLastError());
}

extern "C" void attn_gpu_forward_fp8(const uint8_t *q_codes, const uint8_t *k_codes, const uint8_t *vt_codes,
                                     const float *q_scales, const float *k_scales, const float *v_scales,
                                     float p_scale, uint16_t *o, int o_stride, float *lse, int B, int H,
                                     int T, int d, cudaStream_t stream) {
    const void *ptrs[] = {q_codes, k_codes, vt_codes, o};
    const int strides[] = {o_stride};
    check_args("attn_gpu_forward_fp8", ptrs, 4, strides, 1, B, H, T, d);
    if (!q_scales || !k_scales || !v_scales || !lse) FATAL("attn_gpu_forward_fp8: missing scales or lse");
    if (!(p_scale > 0.0f)) FATAL("attn_gpu_forward_fp8: p_scale must be positive, got %g", p_scale);
    if (d == 64)
        forward_fp8_d<64>(q_codes, k_codes, vt_codes, q_scales, k_scales, v_scales, p_scale, (bf16 *)o, o_stride,
                          lse, B, H, T, stream);
    else
        forward_fp8_d<128>(q_codes, k_codes, vt_codes, q_scales, k_scales, v_scales, p_scale, (bf16 *)o,
                           o_stride, lse, B, H, T, stream);
}
