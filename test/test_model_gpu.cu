// test_model_gpu.cu: the GPU backend (model_gpu.h) against the CPU reference (model_cpu.h).
//
// Everywhere (host code only): the GPU allocation plan against model.c's memory_plan, and the
// user errors of gpu_model_plan. Without a GPU: then one "skipped" line, exit 0.
// With a GPU, on the tiny config's shapes (d 128, 2 layers, 2 heads of 64, SwiGLU 352, T 64,
// GPT-2 vocabulary) and structured token streams (a noisy affine chain, so the loss falls):
//   three variants (base; qk_norm + tied head; NoPE + recompute), each: the same init seed on
//   both backends, loss (rel 1e-2) and EVERY parameter tensor's gradient (rel L2 < 3e-2, one
//   check per tensor, printed with the cosine); for the first two, 10 AdamW steps with the
//   same batches on both and the loss curves compared (rel 1e-2 per step); plus eval loss ==
//   train loss, parameter/optimizer round trips, and next-token logits.
//   Gradient accumulation: two micro-batches with loss_scale 1/2 against the CPU.
//   Then bigger smoke tests (d 768, 2 layers, T 1024; the 125M config's shapes with and without
//   recompute): loss finite, a timing line each.
// --dump PREFIX writes PREFIX_base.bin and PREFIX_qk_tied.bin for test/torch_parity.py:
//   "TGPTDMP1", uint32 n_entries, then per entry: uint32 name_len, name bytes, uint32 dtype
//   (0 = f32, 1 = i32, 2 = UTF-8 text), uint32 ndim, int64 dims[ndim], the data (little
//   endian, row-major). Entries: "meta" (text, key=value lines), "tokens" and "targets" i32
//   (steps, B, T), "param.<name>" (initial FP32 weights), "grad.<name>" (GPU gradients of
//   batch 0), "cpu_grad.<name>" (CPU gradients of batch 0), "gpu_losses", "cpu_losses",
//   "gpu_grad_norms" f32 (steps).
#include <cuda_runtime.h>  // the CUDA runtime (via gpu_test.h)
#include <math.h>          // sqrt, isfinite, fabs
#include <stdint.h>        // int32_t, uint32_t
#include <stdio.h>         // printf, FILE
#include <stdlib.h>        // malloc
#include <string.h>        // strcmp, strstr
#include <string>          // dump names
#include <vector>          // host buffers

#include "attention/kernels_bf16.h"  // attn_gpu_block_sizes (the CPU emulates those tiles)
#include "core/common.h"             // ErrBuf, now_seconds
#include "core/config.h"             // Config, config_parse
#include "core/model.h"              // ParamTable, memory_plan
#include "cpu/model_cpu.h"           // the reference backend
#include "gpu/model_gpu.h"           // the backend under test
#include "optimizer.h"               // AdamW, grad_global_norm, grad_clip_factor
#include "gpu_test.h"                // gpu_test_have_gpu: skip only where there is no GPU
#include "model_test.h"              // TINY_JSON, make_config, make_batch, rel_l2
#include "test.h"                    // CHECK, test_summary


// --- the dump ---------------------------------------------------------------------------------------
struct Dump {
    FILE *f = NULL;
    uint32_t n = 0;
    void entry(const std::string &name, uint32_t dtype, std::vector<int64_t> dims, const void *data, size_t elem) {
        uint32_t len = (uint32_t)name.size(), nd = (uint32_t)dims.size();
        size_t count = 1;
        for (int64_t d : dims) count *= (size_t)d;
        fwrite(&len, 4, 1, f);
        fwrite(name.data(), 1, len, f);
        fwrite(&dtype, 4, 1, f);
        fwrite(&nd, 4, 1, f);
        fwrite(dims.data(), 8, nd, f);
        fwrite(data, elem, count, f);
        n++;
    }
    void f32(const std::string &name, std::vector<int64_t> dims, const float *p) { entry(name, 0, dims, p, 4); }
    void i32(const std::string &name, std::vector<int64_t> dims, const int32_t *p) { entry(name, 1, dims, p, 4); }
    void text(const std::string &name, const std::string &s) { entry(name, 2, {(int64_t)s.size()}, s.data(), 1); }
};

