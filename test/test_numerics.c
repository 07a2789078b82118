// test_numerics.c: the attention numerics beyond the paper (docs/fp8-attention.md §6) where they
// meet the model, checkpoints and diagnostics: the CPU model's delayed key centres (each
// backward commits its micro-batch's key means; probes and attention captures leave them as they
// were), their place in checkpoints (version 2; version 1 files still load, a newer version or a
// corrupt count is refused with a message), and the diagnostics' post-cast residual.
// The kernels' own properties are test_attention_cpu.c's.
#include <cjson/cJSON.h>  // reading back the metrics line
#include <math.h>         // fabs, isfinite
#include <stdint.h>       // int32_t, uint64_t
#include <stdlib.h>       // malloc, mkdtemp
#include <string.h>       // memcmp, strstr

#include "core/checkpoint.h"   // checkpoint_save, checkpoint_load, checkpoint_checksum
#include "core/common.h"       // read_file_text
#include "core/config.h"       // Config, config_defaults
#include "core/fp8.h"          // bf16_round
#include "cpu/model_cpu.h"     // CpuModel, key centres, cpu_model_attention_inputs
#include "eval/diagnostics.h"  // the post-cast residual per layer
#include "test.h"              // CHECK

enum { B = 2, T = 64, L = 2, H = 2, HD = 64, V = 300 };

static char dir[256];

static unsigned long long rng = 0x9E3779B97F4A7C15ull;
static uint32_t rnd(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)(rng >> 33);
}

static Config tiny_config(AttnPrecision mode, AttnCenterKeys center, int correction) {
    Config c;
    config_defaults(&c);
    ModelConfig *m = &c.model;
    m->d_model = H * HD;
    m->n_head = H;
    m->head_dim = HD;
    m->n_layer = L;
    m->ffn_hidden = 96;
    m->vocab_size = V;
    m->padded_vocab_size = 384;
    m->seq_len = T;
    m->position = POS_ROPE;
    c.precision.attention = mode;
    c.precision.attention_center_keys = center;
    c.precision.attention_rowsum_correction = correction;
    c.diagnostics.interval = 1;
    c.diagnostics.bias_probe_batches = 0;
    c.diagnostics.reference = ATTN_BF16;
    return c;
}

static void make_batch(int32_t *in, int32_t *tg) {
    for (int i = 0; i < B * T; i++) {
        in[i] = (int32_t)(rnd() % V);
        tg[i] = (int32_t)(rnd() % V);
    }
}

// A model whose QKV weights are scaled up, so that attention is not uniform.
static void model_init(CpuModel *m, const Config *c) {
    cpu_model_init(m, c, B, T, 7);
    for (int l = 0; l < L; l++) {
        const ParamDesc *d = param_find(&m->table, P_QKV, l);
        for (size_t j = 0; j < d->numel; j++) m->params[d->offset + j] *= 8.0f;
    }
}

// The mean over the micro-batch of layer `layer`'s head `head` keys, as attn_key_centers_accumulate
// forms it (FP64 sums, BF16), from the keys cpu_model_attention_inputs hands out.
static void expected_center(CpuModel *m, const int32_t *in, const int32_t *tg, int layer, int head, float *c) {
    float *q = malloc(4 * (size_t)T * HD * sizeof(float));
    double sum[HD] = {0};
    for (int b = 0; b < B; b++) {
        cpu_model_attention_inputs(m, in, tg, layer, b, head, q, q + T * HD, q + 2 * T * HD, q + 3 * T * HD);
        for (int t = 0; t < T; t++)
            for (int x = 0; x < HD; x++) sum[x] += q[T * HD + t * HD + x];
    }
    for (int x = 0; x < HD; x++) c[x] = bf16_round((float)(sum[x] / (B * T)));
    free(q);
}

