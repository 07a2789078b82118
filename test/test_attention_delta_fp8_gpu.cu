// test_attention_delta_fp8_gpu.cu: fp8_dm's delta pass and the main FP8 backward get P and dP bit
// for bit the same (docs/fp8-attention.md §3, "Computing the matched D"), although they compute
// them in tiles of different shapes: the main kernel's tile_p_dp takes S^T = K̂ Q̂^T and dP^T =
// V̂ dÔ^T with the keys as M (m64n64 wgmmas, a warpgroup per 64 keys), the delta pass's
// delta_issue / delta_p / delta_mask take S = Q̂ K̂^T and dP = dÔ V̂^T with the queries as M
// (m64n128, Q̂ and dÔ as A fragments from registers). Both are the device routines of
// attention/bwd_fp8_tile.cuh that the kernels run.
// One CTA loads one 64-query x 128-key tile of fresh random codes and runs both forms on it:
//   - every P and dP element of the two forms has the same bits (masked ones included);
//   - and both are attention's values: P against exp(tau S - LSE) and dP against dÔ · V̂, in
//     double from the same codes, within the FP8 tensor cores' accumulation error (so that the
//     identity cannot pass on two equally wrong tiles, e.g. all zeros).
// Cases: head dim 64 and 128, dO in E4M3 and E5M2, a tile below the diagonal and one across it
// (keys above the query masked), diffuse and sharp scores, and rows whose LSE lies below their
// largest score (the clamp of P at 1).
#include <math.h>    // exp, log, fabs
#include <stdint.h>  // uint8_t
#include <stdio.h>   // printf, snprintf
#include <vector>    // host tiles

#include "attention/bwd_fp8_tile.cuh"  // tile_p_dp, delta_a_frags, delta_issue, delta_p, delta_mask, sw128
#include "core/fp8.h"                  // fp8_from_f32, fp8_to_f32, fp8_scale_for_amax
#include "gpu_test.h"                  // CU, dnew, dup, back, rng_normal, gpu_test_have_gpu
#include "test.h"                      // CHECK, test_summary

// Shared memory of the test kernel: Q̂, dÔ (64 rows x 128 B), K̂, V̂ (128 rows x 128 B), the 64 LSEs.
#define TS_Q 0
#define TS_DO (64 * 128)
#define TS_K (2 * 64 * 128)
#define TS_V (TS_K + 128 * 128)
#define TS_LSE (TS_V + 128 * 128)
#define TS_BYTES (TS_LSE + 64 * 4 + 1024)

