// delta_fp8.cu: fp8_dm's delta pass (docs/fp8-attention.md §3, "Computing the matched
// D"): for every query row i, D_i = sum_j P_ij dP_ij / sum_j P_ij over its keys j <= i, with P and
// dP bit for bit the values the main FP8 backward (attention/bwd_fp8.cu) forms its dS from, so
// that every row of dS = P (dP - D) sums to 0 up to FP32 rounding.
//
// Same values, other tiles. The main kernel computes S^T = K̂ Q̂^T and dP^T = V̂ dÔ^T in 64-key x
// 64-query wgmma tiles (keys are its M, since a CTA owns a key block). Here a warpgroup owns 64
// queries and takes a whole 128-key block per wgmma: S = Q̂ K̂^T and dP = dÔ V̂^T (m64n128, the
// queries as M), the forward's layout, with Q̂ and dÔ as A fragments in registers (loaded once
// per tile; the wgmmas read only K̂ and V̂ from shared memory). Each element is still the same sum
// of the same exact FP8 products in the same k32 steps over d (an FP8 x FP8 product is exact in
// FP32; a step adds its 32 products to the accumulator), and P comes from it through pdp_p with
// the same scale constants (pdp_s_scale, -LSE log2(e) rounded once), so P and dP get the same
// bits; test_attention_delta_fp8_gpu checks that on the GPU for both tile forms, both gradient
// formats and both head dims, masked tiles included (attention/bwd_fp8_tile.cuh has both forms).
// Rows as M give each thread whole rows: its two rows' LSE sit in two registers and its sums in
// a few (the key-major form loaded 16 LSE values from shared memory per tile and kept 32 column
// sums).
//
// Structure (the FP8 forward's, attention/fwd_fp8.cu): persistent CTAs (one per SM) of three
// warpgroups take (128-query block, b, h) tiles heaviest first from the stream's tile counter
// (persistent_next_tile). Warpgroup 0 is the producer: it copies each tile's Q̂ and dÔ blocks
// and LSE (two buffers: the next tile's load while the current one computes; the consumers
// release a buffer as soon as they hold its contents in registers) and each key block's K̂ and
// V̂ rows with their scales into a ring of DL_STAGES stages, paced by mbarriers (at d 128 the K̂,
// V̂ tiles by TMA from one thread, each block published as soon as it lands), and zeroes the
// tile's rows of the FP32 dQ accumulator (bulk copies from a zeroed region of shared memory) and
// of the row diagnostics (the pre kernel's job, which fp8_dm does not launch). Warpgroups 1 and 2
// take 64 queries each; per key block j:
//   S_j, dP_j issued as two wgmma groups; P = pdp_p(S) once S_j is done (dP_j still on the
//   tensor cores); then sum P dP and sum P into 4 partial sums per row (short FMA chains).
// dP stays in code-product units: the sums are in units of the current block's
// 1 / (s_do s_v), rescaled at each block by the ratio of its V scale to the previous one's (a
// power of two, mostly 1: exact, scaling by 2^k commutes with rounding), and by the last block's
// factor at the end, which gives the bits of sums over scaled dP values. Only the diagonal
// block (the last) is masked (keys above the row: P = dP = 0, as in the main kernel); rows past
// T compute finite values (padding codes are 0) that are not written.
#include "attention/kernels_fp8.h"

#include <cuda_runtime.h>  // launches, cudaFuncSetAttribute
#include <stdint.h>        // uint8_t, uint32_t, uint64_t
#include <type_traits>     // std::true_type, std::false_type (the diagonal block's instantiation)

#include "attention/bwd_fp8_tile.cuh"  // b8_load, delta_a_frags, delta_issue, delta_p, delta_mask, pdp_*
#include "attention/common.cuh"        // mbarriers, setmaxnreg, persistent_next_tile, quad_sum, pow2_recip
#include "core/common.h"               // FATAL
#include "gpu/tensor_map.h"            // tensor_map_2d: K̂, V̂ by TMA (d 128)
#include "gpu/test_hooks.h"            // gpu_test_hooks.delta_fp8_no_tma

#include <string.h>  // memset

#define DL_BQ 128     // queries per tile: one scale block (2 consumer warpgroups x 64)
#define DL_BK 128     // keys per block: one scale block
#define DL_STAGES 4   // K̂ / V̂ ring depth (>= 3, as the forward's: see its producer)
#define DL_THREADS 384
static_assert(DL_BQ == ATTN_SCALE_BLOCK && DL_BK == ATTN_SCALE_BLOCK, "tiles are scale blocks");

