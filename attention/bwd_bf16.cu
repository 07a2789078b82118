// bwd_bf16.cu: fused causal flash attention backward in BF16 (docs/fp8-attention.md), three
// kernels: attn_bwd_preprocess_kernel (D = rowsum(dO * O), the zeroed FP32 dQ accumulator), the
// main kernel attn_bwd_wgmma_kernel (wgmma, sm_90a: one key block per CTA walking the query blocks
// from the diagonal down, dQ by FP32 atomics), then attn_bwd_convert_dq_kernel (dQ in BF16). The
// FP8 backward (attention/bwd_fp8.cu) keeps this tiling and pass order and shares the dQ
// conversion. Interface: attention/kernels_bf16.h. The mma.sync form of the main kernel is a lab
// version in dev/cuda/.
//
// One CTA per key block of BW_BC = 128 keys, 384 threads: warpgroup 0 is the producer (one
// thread issues TMA copies of K and V once, then of Q_j and dO_j, two stages; warp 0 copies
// LSE_j*log2(e) and D_j into the stage); warpgroups 1 and 2 (the consumers) own keys 0-63 and
// 64-127 of the block and keep their dK, dV rows (64 x d each, FP32) in registers. Per query block
// j of BR queries (BR = 64 for d = 128, 128 for d = 64), from the diagonal down, each consumer:
//   S^T = K_w Q_j^T, dP^T = V_w dO_j^T          wgmma, both operands K-major in shared memory
//   P^T = 2^(S^T*scale_log2 - LSE*log2e)        (causal mask on the first BW_BC/BR blocks)
//   dS^T = P^T (dP^T - D)                       FP32, then rounded to BF16 (as is P)
//   dS^T -> shared memory (BF16, 128-byte swizzle)
//   dV += P^T dO_j                              wgmma, A = P^T (BF16) from registers, B N-major
//   named barrier over both consumers (all of dS^T in shared memory), then
//   dK += dS^T Q_j                              wgmma, A = own dS^T rows (K-major), B N-major
//   dQ_j (64 x 64 part) = dS K                  wgmma, A = dS (M-major) and B = K (N-major) from
//                                               shared memory; added to the FP32 accumulator
//                                               with float2 atomics.
// (dK takes dS^T from shared memory rather than registers: 16 fewer live registers, which is
// what keeps the d = 128 consumers at 240 registers without spills.) Registers per consumer
// thread: dV, dK 2 x d/2, S^T and dP^T 2 x BR/2, dQ 32. Shared memory ~162 KB (1 CTA per SM).
// The dQ part of warpgroup w: d = 128: all 64 queries x columns 64w..64w+63;
//                             d = 64:  queries 64w..64w+63 x all 64 columns.
// P and dS are rounded to BF16 before their products, FP32 accumulation everywhere, dK scaled by
// tau at the end, dQ by the conversion kernel.
#include "attention/kernels_bf16.h"

#include <cuda.h>          // CUtensorMap and its enums (types only: no -lcuda)
#include <cuda_runtime.h>  // launches, cudaFuncSetAttribute
#include <stddef.h>        // size_t
#include <stdint.h>        // uint32_t, uint64_t
#include <type_traits>     // std::true_type, std::false_type

#include "attention/common.cuh"  // PTX wrappers, causal orders, dK / dV epilogue, check_args
#include "core/common.h"         // FATAL
#include "core/gpu_sizes.h"      // gpu_attn_bwd_workspace_bytes (shared with the memory plan)
#include "gpu/tensor_map.h"      // tensor_map_bthd (Q, K, V, dO maps)

