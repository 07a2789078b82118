// optimizer.h: AdamW on FP32 master weights, global-norm clipping and the LR schedule.
// The math is written per element (adamw_update_range) so that the GPU kernel and ZeRO-1
// shards can follow it exactly.
#ifndef OPTIMIZER_H
#define OPTIMIZER_H

#include <stddef.h>  // size_t

#include "config.h"  // TrainConfig
#include "model.h"   // ParamTable

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
// lr/warmup to lr, then cosine / linear decay to lr*min_lr_ratio at the last step, WSD (flat,
// then linear decay over the last wsd_decay_fraction of the steps) or constant.
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

// The per-element update shared with the GPU kernel (and ZeRO-1 shards):
// elements [begin, end) of p, g, m, v; step_1based for bias correction.
void adamw_update_range(float *p, const float *g, float *m, float *v, size_t begin, size_t end,
                        double lr, double beta1, double beta2, double eps, double wd,
                        double clip, long long step_1based);

#ifdef __cplusplus
}
#endif
#endif  // OPTIMIZER_H
