// tokenizer_vocab.c: reading GPT-2's vocabulary: encoder.json (token string -> id, in GPT-2's
// bytes_to_unicode alphabet) and vocab.bpe (the merges, one "left right" pair a line, in rank
// order), and finding the default directory that holds them.
#include <cjson/cJSON.h>  // parsing encoder.json
#include <limits.h>       // PATH_MAX
#include <stdio.h>        // snprintf
#include <stdlib.h>       // getenv, free
#include <string.h>       // memcpy, memcmp, memchr, strlen
#include <unistd.h>       // readlink (/proc/self/exe)

#include "core/common.h"                   // ErrBuf, errf, xmalloc, read_file_text, file_exists
#include "tokenizer/tokenizer_internal.h"  // struct Tokenizer, MergeMap, utf8_next, hash_bytes

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves, the other 68 bytes are
// given the code points 256, 257, ... in byte order. cp_to_byte is its inverse (-1: no byte).
static void gpt2_byte_map(int16_t cp_to_byte[324]) {
    for (int c = 0; c < 324; c++) cp_to_byte[c] = -1;
    int extra = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
        cp_to_byte[printable ? b : 256 + extra++] = (int16_t)b;
    }
}

// Converts a vocabulary string (UTF-8 of bytes_to_unicode code points) into raw bytes; out has
// room for strlen(str) bytes. Returns the byte count, or -1 if a character stands for no byte.
static int gpt2_string_bytes(const int16_t cp_to_byte[324], const char *str, size_t n, char *out) {
    size_t len = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        i += utf8_next((const unsigned char *)str, n, i, &cp);
        if (cp >= 324 || cp_to_byte[cp] < 0) return -1;
        out[len++] = (char)cp_to_byte[cp];
    }
    return (int)len;
}

// Token lookup by bytes, used while reading vocab.bpe: open addressing on token ids.
typedef struct {
    uint32_t *slot;  // id + 1; 0 = free
    uint32_t mask;
} BytesIndex;

static uint32_t bytes_index_find(const Tokenizer *t, const BytesIndex *x, const char *b, size_t n) {
    for (uint32_t h = hash_bytes((const unsigned char *)b, n) & x->mask;; h = (h + 1) & x->mask) {
        if (x->slot[h] == 0) return UINT32_MAX;
        uint32_t id = x->slot[h] - 1;
        size_t l = t->tok_off[id + 1] - t->tok_off[id];
        if (l == n && memcmp(t->tok_bytes + t->tok_off[id], b, n) == 0) return id;
    }
}

static uint32_t pow2_at_least(size_t n) {
    uint32_t c = 1;
    while (c < n) c *= 2;
    return c;
}

static int load_encoder(Tokenizer *t, const char *path, const int16_t cp_to_byte[324], ErrBuf *e) {
    size_t len;
    char *text = read_file_text(path, &len, e);
    if (!text) return -1;
    cJSON *root = cJSON_ParseWithLength(text, len);
    free(text);
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return errf(e, "%s: not a JSON object (expected GPT-2's encoder.json: {\"token\": id, ...})", path);
    }
    int n = cJSON_GetArraySize(root);
    if (n <= 256) { cJSON_Delete(root); return errf(e, "%s: %d entries; expected 50257", path, n); }
    t->n_tokens = (uint32_t)n;
    uint32_t *lens = xcalloc((size_t)n, sizeof *lens);
    char **bytes = xcalloc((size_t)n, sizeof *bytes);
    int rc = 0;
    const cJSON *item;
    cJSON_ArrayForEach(item, root) {
        double v = cJSON_IsNumber(item) ? item->valuedouble : -1;
        if (v < 0 || v >= n || v != (double)(int)v) {
            rc = errf(e, "%s: entry \"%s\": id must be an integer in 0..%d", path, item->string, n - 1);
            break;
        }
        int id = (int)v;
        if (bytes[id]) { rc = errf(e, "%s: id %d appears twice (\"%s\")", path, id, item->string); break; }
        size_t sl = strlen(item->string);
        bytes[id] = xmalloc(sl + 1);
        int bl = gpt2_string_bytes(cp_to_byte, item->string, sl, bytes[id]);
        if (bl <= 0) {
            rc = errf(e, "%s: entry \"%s\" (id %d): contains a character outside GPT-2's byte alphabet",
                      path, item->string, id);
            break;
        }
        lens[id] = (uint32_t)bl;
    }
    cJSON_Delete(root);
    if (rc == 0) {  // n distinct ids in 0..n-1: every id is present; pack them
        size_t total = 0;
        for (int id = 0; id < n; id++) total += lens[id];
        t->tok_off = xmalloc(((size_t)n + 1) * sizeof *t->tok_off);
        t->tok_bytes = xmalloc(total + 1);
        size_t off = 0;
        for (int id = 0; id < n; id++) {
            t->tok_off[id] = (uint32_t)off;
            memcpy(t->tok_bytes + off, bytes[id], lens[id]);
            off += lens[id];
        }
        t->tok_off[n] = (uint32_t)off;
    }
    for (int id = 0; id < n; id++) free(bytes[id]);
    free(bytes);
    free(lens);
    return rc;
}

