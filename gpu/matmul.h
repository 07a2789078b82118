// matmul.h: the BF16 GEMMs of the GPU backend through cuBLASLt (implementation in matmul.cu).
//
// All matrices are row-major and contiguous, BF16 (uint16_t bits) unless said otherwise;
// products accumulate in FP32 (CUBLAS_COMPUTE_32F). The three forms of a linear layer
// y = x W^T with x (M, K), W (N, K), y (M, N):
//   forward  y  (M, N)  = x (M, K) @ W (N, K)^T              BF16 out
//   dgrad    dx (M, K)  = dy (M, N) @ W (N, K)               BF16 out
//   wgrad    dW (N, K) += dy (M, N)^T @ x (M, K)             FP32 out, always accumulated
//
// One cuBLASLt handle, one 32 MiB workspace and a small table of plans (matmul descriptor,
// layouts and the heuristic's algorithm) keyed by (shape, transposes, output type, pointer
// alignment) live in this module; matmul_gpu_init() creates them. Because the workspace is
// shared, all GEMMs must be issued on one stream (or otherwise serialised). Errors are fatal
// with file, line, call and hint (cuda_check.h).
#ifndef MATMUL_H
#define MATMUL_H

#include <stddef.h>            // size_t
#include <stdint.h>            // uint16_t
#include <cuda_runtime_api.h>  // cudaStream_t

#include "core/gpu_sizes.h"  // MATMUL_WORKSPACE_BYTES

#ifdef __cplusplus
extern "C" {
#endif

// Creates the handle and the workspace (idempotent); frees everything (and the plan cache).
void matmul_gpu_init(void);
void matmul_gpu_shutdown(void);

// The module's cuBLASLt handle (a cublasLtHandle_t) and its MATMUL_WORKSPACE_BYTES workspace, for
// the other cuBLASLt user, the FP8 GEMMs of linear_fp8_gpu.cu: every GEMM of a process runs on one
// stream, one after another, so one handle and one workspace serve them all.
void *matmul_gpu_lt_handle(void);
void *matmul_gpu_workspace(void);
// cuBLASLt's best algorithm for the matmul descriptor op (a cublasLtMatmulDesc_t) over the layouts
// a, b and c = d (cublasLtMatrixLayout_t), with this module's workspace and the given minimum
// byte alignments of A, B and C/D. Returns the cublasStatus_t: success with *algo (a
// cublasLtMatmulAlgo_t) filled, CUBLAS_STATUS_NOT_SUPPORTED when the heuristic finds none, or its
// error. Both GEMM modules build their plans with it.
int matmul_gpu_pick_algo(void *op, void *a, void *b, void *c, int align_a, int align_b, int align_c, void *algo);

// y (M, N) = x (M, K) @ w (N, K)^T; accumulate != 0 adds to y instead (y = y + x w^T).
void matmul_forward_gpu(uint16_t *y, const uint16_t *x, const uint16_t *w, int M, int N, int K,
                        int accumulate, cudaStream_t stream);
// dx (M, K) = dy (M, N) @ w (N, K); accumulate != 0 adds to dx.
void matmul_dgrad_gpu(uint16_t *dx, const uint16_t *dy, const uint16_t *w, int M, int N, int K,
                      int accumulate, cudaStream_t stream);
// dw (N, K) FP32 += dy (M, N)^T @ x (M, K).
void matmul_wgrad_gpu(float *dw, const uint16_t *dy, const uint16_t *x, int M, int N, int K,
                      cudaStream_t stream);

// Plans created so far (for tests: a repeated shape must not add one).
int matmul_gpu_plan_count(void);

#ifdef __cplusplus
}
#endif
#endif  // MATMUL_H
