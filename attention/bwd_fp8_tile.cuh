// bwd_fp8_tile.cuh: the device routines that the FP8 backward's main kernel
// (attention/bwd_fp8.cu) and fp8_dm's delta pass (attention/delta_fp8.cu) share: the tile shapes,
// the swizzled tile loader, a whole-tile FP8 wgmma (the wrappers themselves, wg_fp8 and wg_fp8_rs,
// are attention/common.cuh's), and THE recomputation of P and dP (pdp_s_scale, pdp_dp_scale,
// pdp_p, tile_p_dp, and the delta pass's form of it). Delta-Matching needs both kernels to get P
// and dP bit for bit the same from the same codes: every FP32 operation of that recomputation is
// defined here once, by explicitly rounded intrinsics, and test_attention_delta_fp8_gpu checks
// the bits of the two kernels' tiles against each other on the GPU.
// Everything here is inline / in an anonymous namespace: each .cu that includes it gets its own copy.
#ifndef ATTENTION_BWD_FP8_TILE_CUH
#define ATTENTION_BWD_FP8_TILE_CUH

#include <stdint.h>  // uint8_t, uint32_t, uint64_t

#include "attention/common.cuh"     // wgmma fences/descriptors, cp.async, reg_fence, fast_exp2
#include "attention/kernels_fp8.h"  // ATTN_FP8_BWD_BLOCK_Q/K, ATTN_SCALE_BLOCK

#define B8_BQ ATTN_FP8_BWD_BLOCK_Q  // 64 queries per tile
#define B8_BK ATTN_FP8_BWD_BLOCK_K  // 128 keys per tile = per CTA
#define B8_THREADS 256
static_assert(B8_BK == ATTN_SCALE_BLOCK, "a key block must be one scale block");
static_assert(ATTN_SCALE_BLOCK % B8_BQ == 0, "a query block must lie in one scale block");
static_assert(B8_BQ == 64 && B8_BK == 128, "the warpgroup layout assumes 64 x 128 tiles");

// The code matrices as a TMA form loads them, B*H*Tp rows of d bytes (Q̂, dÔ in the main backward,
// K̂, V̂ in the delta pass), take int row coordinates (bh * Tp + a block's first row): the TMA forms
// only where those fit; the cp.async forms otherwise.
static inline bool b8_code_rows_fit_tma(int B, int H, int T) {
    return (long)B * H * attn_quant_padded_len(T) < 0x7fffffffL;
}