// 256 threads. Outputs: pt_main, dpt_main (128 keys x 64 queries) from tile_p_dp (dP scaled by
// cdp, as the main kernel uses it); p_delta, dp_delta (64 queries x 128 keys) from the delta form
// (its raw dP scaled by the same cdp with one exact product, as its sums are).
template <int D, bool E5>
__global__ void __launch_bounds__(256) pdp_forms_kernel(const uint8_t *q, const uint8_t *k, const uint8_t *v,
                                                        const uint8_t *dob, const float *lse, float cs, float cdp,
                                                        int key0, int q0, int T, float *pt_main, float *dpt_main,
                                                        float *p_delta, float *dp_delta) {
    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint8_t *sm = smem_align1024(smem_raw);
    float *sLse = reinterpret_cast<float *>(sm + TS_LSE);
    const int tid = threadIdx.x, wg = tid / 128, warp = (tid % 128) / 32, lane = tid % 32, g = lane / 4, t4 = lane % 4;
    for (int c = tid; c < 64 * (D / 16); c += 256) {  // 16-byte chunks of the 64-row tiles
        const int r = c / (D / 16), ch = c % (D / 16);
        *reinterpret_cast<uint4 *>(sm + TS_Q + sw128(r, ch * 16)) = *reinterpret_cast<const uint4 *>(q + r * D + ch * 16);
        *reinterpret_cast<uint4 *>(sm + TS_DO + sw128(r, ch * 16)) = *reinterpret_cast<const uint4 *>(dob + r * D + ch * 16);
    }
    for (int c = tid; c < 128 * (D / 16); c += 256) {
        const int r = c / (D / 16), ch = c % (D / 16);
        *reinterpret_cast<uint4 *>(sm + TS_K + sw128(r, ch * 16)) = *reinterpret_cast<const uint4 *>(k + r * D + ch * 16);
        *reinterpret_cast<uint4 *>(sm + TS_V + sw128(r, ch * 16)) = *reinterpret_cast<const uint4 *>(v + r * D + ch * 16);
    }
    if (tid < 64) sLse[tid] = lse[tid];
    fence_proxy_async();  // generic-proxy stores -> the wgmmas' reads
    __syncthreads();
    const uint32_t base = kmajor_desc_lo(smem_addr(sm));

    // the main kernel's form: warpgroup wg takes keys key0 + 64 wg .. + 63
    {
        float p[32], dp[32];
        tile_p_dp<D, E5>(base + (TS_K + wg * 64 * 128) / 16, base + (TS_V + wg * 64 * 128) / 16, base + TS_Q / 16,
                         base + TS_DO / 16, sLse, cs, cdp, key0 + 64 * wg, q0, T, p, dp);
#pragma unroll
        for (int i = 0; i < 32; i++) {
            const int key = wg * 64 + warp * 16 + g + 8 * ((i & 3) >> 1), qr = 8 * (i >> 2) + 2 * t4 + (i & 1);
            pt_main[key * 64 + qr] = p[i];
            dpt_main[key * 64 + qr] = dp[i];
        }
    }
    __syncthreads();
    // the delta pass's form: warpgroup 0 takes the 64 queries against all 128 keys
    if (wg == 0) {
        float s[64], dp[64];
        const int row = warp * 16 + g;  // this thread's first query row of the tile
        const float nl[2] = {__fmul_rn(sLse[row], -1.4426950408889634f), __fmul_rn(sLse[row + 8], -1.4426950408889634f)};
        uint32_t aq[D / 32][4], ado[D / 32][4];  // Q̂, dÔ as A fragments (registers), as the pass takes them
        delta_a_frags<D / 32>(aq, sm + TS_Q);
        delta_a_frags<D / 32>(ado, sm + TS_DO);
        delta_issue<D, E5>(s, dp, aq, ado, base + TS_K / 16, base + TS_V / 16);
        delta_p(s, dp, cs, nl);
        delta_mask(s, dp, key0 + 2 * t4 - (q0 + row));
#pragma unroll
        for (int i = 0; i < 64; i++) {
            const int qr = row + 8 * ((i >> 1) & 1), key = 8 * (i >> 2) + 2 * t4 + (i & 1);
            p_delta[qr * 128 + key] = s[i];
            dp_delta[qr * 128 + key] = __fmul_rn(dp[i], cdp);
        }
    }
}

// n rows of d values N(0, 1) times a per-row magnitude 2^U(-spread, spread), quantized with one
// power-of-two scale for the tile (fp8_scale_for_amax, as the quantize kernel's block scale).
static std::vector<uint8_t> random_codes(int n, int d, Fp8Format f, double spread, float *scale) {
    std::vector<float> x((size_t)n * d);
    float amax = 0.f;
    for (int r = 0; r < n; r++) {
        const double mag = exp2(spread * (2.0 * rng_uniform() - 1.0));
        for (int c = 0; c < d; c++) {
            x[(size_t)r * d + c] = (float)(mag * rng_normal());
            amax = fmaxf(amax, fabsf(x[(size_t)r * d + c]));
        }
    }
    *scale = fp8_scale_for_amax(f, amax);
    std::vector<uint8_t> codes(x.size());
    for (size_t i = 0; i < x.size(); i++) codes[i] = fp8_from_f32(f, x[i] * *scale);
    return codes;
}

struct Case {
    int d;
    bool e5;
    int key0, q0;   // the tile's first key and first query (T = 512)
    double qk_mag;  // spread of the Q, K row magnitudes (log2): sharp scores when large
    bool clamp;     // every 4th row's LSE below its largest score
};

template <int D, bool E5>
static void launch_forms(const Case &c, const uint8_t *q, const uint8_t *k, const uint8_t *v, const uint8_t *dob,
                         const float *lse, float cs, float cdp, float *o[4]) {
    CU(cudaFuncSetAttribute(pdp_forms_kernel<D, E5>, cudaFuncAttributeMaxDynamicSharedMemorySize, TS_BYTES));
    pdp_forms_kernel<D, E5><<<1, 256, TS_BYTES>>>(q, k, v, dob, lse, cs, cdp, c.key0, c.q0, 512, o[0], o[1], o[2], o[3]);
    CU(cudaGetLastError());
}

