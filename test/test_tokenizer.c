// test_tokenizer.c: GPT-2 BPE against reference ids from three independent JS encoders
// (test/data/tokenizer_vectors.txt, made by scripts/gen_tokenizer_vectors.js), a whole novel's
// id stream, round trips of valid and invalid UTF-8, the vocabulary's structure, load errors
// and the encode/decode commands. Run from the repository root (as test/run_tests.sh does).
#include <fcntl.h>     // open for the command tests' redirections
#include <stdint.h>    // uint32_t, uint64_t
#include <stdio.h>     // printf, FILE
#include <stdlib.h>    // malloc, setenv
#include <string.h>    // memcmp, strstr
#include <sys/wait.h>  // waitpid
#include <unistd.h>    // fork, dup2, chdir, getcwd

#include "core/common.h"          // ErrBuf, read_file_text, xmalloc
#include "test.h"                 // CHECK, test_summary
#include "tokenizer/tokenizer.h"  // the module under test

// ---------------------------------------------------------------------------------------------
// Helpers.

static uint64_t rng_state = 0x9E3779B97F4A7C15ull;
static uint32_t rng_next(void) {  // xorshift64*
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (uint32_t)((rng_state * 0x2545F4914F6CDD1Dull) >> 32);
}

static int hexval(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    return -1;
}

// Printable form of a text for failure details (escapes, truncated).
static const char *show(const char *s, size_t n) {
    static char buf[4][256];
    static int which;
    char *out = buf[which++ & 3];
    size_t o = 0;
    for (size_t i = 0; i < n && o + 8 < sizeof buf[0]; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c >= 0x20 && c < 0x7F && c != '\\') out[o++] = (char)c;
        else o += (size_t)snprintf(out + o, sizeof buf[0] - o, "\\x%02X", c);
    }
    if (o + 8 >= sizeof buf[0]) o += (size_t)snprintf(out + o, sizeof buf[0] - o, "...");
    out[o] = '\0';
    return out;
}

static const char *show_ids(const uint32_t *ids, size_t n) {
    static char buf[2][256];
    static int which;
    char *out = buf[which++ & 1];
    size_t o = 0;
    out[0] = '\0';
    for (size_t k = 0; k < n && o + 16 < sizeof buf[0]; k++)
        o += (size_t)snprintf(out + o, sizeof buf[0] - o, "%s%u", k ? " " : "", ids[k]);
    if (o + 16 >= sizeof buf[0]) snprintf(out + o, sizeof buf[0] - o, " ...");
    return out;
}

static int round_trips(Tokenizer *t, const char *s, size_t n) {
    uint32_t *ids;
    size_t m = tokenizer_encode(t, s, n, &ids);
    size_t len;
    char *back = tokenizer_decode(t, ids, m, &len);
    int ok = back && len == n && memcmp(back, s, n) == 0;
    free(back);
    free(ids);
    return ok;
}

static uint64_t fnv64_ids(const uint32_t *ids, size_t n) {
    uint64_t h = 0xcbf29ce484222325ull;
    for (size_t k = 0; k < n; k++)
        for (int b = 0; b < 4; b++) h = (h ^ ((ids[k] >> (8 * b)) & 255)) * 0x100000001b3ull;
    return h;
}

// ---------------------------------------------------------------------------------------------
// The vocabulary's structure.

