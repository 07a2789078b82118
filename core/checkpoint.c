// checkpoint.c: save and load of the full training state (layout in checkpoint.h), the
// `latest` pointer, and pruning to the last N checkpoints.
#include "core/checkpoint.h"

#include <dirent.h>  // opendir/readdir to list step_*.ckpt
#include <errno.h>   // errno for messages
#include <stdlib.h>  // qsort, strtoll
#include <string.h>  // memcpy, strcmp, strerror
#include <sys/stat.h>  // stat: is a path a directory
#include <unistd.h>  // unlink

// ---------------------------------------------------------------------------------------------
// FNV-1a 64: a simple checksum that catches any flipped byte of a stored file.
uint64_t checkpoint_checksum(const unsigned char *p, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t i = 0; i < n; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull;
    }
    return h;
}

// ---------------------------------------------------------------------------------------------
// A growing byte buffer for the writer.
typedef struct {
    unsigned char *buf;
    size_t len, cap;
} ByteWriter;

static void put(ByteWriter *w, const void *p, size_t n) {
    if (w->len + n > w->cap) {
        size_t cap = w->cap ? w->cap : 4096;
        while (cap < w->len + n) cap *= 2;
        w->buf = xrealloc(w->buf, cap);
        w->cap = cap;
    }
    memcpy(w->buf + w->len, p, n);
    w->len += n;
}
static void put_u32(ByteWriter *w, uint32_t x) { put(w, &x, sizeof x); }
static void put_i32(ByteWriter *w, int32_t x) { put(w, &x, sizeof x); }
static void put_u64(ByteWriter *w, uint64_t x) { put(w, &x, sizeof x); }
static void put_i64(ByteWriter *w, int64_t x) { put(w, &x, sizeof x); }
static void put_f64(ByteWriter *w, double x) { put(w, &x, sizeof x); }

// A bounds-checked reader over a loaded file (the size was validated before reading).
typedef struct {
    const unsigned char *buf;
    size_t len, pos;
} ByteReader;

static void get(ByteReader *r, void *p, size_t n) {
    // The header's file size was checked against the real size, and every count is bounded
    // by it below, so running past the end means this code is wrong, not the file.
    if (r->pos + n > r->len) FATAL("checkpoint reader ran past the end (%zu + %zu > %zu)", r->pos, n, r->len);
    memcpy(p, r->buf + r->pos, n);
    r->pos += n;
}
static uint32_t get_u32(ByteReader *r) { uint32_t x; get(r, &x, sizeof x); return x; }
static int32_t get_i32(ByteReader *r) { int32_t x; get(r, &x, sizeof x); return x; }
static uint64_t get_u64(ByteReader *r) { uint64_t x; get(r, &x, sizeof x); return x; }
static int64_t get_i64(ByteReader *r) { int64_t x; get(r, &x, sizeof x); return x; }
static double get_f64(ByteReader *r) { double x; get(r, &x, sizeof x); return x; }

// ---------------------------------------------------------------------------------------------
// The shape fields, in file order, with the config key each one corresponds to.
#define N_SHAPE_FIELDS 12
static const char *const shape_field_names[N_SHAPE_FIELDS] = {
    "model.vocab_size", "model.padded_vocab_size", "model.d_model", "model.n_layer",
    "model.n_head", "model.ffn_hidden", "model.seq_len", "model.qk_norm",
    "model.tied_embeddings", "model.position", "number of parameter tensors", "total parameters"};

static void shape_fields_of(const ModelConfig *m, const ParamTable *t, int64_t f[N_SHAPE_FIELDS]) {
    f[0] = m->vocab_size;
    f[1] = m->padded_vocab_size;
    f[2] = m->d_model;
    f[3] = m->n_layer;
    f[4] = m->n_head;
    f[5] = m->ffn_hidden;
    f[6] = m->seq_len;
    f[7] = m->qk_norm;
    f[8] = m->tied_embeddings;
    f[9] = m->position;
    f[10] = t->n;
    f[11] = (int64_t)t->total;
}

#define HEADER_BYTES (4 + 4 + 8 + 8 * N_SHAPE_FIELDS + 8)  // up to and including the config length
#define TENSOR_NAME_BYTES 64
#define DELAYED_BYTES (3 * 4 + 4 * ATTN_MAX_AMAX_HISTORY * 4 + 4 * 4)