static void test_model_centers(void) {
    Config c = tiny_config(ATTN_FP8_DM, CENTER_KEYS_DELAYED, 1);
    CpuModel m;
    model_init(&m, &c);
    int32_t in[B * T], tg[B * T], in2[B * T], tg2[B * T];
    make_batch(in, tg);
    make_batch(in2, tg2);
    CHECK(m.key_centers.center && m.key_centers.ready == 0 && m.key_centers.n_layer == L && m.key_centers.n_head == H &&
              m.key_centers.head_dim == HD,
          "model: delayed key centres allocated per layer and head, no estimate before the first backward",
          "center %p ready %d", (void *)m.key_centers.center, m.key_centers.ready);

    // The attention capture leaves the (empty) estimate as it was; the first step's keys define the next c.
    float want[L][H][HD];
    for (int l = 0; l < L; l++)
        for (int h = 0; h < H; h++) expected_center(&m, in, tg, l, h, want[l][h]);
    CHECK(m.key_centers.ready == 0, "model: cpu_model_attention_inputs commits no key centre", "ready %d",
          m.key_centers.ready);
    float loss1 = cpu_model_forward(&m, in, tg);
    CHECK(m.key_centers.ready == 0, "model: a forward alone commits no key centre", "ready %d", m.key_centers.ready);
    cpu_model_backward(&m, 1.0f);
    CHECK(m.key_centers.ready == 1 && !memcmp(m.key_centers.center, want, sizeof want),
          "model: the backward commits the micro-batch's key means per layer and head (FP64 sums, BF16)",
          "ready %d, c[0][0][0] %g vs %g", m.key_centers.ready, m.key_centers.center[0], want[0][0][0]);

    // A probe and a capture leave the committed c untouched; an evaluation forward too.
    size_t nc = (size_t)attn_key_centers_count(&m.key_centers);
    float *saved = malloc(nc * sizeof(float));
    memcpy(saved, m.key_centers.center, nc * sizeof(float));
    ModelProbe p;
    cpu_probe_alloc(&p, &m);
    cpu_model_probe(&m, ATTN_FP8_DM, ATTN_BF16, in2, tg2, &p);
    float qkvd[4 * T * HD];
    cpu_model_attention_inputs(&m, in2, tg2, 1, 1, 1, qkvd, qkvd + T * HD, qkvd + 2 * T * HD, qkvd + 3 * T * HD);
    cpu_model_loss(&m, in2, tg2);
    CHECK(m.key_centers.ready == 1 && !memcmp(m.key_centers.center, saved, nc * sizeof(float)),
          "model: probes, captures and evaluation forwards leave the key centres as they were", "changed");
    int finite = 1;
    for (size_t i = 0; i < p.n_rows * L; i++) finite &= isfinite(p.row_post_resid[i]) && p.row_post_resid[i] >= 0;
    CHECK(finite && p.layer_stats[0].post_resid_max > 0, "model: a CPU probe records the post-cast residual per row",
          "finite %d, max %g", finite, p.layer_stats[0].post_resid_max);
    cpu_probe_free(&p);

    // The centre changes only FP8 rounding: the second step's loss with c, without c, and with
    // the head's own mean all agree to FP8-attention accuracy.
    float loss_delayed = cpu_model_loss(&m, in2, tg2);
    CpuModel off, mean;
    Config co = tiny_config(ATTN_FP8_DM, CENTER_KEYS_OFF, 0), cm = tiny_config(ATTN_FP8_DM, CENTER_KEYS_MEAN, 0);
    model_init(&off, &co);
    model_init(&mean, &cm);
    memcpy(off.params, m.params, m.table.total * sizeof(float));
    memcpy(mean.params, m.params, m.table.total * sizeof(float));
    float loss_off = cpu_model_loss(&off, in2, tg2), loss_mean = cpu_model_loss(&mean, in2, tg2);
    CHECK(fabs(loss_delayed - loss_off) < 0.02 * loss_off && fabs(loss_mean - loss_off) < 0.02 * loss_off &&
              off.key_centers.center == NULL && isfinite(loss1),
          "model: the loss with delayed or mean key centres agrees with the uncentred one (FP8 rounding apart)",
          "delayed %.5f mean %.5f off %.5f", loss_delayed, loss_mean, loss_off);
    cpu_model_free(&off);
    cpu_model_free(&mean);

    // Checkpoints carry c: a fresh model loads it, ready.
    char path[320];
    snprintf(path, sizeof path, "%s/centers.ckpt", dir);
    CheckpointState s = {.model = &m.cfg.model, .table = &m.table, .config_json = "{}", .params = m.params,
                         .adam_m = m.params, .adam_v = m.params, .key_centers = &m.key_centers};
    ErrBuf e;
    int rc = checkpoint_save(path, &s, &e);
    CpuModel back;
    model_init(&back, &c);
    CheckpointState r = {.model = &back.cfg.model, .table = &back.table, .params = back.params,
                         .key_centers = &back.key_centers};
    int rc2 = rc == 0 ? checkpoint_load(path, &r, &e) : -1;
    CHECK(rc == 0 && rc2 == 0 && back.key_centers.ready == 1 && !memcmp(back.key_centers.center, saved, nc * sizeof(float)),
          "checkpoint: the key centres round-trip (version 2)", "save %d load %d (%s), ready %d", rc, rc2,
          rc2 ? e.msg : "", back.key_centers.ready);
    // A model without centred keys loads the same file and ignores them.
    CpuModel plain;
    Config cp = tiny_config(ATTN_FP8_DM, CENTER_KEYS_OFF, 0);
    model_init(&plain, &cp);
    CheckpointState r2 = {.model = &plain.cfg.model, .table = &plain.table, .params = plain.params};
    rc2 = checkpoint_load(path, &r2, &e);
    CHECK(rc2 == 0, "checkpoint: a model without centred keys loads a file that has them", "%s", rc2 ? e.msg : "");
    cpu_model_free(&plain);
    cpu_model_free(&back);
    free(saved);
    cpu_model_free(&m);
}