static void test_vocab(Tokenizer *t) {
    CHECK(tokenizer_vocab_size(t) == 50257, "vocab: 50257 tokens", "got %u", tokenizer_vocab_size(t));
    CHECK(tokenizer_merge_count(t) == 50000, "vocab: 50000 merges", "got %u", tokenizer_merge_count(t));
    // Merge r produces id 256 + r, whose bytes are its halves' bytes.
    uint32_t bad = UINT32_MAX;
    for (uint32_t r = 0; r < tokenizer_merge_count(t) && bad == UINT32_MAX; r++) {
        uint32_t a, b, m;
        size_t la, lb, lm;
        if (tokenizer_merge(t, r, &a, &b, &m) || m != 256 + r) { bad = r; break; }
        const char *pa = tokenizer_token_bytes(t, a, &la), *pb = tokenizer_token_bytes(t, b, &lb);
        const char *pm = tokenizer_token_bytes(t, m, &lm);
        if (lm != la + lb || memcmp(pm, pa, la) || memcmp(pm + la, pb, lb)) bad = r;
    }
    CHECK(bad == UINT32_MAX, "vocab: merge r makes id 256+r from its halves' bytes", "merge %u", bad);
    // Ids 0..255 are the single bytes in GPT-2's bytes_to_unicode order: '!'..'~', 0xA1..0xAC,
    // 0xAE..0xFF, then the other bytes in increasing order.
    int order_ok = 1, id = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int b = 0; b < 256; b++) {
            int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
            if (printable != (pass == 0)) continue;
            size_t l;
            const char *p = tokenizer_token_bytes(t, (uint32_t)id++, &l);
            if (!p || l != 1 || (unsigned char)p[0] != b) order_ok = 0;
        }
    CHECK(order_ok, "vocab: ids 0..255 are the bytes in bytes_to_unicode order", "mismatch");
    size_t l;
    const char *eot = tokenizer_token_bytes(t, GPT2_EOT, &l);
    CHECK(eot && l == 13 && memcmp(eot, "<|endoftext|>", 13) == 0, "vocab: id 50256 is <|endoftext|>",
          "got %s", eot ? show(eot, l) : "NULL");
    CHECK(tokenizer_token_bytes(t, 50257, &l) == NULL, "vocab: id 50257 is out of range", "not NULL");
    uint32_t bad_ids[2] = {15496, 50257};
    CHECK(tokenizer_decode(t, bad_ids, 2, &l) == NULL && l == 0, "decode: an invalid id gives NULL",
          "returned a buffer");
}

// ---------------------------------------------------------------------------------------------
// Reference vectors, grouped by category; each category is one CHECK naming its first failure.

typedef struct {
    char name[32];
    int n, failed;
    char detail[600];
} Category;