// ---------------------------------------------------------------------------------------------
// Finiteness: a diverged model (NaN or Inf anywhere in its state) is never written, and a file
// holding one is refused on load. The values are read as bytes, since in a loaded file they sit
// at any alignment: an FP32 value is not finite when its exponent bits are all ones.
static long long first_nonfinite(const void *bytes, size_t n) {
    const unsigned char *p = bytes;
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, p + 4 * i, sizeof u);
        if ((u & 0x7f800000u) == 0x7f800000u) return (long long)i;
    }
    return -1;
}

static float float_at(const void *bytes, size_t i) {
    float x;
    memcpy(&x, (const unsigned char *)bytes + 4 * i, sizeof x);
    return x;
}

// "tok_emb[1234]": the tensor holding flat element i and the index inside it.
static void name_element(const ParamTable *t, size_t i, char *out, size_t n) {
    for (int k = 0; k < t->n; k++) {
        const ParamDesc *d = &t->p[k];
        if (i >= d->offset && i < d->offset + d->numel) {
            snprintf(out, n, "%s[%zu]", d->name, i - d->offset);
            return;
        }
    }
    snprintf(out, n, "element %zu", i);
}

static const char *const STATE_ARRAY_NAMES[3] = {"parameter", "AdamW first moment", "AdamW second moment"};

// 0 when arrays[k] (total floats each; NULL: not checked) are all finite; else -1 with e naming
// the first bad value as "<what> <tensor>[<index>] is <value>".
static int check_finite(const ParamTable *t, const void *const arrays[3], char *what, size_t what_len) {
    for (int k = 0; k < 3; k++) {
        if (!arrays[k]) continue;
        long long i = first_nonfinite(arrays[k], t->total);
        if (i < 0) continue;
        char where[160];
        name_element(t, (size_t)i, where, sizeof where);
        snprintf(what, what_len, "%s %s is %g", STATE_ARRAY_NAMES[k], where, (double)float_at(arrays[k], (size_t)i));
        return -1;
    }
    return 0;
}

static int delayed_finite(const AttnDelayedState *d) {
    return first_nonfinite(d->hist, sizeof d->hist / 4) < 0 && first_nonfinite(d->cur_amax, sizeof d->cur_amax / 4) < 0;
}