// --- checkpoint versions ---------------------------------------------------------------------

// Writes bytes with the file size field and the checksum made to fit.
static void write_fixed(const char *path, unsigned char *b, size_t len) {
    uint64_t size = len;
    memcpy(b + 8, &size, 8);
    uint64_t h = checkpoint_checksum(b, len - 8);
    memcpy(b + len - 8, &h, 8);
    FILE *f = fopen(path, "wb");
    fwrite(b, 1, len, f);
    fclose(f);
}

static void test_checkpoint_versions(void) {
    Config c = tiny_config(ATTN_FP8_DM, CENTER_KEYS_DELAYED, 0);
    CpuModel m;
    model_init(&m, &c);
    char v2[320], v1[320], bad[320];
    snprintf(v2, sizeof v2, "%s/v2.ckpt", dir);
    snprintf(v1, sizeof v1, "%s/v1.ckpt", dir);
    snprintf(bad, sizeof bad, "%s/bad.ckpt", dir);
    ErrBuf e;
    // no estimate yet: the file holds a zero count, and loading leaves the model without one
    CheckpointState s = {.model = &m.cfg.model, .table = &m.table, .config_json = "{}", .params = m.params,
                         .adam_m = m.params, .adam_v = m.params, .key_centers = &m.key_centers};
    int rc = checkpoint_save(v2, &s, &e);
    size_t len = 0;
    unsigned char *b = rc == 0 ? (unsigned char *)read_file_text(v2, &len, &e) : NULL;
    uint64_t count = 1;
    uint32_t version = 0;
    if (b) { memcpy(&count, b + len - 16, 8); memcpy(&version, b + 4, 4); }
    CHECK(b && version == 2 && count == 0, "checkpoint: version 2, a zero key-centre count before the first commit",
          "version %u count %llu", version, (unsigned long long)count);
    if (!b) return;

    // version 1: the same file without the key-centre section
    unsigned char *old = malloc(len);
    memcpy(old, b, len - 16);
    memcpy(old + len - 16, b + len - 8, 8);
    uint32_t one = 1;
    memcpy(old + 4, &one, 4);
    write_fixed(v1, old, len - 8);
    m.key_centers.ready = 0;
    CheckpointState r = {.model = &m.cfg.model, .table = &m.table, .params = m.params, .key_centers = &m.key_centers};
    rc = checkpoint_load(v1, &r, &e);
    CHECK(rc == 0 && m.key_centers.ready == 0, "checkpoint: a version-1 file (no key centres) still loads",
          "rc %d: %s", rc, rc ? e.msg : "");

    // a newer version, and a key-centre count past the end, are refused with the file named
    uint32_t three = 3;
    memcpy(b + 4, &three, 4);
    write_fixed(bad, b, len);
    rc = checkpoint_load(bad, &r, &e);
    CHECK(rc == -1 && strstr(e.msg, bad) && strstr(e.msg, "format version 3") && strstr(e.msg, "versions 1 to 2"),
          "checkpoint: a newer format version is refused, naming the file and the versions read", "%s", e.msg);
    memcpy(b + 4, &version, 4);
    uint64_t huge = 1000;
    memcpy(b + len - 16, &huge, 8);
    write_fixed(bad, b, len);
    rc = checkpoint_load(bad, &r, &e);
    CHECK(rc == -1 && strstr(e.msg, "key-centre values do not fit"), "checkpoint: a corrupt key-centre count is refused",
          "%s", e.msg);
    free(old);
    free(b);
    cpu_model_free(&m);
}