static int load_merges(Tokenizer *t, const char *path, const int16_t cp_to_byte[324], ErrBuf *e) {
    size_t len;
    char *text = read_file_text(path, &len, e);
    if (!text) return -1;
    BytesIndex x = {0};
    x.mask = pow2_at_least(2 * (size_t)t->n_tokens) - 1;
    x.slot = xcalloc((size_t)x.mask + 1, sizeof *x.slot);
    for (uint32_t id = 0; id < t->n_tokens; id++) {
        const char *b = t->tok_bytes + t->tok_off[id];
        size_t l = t->tok_off[id + 1] - t->tok_off[id];
        if (bytes_index_find(t, &x, b, l) != UINT32_MAX) {
            free(x.slot); free(text);
            return errf(e, "encoder.json beside %s: two ids have the same bytes (id %u)", path, id);
        }
        uint32_t h = hash_bytes((const unsigned char *)b, l) & x.mask;
        while (x.slot[h]) h = (h + 1) & x.mask;
        x.slot[h] = id + 1;
    }
    size_t n_lines = 1;
    for (size_t i = 0; i < len; i++) n_lines += text[i] == '\n';
    t->merges.mask = pow2_at_least(2 * n_lines) - 1;
    t->merges.keys = xmalloc(((size_t)t->merges.mask + 1) * sizeof *t->merges.keys);
    t->merges.rank = xmalloc(((size_t)t->merges.mask + 1) * sizeof *t->merges.rank);
    t->merges.merged = xmalloc(((size_t)t->merges.mask + 1) * sizeof *t->merges.merged);
    memset(t->merges.keys, 0xFF, ((size_t)t->merges.mask + 1) * sizeof *t->merges.keys);
    t->merge_pairs = xmalloc(2 * n_lines * sizeof *t->merge_pairs);
    char *buf = xmalloc(len + 1);  // bytes of the two halves and their concatenation
    int rc = 0;
    size_t line_no = 0;
    for (char *line = text; line < text + len && rc == 0;) {
        char *eol = memchr(line, '\n', (size_t)(text + len - line));
        if (!eol) eol = text + len;
        line_no++;
        size_t ll = (size_t)(eol - line);
        if (ll > 0 && line[ll - 1] == '\r') ll--;
        char *sp = memchr(line, ' ', ll);
        if (ll == 0 || (line_no == 1 && strncmp(line, "#version", 8) == 0)) {  // header, last line
        } else if (!sp || memchr(sp + 1, ' ', ll - (size_t)(sp + 1 - line))) {
            rc = errf(e, "%s:%zu: expected two tokens separated by one space", path, line_no);
        } else {
            int la = gpt2_string_bytes(cp_to_byte, line, (size_t)(sp - line), buf);
            int lb = la > 0 ? gpt2_string_bytes(cp_to_byte, sp + 1, ll - (size_t)(sp + 1 - line), buf + la) : -1;
            uint32_t a = la > 0 ? bytes_index_find(t, &x, buf, (size_t)la) : UINT32_MAX;
            uint32_t b = lb > 0 ? bytes_index_find(t, &x, buf + la, (size_t)lb) : UINT32_MAX;
            uint32_t ab = lb > 0 ? bytes_index_find(t, &x, buf, (size_t)(la + lb)) : UINT32_MAX;
            uint32_t dummy;
            if (a == UINT32_MAX || b == UINT32_MAX || ab == UINT32_MAX) {
                rc = errf(e, "%s:%zu: merge \"%.*s\": both halves and their concatenation must be "
                          "tokens of encoder.json", path, line_no, (int)ll, line);
            } else if (merge_lookup(&t->merges, a, b, &dummy) != UINT32_MAX) {
                rc = errf(e, "%s:%zu: merge \"%.*s\" appears twice", path, line_no, (int)ll, line);
            } else {
                uint64_t key = ((uint64_t)a << 32) | b;
                uint32_t h = hash64(key, t->merges.mask);
                while (t->merges.keys[h] != EMPTY_KEY) h = (h + 1) & t->merges.mask;
                t->merges.keys[h] = key;
                t->merges.rank[h] = t->n_merges;
                t->merges.merged[h] = ab;
                t->merge_pairs[2 * t->n_merges] = a;
                t->merge_pairs[2 * t->n_merges + 1] = b;
                t->n_merges++;
            }
        }
        line = eol + 1;
    }
    free(buf);
    free(x.slot);
    free(text);
    return rc;
}

