// diagnostics.c: FP8-attention diagnostics on probe micro-batches (diagnostics.h says what is
// measured; docs/diagnostics.md how to read it).
//
// An event costs 2 * max(1, N) forward + backward passes of one micro-batch (the run's attention
// precision and the reference, on each of the N probe batches); batch 0 also gives the per-layer
// table. Every pass goes through cpu_model_probe, which leaves the training state bit-identical,
// so a run with diagnostics trains exactly like one without.
#include "eval/diagnostics.h"

#include <cjson/cJSON.h>  // the metrics line
#include <math.h>         // sqrt, NAN, isfinite
#include <stdlib.h>       // qsort, free
#include <string.h>       // memcpy, memset

#include "dataloader.h"  // the probe batches

// Seed offset of the probe stream, so its window order differs from training's and evaluation's.
#define PROBE_SEED_SALT 0xD1A6u

static const char *const cast_names[ATTN_N_CASTS] = {"q", "k", "v", "do", "p", "ds"};

// --- bias ratio ----------------------------------------------------------------------------------

void bias_probe_init(BiasProbe *bp, size_t n) {
    bp->n = n;
    bp->sum_diff = xcalloc(n ? n : 1, sizeof(double));
    bp->sum_norm = 0.0;
    bp->count = 0;
}

void bias_probe_reset(BiasProbe *bp) {
    memset(bp->sum_diff, 0, sizeof(double) * bp->n);
    bp->sum_norm = 0.0;
    bp->count = 0;
}

void bias_probe_add(BiasProbe *bp, const float *g_mode, const float *g_ref) {
    double sq = 0.0;  // fixed order: the ratio does not depend on the thread count
    for (size_t i = 0; i < bp->n; i++) {
        double diff = (double)g_mode[i] - (double)g_ref[i];
        bp->sum_diff[i] += diff;
        sq += diff * diff;
    }
    bp->sum_norm += sqrt(sq);
    bp->count++;
}

double bias_probe_ratio(const BiasProbe *bp) {
    if (bp->count == 0 || !(bp->sum_norm > 0.0)) return NAN;
    double sq = 0.0;
    for (size_t i = 0; i < bp->n; i++) sq += bp->sum_diff[i] * bp->sum_diff[i];
    return sqrt(sq) / bp->sum_norm;
}

void bias_probe_free(BiasProbe *bp) {
    free(bp->sum_diff);
    memset(bp, 0, sizeof *bp);
}

// --- setup ---------------------------------------------------------------------------------------

void diagnostics_init_batches(Diagnostics *d, const Config *c, int B, int T, const int32_t *inputs,
                              const int32_t *targets, int n) {
    memset(d, 0, sizeof *d);
    d->interval = c->diagnostics.interval;
    d->enabled = d->interval > 0;
    if (n < 1) FATAL("diagnostics_init_batches: %d probe batches (need at least one)", n);
    d->n_bias = c->diagnostics.bias_probe_batches < n ? c->diagnostics.bias_probe_batches : n;
    d->mode = c->precision.attention;
    d->reference = c->diagnostics.reference;
    d->B = B;
    d->T = T;
    d->n_batches = n;
    size_t len = (size_t)n * B * T;
    d->inputs = xmalloc(len * sizeof(int32_t));
    d->targets = xmalloc(len * sizeof(int32_t));
    memcpy(d->inputs, inputs, len * sizeof(int32_t));
    memcpy(d->targets, targets, len * sizeof(int32_t));
    d->last.bias_ratio = NAN;
}

int diagnostics_init(Diagnostics *d, const Config *c, int B, int T, ErrBuf *e) {
    memset(d, 0, sizeof *d);
    if (c->diagnostics.interval <= 0) return 0;
    const char *pattern = c->data.val[0] ? c->data.val : c->data.train;
    const char *key = c->data.val[0] ? "data.val" : "data.train";
    int n = c->diagnostics.bias_probe_batches > 1 ? c->diagnostics.bias_probe_batches : 1;
    DataLoader dl;
    ErrBuf e2;
    if (dataloader_open(&dl, pattern, B, T, 0, 1, 1, c->data.seed + PROBE_SEED_SALT, c->model.vocab_size, &e2) != 0)
        return errf(e, "diagnostics: the probe batches come from %s (%s): %s", key, pattern, e2.msg);
    size_t len = (size_t)n * B * T;
    int32_t *inputs = xmalloc(len * sizeof(int32_t)), *targets = xmalloc(len * sizeof(int32_t));
    for (int b = 0; b < n; b++)
        dataloader_next(&dl, inputs + (size_t)b * B * T, targets + (size_t)b * B * T);
    long long distinct = dataloader_batches_per_epoch(&dl);
    dataloader_close(&dl);
    if (distinct < n)
        printf("note: diagnostics: %s has %lld windows of %d x %d tokens, fewer than the %d probe batches; "
               "some repeat, which pulls the bias ratio towards 1\n", key, distinct, B, T, n);
    diagnostics_init_batches(d, c, B, T, inputs, targets, n);
    free(inputs);
    free(targets);
    return 0;
}

