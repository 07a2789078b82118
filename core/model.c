// model.c: the GPT definition shared by both backends: the parameter table, seeded
// initialisation, FLOP count, the per-GPU memory plan (exactly the GPU backend's allocation) and
// the `--dry-run` summary.
#include "core/model.h"
#include "core/gpu_sizes.h"  // scratch sizes of the GPU kernels, for the memory plan

#include <math.h>    // sqrt for the residual init scale
#include <stdint.h>  // uint64_t for the generator
#include <string.h>  // memset, snprintf

#include "core/common.h"     // xcalloc, FATAL
#include "core/precision.h"  // linear_precision_of: which blocks run FP8 linears
#include "core/rng.h"        // splitmix64_next for the seeded init

// --- parameter table -----------------------------------------------------------------------------

static void add_param(ParamTable *t, int *cap, ParamKind kind, int layer, const char *name,
                      long rows, long cols, InitKind init) {
    if (t->n == *cap) {
        *cap = *cap ? 2 * *cap : 64;
        t->p = xrealloc(t->p, sizeof(ParamDesc) * (size_t)*cap);
    }
    ParamDesc *d = &t->p[t->n];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", name);
    d->kind = kind;
    d->layer = layer;
    d->ndim = cols > 1 ? 2 : 1;
    d->rows = rows;
    d->cols = cols;
    d->numel = (size_t)rows * (size_t)cols;
    d->offset = t->total;
    d->init = init;
    d->weight_decay = d->ndim == 2;
    t->index[kind][layer < 0 ? 0 : layer] = t->n;
    t->total += d->numel;
    t->n++;
}

void param_table_build(ParamTable *t, const ModelConfig *m) {
    if (m->n_layer < 1 || m->n_layer > 1024)
        FATAL("param_table_build: n_layer %d outside [1, 1024] (the config should have been validated)", m->n_layer);
    memset(t, 0, sizeof *t);
    memset(t->index, 0xff, sizeof t->index);  // -1 everywhere
    int cap = 0;
    long C = m->d_model, F = m->ffn_hidden, Vp = m->padded_vocab_size, hd = m->head_dim;
    char name[64];
    add_param(t, &cap, P_WTE, -1, "wte.weight", Vp, C, INIT_NORMAL);
    for (int l = 0; l < m->n_layer; l++) {
#define ADD(kind, suffix, rows, cols, init)                            \
    snprintf(name, sizeof name, "layers.%d.%s", l, suffix);            \
    add_param(t, &cap, kind, l, name, rows, cols, init);
        ADD(P_ATTN_NORM, "attn_norm.weight", C, 1, INIT_ONES)
        ADD(P_QKV, "attn.qkv.weight", 3 * C, C, INIT_NORMAL)
        if (m->qk_norm) {
            ADD(P_Q_NORM, "attn.q_norm.weight", hd, 1, INIT_ONES)
            ADD(P_K_NORM, "attn.k_norm.weight", hd, 1, INIT_ONES)
        }
        ADD(P_ATTN_PROJ, "attn.proj.weight", C, C, INIT_NORMAL_RESID)
        ADD(P_MLP_NORM, "mlp_norm.weight", C, 1, INIT_ONES)
        ADD(P_MLP_FC, "mlp.fc.weight", 2 * F, C, INIT_NORMAL)
        ADD(P_MLP_PROJ, "mlp.proj.weight", C, F, INIT_NORMAL_RESID)
#undef ADD
    }
    add_param(t, &cap, P_FINAL_NORM, -1, "final_norm.weight", C, 1, INIT_ONES);
    if (!m->tied_embeddings) add_param(t, &cap, P_LM_HEAD, -1, "lm_head.weight", Vp, C, INIT_NORMAL);
}

void param_table_free(ParamTable *t) {
    free(t->p);
    t->p = NULL;
    t->n = 0;
    t->total = 0;
}

const ParamDesc *param_find(const ParamTable *t, ParamKind kind, int layer) {
    if (kind < 0 || kind >= P_N_KINDS) return NULL;
    int block = kind != P_WTE && kind != P_FINAL_NORM && kind != P_LM_HEAD;
    if (block && (layer < 0 || layer >= 1024)) return NULL;
    int i = t->index[kind][block ? layer : 0];
    return i < 0 ? NULL : &t->p[i];
}

