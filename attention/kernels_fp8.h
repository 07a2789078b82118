// kernels_fp8.h: FP8 quantization of the attention operands on the GPU (Q, K, V in E4M3 for
// the forward, dO in the gradient format for the backward), docs/fp8-attention.md §2, and the
// FP8 forward that consumes them (attention/fwd_fp8.cu). The codes
// and scales are bit-identical to the CPU emulation's attn_quantize_operand (attention_cpu.h):
// same power-of-two scale rule (fp8_scale_for_amax), same encoder (fp8.h), same granularity.
//
// Layouts. Input: BF16 (B, T, H, d) with a row stride, as in attention/kernels_bf16.h (q/k/v may be views
// of the packed QKV buffer). Outputs are head-major and padded to whole 128-token blocks,
// Tp = attn_quant_padded_len(T), padding rows written as code 0 (so FP8 kernels load whole
// tiles without bounds checks, and zeros add nothing to a matmul):
//   codes   (B, H, Tp, d) uint8: K-major for matmuls that reduce over d (S = Q K^T, dP = dO V^T)
//   codes_t (B, H, d, Tp) uint8: the transpose, K-major for matmuls that reduce over tokens
//           (O = P V needs V^T, dV = P^T dO needs dO^T, dQ = dS K needs K^T, dK = dS^T Q needs Q^T);
//           FP8 wgmma takes only K-major operands and Hopper has no 8-bit transposing ldmatrix.
//   scales  (B, H, nblk) FP32, nblk = Tp / 128: the scale s of each (b, h, 128-token block);
//           quantized value = fp8_to_f32(code) / s (exact, s is a power of two).
//
// Scaling. Block (scale_in == NULL): s = fp8_scale_for_amax(fmt, amax of the block's current
// values), with the exponent bound max_scale_exp when it is set (V: ATTN_V_SCALE_MAX_EXP, which
// attn_gpu_forward_fp8 relies on; delayed scales of V are made within it too). Delayed (scale_in != NULL): s is read from device memory, one per tensor
// (scale_in[0]) or one per head (scale_in[b*H + h], the CPU's first step, whose scale comes from
// the head's own amax); attn_gpu_amax_reduce turns amax histories or block amaxes into those
// scales on the device, without a host round trip. Either way the block amax can be written
// out (block_amax) to feed the next steps' history.
#ifndef ATTENTION_QUANT_H
#define ATTENTION_QUANT_H

#include <stdint.h>            // uint8_t, uint16_t
#include <cuda_runtime_api.h>  // cudaStream_t

#include "core/precision.h"  // ATTN_SCALE_BLOCK (128 tokens per scale), AttnCast
#include "core/fp8.h"        // Fp8Format