void diagnostics_free(Diagnostics *d) {
    free(d->inputs);
    free(d->targets);
    if (d->prepared) {
        if (d->on_gpu) {
            gpu_probe_free(&d->run);
            gpu_probe_free(&d->ref);
        } else {
            cpu_probe_free(&d->run);
            cpu_probe_free(&d->ref);
        }
        bias_probe_free(&d->bias);
        free(d->last.layers);
    }
    memset(d, 0, sizeof *d);
}

int diagnostics_due(const Diagnostics *d, long long step) {
    return d->enabled && step > 0 && step % d->interval == 0;
}

// --- measurement ---------------------------------------------------------------------------------

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static double median_of(const float *x, size_t n, float *scratch) {
    if (n == 0) return 0.0;
    memcpy(scratch, x, n * sizeof(float));
    qsort(scratch, n, sizeof(float), cmp_float);
    return n % 2 ? scratch[n / 2] : 0.5 * ((double)scratch[n / 2 - 1] + scratch[n / 2]);
}

// Accumulates ||x - r||^2 and ||r||^2 over n elements.
static void diff_norms(const float *x, const float *r, size_t n, double *num, double *den) {
    for (size_t i = 0; i < n; i++) {
        double dlt = (double)x[i] - (double)r[i];
        *num += dlt * dlt;
        *den += (double)r[i] * r[i];
    }
}
static double rel_err(double num, double den) { return den > 0.0 ? sqrt(num / den) : (num > 0.0 ? INFINITY : 0.0); }

// The per-layer table from the probes of batch 0 (d->run in the run's precision, d->ref in the
// reference).
static void fill_layers(Diagnostics *d) {
    const ModelProbe *run = &d->run, *ref = &d->ref;
    float *scratch = xmalloc((run->n_rows ? run->n_rows : 1) * sizeof(float));
    for (int l = 0; l < run->n_layer; l++) {
        DiagLayer *L = &d->last.layers[l];
        const AttnStats *st = &run->layer_stats[l];
        double med = median_of(run->row_resid + (size_t)l * run->n_rows, run->n_rows, scratch);
        L->resid_median = run->resid_cancel_rows ? NAN : med;  // the GPU's rows are cancellation-scaled
        L->resid_cancel_median = run->resid_cancel_rows ? med : NAN;
        L->resid_max = st->resid_max;
        L->resid_cancel_max = st->resid_cancel_max;
        // the post-cast residual: CPU only (the GPU's probe has no rows of it)
        L->post_median = run->row_post_resid ? median_of(run->row_post_resid + (size_t)l * run->n_rows, run->n_rows, scratch)
                                             : NAN;
        L->post_max = run->row_post_resid ? st->post_resid_max : NAN;
        memcpy(L->saturated, st->saturated, sizeof L->saturated);
        memcpy(L->casts, st->casts, sizeof L->casts);
        double nq = 0, dq = 0, nk = 0, dk = 0, nv = 0, dv = 0;
        if (run->dq) {  // CPU: both probes' gradients on the host
            size_t at = (size_t)l * run->n_attn, n = run->n_attn;
            diff_norms(run->dq + at, ref->dq + at, n, &nq, &dq);
            diff_norms(run->dk + at, ref->dk + at, n, &nk, &dk);
            diff_norms(run->dv + at, ref->dv + at, n, &nv, &dv);
        } else {  // GPU: compared on the device against the reference probe's kept gradients
            const double *c = run->cmp_sq + 6 * (size_t)l;
            nq = c[0], dq = c[1], nk = c[2], dk = c[3], nv = c[4], dv = c[5];
        }
        L->err_dq = rel_err(nq, dq);
        L->err_dk = rel_err(nk, dk);
        L->err_dv = rel_err(nv, dv);
        L->err_qkv = rel_err(nq + nk + nv, dq + dk + dv);
        const double *s = run->local_sq + 6 * (size_t)l;  // (x - ref)^2, ref^2 for dq, dk, dv
        L->local_dq = rel_err(s[0], s[1]);
        L->local_dk = rel_err(s[2], s[3]);
        L->local_dv = rel_err(s[4], s[5]);
        L->local_qkv = rel_err(s[0] + s[2] + s[4], s[1] + s[3] + s[5]);
    }
    free(scratch);
}

