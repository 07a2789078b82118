// fwd_bf16.cu: fused causal flash attention, forward (docs/fp8-attention.md).
// This first version is the BF16 mode; the FP8 modes reuse its tiling and pass order: one query
// block per CTA walking the key blocks upward with an online softmax. Interface: attention/kernels_bf16.h;
// shared device helpers: attention/common.cuh.
//   attn_fwd_wgmma_tma_kernel (default; wgmma m64nNk16, 128x128 tiles, sm_90a, softmax
//     overlapped with P V, tiles by TMA from a producer warpgroup), attn_fwd_wgmma_pipe_kernel
//     (the same with cp.async loads), attn_fwd_kernel (mma.sync m16n8k16, 128x64 tiles, in
//     attention/fwd_bf16_mma.cu).
//     ATTN_GPU_FWD picks one (table fwd_impls at the end).
#include "attention/kernels_bf16.h"

#include <cuda.h>          // CUtensorMap and its enums (types only: no -lcuda)
#include <cuda_runtime.h>  // launches, cudaFuncSetAttribute
#include <math.h>          // INFINITY
#include <stdint.h>        // uint32_t, uint64_t
#include <stdio.h>         // fprintf (the experimental-kernel warning)
#include <stdlib.h>        // getenv, atoi
#include <string.h>        // strcmp, memset
#include <type_traits>     // std::true_type, std::false_type (compile-time mask of a loop step)

#include "attention/common.cuh"        // PTX wrappers, tile loaders, check_args
#include "gpu/tensor_map.h"            // tensor_map_bthd (the TMA kernel's Q, K, V and O maps)
#include "core/common.h"               // FATAL
#include "attention/cta_timeline.cuh"  // TL_*: per-CTA timestamps, only with -DATTN_TIMELINE

// Tile sizes of the wgmma kernel: 128 query rows (2 warpgroups x 64), key blocks of 128.
#define WG_BQ 128
#define WG_BK 128

// --- forward -----------------------------------------------------------------------------------
// grid (ceil(T/FWD_BQ), B*H), block FWD_WARPS*32. Warp w 8 x 128 tiles: 2 warpgroups, each owns
// 64 query rows; S = Q K^T with both operands from shared memory, O += P V with P from registers
// (BF16, straight from the S accumulators) and V N-major from shared memory. The accumulator
// layout of wgmma m64nN is, per warp of the warpgroup, that of mma.m16n8 repeated over N/8 tiles:
// d[4j + e] = (row 16*warp + g + 8*(e/2), col 8j + 2t + e%2). In both wgmma kernels the softmax
// of key block j runs while the tensor cores compute O += P_{j-1} V_{j-1} (FlashAttention-3's
// intra-warpgroup overlap); they differ in how tiles arrive:
//   attn_fwd_wgmma_tma_kernel (default): a producer warpgroup issues TMA copies, mbarriers pace
//     them, the two consumer warpgroups never wait for each other;
//   attn_fwd_wgmma_pipe_kernel (ATTN_GPU_FWD=wgmma_pipe): all 256 threads issue cp.async for the
//     next tiles, one CTA-wide barrier per key block (no TMA, no driver entry point needed).
// Both compute the same thing in the same precision (max per key block, P in BF16, FP32 sums)
// and match the mma.sync kernel up to FP32 summation order.
static_assert(WG_BQ == WG_BK, "only the last (diagonal) key block of a query block is masked");

