// test_diagnostics.c: the FP8-attention diagnostics (diagnostics.c) and the probe of the CPU model
// they run on (cpu_model_probe): the probe is the training computation and leaves the training
// state bit-identical; the per-layer residuals, saturation counts and gradient errors separate the
// modes as the spec says; the bias ratio reads 1 for systematic and ~1/sqrt(N) for random
// differences; the metrics line parses; the GPU path and bad probe data are handled.
//
// The model is tiny (2 layers, 2 heads of 64, T = 128) with its QKV weights scaled up so that
// attention ranges from diffuse to sharp, as in spec §4.
#include <cjson/cJSON.h>  // reading back the metrics line
#include <math.h>         // sqrt, isnan
#include <stdint.h>       // int32_t
#include <stdlib.h>       // malloc
#include <string.h>       // memcmp, strstr
#include <unistd.h>       // getpid for scratch paths

#include "core/config.h"       // Config, config_defaults
#include "dataloader.h"        // shard_write for the probe-data test
#include "eval/diagnostics.h"  // the module under test
#include "cpu/model_cpu.h"     // CpuModel, cpu_model_probe
#include "test.h"              // CHECK

enum { B = 2, T = 128, L = 2, N_BIAS = 4, V = 300 };

static unsigned long long rng = 0x243F6A8885A308D3ull;
static double urand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * 0x1p-53;
}
static double nrand(void) {  // Box-Muller
    double u = urand(), v = urand();
    return sqrt(-2.0 * log(u > 0 ? u : 1e-300)) * cos(6.283185307179586 * v);
}

static Config tiny_config(AttnPrecision mode) {
    Config c;
    config_defaults(&c);
    ModelConfig *m = &c.model;
    m->d_model = 128;
    m->n_head = 2;
    m->head_dim = 64;
    m->n_layer = L;
    m->ffn_hidden = 96;
    m->vocab_size = V;
    m->padded_vocab_size = 384;
    m->seq_len = T;
    m->position = POS_ROPE;
    c.precision.attention = mode;
    c.diagnostics.interval = 10;
    c.diagnostics.bias_probe_batches = N_BIAS;
    c.diagnostics.reference = ATTN_BF16;
    return c;
}

// A model whose QKV weights are scaled by qkv_scale (12: q, k entries of std ~2.7, scores of std
// ~7: from diffuse in some rows to nearly one-hot in others).
static float qkv_scale = 12.0f;
static void model_init(CpuModel *m, const Config *c) {
    cpu_model_init(m, c, B, T, 5);
    const ParamDesc *d;
    for (int l = 0; l < L; l++) {
        d = param_find(&m->table, P_QKV, l);
        for (size_t j = 0; j < d->numel; j++) m->params[d->offset + j] *= qkv_scale;
    }
}

static int32_t probe_in[N_BIAS * B * T], probe_tg[N_BIAS * B * T];
static void make_batches(void) {
    for (int i = 0; i < N_BIAS * B * T; i++) {
        probe_in[i] = (int32_t)(urand() * V);
        probe_tg[i] = (int32_t)(urand() * V);
    }
}

// One diagnostics event of a fresh model in `mode` (options adjusted by p_scale when > 0).
static DiagReport event(AttnPrecision mode, AttnPrecision reference, double p_scale, DiagLayer *layers_out) {
    Config c = tiny_config(mode);
    c.diagnostics.reference = reference;
    if (p_scale > 0) c.precision.attention_p_scale = p_scale;
    CpuModel m;
    model_init(&m, &c);
    Diagnostics d;
    diagnostics_init_batches(&d, &c, B, T, probe_in, probe_tg, N_BIAS);
    DiagReport r = *diagnostics_run(&d, &m, NULL, 10, NULL, NULL);
    memcpy(layers_out, r.layers, sizeof(DiagLayer) * L);
    r.layers = layers_out;
    diagnostics_free(&d);
    cpu_model_free(&m);
    return r;
}