static void prepare(Diagnostics *d, CpuModel *m, GpuModel *g) {
    int B = m ? m->B : g->B, T = m ? m->T : g->T;
    if (B != d->B || T != d->T)
        FATAL("diagnostics: probe batches of %d x %d tokens for a model sized for %d x %d", d->B, d->T, B, T);
    if (d->prepared) return;
    if (m) {
        cpu_probe_alloc(&d->run, m);
        cpu_probe_alloc(&d->ref, m);
    } else {  // the reference keeps its dq, dk, dv on the device for the run's probe to compare with
        gpu_probe_alloc(&d->run, g, 0);
        gpu_probe_alloc(&d->ref, g, 1);
    }
    d->on_gpu = m == NULL;
    bias_probe_init(&d->bias, m ? m->table.total : g->table.total);
    d->last.n_layer = m ? m->cfg.model.n_layer : g->cfg.model.n_layer;
    d->last.layers = xcalloc((size_t)(d->last.n_layer ? d->last.n_layer : 1), sizeof(DiagLayer));
    d->prepared = 1;
}

// --- output --------------------------------------------------------------------------------------

static void json_num(cJSON *o, const char *key, double x) {
    if (isfinite(x)) cJSON_AddNumberToObject(o, key, x);
    else cJSON_AddNullToObject(o, key);
}

char *diagnostics_json(const DiagReport *r) {
    cJSON *root = cJSON_CreateObject();
    cJSON_AddNumberToObject(root, "step", (double)r->step);
    cJSON *dg = cJSON_AddObjectToObject(root, "diagnostics");
    cJSON_AddStringToObject(dg, "mode", attn_precision_name(r->mode));
    cJSON_AddStringToObject(dg, "reference", attn_precision_name(r->reference));
    json_num(dg, "loss_mode", r->loss_mode);
    json_num(dg, "loss_ref", r->loss_ref);
    cJSON *layers = cJSON_AddArrayToObject(dg, "layers");
    for (int l = 0; l < r->n_layer; l++) {
        const DiagLayer *L = &r->layers[l];
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "layer", l);
        json_num(o, "resid_median", L->resid_median);
        json_num(o, "resid_max", L->resid_max);
        json_num(o, "resid_cancel_median", L->resid_cancel_median);
        json_num(o, "resid_cancel_max", L->resid_cancel_max);
        json_num(o, "post_resid_median", L->post_median);
        json_num(o, "post_resid_max", L->post_max);
        cJSON *sat = cJSON_AddObjectToObject(o, "saturated");
        cJSON *casts = cJSON_AddObjectToObject(o, "casts");
        long long ns = 0, nc = 0;
        for (int k = 0; k < ATTN_N_CASTS; k++) {
            cJSON_AddNumberToObject(sat, cast_names[k], (double)L->saturated[k]);
            cJSON_AddNumberToObject(casts, cast_names[k], (double)L->casts[k]);
            ns += L->saturated[k];
            nc += L->casts[k];
        }
        json_num(o, "saturated_fraction", nc ? (double)ns / nc : 0.0);
        json_num(o, "err_dq", L->err_dq);
        json_num(o, "err_dk", L->err_dk);
        json_num(o, "err_dv", L->err_dv);
        json_num(o, "err_qkv", L->err_qkv);
        json_num(o, "local_err_dq", L->local_dq);
        json_num(o, "local_err_dk", L->local_dk);
        json_num(o, "local_err_dv", L->local_dv);
        json_num(o, "local_err_qkv", L->local_qkv);
        cJSON_AddItemToArray(layers, o);
    }
    json_num(dg, "bias_ratio", r->bias_ratio);
    cJSON_AddNumberToObject(dg, "bias_n", r->bias_n);
    json_num(dg, "bias_random_level", r->bias_n > 0 ? 1.0 / sqrt((double)r->bias_n) : NAN);
    json_num(dg, "seconds", r->seconds);
    char *body = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!body) FATAL("diagnostics: cJSON could not print the metrics line (out of memory?)");
    size_t n = strlen(body);
    char *line = xmalloc(n + 2);
    memcpy(line, body, n);
    line[n] = '\n';
    line[n + 1] = '\0';
    cJSON_free(body);
    return line;
}

