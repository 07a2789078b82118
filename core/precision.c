// precision.c: the host-side helpers of precision.h: attention options from the config,
// delayed scaling's amax histories (shared by attention and the FP8 linears, on both backends),
// and the FP8 linears' groupings and delayed-scaling slots.
#include "core/precision.h"

#include <math.h>    // fmaxf
#include <stdlib.h>  // free
#include <string.h>  // memcpy, memset

#include "core/common.h"  // xmalloc, xcalloc, FATAL

static int ceil_div(int a, int b) { return (a + b - 1) / b; }

// ---------------------------------------------------------------------------------------------
// Recipes.

void precision_recipe_apply(PrecisionConfig *p, PrecisionRecipe r) {
    p->recipe = r;
    switch (r) {
    case RECIPE_NONE: break;
    case RECIPE_BF16:
        p->attention = ATTN_BF16;
        p->linear = LINEAR_BF16;
        break;
    case RECIPE_FP8:
        p->attention = ATTN_FP8_DM;
        p->attention_scaling = SCALING_BLOCK;
        p->attention_keep_codes = 1;
        p->linear = LINEAR_FP8_TENSOR;
        p->linear_scaling = LINEAR_SCALING_DELAYED;
        p->linear_grad_format = GRADFMT_E5M2;
        p->linear_keep_lm_head_bf16 = 0;
        p->linear_fast_accum = FAST_ACCUM_FORWARD;
        break;
    default: FATAL("precision_recipe_apply: unknown recipe %d", (int)r);
    }
}

// ---------------------------------------------------------------------------------------------
// Attention: options and delayed-scaling state.

void attn_options_from_config(AttnOptions *opt, const PrecisionConfig *p) {
    opt->precision = p->attention;
    opt->grad_format = p->attention_grad_format == GRADFMT_E5M2 ? FP8_E5M2 : FP8_E4M3;
    opt->scaling = p->attention_scaling;
    opt->p_scale = (float)p->attention_p_scale;
    opt->block_q = p->attention_block_q;
    opt->block_k = p->attention_block_k;
    opt->center_keys = p->attention_center_keys;
    opt->rowsum_correction = p->attention_rowsum_correction;
}

void attn_key_centers_init(AttnKeyCenters *kc, int n_layer, int n_head, int head_dim) {
    memset(kc, 0, sizeof *kc);
    kc->n_layer = n_layer;
    kc->n_head = n_head;
    kc->head_dim = head_dim;
    long n = attn_key_centers_count(kc);
    kc->center = xcalloc((size_t)(n > 0 ? n : 1), sizeof(float));
    kc->next = xcalloc((size_t)(n > 0 ? n : 1), sizeof(float));
}

void attn_key_centers_free(AttnKeyCenters *kc) {
    free(kc->center);
    free(kc->next);
    memset(kc, 0, sizeof *kc);
}

void attn_key_centers_accumulate(AttnKeyCenters *kc, int layer, int B, int T, const float *k) {
    const int H = kc->n_head, d = kc->head_dim;
    if (layer < 0 || layer >= kc->n_layer || B < 1 || T < 1)
        FATAL("attn_key_centers_accumulate: layer %d of %d, B %d, T %d", layer, kc->n_layer, B, T);
    double *sum = xcalloc((size_t)d, sizeof *sum);  // (d) FP64: the mean does not depend on the order
    for (int h = 0; h < H; h++) {
        memset(sum, 0, (size_t)d * sizeof *sum);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                const float *row = k + (((size_t)b * H + h) * T + t) * d;
                for (int c = 0; c < d; c++) sum[c] += row[c];
            }
        float *out = kc->next + ((size_t)layer * H + h) * d;
        for (int c = 0; c < d; c++) out[c] = bf16_round((float)(sum[c] / ((double)B * T)));
    }
    free(sum);
}

void attn_key_centers_commit(AttnKeyCenters *kc) {
    memcpy(kc->center, kc->next, (size_t)attn_key_centers_count(kc) * sizeof(float));
    kc->ready = 1;
}

void attn_delayed_init(AttnDelayedState *s, int history_len) {
    memset(s, 0, sizeof *s);
    if (history_len < 1) history_len = 1;
    if (history_len > ATTN_MAX_AMAX_HISTORY) history_len = ATTN_MAX_AMAX_HISTORY;
    s->len = history_len;
}

void attn_delayed_commit(AttnDelayedState *s) {
    if (s->len < 1 || s->len > ATTN_MAX_AMAX_HISTORY)
        FATAL("attn_delayed_commit: history length %d (hint: call attn_delayed_init first)", s->len);
    for (int t = 0; t < 4; t++) {
        s->hist[t][s->pos] = s->cur_amax[t];
        s->cur_amax[t] = 0.0f;
    }
    s->pos = (s->pos + 1) % s->len;
    if (s->filled < s->len) s->filled++;
}

