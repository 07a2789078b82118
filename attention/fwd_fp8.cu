// fwd_fp8.cu: fused causal flash attention forward in FP8 (docs/fp8-attention.md §3:
// the forward of fp8_naive, fp8_hybrid and fp8_dm), on FP8 wgmma (QGMMA in SASS). Inputs are
// the quantized operands of attention/quant_fp8.cu: Q̂, K̂ codes (B, H, Tp, d), V̂^T codes
// (B, H, d, Tp) and their per-(b, h, 128-token block) scales. Interface: attention/kernels_fp8.h.
//
// Numerics, as attn_cpu_forward emulates them with block_q = block_k = 128 (one key block = one
// scale block, so every S tile has one Q scale and one K scale and every PV step one V scale):
//   S = (Q̂code · K̂code) * (tau / (s_q s_k))                    (FP8 wgmma, FP32 accumulators;
//       tau / (s_q s_k) = tau * inv_q * inv_k is tau times a power of two, so this is the one
//       rounding of tau * ((s * inv_q) * inv_k), the emulation's S; the scales are powers of two
//       in [2^-126, 2^126] (fp8_scale_for_amax; V's in [2^-40, 2^40], which O's units below need),
//       so inv_x = 1 / s_x is exact and is taken from the exponent bits, pow2_recip)
//   running max m advanced once per key block (the max of the dequantized S: the max of the raw
//   accumulators times the positive factor above, rounding being monotone; the raw max is taken
//   on the float bits as integers, exact, see softmax_max in attention/fwd_fp8_step.cuh),
//   alpha = e^(m_old - m) (see below)
//   P' = p_scale * P = 2^(S*log2e - m*log2e + log2 p_scale)   (ex2.approx, FP32; see below)
//   P̂ = E4M3(P')                                               (cvt.rn.satfinite: the hardware
//       conversion that the host encoder fp8_e4m3_from_f32 is bit-exact with)
//   l sums the quantized P̂ (spec §3), on the tensor cores: V̂^T's stages have 8 rows of E4M3
//       ones after their D rows, so the PV wgmma (N = D + 8) returns each row's sum of P̂ beside
//       P̂V̂ (l_add_ones; l = l' / p_scale at the end, exact for a power-of-two p_scale)
//   O = O * alpha + (P̂code · V̂code) * (1 / (p_scale s_v))    (FP8 wgmma into a fresh FP32
//       accumulator per key block, added in FP32 registers: the tensor cores' reduced-precision
//       accumulation never runs over more than 128 keys, spec §3; O carried in the units
//       1 / (p_scale s_v) of the last block added, so that each block's update is one FFMA,
//       fma(U, alpha * s_v,j / s_v,j-1, PV): one rounding a block, o_rescale_add in
//       attention/fwd_fp8_step.cuh)
//   O stored BF16 (acc / l), LSE = m + logf(l) FP32.
// The exponentials of P use ex2.approx on the prescaled argument fma(s, tau_qk*log2e,
// log2(p_scale) - m*log2e) instead of expf(S - m): the argument carries one extra rounding
// (~ulp(|m|*log2e), i.e. ~1e-7 relative in P for |m| ~ 1, ~1e-6 for |m| ~ 20) and ex2.approx
// adds ~2 ulp, so P is within ~1e-7..1e-6 relative of the emulation's; P̂ (3 mantissa bits)
// flips a code only when P' lies that close to a rounding boundary (a few in 1e5 values), far
// inside the O tolerance of the GPU test. alpha (two per row and block) is ex2.approx of the
// difference of the two blocks' biases log2(p_scale) - m*log2e, likewise ~1e-6 relative of the
// emulation's expf(m_old - m): one more rounding of O per key block at that level.
//
// Structure (FlashAttention-3's, on FP8):
// - Persistent CTAs (one per SM) of 3 warpgroups; each CTA computes 128-row query blocks (tiles)
//   one after the other, taking them from a counter heaviest first. Warpgroup 0 is the producer:
//   its 128 threads copy each tile's Q̂ block (two buffers: the next tile's loads while the
//   current one computes) and each key block's K̂ and V̂^T tiles and scales with cp.async into a
//   ring of F8_STAGES stages that runs on across tiles, and hand most of their registers to the
//   consumers (setmaxnreg). Warpgroups 1 and 2 (64 query rows each) compute. Stages are paced
//   by mbarriers (full: the producer's 128 threads landed their copies; empty: the 8 consumer
//   warps are done with the stage, one arrival each), so there is no CTA-wide barrier in the loop
//   and the two consumers drift freely.
// - P̂ goes from registers straight into the PV wgmma (A operand from registers), never through
//   shared memory. The FP8 A fragment holds 4 consecutive keys per register (keys 4t..4t+3 and
//   16+4t..16+4t+3 of each 32-key step), while the S accumulator gives a thread keys 2t, 2t+1
//   of every 8. Instead of shuffling bytes between threads (FA3's permute), the producer stores
//   the K̂ rows of each 16-key group permuted (key_of_row, attention/fwd_fp8_step.cuh): S's
//   column c then holds key key_of_row(c), and the accumulators of two neighbouring n-tiles are
//   exactly 4 consecutive keys: P̂ packs into the A fragments in place. V̂^T stays in natural key
//   order.
// - Within a consumer, key block j issues S_j = Q K_j^T and then PV_{j-1} = P̂_{j-1} V_{j-1} as
//   two wgmma groups; the softmax of S_j runs while the tensor cores still work on PV_{j-1}.
// - The two consumers issue their wgmmas independently (FA3's ping-pong, where they take turns,
//   is the lab version dev/cuda/attention_fwd_fp8_1_pingpong.cu).
// Both matmuls use K-major operands (the only FP8 wgmma form): rows of 128 bytes (128 FP8 values
// along the reduction), 16-byte chunk c of row r at chunk c ^ (r % 8), regions 1024-byte aligned;
// a k32 step advances the descriptor by 32 bytes. For d = 64 the Q and K rows use only the first
// 64 bytes of each 128-byte row (2 k-steps instead of 4).
#include "attention/kernels_fp8.h"

