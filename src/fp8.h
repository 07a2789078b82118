// fp8.h: FP8 (E4M3 "fn" and E5M2) and BF16 conversions and the power-of-two scale rule,
// usable from host C, host C++ and CUDA device code (../shared/design/fp8-attention.md §2).
//
// Conversion from FP32 is round-to-nearest-even with saturation to the largest finite value
// (CUDA's __NV_SATFINITE); NaN stays NaN (E4M3: 0x7F/0xFF, E5M2: 0x7F/0xFF class). The
// encoders must be bit-exact with __nv_cvt_float_to_fp8(x, __NV_SATFINITE, __NV_E4M3/__NV_E5M2)
// from cuda_fp8.h; test/test_fp8.cu checks this over a sweep of float bit patterns.
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

// --- E4M3 and E5M2 encode / decode (implemented below by fp8 owner) ---------------------------
// uint8_t fp8_e4m3_from_f32(float x);   // RNE, satfinite, NaN -> 0x7F (sign kept)
// float   fp8_e4m3_to_f32(uint8_t q);
// uint8_t fp8_e5m2_from_f32(float x);   // RNE, satfinite, NaN -> 0x7F/0xFF class
// float   fp8_e5m2_to_f32(uint8_t q);
// uint8_t fp8_from_f32(Fp8Format f, float x);
// float   fp8_to_f32(Fp8Format f, uint8_t q);
// float   fp8_round(Fp8Format f, float x);          // decode(encode(x)): the value FP8 keeps
// float   fp8_max(Fp8Format f);                     // 448 or 57344
//
// --- BF16 -------------------------------------------------------------------------------------
// uint16_t bf16_from_f32(float x);    // RNE, NaN stays NaN (as __float2bfloat16_rn)
// float    bf16_to_f32(uint16_t h);
// float    bf16_round(float x);       // the value BF16 keeps
//
// --- scales (power of two) --------------------------------------------------------------------
// float fp8_scale_for_amax(Fp8Format f, float amax);
//   s = 2^floor(log2(FMAX / amax)), s = 1 when amax == 0 (or not finite); exact power of two.
//   Quantize q = fp8(x * s); dequantize x_hat = q / s (exact).

#endif  // FP8_H
