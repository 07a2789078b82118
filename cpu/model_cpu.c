// model_cpu.c: the CPU reference backend: the GPT of model.h, forward and backward in FP32.
//
// Matmuls go through matmul_cpu.c (blocked, multi-threaded, bit-reproducible), the row-wise
// layers through layers_cpu.c, attention through attention_cpu.c (per sequence and head, in the
// precision of the config). The LM head is fused with the cross-entropy in chunks of tokens as
// on the GPU: a chunk's logits are computed, turned into dlogits in place, and immediately used
// for the input gradient and the head's weight gradient, so (B*T, Vp) is never stored.
// Because the gradient of the head is produced during the forward, cpu_model_forward keeps it
// unscaled (dhf, dhead) and cpu_model_backward applies loss_scale; cpu_model_loss skips it.
// Every linear-layer GEMM goes through linear_fp8.c, which is the plain FP32 product for BF16
// linears and quantizes the operands first for precision.linear = fp8_tensor / fp8_block.
// cpu_model_probe (for diagnostics.c) reruns a forward + backward in another attention precision
// with the training state set aside; its hooks in the attention wrappers are inert (a NULL
// pointer test) on the training path, which stays bit-identical. cpu_model_attention_inputs
// (for attn-check --from-checkpoint) takes one head's attention inputs the same way.
// Centred keys' delayed form keeps c per layer and head in m->key_centers: each forward writes
// its micro-batch's means into `next`, each backward commits them, as the amax histories are.
#include "cpu/model_cpu.h"

#include <math.h>    // log for the loss
#include <omp.h>     // omp_set_num_threads
#include <stdlib.h>  // free
#include <string.h>  // memcpy, memset

#include "core/common.h"     // xmalloc, xcalloc, FATAL
#include "cpu/layers_cpu.h"  // rmsnorm, rope, swiglu, cross-entropy
#include "cpu/linear_fp8.h"  // linear_forward / dgrad / wgrad in the linear precision of a layer

// Tokens per chunk of the fused LM head + cross-entropy: a multiple of 128, so that an FP8 head's
// 1x128 token slices of its wgrad operands (fp8_block) start at the same tokens as the GPU's
// 8192-token chunks give them: then the head's codes do not depend on either backend's chunking.
#define HEAD_CHUNK 256
_Static_assert(HEAD_CHUNK % 128 == 0, "LM-head chunks must keep 128-token slices aligned");

// Activations of one block saved for backward (BT = B*T rows; heads laid out (B, H, T, hd)).
typedef struct {
    float *x_in;            // (BT, C) residual stream entering the block
    float *rstd1, *h1;      // (BT), (BT, C) attention RMSNorm
    float *q_raw, *k_raw;   // (B, H, T, hd) q, k before QK-norm (used only with qk_norm)
    float *q_rstd, *k_rstd; // (B*H*T) QK-norm
    float *q, *k, *v;       // (B, H, T, hd) attention inputs (after QK-norm and RoPE)
    float *o, *lse;         // (B, H, T, hd), (B, H, T) attention output and row log-sum-exp
    float *att;             // (BT, C) attention output, token-major (attention projection input)
    float *x_mid;           // (BT, C) residual after attention
    float *rstd2, *h2;      // (BT), (BT, C) MLP RMSNorm
    float *fc;              // (BT, 2F) [gate | up]
    float *sw;              // (BT, F) silu(gate) * up
} BlockActs;

typedef struct {
    int B, T;                // shape of the last forward
    int grad_ready;          // the last forward prepared dhf/dhead for backward
    BlockActs *block;        // (n_layer)
    float *x_final;          // (BT, C) residual stream after the last block
    float *rstd_f, *hf;      // (BT), (BT, C) final RMSNorm
    float *dhf;              // (BT, C) d(mean loss)/d(hf), from the fused head
    float *dhead;            // (Vp, C) d(mean loss)/d(head weight)
    float *logits;           // (HEAD_CHUNK, Vp) one chunk of logits / dlogits
    float *losses;           // (BT) per-token loss
    int32_t *tokens;         // (BT) the last forward's tokens (embedding backward)
    float *rope;             // (T, hd/2, 2) cos, sin
    float *qkv;              // (BT, 3C) scratch: forward QKV, backward dQKV
    float *dx, *dh, *datt;   // (BT, C) backward scratch
    float *dsw, *dfc;        // (BT, F), (BT, 2F)
    float *dout, *dq, *dk, *dv;  // (B, H, T, hd)
    AttnStats *head_stats;   // (B*H) per-head counters, merged in a fixed order
    LinearFp8 lin;           // FP8 linear state: formats, counters, scratch
    ModelProbe *probe;         // non-NULL only inside cpu_model_probe: per-layer records go there
    struct AttnCapture *capture;  // non-NULL only inside cpu_model_attention_inputs
} Acts;

// What cpu_model_attention_inputs asks the backward to copy: one head's output gradient.
typedef struct AttnCapture {
    int layer, seq, head;
    float *dout;  // (T, head_dim)
} AttnCapture;

