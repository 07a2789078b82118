// optimizer.c: AdamW on FP32 master weights, global-norm clipping and the LR schedule.
//
// Determinism: every function here gives bit-identical results run to run and for any number
// of OpenMP threads. The AdamW update is element-wise (threads only split the index range);
// the global norm is reduced over fixed-size chunks whose partial sums are added in chunk
// order, so the summation order never depends on the thread count. Resume is bit-exact
// provided m, v, step and the parameters are restored exactly.
#include "optimizer.h"

#include <math.h>    // sqrt, sqrtf, cos, pow
#include <string.h>  // memset

#include "core/common.h"  // xcalloc, FATAL

void adamw_init(AdamW *o, size_t n) {
    o->n = n;
    o->m = xcalloc(n, sizeof(float));
    o->v = xcalloc(n, sizeof(float));
    o->step = 0;
}

void adamw_free(AdamW *o) {
    free(o->m);
    free(o->v);
    memset(o, 0, sizeof *o);
}

// ---------------------------------------------------------------------------------------------
// Learning-rate schedule.

// Warmup: steps [0, warmup) ramp linearly, lr * (step + 1) / warmup, so the last warmup step
// reaches lr. After it the schedule runs over the steps [warmup, steps - 1]:
//   cosine / linear: from lr at step == warmup to lr * min_lr_ratio at step == steps - 1;
//   wsd: lr until the decay phase, the last round(wsd_decay_fraction * steps) steps (never
//        starting inside warmup), then linear: each decay step lower, the last one at the
//        minimum; a fraction of 0 means flat to the end;
//   constant: lr.
// Steps past the end (step >= steps) keep the last step's value.
double lr_at_step(const TrainConfig *t, int step) {
    const double lr = t->lr;
    const double lr_min = t->lr * t->min_lr_ratio;
    const long long steps = t->steps;
    long long s = step < 0 ? 0 : step;
    if (steps > 0 && s > steps - 1) s = steps - 1;
    const long long warmup = t->warmup_steps > 0 ? t->warmup_steps : 0;
    if (s < warmup) return lr * (double)(s + 1) / (double)warmup;

    switch (t->schedule) {
    case SCHED_CONSTANT:
        return lr;
    case SCHED_COSINE:
    case SCHED_LINEAR: {
        const long long span = steps - 1 - warmup;  // steps from lr to the minimum
        const double progress = span > 0 ? (double)(s - warmup) / (double)span : 1.0;
        if (t->schedule == SCHED_LINEAR) return lr + (lr_min - lr) * progress;
        return lr_min + (lr - lr_min) * 0.5 * (1.0 + cos(M_PI * progress));
    }
    case SCHED_WSD: {
        double fraction = t->wsd_decay_fraction;
        if (fraction < 0.0) fraction = 0.0;
        if (fraction > 1.0) fraction = 1.0;
        long long n_decay = llround(fraction * (double)steps);
        long long decay_start = steps - n_decay;
        if (decay_start < warmup) decay_start = warmup;
        n_decay = steps - decay_start;
        if (n_decay <= 0 || s < decay_start) return lr;
        const double progress = (double)(s - decay_start + 1) / (double)n_decay;  // (0, 1]
        return lr + (lr_min - lr) * progress;
    }
    }
    FATAL("unknown schedule kind %d (hint: config.c and optimizer.c disagree)", (int)t->schedule);
}

// ---------------------------------------------------------------------------------------------
// Gradient norm and clipping.

// Elements per partial sum of the norm: fixed, so the reduction order is independent of the
// thread count.
#define NORM_CHUNK ((size_t)1 << 16)

double grad_global_norm(const float *grads, size_t n) {
    const size_t n_chunks = (n + NORM_CHUNK - 1) / NORM_CHUNK;
    double *partial = xcalloc(n_chunks ? n_chunks : 1, sizeof(double));  // (n_chunks)
    #pragma omp parallel for schedule(static) if (n_chunks > 1)
    for (size_t c = 0; c < n_chunks; c++) {
        const size_t lo = c * NORM_CHUNK;
        const size_t hi = lo + NORM_CHUNK < n ? lo + NORM_CHUNK : n;
        double sum = 0.0;
        for (size_t i = lo; i < hi; i++) sum += (double)grads[i] * (double)grads[i];
        partial[c] = sum;
    }
    double total = 0.0;
    for (size_t c = 0; c < n_chunks; c++) total += partial[c];
    free(partial);
    return sqrt(total);
}