// Shared memory: 2 x (Q̂, dÔ) (128 rows x 128 B each: this tile's and the next one's), DL_STAGES x
// (K̂, V̂) (128 keys x 128 B each), 2 x the tile's 128 LSEs, 16 KB of zeros (the source of the
// bulk copies that zero the dQ accumulator), then the ring's mbarriers and posted tile numbers
// (PersistentRing), the Q and dO scales of each buffer and the K and V scales of each stage. Rows
// of D bytes use the first D of each 128-byte row (the forward's convention).
struct DlSmem {
    static constexpr int T128 = 128 * 128;  // one 128-row tile
    static constexpr int OFF_Q = 0, OFF_DO = 2 * T128, OFF_K = 4 * T128, OFF_V = OFF_K + DL_STAGES * T128;
    static constexpr int LSE = OFF_V + DL_STAGES * T128;  // 2 x 128 floats: the LSE of each buffer's rows
    static constexpr int ZERO = LSE + 2 * DL_BQ * (int)sizeof(float);  // 16 KB of zeros: the dQ rows' source
    static constexpr int ZERO_BYTES = 16384;
    static constexpr int BARS = ZERO + ZERO_BYTES;
    static constexpr size_t BYTES =
        (size_t)BARS + PersistentRing<DL_STAGES>::BYTES + (4 + 2 * DL_STAGES) * sizeof(int) + 1024;
};

