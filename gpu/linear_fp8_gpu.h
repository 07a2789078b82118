// linear_fp8_gpu.h: FP8 linear layers of the GPU backend: quantization kernels (BF16 -> FP8 codes
// + power-of-two scales, bit-identical to linear_fp8.c's fp8_quantize) and the forward, dgrad and
// wgrad GEMMs of y = x W^T on FP8 operands through cuBLASLt (implementation in
// linear_fp8_gpu.cu). The contract (which operand is grouped how, in which format) is the one at
// the top of linear_fp8.c; this header only fixes the GPU's data structures.
//
// cuBLASLt multiplies FP8 only in the "TN" layout: both operands contiguous along the reduction.
// So every operand is held as a row-major (rows, cols) matrix whose cols are the reduction
// dimension of the GEMM that consumes it, and the GEMMs below are all out = lhs . rhs^T:
//   forward  y  (N, M) = x    (N, K) . W    (M, K)^T      x: act groups,  W: weight groups
//   dgrad    dx (N, K) = dy   (N, M) . W^T  (K, M)^T      dy: act groups, W^T: weight groups
//   wgrad    dW (M, K) = dy^T (M, N) . x^T  (K, N)^T      both: act groups (along tokens)
// where act groups are FP8_GROUP_TENSOR (fp8_tensor) or FP8_GROUP_1x128 (fp8_block), and weight
// groups FP8_GROUP_TENSOR or FP8_GROUP_128x128.
//
// Scales on the device are DEQUANTIZATION scales 1/s (what cuBLASLt's scale pointers multiply
// by), in cuBLASLt's layouts for an operand (R, C), C the reduction dimension:
//   FP8_GROUP_TENSOR   [0] = 1/s; [1] = the amax s came from (FP32): the tensor's, a by-product,
//                      or (delayed scaling) the history's maximum
//   FP8_GROUP_1x128    slice j of row r at [j * R + r] (the buffer has room for R and
//                      ceil(C/128) rounded up to multiples of 4; that slack is unused)  (VEC128_32F)
//   FP8_GROUP_128x128  block (i, j) at [i * L + j], L = ceil(C/128) rounded up to a multiple
//                      of 4; padding entries (j >= ceil(C/128), or i >= ceil(R/128) up to a
//                      multiple of 4 rows) hold 1.0                             (BLK128x128_32F)
// fp8_scales_to_rowmajor() converts them back to fp8_quantize's order (s, row-major over groups).
//
// Streams: quantizations may run on any stream; the GEMMs use matmul.h's cuBLASLt handle and
// workspace, so they must be issued on the same stream as every other GEMM (or serialised).
#ifndef LINEAR_FP8_GPU_H
#define LINEAR_FP8_GPU_H

#include <stdint.h>            // uint8_t codes, uint16_t BF16 bits
#include <cuda_runtime_api.h>  // cudaStream_t

#include "core/fp8.h"        // Fp8Format
#include "core/precision.h"  // Fp8Grouping, FP8_GROUP