static void print_table(FILE *f, const DiagReport *r, int B, int T) {
    fprintf(f, "diagnostics step %lld | attention %s vs reference %s | probe %d x %d tokens, loss %.4f (ref %.4f) | %.1fs\n",
            r->step, attn_precision_name(r->mode), attn_precision_name(r->reference), B, T, r->loss_mode,
            r->loss_ref, r->seconds);
    fprintf(f, "  %5s %9s %9s %9s %9s %9s %9s  %-24s %8s %8s %8s %8s %8s %8s %8s\n", "layer", "resid_med", "resid_max",
            "canc_med", "canc_max", "post_med", "post_max", "saturated q/k/v/do/p/ds", "sat_frac", "err_dq", "err_dk", "err_dv", "loc_dq", "loc_dk",
            "loc_dv");
    for (int l = 0; l < r->n_layer; l++) {
        const DiagLayer *L = &r->layers[l];
        char sat[128];
        int at = 0;
        long long ns = 0, nc = 0;
        for (int k = 0; k < ATTN_N_CASTS; k++) {
            at += snprintf(sat + at, sizeof sat - (size_t)at, "%s%lld", k ? "/" : "", L->saturated[k]);
            if (at >= (int)sizeof sat) at = (int)sizeof sat - 1;
            ns += L->saturated[k];
            nc += L->casts[k];
        }
        fprintf(f, "  %5d %9.2e %9.2e %9.2e %9.2e %9.2e %9.2e  %-24s %8.1e %8.2e %8.2e %8.2e %8.2e %8.2e %8.2e\n", l,
                L->resid_median, L->resid_max, L->resid_cancel_median, L->resid_cancel_max, L->post_median, L->post_max, sat, nc ? (double)ns / nc : 0.0, L->err_dq, L->err_dk, L->err_dv,
                L->local_dq, L->local_dk, L->local_dv);
    }
    if (r->bias_n > 0 && isfinite(r->bias_ratio))
        fprintf(f, "  gradient bias ratio %.3f over %d probe batches (1/sqrt(N) = %.3f if the errors were random, "
                   "1 if systematic)\n", r->bias_ratio, r->bias_n, 1.0 / sqrt((double)r->bias_n));
    else if (r->bias_n > 0)
        fprintf(f, "  gradient bias ratio n/a: the gradients equal the reference's on all %d probe batches\n", r->bias_n);
    else
        fprintf(f, "  gradient bias ratio off (diagnostics.bias_probe_batches = 0)\n");
    fflush(f);
}

// --- events --------------------------------------------------------------------------------------

const DiagReport *diagnostics_run(Diagnostics *d, CpuModel *m, GpuModel *g, long long step, FILE *metrics,
                                  FILE *log) {
    if (!m == !g) FATAL("diagnostics_run: pass exactly one of the CPU and the GPU model");
    double t0 = now_seconds();
    prepare(d, m, g);
    DiagReport *r = &d->last;
    r->step = step;
    r->mode = m ? m->attn.precision : gpu_model_attention(g);
    r->reference = d->reference;
    bias_probe_reset(&d->bias);
    size_t bt = (size_t)d->B * d->T;
    int n = d->n_bias > 1 ? d->n_bias : 1;
    for (int b = 0; b < n; b++) {
        const int32_t *in = d->inputs + (size_t)b * bt, *tg = d->targets + (size_t)b * bt;
        AttnPrecision local = b == 0 ? r->reference : ATTN_N_PRECISIONS;
        if (m) {
            cpu_model_probe(m, r->reference, ATTN_N_PRECISIONS, in, tg, &d->ref);
            cpu_model_probe(m, r->mode, local, in, tg, &d->run);
        } else {
            gpu_model_probe(g, r->reference, ATTN_N_PRECISIONS, in, tg, NULL, &d->ref);
            gpu_model_probe(g, r->mode, local, in, tg, &d->ref, &d->run);
        }
        if (b == 0) {
            fill_layers(d);
            r->loss_mode = d->run.loss;
            r->loss_ref = d->ref.loss;
        }
        if (d->n_bias > 0) bias_probe_add(&d->bias, d->run.grads, d->ref.grads);
    }
    r->bias_n = d->n_bias > 0 ? d->bias.count : 0;
    r->bias_ratio = d->n_bias > 0 ? bias_probe_ratio(&d->bias) : NAN;
    r->seconds = now_seconds() - t0;
    if (log) print_table(log, r, d->B, d->T);
    if (metrics) {
        char *line = diagnostics_json(r);
        fputs(line, metrics);
        fflush(metrics);
        free(line);
    }
    return r;
}

void diagnostics_maybe_run(Diagnostics *d, CpuModel *cpu, GpuModel *gpu, long long step, FILE *metrics, FILE *log) {
    if (!diagnostics_due(d, step)) return;
    diagnostics_run(d, cpu, gpu, step, metrics, log);
}