// --- initialisation --------------------------------------------------------------------------------
// A portable generator: splitmix64 (Steele, Lea, Flood 2014) gives the uniform bits; normals come
// from Marsaglia's polar method with a logarithm written here from + - * / and sqrt only (all
// correctly rounded in IEEE double), so the values do not depend on the C library or the CPU.

// Uniform in (-1, 1) with 53 random bits.
static double uniform_pm1(uint64_t *s) { return (double)(splitmix64_next(s) >> 11) * 0x1p-52 - 1.0; }

// Natural log of x > 0: x = m * 2^e with m in [sqrt(1/2), sqrt(2)), ln m = 2 atanh(u),
// u = (m - 1) / (m + 1), |u| < 0.172, by its series (terms fall by u^2 < 0.03 each).
static double portable_log(double x) {
    int e = 0;
    while (x >= 1.4142135623730951) { x *= 0.5; e++; }
    while (x < 0.70710678118654752) { x *= 2.0; e--; }
    double u = (x - 1.0) / (x + 1.0), u2 = u * u, term = u, sum = 0.0;
    for (int k = 1; k < 40; k += 2) {
        sum += term / k;
        term *= u2;
    }
    return 2.0 * sum + e * 0.69314718055994531;
}

typedef struct {
    uint64_t state;
    int have_spare;
    double spare;
} NormalGen;

static double normal_next(NormalGen *g) {
    if (g->have_spare) {
        g->have_spare = 0;
        return g->spare;
    }
    double u, v, s;
    do {
        u = uniform_pm1(&g->state);
        v = uniform_pm1(&g->state);
        s = u * u + v * v;
    } while (s >= 1.0 || s == 0.0);
    double f = sqrt(-2.0 * portable_log(s) / s);
    g->spare = v * f;
    g->have_spare = 1;
    return u * f;
}

void params_init(const ParamTable *t, const ModelConfig *m, unsigned long long seed, float *params) {
    double resid_std = m->init_std / sqrt(2.0 * m->n_layer);
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < t->n; i++) {
        const ParamDesc *d = &t->p[i];
        float *w = params + d->offset;
        // Each tensor has its own stream, seeded by (seed, tensor name): adding or removing a
        // tensor (qk_norm, tied head) leaves every other tensor's values unchanged.
        uint64_t mix = (uint64_t)seed, name_hash = 0xCBF29CE484222325ull;  // FNV-1a of the name
        for (const char *c = d->name; *c; c++) name_hash = (name_hash ^ (unsigned char)*c) * 0x100000001B3ull;
        NormalGen g = {0};
        g.state = splitmix64_next(&mix) ^ name_hash;
        if (d->init == INIT_ONES) {
            for (size_t j = 0; j < d->numel; j++) w[j] = 1.0f;
            continue;
        }
        double std = d->init == INIT_NORMAL_RESID ? resid_std : m->init_std;
        // Rows of the padded vocabulary are never looked up nor trained: zero.
        long live_rows = (d->kind == P_WTE || d->kind == P_LM_HEAD) ? m->vocab_size : d->rows;
        size_t live = (size_t)live_rows * (size_t)d->cols;
        for (size_t j = 0; j < live; j++) w[j] = (float)(std * normal_next(&g));
        for (size_t j = live; j < d->numel; j++) w[j] = 0.0f;
    }
}

// --- FLOPs -----------------------------------------------------------------------------------------
// Training FLOPs per token = 6 * N_matmul + attention, where N_matmul counts every weight used
// in a matmul (QKV, attention projection, MLP fc and proj, and the LM head over the padded
// vocabulary, tied or not; the embedding lookup is not a matmul), and attention is the PaLM
// count 12 * L * C * T for full attention (forward S = QK^T and PV: 2 * 2 * T * C per token;
// backward twice that) halved for the causal mask: 6 * L * C * T.
static double matmul_params(const ModelConfig *m) {
    double C = m->d_model, F = m->ffn_hidden;
    return m->n_layer * (3 * C * C + C * C + 2 * F * C + F * C) + (double)m->padded_vocab_size * C;
}

double model_flops_per_token(const ModelConfig *m) {
    return 6.0 * matmul_params(m) + 6.0 * m->n_layer * (double)m->d_model * m->seq_len;
}

