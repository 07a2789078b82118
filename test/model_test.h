// model_test.h: what the GPU model tests share: the tiny config they build on, config parsing that
// fails the test loudly, the structured batches, and the relative L2 error. Both
// test_model_gpu.cu and test_model_gpu_fp8.cu use the same generator and seed, so the BF16 base
// case of each sees the same batches.
#ifndef MODEL_TEST_H
#define MODEL_TEST_H

#include <math.h>    // sqrt
#include <stdint.h>  // int32_t, uint32_t, uint64_t
#include <stdio.h>   // printf
#include <stdlib.h>  // exit

#include "core/common.h"    // ErrBuf, now_seconds
#include "core/config.h"    // Config, config_parse
#include "cpu/model_cpu.h"  // CpuModel, for the paired training steps
#include "gpu/model_gpu.h"  // GpuModel, for the paired and timed training steps
#include "optimizer.h"      // AdamW, adamw_step, grad_global_norm, grad_clip_factor, lr_at_step
#include "test.h"           // CHECK

static const char *TINY_JSON =
    "{\"model\": {\"d_model\": 128, \"n_layer\": 2, \"n_head\": 2, \"ffn_hidden\": 352, \"seq_len\": 64},"
    " \"train\": {\"micro_batch\": 8, \"steps\": 10, \"lr\": 3e-3, \"schedule\": \"constant\","
    " \"warmup_steps\": 0, \"weight_decay\": 0.1, \"grad_clip\": 1.0},"
    " \"precision\": {\"attention\": \"bf16\"}}";

// A config from JSON plus --set-style overrides; a parse error is a FAIL line and exit(1).
static inline Config make_config(const char *json, const char *const *overrides, int n) {
    Config c;
    ErrBuf e;
    if (config_parse(json, "model_test", overrides, n, &c, &e)) {
        printf("FAIL - config (%s:%d): %s\n", __FILE__, __LINE__, e.msg);
        exit(1);
    }
    return c;
}