static void dump_params(Dump &d, const ParamTable *t, const char *prefix, const float *buf) {
    for (int i = 0; i < t->n; i++) {
        const ParamDesc *p = &t->p[i];
        std::vector<int64_t> dims = p->ndim == 2 ? std::vector<int64_t>{p->rows, p->cols} : std::vector<int64_t>{p->rows};
        d.f32(std::string(prefix) + p->name, dims, buf + p->offset);
    }
}

// Writes the dump of one variant (format in the file comment).
static void write_dump(const char *dump_path, const char *label, const Config &c, const std::vector<int32_t> &tokens,
                       const std::vector<int32_t> &targets, int n_batches, const ParamTable *table,
                       const std::vector<float> &p0, const std::vector<float> &gg, const std::vector<float> &cg,
                       const std::vector<float> &gl, const std::vector<float> &cl, const std::vector<float> &gn,
                       int steps) {
    const ModelConfig *mc = &c.model;
    int B = c.train.micro_batch, T = mc->seq_len;
    char name[160];
    Dump d;
    d.f = fopen(dump_path, "wb");
    if (!d.f) {
        snprintf(name, sizeof name, "%s: dump %s opened", label, dump_path);
        CHECK(0, name, "cannot write %s", dump_path);
        return;
    }
    fwrite("TGPTDMP1", 1, 8, d.f);
    uint32_t placeholder = 0;  // the entry count, written at the end
    fwrite(&placeholder, 4, 1, d.f);
    char meta[2048];
    snprintf(meta, sizeof meta,
             "variant=%s\nvocab_size=%d\npadded_vocab_size=%d\nd_model=%d\nn_layer=%d\nn_head=%d\n"
             "ffn_hidden=%d\nseq_len=%d\nposition=%s\nrope_theta=%.17g\nqk_norm=%d\ntied_embeddings=%d\n"
             "norm_eps=%.17g\nB=%d\nT=%d\nsteps=%d\nlr=%.17g\nbeta1=%.17g\nbeta2=%.17g\neps=%.17g\n"
             "weight_decay=%.17g\ngrad_clip=%.17g\n",
             label, mc->vocab_size, mc->padded_vocab_size, mc->d_model, mc->n_layer, mc->n_head,
             mc->ffn_hidden, mc->seq_len, mc->position == POS_ROPE ? "rope" : "none", mc->rope_theta,
             mc->qk_norm, mc->tied_embeddings, mc->norm_eps, B, T, steps, c.train.lr, c.train.beta1,
             c.train.beta2, c.train.eps, c.train.weight_decay, c.train.grad_clip);
    d.text("meta", meta);
    d.i32("tokens", {n_batches, B, T}, tokens.data());
    d.i32("targets", {n_batches, B, T}, targets.data());
    dump_params(d, table, "param.", p0.data());
    dump_params(d, table, "grad.", gg.data());
    dump_params(d, table, "cpu_grad.", cg.data());
    d.f32("gpu_losses", {steps}, gl.data());
    d.f32("cpu_losses", {steps}, cl.data());
    d.f32("gpu_grad_norms", {steps}, gn.data());
    fseek(d.f, 8, SEEK_SET);
    fwrite(&d.n, 4, 1, d.f);
    int bad = ferror(d.f);
    bad |= fclose(d.f) != 0;
    snprintf(name, sizeof name, "%s: dump written to %s", label, dump_path);
    CHECK(!bad, name, "write error");
}

