// adamw_gpu.h: the AdamW update on the GPU (kernel in adamw_gpu.cu), bit-identical to the CPU's
// adamw_update_range (optimizer.c): the same float coefficients computed on the host in double
// and rounded once, then the same sequence of correctly rounded FP32 operations per element
// (__fmul_rn / __fadd_rn / __fsub_rn / __fsqrt_rn / __fdiv_rn, so nvcc cannot contract them
// into FMAs). FP32 master weights p, FP32 gradients g and moments m, v; the updated weight is
// also written as BF16 (round to nearest even) into the working copy when one is given.
//
// Weight decay is per tensor: call once per tensor (or per slice of one, for ZeRO-1) with
// wd = weight_decay where the tensor's desc.weight_decay, else 0 — the loop of
// adamw_update_slice in optimizer.c, with the device pointers offset to the tensor.
#ifndef ADAMW_GPU_H
#define ADAMW_GPU_H

#include <stddef.h>            // size_t
#include <stdint.h>            // uint16_t (BF16 bits)
#include <cuda_runtime_api.h>  // cudaStream_t

#ifdef __cplusplus
extern "C" {
#endif

// Elements [0, n) of p, g, m, v (device, FP32) and of p_bf16 (device BF16, or NULL: not
// written). clip multiplies g first; step_1based is the bias-correction step (>= 1).
void adamw_update_gpu(float *p, uint16_t *p_bf16, const float *g, float *m, float *v, size_t n,
                      double lr, double beta1, double beta2, double eps, double wd, double clip,
                      long long step_1based, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif  // ADAMW_GPU_H
