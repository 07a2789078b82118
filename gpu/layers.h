// layers.h: the element-wise and row-wise layers of the GPU backend (kernels in layers.cu).
//
// Storage is BF16 (uint16_t bit patterns in this C interface, like attention/kernels_bf16.h), arithmetic
// and every reduction is FP32 (the gradient norm: FP64). Weights passed in are the BF16 working
// copies; weight gradients are FP32 and are always ADDED to (micro-batch accumulation), never
// overwritten. Every launcher is asynchronous on `stream`, checks its launch (cuda_check.h) and
// never allocates: scratch buffers are passed in, sized by the *_bytes() helpers.
//
// Determinism: every result here is bitwise reproducible run to run. Reductions across rows
// (gain gradients, embedding gradients, the gradient norm) use fixed partitions reduced in a
// fixed order; no floating-point atomics anywhere.
//
// Shapes: N = rows (B*T tokens), C = model width, H heads of size hd (C = H*hd), F = MLP
// hidden size, Vp = padded vocabulary (V real columns).
#ifndef LAYERS_H
#define LAYERS_H

#include <stddef.h>            // size_t
#include <stdint.h>            // uint16_t (BF16 bits), int32_t tokens
#include <cuda_runtime_api.h>  // cudaStream_t

#include "core/fp8.h"        // Fp8Format (the cross-entropy's FP8 codes)
#include "core/gpu_sizes.h"  // GRAD_NORM_PARTIALS