// grid G <= tiles, block 384; each CTA computes tiles until the counter runs out.
// KV_TMA (d 128): each key block's K̂ and V̂ tiles come by two TMA loads that one producer thread
// issues, not 16 cp.async per producer thread (the tiles' 128-byte rows and sw128 swizzle are
// TMA's 128-byte swizzle), and the ring's blocks are published by asynchronous arrivals
// (PersistentRing::fill<true>).
template <int D, bool E5, bool KV_TMA>
__global__ void __launch_bounds__(DL_THREADS, 1)
    attn_fp8_delta_kernel(const uint8_t *__restrict__ qc, const uint8_t *__restrict__ kc,
                          const uint8_t *__restrict__ vc, const uint8_t *__restrict__ doc,
                          const float *__restrict__ q_scales, const float *__restrict__ k_scales,
                          const float *__restrict__ v_scales, const float *__restrict__ do_scales,
                          const float *__restrict__ lse, float *__restrict__ dlt, float *__restrict__ dq_acc,
                          float *__restrict__ row_ds_sum, float *__restrict__ row_cancel, int n_bh, int T,
                          float tau, unsigned *__restrict__ tile_counter, int heads_per_group,
                          const __grid_constant__ CUtensorMap tm_k, const __grid_constant__ CUtensorMap tm_v) {
    static_assert(!KV_TMA || D == 128, "TMA tiles of 128-byte rows: d 128");
    using L = DlSmem;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint8_t *smem = smem_align1024(smem_raw);
    const PersistentRing<DL_STAGES> ring(smem + L::BARS);
    float *sQs = reinterpret_cast<float *>(ring.end()), *sDOs = sQs + 2;  // Q, dO scale of buffer i
    float *sKs = sDOs + 2, *sVs = sKs + DL_STAGES;                          // K, V scale of stage st
    float *sLse = reinterpret_cast<float *>(smem + L::LSE);                 // (2, 128) LSE of buffer i's rows

    const int nblk = (T + DL_BK - 1) / DL_BK, Tp = nblk * DL_BK;
    const int n_tiles = nblk * n_bh;

    if (threadIdx.x == 0) ring.init();
    for (int i = threadIdx.x; i < L::ZERO_BYTES / 16; i += DL_THREADS)
        reinterpret_cast<uint4 *>(smem + L::ZERO)[i] = make_uint4(0u, 0u, 0u, 0u);
    fence_proxy_async();  // the zeros (generic proxy) -> the bulk copies' reads (async proxy)
    __syncthreads();      // from here on the warpgroups meet on mbarriers only

    if (threadIdx.x < 128) {
        // ---- producer: the ring of attention/common.cuh (PersistentRing), as the forward's; a
        // tile's Q̂, dÔ, scales and LSE copies land with its first key block (its cp.async group,
        // or with KV_TMA its asynchronous arrivals). The consumers release a tile buffer
        // (release_tile) as soon as they hold its contents in registers.
        setmaxnreg_dec<56>();
        const int ptid = threadIdx.x;
        unsigned it = 0;
        for (int ti = 0;; ti++) {
            const int qs = ti & 1;
            const int tile = ring.post_tile(ti, tile_counter, n_tiles, ptid);
            if (tile >= n_tiles) break;
            const CausalTile ct = causal_tile(tile, nblk, n_bh, heads_per_group);
            const int qb = ct.qb, bh = ct.bh, n_kb = qb + 1, q0 = qb * DL_BQ;
            b8_load<DL_BQ, D / 16, 128>(smem + L::OFF_Q + qs * L::T128, qc + ((long)bh * Tp + q0) * D, D, ptid);
            b8_load<DL_BQ, D / 16, 128>(smem + L::OFF_DO + qs * L::T128, doc + ((long)bh * Tp + q0) * D, D, ptid);
            if (ptid == 0) {
                cp_async4(sQs + qs, q_scales + (long)bh * nblk + qb, true);
                cp_async4(sDOs + qs, do_scales + (long)bh * nblk + qb, true);
            }
            // the rows' LSE (rows past T: 0, zero-filled; they are not written)
            cp_async4(sLse + qs * DL_BQ + ptid, lse + (long)bh * T + min(q0 + ptid, T - 1), q0 + ptid < T);
            {  // zero the tile's rows of the dQ accumulator (bulk copies of the zero region, issued by
               // one thread: the copy engine writes them, not 32 stores per producer thread) and of
               // the row diagnostics
                const int rows = min(T - q0, DL_BQ);
                if (ptid == 0) {
                    unsigned char *z = reinterpret_cast<unsigned char *>(dq_acc + ((long)bh * T + q0) * D);
                    const uint32_t bytes = (uint32_t)rows * D * 4;  // a multiple of 16
                    for (uint32_t off = 0; off < bytes; off += L::ZERO_BYTES)
                        bulk_store(z + off, smem_addr(smem + L::ZERO), min(bytes - off, (uint32_t)L::ZERO_BYTES));
                    bulk_commit();
                }
                if (row_ds_sum && ptid < rows) {
                    row_ds_sum[(long)bh * T + q0 + ptid] = 0.f;
                    row_cancel[(long)bh * T + q0 + ptid] = 0.f;
                }
            }
            if constexpr (KV_TMA) {
                ring.fill<true>(it, n_kb, [&](int kb, unsigned st) {
                    if (ptid == 0) {
                        mbar_expect_tx(ring.full + st, 2 * DL_BK * D);
                        tma_load_2d(smem + L::OFF_K + st * L::T128, &tm_k, ring.full + st, 0, bh * Tp + kb * DL_BK);
                        tma_load_2d(smem + L::OFF_V + st * L::T128, &tm_v, ring.full + st, 0, bh * Tp + kb * DL_BK);
                    } else if (ptid == 32) {  // another warp: the scales' cp.async
                        cp_async4(sKs + st, k_scales + (long)bh * nblk + kb, true);
                        cp_async4(sVs + st, v_scales + (long)bh * nblk + kb, true);
                    }
                });
            } else {
                const uint8_t *gk = kc + (long)bh * Tp * D, *gv = vc + (long)bh * Tp * D;
                ring.fill(it, n_kb, [&](int kb, unsigned st) {
                    b8_load<DL_BK, D / 16, 128>(smem + L::OFF_K + st * L::T128, gk + (long)kb * DL_BK * D, D, ptid);
                    b8_load<DL_BK, D / 16, 128>(smem + L::OFF_V + st * L::T128, gv + (long)kb * DL_BK * D, D, ptid);
                    if (ptid == 0) {
                        cp_async4(sKs + st, k_scales + (long)bh * nblk + kb, true);
                        cp_async4(sVs + st, v_scales + (long)bh * nblk + kb, true);
                    }
                });
            }
        }
        ring.drain<KV_TMA>(it);
        // the zero region must outlive the bulk copies' reads; their writes complete with the grid,
        // before the main backward reduces into the accumulator (as the main backward's own dQ)
        if (ptid == 0) bulk_wait_read();
    } else {
        // ---- consumers: warpgroup wg (0, 1) owns queries q0 + 64 wg .. + 63 of each tile; this
        // thread rows row0 and row0 + 8 (accumulator element 4n + e: row + 8 (e >> 1), key
        // 8n + 2 t4 + (e & 1) of the block).
        setmaxnreg_inc<224>();
        constexpr float LOG2E = 1.4426950408889634f;
        const int ctid = (int)threadIdx.x - 128, wg = ctid >> 7, warp = (ctid >> 5) & 3, lane = ctid & 31;
        const int g = lane >> 2, t4 = lane & 3;
        // descriptor low words (kmajor_desc_lo) of stage 0 of the K̂ and V̂ rings (stage st: + st * T128 / 16)
        const uint32_t dk0 = kmajor_desc_lo(smem_addr(smem + L::OFF_K)), dv0 = kmajor_desc_lo(smem_addr(smem + L::OFF_V));
        unsigned it0 = 0;  // key blocks of the earlier tiles: this tile's block j is ring block it0 + j
        for (int ti = 0;; ti++) {
            const int tile = ring.tile(ti);
            if (tile >= n_tiles) break;
            const CausalTile ct = causal_tile(tile, nblk, n_bh, heads_per_group);
            const int qb = ct.qb, bh = ct.bh, n_kb = qb + 1;
            const int row0 = qb * DL_BQ + wg * 64 + warp * 16 + g;  // this thread's rows: row0, row0 + 8
            // The tile's Q̂, dÔ rows, scales and LSE came with key block 0's copies: after its full
            // wait, Q̂ and dÔ become this warpgroup's A fragments (the same for every key block),
            // the LSE -LOG2E rounded once as the main kernel rounds it
            float nl[2], inv_q, inv_do;
            uint32_t aq[D / 32][4], ado[D / 32][4];
            {
                ring.wait_full(it0);
                const int qs = ti & 1, lr = wg * 64 + warp * 16 + g;  // lr: row0 within the tile
                delta_a_frags<D / 32>(aq, smem + L::OFF_Q + qs * L::T128 + wg * 64 * 128);
                delta_a_frags<D / 32>(ado, smem + L::OFF_DO + qs * L::T128 + wg * 64 * 128);
                inv_q = pow2_recip(sQs[qs]);
                inv_do = pow2_recip(sDOs[qs]);
                nl[0] = __fmul_rn(sLse[qs * DL_BQ + lr], -LOG2E);
                nl[1] = __fmul_rn(sLse[qs * DL_BQ + lr + 8], -LOG2E);
            }
            ring.release_tile(ti);  // this tile's Q̂, dÔ buffer is read: the producer may refill it
            float pd[2][4], ps[2][4];  // per row, 4 partial sums of P dP (in dP units of block s_v_u) and P
#pragma unroll
            for (int r = 0; r < 2; r++)
#pragma unroll
                for (int k = 0; k < 4; k++) pd[r][k] = ps[r][k] = 0.f;
            float s[DL_BK / 2], dp[DL_BK / 2];  // S -> P, and dP (raw code products) of the block
#pragma unroll
            for (int i = 0; i < DL_BK / 2; i++) s[i] = dp[i] = 0.f;
            float s_v_u = 1.f;

            auto step = [&](int j, auto mask) {
                const unsigned rb = it0 + (unsigned)j, st = rb % DL_STAGES;
                ring.wait_full(rb);
                const float cs = pdp_s_scale(inv_q, pow2_recip(sKs[st]), tau), s_v = sVs[st];
                delta_issue<D, E5>(s, dp, aq, ado, dk0 + st * (L::T128 / 16), dv0 + st * (L::T128 / 16));
                {  // the sums into this block's dP units (exact: a power of two, 1 mostly; no branch)
                    const float ratio = __fmul_rn(s_v, pow2_recip(s_v_u));
#pragma unroll
                    for (int r = 0; r < 2; r++)
#pragma unroll
                        for (int k = 0; k < 4; k++) pd[r][k] = __fmul_rn(pd[r][k], ratio);
                }
                s_v_u = s_v;
                delta_p(s, dp, cs, nl);
                ring.release(rb);  // K̂_j and V̂_j are no longer read
                if constexpr (decltype(mask)::value) delta_mask(s, dp, j * DL_BK + 2 * t4 - row0);  // the diagonal block
#pragma unroll
                for (int i = 0; i < DL_BK / 2; i++) {
                    const int r = (i >> 1) & 1, k = (i >> 2) & 3;
                    pd[r][k] = fmaf(s[i], dp[i], pd[r][k]);
                    ps[r][k] += s[i];
                }
            };
            for (int j = 0; j < n_kb - 1; j++) step(j, std::false_type());
            step(n_kb - 1, std::true_type());
            it0 += (unsigned)n_kb;

            // D = sum P dP / sum P over the quad's 4 threads; the sums back to dP units (exact)
            const float cdp_u = pdp_dp_scale(inv_do, pow2_recip(s_v_u));
            float a[2], b[2];
#pragma unroll
            for (int r = 0; r < 2; r++) {
                a[r] = __fmul_rn((pd[r][0] + pd[r][1]) + (pd[r][2] + pd[r][3]), cdp_u);
                b[r] = (ps[r][0] + ps[r][1]) + (ps[r][2] + ps[r][3]);
            }
            quad_sum(a);
            quad_sum(b);
            if (t4 == 0)
#pragma unroll
                for (int r = 0; r < 2; r++)
                    if (row0 + 8 * r < T) dlt[(long)bh * T + row0 + 8 * r] = a[r] / b[r];
        }
    }
}

