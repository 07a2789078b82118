// test_fp8.cu: fp8.h against CUDA's own conversions (cuda_fp8.h, cuda_bf16.h), run on the host.
// nvcc compiles this as a host program; no GPU is needed. The reference is
// __nv_cvt_float_to_fp8(x, __NV_SATFINITE, fmt), the conversion the GPU kernels use.
//
// Coverage: a strided sweep of all 2^32 float patterns (odd stride, so every low-bit pattern
// class shows up), plus, for every float exponent that matters to FP8 (below the smallest
// subnormal up to past the max), every combination of the top 12 mantissa bits (which holds
// each rounding position of both formats, normal and subnormal) with low-bit tails that make
// exact ties, just-below and just-above ties; plus +-0, +-inf, NaNs with many payloads, the
// saturation threshold. Then the 256 decodes of each format and the scale rule.
#include <cuda_bf16.h>  // __float2bfloat16_rn, the BF16 reference
#include <cuda_fp8.h>   // __nv_cvt_float_to_fp8, __nv_cvt_fp8_to_halfraw, the FP8 reference
#include <cuda_fp16.h>  // __half2float for decoding the reference's half result

#include <math.h>    // isnan, ldexp
#include <stdint.h>  // uint32_t
#include <string.h>  // memcpy

#include "core/fp8.h"  // the code under test
#include "test.h"      // CHECK, test_summary

static float f_of(uint32_t u) { float f; memcpy(&f, &u, 4); return f; }
static uint32_t u_of(float f) { uint32_t u; memcpy(&u, &f, 4); return u; }

