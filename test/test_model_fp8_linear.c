// test_model_fp8_linear.c: the CPU model with FP8 linear layers (precision.linear = fp8_tensor,
// fp8_block): loss and per-tensor gradients close to the BF16 (on the CPU: FP32) linears on the
// same weights and tokens; the BF16-kept first/last blocks and LM head really stay unquantized
// (checked bit for bit on models whose other blocks are silenced); and 30 AdamW steps on Jane
// Austen text (data/austen, ids remapped to a 256-token vocabulary) in which the FP8 runs track
// the BF16 run.
#include <math.h>    // sqrt, fabs
#include <stdint.h>  // int32_t, uint16_t
#include <stdio.h>   // FILE, printf
#include <stdlib.h>  // malloc, free
#include <string.h>  // memcmp, memcpy

#include "core/config.h"    // Config, config_defaults
#include "cpu/model_cpu.h"  // CpuModel
#include "optimizer.h"      // AdamW
#include "test.h"           // CHECK

enum { B = 4, T = 64, BT = B * T, V = 256, STEPS = 30 };

static Config tiny_config(LinearPrecision lin, GradFormat gf) {
    Config c;
    config_defaults(&c);
    ModelConfig *m = &c.model;
    m->d_model = 128;
    m->n_head = 2;
    m->n_layer = 2;
    m->ffn_hidden = 160;  // 2F = 320: 1x128 slices with a partial last one
    m->vocab_size = V;
    m->seq_len = T;
    c.precision.attention = ATTN_FP32;  // isolate the linears
    c.precision.linear = lin;
    c.precision.linear_grad_format = gf;
    c.train.lr = 3e-3;
    c.train.schedule = SCHED_CONSTANT;
    c.train.steps = STEPS;
    config_derive(&c);
    return c;
}

// --- data: Austen's GPT-2 ids, the 255 most frequent kept (0..254), the rest mapped to 255 ------
static int32_t *g_text;
static long g_text_len;

static int load_austen(void) {
    const char *path = "data/austen/train_000000.bin";
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    int32_t header[256];
    int ok = fread(header, sizeof header, 1, f) == 1 && header[0] == 20240520 && header[2] > 0;
    long n = ok ? header[2] : 0;
    uint16_t *raw = malloc(sizeof(uint16_t) * (n ? n : 1));
    ok = ok && fread(raw, sizeof(uint16_t), (size_t)n, f) == (size_t)n;
    fclose(f);
    if (!ok) {
        free(raw);
        return -1;
    }
    static long count[65536];
    for (long i = 0; i < n; i++) count[raw[i]]++;
    static int32_t map[65536];
    for (int i = 0; i < 65536; i++) map[i] = V - 1;
    for (int r = 0; r < V - 1; r++) {  // selection of the top ids (ties: smaller id first)
        int best = -1;
        for (int i = 0; i < 65536; i++)
            if (count[i] > 0 && (best < 0 || count[i] > count[best])) best = i;
        if (best < 0) break;
        map[best] = r;
        count[best] = -1;
    }
    g_text = malloc(sizeof(int32_t) * n);
    for (long i = 0; i < n; i++) g_text[i] = map[raw[i]];
    g_text_len = n;
    free(raw);
    return 0;
}

// Batch `step`: B windows of T + 1 tokens at seeded offsets (the same for every run).
static void batch(int step, int32_t *tok, int32_t *tgt) {
    unsigned long long s = 0x9E3779B97F4A7C15ull * (unsigned long long)(step + 1);
    for (int b = 0; b < B; b++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        long off = (long)((s >> 17) % (unsigned long long)(g_text_len - T - 1));
        for (int t = 0; t < T; t++) {
            tok[b * T + t] = g_text[off + t];
            tgt[b * T + t] = g_text[off + t + 1];
        }
    }
}

// --- loss and gradients at initialisation -------------------------------------------------------
typedef struct {
    float loss;
    float *grads;  // (table.total)
} LossGrad;

static LossGrad loss_and_grad(const Config *c, void (*edit)(CpuModel *)) {
    CpuModel m;
    cpu_model_init(&m, c, B, T, 7);
    if (edit) edit(&m);
    int32_t tok[BT], tgt[BT];
    batch(0, tok, tgt);
    cpu_model_zero_grad(&m);
    LossGrad r;
    r.loss = cpu_model_forward(&m, tok, tgt);
    cpu_model_backward(&m, 1.0f);
    r.grads = malloc(sizeof(float) * m.table.total);
    memcpy(r.grads, m.grads, sizeof(float) * m.table.total);
    cpu_model_free(&m);
    return r;
}

