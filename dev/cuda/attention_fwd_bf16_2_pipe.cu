// attention_fwd_bf16_2_pipe.cu: lab version 2 of the fused causal BF16 attention forward: wgmma
// (m64nNk16) with 128 x 128 tiles, S = Q K^T from shared memory, P from registers into O += P V,
// and the softmax of key block j overlapped with P_{j-1} V_{j-1} on the tensor cores
// (FlashAttention-3's intra-warpgroup overlap). All 256 threads load the next K and V tiles with
// cp.async and meet at one CTA-wide barrier per key block. Version 3, the library's
// (attention/fwd_bf16.cu), is the same math in the same order with the loads moved to a TMA
// producer warpgroup and mbarriers in place of the barrier, so O and LSE must agree bit for bit;
// version 1 (attention_fwd_bf16_1_mma.cu) is the mma.sync form. The program checks that and
// times both. The step helpers below are copies of the library's (attention/fwd_bf16.cu).
//
//   make -C dev/cuda && build/dev/attention_fwd_bf16_2_pipe [d=128] [T ...]
#include <cuda_runtime.h>  // launches, cudaFuncSetAttribute
#include <math.h>          // INFINITY, sqrtf
#include <stdint.h>        // uint16_t, uint32_t
#include <type_traits>     // std::true_type, std::false_type (compile-time mask of a loop step)

#include "attention/common.cuh"       // PTX wrappers, causal orders, online_max_step, fwd_store_rows
#include "attention/kernels_bf16.h"   // attn_gpu_forward: the library's version
#include "dev/cuda/attention_lab.cuh"  // LabShapes, lab_diff_*, lab_report, timing

#define WG_BQ 128  // query rows per CTA: 2 warpgroups x 64
#define WG_BK 128  // keys per block

// Copies rows [row0, row0+ROWS) of a (T, stride) BF16 matrix (D columns) into D/64 swizzled
// regions of ROWS x 128 bytes; rows >= T become zeros.
template <int ROWS, int D, int NTHREADS>
__device__ __forceinline__ void load_tile_sw128(bf16 *s, const bf16 *g, long stride, int row0, int T,
                                                int tid) {
    constexpr int CHUNKS = D / 8;
    static_assert(ROWS * CHUNKS % NTHREADS == 0, "tile copy must split evenly over the threads");
    unsigned char *sb = reinterpret_cast<unsigned char *>(s);
#pragma unroll
    for (int i = 0; i < ROWS * CHUNKS / NTHREADS; i++) {
        int c = tid + i * NTHREADS;
        int r = c / CHUNKS, ch = c % CHUNKS;
        int t = row0 + r;
        bool ok = t < T;
        unsigned char *dst = sb + (ch >> 3) * (ROWS * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4);
        cp_async16(dst, g + (long)(ok ? t : 0) * stride + ch * 8, ok);
    }
}

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

template <int D>
static void forward_pipe(const bf16 *q, const bf16 *k, const bf16 *v, int qkv_stride, bf16 *o, int o_stride,
                         float *lse, int B, int H, int T) {
    const size_t tiles = (size_t)(WG_BQ + 4 * WG_BK) * D * sizeof(bf16) + 1024;  // +1024: alignment
    CU(cudaFuncSetAttribute(attn_fwd_wgmma_pipe_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)tiles));
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)D);
    const int n_qb = (T + WG_BQ - 1) / WG_BQ;
    // the library forward's CTA order: heads grouped so that about one wave of CTAs shares K, V in L2
    const int hg = causal_heads_per_group(4L * T * D, n_qb, B * H, attn_sm_count());
    attn_fwd_wgmma_pipe_kernel<D><<<(unsigned)((long)n_qb * B * H), 256, tiles>>>(
        q, k, v, qkv_stride, o, o_stride, lse, H, T, scale_log2, WG_BK * 128, 1024, hg);
    CU(cudaGetLastError());
}

int main(int argc, char **argv) {
    return lab_forward_main(argc, argv, "library (TMA producer)", "lab 2 (cp.async, barrier)", true, 0,
                            [](int d, const uint16_t *q, const uint16_t *k, const uint16_t *v, int ld, uint16_t *o,
                               int ldo, float *lse, int B, int H, int T) {
                                const bf16 *bq = (const bf16 *)q, *bk = (const bf16 *)k, *bv = (const bf16 *)v;
                                if (d == 64) forward_pipe<64>(bq, bk, bv, ld, (bf16 *)o, ldo, lse, B, H, T);
                                else forward_pipe<128>(bq, bk, bv, ld, (bf16 *)o, ldo, lse, B, H, T);
                            });
}