// --- backward: preprocess ----------------------------------------------------------------------
// One warp per (b, t, h) row: Dlt[b,h,t] = sum_c dO*O (FP32), and zero the row of the FP32 dQ
// accumulator (B, H, T, D).
template <int D>
__global__ void attn_bwd_preprocess_kernel(const bf16 *__restrict__ o, const bf16 *__restrict__ dout,
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
#define BW_BC 128  // keys per CTA: 2 consumer warpgroups x 64

template <int D>
struct BwCfg {
    static constexpr int BR = D == 128 ? 64 : 128;  // queries per block
    static constexpr int K_BYTES = BW_BC * D * 2;   // one K (or V) tile
    static constexpr int Q_BYTES = BR * D * 2;      // one Q (or dO) stage
    static constexpr int DS_BYTES = BW_BC * BR * 2; // one dS^T buffer
    static constexpr int LD_FLOATS = 2 * BR;        // one stage of LSE*log2e, D
    static constexpr size_t SMEM = 1024 + 2 * (size_t)K_BYTES + 4 * (size_t)Q_BYTES + 2 * (size_t)DS_BYTES +
                                   2 * LD_FLOATS * sizeof(float) + 8 * sizeof(uint64_t);
};

// acc (64 x N) = A (64 rows at sA, K-major, D/64 regions of a_rows x 128 bytes) *
// B^T (N rows at sB, K-major, D/64 regions of N x 128 bytes): S^T = K Q^T and dP^T = V dO^T.
template <int D, int N>
__device__ __forceinline__ void bw_issue_kmajor(float (&acc)[N / 2], uint32_t sA, int a_rows, uint32_t sB) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const int reg = kk >> 2, off = (kk & 3) * 32;  // 64-column region, 32 bytes per k16
        const uint64_t da = wgmma_desc_at(sA + reg * a_rows * 128 + off, 16, 1024);
        const uint64_t db = wgmma_desc_at(sB + reg * N * 128 + off, 16, 1024);
        if constexpr (N == 64) wgmma_m64n64_ss(acc, da, db, kk > 0);
        else wgmma_m64n128_ss(acc, da, db, kk > 0);
    }
}

// acc (64 x D) += A (64 x BR, BF16 fragments in registers) * B (BR x D at sB, N-major: D/64
// regions of BR rows x 128 bytes): dV += P^T dO and dK += dS^T Q.
template <int D, int BR>
__device__ __forceinline__ void bw_issue_rs(float (&acc)[D / 2], const uint32_t (&a)[BR / 16][4], uint32_t sB) {
#pragma unroll
    for (int kk = 0; kk < BR / 16; kk++) {
        const uint64_t db = wgmma_desc_at(sB + kk * 16 * 128, BR * 128, 1024);
        if constexpr (D == 128) wgmma_m64n128_rs_nmajor(acc, a[kk], db);
        else wgmma_m64n64_rs_nmajor(acc, a[kk], db);
    }
}

// acc (64 x D) += A (64 x BR at sA, K-major: BR/64 regions of a_rows x 128 bytes) * B (BR x D
// at sB, N-major as in bw_issue_rs): dK += dS^T Q with dS^T from shared memory.
template <int D, int BR>
__device__ __forceinline__ void bw_issue_ss_nt(float (&acc)[D / 2], uint32_t sA, int a_rows, uint32_t sB) {
#pragma unroll
    for (int kk = 0; kk < BR / 16; kk++) {
        const uint64_t da = wgmma_desc_at(sA + (kk >> 2) * a_rows * 128 + (kk & 3) * 32, 16, 1024);
        const uint64_t db = wgmma_desc_at(sB + kk * 16 * 128, BR * 128, 1024);
        if constexpr (D == 128) wgmma_m64n128_ss<0, 1>(acc, da, db, 1);
        else wgmma_m64n64_ss<0, 1>(acc, da, db, 1);
    }
}

