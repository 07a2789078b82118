// model_cpu.h: the CPU reference backend: the whole GPT of model.h, forward and backward in FP32,
// with the attention precision of the config emulated by attention_cpu.c. Slow and obviously
// correct; it trains tiny configs and is the oracle for the GPU backend.
#ifndef MODEL_CPU_H
#define MODEL_CPU_H

#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t tokens

#include "cpu/attention_cpu.h"  // AttnOptions, AttnDelayedState, AttnStats
#include "core/config.h"        // Config
#include "core/model.h"         // ParamTable
#include "eval/probe.h"         // ModelProbe

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    Config cfg;            // copy of the validated config
    ParamTable table;
    float *params;         // (table.total) FP32 parameters
    float *grads;          // (table.total) FP32 gradients, accumulated by backward
    int B, T;              // micro-batch shape the activations were sized for
    AttnOptions attn;
    AttnDelayedState *attn_delayed;  // (n_delayed) delayed-scaling states: attention's (one per layer), then
                                     // with delayed linear scaling the FP8 linears' (two per layer)
    int n_delayed;
    AttnStats attn_stats;            // summed over the last forward and its backward
    AttnKeyCenters key_centers;      // precision.attention_center_keys "delayed": c per layer and head
    void *acts;            // activation storage, private to model_cpu.c
} CpuModel;

// Allocates parameters (initialised with params_init(seed)), gradients and activations for
// micro-batches of B sequences of T tokens (T <= model.seq_len).
void cpu_model_init(CpuModel *m, const Config *c, int B, int T, unsigned long long seed);
void cpu_model_free(CpuModel *m);

// Forward: tokens, targets (B, T) int32; targets < 0 are ignored. Returns the mean loss over
// counted targets. Keeps the activations for backward. The LM head is fused with the loss (as on
// the GPU), so this already computes the head's gradients (unscaled, kept privately); backward
// applies loss_scale to them. Token or target ids >= vocab_size are an internal error (FATAL).
float cpu_model_forward(CpuModel *m, const int32_t *tokens, const int32_t *targets);

// Backward of the last forward: ADDS d(loss * loss_scale)/d(params) into m->grads (so several
// micro-batches accumulate; pass loss_scale = 1/grad_accum).
void cpu_model_backward(CpuModel *m, float loss_scale);

// Forward only, for evaluation: the same loss as cpu_model_forward (bit for bit) without
// preparing a backward (the fused LM head then costs a third). A following
// cpu_model_backward is an error.
float cpu_model_loss(CpuModel *m, const int32_t *tokens, const int32_t *targets);

// cpu_model_loss that also gives the per-token losses (B*T; 0 where a target is ignored; NULL to
// skip) and the logits (n_rows, Vp) of the listed rows (indices into the B*T tokens), as the loss
// computed them: what evaluation per position, per source and of passkey answers needs.
float cpu_model_loss_detail(CpuModel *m, const int32_t *tokens, const int32_t *targets, float *losses, int n_rows,
                            const int *rows, float *row_logits);

void cpu_model_zero_grad(CpuModel *m);

// Logits of the last position only, for sampling: tokens (1, t) with t <= T; logits (Vp).
void cpu_model_next_logits(CpuModel *m, const int32_t *tokens, int t, float *logits);

// --- probes, for diagnostics (diagnostics.h, probe.h) -----------------------------------------------
// A probe is a forward + backward of one micro-batch (m->B, m->T) in a chosen attention precision
// that leaves the training state bit-identical: parameters, m->grads, m->attn, m->attn_stats, the
// delayed-scaling amax histories and the FP8-linear counters are as they were before. Only the
// activations are overwritten, so call it between steps (after cpu_model_backward has been used),
// never between a forward and its backward.

void cpu_probe_alloc(ModelProbe *p, const CpuModel *m);
void cpu_probe_free(ModelProbe *p);

// Runs the probe on tokens, targets (m->B, m->T) with attention in `precision` (every other
// attention option as configured: grad format, scaling, p_scale, block sizes) and fills out.
// local_ref (ATTN_N_PRECISIONS: none): also recompute each layer's attention alone, forward and
// backward in that precision on exactly the q, k, v and output gradient this probe's attention
// received, and compare its dq, dk, dv with the probe's (out->local_sq): the error this layer's
// attention adds by itself, without what earlier layers propagated into its inputs.
void cpu_model_probe(CpuModel *m, AttnPrecision precision, AttnPrecision local_ref, const int32_t *tokens,
                     const int32_t *targets, ModelProbe *out);

// One head's attention inputs as the model computes them on tokens, targets (m->B, m->T): q, k,
// v (after QK-norm and RoPE) of layer `layer`, sequence `seq`, head `head`, and the gradient of
// the mean loss with respect to that head's attention output (dout), each (m->T, head_dim). Runs
// a forward and a backward; leaves the parameters, m->grads and the delayed-scaling and key-centre
// states as they were (a probe's rules apply: call it between steps).
void cpu_model_attention_inputs(CpuModel *m, const int32_t *tokens, const int32_t *targets, int layer, int seq,
                                int head, float *q, float *k, float *v, float *dout);

#ifdef __cplusplus
}
#endif
#endif  // MODEL_CPU_H
