// linear_fp8.h: FP8 linear layers of the CPU backend: quantization of GEMM operands exactly as the
// GPU does it (power-of-two current scales, per tensor or DeepSeek-V3-style 1x128 / 128x128
// groups), and the forward, input-gradient and weight-gradient GEMMs of y = x W^T on those
// operands with FP32 accumulation. linear_fp8.c opens with the contract the GPU follows.
#ifndef LINEAR_FP8_H
#define LINEAR_FP8_H

#include <stddef.h>  // size_t
#include <stdint.h>  // uint8_t codes

#include "core/precision.h"  // PrecisionConfig, Fp8Grouping, AttnDelayedState (the amax histories)

#ifdef __cplusplus
extern "C" {
#endif

// Counters of one or more quantizations (summed, never reset by the quantizer).
typedef struct {
    long long casts;      // elements quantized
    long long saturated;  // elements clamped to +-FMAX (|x * s| beyond it; +-inf inputs)
    long long nans;       // NaN inputs (they become the NaN code 0x7F)
} Fp8QuantStats;

// Quantize-dequantize x (rows, cols) group by group: amax = max |x| over the group (NaN ignored,
// as fmaxf does), s = fp8_scale_for_amax(fmt, amax) (a power of two), code = fp8(x * s) with
// RNE and saturation, out = decode(code) / s (exact: out * s is an FP8 value). out (rows, cols)
// may be NULL or equal to x; codes (rows * cols) and scales (fp8_group_count) may be NULL.
// Stored scales are the quantization multipliers s (cuBLASLt's scale pointers take 1/s).
// stats (may be NULL) is added to.
void fp8_quantize(float *out, uint8_t *codes, float *scales, const float *x, int rows, int cols,
                  Fp8Grouping g, Fp8Format fmt, Fp8QuantStats *stats);

// State of the FP8 linears: formats, quantization counters and scratch (reused across calls).
typedef struct {
    Fp8Format grad_format;  // of output gradients (fp8_tensor: linear_grad_format; block: E4M3)
    Fp8Grouping wgrad_dyt, wgrad_xt;  // fp8_block's wgrad operands dy^T, x^T: 1x128, or one 128x128
                                      // (precision.linear_wgrad_blocks; linear_wgrad_groupings)
    Fp8QuantStats stats[3]; // per operand role: activations x, weights W, output gradients dy
    long long gemms;        // GEMMs run on quantized operands
    // Delayed scaling (fp8_tensor, precision.linear_scaling = "delayed"): the blocks' amax
    // histories, two states per block (linear_delayed_slot), owned by the model; NULL: current.
    AttnDelayedState *delayed;
    int site;               // the FP8 linear the next calls quantize for (linear_fp8_site), or -1
    int head_given;         // fp8_tensor's LM head: head_amax holds the micro-batch's (linear_fp8_head_scales)
    float head_amax[2];     // [LINEAR_ROLE_X] max |hf|, [LINEAR_ROLE_DY] the bound of |dlogits|
    float *scratch[2];      // quantized (and transposed) operand copies
    size_t scratch_cap[2];  // in floats
} LinearFp8;

enum { LINEAR_X = 0, LINEAR_W = 1, LINEAR_DY = 2 };  // indices of LinearFp8.stats

// The site of the next linear_forward / dgrad / wgrad calls: layer's linear i, or none (layer <
// 0: the LM head, current scaling; fp8_tensor's training head takes linear_fp8_head_scales instead).
void linear_fp8_site(LinearFp8 *L, int layer, int i);
// fp8_tensor's LM head for one micro-batch (the contract in linear_fp8.c): the next calls are the
// head's (site -1), x quantized with the scale of max |hf| over the whole hf (rows, cols) and dy
// with the scale of dy_bound (|dlogits| <= dy_bound), whatever rows a call gets (a chunk of
// tokens). linear_fp8_site drops them.
void linear_fp8_head_scales(LinearFp8 *L, const float *hf, int rows, int cols, float dy_bound);
// At the start of every forward: this micro-batch's amaxes start from zero (a forward without a
// backward, e.g. an evaluation, records nothing: the next forward zeroes them again), for the
// n_layer blocks' states.
void linear_fp8_forward_begin(LinearFp8 *L, int n_layer);

void linear_fp8_init(LinearFp8 *L, const PrecisionConfig *p);
void linear_fp8_free(LinearFp8 *L);

// The three GEMMs of y = x W^T, x (N, K), W (M, K), y (N, M), in precision prec. LINEAR_BF16
// calls the FP32 matmul_cpu.c product directly (the CPU backend's BF16 is FP32); FP8 precisions
// first quantize-dequantize both operands as the contract in linear_fp8.c says.
// y (N, M) (+)= x W^T
void linear_forward(LinearFp8 *L, LinearPrecision prec, float *y, const float *x, const float *w,
                    int N, int M, int K, int accumulate);
// dx (N, K) (+)= dy W, dy (N, M)
void linear_dgrad(LinearFp8 *L, LinearPrecision prec, float *dx, const float *dy, const float *w,
                  int N, int M, int K, int accumulate);
// dW (M, K) (+)= dy^T x
void linear_wgrad(LinearFp8 *L, LinearPrecision prec, float *dw, const float *dy, const float *x,
                  int N, int M, int K, int accumulate);

#ifdef __cplusplus
}
#endif
#endif  // LINEAR_FP8_H
