// config_validate.c: the checks of a resolved Config that go beyond one key's type: ranges,
// enum values, and the rules between fields (head_dim 64 or 128 for the GPU kernels, warmup
// within the run, batch_tokens a multiple of one micro-batch, ...). Every message names the
// config file, the full key and what was expected.
#include <limits.h>   // INT_MAX, LLONG_MAX
#include <math.h>     // INFINITY, isfinite
#include <stdbool.h>  // bool
#include <stdio.h>    // snprintf
#include <string.h>   // strlen

#include "core/config.h"
#include "core/config_names.h"  // the enum name tables, join_quoted

// Validation: ranges and cross-field rules.

static const char *label(const Config *c) { return c->source_path[0] ? c->source_path : "config"; }

static int range_int(const Config *c, const char *key, long long v, long long lo, long long hi, ErrBuf *e) {
    if (v >= lo && v <= hi) return 0;
    if (hi == LLONG_MAX) return errf(e, "%s: %s: must be >= %lld, got %lld", label(c), key, lo, v);
    return errf(e, "%s: %s: must be in [%lld, %lld], got %lld", label(c), key, lo, hi, v);
}

// v in an interval; lo_open/hi_open exclude the end point; hi = INFINITY for no upper bound.
static int range_real(const Config *c, const char *key, double v, double lo, bool lo_open, double hi,
                      bool hi_open, ErrBuf *e) {
    bool ok = isfinite(v) && (lo_open ? v > lo : v >= lo) && (hi_open ? v < hi : v <= hi);
    if (ok) return 0;
    if (isinf(hi)) return errf(e, "%s: %s: must be %s %g, got %.15g", label(c), key, lo_open ? ">" : ">=", lo, v);
    return errf(e, "%s: %s: must be in %c%g, %g%c, got %.15g", label(c), key, lo_open ? '(' : '[', lo, hi,
                hi_open ? ')' : ']', v);
}

static int check_enum(const Config *c, const char *key, int v, const char *const *names, ErrBuf *e) {
    if (v >= 0 && v < count_names(names)) return 0;
    char allowed[256];
    join_quoted(names, allowed, sizeof allowed);
    return errf(e, "%s: %s: invalid value %d; allowed: %s", label(c), key, v, allowed);
}

static bool is_pow2(long long v) { return v > 0 && (v & (v - 1)) == 0; }

static int validate_model(const Config *c, ErrBuf *e) {
    const ModelConfig *m = &c->model;
    if (range_int(c, "model.vocab_size", m->vocab_size, 1, INT_MAX - 127, e) ||
        range_int(c, "model.d_model", m->d_model, 1, 65536, e) ||
        range_int(c, "model.n_layer", m->n_layer, 1, 1024, e) ||  // model.h's ParamTable index
        range_int(c, "model.n_head", m->n_head, 1, 1024, e) ||
        range_int(c, "model.ffn_hidden", m->ffn_hidden, 1, 1 << 20, e) ||
        range_int(c, "model.seq_len", m->seq_len, 1, 1 << 20, e))
        return -1;
    if (m->d_model % m->n_head != 0)
        return errf(e, "%s: model.d_model: %d is not divisible by model.n_head %d", label(c), m->d_model, m->n_head);
    int hd = m->d_model / m->n_head;
    if (hd != 64 && hd != 128) {
        char hint[96] = "";
        if (m->d_model % 128 == 0)
            snprintf(hint, sizeof hint, "; with d_model %d use n_head %d or %d", m->d_model, m->d_model / 64,
                     m->d_model / 128);
        else if (m->d_model % 64 == 0)
            snprintf(hint, sizeof hint, "; with d_model %d use n_head %d", m->d_model, m->d_model / 64);
        return errf(e, "%s: model.n_head: head_dim = d_model / n_head = %d / %d = %d, but the GPU attention "
                    "kernels support only head_dim 64 or 128%s", label(c), m->d_model, m->n_head, hd, hint);
    }
    if (m->head_dim != hd || m->padded_vocab_size != (int)(((long long)m->vocab_size + 127) / 128 * 128))
        return errf(e, "%s: model.head_dim %d / model.padded_vocab_size %d do not match d_model, n_head and "
                    "vocab_size (internal: call config_derive after changing the model shape)",
                    label(c), m->head_dim, m->padded_vocab_size);
    if (check_enum(c, "model.position", (int)m->position, POSITION_NAMES, e) ||
        range_real(c, "model.rope_theta", m->rope_theta, 0, true, INFINITY, false, e) ||
        range_real(c, "model.norm_eps", m->norm_eps, 0, true, INFINITY, false, e) ||
        range_real(c, "model.init_std", m->init_std, 0, true, INFINITY, false, e))
        return -1;
    return 0;
}