static float *falloc(size_t n) { return xcalloc(n ? n : 1, sizeof(float)); }

static const float *P(const CpuModel *m, ParamKind kind, int layer) {
    const ParamDesc *d = param_find(&m->table, kind, layer);
    if (!d) FATAL("model_cpu: parameter kind %d layer %d missing from the table", (int)kind, layer);
    return m->params + d->offset;
}
static float *G(CpuModel *m, ParamKind kind, int layer) {
    const ParamDesc *d = param_find(&m->table, kind, layer);
    if (!d) FATAL("model_cpu: parameter kind %d layer %d missing from the table", (int)kind, layer);
    return m->grads + d->offset;
}
static ParamKind head_kind(const CpuModel *m) { return m->cfg.model.tied_embeddings ? P_WTE : P_LM_HEAD; }
// Precision of the linears of block `layer` (-1: the LM head).
static LinearPrecision lin_prec(const CpuModel *m, int layer) {
    return linear_precision_of(&m->cfg.precision, m->cfg.model.n_layer, layer);
}

void cpu_model_init(CpuModel *m, const Config *c, int B, int T, unsigned long long seed) {
    memset(m, 0, sizeof *m);
    m->cfg = *c;
    const ModelConfig *mc = &c->model;
    if (B < 1 || T < 1 || T > mc->seq_len)
        FATAL("cpu_model_init: micro-batch %d x %d does not fit seq_len %d", B, T, mc->seq_len);
    if (mc->head_dim * mc->n_head != mc->d_model || mc->head_dim % 2)
        FATAL("cpu_model_init: head_dim %d x n_head %d != d_model %d or odd head_dim", mc->head_dim,
              mc->n_head, mc->d_model);
    if (c->train.threads > 0) omp_set_num_threads(c->train.threads);
    param_table_build(&m->table, mc);
    m->params = falloc(m->table.total);
    m->grads = falloc(m->table.total);
    params_init(&m->table, mc, seed, m->params);
    m->B = B;
    m->T = T;
    attn_options_from_config(&m->attn, &c->precision);
    // attention's states (one per layer, always), then with delayed linear scaling the linears'
    m->attn_delayed = delayed_states_new(&c->precision, mc->n_layer, 1, &m->n_delayed);
    if (c->precision.attention_center_keys == CENTER_KEYS_DELAYED)
        attn_key_centers_init(&m->key_centers, mc->n_layer, mc->n_head, mc->head_dim);

    size_t BT = (size_t)B * T, C = mc->d_model, F = mc->ffn_hidden, H = mc->n_head;
    size_t hd = mc->head_dim, Vp = mc->padded_vocab_size;
    Acts *a = xcalloc(1, sizeof(Acts));
    a->block = xcalloc((size_t)mc->n_layer, sizeof(BlockActs));
    for (int l = 0; l < mc->n_layer; l++) {
        BlockActs *b = &a->block[l];
        b->x_in = falloc(BT * C);
        b->rstd1 = falloc(BT);
        b->h1 = falloc(BT * C);
        if (mc->qk_norm) {
            b->q_raw = falloc(BT * C);
            b->k_raw = falloc(BT * C);
            b->q_rstd = falloc(BT * H);
            b->k_rstd = falloc(BT * H);
        }
        b->q = falloc(BT * C);
        b->k = falloc(BT * C);
        b->v = falloc(BT * C);
        b->o = falloc(BT * C);
        b->lse = falloc(BT * H);
        b->att = falloc(BT * C);
        b->x_mid = falloc(BT * C);
        b->rstd2 = falloc(BT);
        b->h2 = falloc(BT * C);
        b->fc = falloc(BT * 2 * F);
        b->sw = falloc(BT * F);
    }
    a->x_final = falloc(BT * C);
    a->rstd_f = falloc(BT);
    a->hf = falloc(BT * C);
    a->dhf = falloc(BT * C);
    a->dhead = falloc(Vp * C);
    a->logits = falloc((size_t)HEAD_CHUNK * Vp);
    a->losses = falloc(BT);
    a->tokens = xcalloc(BT, sizeof(int32_t));
    a->rope = falloc((size_t)T * hd);
    if (mc->position == POS_ROPE) rope_table(a->rope, T, (int)hd, mc->rope_theta);
    a->qkv = falloc(BT * 3 * C);
    a->dx = falloc(BT * C);
    a->dh = falloc(BT * C);
    a->datt = falloc(BT * C);
    a->dsw = falloc(BT * F);
    a->dfc = falloc(BT * 2 * F);
    a->dout = falloc(BT * C);
    a->dq = falloc(BT * C);
    a->dk = falloc(BT * C);
    a->dv = falloc(BT * C);
    a->head_stats = xcalloc((size_t)B * H, sizeof(AttnStats));
    linear_fp8_init(&a->lin, &c->precision);
    if (linear_delayed_on(&c->precision)) a->lin.delayed = m->attn_delayed + LINEAR_DELAYED_FIRST(mc->n_layer);
    m->acts = a;
}

