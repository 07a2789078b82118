// fwd_fp8_step.cuh: one key block's work of a consumer warpgroup of the FP8 forward
// (attention/fwd_fp8.cu, whose header comment gives the numerics and the structure): the S and PV
// wgmmas, the online-softmax step on S (its max half and its exponentials), the packing of P̂ into
// the PV wgmma's A fragments and the O update. In a header of its own so that the lab version
// (dev/cuda/attention_fwd_fp8_1_pingpong.cu) and the step benchmarks (dev/bench/bench_mufu_qgmma.cu,
// dev/bench/bench_fwd_fp8_loops.cuh) run exactly the kernel's step.
#ifndef ATTENTION_FWD_FP8_STEP_CUH
#define ATTENTION_FWD_FP8_STEP_CUH

#include <math.h>    // INFINITY
#include <stdint.h>  // uint32_t

#include "attention/common.cuh"  // wg_fp8_tile, wg_fp8_rs_tile, quad_max, fast_exp2, pow2_recip

#define F8_BK 128  // keys per block = ATTN_SCALE_BLOCK (one key block = one scale block)
#define F8_VONES 8  // rows of E4M3 ones after each V̂^T stage's D rows: PV's n8 tile of row sums (l_add_ones)

// Four FP32 values -> four E4M3 codes in one register (x0 in the low byte), round to nearest
// even, saturating: the hardware conversion (__nv_cvt_float_to_fp8's own instruction).
__device__ __forceinline__ uint32_t pack_e4m3x4(float x0, float x1, float x2, float x3) {
    uint32_t r;
    asm("{\n.reg .b16 lo, hi;\n"
        "cvt.rn.satfinite.e4m3x2.f32 lo, %2, %1;\n"  // cvt d, a, b puts a in the upper byte
        "cvt.rn.satfinite.e4m3x2.f32 hi, %4, %3;\n"
        "mov.b32 %0, {lo, hi};\n}\n"
        : "=r"(r)
        : "f"(x0), "f"(x1), "f"(x2), "f"(x3));
    return r;
}

// The key (within its block) that row r of a K̂ stage holds. Within each 16-row group, row
// 8j + 2t + e (j, e in {0, 1}, t in 0..3) holds key 4t + 2j + e: S column 8n + 2t + e of a
// thread with t = lane % 4 is then key 16(n/2) + 4t + 2(n%2) + e, so the thread's accumulators
// of n-tiles 2i and 2i+1 are keys 16i + 4t .. 16i + 4t + 3, in order: one register of the FP8
// A fragment of P̂ (keys 4t..4t+3 of a 16-key half of a k32 step).
__device__ __forceinline__ int key_of_row(int r) {
    return (r & ~15) | (((r >> 1) & 3) << 2) | (((r >> 3) & 1) << 1) | (r & 1);
}

// Descriptors of the K-major tiles as low words (kmajor_desc_lo, attention/common.cuh): the
// key loop keeps one per region (Q̂ rows, K̂ ring, V̂^T ring) and adds constants, instead of
// rebuilding every descriptor from its address (~40 uniform-datapath instructions per block).

// s (64 x 128 raw code products) = Q̂_wg K̂^T: D/32 wgmmas (caller fences and commits). dq, dk:
// kmajor_desc_lo of the warpgroup's Q̂ rows and of the K̂ stage (wg_fp8_tile).
template <int D>
__device__ __forceinline__ void issue_s(float (&s)[F8_BK / 2], uint32_t dq, uint32_t dk) {
    wg_fp8_tile<128, 0, 0, D / 32>(s, dq, dk);
}
// pv (64 x D) = P̂ (registers) V̂: 4 k32 steps into a fresh accumulator (caller fences, commits).
// dv: kmajor_desc_lo of the V̂^T stage (wg_fp8_rs_tile).
template <int D>
__device__ __forceinline__ void issue_pv(float (&pv)[D / 2], const uint32_t (&pa)[F8_BK / 32][4], uint32_t dv) {
    wg_fp8_rs_tile<D, 0, F8_BK / 32>(pv, pa, dv);
}