// --- diagnostics ------------------------------------------------------------------------------

static void test_diagnostics_post_cast(void) {
    Config c = tiny_config(ATTN_FP8_DM, CENTER_KEYS_OFF, 0);
    CpuModel m;
    model_init(&m, &c);
    int32_t in[B * T], tg[B * T];
    make_batch(in, tg);
    Diagnostics d;
    diagnostics_init_batches(&d, &c, B, T, in, tg, 1);
    const DiagReport *r = diagnostics_run(&d, &m, NULL, 1, NULL, NULL);
    int ok = 1;
    for (int l = 0; l < L; l++) {
        const DiagLayer *x = &r->layers[l];
        ok &= x->post_median > 1e-4 && x->post_median < 0.1 && x->post_max >= x->post_median &&
              x->resid_median < 1e-5 && x->post_median > 10 * x->resid_median;
    }
    CHECK(ok, "diagnostics (CPU): fp8_dm's post-cast residual per layer, far above its FP32 residual",
          "layer 0: post median %.2e max %.2e, FP32 median %.2e", r->layers[0].post_median, r->layers[0].post_max,
          r->layers[0].resid_median);
    char *line = diagnostics_json(r);
    cJSON *root = cJSON_Parse(line);
    cJSON *layer0 = root ? cJSON_GetArrayItem(cJSON_GetObjectItem(cJSON_GetObjectItem(root, "diagnostics"), "layers"), 0)
                         : NULL;
    cJSON *pm = layer0 ? cJSON_GetObjectItem(layer0, "post_resid_median") : NULL;
    cJSON *px = layer0 ? cJSON_GetObjectItem(layer0, "post_resid_max") : NULL;
    CHECK(pm && px && cJSON_IsNumber(pm) && fabs(pm->valuedouble - r->layers[0].post_median) <= 1e-6 * r->layers[0].post_median,
          "diagnostics: the metrics line carries post_resid_median and post_resid_max", "%s", line);
    cJSON_Delete(root);
    free(line);
    diagnostics_free(&d);
    cpu_model_free(&m);
}

int main(void) {
    snprintf(dir, sizeof dir, "/tmp/test_numerics_XXXXXX");
    if (!mkdtemp(dir)) {
        printf("FAIL - scratch directory: cannot create %s\n", dir);
        return 1;
    }
    double t0 = now_seconds();
    test_model_centers();
    test_checkpoint_versions();
    test_diagnostics_post_cast();
    char cmd[300];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("# could not remove %s\n", dir);
    printf("# test_numerics: %.1f s\n", now_seconds() - t0);
    return test_summary("test_numerics");
}
