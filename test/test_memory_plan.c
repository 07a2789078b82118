// test_memory_plan.c: the per-GPU memory plan of the shipped configs (host code only, runs
// everywhere):
//   - for every configs/*.json and each precision setting below, model.c's memory_plan (what
//     --dry-run prints) equals gpu_model_plan (what model_gpu.cu's carve allocates) byte for byte,
//     on one GPU and sharded by ZeRO-1 over 8;
//   - the fp8 recipe's plan is at most the bf16 recipe's on the configs where FP8 is meant to save
//     memory (FP8_NOT_ABOVE_BF16 below); the others are printed;
//   - on paper_569m's shapes, each decision of model.h's gpu_keeps_* moves the activations by
//     exactly the buffers it keeps or drops (h1, h2, sw with BF16 linears; qkv without kept codes or
//     with diagnostics; o with an attention backward that reads it or with BF16 linears), and the
//     fp8 recipe's FP8 weights are the blocks' Q(W) alone and the LM head's Q(W), Q(W^T).
#include <dirent.h>  // opendir: every shipped config
#include <stdio.h>   // printf
#include <stdlib.h>  // qsort
#include <string.h>  // memcmp, strcmp

#include "core/config.h"     // config_load
#include "core/gpu_sizes.h"  // gpu_align256, gpu_attn_saved_codes_bytes, gpu_fp8_scales_xt
#include "core/model.h"      // memory_plan, gpu_keeps_*
#include "gpu/model_gpu.h"   // gpu_model_plan, gpu_model_plan_sharded
#include "test.h"            // CHECK, test_summary

// The settings, as --set options over the config file. The files set precision.attention and a
// key the file gives wins over the recipe, so the fp8 recipe's attention is given again.
typedef struct {
    const char *label;
    const char *ov[4];
} Setting;
static const Setting SETTINGS[] = {
    {"bf16", {"precision.recipe=\"bf16\""}},
    {"bf16 recompute", {"precision.recipe=\"bf16\"", "train.recompute=true"}},
    {"fp8", {"precision.recipe=\"fp8\"", "precision.attention=\"fp8_dm\""}},
    {"fp8 recompute", {"precision.recipe=\"fp8\"", "precision.attention=\"fp8_dm\"", "train.recompute=true"}},
    {"fp8 no kept codes", {"precision.recipe=\"fp8\"", "precision.attention=\"fp8_dm\"",
                           "precision.attention_keep_codes=false"}},
    {"fp8 diagnostics", {"precision.recipe=\"fp8\"", "precision.attention=\"fp8_dm\"", "diagnostics.interval=100"}},
    {"fp8_block linears, fp8_dm", {"precision.linear=\"fp8_block\"", "precision.attention=\"fp8_dm\""}},
    {"fp8_dm attention, bf16 linears", {"precision.attention=\"fp8_dm\""}},
    {"fp8_tensor linears, bf16 attention", {"precision.linear=\"fp8_tensor\""}},
};
enum { N_SETTINGS = sizeof SETTINGS / sizeof SETTINGS[0] };
static const char *FP8_NOT_ABOVE_BF16[] = {"paper_569m.json", "paper_1p67b.json"};

static int n_of(const Setting *s) {
    int n = 0;
    while (n < 4 && s->ov[n]) n++;
    return n;
}

static int load(const char *path, const Setting *s, const char *extra, Config *c) {
    const char *ov[5];
    int n = n_of(s);
    for (int i = 0; i < n; i++) ov[i] = s->ov[i];
    if (extra) ov[n++] = extra;
    ErrBuf e = {{0}};
    int rc = config_load(path, ov, n, c, &e);
    if (rc) {
        char name[600];
        snprintf(name, sizeof name, "%s %s loads", path, s->label);
        CHECK(0, name, "%s", e.msg);
    }
    return rc;
}

