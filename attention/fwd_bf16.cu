// fwd_bf16.cu: fused causal flash attention forward in BF16 (docs/fp8-attention.md), on wgmma
// (sm_90a) with 128 x 128 tiles: one query block per CTA walking the key blocks upward with an
// online softmax, a producer warpgroup loading Q, K and V by TMA and two consumer warpgroups
// computing, the softmax of key block j overlapped with P_{j-1} V_{j-1} on the tensor cores.
// The FP8 forward (attention/fwd_fp8.cu) keeps this tiling and pass order. Interface:
// attention/kernels_bf16.h. Earlier forms of the same job (mma.sync; cp.async loads by every
// thread) are lab versions in dev/cuda/.
#include "attention/kernels_bf16.h"

#include <cuda.h>          // CUtensorMap and its enums (types only: no -lcuda)
#include <cuda_runtime.h>  // launches, cudaFuncSetAttribute
#include <math.h>          // INFINITY
#include <stdint.h>        // uint32_t, uint64_t
#include <string.h>        // memset
#include <type_traits>     // std::true_type, std::false_type (compile-time mask of a loop step)

#include "attention/common.cuh"  // PTX wrappers, causal orders, epilogues, check_args
#include "core/common.h"         // FATAL
#include "gpu/tensor_map.h"      // tensor_map_bthd (Q, K, V and O maps)
#include "gpu/test_hooks.h"      // gpu_test_hooks.fwd_bf16_no_o_tma

// Tiles: 128 query rows (2 warpgroups x 64), key blocks of 128.
#define WG_BQ 128
#define WG_BK 128

// --- forward -----------------------------------------------------------------------------------
// grid: one CTA per (query block, b*H + h), 384 threads: warpgroup 0 the producer, warpgroups 1
// and 2 each own 64 query rows; S = Q K^T with both operands from shared memory, O += P V with P
// from registers (BF16, straight from the S accumulators) and V N-major from shared memory. The
// accumulator layout of wgmma m64nN is, per warp of the warpgroup, that of mma.m16n8 repeated
// over N/8 tiles: d[4j + e] = (row 16*warp + g + 8*(e/2), col 8j + 2t + e%2).
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

// Per-CTA indices and shared-memory carve-up. tid: the thread's index among the 256 consumers.
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
    // first and the shortest fill the tail, and the group's K and V stay in L2
    // (causal_item_grouped).
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
// read by the tensor cores until the wait (with a conditional PV issue it may reuse them for
// softmax temporaries, and the result is wrong).
// Warpgroup 0 is the producer: one thread issues TMA bulk tensor copies of Q, then K_j and V_j
// into two stages each, and the warpgroup hands most of its registers to the others
// (setmaxnreg). The consumers meet no CTA-wide barrier in the loop: a consumer waits on a stage's
// "full" mbarrier (TMA bytes landed) before its wgmma reads the stage, and arrives on its "empty"
// mbarrier once the wgmma that read it retired; the producer waits for all 256 consumer arrivals
// before it refills the stage. Tensor maps: 4-D (c, h, t, b) views of q, k, v with boxes of 64
// columns x 128 rows in the 128-byte swizzle; rows past T are zero-filled by the copy engine.
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

        mbar_wait(full_q, 0);
        mbar_wait(full_k, 0);
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

        const int last = c.n_kb - 1;
        mbar_wait(full_v + (last & 1), (last >> 1) & 1);
        reg_fence(oacc);
        wgmma_fence();
        wg_issue_pv<D>(oacc, pa, as_bytes(c.sV + (last & 1) * KV_TILE), v_lbo, v_sbo);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(oacc);
        reg_fence(pa);
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
    }
}

// --- launchers ---------------------------------------------------------------------------------
extern "C" void attn_gpu_block_sizes(int d, int *block_q, int *block_k) {
    (void)d;
    *block_q = WG_BQ;
    *block_k = WG_BK;
}

// (B, T, H, D) BF16 with row stride `stride` as a 4-D tensor (c, h, t, b); box 64 x 1 x rows x 1.
static CUtensorMap make_tmap(const bf16 *base, int B, int H, int T, int D, int stride, int rows) {
    return tensor_map_bthd("the BF16 attention forward", base, B, H, T, D, stride, rows);
}

template <int D>
static void forward_d(const bf16 *q, const bf16 *k, const bf16 *v, int qkv_stride, bf16 *o, int o_stride,
                      float *lse, int B, int H, int T, cudaStream_t stream) {
    const size_t tiles = (size_t)(WG_BQ + 4 * WG_BK) * D * sizeof(bf16) + 1024;  // +1024: alignment
    const size_t smem = tiles + 9 * sizeof(uint64_t);                             // + the mbarriers
    const float scale_log2 = 1.4426950408889634f / sqrtf((float)D);
    const long n_cta = (long)((T + WG_BQ - 1) / WG_BQ) * B * H;
    if (n_cta > 0x7fffffffL) FATAL("attn_gpu_forward: B*H*ceil(T/%d) = %ld CTAs is too many", WG_BQ, n_cta);
    // heads per group of the CTA order: K and V of a head are 2 T D BF16 values, and at least one
    // wave of CTAs per group (one CTA per SM): on one H200 (measured 2026-11-30) the best fixed
    // group was about one wave of CTAs with K, V in 16 MiB at every T; two waves per group were
    // 5-9% slower at 4K-8K.
    const int hg = causal_heads_per_group(4L * T * D, (T + WG_BQ - 1) / WG_BQ, B * H, attn_sm_count());
    // V's descriptor offsets: next 64-column region (leading), next 8 keys (stride).
    const uint32_t v_lbo = WG_BK * 128, v_sbo = 1024;
    static bool attr_set = false;  // one device per process (one GPU per rank)
    if (!attr_set) {
        CUDA_OK(cudaFuncSetAttribute(attn_fwd_wgmma_tma_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr_set = true;
    }
    const CUtensorMap tq = make_tmap(q, B, H, T, D, qkv_stride, WG_BK), tk = make_tmap(k, B, H, T, D, qkv_stride, WG_BK),
                      tv = make_tmap(v, B, H, T, D, qkv_stride, WG_BK);
    // O by TMA where its rows are 16-byte aligned, else from the fragments (the same bits)
    const bool o_tma = !gpu_test_hooks.fwd_bf16_no_o_tma && tma_rows_aligned(o, 2L * o_stride);
    CUtensorMap to;
    memset(&to, 0, sizeof to);
    if (o_tma) to = make_tmap(o, B, H, T, D, o_stride, 64);
    attn_fwd_wgmma_tma_kernel<D><<<(unsigned)n_cta, 384, smem, stream>>>(
        tq, tk, tv, o, o_stride, lse, H, T, scale_log2, v_lbo, v_sbo, hg, to, o_tma ? 1 : 0);
    CUDA_OK(cudaGetLastError());
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