#include <cuda_runtime.h>  // launches, cudaFuncSetAttribute
#include <math.h>          // INFINITY, expf, logf, log2f
#include <stdint.h>        // uint8_t, uint32_t, uint64_t
#include <string.h>        // memset
#include <type_traits>     // std::true_type, std::false_type (compile-time mask of a loop step)

#include "attention/fwd_fp8_step.cuh"  // F8_BK, issue_s, issue_pv, softmax_block, pack_p, key_of_row
#include "attention/common.cuh"        // bf16, CUDA_OK, PTX wrappers, PersistentRing, causal_tile
#include "core/common.h"               // FATAL
#include "gpu/tensor_map.h"            // tensor_map_bthd (O's map for the TMA store)
#include "gpu/test_hooks.h"            // gpu_test_hooks: the grid, the tile order, O's stores

#define F8_BQ 128     // query rows per CTA (2 consumer warpgroups x 64)
#define F8_STAGES 4   // K̂ / V̂^T ring depth (>= 3: see the producer)
#define F8_THREADS 384
static_assert(F8_BK == ATTN_SCALE_BLOCK, "a key block must be one scale block");
static_assert(F8_BQ == F8_BK, "only the diagonal key block is masked");

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

// The tiles (query block, batch x head) of a launch, heaviest first within groups of
// heads_per_group heads (causal_item_grouped: rank r is query block nblk - 1 - r; the group's K̂
// and V̂^T stay in L2 while its tiles run, causal_heads_per_group), taken by the CTAs from the
// stream's tile counter (persistent_next_tile, attention/common.cuh).

