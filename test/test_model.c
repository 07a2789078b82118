// test_model.c: the model definition (parameter table, counts, init, FLOPs, memory plan), the CPU
// matmuls and layers against straightforward double-precision references, and properties of the
// CPU model (initial loss, thread-count independence, next-token logits).
#include <math.h>    // fabs, sqrt, log, exp
#include <omp.h>     // omp_set_num_threads for the thread-independence checks
#include <stdint.h>  // int32_t tokens
#include <stdlib.h>  // malloc, free
#include <string.h>  // memcmp, strstr

#include "core/common.h"     // file_exists, ErrBuf
#include "core/config.h"     // Config, config_defaults, config_load
#include "cpu/layers_cpu.h"  // the CPU layers under test
#include "cpu/matmul_cpu.h"  // the CPU matmuls under test
#include "core/model.h"      // ParamTable, params_init, memory_plan
#include "cpu/model_cpu.h"   // CpuModel
#include "test.h"            // CHECK

// --- helpers --------------------------------------------------------------------------------------

static unsigned long long rng_state = 0x243F6A8885A308D3ull;
static double urand(void) {  // uniform [0, 1)
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng_state >> 11) * 0x1p-53;
}
static float frand(float scale) { return (float)((2.0 * urand() - 1.0) * scale); }
static void fill(float *x, size_t n, float scale) {
    for (size_t i = 0; i < n; i++) x[i] = frand(scale);
}

static Config make_config(int C, int L, int H, int F, int V, int T) {
    Config c;
    config_defaults(&c);
    ModelConfig *m = &c.model;
    m->d_model = C;
    m->n_layer = L;
    m->n_head = H;
    m->head_dim = C / H;
    m->ffn_hidden = F;
    m->vocab_size = V;
    m->padded_vocab_size = (V + 127) / 128 * 128;
    m->seq_len = T;
    c.precision.attention = ATTN_FP32;
    return c;
}

// The parameter count written out: embedding and head (padded), per block 4C^2 + 3FC + 2C
// (+ 2 hd with QK-norm), final norm.
static double formula_count(const ModelConfig *m) {
    double C = m->d_model, F = m->ffn_hidden, Vp = m->padded_vocab_size;
    double per_block = 4 * C * C + 3 * F * C + 2 * C + (m->qk_norm ? 2.0 * m->head_dim : 0);
    return Vp * C * (m->tied_embeddings ? 1 : 2) + m->n_layer * per_block + C;
}

// --- parameter counts -------------------------------------------------------------------------------

static void test_paper_counts(void) {
    struct { const char *name, *file; int C, L, H, F; double expect; } paper[] = {
        {"paper_569m", "configs/paper_569m.json", 1536, 15, 12, 3968, 569e6},
        {"paper_1p67b", "configs/paper_1p67b.json", 2048, 29, 16, 5504, 1.67e9},
        {"paper_5p29b", "configs/paper_5p29b.json", 3072, 44, 24, 8192, 5.29e9},
    };
    for (int i = 0; i < 3; i++) {
        Config c = make_config(paper[i].C, paper[i].L, paper[i].H, paper[i].F, 50257, 1024);
        CHECK(c.model.padded_vocab_size == 50304, "vocab 50257 pads to 50304", "got %d", c.model.padded_vocab_size);
        ParamTable t;
        param_table_build(&t, &c.model);
        char name[96];
        snprintf(name, sizeof name, "%s: total params within 1%% of the paper", paper[i].name);
        double rel = fabs((double)t.total - paper[i].expect) / paper[i].expect;
        CHECK(rel < 0.01, name, "total %zu vs %.3g (%.2f%%)", t.total, paper[i].expect, 100 * rel);
        snprintf(name, sizeof name, "%s: total equals the closed formula", paper[i].name);
        CHECK((double)t.total == formula_count(&c.model), name, "table %zu formula %.0f", t.total, formula_count(&c.model));
        // The config file, where it exists, describes the same model.
        if (file_exists(paper[i].file)) {
            Config fc;
            ErrBuf e = {{0}};
            int rc = config_load(paper[i].file, NULL, 0, &fc, &e);
            snprintf(name, sizeof name, "%s: config file has the paper's shape", paper[i].name);
            CHECK(rc == 0 && fc.model.d_model == paper[i].C && fc.model.n_layer == paper[i].L &&
                      fc.model.n_head == paper[i].H && fc.model.ffn_hidden == paper[i].F &&
                      !fc.model.tied_embeddings && fc.model.padded_vocab_size == 50304,
                  name, "rc %d (%s) d_model %d n_layer %d n_head %d ffn %d", rc, e.msg, fc.model.d_model,
                  fc.model.n_layer, fc.model.n_head, fc.model.ffn_hidden);
        } else {
            printf("# %s not found: config file check skipped\n", paper[i].file);
        }
        param_table_free(&t);
    }
}