// --- what the GPU model keeps for the backward ------------------------------------------------------
// A block's forward on the GPU (model_gpu.cu) makes h1 = RMSNorm(x_in), qkv = h1 Wqkv^T, o =
// attention(q, k, v), x_mid = x_in + o Wo^T, h2 = RMSNorm(x_mid), fc = h2 Wfc^T, sw = SwiGLU(fc).
// Its backward reads x_in and x_mid (the RMSNorm backwards, with rstd1, rstd2), fc (the SwiGLU
// backward) and lse (every attention backward) in every configuration. The other three kinds are
// read by the backward only in some:
//   h1, h2, sw: only as x of the weight-gradient GEMM (dW += dy^T x) of the qkv, MLP-in and
//     MLP-out linears. With BF16 linears the GEMM reads x: kept, or recomputed from x_in, x_mid,
//     fc (train.recompute). An FP8 linear's weight gradient multiplies the Q(x^T) that its
//     forward saved (model_gpu_linear.cu's lin_wgrad does not read x), so in a block with FP8
//     linears their last reader is the forward's own GEMM, or its quantization (the fused
//     producers of fp8_block and of delayed fp8_tensor write the codes and no BF16 x at all).
//   qkv: read by the attention backward as q, k, v, and with QK-norm by the backward's
//     re-derivation of the normalised q, k and by the QK-norm backward. An FP8 attention whose
//     forward kept its Q, K, V codes (attention_keep_codes) reads those instead (fp8_hybrid: its
//     kept dequantized copies); only a diagnostics probe's local reference then reads q, k, v
//     (model_gpu_probe.c, on when diagnostics.interval > 0). A BF16 attention, an FP8 one without
//     kept codes, QK-norm or diagnostics keep it; otherwise its last reader is the forward's
//     attention (or the QKV projection's epilogue writes only the codes).
//   o: read by the attention projection's weight-gradient GEMM (as x above: not in a block with
//     FP8 linears) and by the attention backward for D = rowsum(dO * O), except fp8_dm's, whose D
//     comes from the P and dP that form dS (its delta pass, attention/delta_fp8.cu, reads no O).
//     So fp8_dm attention in a block with FP8 linears, without diagnostics, does not keep it.
// A buffer not kept is never read after its forward; gpu_model_set_attention refuses a precision
// whose backward would read one (the probe's BF16 reference), and gpu_model_set_attn_diag a local
// reference.

int attn_backward_reads_qkv(AttnPrecision p, int codes_kept) { return !attn_precision_is_fp8(p) || !codes_kept; }

int attn_backward_reads_o(AttnPrecision p) {
    const AttnModePlan plan = attn_mode_plan(p);
    return !(plan.fp8_backward && plan.delta == ATTN_DELTA_MATCHED);
}

static int block_linears_bf16(const Config *c, int layer) {
    return linear_precision_of(&c->precision, c->model.n_layer, layer) == LINEAR_BF16;
}

int gpu_keeps_linear_inputs(const Config *c, int layer) { return !c->train.recompute && block_linears_bf16(c, layer); }

int gpu_keeps_qkv(const Config *c) {
    return c->model.qk_norm || c->diagnostics.interval > 0 ||
           attn_backward_reads_qkv(c->precision.attention, c->precision.attention_keep_codes);
}

int gpu_keeps_attn_out(const Config *c, int layer) {
    return block_linears_bf16(c, layer) || c->diagnostics.interval > 0 || attn_backward_reads_o(c->precision.attention);
}

// --- memory plan -----------------------------------------------------------------------------------
// The GPU backend's allocation, buffer by buffer in model_gpu.cu's order (its carve()): one arena
// where every buffer starts on a 256-byte boundary (the padding counts in the buffer's
// category), plus cuBLASLt's own workspace. Plain C arithmetic (model.c links no GPU code, so
// `--dry-run` and the CPU tests need no CUDA runtime); the kernels' scratch sizes come from
// gpu_sizes.h, which their launchers use too, and test_backend checks the whole plan equals
// gpu_model_plan byte for byte for several configs.

#define PLAN_ALIGN 256               // model_gpu.cu's ARENA_ALIGN

// FP8 scale floats of an operand of the GPU model's linears in the contract's grouping of an
// activation or gradient (weight 0) or a weight (linear_fp8.h).
static size_t plan_fp8_scales(LinearPrecision p, int weight, size_t rows, size_t cols) {
    return gpu_fp8_scales(weight ? linear_weight_grouping(p) : linear_act_grouping(p), rows, cols);
}