int checkpoint_save(const char *path, const CheckpointState *s, ErrBuf *e) {
    const ParamTable *t = s->table;
    char bad[256];
    const void *arrays[3] = {s->params, s->adam_m, s->adam_v};
    if (check_finite(t, arrays, bad, sizeof bad) != 0)
        return errf(e, "checkpoint %s not written: the model is not finite (%s): a diverged model is never "
                       "checkpointed", path, bad);
    for (int l = 0; s->delayed && l < s->n_delayed; l++)
        if (!delayed_finite(&s->delayed[l]))
            return errf(e, "checkpoint %s not written: delayed-scaling state %d holds a non-finite amax: a diverged "
                           "model is never checkpointed", path, l);
    ByteWriter w = {0};
    put_u32(&w, CKPT_MAGIC);
    put_u32(&w, CKPT_VERSION);
    put_u64(&w, 0);  // file size, patched below
    int64_t f[N_SHAPE_FIELDS];
    shape_fields_of(s->model, t, f);
    for (int i = 0; i < N_SHAPE_FIELDS; i++) put_i64(&w, f[i]);
    const char *cfg = s->config_json ? s->config_json : "";
    put_u64(&w, strlen(cfg));
    put(&w, cfg, strlen(cfg));
    for (int i = 0; i < t->n; i++) {
        char name[TENSOR_NAME_BYTES] = {0};
        snprintf(name, sizeof name, "%s", t->p[i].name);
        put(&w, name, sizeof name);
        put_i64(&w, t->p[i].rows);
        put_i64(&w, t->p[i].cols);
    }
    put(&w, s->params, t->total * sizeof(float));
    put(&w, s->adam_m, t->total * sizeof(float));
    put(&w, s->adam_v, t->total * sizeof(float));
    put_i64(&w, s->adam_step);
    put_i64(&w, s->train_step);
    put_f64(&w, s->elapsed_s);
    put_u64(&w, s->sample_rng);
    put_u64(&w, s->data.seed);
    put_i64(&w, s->data.epoch);
    put_i64(&w, s->data.shard_pos);
    put_i64(&w, s->data.window_pos);
    int n_delayed = s->delayed ? s->n_delayed : 0;
    put_u64(&w, (uint64_t)n_delayed);
    for (int l = 0; l < n_delayed; l++) {
        const AttnDelayedState *d = &s->delayed[l];
        put_i32(&w, d->len);
        put_i32(&w, d->pos);
        put_i32(&w, d->filled);
        put(&w, d->hist, sizeof d->hist);
        put(&w, d->cur_amax, sizeof d->cur_amax);
    }
    const AttnKeyCenters *kc = s->key_centers;
    uint64_t n_center = kc && kc->center && kc->ready ? (uint64_t)attn_key_centers_count(kc) : 0;
    put_u64(&w, n_center);
    if (n_center) put(&w, kc->center, n_center * sizeof(float));
    uint64_t size = w.len + 8;
    memcpy(w.buf + 8, &size, sizeof size);
    put_u64(&w, checkpoint_checksum(w.buf, w.len));
    int rc = write_file_atomic(path, w.buf, w.len, e);
    free(w.buf);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// Reads the file and validates what needs no model: magic, version, size, checksum. Returns
// the bytes (caller frees) with the reader positioned after the header's file-size field.
static unsigned char *read_validated(const char *path, ByteReader *r, uint32_t *version_out, ErrBuf *e) {
    size_t len = 0;
    char *text = read_file_text(path, &len, e);
    if (!text) return NULL;
    unsigned char *buf = (unsigned char *)text;
    *r = (ByteReader){buf, len, 0};
    if (len < 8) {
        free(buf);
        errf(e, "checkpoint %s: truncated: %zu bytes, shorter than the 8-byte magic and version", path, len);
        return NULL;
    }
    uint32_t magic = get_u32(r), version = get_u32(r);
    if (magic != CKPT_MAGIC) {
        free(buf);
        errf(e, "checkpoint %s: not a train_gpt checkpoint (magic 0x%08x, expected 0x%08x \"TGPT\")", path, magic, CKPT_MAGIC);
        return NULL;
    }
    if (version < CKPT_VERSION_MIN || version > CKPT_VERSION) {
        free(buf);
        errf(e, "checkpoint %s: format version %u, this build reads versions %d to %d", path, version, CKPT_VERSION_MIN,
             CKPT_VERSION);
        return NULL;
    }
    if (len < HEADER_BYTES) {
        free(buf);
        errf(e, "checkpoint %s: truncated: %zu bytes, shorter than its %d-byte header", path, len, HEADER_BYTES);
        return NULL;
    }
    uint64_t expected = get_u64(r);
    if (expected != len) {
        free(buf);
        errf(e, "checkpoint %s: %s: the header says %llu bytes but the file has %zu (an interrupted copy?)", path,
             len < expected ? "truncated" : "wrong size", (unsigned long long)expected, len);
        return NULL;
    }
    uint64_t stored;
    memcpy(&stored, buf + len - 8, sizeof stored);
    if (checkpoint_checksum(buf, len - 8) != stored) {
        free(buf);
        errf(e, "checkpoint %s: corrupt: the checksum does not match its contents", path);
        return NULL;
    }
    r->len = len - 8;  // the checksum is not content
    if (version_out) *version_out = version;
    return buf;
}

// Reads the config text that follows the shape fields (its length is bounded by the file).
static char *read_config_text(const char *path, ByteReader *r, ErrBuf *e) {
    uint64_t n = get_u64(r);
    if (n > r->len - r->pos) {
        errf(e, "checkpoint %s: corrupt: config length %llu exceeds the file", path, (unsigned long long)n);
        return NULL;
    }
    char *cfg = xmalloc(n + 1);
    get(r, cfg, n);
    cfg[n] = '\0';
    return cfg;
}

char *checkpoint_read_config(const char *path, ErrBuf *e) {
    ByteReader r;
    unsigned char *buf = read_validated(path, &r, NULL, e);
    if (!buf) return NULL;
    for (int i = 0; i < N_SHAPE_FIELDS; i++) get_i64(&r);
    char *cfg = read_config_text(path, &r, e);
    free(buf);
    if (cfg && !cfg[0]) {
        free(cfg);
        errf(e, "checkpoint %s: holds no config text", path);
        return NULL;
    }
    return cfg;
}

int checkpoint_load(const char *path, CheckpointState *s, ErrBuf *e) {
    ByteReader r;
    uint32_t version;
    unsigned char *buf = read_validated(path, &r, &version, e);
    if (!buf) return -1;
    int rc = -1;
    char *cfg = NULL;
    AttnDelayedState *delayed = NULL;
    const ParamTable *t = s->table;
    int64_t want[N_SHAPE_FIELDS], have[N_SHAPE_FIELDS];
    shape_fields_of(s->model, t, want);
    for (int i = 0; i < N_SHAPE_FIELDS; i++) have[i] = get_i64(&r);
    for (int i = 0; i < N_SHAPE_FIELDS; i++) {
        if (have[i] != want[i]) {
            errf(e, "checkpoint %s: %s is %lld in the checkpoint but %lld in the config", path,
                 shape_field_names[i], (long long)have[i], (long long)want[i]);
            rc = -2;
            goto done;
        }
    }
    cfg = read_config_text(path, &r, e);
    if (!cfg) goto done;
    // The tensor table: the same names and shapes in the same order. The size check above
    // guarantees the table and buffers fit, since the file size equals what they need.
    size_t need = (size_t)t->n * (TENSOR_NAME_BYTES + 16) + 3 * t->total * sizeof(float) + 8 * 9;
    if (r.len - r.pos < need) {
        errf(e, "checkpoint %s: corrupt: %zu bytes left for tensors and state, need at least %zu", path, r.len - r.pos, need);
        goto done;
    }
    for (int i = 0; i < t->n; i++) {
        char name[TENSOR_NAME_BYTES + 1] = {0};
        get(&r, name, TENSOR_NAME_BYTES);
        int64_t rows = get_i64(&r), cols = get_i64(&r);
        const ParamDesc *d = &t->p[i];
        if (strcmp(name, d->name) != 0) {
            errf(e, "checkpoint %s: tensor %d is %s in the checkpoint but %s in the model", path, i, name, d->name);
            rc = -2;
            goto done;
        }
        if (rows != d->rows || cols != d->cols) {
            errf(e, "checkpoint %s: %s: checkpoint has shape (%lld, %lld), model has (%ld, %ld)", path, d->name,
                 (long long)rows, (long long)cols, d->rows, d->cols);
            rc = -2;
            goto done;
        }
    }
    // Everything is validated before any of s's buffers is written, so a refused file leaves the
    // caller's state as it was (a resume then tries an older checkpoint into the same buffers).
    size_t bytes = t->total * sizeof(float);
    const unsigned char *arrays = r.buf + r.pos;  // params, adam m, adam v
    const void *checked[3] = {arrays, s->adam_m ? arrays + bytes : NULL, s->adam_v ? arrays + 2 * bytes : NULL};
    char bad[256];
    if (check_finite(t, checked, bad, sizeof bad) != 0) {
        errf(e, "checkpoint %s: not finite (%s): it was written by a diverged run; use an earlier checkpoint", path,
             bad);
        goto done;
    }
    r.pos += 3 * bytes;
    long long adam_step = get_i64(&r), train_step = get_i64(&r);
    double elapsed_s = get_f64(&r);
    unsigned long long sample_rng = get_u64(&r);
    DataLoaderState data;
    data.seed = get_u64(&r);
    data.epoch = get_i64(&r);
    data.shard_pos = get_i64(&r);
    data.window_pos = get_i64(&r);
    uint64_t n_delayed = get_u64(&r);
    // version 1 ends with the delayed states; version 2 has at least the key centres' count after them
    size_t tail = version >= 2 ? 8 : 0;
    if (n_delayed > (r.len - r.pos) / DELAYED_BYTES ||
        (version >= 2 ? r.len - r.pos < n_delayed * DELAYED_BYTES + tail : r.len - r.pos != n_delayed * DELAYED_BYTES)) {
        errf(e, "checkpoint %s: corrupt: %llu delayed-scaling states do not fit the %zu bytes left", path,
             (unsigned long long)n_delayed, r.len - r.pos);
        goto done;
    }
    delayed = xcalloc(n_delayed ? n_delayed : 1, sizeof *delayed);
    for (uint64_t l = 0; l < n_delayed; l++) {
        AttnDelayedState *d = &delayed[l];
        d->len = get_i32(&r);
        d->pos = get_i32(&r);
        d->filled = get_i32(&r);
        get(&r, d->hist, sizeof d->hist);
        get(&r, d->cur_amax, sizeof d->cur_amax);
        if (d->len < 0 || d->len > ATTN_MAX_AMAX_HISTORY) {
            errf(e, "checkpoint %s: corrupt: layer %llu's delayed-scaling history length %d is outside [0, %d]", path,
                 (unsigned long long)l, d->len, ATTN_MAX_AMAX_HISTORY);
            goto done;
        }
        if (!delayed_finite(d)) {
            errf(e, "checkpoint %s: not finite (delayed-scaling state %llu holds a non-finite amax): it was written "
                    "by a diverged run; use an earlier checkpoint", path, (unsigned long long)l);
            goto done;
        }
    }
    memcpy(s->params, arrays, bytes);
    if (s->adam_m) memcpy(s->adam_m, arrays + bytes, bytes);
    if (s->adam_v) memcpy(s->adam_v, arrays + 2 * bytes, bytes);
    s->adam_step = adam_step;
    s->train_step = train_step;
    s->elapsed_s = elapsed_s;
    s->sample_rng = sample_rng;
    s->data = data;
    if (s->delayed && (int)n_delayed == s->n_delayed)
        memcpy(s->delayed, delayed, (size_t)n_delayed * sizeof *delayed);
    if (s->config_out) {
        *s->config_out = cfg;
        cfg = NULL;
    }
    if (version >= 2) {
        uint64_t n_center = get_u64(&r);
        if (n_center > (r.len - r.pos) / sizeof(float) || r.len - r.pos != n_center * sizeof(float)) {
            errf(e, "checkpoint %s: corrupt: %llu key-centre values do not fit the %zu bytes left", path,
                 (unsigned long long)n_center, r.len - r.pos);
            goto done;
        }
        AttnKeyCenters *kc = s->key_centers;
        if (n_center && kc && kc->center && n_center == (uint64_t)attn_key_centers_count(kc)) {
            get(&r, kc->center, n_center * sizeof(float));
            kc->ready = 1;
        }
    }
    rc = 0;
done:
    free(delayed);
    free(cfg);
    free(buf);
    return rc;
}

// ---------------------------------------------------------------------------------------------
// Directory helpers.

void checkpoint_dir_of(const Config *c, char *out, size_t out_len) {
    if (c->checkpoint.dir[0]) snprintf(out, out_len, "%s", c->checkpoint.dir);
    else snprintf(out, out_len, "%s/checkpoints", c->log.dir);
}

void checkpoint_path_for_step(const char *dir, long long step, char *out, size_t out_len) {
    snprintf(out, out_len, "%s/step_%06lld.ckpt", dir, step);
}

int checkpoint_mark_latest(const char *dir, const char *path, ErrBuf *e) {
    const char *slash = strrchr(path, '/');
    const char *base = slash ? slash + 1 : path;
    char text[1024], latest[4096];
    int n = snprintf(text, sizeof text, "%s\n", base);
    snprintf(latest, sizeof latest, "%s/latest", dir);
    return write_file_atomic(latest, text, (size_t)n, e);
}

// Parses "step_<digits>.ckpt"; returns the step or -1.
static long long step_of_name(const char *name) {
    if (strncmp(name, "step_", 5) != 0) return -1;
    char *end;
    long long step = strtoll(name + 5, &end, 10);
    if (end == name + 5 || strcmp(end, ".ckpt") != 0 || step < 0) return -1;
    return step;
}

// Steps of every step_*.ckpt in dir, ascending; returns the count (0 if dir is missing).
static int list_steps(const char *dir, long long **steps_out) {
    *steps_out = NULL;
    DIR *d = opendir(dir);
    if (!d) return 0;
    int n = 0, cap = 0;
    long long *steps = NULL;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        long long s = step_of_name(ent->d_name);
        if (s < 0) continue;
        if (n == cap) {
            cap = cap ? 2 * cap : 16;
            steps = xrealloc(steps, (size_t)cap * sizeof *steps);
        }
        steps[n++] = s;
    }
    closedir(d);
    for (int i = 1; i < n; i++)  // insertion sort: a handful of files
        for (int j = i; j > 0 && steps[j - 1] > steps[j]; j--) {
            long long tmp = steps[j];
            steps[j] = steps[j - 1];
            steps[j - 1] = tmp;
        }
    *steps_out = steps;
    return n;
}