#ifdef __cplusplus
extern "C" {
#endif

// --- embedding ---------------------------------------------------------------------------------
// x (N, C) = wte (Vp, C) [tokens (N)]. A token outside [0, Vp) gives a NaN row (visible, no
// out-of-bounds read).
void embedding_forward_gpu(uint16_t *x, const int32_t *tokens, const uint16_t *wte, int N, int C,
                           int Vp, cudaStream_t stream);
// Scratch for the backward: the positions sorted by token and the partial rows of long runs.
size_t embedding_backward_scratch_bytes(int N, int C);
// dwte (Vp, C) FP32 += sum over positions i with tokens[i] == v of dx[i] (BF16 (N, C)). The rows
// of one token are added in a fixed order that depends only on the tokens (increasing position
// within tiles of 64 sorted entries, the tiles in order): deterministic, and fast for any token
// distribution (embedding.cu). scratch: embedding_backward_scratch_bytes(N, C) bytes,
// 256-byte aligned. Tokens outside [0, Vp) are skipped.
void embedding_backward_gpu(float *dwte, const uint16_t *dx, const int32_t *tokens, void *scratch,
                            int N, int C, int Vp, cudaStream_t stream);

// --- RMSNorm -----------------------------------------------------------------------------------
// y (N, C) = x / sqrt(mean(x^2) + eps) * g; g (C) BF16; rstd (N) FP32 saved. y may be x, or NULL:
// then only rstd (and, below, the residual) is written, for a caller that makes y itself
// (layers_fp8.cu's fused norm: the same rstd by construction).
void rmsnorm_forward_gpu(uint16_t *y, float *rstd, const uint16_t *x, const uint16_t *g, int N,
                         int C, float eps, cudaStream_t stream);
// Fused residual add + RMSNorm: res_out = bf16(res_in + delta) (N, C), then y = RMSNorm(res_out)
// as above (normalising the stored BF16 residual, which is what the backward sees). res_out
// may be res_in (in-place residual stream).
void residual_rmsnorm_forward_gpu(uint16_t *res_out, uint16_t *y, float *rstd,
                                  const uint16_t *res_in, const uint16_t *delta, const uint16_t *g,
                                  int N, int C, float eps, cudaStream_t stream);
// FP32 scratch for a norm backward over N rows of width dim.
size_t rmsnorm_backward_scratch_bytes(int N, int dim);
// With xhat = x * rstd:  dx = rstd * (dy*g - xhat * mean(dy*g*xhat)),  dg += sum_rows dy*xhat.
// dx (N, C) BF16: overwritten (accumulate == 0; dx may be dy) or added to (accumulate != 0, the
// residual gradient). dg (C) FP32 added to. scratch: rmsnorm_backward_scratch_bytes(N, C).
void rmsnorm_backward_gpu(uint16_t *dx, float *dg, void *scratch, const uint16_t *dy,
                          const uint16_t *x, const uint16_t *g, const float *rstd, int N, int C,
                          int accumulate, cudaStream_t stream);

// out (n) = bf16(a + b), all BF16. out may be a or b.
void residual_add_gpu(uint16_t *out, const uint16_t *a, const uint16_t *b, size_t n,
                      cudaStream_t stream);

// --- QK-RMSNorm (per head, gains of size hd shared by all heads) ---------------------------------
// qkv_in, qkv_out: (N, 3, H, hd) BF16 (the packed QKV GEMM output, N = B*T). Normalises every
// q head with q_gain and every k head with k_gain into qkv_out, and copies v when qkv_out !=
// qkv_in. rstd: (2, N, H) FP32 (q heads first). The backward needs qkv_in, so keep the GEMM
// output and normalise into another buffer (in place is allowed when no backward follows).
void qk_rmsnorm_forward_gpu(uint16_t *qkv_out, float *rstd, const uint16_t *qkv_in,
                            const uint16_t *q_gain, const uint16_t *k_gain, int N, int H, int hd,
                            float eps, cudaStream_t stream);
// Scratch: qk_rmsnorm_backward_scratch_bytes(N, H, hd) bytes.
size_t qk_rmsnorm_backward_scratch_bytes(int N, int H, int hd);
// dqkv_in (N, 3, H, hd) BF16 = gradient w.r.t. qkv_in from dqkv_out (same shape): q and k parts
// through the norm, v copied when the buffers differ (dqkv_in may be dqkv_out). dq_gain, dk_gain
// (hd) FP32 added to.
void qk_rmsnorm_backward_gpu(uint16_t *dqkv_in, float *dq_gain, float *dk_gain, void *scratch,
                             const uint16_t *dqkv_out, const uint16_t *qkv_in,
                             const uint16_t *q_gain, const uint16_t *k_gain, const float *rstd,
                             int N, int H, int hd, cudaStream_t stream);

// --- RoPE (rotate-half: pairs (i, i + hd/2), angle t * theta^(-2i/hd), t = position) -----------
// cos_sin (T, hd/2, 2) FP32 table, computed in double on the device (same layout and formula as
// rope_table in layers_cpu.h).
void rope_table_gpu(float *cos_sin, int T, int hd, double theta, cudaStream_t stream);
// In place on the q and k parts of qkv (B, T, 3, H, hd) BF16; v untouched. Forward rotates by
// +angle, backward (on the packed gradient) by -angle.
void rope_forward_gpu(uint16_t *qkv, const float *cos_sin, int B, int T, int H, int hd,
                      cudaStream_t stream);
void rope_backward_gpu(uint16_t *dqkv, const float *cos_sin, int B, int T, int H, int hd,
                       cudaStream_t stream);

// --- SwiGLU ------------------------------------------------------------------------------------
// fc (N, 2F) = [gate | up] per row; out (N, F) = silu(gate) * up.
void swiglu_forward_gpu(uint16_t *out, const uint16_t *fc, int N, int F, cudaStream_t stream);
// dfc (N, 2F) overwritten from dout (N, F) (dfc must not overlap dout).
void swiglu_backward_gpu(uint16_t *dfc, const uint16_t *dout, const uint16_t *fc, int N, int F,
                         cudaStream_t stream);

// --- The same layers with their output's amax, for per-tensor FP8 scaling ----------------------
// Each is the layer above (same outputs, bit for bit) and also folds max |output| into
// *amax_f32 (device): the FP32 bits of the largest BF16 |value| it stored, NaN ignored, folded in
// with atomicMax, so *amax_f32 must hold 0 (or a smaller amax) before. That is the amax
// fp8_quantize_gpu's per-tensor pass would take (linear_fp8_gpu.h: fp8_quantize_gpu_with_amax),
// so a fp8_tensor operand's quantization needs no pass of its own to find it. amax_f32 may be NULL.
void rmsnorm_forward_amax_gpu(uint16_t *y, float *rstd, const uint16_t *x, const uint16_t *g, int N, int C,
                              float eps, unsigned *amax_f32, cudaStream_t stream);
void residual_rmsnorm_forward_amax_gpu(uint16_t *res_out, uint16_t *y, float *rstd, const uint16_t *res_in,
                                       const uint16_t *delta, const uint16_t *g, int N, int C, float eps,
                                       unsigned *amax_f32, cudaStream_t stream);
// amax of dx as stored (after the accumulation).
void rmsnorm_backward_amax_gpu(uint16_t *dx, float *dg, void *scratch, const uint16_t *dy, const uint16_t *x,
                               const uint16_t *g, const float *rstd, int N, int C, int accumulate,
                               unsigned *amax_f32, cudaStream_t stream);
void swiglu_forward_amax_gpu(uint16_t *out, const uint16_t *fc, int N, int F, unsigned *amax_f32,
                             cudaStream_t stream);
void swiglu_backward_amax_gpu(uint16_t *dfc, const uint16_t *dout, const uint16_t *fc, int N, int F,
                              unsigned *amax_f32, cudaStream_t stream);

// --- fused cross-entropy (the LM head GEMM's output chunk) ---------------------------------------
// logits (N, Vp) BF16, targets (N) int32. For a row with a target in [0, V):
// loss[i] = logsumexp(row[:V]) - row[target] (FP32); a target < 0 is ignored (loss 0); a target
// >= V gives loss NaN (a data bug must be visible). If grad_scale != 0 the row is overwritten
// IN PLACE with (softmax - onehot) * grad_scale on the V real columns, 0 on padded columns and
// on ignored rows; probabilities are never stored anywhere else. grad_scale == 0: logits kept.
void cross_entropy_gpu(uint16_t *logits, float *loss, const int32_t *targets, int N, int V, int Vp,
                       float grad_scale, cudaStream_t stream);
// The same loss, with the gradient (grad_scale != 0) written as per-tensor FP8 codes (fmt) to
// codes (N, Vp) instead of over the logits (left unchanged): each the code fp8_quantize_gpu_with_amax
// would give the BF16 value cross_entropy_gpu writes, with the scale of the amax grad_scale
// (|dlogits| <= grad_scale: fp8_tensor's LM head, linear_fp8.c). Needs
// cross_entropy_fp8_supported (the row kernel that holds the row in registers).
void cross_entropy_fp8_gpu(const uint16_t *logits, float *loss, const int32_t *targets, int N, int V, int Vp,
                           float grad_scale, uint8_t *codes, Fp8Format fmt, cudaStream_t stream);
int cross_entropy_fp8_supported(int Vp, const void *logits, const void *codes);

// --- gradient norm -----------------------------------------------------------------------------
// *sumsq_out (device, FP64) = sum of g[i]^2 over g (n) FP32, accumulated in FP64 over a fixed
// partition (GRAD_NORM_PARTIALS blocks, grid-stride) and reduced in a fixed tree: bitwise
// reproducible. partials: GRAD_NORM_PARTIALS doubles of scratch. Sum across ranks/shards, then
// sqrt, to get the global norm.
void grad_norm_squared_gpu(double *sumsq_out, double *partials, const float *g, size_t n,
                           cudaStream_t stream);

// --- casts -------------------------------------------------------------------------------------
// Round-to-nearest-even (bf16_from_f32 in fp8.h gives the same bits for every non-NaN input).
void cast_f32_to_bf16_gpu(uint16_t *out, const float *in, size_t n, cudaStream_t stream);
void cast_bf16_to_f32_gpu(float *out, const uint16_t *in, size_t n, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif  // LAYERS_H