static int cmp_names(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

// --- every shipped config: the dry run's plan is the allocation ---------------------------------
static void shipped_configs(void) {
    DIR *d = opendir("configs");
    CHECK(d != NULL, "configs/ is readable", "run from the repository root");
    if (!d) return;
    char *names[64];
    int n = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) && n < 64) {
        size_t len = strlen(ent->d_name);
        if (len > 5 && strcmp(ent->d_name + len - 5, ".json") == 0) names[n++] = strdup(ent->d_name);
    }
    closedir(d);
    qsort(names, (size_t)n, sizeof names[0], cmp_names);
    CHECK(n >= 4, "configs/ holds the shipped configs", "%d found", n);
    const double GiB = 1024.0 * 1024.0 * 1024.0;
    for (int k = 0; k < n; k++) {
        char path[600], name[800];
        snprintf(path, sizeof path, "configs/%s", names[k]);
        MemoryPlan by[N_SETTINGS];
        int ok[N_SETTINGS];
        for (int si = 0; si < N_SETTINGS; si++) {
            const Setting *s = &SETTINGS[si];
            Config c;
            ok[si] = 0;
            if (load(path, s, NULL, &c)) continue;
            int B = c.train.micro_batch, T = c.model.seq_len;
            MemoryPlan dry, gpu, dry8, gpu8;
            ErrBuf e = {{0}};
            memory_plan(&c, 1, 0, B, &dry);
            int rc = gpu_model_plan(&c, B, T, &gpu, &e);
            snprintf(name, sizeof name, "%s %s: --dry-run's plan equals carve's allocation in every category", path,
                     s->label);
            CHECK(rc == 0 && !memcmp(&dry, &gpu, sizeof dry), name,
                  "rc %d %s; dry/carve: weights %zu/%zu act %zu/%zu ws %zu/%zu total %zu/%zu", rc, rc ? e.msg : "",
                  dry.weights, gpu.weights, dry.activations, gpu.activations, dry.workspace, gpu.workspace,
                  dry.total, gpu.total);
            memory_plan(&c, 8, 1, B, &dry8);
            rc = gpu_model_plan_sharded(&c, B, T, 8, 1, &gpu8, &e);
            snprintf(name, sizeof name, "%s %s: ZeRO-1 over 8: the same", path, s->label);
            CHECK(rc == 0 && !memcmp(&dry8, &gpu8, sizeof dry8) && dry8.total < dry.total, name,
                  "rc %d; total %zu/%zu (one GPU %zu)", rc, dry8.total, gpu8.total, dry.total);
            by[si] = dry;
            ok[si] = 1;
        }
        printf("# %s plans (GiB):", path);
        for (int si = 0; si < N_SETTINGS; si++)
            if (ok[si]) printf(" %s %.3f;", SETTINGS[si].label, by[si].total / GiB);
        printf("\n");
        int asserted = 0;
        for (size_t i = 0; i < sizeof FP8_NOT_ABOVE_BF16 / sizeof FP8_NOT_ABOVE_BF16[0]; i++)
            asserted |= strcmp(names[k], FP8_NOT_ABOVE_BF16[i]) == 0;
        if (asserted && ok[0] && ok[2]) {
            snprintf(name, sizeof name, "%s: the fp8 recipe's plan is at most the bf16 recipe's", path);
            CHECK(by[2].total <= by[0].total, name, "fp8 %.3f GiB, bf16 %.3f GiB", by[2].total / GiB,
                  by[0].total / GiB);
        }
        free(names[k]);
    }
}

