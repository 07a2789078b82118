// test_backend.cu: the backend facade (backend.h) and the memory plan of `--dry-run`.
// (A .cu file only so that it links with the C++ runtime the GPU backend's objects need; it is
// host code.)
//
// Everywhere:
//   - model.c's memory_plan (what --dry-run prints) equals gpu_model_plan (what the GPU backend
//     allocates) byte for byte in every category, for configs that exercise every branch
//     (recompute, qk_norm, tied, head_dim 128, LM-head chunking, the 125M config's shapes);
//     every category > 0 and the total is their sum.
//   - device choice: cpu stays cpu; auto / gpu with and without a GPU, and with a config the
//     GPU backend cannot run (an FP8 LM head): the note or the error says why.
//   - the CPU backend is the CPU reference unchanged: 3 steps with gradient accumulation 2 give
//     bit-identical losses, norms and parameters to cpu_model_* + adamw_step called directly;
//     state get/set round trips and a restored backend continues bit for bit.
// With a GPU: the GPU backend against the CPU one on the same batches (losses within 2%),
// state round trips (exact), eval leaves the gradients alone, and a restored GPU backend
// continues the original's losses closely (dQ atomics: not bitwise).
#include <math.h>    // fabs, isfinite
#include <stdint.h>  // int32_t
#include <stdio.h>   // printf
#include <stdlib.h>  // malloc, free
#include <string.h>  // memcmp, strstr

#include "core/backend.h"   // the facade under test
#include "core/common.h"    // ErrBuf
#include "core/config.h"    // config_parse
#include "gpu/gpu_info.h"   // is there a GPU
#include "core/model.h"     // memory_plan
#include "cpu/model_cpu.h"  // the reference the CPU path must equal
#include "gpu/model_gpu.h"  // gpu_model_plan
#include "gpu_test.h"       // gpu_test_have_gpu: skip only where there is no GPU
#include "model_test.h"     // make_config
#include "optimizer.h"      // adamw_step, grad_global_norm, grad_clip_factor, lr_at_step
#include "test.h"           // CHECK, test_summary

static const char *BACKEND_JSON =
    "{\"model\": {\"vocab_size\": 512, \"d_model\": 128, \"n_layer\": 2, \"n_head\": 2, \"ffn_hidden\": 352,"
    " \"seq_len\": 32},"
    " \"train\": {\"micro_batch\": 4, \"steps\": 10, \"lr\": 3e-3, \"warmup_steps\": 2, \"weight_decay\": 0.1,"
    " \"grad_clip\": 1.0}, \"precision\": {\"attention\": \"bf16\"}}";