// --- table properties -------------------------------------------------------------------------------

static void test_table(void) {
    Config c = make_config(128, 3, 2, 96, 300, 16);
    ParamTable t, tq, tt;
    param_table_build(&t, &c.model);
    c.model.qk_norm = 1;
    param_table_build(&tq, &c.model);
    c.model.qk_norm = 0;
    c.model.tied_embeddings = 1;
    param_table_build(&tt, &c.model);

    size_t off = 0;
    int contiguous = 1, decay_ok = 1, shapes_ok = 1;
    for (int i = 0; i < t.n; i++) {
        const ParamDesc *d = &t.p[i];
        contiguous &= d->offset == off && d->numel == (size_t)d->rows * d->cols;
        off += d->numel;
        decay_ok &= d->weight_decay == (d->ndim == 2) && (d->ndim == 2) == (d->cols > 1);
        decay_ok &= (d->init == INIT_ONES) == (d->ndim == 1);
    }
    CHECK(contiguous && off == t.total, "table: offsets contiguous, total is the sum", "end %zu total %zu", off, t.total);
    CHECK(decay_ok, "table: decay exactly on matrices, ones-init exactly on gains", "a flag is wrong");
    int once = 1;
    ParamKind block_kinds[] = {P_ATTN_NORM, P_QKV, P_ATTN_PROJ, P_MLP_NORM, P_MLP_FC, P_MLP_PROJ};
    for (int l = 0; l < 3; l++)
        for (int k = 0; k < 6; k++) {
            int count = 0;
            for (int i = 0; i < t.n; i++) count += t.p[i].kind == block_kinds[k] && t.p[i].layer == l;
            const ParamDesc *d = param_find(&t, block_kinds[k], l);
            once &= count == 1 && d && d->kind == block_kinds[k] && d->layer == l;
        }
    CHECK(once, "table: every block kind present once per layer", "missing or duplicated");
    CHECK(t.n == 1 + 6 * 3 + 2 && param_find(&t, P_Q_NORM, 0) == NULL, "table: 6 tensors per block + wte, final_norm, lm_head",
          "n %d", t.n);
    const ParamDesc *qkv = param_find(&t, P_QKV, 2), *fc = param_find(&t, P_MLP_FC, 1);
    const ParamDesc *proj = param_find(&t, P_MLP_PROJ, 0), *wte = param_find(&t, P_WTE, 0);
    shapes_ok = qkv && qkv->rows == 384 && qkv->cols == 128 && fc && fc->rows == 192 && fc->cols == 128 &&
                proj && proj->rows == 128 && proj->cols == 96 && proj->init == INIT_NORMAL_RESID &&
                wte && wte->rows == 384 && wte->cols == 128;
    CHECK(shapes_ok, "table: shapes (3C,C), (2F,C), (C,F), (Vp,C)", "a shape is wrong");
    CHECK(qkv && strcmp(qkv->name, "layers.2.attn.qkv.weight") == 0 && strcmp(t.p[0].name, "wte.weight") == 0 &&
              strcmp(t.p[t.n - 1].name, "lm_head.weight") == 0,
          "table: names", "qkv '%s'", qkv ? qkv->name : "?");
    const ParamDesc *qn = param_find(&tq, P_Q_NORM, 1), *kn = param_find(&tq, P_K_NORM, 1);
    CHECK(tq.n == t.n + 2 * 3 && qn && kn && qn->rows == 64 && kn->numel == 64 && qn->weight_decay == 0 &&
              tq.total == t.total + 3 * 2 * 64,
          "table: qk_norm adds two hd-sized gains per layer", "n %d vs %d", tq.n, t.n);
    CHECK(tt.n == t.n - 1 && param_find(&tt, P_LM_HEAD, 0) == NULL && tt.total == t.total - 384 * 128,
          "table: tied embeddings remove lm_head", "n %d", tt.n);
    CHECK((double)tq.total == formula_count(&(ModelConfig){.d_model = 128, .n_layer = 3, .head_dim = 64, .ffn_hidden = 96,
                                                         .padded_vocab_size = 384, .qk_norm = 1}),
          "table: qk_norm count equals the formula", "%zu", tq.total);
    param_table_free(&t);
    param_table_free(&tq);
    param_table_free(&tt);
}