// --dump-cpu: the same dump from the CPU backend alone ("grad." and "gpu_losses" then hold the
// CPU's values), so that torch_parity.py can be checked on a machine without a GPU.
static void cpu_only_dump(const char *label, const Config &c, int steps, const char *path) {
    const ModelConfig *mc = &c.model;
    int B = c.train.micro_batch, T = mc->seq_len, BT = B * T;
    std::vector<int32_t> tokens((size_t)steps * BT), targets((size_t)steps * BT);
    for (int k = 0; k < steps; k++) make_batch(&tokens[(size_t)k * BT], &targets[(size_t)k * BT], B, T, mc->vocab_size);
    CpuModel cpu;
    cpu_model_init(&cpu, &c, B, T, 1234);
    size_t P = cpu.table.total;
    std::vector<float> p0(cpu.params, cpu.params + P), cg(P), cl(steps), cn(steps);
    AdamW opt;
    adamw_init(&opt, P);
    for (int k = 0; k < steps; k++) {
        cpu_model_zero_grad(&cpu);
        cl[k] = cpu_model_forward(&cpu, &tokens[(size_t)k * BT], &targets[(size_t)k * BT]);
        cpu_model_backward(&cpu, 1.0f);
        if (k == 0) memcpy(cg.data(), cpu.grads, P * sizeof(float));
        double n = grad_global_norm(cpu.grads, P);
        cn[k] = (float)n;
        adamw_step(&opt, &cpu.table, &c.train, cpu.params, cpu.grads, lr_at_step(&c.train, k), grad_clip_factor(&c.train, n));
        printf("#   %-12s cpu step %d loss %.5f grad norm %.4f\n", label, k, cl[k], n);
    }
    write_dump(path, label, c, tokens, targets, steps, &cpu.table, p0, cg, cg, cl, cl, cn, steps);
    adamw_free(&opt);
    cpu_model_free(&cpu);
}

// --- one variant: loss + every gradient, then (steps > 0) an AdamW run on both backends ----------
#define STEPS 10