static double rel_err(const float *a, const float *ref, size_t n) {
    double d = 0, r = 0;
    for (size_t i = 0; i < n; i++) {
        d += ((double)a[i] - ref[i]) * ((double)a[i] - ref[i]);
        r += (double)ref[i] * ref[i];
    }
    return sqrt(d / (r > 0 ? r : 1e-300));
}

static void test_close_to_bf16(void) {
    Config c_ref = tiny_config(LINEAR_BF16, GRADFMT_E4M3);
    ErrBuf e;
    CHECK(config_validate(&c_ref, &e) == 0, "fp8 model: the tiny config validates", "%s", e.msg);
    LossGrad ref = loss_and_grad(&c_ref, NULL);
    ParamTable table;
    param_table_build(&table, &c_ref.model);
    struct { LinearPrecision lin; GradFormat gf; int fp8_head; WgradBlocks wb; } runs[] = {
        {LINEAR_FP8_TENSOR, GRADFMT_E4M3, 0, WGRAD_BLOCKS_NONE}, {LINEAR_FP8_TENSOR, GRADFMT_E5M2, 0, WGRAD_BLOCKS_NONE},
        {LINEAR_FP8_BLOCK, GRADFMT_E4M3, 0, WGRAD_BLOCKS_NONE},  {LINEAR_FP8_TENSOR, GRADFMT_E4M3, 1, WGRAD_BLOCKS_NONE},
        {LINEAR_FP8_BLOCK, GRADFMT_E4M3, 1, WGRAD_BLOCKS_NONE},
        {LINEAR_FP8_BLOCK, GRADFMT_E4M3, 1, WGRAD_BLOCKS_ACTIVATION},
        {LINEAR_FP8_BLOCK, GRADFMT_E4M3, 1, WGRAD_BLOCKS_GRADIENT},
    };
    LossGrad block_head = {0, NULL};  // fp8_block with an FP8 head, wgrad operands 1x128
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        Config c = tiny_config(runs[k].lin, runs[k].gf);
        c.precision.linear_keep_lm_head_bf16 = !runs[k].fp8_head;
        c.precision.linear_wgrad_blocks = runs[k].wb;
        LossGrad r = loss_and_grad(&c, NULL);
        char label[96], name[320];
        snprintf(label, sizeof label, "%s grad %s head %s wgrad blocks %s", linear_precision_name(runs[k].lin),
                 grad_format_name(runs[k].gf), runs[k].fp8_head ? "fp8" : "bf16",
                 runs[k].wb == WGRAD_BLOCKS_NONE ? "none" : runs[k].wb == WGRAD_BLOCKS_ACTIVATION ? "x^T" : "dy^T");
        if (runs[k].wb != WGRAD_BLOCKS_NONE && block_head.grads) {
            // only the weight gradients of the quantized linears change: same loss, other weights' grads
            size_t differ = 0;
            for (size_t i = 0; i < table.total; i++) differ += r.grads[i] != block_head.grads[i];
            snprintf(name, sizeof name, "fp8 model %s: loss bit for bit the 1x128 wgrad's, weight gradients differ (%zu)",
                     label, differ);
            CHECK(r.loss == block_head.loss && differ > 0, name, "loss %.9g vs %.9g", r.loss, block_head.loss);
        }
        double dl = fabs(r.loss - ref.loss) / ref.loss;
        snprintf(name, sizeof name, "fp8 model %s: loss %.5f vs bf16 %.5f (rel %.1e)", label, r.loss, ref.loss, dl);
        CHECK(dl < 0.02 && r.loss != ref.loss, name, "relative difference %.3g (expected nonzero, < 2%%)", dl);
        double worst = 0;
        const char *worst_name = "";
        printf("# %s: per-tensor gradient relative error:", label);
        for (int i = 0; i < table.n; i++) {
            const ParamDesc *d = &table.p[i];
            double er = rel_err(r.grads + d->offset, ref.grads + d->offset, d->numel);
            printf(" %s %.3f", d->name, er);
            if (er > worst) worst = er, worst_name = d->name;
        }
        printf("\n");
        snprintf(name, sizeof name, "fp8 model %s: every gradient tensor within 10%% (worst %.3f, %s)", label, worst,
                 worst_name);
        CHECK(worst < 0.10 && worst > 0, name, "worst %.3g at %s", worst, worst_name);
        if (runs[k].lin == LINEAR_FP8_BLOCK && runs[k].fp8_head && runs[k].wb == WGRAD_BLOCKS_NONE) block_head = r;
        else free(r.grads);
    }
    free(block_head.grads);
    param_table_free(&table);
    free(ref.grads);
}