namespace {

// Copies ROWS rows of CHUNKS 16-byte chunks (row pitch `pitch` bytes in global memory) into a
// swizzled tile, with NT threads (tid < NT). Every source byte exists (the quantized layouts are
// padded to whole blocks).
template <int ROWS, int CHUNKS, int NT = B8_THREADS>
__device__ __forceinline__ void b8_load(uint8_t *s, const uint8_t *g, long pitch, int tid) {
    static_assert(ROWS * CHUNKS % NT == 0, "tile copy must split evenly over the threads");
#pragma unroll
    for (int i = 0; i < ROWS * CHUNKS / NT; i++) {
        const int c = tid + i * NT, r = c / CHUNKS, ch = c % CHUNKS;
        cp_async16(s + sw128(r, ch * 16), g + (long)r * pitch + ch * 16, true);
    }
}

// Fragment map of a 64 x N wgmma accumulator (this thread's element i = 4n + e):
// row (M) = warp*16 + g + 8*(e>>1) within the warpgroup's 64, column (N) = 8n + 2*t4 + (e&1).

// The two scale constants of tile_p_dp, computed by this one routine in both kernels (so both
// get the same bits): S in log2 units per code product, tau log2(e) / (s_q s_k), and dP per code
// product, 1 / (s_do s_v) (a power of two: exact).
__device__ __forceinline__ float pdp_s_scale(float inv_q, float inv_k, float tau) {
    return __fmul_rn(__fmul_rn(inv_q, inv_k), __fmul_rn(tau, 1.4426950408889634f));
}
__device__ __forceinline__ float pdp_dp_scale(float inv_do, float inv_v) { return __fmul_rn(inv_do, inv_v); }
// P of one element from its raw S accumulator `acc` (code products), cs = pdp_s_scale(..) and
// nl = -LSE log2(e) rounded once (__fmul_rn(lse, -log2 e)): 2^min(acc cs + nl, 0), one explicit
// FMA (never contracted or reordered) and ex2.approx.ftz. The clamp keeps P <= 1 whatever the
// rounding (see tile_p_dp).
__device__ __forceinline__ float pdp_p(float acc, float cs, float nl) {
    return fast_exp2(fminf(__fmaf_rn(acc, cs, nl), 0.0f));
}

// THE main pass's recomputation: for this warpgroup's 64 keys
// (key0 = first of them; dKw, dVw the descriptor low words (kmajor_desc_lo) of their K̂, V̂ rows) and the
// 64 queries of the Q̂, dÔ tiles at dQ, ddO (first query q0), P^T and dP^T in FP32, 0 where masked
// (key > query, or query >= T). sLse: the 64 LSEs (natural log, 8-byte aligned).
// cs = pdp_s_scale(..), cdp = pdp_dp_scale(..).
//   P  = 2^(acc_s * cs - LSE log2(e))  (one explicit FMA, then ex2.approx.ftz on the SFU)
//   dP = acc_dp * cdp
// This is exp(tau S - LSE) of the emulation up to the rounding of the exponent's argument and
// ex2.approx's ~2 ulp (relative error of P ~1e-6, well inside the GPU-vs-emulation tolerance;
// a P̂ code flips only where P p_scale lies within that of a rounding boundary; P below 2^-126
// flushes to 0). The argument is clamped at 0: S <= LSE in exact arithmetic, and where |S| is
// huge (|tau S| ~ 2^20 and beyond) the rounding of a large LSE log2(e) could otherwise make P
// overflow (non-finite gradients); for ordinary inputs the clamp changes nothing. What matters for Delta-Matching is that both kernels run exactly this code:
// every FP32 operation is an explicitly rounded intrinsic or a fixed PTX instruction (never
// contracted or reordered by the compiler), so they get bitwise the same p and dp from the same
// codes. Tiles entirely below the diagonal and inside the sequence (the vast majority) skip the
// mask (a branch, see below); the unmasked values are the same instructions either way.
// fp8_dm's delta pass (attention/delta_fp8.cu) gets the same values in tiles of its own shape.
template <int D, bool E5>
__device__ __forceinline__ void tile_p_dp(uint32_t dKw, uint32_t dVw, uint32_t dQ, uint32_t ddO, const float *sLse,
                                          float cs, float cdp, int key0, int q0, int T, float (&p)[32],
                                          float (&dp)[32]) {
    const int tid = threadIdx.x, warp = (tid % 128) / 32, lane = tid % 32, g = lane >> 2, t4 = lane & 3;
    reg_fence(p);
    reg_fence(dp);
    wgmma_fence();
    // S^T and dP^T in two groups: the exponentials of P run while dP^T is still on the tensor
    // cores (the caller has no other group in flight, so "all but the newest" is S^T's group).
    wg_fp8_tile<64, 0, 0, D / 32>(p, dKw, dQ);
    wgmma_commit();
    wg_fp8_tile<64, 0, E5 ? 1 : 0, D / 32>(dp, dVw, ddO);
    wgmma_commit();
    wgmma_wait<1>();
    reg_fence(p);
    if (nsmid_nonzero()) {  // a basic block of its own: ptxas keeps the wait for dP^T below it
#pragma unroll
        for (int n = 0; n < 8; n++) {
            const float2 l = *reinterpret_cast<const float2 *>(sLse + 8 * n + 2 * t4);
            const float nl[2] = {__fmul_rn(l.x, -1.4426950408889634f), __fmul_rn(l.y, -1.4426950408889634f)};
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = 4 * n + e;
                p[i] = pdp_p(p[i], cs, nl[e & 1]);
            }
        }
    }
    reg_fence(p);
    wgmma_wait<0>();
    reg_fence(dp);
#pragma unroll
    for (int i = 0; i < 32; i++) dp[i] = __fmul_rn(dp[i], cdp);
    // The mask, as a second pass behind a warp-uniform branch (key0, q0, T are the same for the
    // whole warpgroup): only tiles that reach above the diagonal or past T take it (per CTA the
    // first two query blocks and a partial last one). Written into the loop above, the compiler
    // if-converts it and every tile pays its ~64 selects and ~70 integer tests; peeling the masked
    // iterations into their own loops instead spills (0.5-0.9 KB, the main kernel has no
    // registers to spare). The values are the same either way: masked elements become 0.
    const bool full = key0 + 63 <= q0 && q0 + B8_BQ <= T;  // no key above a query, no query >= T
    if (!full) {
        const int kq = key0 + warp * 16 + g - (q0 + 2 * t4);  // key - query of element (n = 0, e = 0)
#pragma unroll
        for (int n = 0; n < 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int i = 4 * n + e, ql = 8 * n + 2 * t4 + (e & 1);
                const bool masked = kq + 8 * (e >> 1) - 8 * n - (e & 1) > 0 || q0 + ql >= T;
                p[i] = masked ? 0.0f : p[i];
                dp[i] = masked ? 0.0f : dp[i];
            }
    }
}

