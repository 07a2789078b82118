// kernels_bf16.h: fused causal flash attention on the GPU in BF16 (the bf16 mode; the FP8 kernels
// of attention/kernels_fp8.h keep its tiles and pass order). Kernels: attention/fwd_bf16.cu
// (forward), attention/bwd_bf16.cu (backward); shared helpers: attention/common.cuh.
//
// Layout. Every BF16 tensor is token-major, (B, T, H, d) with a row stride: element
// (b, t, h, c) of q lives at q[(b*T + t)*stride + h*d + c]. So q, k, v may be views of the
// packed QKV GEMM output (B, T, 3, H, d): q = qkv, k = qkv + H*d, v = qkv + 2*H*d, stride 3*H*d;
// likewise dq/dk/dv may be views of the packed gradient buffer. o and dout use their own
// stride (H*d when they are plain (B, T, H, d)). lse is FP32 (B, H, T), natural log of
// sum_j exp(tau * S_ij), tau = 1/sqrt(d). Requirements (checked, FATAL otherwise): d is 64 or
// 128; strides and H*d multiples of 8 elements and pointers 16-byte aligned (16-byte loads).
// T is any positive length (the last tile is masked).
//
// Backward: a preprocess kernel computes D = rowsum(dO * O) (B, H, T) and zeroes the FP32 dQ
// accumulator; the main kernel walks one key block per CTA over the query blocks at or below
// the diagonal, keeps dK and dV in registers, and adds dQ into the FP32 accumulator with
// atomics; a last kernel scales dQ by tau and converts it to BF16. dK and dV are deterministic;
// dQ is not bitwise deterministic across runs (FP32 atomic adds in arbitrary order, error at
// FP32 rounding level).
#ifndef ATTENTION_GPU_H
#define ATTENTION_GPU_H

#include <stddef.h>            // size_t
#include <stdint.h>            // uint16_t (BF16 bit patterns in the C interface)
#include <cuda_runtime_api.h>  // cudaStream_t

#ifdef __cplusplus
extern "C" {
#endif

// Tile sizes of the forward kernel for head dimension d (the CPU emulation in cpu/attention_cpu.h
// must be run with these: the online softmax advances its running max one key block at a time):
// 128 x 128.
void attn_gpu_block_sizes(int d, int *block_q, int *block_k);

// Forward. q, k, v: (B, T, H, d) BF16 with row stride qkv_stride; o: (B, T, H, d) BF16 with
// row stride o_stride (written); lse: (B, H, T) FP32 (written).
void attn_gpu_forward(const uint16_t *q, const uint16_t *k, const uint16_t *v, int qkv_stride,
                      uint16_t *o, int o_stride, float *lse, int B, int H, int T, int d,
                      cudaStream_t stream);

// Bytes of FP32 scratch the backward needs: dQ accumulator (B, H, T, d) and D (B, H, T).
size_t attn_gpu_backward_workspace_bytes(int B, int H, int T, int d);

// Backward. q, k, v, o, lse as the forward saw and wrote them; dout: (B, T, H, d) BF16 with
// row stride o_stride (the same layout as o). dq, dk, dv: (B, T, H, d) BF16 with row stride
// dqkv_stride (overwritten, never accumulated into). workspace: at least
// attn_gpu_backward_workspace_bytes() bytes, 16-byte aligned, contents ignored.
void attn_gpu_backward(const uint16_t *q, const uint16_t *k, const uint16_t *v, int qkv_stride,
                       const uint16_t *o, const uint16_t *dout, int o_stride, const float *lse,
                       uint16_t *dq, uint16_t *dk, uint16_t *dv, int dqkv_stride,
                       void *workspace, int B, int H, int T, int d, cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif  // ATTENTION_GPU_H