// Online-softmax step on one (64 x WG_BK) S tile held as wgmma accumulators: mask (MASKED: the
// causal mask and keys past T, needed on the diagonal block only, the last one a query block
// visits and the only one that can reach past T), running max m
// (raw score units) and row sums l (this thread's part) updated, s replaced by
// P = 2^(s*scale_log2 - m*scale_log2) in FP32, alpha = the factor by which O must be rescaled.
// Every row has a visible key in every block it visits (key k0 <= row on the diagonal block), so
// m is finite after block 0 and alpha = 0 there (O and l start at zero).
template <bool MASKED>
__device__ __forceinline__ void softmax_block(float (&s)[WG_BK / 2], float (&m)[2], float (&l)[2],
                                              float (&alpha)[2], int k0, int row_w0, int T, int g,
                                              int t4, float scale_log2) {
    if (MASKED) {
#pragma unroll
        for (int n = 0; n < WG_BK / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                int col = k0 + n * 8 + 2 * t4 + (e & 1), row = row_w0 + g + (e >> 1) * 8;
                if (col > row || col >= T) s[4 * n + e] = -INFINITY;
            }
    }
    float mx[2] = {m[0], m[1]};
#pragma unroll
    for (int n = 0; n < WG_BK / 8; n++) {
        mx[0] = fmaxf(mx[0], fmaxf(s[4 * n + 0], s[4 * n + 1]));
        mx[1] = fmaxf(mx[1], fmaxf(s[4 * n + 2], s[4 * n + 3]));
    }
    float ms[2];
    online_max_step(mx, m, ms, alpha, scale_log2);
    float rs[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < WG_BK / 8; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) s[4 * n + e] = fast_exp2(fmaf(s[4 * n + e], scale_log2, -ms[e >> 1]));
        rs[0] += s[4 * n + 0] + s[4 * n + 1];
        rs[1] += s[4 * n + 2] + s[4 * n + 3];
    }
    l[0] = l[0] * alpha[0] + rs[0];
    l[1] = l[1] * alpha[1] + rs[1];
}

// s (64 x WG_BK) = Q_wg K^T: D/16 wgmmas, both operands 128-byte-swizzled in shared memory (the
// caller fences before and commits after). sQb: this warpgroup's 64 rows of Q; cK: one K stage.
template <int D>
__device__ __forceinline__ void wg_issue_qk(float (&s)[WG_BK / 2], const unsigned char *sQb,
                                            const unsigned char *cK) {
#pragma unroll
    for (int kk = 0; kk < D / 16; kk++) {
        const int reg = kk >> 2, off = (kk & 3) * 32;  // 64-column region, 32 bytes per k16
        wgmma_m64n128_ss(s, wgmma_desc(sQb + reg * WG_BQ * 128 + off, 16, 1024),
                         wgmma_desc(cK + reg * WG_BK * 128 + off, 16, 1024), kk > 0);
    }
}

// oacc (64 x D) += P (64 x WG_BK, BF16 A fragments in registers) V (WG_BK x D, one V stage,
// N-major, descriptor offsets v_lbo/v_sbo). The caller fences before and commits after.
template <int D>
__device__ __forceinline__ void wg_issue_pv(float (&oacc)[D / 2], const uint32_t (&pa)[WG_BK / 16][4],
                                            const unsigned char *cV, uint32_t v_lbo, uint32_t v_sbo) {
#pragma unroll
    for (int kk = 0; kk < WG_BK / 16; kk++) {
        uint64_t dv = wgmma_desc(cV + kk * 16 * 128, v_lbo, v_sbo);
        if constexpr (D == 128) wgmma_m64n128_rs_nmajor(oacc, pa[kk], dv);
        else wgmma_m64n64_rs_nmajor(oacc, pa[kk], dv);
    }
}

// O *= alpha (per row: elements e = 0, 1 of each n-tile are row g, e = 2, 3 row g + 8).
template <int N>
__device__ __forceinline__ void wg_rescale(float (&oacc)[N], const float (&alpha)[2]) {
#pragma unroll
    for (int i = 0; i < N; i++) oacc[i] *= alpha[(i >> 1) & 1];
}

