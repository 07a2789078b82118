// layers_fp8.h: layers that also write the FP8 codes of their output for the next linear layer
// (precision.linear = fp8_block, or fp8_tensor with delayed scaling: Fp8TensorScale below), so
// that no separate quantization pass re-reads that output (kernels in layers_fp8.cu).
//
// Each function computes exactly what its BF16 counterpart in layers.h computes (the same
// arithmetic, from layers_math.cuh: bit-identical BF16 values) and quantizes those BF16 values as
// linear_fp8.c's contract says for fp8_block activations and output gradients, giving exactly the
// codes and scales fp8_quantize_gpu (linear_fp8_gpu.h) would give on the BF16 output:
//   q  = Q(out)   (rows, cols) 1x128 slices along cols (the forward's x, dgrad's dy)
//   qt = Q(out^T) (cols, rows) 1x128 slices along rows = tokens (wgrad's x^T, dy^T), or 128x128
//        blocks (below); may be NULL
// q must be an FP8_GROUP_1x128 operand; qt FP8_GROUP_1x128 or, for a wgrad operand in blocks
// (precision.linear_wgrad_blocks), FP8_GROUP_128x128 (each 128 x 128 output tile one block of
// out^T); both of the right shape and one format; scales are stored as
// fp8_quantize_gpu stores them (1/s, cuBLASLt's VEC128 layout). The BF16 output pointer may be
// NULL when nothing else reads it (the FP8 GEMMs read only the codes): then it is not written.
// No saturation / NaN counters (the model passes none).
//
// Why tiles of 128 tokens: Q(out^T) groups 128 consecutive rows of a column, so a kernel that
// writes it must see 128 rows at once. SwiGLU and its backward are element-wise: one CTA per
// 128 x 128 output tile computes the tile and writes it both ways (fp8_quant.cuh's vec128_tile),
// as linear_fp8_gpu.cu's vec128both_kernel does from a loaded tile. RMSNorm needs the whole row
// first (its rstd): layers.cu's norm computes the rows' rstd and residual with no output, then
// one CTA per 128 x 128 tile normalises and quantizes (re-reading the residual, partly from L2).
#ifndef LAYERS_FP8_H
#define LAYERS_FP8_H

#include <stdint.h>            // uint16_t (BF16 bits)
#include <cuda_runtime_api.h>  // cudaStream_t

#include "gpu/linear_fp8_gpu.h"  // Fp8Operand

#ifdef __cplusplus
extern "C" {
#endif

// Per-tensor codes (fp8_tensor with precision.linear_scaling = "delayed"): q and qt are
// FP8_GROUP_TENSOR operands and every code takes the scale of *amax (device FP32: the amax
// history's maximum), saturating beyond it, as fp8_quantize_gpu_with_amax; observe (device FP32
// bits, may be NULL) gets the output's own amax folded in. 1x128 operands take none (NULL).
typedef struct {
    const float *amax;
    unsigned *observe;
} Fp8TensorScale;

// RMSNorm as rmsnorm_forward_gpu (delta == NULL: normalises x) or residual_rmsnorm_forward_gpu
// (delta != NULL: res_out = bf16(x + delta) is stored and normalised), y (N, C), rstd (N); plus
// q = Q(y) (N, C) and qt = Q(y^T) (C, N). y may be NULL (not written); res_out may be x.
void rmsnorm_forward_fp8_gpu(uint16_t *res_out, uint16_t *y, float *rstd, const uint16_t *x,
                             const uint16_t *delta, const uint16_t *g, int N, int C, float eps,
                             const Fp8Operand *q, const Fp8Operand *qt, const Fp8TensorScale *ts,
                             cudaStream_t stream);
// out (N, F) = silu(gate) * up from fc (N, 2F), as swiglu_forward_gpu; q = Q(out) (N, F),
// qt = Q(out^T) (F, N). out may be NULL. F must be a multiple of 8.
void swiglu_forward_fp8_gpu(uint16_t *out, const uint16_t *fc, int N, int F, const Fp8Operand *q,
                            const Fp8Operand *qt, const Fp8TensorScale *ts, cudaStream_t stream);
// dfc (N, 2F) from dout (N, F), as swiglu_backward_gpu; q = Q(dfc) (N, 2F), qt = Q(dfc^T)
// (2F, N). dfc may be NULL; it must not overlap dout. F must be a multiple of 8.
void swiglu_backward_fp8_gpu(uint16_t *dfc, const uint16_t *dout, const uint16_t *fc, int N, int F,
                             const Fp8Operand *q, const Fp8Operand *qt, const Fp8TensorScale *ts,
                             cudaStream_t stream);

// The RoPE backward (rope_backward_gpu's rotation, with sin negated) of dqkv (N = B*T, 3C), C =
// H * hd, quantized per tensor both ways as the qkv linear's dy: q = Q(dqkv') (N, 3C), qt =
// Q(dqkv'^T) (3C, N) (may be NULL), with ts (required: delayed scaling). dqkv itself is not
// changed and the rotated BF16 values are not written. Needs rope_backward_fp8_supported(H, hd).
void rope_backward_fp8_gpu(const uint16_t *dqkv, const float *cos_sin, int B, int T, int H, int hd,
                           const Fp8Operand *q, const Fp8Operand *qt, const Fp8TensorScale *ts, cudaStream_t stream);
// 1 when the fused RoPE backward handles these heads: C % 128 == 0, 128 % hd == 0, hd % 16 == 0.
int rope_backward_fp8_supported(int H, int hd);

#ifdef __cplusplus
}
#endif
#endif  // LAYERS_FP8_H
