// layers_math.cuh: the per-element arithmetic of the RMSNorm and SwiGLU kernels, in one place so
// that layers.cu's kernels and layers_fp8.cu's (the same layers, also writing the FP8 codes of
// their output) compile literally the same expressions: their BF16 outputs, and hence the codes
// quantized from them, are bit-identical (test_layers_fp8_gpu checks it). Rounding to BF16 is the
// caller's, with lm_f2bf.
#ifndef LAYERS_MATH_CUH
#define LAYERS_MATH_CUH

#include <cuda_bf16.h>  // __nv_bfloat16 and its conversions
#include <math.h>       // expf, sqrtf
#include <stdint.h>     // uintptr_t

// Whether p allows 16-byte accesses (host: choosing a vectorized kernel; device: per row).
static __host__ __device__ __forceinline__ bool aligned16(const void *p) { return ((uintptr_t)p & 15) == 0; }

// Eight BF16 values in one 16-byte access (the vectorized kernels' unit).
union Bf16x8 {
    uint4 u;
    __nv_bfloat16 h[8];
};

static __device__ __forceinline__ float lm_bf2f(__nv_bfloat16 x) { return __bfloat162float(x); }
static __device__ __forceinline__ __nv_bfloat16 lm_f2bf(float x) { return __float2bfloat16_rn(x); }
static __device__ __forceinline__ float lm_bits2f(unsigned short b) { return lm_bf2f(__ushort_as_bfloat16(b)); }
static __device__ __forceinline__ unsigned short lm_f2bits(float x) { return __bfloat16_as_ushort(lm_f2bf(x)); }

// Sum over the warp with a fixed butterfly (every lane gets the same, deterministic, result).
static __device__ __forceinline__ float lm_warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

// RMSNorm: rstd of a row from its sum of squares; the output element before rounding.
static __device__ __forceinline__ float lm_rstd(float ss, int dim, float eps) { return 1.0f / sqrtf(ss / (float)dim + eps); }
static __device__ __forceinline__ float lm_rms_out(float x, float rstd, float g) { return x * rstd * g; }

// RoPE of one pair (x at i, y at i + hd/2) with cos c and sin sn (sn = -sin for the backward):
// x' = x c - y sn, y' = y c + x sn, each product and the sum rounded once (no FMA contraction),
// so every kernel that rotates (layers.cu's, layers_fp8.cu's fused backward) gets the same bits.
static __device__ __forceinline__ float lm_rope_lo(float x, float y, float c, float sn) {
    return __fsub_rn(__fmul_rn(x, c), __fmul_rn(y, sn));
}
static __device__ __forceinline__ float lm_rope_hi(float x, float y, float c, float sn) {
    return __fadd_rn(__fmul_rn(y, c), __fmul_rn(x, sn));
}

// SwiGLU out = silu(g) * u, and its gradients: du = dout * silu(g),
// dg = dout * u * s * (1 + g * (1 - s)), s = sigmoid(g). The two gradients have their own
// functions (of s) so that a kernel that needs only one computes only that one, with the same
// expression as lm_swiglu_grad.
static __device__ __forceinline__ float lm_swiglu(float g, float u) { return g / (1.0f + expf(-g)) * u; }
static __device__ __forceinline__ float lm_sigmoid(float g) { return 1.0f / (1.0f + expf(-g)); }
static __device__ __forceinline__ float lm_swiglu_grad_up(float g, float d, float s) { return d * g * s; }
static __device__ __forceinline__ float lm_swiglu_grad_gate(float g, float u, float d, float s) {
    return d * u * s * (1.0f + g * (1.0f - s));
}
static __device__ __forceinline__ void lm_swiglu_grad(float g, float u, float d, float &dg, float &du) {
    const float s = lm_sigmoid(g);
    du = lm_swiglu_grad_up(g, d, s);
    dg = lm_swiglu_grad_gate(g, u, d, s);
}

#endif  // LAYERS_MATH_CUH