// Per-CTA indices and shared-memory carve-up of the wgmma kernels.
// tid: the thread's index among the 256 that compute (2 warpgroups).
struct WgFwdCta {
    bf16 *sQ, *sK, *sV;           // Q: D/64 regions of (WG_BQ x 64); K, V: 2 stages of D/64 regions
    const unsigned char *sQb;     // this warpgroup's 64 rows of Q (bytes)
    long qkv_base, obase;         // this (b, h)'s first element of q/k/v and of o
    int b, h, bh, q0, row_w0, n_kb, tid, g, t4;
};
template <int D>
__device__ __forceinline__ WgFwdCta wg_fwd_cta(unsigned char *smem_raw, int qkv_stride, int o_stride,
                                               int H, int T, int tid, int heads_per_group) {
    WgFwdCta c;
    unsigned char *smem = reinterpret_cast<unsigned char *>(((uintptr_t)smem_raw + 1023) & ~(uintptr_t)1023);
    c.sQ = reinterpret_cast<bf16 *>(smem);
    c.sK = c.sQ + WG_BQ * D;
    c.sV = c.sK + 2 * WG_BK * D;
    // 1-D grid over (query block, b*H + h), heaviest first within groups of heads: in a group,
    // every head's last query block before any head's second-to-last, so the longest jobs start
    // first and the shortest fill the tail (measured on the H200, pipe kernel: +2-4% at T = 4K-8K
    // over walking head by head), and the group's K and V stay in L2 (causal_item_grouped; with
    // heads_per_group = B*H heaviest first over all heads, as before).
    const int n_qb = (T + WG_BQ - 1) / WG_BQ, n_bh = gridDim.x / n_qb;
    const CausalItem item = causal_item_grouped(blockIdx.x, n_qb, n_bh, heads_per_group);
    const int qb = n_qb - 1 - item.rank;
    c.bh = item.bh;
    const int b = c.bh / H, h = c.bh % H;
    c.b = b;
    c.h = h;
    c.tid = tid;
    const int wg = c.tid / 128, warp = (c.tid % 128) / 32, lane = c.tid % 32;
    c.g = lane >> 2;
    c.t4 = lane & 3;
    c.qkv_base = (long)b * T * qkv_stride + (long)h * D;
    c.obase = (long)b * T * o_stride + (long)h * D;
    c.q0 = qb * WG_BQ;
    c.row_w0 = c.q0 + wg * 64 + warp * 16;  // warp's first query row
    c.n_kb = (min(c.q0 + WG_BQ, T) - 1) / WG_BK + 1;
    c.sQb = reinterpret_cast<const unsigned char *>(c.sQ) + wg * 64 * 128;
    return c;
}

// Epilogue: full row sums, O = acc / l in BF16, LSE in natural log.
template <int D>
__device__ __forceinline__ void wg_store_output(const WgFwdCta &c, const float (&oacc)[D / 2],
                                                const float (&m)[2], float (&l)[2], bf16 *o,
                                                int o_stride, float *lse, int T, float scale_log2) {
    quad_sum(l);
    const float inv_l[2] = {1.f / l[0], 1.f / l[1]};
    fwd_store_rows<D>(oacc, inv_l, o + c.obase, o_stride, lse + (long)c.bh * T, c.row_w0 + c.g, T, c.t4,
                      [&](int r) { return (m[r] * scale_log2 + log2f(l[r])) * 0.69314718056f; });
}

__device__ __forceinline__ const unsigned char *as_bytes(const bf16 *p) {
    return reinterpret_cast<const unsigned char *>(p);
}

// Key block j: S_j = Q K_j^T and O += P_{j-1} V_{j-1} are issued as two wgmma groups; the softmax
// of S_j runs once the first retires, while the tensor cores still work on the second; P_j
// overwrites the registers of P_{j-1} only after the second retires (wgmma.wait_group 0).
// Block 0 (S and softmax only) and the diagonal block (masked) are peeled out of the loop, so
// every wgmma issue and wait in it is unconditional: ptxas must see that the registers of P stay
// read by the tensor cores until the wait (seen with a conditional PV issue: it reused them for
// softmax temporaries and the result was wrong). Tiles (cp.async, two stages each): K_{j+1} and
// V_j load during block j; Q, K_0 before block 0.
template <int D>
__global__ void __launch_bounds__(256, 1)
    attn_fwd_wgmma_pipe_kernel(const bf16 *__restrict__ q, const bf16 *__restrict__ k,
                               const bf16 *__restrict__ v, int qkv_stride, bf16 *__restrict__ o,
                               int o_stride, float *__restrict__ lse, int H, int T,
                               float scale_log2, uint32_t v_lbo, uint32_t v_sbo, int heads_per_group) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    const WgFwdCta c = wg_fwd_cta<D>(smem_raw, qkv_stride, o_stride, H, T, threadIdx.x, heads_per_group);
    const bf16 *gq = q + c.qkv_base, *gk = k + c.qkv_base, *gv = v + c.qkv_base;
    constexpr int KV_TILE = WG_BK * D;
    float oacc[D / 2], s[WG_BK / 2];