static int validate_train(const Config *c, ErrBuf *e) {
    const TrainConfig *t = &c->train;
    if (check_enum(c, "train.device", (int)t->device, DEVICE_NAMES, e) ||
        range_int(c, "train.micro_batch", t->micro_batch, 1, LLONG_MAX, e) ||
        range_int(c, "train.batch_tokens", t->batch_tokens, 0, LLONG_MAX, e) ||
        range_int(c, "train.steps", t->steps, 1, LLONG_MAX, e))
        return -1;
    long long micro_tokens = (long long)t->micro_batch * c->model.seq_len;
    if (t->batch_tokens > 0 && t->batch_tokens % micro_tokens != 0)
        return errf(e, "%s: train.batch_tokens: %lld is not a multiple of train.micro_batch * model.seq_len = "
                    "%d * %d = %lld (the tokens of one micro-batch)", label(c), t->batch_tokens, t->micro_batch,
                    c->model.seq_len, micro_tokens);
    if (range_real(c, "train.lr", t->lr, 0, true, INFINITY, false, e) ||
        range_real(c, "train.min_lr_ratio", t->min_lr_ratio, 0, false, 1, false, e))
        return -1;
    if (t->warmup_steps < 0 || t->warmup_steps > t->steps)
        return errf(e, "%s: train.warmup_steps: must be in [0, train.steps = %d], got %d", label(c), t->steps,
                    t->warmup_steps);
    if (check_enum(c, "train.schedule", (int)t->schedule, SCHEDULE_NAMES, e) ||
        range_real(c, "train.wsd_decay_fraction", t->wsd_decay_fraction, 0, false, 1, false, e) ||
        range_real(c, "train.weight_decay", t->weight_decay, 0, false, INFINITY, false, e) ||
        range_real(c, "train.beta1", t->beta1, 0, false, 1, true, e) ||
        range_real(c, "train.beta2", t->beta2, 0, false, 1, true, e) ||
        range_real(c, "train.eps", t->eps, 0, true, INFINITY, false, e) ||
        range_real(c, "train.grad_clip", t->grad_clip, 0, false, INFINITY, false, e) ||
        range_int(c, "train.threads", t->threads, 0, LLONG_MAX, e) ||
        range_real(c, "train.comm_timeout_s", t->comm_timeout_s, 0, true, 86400, false, e) ||
        range_int(c, "train.max_bad_steps", t->max_bad_steps, 1, 1000000, e))
        return -1;
    if ((double)t->seed > MAX_EXACT_INT || (double)c->data.seed > MAX_EXACT_INT)
        return errf(e, "%s: %s: must be at most 2^53 (JSON numbers are exact only up to there)", label(c),
                    (double)t->seed > MAX_EXACT_INT ? "train.seed" : "data.seed");
    return 0;
}

