// matmul_cpu.h: the FP32 matrix products of the CPU backend (forward and both backward forms).
//
// All matrices are row-major and contiguous. Every output element is computed by one thread as
// the plain sequential sum over k in increasing order, starting from 0 (accumulate == 0) or from
// the element's current value (accumulate != 0). Blocking, vector width and thread count
// therefore never change a single bit of the result (resume tests and the GPU comparisons rely
// on it). No fused multiply-add is used, so the AVX2 path and the portable path agree bitwise.
#ifndef MATMUL_CPU_H
#define MATMUL_CPU_H

#ifdef __cplusplus
extern "C" {
#endif

// out (M, N) (+)= a (M, K) @ b (N, K)^T      forward of a linear layer (b is the weight)
void matmul_nt(float *out, const float *a, const float *b, int M, int N, int K, int accumulate);

// out (M, N) (+)= a (M, K) @ b (K, N)        input gradient: dX = dY @ W
void matmul_nn(float *out, const float *a, const float *b, int M, int N, int K, int accumulate);

// out (M, N) (+)= a (K, M)^T @ b (K, N)      weight gradient: dW += dY^T @ X
void matmul_tn(float *out, const float *a, const float *b, int M, int N, int K, int accumulate);

#ifdef __cplusplus
}
#endif
#endif  // MATMUL_CPU_H