#pragma unroll
    for (int i = 0; i < D / 2; i++) oacc[i] = 0.f;
#pragma unroll
    for (int i = 0; i < WG_BK / 2; i++) s[i] = 0.f;
    float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];
    uint32_t pa[WG_BK / 16][4];  // P of the previous block: A operand of the PV wgmmas

    // block 0: Q and K_0 first; K_1 and V_0 load while S_0 and its softmax run
    load_tile_sw128<WG_BQ, D, 256>(c.sQ, gq, qkv_stride, c.q0, T, c.tid);
    load_tile_sw128<WG_BK, D, 256>(c.sK, gk, qkv_stride, 0, T, c.tid);
    cp_async_commit();
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();
    if (c.n_kb > 1)
        load_tile_sw128<WG_BK, D, 256>(c.sK + KV_TILE, gk, qkv_stride, WG_BK, T, c.tid);
    load_tile_sw128<WG_BK, D, 256>(c.sV, gv, qkv_stride, 0, T, c.tid);
    cp_async_commit();
    reg_fence(s);
    wgmma_fence();
    wg_issue_qk<D>(s, c.sQb, as_bytes(c.sK));
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(s);
    if (c.n_kb == 1) softmax_block<true>(s, m, l, alpha, 0, c.row_w0, T, c.g, c.t4, scale_log2);
    else softmax_block<false>(s, m, l, alpha, 0, c.row_w0, T, c.g, c.t4, scale_log2);
    pack_bf16_afrags<WG_BK>(pa, s);  // O is zero: no rescale

    auto step = [&](int kb, auto mask) {
        cp_async_wait_all();  // K_kb and V_{kb-1} (this thread's part)
        fence_proxy_async();
        __syncthreads();  // ... everyone's part; every warpgroup retired S_{kb-1} and PV_{kb-2},
                          // so K stage (kb+1)&1 and V stage kb&1 are free
        if (kb + 1 < c.n_kb)
            load_tile_sw128<WG_BK, D, 256>(c.sK + ((kb + 1) & 1) * KV_TILE, gk, qkv_stride, (kb + 1) * WG_BK, T, c.tid);
        load_tile_sw128<WG_BK, D, 256>(c.sV + (kb & 1) * KV_TILE, gv, qkv_stride, kb * WG_BK, T, c.tid);
        cp_async_commit();
        reg_fence(s);
        reg_fence(oacc);
        wgmma_fence();
        wg_issue_qk<D>(s, c.sQb, as_bytes(c.sK + (kb & 1) * KV_TILE));
        wgmma_commit();
        wg_issue_pv<D>(oacc, pa, as_bytes(c.sV + ((kb - 1) & 1) * KV_TILE), v_lbo, v_sbo);
        wgmma_commit();
        wgmma_wait<1>();  // groups retire in order: S_kb is done, PV may still run
        reg_fence(s);
        softmax_block<decltype(mask)::value>(s, m, l, alpha, kb * WG_BK, c.row_w0, T, c.g, c.t4, scale_log2);
        wgmma_wait<0>();  // PV done: O and the registers of P_{kb-1} may change now
        reg_fence(oacc);
        reg_fence(pa);
        wg_rescale(oacc, alpha);
        pack_bf16_afrags<WG_BK>(pa, s);
    };
    for (int kb = 1; kb < c.n_kb - 1; kb++) step(kb, std::false_type());
    if (c.n_kb > 1) step(c.n_kb - 1, std::true_type());

    // the last block's O += P V
    cp_async_wait_all();
    fence_proxy_async();
    __syncthreads();
    reg_fence(oacc);
    wgmma_fence();
    wg_issue_pv<D>(oacc, pa, as_bytes(c.sV + ((c.n_kb - 1) & 1) * KV_TILE), v_lbo, v_sbo);
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(oacc);
    reg_fence(pa);
    wg_store_output<D>(c, oacc, m, l, o, o_stride, lse, T, scale_log2);
}

