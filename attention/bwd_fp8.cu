// bwd_fp8.cu: fused causal flash attention backward in FP8 (docs/fp8-attention.md §3:
// fp8_naive, fp8_dm, fp8_dm_approx) on FP8 wgmma (QGMMA in SASS). Interface and operand layouts:
// attention/kernels_fp8.h. Numerics, as attn_cpu_backward emulates them with block_q = 64,
// block_k = 128 (ATTN_FP8_BWD_BLOCK_Q/K; a query block lies in one 128-token scale block, a key
// block is one scale block, so every tile has one scale per operand):
//   S^T = K̂ Q̂^T (codes) / (s_k s_q) * tau,  P = exp(S - LSE)   FP32, against the final LSE
//   dP^T = V̂ dÔ^T (codes) / (s_v s_do)                          FP32 (dÔ in the grad format)
//   dS = P (dP - D)                                              FP32 (the P above, not P̂)
//   dŜ = fmt(dS s_ds), s_ds from the amax of the 64 x 128 tile;  P̂ = E4M3(P p_scale)
//   dV += P̂^T dÔ / (p_scale s_do),  dK += dŜ^T Q̂ / (s_ds s_q),  dQ += dŜ K̂ / (s_ds s_k)
// Each tile's product goes to a fresh wgmma accumulator and is added in FP32 (registers for dK,
// dV; FP32 bulk reductions into an accumulator for dQ): the tensor cores' reduced-precision
// accumulation never runs over more than 128 elements (spec §3). dK, dQ get tau at the end, as
// in the emulation.
//
// D (spec "Computing the matched D"): fp8_naive rowsum(dO ∘ O) with the BF16 dO and stored O;
// fp8_dm_approx rowsum(dÔ ∘ O); fp8_dm the delta pass (attention/delta_fp8.cu), which gets P and
// dP bit for bit as this kernel's tile_p_dp does (the same codes, the same k32 steps of FP8
// wgmma, the same FP32 element arithmetic: pdp_p and the scale constants of
// attention/bwd_fp8_tile.cuh, explicitly rounded intrinsics that the compiler may not contract or
// reorder; exp as ex2.approx of a prescaled argument), in tiles of its own shape, so sum_j dS_ij = 0
// up to FP32 rounding.
//
// Kernels: attn_bwd_fp8_pre_kernel (D for naive/approx; zeroes the dQ accumulator and the row
// diagnostics), attn_fp8_delta_kernel (fp8_dm, attention/delta_fp8.cu; zeroes them too),
// attn_bwd_fp8_kernel (main), and
// attention/bwd_bf16.cu's attn_bwd_convert_dq (dQ = BF16(tau * acc), shared with the BF16 backward).
//
// Layout of the main kernel: 256 threads = 2 warpgroups; warpgroup w owns keys k0+64w..+63 of
// the CTA's 128-key block (M = keys for S^T, dP^T, dK, dV, so dK and dV stay in registers), the
// query block (64) is N. All FP8 wgmma operands are K-major tiles in shared memory with the
// forward's conventions (attention/fwd_fp8.cu): 128-byte rows, 128-byte swizzle (16-byte chunk
// c of row r at c ^ (r % 8)), regions 1024-byte aligned, a k32 step = +32 bytes of the
// descriptor; a tile whose reduction is 64 long (queries) uses the first 64 bytes of each row.
// The K-major operands for the reductions over tokens come from the transposed codes of the
// quantize kernel (Q̂^T, K̂^T, dÔ^T); P̂^T, dŜ^T and dŜ are written to shared memory by the
// threads that computed them. The main kernel double-buffers the query block's tiles (block i+1
// loads while block i computes: at d = 128 by TMA from one thread, at d = 64 by cp.async from
// every thread), overlaps the dV / dQ / dK wgmma groups with each
// other's FP32 epilogues, and converts to FP8 with the hardware's paired conversion (cvt_*x2,
// the same codes as fp8.h's encoders); see the comment above attn_bwd_fp8_kernel.
//
// By a static count the main loop is bound by instruction issue, not by the tensor cores
// (docs/fp8-attention-kernels.md §11), so its bookkeeping is kept lean (none of it changes a
// computed value): tiles are reached through pointers that keep the shared address space
// (smem_align1024: LDS/STS with 32-bit addresses, not generic 64-bit LD/ST); wgmma descriptors
// are 32-bit low words derived from one base by constant offsets (kmajor_desc_lo, wg_fp8_tile),
// the warpgroup's part in uniform registers; the causal / sequence end mask runs behind a
// warp-uniform branch, only on the tiles that need it (tile_p_dp); dQ leaves each query block
// through shared memory and D/32 TMA reductions issued by one thread (dq_reduce), not
// per-thread atomics; and 1/s_ds comes from the exponent bits of the power-of-two scale
// (pow2_recip).
#include "attention/kernels_fp8.h"

#include <cuda_runtime.h>  // launches, cudaFuncSetAttribute
#include <math.h>          // sqrtf
#include <stddef.h>        // size_t
#include <stdint.h>        // uint8_t, uint32_t, uint64_t
#include <string.h>        // memset

