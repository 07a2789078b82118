// fp8_cvt.cuh: FP8 codes from FP32 with the hardware conversion (sm_89+), for the device code of
// the attention kernels and of the linear layers' quantization, and the byte transpose of codes.
//
// cvt.rn.satfinite.{e4m3,e5m2}x2.f32 is the instruction CUDA's __nv_cvt_float_to_fp8(x,
// __NV_SATFINITE, fmt) executes on the device (cuda_fp8.hpp), whose host path fp8.h's integer
// encoders match bit for bit (test/test_fp8.cu): RNE, saturation to the largest finite value
// (+-inf included). NaN is the one difference: the host path canonicalises it to 0x7FFFFFFF first
// (code 0x7F), the device path converts it as it is; fp8x2_from_f32 canonicalises too, so its
// codes are fp8_from_f32's for every input, at a fraction of the cost of the integer encoder
// (~30 instructions with branches per value against one conversion per two values).
#ifndef FP8_CVT_CUH
#define FP8_CVT_CUH

#include <cuda_bf16.h>  // __nv_bfloat162, __hmax2, __habs2 (the packed amaxes)
#include <stdint.h>     // uint16_t, uint32_t

#include "core/fp8.h"  // Fp8Format

// The packed amaxes of BF16 pairs, as the quantize kernels take them (fp8_quant.cuh, layers_fp8.cu,
// qkv_gemm_overlap.cuh): max(|acc|, |w|) per BF16 half, NaN ignored (acc must not be NaN: it is an
// amax so far, starting at 0).
static __device__ __forceinline__ uint32_t amax2(uint32_t acc, uint32_t w) {
    const __nv_bfloat162 r = __hmax2(*reinterpret_cast<const __nv_bfloat162 *>(&acc),
                                     __habs2(*reinterpret_cast<const __nv_bfloat162 *>(&w)));
    return *reinterpret_cast<const uint32_t *>(&r);
}
// The larger of the two halves of a non-negative BF16 pair, as bits (on non-negative BF16 the
// order of values is the order of bits).
static __device__ __forceinline__ unsigned amax_of_pair(uint32_t p) { return max(p & 0xFFFFu, p >> 16); }
// amax2's magnitudes in one instruction (max.xorsign.abs.bf16x2, HMNMX2; amax2 compiles to two on
// sm_90, HFMA2 for the |w| and VHMNMX): per half, the larger of |acc| and |w|, NaN ignored, with the
// xor of their signs as its sign, so the result must be read through |.| (not amax_of_pair). The
// QKV GEMM's overlapped epilogue keeps its amaxes so (qkv_gemm_overlap.cuh).
static __device__ __forceinline__ uint32_t amax2_xorsign(uint32_t acc, uint32_t w) {
    uint32_t d;
    asm("max.xorsign.abs.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(acc), "r"(w));
    return d;
}

// Codes of two finite-or-infinite floats (NaN: see fp8x2_from_f32): lo's in bits 0-7, hi's in
// bits 8-15 (PTX: operand a goes to the upper byte).
__device__ __forceinline__ uint32_t cvt_e4m3x2(float lo, float hi) {
    uint16_t r;
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}
__device__ __forceinline__ uint32_t cvt_e5m2x2(float lo, float hi) {
    uint16_t r;
    asm("cvt.rn.satfinite.e5m2x2.f32 %0, %1, %2;\n" : "=h"(r) : "f"(hi), "f"(lo));
    return r;
}
// NaN of either sign -> the positive quiet NaN whose code is FP8_NAN_CODE (as the host path).
__device__ __forceinline__ float fp8_canonical_nan(float v) {
    return v == v ? v : __uint_as_float(0x7FFFFFFFu);
}
// fp8_from_f32(FMT, lo) | fp8_from_f32(FMT, hi) << 8, for any inputs.
template <Fp8Format FMT>
__device__ __forceinline__ uint32_t fp8x2_from_f32(float lo, float hi) {
    lo = fp8_canonical_nan(lo);
    hi = fp8_canonical_nan(hi);
    return FMT == FP8_E5M2 ? cvt_e5m2x2(lo, hi) : cvt_e4m3x2(lo, hi);
}

// The 4 x 4 byte transpose of four rows' words of codes: byte k of out[j] = byte j of row k
// (PRMT only). Transposed FP8 operands are made this way from their codes (attention/quant_fp8.cu,
// fp8_quant.cuh's emit_qt_codes) wherever one scale covers the whole tile.
__device__ __forceinline__ void transpose4x4(uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3, uint32_t out[4]) {
    const uint32_t lo01 = __byte_perm(r0, r1, 0x5140), hi01 = __byte_perm(r0, r1, 0x7362);  // r0.b0 r1.b0 r0.b1 r1.b1
    const uint32_t lo23 = __byte_perm(r2, r3, 0x5140), hi23 = __byte_perm(r2, r3, 0x7362);  // | .b2 .b3 likewise
    out[0] = __byte_perm(lo01, lo23, 0x5410);
    out[1] = __byte_perm(lo01, lo23, 0x7632);
    out[2] = __byte_perm(hi01, hi23, 0x5410);
    out[3] = __byte_perm(hi01, hi23, 0x7632);
}

#endif  // FP8_CVT_CUH
