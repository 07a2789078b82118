// model_gpu.h: the GPU backend: the whole GPT of model.h with BF16 storage and FP32
// accumulation (kernels of layers.h, cuBLASLt GEMMs of matmul.h, flash attention of
// attention/kernels_bf16.h), FP32 master weights, FP32 gradients and AdamW (adamw_gpu.h) on the device.
// The same shape of API as the CPU reference (model_cpu.h), plus host copies of parameters,
// gradients and optimizer state for checkpoints and tests.
//
// Memory: gpu_model_init computes ONE allocation plan up front (gpu_model_plan, host code, no
// GPU needed), prints it, and takes all of it in one cudaMalloc carved into the buffers; the
// categories are those of model.h's MemoryPlan and of `--dry-run` (see gpu_model_plan_compare).
//
// The LM head is fused with the cross-entropy, chunk by chunk of tokens (as llm.c does): a
// chunk of logits (n, Vp) is computed into one BF16 buffer, the CE kernel overwrites it with
// dlogits in place, and the head's input gradient (dgrad) and weight gradient (wgrad) are
// taken from it at once, so the (B*T, Vp) probabilities are never stored. Consequence: the
// FORWARD already adds the head's weight gradient into the FP32 gradients, scaled by
// m->loss_scale (set it with gpu_model_set_loss_scale, normally 1/grad_accum, before the
// forward); gpu_model_backward(m, loss_scale) must receive the same scale (FATAL otherwise).
// A forward that is not followed by a backward therefore leaves the head's gradient in the
// gradients: use gpu_model_loss for evaluation (it computes no gradient).
//
// Precision: precision.attention runs through attention_fp8.h in any mode it supports (bf16 and
// the FP8 modes, with block or delayed scaling; fp32 is refused with a message). precision.linear
// may be "bf16", "fp8_tensor" or "fp8_block": the blocks' linears that linear_precision_of
// (linear_fp8.h) puts in FP8 quantize their GEMM operands with linear_fp8_gpu.h exactly as
// linear_fp8.c's contract says (the CPU backend emulates the same codes). An FP8 LM head
// (linear_keep_lm_head_bf16 = false) runs with fp8_block only (fp8_tensor's per-chunk scales
// would not be the CPU's); FP8 linears need d_model and ffn_hidden multiples of 16, and B*T a
// multiple of 16. With fp8_block, the kernels
// that produce a linear's input (RMSNorm, SwiGLU) or output gradient (the SwiGLU backward) write
// its FP8 codes themselves (layers_fp8.h; same codes); with fp8_tensor those kernels and the
// RMSNorm backwards (the residual gradient) take their output's amax, so its quantization has no
// amax pass of its own (same codes); precision.fuse_fp8_producers = false turns both off.
// train.recompute: the attention/MLP RMSNorm outputs and the SwiGLU output are not kept per
// layer but recomputed in the backward from the saved residuals (one norm or SwiGLU kernel
// each), which saves 2*(2C + F) bytes per token and layer.
#ifndef MODEL_GPU_H
#define MODEL_GPU_H

#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t tokens
#include <stdio.h>   // FILE for the plan printer

#include "attention_fp8.h"  // AttnModeDiag
#include "core/common.h"    // ErrBuf
#include "core/config.h"    // Config, TrainConfig
#include "core/model.h"     // ParamTable, MemoryPlan
#include "eval/probe.h"     // ModelProbe