#ifdef __cplusplus
extern "C" {
#endif

// T rounded up to whole scale blocks: the token extent of the quantized layouts.
static inline int attn_quant_padded_len(int T) {
    return (T + ATTN_SCALE_BLOCK - 1) / ATTN_SCALE_BLOCK * ATTN_SCALE_BLOCK;
}
static inline int attn_quant_n_blocks(int T) { return (T + ATTN_SCALE_BLOCK - 1) / ATTN_SCALE_BLOCK; }

// One tensor to quantize. Pointers are device pointers; NULL outputs are skipped.
typedef struct {
    const uint16_t *x;              // (B, T, H, d) BF16, row stride `stride` (elements)
    int stride;
    Fp8Format fmt;                  // E4M3 for Q, K, V; the grad format for dO
    uint8_t *codes;                 // (B, H, Tp, d) or NULL
    uint8_t *codes_t;               // (B, H, d, Tp) or NULL
    float *scales;                  // (B, H, nblk) or NULL
    float *block_amax;              // (B, H, nblk) or NULL: max |x| of each block
    int max_scale_exp;              // block scaling: the scales' exponent bound, 0 = FP8_SCALE_MAX_EXP;
                                    // V for the FP8 forward: ATTN_V_SCALE_MAX_EXP (attention_cpu.h)
    const float *scale_in;          // NULL: block scaling; else delayed: the scale(s) to use
    int scale_in_per_head;          // delayed: 0 = scale_in[0] for all, 1 = scale_in[b*H + h]
    unsigned long long *saturated;  // or NULL: += number of values with |x*s| > the format's max
    uint16_t *dequant;              // or NULL: (B, T, H, d) BF16, row stride dequant_stride: the
    int dequant_stride;             // quantized values fp8(x*s)/s (exact in BF16 but for BF16
                                    // subnormals), e.g. for fp8_hybrid's BF16 backward on Q̂, K̂, V̂
    // RoPE on the way in (NULL: none): x is rotated first, exactly as rope_forward_gpu (layers.h)
    // rotates q and k (element i with i + d/2 by the angle of token t, FP32, rounded to BF16), and
    // the rotated values are what every output above is made of, bit for bit as rope_forward_gpu
    // followed by this call. So the pass that makes Q̂ and K̂ is the RoPE pass too.
    const float *rope;              // (T, d/2, 2) cos, sin: rope_table_gpu's table, 16-byte aligned
    uint16_t *rotated;              // or NULL (rope only): the rotated BF16 values, (B, T, H, d) with
    int rotated_stride;             // row stride rotated_stride; may be x itself (in place)
} AttnQuantTensor;

#define ATTN_QUANT_MAX_TENSORS 4

// Quantizes n (1..4) tensors of the same shape in one launch: one CTA per (tensor, b, h,
// 128-token block) reads the block once, reduces its amax, casts, and writes both layouts (the
// transposed one through shared memory, so that its global writes are coalesced). d is 64 or
// 128; strides and pointers as attention/kernels_bf16.h requires (16-byte aligned rows); codes/codes_t
// 16-byte aligned. Checked; FATAL on violation.
void attn_gpu_quantize(const AttnQuantTensor *tensors, int n, int B, int H, int T, int d,
                       cudaStream_t stream);

// out[g] over n_groups groups of group_len consecutive floats of `in` (device pointers):
// amax_out[g] = max_i |in[g*group_len + i]| (optional), scale_out[g] = fp8_scale_for_amax(fmt,
// that max, within 2^±max_scale_exp; 0 = FP8_SCALE_MAX_EXP, V: ATTN_V_SCALE_MAX_EXP) (optional).
// Examples: per-head scales from block amaxes (group_len = nblk), the tensor's amax (one group
// over everything), the delayed scale from an amax history.
void attn_gpu_amax_reduce(const float *in, int n_groups, int group_len, Fp8Format fmt, int max_scale_exp,
                          float *amax_out, float *scale_out, cudaStream_t stream);

// fp8_hybrid's backward needs no kernel of its own: attn_gpu_backward (attention/kernels_bf16.h, BF16) run
// on the `dequant` copies of Q̂, K̂, V̂, the FP8 forward's O and LSE and the BF16 dO is exactly
// what the CPU emulation's fp8_hybrid does (test/test_attention_fp8_gpu.cu checks it).
//
// FP8 forward (attention/fwd_fp8.cu): the forward of fp8_naive / fp8_hybrid / fp8_dm on the
// operands quantized above: q_codes, k_codes (B, H, Tp, d) E4M3 and vt_codes (B, H, d, Tp) E4M3
// with their scales (B, H, nblk), powers of two as the quantize kernels write them (the kernel
// inverts them by exponent arithmetic); p_scale: the static scale of P before its E4M3 cast (256).
// o: (B, T, H, d) BF16 with row stride o_stride (written); lse: (B, H, T) FP32 natural log
// (written). Tiles: ATTN_FP8_FWD_BLOCK_Q x ATTN_FP8_FWD_BLOCK_K, the block sizes the CPU
// emulation (attn_cpu_forward) must be run with to compare P̂ code for code.
#define ATTN_FP8_FWD_BLOCK_Q 128
#define ATTN_FP8_FWD_BLOCK_K 128
void attn_gpu_forward_fp8(const uint8_t *q_codes, const uint8_t *k_codes, const uint8_t *vt_codes,
                          const float *q_scales, const float *k_scales, const float *v_scales,
                          float p_scale, uint16_t *o, int o_stride, float *lse, int B, int H, int T,
                          int d, cudaStream_t stream);
// The FP8 forward runs persistent CTAs (one per SM), each taking (query block, b, h) tiles from a
// counter (gpu/test_hooks.h lets tests cap the grid and fix the order: the outputs are the same).
// The persistent FP8 kernels (the forward, fp8_dm's delta pass) keep a tile counter per stream
// they ran on (32 at most at a time; attn_fp8_tile_counter makes or finds it, outside any graph
// capture): call this before destroying a stream that ran them (no-op for one that did not).
// Not during a graph capture.
unsigned *attn_fp8_tile_counter(cudaStream_t stream);
void attn_fp8_release_stream(cudaStream_t stream);

// FP8 backward (attention/bwd_fp8.cu): the backward of fp8_naive, fp8_dm and fp8_dm_approx
// (docs/fp8-attention.md §3) on the quantized operands above and the FP8 forward's O and LSE.
// Tiles: ATTN_FP8_BWD_BLOCK_Q queries x ATTN_FP8_BWD_BLOCK_K keys (the block sizes
// attn_cpu_backward must be run with: dS gets one power-of-two scale per tile; the forward's
// values do not depend on block_q, so the same CPU options serve the forward too). One CTA per
// (key block, b, h) walks the query blocks at or below the diagonal: S^T = K̂ Q̂^T and
// dP^T = V̂ dÔ^T (FP8 wgmma), P = exp(tau S - LSE) (FP32), dS = P (dP - D) (FP32), dŜ in the grad
// format with the tile's scale, P̂ = E4M3(P p_scale); dV += P̂^T dÔ, dK += dŜ^T Q̂, dQ += dŜ K̂
// (each tile's product in a fresh FP32 accumulator, added in FP32 registers / FP32 atomics).
// D: fp8_naive rowsum(dO ∘ O) (BF16 dO, stored O); fp8_dm_approx rowsum(dÔ ∘ O); fp8_dm the
// delta pass (attention/delta_fp8.cu: per query block it walks the key blocks and recomputes P
// and dP bit for bit as the main kernel does, D = sum P dP / sum P).
#define ATTN_FP8_BWD_BLOCK_Q 64
#define ATTN_FP8_BWD_BLOCK_K 128
typedef struct {
    AttnPrecision precision;  // ATTN_FP8_NAIVE, ATTN_FP8_DM or ATTN_FP8_DM_APPROX
    Fp8Format grad_format;    // format of the dO codes and of dŜ
    float p_scale;            // static scale of P before its E4M3 cast (256)
    // codes (B, H, Tp, d) and transposed codes (B, H, d, Tp) from attn_gpu_quantize; scales
    // (B, H, nblk). Q, K, V in E4M3, dO in grad_format.
    const uint8_t *q_codes, *qt_codes, *k_codes, *kt_codes, *v_codes, *do_codes, *dot_codes;
    const float *q_scales, *k_scales, *v_scales, *do_scales;
    const uint16_t *o;     // (B, T, H, d) BF16, row stride o_stride: the forward's output
    const uint16_t *dout;  // (B, T, H, d) BF16, row stride o_stride: dO (read by fp8_naive only)
    int o_stride;
    const float *lse;      // (B, H, T) the forward's LSE
    uint16_t *dq, *dk, *dv;  // (B, T, H, d) BF16, row stride dqkv_stride (overwritten)
    int dqkv_stride;
    void *workspace;       // attn_gpu_backward_fp8_workspace_bytes(), 16-byte aligned
    float *delta_out;      // optional (B, H, T): D as used (written)
    // optional diagnostics (both or neither), (B, H, T): per row sum_j dS_ij and
    // sum_j P_ij (|dP_ij| + |D_i|) over the FP32 dS before its cast (spec §4.1)
    float *row_ds_sum, *row_cancel;
} AttnFp8BwdArgs;
size_t attn_gpu_backward_fp8_workspace_bytes(int B, int H, int T, int d);
void attn_gpu_backward_fp8(const AttnFp8BwdArgs *args, int B, int H, int T, int d, cudaStream_t stream);
// fp8_dm's delta pass (attention/delta_fp8.cu), launched by attn_gpu_backward_fp8: D into dlt
// (B, H, T) from the codes, scales and LSE of *args; zeroes dq_acc (B, H, T, d) and the row
// diagnostics (if given) for the main kernel.
void attn_fp8_delta_pass(const AttnFp8BwdArgs *args, float *dlt, float *dq_acc, int B, int H, int T, int d,
                         cudaStream_t stream);

#ifdef __cplusplus
}
#endif
#endif  // ATTENTION_QUANT_H
