// test_model_grad.c: finite-difference check of the CPU model's backward for EVERY parameter
// tensor, in two variants (QK-norm on and untied; QK-norm off and tied; RoPE and FP32 attention
// in both), plus the accumulate / loss_scale semantics of cpu_model_backward.
//
// Central differences on the FP32 forward: (L(w + h) - L(w - h)) / 2h with h = 1e-2 * max(1, |w|).
// The loss is ~ln(300) = 5.7 in FP32, so each difference carries ~1e-6 of rounding noise, i.e.
// ~1e-4 in the quotient; elements are therefore compared with a relative tolerance plus an
// absolute floor tied to that noise. Per tensor, the elements with the largest analytic
// gradients (where the relative check bites) and a few random elements are checked.
#include <math.h>    // fabs, fmax
#include <stdint.h>  // int32_t
#include <stdlib.h>  // malloc
#include <string.h>  // memcpy

#include "core/config.h"    // Config, config_defaults
#include "cpu/model_cpu.h"  // CpuModel
#include "test.h"           // CHECK

enum { B = 2, T = 8, N_TOP = 3, N_RANDOM = 3 };

static unsigned long long rng = 0x9E3779B97F4A7C15ull;
static double urand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * 0x1p-53;
}

static Config tiny_config(int qk_norm, int tied) {
    Config c;
    config_defaults(&c);
    ModelConfig *m = &c.model;
    m->d_model = 128;
    m->n_head = 2;
    m->head_dim = 64;
    m->n_layer = 2;
    m->ffn_hidden = 96;
    m->vocab_size = 300;
    m->padded_vocab_size = 384;
    m->seq_len = T;
    m->position = POS_ROPE;
    m->qk_norm = qk_norm;
    m->tied_embeddings = tied;
    m->init_std = 0.1;  // larger than training's 0.02: bigger gradients, well above FD noise
    c.precision.attention = ATTN_FP32;
    return c;
}

static void check_variant(const char *variant, int qk_norm, int tied) {
    Config c = tiny_config(qk_norm, tied);
    CpuModel m;
    cpu_model_init(&m, &c, B, T, 11);
    // Gains away from 1 so that their gradients (and the ones through them) are generic.
    for (int i = 0; i < m.table.n; i++) {
        const ParamDesc *d = &m.table.p[i];
        if (d->init == INIT_ONES)
            for (size_t j = 0; j < d->numel; j++) m.params[d->offset + j] = (float)(0.5 + urand());
    }
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) {
        tok[i] = (int32_t)(urand() * 300);
        tgt[i] = (int32_t)(urand() * 300);
    }
    tgt[3] = -1;  // ignored target
    cpu_model_zero_grad(&m);
    float loss0 = cpu_model_forward(&m, tok, tgt);
    cpu_model_backward(&m, 1.0f);
    float *grad = malloc(sizeof(float) * m.table.total);
    memcpy(grad, m.grads, sizeof(float) * m.table.total);

    double worst_all = 0;
    int n_checked = 0;
    for (int ti = 0; ti < m.table.n; ti++) {
        const ParamDesc *d = &m.table.p[ti];
        const float *g = grad + d->offset;
        float *w = m.params + d->offset;
        size_t pick[N_TOP + N_RANDOM];
        int n_pick = 0;
        // The largest |gradient| elements.
        for (int k = 0; k < N_TOP; k++) {
            size_t best = 0;
            float bv = -1;
            for (size_t j = 0; j < d->numel; j++) {
                int taken = 0;
                for (int q = 0; q < n_pick; q++) taken |= pick[q] == j;
                if (!taken && fabsf(g[j]) > bv) bv = fabsf(g[j]), best = j;
            }
            pick[n_pick++] = best;
        }
        for (int k = 0; k < N_RANDOM; k++) pick[n_pick++] = (size_t)(urand() * d->numel);
        float gmax = fabsf(g[pick[0]]);
        double worst = 0;
        int ok = 1;
        char detail[512] = "";
        for (int k = 0; k < n_pick; k++) {
            size_t j = pick[k];
            float w0 = w[j];
            float h = 1e-2f * fmaxf(1.0f, fabsf(w0));
            w[j] = w0 + h;
            double lp = cpu_model_loss(&m, tok, tgt);
            w[j] = w0 - h;
            double lm = cpu_model_loss(&m, tok, tgt);
            w[j] = w0;
            double hd = ((double)(w0 + h) - (double)(w0 - h)) / 2;  // the step actually taken
            double fd = (lp - lm) / (2 * hd);
            double floor_abs = 2e-4 + 1e-3 * gmax;  // FD noise, and curvature at the top elements
            double err = fabs(fd - g[j]) / fmax(fabs(g[j]), fmax(fabs(fd), floor_abs / 1e-2));
            if (err > worst) worst = err;
            if (!(fabs(fd - g[j]) <= 1e-2 * fabs(g[j]) + floor_abs)) {
                ok = 0;
                size_t len = strlen(detail);
                snprintf(detail + len, sizeof detail - len, "[%zu] fd %.6g analytic %.6g; ", j, fd, (double)g[j]);
            }
            n_checked++;
        }
        if (worst > worst_all) worst_all = worst;
        char name[160];
        snprintf(name, sizeof name, "grad %s: %s (max |g| %.3g, worst rel err %.2e)", variant, d->name, gmax, worst);
        CHECK(ok, name, "%s", detail);
    }
    printf("# %s: %d elements over %d tensors, worst relative error %.3e (loss %.4f)\n", variant, n_checked,
           m.table.n, worst_all, loss0);

    // Padded vocabulary rows get no gradient (CE uses only the real columns).
    const ParamDesc *head = param_find(&m.table, tied ? P_WTE : P_LM_HEAD, 0);
    int pad_zero = 1;
    for (long r = 300; r < head->rows; r++)
        for (long col = 0; col < head->cols; col++) pad_zero &= grad[head->offset + r * head->cols + col] == 0.0f;
    char name[128];
    snprintf(name, sizeof name, "grad %s: padded vocabulary rows get zero gradient", variant);
    CHECK(pad_zero, name, "nonzero");

    // Accumulate semantics: a second backward adds the same gradient again; loss_scale scales.
    cpu_model_forward(&m, tok, tgt);
    cpu_model_backward(&m, 1.0f);
    double e2 = 0, e_half = 0, gnorm = 0;
    for (size_t i = 0; i < m.table.total; i++) gnorm = fmax(gnorm, fabs(grad[i]));
    for (size_t i = 0; i < m.table.total; i++) e2 = fmax(e2, fabs(m.grads[i] - 2.0 * grad[i]));
    cpu_model_zero_grad(&m);
    cpu_model_forward(&m, tok, tgt);
    cpu_model_backward(&m, 0.5f);
    for (size_t i = 0; i < m.table.total; i++) e_half = fmax(e_half, fabs(m.grads[i] - 0.5 * grad[i]));
    snprintf(name, sizeof name, "grad %s: two backward calls accumulate twice the gradient", variant);
    CHECK(e2 <= 1e-6 * gnorm, name, "max error %.3g (max |g| %.3g)", e2, gnorm);
    snprintf(name, sizeof name, "grad %s: loss_scale 0.5 halves the gradient", variant);
    CHECK(e_half <= 1e-6 * gnorm, name, "max error %.3g (max |g| %.3g)", e_half, gnorm);
    free(grad);
    cpu_model_free(&m);
}

int main(void) {
    check_variant("qk_norm untied", 1, 0);
    check_variant("no-qk_norm tied", 0, 1);
    return test_summary("test_model_grad");
}