static void plan_take(size_t *category, size_t bytes) {
    if (bytes == 0) bytes = 1;
    *category += (bytes + PLAN_ALIGN - 1) / PLAN_ALIGN * PLAN_ALIGN;
}

void memory_plan(const Config *c, int world_size, int zero1, int micro_batch, MemoryPlan *out) {
    const ModelConfig *m = &c->model;
    ParamTable t;
    param_table_build(&t, m);
    size_t P = t.total;
    param_table_free(&t);
    size_t shards = (zero1 && world_size > 1) ? (size_t)world_size : 1;
    size_t P_shard = (P + shards - 1) / shards;  // ZeRO-1: each rank keeps a slice of masters and moments
    memset(out, 0, sizeof *out);
    plan_take(&out->weights, 2 * P);            // BF16 working copy
    plan_take(&out->master, 4 * P_shard);       // FP32 master weights
    plan_take(&out->optimizer, 4 * P_shard);    // AdamW m (FP32)
    plan_take(&out->optimizer, 4 * P_shard);    // AdamW v (FP32)
    plan_take(&out->grads, 4 * P);              // FP32 gradients (full: reduced before the step)

    // Activations of one micro-batch (BT tokens): BF16 = 2 bytes, FP32 = 4.
    size_t BT = (size_t)micro_batch * m->seq_len, T = (size_t)m->seq_len;
    size_t C = m->d_model, F = m->ffn_hidden, H = m->n_head, hd = m->head_dim, Vp = m->padded_vocab_size;
    size_t wide = 3 * C > 2 * F ? 3 * C : 2 * F;
    size_t *A = &out->activations;
    AttnPrecision ap = c->precision.attention;
    const int keep_qkv = gpu_keeps_qkv(c);
    for (int l = 0; l < m->n_layer; l++) {  // saved per layer for the backward (gpu_keeps_*)
        const int keep_in = gpu_keeps_linear_inputs(c, l);
        plan_take(A, 2 * BT * C);                        // residual input x_in
        if (keep_in) plan_take(A, 2 * BT * C);           // attention RMSNorm output h1
        if (keep_qkv) plan_take(A, 2 * BT * 3 * C);      // qkv (raw with QK-norm, else after RoPE)
        if (gpu_keeps_attn_out(c, l)) plan_take(A, 2 * BT * C);  // attention output o
        plan_take(A, 4 * BT * H);                        // its log-sum-exp (B, H, T)
        plan_take(A, 2 * BT * C);                        // residual after attention x_mid
        if (keep_in) plan_take(A, 2 * BT * C);           // MLP RMSNorm output h2
        plan_take(A, 2 * BT * 2 * F);                    // fc output [gate | up]
        if (keep_in) plan_take(A, 2 * BT * F);           // SwiGLU output
        plan_take(A, 4 * BT);                       // attention RMSNorm rstd
        plan_take(A, 4 * BT);                       // MLP RMSNorm rstd
        if (m->qk_norm) plan_take(A, 4 * 2 * BT * H);  // QK-norm rstd per head (q and k)
        if (attn_precision_is_fp8(ap) && c->precision.attention_keep_codes)  // the forward's quantized Q, K, V
            plan_take(A, gpu_attn_saved_codes_bytes(ap, (size_t)micro_batch, H, T, hd));
    }
    size_t head_chunk = gpu_head_chunk(BT);
    plan_take(A, 2 * BT * C);           // residual after the last block
    plan_take(A, 2 * BT * C);           // final RMSNorm output
    plan_take(A, 4 * BT);               // its rstd
    plan_take(A, 2 * head_chunk * Vp);  // one chunk of logits, overwritten by dlogits (fused head)
    plan_take(A, 2 * BT * wide);        // backward scratch 1 (BT, max(3C, 2F))
    plan_take(A, 2 * BT * wide);        // backward scratch 2
    plan_take(A, 2 * BT * C);           // residual-stream gradient (BF16)
    plan_take(A, 2 * BT * C);           // the head's input gradient, then backward scratch (BF16)
    plan_take(A, 4 * BT);               // input token ids
    plan_take(A, 4 * BT);               // target ids
    plan_take(A, 4 * BT);               // per-token losses

    size_t *W = &out->workspace;
    plan_take(W, 4 * T * hd);  // RoPE table (T, hd/2) cos and sin
    // attention: the backward's scratch, plus in FP8 modes the quantized operands (attention_fp8.h)
    plan_take(W, gpu_attn_mode_workspace_bytes(ap, (size_t)micro_batch, H, T, hd));
    size_t norm_scratch = gpu_norm_scratch_bytes((long long)BT, C);            // RMSNorm backward
    if (m->qk_norm) {
        size_t q = gpu_norm_scratch_bytes((long long)(BT * H), hd);            // QK-norm backward
        if (q > norm_scratch) norm_scratch = q;
    }
    plan_take(W, norm_scratch);
    plan_take(W, gpu_embedding_scratch_bytes(BT, C));  // embedding backward (token sort for wte)
    plan_take(W, sizeof(double) * GRAD_NORM_PARTIALS);                 // grad-norm partial sums
    plan_take(W, sizeof(double));                                      // and their total
    if (c->precision.attention_scaling == SCALING_DELAYED)              // per layer: 4 scales, 4 amaxes
        plan_take(W, sizeof(float) * 8 * (size_t)m->n_layer);
    *W += MATMUL_WORKSPACE_BYTES;  // cuBLASLt's workspace, allocated by matmul.cu outside the arena
    if (c->precision.linear != LINEAR_BF16) {
        // FP8 linears: model_gpu.cu's two operand slots (codes, then scales; gpu_fp8_slot_size,
        // with an FP8 LM head's chunk when the head is FP8); the FP8 GEMMs share matmul.cu's
        // cuBLASLt workspace. First the amaxes that fp8_tensor's producers take.
        plan_take(W, gpu_fp8_prod_amax_bytes((size_t)m->n_layer));
        if (linear_delayed_on(&c->precision))  // the scales' amaxes (delayed scaling)
            plan_take(W, gpu_fp8_delayed_amax_bytes((size_t)m->n_layer));
        const size_t fp8_head = gpu_fp8_head_chunk(linear_precision_of(&c->precision, m->n_layer, -1), BT);
        for (int slot = 0; slot < 2; slot++) {
            size_t codes, scales;
            gpu_fp8_slot_size(slot, c->precision.linear, BT, C, F, fp8_head, Vp, &codes, &scales);
            plan_take(W, codes);       // FP8 codes
            plan_take(W, 4 * scales);  // their scales
        }
        const int keep_wt = gpu_fp8_keeps_weight_t(c->precision.linear);
        if (!keep_wt) {  // per-tensor weights: the dgrad's Q(W^T), transposed from Q(W) (gpu_sizes.h)
            plan_take(W, gpu_fp8_weight_t_scratch_codes(C, F));
            plan_take(W, 4 * gpu_fp8_scales_tensor());
        }
        // Per FP8 block, each linear W (M, K) (qkv (3C, C), attention projection (C, C), MLP in
        // (2F, C), MLP out (C, F)): Q(W) and (but per tensor) Q(W^T), quantized once per optimizer
        // step (weights), and Q(x^T) (K, BT) of its input, saved by the forward for wgrad (activations).
        for (int l = 0; l < m->n_layer; l++) {
            if (linear_precision_of(&c->precision, m->n_layer, l) == LINEAR_BF16) continue;
            size_t mk[4][2] = {{3 * C, C}, {C, C}, {2 * F, C}, {C, F}};
            for (int i = 0; i < 4; i++) {
                size_t M = mk[i][0], K = mk[i][1];
                plan_take(&out->weights, M * K);                                        // Q(W) codes
                plan_take(&out->weights, 4 * plan_fp8_scales(c->precision.linear, 1, M, K));
                if (keep_wt) {
                    plan_take(&out->weights, K * M);                                    // Q(W^T) codes
                    plan_take(&out->weights, 4 * plan_fp8_scales(c->precision.linear, 1, K, M));
                }
                plan_take(A, K * BT);                                                   // Q(x^T) codes
                plan_take(A, 4 * gpu_fp8_scales_xt(c->precision.linear, c->precision.linear_wgrad_blocks, K, BT));
            }
        }
        if (fp8_head) {  // the LM head's Q(W) (Vp, C), Q(W^T) (C, Vp) and its chunk's Q(hf^T) (C, chunk)
            const LinearPrecision hp = linear_precision_of(&c->precision, m->n_layer, -1);
            plan_take(&out->weights, Vp * C);
            plan_take(&out->weights, 4 * plan_fp8_scales(hp, 1, Vp, C));
            plan_take(&out->weights, C * Vp);
            plan_take(&out->weights, 4 * plan_fp8_scales(hp, 1, C, Vp));
            plan_take(W, C * fp8_head);
            plan_take(W, 4 * gpu_fp8_scales_xt(hp, c->precision.linear_wgrad_blocks, C, fp8_head));
        }
    }
    out->total = out->weights + out->master + out->optimizer + out->grads + out->activations +
                 out->workspace;
}