// --- the kept blocks stay unquantized ----------------------------------------------------------
// Zeroing a block's output projections silences it: it adds nothing to the residual stream in the
// forward and passes the gradient through unchanged in the backward (all its branch gradients are
// exact zeros whatever the precision). With every other block kept in BF16, the model must then
// equal the BF16 model bit for bit, except for the silenced block's projection gradients.
static void silence(CpuModel *m, int layer) {
    const ParamKind kinds[2] = {P_ATTN_PROJ, P_MLP_PROJ};
    for (int k = 0; k < 2; k++) {
        const ParamDesc *d = param_find(&m->table, kinds[k], layer);
        memset(m->params + d->offset, 0, sizeof(float) * d->numel);
    }
}
static void silence_layer1(CpuModel *m) { silence(m, 1); }
static void silence_layer0(CpuModel *m) { silence(m, 0); }

// Bitwise equality of loss and of every gradient tensor except the projections of `skip_layer`.
static int same_except(const Config *c, LossGrad a, LossGrad b, int skip_layer, char *why, size_t cap) {
    ParamTable table;
    param_table_build(&table, &c->model);
    int same = a.loss == b.loss;
    snprintf(why, cap, "loss %.9g vs %.9g", a.loss, b.loss);
    for (int i = 0; i < table.n; i++) {
        const ParamDesc *d = &table.p[i];
        if (d->layer == skip_layer && (d->kind == P_ATTN_PROJ || d->kind == P_MLP_PROJ)) continue;
        if (memcmp(a.grads + d->offset, b.grads + d->offset, sizeof(float) * d->numel) != 0) {
            if (same) snprintf(why, cap, "gradient of %s differs", d->name);
            same = 0;
        }
    }
    param_table_free(&table);
    return same;
}

static void test_keep(LinearPrecision lin) {
    const char *pn = linear_precision_name(lin);
    char name[160], why[160];
    Config cb = tiny_config(LINEAR_BF16, GRADFMT_E4M3);
    // First block kept, second (FP8) silenced.
    LossGrad ref = loss_and_grad(&cb, silence_layer1);
    Config c = tiny_config(lin, GRADFMT_E4M3);
    c.precision.linear_bf16_first_layers = 1;
    LossGrad r = loss_and_grad(&c, silence_layer1);
    snprintf(name, sizeof name, "keep %s: linear_bf16_first_layers=1 leaves block 0 unquantized (bitwise)", pn);
    CHECK(same_except(&c, r, ref, 1, why, sizeof why), name, "%s", why);
    free(r.grads);
    c.precision.linear_bf16_first_layers = 0;  // control: block 0 quantized now
    r = loss_and_grad(&c, silence_layer1);
    snprintf(name, sizeof name, "keep %s: without it block 0 is quantized (loss %.6f vs %.6f)", pn, r.loss, ref.loss);
    CHECK(r.loss != ref.loss, name, "same loss");
    free(r.grads), free(ref.grads);

    // Last block kept, first (FP8) silenced.
    ref = loss_and_grad(&cb, silence_layer0);
    c.precision.linear_bf16_last_layers = 1;
    r = loss_and_grad(&c, silence_layer0);
    snprintf(name, sizeof name, "keep %s: linear_bf16_last_layers=1 leaves block 1 unquantized (bitwise)", pn);
    CHECK(same_except(&c, r, ref, 0, why, sizeof why), name, "%s", why);
    free(r.grads);
    c.precision.linear_bf16_last_layers = 0;
    r = loss_and_grad(&c, silence_layer0);
    snprintf(name, sizeof name, "keep %s: without it block 1 is quantized (loss %.6f vs %.6f)", pn, r.loss, ref.loss);
    CHECK(r.loss != ref.loss, name, "same loss");
    free(r.grads), free(ref.grads);

    // Every block kept: the LM head decides alone.
    ref = loss_and_grad(&cb, NULL);
    c.precision.linear_bf16_first_layers = 2;
    r = loss_and_grad(&c, NULL);
    snprintf(name, sizeof name, "keep %s: all blocks kept + linear_keep_lm_head_bf16 = the bf16 model (bitwise)", pn);
    CHECK(same_except(&c, r, ref, -2, why, sizeof why), name, "%s", why);
    free(r.grads);
    c.precision.linear_keep_lm_head_bf16 = 0;
    r = loss_and_grad(&c, NULL);
    snprintf(name, sizeof name, "keep %s: linear_keep_lm_head_bf16=false quantizes the head (loss %.6f vs %.6f)", pn,
             r.loss, ref.loss);
    CHECK(r.loss != ref.loss && fabs(r.loss - ref.loss) < 0.02 * ref.loss, name, "loss %.9g vs %.9g", r.loss,
          ref.loss);
    free(r.grads), free(ref.grads);
}