static int validate_precision(const Config *c, ErrBuf *e) {
    const PrecisionConfig *p = &c->precision;
    if (check_enum(c, "precision.recipe", (int)p->recipe, RECIPE_NAMES, e) ||
        check_enum(c, "precision.attention", (int)p->attention, ATTN_NAMES, e) ||
        check_enum(c, "precision.attention_grad_format", (int)p->attention_grad_format, GRADFMT_NAMES, e) ||
        check_enum(c, "precision.attention_scaling", (int)p->attention_scaling, SCALING_NAMES, e) ||
        check_enum(c, "precision.attention_center_keys", (int)p->attention_center_keys, CENTER_KEYS_NAMES, e) ||
        check_enum(c, "precision.linear", (int)p->linear, LINEAR_NAMES, e) ||
        check_enum(c, "precision.linear_grad_format", (int)p->linear_grad_format, GRADFMT_NAMES, e) ||
        check_enum(c, "precision.linear_wgrad_blocks", (int)p->linear_wgrad_blocks, WGRAD_BLOCKS_NAMES, e) ||
        check_enum(c, "precision.linear_scaling", (int)p->linear_scaling, LINEAR_SCALING_NAMES, e) ||
        range_int(c, "precision.linear_amax_history", p->linear_amax_history, 1, 64, e) ||
        check_enum(c, "precision.linear_fast_accum", (int)p->linear_fast_accum, FAST_ACCUM_NAMES, e))
        return -1;
    if (p->linear_fast_accum != FAST_ACCUM_NONE && p->linear != LINEAR_FP8_TENSOR)
        return errf(e, "%s: precision.linear_fast_accum: \"%s\" needs precision.linear = \"fp8_tensor\" (cuBLASLt always "
                    "promotes block-scaled FP8 sums to FP32), got linear = \"%s\"; use \"none\"", label(c),
                    FAST_ACCUM_NAMES[p->linear_fast_accum], LINEAR_NAMES[p->linear]);
    if (p->linear_scaling == LINEAR_SCALING_DELAYED && p->linear != LINEAR_FP8_TENSOR)
        return errf(e, "%s: precision.linear_scaling: \"delayed\" needs precision.linear = \"fp8_tensor\" (fp8_block's "
                    "scales come from each 1x128 slice or 128x128 block itself), got linear = \"%s\"; use \"current\"",
                    label(c), LINEAR_NAMES[p->linear]);
    if (p->linear_wgrad_blocks != WGRAD_BLOCKS_NONE && p->linear != LINEAR_FP8_BLOCK)
        return errf(e, "%s: precision.linear_wgrad_blocks: \"%s\" needs precision.linear = \"fp8_block\" (it picks "
                    "fp8_block's 128x128 wgrad operand), got linear = \"%s\"; use \"none\"", label(c),
                    WGRAD_BLOCKS_NAMES[p->linear_wgrad_blocks], LINEAR_NAMES[p->linear]);
    // Centred keys and the row-sum correction change what the FP8 modes quantize and how dQ is
    // formed; bf16 and fp32 attention have neither (docs/fp8-attention.md §6).
    if (p->attention_center_keys != CENTER_KEYS_OFF && !attn_precision_is_fp8(p->attention))
        return errf(e, "%s: precision.attention_center_keys: \"%s\" needs an FP8 precision.attention (it sets what "
                    "the FP8 modes quantize), got attention = \"%s\"; use \"off\"", label(c),
                    CENTER_KEYS_NAMES[p->attention_center_keys], ATTN_NAMES[p->attention]);
    if (p->attention_rowsum_correction && !attn_precision_is_fp8(p->attention))
        return errf(e, "%s: precision.attention_rowsum_correction: true needs an FP8 precision.attention (it corrects "
                    "dQ for the row sums of the cast dS), got attention = \"%s\"; use false", label(c),
                    ATTN_NAMES[p->attention]);
    int exponent;
    double v = p->attention_p_scale;
    if (!(isfinite(v) && v >= 1 && v <= 32768 && frexp(v, &exponent) == 0.5))
        return errf(e, "%s: precision.attention_p_scale: must be a power of two in [1, 32768] (the static scale "
                    "of P <= 1 before E4M3 quantization; default 256), got %.15g", label(c), v);
    if (range_int(c, "precision.attention_amax_history", p->attention_amax_history, 1, 64, e)) return -1;
    const char *bkey[2] = {"precision.attention_block_q", "precision.attention_block_k"};
    int bval[2] = {p->attention_block_q, p->attention_block_k};
    for (int i = 0; i < 2; i++)
        if (!is_pow2(bval[i]) || bval[i] < 16 || bval[i] > 256)
            return errf(e, "%s: %s: must be a power of two in [16, 256], got %d", label(c), bkey[i], bval[i]);
    // Keeping more blocks than the model has would be a typo, not a request.
    if (range_int(c, "precision.linear_bf16_first_layers", p->linear_bf16_first_layers, 0, c->model.n_layer, e) ||
        range_int(c, "precision.linear_bf16_last_layers", p->linear_bf16_last_layers, 0, c->model.n_layer, e))
        return -1;
    return 0;
}