// Warp-specialized form of attn_fwd_wgmma_pipe_kernel (same math, same order): warpgroup 0 is
// the producer: one thread issues TMA bulk tensor copies of Q, then K_j and V_j into two stages
// each, and the warpgroup hands most of its registers to the others (setmaxnreg). Warpgroups 1
// and 2 compute as in the pipelined kernel, with no CTA-wide barrier in the loop: a consumer
// waits on a stage's "full" mbarrier (TMA bytes landed) before its wgmma reads the stage, and
// arrives on its "empty" mbarrier once the wgmma that read it retired; the producer waits for
// all 256 consumer arrivals before it refills the stage. Tensor maps: 4-D (c, h, t, b) views of
// q, k, v with boxes of 64 columns x 128 rows in the 128-byte swizzle (the layout of
// load_tile_sw128); rows past T are zero-filled by the copy engine.
// -DATTN_TIMELINE: the first consumer thread of each CTA records its start (0), K block 0 in
// (1), block 0's softmax done (2), the block loop done (3), the last PV done (4) and its end (5),
// as the FP8 forward does per tile (cta_timeline.cuh; bench/attn_timeline.py)
TL_DECLARE(bf_timeline);
TL_DEFINE_SETTER(attn_gpu_forward_timeline, bf_timeline)

