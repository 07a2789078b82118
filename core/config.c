// config.c: the run configuration: JSON (cJSON) -> typed Config, strict validation with
// messages that name the file and the key, "section.key=value" overrides, and the resolved
// config written back as JSON (every key, stable order) so that a run records what it used.
//
// One table (SECTIONS below) lists every key with its type and its place in Config. Reading,
// the unknown-key messages and config_to_json all walk that table, so they cannot disagree.
// Ranges and cross-field rules live in config_validate, which also checks configs built in code.
#include "core/config.h"
#include "core/config_names.h"  // the enum name tables shared with config_validate.c

#include <cjson/cJSON.h>  // the JSON parser
#include <limits.h>       // INT_MIN, INT_MAX, LLONG_MAX
#include <math.h>         // floor, isfinite, frexp, INFINITY
#include <stdbool.h>      // bool
#include <stddef.h>       // offsetof
#include <string.h>       // strcmp, strlen, memset, memcpy

// Enum fields are written through an int pointer, so every enum must be int-sized.
_Static_assert(sizeof(DeviceKind) == sizeof(int), "enum size");
_Static_assert(sizeof(PositionKind) == sizeof(int), "enum size");
_Static_assert(sizeof(ScheduleKind) == sizeof(int), "enum size");
_Static_assert(sizeof(AttnPrecision) == sizeof(int), "enum size");
_Static_assert(sizeof(GradFormat) == sizeof(int), "enum size");
_Static_assert(sizeof(ScalingKind) == sizeof(int), "enum size");
_Static_assert(sizeof(AttnCenterKeys) == sizeof(int), "enum size");
_Static_assert(sizeof(LinearPrecision) == sizeof(int), "enum size");
_Static_assert(sizeof(WgradBlocks) == sizeof(int), "enum size");
_Static_assert(sizeof(LinearScaling) == sizeof(int), "enum size");
_Static_assert(sizeof(PrecisionRecipe) == sizeof(int), "enum size");
_Static_assert(sizeof(DataOrder) == sizeof(int), "enum size");

// ---------------------------------------------------------------------------------------------
// Enum names, indexed by the enum value, NULL-terminated.
const char *const DEVICE_NAMES[] = {"auto", "cpu", "gpu", NULL};
const char *const POSITION_NAMES[] = {"rope", "none", NULL};
const char *const SCHEDULE_NAMES[] = {"cosine", "linear", "wsd", "constant", NULL};
const char *const ATTN_NAMES[] = {"fp32",   "bf16",          "fp8_naive",     "fp8_hybrid",
                                         "fp8_dm", "fp8_dm_approx", "fp8_hybrid_dm", NULL};
const char *const GRADFMT_NAMES[] = {"e4m3", "e5m2", NULL};
const char *const SCALING_NAMES[] = {"block", "delayed", NULL};
const char *const CENTER_KEYS_NAMES[] = {"off", "mean", "delayed", NULL};
const char *const LINEAR_NAMES[] = {"bf16", "fp8_tensor", "fp8_block", NULL};
const char *const WGRAD_BLOCKS_NAMES[] = {"none", "activation", "gradient", NULL};
const char *const LINEAR_SCALING_NAMES[] = {"current", "delayed", NULL};
const char *const FAST_ACCUM_NAMES[] = {"none", "forward", "all", NULL};
const char *const RECIPE_NAMES[] = {"none", "bf16", "fp8", NULL};
const char *const DATA_ORDER_NAMES[] = {"mixed", "shards", NULL};

int count_names(const char *const *names) {
    int n = 0;
    while (names[n]) n++;
    return n;
}
static const char *enum_name(const char *const *names, int v) {
    return (v >= 0 && v < count_names(names)) ? names[v] : "?";
}
static int enum_index(const char *const *names, const char *s) {
    for (int i = 0; names[i]; i++)
        if (strcmp(names[i], s) == 0) return i;
    return -1;
}

const char *attn_precision_name(AttnPrecision p) { return enum_name(ATTN_NAMES, (int)p); }
const char *grad_format_name(GradFormat f) { return enum_name(GRADFMT_NAMES, (int)f); }
const char *scaling_name(ScalingKind s) { return enum_name(SCALING_NAMES, (int)s); }
const char *schedule_name(ScheduleKind s) { return enum_name(SCHEDULE_NAMES, (int)s); }
const char *linear_precision_name(LinearPrecision p) { return enum_name(LINEAR_NAMES, (int)p); }
const char *device_name(DeviceKind d) { return enum_name(DEVICE_NAMES, (int)d); }

