// attention_fwd_fp8_1_pingpong.cu: lab version 1 of the FP8 attention forward: the library's
// kernel (attention/fwd_fp8.cu, version 2: the same persistent CTAs, producer ring, per-block step
// and epilogue) with FlashAttention-3's ping-pong between the two consumer warpgroups: each issues
// its wgmmas only in its turn (named barriers 1 and 2), so that one warpgroup's softmax, bound by
// the special-function unit (16 ex2 per clock per SM), overlaps the other one's matmuls. The same
// arithmetic in the same order, so O and LSE must equal the library's bit for bit; the program
// checks that on quantized random inputs and times both.
//
//   make -C dev/cuda && build/dev/attention_fwd_fp8_1_pingpong [d=128] [T ...]
#include <cuda_runtime.h>  // launches, cudaFuncSetAttribute
#include <math.h>          // INFINITY, logf, log2f
#include <stdint.h>        // uint8_t, uint16_t, uint32_t
#include <string.h>        // memset
#include <type_traits>     // std::true_type, std::false_type (compile-time mask of a loop step)

#include "attention/fwd_fp8_step.cuh"  // the library's per-block step: issue_s, issue_pv, softmax_block, pack_p, ...
#include "attention/common.cuh"        // PTX wrappers, PersistentRing, causal_tile, store_o_tma
#include "attention/kernels_fp8.h"     // attn_gpu_quantize, attn_gpu_forward_fp8, attn_fp8_tile_counter
#include "core/precision.h"            // attn_scale_max_exp
#include "dev/cuda/attention_lab.cuh"  // LabShapes, lab_diff_*, lab_report, timing
#include "gpu/tensor_map.h"            // tensor_map_bthd (O's map for the TMA store)

#define F8_BQ 128     // query rows per CTA (2 consumer warpgroups x 64)
#define F8_STAGES 4   // K̂ / V̂^T ring depth (>= 3: see the producer)
#define F8_THREADS 384

// The producer's copies and the shared-memory layout, as the library's kernel has them.
// Producer copies (128 threads). Every source byte exists: the quantized layouts are padded to
// whole blocks with code 0. Thread p copies chunk p % CH of rows p / CH + RSTEP i (RSTEP = 128 /
// CH, a multiple of 16): the swizzle (r % 8) and the key permutation (within 16-row groups) are
// the same for all its rows, so every copy is base + i * constant and the producer fits in the
// few registers it keeps (setmaxnreg_dec<24>).
template <int D, bool PERMUTE>  // 128 rows of D bytes: Q̂ (as is) or K̂ (rows permuted by key_of_row)
__device__ __forceinline__ void load_rows_tile(uint8_t *s, const uint8_t *g, int ptid) {
    constexpr int CH = D / 16, RSTEP = 128 / CH;
    const int r0 = ptid / CH, ch = ptid % CH;
    uint8_t *dst = s + sw128(r0, ch * 16);
    const uint8_t *src = g + (PERMUTE ? key_of_row(r0) : r0) * D + ch * 16;
#pragma unroll
    for (int i = 0; i < 128 / RSTEP; i++) cp_async16(dst + i * RSTEP * 128, src + i * RSTEP * D, true);
}
template <int D>  // V̂^T block: D rows of 128 keys (row pitch Tp in global memory)
__device__ __forceinline__ void load_vt_tile(uint8_t *s, const uint8_t *g, int Tp, int ptid) {
    const int r0 = ptid / 8, ch = ptid % 8;
    uint8_t *dst = s + sw128(r0, ch * 16);
    const uint8_t *src = g + (long)r0 * Tp + ch * 16;
#pragma unroll
    for (int i = 0; i < D / 16; i++) cp_async16(dst + i * 16 * 128, src + (long)i * 16 * Tp, true);
}