static void run_variant(const char *label, const Config &c_in, int steps, const char *dump_path) {
    Config c = c_in;  // the CPU emulates the GPU kernel's attention tiles
    attn_gpu_block_sizes(c.model.head_dim, &c.precision.attention_block_q, &c.precision.attention_block_k);
    const ModelConfig *mc = &c.model;
    int B = c.train.micro_batch, T = mc->seq_len, BT = B * T;
    int n_batches = steps > 0 ? steps : 1;
    std::vector<int32_t> tokens((size_t)n_batches * BT), targets((size_t)n_batches * BT);
    for (int k = 0; k < n_batches; k++) make_batch(&tokens[(size_t)k * BT], &targets[(size_t)k * BT], B, T, mc->vocab_size);

    unsigned long long seed = 1234;
    CpuModel cpu;
    cpu_model_init(&cpu, &c, B, T, seed);
    GpuModel gpu;
    ErrBuf e;
    char name[160];
    int rc = gpu_model_init(&gpu, &c, B, T, seed, NULL, &e);
    snprintf(name, sizeof name, "%s: gpu_model_init", label);
    CHECK(rc == 0, name, "%s", e.msg);
    if (rc) { cpu_model_free(&cpu); return; }
    size_t P = gpu.table.total;
    std::vector<float> gp(P), cg(P), gg(P), p0(P);
    gpu_model_get_params(&gpu, gp.data());
    snprintf(name, sizeof name, "%s: initial parameters identical on both backends", label);
    CHECK(memcmp(gp.data(), cpu.params, P * sizeof(float)) == 0, name, "params_init differs");
    p0 = gp;

    // loss and gradients of batch 0
    float lc = cpu_model_forward(&cpu, tokens.data(), targets.data());
    cpu_model_backward(&cpu, 1.0f);
    gpu_model_zero_grad(&gpu);
    float lg = gpu_model_forward(&gpu, tokens.data(), targets.data());
    gpu_model_backward(&gpu, 1.0f);
    gpu_model_get_grads(&gpu, gg.data());
    memcpy(cg.data(), cpu.grads, P * sizeof(float));
    printf("# %s: loss cpu %.6f gpu %.6f (rel %.2e)\n", label, lc, lg, fabs(lg - lc) / fabs(lc));
    snprintf(name, sizeof name, "%s: loss matches the CPU (rel 1e-2)", label);
    CHECK(isfinite(lg) && fabs(lg - lc) <= 1e-2 * fabs(lc), name, "cpu %.6f gpu %.6f", lc, lg);
    double worst = 0;
    for (int i = 0; i < gpu.table.n; i++) {
        const ParamDesc *p = &gpu.table.p[i];
        double cosv, r = rel_l2(gg.data() + p->offset, cg.data() + p->offset, p->numel, &cosv);
        if (!(r <= worst)) worst = r;
        printf("#   %-12s %-32s rel L2 %.3e  cos %.6f\n", label, p->name, r, cosv);
        snprintf(name, sizeof name, "%s: gradient of %s (rel L2 < 3e-2)", label, p->name);
        CHECK(r < 3e-2, name, "rel L2 %.3e, cosine %.6f", r, cosv);
    }
    printf("# %s: worst gradient rel L2 %.3e\n", label, worst);

    // evaluation path: the same loss, no gradient
    float le = gpu_model_loss(&gpu, tokens.data(), targets.data());
    snprintf(name, sizeof name, "%s: gpu_model_loss equals the forward's loss", label);
    CHECK(fabs(le - lg) <= 1e-6 * fabs(lg), name, "forward %.7f loss %.7f", lg, le);
    // next-token logits against the CPU's
    {
        int t = T / 2;
        std::vector<float> a(mc->padded_vocab_size), b(mc->padded_vocab_size);
        gpu_model_next_logits(&gpu, tokens.data(), t, a.data());
        cpu_model_next_logits(&cpu, tokens.data(), t, b.data());
        double r = rel_l2(a.data(), b.data(), (size_t)mc->vocab_size, NULL);
        snprintf(name, sizeof name, "%s: next_logits match the CPU (rel L2 < 2e-2)", label);
        CHECK(r < 2e-2, name, "rel L2 %.3e", r);
    }

    // AdamW run: the same batches on both backends
    std::vector<float> gl(STEPS), cl(STEPS), gn(STEPS);
    if (steps > 0) {
        AdamW opt;
        adamw_init(&opt, P);
        paired_run(label, 12, &cpu, &opt, &gpu, &c, tokens.data(), targets.data(), (size_t)BT, steps, cl.data(),
                   gl.data(), gn.data());
        gpu_model_get_params(&gpu, gp.data());
        double r = rel_l2(gp.data(), cpu.params, P, NULL);
        printf("# %s: parameters after %d steps, GPU vs CPU rel L2 %.3e\n", label, steps, r);
        snprintf(name, sizeof name, "%s: step count", label);
        CHECK(gpu.step == steps && opt.step == steps, name, "gpu %lld cpu %lld", gpu.step, opt.step);
        // round trips: parameters and optimizer state out and back in give the same next step
        {
            std::vector<float> m1(P), v1(P), m2(P), v2(P), pa(P);
            long long st;
            gpu_model_get_opt_state(&gpu, m1.data(), v1.data(), &st);
            gpu_model_zero_grad(&gpu);
            gpu_model_forward(&gpu, tokens.data(), targets.data());
            gpu_model_backward(&gpu, 1.0f);
            gpu_model_step(&gpu, 1e-3, 1.0, &c.train);
            gpu_model_get_params(&gpu, pa.data());
            gpu_model_set_params(&gpu, gp.data());
            gpu_model_set_opt_state(&gpu, m1.data(), v1.data(), st);
            gpu_model_step(&gpu, 1e-3, 1.0, &c.train);  // gradients are still those of that batch
            gpu_model_get_params(&gpu, m2.data());
            snprintf(name, sizeof name, "%s: set_params/set_opt_state round trip repeats a step bit for bit", label);
            CHECK(memcmp(m2.data(), pa.data(), P * sizeof(float)) == 0, name, "parameters differ");
        }
        adamw_free(&opt);
    }

    if (dump_path) write_dump(dump_path, label, c, tokens, targets, n_batches, &gpu.table, p0, gg, cg, gl, cl, gn, steps);
    gpu_model_free(&gpu);
    cpu_model_free(&cpu);
}