// grid: ceil(T/BW_BC) * B*H CTAs, heaviest key blocks (kb = 0) first within groups of
// heads_per_group heads (causal_item_grouped; all heads by default); block 384 threads.
template <int D>
__global__ void __launch_bounds__(384, 1)
    attn_bwd_wgmma_kernel(const __grid_constant__ CUtensorMap tm_q, const __grid_constant__ CUtensorMap tm_k,
                          const __grid_constant__ CUtensorMap tm_v, const __grid_constant__ CUtensorMap tm_do,
                          const float *__restrict__ lse, const float *__restrict__ dlt,
                          float *__restrict__ dq_acc, bf16 *__restrict__ dk, bf16 *__restrict__ dv,
                          int dqkv_stride, int H, int T, float scale_log2, float tau, int heads_per_group) {
    using C = BwCfg<D>;
    constexpr int BR = C::BR;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    unsigned char *smem = reinterpret_cast<unsigned char *>(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    unsigned char *sK = smem, *sV = sK + C::K_BYTES, *sQ = sV + C::K_BYTES, *sdO = sQ + 2 * C::Q_BYTES,
                  *sdS = sdO + 2 * C::Q_BYTES;
    float *sLD = reinterpret_cast<float *>(sdS + 2 * C::DS_BYTES);  // per stage: LSE*log2e (BR), D (BR)
    uint64_t *bars = reinterpret_cast<uint64_t *>(sLD + 2 * C::LD_FLOATS);
    uint64_t *full_kv = bars, *full = bars + 1, *empty = bars + 3;

    const int n_kb = (T + BW_BC - 1) / BW_BC, n_bh = gridDim.x / n_kb;
    const CausalItem cta = causal_item_grouped(blockIdx.x, n_kb, n_bh, heads_per_group);
    const int kb = cta.rank, bh = cta.bh, b = bh / H, h = bh % H;
    const int k0 = kb * BW_BC, qb0 = k0 / BR, n_it = (T + BR - 1) / BR - qb0;

    if (threadIdx.x == 0) {
        mbar_init(full_kv, 1);
        for (int i = 0; i < 2; i++) {
            mbar_init(full + i, 33);  // the expect_tx arrival + warp 0's 32 LSE/D arrivals
            mbar_init(empty + i, 256);
        }
        mbar_fence_init();
    }
    __syncthreads();

    if (threadIdx.x < 128) {  // producer
        setmaxnreg_dec<24>();
        if (threadIdx.x < 32) {
            const int lane = threadIdx.x;
            if (lane == 0) {
                mbar_arrive_expect_tx(full_kv, 2 * C::K_BYTES);
                for (int r = 0; r < D / 64; r++) {
                    tma_load_4d(sK + r * BW_BC * 128, &tm_k, full_kv, r * 64, h, k0, b);
                    tma_load_4d(sV + r * BW_BC * 128, &tm_v, full_kv, r * 64, h, k0, b);
                }
            }
            const float *gl = lse + (long)bh * T, *gd = dlt + (long)bh * T;
            for (int it = 0; it < n_it; it++) {
                const int st = it & 1, q0 = (qb0 + it) * BR;
                if (it >= 2) mbar_wait(empty + st, ((it >> 1) & 1) ^ 1);  // release of use it-2
                if (lane == 0) {
                    mbar_arrive_expect_tx(full + st, 2 * C::Q_BYTES);
                    for (int r = 0; r < D / 64; r++) {
                        tma_load_4d(sQ + st * C::Q_BYTES + r * BR * 128, &tm_q, full + st, r * 64, h, q0, b);
                        tma_load_4d(sdO + st * C::Q_BYTES + r * BR * 128, &tm_do, full + st, r * 64, h, q0, b);
                    }
                }
                // rows past T: LSE = D = 0 with Q = dO = 0 (TMA zero fill): they add nothing
                float *ld = sLD + st * C::LD_FLOATS;
                for (int i = lane; i < BR; i += 32) {
                    const int t = q0 + i;
                    const bool ok = t < T;
                    ld[i] = ok ? gl[t] * 1.4426950408889634f : 0.f;
                    ld[BR + i] = ok ? gd[t] : 0.f;
                }
                mbar_arrive(full + st);  // release: the stores above are seen by the waiters
            }
        }
    } else {  // consumers
        setmaxnreg_inc<240>();
        const int ctid = (int)threadIdx.x - 128, w = ctid / 128, wp = (ctid % 128) / 32, lane = ctid % 32;
        const int g = lane >> 2, t4 = lane & 3;
        const int kw0 = k0 + 64 * w;         // warpgroup's first key
        const int krow = 64 * w + 16 * wp + g;  // thread's first key row in the block (and +8)
        const uint32_t aK = smem_addr(sK), aV = smem_addr(sV), aQ = smem_addr(sQ), adO = smem_addr(sdO),
                       adS = smem_addr(sdS), aLD = smem_addr(sLD);
        // dQ part of this warpgroup: A region of dS (64 queries), B region of K (64 columns)
        const int ra = D == 64 ? w : 0, rb = D == 128 ? w : 0;
        const int qa0 = 64 * ra, cb0 = 64 * rb;
        float *gdq = dq_acc + (long)bh * T * D;

        float dva[D / 2], dka[D / 2];
#pragma unroll
        for (int i = 0; i < D / 2; i++) dva[i] = dka[i] = 0.f;

        mbar_wait(full_kv, 0);

        auto step = [&](int it, auto mask) {
            const int st = it & 1, q0 = (qb0 + it) * BR;
            const uint32_t cQ = aQ + st * C::Q_BYTES, cdO = adO + st * C::Q_BYTES, cdS = adS + st * C::DS_BYTES;
            const uint32_t oK = opaque_u32(aK), oKw = oK + w * 64 * 128, oVw = opaque_u32(aV) + w * 64 * 128;
            const uint32_t cL = aLD + st * C::LD_FLOATS * 4, cD = cL + BR * 4;
            float s[BR / 2], dp[BR / 2];
            uint32_t pa[BR / 16][4], dsa[BR / 16][4];
            float dq[32];

            mbar_wait(full + st, (it >> 1) & 1);
            reg_fence(s);
            reg_fence(dp);
            wgmma_fence();
            bw_issue_kmajor<D, BR>(s, oKw, BW_BC, cQ);
            wgmma_commit();
            bw_issue_kmajor<D, BR>(dp, oVw, BW_BC, cdO);
            wgmma_commit();
            wgmma_wait<1>();  // S^T done; dP^T may still run
            reg_fence(s);
#pragma unroll
            for (int j = 0; j < BR / 8; j++) {
                const float2 l2 = lds_f32x2(cL + (8 * j + 2 * t4) * 4);
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    // clamped at 0: P <= 1 even where a huge |S| makes the argument's rounding exceed LSE
                    float p = fast_exp2(fminf(fmaf(s[4 * j + e], scale_log2, -((e & 1) ? l2.y : l2.x)), 0.f));
                    if (decltype(mask)::value) {
                        const int key = kw0 + 16 * wp + g + 8 * (e >> 1), qry = q0 + 8 * j + 2 * t4 + (e & 1);
                        if (key > qry) p = 0.f;
                    }
                    s[4 * j + e] = p;
                }
            }
            wgmma_wait<0>();  // dP^T done
            reg_fence(dp);
#pragma unroll
            for (int j = 0; j < BR / 8; j++) {
                const float2 d2 = lds_f32x2(cD + (8 * j + 2 * t4) * 4);
#pragma unroll
                for (int e = 0; e < 4; e++) dp[4 * j + e] = s[4 * j + e] * (dp[4 * j + e] - ((e & 1) ? d2.y : d2.x));
            }
            pack_bf16_afrags<BR>(pa, s);
            pack_bf16_afrags<BR>(dsa, dp);
            // dS^T (keys x queries) -> shared memory, BF16, 128-byte swizzle: 64-query regions of
            // BW_BC rows x 128 bytes; the pair (key, 8j+2t4..+1) is dsa[j/2][2*(j%2) + r]
#pragma unroll
            for (int j = 0; j < BR / 8; j++)
#pragma unroll
                for (int r = 0; r < 2; r++) {
                    const int kr = krow + 8 * r;  // kr % 8 == g
                    sts_b32(cdS + (j >> 3) * (BW_BC * 128) + kr * 128 + (((j & 7) ^ g) << 4) + 4 * t4,
                             dsa[j >> 1][2 * (j & 1) + r]);
                }
            fence_proxy_async();  // the dS^T stores, before the tensor cores read them
            reg_fence(dva);
            reg_fence(dka);
            wgmma_fence();
            bw_issue_rs<D, BR>(dva, pa, cdO);
            wgmma_commit();
            named_bar_sync<1, 256>();  // both warpgroups' dS^T in shared memory
            reg_fence(dq);
            wgmma_fence();
            bw_issue_ss_nt<D, BR>(dka, cdS + w * 64 * 128, BW_BC, cQ);
#pragma unroll
            for (int kk = 0; kk < BW_BC / 16; kk++)
                wgmma_m64n64_ss<1, 1>(dq, wgmma_desc_at(cdS + ra * (BW_BC * 128) + kk * 16 * 128, BW_BC * 128, 1024),
                                      wgmma_desc_at(oK + rb * (BW_BC * 128) + kk * 16 * 128, BW_BC * 128, 1024), kk > 0);
            wgmma_commit();
            wgmma_wait<0>();
            reg_fence(dq);
            reg_fence(dva);
            reg_fence(dka);
            reg_fence(pa);
            mbar_arrive(empty + st);  // this thread is done with Q_j, dO_j, LSE_j, D_j
            // dQ += dS K: rows qa0 + 16wp + g (+8), columns cb0 + 8j + 2t4
            const int qr = q0 + qa0 + 16 * wp + g;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const int col = cb0 + 8 * j + 2 * t4;
                if (qr < T) atomicAdd(reinterpret_cast<float2 *>(gdq + (long)qr * D + col), make_float2(dq[4 * j], dq[4 * j + 1]));
                if (qr + 8 < T)
                    atomicAdd(reinterpret_cast<float2 *>(gdq + (long)(qr + 8) * D + col), make_float2(dq[4 * j + 2], dq[4 * j + 3]));
            }
        };
        // the causal mask (and keys past T) matter only while q0 < k0 + BW_BC - 1
        constexpr int N_MASKED = BW_BC / BR;
        int it = 0;
        for (; it < n_it && it < N_MASKED; it++) step(it, std::true_type());
        for (; it < n_it; it++) step(it, std::false_type());

        // epilogue: dV and tau dK in BF16, staged in the K and V tiles' shared memory (free once
        // both consumers are past their last wgmma), then copied out in 16-byte chunks
        // (dkdv_stage, attention/common.cuh)
        static_assert(2 * BW_BC * 2 * D <= 2 * C::K_BYTES, "dK and dV fit where K and V were");
        // (the thread indices read again here: kept live through the loop, one of them spilled)
        const int etid = (int)threadIdx.x - 128;
        named_bar_sync<2, 256>();
        dkdv_stage<D>(smem_addr(sK), dka, dva, tau, 16 * (etid / 32));
        named_bar_sync<2, 256>();
        dkdv_copy_out<D, 256>(sK, dk, dv, (long)b * T * dqkv_stride + (long)h * D, dqkv_stride, k0, T, etid);
    }
}