// The probe computes what training computes, and leaves no trace: with delayed scaling (amax
// histories that a backward commits) and FP8 linears (counters), after a few training steps.
static void test_probe_is_training_and_leaves_no_trace(void) {
    Config c = tiny_config(ATTN_FP8_DM);
    c.precision.attention_scaling = SCALING_DELAYED;
    c.precision.linear = LINEAR_FP8_BLOCK;
    CpuModel a, b;  // a gets diagnostics between steps, b does not
    model_init(&a, &c);
    model_init(&b, &c);
    for (int s = 0; s < 2; s++) {
        cpu_model_zero_grad(&a);
        cpu_model_zero_grad(&b);
        cpu_model_forward(&a, probe_in + (size_t)s * B * T, probe_tg + (size_t)s * B * T);
        cpu_model_forward(&b, probe_in + (size_t)s * B * T, probe_tg + (size_t)s * B * T);
        cpu_model_backward(&a, 1.0f);
        cpu_model_backward(&b, 1.0f);
    }
    size_t n = a.table.total;
    float *params0 = malloc(n * sizeof(float)), *grads0 = malloc(n * sizeof(float));
    memcpy(params0, a.params, n * sizeof(float));
    memcpy(grads0, a.grads, n * sizeof(float));
    AttnDelayedState ds0[L];
    memcpy(ds0, a.attn_delayed, sizeof ds0);
    AttnStats st0 = a.attn_stats;
    AttnOptions opt0 = a.attn;

    Diagnostics d;
    diagnostics_init_batches(&d, &c, B, T, probe_in, probe_tg, N_BIAS);
    diagnostics_run(&d, &a, NULL, 10, NULL, NULL);
    CHECK(memcmp(params0, a.params, n * sizeof(float)) == 0, "probe: parameters untouched", "they changed");
    CHECK(memcmp(grads0, a.grads, n * sizeof(float)) == 0, "probe: gradients untouched", "they changed");
    CHECK(memcmp(ds0, a.attn_delayed, sizeof ds0) == 0, "probe: delayed-scaling amax histories untouched",
          "they changed");
    CHECK(memcmp(&st0, &a.attn_stats, sizeof st0) == 0 && memcmp(&opt0, &a.attn, sizeof opt0) == 0,
          "probe: attention stats and options untouched", "they changed");

    // The next training step of a equals b's bit for bit.
    cpu_model_zero_grad(&a);
    cpu_model_zero_grad(&b);
    float la = cpu_model_forward(&a, probe_in + 2 * B * T, probe_tg + 2 * B * T);
    float lb = cpu_model_forward(&b, probe_in + 2 * B * T, probe_tg + 2 * B * T);
    cpu_model_backward(&a, 1.0f);
    cpu_model_backward(&b, 1.0f);
    CHECK(la == lb && memcmp(a.grads, b.grads, n * sizeof(float)) == 0 &&
              memcmp(a.attn_delayed, b.attn_delayed, sizeof ds0) == 0,
          "probe: the following training step is bit-identical to a run without diagnostics",
          "loss %.9g vs %.9g", la, lb);

    // The probe's gradient is the training gradient of the same batch at the same state.
    ModelProbe p;
    cpu_probe_alloc(&p, &b);
    memcpy(ds0, b.attn_delayed, sizeof ds0);
    cpu_model_probe(&b, ATTN_FP8_DM, ATTN_BF16, probe_in, probe_tg, &p);
    cpu_model_zero_grad(&b);
    float lt = cpu_model_forward(&b, probe_in, probe_tg);
    cpu_model_backward(&b, 1.0f);
    CHECK(lt == p.loss && memcmp(p.grads, b.grads, n * sizeof(float)) == 0,
          "probe: gradient equals the training gradient of the same batch", "loss %.9g vs %.9g", p.loss, lt);
    long long casts = 0, casts_train = 0;
    double cancel = 0;
    for (int l = 0; l < L; l++) {
        for (int k = 0; k < ATTN_N_CASTS; k++) casts += p.layer_stats[l].casts[k];
        cancel = fmax(cancel, p.layer_stats[l].resid_cancel_max);
    }
    for (int k = 0; k < ATTN_N_CASTS; k++) casts_train += b.attn_stats.casts[k];
    CHECK(casts == casts_train && casts > 0 && cancel == b.attn_stats.resid_cancel_max,
          "probe: per-layer stats add up to the training step's", "casts %lld vs %lld, cancel %.3e vs %.3e", casts,
          casts_train, cancel, b.attn_stats.resid_cancel_max);
    cpu_probe_free(&p);
    diagnostics_free(&d);
    free(params0);
    free(grads0);
    cpu_model_free(&a);
    cpu_model_free(&b);
}