// Shared memory: 2 x Q̂ (128 x 128 B: the tile being computed and the next one, loading),
// STAGES x K̂ (128 x 128 B), STAGES x V̂^T ((D + F8_VONES) x 128 B), 2 x O (each warpgroup's 64 rows of
// BF16 O on their way out, stage_o_sw128), then the ring's mbarriers and posted
// tile numbers (PersistentRing) and each stage's K and V scale (copied with the stage's tiles, so
// the consumers hold no pointers to the scale arrays); regions 1024-byte aligned (the swizzle's
// period).
template <int D, int STAGES>
struct F8Smem {
    // a V̂^T stage: D rows of codes, then F8_VONES rows of E4M3 ones (the row sums' columns of PV)
    static constexpr int Q = F8_BQ * 128, K = F8_BK * 128, V = (D + F8_VONES) * 128;
    static constexpr int O = 64 * D * 2;  // a warpgroup's O rows in BF16, staged for the TMA store (stage_o_sw128)
    static constexpr int BARS = 2 * Q + STAGES * (K + V) + 2 * O;
    static constexpr size_t BYTES =
        (size_t)BARS + PersistentRing<STAGES, true>::BYTES + (2 * STAGES + 2) * sizeof(int) + 1024;
};
static_assert(F8Smem<128, F8_STAGES>::BYTES <= 227 * 1024, "the ring fits Hopper's 227 KB of shared memory per block");


// Named barriers 1 and 2, 256 threads each: the consumers' turns (3 is the producer's own).
__device__ __forceinline__ void pp_sync(int wg) {  // wait for warpgroup wg's turn
    if (wg == 0) named_bar_sync<1, 256>();
    else named_bar_sync<2, 256>();
}
__device__ __forceinline__ void pp_pass(int wg) {  // warpgroup wg hands the turn to the other one
    if (wg == 0) named_bar_arrive<2, 256>();
    else named_bar_arrive<1, 256>();
}