// The delta pass's heads per group: as the FP8 forward's, two waves of CTAs whose heads' K̂ and V̂
// (2 Tp d bytes per head) fit in L2. On one H200 (measured 2026-11-30): heaviest first over all
// heads is 9-19% slower at T = 1K-2K, groups of 4 heads the same.
static int delta_heads_per_group(int n_bh, int nblk, int d) {
    return causal_heads_per_group(2L * nblk * DL_BK * d, nblk, n_bh, 2 * attn_sm_count());
}

// The delta pass's K̂ and V̂ by TMA at d 128 (else the cp.async producer, as at d 64) where the
// code rows fit a TMA copy's int coordinates (b8_code_rows_fit_tma, as the main backward).
static bool delta_kv_tma(int B, int H, int T, int d) {
    return d == 128 && !gpu_test_hooks.delta_fp8_no_tma && b8_code_rows_fit_tma(B, H, T);
}

template <int D, bool E5, bool KV_TMA>
static void delta_launch(const AttnFp8BwdArgs *a, float *dlt, float *dq_acc, int B, int H, int T, cudaStream_t stream) {
    const size_t smem = DlSmem::BYTES;
    static bool attr_set = false;  // one device per process (one GPU per rank)
    if (!attr_set) {
        CUDA_OK(cudaFuncSetAttribute(attn_fp8_delta_kernel<D, E5, KV_TMA>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     (int)smem));
        attr_set = true;
    }
    const int nblk = attn_quant_n_blocks(T);
    const long n_tiles = (long)nblk * B * H;
    if (n_tiles > 0x3fffffffL) FATAL("attn_gpu_backward_fp8: B*H*ceil(T/128) = %ld delta tiles is too many", n_tiles);
    const long grid = n_tiles < attn_sm_count() ? n_tiles : attn_sm_count();
    // K̂, V̂ codes (B*H*Tp rows of D bytes) as 2-D maps; box 128 x 128 rows, 128-byte swizzle (sw128)
    CUtensorMap tm_k, tm_v;
    memset(&tm_k, 0, sizeof tm_k);
    memset(&tm_v, 0, sizeof tm_v);
    if constexpr (KV_TMA) {
        const uint64_t rows = (uint64_t)B * H * nblk * DL_BK;
        tm_k = tensor_map_2d("the delta pass's K codes", CU_TENSOR_MAP_DATA_TYPE_UINT8, a->k_codes, D, rows, D, D, DL_BK,
                             CU_TENSOR_MAP_SWIZZLE_128B);
        tm_v = tensor_map_2d("the delta pass's V codes", CU_TENSOR_MAP_DATA_TYPE_UINT8, a->v_codes, D, rows, D, D, DL_BK,
                             CU_TENSOR_MAP_SWIZZLE_128B);
    }
    attn_fp8_delta_kernel<D, E5, KV_TMA><<<(unsigned)grid, DL_THREADS, smem, stream>>>(
        a->q_codes, a->k_codes, a->v_codes, a->do_codes, a->q_scales, a->k_scales, a->v_scales, a->do_scales, a->lse,
        dlt, dq_acc, a->row_ds_sum, a->row_cancel, B * H, T, 1.0f / sqrtf((float)D), attn_fp8_tile_counter(stream),
        delta_heads_per_group(B * H, nblk, D), tm_k, tm_v);
    CUDA_OK(cudaGetLastError());
}

extern "C" void attn_fp8_delta_pass(const AttnFp8BwdArgs *a, float *dlt, float *dq_acc, int B, int H, int T, int d,
                                    cudaStream_t stream) {
    const bool e5 = a->grad_format == FP8_E5M2;
    if (d == 64) {
        if (e5) delta_launch<64, true, false>(a, dlt, dq_acc, B, H, T, stream);
        else delta_launch<64, false, false>(a, dlt, dq_acc, B, H, T, stream);
    } else if (delta_kv_tma(B, H, T, d)) {
        if (e5) delta_launch<128, true, true>(a, dlt, dq_acc, B, H, T, stream);
        else delta_launch<128, false, true>(a, dlt, dq_acc, B, H, T, stream);
    } else {
        if (e5) delta_launch<128, true, false>(a, dlt, dq_acc, B, H, T, stream);
        else delta_launch<128, false, false>(a, dlt, dq_acc, B, H, T, stream);
    }
}