// P' (FP32, S accumulator layout) -> E4M3 A fragments: register q of k32 step kk holds row
// g + 8 (q & 1), keys 16 (q >> 1) + 4t .. + 3 of the step = n-tiles 4kk + 2(q >> 1) + {0, 1},
// elements 2 (q & 1) + {0, 1} of each (see key_of_row).
__device__ __forceinline__ void pack_p(uint32_t (&pa)[F8_BK / 32][4], const float (&s)[F8_BK / 2]) {
#pragma unroll
    for (int kk = 0; kk < F8_BK / 32; kk++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const int n0 = 4 * kk + 2 * (q >> 1), e = 2 * (q & 1);
            pa[kk][q] = pack_e4m3x4(s[4 * n0 + e], s[4 * n0 + e + 1], s[4 * n0 + 4 + e], s[4 * n0 + 4 + e + 1]);
        }
}

// The max over a quad (the 4 threads of an accumulator row) of row r's 128 values of the S tile
// (this thread's 32: s[4n + 2r], s[4n + 2r + 1]), on the float bits as signed integers with
// Hopper's 3-input integer max (a DPX instruction, VIMNMX3: 16 instead of 32 FMNMX, a tree 4
// deep instead of chains 8 deep). For floats >= 0 the integer order is the float order and every
// negative float is a negative integer, so a result >= 0 is exactly the float max, bits and all
// (S is never NaN). A negative result means all 128 values are negative (it is then the bits of
// the most negative one): softmax_max takes the float path for it.
__device__ __forceinline__ int quad_row_max_bits(const float (&s)[F8_BK / 2], int r) {
    int x[F8_BK / 4];
#pragma unroll
    for (int n = 0; n < F8_BK / 8; n++) {
        x[2 * n] = __float_as_int(s[4 * n + 2 * r]);
        x[2 * n + 1] = __float_as_int(s[4 * n + 2 * r + 1]);
    }
    int y[12], z[4];
#pragma unroll
    for (int k = 0; k < 10; k++) y[k] = __vimax3_s32(x[3 * k], x[3 * k + 1], x[3 * k + 2]);
    y[10] = x[30];
    y[11] = x[31];
#pragma unroll
    for (int k = 0; k < 4; k++) z[k] = __vimax3_s32(y[3 * k], y[3 * k + 1], y[3 * k + 2]);
    int v = max(__vimax3_s32(z[0], z[1], z[2]), z[3]);
    v = max(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return max(v, __shfl_xor_sync(0xffffffffu, v, 2));
}

// The max of each of this thread's two rows over its quad (the float path of softmax_block):
// 4 partial maxima per row (n-tiles n with the same n % 4) combined at the end, dependent chains
// of ~8 FMNMX instead of one of ~32. The max of a set is exact and does not depend on the order
// (at most the sign of a zero maximum could, and that changes no output: m only enters through
// m_old - m, -m * log2e + log2(p_scale) and m + logf(l)).
__device__ __forceinline__ void fmax_rows(const float (&s)[F8_BK / 2], float (&mx)[2]) {
    float pm[2][4];
#pragma unroll
    for (int q = 0; q < 4; q++) {
        pm[0][q] = fmaxf(s[4 * q + 0], s[4 * q + 1]);
        pm[1][q] = fmaxf(s[4 * q + 2], s[4 * q + 3]);
    }
#pragma unroll
    for (int n = 4; n < F8_BK / 8; n++) {
        pm[0][n % 4] = fmaxf(pm[0][n % 4], fmaxf(s[4 * n + 0], s[4 * n + 1]));
        pm[1][n % 4] = fmaxf(pm[1][n % 4], fmaxf(s[4 * n + 2], s[4 * n + 3]));
    }
#pragma unroll
    for (int r = 0; r < 2; r++) mx[r] = quad_max(fmaxf(fmaxf(pm[r][0], pm[r][1]), fmaxf(pm[r][2], pm[r][3])));
}

// Online-softmax step on one (64 x 128) S tile of raw code products (accumulator layout:
// s[4n + e] = row g + 8(e/2), column 8n + 2t + e%2 = key k0 + key_of_row(column)). tau_qk =
// tau * inv_q * inv_k. MASKED: the diagonal block (keys past the row or past T become -inf).
// Updates m (natural-log units, the max of the dequantized S) and alpha (the factor for O), and
// replaces s by P' = p_scale P. The row sums l come from the PV wgmma (l_add_ones). In two halves:
// softmax_max (the mask, the row maxima, m, alpha and the exponent bias of each row) and
// softmax_exp (P').
template <bool MASKED>
__device__ __forceinline__ void softmax_max(float (&s)[F8_BK / 2], float (&m)[2], float (&alpha)[2],
                                            float (&bias)[2], float tau_qk, float log2_ps, int k0, int row_w0,
                                            int T, int g, int t4) {
    constexpr float LOG2E = 1.4426950408889634f;
    if (MASKED) {
        // Element (n, e) is key k0 + 4 t4 + c (key_of_row, c = 16 (n / 2) + 2 (n % 2) + e % 2, a
        // constant): masked past its row (row_w0 + g + 8 (e / 2)) or past T, i.e. where c exceeds
        // one limit per row. One compare with a constant an element, where the key and row
        // arithmetic per element made ptxas keep 64 predicates in registers and spill.
        int lim[2];
#pragma unroll
        for (int r = 0; r < 2; r++) lim[r] = min(row_w0 + g + 8 * r, T - 1) - k0 - 4 * t4;
#pragma unroll
        for (int n = 0; n < F8_BK / 8; n++)
#pragma unroll
            for (int e = 0; e < 4; e++)
                if (16 * (n >> 1) + 2 * (n & 1) + (e & 1) > lim[e >> 1]) s[4 * n + e] = -INFINITY;
    }
    // The row max on the float bits as integers (quad_row_max_bits: exact wherever the row has a
    // value >= 0); a warp with a row whose 128 values are all negative takes the float path, exact
    // too. Either way m gets the same bits.
    float mx[2];
    int rmax[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        rmax[r] = quad_row_max_bits(s, r);
        mx[r] = __int_as_float(rmax[r]);
    }
    if (__any_sync(0xffffffffu, (rmax[0] | rmax[1]) < 0)) fmax_rows(s, mx);
#pragma unroll
    for (int r = 0; r < 2; r++) {
        // every row sees at least one key of every block it visits (key k0 <= row on the
        // diagonal), so mx is finite and m is finite from block 0 on
        const float mn = fmaxf(m[r], mx[r] * tau_qk);  // the dequantized S of the max, as the emulation rounds it
        const float b_new = fmaf(-mn, LOG2E, log2_ps);
        // alpha = 2^(b_new - b_old) = e^(m_old - m) up to the roundings of the two exponent biases
        // and ex2.approx (~1e-6 relative, like P's own exponent): 2 instructions, no branch (the
        // accurate expf with its -inf test was ~20 and a branch on the path to the exponentials;
        // measured 4-5% of the forward). Block 0 (m_old = -inf, b_old = +inf) gives ex2(-inf) = 0.
        // b_old is the previous block's bias made again from m (one FFMA, the same bits): carrying
        // it would cost two registers through the loop, which has 4 of its 240 to spare.
        alpha[r] = fast_exp2(b_new - fmaf(-m[r], LOG2E, log2_ps));
        m[r] = mn;
        bias[r] = b_new;
    }
}
// P' = 2^(s tau_qk log2(e) + bias) for every element (bias: softmax_max's exponent bias of its row).
template <bool MASKED>
__device__ __forceinline__ void softmax_exp(float (&s)[F8_BK / 2], const float (&bias)[2], float tau_qk) {
    constexpr float LOG2E = 1.4426950408889634f;
    const float c2 = tau_qk * LOG2E;
#pragma unroll
    for (int n = 0; n < F8_BK / 8; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float p = fast_exp2(fmaf(s[4 * n + e], c2, bias[e >> 1]));
            // masked: -inf gives 0 through ex2 too, but not if tau_qk underflowed to 0
            s[4 * n + e] = MASKED && s[4 * n + e] == -INFINITY ? 0.0f : p;
        }
    }
}
template <bool MASKED>
__device__ __forceinline__ void softmax_block(float (&s)[F8_BK / 2], float (&m)[2], float (&alpha)[2], float tau_qk,
                                              float log2_ps, int k0, int row_w0, int T, int g, int t4) {
    float bias[2];
    softmax_max<MASKED>(s, m, alpha, bias, tau_qk, log2_ps, k0, row_w0, T, g, t4);
    softmax_exp<MASKED>(s, bias, tau_qk);
}