static void test_modes(void) {
    DiagLayer lb[L], ln[L], ld[L], lh[L], ls[L], lf[L];
    DiagReport bf = event(ATTN_BF16, ATTN_BF16, 0, lb);
    DiagReport nv = event(ATTN_FP8_NAIVE, ATTN_BF16, 0, ln);
    DiagReport dm = event(ATTN_FP8_DM, ATTN_BF16, 0, ld);
    DiagReport hy = event(ATTN_FP8_HYBRID, ATTN_BF16, 0, lh);
    DiagReport sat = event(ATTN_FP8_DM, ATTN_BF16, 32768.0, ls);
    DiagReport f32 = event(ATTN_BF16, ATTN_FP32, 0, lf);
    const DiagReport *all[] = {&bf, &nv, &dm, &hy, &sat, &f32};
    printf("# qkv_scale %g\n# %-10s %-5s %5s %9s %9s %9s %8s %8s %8s %8s %8s %8s %6s %6s\n", qkv_scale, "mode", "ref",
           "layer", "resid_med", "resid_max", "cancel", "err_dq", "err_dk", "err_dv", "loc_dq", "loc_dk", "loc_dv", "sat",
           "bias");
    for (size_t i = 0; i < sizeof all / sizeof all[0]; i++)
        for (int l = 0; l < L; l++) {
            const DiagLayer *x = &all[i]->layers[l];
            long long s = 0;
            for (int k = 0; k < ATTN_N_CASTS; k++) s += x->saturated[k];
            printf("# %-10s %-5s %5d %9.2e %9.2e %9.2e %8.2e %8.2e %8.2e %8.2e %8.2e %8.2e %6lld %6.3f\n",
                   attn_precision_name(all[i]->mode), attn_precision_name(all[i]->reference), l, x->resid_median,
                   x->resid_max, x->resid_cancel_max, x->err_dq, x->err_dk, x->err_dv, x->local_dq, x->local_dk,
                   x->local_dv, s, all[i]->bias_ratio);
        }

    double dm_cancel = 0, naive_cancel = 1e30;
    int bf_zero = 1, bf_no_casts = 1, fp8_err_pos = 1, sat_p = 1;
    double e_dm = 0, e_nv = 0, loc_dm = 0, loc_nv = 0;
    for (int l = 0; l < L; l++) {
        dm_cancel = fmax(dm_cancel, ld[l].resid_cancel_max);
        naive_cancel = fmin(naive_cancel, ln[l].resid_cancel_max);
        bf_zero &= lb[l].err_qkv == 0 && lb[l].local_qkv == 0;
        for (int k = 0; k < ATTN_N_CASTS; k++) bf_no_casts &= lb[l].casts[k] == 0 && lb[l].saturated[k] == 0;
        fp8_err_pos &= ln[l].err_qkv > 0 && ld[l].err_qkv > 0 && lh[l].err_qkv > 0 && ln[l].local_qkv > 0 &&
                       ld[l].local_qkv > 0 && lh[l].local_qkv > 0;
        sat_p &= ls[l].saturated[CAST_P] > 0;
        e_dm += ld[l].err_dq + ld[l].err_dk;
        e_nv += ln[l].err_dq + ln[l].err_dk;
        loc_dm += ld[l].local_dq + ld[l].local_dk;
        loc_nv += ln[l].local_dq + ln[l].local_dk;
    }
    char name[160];
#define NAMED(...) (snprintf(name, sizeof name, __VA_ARGS__), name)
    CHECK(dm_cancel <= 1e-5, NAMED("qkv x%g: fp8_dm per-layer cancellation residual <= 1e-5", qkv_scale), "max %.3e",
          dm_cancel);
    CHECK(naive_cancel > 100 * fmax(dm_cancel, 1e-8), NAMED("qkv x%g: fp8_naive per-layer residual far above fp8_dm's",
          qkv_scale), "naive min %.3e, dm max %.3e", naive_cancel, dm_cancel);
    CHECK(ln[0].resid_median > 0 && ln[0].resid_median <= ln[0].resid_max,
          NAMED("qkv x%g: fp8_naive median residual in (0, max]", qkv_scale), "median %.3e max %.3e",
          ln[0].resid_median, ln[0].resid_max);
    CHECK(bf_zero, NAMED("qkv x%g: bf16 against a bf16 reference: gradient errors exactly 0", qkv_scale), "dq %.3e",
          lb[0].err_dq);
    CHECK(isnan(bf.bias_ratio) && bf.bias_n == N_BIAS, NAMED("qkv x%g: bf16 against bf16: bias ratio n/a", qkv_scale),
          "%.3f", bf.bias_ratio);
    CHECK(bf_no_casts, NAMED("qkv x%g: bf16: no FP8 casts, no saturation", qkv_scale), "layer 0 Q casts %lld",
          lb[0].casts[CAST_Q]);
    CHECK(fp8_err_pos, NAMED("qkv x%g: fp8 modes: attention gradient errors > 0", qkv_scale), "naive %.3e dm %.3e",
          ln[0].err_qkv, ld[0].err_qkv);
    CHECK(e_dm <= 1.05 * e_nv, NAMED("qkv x%g: fp8_dm no worse than fp8_naive on dQ, dK end to end", qkv_scale),
          "dm %.4f naive %.4f", e_dm / (2 * L), e_nv / (2 * L));
    CHECK(loc_dm <= loc_nv, NAMED("qkv x%g: fp8_dm no worse than fp8_naive on dQ, dK locally", qkv_scale),
          "dm %.4f naive %.4f", loc_dm / (2 * L), loc_nv / (2 * L));
    CHECK(sat_p, NAMED("qkv x%g: p_scale 2^15: P casts saturate in every layer", qkv_scale), "layer 0: %lld",
          ls[0].saturated[CAST_P]);
    CHECK(ld[0].saturated[CAST_P] == 0 && ld[0].casts[CAST_P] > 0, NAMED("qkv x%g: p_scale 2^8: no P saturation",
          qkv_scale), "%lld of %lld", ld[0].saturated[CAST_P], ld[0].casts[CAST_P]);
    CHECK(f32.bias_ratio > 0 && f32.bias_ratio <= 1 + 1e-12 && f32.bias_n == N_BIAS,
          NAMED("qkv x%g: bf16 vs fp32: bias ratio in (0, 1]", qkv_scale), "%.4f", f32.bias_ratio);
    CHECK(nv.bias_ratio > 0 && nv.bias_ratio <= 1 + 1e-12 && dm.bias_ratio > 0 && dm.bias_ratio <= 1 + 1e-12,
          NAMED("qkv x%g: fp8 modes: bias ratio in (0, 1]", qkv_scale), "naive %.4f dm %.4f", nv.bias_ratio,
          dm.bias_ratio);
#undef NAMED
}