// dq[b,t,h,:] = BF16(tau * dq_acc[b,h,t,:]); one thread per 4 elements.
template <int D>
__global__ void attn_bwd_convert_dq_kernel(const float *__restrict__ dq_acc, bf16 *__restrict__ dq,
                                           int dqkv_stride, int B, int H, int T, float tau) {
    const long i = (long)blockIdx.x * blockDim.x + threadIdx.x;  // over B*H*T*D/4
    if (i >= (long)B * H * T * (D / 4)) return;
    const int c = (int)(i % (D / 4)) * 4;
    const long bht = i / (D / 4);
    const int t = (int)(bht % T);
    const long bh = bht / T;
    const int h = (int)(bh % H), b = (int)(bh / H);
    float4 a = *reinterpret_cast<const float4 *>(dq_acc + bht * D + c);
    uint2 packed = make_uint2(pack_bf16(a.x * tau, a.y * tau), pack_bf16(a.z * tau, a.w * tau));
    *reinterpret_cast<uint2 *>(dq + ((long)b * T + t) * dqkv_stride + (long)h * D + c) = packed;
}

// --- launchers ---------------------------------------------------------------------------------
extern "C" size_t attn_gpu_backward_workspace_bytes(int B, int H, int T, int d) {
    return gpu_attn_bwd_workspace_bytes((size_t)B, (size_t)H, (size_t)T, (size_t)d);
}