void memory_plan_print(FILE *f, const MemoryPlan *mp) {
    const double GiB = 1024.0 * 1024.0 * 1024.0;
    const char *names[] = {"weights (bf16)", "master weights (fp32)", "AdamW m, v (fp32)", "gradients (fp32)",
                           "activations (1 micro-batch)", "workspace", "total"};
    size_t bytes[] = {mp->weights, mp->master, mp->optimizer, mp->grads, mp->activations, mp->workspace, mp->total};
    fprintf(f, "  %-28s %10s %16s\n", "memory per GPU", "GiB", "bytes");
    for (int i = 0; i < 7; i++) fprintf(f, "  %-28s %10.3f %16zu\n", names[i], bytes[i] / GiB, bytes[i]);
}

// --- summary -----------------------------------------------------------------------------------------

// "569M" / "1.67B" with three significant digits.
static void format_count(char *buf, size_t n, double x) {
    const char *unit = "";
    if (x >= 1e9) { x /= 1e9; unit = "B"; }
    else if (x >= 1e6) { x /= 1e6; unit = "M"; }
    else if (x >= 1e3) { x /= 1e3; unit = "K"; }
    int decimals = x >= 100 ? 0 : x >= 10 ? 1 : 2;
    snprintf(buf, n, "%.*f%s", decimals, x, unit);
}