static uint8_t cuda_enc(Fp8Format f, float x) {
    return (uint8_t)__nv_cvt_float_to_fp8(x, __NV_SATFINITE, f == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
}
static float cuda_dec(Fp8Format f, uint8_t q) {
    __half_raw h = __nv_cvt_fp8_to_halfraw((__nv_fp8_storage_t)q, f == FP8_E4M3 ? __NV_E4M3 : __NV_E5M2);
    return __half2float(__half(h));
}
static uint16_t cuda_bf16(float x) {
    __nv_bfloat16 b = __float2bfloat16_rn(x);
    __nv_bfloat16_raw r = b;
    return r.x;
}

// Running tallies for one kind of comparison.
typedef struct {
    long long n, bad;
    uint32_t first_bad;  // an input that disagreed, for the failure message
} Tally;

static void check_enc(Tally *t, Fp8Format f, uint32_t u) {
    float x = f_of(u);
    t->n++;
    if (fp8_from_f32(f, x) != cuda_enc(f, x)) {
        if (!t->bad) t->first_bad = u;
        t->bad++;
    }
}
static void check_bf16(Tally *t, uint32_t u) {
    float x = f_of(u);
    t->n++;
    if (bf16_from_f32(x) != cuda_bf16(x)) {
        if (!t->bad) t->first_bad = u;
        t->bad++;
    }
}

static void report(const char *name, const Tally *t, Fp8Format f, int is_bf16) {
    char msg[256];
    if (t->bad) {
        float x = f_of(t->first_bad);
        if (is_bf16)
            snprintf(msg, sizeof msg, "%lld of %lld differ; e.g. 0x%08x (%g): ours 0x%04x, CUDA 0x%04x",
                     t->bad, t->n, t->first_bad, x, bf16_from_f32(x), cuda_bf16(x));
        else
            snprintf(msg, sizeof msg, "%lld of %lld differ; e.g. 0x%08x (%g): ours 0x%02x, CUDA 0x%02x",
                     t->bad, t->n, t->first_bad, x, fp8_from_f32(f, x), cuda_enc(f, x));
    }
    CHECK(t->bad == 0, name, "%s", msg);
    printf("#   %s: %lld patterns compared\n", name, t->n);
}

// Float patterns around every rounding decision of FP8: for each exponent field in
// [exp_lo, exp_hi] and both signs, every top-12-bit mantissa prefix with these 11-bit tails.
static const uint32_t k_tails[] = {0x000, 0x001, 0x002, 0x3FF, 0x400, 0x401, 0x7FE, 0x7FF,
                                   0x155, 0x2AA, 0x5A5};
#define N_TAILS (sizeof k_tails / sizeof k_tails[0])

static void sweep_dense(Tally *t, Fp8Format f, int exp_lo, int exp_hi) {
    for (uint32_t sign = 0; sign < 2; sign++)
        for (int e = exp_lo; e <= exp_hi; e++)
            for (uint32_t top = 0; top < 4096; top++)
                for (size_t k = 0; k < N_TAILS; k++)
                    check_enc(t, f, (sign << 31) | ((uint32_t)(e + 127) << 23) | (top << 11) | k_tails[k]);
}

int main(void) {
    const Fp8Format fmts[2] = {FP8_E4M3, FP8_E5M2};
    const char *fname[2] = {"e4m3", "e5m2"};

    // 1. Encoders.
    for (int fi = 0; fi < 2; fi++) {
        Fp8Format f = fmts[fi];
        char name[96];

        Tally strided = {0, 0, 0};
        // 2^32 / 409 ~ 10.5M patterns; 409 is prime, so every residue of the low bits appears.
        for (uint64_t u = 0; u < (1ull << 32); u += 409) check_enc(&strided, f, (uint32_t)u);
        snprintf(name, sizeof name, "%s encode: strided sweep of all float patterns", fname[fi]);
        report(name, &strided, f, 0);

        Tally dense = {0, 0, 0};
        // E4M3: smallest subnormal 2^-9, max 2^8 * 1.75; E5M2: 2^-16 and 2^15 * 1.75. Start a
        // few exponents below half the smallest subnormal, end past the saturation threshold.
        if (f == FP8_E4M3) sweep_dense(&dense, f, -13, 10);
        else sweep_dense(&dense, f, -20, 17);
        snprintf(name, sizeof name, "%s encode: every rounding position, ties and neighbours", fname[fi]);
        report(name, &dense, f, 0);

        Tally special = {0, 0, 0};
        const float fmax = fp8_max(f);
        uint32_t edges[] = {0x00000000u, 0x80000000u, 0x7F800000u, 0xFF800000u, 0x00000001u, 0x80000001u,
                            0x007FFFFFu, 0x00800000u, 0x7F7FFFFFu, 0xFF7FFFFFu, u_of(fmax), u_of(-fmax),
                            u_of(fmax) + 1, u_of(fmax) - 1, u_of(f == FP8_E4M3 ? 464.0f : 61440.0f),
                            u_of(f == FP8_E4M3 ? 464.0f : 61440.0f) - 1, u_of(f == FP8_E4M3 ? 464.0f : 61440.0f) + 1,
                            u_of(f == FP8_E4M3 ? 480.0f : 65536.0f)};
        for (size_t i = 0; i < sizeof edges / sizeof edges[0]; i++) {
            check_enc(&special, f, edges[i]);
            check_enc(&special, f, edges[i] ^ 0x80000000u);
        }
        // NaNs: quiet and signalling, many payloads, both signs.
        for (uint32_t p = 1; p < (1u << 23); p = p * 3 + 1) {
            check_enc(&special, f, 0x7F800000u | p);
            check_enc(&special, f, 0xFF800000u | p);
            check_enc(&special, f, 0x7F800000u | (p & 0x3FFFFFu) | 0x400000u);
        }
        snprintf(name, sizeof name, "%s encode: zeros, infinities, NaN payloads, max and saturation edges", fname[fi]);
        report(name, &special, f, 0);

        // 2. Decoders: all 256 codes.
        int bad = 0, first = -1;
        for (int q = 0; q < 256; q++) {
            float ours = fp8_to_f32(f, (uint8_t)q), ref = cuda_dec(f, (uint8_t)q);
            int same = (isnan(ours) && isnan(ref)) || (!isnan(ours) && !isnan(ref) && u_of(ours) == u_of(ref));
            if (!same) { bad++; if (first < 0) first = q; }
        }
        snprintf(name, sizeof name, "%s decode: all 256 codes equal CUDA's", fname[fi]);
        CHECK(bad == 0, name, "%d codes differ, first 0x%02x: ours %g CUDA %g", bad, first,
              first >= 0 ? fp8_to_f32(f, (uint8_t)first) : 0.0f, first >= 0 ? cuda_dec(f, (uint8_t)first) : 0.0f);

        // Round trip: every finite code decodes to a value that encodes back to itself.
        bad = 0;
        for (int q = 0; q < 256; q++) {
            float v = fp8_to_f32(f, (uint8_t)q);
            if (isnan(v) || isinf(v)) continue;
            if (fp8_from_f32(f, v) != q) bad++;
        }
        snprintf(name, sizeof name, "%s: encode(decode(q)) == q for every finite code", fname[fi]);
        CHECK(bad == 0, name, "%d codes do not round-trip", bad);

        // 3. Scale rule on many amax values: random positive finite floats, powers of two and
        // their neighbours, values around FMAX and its multiples.
        long long n = 0, not_pow2 = 0, overflow = 0, not_tight = 0;
        uint32_t rng = 12345u;
        uint32_t bad_amax = 0;
        for (int i = 0; i < 400000; i++) {
            uint32_t ua;
            if (i < 254 * 3) {  // every power of two, and one ulp either side
                ua = ((uint32_t)(i / 3 + 1) << 23) + (uint32_t)(i % 3) - 1u;
                if (i % 3 == 0 && i / 3 == 0) ua = 1;  // smallest subnormal instead of 0x7FFFFF..
            } else if (i < 254 * 3 + 2000) {  // FMAX * 2^k and neighbours
                int k = (i - 254 * 3) / 3 - 300;
                float v = (float)ldexp((double)fmax, k);
                if (v == 0.0f || isinf(v)) continue;
                ua = u_of(v) + (uint32_t)((i % 3) - 1);
                if (ua == 0) continue;
            } else {
                rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5;
                ua = rng & 0x7FFFFFFFu;
                if (ua >= 0x7F800000u || ua == 0) continue;
            }
            float amax = f_of(ua), s = fp8_scale_for_amax(f, amax);
            uint32_t us = u_of(s);
            n++;
            if ((us & 0x7FFFFFu) || us < 0x00800000u || us >= 0x7F800000u) { not_pow2++; bad_amax = ua; continue; }
            double prod = (double)amax * (double)s;  // exact in double
            if (prod > fmax) { overflow++; bad_amax = ua; }
            int clamped = s == ldexpf(1.0f, FP8_SCALE_MAX_EXP) || s == ldexpf(1.0f, -FP8_SCALE_MAX_EXP);
            if (!clamped && 2.0 * prod <= fmax) { not_tight++; bad_amax = ua; }
        }
        snprintf(name, sizeof name, "%s scale: power of two, amax*s <= FMAX < 2*amax*s on %lld amax values", fname[fi], n);
        CHECK(not_pow2 == 0 && overflow == 0 && not_tight == 0, name,
              "not a normal power of two: %lld, overflow: %lld, not the largest: %lld (e.g. amax 0x%08x -> s %g)",
              not_pow2, overflow, not_tight, bad_amax, fp8_scale_for_amax(f, f_of(bad_amax)));
        snprintf(name, sizeof name, "%s scale: s = 1 for amax 0, inf, NaN; |amax| used for negative", fname[fi]);
        CHECK(fp8_scale_for_amax(f, 0.0f) == 1.0f && fp8_scale_for_amax(f, -0.0f) == 1.0f &&
                  fp8_scale_for_amax(f, f_of(0x7F800000u)) == 1.0f && fp8_scale_for_amax(f, f_of(0x7FC00000u)) == 1.0f &&
                  fp8_scale_for_amax(f, -3.0f) == fp8_scale_for_amax(f, 3.0f),
              name, "s(0)=%g s(inf)=%g s(nan)=%g", fp8_scale_for_amax(f, 0.0f), fp8_scale_for_amax(f, f_of(0x7F800000u)),
              fp8_scale_for_amax(f, f_of(0x7FC00000u)));
        snprintf(name, sizeof name, "%s scale: known values", fname[fi]);
        if (f == FP8_E4M3)
            CHECK(fp8_scale_for_amax(f, 1.0f) == 256.0f && fp8_scale_for_amax(f, 448.0f) == 1.0f &&
                      fp8_scale_for_amax(f, 449.0f) == 0.5f && fp8_scale_for_amax(f, 1.75f) == 256.0f &&
                      fp8_scale_for_amax(f, 1.7500001f) == 128.0f && fp8_scale_for_amax(f, 1e-38f) == ldexpf(1.0f, 126),
                  name, "s(1)=%g s(448)=%g s(449)=%g", fp8_scale_for_amax(f, 1.0f), fp8_scale_for_amax(f, 448.0f),
                  fp8_scale_for_amax(f, 449.0f));
        else
            CHECK(fp8_scale_for_amax(f, 1.0f) == 32768.0f && fp8_scale_for_amax(f, 57344.0f) == 1.0f &&
                      fp8_scale_for_amax(f, 60000.0f) == 0.5f && fp8_scale_for_amax(f, 3.4e38f) == ldexpf(1.0f, -113),
                  name, "s(1)=%g s(57344)=%g s(60000)=%g", fp8_scale_for_amax(f, 1.0f),
                  fp8_scale_for_amax(f, 57344.0f), fp8_scale_for_amax(f, 60000.0f));
    }

    // 3b. The scale with a narrower exponent bound (attention's V: ATTN_V_SCALE_MAX_EXP = 40): the
    // default's value clamped to [2^-max_exp, 2^max_exp], and the default itself at 126.
    {
        long long n = 0, bad = 0;
        uint32_t rng = 0x5CA1Eu, bad_amax = 0;
        for (int i = 0; i < 200000; i++) {
            rng ^= rng << 13; rng ^= rng >> 17; rng ^= rng << 5;
            const uint32_t ua = rng & 0x7FFFFFFFu;
            if (ua >= 0x7F800000u || ua == 0) continue;
            n++;
            const int me[3] = {1, 40, 126};
            for (int f = 0; f < 2; f++)
                for (int k = 0; k < 3; k++) {
                    const Fp8Format fmt = f ? FP8_E5M2 : FP8_E4M3;
                    const float s = fp8_scale_for_amax(fmt, f_of(ua)), lo = ldexpf(1.0f, -me[k]), hi = ldexpf(1.0f, me[k]);
                    const float want = s < lo ? lo : s > hi ? hi : s;
                    if (fp8_scale_for_amax_within(fmt, f_of(ua), me[k]) != want) { bad++; bad_amax = ua; }
                }
        }
        CHECK(bad == 0 && fp8_scale_for_amax_within(FP8_E4M3, 0.0f, 40) == 1.0f &&
                  fp8_scale_for_amax_within(FP8_E4M3, 1e-30f, 40) == ldexpf(1.0f, 40) &&
                  fp8_scale_for_amax_within(FP8_E4M3, 1e30f, 40) == ldexpf(1.0f, -40),
              "scale within 2^+-max_exp (1, 40, 126): the default's scale clamped, on random amax values",
              "%lld of %lld differ (e.g. amax 0x%08x)", bad, n, bad_amax);
    }

    // 4. BF16.
    Tally b = {0, 0, 0};
    for (uint64_t u = 0; u < (1ull << 32); u += 409) check_bf16(&b, (uint32_t)u);
    const uint32_t tails[] = {0x0000, 0x0001, 0x7FFF, 0x8000, 0x8001, 0xFFFF};
    for (uint32_t hi = 0; hi < 65536; hi++)
        for (size_t k = 0; k < sizeof tails / sizeof tails[0]; k++) check_bf16(&b, (hi << 16) | tails[k]);
    report("bf16 encode: strided sweep plus every upper half with tie tails", &b, FP8_E4M3, 1);
    int bad = 0;
    for (uint32_t h = 0; h < 65536; h++) {
        float x = bf16_to_f32((uint16_t)h);
        __nv_bfloat16_raw r; r.x = (unsigned short)h;
        float ref = __bfloat162float(__nv_bfloat16(r));
        if (!((isnan(x) && isnan(ref)) || u_of(x) == u_of(ref))) bad++;
    }
    CHECK(bad == 0, "bf16 decode: all 65536 codes equal CUDA's", "%d differ", bad);

    // 5. fp8_qdq with a block scale is idempotent and exact on the dequantized grid.
    bad = 0;
    for (int i = 0; i < 100000; i++) {
        float x = (float)ldexp((double)((i * 2654435761u) % 100000u) / 1000.0 - 50.0, (i % 20) - 10);
        float s = fp8_scale_for_amax(FP8_E4M3, fabsf(x));
        float xh = fp8_qdq(FP8_E4M3, x, s);
        if (fp8_qdq(FP8_E4M3, xh, s) != xh || fp8_round(FP8_E4M3, xh * s) != xh * s) bad++;
    }
    CHECK(bad == 0, "e4m3 qdq: quantize-dequantize is idempotent and x_hat*s is an FP8 value", "%d failures", bad);

    return test_summary("test_fp8");
}
