// fp8.h: FP8 (E4M3 "fn" and E5M2) and BF16 conversions and the power-of-two scale rule,
// usable from host C, host C++ and CUDA device code (docs/fp8-attention.md §2).
//
// Conversion from FP32 is round-to-nearest-even with saturation to the largest finite value
// (CUDA's __NV_SATFINITE): every value whose rounding would exceed the max, +-inf included,
// becomes +-max. NaN becomes 0x7F in both formats, sign dropped, exactly as CUDA's
// __nv_cvt_float_to_fp8 does (it canonicalises NaN to 0x7FFFFFFF before converting). Zeros keep
// their sign; FP8 subnormals are rounded like everything else (RNE on the exact value).
// The encoders use only integer operations on the float's bits (no libm, no FP rounding mode),
// and test/test_fp8.cu checks them bit for bit against cuda_fp8.h over > 10^7 float patterns.
#ifndef FP8_H
#define FP8_H

#include <stdint.h>  // uint8_t, uint16_t, uint32_t

#if defined(__CUDACC__)
#define FP8_FN static inline __host__ __device__
#else
#define FP8_FN static inline
#endif

#define FP8_E4M3_MAX 448.0f
#define FP8_E5M2_MAX 57344.0f

typedef enum { FP8_E4M3 = 0, FP8_E5M2 = 1 } Fp8Format;

// --- bit-level helpers -----------------------------------------------------------------------
FP8_FN uint32_t fp8_f32_bits(float x) { union { float f; uint32_t u; } v; v.f = x; return v.u; }
FP8_FN float fp8_bits_f32(uint32_t u) { union { float f; uint32_t u; } v; v.u = u; return v.f; }

#define FP8_NAN_CODE 0x7Fu             // what CUDA's host and device conversions return for NaN
#define FP8_F32_QNAN_BITS 0x7FFFFFFFu  // the float NaN our decoders return

// Generic FP32 -> FP8 encoder: mbits mantissa bits, exponent bias `bias`, largest finite code
// `maxcode` (E4M3: 3, 7, 0x7E; E5M2: 2, 15, 0x7B). RNE, satfinite, NaN -> 0x7F.
FP8_FN uint8_t fp8_encode(float x, int mbits, int bias, uint32_t maxcode) {
    uint32_t u = fp8_f32_bits(x);
    uint32_t sign = (u >> 24) & 0x80u;
    uint32_t a = u & 0x7FFFFFFFu;  // |x| as bits; ordered like the values
    if (a > 0x7F800000u) return (uint8_t)FP8_NAN_CODE;
    int e = (int)(a >> 23) - 127;  // unbiased exponent of x (float zero/subnormal: -127)
    int emin = 1 - bias;           // exponent of the smallest FP8 normal
    uint32_t code;
    if (e >= emin) {
        // Normal in FP8: round the float's own bits to mbits mantissa bits (RNE). A carry out of
        // the mantissa bumps the exponent, which is exactly right. inf/huge -> code > maxcode.
        int drop = 23 - mbits;
        uint32_t rounded = a + ((1u << (drop - 1)) - 1u) + ((a >> drop) & 1u);
        code = (rounded >> drop) - ((uint32_t)(127 - bias) << mbits);
        if (code > maxcode) code = maxcode;  // satfinite (also +-inf)
    } else {
        // FP8 subnormal (or zero): count x in units of the smallest subnormal 2^(emin-mbits).
        // x = mant * 2^(e-23), so the unit count is mant >> drop with drop >= 24 - mbits.
        uint32_t mant = (a & 0x7FFFFFu) | 0x800000u;
        int drop = (23 - mbits) + (emin - e);
        if (drop > 25) {
            code = 0;  // |x| < quantum/4: rounds to zero (also float zeros and subnormals)
        } else {
            uint32_t q = mant >> drop;
            uint32_t rest = mant & ((1u << drop) - 1u);
            uint32_t half = 1u << (drop - 1);
            if (rest > half || (rest == half && (q & 1u))) q++;
            code = q;  // q == 2^mbits is the smallest normal: the encoding carries over by itself
        }
    }
    return (uint8_t)(sign | code);
}

FP8_FN uint8_t fp8_e4m3_from_f32(float x) { return fp8_encode(x, 3, 7, 0x7Eu); }
FP8_FN uint8_t fp8_e5m2_from_f32(float x) { return fp8_encode(x, 2, 15, 0x7Bu); }

// E4M3 "fn": no infinities; S.1111.111 is NaN. Subnormals are m * 2^-9 (exact in float).
FP8_FN float fp8_e4m3_to_f32(uint8_t q) {
    uint32_t sign = (uint32_t)(q & 0x80u) << 24;
    uint32_t exp = (q >> 3) & 0xFu, man = q & 0x7u;
    if ((q & 0x7Fu) == 0x7Fu) return fp8_bits_f32(FP8_F32_QNAN_BITS);
    if (exp == 0) return fp8_bits_f32(sign | fp8_f32_bits((float)man * 0.001953125f));  // 2^-9
    return fp8_bits_f32(sign | ((exp - 7u + 127u) << 23) | (man << 20));
}