static const char *init_name(InitKind k) {
    switch (k) {
    case INIT_NORMAL: return "normal";
    case INIT_NORMAL_RESID: return "normal/sqrt(2L)";
    case INIT_ONES: return "ones";
    }
    return "?";
}

void model_print_summary(FILE *f, const Config *c, const ParamTable *t, int world_size, int zero1) {
    const ModelConfig *m = &c->model;
    fprintf(f, "model: d_model %d, n_layer %d, n_head %d (head_dim %d), ffn_hidden %d, seq_len %d, "
               "vocab %d (padded %d), position %s (theta %g), qk_norm %s, tied %s, norm_eps %g, init_std %g\n",
            m->d_model, m->n_layer, m->n_head, m->head_dim, m->ffn_hidden, m->seq_len, m->vocab_size,
            m->padded_vocab_size, m->position == POS_ROPE ? "rope" : "none", m->rope_theta,
            m->qk_norm ? "on" : "off", m->tied_embeddings ? "yes" : "no", m->norm_eps, m->init_std);
    fprintf(f, "  %-36s %-14s %14s  %-16s %s\n", "parameter", "shape", "numel", "init", "decay");
    for (int i = 0; i < t->n; i++) {
        const ParamDesc *d = &t->p[i];
        char shape[32];
        if (d->ndim == 2) snprintf(shape, sizeof shape, "(%ld, %ld)", d->rows, d->cols);
        else snprintf(shape, sizeof shape, "(%ld)", d->rows);
        fprintf(f, "  %-36s %-14s %14zu  %-16s %s\n", d->name, shape, d->numel, init_name(d->init),
                d->weight_decay ? "yes" : "no");
    }
    char total[32], mm[32];
    format_count(total, sizeof total, (double)t->total);
    format_count(mm, sizeof mm, matmul_params(m));
    fprintf(f, "total parameters: %zu (%s)\n", t->total, total);
    fprintf(f, "matmul parameters (incl. LM head, excl. embedding lookup): %.0f (%s)\n",
            matmul_params(m), mm);
    fprintf(f, "training FLOPs per token: %.4g (6 * matmul params + 6 * n_layer * d_model * seq_len)\n",
            model_flops_per_token(m));
    MemoryPlan mp;
    memory_plan(c, world_size, zero1, c->train.micro_batch, &mp);
    fprintf(f, "memory plan: world_size %d, zero1 %s, micro_batch %d x seq_len %d\n", world_size,
            zero1 ? "on" : "off", c->train.micro_batch, m->seq_len);
    memory_plan_print(f, &mp);
}