// --- gradient accumulation: two micro-batches with loss_scale 1/2 on both backends ------------------
static void accumulation_test(const Config &c_in) {
    Config c = c_in;
    attn_gpu_block_sizes(c.model.head_dim, &c.precision.attention_block_q, &c.precision.attention_block_k);
    int B = c.train.micro_batch, T = c.model.seq_len, BT = B * T;
    std::vector<int32_t> tokens(2 * (size_t)BT), targets(2 * (size_t)BT);
    for (int k = 0; k < 2; k++) make_batch(&tokens[(size_t)k * BT], &targets[(size_t)k * BT], B, T, c.model.vocab_size);
    CpuModel cpu;
    cpu_model_init(&cpu, &c, B, T, 99);
    GpuModel gpu;
    ErrBuf e;
    if (gpu_model_init(&gpu, &c, B, T, 99, NULL, &e)) {
        CHECK(0, "accumulation: gpu_model_init", "%s", e.msg);
        cpu_model_free(&cpu);
        return;
    }
    size_t P = gpu.table.total;
    gpu_model_zero_grad(&gpu);
    gpu_model_set_loss_scale(&gpu, 0.5f);
    cpu_model_zero_grad(&cpu);
    for (int k = 0; k < 2; k++) {
        gpu_model_forward(&gpu, &tokens[(size_t)k * BT], &targets[(size_t)k * BT]);
        gpu_model_backward(&gpu, 0.5f);
        cpu_model_forward(&cpu, &tokens[(size_t)k * BT], &targets[(size_t)k * BT]);
        cpu_model_backward(&cpu, 0.5f);
    }
    std::vector<float> gg(P);
    gpu_model_get_grads(&gpu, gg.data());
    double worst = 0;
    const char *worst_name = "";
    for (int i = 0; i < gpu.table.n; i++) {
        const ParamDesc *p = &gpu.table.p[i];
        double r = rel_l2(gg.data() + p->offset, cpu.grads + p->offset, p->numel, NULL);
        if (!(r <= worst)) { worst = r; worst_name = p->name; }
    }
    printf("# accumulation (2 micro-batches, loss_scale 1/2): worst gradient rel L2 %.3e (%s)\n", worst, worst_name);
    CHECK(worst < 3e-2, "accumulation: 2 micro-batches x loss_scale 1/2 match the CPU (every tensor rel L2 < 3e-2)",
          "worst %.3e at %s", worst, worst_name);
    double ng = gpu_model_grad_norm(&gpu), nc = grad_global_norm(cpu.grads, P);
    CHECK(fabs(ng - nc) < 2e-2 * nc, "accumulation: gradient norm matches the CPU", "gpu %.6f cpu %.6f", ng, nc);
    gpu_model_free(&gpu);
    cpu_model_free(&cpu);
}

// --- bigger shapes: NaN-free and timed ----------------------------------------------------------------
static void smoke_test(const char *label, const char *json, const char *const *ov, int n_ov, int print_plan) {
    Config c = make_config(json, ov, n_ov);
    int B = c.train.micro_batch, T = c.model.seq_len, BT = B * T;
    std::vector<int32_t> tokens(BT), targets(BT);
    make_batch(tokens.data(), targets.data(), B, T, c.model.vocab_size);
    GpuModel m;
    ErrBuf e;
    char name[160];
    int rc = gpu_model_init(&m, &c, B, T, 42, print_plan ? stdout : NULL, &e);
    snprintf(name, sizeof name, "smoke %s: gpu_model_init", label);
    CHECK(rc == 0, name, "%s", e.msg);
    if (rc) return;
    if (print_plan) gpu_model_plan_compare(stdout, &c, B, T);
    int ok = 1;
    float first = 0, last = 0;
    double dt = timed_steps(&m, &c, tokens.data(), targets.data(), 8, 3, &first, &last, &ok);
    double flops = model_flops_per_token(&c.model) * BT;
    printf("# timing: smoke %s B%d: %.2f ms/step, %.0f tokens/s, %.1f TFLOP/s (model FLOPs), %.2f GiB planned, loss %.4f -> %.4f (same batch)\n",
           label, B, dt * 1e3, BT / dt, flops / dt / 1e12, m.plan.total / 1073741824.0, first, last);
    snprintf(name, sizeof name, "smoke %s: loss and gradient norm finite", label);
    CHECK(ok, name, "loss %.4f -> %.4f", first, last);
    snprintf(name, sizeof name, "smoke %s: initial loss near ln(V)", label);
    CHECK(first > 9.5 && first < 12.0, name, "loss %.4f", first);
    // The phase profile over 3 more steps: it prints, and its phases add up to about the step
    // time (they tile the stream's timeline; the host gaps between steps are one of them).
    gpu_model_profile(&m, 1);
    double dp = timed_steps(&m, &c, tokens.data(), targets.data(), 3, 0, &first, &last, &ok);
    FILE *f = tmpfile();
    gpu_model_profile_report(&m, f, 3);
    gpu_model_profile(&m, 0);
    char buf[4096] = "";
    rewind(f);
    size_t nr = fread(buf, 1, sizeof buf - 1, f);
    buf[nr] = '\0';
    fclose(f);
    double per_step = 0;
    const char *at = strstr(buf, "ms per step)");
    if (at) {
        const char *p0 = at;
        while (p0 > buf && p0[-1] != ',') p0--;
        per_step = atof(p0 + 1);
    }
    printf("# %s", buf);
    snprintf(name, sizeof name, "smoke %s: the phase profile covers the step (%.2f ms profiled, %.2f ms timed)", label,
             per_step, dp * 1e3);
    CHECK(strstr(buf, "fwd attention") && strstr(buf, "bwd linears") && per_step > 0.5 * dp * 1e3 &&
              per_step < 1.1 * dp * 1e3,
          name, "%s", buf);
    gpu_model_free(&m);
}