// grid G <= n_qb * B * H CTAs, block 384 (producer + 2 consumer warpgroups); each CTA computes
// tiles until the counter runs out (persistent_next_tile), one after the other (persistent when G =
// the number of SMs: the producer loads the next tile's Q̂ and first key blocks while the
// consumers finish the current one, and no CTA launches in between).
template <int D>
__global__ void __launch_bounds__(F8_THREADS, 1)
    attn_fwd_fp8_pingpong_kernel(const uint8_t *__restrict__ qc, const uint8_t *__restrict__ kc,
                        const uint8_t *__restrict__ vtc, const float *__restrict__ q_scales,
                        const float *__restrict__ k_scales, const float *__restrict__ v_scales,
                        float inv_p, float log2_ps, bf16 *__restrict__ o, int o_stride,
                        float *__restrict__ lse, int H, int n_bh, int T, float tau,
                        unsigned *__restrict__ tile_counter, int heads_per_group,
                        const __grid_constant__ CUtensorMap tm_o, int o_tma) {
    constexpr int ST = F8_STAGES;  // ring stages
    using L = F8Smem<D, ST>;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint8_t *smem = smem_align1024(smem_raw);
    uint8_t *sQ = smem, *sK = smem + 2 * L::Q, *sV = sK + ST * L::K, *sO = sV + ST * L::V;
    const PersistentRing<ST, true> ring(smem + L::BARS);  // released by warps
    float *sKs = reinterpret_cast<float *>(ring.end()), *sVs = sKs + ST;  // scales of stage st
    float *sQs = sVs + ST;  // the Q scale of each Q̂ buffer's tile

    const int nblk = (T + F8_BK - 1) / F8_BK, Tp = nblk * F8_BK;
    const int n_tiles = nblk * n_bh;

    if (threadIdx.x == 0) ring.init();
    {
        // V̂^T rows D .. D + 7 of every stage: E4M3 1.0 (0x38), never overwritten (the producer
        // copies rows 0 .. D - 1), so PV's columns D .. D + 7 are P̂'s row sums (l_add_ones);
        // written by the generic proxy, read by wgmma (the async proxy)
        constexpr int CHUNKS = F8_VONES * 128 / 16;  // 16-byte chunks of a stage's ones rows
        for (int i = threadIdx.x; i < ST * CHUNKS; i += F8_THREADS)
            *reinterpret_cast<uint4 *>(sV + (i / CHUNKS) * L::V + D * 128 + (i % CHUNKS) * 16) =
                make_uint4(0x38383838u, 0x38383838u, 0x38383838u, 0x38383838u);
        fence_proxy_async();
    }
    __syncthreads();  // the last CTA-wide barrier: from here on the warpgroups meet on mbarriers only

    if (threadIdx.x < 128) {
        // ---- producer: the ring of attention/common.cuh (PersistentRing: its accounting and
        // why it cannot deadlock). The tile's Q̂ copies join its first key block's cp.async group,
        // so that block's full barrier covers them.
        setmaxnreg_dec<24>();
        const int ptid = threadIdx.x;
        unsigned it = 0;
        for (int ti = 0;; ti++) {
            const int qs = ti & 1;
            const int tile = ring.post_tile(ti, tile_counter, n_tiles, ptid);
            if (tile >= n_tiles) break;
            const CausalTile ct = causal_tile(tile, nblk, n_bh, heads_per_group);
            const int qb = ct.qb, bh = ct.bh, n_kb = qb + 1;
            const uint8_t *gk = kc + (long)bh * Tp * D, *gv = vtc + (long)bh * D * Tp;
            load_rows_tile<D, false>(sQ + qs * L::Q, qc + ((long)bh * Tp + qb * F8_BQ) * D, ptid);
            if (ptid == 0) cp_async4(sQs + qs, q_scales + (long)bh * nblk + qb, true);  // with the Q̂ copies
            ring.fill(it, n_kb, [&](int kb, unsigned st) {
                load_rows_tile<D, true>(sK + st * L::K, gk + (long)kb * F8_BK * D, ptid);
                load_vt_tile<D>(sV + st * L::V, gv + kb * F8_BK, Tp, ptid);
                if (ptid == 0) {
                    cp_async4(sKs + st, k_scales + (long)bh * nblk + kb, true);
                    cp_async4(sVs + st, v_scales + (long)bh * nblk + kb, true);
                }
            });
        }
        ring.drain(it);
    } else {
        // ---- consumers: warpgroup wg (0, 1) owns query rows q0 + 64 wg .. + 63 of each tile.
        setmaxnreg_inc<240>();
        constexpr int NPV = D + F8_VONES;  // PV's columns: O's, then the row sums'
        const int ctid = (int)threadIdx.x - 128, wg = ctid >> 7, warp = (ctid >> 5) & 3, lane = ctid & 31;
        const int g = lane >> 2, t4 = lane & 3;
        // descriptor low words (kmajor_desc_lo): stage 0 of the K̂ and V̂^T rings (stage st:
        // + st * L::K / 16, + st * L::V / 16) and this warpgroup's 64 rows of Q̂ buffer 0
        // (buffer 1: + L::Q / 16)
        const uint32_t dk0 = kmajor_desc_lo(smem_addr(sK)), dv0 = kmajor_desc_lo(smem_addr(sV)),
                       dq0 = kmajor_desc_lo(smem_addr(sQ + wg * 64 * 128));
        unsigned it0 = 0;  // key blocks of the earlier tiles: this tile's block j is ring block it0 + j
        for (int ti = 0;; ti++) {
            const int tile = ring.tile(ti);
            if (tile >= n_tiles) break;
            const CausalTile ct = causal_tile(tile, nblk, n_bh, heads_per_group);
            const int qb = ct.qb, bh = ct.bh;
            const int q0 = qb * F8_BQ, n_kb = qb + 1;  // causal: key blocks 0..qb
            const int row_w0 = q0 + wg * 64 + warp * 16;  // warp's first query row
            const uint32_t dq = dq0 + (ti & 1) * (L::Q / 16);
            // tau * inv_q (exact scaling): the Q scale came with the tile's Q̂ copies (sQs), readable
            // after the first key block's full wait, which covers them
            float tau_q;

            // Ping-pong: warpgroup wg issues its wgmmas after bar.sync on barrier 1 + wg and then
            // lets the other one go (bar.arrive on its barrier). Each warpgroup has n_kb + 1 issue
            // phases per tile (S_0; S_j + PV_{j-1} for j = 1..n_kb-1; PV_last); warpgroup 1
            // arrives once up front and skips its last arrive, so every barrier sees as many
            // arrivals as syncs in every tile. (Warpgroup 1 cannot arrive twice on barrier 1
            // before warpgroup 0 synced there: its next arrive follows its own turn, which
            // warpgroup 0 grants only after that sync.)
            if (wg == 1) pp_pass(1);

            float oacc[D / 2], pv[NPV / 2];  // O (FP32), one block's P̂V̂ (and its row sums): wgmma layouts
#pragma unroll
            for (int i = 0; i < D / 2; i++) oacc[i] = 0.f;
#pragma unroll
            for (int i = 0; i < NPV / 2; i++) pv[i] = 0.f;
            float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f}, alpha[2];
            // 1 / s_v of the last block whose PV the loop took into O: O is carried in that block's
            // units (o_rescale_add; any finite value before the first, whose factor is 0)
            float inv_sv_u = 1.f;
            uint32_t pa[F8_BK / 32][4];  // P̂ of a block: A operand of the PV wgmmas
            float s[F8_BK / 2];  // S of the current block
#pragma unroll
            for (int i = 0; i < F8_BK / 2; i++) s[i] = 0.f;

            // The K and V scales of key block j come with its stage (sKs, sVs): read after the
            // stage's full wait, they are first needed once S_j is done (tau_qk, and the V
            // scale for O's factor, o_unit_factor), so their shared-memory latency hides behind the wgmmas.

            // block 0: S_0 and its softmax (masked if it is the diagonal block)
            {
                ring.wait_full(it0);
                tau_q = tau * pow2_recip(sQs[ti & 1]);
                const float tau_qk = tau_q * pow2_recip(sKs[it0 % ST]);
                const float sv0 = sVs[it0 % ST];
                pp_sync(wg);
                reg_fence(s);
                wgmma_fence();
                issue_s<D>(s, dq, dk0 + (it0 % ST) * (L::K / 16));
                wgmma_commit();
                pp_pass(wg);
                wgmma_wait<0>();
                reg_fence(s);
                if (n_kb == 1) softmax_block<true>(s, m, alpha, tau_qk, log2_ps, 0, row_w0, T, g, t4);
                else softmax_block<false>(s, m, alpha, tau_qk, log2_ps, 0, row_w0, T, g, t4);
                pack_p(pa, s);  // O is zero: nothing to rescale
                o_unit_factor(alpha, alpha, sv0, inv_sv_u);  // alpha is 0: O takes PV_0 as it is
            }
            float alpha_prev[2] = {alpha[0], alpha[1]};  // O's factor for the block in pa (o_unit_factor)

            // Key block j >= 1: S_j and PV_{j-1} are two wgmma groups; the softmax of S_j runs once
            // the first retires, while the tensor cores work on the second; then O takes PV_{j-1}
            // and P̂_j replaces P̂_{j-1} in pa. Every issue and wait in a step is unconditional and
            // the diagonal block is a separate instantiation (as in attention/fwd_bf16.cu: ptxas must
            // see that pa stays read by the tensor cores until the wait).
            auto step = [&](int j, auto mask) {
                const unsigned rb = it0 + (unsigned)j;  // ring block of key block j (>= 1)
                const unsigned st = rb % ST, pst = (rb - 1) % ST;
                ring.wait_full(rb);
                const float tau_qk = tau_q * pow2_recip(sKs[st]);
                const float sv = sVs[st];
                pp_sync(wg);
                reg_fence(s);
                reg_fence(pv);
                reg_fence(pa);  // P̂_{j-1} packed before the fence that orders it for the tensor cores
                wgmma_fence();
                issue_s<D>(s, dq, dk0 + st * (L::K / 16));
                wgmma_commit();
                issue_pv<NPV>(pv, pa, dv0 + pst * (L::V / 16));
                wgmma_commit();
                pp_pass(wg);
                wgmma_wait<1>();
                reg_fence(s);
                softmax_block<decltype(mask)::value>(s, m, alpha, tau_qk, log2_ps, j * F8_BK, row_w0, T, g, t4);
                wgmma_wait<0>();
                reg_fence(pv);
                reg_fence(pa);
                ring.release(rb - 1);  // K̂_{j-1} and V̂_{j-1} are no longer read
                o_rescale_add(oacc, pv, alpha_prev);
                l_add_ones<D>(l, alpha_prev, pv, pow2_recip(inv_sv_u));
                pack_p(pa, s);
                o_unit_factor(alpha_prev, alpha, sv, inv_sv_u);
            };
            for (int j = 1; j < n_kb - 1; j++) step(j, std::false_type());
            if (n_kb > 1) step(n_kb - 1, std::true_type());

            // the last block's PV; then its stage and this tile's Q̂ buffer are free
            {
                const unsigned lst = (it0 + (unsigned)n_kb - 1) % ST;
                pp_sync(wg);
                reg_fence(pv);
                reg_fence(pa);
                wgmma_fence();
                issue_pv<NPV>(pv, pa, dv0 + lst * (L::V / 16));
                wgmma_commit();
                if (wg == 0) pp_pass(wg);
                wgmma_wait<0>();
                reg_fence(pv);
                reg_fence(pa);
                ring.release(it0 + (unsigned)n_kb - 1);
                ring.release_tile(ti);
                o_rescale_add(oacc, pv, alpha_prev);
                l_add_ones<D>(l, alpha_prev, pv, pow2_recip(inv_sv_u));
            }
            it0 += (unsigned)n_kb;

            // epilogue: O = U / l in BF16, LSE natural log. l holds l' s_v,last for whole rows, in
            // U's own units (l_add_ones: no quad sum); l' = l inv_sv_u (exact: a power of two)
            const float inv_l[2] = {1.f / l[0], 1.f / l[1]};
            l[0] *= inv_sv_u * inv_p;  // -> P units (exact for a power-of-two p_scale)
            l[1] *= inv_sv_u * inv_p;
            const int b = bh / H, h = bh % H;
            if (o_tma) {
                // O by TMA (store_o_tma, attention/common.cuh; named barriers 4, 5): thread 0
                // of the warpgroup waits for its previous tile's store to have read the staging
                // area (long done); the store runs on under the next tile
                const bool issuer = (ctid & 127) == 0;
                if (issuer) bulk_wait_read();
                wg_bar_sync<4>(wg);
                store_o_tma<D, L::O / 2, 4>(&tm_o, smem_addr(sO + wg * L::O), oacc, inv_l, wg, warp, issuer, h, q0 + wg * 64, b);
                fwd_store_lse(lse + (long)bh * T, row_w0 + g, T, t4, [&](int r) { return m[r] + logf(l[r]); });
            } else {
                fwd_store_rows<D>(oacc, inv_l, o + (long)b * T * o_stride + (long)h * D, o_stride, lse + (long)bh * T,
                                  row_w0 + g, T, t4, [&](int r) { return m[r] + logf(l[r]); });
            }
        }
        if (o_tma && (ctid & 127) == 0) bulk_wait_read();  // the last O store has read the staging area
    }
}