// The file name `latest` points at (its first line), or "" when it is missing or empty.
static void read_latest(const char *dir, char *name, size_t n) {
    char latest[4096];
    ErrBuf e;
    name[0] = '\0';
    snprintf(latest, sizeof latest, "%s/latest", dir);
    if (!file_exists(latest)) return;
    char *text = read_file_text(latest, NULL, &e);
    if (!text) return;
    text[strcspn(text, "\r\n")] = '\0';
    snprintf(name, n, "%s", text);
    free(text);
}

int checkpoint_find_latest(const char *dir, char *out, size_t out_len, ErrBuf *e) {
    char name[1024];
    read_latest(dir, name, sizeof name);
    if (name[0]) {
        snprintf(out, out_len, "%s/%s", dir, name);
        if (file_exists(out)) return 0;
        // fall through to the newest step file when `latest` names a deleted file
    }
    long long *steps;
    int n = list_steps(dir, &steps);
    if (n == 0) return errf(e, "no checkpoint to resume from in %s (no 'latest' file and no step_*.ckpt)", dir);
    checkpoint_path_for_step(dir, steps[n - 1], out, out_len);
    free(steps);
    return 0;
}

int checkpoint_list_newest_first(const char *dir, char ***paths_out) {
    char name[1024], path[4096];
    read_latest(dir, name, sizeof name);
    long long *steps;
    int n = list_steps(dir, &steps);
    char **paths = xcalloc((size_t)n + 1, sizeof *paths);
    int count = 0;
    if (name[0]) {
        snprintf(path, sizeof path, "%s/%s", dir, name);
        if (file_exists(path)) paths[count++] = xstrdup(path);
    }
    for (int i = n - 1; i >= 0; i--) {
        checkpoint_path_for_step(dir, steps[i], path, sizeof path);
        if (count > 0 && !strcmp(paths[0], path)) continue;  // named by `latest` already
        paths[count++] = xstrdup(path);
    }
    free(steps);
    *paths_out = paths;
    return count;
}