// --- the delta pass's form (attention/delta_fp8.cu): the same values, queries as M -------------
// A warpgroup's 64 queries against a whole 128-key block: s = Q̂ K̂^T and dp = dÔ V̂^T (m64n128,
// raw code products; element 4n + e is query row warp*16 + g + 8 (e >> 1), key 8n + 2 t4 + (e & 1)).
// Each element is the sum of the same exact FP8 products in the same k32 steps over d as tile_p_dp's
// S^T, dP^T element (keys as M there), so the accumulators hold the same bits: the FP8 products are
// exact in FP32 and a k32 step adds the same 32 of them whichever operand is A, whether A comes
// from registers or shared memory, and whatever N is (test_attention_delta_fp8_gpu checks the
// bits of both forms on the GPU). Q̂ and dÔ, the same for all key blocks of a tile, are the A
// operands from registers (delta_a_frags, once per tile): a wgmma then reads only K̂ or V̂ from
// shared memory, 4 KB per k32 step instead of 6 (at the tensor cores' full rate, 64 instead of
// 96 bytes per clock of the SM's 128; measured on one H200, 2026-11-30: the pass 4-5% faster).

// The A fragments of a warpgroup's 64 rows of a K-major tile (rows of 128 B, sw128's swizzle;
// `rows`: the warpgroup's first row) for STEPS k32 steps: register q of step kk holds row
// warp*16 + g + 8 (q & 1), bytes 32 kk + 16 (q >> 1) + 4 t4 .. + 3 (the wgmma A layout of 8-bit
// types; the FP8 forward packs P̂ the same way).
template <int STEPS>
__device__ __forceinline__ void delta_a_frags(uint32_t (&a)[STEPS][4], const uint8_t *rows) {
    const int lane = threadIdx.x % 32, warp = (threadIdx.x % 128) / 32, g = lane >> 2, t4 = lane & 3;
#pragma unroll
    for (int kk = 0; kk < STEPS; kk++)
#pragma unroll
        for (int q = 0; q < 4; q++)
            a[kk][q] = *reinterpret_cast<const uint32_t *>(rows + sw128(warp * 16 + g + 8 * (q & 1), 32 * kk + 16 * (q >> 1) + 4 * t4));
}
// delta_issue: two wgmma groups (S, then dP); the caller has no other group in flight. aq, ado:
// delta_a_frags of the warpgroup's Q̂ and dÔ rows; dk, dv: kmajor_desc_lo of the block's K̂, V̂ rows.
template <int D, bool E5>
__device__ __forceinline__ void delta_issue(float (&s)[64], float (&dp)[64], const uint32_t (&aq)[D / 32][4],
                                            const uint32_t (&ado)[D / 32][4], uint32_t dk, uint32_t dv) {
    reg_fence(s);
    reg_fence(dp);
    wgmma_fence();
    wg_fp8_rs_tile<128, 0, D / 32>(s, aq, dk);
    wgmma_commit();
    wg_fp8_rs_tile<128, E5 ? 1 : 0, D / 32>(dp, ado, dv);
    wgmma_commit();
}
// s -> P (pdp_p; nl[r] = -LSE log2(e) of row r, rounded as tile_p_dp rounds it) once S is done,
// while dP is still on the tensor cores; then waits for dP. dp stays in code-product units.
// (ptxas puts the wait for dP after the first dozen exponentials; fencing it below all of them,
// as tile_p_dp does, measured 5% slower here.)
__device__ __forceinline__ void delta_p(float (&s)[64], float (&dp)[64], float cs, const float (&nl)[2]) {
    wgmma_wait<1>();
    reg_fence(s);
#pragma unroll
    for (int i = 0; i < 64; i++) s[i] = pdp_p(s[i], cs, nl[(i >> 1) & 1]);
    reg_fence(s);
    wgmma_wait<0>();
    reg_fence(dp);
}
// The causal mask of a tile that reaches above the diagonal, as tile_p_dp's (key > query: P =
// dP = 0). kr: key - query of this thread's element 0 (key0 + 2 t4 - its first row).
__device__ __forceinline__ void delta_mask(float (&s)[64], float (&dp)[64], int kr) {
#pragma unroll
    for (int i = 0; i < 64; i++) {
        const bool masked = kr + 8 * (i >> 2) + (i & 1) - 8 * ((i >> 1) & 1) > 0;
        s[i] = masked ? 0.f : s[i];
        dp[i] = masked ? 0.f : dp[i];
    }
}

}  // namespace

#endif  // ATTENTION_BWD_FP8_TILE_CUH