// Structured batches: x[t+1] = (7 x[t] + 13) mod 997 with probability 0.85, else uniform over the
// whole vocabulary; ~3% of targets ignored (-1).
static uint64_t model_test_rng = 0xC0FFEE123ull;
static inline uint32_t model_test_rnd(void) {
    uint64_t z = (model_test_rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}
static inline void make_batch(int32_t *tokens, int32_t *targets, int B, int T, int V) {
    for (int b = 0; b < B; b++) {
        int32_t x = (int32_t)(model_test_rnd() % 997);
        for (int t = 0; t <= T; t++) {
            if (t < T) tokens[b * T + t] = x;
            if (t > 0) targets[b * T + t - 1] = (model_test_rnd() % 100 < 3) ? -1 : x;
            x = (model_test_rnd() % 100 < 85) ? (7 * x + 13) % 997 : (int32_t)(model_test_rnd() % (uint32_t)V);
        }
    }
}

// ||a - ref|| / ||ref|| (the plain norm when ref is 0); *cosine (optional) gets cos(a, ref).
static inline double rel_l2(const float *a, const float *ref, size_t n, double *cosine) {
    double num = 0, den = 0, ab = 0, aa = 0;
    for (size_t i = 0; i < n; i++) {
        double d = (double)a[i] - ref[i];
        num += d * d;
        den += (double)ref[i] * ref[i];
        ab += (double)a[i] * ref[i];
        aa += (double)a[i] * a[i];
    }
    if (cosine) *cosine = (aa > 0 && den > 0) ? ab / sqrt(aa * den) : (aa == den ? 1.0 : 0.0);
    return den > 0 ? sqrt(num / den) : sqrt(num);
}

// n_steps training steps of m on one batch (lr 6e-4, clipping from c), the first `warm` untimed.
// Returns seconds per timed step; *first and *last get the first and last loss, *finite 0 if a
// loss or gradient norm was not finite.
static inline double timed_steps(GpuModel *m, const Config *c, const int32_t *tokens, const int32_t *targets,
                                 int n_steps, int warm, float *first, float *last, int *finite) {
    double t0 = now_seconds();
    *finite = 1;
    for (int k = 0; k < n_steps; k++) {
        if (k == warm) t0 = now_seconds();
        gpu_model_zero_grad(m);
        float l = gpu_model_forward(m, tokens, targets);
        gpu_model_backward(m, 1.0f);
        double n = gpu_model_grad_norm(m);
        gpu_model_step(m, 6e-4, grad_clip_factor(&c->train, n), &c->train);
        if (!isfinite(l) || !isfinite(n)) *finite = 0;
        if (k == 0) *first = l;
        *last = l;
    }
    return (now_seconds() - t0) / (n_steps - warm);
}

// One training step of the same batch at learning rate lr on the CPU backend (with its AdamW)
// and on the GPU model; *cl/*gl get the losses, *cn/*gn the gradient norms. Returns the loss's
// relative difference |gl - cl| / |cl|.
static inline double paired_step(CpuModel *cpu, AdamW *opt, GpuModel *gpu, const Config *c, const int32_t *tk,
                                 const int32_t *tg, double lr, float *cl, float *gl, double *cn, double *gn) {
    const size_t P = cpu->table.total;
    cpu_model_zero_grad(cpu);
    *cl = cpu_model_forward(cpu, tk, tg);
    cpu_model_backward(cpu, 1.0f);
    *cn = grad_global_norm(cpu->grads, P);
    adamw_step(opt, &cpu->table, &c->train, cpu->params, cpu->grads, lr, grad_clip_factor(&c->train, *cn));
    gpu_model_zero_grad(gpu);
    *gl = gpu_model_forward(gpu, tk, tg);
    gpu_model_backward(gpu, 1.0f);
    *gn = gpu_model_grad_norm(gpu);
    gpu_model_step(gpu, lr, grad_clip_factor(&c->train, *gn), &c->train);
    return fabs(*gl - *cl) / fabs(*cl);
}

// `steps` paired steps (above) on batches k = 0 .. steps-1 of tokens, targets (BT each) at the
// config's learning-rate schedule: prints each step under label (padded to width), fills cl, gl
// (and gn unless NULL) and checks that every step's loss is within 1e-2 (relative) of the CPU's
// and that the GPU's loss falls by more than 0.1 over the run.
static inline void paired_run(const char *label, int width, CpuModel *cpu, AdamW *opt, GpuModel *gpu,
                              const Config *c, const int32_t *tokens, const int32_t *targets, size_t BT, int steps,
                              float *cl, float *gl, float *gn) {
    int ok_curve = 1;
    double worst_curve = 0;
    char name[220];
    for (int k = 0; k < steps; k++) {
        double cn, n, r = paired_step(cpu, opt, gpu, c, tokens + (size_t)k * BT, targets + (size_t)k * BT,
                                      lr_at_step(&c->train, k), &cl[k], &gl[k], &cn, &n);
        if (gn) gn[k] = (float)n;
        if (r > worst_curve) worst_curve = r;
        if (!(r <= 1e-2)) ok_curve = 0;
        printf("#   %-*s step %2d  loss cpu %.5f gpu %.5f (rel %.1e)  grad norm cpu %.4f gpu %.4f\n", width, label, k,
               cl[k], gl[k], r, cn, n);
    }
    snprintf(name, sizeof name, "%s: %d AdamW steps track the CPU (loss rel 1e-2 each step)", label, steps);
    CHECK(ok_curve, name, "worst rel difference %.3e", worst_curve);
    snprintf(name, sizeof name, "%s: the loss falls over the run", label);
    CHECK(gl[steps - 1] < gl[0] - 0.1, name, "first %.4f last %.4f", gl[0], gl[steps - 1]);
}

#endif  // MODEL_TEST_H