template <int D>
__global__ void __launch_bounds__(384, 1)
    attn_fwd_wgmma_tma_kernel(const __grid_constant__ CUtensorMap tm_q,
                              const __grid_constant__ CUtensorMap tm_k,
                              const __grid_constant__ CUtensorMap tm_v, bf16 *__restrict__ o,
                              int o_stride, float *__restrict__ lse, int H, int T,
                              float scale_log2, uint32_t v_lbo, uint32_t v_sbo, int heads_per_group,
                              const __grid_constant__ CUtensorMap tm_o, int o_tma) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    constexpr int KV_TILE = WG_BK * D;
    constexpr uint32_t Q_BYTES = WG_BQ * D * 2, KV_BYTES = WG_BK * D * 2;
    const int ctid = (int)threadIdx.x - 128;  // index among the consumer threads (< 0: producer)
    const WgFwdCta c = wg_fwd_cta<D>(smem_raw, 0, o_stride, H, T, ctid < 0 ? 0 : ctid, heads_per_group);
    uint64_t *bars = reinterpret_cast<uint64_t *>(c.sV + 2 * KV_TILE);
    uint64_t *full_q = bars, *full_k = bars + 1, *full_v = bars + 3, *empty_k = bars + 5,
             *empty_v = bars + 7;
    if (threadIdx.x == 0) {
        mbar_init(full_q, 1);
        for (int i = 0; i < 2; i++) {
            mbar_init(full_k + i, 1);
            mbar_init(full_v + i, 1);
            mbar_init(empty_k + i, 256);
            mbar_init(empty_v + i, 256);
        }
        mbar_fence_init();
    }
    __syncthreads();

    if (threadIdx.x < 128) {  // producer
        setmaxnreg_dec<24>();
        if (threadIdx.x == 0) {
            mbar_arrive_expect_tx(full_q, Q_BYTES);
            for (int r = 0; r < D / 64; r++)
                tma_load_4d(c.sQ + r * WG_BQ * 64, &tm_q, full_q, r * 64, c.h, c.q0, c.b);
            for (int kb = 0; kb < c.n_kb; kb++) {
                const int st = kb & 1;
                const uint32_t freed = ((kb >> 1) & 1) ^ 1;  // parity of the release of use kb-2
                if (kb >= 2) mbar_wait(empty_k + st, freed);
                mbar_arrive_expect_tx(full_k + st, KV_BYTES);
                for (int r = 0; r < D / 64; r++)
                    tma_load_4d(c.sK + st * KV_TILE + r * WG_BK * 64, &tm_k, full_k + st, r * 64, c.h,
                                kb * WG_BK, c.b);
                if (kb >= 2) mbar_wait(empty_v + st, freed);
                mbar_arrive_expect_tx(full_v + st, KV_BYTES);
                for (int r = 0; r < D / 64; r++)
                    tma_load_4d(c.sV + st * KV_TILE + r * WG_BK * 64, &tm_v, full_v + st, r * 64, c.h,
                                kb * WG_BK, c.b);
            }
        }
    } else {  // consumers
        setmaxnreg_inc<240>();
        float oacc[D / 2], s[WG_BK / 2];
#pragma unroll
        for (int i = 0; i < D / 2; i++) oacc[i] = 0.f;
#pragma unroll
        for (int i = 0; i < WG_BK / 2; i++) s[i] = 0.f;
        float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];
        uint32_t pa[WG_BK / 16][4];

        TL_MARK(bf_timeline, ctid == 0, 0);
        mbar_wait(full_q, 0);
        mbar_wait(full_k, 0);
        TL_MARK(bf_timeline, ctid == 0, 1);
        reg_fence(s);
        wgmma_fence();
        wg_issue_qk<D>(s, c.sQb, as_bytes(c.sK));
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(s);
        mbar_arrive(empty_k);
        if (c.n_kb == 1) softmax_block<true>(s, m, l, alpha, 0, c.row_w0, T, c.g, c.t4, scale_log2);
        else softmax_block<false>(s, m, l, alpha, 0, c.row_w0, T, c.g, c.t4, scale_log2);
        pack_bf16_afrags<WG_BK>(pa, s);
        TL_MARK(bf_timeline, ctid == 0, 2);

        auto step = [&](int kb, auto mask) {
            mbar_wait(full_k + (kb & 1), (kb >> 1) & 1);
            mbar_wait(full_v + ((kb - 1) & 1), ((kb - 1) >> 1) & 1);
            reg_fence(s);
            reg_fence(oacc);
            wgmma_fence();
            wg_issue_qk<D>(s, c.sQb, as_bytes(c.sK + (kb & 1) * KV_TILE));
            wgmma_commit();
            wg_issue_pv<D>(oacc, pa, as_bytes(c.sV + ((kb - 1) & 1) * KV_TILE), v_lbo, v_sbo);
            wgmma_commit();
            wgmma_wait<1>();
            reg_fence(s);
            mbar_arrive(empty_k + (kb & 1));
            softmax_block<decltype(mask)::value>(s, m, l, alpha, kb * WG_BK, c.row_w0, T, c.g, c.t4, scale_log2);
            wgmma_wait<0>();
            reg_fence(oacc);
            reg_fence(pa);
            mbar_arrive(empty_v + ((kb - 1) & 1));
            wg_rescale(oacc, alpha);
            pack_bf16_afrags<WG_BK>(pa, s);
        };
        for (int kb = 1; kb < c.n_kb - 1; kb++) step(kb, std::false_type());
        if (c.n_kb > 1) step(c.n_kb - 1, std::true_type());
        TL_MARK(bf_timeline, ctid == 0, 3);

        const int last = c.n_kb - 1;
        mbar_wait(full_v + (last & 1), (last >> 1) & 1);
        reg_fence(oacc);
        wgmma_fence();
        wg_issue_pv<D>(oacc, pa, as_bytes(c.sV + (last & 1) * KV_TILE), v_lbo, v_sbo);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(oacc);
        reg_fence(pa);
        TL_MARK(bf_timeline, ctid == 0, 4);
        if (o_tma) {
            // O by TMA (store_o_tma, attention/common.cuh), staged where this warpgroup's
            // Q rows were (every S is done): the D / 64 regions of Q are 128 rows x 128 bytes in
            // the same swizzle, the warpgroup's 64 rows 8 KB into each
            // (named barriers 1, 2)
            const int wg = ctid >> 7;
            quad_sum(l);
            const float inv_l[2] = {1.f / l[0], 1.f / l[1]};
            store_o_tma<D, WG_BQ * 128, 1>(&tm_o, smem_addr(c.sQ) + wg * (64 * 128), oacc, inv_l, wg, (ctid >> 5) & 3,
                                           (ctid & 127) == 0, c.h, c.q0 + wg * 64, c.b);
            fwd_store_lse(lse + (long)c.bh * T, c.row_w0 + c.g, T, c.t4,
                          [&](int r) { return (m[r] * scale_log2 + log2f(l[r])) * 0.69314718056f; });
            if ((ctid & 127) == 0) bulk_wait_read();  // the CTA's shared memory outlives the store's reads
        } else {
            wg_store_output<D>(c, oacc, m, l, o, o_stride, lse, T, scale_log2);
        }
        TL_END(bf_timeline, ctid == 0, 5, c.n_kb);
    }
}