void cpu_model_free(CpuModel *m) {
    Acts *a = m->acts;
    if (a) {
        for (int l = 0; l < m->cfg.model.n_layer; l++) {
            BlockActs *b = &a->block[l];
            float *bufs[] = {b->x_in, b->rstd1, b->h1, b->q_raw, b->k_raw, b->q_rstd, b->k_rstd,
                             b->q, b->k, b->v, b->o, b->lse, b->att, b->x_mid, b->rstd2, b->h2,
                             b->fc, b->sw};
            for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
        }
        float *bufs[] = {a->x_final, a->rstd_f, a->hf, a->dhf, a->dhead, a->logits, a->losses,
                         a->rope, a->qkv, a->dx, a->dh, a->datt, a->dsw, a->dfc, a->dout,
                         a->dq, a->dk, a->dv};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
        free(a->tokens);
        free(a->head_stats);
        linear_fp8_free(&a->lin);
        free(a->block);
        free(a);
    }
    free(m->params);
    free(m->grads);
    free(m->attn_delayed);
    attn_key_centers_free(&m->key_centers);
    param_table_free(&m->table);
    memset(m, 0, sizeof *m);
}

void cpu_model_zero_grad(CpuModel *m) { memset(m->grads, 0, sizeof(float) * m->table.total); }

// --- layout helpers: token-major (B, T, [H, hd]) <-> head-major (B, H, T, hd) --------------------

// dst (B, H, T, hd) = the columns [col0, col0 + C) of src (B*T, ld), split into heads.
static void to_heads(float *dst, const float *src, int B, int T, int H, int hd, int ld, int col0) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++)
            for (int t = 0; t < T; t++)
                memcpy(dst + (((long)b * H + h) * T + t) * hd,
                       src + ((long)b * T + t) * ld + col0 + (long)h * hd, sizeof(float) * hd);
}

// Inverse of to_heads: columns [col0, col0 + C) of dst (B*T, ld) from src (B, H, T, hd).
static void from_heads(float *dst, const float *src, int B, int T, int H, int hd, int ld, int col0) {
#pragma omp parallel for collapse(2) schedule(static)
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                memcpy(dst + ((long)b * T + t) * ld + col0 + (long)h * hd,
                       src + (((long)b * H + h) * T + t) * hd, sizeof(float) * hd);
}

// --- attention over all (sequence, head) pairs --------------------------------------------------
// Heads run in parallel with private counters merged in a fixed order. With delayed scaling the
// per-layer amax state is shared by every head of the step, so those heads run one at a time.

static void merge_stats(AttnStats *into, const AttnStats *s) {
    for (int i = 0; i < ATTN_N_CASTS; i++) {
        into->saturated[i] += s->saturated[i];
        into->casts[i] += s->casts[i];
    }
    if (s->resid_max > into->resid_max) into->resid_max = s->resid_max;
    if (s->resid_cancel_max > into->resid_cancel_max) into->resid_cancel_max = s->resid_cancel_max;
    if (s->post_resid_max > into->post_resid_max) into->post_resid_max = s->post_resid_max;
}

// The c of centred keys' delayed form for head `head` of layer `layer` (NULL: none, or the head's
// own mean before the first commit; attention_cpu.h).
static const float *key_center(const CpuModel *m, int layer, int head) {
    if (m->attn.center_keys != CENTER_KEYS_DELAYED || !m->key_centers.center) return NULL;
    return attn_key_center_of(&m->key_centers, layer, head);
}

static void attention_forward(CpuModel *m, int layer, BlockActs *b, AttnDelayedState *ds, int B, int T) {
    Acts *a = m->acts;
    int H = m->cfg.model.n_head, hd = m->cfg.model.head_dim, n = B * H;
    memset(a->head_stats, 0, sizeof(AttnStats) * (size_t)n);
    // this micro-batch's key means, committed by its backward (c stays the previous one until then)
    if (m->key_centers.center) attn_key_centers_accumulate(&m->key_centers, layer, B, T, b->k);
    int serial = m->attn.scaling == SCALING_DELAYED;
#pragma omp parallel for schedule(dynamic, 1) if (!serial)
    for (int i = 0; i < n; i++) {
        long off = (long)i * T * hd;
        attn_cpu_forward_centered(&m->attn, ds, T, hd, b->q + off, b->k + off, b->v + off, key_center(m, layer, i % H),
                                  b->o + off, b->lse + (long)i * T, &a->head_stats[i]);
    }
    for (int i = 0; i < n; i++) merge_stats(&m->attn_stats, &a->head_stats[i]);
    if (a->probe)
        for (int i = 0; i < n; i++) merge_stats(&a->probe->layer_stats[layer], &a->head_stats[i]);
}