// --- each buffer decision, by the bytes it moves (paper_569m's shapes) -----------------------------
static void decisions(void) {
    const char *path = "configs/paper_569m.json";
    Config f;
    if (load(path, &SETTINGS[2], NULL, &f)) return;
    const size_t L = (size_t)f.model.n_layer, BT = (size_t)f.train.micro_batch * f.model.seq_len;
    const size_t C = (size_t)f.model.d_model, F = (size_t)f.model.ffn_hidden;
    const size_t h1 = gpu_align256(2 * BT * C), sw = gpu_align256(2 * BT * F), qkv = gpu_align256(2 * BT * 3 * C);
    const size_t o = h1, inputs = 2 * h1 + sw;
    MemoryPlan fp8, p;
    memory_plan(&f, 1, 0, f.train.micro_batch, &fp8);
    CHECK(!gpu_keeps_qkv(&f) && !gpu_keeps_attn_out(&f, 0) && !gpu_keeps_linear_inputs(&f, 0),
          "decisions: the fp8 recipe keeps none of h1, h2, sw, qkv, o", "qkv %d o %d inputs %d", gpu_keeps_qkv(&f),
          gpu_keeps_attn_out(&f, 0), gpu_keeps_linear_inputs(&f, 0));
    struct {
        const char *label, *extra;
        long long expect;  // activations against the fp8 recipe's, bytes
    } cases[] = {
        // a probe's BF16 reference reads q, k, v, o
        {"diagnostics on keep qkv and o", "diagnostics.interval=100", (long long)(L * (qkv + o))},
        // the FP8 backward quantizes Q, K, V again from the BF16 qkv; fp8_dm still reads no O
        {"no kept codes keep qkv, drop the codes", "precision.attention_keep_codes=false",
         (long long)(L * qkv) - (long long)(L * gpu_attn_saved_codes_bytes(ATTN_FP8_DM, (size_t)f.train.micro_batch,
                                                                          (size_t)f.model.n_head, (size_t)f.model.seq_len,
                                                                          (size_t)f.model.head_dim))},
        // fp8_naive's and fp8_dm_approx's D reads O
        {"fp8_naive keeps o", "precision.attention=\"fp8_naive\"", (long long)(L * o)},
        {"fp8_dm_approx keeps o", "precision.attention=\"fp8_dm_approx\"", (long long)(L * o)},
        // FP8 blocks keep no linear inputs with or without recompute
        {"recompute changes nothing", "train.recompute=true", 0},
        // a BF16 block's wgrads read h1, h2, sw and o; it saves no Q(x^T)
        {"a BF16 first block keeps h1, h2, sw, o", "precision.linear_bf16_first_layers=1",
         (long long)(inputs + o) -
             (long long)(gpu_align256(C * BT) * 3 + gpu_align256(F * BT) +
                         4 * gpu_align256(4 * gpu_fp8_scales_xt(LINEAR_FP8_TENSOR, f.precision.linear_wgrad_blocks, C, BT)))},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        Config c;
        if (load(path, &SETTINGS[2], cases[i].extra, &c)) continue;
        memory_plan(&c, 1, 0, c.train.micro_batch, &p);
        long long got = (long long)p.activations - (long long)fp8.activations;
        char name[300];
        snprintf(name, sizeof name, "decisions (paper_569m, fp8 recipe): %s (activations %+lld bytes)", cases[i].label,
                 cases[i].expect);
        CHECK(got == cases[i].expect, name, "got %+lld", got);
    }
    // BF16 attention with FP8 linears keeps qkv and o, drops h1, h2, sw; FP8 attention with BF16
    // linears keeps h1, h2, sw and o, drops qkv
    // the fp8 recipe's FP8 weights: the blocks' per-tensor Q(W) alone (each dgrad transposes it),
    // the LM head's Q(W) and Q(W^T); both with 2 scale floats
    MemoryPlan bf;
    Config c16;
    if (!load(path, &SETTINGS[0], NULL, &c16)) {
        memory_plan(&c16, 1, 0, c16.train.micro_batch, &bf);
        const size_t Vp = (size_t)f.model.padded_vocab_size, sc = gpu_align256(8);
        const size_t want = L * (gpu_align256(3 * C * C) + gpu_align256(C * C) + gpu_align256(2 * F * C) +
                                 gpu_align256(C * F) + 4 * sc) + 2 * (gpu_align256(Vp * C) + sc);
        CHECK(fp8.weights - bf.weights == want,
              "decisions: the fp8 recipe adds the blocks' Q(W) (1 byte a weight) and the head's Q(W), Q(W^T)",
              "added %zu bytes, expected %zu", fp8.weights - bf.weights, want);
    }
    {  // an FP8 LM head's Q(dlogits^T) (Vp, chunk): slot 1 with fp8_block; per tensor the chunk's
       // logits buffer, so slot 1 stays the blocks'
        const size_t Vp = (size_t)f.model.padded_vocab_size, hc = gpu_head_chunk(BT);
        size_t t_head, t_none, b_head, b_none, sc;
        gpu_fp8_slot_size(1, LINEAR_FP8_TENSOR, BT, C, F, hc, Vp, &t_head, &sc);
        gpu_fp8_slot_size(1, LINEAR_FP8_TENSOR, BT, C, F, 0, Vp, &t_none, &sc);
        gpu_fp8_slot_size(1, LINEAR_FP8_BLOCK, BT, C, F, hc, Vp, &b_head, &sc);
        gpu_fp8_slot_size(1, LINEAR_FP8_BLOCK, BT, C, F, 0, Vp, &b_none, &sc);
        CHECK(t_head == t_none && t_none == 2 * F * BT && b_head == Vp * hc && b_head > b_none,
              "decisions: slot 1 holds an FP8 head's Q(dlogits^T) with fp8_block only",
              "fp8_tensor %zu / %zu, fp8_block %zu / %zu bytes (with / without the head)", t_head, t_none, b_head,
              b_none);
    }
    Config a, b;
    if (!load(path, &SETTINGS[8], NULL, &a) && !load(path, &SETTINGS[7], NULL, &b)) {
        CHECK(gpu_keeps_qkv(&a) && gpu_keeps_attn_out(&a, 0) && !gpu_keeps_linear_inputs(&a, 0),
              "decisions: FP8 linears with BF16 attention keep qkv and o only", "qkv %d o %d inputs %d",
              gpu_keeps_qkv(&a), gpu_keeps_attn_out(&a, 0), gpu_keeps_linear_inputs(&a, 0));
        CHECK(!gpu_keeps_qkv(&b) && gpu_keeps_attn_out(&b, 0) && gpu_keeps_linear_inputs(&b, 0),
              "decisions: FP8 attention with BF16 linears keeps h1, h2, sw and o, not qkv", "qkv %d o %d inputs %d",
              gpu_keeps_qkv(&b), gpu_keeps_attn_out(&b, 0), gpu_keeps_linear_inputs(&b, 0));
    }
    Config q;
    if (!load(path, &SETTINGS[2], "model.qk_norm=true", &q))
        CHECK(gpu_keeps_qkv(&q), "decisions: QK-norm keeps the raw qkv (its backward re-derives q, k)", "%d",
              gpu_keeps_qkv(&q));
    // the attention backwards: which read the BF16 q, k, v (with codes kept or not) and O
    CHECK(attn_backward_reads_qkv(ATTN_BF16, 1) && !attn_backward_reads_qkv(ATTN_FP8_DM, 1) &&
              !attn_backward_reads_qkv(ATTN_FP8_HYBRID, 1) && attn_backward_reads_qkv(ATTN_FP8_DM, 0),
          "decisions: only bf16, or FP8 without kept codes, reads q, k, v in the backward", "%s", "");
    CHECK(attn_backward_reads_o(ATTN_BF16) && attn_backward_reads_o(ATTN_FP8_NAIVE) &&
              attn_backward_reads_o(ATTN_FP8_HYBRID) && attn_backward_reads_o(ATTN_FP8_DM_APPROX) &&
              !attn_backward_reads_o(ATTN_FP8_DM),
          "decisions: every attention backward but fp8_dm's reads O", "%s", "");
}

int main(void) {
    shipped_configs();
    decisions();
    return test_summary("test_memory_plan");
}