static void test_bias_ratio(void) {
    enum { N = 64, LEN = 4096 };
    float *g = malloc(LEN * sizeof(float)), *r = malloc(LEN * sizeof(float)), *c = malloc(LEN * sizeof(float));
    for (int i = 0; i < LEN; i++) c[i] = (float)nrand();
    BiasProbe sys, rnd;
    bias_probe_init(&sys, LEN);
    bias_probe_init(&rnd, LEN);
    CHECK(isnan(bias_probe_ratio(&sys)), "bias ratio: NaN before any batch", "%.3f", bias_probe_ratio(&sys));
    for (int b = 0; b < N; b++) {
        for (int i = 0; i < LEN; i++) r[i] = (float)nrand();
        for (int i = 0; i < LEN; i++) g[i] = r[i] + c[i] + 0.1f * (float)nrand();  // systematic + noise
        bias_probe_add(&sys, g, r);
        for (int i = 0; i < LEN; i++) g[i] = r[i] + (float)nrand();  // independent noise
        bias_probe_add(&rnd, g, r);
    }
    double rs = bias_probe_ratio(&sys), rr = bias_probe_ratio(&rnd);
    CHECK(rs > 0.99 && rs <= 1.0, "bias ratio: systematic differences give ~1", "%.4f", rs);
    CHECK(fabs(rr - 1.0 / sqrt(N)) < 0.01, "bias ratio: independent differences give ~1/sqrt(N)",
          "%.4f vs %.4f", rr, 1.0 / sqrt(N));
    bias_probe_reset(&sys);
    for (int i = 0; i < LEN; i++) g[i] = r[i] + c[i];
    bias_probe_add(&sys, g, r);
    CHECK(fabs(bias_probe_ratio(&sys) - 1.0) < 1e-12, "bias ratio: one batch gives exactly 1", "%.6f",
          bias_probe_ratio(&sys));
    bias_probe_free(&sys);
    bias_probe_free(&rnd);
    free(g);
    free(r);
    free(c);
}

static char *slurp(FILE *f) {
    fflush(f);
    long n = ftell(f);
    rewind(f);
    char *s = calloc((size_t)n + 1, 1);
    if (n > 0 && fread(s, 1, (size_t)n, f) != (size_t)n) s[0] = '\0';
    return s;
}