// Probe with a local reference: this layer's attention alone, on the very inputs q, k, v and
// output gradient dout the probe's attention received, recomputed in p->local_ref precision
// (block scaling: the reference is BF16 or FP32); adds sum (x - x_ref)^2 and sum x_ref^2 of
// dq, dk, dv into p->local_sq[layer]. Per-head sums are merged in a fixed order.
static void local_reference(CpuModel *m, ModelProbe *p, int layer, const BlockActs *b, int B, int T) {
    Acts *a = m->acts;
    int H = m->cfg.model.n_head, hd = m->cfg.model.head_dim, n = B * H;
    AttnOptions ref = m->attn;
    ref.precision = p->local_ref;
    ref.scaling = SCALING_BLOCK;
    double *sums = xcalloc((size_t)n * 6, sizeof(double));  // (n, 6) per head
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < n; i++) {
        size_t th = (size_t)T * hd;
        long off = (long)i * T * hd;
        float *o = falloc(th), *lse = falloc((size_t)T), *g = falloc(3 * th);  // g: dq, dk, dv
        attn_cpu_forward(&ref, NULL, T, hd, b->q + off, b->k + off, b->v + off, o, lse, NULL);
        attn_cpu_backward(&ref, NULL, T, hd, b->q + off, b->k + off, b->v + off, o, lse, a->dout + off, g,
                          g + th, g + 2 * th, NULL, NULL);
        const float *mine[3] = {a->dq + off, a->dk + off, a->dv + off};
        for (int t = 0; t < 3; t++)
            for (size_t x = 0; x < th; x++) {
                double r = g[t * th + x], dlt = (double)mine[t][x] - r;
                sums[i * 6 + 2 * t] += dlt * dlt;
                sums[i * 6 + 2 * t + 1] += r * r;
            }
        free(o);
        free(lse);
        free(g);
    }
    for (int i = 0; i < n; i++)
        for (int k = 0; k < 6; k++) p->local_sq[layer * 6 + k] += sums[i * 6 + k];
    free(sums);
}

static void attention_backward(CpuModel *m, int layer, BlockActs *b, AttnDelayedState *ds, int B, int T) {
    Acts *a = m->acts;
    int H = m->cfg.model.n_head, hd = m->cfg.model.head_dim, n = B * H;
    // A probe also records each row's residuals (written only: the arithmetic is the same).
    float *row_resid = a->probe ? a->probe->row_resid + (size_t)layer * a->probe->n_rows : NULL;
    float *row_post = a->probe ? a->probe->row_post_resid + (size_t)layer * a->probe->n_rows : NULL;
    if (a->capture && a->capture->layer == layer) {
        long off = ((long)a->capture->seq * H + a->capture->head) * T * hd;
        memcpy(a->capture->dout, a->dout + off, sizeof(float) * (size_t)T * hd);
    }
    memset(a->head_stats, 0, sizeof(AttnStats) * (size_t)n);
    int serial = m->attn.scaling == SCALING_DELAYED;
#pragma omp parallel for schedule(dynamic, 1) if (!serial)
    for (int i = 0; i < n; i++) {
        long off = (long)i * T * hd;
        attn_cpu_backward_centered(&m->attn, ds, T, hd, b->q + off, b->k + off, b->v + off, key_center(m, layer, i % H),
                                   b->o + off, b->lse + (long)i * T, a->dout + off, a->dq + off, a->dk + off,
                                   a->dv + off, &a->head_stats[i], row_resid ? row_resid + (long)i * T : NULL,
                                   row_post ? row_post + (long)i * T : NULL);
    }
    for (int i = 0; i < n; i++) merge_stats(&m->attn_stats, &a->head_stats[i]);
    if (a->probe) {
        ModelProbe *p = a->probe;
        size_t nel = (size_t)n * T * hd, at = (size_t)layer * p->n_attn;
        for (int i = 0; i < n; i++) merge_stats(&p->layer_stats[layer], &a->head_stats[i]);
        memcpy(p->dq + at, a->dq, sizeof(float) * nel);
        memcpy(p->dk + at, a->dk, sizeof(float) * nel);
        memcpy(p->dv + at, a->dv, sizeof(float) * nel);
        if (p->local_ref != ATTN_N_PRECISIONS) local_reference(m, p, layer, b, B, T);
    }
}

// --- forward -------------------------------------------------------------------------------------

