// qkv_gemm.h: the attention block's QKV projection as our own GEMM (qkv_gemm.cu), for FP8
// attention: y (M, N) = x (M, K) W (N, K)^T, BF16 operands, FP32 accumulation, whose epilogue can
// write FP8 attention's operands directly instead of BF16 y.
//
// Why a GEMM of our own: cuBLASLt writes y in BF16; FP8 attention then reads y again to rotate q
// and k (RoPE), find each (128-token block, head)'s amax and cast Q, K, V to E4M3 with that block's
// power-of-two scale (attention/kernels_fp8.h), a pass over 3 BT C BF16 values that costs 12-43% of
// the FP8 forward (docs/perf.md, "FP8 backward and forward + backward"). No cuBLASLt epilogue makes
// per-(128 x 128) block scales. Here every 128-token x 128-column output block, which is exactly
// one scale block of one head of q, k or v
// (N = 3 C, C = H 128: column n is operand n / C, head (n % C) / 128), is computed by one CTA, so
// its epilogue can do the whole quantization in registers and shared memory: round to BF16 (the
// value cuBLASLt's y would hold), RoPE on q and k (rope_forward_gpu's arithmetic), the tile's amax,
// the scale (fp8_scale_for_amax_within, V within 2^±ATTN_V_SCALE_MAX_EXP) and the casts, written as
// attn_gpu_quantize writes them: codes (B, H, T, 128), transposed codes (B, H, 128, T), scales
// (B, H, T/128). The codes are bit for bit what attn_gpu_quantize (with the same RoPE table) makes
// of this GEMM's own BF16 output (qkv_gemm_bf16). That output equals cuBLASLt's
// (matmul_forward_gpu) bit for bit in every shape test_qkv_gemm_gpu runs on the H200 (both sum the
// same HGMMA k-steps in K order into FP32), which is observed, not promised: a cuBLASLt that split
// K or reordered its steps would differ in the last bits.
//
// Shapes: M, N multiples of 256 (a CTA's tile is two heads wide, and the CTAs of a cluster of two
// take neighbouring 128-token blocks), K a multiple of 64; x and W contiguous rows, 16-byte
// aligned. The quantizing form: N = 3 C, head dim 128 with an even number of heads, M = B T with T
// a multiple of 128 and an even number of 128-token blocks in all. Checked; FATAL on violation
// (qkv_gemm_quant_supported says beforehand). Other shapes take cuBLASLt and the attention's
// quantize pass (the model's choice, model_gpu.cu): the same codes.
#ifndef QKV_GEMM_H
#define QKV_GEMM_H

#include <stdint.h>            // uint8_t, uint16_t
#include <cuda_runtime_api.h>  // cudaStream_t

#ifdef __cplusplus
extern "C" {
#endif

// Where the quantizing epilogue writes, per operand i (0 q, 1 k, 2 v); device pointers, codes
// 16-byte aligned. rope: rope_table_gpu's (T, 64, 2) table to rotate q and k with, or NULL.
typedef struct {
    uint8_t *codes[3];    // (B, H, T, 128) E4M3
    uint8_t *codes_t[3];  // (B, H, 128, T) E4M3, the transpose
    float *scales[3];     // (B, H, T / 128)
    const float *rope;
} QkvQuantOut;

// 0 when qkv_gemm_quant can run this projection (M = B T tokens, model width C, head dim d),
// else -1 with a one-line reason in why (may be NULL).
int qkv_gemm_quant_supported(int M, int T, int C, int d, const char **why);

// y (M, N) BF16 = x W^T, rounded once from FP32; with rope (T, 64, 2) (then N = 3 C, C a multiple
// of 256, M a multiple of T) the columns of q and k are rotated as rope_forward_gpu rotates them.
// The GEMM of qkv_gemm_quant with a BF16 epilogue: the tests' reference for its codes. Stores from
// registers (not tuned: the model uses cuBLASLt for BF16 outputs).
void qkv_gemm_bf16(uint16_t *y, const uint16_t *x, const uint16_t *w, int M, int N, int K, const float *rope, int T,
                   cudaStream_t stream);

// The projection's output quantized for FP8 attention (see above): x (M, C), W (3 C, C).
void qkv_gemm_quant(const QkvQuantOut *out, const uint16_t *x, const uint16_t *w, int M, int T, int C,
                    cudaStream_t stream);

// The number of CTAs the last launch ran (one per SM at most; whole clusters resident at once).
int qkv_gemm_last_grid(void);

#ifdef __cplusplus
}
#endif
#endif  // QKV_GEMM_H