void checkpoint_list_free(char **paths, int n) {
    for (int i = 0; i < n; i++) free(paths[i]);
    free(paths);
}

int checkpoint_dir_has_any(const char *dir) {
    char latest[4096];
    snprintf(latest, sizeof latest, "%s/latest", dir);
    if (file_exists(latest)) return 1;
    long long *steps;
    int n = list_steps(dir, &steps);
    free(steps);
    return n > 0;
}

static int is_dir(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

// Whether path is a `latest` pointer: a short text file that does not start with the magic.
static int is_pointer_file(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return 0;
    unsigned char head[4] = {0};
    size_t n = fread(head, 1, sizeof head, f);
    int pointer = 1;
    if (n == 4) {
        uint32_t magic;
        memcpy(&magic, head, sizeof magic);
        pointer = magic != CKPT_MAGIC;
    }
    if (pointer && fseek(f, 0, SEEK_END) == 0) pointer = ftell(f) < 4096;
    fclose(f);
    return pointer;
}

int checkpoint_resolve(const char *arg, char *out, size_t out_len, int *is_file, ErrBuf *e) {
    *is_file = 0;
    if (is_dir(arg)) {
        char sub[4096];
        snprintf(sub, sizeof sub, "%s/checkpoints", arg);
        // a run directory holds checkpoints/ (its own checkpoints are elsewhere only with
        // checkpoint.dir set, and then that directory is the one to name)
        snprintf(out, out_len, "%s", !checkpoint_dir_has_any(arg) && is_dir(sub) ? sub : arg);
        return 0;
    }
    if (!file_exists(arg)) return errf(e, "%s: no such checkpoint file or directory", arg);
    if (is_pointer_file(arg)) {  // `latest`: its directory, whose newest valid checkpoint it names
        ErrBuf e2;
        char *text = read_file_text(arg, NULL, &e2);
        if (text) text[strcspn(text, "\r\n")] = '\0';
        int named = text && step_of_name(text) >= 0;
        free(text);
        if (!named)
            return errf(e, "%s: neither a train_gpt checkpoint nor a 'latest' pointer naming a step_*.ckpt file", arg);
        const char *slash = strrchr(arg, '/');
        if (slash) snprintf(out, out_len, "%.*s", slash == arg ? 1 : (int)(slash - arg), arg);
        else snprintf(out, out_len, ".");
        return 0;
    }
    *is_file = 1;
    snprintf(out, out_len, "%s", arg);
    return 0;
}

int checkpoint_prune(const char *dir, int keep, long long newest_step) {
    if (keep <= 0) return 0;
    long long *steps;
    int n = list_steps(dir, &steps);
    int deleted = 0;
    while (n > 0 && steps[n - 1] > newest_step) n--;  // a later trajectory's files: left alone
    for (int i = 0; i + keep < n; i++) {
        char path[4096];
        checkpoint_path_for_step(dir, steps[i], path, sizeof path);
        if (unlink(path) == 0) deleted++;
        else fprintf(stderr, "train_gpt: warning: could not delete old checkpoint %s: %s\n", path, strerror(errno));
    }
    free(steps);
    return deleted;
}