// Embedding and every block for tokens (B, T); leaves the result in acts->x_final.
static void forward_blocks(CpuModel *m, const int32_t *tokens, int B, int T) {
    const ModelConfig *mc = &m->cfg.model;
    Acts *a = m->acts;
    int BT = B * T, C = mc->d_model, F = mc->ffn_hidden, H = mc->n_head, hd = mc->head_dim;
    float eps = (float)mc->norm_eps;
    a->B = B;
    a->T = T;
    memset(&m->attn_stats, 0, sizeof m->attn_stats);
    linear_fp8_forward_begin(&a->lin, mc->n_layer);  // delayed scaling: this micro-batch's amaxes from zero

    const float *wte = P(m, P_WTE, 0);
    for (int i = 0; i < BT; i++) {
        if (tokens[i] < 0 || tokens[i] >= mc->vocab_size)
            FATAL("model_cpu: token id %d at position %d outside [0, %d) (hint: the data shard does not match the vocabulary)",
                  tokens[i], i, mc->vocab_size);
        a->tokens[i] = tokens[i];
    }
    float *x0 = mc->n_layer > 0 ? a->block[0].x_in : a->x_final;
#pragma omp parallel for schedule(static)
    for (int i = 0; i < BT; i++) memcpy(x0 + (long)i * C, wte + (long)tokens[i] * C, sizeof(float) * C);

    for (int l = 0; l < mc->n_layer; l++) {
        BlockActs *b = &a->block[l];
        float *x_out = l + 1 < mc->n_layer ? a->block[l + 1].x_in : a->x_final;
        LinearPrecision lp = lin_prec(m, l);
        // attention
        rmsnorm_forward(b->h1, b->rstd1, b->x_in, P(m, P_ATTN_NORM, l), BT, C, eps);
        linear_fp8_site(&a->lin, l, 0);
        linear_forward(&a->lin, lp, a->qkv, b->h1, P(m, P_QKV, l), BT, 3 * C, C, 0);     // (BT, 3C)
        if (mc->qk_norm) {
            to_heads(b->q_raw, a->qkv, B, T, H, hd, 3 * C, 0);
            to_heads(b->k_raw, a->qkv, B, T, H, hd, 3 * C, C);
            rmsnorm_forward(b->q, b->q_rstd, b->q_raw, P(m, P_Q_NORM, l), BT * H, hd, eps);
            rmsnorm_forward(b->k, b->k_rstd, b->k_raw, P(m, P_K_NORM, l), BT * H, hd, eps);
        } else {
            to_heads(b->q, a->qkv, B, T, H, hd, 3 * C, 0);
            to_heads(b->k, a->qkv, B, T, H, hd, 3 * C, C);
        }
        to_heads(b->v, a->qkv, B, T, H, hd, 3 * C, 2 * C);
        if (mc->position == POS_ROPE) {
            rope_forward(b->q, a->rope, BT * H, T, hd);
            rope_forward(b->k, a->rope, BT * H, T, hd);
        }
        attention_forward(m, l, b, &m->attn_delayed[l], B, T);
        from_heads(b->att, b->o, B, T, H, hd, C, 0);
        memcpy(b->x_mid, b->x_in, sizeof(float) * (size_t)BT * C);
        linear_fp8_site(&a->lin, l, 1);
        linear_forward(&a->lin, lp, b->x_mid, b->att, P(m, P_ATTN_PROJ, l), BT, C, C, 1);  // x += att @ W^T
        // MLP
        rmsnorm_forward(b->h2, b->rstd2, b->x_mid, P(m, P_MLP_NORM, l), BT, C, eps);
        linear_fp8_site(&a->lin, l, 2);
        linear_forward(&a->lin, lp, b->fc, b->h2, P(m, P_MLP_FC, l), BT, 2 * F, C, 0);   // (BT, 2F)
        swiglu_forward(b->sw, b->fc, BT, F);
        memcpy(x_out, b->x_mid, sizeof(float) * (size_t)BT * C);
        linear_fp8_site(&a->lin, l, 3);
        linear_forward(&a->lin, lp, x_out, b->sw, P(m, P_MLP_PROJ, l), BT, C, F, 1);    // x += sw @ W^T
    }
    rmsnorm_forward(a->hf, a->rstd_f, a->x_final, P(m, P_FINAL_NORM, 0), BT, C, eps);
}

// Fused LM head + cross-entropy over the chunks of the last forward_blocks. With want_grad, also
// dhf = d(mean loss)/d(hf) and dhead = d(mean loss)/d(head weight). row_logits (n_rows, Vp), if
// not NULL, receives the logits of the listed rows (indices into B*T) as the loss saw them.
static float head_and_loss_rows(CpuModel *m, const int32_t *targets, int want_grad, int n_rows, const int *rows,
                                float *row_logits) {
    const ModelConfig *mc = &m->cfg.model;
    Acts *a = m->acts;
    int BT = a->B * a->T, C = mc->d_model, V = mc->vocab_size, Vp = mc->padded_vocab_size;
    const float *w = P(m, head_kind(m), 0);  // (Vp, C)
    LinearPrecision hp = lin_prec(m, -1);
    int counted = 0;
    for (int i = 0; i < BT; i++) {
        if (targets[i] >= V)
            FATAL("model_cpu: target id %d at position %d outside [0, %d) (hint: the data shard does not match the vocabulary)",
                  targets[i], i, V);
        counted += targets[i] >= 0;
    }
    float grad_scale = want_grad && counted ? 1.0f / counted : 0.0f;
    // the head: per-tensor scales of the micro-batch (fp8_tensor; |dlogits| <= grad_scale), else
    // as its precision quantizes (linear_fp8.c's contract)
    if (hp == LINEAR_FP8_TENSOR) linear_fp8_head_scales(&a->lin, a->hf, BT, C, grad_scale);
    else linear_fp8_site(&a->lin, -1, 0);
    for (int c0 = 0; c0 < BT; c0 += HEAD_CHUNK) {
        int n = BT - c0 < HEAD_CHUNK ? BT - c0 : HEAD_CHUNK;
        const float *hf = a->hf + (long)c0 * C;
        linear_forward(&a->lin, hp, a->logits, hf, w, n, Vp, C, 0);             // (n, Vp)
        for (int r = 0; r < n_rows && row_logits; r++)
            if (rows[r] >= c0 && rows[r] < c0 + n)
                memcpy(row_logits + (size_t)r * Vp, a->logits + (size_t)(rows[r] - c0) * Vp, sizeof(float) * (size_t)Vp);
        cross_entropy_rows(a->logits, a->losses + c0, targets + c0, n, V, Vp, grad_scale);
        if (want_grad) {
            if (grad_scale == 0.0f) memset(a->logits, 0, sizeof(float) * (size_t)n * Vp);
            linear_dgrad(&a->lin, hp, a->dhf + (long)c0 * C, a->logits, w, n, Vp, C, 0);  // (n, C)
            linear_wgrad(&a->lin, hp, a->dhead, a->logits, hf, n, Vp, C, c0 > 0);          // (Vp, C)
        }
    }
    a->grad_ready = want_grad;
    double sum = 0.0;  // fixed order: the loss does not depend on the thread count
    for (int i = 0; i < BT; i++) sum += a->losses[i];
    return counted ? (float)(sum / counted) : 0.0f;
}

