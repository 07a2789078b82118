// backend.h: one face for the two model backends, so the trainer and the sampler do not care
// which one runs: the CPU reference (model_cpu.h with optimizer.h's AdamW on the host) or the
// GPU backend (model_gpu.h, AdamW on the device).
//
// A training step is, on either backend:
//   backend_zero_grad(b);
//   for each micro-batch: loss += backend_forward_backward(b, inputs, targets);
//   norm = backend_grad_norm(b);
//   backend_step(b, lr, grad_clip_factor(tc, norm), tc);
// Data parallelism (world > 1, a backend made by backend_init_dp): every rank runs the
// micro-batches of its data, then backend_dp_sync_grads sums the gradients over the ranks (each
// backward is scaled by 1 / (grad_accum x world), so the sum is the mean) and returns the global
// norm, and backend_dp_step updates. ZeRO-1: the sum is a reduce-scatter, each rank keeps AdamW
// moments for its contiguous slice [rank*S, min((rank+1)*S, total)) of the flat parameters,
// S = ceil(total / world) (model.h's memory plan's P_shard), updates only that slice and
// all-gathers the parameters. On the GPU the FP32 masters are sharded too and the all-gather
// carries the BF16 working weights (zero1_gpu.h). The norm is the sum of the slices' sums of
// squares in rank order, in plain DP too, so ZeRO-1 and plain runs clip alike, bit for bit. The
// collectives are comm.h's: NCCL on the GPU's device buffers, the host transport on the CPU.
//
// A step whose loss or norm is not finite (train_gpt.c's run loop) is not applied: the caller
// skips backend_step / backend_dp_step, which leaves parameters, AdamW moments and step untouched
// on both backends (the GPU's norm is an FP64 sum of squares read back to the host, so a NaN or
// Inf gradient anywhere makes it non-finite, on every rank alike after the reduction); the next
// backend_zero_grad clears the gradients. The delayed-scaling histories the step's backwards
// committed live in backend_delayed_state's host array on both backends (the GPU uploads them
// before each forward), so the caller restores them from a copy taken before the step.
//
// Checkpoints see the state as host FP32 arrays (backend_get_state / backend_set_state), so the
// checkpoint format does not depend on the backend: a run saved on one resumes on the other.
//
// Exactness: the CPU path is the CPU reference's arithmetic unchanged, so a CPU resume is bit
// for bit. On the GPU, parameters, AdamW state and step are restored exactly, but the
// attention backward adds dQ with FP32 atomics in arbitrary order, so two GPU runs (resumed or
// not) agree only to FP32 rounding in the gradients, not bit for bit.
#ifndef BACKEND_H
#define BACKEND_H

#include <stdint.h>  // int32_t tokens
#include <stdio.h>   // FILE for the memory plan

#include "core/precision.h"  // AttnDelayedState
#include "core/common.h"     // ErrBuf
#include "core/config.h"     // Config, DeviceKind, TrainConfig
#include "gpu/gpu_info.h"    // GpuInfo
#include "core/model.h"      // ParamTable
#include "cpu/model_cpu.h"   // CpuModel
#include "gpu/model_gpu.h"   // GpuModel
#include "optimizer.h"       // AdamW

struct Comm;  // comm.h

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    DeviceKind kind;    // DEVICE_CPU or DEVICE_GPU (never DEVICE_AUTO)
    int B, T;           // micro-batch shape
    int grad_accum;     // micro-batches per step over all ranks: each backward is scaled by
                        // 1 / grad_accum (the trainer passes its accumulation x world size)
    CpuModel cpu;       // CPU: the model (parameters, gradients, activations)
    AdamW adam;         // CPU: AdamW moments and step (ZeRO-1: n = shard_len, the slice only)
    GpuModel gpu;       // GPU: everything on the device
    // Data parallelism (backend_init_dp); comm NULL: one process.
    struct Comm *comm;
    int zero1;                     // AdamW state sharded (CPU: the moments; GPU: masters and moments)
    size_t shard_begin, shard_end; // ZeRO-1: this rank's slice of the flat parameters
    size_t shard_len;              // S = ceil(total / world): every rank's slice length, padded
    float *zero1_buf;              // ZeRO-1: (world * S) gradients, then parameters, for the collectives
    // GPU, train.overlap_comm: the last micro-step's backward hands its gradients to NCCL layer by
    // layer (zero1_gpu.h's GpuDpOverlap); NULL: reduced after the backward in one collective.
    struct GpuDpOverlap *overlap;
    int micro, micro_per_rank;     // micro-steps since backend_zero_grad; per rank and step
} Backend;

// Which device a run uses. want: the config's train.device (or --device). AUTO takes the GPU
// when gpu_info finds one and the GPU backend supports the config (for micro-batches (B, T));
// otherwise the CPU, with a one-line note saying why in note (may be NULL), e.g. "note: no GPU
// (...): <activity> on the CPU" (activity: "training", "sampling"). An explicit GPU request
// without a GPU, or with a config the GPU backend cannot run, is a user error: -1 with e filled.
// info (may be NULL) receives what gpu_info_query found. Returns DEVICE_CPU or DEVICE_GPU.
int backend_choose_device(const Config *c, DeviceKind want, int B, int T, const char *activity,
                          GpuInfo *info, char *note, int note_len, ErrBuf *e);