// --- host-only: the allocation plan ------------------------------------------------------------------
static void plan_tests(void) {
    ErrBuf e;
    const char *ov_qk[] = {"model.qk_norm=true", "model.tied_embeddings=true"};
    const char *ov_rc[] = {"train.recompute=true"};
    struct { const char *label; const char *const *ov; int n; } cases[] = {
        {"tiny", NULL, 0}, {"tiny qk_norm tied", ov_qk, 2}, {"tiny recompute", ov_rc, 1}};
    for (auto &k : cases) {
        Config c = make_config(TINY_JSON, k.ov, k.n);
        int B = c.train.micro_batch, T = c.model.seq_len;
        MemoryPlan mine, ref;
        int rc = gpu_model_plan(&c, B, T, &mine, &e);
        char name[160];
        snprintf(name, sizeof name, "plan %s: gpu_model_plan accepts the config", k.label);
        CHECK(rc == 0, name, "%s", e.msg);
        memory_plan(&c, 1, 0, B, &ref);
        printf("# plan %s:\n", k.label);
        gpu_model_plan_compare(stdout, &c, B, T);
        // Parameters, masters, moments, gradients: the same bytes up to the 256-byte alignment.
        snprintf(name, sizeof name, "plan %s: weights, masters, AdamW state, gradients as memory_plan", k.label);
        CHECK(mine.weights - ref.weights < 256 && mine.master - ref.master < 256 &&
                  mine.optimizer - ref.optimizer < 512 && mine.grads - ref.grads < 256,
              name, "weights %zu/%zu master %zu/%zu opt %zu/%zu grads %zu/%zu", mine.weights, ref.weights,
              mine.master, ref.master, mine.optimizer, ref.optimizer, mine.grads, ref.grads);
        // Activations: memory_plan's formula plus the batch (12 bytes a token) and alignment.
        double ra = (double)mine.activations / (double)ref.activations;
        snprintf(name, sizeof name, "plan %s: activations within 2%% of memory_plan", k.label);
        CHECK(ra > 0.98 && ra < 1.02, name, "allocated %zu, memory_plan %zu", mine.activations, ref.activations);
        snprintf(name, sizeof name, "plan %s: total sums the categories", k.label);
        CHECK(mine.total == mine.weights + mine.master + mine.optimizer + mine.grads + mine.activations + mine.workspace,
              name, "total %zu", mine.total);
    }
    const char *ov_fp8[] = {"precision.attention=\"fp8_dm\"", "precision.attention_scaling=\"delayed\""};
    Config c = make_config(TINY_JSON, ov_fp8, 2);
    MemoryPlan mp, dry;
    int rc = gpu_model_plan(&c, c.train.micro_batch, c.model.seq_len, &mp, &e);
    memory_plan(&c, 1, 0, c.train.micro_batch, &dry);
    CHECK(rc == 0 && !memcmp(&mp, &dry, sizeof mp),
          "plan: FP8 attention with delayed scaling runs on the GPU, planned as --dry-run plans it", "rc %d %s", rc,
          rc ? e.msg : "");
    c = make_config(TINY_JSON, NULL, 0);  // config_validate rejects this too; the backend checks on its own
    c.model.n_head = 4;
    c.model.head_dim = 32;
    rc = gpu_model_plan(&c, 8, 64, &mp, &e);
    CHECK(rc == -1 && strstr(e.msg, "head_dim 32"), "plan: head_dim 32 is a user error on the GPU backend",
          "rc %d msg %s", rc, rc ? e.msg : "");
    c = make_config(TINY_JSON, NULL, 0);
    rc = gpu_model_plan(&c, 8, 65, &mp, &e);
    CHECK(rc == -1 && strstr(e.msg, "seq_len"), "plan: T > seq_len is a user error", "rc %d msg %s", rc,
          rc ? e.msg : "");
    // Recompute must save 2 * (2C + F) bytes per token and layer.
    const char *ov_rc2[] = {"train.recompute=true"};
    Config a = make_config(TINY_JSON, NULL, 0), b = make_config(TINY_JSON, ov_rc2, 1);
    MemoryPlan pa, pb;
    gpu_model_plan(&a, 8, 64, &pa, &e);
    gpu_model_plan(&b, 8, 64, &pb, &e);
    size_t expect = (size_t)8 * 64 * 2 * (2 * 128 + 352) * 2;
    CHECK(pa.activations - pb.activations == expect, "plan: recompute saves the norm and SwiGLU outputs",
          "saved %zu, expected %zu", pa.activations - pb.activations, expect);
}