static float head_and_loss(CpuModel *m, const int32_t *targets, int want_grad) {
    return head_and_loss_rows(m, targets, want_grad, 0, NULL, NULL);
}

float cpu_model_forward(CpuModel *m, const int32_t *tokens, const int32_t *targets) {
    forward_blocks(m, tokens, m->B, m->T);
    return head_and_loss(m, targets, 1);
}

float cpu_model_loss(CpuModel *m, const int32_t *tokens, const int32_t *targets) {
    forward_blocks(m, tokens, m->B, m->T);
    return head_and_loss(m, targets, 0);
}

float cpu_model_loss_detail(CpuModel *m, const int32_t *tokens, const int32_t *targets, float *losses, int n_rows,
                            const int *rows, float *row_logits) {
    const int BT = m->B * m->T;
    for (int r = 0; r < n_rows; r++)
        if (rows[r] < 0 || rows[r] >= BT) FATAL("cpu_model_loss_detail: row %d outside [0, %d)", rows[r], BT);
    forward_blocks(m, tokens, m->B, m->T);
    float loss = head_and_loss_rows(m, targets, 0, n_rows, rows, row_logits);
    if (losses) memcpy(losses, ((Acts *)m->acts)->losses, sizeof(float) * (size_t)BT);
    return loss;
}

void cpu_model_next_logits(CpuModel *m, const int32_t *tokens, int t, float *logits) {
    if (t < 1 || t > m->T) FATAL("cpu_model_next_logits: %d tokens, expected 1..%d", t, m->T);
    forward_blocks(m, tokens, 1, t);
    ((Acts *)m->acts)->grad_ready = 0;
    const ModelConfig *mc = &m->cfg.model;
    const float *last = ((Acts *)m->acts)->hf + (long)(t - 1) * mc->d_model;
    linear_fp8_site(&((Acts *)m->acts)->lin, -1, 0);  // the head on this row alone
    linear_forward(&((Acts *)m->acts)->lin, lin_prec(m, -1), logits, last, P(m, head_kind(m), 0), 1,
                   mc->padded_vocab_size, mc->d_model, 0);
}

// --- backward ------------------------------------------------------------------------------------

void cpu_model_backward(CpuModel *m, float loss_scale) {
    const ModelConfig *mc = &m->cfg.model;
    Acts *a = m->acts;
    if (!a->grad_ready)
        FATAL("cpu_model_backward: the last forward did not prepare a backward (it was cpu_model_loss or cpu_model_next_logits)");
    int B = a->B, T = a->T, BT = B * T, C = mc->d_model, F = mc->ffn_hidden, H = mc->n_head;
    int hd = mc->head_dim, Vp = mc->padded_vocab_size;

    // LM head: its weight gradient was formed by the forward; scale it in.
    float *ghead = G(m, head_kind(m), 0);
    const float *dhead = a->dhead;
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < (long)Vp * C; i++) ghead[i] += loss_scale * dhead[i];
    // Final RMSNorm: dx = d(loss * loss_scale)/d(x_final).