// --- initialisation ---------------------------------------------------------------------------------

static double std_of(const float *x, size_t n) {
    double s = 0, s2 = 0;
    for (size_t i = 0; i < n; i++) s += x[i], s2 += (double)x[i] * x[i];
    return sqrt(s2 / n - (s / n) * (s / n));
}

static void test_init(void) {
    Config c = make_config(256, 4, 4, 512, 1000, 16);
    ParamTable t;
    param_table_build(&t, &c.model);
    float *a = malloc(sizeof(float) * t.total), *b = malloc(sizeof(float) * t.total), *d = malloc(sizeof(float) * t.total);
    params_init(&t, &c.model, 7, a);
    params_init(&t, &c.model, 7, b);
    params_init(&t, &c.model, 8, d);
    CHECK(memcmp(a, b, sizeof(float) * t.total) == 0, "init: same seed gives the same bits", "differs");
    size_t same = 0;
    for (size_t i = 0; i < t.total; i++) same += a[i] == d[i] && a[i] != 1.0f && a[i] != 0.0f;
    CHECK(same < t.total / 1000, "init: another seed gives other values", "%zu equal", same);

    const ParamDesc *fc = param_find(&t, P_MLP_FC, 1), *proj = param_find(&t, P_ATTN_PROJ, 3);
    const ParamDesc *wte = param_find(&t, P_WTE, 0), *g = param_find(&t, P_MLP_NORM, 2);
    double s_fc = std_of(a + fc->offset, fc->numel), s_proj = std_of(a + proj->offset, proj->numel);
    CHECK(fabs(s_fc - 0.02) < 0.02 * 0.02, "init: std of a matrix is init_std", "%.5f", s_fc);
    double want = 0.02 / sqrt(2.0 * 4);
    CHECK(fabs(s_proj - want) < want * 0.03, "init: residual projections have init_std/sqrt(2L)", "%.5f vs %.5f", s_proj, want);
    // Mean and a tail fraction: the generator is a normal, not just the right variance.
    size_t tail = 0;
    double mean = 0;
    for (size_t i = 0; i < fc->numel; i++) {
        tail += fabs(a[fc->offset + i]) > 2 * 0.02;
        mean += a[fc->offset + i];
    }
    double frac = (double)tail / fc->numel;
    CHECK(fabs(frac - 0.0455) < 0.004 && fabs(mean / fc->numel) < 3 * 0.02 / sqrt((double)fc->numel),
          "init: normal shape (P(|x| > 2 sigma) = 4.55%, mean 0)", "tail %.4f mean %.2e", frac, mean / fc->numel);
    int ones = 1;
    for (size_t i = 0; i < g->numel; i++) ones &= a[g->offset + i] == 1.0f;
    CHECK(ones, "init: gains are ones", "not ones");
    int pad_zero = 1, live_nonzero = 1;
    for (long r = 0; r < wte->rows; r++)
        for (long col = 0; col < wte->cols; col++) {
            float v = a[wte->offset + r * wte->cols + col];
            if (r >= 1000) pad_zero &= v == 0.0f;
            else if (col == 0) live_nonzero &= v != 0.0f;
        }
    CHECK(pad_zero && live_nonzero, "init: padded vocabulary rows are zero, real rows are not", "pad %d live %d", pad_zero, live_nonzero);
    // Adding tensors (qk_norm) leaves the other tensors' values unchanged.
    c.model.qk_norm = 1;
    ParamTable tq;
    param_table_build(&tq, &c.model);
    float *q = malloc(sizeof(float) * tq.total);
    params_init(&tq, &c.model, 7, q);
    const ParamDesc *fcq = param_find(&tq, P_MLP_FC, 3), *fc3 = param_find(&t, P_MLP_FC, 3);
    CHECK(memcmp(q + fcq->offset, a + fc3->offset, sizeof(float) * fc3->numel) == 0,
          "init: a tensor's values do not depend on the other tensors in the table", "layers.3.mlp.fc differs");
    free(q);
    param_table_free(&tq);
    free(a);
    free(b);
    free(d);
    param_table_free(&t);
}

