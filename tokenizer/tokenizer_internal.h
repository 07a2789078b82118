// tokenizer_internal.h: what the two halves of the tokenizer share: tokenizer.c (encode, decode)
// and tokenizer_vocab.c (reading encoder.json and vocab.bpe). Not for other modules.
#ifndef TOKENIZER_INTERNAL_H
#define TOKENIZER_INTERNAL_H

#include <stddef.h>  // size_t
#include <stdint.h>  // uint32_t, uint64_t

#include "core/common.h"          // ErrBuf
#include "tokenizer/tokenizer.h"  // Tokenizer (opaque outside)

#define UTF8_INVALID 0xFFFFFFFFu  // code point given to a byte that starts no valid UTF-8 char

// ---------------------------------------------------------------------------------------------
// Hash map (left id, right id) -> (rank, merged id), open addressing, power-of-two capacity.
typedef struct {
    uint64_t *keys;  // (left << 32) | right; EMPTY_KEY where free
    uint32_t *rank;  // line of the merge in vocab.bpe, 0-based
    uint32_t *merged;  // id of the token the merge produces
    uint32_t mask;
} MergeMap;
#define EMPTY_KEY UINT64_MAX

static inline uint32_t hash64(uint64_t k, uint32_t mask) {
    return (uint32_t)((k * 0x9E3779B97F4A7C15ull) >> 32) & mask;
}

// Rank of merging (a, b), or UINT32_MAX if vocab.bpe has no such merge.
static inline uint32_t merge_lookup(const MergeMap *m, uint32_t a, uint32_t b, uint32_t *merged) {
    uint64_t key = ((uint64_t)a << 32) | b;
    for (uint32_t h = hash64(key, m->mask);; h = (h + 1) & m->mask) {
        if (m->keys[h] == key) { *merged = m->merged[h]; return m->rank[h]; }
        if (m->keys[h] == EMPTY_KEY) return UINT32_MAX;
    }
}

// ---------------------------------------------------------------------------------------------
// The tokenizer (opaque to other modules).
struct Tokenizer {
    uint32_t n_tokens;        // 50257 for GPT-2
    uint32_t n_merges;        // 50000 for GPT-2
    uint32_t *tok_off;        // (n_tokens + 1) offsets into tok_bytes
    char *tok_bytes;          // every token's raw bytes, concatenated in id order
    uint32_t byte_token[256]; // id of the one-byte token for each byte value
    MergeMap merges;
    uint32_t *merge_pairs;    // (n_merges, 2): left and right id of merge r (for tests)
    uint64_t serial;          // unique per loaded Tokenizer, for the thread-local caches
    int cacheable;            // ids fit the cache's 16 bits
    uint8_t bmp_class[0x10000];  // UnicodeClass of every code point below 0x10000
};

// ---------------------------------------------------------------------------------------------
// Bytes.

// Decodes the character at s[i] (i < len). Returns its length in bytes (>= 1) and sets *cp; a
// byte that does not start a valid, shortest-form, non-surrogate sequence gets UTF8_INVALID.
static inline size_t utf8_next(const unsigned char *s, size_t len, size_t i, uint32_t *cp) {
    unsigned c = s[i];
    if (c < 0x80) { *cp = c; return 1; }
    size_t n;
    uint32_t v, min;
    if (c >= 0xC2 && c <= 0xDF) { n = 2; v = c & 0x1F; min = 0x80; }
    else if (c >= 0xE0 && c <= 0xEF) { n = 3; v = c & 0x0F; min = 0x800; }
    else if (c >= 0xF0 && c <= 0xF4) { n = 4; v = c & 0x07; min = 0x10000; }
    else { *cp = UTF8_INVALID; return 1; }
    if (i + n > len) { *cp = UTF8_INVALID; return 1; }
    for (size_t k = 1; k < n; k++) {
        unsigned d = s[i + k];
        if ((d & 0xC0) != 0x80) { *cp = UTF8_INVALID; return 1; }
        v = (v << 6) | (d & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) { *cp = UTF8_INVALID; return 1; }
    *cp = v;
    return n;
}

static inline uint32_t hash_bytes(const unsigned char *s, size_t len) {
    uint32_t h = 2166136261u;  // FNV-1a
    for (size_t k = 0; k < len; k++) h = (h ^ s[k]) * 16777619u;
    return h;
}

// tokenizer_vocab.c: fills tok_off, tok_bytes, byte_token, merges and merge_pairs from
// dir/encoder.json and dir/vocab.bpe. Returns 0, or -1 with e naming the file (and line).
int tokenizer_read_vocab(Tokenizer *t, const char *dir, ErrBuf *e);
// The default vocabulary directory (see tokenizer_load); NULL with e naming every path tried.
const char *tokenizer_default_dir(char *out, size_t cap, ErrBuf *e);

#endif  // TOKENIZER_INTERNAL_H