AttnDelayedState *attn_delayed_save(const AttnDelayedState *s, int n) {
    AttnDelayedState *c = xmalloc((size_t)(n > 0 ? n : 1) * sizeof *c);
    if (n > 0) memcpy(c, s, (size_t)n * sizeof *c);
    return c;
}
void attn_delayed_restore(AttnDelayedState *s, AttnDelayedState *saved, int n) {
    if (n > 0) memcpy(s, saved, (size_t)n * sizeof *s);
    free(saved);
}

float attn_delayed_amax(const AttnDelayedState *s, int tensor) {
    if (s->filled < 1 || s->filled > ATTN_MAX_AMAX_HISTORY || tensor < 0 || tensor > 3)
        FATAL("attn_delayed_amax: a history of %d entries, tensor %d (hint: an empty history has no maximum: the "
              "first step scales from the tensor itself)", s->filled, tensor);
    float h = 0.0f;
    for (int i = 0; i < s->filled; i++) h = fmaxf(h, s->hist[tensor][i]);
    return h;
}

void attn_delayed_scales(const AttnDelayedState *s, Fp8Format grad_format, float scale[4]) {
    if (s->filled < 1 || s->filled > ATTN_MAX_AMAX_HISTORY)
        FATAL("attn_delayed_scales: a history of %d entries (hint: the first step takes per-head scales)", s->filled);
    for (int t = 0; t < 4; t++) scale[t] = fp8_scale_for_amax_within(t == CAST_DO ? grad_format : FP8_E4M3, attn_delayed_amax(s, t),
                                             attn_scale_max_exp((AttnCast)t));
}

// ---------------------------------------------------------------------------------------------
// FP8 linears.

long fp8_group_count(Fp8Grouping g, int rows, int cols) {
    switch (g) {
    case FP8_GROUP_TENSOR: return 1;
    case FP8_GROUP_1x128: return (long)rows * ceil_div(cols, FP8_GROUP);
    case FP8_GROUP_128x128: return (long)ceil_div(rows, FP8_GROUP) * ceil_div(cols, FP8_GROUP);
    }
    FATAL("fp8_group_count: unknown grouping %d", (int)g);
}

LinearPrecision linear_precision_of(const PrecisionConfig *p, int n_layer, int layer) {
    if (p->linear == LINEAR_BF16) return LINEAR_BF16;
    if (layer < 0) return p->linear_keep_lm_head_bf16 ? LINEAR_BF16 : p->linear;
    if (layer < p->linear_bf16_first_layers || layer >= n_layer - p->linear_bf16_last_layers)
        return LINEAR_BF16;
    return p->linear;
}

Fp8Grouping linear_act_grouping(LinearPrecision p) {
    return p == LINEAR_FP8_TENSOR ? FP8_GROUP_TENSOR : FP8_GROUP_1x128;
}
Fp8Grouping linear_weight_grouping(LinearPrecision p) {
    return p == LINEAR_FP8_TENSOR ? FP8_GROUP_TENSOR : FP8_GROUP_128x128;
}
Fp8Grouping linear_dyt_grouping(LinearPrecision p, WgradBlocks b) {
    if (p == LINEAR_FP8_TENSOR) return FP8_GROUP_TENSOR;
    return b == WGRAD_BLOCKS_GRADIENT ? FP8_GROUP_128x128 : FP8_GROUP_1x128;
}
Fp8Grouping linear_xt_grouping(LinearPrecision p, WgradBlocks b) {
    if (p == LINEAR_FP8_TENSOR) return FP8_GROUP_TENSOR;
    return b == WGRAD_BLOCKS_ACTIVATION ? FP8_GROUP_128x128 : FP8_GROUP_1x128;
}
void linear_wgrad_groupings(LinearPrecision p, WgradBlocks b, Fp8Grouping *dyt, Fp8Grouping *xt) {
    *dyt = linear_dyt_grouping(p, b);
    *xt = linear_xt_grouping(p, b);
}

void linear_delayed_slot(int site, int role, int *state, int *tensor) {
    if (site < 0 || (role != LINEAR_ROLE_X && role != LINEAR_ROLE_DY))
        FATAL("linear_delayed_slot: site %d role %d (hint: a block's linear has site 4 * layer + i, role 0 or 1)",
              site, role);
    *state = site / 2;
    *tensor = 2 * (site % 2) + role;
}

int linear_delayed_on(const PrecisionConfig *p) {
    return p->linear == LINEAR_FP8_TENSOR && p->linear_scaling == LINEAR_SCALING_DELAYED;
}

AttnDelayedState *delayed_states_new(const PrecisionConfig *p, int n_layer, int with_attention, int *n) {
    const int lin = linear_delayed_on(p);
    *n = (with_attention || lin ? n_layer : 0) + (lin ? 2 * n_layer : 0);
    if (*n == 0) return NULL;
    AttnDelayedState *s = xcalloc((size_t)*n, sizeof(AttnDelayedState));
    for (int j = 0; j < *n; j++)
        attn_delayed_init(&s[j], j < LINEAR_DELAYED_FIRST(n_layer) ? p->attention_amax_history : p->linear_amax_history);
    return s;
}