#ifdef __cplusplus
extern "C" {
#endif

// One FP8 GEMM operand on the device.
typedef struct {
    uint8_t *codes;         // (rows, cols) row-major FP8 codes
    float *scales;          // fp8_gpu_scale_count(grouping, rows, cols) floats, layout above
    int rows, cols;         // cols: the reduction dimension of the consuming GEMM
    Fp8Grouping grouping;   // how the scales are shared
    Fp8Format fmt;          // E4M3 or E5M2
} Fp8Operand;

// Floats in an operand's scale buffer (with cuBLASLt's padding; >= 2).
long fp8_gpu_scale_count(Fp8Grouping g, int rows, int cols);
// cudaMalloc's codes and scales and fills in the shape; free releases both (and zeroes *op).
void fp8_operand_alloc(Fp8Operand *op, int rows, int cols, Fp8Grouping g, Fp8Format fmt);
void fp8_operand_free(Fp8Operand *op);

// Quantizes x (rows, cols) BF16, row-major, as fp8_quantize does (same groups, scales, codes):
//   q  (may be NULL): q = Q(x),   q->rows == rows, q->cols == cols, groups along cols of x
//   qt (may be NULL): qt = Q(x^T), qt->rows == cols, qt->cols == rows, groups along rows of x
// q and qt (when both are given) must have the same grouping and format. For FP8_GROUP_TENSOR
// and FP8_GROUP_128x128, Q(x^T) is Q(x) transposed (same scales), and one pass over x writes
// both; for FP8_GROUP_1x128 they are different quantizations (the forward's slices along the
// channels, wgrad's along the tokens), both made from one 128x128 tile of x in one pass. FP8_GROUP_TENSOR takes two
// passes (amax, then cast); deterministic since max is exact.
// counts (device, may be NULL): [0] += elements that saturated (|x * s| > FMAX: only +-inf
// inputs can, since s <= FMAX / amax), [1] += NaN inputs; each element of x counted once per
// call (like one fp8_quantize's Fp8QuantStats).
void fp8_quantize_gpu(const Fp8Operand *q, const Fp8Operand *qt, const uint16_t *x, int rows, int cols,
                      unsigned long long *counts, cudaStream_t stream);

// fp8_quantize_gpu for per-tensor operands (FP8_GROUP_TENSOR) with the scale of the amax *amax
// (device FP32) instead of an amax pass of its own over x:
//   - x's own amax, taken by x's producer (layers.h's *_amax_gpu: the FP32 bits they fold in are
//     that float): the same codes, scales and counts as fp8_quantize_gpu;
//   - delayed scaling's history maximum (precision.linear_scaling = "delayed"): values beyond the
//     scale saturate (counted in counts[0]).
// observe (device FP32 bits, may be NULL) gets max |x| folded in (atomicMax), x's record for the
// history. scales[0] = 1/s, scales[1] = *amax. One pass over x when both q and qt are given.
void fp8_quantize_gpu_with_amax(const Fp8Operand *q, const Fp8Operand *qt, const uint16_t *x, int rows, int cols,
                                const float *amax, unsigned *observe, unsigned long long *counts, cudaStream_t stream);
// *amax (device FP32) = max |x| over n BF16 values (NaN ignored): the amax pass fp8_quantize_gpu
// runs for per-tensor operands, for a tensor that is quantized in parts with one scale.
void fp8_amax_gpu(float *amax, const uint16_t *x, long n, cudaStream_t stream);
// The per-tensor operand op's two scale floats for the amax `amax`, as fp8_quantize_gpu_with_amax
// writes them (scales[0] = 1/s with s = fp8_scale_for_amax(op->fmt, amax), scales[1] = amax): for
// codes made elsewhere with that scale (the cross-entropy's), and as the amax a later
// fp8_quantize_gpu_with_amax reads (op->scales + 1) when it is known on the host only.
void fp8_set_tensor_scale_gpu(const Fp8Operand *op, float amax, cudaStream_t stream);
// qt = the transpose of the per-tensor operand q (codes and its two scale floats), without the BF16
// values: for codes made where the transpose could not be (the cross-entropy's rows).
void fp8_transpose_tensor_gpu(const Fp8Operand *q, const Fp8Operand *qt, cudaStream_t stream);

// Host: converts an operand's scales as stored on the device (1/s, cuBLASLt layout, copied to
// the host in `dev_layout`) to fp8_quantize's (s, row-major over the group grid, fp8_group_count
// entries).
void fp8_scales_to_rowmajor(float *s_rowmajor, const float *dev_layout, Fp8Grouping g, int rows, int cols);

// Creates the cuBLASLt handle and the workspace (idempotent); frees everything.
void linear_fp8_gpu_init(void);
void linear_fp8_gpu_shutdown(void);

// out (n, m) = lhs (n, k) . rhs (m, k)^T (+ out when accumulate), FP32 accumulation, promoted
// to FP32 every few k steps by cuBLASLt unless fast_accum (CUBLASLT_MATMUL_DESC_FAST_ACCUM: the
// tensor cores' own accumulator throughout; per-tensor operands only, block scaling always
// promotes: FATAL otherwise). out is BF16 (out_fp32 = 0) or FP32. Returns the cuBLASLt
// status (0 = CUBLAS_STATUS_SUCCESS); misuse (shapes that do not chain, E5M2 x E5M2, 128x128 x
// 128x128, k not a multiple of 16, codes not 16-byte aligned, a 1x128 operand whose rows are
// not a multiple of 4) is FATAL. k = lhs->cols must be a multiple of 16 (cuBLASLt's FP8
// leading-dimension rule); in a linear layer N, M and K each reduce one of the three GEMMs, so
// all three must be multiples of 16.
int fp8_gemm_gpu(void *out, int out_fp32, int accumulate, int fast_accum, const Fp8Operand *lhs,
                 const Fp8Operand *rhs, cudaStream_t stream);
// 1 when cuBLASLt has an algorithm for this product (plans it; for tests and start-up checks).
int fp8_gemm_gpu_supported(int out_fp32, int fast_accum, const Fp8Operand *lhs, const Fp8Operand *rhs);

// The three GEMMs of a linear layer (fast_accum as fp8_gemm_gpu's: precision.linear_fast_accum);
// a cuBLASLt failure is FATAL.
// y (N, M) BF16 = x (N, K) . w (M, K)^T
void linear_fp8_forward_gpu(uint16_t *y, const Fp8Operand *x, const Fp8Operand *w, int fast_accum,
                            cudaStream_t stream);
// dx (N, K) BF16 = dy (N, M) . wt (K, M)^T        (wt = Q(W^T))
void linear_fp8_dgrad_gpu(uint16_t *dx, const Fp8Operand *dy, const Fp8Operand *wt, int fast_accum,
                          cudaStream_t stream);
// dw (M, K) FP32 (+)= dyt (M, N) . xt (K, N)^T    (dyt = Q(dy^T), xt = Q(x^T))
void linear_fp8_wgrad_gpu(float *dw, const Fp8Operand *dyt, const Fp8Operand *xt, int accumulate, int fast_accum,
                          cudaStream_t stream);

// Plans created so far (a repeated shape must not add one).
int linear_fp8_gpu_plan_count(void);

#ifdef __cplusplus
}
#endif
#endif  // LINEAR_FP8_GPU_H