#include "attention/common.cuh"  // bf16, CUDA_OK, cp.async, wgmma fences/descriptors, check_args
#include "core/common.h"         // FATAL
#include "core/fp8.h"            // fp8_scale_for_amax, fp8_to_f32 (the encoders: see cvt_e4m3x2)
#include "core/gpu_sizes.h"      // gpu_attn_bwd_workspace_bytes (same scratch as the BF16 backward)
#include "gpu/tensor_map.h"      // tensor_map_tiled (the dQ accumulator's map), tensor_map_2d (the TMA form's maps)

#include "attention/bwd_fp8_tile.cuh"  // B8_*, wg_fp8_tile, b8_load, tile_p_dp: shared with the delta pass
#include "gpu/test_hooks.h"            // gpu_test_hooks: the head groups, the cp.async form

namespace {
// Scale blocks of a sequence of T tokens (attn_quant_n_blocks, for device code).
__device__ __forceinline__ int b8_nblk(int T) { return (T + ATTN_SCALE_BLOCK - 1) / ATTN_SCALE_BLOCK; }

// cvt_e4m3x2 / cvt_e5m2x2 (attention/common.cuh): two FP8 codes per hardware conversion.
template <bool E5>
__device__ __forceinline__ uint32_t grad_code2(float lo, float hi) {
    return E5 ? cvt_e5m2x2(lo, hi) : cvt_e4m3x2(lo, hi);
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

namespace {
// dQ leaves the CTA by bulk asynchronous tensor reductions (FlashAttention-3's way): each query
// block's 64 x D FP32 product is stored to shared memory in the layout of D/32 TMA boxes (64 rows
// x 32 floats = 128 bytes, 128-byte swizzle: 16-byte chunk c of row r at c ^ (r % 8)) and added
// to the FP32 accumulator in global memory by one thread with D/32 cp.reduce.async.bulk.tensor
// .add (each element added atomically in L2; rows past T are outside the tensor map and dropped).
// This replaced 16 float2 atomics per thread per block, which throttled the load/store queue
// (ncu: 15% of the warp stalls) and delayed the next block's prefetch behind them.
// The dQ reduction of the query block at row q0 of head bh: thread 0, after a barrier that follows
// every thread's staging stores and proxy fence.
template <int D>
__device__ __forceinline__ void dq_reduce(const void *tm_dq, uint32_t s_dq, int q0, int bh) {
#pragma unroll
    for (int bx = 0; bx < D / 32; bx++) tma_reduce_add_3d(tm_dq, s_dq + bx * B8_BQ * 128, bx * 32, q0, bh);
    bulk_commit();
}
}  // namespace

// --- main backward: grid (heads per group, ceil(T/128), groups), block 256 (2 warpgroups) -------
// Per query block (one iteration), with the next block's tiles already loading (two stages):
//   B1  wait for this stage's copies; __syncthreads (also: everyone is done with the previous
//       iteration, so its stage, sPt, sdSt, sdS and sAmax may be overwritten); prefetch the next
//       query block into the other stage
//       S^T, dP^T (one wgmma group) -> P, dP, dS in FP32; P̂^T codes; warp amax of dS
//   B2  __syncthreads: the tile's amax -> s_ds; dŜ^T, dŜ codes
//   B3  __syncthreads: dV (fresh accumulator) and dQ issued together; dV added while dQ runs;
//       dK issued; dQ staged in shared memory while dK runs (reduced after the next B1); dK added
// Shared memory (d = 128): K̂, V̂, K̂^T, P̂^T, dŜ^T (16 KB each), dŜ (8 KB), 2 stages of
// Q̂, dÔ (8 KB each), Q̂^T, dÔ^T (16 KB each; 8 KB with TMA), the dQ staging area (64 x 128
// FP32, 32 KB), LSE and D: ~218 KB (~186 KB with TMA), one CTA per SM.
// TMA (d = 128): one thread loads each query block with bulk tensor copies, completed on the
// stage's mbarrier, instead of 8 cp.async per thread; Q̂^T and dÔ^T then come in the 64-byte
// swizzle (64-byte rows: TMA writes a box densely, and the reduction over a query block's 64
// queries is one such row), the other tiles in the 128-byte one as in the cp.async form.
template <int D, bool TMA = false>
struct B8Smem {
    static constexpr int KV = B8_BK * 128;         // K̂ or V̂ (128 keys x 128 B)
    static constexpr int KT = D * 128;             // K̂^T (D rows x 128 B)
    static constexpr int QTT = D * (TMA ? 64 : 128);  // Q̂^T, dÔ^T (D rows x 64 queries, 64 or 128 B pitch)
    static constexpr int QT = B8_BQ * 128;         // Q̂, dÔ, dŜ (64 rows x 128 B)
    static constexpr int STAGE = 2 * QT + 2 * QTT;  // Q̂, dÔ, Q̂^T, dÔ^T of one query block
    // byte offsets from the 1024-aligned base: K̂, V̂, P̂^T, dŜ^T, K̂^T, dŜ, then the 2 stages
    static constexpr int OFF_K = 0, OFF_V = OFF_K + KV, OFF_PT = OFF_V + KV, OFF_DST = OFF_PT + KV,
                         OFF_KT = OFF_DST + KV, OFF_DS = OFF_KT + KT, OFF_STAGE = OFF_DS + QT;
    // within a stage: Q̂, dÔ, Q̂^T, dÔ^T
    static constexpr int OFF_Q = 0, OFF_DO = QT, OFF_QT = 2 * QT, OFF_DOT = 2 * QT + QTT;
    static constexpr int FIXED = OFF_STAGE;        // 4 KV + KT + QT
    static_assert(KV % 1024 == 0 && KT % 1024 == 0 && QT % 1024 == 0 && QTT % 1024 == 0,
                  "swizzled regions start at 1024-byte boundaries");
    // after the 2 stages: the dQ staging area (D/32 swizzled boxes of B8_BQ x 128 bytes), then
    // LSE, D (2 stages x 64 each), amax (8), the Q and dO scales (2 x 2), the stages' mbarriers
    static constexpr int OFF_DQ = FIXED + 2 * STAGE, DQ = B8_BQ * D * (int)sizeof(float);
    static_assert(OFF_DQ % 1024 == 0, "the 128-byte swizzle of the dQ boxes needs 1024-byte alignment");
    static constexpr int OFF_BAR = OFF_DQ + DQ + (4 * B8_BQ + 8 + 4) * (int)sizeof(float);
    static_assert(OFF_BAR % 8 == 0, "mbarriers are 8-byte aligned");
    // bytes of one query block's TMA copies (the mbarrier's transaction count)
    static constexpr int STAGE_TX = STAGE + 2 * B8_BQ * (int)sizeof(float);
    static constexpr size_t bytes = (size_t)OFF_BAR + 2 * sizeof(uint64_t) + 1024;
    static_assert(bytes <= 227 * 1024, "more shared memory than an sm_90 CTA may have");
};

// The tensor maps of the TMA form (d = 128): Q̂, dÔ (B*H*Tp rows of D bytes; box 64 rows, 128-byte
// swizzle), Q̂^T, dÔ^T (B*H*D rows of Tp bytes; box 64 bytes x D rows, 64-byte swizzle), LSE and
// D (B*H rows of T floats; box 64 x 1, rows past T read as zeros).
struct B8QMaps {
    CUtensorMap q, dout, qt, dot, lse, dl;
};
// The thread that issues the TMA form's query-block copies (thread 0 issues the dQ reductions).
#define B8_LOADER 32

template <int D, bool E5, bool TMA>
__global__ void __launch_bounds__(B8_THREADS, 1)
    attn_bwd_fp8_kernel(const uint8_t *__restrict__ qc, const uint8_t *__restrict__ qtc,
                        const uint8_t *__restrict__ kc, const uint8_t *__restrict__ ktc,
                        const uint8_t *__restrict__ vc, const uint8_t *__restrict__ doc,
                        const uint8_t *__restrict__ dotc, const float *__restrict__ q_scales,
                        const float *__restrict__ k_scales, const float *__restrict__ v_scales,
                        const float *__restrict__ do_scales, float p_scale, const float *__restrict__ lse,
                        const float *__restrict__ dlt, bf16 *__restrict__ dk,
                        bf16 *__restrict__ dv, int dqkv_stride, float *__restrict__ row_ds_sum,
                        float *__restrict__ row_cancel, int H, int n_bh, int T, float tau,
                        const __grid_constant__ CUtensorMap tm_dq, const __grid_constant__ B8QMaps qm) {
    static_assert(!TMA || D == 128, "the TMA form is for d = 128");
    using L = B8Smem<D, TMA>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint8_t *smem = smem_align1024(smem_raw);
    uint8_t *sK = smem + L::OFF_K;          // (128 keys x 128 B)  K̂, reduction over d
    uint8_t *sV = smem + L::OFF_V;          // (128 keys x 128 B)  V̂
    uint8_t *sPt = smem + L::OFF_PT;        // (128 keys x 64 queries) P̂^T
    uint8_t *sdSt = smem + L::OFF_DST;      // (128 keys x 64 queries) dŜ^T
    uint8_t *sKt = smem + L::OFF_KT;        // (D x 128 keys)      K̂^T, for dQ
    uint8_t *sdS = smem + L::OFF_DS;        // (64 queries x 128 keys) dŜ
    uint8_t *stage0 = smem + L::OFF_STAGE;  // 2 stages: Q̂ (64 x 128 B), dÔ, Q̂^T (D x 64 queries), dÔ^T
    const uint32_t dlo_smem = kmajor_desc_lo(smem_addr(smem));  // the base's descriptor low word
    const uint32_t s_dq = smem_addr(smem + L::OFF_DQ);                   // (D/32 boxes of 64 x 32) dQ staging
    float *sLse2 = reinterpret_cast<float *>(smem + L::OFF_DQ + L::DQ);  // (2 stages, 64)
    float *sDl2 = sLse2 + 2 * B8_BQ;                                  // (2 stages, 64) D
    float *sAmax = sDl2 + 2 * B8_BQ;                                  // (8) per-warp |dS| max
    float *sQDs = sAmax + 8;  // (2 stages, 2) the query block's Q and dO scales
    uint64_t *sFull = reinterpret_cast<uint64_t *>(smem + L::OFF_BAR);  // (2 stages) TMA: the stage is in

    // Heaviest first within groups of heads (grid (heads per group, key blocks, groups): the
    // launch order runs x fastest, so a group's CTAs of rank 0 start first, then rank 1, ...),
    // the groups of about one wave of CTAs (backward_fp8_d). Measured: 2-4% faster than the
    // natural order (each head's key blocks in turn, a group of one head); heaviest first over
    // all heads gained 1% at T = 4K-8K and lost 18-21% at 1K-2K (the CTAs running at once then
    // belong to ~132 heads and no longer share their Q̂, dÔ blocks in L2).
    const int kb = blockIdx.y, bh = blockIdx.z * gridDim.x + blockIdx.x, b = bh / H, h = bh % H;
    if (bh >= n_bh) return;  // past the last head of a partial last group (before any barrier)
    const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32;
    const int g = lane >> 2, t4 = lane & 3;
    const int nblk = b8_nblk(T), Tp = nblk * ATTN_SCALE_BLOCK;
    const int k0 = kb * B8_BK, key0 = k0 + wg * 64;  // the warpgroup's first key
    const int n_qb = (T + B8_BQ - 1) / B8_BQ;
    const float inv_k = 1.0f / k_scales[(long)bh * nblk + kb], inv_v = 1.0f / v_scales[(long)bh * nblk + kb];
    const float inv_p = 1.0f / p_scale;
    const Fp8Format gfmt = E5 ? FP8_E5M2 : FP8_E4M3;

    // cp.async of query block qb's tiles (codes, transposed codes, LSE, D, the Q and dO scales)
    // into stage s
    auto load_qblock = [&](int qb, int s) {
        const int q0 = qb * B8_BQ;
        uint8_t *st = stage0 + s * L::STAGE;
        b8_load<B8_BQ, D / 16>(st + L::OFF_Q, qc + ((long)bh * Tp + q0) * D, D, tid);
        b8_load<B8_BQ, D / 16>(st + L::OFF_DO, doc + ((long)bh * Tp + q0) * D, D, tid);
        b8_load<D, B8_BQ / 16>(st + L::OFF_QT, qtc + (long)bh * D * Tp + q0, Tp, tid);
        b8_load<D, B8_BQ / 16>(st + L::OFF_DOT, dotc + (long)bh * D * Tp + q0, Tp, tid);
        if (tid < 2 * B8_BQ) {  // LSE (threads 0-63) and D (64-127); rows past T become 0
            const int r = tid % B8_BQ;
            const bool ok = q0 + r < T;
            const float *src = (tid < B8_BQ ? lse : dlt) + (long)bh * T + (ok ? q0 + r : 0);
            cp_async4((tid < B8_BQ ? sLse2 : sDl2) + s * B8_BQ + r, src, ok);
        } else if (tid < 2 * B8_BQ + 2) {  // threads 128, 129: the scales of the block's 128-token scale block
            const float *src = (tid == 2 * B8_BQ ? q_scales : do_scales) + (long)bh * nblk + q0 / ATTN_SCALE_BLOCK;
            cp_async4(sQDs + 2 * s + (tid - 2 * B8_BQ), src, true);
        }
    };

    // TMA form, thread B8_LOADER: query block qb's tiles, LSE and D by bulk tensor copies and its
    // two scales by cp.async, all completing on stage s's mbarrier (count 1: the cp.async arrival)
    auto load_qblock_tma = [&](int qb, int s) {
        const int q0 = qb * B8_BQ;
        uint8_t *st = stage0 + s * L::STAGE;
        uint64_t *bar = sFull + s;
        mbar_expect_tx(bar, L::STAGE_TX);
        tma_load_2d(st + L::OFF_Q, &qm.q, bar, 0, bh * Tp + q0);
        tma_load_2d(st + L::OFF_DO, &qm.dout, bar, 0, bh * Tp + q0);
        tma_load_2d(st + L::OFF_QT, &qm.qt, bar, q0, bh * D);
        tma_load_2d(st + L::OFF_DOT, &qm.dot, bar, q0, bh * D);
        tma_load_2d(sLse2 + s * B8_BQ, &qm.lse, bar, q0, bh);
        tma_load_2d(sDl2 + s * B8_BQ, &qm.dl, bar, q0, bh);
        const long sb = (long)bh * nblk + q0 / ATTN_SCALE_BLOCK;
        cp_async4(sQDs + 2 * s, q_scales + sb, true);
        cp_async4(sQDs + 2 * s + 1, do_scales + sb, true);
        cp_async_mbar_arrive(bar);
    };

    const int qb_first = k0 / B8_BQ;
    if constexpr (TMA) {
        if (tid == B8_LOADER) {
            mbar_init(sFull, 1);
            mbar_init(sFull + 1, 1);
            mbar_fence_init();
            load_qblock_tma(qb_first, 0);  // the other threads wait on it after the loop's first barrier
        }
    }
    b8_load<B8_BK, D / 16>(sK, kc + ((long)bh * Tp + k0) * D, D, tid);
    b8_load<B8_BK, D / 16>(sV, vc + ((long)bh * Tp + k0) * D, D, tid);
    b8_load<D, B8_BK / 16>(sKt, ktc + (long)bh * D * Tp + k0, Tp, tid);
    if constexpr (!TMA) load_qblock(qb_first, 0);
    cp_async_commit();
    if constexpr (TMA) cp_async_wait_all();  // K̂, V̂, K̂^T (the loop's first fence and barrier publish them)

    // This thread's shared-memory stores of each query block at loop-invariant offsets (sw128
    // written out, so that every store is one of a few registers plus a constant; recomputing
    // sw128 took ~3 instructions per store, ~100 of the ~1190 per iteration). P̂^T and dŜ^T
    // element (key row wr0 + 8 r, query column 8 n + 2 t4): (pt_off ^ ((n >> 1) << 4)) + 8 (n & 1)
    // + 1024 r, since (wr0 + 8 r) % 8 = g and the 16-byte chunk (8 n + 2 t4) >> 4 = n >> 1, so
    // the swizzle's XOR is g ^ (n >> 1) in bits 4-6 (the XOR with (n >> 1) << 4 flips bits 4-5
    // only). dŜ's element (query 8 n + 2 t4 + odd, key wr0 + 8 r - odd; see the dŜ stores):
    // ds_off + 1024 n + 8 r, since the key's chunk is 4 wg + warp and the query row's swizzle
    // 2 t4 + odd, whatever n and r.
    const int wr0 = wg * 64 + warp * 16 + g, odd = g & 1;
    const int pt_off = wr0 * 128 + (g << 4) + 2 * t4;
    auto pt_at = [&](int n, int r) { return (pt_off ^ ((n >> 1) << 4)) + 8 * (n & 1) + 1024 * r; };  // P̂^T, dŜ^T
    const int ds_off = (2 * t4 + odd) * 128 + (((4 * wg + warp) ^ (2 * t4 + odd)) << 4) + g - odd;

    float dka[D / 2], dva[D / 2];  // FP32 dK, dV of the warpgroup's 64 keys (wgmma layout)
#pragma unroll
    for (int i = 0; i < D / 2; i++) dka[i] = dva[i] = 0.f;

    for (int qb = qb_first; qb < n_qb; qb++) {
        const int q0 = qb * B8_BQ, s = (qb - qb_first) & 1;
        // B1: every thread is past the previous iteration, so the other stage is free to refill;
        // this stage's copies have landed: cp.async, the only group in flight, before the barrier
        // for all threads; TMA, its mbarrier's phase after it
        if constexpr (!TMA) cp_async_wait_all();
        fence_proxy_async();  // also orders the previous block's dQ staging stores for the bulk reads
        __syncthreads();
        if (qb + 1 < n_qb) {
            if constexpr (TMA) {
                if (tid == B8_LOADER) load_qblock_tma(qb + 1, s ^ 1);
            } else {
                load_qblock(qb + 1, s ^ 1);
                cp_async_commit();
            }
        }
        // the previous query block's dQ, staged by every thread before this barrier
        if (qb > qb_first && tid == 0) dq_reduce<D>(&tm_dq, s_dq, q0 - B8_BQ, bh);
        if constexpr (TMA) mbar_wait(sFull + s, (uint32_t)(((qb - qb_first) >> 1) & 1));
        // descriptor low words of the tiles: constant offsets from the opaque base, one add each.
        // wgu = wg, as a value the compiler knows to be warp-uniform (a shuffle from lane 0, as
        // CUTLASS's canonical_warp_group_idx), so the descriptors that depend on it are built in
        // uniform registers rather than per thread and moved over (R2UR) for every wgmma. Taken
        // here, not before the loop: there ptxas hoists more wg-dependent addresses and spills.
        const uint32_t dsm = opaque_u32(dlo_smem), dstage = dsm + (L::OFF_STAGE + s * L::STAGE) / 16;
        const uint32_t wgu = __shfl_sync(0xffffffffu, wg, 0);
        const uint32_t dkw = wgu * (64 * 128 / 16);  // the warpgroup's 64 key rows of K̂, V̂, P̂^T, dŜ^T
        const float *sLse = sLse2 + s * B8_BQ, *sDl = sDl2 + s * B8_BQ;
        const float inv_q = pow2_recip(sQDs[2 * s]), inv_do = pow2_recip(sQDs[2 * s + 1]);  // exact: powers of two

        float p[32], ds[32];
        tile_p_dp<D, E5>(dsm + L::OFF_K / 16 + dkw, dsm + L::OFF_V / 16 + dkw, dstage + L::OFF_Q / 16,
                         dstage + L::OFF_DO / 16, sLse, pdp_s_scale(inv_q, inv_k, tau), pdp_dp_scale(inv_do, inv_v),
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
        // dS = P (dP - D) in FP32 (masked entries: P = dP = 0 -> 0), its tile amax (four chains
        // of 8 instead of one of 32 on the way to B2: the max of a set is exact in any order); P̂^T
        // codes (two per hardware conversion, one 16-bit store per key row and query pair)
        float am[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
        for (int n = 0; n < 8; n++) {
            const float2 dl = *reinterpret_cast<const float2 *>(sDl + 8 * n + 2 * t4);
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = 4 * n + e;
                ds[i] = __fmul_rn(p[i], __fsub_rn(ds[i], (e & 1) ? dl.y : dl.x));
                am[e] = fmaxf(am[e], fabsf(ds[i]));
            }
        }
        float amax = fmaxf(fmaxf(am[0], am[1]), fmaxf(am[2], am[3]));
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int r = 0; r < 2; r++)  // key row wr0 + 8r, query columns 8n + 2t4, +1 (pt_at)
                *reinterpret_cast<uint16_t *>(sPt + pt_at(n, r)) =
                    (uint16_t)cvt_e4m3x2(p[4 * n + 2 * r] * p_scale, p[4 * n + 2 * r + 1] * p_scale);
        // the warp's max in one instruction (redux.sync) instead of five shuffle-and-max steps:
        // the amax is >= 0 and never NaN (fmaxf drops NaN), and such floats order as their bits
        amax = __uint_as_float(__reduce_max_sync(0xffffffffu, __float_as_uint(amax)));
        if (lane == 0) sAmax[wg * 4 + warp] = amax;
        __syncthreads();  // B2
        const float tmax = fmaxf(fmaxf(fmaxf(sAmax[0], sAmax[1]), fmaxf(sAmax[2], sAmax[3])),
                                 fmaxf(fmaxf(sAmax[4], sAmax[5]), fmaxf(sAmax[6], sAmax[7])));
        const float s_ds = fp8_scale_for_amax(gfmt, tmax), inv_ds = pow2_recip(s_ds);

        // dŜ codes, both orientations: dŜ^T (for dK) as this thread's (key, query pair) 16-bit
        // words; dŜ (for dQ) wants (query, key pair) words, so lanes g and g^1 (lane ^ 4: the
        // neighbouring key, same queries) swap one code each: the even-g lane then holds queries
        // ql of keys kr, kr+1, the odd-g lane query ql+1 of keys kr-1, kr. One shuffle and two
        // 16-bit stores per n instead of four byte stores (and no bank conflicts: the 8 rows a
        // warp writes fall in 8 different swizzle chunks).
        const uint32_t send_sel = odd ? 0x40u : 0x51u;  // odd sends its query-ql codes, even its ql+1
        const uint32_t keep_sel = odd ? 0x14u : 0x40u;  // (+0x01 / +0x10 for r = 1, see below)
#pragma unroll
        for (int n = 0; n < 8; n++) {  // query columns ql = 8n + 2t4, ql + 1
            uint32_t c2[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {  // key row wr0 + 8r, queries ql, ql + 1 (pt_at)
                c2[r] = grad_code2<E5>(ds[4 * n + 2 * r] * s_ds, ds[4 * n + 2 * r + 1] * s_ds);
                *reinterpret_cast<uint16_t *>(sdSt + pt_at(n, r)) = (uint16_t)c2[r];
            }
            // byte r of `recv`: the partner's code for key row r (query ql for the even lane,
            // ql + 1 for the odd one)
            const uint32_t recv = __shfl_xor_sync(0xffffffffu, __byte_perm(c2[0], c2[1], send_sel), 4);
#pragma unroll
            for (int r = 0; r < 2; r++) {
                // even: (my code, partner's) = (c2[r] byte 0, recv byte r) -> selector 0x40 + 0x10 r
                // odd:  (partner's, my code) = (recv byte r, c2[r] byte 1) -> selector 0x14 + r
                // at (query ql + odd, keys wr0 + 8r - odd, + 1): ds_off + 1024 n + 8 r
                const uint32_t sel = keep_sel + (r ? (odd ? 0x01u : 0x10u) : 0u);
                *reinterpret_cast<uint16_t *>(sdS + ds_off + 1024 * n + 8 * r) = (uint16_t)__byte_perm(c2[r], recv, sel);
            }
        }
        fence_proxy_async();  // generic-proxy stores -> wgmma reads
        if (tid == 0) bulk_wait_read();  // the dQ staging area may be refilled after B3
        __syncthreads();      // B3

        // dV += P̂^T dÔ (keys x d, reduction over the 64 queries) and dQ (64 queries x this
        // warpgroup's D/2 columns) = dŜ K̂ over the 128 keys, each in a fresh accumulator, issued
        // back to back; dV is added to its FP32 sum while dQ runs
        float t[D / 2], tq[D / 4];
        reg_fence(t);
        reg_fence(tq);
        wgmma_fence();
        wg_fp8_tile<D, 0, E5 ? 1 : 0, B8_BQ / 32, TMA>(t, dsm + L::OFF_PT / 16 + dkw, dstage + L::OFF_DOT / 16);
        wgmma_commit();
        wg_fp8_tile<D / 2, E5 ? 1 : 0, 0, B8_BK / 32>(tq, dsm + L::OFF_DS / 16, dsm + L::OFF_KT / 16 + wgu * (D / 2 * 128 / 16));
        wgmma_commit();
        wgmma_wait<1>();  // dV's group done
        reg_fence(t);
        {
            const float f = inv_p * inv_do;
#pragma unroll
            for (int i = 0; i < D / 2; i++) dva[i] += t[i] * f;
        }
        // dK += dŜ^T Q̂ (tau at the end), fresh accumulator (t again)
        reg_fence(t);
        wgmma_fence();
        wg_fp8_tile<D, E5 ? 1 : 0, 0, B8_BQ / 32, TMA>(t, dsm + L::OFF_DST / 16 + dkw, dstage + L::OFF_QT / 16);
        wgmma_commit();
        wgmma_wait<1>();  // dQ's group done (groups complete in order)
        reg_fence(tq);
        {
            // this thread's dQ elements: rows r, r + 8 (r = warp*16 + g) of the block, columns
            // c = wg*D/2 + 8n + 2t4, +1 (n < D/16), into the staging boxes (reduced after the next
            // B1): box c / 32 = wg*D/64 + n/4, 16-byte chunk (8 (n%4) + 2 t4) / 4 = 2 (n%4) + t4/2 of
            // the row, at chunk ^ (r % 8) = 2 (n%4) ^ (g ^ t4/2) (bit 0 of 2 (n%4) is free), byte
            // 8 (t4 & 1) in it. Row r + 8 has the same swizzle, 1024 bytes further.
            const float f = inv_ds * inv_k;
            const uint32_t base = s_dq + (wg * (D / 64)) * (B8_BQ * 128) + (warp * 16 + g) * 128 + 8 * (t4 & 1);
            const uint32_t x = (uint32_t)(g ^ (t4 >> 1));
#pragma unroll
            for (int n = 0; n < D / 16; n++) {
                const uint32_t a = base + (n / 4) * (B8_BQ * 128) + (((uint32_t)(2 * (n % 4)) ^ x) << 4);
                sts_f32x2(a, tq[4 * n] * f, tq[4 * n + 1] * f);
                sts_f32x2(a + 8 * 128, tq[4 * n + 2] * f, tq[4 * n + 3] * f);
            }
        }
        wgmma_wait<0>();
        reg_fence(t);
        {
            const float f = inv_ds * inv_q;
#pragma unroll
            for (int i = 0; i < D / 2; i++) dka[i] += t[i] * f;
        }
    }

    // the last query block's dQ: its reduction runs under the epilogue. Thread 0 waits only for
    // its reads of the staging area, and only before the CTA ends (dK and dV are staged in the
    // stages' memory, not there); its writes complete with the grid, as a TMA store's do. Waiting
    // for them here would keep the whole CTA ~1 us longer (2% of the kernel's SM time at T = 2K).
    fence_proxy_async();
    __syncthreads();
    if (tid == 0 && n_qb > qb_first) dq_reduce<D>(&tm_dq, s_dq, (n_qb - 1) * B8_BQ, bh);

    // epilogue: dV and tau dK in BF16, staged in the stages' shared memory (free now: every
    // wgmma is done), then copied out in 16-byte chunks (dkdv_stage, attention/common.cuh)
    static_assert(2 * B8_BK * 2 * D <= 2 * L::STAGE, "dK and dV fit in the two stages");
    dkdv_stage<D>(smem_addr(stage0), dka, dva, tau, wg * 64 + warp * 16);
    __syncthreads();
    dkdv_copy_out<D, B8_THREADS>(stage0, dk, dv, (long)b * T * dqkv_stride + (long)h * D, dqkv_stride, k0, T, tid);
    if (tid == 0) bulk_wait_read();  // the last dQ reduction has read the staging area
}

// --- launchers ---------------------------------------------------------------------------------
// The main backward's heads per group of its CTA order: about one wave of CTAs whose heads' Q̂, dÔ
// and their transposed copies (4 T d bytes per head) fit ~16 MiB of L2 (causal_heads_per_group). On
// one H200 (measured 2026-11-30): groups of 8-16 heads 2-4% faster than each head's key blocks in
// turn at every T; more than a wave per group gained nothing. (Tests may force a count: dK, dV do
// not depend on the order, dQ only through the order of its FP32 reductions.)
static int bwd_fp8_main_heads_per_group(int n_bh, int T, int d) {
    const int forced = gpu_test_hooks.bwd_fp8_group_heads;
    if (forced > 0) return forced < n_bh ? forced : n_bh;
    return causal_heads_per_group(4L * T * d, attn_quant_n_blocks(T), n_bh, attn_sm_count());
}
extern "C" size_t attn_gpu_backward_fp8_workspace_bytes(int B, int H, int T, int d) {
    return gpu_attn_bwd_workspace_bytes((size_t)B, (size_t)H, (size_t)T, (size_t)d);  // the BF16 backward's layout
}

// D's rows (B, H, T): the caller's delta_out, or after the dQ accumulator in the workspace.
static float *bwd_fp8_dlt(const AttnFp8BwdArgs *a, int B, int H, int T, int d) {
    return a->delta_out ? a->delta_out : (float *)a->workspace + (size_t)B * H * T * d;
}

// The main backward's query blocks by TMA at d = 128 (else cp.async by every thread, as at d = 64)
// where the maps can describe them: the maps of LSE and D need 16-byte aligned rows (T a multiple
// of 4: a box that starts off a 16-byte boundary is an illegal instruction) and aligned bases; the
// code rows (B*H*Tp, and B*H*D < that) must fit the int coordinates of a TMA copy
// (b8_code_rows_fit_tma).
static bool bwd_fp8_tma(const AttnFp8BwdArgs *a, const float *dlt, int B, int H, int T, int d) {
    return !gpu_test_hooks.bwd_fp8_no_tma && d == 128 && b8_code_rows_fit_tma(B, H, T) &&
           tma_rows_aligned(a->lse, 4L * T) && tma_rows_aligned(dlt, 4L * T);
}

// B8QMaps for the TMA form (see there).
static B8QMaps bwd_fp8_qmaps(const AttnFp8BwdArgs *a, const float *dlt, int B, int H, int T, int D) {
    B8QMaps m;
    const uint64_t bh = (uint64_t)B * H, Tp = (uint64_t)attn_quant_n_blocks(T) * ATTN_SCALE_BLOCK;
    const CUtensorMapDataType u8 = CU_TENSOR_MAP_DATA_TYPE_UINT8, f32 = CU_TENSOR_MAP_DATA_TYPE_FLOAT32;
    m.q = tensor_map_2d("the FP8 backward's Q codes", u8, a->q_codes, D, bh * Tp, D, D, B8_BQ, CU_TENSOR_MAP_SWIZZLE_128B);
    m.dout = tensor_map_2d("the FP8 backward's dO codes", u8, a->do_codes, D, bh * Tp, D, D, B8_BQ,
                           CU_TENSOR_MAP_SWIZZLE_128B);
    m.qt = tensor_map_2d("the FP8 backward's transposed Q codes", u8, a->qt_codes, Tp, bh * D, Tp, B8_BQ, D,
                         CU_TENSOR_MAP_SWIZZLE_64B);
    m.dot = tensor_map_2d("the FP8 backward's transposed dO codes", u8, a->dot_codes, Tp, bh * D, Tp, B8_BQ, D,
                          CU_TENSOR_MAP_SWIZZLE_64B);
    m.lse = tensor_map_2d("the FP8 backward's LSE", f32, a->lse, T, bh, 4L * T, B8_BQ, 1, CU_TENSOR_MAP_SWIZZLE_NONE);
    m.dl = tensor_map_2d("the FP8 backward's D", f32, dlt, T, bh, 4L * T, B8_BQ, 1, CU_TENSOR_MAP_SWIZZLE_NONE);
    return m;
}

// dlt: D's rows (B, H, T), bwd_fp8_dlt.
template <int D, bool E5, bool TMA>
static void backward_fp8_d(const AttnFp8BwdArgs *a, float *dlt, int B, int H, int T, cudaStream_t stream) {
    float *dq_acc = (float *)a->workspace;  // (B, H, T, D)
    const float tau = 1.0f / sqrtf((float)D);
    const long rows = (long)B * H * T;
    if (a->precision != ATTN_FP8_DM) {  // fp8_dm: the delta pass zeroes the accumulators itself
        attn_bwd_fp8_pre_kernel<D><<<(unsigned)((rows + 7) / 8), 256, 0, stream>>>(
            (const bf16 *)a->o, (const bf16 *)a->dout, a->o_stride, a->do_codes, a->do_scales, a->grad_format,
            (int)a->precision, dlt, dq_acc, a->row_ds_sum, a->row_cancel, B, H, T);
        CUDA_OK(cudaGetLastError());
    } else {
        attn_fp8_delta_pass(a, dlt, dq_acc, B, H, T, D, stream);  // attention/delta_fp8.cu
    }

    // dQ accumulator (B*H, T, D) FP32 as a 3-D tensor (d, t, bh); box 32 x 64 x 1, 128-byte
    // swizzle (the staging layout of the main kernel); rows past T are out of bounds
    const cuuint64_t dims[3] = {(cuuint64_t)D, (cuuint64_t)T, (cuuint64_t)B * H};
    const cuuint64_t strides[2] = {(cuuint64_t)D * 4, (cuuint64_t)T * D * 4};
    const cuuint32_t box[3] = {32, B8_BQ, 1};
    const CUtensorMap tm_dq = tensor_map_tiled("the FP8 backward's dQ reduction", CU_TENSOR_MAP_DATA_TYPE_FLOAT32, 3,
                                               dq_acc, dims, strides, box, CU_TENSOR_MAP_SWIZZLE_128B);
    B8QMaps qm;
    memset(&qm, 0, sizeof qm);
    if constexpr (TMA) qm = bwd_fp8_qmaps(a, dlt, B, H, T, D);
    const size_t smem = B8Smem<D, TMA>::bytes;
    static bool attr_set = false;
    if (!attr_set) {
        CUDA_OK(cudaFuncSetAttribute(attn_bwd_fp8_kernel<D, E5, TMA>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem));
        attr_set = true;
    }
    const int nblk = attn_quant_n_blocks(T), hg = bwd_fp8_main_heads_per_group(B * H, T, D);
    dim3 grid(hg, nblk, (B * H + hg - 1) / hg);
    attn_bwd_fp8_kernel<D, E5, TMA><<<grid, B8_THREADS, smem, stream>>>(
        a->q_codes, a->qt_codes, a->k_codes, a->kt_codes, a->v_codes, a->do_codes, a->dot_codes, a->q_scales,
        a->k_scales, a->v_scales, a->do_scales, a->p_scale, a->lse, dlt, (bf16 *)a->dk, (bf16 *)a->dv,
        a->dqkv_stride, a->row_ds_sum, a->row_cancel, H, B * H, T, tau, tm_dq, qm);
    CUDA_OK(cudaGetLastError());

    attn_bwd_convert_dq(dq_acc, (bf16 *)a->dq, a->dqkv_stride, B, H, T, D, tau, stream);  // the BF16 backward's
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
    float *dlt = bwd_fp8_dlt(a, B, H, T, d);
    if (d == 64) {
        if (e5) backward_fp8_d<64, true, false>(a, dlt, B, H, T, stream);
        else backward_fp8_d<64, false, false>(a, dlt, B, H, T, stream);
    } else if (bwd_fp8_tma(a, dlt, B, H, T, d)) {
        if (e5) backward_fp8_d<128, true, true>(a, dlt, B, H, T, stream);
        else backward_fp8_d<128, false, true>(a, dlt, B, H, T, stream);
    } else {
        if (e5) backward_fp8_d<128, true, false>(a, dlt, B, H, T, stream);
        else backward_fp8_d<128, false, false>(a, dlt, B, H, T, stream);
    }
}