static void test_vectors(Tokenizer *t) {
    ErrBuf e;
    size_t len;
    char *file = read_file_text("test/data/tokenizer_vectors.txt", &len, &e);
    CHECK(file != NULL, "vectors: file readable", "%s", file ? "" : e.msg);
    if (!file) return;
    Category cats[64];
    int n_cats = 0, n_cases = 0, rt_fail = 0;
    char *save = NULL;
    for (char *line = strtok_r(file, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        if (line[0] == '#') continue;
        char *tab1 = strchr(line, '\t'), *tab2 = tab1 ? strchr(tab1 + 1, '\t') : NULL;
        if (!tab2) continue;
        *tab1 = *tab2 = '\0';
        Category *c = NULL;
        for (int k = 0; k < n_cats; k++)
            if (strcmp(cats[k].name, line) == 0) c = &cats[k];
        if (!c && n_cats < 64) {
            c = &cats[n_cats++];
            snprintf(c->name, sizeof c->name, "%s", line);
            c->n = c->failed = 0;
        }
        if (!c) continue;
        size_t hl = strlen(tab1 + 1), tl = hl / 2;  // text from hex
        char *text = xmalloc(tl + 1);
        for (size_t i = 0; i < tl; i++)
            text[i] = (char)(hexval(tab1[1 + 2 * i]) * 16 + hexval(tab1[2 + 2 * i]));
        size_t n_exp = 0, cap = 16;
        uint32_t *expect = xmalloc(cap * sizeof *expect);
        for (char *p = tab2 + 1; *p;) {
            char *endp;
            unsigned long v = strtoul(p, &endp, 10);
            if (endp == p) break;
            if (n_exp == cap) expect = xrealloc(expect, (cap *= 2) * sizeof *expect);
            expect[n_exp++] = (uint32_t)v;
            p = endp;
        }
        uint32_t *got, *again;
        size_t n_got = tokenizer_encode(t, text, tl, &got);
        size_t n_again = tokenizer_encode(t, text, tl, &again);  // now from the word cache
        int ok = n_got == n_exp && memcmp(got, expect, n_exp * sizeof *got) == 0 &&
                 n_again == n_got && memcmp(again, got, n_got * sizeof *got) == 0;
        c->n++;
        n_cases++;
        if (!ok && c->failed++ == 0)
            snprintf(c->detail, sizeof c->detail, "\"%s\": expected [%s], got [%s]", show(text, tl),
                     show_ids(expect, n_exp), show_ids(got, n_got));
        rt_fail += !round_trips(t, text, tl);
        free(got); free(again); free(expect); free(text);
    }
    free(file);
    for (int k = 0; k < n_cats; k++) {
        char name[64];
        snprintf(name, sizeof name, "vectors: %.31s (%d cases)", cats[k].name, cats[k].n);
        CHECK(cats[k].failed == 0, name, "%d of %d differ; first: %s", cats[k].failed, cats[k].n,
              cats[k].detail);
    }
    CHECK(n_cases >= 1000, "vectors: at least 1000 cases read", "read %d", n_cases);
    CHECK(rt_fail == 0, "vectors: decode(encode(x)) == x", "%d cases differ", rt_fail);
}

// ---------------------------------------------------------------------------------------------
// A whole novel (Pride and Prejudice) against the reference's id count and checksums.

static void test_novel(Tokenizer *t) {
    ErrBuf e;
    size_t len, elen;
    char *text = read_file_text("test/data/tokenizer_novel.txt", &len, &e);
    char *expect = text ? read_file_text("test/data/tokenizer_novel_ids.txt", &elen, &e) : NULL;
    CHECK(text && expect, "novel: files readable", "%s", e.msg);
    if (!text || !expect) { free(text); return; }
    uint32_t *ids;
    double t0 = now_seconds();
    size_t n = tokenizer_encode(t, text, len, &ids);
    double dt = now_seconds() - t0;
    unsigned long long count = 0, fnv = 0, block_size = 0;
    const char *p = strstr(expect, "\ncount ");
    if (p) count = strtoull(p + 7, NULL, 10);
    if ((p = strstr(expect, "\nfnv64 "))) fnv = strtoull(p + 7, NULL, 16);
    if ((p = strstr(expect, "\nblock_size "))) block_size = strtoull(p + 12, NULL, 10);
    CHECK(n == count, "novel: id count matches the reference", "got %zu, expected %llu", n, count);
    uint64_t h = fnv64_ids(ids, n);
    // On a mismatch, name the first 4096-id block that differs.
    long first_bad = -1;
    for (p = strstr(expect, "\nblock "); p && block_size && first_bad < 0; p = strstr(p + 1, "\nblock ")) {
        char *endp;
        unsigned long b = strtoul(p + 7, &endp, 10);
        unsigned long long bh = strtoull(endp, NULL, 16);
        size_t from = b * block_size, to = from + block_size < n ? from + block_size : n;
        if (from >= n || fnv64_ids(ids + from, to - from) != bh) first_bad = (long)b;
    }
    CHECK(h == fnv && first_bad < 0, "novel: id stream matches the reference (FNV-1a 64)",
          "got %016llx, expected %016llx; first differing block %ld (ids %ld..)",
          (unsigned long long)h, fnv, first_bad, first_bad * (long)block_size);
    CHECK(round_trips(t, text, len), "novel: decode(encode(text)) == text", "differs");
    // Threads sharing the Tokenizer (as an OpenMP data preparation would): each chunk's ids equal
    // the serial result. A fresh tokenizer per round so the thread caches start empty.
    enum { CHUNKS = 8 };
    size_t bad_chunks = 0;
    for (int round = 0; round < 2; round++) {
        Tokenizer *shared = tokenizer_load(NULL, &e);
        if (!shared) break;
        uint32_t *chunk_ids[CHUNKS];
        size_t chunk_n[CHUNKS];
#pragma omp parallel for schedule(dynamic, 1)
        for (int c = 0; c < CHUNKS; c++) {
            size_t from = len * (size_t)c / CHUNKS, to = len * (size_t)(c + 1) / CHUNKS;
            chunk_n[c] = tokenizer_encode(shared, text + from, to - from, &chunk_ids[c]);
        }
        for (int c = 0; c < CHUNKS; c++) {
            size_t from = len * (size_t)c / CHUNKS, to = len * (size_t)(c + 1) / CHUNKS;
            uint32_t *serial;
            size_t m = tokenizer_encode(t, text + from, to - from, &serial);
            bad_chunks += m != chunk_n[c] || memcmp(serial, chunk_ids[c], m * sizeof *serial) != 0;
            free(serial);
            free(chunk_ids[c]);
        }
        tokenizer_free(shared);
    }
    CHECK(bad_chunks == 0, "novel: threads sharing one Tokenizer agree with serial encoding",
          "%zu chunks differ", bad_chunks);
    printf("# novel: %zu bytes -> %zu ids in %.3f s (%.1f MB/s, warm-up run)\n", len, n, dt,
           len / dt / 1e6);
    free(ids); free(text); free(expect);
}

// ---------------------------------------------------------------------------------------------
// Bytes that are not UTF-8: never a crash, exact round trips, each bad byte a "symbol".

static size_t encode_to(Tokenizer *t, const char *s, uint32_t *out, size_t at) {
    uint32_t *ids;
    size_t n = tokenizer_encode(t, s, strlen(s), &ids);
    memcpy(out + at, ids, n * sizeof *ids);
    free(ids);
    return at + n;
}

// encode(whole) must equal the concatenation of encode(piece) for the expected pieces.
static int splits_as(Tokenizer *t, const char *whole, const char *const *pieces, int n_pieces) {
    uint32_t expect[256], *got;
    size_t n_exp = 0;
    for (int k = 0; k < n_pieces; k++) n_exp = encode_to(t, pieces[k], expect, n_exp);
    size_t n = tokenizer_encode(t, whole, strlen(whole), &got);
    int ok = n == n_exp && memcmp(got, expect, n * sizeof *got) == 0;
    free(got);
    return ok;
}

static void test_invalid_utf8(Tokenizer *t) {
    const char *fixed[] = {"\x80", "\xBF\xBF", "\xC0\x80", "\xC1\xBF", "\xE0\x80\x80", "\xED\xA0\x80",
                           "\xED\xBF\xBF", "\xF0\x80\x80\x80", "\xF4\x90\x80\x80", "\xF5\xFF\xFE",
                           "abc\xE6\x97", "\xF0\x9F\x98", "\xC3", "a\xC3 b\xC3\xA9", "'\xFFs",
                           "\xFF's", " \xFF\xFE\xFD", "\xE2\x80\xA8\xE2\x80"};
    int bad = -1;
    for (int k = 0; k < (int)(sizeof fixed / sizeof fixed[0]) && bad < 0; k++)
        if (!round_trips(t, fixed[k], strlen(fixed[k]))) bad = k;
    CHECK(bad < 0, "invalid utf8: hand-picked sequences round-trip", "\"%s\"",
          bad < 0 ? "" : show(fixed[bad], strlen(fixed[bad])));
    // Pre-tokenization: an invalid byte is one non-letter, non-number, non-space character.
    const char *p1[] = {"word", "\xFF", "word"};
    CHECK(splits_as(t, "word\xFFword", p1, 3), "invalid utf8: bad byte splits letters", "differs");
    const char *p2[] = {"x", " \xFF!", "y"};
    CHECK(splits_as(t, "x \xFF!y", p2, 3), "invalid utf8: bad byte joins ' ?[^\\s\\p{L}\\p{N}]+'", "differs");
    const char *p3[] = {"caf", "\xC3", " na\xC3\xAFve"};  // truncated é, then a valid ï
    CHECK(splits_as(t, "caf\xC3 na\xC3\xAFve", p3, 3), "invalid utf8: truncated sequence", "differs");
    const char *p4[] = {"12", "\xED\xA0\x80", "34"};  // an encoded surrogate is 3 bad bytes
    CHECK(splits_as(t, "12\xED\xA0\x80" "34", p4, 3), "invalid utf8: encoded surrogate", "differs");

    // Random byte strings: uniform bytes, and UTF-8-like mixes of lead and continuation bytes.
    int fails = 0;
    char worst[256] = "";
    for (int k = 0; k < 3000; k++) {
        size_t n = rng_next() % 200;
        char *s = xmalloc(n + 1);
        for (size_t i = 0; i < n; i++) {
            uint32_t r = rng_next();
            if (k % 2) s[i] = (char)r;
            else {
                static const unsigned char pool[] = {'a', ' ', '\'', 's', '1', '\n', 0x80, 0xBF, 0xC3,
                                                     0xA9, 0xE6, 0x97, 0xA5, 0xF0, 0x9F, 0x98, 0x80,
                                                     0xED, 0xA0, 0xFF, 0xC0, 0xF4, 0x90, 0x00};
                s[i] = (char)pool[r % sizeof pool];
            }
        }
        if (!round_trips(t, s, n) && fails++ == 0) snprintf(worst, sizeof worst, "%s", show(s, n));
        free(s);
    }
    CHECK(fails == 0, "invalid utf8: 3000 random byte strings round-trip", "%d fail; first \"%s\"",
          fails, worst);
    size_t big = 1 << 20;  // one long piece of random letters and bad bytes (the heap BPE path)
    char *s = xmalloc(big);
    for (size_t i = 0; i < big; i++) s[i] = (char)(rng_next() % 7 == 0 ? 0xFF : 'a' + rng_next() % 26);
    double t0 = now_seconds();
    int ok = round_trips(t, s, big);
    CHECK(ok, "invalid utf8: 1 MiB of letters and bad bytes round-trips", "differs");
    for (size_t i = 0; i < big; i++) s[i] = (char)('a' + rng_next() % 26);
    ok = round_trips(t, s, big);
    CHECK(ok && now_seconds() - t0 < 20, "long piece: 1 MiB without a space round-trips quickly",
          "ok=%d, %.1f s", ok, now_seconds() - t0);
    free(s);
}

// ---------------------------------------------------------------------------------------------
// Load errors name what they tried.

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) FATAL("cannot write %s", path);
    fputs(text, f);
    fclose(f);
}