// E5M2: IEEE-like; exponent 31 is inf (mantissa 0) or NaN. Subnormals are m * 2^-16.
FP8_FN float fp8_e5m2_to_f32(uint8_t q) {
    uint32_t sign = (uint32_t)(q & 0x80u) << 24;
    uint32_t exp = (q >> 2) & 0x1Fu, man = q & 0x3u;
    if (exp == 31u) return man ? fp8_bits_f32(FP8_F32_QNAN_BITS) : fp8_bits_f32(sign | 0x7F800000u);
    if (exp == 0) return fp8_bits_f32(sign | fp8_f32_bits((float)man * 1.52587890625e-05f));  // 2^-16
    return fp8_bits_f32(sign | ((exp - 15u + 127u) << 23) | (man << 21));
}

FP8_FN uint8_t fp8_from_f32(Fp8Format f, float x) {
    return f == FP8_E4M3 ? fp8_e4m3_from_f32(x) : fp8_e5m2_from_f32(x);
}
FP8_FN float fp8_to_f32(Fp8Format f, uint8_t q) {
    return f == FP8_E4M3 ? fp8_e4m3_to_f32(q) : fp8_e5m2_to_f32(q);
}
// decode(encode(x)): the value FP8 keeps of x.
FP8_FN float fp8_round(Fp8Format f, float x) { return fp8_to_f32(f, fp8_from_f32(f, x)); }
FP8_FN float fp8_max(Fp8Format f) { return f == FP8_E4M3 ? FP8_E4M3_MAX : FP8_E5M2_MAX; }

// --- BF16 -------------------------------------------------------------------------------------
// RNE; overflow rounds to inf (as __float2bfloat16_rn); NaN -> 0x7FFF (CUDA's canonical NaN).
FP8_FN uint16_t bf16_from_f32(float x) {
    uint32_t u = fp8_f32_bits(x);
    if ((u & 0x7FFFFFFFu) > 0x7F800000u) return (uint16_t)0x7FFFu;
    return (uint16_t)((u + 0x7FFFu + ((u >> 16) & 1u)) >> 16);
}
FP8_FN float bf16_to_f32(uint16_t h) { return fp8_bits_f32((uint32_t)h << 16); }
FP8_FN float bf16_round(float x) { return bf16_to_f32(bf16_from_f32(x)); }

// --- scales (power of two) --------------------------------------------------------------------
// s = 2^floor(log2(FMAX / amax)), computed exactly from the bits (no division, no libm):
// with amax = 1.m * 2^ea and FMAX = 1.75 * 2^emax, FMAX/amax lies in [1, 2) * 2^(emax-ea) when
// 1.m <= 1.75 and in [0.5, 1) * 2^(emax-ea) otherwise. s = 1 when amax is 0, inf or NaN (the
// sign of amax is ignored). The exponent is clamped to [-126, 126] so that s and 1/s are both
// finite normal floats: a tiny amax (< ~2^-118) gets s = 2^126 and simply uses less of the FP8
// range; no finite amax can need an exponent below -126 (FLT_MAX * 2^-113 < 448 already).
// Quantize q = fp8(x * s); dequantize x_hat = fp8_to_f32(q) / s, exact.
// fp8_scale_for_amax_within: the same with the exponent clamped to [-max_exp, max_exp] instead
// (1 <= max_exp <= 126): attention's V block scales (ATTN_V_SCALE_MAX_EXP, attention_cpu.h).
#define FP8_SCALE_MAX_EXP 126
FP8_FN float fp8_scale_for_amax_within(Fp8Format f, float amax, int max_exp) {
    // Branch-free (it sits on the FP8 backward's critical path, once per dS tile): a float
    // subnormal amax (biased exponent 0) needs k >= emax + 127 - 1 > 126 with or without
    // normalising its fraction, so the clamp gives the same 2^126; amax 0, inf and NaN select
    // s = 1. The same values as the normalising form for every float (checked over all 2^32 bit
    // patterns when this replaced it).
    const uint32_t a = fp8_f32_bits(amax) & 0x7FFFFFFFu;
    const int emax = f == FP8_E4M3 ? 8 : 15;  // FMAX = 1.75 * 2^emax
    int k = emax + 127 - (int)(a >> 23) - ((a & 0x7FFFFFu) > 0x600000u);  // 0x600000: the fraction bits of 1.75
    k = k > max_exp ? max_exp : k < -max_exp ? -max_exp : k;
    return a == 0 || a >= 0x7F800000u ? 1.0f : fp8_bits_f32((uint32_t)(k + 127) << 23);
}
FP8_FN float fp8_scale_for_amax(Fp8Format f, float amax) {
    return fp8_scale_for_amax_within(f, amax, FP8_SCALE_MAX_EXP);
}

// Quantize-dequantize with a power-of-two scale s: the value the FP8 matmul sees, in x's units.
FP8_FN float fp8_qdq(Fp8Format f, float x, float s) { return fp8_round(f, x * s) / s; }

#endif  // FP8_H
