// attention_fp8.h: one layer's attention on the GPU in any precision of docs/fp8-attention.md:
// the one dispatcher the model, `attn-check --device gpu`, the tests and the benchmarks call.
// precision.attention goes config -> AttnOptions (core/precision.h, attn_options_from_config) ->
// attn_forward / attn_backward here, which read the mode's plan (attn_mode_plan: FP8 forward?
// FP8 backward? which D?) and launch the kernels:
//
//   mode           forward                                  backward
//   bf16           BF16 flash forward                       BF16 flash backward, D from O
//   fp8_naive      quantize Q K V (E4M3), FP8 forward       quantize dO, FP8 backward, D from O (pre kernel)
//   fp8_hybrid     quantize Q K V (E4M3), FP8 forward       BF16 backward on the dequantized Q̂ K̂ V̂, BF16 dO
//   fp8_dm         quantize Q K V (E4M3), FP8 forward       quantize dO, delta pass (matched D), FP8 backward
//   fp8_dm_approx  quantize Q K V (E4M3), FP8 forward       quantize dO, FP8 backward, D from dÔ (pre kernel)
//
// Where D is formed: attention/bwd_fp8.cu's pre kernel (from O, approx) and attention/delta_fp8.cu
// (matched: per query block it recomputes P and dP exactly as the main backward does); the main
// backward (attention/bwd_fp8.cu) reads D per row. The CPU emulation of the same plan is
// cpu/attention_cpu.c.
//
// Q, K, V of the backward: with an AttnSavedCodes (precision.attention_keep_codes) the forward's
// one quantize launch also writes every layout the backward reads (Q, K, V codes and transposed
// codes, scales; fp8_hybrid: the dequantized Q̂, K̂, V̂) into the layer's buffer and the backward
// quantizes dO alone (fp8_hybrid: nothing). Without one the backward quantizes Q, K, V again from
// the same BF16 inputs. Either way the values are the same bit for bit (block scales are functions
// of the values), so the option trades memory (core/gpu_sizes.h: 6 bytes per q/k/v element per
// layer) for two quantize passes' worth of memory traffic per layer; results do not change.
// Scaling: block scaling (per 128-token block for Q, K, V, dO, per tile for dS, static 2^8 for
// P), or with precision.attention_scaling = "delayed" one scale per tensor (Q, K, V, dO) from the
// layer's amax history (AttnDelayedGpu below; dS and P as in block scaling).
//
// Layouts: q, k, v (B, T, H, d) BF16 with row stride qkv_stride (views of the packed QKV buffer),
// o and dout (B, T, H, d) with row stride o_stride, lse (B, H, T) FP32, dq, dk, dv (B, T, H, d)
// with row stride dqkv_stride. The CPU emulation of the same mode must run with the tiles
// attn_mode_block_sizes gives.
#ifndef ATTENTION_FP8_H
#define ATTENTION_FP8_H

#include <stddef.h>            // size_t
#include <stdint.h>            // uint16_t (BF16 bits)
#include <cuda_runtime_api.h>  // cudaStream_t

#include "core/precision.h"  // AttnOptions (precision, grad_format, scaling, p_scale), AttnCast