// --- launchers ---------------------------------------------------------------------------------
// Forward implementations, one read from ATTN_GPU_FWD per process (unset: FWD_DEFAULT). All of
// them pass test_attention_gpu (scripts/gpu_attention_check.sh runs it with each); the ones that
// are not the default stay for comparisons and as fallbacks.
enum FwdKernel { K_MMA, K_WG_PIPE, K_WG_TMA };
struct FwdImpl {
    const char *name;
    FwdKernel kernel;
};
static const FwdImpl fwd_impls[] = {
    {"wgmma_tma", K_WG_TMA},    // wgmma, softmax overlapped with PV, TMA producer warpgroup
    {"wgmma_pipe", K_WG_PIPE},  // the same with cp.async loads by every thread
    {"mma", K_MMA},             // mma.sync, 128 x 64 tiles
};
#define N_FWD_IMPLS (int)(sizeof fwd_impls / sizeof fwd_impls[0])
#define FWD_DEFAULT 0  // wgmma_tma
static const FwdImpl &fwd_impl(void) {
    static int impl = -1;
    if (impl < 0) {
        const char *e = getenv("ATTN_GPU_FWD");
        impl = FWD_DEFAULT;
        if (e && *e) {
            int found = -1;
            for (int i = 0; i < N_FWD_IMPLS; i++)
                if (strcmp(e, fwd_impls[i].name) == 0) found = i;
            if (found < 0)
                fprintf(stderr, "attention: ATTN_GPU_FWD=%s is not a forward kernel of "
                                "attention/fwd_bf16.cu; using %s\n", e, fwd_impls[FWD_DEFAULT].name);
            else
                impl = found;
        }
    }
    return fwd_impls[impl];
}

// Name of the forward kernel in use ("wgmma_pipe", ...), for benchmarks and logs. Not in
// attention/kernels_bf16.h (its API is fixed); bench/bench_attention.{cu,py} declare it themselves.
extern "C" const char *attn_gpu_forward_impl_name(void) { return fwd_impl().name; }

extern "C" void attn_gpu_block_sizes(int d, int *block_q, int *block_k) {
    (void)d;
    const bool wg = fwd_impl().kernel != K_MMA;
    *block_q = wg ? WG_BQ : FWD_BQ;
    *block_k = wg ? WG_BK : FWD_BK;
}

static int fwd_test_o_tma_form = -1;  // attn_gpu_forward_test_o_tma
extern "C" void attn_gpu_forward_test_o_tma(int on) { fwd_test_o_tma_form = on; }  // attn_form_on reads it

// (B, T, H, D) BF16 with row stride `stride` as a 4-D tensor (c, h, t, b); box 64 x 1 x rows x 1.
static CUtensorMap make_tmap(const bf16 *base, int B, int H, int T, int D, int stride, int rows) {
    return tensor_map_bthd("the TMA forward (ATTN_GPU_FWD=wgmma_pipe avoids it)", base, B, H, T, D, stride, rows);
}