// grid G <= n_qb * B * H CTAs, block 384 (producer + 2 consumer warpgroups); each CTA computes
// tiles until the counter runs out (persistent_next_tile), one after the other (persistent when G =
// the number of SMs: the producer loads the next tile's Q̂ and first key blocks while the
// consumers finish the current one, and no CTA launches in between).
template <int D>
__global__ void __launch_bounds__(F8_THREADS, 1)
    attn_fwd_fp8_kernel(const uint8_t *__restrict__ qc, const uint8_t *__restrict__ kc,
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
                reg_fence(s);
                wgmma_fence();
                issue_s<D>(s, dq, dk0 + (it0 % ST) * (L::K / 16));
                wgmma_commit();
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
                reg_fence(s);
                reg_fence(pv);
                reg_fence(pa);  // P̂_{j-1} packed before the fence that orders it for the tensor cores
                wgmma_fence();
                issue_s<D>(s, dq, dk0 + st * (L::K / 16));
                wgmma_commit();
                issue_pv<NPV>(pv, pa, dv0 + pst * (L::V / 16));
                wgmma_commit();
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
                reg_fence(pv);
                reg_fence(pa);
                wgmma_fence();
                issue_pv<NPV>(pv, pa, dv0 + lst * (L::V / 16));
                wgmma_commit();
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

// The tile counters (persistent_next_tile: 2 words each), one per stream that launched the
// FP8 forward or fp8_dm's delta pass and was not released since
// (attn_fp8_release_stream, before the stream is destroyed: a program that makes and
// frees models one after the other reuses the slots). One device per process (one GPU per
// rank). Made outside any graph capture (cudaMalloc): warm a stream up with one forward before
// capturing on it.
static struct {
    cudaStream_t stream;
    unsigned *counter;
} fwd_fp8_slots[32];
static int fwd_fp8_n_slots = 0;
extern "C" unsigned *attn_fp8_tile_counter(cudaStream_t stream) {
    for (int i = 0; i < fwd_fp8_n_slots; i++)
        if (fwd_fp8_slots[i].stream == stream) return fwd_fp8_slots[i].counter;
    if (fwd_fp8_n_slots == (int)(sizeof fwd_fp8_slots / sizeof fwd_fp8_slots[0]))
        FATAL("attention FP8: more than %d streams launched the FP8 forward or delta pass (one tile counter each; hint: "
              "attn_fp8_release_stream before destroying a stream)", fwd_fp8_n_slots);
    unsigned *c = NULL;
    CUDA_OK(cudaMalloc(&c, 2 * sizeof(unsigned)));
    CUDA_OK(cudaMemset(c, 0, 2 * sizeof(unsigned)));
    fwd_fp8_slots[fwd_fp8_n_slots].stream = stream;
    fwd_fp8_slots[fwd_fp8_n_slots].counter = c;
    fwd_fp8_n_slots++;
    return c;
}
extern "C" void attn_fp8_release_stream(cudaStream_t stream) {
    for (int i = 0; i < fwd_fp8_n_slots; i++)
        if (fwd_fp8_slots[i].stream == stream) {
            CUDA_OK(cudaFree(fwd_fp8_slots[i].counter));  // waits for the stream's launches
            fwd_fp8_slots[i] = fwd_fp8_slots[--fwd_fp8_n_slots];
            return;
        }
}

template <int D>
static void forward_fp8_d(const uint8_t *qc, const uint8_t *kc, const uint8_t *vtc, const float *qs, const float *ks,
                          const float *vs, float p_scale, bf16 *o, int o_stride, float *lse, int B, int H, int T,
                          cudaStream_t stream) {
    const size_t smem = F8Smem<D, F8_STAGES>::BYTES;
    static bool attr_set = false;  // one device per process (one GPU per rank)
    if (!attr_set) {
        CUDA_OK(cudaFuncSetAttribute(attn_fwd_fp8_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem));
        attr_set = true;
    }
    const int nblk = attn_quant_n_blocks(T);
    const long n_tiles = (long)nblk * B * H;
    if (n_tiles > 0x3fffffffL) FATAL("attn_gpu_forward_fp8: B*H*ceil(T/128) = %ld tiles is too many", n_tiles);
    // one persistent CTA per SM (tests: fewer, so that small shapes run several tiles per CTA),
    // taking tiles from the stream's counter (tests: a fixed order, persistent_next_tile)
    const GpuTestHooks &th = gpu_test_hooks;
    long grid = th.fwd_fp8_max_ctas > 0 ? th.fwd_fp8_max_ctas : attn_sm_count();
    if (grid > n_tiles) grid = n_tiles;
    // heads per group: K̂ and V̂^T of a head are 2 Tp D bytes; two waves of CTAs per group
    const int hg = causal_heads_per_group(2L * nblk * F8_BK * D, nblk, B * H, 2 * attn_sm_count());
    // O by TMA (store_o_tma) where its rows are 16-byte aligned, else from the fragments (the same bits)
    CUtensorMap tm_o;
    memset(&tm_o, 0, sizeof tm_o);
    const bool o_tma = !th.fwd_fp8_no_o_tma && tma_rows_aligned(o, 2L * o_stride);
    if (o_tma) tm_o = tensor_map_bthd("the FP8 forward's O", o, B, H, T, D, o_stride, 64);
    attn_fwd_fp8_kernel<D><<<(unsigned)grid, F8_THREADS, smem, stream>>>(
        qc, kc, vtc, qs, ks, vs, 1.0f / p_scale, log2f(p_scale), o, o_stride, lse, H, B * H, T,
        1.0f / sqrtf((float)D), th.fwd_fp8_static_order ? NULL : attn_fp8_tile_counter(stream), hg, tm_o,
        o_tma ? 1 : 0);
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