// O is carried in the units of the last key block added: U = O / fac_j, fac_j = 1 / (p_scale s_v,j)
// (a power of two). Block j's update is then one FFMA per element,
//   U_j = U_{j-1} * a_j + PV_j,   a_j = alpha_j * (s_v,j / s_v,j-1)   (o_unit_factor),
// instead of O * alpha rounded and then PV * fac added (64 FMUL + 64 FFMA a thread a block): the
// same value with one rounding fewer, since scaling by a power of two is exact. The epilogue
// divides U by l, kept in U's units (l_add_ones). Range: U exceeds p_scale * O by
// the ratio of two V scales of the head, which the quantize pass keeps within 2^80 by clamping V's
// scale exponents to [-40, 40] (ATTN_V_SCALE_MAX_EXP, spec §2): |U| <= 2^8 * T * 448 * 2^80 <
// 2^127 for T <= 2^20. Without the clamp, V blocks ~2^90 apart would overflow U.
// (pv may be longer than o: the kernel's PV has the row sums' columns after O's, l_add_ones)
template <int N, int M>
__device__ __forceinline__ void o_rescale_add(float (&o)[N], const float (&pv)[M], const float (&a)[2]) {
    static_assert(M >= N, "PV holds O's columns first");
#pragma unroll
    for (int i = 0; i < N; i++) o[i] = fmaf(o[i], a[(i >> 1) & 1], pv[i]);
}
// The row sums l, on the tensor cores (spec §3: l sums the quantized P̂): each V̂^T stage has 8
// rows of E4M3 ones after its D rows, so PV (N = D + 8) has in its columns D .. D + 7 the block's
// row sums R of P̂ (P' units, the codes' own sum), and every thread holds its two rows' whole
// sums: no quad sum, and none of the 64 FADD a thread a block that summing P' would take. l is
// kept in U's units, l = l a_j + R s_v,j (sv: the V scale of the
// block being added, a power of two, so the product is exact): l' s_v,last at the end, U's exact
// divisor, O = U / l.
template <int D, int M>
__device__ __forceinline__ void l_add_ones(float (&l)[2], const float (&a)[2], const float (&pv)[M], float sv) {
    static_assert(M == (D + F8_VONES) / 2, "PV with its row-sum columns");
    l[0] = fmaf(l[0], a[0], pv[D / 2] * sv);
    l[1] = fmaf(l[1], a[1], pv[D / 2 + 2] * sv);
}
// a_j of o_rescale_add from block j's alpha and V scale sv and the previous block's 1 / s_v
// (inv_sv_u, which then becomes 1 / sv): alpha * (sv * inv_sv_u). The ratio, one multiply for
// both rows, is an exact power of two within 2^±80 (V's scales lie within 2^±40), so each a_j is
// alpha times it, exact unless a_j itself falls below FP32's normal range; never NaN (alpha = 0,
// block 0's, gives 0 for any finite inv_sv_u).
__device__ __forceinline__ void o_unit_factor(float (&a)[2], const float (&alpha)[2], float sv, float &inv_sv_u) {
    const float ratio = sv * inv_sv_u;
    a[0] = alpha[0] * ratio;
    a[1] = alpha[1] * ratio;
    inv_sv_u = pow2_recip(sv);
}

#endif  // ATTENTION_FWD_FP8_STEP_CUH