static void test_output_and_schedule(void) {
    Config c = tiny_config(ATTN_FP8_NAIVE);
    CpuModel m;
    model_init(&m, &c);
    Diagnostics d;
    diagnostics_init_batches(&d, &c, B, T, probe_in, probe_tg, N_BIAS);
    FILE *metrics = tmpfile(), *log = tmpfile();
    for (long long s = 1; s <= 10; s++) diagnostics_maybe_run(&d, &m, NULL, s, metrics, log);
    char *line = slurp(metrics), *text = slurp(log);
    printf("%s", text);
    int n_lines = 0;
    for (char *p = line; *p; p++) n_lines += *p == '\n';
    CHECK(n_lines == 1, "diagnostics: one metrics line per event (interval 10, steps 1..10)", "%d lines", n_lines);
    cJSON *o = cJSON_Parse(line);
    cJSON *dg = cJSON_GetObjectItemCaseSensitive(o, "diagnostics");
    cJSON *layers = cJSON_GetObjectItemCaseSensitive(dg, "layers");
    cJSON *l1 = cJSON_GetArrayItem(layers, 1);
    cJSON *bias = cJSON_GetObjectItemCaseSensitive(dg, "bias_ratio");
    cJSON *sat = cJSON_GetObjectItemCaseSensitive(l1, "saturated");
    int ok = o && cJSON_GetObjectItemCaseSensitive(o, "step")->valueint == 10 &&
             strcmp(cJSON_GetObjectItemCaseSensitive(dg, "mode")->valuestring, "fp8_naive") == 0 &&
             strcmp(cJSON_GetObjectItemCaseSensitive(dg, "reference")->valuestring, "bf16") == 0 &&
             cJSON_GetArraySize(layers) == L && cJSON_IsNumber(bias) &&
             fabs(bias->valuedouble - d.last.bias_ratio) < 1e-12 &&
             cJSON_GetObjectItemCaseSensitive(dg, "bias_n")->valueint == N_BIAS &&
             fabs(cJSON_GetObjectItemCaseSensitive(l1, "err_dq")->valuedouble - d.last.layers[1].err_dq) <=
                 1e-12 * d.last.layers[1].err_dq &&
             cJSON_GetObjectItemCaseSensitive(sat, "p") != NULL;
    CHECK(ok, "diagnostics: the metrics line parses and carries the report", "%s", line);
    CHECK(strstr(text, "diagnostics step 10") && strstr(text, "gradient bias ratio"),
          "diagnostics: the log table names the step and the bias ratio", "%s", text);
    cJSON_Delete(o);
    free(line);
    free(text);
    fclose(metrics);
    fclose(log);

    diagnostics_free(&d);

    // Interval 0: disabled, never due.
    c.diagnostics.interval = 0;
    ErrBuf e;
    CHECK(diagnostics_init(&d, &c, B, T, &e) == 0 && !diagnostics_due(&d, 10), "diagnostics: interval 0 is off",
          "due at 10");
    diagnostics_free(&d);
    cpu_model_free(&m);
}

static void test_probe_data(void) {
    Config c = tiny_config(ATTN_FP8_DM);
    ErrBuf e;
    Diagnostics d;
    snprintf(c.data.train, sizeof c.data.train, "/nonexistent_dir_%d/*.bin", (int)getpid());
    int rc = diagnostics_init(&d, &c, B, T, &e);
    CHECK(rc == -1 && strstr(e.msg, "data.train") && strstr(e.msg, "nonexistent_dir"),
          "diagnostics_init: unreadable probe data is a user error naming data.train", "rc %d: %s", rc, e.msg);
    char path[256];
    snprintf(path, sizeof path, "/tmp/test_diagnostics_%d.bin", (int)getpid());
    enum { NTOK = 20 * B * T + 1 };
    uint32_t *tok = malloc(NTOK * sizeof(uint32_t));
    for (int i = 0; i < NTOK; i++) tok[i] = (uint32_t)(urand() * V);
    rc = shard_write(path, tok, NTOK, &e);
    snprintf(c.data.train, sizeof c.data.train, "%s", path);
    rc = rc ? rc : diagnostics_init(&d, &c, B, T, &e);
    int distinct = 1;
    if (rc == 0)
        for (int b = 1; b < d.n_batches; b++)
            distinct &= memcmp(d.inputs, d.inputs + (size_t)b * B * T, sizeof(int32_t) * B * T) != 0;
    CHECK(rc == 0 && d.enabled && d.n_batches == N_BIAS && d.n_bias == N_BIAS && distinct,
          "diagnostics_init: reads N distinct probe batches from the shards", "rc %d n %d", rc, d.n_batches);
    if (rc == 0) diagnostics_free(&d);
    remove(path);
    free(tok);
}

int main(int argc, char **argv) {
    make_batches();
    test_bias_ratio();
    test_probe_is_training_and_leaves_no_trace();
    if (argc > 1) {  // exploring: one sharpness given on the command line
        qkv_scale = (float)atof(argv[1]);
        test_modes();
        return test_summary("test_diagnostics");
    }
    qkv_scale = 4.0f;  // diffuse attention
    test_modes();
    qkv_scale = 12.0f;  // from diffuse to nearly one-hot rows
    test_modes();
    test_output_and_schedule();
    test_probe_data();
    return test_summary("test_diagnostics");
}