#ifdef __cplusplus
extern "C" {
#endif

typedef void (*GpuGradReadyFn)(void *ctx, size_t lo, size_t hi);  // gpu_model_set_grad_ready_hook

typedef struct {
    Config cfg;          // copy of the validated config
    ParamTable table;    // the same table (names, offsets, decay flags) as the CPU backend
    int B, T;            // micro-batch shape the activations were sized for
    float loss_scale;    // scale the next forward puts into the head's gradient (default 1)
    long long step;      // AdamW steps taken (bias correction uses step + 1 while updating)
    MemoryPlan plan;     // what gpu_model_init allocated, by category (bytes)
    // ZeRO-1 (gpu_model_init_sharded): this rank's slice [shard_lo, shard_hi) of the flat
    // parameters, S = shard_len = ceil(P / shard_world) and shard_lo = shard_rank * S (both
    // clipped to P). Only the slice's FP32 masters and AdamW moments exist on this GPU, in (S)
    // buffers (zero past the slice); BF16 weights and FP32 gradients stay full (P).
    // Without ZeRO-1: rank 0 of 1, the slice [0, P), S = P.
    int shard_rank, shard_world;
    size_t shard_lo, shard_hi, shard_len;
    GpuGradReadyFn grad_ready_fn;  // gpu_model_set_grad_ready_hook; NULL: none
    void *grad_ready_ctx;
    void *priv;          // device buffers and state, private to model_gpu.cu
} GpuModel;

// Plan of the device memory for micro-batches (B, T) of config c, by category, exactly as
// gpu_model_init allocates it (the cuBLASLt workspace of matmul.h included under workspace).
// Host code: works without a GPU. Returns 0, or -1 with e filled when the config cannot run
// on the GPU backend (precision, head_dim, shapes).
int gpu_model_plan(const Config *c, int B, int T, MemoryPlan *out, ErrBuf *e);
// The same for one of `world` ranks with ZeRO-1 (zero1 and world > 1: FP32 masters and AdamW
// moments of S = ceil(P / world) elements), equal byte for byte to model.h's
// memory_plan(c, world, zero1, B) (--dry-run --world-size N --zero1).
int gpu_model_plan_sharded(const Config *c, int B, int T, int world, int zero1, MemoryPlan *out, ErrBuf *e);
// Prints the plan next to model.h's memory_plan for the same (B, T) (one line per category,
// with the difference) to f.
void gpu_model_plan_compare(FILE *f, const Config *c, int B, int T);

// Initialises parameters with params_init(seed) on the host, copies them to the device as FP32
// masters and BF16 working weights, zeroes gradients and AdamW state, and sizes activations for
// micro-batches of B sequences of T tokens (T <= model.seq_len). Prints the allocation plan to
// plan_out (NULL: silent). Returns 0, or -1 with e filled for a config the GPU backend cannot
// run, or when the plan does not fit in the free device memory (the message gives both sizes).
int gpu_model_init(GpuModel *m, const Config *c, int B, int T, unsigned long long seed,
                   FILE *plan_out, ErrBuf *e);
// gpu_model_init for rank `rank` of `world` under ZeRO-1 (world 1: gpu_model_init): allocates
// the plan of gpu_model_plan_sharded(c, B, T, world, 1) and keeps only this rank's slice of the
// masters and moments (see GpuModel). Under sharding gpu_model_step, gpu_model_get_params and
// gpu_model_get_opt_state are errors (the full state is on no GPU: zero1_gpu.h gathers it);
// set_params and set_opt_state take full host arrays and keep the slice.
int gpu_model_init_sharded(GpuModel *m, const Config *c, int B, int T, unsigned long long seed, int rank,
                           int world, FILE *plan_out, ErrBuf *e);
void gpu_model_free(GpuModel *m);

// Scale of the head's gradient for the following forwards (see above). Default 1.
void gpu_model_set_loss_scale(GpuModel *m, float loss_scale);

// Forward of tokens, targets (B, T) int32 host arrays; targets < 0 are ignored. Returns the mean
// loss over counted targets. Keeps the activations for backward and ADDS the LM head's weight
// gradient (times m->loss_scale) into the gradients. Token or target ids >= vocab_size are an
// internal error (FATAL), as on the CPU.
float gpu_model_forward(GpuModel *m, const int32_t *tokens, const int32_t *targets);
// Backward of the last forward: ADDS d(loss * loss_scale)/d(params) into the FP32 gradients.
void gpu_model_backward(GpuModel *m, float loss_scale);
// Gradient-ready hook (data parallelism overlapping the reduction with the backward, zero1_gpu.h):
// gpu_model_backward calls fn(ctx, lo, hi) on the host each time the work that finishes the
// gradients [lo, hi) of the flat buffer has been ENQUEUED on the model's stream (not yet run):
// nothing later in this backward touches them. The calls come in this order, each range just
// below the previous one, together [0, P): [final_norm, P) after the final norm's backward (the
// untied LM head was completed by the forward), then each block's tensors, layer n_layer-1 down
// to 0, then [0, layers.0) (wte: the embedding's gradient, and the tied head's from the forward)
// after the embedding's backward. fn NULL: no calls (the default). Affects only the backwards
// that run while it is set (the backend sets it around the last micro-step's backward only).
void gpu_model_set_grad_ready_hook(GpuModel *m, GpuGradReadyFn fn, void *ctx);
// Forward only (evaluation): the same loss, no gradient work; a following backward is an error.
float gpu_model_loss(GpuModel *m, const int32_t *tokens, const int32_t *targets);
// gpu_model_loss that also gives the per-token losses (B*T host floats; 0 where a target is
// ignored; NULL to skip) and the logits (n_rows, Vp host floats, BF16 values) of the listed rows
// (indices into the B*T tokens), as the cross-entropy read them; the CPU's
// cpu_model_loss_detail contract.
float gpu_model_loss_detail(GpuModel *m, const int32_t *tokens, const int32_t *targets, float *losses, int n_rows,
                            const int *rows, float *row_logits);
// Logits of the last position only, for sampling: tokens (1, t) host, t <= T; logits (Vp) host
// FP32 (from the BF16 GEMM output).
void gpu_model_next_logits(GpuModel *m, const int32_t *tokens, int t, float *logits);

void gpu_model_zero_grad(GpuModel *m);
// Global L2 norm of the FP32 gradients (FP64 accumulation, fixed partition: reproducible).
double gpu_model_grad_norm(GpuModel *m);
// One AdamW step over all tensors (decay where the table's weight_decay flag is set, with
// tc->weight_decay, beta1, beta2, eps), gradients multiplied by clip first (the factor of
// grad_clip_factor, optimizer.h); bias correction with step + 1, then m->step++. Bit-identical
// to optimizer.c's adamw_step on the same FP32 values; also rewrites the BF16 working weights.
void gpu_model_step(GpuModel *m, double lr, double clip, const TrainConfig *tc);
// ZeRO-1: the same update for this rank's slice [shard_lo, shard_hi) only, from the summed
// gradients at grads[shard_lo, shard_hi) (where an in-place reduce-scatter leaves them): the
// slice's masters and moments, and the BF16 weights [shard_lo, shard_hi). A tensor cut by a
// slice boundary keeps its weight decay (optimizer.c's adamw_update_slice). Then m->step++.
// Without sharding it is gpu_model_step.
void gpu_model_step_slice(GpuModel *m, double lr, double clip, const TrainConfig *tc);
// Sum of squares of the gradients [lo, hi) in FP64 (the fixed partition of gpu_model_grad_norm
// over that range, so the same range gives the same bits on any rank).
double gpu_model_grad_sumsq(GpuModel *m, size_t lo, size_t hi);

// Host copies (table.total FP32 values each), for checkpoints and tests.
void gpu_model_get_params(GpuModel *m, float *params);
void gpu_model_set_params(GpuModel *m, const float *params);  // also refreshes the BF16 copy
void gpu_model_get_grads(GpuModel *m, float *grads);
void gpu_model_set_grads(GpuModel *m, const float *grads);
// AdamW moments (table.total each) and step count.
void gpu_model_get_opt_state(GpuModel *m, float *adam_m, float *adam_v, long long *step);
void gpu_model_set_opt_state(GpuModel *m, const float *adam_m, const float *adam_v, long long step);

// Data parallelism (comm.h's NCCL collectives run on the model's buffers, on its stream): the
// device FP32 gradients (table.total values) and the cudaStream_t all of the model's work uses.
float *gpu_model_grads_device(GpuModel *m);
void *gpu_model_stream(GpuModel *m);
// ZeRO-1 (zero1_gpu.c): the device BF16 working weights (P, as uint16_t bits), and the FP32
// masters and AdamW moments (shard_len each: this rank's slice).
uint16_t *gpu_model_weights_device(GpuModel *m);
void gpu_model_state_device(GpuModel *m, float **master, float **adam_m, float **adam_v);

// Attention precision for the following forwards and backwards (diagnostics recompute a batch in
// the reference precision): -1 when the mode cannot run on the GPU, needs more workspace than
// the configured mode's, or has a backward that reads a BF16 activation this model does not keep
// (model.h's gpu_keeps_*: bf16 after a config with FP8 attention, kept codes and diagnostics off,
// which keeps no q, k, v). A pending backward is cancelled.
int gpu_model_set_attention(GpuModel *m, AttnPrecision p);
AttnPrecision gpu_model_attention(GpuModel *m);
// Diagnostics outputs of the attention of every layer (n_layer entries, device pointers, see
// attention_fp8.h's AttnModeDiag), used by the following forwards and backwards; NULL: none.
// The array must outlive its use. Set it before the forward whose backward it is for: a pending
// backward is cancelled (its forward kept only what a backward without these diagnostics reads,
// e.g. no rotated q, k with FP8 attention's kept codes). A local reference reads the BF16 q, k, v:
// fatal where the model does not keep them.
void gpu_model_set_attn_diag(GpuModel *m, const AttnModeDiag *per_layer);

// Attention delayed scaling (precision.attention_scaling = "delayed"): the per-layer amax
// histories, n_layer entries in *n (NULL, 0 otherwise). Host memory, the state itself: every
// forward derives the step's scales from it and every backward commits the step's amaxes into it
// (as the CPU backend does), so a caller may save, restore or checkpoint it between steps.
AttnDelayedState *gpu_model_delayed_state(GpuModel *m, int *n);

// Diagnostics probe (probe.h): forward + backward of tokens, targets (B, T) with attention in
// `precision`, leaving the training state as it was (gradients, attention precision, loss
// scale; the activations are the probe's afterwards, so call it between steps). Fills out's
// loss, grads, per-layer saturation counts and cancellation-scaled row residuals (FP8 backward
// modes), local_sq against `local_ref` (ATTN_N_PRECISIONS: none), and, when compare_with is
// given (a probe of the same batch run with keep = 1), cmp_sq against its dq, dk, dv. keep = 1
// keeps this probe's dq, dk, dv on the device for such a comparison.
void gpu_probe_alloc(ModelProbe *p, GpuModel *m, int keep);
void gpu_probe_free(ModelProbe *p);
void gpu_model_probe(GpuModel *m, AttnPrecision precision, AttnPrecision local_ref, const int32_t *tokens,
                     const int32_t *targets, const ModelProbe *compare_with, ModelProbe *out);

// Phase profile (model_gpu_profile.cu): on = 1 starts (or restarts) charging the model stream's
// time to phases (forward / backward linears, attention, norms, head, reduction, AdamW, gaps)
// with CUDA events; on = 0 stops and frees it. The report prints ms per step over `steps`.
void gpu_model_profile(GpuModel *m, int on);
void gpu_model_profile_report(GpuModel *m, FILE *f, long long steps);
// paused = 1: the marks are ignored until paused = 0, and the stream's work in between is charged
// to no phase (the trainer pauses between steps: evaluation, diagnostics and checkpoints).
void gpu_model_profile_pause(GpuModel *m, int paused);

// FP8 GEMMs (forward, dgrad and wgrad each count one) run since gpu_model_init: 12 per FP8 block
// per forward + backward, 4 per forward only. For tests.
long long gpu_model_fp8_gemm_count(GpuModel *m);
// Quantizations of an FP8 linear's weight into Q(W) and Q(W^T) so far (one per FP8 linear per
// forward that follows a change of the BF16 weights; for tests).
long long gpu_model_fp8_weight_refreshes(GpuModel *m);
// The fusions (docs/config.md; the same codes with or without each) and how often they ran, for
// tests.
// precision.fuse_fp8_producers: producer kernels that wrote FP8 codes so far (layers_fp8.h): per
// fp8_block block 3 per forward (the two RMSNorms feeding qkv and MLP-in, SwiGLU feeding MLP-out)
// and 1 per backward; per fp8_tensor block, those that took an amax: the same 3 per forward and 3
// per backward (the SwiGLU backward and the two RMSNorm backwards feeding the output projections).
long long gpu_model_fp8_fused_count(GpuModel *m);
// precision.fuse_attention_rope (FP8 attention with RoPE and no QK-norm: q and k rotated inside the
// attention's quantize pass, AttnCall.rope): layer forwards that ran the fused pass so far.
long long gpu_model_attn_rope_fused_count(GpuModel *m);
// precision.fuse_qkv_epilogue: FP8 precision.attention whose forward keeps its codes for the
// backward (fp8_naive, fp8_dm, fp8_dm_approx with block scaling and precision.attention_keep_codes),
// BF16 linears, no QK-norm and the shapes qkv_gemm_quant_supported takes run the QKV projection as
// qkv_gemm_quant (qkv_gemm.h), whose epilogue rotates q, k and writes the Q, K, V codes the
// attention reads, instead of cuBLASLt's BF16 qkv and the attention's quantize pass. The same bits
// wherever the two GEMMs' sums agree (on the H200 in every shape measured, qkv_gemm.h;
// test_model_gpu_fp8 also bounds the difference, should a GEMM sum in another order). Training
// forwards with a diagnostics probe on the layer, and evaluation forwards (no codes kept), take the
// BF16 GEMM. The count: layer forwards that ran the epilogue.
long long gpu_model_qkv_epilogue_count(GpuModel *m);

#ifdef __cplusplus
}
#endif
#endif  // MODEL_GPU_H