// Builds the model for micro-batches (B, T) with parameters from params_init(seed) and zeroed
// optimizer state. kind: DEVICE_CPU or DEVICE_GPU (resolve AUTO with backend_choose_device
// first). The GPU backend prints its memory plan to plan_out (NULL: silent). Returns 0, or -1
// with e filled when the GPU backend refuses the config or the plan does not fit.
int backend_init(Backend *b, const Config *c, DeviceKind kind, int B, int T, unsigned long long seed,
                 int grad_accum, FILE *plan_out, ErrBuf *e);
void backend_free(Backend *b);

const ParamTable *backend_table(const Backend *b);
const Config *backend_config(const Backend *b);

void backend_zero_grad(Backend *b);
// One micro-step: forward and backward of inputs, targets (B, T) host int32; ADDS the gradient
// of loss / grad_accum. Returns the micro-batch's mean loss.
float backend_forward_backward(Backend *b, const int32_t *inputs, const int32_t *targets);
// Global L2 norm of the accumulated gradients.
double backend_grad_norm(Backend *b);
// One AdamW step with learning rate lr, gradients multiplied by clip first.
void backend_step(Backend *b, double lr, double clip, const TrainConfig *tc);
// Forward only (no gradient work): the mean loss of inputs, targets (B, T).
float backend_eval_loss(Backend *b, const int32_t *inputs, const int32_t *targets);
// backend_eval_loss that also gives the per-token losses (B*T; 0 where a target is ignored; NULL
// to skip) and the logits (n_rows, Vp) of the listed rows (indices into the B*T tokens) as the
// loss computed them (the GPU's are BF16 values): per-position and per-source evaluation,
// passkey answers.
float backend_eval_detail(Backend *b, const int32_t *inputs, const int32_t *targets, float *losses, int n_rows,
                          const int *rows, float *row_logits);
// Logits (Vp floats, host) of the last of t <= T tokens, for sampling.
void backend_next_logits(Backend *b, const int32_t *tokens, int t, float *logits);

// backend_init for one rank of data parallelism over comm (NULL or world 1: backend_init).
// zero1 shards the AdamW state over the ranks (on the GPU the FP32 masters too, at allocation:
// the printed memory plan is this rank's, as --dry-run --world-size N --zero1 shows it).
// Returns 0, or -1 with e filled.
int backend_init_dp(Backend *b, const Config *c, DeviceKind kind, int B, int T, unsigned long long seed,
                    int grad_accum, FILE *plan_out, struct Comm *comm, int zero1, ErrBuf *e);
// Sums the gradients over the ranks (the backward scale makes it the mean) and returns their
// global L2 norm in *norm (the same value on every rank). 0, or -1 with e (a peer failed).
// GPU with train.overlap_comm (default): the sum was started during the last micro-step's
// backward (backend_forward_backward counts the micro-steps since backend_zero_grad: grad_accum /
// world of them per step), bucket by bucket on a communication stream; this waits for it under
// the comm deadline, then computes the norm. Same sums, bit for bit, as without the overlap.
int backend_dp_sync_grads(Backend *b, double *norm, ErrBuf *e);
// The AdamW step after backend_dp_sync_grads (ZeRO-1: the slice, then an all-gather). 0 or -1.
int backend_dp_step(Backend *b, double lr, double clip, const TrainConfig *tc, ErrBuf *e);
// backend_get_state for every rank together (a collective under ZeRO-1: the moments are
// gathered, so a checkpoint holds the full state whatever the world size). 0 or -1.
int backend_dp_get_state(Backend *b, float *params, float *adam_m, float *adam_v, long long *step, ErrBuf *e);

// Host FP32 copies for checkpoints: params, adam_m, adam_v have backend_table(b)->total
// elements; any of them (and step) may be NULL to skip it.
void backend_get_state(Backend *b, float *params, float *adam_m, float *adam_v, long long *step);
// Under ZeRO-1 use backend_dp_get_state (this one refuses the moments, and on the GPU the params).
// Restores them; adam_m and adam_v NULL: the optimizer state is left as it is (sampling). Under
// ZeRO-1 each rank keeps its slice of the full adam_m, adam_v (GPU: and of params; the BF16
// weights take all of params; the GPU's gradients are overwritten, so call it between steps).
void backend_set_state(Backend *b, const float *params, const float *adam_m, const float *adam_v,
                       long long step);
// The CPU backend keeps its state in host FP32 arrays already: returns 1 and points params,
// adam_m, adam_v at them, so a checkpoint reads and fills them in place (get/set_state then skip
// the copies); 0 where the state must be copied (GPU, ZeRO-1 shards).
int backend_state_in_place(Backend *b, float **params, float **adam_m, float **adam_v);

// The per-layer attention delayed-scaling state (n_layer entries, in *n) that checkpoints keep:
// the CPU model's; NULL with *n = 0 on the GPU (its BF16 attention has none).
AttnDelayedState *backend_delayed_state(Backend *b, int *n);
// Centred keys' delayed c that checkpoints keep (precision.attention_center_keys "delayed"): the
// CPU model's; NULL otherwise (the GPU backend refuses centred keys).
AttnKeyCenters *backend_key_centers(Backend *b);

// "cpu" / "gpu".
const char *backend_name(const Backend *b);

#ifdef __cplusplus
}
#endif
#endif  // BACKEND_H