// --- FLOPs, memory plan, summary ------------------------------------------------------------------

static void test_flops_memory(void) {
    Config c = make_config(1536, 15, 12, 3968, 50257, 1024);
    double C = 1536, F = 3968, L = 15, T = 1024;
    double want = 6 * (L * (4 * C * C + 3 * F * C) + 50304 * C) + 6 * L * C * T;
    CHECK(fabs(model_flops_per_token(&c.model) - want) < 1, "flops per token = 6 N_matmul + 6 L C T", "%.6g vs %.6g",
          model_flops_per_token(&c.model), want);

    MemoryPlan one, two, b1, b2, b4;
    memory_plan(&c, 1, 1, 4, &one);
    memory_plan(&c, 2, 1, 4, &two);
    ParamTable t;
    param_table_build(&t, &c.model);
    size_t P = t.total;
    param_table_free(&t);
    CHECK(one.weights == 2 * P && one.master == 4 * P && one.optimizer == 8 * P && one.grads == 4 * P,
          "memory: 2 + 4 + 8 + 4 bytes per parameter on one GPU", "w %zu m %zu o %zu g %zu (P %zu)", one.weights,
          one.master, one.optimizer, one.grads, P);
    CHECK(two.master == (one.master + 1) / 2 && two.optimizer == (one.optimizer + 1) / 2 && two.weights == one.weights &&
              two.grads == one.grads && two.activations == one.activations,
          "memory: zero1 on 2 GPUs halves master weights and AdamW state only", "master %zu/%zu opt %zu/%zu",
          two.master, one.master, two.optimizer, one.optimizer);
    MemoryPlan nz;
    memory_plan(&c, 2, 0, 4, &nz);
    CHECK(nz.master == one.master && nz.optimizer == one.optimizer, "memory: without zero1 nothing is sharded", "master %zu", nz.master);
    memory_plan(&c, 1, 0, 1, &b1);
    memory_plan(&c, 1, 0, 2, &b2);
    memory_plan(&c, 1, 0, 4, &b4);
    CHECK(b1.activations < b2.activations && b2.activations < b4.activations && b1.total < b2.total && b2.total < b4.total,
          "memory: monotone in the micro-batch", "%zu %zu %zu", b1.activations, b2.activations, b4.activations);
    CHECK(b4.total == b4.weights + b4.master + b4.optimizer + b4.grads + b4.activations + b4.workspace,
          "memory: total is the sum of the parts", "%zu", b4.total);
    c.train.recompute = 1;
    MemoryPlan rc;
    memory_plan(&c, 1, 0, 4, &rc);
    CHECK(rc.activations < b4.activations, "memory: recompute saves activations", "%zu vs %zu", rc.activations, b4.activations);

    // The summary mentions the table, the totals and the memory plan.
    c.train.micro_batch = 2;
    param_table_build(&t, &c.model);
    FILE *f = tmpfile();
    model_print_summary(f, &c, &t, 2, 1);
    long n = ftell(f);
    rewind(f);
    char *text = calloc((size_t)n + 1, 1);
    size_t got = fread(text, 1, (size_t)n, f);
    fclose(f);
    text[got] = 0;
    CHECK(strstr(text, "layers.14.mlp.proj.weight") && strstr(text, "total parameters") && strstr(text, "570M") &&
              strstr(text, "FLOPs per token") && strstr(text, "AdamW") && strstr(text, "zero1 on"),
          "summary: table, totals (3 significant digits), FLOPs and memory plan", "got:\n%s", text);
    free(text);
    param_table_free(&t);
}

