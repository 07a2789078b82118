// model_gpu.h: the GPU backend: the whole GPT of model.h with BF16 storage and FP32
// accumulation (kernels of layers.h, cuBLASLt GEMMs of matmul.h, flash attention of
// attention_gpu.h), FP32 master weights, FP32 gradients and AdamW (adamw_gpu.h) on the device.
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
// Precision: precision.attention must be "bf16" (gpu_model_init returns -1 with a message
// otherwise). precision.linear may be "bf16", "fp8_tensor" or "fp8_block": the blocks'
// linears that linear_precision_of (linear_fp8.h) puts in FP8 quantize their GEMM operands with
// linear_fp8_gpu.h exactly as linear_fp8.c's contract says (the CPU backend emulates the same
// codes). FP8 linears need linear_keep_lm_head_bf16 = true (an FP8 LM head is refused),
// d_model and ffn_hidden multiples of 16, and B*T a multiple of 16.
// train.recompute: the attention/MLP RMSNorm outputs and the SwiGLU output are not kept per
// layer but recomputed in the backward from the saved residuals (one norm or SwiGLU kernel
// each), which saves 2*(2C + F) bytes per token and layer.
#ifndef MODEL_GPU_H
#define MODEL_GPU_H

#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t tokens
#include <stdio.h>   // FILE for the plan printer

#include "common.h"  // ErrBuf
#include "config.h"  // Config, TrainConfig
#include "model.h"   // ParamTable, MemoryPlan

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    Config cfg;          // copy of the validated config
    ParamTable table;    // the same table (names, offsets, decay flags) as the CPU backend
    int B, T;            // micro-batch shape the activations were sized for
    float loss_scale;    // scale the next forward puts into the head's gradient (default 1)
    long long step;      // AdamW steps taken (bias correction uses step + 1 while updating)
    MemoryPlan plan;     // what gpu_model_init allocated, by category (bytes)
    void *priv;          // device buffers and state, private to model_gpu.cu
} GpuModel;

// Plan of the device memory for micro-batches (B, T) of config c, by category, exactly as
// gpu_model_init allocates it (the cuBLASLt workspace of matmul.h included under workspace).
// Host code: works without a GPU. Returns 0, or -1 with e filled when the config cannot run
// on the GPU backend (precision, head_dim, shapes).
int gpu_model_plan(const Config *c, int B, int T, MemoryPlan *out, ErrBuf *e);
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
// Forward only (evaluation): the same loss, no gradient work; a following backward is an error.
float gpu_model_loss(GpuModel *m, const int32_t *tokens, const int32_t *targets);
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

// Host copies (table.total FP32 values each), for checkpoints and tests.
void gpu_model_get_params(GpuModel *m, float *params);
void gpu_model_set_params(GpuModel *m, const float *params);  // also refreshes the BF16 copy
void gpu_model_get_grads(GpuModel *m, float *grads);
// AdamW moments (table.total each) and step count.
void gpu_model_get_opt_state(GpuModel *m, float *adam_m, float *adam_v, long long *step);
void gpu_model_set_opt_state(GpuModel *m, const float *adam_m, const float *adam_v, long long step);

// Data parallelism (comm.h's NCCL collectives run on the model's buffers, on its stream): the
// device FP32 gradients (table.total values) and the cudaStream_t all of the model's work uses.
float *gpu_model_grads_device(GpuModel *m);
void *gpu_model_stream(GpuModel *m);

// FP8 GEMMs (forward, dgrad and wgrad each count one) run since gpu_model_init: 12 per FP8 block
// per forward + backward, 4 per forward only. For tests.
long long gpu_model_fp8_gemm_count(GpuModel *m);

#ifdef __cplusplus
}
#endif
#endif  // MODEL_GPU_H