static uint64_t backend_rng_state = 0x5EEDBACCE11ull;
static uint32_t rnd(void) {
    uint64_t z = (backend_rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return (uint32_t)((z ^ (z >> 31)) >> 32);
}
// A learnable chain x' = (5x + 3) mod V most of the time, some targets ignored.
static void chain_batch(int32_t *tokens, int32_t *targets, int B, int T, int V) {
    for (int b = 0; b < B; b++) {
        int32_t x = (int32_t)(rnd() % (uint32_t)V);
        for (int t = 0; t <= T; t++) {
            if (t < T) tokens[b * T + t] = x;
            if (t > 0) targets[b * T + t - 1] = (rnd() % 100 < 3) ? -1 : x;
            x = (rnd() % 100 < 80) ? (5 * x + 3) % V : (int32_t)(rnd() % (uint32_t)V);
        }
    }
}

// --- the plan ------------------------------------------------------------------------------------
static void plan_tests(void) {
    const char *ov_rc[] = {"train.recompute=true"};
    const char *ov_qk[] = {"model.qk_norm=true", "model.tied_embeddings=true"};
    const char *ov_big[] = {"model.d_model=768", "model.n_head=6", "model.ffn_hidden=2048", "model.seq_len=1024",
                            "model.n_layer=3", "model.vocab_size=50257", "model.tied_embeddings=true",
                            "train.micro_batch=16"};
    const char *ov_big_qk_rc[] = {"model.d_model=768", "model.n_head=12", "model.ffn_hidden=2048",
                                  "model.seq_len=1024", "model.n_layer=2", "model.vocab_size=50257",
                                  "model.qk_norm=true", "train.recompute=true", "train.micro_batch=3"};
    struct { const char *label; const char *const *ov; int n; } cases[] = {
        {"tiny", NULL, 0}, {"tiny recompute", ov_rc, 1}, {"tiny qk_norm tied", ov_qk, 2},
        {"d768 hd128 B16 T1024 (LM head in chunks)", ov_big, 8}, {"d768 hd64 qk_norm recompute B3", ov_big_qk_rc, 9}};
    for (auto &k : cases) {
        Config c = make_config(BACKEND_JSON, k.ov, k.n);
        int B = c.train.micro_batch, T = c.model.seq_len;
        MemoryPlan dry, gpu;
        ErrBuf e;
        memory_plan(&c, 1, 0, B, &dry);
        int rc = gpu_model_plan(&c, B, T, &gpu, &e);
        char name[200];
        snprintf(name, sizeof name, "plan %s: --dry-run's plan equals the GPU allocation in every category", k.label);
        CHECK(rc == 0 && !memcmp(&dry, &gpu, sizeof dry), name,
              "rc %d; dry/gpu: weights %zu/%zu master %zu/%zu opt %zu/%zu grads %zu/%zu act %zu/%zu ws %zu/%zu", rc,
              dry.weights, gpu.weights, dry.master, gpu.master, dry.optimizer, gpu.optimizer, dry.grads, gpu.grads,
              dry.activations, gpu.activations, dry.workspace, gpu.workspace);
        snprintf(name, sizeof name, "plan %s: every category > 0, total is their sum", k.label);
        CHECK(dry.weights > 0 && dry.master > 0 && dry.optimizer > 0 && dry.grads > 0 && dry.activations > 0 &&
                  dry.workspace > 0 &&
                  dry.total == dry.weights + dry.master + dry.optimizer + dry.grads + dry.activations + dry.workspace,
              name, "total %zu", dry.total);
    }
    // The fp8 configs' dry run still has a plan (the same buffers with BF16 attention).
    const char *ov_fp8[] = {"precision.attention=\"fp8_dm\""};
    Config c = make_config(BACKEND_JSON, ov_fp8, 1);
    MemoryPlan mp;
    memory_plan(&c, 1, 0, 4, &mp);
    CHECK(mp.total > 0, "plan: an fp8 config still gets a plan for --dry-run", "total %zu", mp.total);
}

// --- device choice -----------------------------------------------------------------------------------
static void device_tests(int have_gpu) {
    Config c = make_config(BACKEND_JSON, NULL, 0);
    // A config the GPU backend refuses: fp32 attention (the CPU backend's reference mode; the
    // GPU has none). And one it takes since it has an FP8 LM head: fp8_tensor's.
    const char *ov_fp32[] = {"precision.attention=\"fp32\""};
    Config fp32 = make_config(BACKEND_JSON, ov_fp32, 1);
    const char *ov_head[] = {"precision.linear=\"fp8_tensor\"", "precision.linear_keep_lm_head_bf16=false"};
    Config head = make_config(BACKEND_JSON, ov_head, 2);
    char note[1536];
    ErrBuf e;
    GpuInfo info;
    int d = backend_choose_device(&c, DEVICE_CPU, 4, 32, "training", &info, note, sizeof note, &e);
    CHECK(d == DEVICE_CPU && note[0] == 0, "device: cpu stays cpu, silently", "got %d note '%s'", d, note);
    if (!have_gpu) {
        d = backend_choose_device(&c, DEVICE_AUTO, 4, 32, "training", &info, note, sizeof note, &e);
        CHECK(d == DEVICE_CPU && strstr(note, "no GPU") && strstr(note, "training on the CPU"),
              "device: auto without a GPU: CPU with a note", "got %d note '%s'", d, note);
        d = backend_choose_device(&c, DEVICE_GPU, 4, 32, "training", &info, note, sizeof note, &e);
        CHECK(d == -1 && strstr(e.msg, "no usable GPU") && strstr(e.msg, "--device cpu"),
              "device: gpu without a GPU is an error that says why", "got %d msg '%s'", d, d < 0 ? e.msg : "");
        return;
    }
    d = backend_choose_device(&c, DEVICE_AUTO, 4, 32, "training", &info, note, sizeof note, &e);
    CHECK(d == DEVICE_GPU && info.count > 0 && note[0] == 0, "device: auto with a GPU takes it", "got %d note '%s'",
          d, note);
    d = backend_choose_device(&fp32, DEVICE_AUTO, 4, 32, "sampling", &info, note, sizeof note, &e);
    CHECK(d == DEVICE_CPU && strstr(note, "fp32 attention") && strstr(note, "sampling on the CPU"),
          "device: auto with fp32 attention falls back to the CPU with a note", "got %d note '%s'", d, note);
    d = backend_choose_device(&fp32, DEVICE_GPU, 4, 32, "training", &info, note, sizeof note, &e);
    CHECK(d == -1 && strstr(e.msg, "GPU backend") && strstr(e.msg, "precision.attention"),
          "device: gpu with fp32 attention is an error naming the field", "got %d msg '%s'", d, d < 0 ? e.msg : "");
    d = backend_choose_device(&head, DEVICE_GPU, 4, 32, "training", &info, note, sizeof note, &e);
    CHECK(d == DEVICE_GPU && note[0] == 0, "device: gpu takes fp8_tensor's FP8 LM head", "got %d note '%s' msg '%s'",
          d, note, d < 0 ? e.msg : "");
}

// --- training through the facade ---------------------------------------------------------------------
typedef struct {
    int steps, accum, B, T, V;
    int32_t *tok, *tgt;  // (steps, accum, B, T)
} Batches;

static Batches make_batches(int steps, int accum, int B, int T, int V) {
    Batches b = {steps, accum, B, T, V, NULL, NULL};
    size_t n = (size_t)steps * accum * B * T;
    b.tok = (int32_t *)malloc(n * sizeof(int32_t));
    b.tgt = (int32_t *)malloc(n * sizeof(int32_t));
    for (int s = 0; s < steps * accum; s++) chain_batch(b.tok + (size_t)s * B * T, b.tgt + (size_t)s * B * T, B, T, V);
    return b;
}

// Steps [first, last) through the facade; losses[step] = mean micro-batch loss.
static void train_backend(Backend *be, const Config *c, const Batches *bt, int first, int last, double *losses,
                          double *norms) {
    size_t bt_n = (size_t)bt->B * bt->T;
    for (int s = first; s < last; s++) {
        backend_zero_grad(be);
        double sum = 0;
        for (int a = 0; a < bt->accum; a++) {
            size_t o = ((size_t)s * bt->accum + a) * bt_n;
            sum += backend_forward_backward(be, bt->tok + o, bt->tgt + o);
        }
        double norm = backend_grad_norm(be);
        backend_step(be, lr_at_step(&c->train, s), grad_clip_factor(&c->train, norm), &c->train);
        losses[s] = sum / bt->accum;
        if (norms) norms[s] = norm;
    }
}

static void cpu_facade_tests(void) {
    Config c = make_config(BACKEND_JSON, NULL, 0);
    const int steps = 3, accum = 2, B = c.train.micro_batch, T = c.model.seq_len;
    Batches bt = make_batches(steps + 2, accum, B, T, c.model.vocab_size);
    // The reference: the CPU model and AdamW called directly, without the backend facade.
    CpuModel ref;
    AdamW adam;
    cpu_model_init(&ref, &c, B, T, 1234);
    adamw_init(&adam, ref.table.total);
    double ref_loss[8], ref_norm[8];
    for (int s = 0; s < steps; s++) {
        cpu_model_zero_grad(&ref);
        double sum = 0;
        for (int a = 0; a < accum; a++) {
            size_t o = ((size_t)s * accum + a) * B * T;
            sum += cpu_model_forward(&ref, bt.tok + o, bt.tgt + o);
            cpu_model_backward(&ref, 1.0f / accum);
        }
        double norm = grad_global_norm(ref.grads, ref.table.total);
        adamw_step(&adam, &ref.table, &c.train, ref.params, ref.grads, lr_at_step(&c.train, s),
                   grad_clip_factor(&c.train, norm));
        ref_loss[s] = sum / accum;
        ref_norm[s] = norm;
    }
    Backend be;
    ErrBuf e;
    CHECK(backend_init(&be, &c, DEVICE_CPU, B, T, 1234, accum, NULL, &e) == 0, "cpu backend: init", "%s", e.msg);
    double loss[8], norm[8];
    train_backend(&be, &c, &bt, 0, steps, loss, norm);
    int same = 1;
    for (int s = 0; s < steps; s++) same &= loss[s] == ref_loss[s] && norm[s] == ref_norm[s];
    CHECK(same, "cpu backend: losses and norms bit-identical to the CPU reference",
          "step 2 loss %.9g vs %.9g norm %.9g vs %.9g", loss[2], ref_loss[2], norm[2], ref_norm[2]);
    size_t P = backend_table(&be)->total;
    float *p = (float *)malloc(P * 4), *m = (float *)malloc(P * 4), *v = (float *)malloc(P * 4);
    long long step = -1;
    backend_get_state(&be, p, m, v, &step);
    CHECK(!memcmp(p, ref.params, P * 4) && !memcmp(m, adam.m, P * 4) && !memcmp(v, adam.v, P * 4) &&
              step == adam.step && step == steps,
          "cpu backend: parameters, moments and step bit-identical to the reference", "step %lld", step);
    int n_delayed = -1;
    CHECK(backend_delayed_state(&be, &n_delayed) == be.cpu.attn_delayed && n_delayed == c.model.n_layer,
          "cpu backend: the delayed-scaling state is the model's, one per layer", "n %d", n_delayed);

    // A second backend restored from the state continues bit for bit.
    Backend be2;
    backend_init(&be2, &c, DEVICE_CPU, B, T, 999 /* a different init, overwritten */, accum, NULL, &e);
    backend_set_state(&be2, p, m, v, step);
    double l1[8], l2[8];
    train_backend(&be, &c, &bt, steps, steps + 2, l1, NULL);
    train_backend(&be2, &c, &bt, steps, steps + 2, l2, NULL);
    float *p2 = (float *)malloc(P * 4);
    backend_get_state(&be, p, NULL, NULL, NULL);
    backend_get_state(&be2, p2, NULL, NULL, NULL);
    CHECK(l1[steps] == l2[steps] && l1[steps + 1] == l2[steps + 1] && !memcmp(p, p2, P * 4),
          "cpu backend: a restored state continues bit for bit", "loss %.9g vs %.9g", l1[steps + 1], l2[steps + 1]);
    // Evaluation changes nothing.
    float e1 = backend_eval_loss(&be, bt.tok, bt.tgt), e2 = backend_eval_loss(&be, bt.tok, bt.tgt);
    backend_get_state(&be, p2, NULL, NULL, NULL);
    CHECK(e1 == e2 && isfinite(e1) && !memcmp(p, p2, P * 4), "cpu backend: eval is repeatable and leaves the parameters",
          "%.9g vs %.9g", e1, e2);
    free(p), free(m), free(v), free(p2);
    backend_free(&be);
    backend_free(&be2);
    adamw_free(&adam);
    cpu_model_free(&ref);
    free(bt.tok), free(bt.tgt);
}

static void gpu_facade_tests(void) {
    Config c = make_config(BACKEND_JSON, NULL, 0);
    const int steps = 4, accum = 2, B = c.train.micro_batch, T = c.model.seq_len;
    Batches bt = make_batches(steps + 2, accum, B, T, c.model.vocab_size);
    Backend cpu, gpu;
    ErrBuf e;
    backend_init(&cpu, &c, DEVICE_CPU, B, T, 77, accum, NULL, &e);
    int rc = backend_init(&gpu, &c, DEVICE_GPU, B, T, 77, accum, NULL, &e);
    CHECK(rc == 0, "gpu backend: init", "%s", e.msg);
    if (rc) return;
    double lc[8], lg[8], nc[8], ng[8];
    train_backend(&cpu, &c, &bt, 0, steps, lc, nc);
    train_backend(&gpu, &c, &bt, 0, steps, lg, ng);
    double worst = 0;
    for (int s = 0; s < steps; s++) worst = nan_max(worst, fabs(lg[s] - lc[s]) / lc[s]);  // NaN fails
    CHECK(worst < 2e-2 && lg[steps - 1] < lg[0], "gpu backend: loss curve follows the CPU's (rel 2e-2)",
          "worst rel %.3g; gpu %.5f..%.5f cpu %.5f..%.5f", worst, lg[0], lg[steps - 1], lc[0], lc[steps - 1]);
    size_t P = backend_table(&gpu)->total;
    float *p = (float *)malloc(P * 4), *m = (float *)malloc(P * 4), *v = (float *)malloc(P * 4);
    float *p2 = (float *)malloc(P * 4), *m2 = (float *)malloc(P * 4), *v2 = (float *)malloc(P * 4);
    long long step = -1, step2 = -1;
    backend_get_state(&gpu, p, m, v, &step);
    Backend g2;
    backend_init(&g2, &c, DEVICE_GPU, B, T, 5, accum, NULL, &e);
    backend_set_state(&g2, p, m, v, step);
    backend_get_state(&g2, p2, m2, v2, &step2);
    CHECK(step == steps && step2 == step && !memcmp(p, p2, P * 4) && !memcmp(m, m2, P * 4) && !memcmp(v, v2, P * 4),
          "gpu backend: state round trip is exact", "step %lld/%lld", step, step2);
    int nd = -1;
    CHECK(backend_delayed_state(&gpu, &nd) == NULL && nd == 0, "gpu backend: no delayed-scaling state in block scaling",
          "n %d", nd);
    float ev1 = backend_eval_loss(&gpu, bt.tok, bt.tgt), ev2 = backend_eval_loss(&gpu, bt.tok, bt.tgt);
    CHECK(ev1 == ev2 && isfinite(ev1), "gpu backend: eval is repeatable", "%.9g vs %.9g", ev1, ev2);
    double a[8], b2[8];
    train_backend(&gpu, &c, &bt, steps, steps + 2, a, NULL);
    train_backend(&g2, &c, &bt, steps, steps + 2, b2, NULL);
    double d = nan_max(fabs(a[steps] - b2[steps]), fabs(a[steps + 1] - b2[steps + 1]));
    CHECK(d < 1e-3 * a[steps], "gpu backend: a restored state continues the run (to dQ-atomics rounding)",
          "losses %.7f %.7f vs %.7f %.7f", a[steps], a[steps + 1], b2[steps], b2[steps + 1]);
    float *logits = (float *)malloc(sizeof(float) * c.model.padded_vocab_size);
    float *logits_c = (float *)malloc(sizeof(float) * c.model.padded_vocab_size);
    backend_get_state(&gpu, p, NULL, NULL, NULL);
    backend_set_state(&cpu, p, NULL, NULL, 0);
    backend_next_logits(&gpu, bt.tok, T, logits);
    backend_next_logits(&cpu, bt.tok, T, logits_c);
    double num = 0, den = 0;
    for (int i = 0; i < c.model.vocab_size; i++) {
        num += (logits[i] - logits_c[i]) * (double)(logits[i] - logits_c[i]);
        den += (double)logits_c[i] * logits_c[i];
    }
    CHECK(sqrt(num / den) < 3e-2, "gpu backend: next-token logits match the CPU's on the same weights",
          "rel L2 %.3g", sqrt(num / den));
    free(logits), free(logits_c);
    free(p), free(m), free(v), free(p2), free(m2), free(v2);
    backend_free(&g2);
    backend_free(&gpu);
    backend_free(&cpu);
    free(bt.tok), free(bt.tgt);
}

int main(void) {
    plan_tests();
    GpuInfo g;
    char why[256];
    gpu_info_query(&g, why, sizeof why);
    device_tests(g.count > 0);
    cpu_facade_tests();
    if (g.count > 0) gpu_facade_tests();
    else gpu_test_have_gpu("test_backend GPU part");  // a skip line, or a FAIL on a broken GPU machine
    return test_summary("test_backend");
}