// A non-finite norm gives 1 (the comparison is false): the caller sees the non-finite norm
// itself and decides whether to skip the step.
double grad_clip_factor(const TrainConfig *t, double norm) {
    if (t->grad_clip <= 0.0) return 1.0;
    return norm > t->grad_clip ? t->grad_clip / norm : 1.0;
}

// ---------------------------------------------------------------------------------------------
// AdamW.

// The per-element update. Scalar coefficients are computed in double and rounded once to
// float; every element operation is then a single correctly-rounded FP32 operation in the order
// written (gcc does not contract them into FMAs without -ffp-contract=fast on an FMA target).
// A GPU kernel that must match bit for bit uses the same float coefficients and the same
// operation order with __fmul_rn / __fadd_rn (nvcc contracts a*b+c into an FMA otherwise).
void adamw_update_range(float *p, const float *g, float *m, float *v, size_t begin, size_t end,
                        double lr, double beta1, double beta2, double eps, double wd,
                        double clip, long long step_1based) {
    const float clip_f = (float)clip;
    const float b1 = (float)beta1, one_minus_b1 = (float)(1.0 - beta1);
    const float b2 = (float)beta2, one_minus_b2 = (float)(1.0 - beta2);
    // Bias corrections 1 / (1 - beta^t), in double: 1 - beta2^t is tiny for early steps.
    const float inv_bc1 = (float)(1.0 / (1.0 - pow(beta1, (double)step_1based)));
    const float inv_bc2 = (float)(1.0 / (1.0 - pow(beta2, (double)step_1based)));
    const float lr_f = (float)lr;
    const float eps_f = (float)eps;
    const float keep = (float)(1.0 - lr * wd);  // decoupled weight decay: p -= lr * wd * p
    #pragma omp parallel for schedule(static) if (end - begin > ((size_t)1 << 15))
    for (size_t i = begin; i < end; i++) {
        const float gi = g[i] * clip_f;
        const float mi = b1 * m[i] + one_minus_b1 * gi;
        const float vi = b2 * v[i] + one_minus_b2 * (gi * gi);
        m[i] = mi;
        v[i] = vi;
        const float m_hat = mi * inv_bc1;
        const float v_hat = vi * inv_bc2;
        p[i] = p[i] * keep - lr_f * (m_hat / (sqrtf(v_hat) + eps_f));
    }
}

void adamw_update_slice(const ParamTable *t, const TrainConfig *tc, float *params,
                        const float *grads, float *m, float *v, size_t begin, size_t end,
                        double lr, double clip, long long step_1based) {
    if (begin > end || end > t->total)
        FATAL("adamw slice [%zu, %zu) does not fit the %zu parameters", begin, end, t->total);
    for (int k = 0; k < t->n; k++) {
        const ParamDesc *d = &t->p[k];
        // The part of tensor k inside the slice.
        const size_t lo = d->offset > begin ? d->offset : begin;
        const size_t hi = d->offset + d->numel < end ? d->offset + d->numel : end;
        if (lo >= hi) continue;
        const double wd = d->weight_decay ? tc->weight_decay : 0.0;
        adamw_update_range(params + lo, grads + lo, m + (lo - begin), v + (lo - begin), 0, hi - lo,
                           lr, tc->beta1, tc->beta2, tc->eps, wd, clip, step_1based);
    }
}

void adamw_step(AdamW *o, const ParamTable *t, const TrainConfig *tc, float *params,
                const float *grads, double lr, double clip) {
    if (o->n != t->total)
        FATAL("AdamW holds %zu moments but the parameter table has %zu elements", o->n, t->total);
    adamw_update_slice(t, tc, params, grads, o->m, o->v, 0, t->total, lr, clip, o->step + 1);
    o->step++;
}