#pragma omp parallel for simd schedule(static)
    for (long i = 0; i < (long)BT * C; i++) a->dh[i] = loss_scale * a->dhf[i];
    rmsnorm_backward(a->dx, G(m, P_FINAL_NORM, 0), a->dh, a->x_final, P(m, P_FINAL_NORM, 0),
                     a->rstd_f, BT, C, 0);

    for (int l = mc->n_layer - 1; l >= 0; l--) {
        BlockActs *b = &a->block[l];
        LinearPrecision lp = lin_prec(m, l);
        LinearFp8 *L = &a->lin;
        // MLP: x_out = x_mid + sw @ Wp^T, sw = swiglu(h2 @ Wfc^T), h2 = RMSNorm(x_mid)
        linear_fp8_site(L, l, 3);
        linear_wgrad(L, lp, G(m, P_MLP_PROJ, l), a->dx, b->sw, BT, C, F, 1);     // (C, F)
        linear_dgrad(L, lp, a->dsw, a->dx, P(m, P_MLP_PROJ, l), BT, C, F, 0);    // (BT, F)
        swiglu_backward(a->dfc, a->dsw, b->fc, BT, F);                         // (BT, 2F)
        linear_fp8_site(L, l, 2);
        linear_wgrad(L, lp, G(m, P_MLP_FC, l), a->dfc, b->h2, BT, 2 * F, C, 1);  // (2F, C)
        linear_dgrad(L, lp, a->dh, a->dfc, P(m, P_MLP_FC, l), BT, 2 * F, C, 0);  // (BT, C)
        rmsnorm_backward(a->dx, G(m, P_MLP_NORM, l), a->dh, b->x_mid, P(m, P_MLP_NORM, l),
                         b->rstd2, BT, C, 1);
        // Attention: x_mid = x_in + att @ Wo^T
        linear_fp8_site(L, l, 1);
        linear_wgrad(L, lp, G(m, P_ATTN_PROJ, l), a->dx, b->att, BT, C, C, 1);   // (C, C)
        linear_dgrad(L, lp, a->datt, a->dx, P(m, P_ATTN_PROJ, l), BT, C, C, 0);  // (BT, C)
        to_heads(a->dout, a->datt, B, T, H, hd, C, 0);
        attention_backward(m, l, b, &m->attn_delayed[l], B, T);                // dq, dk, dv
        if (mc->position == POS_ROPE) {
            rope_backward(a->dq, a->rope, BT * H, T, hd);
            rope_backward(a->dk, a->rope, BT * H, T, hd);
        }
        if (mc->qk_norm) {  // in place: rows are independent, each read before it is written
            rmsnorm_backward(a->dq, G(m, P_Q_NORM, l), a->dq, b->q_raw, P(m, P_Q_NORM, l),
                             b->q_rstd, BT * H, hd, 0);
            rmsnorm_backward(a->dk, G(m, P_K_NORM, l), a->dk, b->k_raw, P(m, P_K_NORM, l),
                             b->k_rstd, BT * H, hd, 0);
        }
        from_heads(a->qkv, a->dq, B, T, H, hd, 3 * C, 0);                      // dQKV (BT, 3C)
        from_heads(a->qkv, a->dk, B, T, H, hd, 3 * C, C);
        from_heads(a->qkv, a->dv, B, T, H, hd, 3 * C, 2 * C);
        linear_fp8_site(L, l, 0);
        linear_wgrad(L, lp, G(m, P_QKV, l), a->qkv, b->h1, BT, 3 * C, C, 1);     // (3C, C)
        linear_dgrad(L, lp, a->dh, a->qkv, P(m, P_QKV, l), BT, 3 * C, C, 0);     // (BT, C)
        rmsnorm_backward(a->dx, G(m, P_ATTN_NORM, l), a->dh, b->x_in, P(m, P_ATTN_NORM, l),
                         b->rstd1, BT, C, 1);
    }
    // Embedding: scatter-add in token order (a fixed order, so repeated tokens sum identically).
    float *gwte = G(m, P_WTE, 0);
    for (int i = 0; i < BT; i++) {
        float *row = gwte + (long)a->tokens[i] * C;
        const float *d = a->dx + (long)i * C;
        for (int j = 0; j < C; j++) row[j] += d[j];
    }
    for (int j = 0; j < m->n_delayed; j++) attn_delayed_commit(&m->attn_delayed[j]);  // attention's, the linears'
    if (m->key_centers.center) attn_key_centers_commit(&m->key_centers);
}

// --- probes (diagnostics) ------------------------------------------------------------------------

void cpu_probe_alloc(ModelProbe *p, const CpuModel *m) {
    const ModelConfig *mc = &m->cfg.model;
    memset(p, 0, sizeof *p);
    p->n_layer = mc->n_layer;
    p->n_rows = (size_t)m->B * mc->n_head * m->T;
    p->n_attn = p->n_rows * mc->head_dim;
    size_t L = (size_t)mc->n_layer;
    p->layer_stats = xcalloc(L ? L : 1, sizeof(AttnStats));
    p->row_resid = falloc(L * p->n_rows);
    p->row_post_resid = falloc(L * p->n_rows);
    p->dq = falloc(L * p->n_attn);
    p->dk = falloc(L * p->n_attn);
    p->dv = falloc(L * p->n_attn);
    p->grads = falloc(m->table.total);
    p->local_sq = xcalloc((L ? L : 1) * 6, sizeof(double));
    p->local_ref = ATTN_N_PRECISIONS;
}

void cpu_probe_free(ModelProbe *p) { probe_free_host(p); }