int main(int argc, char **argv) {
    const char *dump = NULL, *dump_cpu = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--dump") && i + 1 < argc) dump = argv[++i];
        else if (!strcmp(argv[i], "--dump-cpu") && i + 1 < argc) dump_cpu = argv[++i];
        else { fprintf(stderr, "usage: %s [--dump PREFIX] [--dump-cpu PREFIX]\n", argv[0]); return 2; }
    }
    const char *ov_qk[] = {"model.qk_norm=true", "model.tied_embeddings=true"};
    if (dump_cpu) {  // CPU only: write the two dumps and stop
        cpu_only_dump("base", make_config(TINY_JSON, NULL, 0), STEPS, (std::string(dump_cpu) + "_base.bin").c_str());
        cpu_only_dump("qk_tied", make_config(TINY_JSON, ov_qk, 2), STEPS, (std::string(dump_cpu) + "_qk_tied.bin").c_str());
        return test_summary("test_model_gpu");
    }
    plan_tests();
    if (!gpu_test_have_gpu("test_model_gpu")) return test_summary("test_model_gpu");
    std::string d1 = dump ? std::string(dump) + "_base.bin" : "", d2 = dump ? std::string(dump) + "_qk_tied.bin" : "";
    double t0 = now_seconds();
    run_variant("base", make_config(TINY_JSON, NULL, 0), STEPS, dump ? d1.c_str() : NULL);
    run_variant("qk_tied", make_config(TINY_JSON, ov_qk, 2), STEPS, dump ? d2.c_str() : NULL);
    const char *ov_nope[] = {"model.position=\"none\"", "train.recompute=true"};
    run_variant("nope_recomp", make_config(TINY_JSON, ov_nope, 2), 0, NULL);
    printf("# tiny variants took %.1f s\n", now_seconds() - t0);
    accumulation_test(make_config(TINY_JSON, NULL, 0));
    const char *d768 =
        "{\"model\": {\"d_model\": 768, \"n_layer\": 2, \"n_head\": 12, \"ffn_hidden\": 2048, \"seq_len\": 1024},"
        " \"train\": {\"micro_batch\": 8, \"lr\": 6e-4, \"grad_clip\": 1.0}, \"precision\": {\"attention\": \"bf16\"}}";
    smoke_test("d768 L2 T1024", d768, NULL, 0, 1);
    // the 125M config's shapes (configs/small_125m.json: 12 layers, 6 heads of 128, tied)
    const char *s125 =
        "{\"model\": {\"d_model\": 768, \"n_layer\": 12, \"n_head\": 6, \"ffn_hidden\": 2048, \"seq_len\": 1024,"
        " \"tied_embeddings\": true}, \"train\": {\"micro_batch\": 16, \"grad_clip\": 1.0},"
        " \"precision\": {\"attention\": \"bf16\"}}";
    const char *ov_rc[] = {"train.recompute=true"};
    smoke_test("125M L12 T1024", s125, NULL, 0, 0);
    smoke_test("125M L12 T1024 recompute", s125, ov_rc, 1, 0);
    return test_summary("test_model_gpu");
}
