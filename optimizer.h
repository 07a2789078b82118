// optimizer.h: AdamW on FP32 master weights, global-norm clipping and the LR schedule.
// The math is written per element (adamw_update_range) so that the GPU kernel and ZeRO-1
// shards can follow it exactly.
#ifndef OPTIMIZER_H
#define OPTIMIZER_H

#include <stddef.h>  // size_t

#include "core/config.h"  // TrainConfig
#include "core/model.h"   // ParamTable

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    size_t n;          // number of parameters
    float *m, *v;      // (n) first and second moments
    long long step;    // optimizer steps taken (bias correction uses step + 1 while updating)
} AdamW;

void adamw_init(AdamW *o, size_t n);
void adamw_free(AdamW *o);

// Learning rate for step (0-based) of total_steps: linear warmup over warmup_steps from
// lr/warmup to lr (step < warmup: lr * (step + 1) / warmup), then cosine / linear decay from lr
// at step == warmup to lr*min_lr_ratio at the last step (steps - 1), WSD (flat, then linear
// decay over the last round(wsd_decay_fraction * steps) steps, the last one at the minimum) or
// constant. Steps past the end keep the last step's value.
double lr_at_step(const TrainConfig *t, int step);

// Global L2 norm of grads (n), accumulated in double.
double grad_global_norm(const float *grads, size_t n);
// Clip factor for a global norm: min(1, grad_clip / norm); 1 when grad_clip <= 0.
double grad_clip_factor(const TrainConfig *t, double norm);

// One AdamW step over all parameters: for each tensor of the table, decoupled weight decay
// applied only where desc.weight_decay; grads are multiplied by clip first.
// params, grads: (n). Increments o->step.
void adamw_step(AdamW *o, const ParamTable *t, const TrainConfig *tc, float *params,
                const float *grads, double lr, double clip);

// ZeRO-1: the same update for the flat elements [begin, end) only. params and grads are full
// (t->total) buffers; m and v hold just the slice (m[0] is element begin). Weight decay follows
// each tensor's flag, also for a tensor cut by the slice boundary. adamw_step is this with
// [0, total) and step_1based = o->step + 1.
void adamw_update_slice(const ParamTable *t, const TrainConfig *tc, float *params,
                        const float *grads, float *m, float *v, size_t begin, size_t end,
                        double lr, double clip, long long step_1based);

// The per-element update shared with the GPU kernel (and ZeRO-1 shards):
// elements [begin, end) of p, g, m, v; step_1based for bias correction.
void adamw_update_range(float *p, const float *g, float *m, float *v, size_t begin, size_t end,
                        double lr, double beta1, double beta2, double eps, double wd,
                        double clip, long long step_1based);

#ifdef __cplusplus
}
#endif
#endif  // OPTIMIZER_H