// The key centres' committed state, set aside around a probe (whose backward commits into it).
static AttnKeyCenters key_centers_save(const AttnKeyCenters *kc) {
    AttnKeyCenters c = *kc;
    if (kc->center) {
        size_t bytes = (size_t)attn_key_centers_count(kc) * sizeof(float);
        c.center = xmalloc(bytes ? bytes : 1);
        memcpy(c.center, kc->center, bytes);
    }
    return c;
}
static void key_centers_restore(AttnKeyCenters *kc, AttnKeyCenters *saved) {
    if (kc->center) memcpy(kc->center, saved->center, (size_t)attn_key_centers_count(kc) * sizeof(float));
    kc->ready = saved->ready;
    if (kc->center) free(saved->center);
}

// Everything a forward + backward writes besides the activations is set aside first and put back
// afterwards: the gradient buffer (swapped for the probe's own), the attention precision, the
// delayed-scaling amax histories (the backward commits into them), the statistics of the last
// training step and the FP8-linear counters. Parameters are only read.
void cpu_model_probe(CpuModel *m, AttnPrecision precision, AttnPrecision local_ref, const int32_t *tokens,
                     const int32_t *targets, ModelProbe *out) {
    Acts *a = m->acts;
    int L = m->cfg.model.n_layer;
    if (out->n_layer != L || out->n_rows != (size_t)m->B * m->cfg.model.n_head * m->T)
        FATAL("cpu_model_probe: the probe was allocated for another model (cpu_probe_alloc)");
    float *grads_saved = m->grads;
    AttnOptions attn_saved = m->attn;
    AttnStats stats_saved = m->attn_stats;
    AttnDelayedState *delayed_saved = attn_delayed_save(m->attn_delayed, m->n_delayed);
    Fp8QuantStats lin_stats_saved[3];
    memcpy(lin_stats_saved, a->lin.stats, sizeof lin_stats_saved);
    long long lin_gemms_saved = a->lin.gemms;
    AttnKeyCenters centers_saved = key_centers_save(&m->key_centers);

    m->grads = out->grads;
    memset(out->grads, 0, sizeof(float) * m->table.total);
    memset(out->layer_stats, 0, sizeof(AttnStats) * (size_t)L);
    memset(out->local_sq, 0, sizeof(double) * 6 * (size_t)L);
    out->local_ref = local_ref;
    m->attn.precision = precision;
    a->probe = out;
    out->loss = cpu_model_forward(m, tokens, targets);
    cpu_model_backward(m, 1.0f);
    a->probe = NULL;

    m->grads = grads_saved;
    m->attn = attn_saved;
    m->attn_stats = stats_saved;
    attn_delayed_restore(m->attn_delayed, delayed_saved, m->n_delayed);
    memcpy(a->lin.stats, lin_stats_saved, sizeof lin_stats_saved);
    a->lin.gemms = lin_gemms_saved;
    key_centers_restore(&m->key_centers, &centers_saved);
    a->grad_ready = 0;  // the activations are the probe's now: a backward needs a new forward
}

void cpu_model_attention_inputs(CpuModel *m, const int32_t *tokens, const int32_t *targets, int layer, int seq,
                                int head, float *q, float *k, float *v, float *dout) {
    const ModelConfig *mc = &m->cfg.model;
    if (layer < 0 || layer >= mc->n_layer || seq < 0 || seq >= m->B || head < 0 || head >= mc->n_head)
        FATAL("cpu_model_attention_inputs: layer %d, sequence %d, head %d outside the model's %d x %d x %d", layer, seq,
              head, mc->n_layer, m->B, mc->n_head);
    Acts *a = m->acts;
    float *grads_saved = m->grads;
    AttnStats stats_saved = m->attn_stats;
    AttnDelayedState *delayed_saved = attn_delayed_save(m->attn_delayed, m->n_delayed);
    AttnKeyCenters centers_saved = key_centers_save(&m->key_centers);
    Fp8QuantStats lin_stats_saved[3];
    memcpy(lin_stats_saved, a->lin.stats, sizeof lin_stats_saved);
    long long lin_gemms_saved = a->lin.gemms;

    m->grads = falloc(m->table.total);
    AttnCapture cap = {layer, seq, head, dout};
    a->capture = &cap;
    cpu_model_forward(m, tokens, targets);
    size_t th = (size_t)m->T * mc->head_dim;
    long off = ((long)seq * mc->n_head + head) * (long)th;
    const BlockActs *b = &a->block[layer];
    memcpy(q, b->q + off, th * sizeof(float));
    memcpy(k, b->k + off, th * sizeof(float));
    memcpy(v, b->v + off, th * sizeof(float));
    cpu_model_backward(m, 1.0f);
    a->capture = NULL;

    free(m->grads);
    m->grads = grads_saved;
    m->attn_stats = stats_saved;
    attn_delayed_restore(m->attn_delayed, delayed_saved, m->n_delayed);
    key_centers_restore(&m->key_centers, &centers_saved);
    memcpy(a->lin.stats, lin_stats_saved, sizeof lin_stats_saved);
    a->lin.gemms = lin_gemms_saved;
    a->grad_ready = 0;
}