int config_validate(const Config *c, ErrBuf *e) {
    if (validate_model(c, e) || validate_train(c, e) || validate_precision(c, e)) return -1;
    if (range_int(c, "eval.interval", c->eval.interval, 0, LLONG_MAX, e) ||
        range_int(c, "eval.batches", c->eval.batches, 1, LLONG_MAX, e) ||
        range_int(c, "eval.sample_interval", c->eval.sample_interval, 0, LLONG_MAX, e) ||
        range_int(c, "eval.sample_tokens", c->eval.sample_tokens, 1, LLONG_MAX, e) ||
        range_int(c, "checkpoint.interval", c->checkpoint.interval, 0, LLONG_MAX, e) ||
        range_int(c, "checkpoint.keep", c->checkpoint.keep, 1, LLONG_MAX, e) ||
        range_int(c, "log.interval", c->log.interval, 1, LLONG_MAX, e) ||
        range_int(c, "diagnostics.interval", c->diagnostics.interval, 0, LLONG_MAX, e) ||
        range_int(c, "diagnostics.bias_probe_batches", c->diagnostics.bias_probe_batches, 0, 1024, e) ||
        check_enum(c, "diagnostics.reference", (int)c->diagnostics.reference, DIAG_REFERENCE_NAMES, e))
        return -1;
    // Data order, passkey mixing and evaluation.
    if (check_enum(c, "data.order", (int)c->data.order, DATA_ORDER_NAMES, e) ||
        range_real(c, "data.passkey_fraction", c->data.passkey_fraction, 0, false, 0.5, false, e) ||
        range_int(c, "eval.passkey_interval", c->eval.passkey_interval, 0, LLONG_MAX, e) ||
        range_int(c, "eval.passkey_samples", c->eval.passkey_samples, 1, 100000, e) ||
        range_int(c, "eval.passkey_min_distance", c->eval.passkey_min_distance, 1, 1 << 20, e))
        return -1;
    if (c->data.passkey_fraction > 0 && c->data.order != DATA_ORDER_MIXED)
        return errf(e, "%s: data.passkey_fraction: %g needs data.order = \"mixed\" (passkey sequences replace rows of "
                    "the mixed order), got order = \"%s\"", label(c), c->data.passkey_fraction,
                    DATA_ORDER_NAMES[c->data.order]);
    // Run files are named <dir>/<file>: leave room for the names below the directories.
    if (c->log.dir[0] == '\0' || strlen(c->log.dir) > 900)
        return errf(e, "%s: log.dir: must be a non-empty path of at most 900 characters", label(c));
    if (c->checkpoint.dir[0] == '\0' || strlen(c->checkpoint.dir) > 900)
        return errf(e, "%s: checkpoint.dir: must be a non-empty path of at most 900 characters", label(c));
    if (c->log.metrics_file[0] == '\0')
        return errf(e, "%s: log.metrics_file: must be a non-empty file name", label(c));
    return 0;
}