int tokenizer_read_vocab(Tokenizer *t, const char *dir, ErrBuf *e) {
    int16_t cp_to_byte[324];
    gpt2_byte_map(cp_to_byte);
    size_t cap = strlen(dir) + sizeof "/encoder.json";
    char *path = xmalloc(cap);
    snprintf(path, cap, "%s/encoder.json", dir);
    int rc = load_encoder(t, path, cp_to_byte, e);
    for (int b = 0; b < 256 && rc == 0; b++) {  // the one-byte tokens
        char c = (char)b;
        t->byte_token[b] = UINT32_MAX;
        for (uint32_t id = 0; id < t->n_tokens && t->byte_token[b] == UINT32_MAX; id++)
            if (t->tok_off[id + 1] - t->tok_off[id] == 1 && t->tok_bytes[t->tok_off[id]] == c)
                t->byte_token[b] = id;
        if (t->byte_token[b] == UINT32_MAX)
            rc = errf(e, "%s: no token for the single byte 0x%02X", path, b);
    }
    if (rc == 0) {
        snprintf(path, cap, "%s/vocab.bpe", dir);
        rc = load_merges(t, path, cp_to_byte, e);
    }
    if (rc == 0 && t->n_merges == 0) rc = errf(e, "%s: no merges (expected GPT-2's 50,000)", path);
    free(path);
    return rc;
}

// Whether dir/encoder.json exists; probe receives that path (truncated to cap) for messages.
static int has_vocab(const char *dir, char *probe, size_t cap) {
    size_t n = strlen(dir) + sizeof "/encoder.json";
    char *path = xmalloc(n);
    snprintf(path, n, "%s/encoder.json", dir);
    snprintf(probe, cap, "%s", path);
    int found = file_exists(path);
    free(path);
    return found;
}

// Where tokenizer_load(NULL) looks: $TRAIN_GPT_VOCAB_DIR when it is set (and only there: an
// explicit setting that is wrong is an error, not a silent fallback), else ./data/gpt2, then
// <directory of the binary>/data/gpt2. The first that has an encoder.json is used.
const char *tokenizer_default_dir(char *out, size_t cap, ErrBuf *e) {
    char tried[900] = "", probe[300];
    size_t used = 0;
    const char *env = getenv("TRAIN_GPT_VOCAB_DIR");
    if (env && *env) {
        if (strlen(env) < cap && has_vocab(env, probe, sizeof probe)) return snprintf(out, cap, "%s", env), out;
        errf(e, "TRAIN_GPT_VOCAB_DIR=%s holds no GPT-2 vocabulary (expected encoder.json and vocab.bpe there)", env);
        return NULL;
    }
    if (has_vocab("data/gpt2", probe, sizeof probe)) return snprintf(out, cap, "data/gpt2"), out;
    used += (size_t)snprintf(tried + used, sizeof tried - used, "%s (current directory)", probe);
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash) *slash = '\0';
        size_t need = strlen(exe) + sizeof "/data/gpt2";
        if (need <= cap) {
            snprintf(out, cap, "%s", exe);
            strcat(out, "/data/gpt2");
            if (has_vocab(out, probe, sizeof probe)) return out;
            used += (size_t)snprintf(tried + used, sizeof tried - used, ", %s (beside the binary)", probe);
        }
    }
    errf(e, "GPT-2 vocabulary not found; tried %s. Pass --vocab DIR (a directory with "
         "encoder.json and vocab.bpe) or set TRAIN_GPT_VOCAB_DIR", tried);
    return NULL;
}