// (B, T, H, D) BF16 with row stride `stride` as a 4-D tensor (c, h, t, b); box 64 x 1 x rows x 1,
// 128-byte swizzle; rows past T are zero-filled.
static CUtensorMap bw_make_tmap(const bf16 *base, int B, int H, int T, int D, int stride, int rows) {
    return tensor_map_bthd("the BF16 attention backward", base, B, H, T, D, stride, rows);
}

template <int D>
static void backward_d(const bf16 *q, const bf16 *k, const bf16 *v, int qkv_stride, const bf16 *o,
                       const bf16 *dout, int o_stride, const float *lse, bf16 *dq, bf16 *dk,
                       bf16 *dv, int dqkv_stride, void *workspace, int B, int H, int T,
                       cudaStream_t stream) {
    using C = BwCfg<D>;
    float *dq_acc = (float *)workspace;                 // (B, H, T, D)
    float *dlt = dq_acc + (size_t)B * H * T * D;        // (B, H, T)
    const long rows = (long)B * T * H;
    attn_bwd_preprocess_kernel<D><<<(unsigned)((rows + 7) / 8), 256, 0, stream>>>(o, dout, o_stride, dlt, dq_acc, B, H, T);
    CUDA_OK(cudaGetLastError());
    const float tau = 1.f / sqrtf((float)D);
    const float scale_log2 = 1.4426950408889634f * tau;

    const long n_cta = (long)((T + BW_BC - 1) / BW_BC) * B * H;
    if (n_cta > 0x7fffffffL) FATAL("attn_gpu_backward: B*H*ceil(T/%d) = %ld CTAs is too many", BW_BC, n_cta);
    static bool attr_set = false;  // one device per process (one GPU per rank)
    if (!attr_set) {
        CUDA_OK(cudaFuncSetAttribute(attn_bwd_wgmma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)C::SMEM));
        attr_set = true;
    }
    const CUtensorMap tq = bw_make_tmap(q, B, H, T, D, qkv_stride, C::BR);
    const CUtensorMap tk = bw_make_tmap(k, B, H, T, D, qkv_stride, BW_BC);
    const CUtensorMap tv = bw_make_tmap(v, B, H, T, D, qkv_stride, BW_BC);
    const CUtensorMap tdo = bw_make_tmap(dout, B, H, T, D, o_stride, C::BR);
    // CTA order: heaviest first within groups of heads, about one wave of CTAs whose Q and dO
    // (4 T D bytes per head) fit ~16 MiB of L2 (causal_heads_per_group). On one H200 (measured
    // 2026-11-30): 16-27% faster than heaviest first over all heads at T = 1K-2K (where the CTAs
    // running at once then share each head's Q and dO in L2), the same at 4K-8K.
    const int n_kb = (T + BW_BC - 1) / BW_BC;
    const int hg = causal_heads_per_group(4L * T * D, n_kb, B * H, attn_sm_count());
    attn_bwd_wgmma_kernel<D><<<(unsigned)n_cta, 384, C::SMEM, stream>>>(tq, tk, tv, tdo, lse, dlt, dq_acc, dk, dv,
                                                                        dqkv_stride, H, T, scale_log2, tau, hg);
    CUDA_OK(cudaGetLastError());

    attn_bwd_convert_dq(dq_acc, dq, dqkv_stride, B, H, T, D, tau, stream);
}