template <int D>
static void forward_wgmma_d(const FwdImpl &impl, const bf16 *q, const bf16 *k, const bf16 *v,
                            int qkv_stride, bf16 *o, int o_stride, float *lse, int B, int H, int T,
                            cudaStream_t stream) {
    const size_t tiles = (size_t)(WG_BQ + 4 * WG_BK) * D * sizeof(bf16) + 1024;  // +1024: alignment
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)D);
    const long n_cta = (long)((T + WG_BQ - 1) / WG_BQ) * B * H;
    if (n_cta > 0x7fffffffL) FATAL("attn_gpu_forward: B*H*ceil(T/%d) = %ld CTAs is too many", WG_BQ, n_cta);
    // heads per group of the CTA order: K and V of a head are 2 T D BF16 values, and at least one
    // wave of CTAs per group (one CTA per SM). Measured on one H200 (docs/perf.md, the head-group
    // sweep): the best fixed group was 8-16 heads at T = 1K, 8 at 2K, 4 at 4K, 2 at 8K, i.e. about
    // one wave of CTAs with K, V in 16 MiB; two waves per group (the FP8 persistent forward's
    // rule) took 5-9% of that back at 4K-8K. ATTN_BF16_FWD_GROUP_HEADS=N overrides (0: all heads,
    // the order before head groups).
    static const int forced = attn_env_count("ATTN_BF16_FWD_GROUP_HEADS");
    const int hg = causal_group_heads(
        forced, B * H, causal_heads_per_group(4L * T * D, (T + WG_BQ - 1) / WG_BQ, B * H, attn_sm_count()));
    // V's descriptor offsets: next 64-column region (leading), next 8 keys (stride).
    const uint32_t v_lbo = WG_BK * 128, v_sbo = 1024;
    static bool attr_set[2] = {false, false};  // one device per process (one GPU per rank)
    if (impl.kernel == K_WG_TMA) {
        const size_t smem = tiles + 9 * sizeof(uint64_t);  // + the mbarriers
        if (!attr_set[0]) {
            CUDA_OK(cudaFuncSetAttribute(attn_fwd_wgmma_tma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
            attr_set[0] = true;
        }
        const CUtensorMap tq = make_tmap(q, B, H, T, D, qkv_stride, WG_BK), tk = make_tmap(k, B, H, T, D, qkv_stride, WG_BK),
                          tv = make_tmap(v, B, H, T, D, qkv_stride, WG_BK);
        // O by TMA where its rows are 16-byte aligned (ATTN_FWD_O_TMA=0: the fragments' stores)
        static const bool o_tma_env = attn_env_switch("ATTN_FWD_O_TMA");
        const bool o_tma = attn_form_on(fwd_test_o_tma_form, o_tma_env) && tma_rows_aligned(o, 2L * o_stride);
        CUtensorMap to;
        memset(&to, 0, sizeof to);
        if (o_tma) to = make_tmap(o, B, H, T, D, o_stride, 64);
        attn_fwd_wgmma_tma_kernel<D><<<(unsigned)n_cta, 384, smem, stream>>>(
            tq, tk, tv, o, o_stride, lse, H, T, scale_log2, v_lbo, v_sbo, hg, to, o_tma ? 1 : 0);
    } else {
        if (!attr_set[1]) {
            CUDA_OK(cudaFuncSetAttribute(attn_fwd_wgmma_pipe_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tiles));
            attr_set[1] = true;
        }
        attn_fwd_wgmma_pipe_kernel<D><<<(unsigned)n_cta, 256, tiles, stream>>>(
            q, k, v, qkv_stride, o, o_stride, lse, H, T, scale_log2, v_lbo, v_sbo, hg);
    }
    CUDA_OK(cudaGetLastError());
}

template <int D>
static void forward_d(const bf16 *q, const bf16 *k, const bf16 *v, int qkv_stride, bf16 *o,
                      int o_stride, float *lse, int B, int H, int T, cudaStream_t stream) {
    const FwdImpl &impl = fwd_impl();
    if (impl.kernel != K_MMA) {
        forward_wgmma_d<D>(impl, q, k, v, qkv_stride, o, o_stride, lse, B, H, T, stream);
        return;
    }
    attn_fwd_mma_launch(D, q, k, v, qkv_stride, o, o_stride, lse, B, H, T, stream);
}

extern "C" void attn_gpu_forward(const uint16_t *q, const uint16_t *k, const uint16_t *v,
                                 int qkv_stride, uint16_t *o, int o_stride, float *lse, int B,
                                 int H, int T, int d, cudaStream_t stream) {
    const void *ptrs[] = {q, k, v, o};
    const int strides[] = {qkv_stride, o_stride};
    check_args("attn_gpu_forward", ptrs, 4, strides, 2, B, H, T, d);
    if (d == 64)
        forward_d<64>((const bf16 *)q, (const bf16 *)k, (const bf16 *)v, qkv_stride, (bf16 *)o,
                      o_stride, lse, B, H, T, stream);
    else
        forward_d<128>((const bf16 *)q, (const bf16 *)k, (const bf16 *)v, qkv_stride, (bf16 *)o,
                       o_stride, lse, B, H, T, stream);
}