static void test_load_errors(void) {
    ErrBuf e = {{0}};
    Tokenizer *t = tokenizer_load("/nonexistent/vocab_dir", &e);
    CHECK(!t && strstr(e.msg, "/nonexistent/vocab_dir/encoder.json"), "load: missing dir names the file",
          "message: %s", e.msg);
    tokenizer_free(t);

    char cwd[4096], tmp[] = "/tmp/test_tokenizer_XXXXXX", path[4200];
    if (!getcwd(cwd, sizeof cwd) || !mkdtemp(tmp)) FATAL("getcwd/mkdtemp failed");
    char real_dir[4200];
    snprintf(real_dir, sizeof real_dir, "%s/data/gpt2", cwd);

    // Default location: nothing in ./data/gpt2, nothing beside the binary. A set
    // TRAIN_GPT_VOCAB_DIR takes precedence and, when wrong, is reported rather than skipped.
    if (chdir(tmp)) FATAL("chdir %s", tmp);
    setenv("TRAIN_GPT_VOCAB_DIR", "/nonexistent/env_dir", 1);
    e.msg[0] = '\0';
    t = tokenizer_load(NULL, &e);
    CHECK(!t && strstr(e.msg, "TRAIN_GPT_VOCAB_DIR=/nonexistent/env_dir") && strstr(e.msg, "encoder.json"),
          "load: a wrong TRAIN_GPT_VOCAB_DIR is named, not skipped", "message: %s", e.msg);
    tokenizer_free(t);
    unsetenv("TRAIN_GPT_VOCAB_DIR");
    t = tokenizer_load(NULL, &e);
    CHECK(!t && strstr(e.msg, "data/gpt2/encoder.json (current directory)") &&
              strstr(e.msg, "beside the binary") && strstr(e.msg, "--vocab") &&
              strstr(e.msg, "TRAIN_GPT_VOCAB_DIR"),
          "load: default location error names every path tried", "message: %s", e.msg);
    tokenizer_free(t);
    setenv("TRAIN_GPT_VOCAB_DIR", real_dir, 1);
    t = tokenizer_load(NULL, &e);
    CHECK(t != NULL, "load: TRAIN_GPT_VOCAB_DIR is used", "message: %s", e.msg);
    tokenizer_free(t);
    unsetenv("TRAIN_GPT_VOCAB_DIR");

    // Broken files: the message names the file (and line for vocab.bpe).
    snprintf(path, sizeof path, "%s/encoder.json", tmp);
    write_text(path, "{\"a\": 0, \"b\": ");
    t = tokenizer_load(tmp, &e);
    CHECK(!t && strstr(e.msg, path) && strstr(e.msg, "JSON"), "load: truncated encoder.json",
          "message: %s", e.msg);
    write_text(path, "{\"a\": 0, \"b\": 1, \"c\": 7}");
    t = tokenizer_load(tmp, &e);
    CHECK(!t && strstr(e.msg, path), "load: too small encoder.json", "message: %s", e.msg);
    // The real encoder.json with a vocab.bpe whose second merge names no token.
    snprintf(path, sizeof path, "%s/encoder.json", tmp);
    char src[4300];
    snprintf(src, sizeof src, "%s/encoder.json", real_dir);
    if (symlink(src, path) && (unlink(path) || symlink(src, path))) FATAL("symlink %s", path);
    snprintf(path, sizeof path, "%s/vocab.bpe", tmp);
    write_text(path, "#version: 0.2\n\xC4\xA0 t\nzzzzqq x\n");
    t = tokenizer_load(tmp, &e);
    char want[4300];
    snprintf(want, sizeof want, "%s:3", path);
    CHECK(!t && strstr(e.msg, want) && strstr(e.msg, "zzzzqq"), "load: bad merge names file:line",
          "message: %s", e.msg);
    write_text(path, "#version: 0.2\n\xC4\xA0 t\n");
    t = tokenizer_load(tmp, &e);
    CHECK(t != NULL && tokenizer_merge_count(t) == 1, "load: a one-merge vocab.bpe loads", "%s", e.msg);
    if (t) {  // with only the merge " t": "at" stays two bytes, " t" is one token
        uint32_t *ids;
        size_t n = tokenizer_encode(t, "at t", 4, &ids);
        CHECK(n == 3 && ids[2] == 256, "load: encoding follows the loaded merges", "got [%s]",
              show_ids(ids, n));
        free(ids);
    }
    tokenizer_free(t);
    unlink(path);
    snprintf(path, sizeof path, "%s/encoder.json", tmp);
    unlink(path);
    rmdir(tmp);
    if (chdir(cwd)) FATAL("chdir %s", cwd);
}