// --- matmuls -------------------------------------------------------------------------------------

// Each form against a double reference, and bitwise: the same bits for 1, 2 and 3 threads and
// the same bits as the plain sequential float sum (the documented order).
static void test_matmul(void) {
    int shapes[][3] = {{1, 1, 1}, {7, 9, 5}, {13, 37, 300}, {64, 100, 513}, {1, 50, 128}, {100, 17, 3}, {97, 130, 260}};
    int ok_ref = 1, ok_seq = 1, ok_threads = 1;
    double worst = 0;
    for (int form = 0; form < 3; form++)
        for (size_t s = 0; s < sizeof shapes / sizeof shapes[0]; s++)
            for (int acc = 0; acc < 2; acc++) {
                int M = shapes[s][0], N = shapes[s][1], K = shapes[s][2];
                float *a = malloc(sizeof(float) * M * K), *b = malloc(sizeof(float) * N * K);
                float *o0 = malloc(sizeof(float) * M * N), *o[3], *seq = malloc(sizeof(float) * M * N);
                fill(a, (size_t)M * K, 1);
                fill(b, (size_t)N * K, 1);
                fill(o0, (size_t)M * N, 1);
                for (int th = 0; th < 3; th++) {
                    o[th] = malloc(sizeof(float) * M * N);
                    memcpy(o[th], o0, sizeof(float) * M * N);
                    omp_set_num_threads(th + 1);
                    if (form == 0) matmul_nt(o[th], a, b, M, N, K, acc);
                    else if (form == 1) matmul_nn(o[th], a, b, M, N, K, acc);
                    else matmul_tn(o[th], a, b, M, N, K, acc);
                }
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        float sf = acc ? o0[i * N + j] : 0.0f;
                        double sd = acc ? o0[i * N + j] : 0.0, mag = fabs(sd);
                        for (int k = 0; k < K; k++) {
                            float av = form == 2 ? a[k * M + i] : a[i * K + k];
                            float bv = form == 0 ? b[j * K + k] : b[k * N + j];
                            sf += av * bv;
                            sd += (double)av * bv;
                            mag += fabs((double)av * bv);
                        }
                        seq[i * N + j] = sf;
                        double err = fabs(o[0][i * N + j] - sd) / (mag + 1e-30);
                        if (err > worst) worst = err;
                        ok_ref &= err < 1e-5;
                    }
                ok_seq &= memcmp(o[0], seq, sizeof(float) * M * N) == 0;
                ok_threads &= memcmp(o[0], o[1], sizeof(float) * M * N) == 0 && memcmp(o[0], o[2], sizeof(float) * M * N) == 0;
                for (int th = 0; th < 3; th++) free(o[th]);
                free(a);
                free(b);
                free(o0);
                free(seq);
            }
    omp_set_num_threads(omp_get_num_procs());
    CHECK(ok_ref, "matmul: nt, nn, tn (+accumulate) match a double reference", "worst relative error %.3g", worst);
    CHECK(ok_seq, "matmul: bitwise the sequential float sum over k", "differs");
    CHECK(ok_threads, "matmul: bitwise the same for 1, 2 and 3 threads", "differs");
}