int attn_precision_from_name(const char *s, AttnPrecision *out) {
    int i = s ? enum_index(ATTN_NAMES, s) : -1;
    if (i < 0) return -1;
    *out = (AttnPrecision)i;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// The key table.
typedef enum { KIND_INT, KIND_I64, KIND_U64, KIND_F64, KIND_BOOL, KIND_STR, KIND_ENUM } KeyKind;

typedef struct {
    const char *name;           // the JSON key
    KeyKind kind;
    size_t offset;              // of the field in Config
    size_t size;                // of the field (for strings: the capacity, NUL included)
    const char *const *values;  // KIND_ENUM: the allowed names
    bool required;              // no default: the file (or a --set) must give it
} KeyDef;

#define FIELD(sec, f) offsetof(Config, sec.f), sizeof(((Config *)0)->sec.f)
#define KEY(sec, f, kind) {#f, kind, FIELD(sec, f), NULL, false}
#define KEY_REQUIRED(sec, f) {#f, KIND_INT, FIELD(sec, f), NULL, true}
#define KEY_ENUM(sec, f, names) {#f, KIND_ENUM, FIELD(sec, f), names, false}

static const KeyDef MODEL_KEYS[] = {
    KEY(model, vocab_size, KIND_INT),   KEY_REQUIRED(model, d_model),
    KEY_REQUIRED(model, n_layer),       KEY_REQUIRED(model, n_head),
    KEY_REQUIRED(model, ffn_hidden),    KEY_REQUIRED(model, seq_len),
    KEY_ENUM(model, position, POSITION_NAMES),
    KEY(model, rope_theta, KIND_F64),   KEY(model, qk_norm, KIND_BOOL),
    KEY(model, tied_embeddings, KIND_BOOL),
    KEY(model, norm_eps, KIND_F64),     KEY(model, init_std, KIND_F64),
};
static const KeyDef DATA_KEYS[] = {
    KEY(data, train, KIND_STR), KEY(data, val, KIND_STR),
    KEY(data, shuffle, KIND_BOOL), KEY(data, seed, KIND_U64),
    KEY_ENUM(data, order, DATA_ORDER_NAMES), KEY(data, passkey_fraction, KIND_F64),
};
static const KeyDef TRAIN_KEYS[] = {
    KEY_ENUM(train, device, DEVICE_NAMES), KEY(train, micro_batch, KIND_INT),
    KEY(train, batch_tokens, KIND_I64),    KEY(train, steps, KIND_INT),
    KEY(train, lr, KIND_F64),              KEY(train, min_lr_ratio, KIND_F64),
    KEY(train, warmup_steps, KIND_INT),    KEY_ENUM(train, schedule, SCHEDULE_NAMES),
    KEY(train, wsd_decay_fraction, KIND_F64),
    KEY(train, weight_decay, KIND_F64),    KEY(train, beta1, KIND_F64),
    KEY(train, beta2, KIND_F64),           KEY(train, eps, KIND_F64),
    KEY(train, grad_clip, KIND_F64),       KEY(train, seed, KIND_U64),
    KEY(train, recompute, KIND_BOOL),      KEY(train, threads, KIND_INT),
    KEY(train, zero1, KIND_BOOL),          KEY(train, comm_timeout_s, KIND_F64),
    KEY(train, overlap_comm, KIND_BOOL),
    KEY(train, max_bad_steps, KIND_INT),
};
static const KeyDef PRECISION_KEYS[] = {
    KEY_ENUM(precision, recipe, RECIPE_NAMES),
    KEY_ENUM(precision, attention, ATTN_NAMES),
    KEY_ENUM(precision, attention_grad_format, GRADFMT_NAMES),
    KEY_ENUM(precision, attention_scaling, SCALING_NAMES),
    KEY(precision, attention_p_scale, KIND_F64),
    KEY(precision, attention_amax_history, KIND_INT),
    KEY(precision, attention_block_q, KIND_INT),
    KEY(precision, attention_block_k, KIND_INT),
    KEY(precision, attention_keep_codes, KIND_BOOL),
    KEY_ENUM(precision, attention_center_keys, CENTER_KEYS_NAMES),
    KEY(precision, attention_rowsum_correction, KIND_BOOL),
    KEY_ENUM(precision, linear, LINEAR_NAMES),
    KEY_ENUM(precision, linear_grad_format, GRADFMT_NAMES),
    KEY(precision, linear_keep_lm_head_bf16, KIND_BOOL),
    KEY(precision, linear_bf16_first_layers, KIND_INT),
    KEY(precision, linear_bf16_last_layers, KIND_INT),
    KEY_ENUM(precision, linear_wgrad_blocks, WGRAD_BLOCKS_NAMES),
    KEY_ENUM(precision, linear_scaling, LINEAR_SCALING_NAMES),
    KEY(precision, linear_amax_history, KIND_INT),
    KEY_ENUM(precision, linear_fast_accum, FAST_ACCUM_NAMES),
    KEY(precision, fuse_fp8_producers, KIND_BOOL),
    KEY(precision, fuse_attention_rope, KIND_BOOL),
    KEY(precision, fuse_qkv_epilogue, KIND_BOOL),
};
static const KeyDef EVAL_KEYS[] = {
    KEY(eval, interval, KIND_INT), KEY(eval, batches, KIND_INT),
    KEY(eval, sample_interval, KIND_INT), KEY(eval, sample_tokens, KIND_INT),
    KEY(eval, passkey_interval, KIND_INT), KEY(eval, passkey_samples, KIND_INT),
    KEY(eval, passkey_min_distance, KIND_INT),
};
static const KeyDef CHECKPOINT_KEYS[] = {
    KEY(checkpoint, dir, KIND_STR), KEY(checkpoint, interval, KIND_INT),
    KEY(checkpoint, keep, KIND_INT), KEY(checkpoint, at_end, KIND_BOOL),
};
static const KeyDef LOG_KEYS[] = {
    KEY(log, dir, KIND_STR), KEY(log, interval, KIND_INT), KEY(log, metrics_file, KIND_STR),
};
const char *const DIAG_REFERENCE_NAMES[] = {"fp32", "bf16", NULL};  // AttnPrecision 0 and 1
static const KeyDef DIAGNOSTICS_KEYS[] = {
    KEY(diagnostics, interval, KIND_INT), KEY(diagnostics, bias_probe_batches, KIND_INT),
    KEY_ENUM(diagnostics, reference, DIAG_REFERENCE_NAMES),
};

typedef struct {
    const char *name;
    const KeyDef *keys;
    int n_keys;
} SectionDef;

#define SECTION(name, keys) {name, keys, (int)(sizeof(keys) / sizeof(keys[0]))}
static const SectionDef SECTIONS[] = {
    SECTION("model", MODEL_KEYS),   SECTION("data", DATA_KEYS),
    SECTION("train", TRAIN_KEYS),   SECTION("precision", PRECISION_KEYS),
    SECTION("eval", EVAL_KEYS),     SECTION("checkpoint", CHECKPOINT_KEYS),
    SECTION("log", LOG_KEYS),       SECTION("diagnostics", DIAGNOSTICS_KEYS),
};
#define N_SECTIONS ((int)(sizeof(SECTIONS) / sizeof(SECTIONS[0])))
#define MAX_KEYS 32  // per section, for the "seen" flags
#define TOP_LEVEL_NAMES "description, model, data, train, precision, eval, checkpoint, log, diagnostics"


static const SectionDef *find_section(const char *name) {
    for (int s = 0; s < N_SECTIONS; s++)
        if (strcmp(SECTIONS[s].name, name) == 0) return &SECTIONS[s];
    return NULL;
}
static int find_key(const SectionDef *s, const char *name) {
    for (int k = 0; k < s->n_keys; k++)
        if (strcmp(s->keys[k].name, name) == 0) return k;
    return -1;
}

// ---------------------------------------------------------------------------------------------
// Defaults and derived values.
void config_defaults(Config *c) {
    memset(c, 0, sizeof *c);  // also zeroes padding, so two equal configs compare equal bytewise
    ModelConfig *m = &c->model;
    m->vocab_size = 50257;
    m->position = POS_ROPE;
    m->rope_theta = 10000.0;
    m->qk_norm = 0;
    m->tied_embeddings = 0;
    m->norm_eps = 1e-5;
    m->init_std = 0.02;
    c->data.shuffle = 1;
    c->data.seed = 1337;
    TrainConfig *t = &c->train;
    t->device = DEVICE_AUTO;
    t->micro_batch = 8;
    t->batch_tokens = 0;
    t->steps = 1000;
    t->lr = 6e-4;
    t->min_lr_ratio = 0.1;
    t->warmup_steps = 0;
    t->schedule = SCHED_COSINE;
    t->wsd_decay_fraction = 0.2;
    t->weight_decay = 0.1;
    t->beta1 = 0.9;
    t->beta2 = 0.95;
    t->eps = 1e-8;
    t->grad_clip = 1.0;
    t->seed = 42;
    t->recompute = 0;
    t->threads = 0;
    t->zero1 = 0;
    t->comm_timeout_s = 60.0;
    t->overlap_comm = 1;
    t->max_bad_steps = 5;
    c->diagnostics.interval = 0;
    c->diagnostics.bias_probe_batches = 8;
    c->diagnostics.reference = ATTN_BF16;
    PrecisionConfig *p = &c->precision;
    p->attention = ATTN_BF16;
    p->attention_grad_format = GRADFMT_E4M3;
    p->attention_scaling = SCALING_BLOCK;
    p->attention_p_scale = 256.0;
    p->attention_amax_history = 16;
    p->attention_block_q = 128;
    p->attention_block_k = 128;
    p->attention_keep_codes = 1;
    p->attention_center_keys = CENTER_KEYS_OFF;
    p->attention_rowsum_correction = 0;
    p->linear = LINEAR_BF16;
    p->linear_grad_format = GRADFMT_E4M3;
    p->linear_keep_lm_head_bf16 = 1;
    p->linear_bf16_first_layers = 0;
    p->linear_bf16_last_layers = 0;
    p->linear_wgrad_blocks = WGRAD_BLOCKS_NONE;
    p->linear_scaling = LINEAR_SCALING_CURRENT;
    p->linear_amax_history = 16;
    p->linear_fast_accum = FAST_ACCUM_NONE;
    p->fuse_fp8_producers = 1;
    p->fuse_attention_rope = 1;
    p->fuse_qkv_epilogue = 1;
    c->eval.interval = 100;
    c->eval.batches = 10;
    c->eval.sample_interval = 0;
    c->eval.sample_tokens = 64;
    c->data.order = DATA_ORDER_MIXED;
    c->data.passkey_fraction = 0.0;
    c->eval.passkey_interval = 0;
    c->eval.passkey_samples = 32;
    c->eval.passkey_min_distance = 512;
    c->checkpoint.interval = 0;
    c->checkpoint.keep = 3;
    c->checkpoint.at_end = 1;
    c->log.interval = 1;
    snprintf(c->log.metrics_file, sizeof c->log.metrics_file, "metrics.jsonl");
}

// Copies s into a fixed field, zeroing the rest so that byte comparisons stay meaningful.
static void set_string_field(char *dst, size_t cap, const char *s) {
    memset(dst, 0, cap);
    snprintf(dst, cap, "%s", s);
}

void config_derive(Config *c) {
    ModelConfig *m = &c->model;
    m->padded_vocab_size = m->vocab_size > 0 ? (int)(((long long)m->vocab_size + 127) / 128 * 128) : 0;
    m->head_dim = (m->n_head > 0 && m->d_model % m->n_head == 0) ? m->d_model / m->n_head : 0;
    if (c->log.dir[0] == '\0') {
        // runs/<config file name without directory and .json>, or runs/default
        const char *base = strrchr(c->source_path, '/');
        base = base ? base + 1 : c->source_path;
        size_t n = strlen(base);
        if (n >= 5 && strcmp(base + n - 5, ".json") == 0) n -= 5;
        if (n > 1000) n = 1000;
        memset(c->log.dir, 0, sizeof c->log.dir);
        if (n == 0) snprintf(c->log.dir, sizeof c->log.dir, "runs/default");
        else snprintf(c->log.dir, sizeof c->log.dir, "runs/%.*s", (int)n, base);
    }
    if (c->checkpoint.dir[0] == '\0') {  // (config_validate limits log.dir to 900 characters)
        memset(c->checkpoint.dir, 0, sizeof c->checkpoint.dir);
        snprintf(c->checkpoint.dir, sizeof c->checkpoint.dir, "%.1000s/checkpoints", c->log.dir);
    }
}

// ---------------------------------------------------------------------------------------------
// Reading one value.

// "string \"12\"", "number 12.5", "boolean true", "null", "an array", "an object".
static void describe_json(const cJSON *v, char *out, size_t cap) {
    if (cJSON_IsString(v)) {
        size_t n = strlen(v->valuestring);
        snprintf(out, cap, "string \"%.60s%s\"", v->valuestring, n > 60 ? "..." : "");
    } else if (cJSON_IsNumber(v)) snprintf(out, cap, "number %.15g", v->valuedouble);
    else if (cJSON_IsBool(v)) snprintf(out, cap, "boolean %s", cJSON_IsTrue(v) ? "true" : "false");
    else if (cJSON_IsNull(v)) snprintf(out, cap, "null");
    else if (cJSON_IsArray(v)) snprintf(out, cap, "an array");
    else if (cJSON_IsObject(v)) snprintf(out, cap, "an object");
    else snprintf(out, cap, "an invalid value");
}

// "a", "b", "c" of an enum, for messages.
void join_quoted(const char *const *names, char *out, size_t cap) {
    size_t len = 0;
    out[0] = '\0';
    for (int i = 0; names[i] && len < cap; i++)
        len += (size_t)snprintf(out + len, cap - len, "%s\"%s\"", i ? ", " : "", names[i]);
}

// Sets one key from a JSON value. where names it in messages: "model.n_head", or
// "model.n_head (from --set model.n_head=x)".
static int set_key(Config *c, const KeyDef *k, const cJSON *v, const char *file, const char *where,
                   ErrBuf *e) {
    void *field = (char *)c + k->offset;
    char got[128];
    describe_json(v, got, sizeof got);
    double d = cJSON_IsNumber(v) ? v->valuedouble : 0.0;
    bool integral = cJSON_IsNumber(v) && isfinite(d) && d == floor(d);
    switch (k->kind) {
    case KIND_INT:
        if (!integral) return errf(e, "%s: %s: expected an integer, got %s", file, where, got);
        if (d < INT_MIN || d > INT_MAX)
            return errf(e, "%s: %s: expected an integer in [%d, %d], got %s", file, where, INT_MIN, INT_MAX, got);
        *(int *)field = (int)d;
        return 0;
    case KIND_I64:
    case KIND_U64: {
        double lo = k->kind == KIND_U64 ? 0.0 : -MAX_EXACT_INT;
        if (!integral) return errf(e, "%s: %s: expected an integer, got %s", file, where, got);
        if (d < lo || d > MAX_EXACT_INT)
            return errf(e, "%s: %s: expected an integer in [%.0f, %.0f] (JSON numbers are exact up to 2^53), got %s",
                        file, where, lo, MAX_EXACT_INT, got);
        if (k->kind == KIND_U64) *(unsigned long long *)field = (unsigned long long)d;
        else *(long long *)field = (long long)d;
        return 0;
    }
    case KIND_F64:
        if (!cJSON_IsNumber(v)) return errf(e, "%s: %s: expected a number, got %s", file, where, got);
        if (!isfinite(d)) return errf(e, "%s: %s: expected a finite number, got %s", file, where, got);
        *(double *)field = d;
        return 0;
    case KIND_BOOL:
        if (!cJSON_IsBool(v)) return errf(e, "%s: %s: expected true or false, got %s", file, where, got);
        *(int *)field = cJSON_IsTrue(v) ? 1 : 0;
        return 0;
    case KIND_STR:
        if (!cJSON_IsString(v)) return errf(e, "%s: %s: expected a string, got %s", file, where, got);
        if (strlen(v->valuestring) >= k->size)
            return errf(e, "%s: %s: is too long (%zu characters; at most %zu)", file, where,
                        strlen(v->valuestring), k->size - 1);
        set_string_field(field, k->size, v->valuestring);
        return 0;
    case KIND_ENUM: {
        char allowed[256];
        join_quoted(k->values, allowed, sizeof allowed);
        int i = cJSON_IsString(v) ? enum_index(k->values, v->valuestring) : -1;
        if (i < 0) return errf(e, "%s: %s: expected one of %s, got %s", file, where, allowed, got);
        *(int *)field = i;
        return 0;
    }
    }
    FATAL("config key %s has an unknown kind %d", k->name, (int)k->kind);
}

// Edit distance, for "did you mean" hints (names are short; longer ones get no hint).
static int edit_distance(const char *a, const char *b) {
    size_t na = strlen(a), nb = strlen(b);
    if (na > 63 || nb > 63) return 99;
    int row[64];
    for (size_t j = 0; j <= nb; j++) row[j] = (int)j;
    for (size_t i = 1; i <= na; i++) {
        int diag = row[0];
        row[0] = (int)i;
        for (size_t j = 1; j <= nb; j++) {
            int up = row[j];
            int best = diag + (a[i - 1] != b[j - 1]);
            if (up + 1 < best) best = up + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diag = up;
        }
    }
    return row[nb];
}

// "; did you mean lr?" when one allowed name is close to the unknown one, else "".
static void did_you_mean(const char *unknown, const char *const *names, int n, char *out, size_t cap) {
    int best = 3, best_i = -1;
    for (int i = 0; i < n; i++) {
        int d = edit_distance(unknown, names[i]);
        if (d < best) best = d, best_i = i;
    }
    if (best_i >= 0) snprintf(out, cap, " (did you mean %s?)", names[best_i]);
    else out[0] = '\0';
}

static int unknown_key(const SectionDef *s, const char *name, const char *file, const char *from, ErrBuf *e) {
    const char *names[MAX_KEYS];
    char allowed[512], hint[96];
    size_t len = 0;
    allowed[0] = '\0';
    for (int k = 0; k < s->n_keys; k++) {
        names[k] = s->keys[k].name;
        len += (size_t)snprintf(allowed + len, sizeof allowed - len, "%s%s", k ? ", " : "", names[k]);
        if (len >= sizeof allowed) break;
    }
    did_you_mean(name, names, s->n_keys, hint, sizeof hint);
    return errf(e, "%s: %s.%s%s: unknown key%s; allowed keys in %s: %s", file, s->name, name, from, hint,
                s->name, allowed);
}

static int unknown_section(const char *name, const char *file, const char *from, ErrBuf *e) {
    const char *names[N_SECTIONS + 1] = {"description"};
    for (int s = 0; s < N_SECTIONS; s++) names[s + 1] = SECTIONS[s].name;
    char hint[96];
    did_you_mean(name, names, N_SECTIONS + 1, hint, sizeof hint);
    return errf(e, "%s: %s%s: unknown section%s; allowed at the top level: %s", file, name, from, hint,
                TOP_LEVEL_NAMES);
}

// ---------------------------------------------------------------------------------------------
// Reading a whole document.

// Which keys were given (file or --set), to find missing required ones and duplicates.
typedef struct {
    bool key[N_SECTIONS][MAX_KEYS];
    bool section[N_SECTIONS];
    bool description;
} Seen;

static int read_section(Config *c, int s, const cJSON *obj, const char *file, Seen *seen, ErrBuf *e) {
    const SectionDef *sec = &SECTIONS[s];
    char got[128];
    if (!cJSON_IsObject(obj)) {
        describe_json(obj, got, sizeof got);
        return errf(e, "%s: %s: expected an object {\"key\": value, ...}, got %s", file, sec->name, got);
    }
    for (const cJSON *item = obj->child; item; item = item->next) {
        int k = find_key(sec, item->string);
        if (k < 0) return unknown_key(sec, item->string, file, "", e);
        if (seen->key[s][k]) return errf(e, "%s: %s.%s: appears twice", file, sec->name, item->string);
        seen->key[s][k] = true;
        char where[128];
        snprintf(where, sizeof where, "%s.%s", sec->name, item->string);
        if (set_key(c, &sec->keys[k], item, file, where, e)) return -1;
    }
    return 0;
}

// Line and column (1-based) of position at within text.
static void line_col(const char *text, const char *at, int *line, int *col) {
    *line = 1, *col = 1;
    for (const char *p = text; p < at && *p; p++) {
        if (*p == '\n') (*line)++, *col = 1;
        else (*col)++;
    }
}

static int parse_error(const char *text, const char *at, const char *file, ErrBuf *e) {
    if (!at) at = text + strlen(text);
    int line, col;
    line_col(text, at, &line, &col);
    const char *rest = at;
    while (*rest == ' ' || *rest == '\t' || *rest == '\r' || *rest == '\n') rest++;
    if (*rest == '\0' || at[1] == '\0')
        return errf(e, "%s: invalid JSON at line %d, column %d, at the end of the file (is it truncated, or a "
                    "brace or bracket unclosed?)", file, line, col);
    char near[32];
    size_t n = 0;
    for (const char *p = at; *p && n < 20; p++) near[n++] = (*p == '\n' || *p == '\t' || *p == '\r') ? ' ' : *p;
    near[n] = '\0';
    return errf(e, "%s: invalid JSON at line %d, column %d, near '%s' (look for a missing comma or quote, "
                "a trailing comma, or a comment: JSON has none)", file, line, col, near);
}

static int read_document(Config *c, const char *text, const char *file, Seen *seen, ErrBuf *e) {
    const char *p = text;
    if ((unsigned char)p[0] == 0xEF && (unsigned char)p[1] == 0xBB && (unsigned char)p[2] == 0xBF) p += 3;
    const char *q = p;
    while (*q == ' ' || *q == '\t' || *q == '\r' || *q == '\n') q++;
    if (*q == '\0')
        return errf(e, "%s: is empty; expected a JSON object such as {\"model\": {\"d_model\": 128, ...}}", file);
    const char *end = NULL;
    cJSON *root = cJSON_ParseWithOpts(p, &end, 1);
    if (!root) return parse_error(p, end, file, e);
    int rc = 0;
    char got[128];
    if (!cJSON_IsObject(root)) {
        describe_json(root, got, sizeof got);
        rc = errf(e, "%s: expected a JSON object at the top level ({\"model\": {...}, ...}), got %s", file, got);
    }
    for (const cJSON *item = root->child; item && rc == 0 && cJSON_IsObject(root); item = item->next) {
        if (strcmp(item->string, "description") == 0) {
            if (seen->description) rc = errf(e, "%s: description: appears twice", file);
            else {
                seen->description = true;
                KeyDef desc = {"description", KIND_STR, offsetof(Config, description), sizeof c->description, NULL, false};
                rc = set_key(c, &desc, item, file, "description", e);
            }
            continue;
        }
        const SectionDef *sec = find_section(item->string);
        if (!sec) rc = unknown_section(item->string, file, "", e);
        else if (seen->section[sec - SECTIONS]) rc = errf(e, "%s: %s: section appears twice", file, sec->name);
        else {
            seen->section[sec - SECTIONS] = true;
            rc = read_section(c, (int)(sec - SECTIONS), item, file, seen, e);
        }
    }
    cJSON_Delete(root);
    return rc;
}

// One "section.key=value" override. The value is JSON when it parses as JSON (3e-4, true,
// "quoted"), else the raw text; string keys always take the raw text unless it is a JSON string,
// so that --set log.dir=2024 means the directory "2024".
static int apply_override(Config *c, const char *ov, const char *file, Seen *seen, ErrBuf *e) {
    const char *eq = strchr(ov, '=');
    const char *dot = eq ? memchr(ov, '.', (size_t)(eq - ov)) : NULL;
    if (!eq || !dot || dot == ov || dot + 1 == eq)
        return errf(e, "%s: --set %s: expected section.key=value (for example train.lr=3e-4)", file, ov);
    char sec_name[64], key_name[64];
    snprintf(sec_name, sizeof sec_name, "%.*s", (int)(dot - ov), ov);
    snprintf(key_name, sizeof key_name, "%.*s", (int)(eq - dot - 1), dot + 1);
    char from[160];
    snprintf(from, sizeof from, " (from --set %.120s)", ov);
    const SectionDef *sec = find_section(sec_name);
    if (!sec) return unknown_section(sec_name, file, from, e);
    int k = find_key(sec, key_name);
    if (k < 0) return unknown_key(sec, key_name, file, from, e);
    const KeyDef *key = &sec->keys[k];
    const char *raw = eq + 1;
    cJSON *v = cJSON_ParseWithOpts(raw, NULL, 1);
    if (!v || ((key->kind == KIND_STR || key->kind == KIND_ENUM) && !cJSON_IsString(v))) {
        cJSON_Delete(v);
        v = cJSON_CreateString(raw);
        if (!v) FATAL("cJSON_CreateString failed (out of memory?)");
    }
    char where[256];
    snprintf(where, sizeof where, "%s.%s%s", sec->name, key->name, from);
    int rc = set_key(c, key, v, file, where, e);
    cJSON_Delete(v);
    seen->key[sec - SECTIONS][k] = true;
    return rc;
}

int config_parse(const char *json_text, const char *name, const char *const *overrides, int n_overrides,
                 Config *out, ErrBuf *e) {
    Config c;
    config_defaults(&c);
    set_string_field(c.source_path, sizeof c.source_path, name ? name : "");
    const char *file = (name && name[0]) ? name : "config";
    Seen seen;
    memset(&seen, 0, sizeof seen);
    if (!json_text) return errf(e, "%s: no JSON text", file);
    if (read_document(&c, json_text, file, &seen, e)) return -1;
    for (int i = 0; i < n_overrides; i++)
        if (apply_override(&c, overrides[i], file, &seen, e)) return -1;
    // precision.recipe (the file's, or the last --set's) sets its keys before the keys given:
    // read again over the recipe's values, so that every key given explicitly wins.
    const PrecisionRecipe recipe = c.precision.recipe;
    if (recipe != RECIPE_NONE) {
        config_defaults(&c);
        set_string_field(c.source_path, sizeof c.source_path, name ? name : "");
        precision_recipe_apply(&c.precision, recipe);
        memset(&seen, 0, sizeof seen);
        if (read_document(&c, json_text, file, &seen, e)) return -1;
        for (int i = 0; i < n_overrides; i++)
            if (apply_override(&c, overrides[i], file, &seen, e)) return -1;
    }
    for (int s = 0; s < N_SECTIONS; s++)
        for (int k = 0; k < SECTIONS[s].n_keys; k++)
            if (SECTIONS[s].keys[k].required && !seen.key[s][k])
                return errf(e, "%s: %s.%s is required (the model shapes d_model, n_layer, n_head, ffn_hidden "
                            "and seq_len have no defaults)", file, SECTIONS[s].name, SECTIONS[s].keys[k].name);
    config_derive(&c);
    if (config_validate(&c, e)) {
        // Say so when the offending key came from the command line rather than the file.
        for (int i = 0; e && i < n_overrides; i++) {
            const char *eq = strchr(overrides[i], '=');
            char key[160];
            snprintf(key, sizeof key, ": %.*s:", eq ? (int)(eq - overrides[i]) : 0, overrides[i]);
            size_t len = strlen(e->msg);
            if (eq && strstr(e->msg, key) && len + 40 < sizeof e->msg) {
                snprintf(e->msg + len, sizeof e->msg - len, " (value from --set %.*s)",
                         (int)(sizeof e->msg - len - 20), overrides[i]);
                break;
            }
        }
        return -1;
    }
    memcpy(out, &c, sizeof c);  // bytewise, padding included, so configs compare with memcmp
    return 0;
}

int config_load(const char *path, const char *const *overrides, int n_overrides, Config *out, ErrBuf *e) {
    char *text = read_file_text(path, NULL, e);
    if (!text) return -1;
    int rc = config_parse(text, path, overrides, n_overrides, out, e);
    free(text);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// Writing the resolved config.

typedef struct {
    char *p;
    size_t len, cap;
} StrBuf;

static void sb_printf(StrBuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void sb_printf(StrBuf *b, const char *fmt, ...) {
    for (;;) {
        va_list ap;
        va_start(ap, fmt);
        int n = vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap);
        va_end(ap);
        if (n < 0) FATAL("vsnprintf failed while writing the config JSON");
        if ((size_t)n < b->cap - b->len) {
            b->len += (size_t)n;
            return;
        }
        b->cap = 2 * b->cap + (size_t)n;
        b->p = xrealloc(b->p, b->cap);
    }
}

static void sb_json_string(StrBuf *b, const char *s) {
    sb_printf(b, "\"");
    for (const unsigned char *p = (const unsigned char *)s; *p; p++) {
        if (*p == '"' || *p == '\\') sb_printf(b, "\\%c", *p);
        else if (*p == '\n') sb_printf(b, "\\n");
        else if (*p == '\t') sb_printf(b, "\\t");
        else if (*p < 0x20) sb_printf(b, "\\u%04x", *p);
        else sb_printf(b, "%c", *p);
    }
    sb_printf(b, "\"");
}

// The shortest of %.15g / %.17g that reads back as the same double (6e-4 stays "0.0006").
static void sb_double(StrBuf *b, double v) {
    if (!isfinite(v)) {  // never in a validated config; null makes the reader report it
        sb_printf(b, "null");
        return;
    }
    char s[40];
    snprintf(s, sizeof s, "%.15g", v);
    if (strtod(s, NULL) != v) snprintf(s, sizeof s, "%.17g", v);
    sb_printf(b, "%s", s);
}

char *config_to_json(const Config *c) {
    StrBuf b = {xmalloc(4096), 0, 4096};
    sb_printf(&b, "{\n  \"description\": ");
    sb_json_string(&b, c->description);
    for (int s = 0; s < N_SECTIONS; s++) {
        sb_printf(&b, ",\n  \"%s\": {", SECTIONS[s].name);
        for (int k = 0; k < SECTIONS[s].n_keys; k++) {
            const KeyDef *key = &SECTIONS[s].keys[k];
            const void *field = (const char *)c + key->offset;
            sb_printf(&b, "%s\n    \"%s\": ", k ? "," : "", key->name);
            switch (key->kind) {
            case KIND_INT: sb_printf(&b, "%d", *(const int *)field); break;
            case KIND_I64: sb_printf(&b, "%lld", *(const long long *)field); break;
            case KIND_U64: sb_printf(&b, "%llu", *(const unsigned long long *)field); break;
            case KIND_F64: sb_double(&b, *(const double *)field); break;
            case KIND_BOOL: sb_printf(&b, "%s", *(const int *)field ? "true" : "false"); break;
            case KIND_STR: sb_json_string(&b, (const char *)field); break;
            case KIND_ENUM: sb_json_string(&b, enum_name(key->values, *(const int *)field)); break;
            }
        }
        sb_printf(&b, "\n  }");
    }
    sb_printf(&b, "\n}\n");
    return b.p;
}

int config_write_resolved(const Config *c, const char *dir, ErrBuf *e) {
    if (make_dirs(dir, e)) return -1;
    char path[4096];
    if ((size_t)snprintf(path, sizeof path, "%s/config.json", dir) >= sizeof path)
        return errf(e, "%s: directory path too long for config.json", dir);
    char *json = config_to_json(c);
    int rc = write_file_atomic(path, json, strlen(json), e);
    free(json);
    return rc;
}