// ---------------------------------------------------------------------------------------------
// The commands, run in a child with stdin/stdout/stderr redirected to files.

static int run_cmd(int (*cmd)(int, char **), char **argv, int argc, const char *input, char **out,
                   char **err) {
    char in_path[] = "/tmp/tok_in_XXXXXX", out_path[] = "/tmp/tok_out_XXXXXX", err_path[] = "/tmp/tok_err_XXXXXX";
    int fi = mkstemp(in_path), fo = mkstemp(out_path), fe = mkstemp(err_path);
    if (fi < 0 || fo < 0 || fe < 0) FATAL("mkstemp failed");
    if (write(fi, input, strlen(input)) != (ssize_t)strlen(input)) FATAL("write failed");
    lseek(fi, 0, SEEK_SET);
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(fi, 0); dup2(fo, 1); dup2(fe, 2);
        _exit(cmd(argc, argv));
    }
    int status = 0;
    waitpid(pid, &status, 0);
    close(fi); close(fo); close(fe);
    ErrBuf e;
    *out = read_file_text(out_path, NULL, &e);
    *err = read_file_text(err_path, NULL, &e);
    unlink(in_path); unlink(out_path); unlink(err_path);
    return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

static void test_commands(void) {
    char *out, *err;
    char *enc_argv[] = {"encode", "--vocab", "data/gpt2", NULL};
    int rc = run_cmd(cmd_encode, enc_argv, 3, "Hello world", &out, &err);
    CHECK(rc == 0 && strcmp(out, "15496 995\n") == 0, "cmd encode: ids and a newline", "rc %d, out '%s' err '%s'",
          rc, out, err);
    free(out); free(err);
    rc = run_cmd(cmd_encode, enc_argv, 1, "", &out, &err);
    CHECK(rc == 0 && strcmp(out, "\n") == 0, "cmd encode: empty input gives an empty line", "rc %d, out '%s'",
          rc, out);
    free(out); free(err);
    char *dec_argv[] = {"decode", NULL};
    rc = run_cmd(cmd_decode, dec_argv, 1, " 15496\n995\t0 50256 ", &out, &err);
    CHECK(rc == 0 && strcmp(out, "Hello world!<|endoftext|>") == 0, "cmd decode: whitespace-separated ids",
          "rc %d, out '%s' err '%s'", rc, out, err);
    free(out); free(err);
    rc = run_cmd(cmd_decode, dec_argv, 1, "15496 50257 995", &out, &err);
    CHECK(rc == 1 && strstr(err, "50257") && strstr(err, "item 2") && out[0] == '\0',
          "cmd decode: an out-of-range id is named, exit 1", "rc %d, err '%s'", rc, err);
    free(out); free(err);
    rc = run_cmd(cmd_decode, dec_argv, 1, "15496 hello", &out, &err);
    CHECK(rc == 1 && strstr(err, "'hello'"), "cmd decode: a non-number is named, exit 1", "rc %d, err '%s'",
          rc, err);
    free(out); free(err);
    char *bad_argv[] = {"encode", "--vocab", "/nonexistent/v", NULL};
    rc = run_cmd(cmd_encode, bad_argv, 3, "x", &out, &err);
    CHECK(rc == 1 && strstr(err, "/nonexistent/v/encoder.json"), "cmd encode: bad --vocab is named",
          "rc %d, err '%s'", rc, err);
    free(out); free(err);
    char *junk_argv[] = {"encode", "--frobnicate", NULL};
    rc = run_cmd(cmd_encode, junk_argv, 2, "x", &out, &err);
    CHECK(rc == 1 && strstr(err, "--frobnicate"), "cmd encode: unknown argument is named", "rc %d, err '%s'",
          rc, err);
    free(out); free(err);
}

int main(void) {
    ErrBuf e;
    Tokenizer *t = tokenizer_load(NULL, &e);
    CHECK(t != NULL, "load: default location (./data/gpt2)", "%s", e.msg);
    if (!t) return test_summary("test_tokenizer");
    test_vocab(t);
    uint32_t *ids;
    size_t n = tokenizer_encode(t, "<|endoftext|>", 13, &ids);
    int has_eot = 0;
    for (size_t k = 0; k < n; k++) has_eot |= ids[k] == GPT2_EOT;
    static const uint32_t eot_text[7] = {27, 91, 437, 1659, 5239, 91, 29};  // < | end of text | >
    CHECK(n == 7 && !has_eot && memcmp(ids, eot_text, sizeof eot_text) == 0,
          "encode: literal <|endoftext|> is ordinary text", "got [%s]", show_ids(ids, n));
    free(ids);
    test_vectors(t);
    test_novel(t);
    test_invalid_utf8(t);
    tokenizer_free(t);
    test_load_errors();
    test_commands();
    return test_summary("test_tokenizer");
}