#ifdef __cplusplus
extern "C" {
#endif

// The options of precision p as the trainer runs it on the GPU with block scaling at head dim d:
// gradient format grad_format, P's static scale 256, the tiles of attn_mode_block_sizes (tests and
// benchmarks; the trainer fills its own from the config, attn_options_from_config).
AttnOptions attn_block_options(AttnPrecision p, Fp8Format grad_format, int d);

// 0 when opt can run on the GPU; else -1 with a one-line reason in why (may be NULL):
// fp32 attention is CPU-only.
int attn_mode_supported(const AttnOptions *opt, int d, const char **why);

// Tiles the CPU emulation (attn_cpu_forward / attn_cpu_backward) must use to reproduce this
// mode's GPU numerics: the BF16 kernels' tiles for bf16, else the FP8 backward's (64 x 128;
// the FP8 forward's values depend on block_k = 128 only).
void attn_mode_block_sizes(const AttnOptions *opt, int d, int *block_q, int *block_k);

// Bytes of device scratch a forward or backward of this shape needs (the same buffer serves
// both; its contents do not survive from forward to backward). 256-byte aligned.
size_t attn_mode_workspace_bytes(const AttnOptions *opt, int B, int H, int T, int d);

// One layer's Q, K, V as its forward quantized them, kept for its backward. buf/bytes are the
// caller's (device memory, 256-byte aligned, at least attn_saved_codes_bytes); the rest is written
// by attn_forward and checked by attn_backward (host side: a backward on codes of
// another shape or mode, or of no forward, is a FATAL error, not silently wrong gradients).
typedef struct {
    void *buf;
    size_t bytes;
    int valid;  // the last attn_forward given this struct filled buf (an FP8 mode)
    AttnPrecision precision;
    int B, H, T, d;
} AttnSavedCodes;

// Bytes of an AttnSavedCodes buffer for this shape: 0 for bf16 (nothing to keep), else
// gpu_attn_saved_codes_bytes (the same for every FP8 mode).
size_t attn_saved_codes_bytes(const AttnOptions *opt, int B, int H, int T, int d);

// Where a filled AttnSavedCodes of an FP8-backward mode (naive, dm, dm_approx) keeps operand i
// (0 Q, 1 K, 2 V): codes (B, H, Tp, d), codes_t (B, H, d, Tp), scales (B, H, Tp/128), exactly
// attn_gpu_quantize's outputs for that operand (for tests). fp8_hybrid: *dequant is the (B, T, 3,
// H, d) BF16 Q̂ | K̂ | V̂ and the code pointers are NULL. Device pointers; any output may be NULL.
void attn_saved_codes_view(const AttnSavedCodes *s, int i, const uint8_t **codes, const uint8_t **codes_t,
                           const float **scales, const uint16_t **dequant);

// Optional outputs for diagnostics and tests (any pointer may be NULL; device memory).
typedef struct {
    // += number of FP8 casts past the format's max, per AttnCast (Q, K, V by the forward, dO by
    // the backward; P and dS never saturate: P <= 1 under its static 2^8 scale, dS's scale is
    // its tile's amax).
    unsigned long long *saturated;  // (ATTN_N_CASTS)
    // FP8 backward modes (naive, dm, dm_approx): per row sum_j dS_ij and sum_j P_ij(|dP_ij| +
    // |D_i|) over the FP32 dS before its cast, (B, H, T) each; the cancellation-scaled row-sum
    // residual of spec §4.1 is |row_ds_sum| / row_cancel. Not written in bf16 / fp8_hybrid.
    float *row_ds_sum, *row_cancel;
    float *delta;  // (B, H, T): D as the backward used it (FP8 backward modes)
    // Probes (diagnostics), after the backward, on its dq, dk, dv (x below):
    //   dqkv_keep (B, T, 3, H, d) BF16: a copy of dq | dk | dv;
    //   dqkv_cmp (same layout) with cmp_sq (6 doubles): += sum (x - cmp)^2 and sum cmp^2 for dq,
    //     dk, dv in turn (the gradients of another run of the same batch, kept by dqkv_keep);
    //   local_ref with local_sq (6 doubles): this layer's attention recomputed in the reference
    //     precision (forward and backward, same q, k, v, dout) into the scratch ref_o (B, T, H, d),
    //     ref_lse (B, H, T), ref_dqkv (B, T, 3, H, d); += sum (x - ref)^2 and sum ref^2 as above.
    //     The reference reuses the workspace: it must not need more of it than the mode (bf16
    //     never does).
    uint16_t *dqkv_keep;
    const uint16_t *dqkv_cmp;
    double *cmp_sq;
    const AttnOptions *local_ref;
    uint16_t *ref_o, *ref_dqkv;
    float *ref_lse;
    double *local_sq;
} AttnModeDiag;

// Delayed scaling of one layer on the GPU (opt->scaling == SCALING_DELAYED; required then, else
// ignored). The history itself stays on the host in an AttnDelayedState (core/precision.h), the
// CPU backend's type (same commits, same checkpoints); the caller derives from it, per step, what
// the kernels need:
//   first_step: the history is empty, so each head's tensor scale comes from the head's own amax
//     (attention_cpu.c's delayed_scale): one more quantize pass per tensor finds it;
//   scale (4) device: else this step's scale of Q, K, V, dO, fp8_scale_for_amax of the history's
//     max (core/precision.h's attn_delayed_scales);
//   cur_amax (4) device, or NULL: max-accumulates this step's amax of Q, K, V (forward) and dO
//     (backward), the values attention_cpu.c collects in cur_amax with update_amax (a training
//     step; NULL for evaluation forwards and probes, which the trainer does not let count).
typedef struct {
    int first_step;
    const float *scale;
    float *cur_amax;
} AttnDelayedGpu;

// One call of one layer's attention: its shape, tensors and state. attn_forward reads q, k, v
// (or the kept codes, with codes_ready) and writes o, lse (and the kept codes); attn_backward
// reads q, k, v, o, dout, lse (and the kept codes) and overwrites dq, dk, dv. Fields a call does
// not use may be left zero.
typedef struct {
    const AttnOptions *opt;
    int B, H, T, d;
    const uint16_t *q, *k, *v;  // (B, T, H, d) each, row stride qkv_stride
    int qkv_stride;
    uint16_t *o;                // (B, T, H, d), row stride o_stride: the forward's output
    const uint16_t *dout;       // (B, T, H, d), row stride o_stride: the backward's input
    int o_stride;
    float *lse;                 // (B, H, T): the forward's row log-sum-exp (natural log)
    uint16_t *dq, *dk, *dv;     // (B, T, H, d), row stride dqkv_stride: the backward's outputs
    int dqkv_stride;
    // Forward with RoPE first: the (T, d/2, 2) table of rope_table_gpu (gpu/layers.h); q, k are not
    // yet rotated and q is the start of the packed (B, T, 3, H, d) qkv (qkv_stride 3 H d). Every
    // output is the same bit for bit as rope_forward_gpu(qkv) then the forward. The FP8 modes rotate
    // q and k as their quantize pass reads them (one pass over q, k, v does both); with
    // rotate_in_place they also write the rotated q, k back into qkv, without it qkv is left as it
    // was (for callers whose backward reads no BF16 q, k: kept codes and no local reference). bf16
    // runs rope_forward_gpu first (rotate_in_place must be 1).
    const float *rope;
    int rotate_in_place;
    // Forward on codes written upstream: saved already holds Q, K, V's codes, transposed codes and
    // scales (the QKV projection's epilogue, gpu/qkv_gemm.h, writes them where
    // attn_saved_codes_parts says); q, k, v are not read. Only where attn_mode_codes_upstream.
    int codes_ready;
    AttnSavedCodes *saved;           // NULL, or this layer's kept codes (filled by the forward in
                                     // FP8 modes, marked not valid in bf16; checked by the backward)
    const AttnDelayedGpu *delayed;   // NULL in block scaling, this layer's state in delayed scaling
    void *workspace;                 // attn_mode_workspace_bytes, 256-byte aligned; not kept between
                                     // the forward and the backward
    const AttnModeDiag *diag;        // NULL, or the diagnostics outputs
    cudaStream_t stream;
} AttnCall;

void attn_forward(const AttnCall *c);
// With saved codes the FP8 modes read no q, k, v, except for the diagnostics' local reference;
// bf16 always reads them.
void attn_backward(const AttnCall *c);

// Q, K, V quantized upstream: the QKV projection's epilogue (gpu/qkv_gemm.h) can write the kept
// codes itself, straight from its FP32 sums, so that no pass reads q, k, v again. For the modes
// where those codes are all the forward and backward read (an FP8 backward with block scaling:
// attn_mode_codes_upstream returns 1; fp8_hybrid keeps dequantized BF16 copies and delayed scaling
// needs the history's scale first, so they quantize here), attn_saved_codes_parts gives where a
// kept-codes buffer of this shape holds operand i's codes (B, H, T, d), transposed codes (B, H, d,
// T) and scales (B, H, T/128). T must be a multiple of 128 (no padding rows).
int attn_mode_codes_upstream(const AttnOptions *opt, int d, int T);
void attn_saved_codes_parts(const AttnOptions *opt, const AttnSavedCodes *s, int B, int H, int T, int d,
                            uint8_t *codes[3], uint8_t *codes_t[3], float *scales[3]);

#ifdef __cplusplus
}
#endif
#endif  // ATTENTION_FP8_H