// --- layers -------------------------------------------------------------------------------------

static void test_layers(void) {
    enum { N = 24, D = 64, F = 40, T = 6, V = 300, VP = 384 };
    float x[N * D], g[D], y[N * D], rstd[N], dy[N * D], dx[N * D], dg[D];
    fill(x, N * D, 2);
    fill(g, D, 1.5f);
    fill(dy, N * D, 1);
    for (int j = 0; j < D; j++) dg[j] = 0.25f;
    // RMSNorm forward and backward against double (the backward by its closed form).
    rmsnorm_forward(y, rstd, x, g, N, D, 1e-5f);
    rmsnorm_backward(dx, dg, dy, x, g, rstd, N, D, 0);
    double ef = 0, eb = 0, eg = 0, dg_ref[D] = {0};
    for (int i = 0; i < N; i++) {
        double ss = 0, dot = 0;
        for (int j = 0; j < D; j++) ss += (double)x[i * D + j] * x[i * D + j];
        double r = 1 / sqrt(ss / D + 1e-5);
        for (int j = 0; j < D; j++) {
            ef = fmax(ef, fabs(y[i * D + j] - x[i * D + j] * r * g[j]));
            dot += (double)dy[i * D + j] * g[j] * x[i * D + j] * r;
            dg_ref[j] += (double)dy[i * D + j] * x[i * D + j] * r;
        }
        for (int j = 0; j < D; j++) {
            double want = r * (dy[i * D + j] * g[j] - x[i * D + j] * r * dot / D);
            eb = fmax(eb, fabs(dx[i * D + j] - want));
        }
    }
    for (int j = 0; j < D; j++) eg = fmax(eg, fabs(dg[j] - 0.25 - dg_ref[j]));
    CHECK(ef < 1e-5 && eb < 1e-5 && eg < 1e-4, "layers: RMSNorm forward, dx, dg match double",
          "fwd %.2e dx %.2e dg %.2e", ef, eb, eg);
    // RMSNorm backward, numerically: a directional derivative of sum(dy * y).
    {
        float xp[N * D], xm[N * D], yp[N * D], ym[N * D], rs[N];
        float dir[N * D];
        fill(dir, N * D, 1);
        double h = 1e-3, pred = 0, lp = 0, lm = 0;
        for (int i = 0; i < N * D; i++) xp[i] = x[i] + (float)h * dir[i], xm[i] = x[i] - (float)h * dir[i], pred += (double)dx[i] * dir[i];
        rmsnorm_forward(yp, rs, xp, g, N, D, 1e-5f);
        rmsnorm_forward(ym, rs, xm, g, N, D, 1e-5f);
        for (int i = 0; i < N * D; i++) lp += (double)dy[i] * yp[i], lm += (double)dy[i] * ym[i];
        double fd = (lp - lm) / (2 * h);
        CHECK(fabs(fd - pred) < 1e-2 * fabs(pred) + 1e-3, "layers: RMSNorm dx agrees with finite differences",
              "fd %.6f analytic %.6f", fd, pred);
    }
    // RoPE: rotate-half pairs (i, i + hd/2), angle t * theta^(-2i/hd); backward is the transpose.
    {
        float cs[T * D], r[N * D], rb[N * D];
        rope_table(cs, T, D, 10000.0);
        memcpy(r, x, sizeof x);
        rope_forward(r, cs, N, T, D);
        double e = 0;
        for (int row = 0; row < N; row++)
            for (int i = 0; i < D / 2; i++) {
                double ang = (row % T) * pow(10000.0, -2.0 * i / D), a = x[row * D + i], b = x[row * D + i + D / 2];
                e = fmax(e, fabs(r[row * D + i] - (a * cos(ang) - b * sin(ang))));
                e = fmax(e, fabs(r[row * D + i + D / 2] - (b * cos(ang) + a * sin(ang))));
            }
        memcpy(rb, dy, sizeof dy);
        rope_backward(rb, cs, N, T, D);
        double lhs = 0, rhs = 0;  // <R x, dy> = <x, R^T dy>
        for (int i = 0; i < N * D; i++) lhs += (double)r[i] * dy[i], rhs += (double)x[i] * rb[i];
        CHECK(e < 1e-5 && fabs(lhs - rhs) < 1e-4 * (1 + fabs(lhs)), "layers: RoPE matches double, backward is its transpose",
              "fwd %.2e <Rx,y> %.6f <x,R^T y> %.6f", e, lhs, rhs);
    }
    // SwiGLU forward and backward against double.
    {
        float fc[N * 2 * F], out[N * F], dout[N * F], dfc[N * 2 * F];
        fill(fc, N * 2 * F, 4);
        fill(dout, N * F, 1);
        swiglu_forward(out, fc, N, F);
        swiglu_backward(dfc, dout, fc, N, F);
        double e = 0, ed = 0;
        for (int i = 0; i < N; i++)
            for (int j = 0; j < F; j++) {
                double gt = fc[i * 2 * F + j], up = fc[i * 2 * F + F + j], s = 1 / (1 + exp(-gt));
                e = fmax(e, fabs(out[i * F + j] - gt * s * up));
                ed = fmax(ed, fabs(dfc[i * 2 * F + F + j] - dout[i * F + j] * gt * s));
                ed = fmax(ed, fabs(dfc[i * 2 * F + j] - dout[i * F + j] * up * (s + gt * s * (1 - s))));
            }
        CHECK(e < 1e-5 && ed < 1e-5, "layers: SwiGLU forward and backward match double", "fwd %.2e bwd %.2e", e, ed);
    }
    // exp_nonpos against exp.
    {
        double e = 0;
        for (int i = 0; i <= 100000; i++) {
            float v = (float)(-87.0 * i / 100000);
            e = fmax(e, fabs(exp_nonpos(v) - exp((double)v)) / exp((double)v));
        }
        CHECK(e < 5e-7, "layers: exp_nonpos relative error on [-87, 0]", "%.3g", e);
    }
    // Cross-entropy: loss and dlogits against double; padded columns and ignored rows give 0.
    {
        enum { R = 5 };
        static float lg[R * VP], lg2[R * VP];
        float loss[R], loss2[R];
        int32_t tg[R] = {3, -1, 299, 0, 150};
        fill(lg, R * VP, 6);
        for (int j = V; j < VP; j++) lg[j] = 50;  // junk in padded columns must not count
        memcpy(lg2, lg, sizeof lg);
        cross_entropy_rows(lg2, loss2, tg, R, V, VP, 0.0f);
        cross_entropy_rows(lg, loss, tg, R, V, VP, 0.25f);
        double el = 0, eg2 = 0;
        int pads_zero = 1;
        for (int i = 0; i < R; i++) {
            const float *row = lg2;  // unchanged logits (grad_scale 0 keeps them)
            row += (long)i * VP;
            if (tg[i] < 0) {
                for (int j = 0; j < VP; j++) pads_zero &= lg[i * VP + j] == 0.0f;
                pads_zero &= loss[i] == 0.0f;
                continue;
            }
            double mx = -1e30, s = 0;
            for (int j = 0; j < V; j++) mx = fmax(mx, row[j]);
            for (int j = 0; j < V; j++) s += exp(row[j] - mx);
            double want = log(s) + mx - row[tg[i]];
            el = fmax(el, fabs(loss[i] - want));
            el = fmax(el, fabs(loss2[i] - want));
            for (int j = 0; j < V; j++) {
                double p = exp(row[j] - mx) / s, d = 0.25 * (p - (j == tg[i]));
                eg2 = fmax(eg2, fabs(lg[i * VP + j] - d));
            }
            for (int j = V; j < VP; j++) pads_zero &= lg[i * VP + j] == 0.0f;
        }
        CHECK(el < 2e-5 && eg2 < 1e-7, "layers: cross-entropy loss and dlogits match double", "loss %.2e grad %.2e", el, eg2);
        CHECK(pads_zero, "layers: cross-entropy ignores padded columns and targets < 0", "nonzero gradient");
    }
}