// --- a short training run ------------------------------------------------------------------------
static void train(const Config *c, float *losses) {
    CpuModel m;
    cpu_model_init(&m, c, B, T, 3);
    AdamW opt;
    adamw_init(&opt, m.table.total);
    int32_t tok[BT], tgt[BT];
    for (int s = 0; s < STEPS; s++) {
        batch(1000 + s, tok, tgt);
        cpu_model_zero_grad(&m);
        losses[s] = cpu_model_forward(&m, tok, tgt);
        cpu_model_backward(&m, 1.0f);
        double clip = grad_clip_factor(&c->train, grad_global_norm(m.grads, m.table.total));
        adamw_step(&opt, &m.table, &c->train, m.params, m.grads, lr_at_step(&c->train, s), clip);
    }
    adamw_free(&opt);
    cpu_model_free(&m);
}

static double mean_last(const float *l, int n) {
    double s = 0;
    for (int i = STEPS - n; i < STEPS; i++) s += l[i];
    return s / n;
}

static void test_training(void) {
    float ref[STEPS], run[STEPS];
    Config cb = tiny_config(LINEAR_BF16, GRADFMT_E4M3);
    train(&cb, ref);
    double ref_end = mean_last(ref, 5);
    printf("# train bf16:");
    for (int s = 0; s < STEPS; s += 5) printf(" %.3f", ref[s]);
    printf(" ... last-5 mean %.4f\n", ref_end);
    CHECK(ref_end < ref[0] - 1.0, "train bf16: the loss falls by more than 1 nat in 30 steps", "%.3f -> %.3f",
          ref[0], ref_end);
    struct { LinearPrecision lin; GradFormat gf; } runs[] = {
        {LINEAR_FP8_TENSOR, GRADFMT_E4M3}, {LINEAR_FP8_TENSOR, GRADFMT_E5M2}, {LINEAR_FP8_BLOCK, GRADFMT_E4M3}};
    for (size_t k = 0; k < sizeof runs / sizeof runs[0]; k++) {
        Config c = tiny_config(runs[k].lin, runs[k].gf);
        train(&c, run);
        double end = mean_last(run, 5), worst = 0;
        for (int s = 0; s < STEPS; s++) worst = fmax(worst, fabs(run[s] - ref[s]));
        printf("# train %s %s:", linear_precision_name(runs[k].lin), grad_format_name(runs[k].gf));
        for (int s = 0; s < STEPS; s += 5) printf(" %.3f", run[s]);
        printf(" ... last-5 mean %.4f, max |diff| to bf16 %.4f\n", end, worst);
        char name[160];
        snprintf(name, sizeof name, "train %s %s: tracks bf16 (last-5 mean %.3f vs %.3f, max step diff %.3f)",
                 linear_precision_name(runs[k].lin), grad_format_name(runs[k].gf), end, ref_end, worst);
        CHECK(fabs(end - ref_end) < 0.03 * ref_end && worst < 0.1, name, "last-5 mean %.4f vs %.4f", end,
              ref_end);
    }
}

int main(void) {
    int loaded = load_austen() == 0;
    CHECK(loaded, "fp8 model: data/austen/train_000000.bin readable (tests run from the repository root)",
          "cannot read it");
    if (!loaded) return test_summary("test_model_fp8_linear");
    test_close_to_bf16();
    test_keep(LINEAR_FP8_TENSOR);
    test_keep(LINEAR_FP8_BLOCK);
    test_training();
    free(g_text);
    return test_summary("test_model_fp8_linear");
}