static void run_case(const Case &c, int idx) {
    const int d = c.d;
    const Fp8Format gf = c.e5 ? FP8_E5M2 : FP8_E4M3;
    rng_state = 0x5EED0000ull + 977 * (uint64_t)idx;
    float sq, sk, sv, sdo;
    std::vector<uint8_t> q = random_codes(64, d, FP8_E4M3, c.qk_mag, &sq), k = random_codes(128, d, FP8_E4M3, c.qk_mag, &sk),
                         v = random_codes(128, d, FP8_E4M3, 1.0, &sv), dob = random_codes(64, d, gf, 1.0, &sdo);
    const double tau = 1.0 / sqrt((double)d);
    // the kernels' constants, rounded as pdp_s_scale / pdp_dp_scale round them
    const float cs = (1.0f / sq * (1.0f / sk)) * ((float)tau * 1.4426950408889634f), cdp = 1.0f / sdo * (1.0f / sv);
    // S, dP and LSE in double from the codes; keys above the query are masked
    std::vector<double> S(64 * 128), dP(64 * 128), Sabs(64 * 128), dPabs(64 * 128);
    std::vector<float> lse(64);
    for (int r = 0; r < 64; r++) {
        double mx = -1e300;
        for (int j = 0; j < 128; j++) {
            double s = 0, sa = 0, p = 0, pa = 0;
            for (int x = 0; x < d; x++) {
                const double qx = fp8_to_f32(FP8_E4M3, q[r * d + x]), kx = fp8_to_f32(FP8_E4M3, k[j * d + x]);
                const double ox = fp8_to_f32(gf, dob[r * d + x]), vx = fp8_to_f32(FP8_E4M3, v[j * d + x]);
                s += qx * kx;
                sa += fabs(qx * kx);
                p += ox * vx;
                pa += fabs(ox * vx);
            }
            S[r * 128 + j] = s * tau / ((double)sq * sk);
            Sabs[r * 128 + j] = sa * tau / ((double)sq * sk);
            dP[r * 128 + j] = p / ((double)sdo * sv);
            dPabs[r * 128 + j] = pa / ((double)sdo * sv);
            if (c.key0 + j <= c.q0 + r && S[r * 128 + j] > mx) mx = S[r * 128 + j];
        }
        double sum = 0;
        for (int j = 0; j < 128; j++)
            if (c.key0 + j <= c.q0 + r) sum += exp(S[r * 128 + j] - mx);
        // the other key blocks' mass, or (clamp) an LSE below the row's largest score
        lse[r] = (float)(c.clamp && r % 4 == 0 ? mx - 0.75 : mx + log(sum + 3.0 * rng_uniform()));
    }
    uint8_t *dq = dup(q), *dk = dup(k), *dv = dup(v), *ddo = dup(dob);
    float *dl = dup(lse);
    float *o[4] = {dnew<float>(128 * 64), dnew<float>(128 * 64), dnew<float>(64 * 128), dnew<float>(64 * 128)};
    if (d == 64) {
        if (c.e5) launch_forms<64, true>(c, dq, dk, dv, ddo, dl, cs, cdp, o);
        else launch_forms<64, false>(c, dq, dk, dv, ddo, dl, cs, cdp, o);
    } else {
        if (c.e5) launch_forms<128, true>(c, dq, dk, dv, ddo, dl, cs, cdp, o);
        else launch_forms<128, false>(c, dq, dk, dv, ddo, dl, cs, cdp, o);
    }
    std::vector<float> pt = back(o[0], 128 * 64), dpt = back(o[1], 128 * 64), pd = back(o[2], 64 * 128),
                       dpd = back(o[3], 64 * 128);
    long diff_p = 0, diff_dp = 0, masked = 0, bad_p = 0, bad_dp = 0, mid = 0, clamped = 0;
    int first_r = -1, first_j = -1;
    double worst_p = 0, worst_dp = 0;
    for (int r = 0; r < 64; r++)
        for (int j = 0; j < 128; j++) {
            const float a = pt[j * 64 + r], b = pd[r * 128 + j], da = dpt[j * 64 + r], db = dpd[r * 128 + j];
            const bool dp_same = fp8_f32_bits(da) == fp8_f32_bits(db), p_same = fp8_f32_bits(a) == fp8_f32_bits(b);
            diff_p += !p_same;
            diff_dp += !dp_same;
            if ((!p_same || !dp_same) && first_r < 0) { first_r = r; first_j = j; }
            if (c.key0 + j > c.q0 + r) {  // masked: both forms give 0
                masked++;
                bad_p += b != 0.f;
                bad_dp += db != 0.f;
                continue;
            }
            // attention's values, within the FP8 accumulation error (~2^-11 of the sum of |terms|)
            const double arg = S[r * 128 + j] - lse[r], tol_s = 2e-3 * Sabs[r * 128 + j] + 1e-5;
            const double ref_p = exp(fmin(arg, 0.0));
            if (arg > 0) clamped++;
            if (b > 1e-30f && b < 1.f) mid++;
            const double ep = ref_p > 1e-30 ? fabs(log(b > 0 ? (double)b : 1e-300) - log(ref_p)) : 0;
            if (ref_p > 1e-30 && ref_p < 1e30 && arg > -80 && ep > tol_s) bad_p++;
            if (ref_p > 1e-30 && arg > -80) worst_p = fmax(worst_p, ep / tol_s);
            const double edp = fabs(db - dP[r * 128 + j]), tol_dp = 2e-3 * dPabs[r * 128 + j] + 1e-30;
            bad_dp += edp > tol_dp;
            worst_dp = fmax(worst_dp, edp / tol_dp);
        }
    char tag[160], name[256];
    snprintf(tag, sizeof tag, "d %d, dO %s, keys %d.., queries %d.., %s%s", d, c.e5 ? "E5M2" : "E4M3", c.key0, c.q0,
             c.qk_mag > 2 ? "sharp" : "diffuse", c.clamp ? ", LSE below the max" : "");
    printf("#   %s: %ld masked, %ld with 0 < P < 1, %ld clamped; P err %.2f, dP err %.2f of the tolerance\n", tag, masked,
           mid, clamped, worst_p, worst_dp);
    snprintf(name, sizeof name, "delta form's P bit for bit the main kernel's: %s", tag);
    CHECK(diff_p == 0, name, "%ld of 8192 differ, first at query %d key %d", diff_p, first_r, first_j);
    snprintf(name, sizeof name, "delta form's dP bit for bit the main kernel's: %s", tag);
    CHECK(diff_dp == 0, name, "%ld of 8192 differ, first at query %d key %d", diff_dp, first_r, first_j);
    snprintf(name, sizeof name, "both forms' P and dP are attention's (vs FP64 from the codes, masked = 0): %s", tag);
    CHECK(bad_p == 0 && bad_dp == 0 && mid > 256, name, "%ld P and %ld dP outside, %ld values strictly in (0, 1)", bad_p,
          bad_dp, mid);
    if (c.clamp) {
        snprintf(name, sizeof name, "the clamp P <= 1 is exercised: %s", tag);
        CHECK(clamped > 0, name, "no argument above 0");
    }
    for (int i = 0; i < 4; i++) cudaFree(o[i]);
    cudaFree(dq); cudaFree(dk); cudaFree(dv); cudaFree(ddo); cudaFree(dl);
}

int main(void) {
    if (!gpu_test_have_gpu("test_attention_delta_fp8_gpu")) return 0;
    const Case cases[] = {
        {128, false, 0, 256, 1.0, false}, {128, true, 0, 256, 1.0, false},  {128, false, 128, 192, 1.0, false},
        {128, true, 128, 192, 3.0, true}, {128, false, 0, 128, 3.0, true},  {64, false, 0, 256, 1.0, false},
        {64, true, 128, 192, 1.0, false}, {64, true, 0, 256, 3.0, true},    {64, false, 256, 256, 1.0, true},
    };
    int idx = 0;
    for (const Case &c : cases) run_case(c, idx++);
    return test_summary("test_attention_delta_fp8_gpu");
}