// --- the CPU model --------------------------------------------------------------------------------

static void test_cpu_model(void) {
    // Initial loss of a random tiny model is ln(vocab).
    Config c = make_config(128, 2, 2, 96, 50257, 16);
    enum { B = 2, T = 16 };
    int32_t tok[B * T], tgt[B * T];
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(urand() * 50257), tgt[i] = (int32_t)(urand() * 50257);
    tgt[5] = -1;
    CpuModel m;
    cpu_model_init(&m, &c, B, T, 1);
    float loss = cpu_model_forward(&m, tok, tgt);
    CHECK(fabs(loss - log(50257.0)) < 0.1, "cpu model: initial loss is ln(50257) within 0.1", "%.4f vs %.4f", loss, log(50257.0));
    float eval_loss = cpu_model_loss(&m, tok, tgt);
    CHECK(eval_loss == loss, "cpu model: cpu_model_loss equals the training forward's loss", "%.8f vs %.8f", eval_loss, loss);
    cpu_model_free(&m);

    // Thread-count independence: loss and every gradient bit for 1 and 2 threads.
    c = make_config(128, 2, 2, 96, 1000, 16);
    c.model.qk_norm = 1;
    c.model.init_std = 0.1;
    for (int i = 0; i < B * T; i++) tok[i] = (int32_t)(urand() * 1000), tgt[i] = (int32_t)(urand() * 1000);
    float *g1 = NULL, l1 = 0;
    int same = 1;
    for (int th = 1; th <= 2; th++) {
        omp_set_num_threads(th);
        cpu_model_init(&m, &c, B, T, 3);
        cpu_model_zero_grad(&m);
        float l = cpu_model_forward(&m, tok, tgt);
        cpu_model_backward(&m, 1.0f);
        if (th == 1) {
            g1 = malloc(sizeof(float) * m.table.total);
            memcpy(g1, m.grads, sizeof(float) * m.table.total);
            l1 = l;
        } else {
            same = l == l1 && memcmp(g1, m.grads, sizeof(float) * m.table.total) == 0;
        }
        cpu_model_free(&m);
    }
    omp_set_num_threads(omp_get_num_procs());
    free(g1);
    CHECK(same, "cpu model: loss and gradients bitwise equal for 1 and 2 threads", "differ");

    // next_logits: the last position's logits, and causal (later tokens do not change them).
    {
        CpuModel m1;
        cpu_model_init(&m1, &c, 1, T, 5);
        int32_t t1[T], y1[T];
        for (int i = 0; i < T; i++) t1[i] = (int32_t)(urand() * 1000), y1[i] = -1;
        int t = 9;
        y1[t - 1] = 17;
        float fwd = cpu_model_forward(&m1, t1, y1);  // only position t-1 counts
        float *lg = malloc(sizeof(float) * c.model.padded_vocab_size);
        cpu_model_next_logits(&m1, t1, t, lg);
        double mx = -1e30, s = 0;
        for (int j = 0; j < 1000; j++) mx = fmax(mx, lg[j]);
        for (int j = 0; j < 1000; j++) s += exp(lg[j] - mx);
        double want = log(s) + mx - lg[17];
        CHECK(fabs(fwd - want) < 1e-4, "cpu model: next_logits agree with the forward at position t-1", "%.6f vs %.6f", fwd, want);
        free(lg);
        cpu_model_free(&m1);
    }
}

int main(void) {
    test_paper_counts();
    test_table();
    test_init();
    test_flops_memory();
    test_matmul();
    test_layers();
    test_cpu_model();
    return test_summary("test_model");
}