template <int D>
static void forward_pingpong(const uint8_t *qc, const uint8_t *kc, const uint8_t *vtc, const float *qs, const float *ks,
                             const float *vs, float p_scale, bf16 *o, int o_stride, float *lse, int B, int H, int T) {
    const size_t smem = F8Smem<D, F8_STAGES>::BYTES;
    CU(cudaFuncSetAttribute(attn_fwd_fp8_pingpong_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
    const int nblk = attn_quant_n_blocks(T);
    const long n_tiles = (long)nblk * B * H;
    const long grid = n_tiles < attn_sm_count() ? n_tiles : attn_sm_count();
    const int hg = causal_heads_per_group(2L * nblk * F8_BK * D, nblk, B * H, 2 * attn_sm_count());
    const CUtensorMap tm_o = tensor_map_bthd("the ping-pong FP8 forward's O", o, B, H, T, D, o_stride, 64);
    attn_fwd_fp8_pingpong_kernel<D><<<(unsigned)grid, F8_THREADS, smem>>>(
        qc, kc, vtc, qs, ks, vs, 1.0f / p_scale, log2f(p_scale), o, o_stride, lse, H, B * H, T, 1.0f / sqrtf((float)D),
        attn_fp8_tile_counter(0), hg, tm_o, 1);
    CU(cudaGetLastError());
}

int main(int argc, char **argv) {
    const LabShapes sh(argc, argv);
    const int d = sh.d, H = sh.H, C = H * d;
    const float p_scale = 256.0f;
    bool ok = true;
    for (int T : sh.Ts) {
        const int B = sh.batch(T), Tp = attn_quant_padded_len(T), nblk = attn_quant_n_blocks(T);
        uint16_t *qkv = random_bf16((size_t)B * T * 3 * C, 1234u + T);  // (B, T, 3 C)
        const LabForwardOut out(B, H, T, d);
        float *scales[3];
        uint8_t *codes[3];
        // Q, K codes (B, H, Tp, d) and V's transposed codes (B, H, d, Tp), E4M3, as the FP8 modes
        // quantize them for the forward
        AttnQuantTensor ts[3];
        for (int i = 0; i < 3; i++) {
            CU(cudaMalloc(&codes[i], (size_t)B * H * Tp * d));
            CU(cudaMalloc(&scales[i], (size_t)B * H * nblk * 4));
            memset(&ts[i], 0, sizeof ts[i]);
            ts[i].x = qkv + i * C;
            ts[i].stride = 3 * C;
            ts[i].fmt = FP8_E4M3;
            ts[i].codes = i < 2 ? codes[i] : NULL;
            ts[i].codes_t = i == 2 ? codes[i] : NULL;
            ts[i].scales = scales[i];
            ts[i].max_scale_exp = attn_scale_max_exp((AttnCast)i);
        }
        attn_gpu_quantize(ts, 3, B, H, T, d, 0);
        auto lib = [&] {
            attn_gpu_forward_fp8(codes[0], codes[1], codes[2], scales[0], scales[1], scales[2], p_scale, out.o_ref, C,
                                 out.lse_ref, B, H, T, d, 0);
        };
        auto lab = [&] {
            if (d == 64)
                forward_pingpong<64>(codes[0], codes[1], codes[2], scales[0], scales[1], scales[2], p_scale,
                                     (bf16 *)out.o_lab, C, out.lse_lab, B, H, T);
            else
                forward_pingpong<128>(codes[0], codes[1], codes[2], scales[0], scales[1], scales[2], p_scale,
                                      (bf16 *)out.o_lab, C, out.lse_lab, B, H, T);
        };
        ok &= lab_forward_compare(out, lib, lab, "library (plain loop)", "lab 1 (ping-pong)", true, 0, B, H, T, d);
        cudaFree(qkv);
        for (int i = 0; i < 3; i++) {
            cudaFree(codes[i]);
            cudaFree(scales[i]);
        }
    }
    return ok ? 0 : 1;
}