void attn_bwd_convert_dq(const float *dq_acc, bf16 *dq, int dqkv_stride, int B, int H, int T, int d, float tau,
                         cudaStream_t stream) {
    const long n4 = (long)B * H * T * (d / 4);
    if (d == 64)
        attn_bwd_convert_dq_kernel<64><<<(unsigned)((n4 + 255) / 256), 256, 0, stream>>>(dq_acc, dq, dqkv_stride, B, H,
                                                                                         T, tau);
    else
        attn_bwd_convert_dq_kernel<128><<<(unsigned)((n4 + 255) / 256), 256, 0, stream>>>(dq_acc, dq, dqkv_stride, B, H,
                                                                                          T, tau);
    CUDA_OK(cudaGetLastError());
}

extern "C" void attn_gpu_backward(const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                  int qkv_stride, const uint16_t *o, const uint16_t *dout,
                                  int o_stride, const float *lse, uint16_t *dq, uint16_t *dk,
                                  uint16_t *dv, int dqkv_stride, void *workspace, int B, int H,
                                  int T, int d, cudaStream_t stream) {
    const void *ptrs[] = {q, k, v, o, dout, dq, dk, dv, workspace};
    const int strides[] = {qkv_stride, o_stride, dqkv_stride};
    check_args("attn_gpu_backward", ptrs, 9, strides, 3, B, H, T, d);
    if (d == 64)
        backward_d<64>((const bf16 *)q, (const bf16 *)k, (const bf16 *)v, qkv_stride, (const bf16 *)o,
                       (const bf16 *)dout, o_stride, lse, (bf16 *)dq, (bf16 *)dk, (bf16 *)dv,
                       dqkv_stride, workspace, B, H, T, stream);
    else
        backward_d<128>((const bf16 *)q, (const bf16 *)k, (const bf16 *)v, qkv_stride, (const bf16 *)o,
                        (const bf16 *)dout, o_stride, lse, (bf16 *)dq, (bf16 *)dk, (bf16 *)dv,
                        dqkv_stride, workspace, B, H, T, stream);
}
