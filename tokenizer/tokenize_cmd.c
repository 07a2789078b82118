// tokenize_cmd.c: `train_gpt tokenize`, text files -> llm.c token shards with a held-out split.
//
//   train_gpt tokenize --out DIR [--val-fraction F] [--shard-tokens N] [--vocab DIR]
//                      [--doc-separator STR] [--seed S] [--force] FILE...
//
// Every document (a whole FILE, or each piece of a FILE between occurrences of --doc-separator)
// is written as <|endoftext|> followed by its GPT-2 tokens, so shards read like llm.c's.
// Which documents are held out for validation is decided before any text is encoded: every
// document index i gets a seeded hash, and the round(F * n) documents with the smallest hashes
// go to val (at least one when F > 0 and n >= 2, never all of them). A document is never split
// between train and val, so the validation split shares no document with training; it may be
// split across two shards of the same split.
//
// Output: DIR/train_000000.bin, train_000001.bin, ... and DIR/val_000000.bin, ... each holding
// at most N tokens (llm.c format: version 1, uint16 tokens, since GPT-2 ids are < 65536).
// Existing shards in DIR are never overwritten unless --force is given.
#include "tokenizer/tokenizer.h"

#include <dirent.h>    // opendir/readdir: look for existing shards in the output directory
#include <errno.h>     // errno for stat/unlink messages
#include <math.h>      // llround for the number of held-out documents
#include <stdbool.h>   // bool
#include <string.h>    // strcmp, memmem, memcpy
#include <sys/stat.h>  // stat: inputs must be regular files; their sizes for the progress bar
#include <unistd.h>    // isatty: progress bar only on a terminal

#include "dataloader.h"  // shard_write
#include "core/rng.h"    // splitmix64_mix: the hash that splits documents

#define DEFAULT_SHARD_TOKENS 100000000LL
#define DEFAULT_VAL_FRACTION 0.05
#define DEFAULT_SEED 1337ULL
// Documents are encoded in pieces of about this many bytes (see safe_cut), which bounds the
// memory of one encode call and lets the progress bar move inside a large file.
#define ENCODE_PIECE_BYTES (1 << 20)

static const char USAGE[] =
    "usage: train_gpt tokenize --out DIR [options] FILE...\n"
    "  Encodes text files with GPT-2's tokenizer into llm.c shards DIR/train_*.bin, DIR/val_*.bin.\n"
    "  Each FILE is one document (or several, with --doc-separator); each document starts with\n"
    "  <|endoftext|> (50256). Whole documents are held out for validation.\n"
    "options:\n"
    "  --out DIR              output directory (created if missing)\n"
    "  --val-fraction F       fraction of documents held out for validation, 0 <= F < 1 (default 0.05)\n"
    "  --shard-tokens N       at most N tokens per shard file (default 100000000)\n"
    "  --doc-separator STR    split every FILE into documents at STR (dropped; empty pieces skipped);\n"
    "                         escapes \\n \\t \\r \\f \\\\ \\xHH are understood, e.g. '\\n\\n\\n'\n"
    "  --seed S               seed of the train/val assignment (default 1337)\n"
    "  --vocab DIR            directory with encoder.json and vocab.bpe (default: see README)\n"
    "  --force                replace shards already in DIR (default: refuse)\n";

typedef struct {
    const char *out_dir;
    const char *vocab_dir;     // NULL: the tokenizer's default
    double val_fraction;
    long long shard_tokens;
    unsigned long long seed;
    char *separator;           // unescaped --doc-separator, NULL if none
    size_t separator_len;
    bool force;
    char **files;              // (n_files) input paths, pointing into argv
    int n_files;
} TokenizeArgs;

// ---------------------------------------------------------------------------------------------
// Command line.

static int parse_double(const char *opt, const char *s, double *out, ErrBuf *e) {
    char *end;
    errno = 0;
    double v = strtod(s, &end);
    if (end == s || *end != '\0' || errno != 0)
        return errf(e, "%s: expected a number, got '%s'", opt, s);
    *out = v;
    return 0;
}

static int parse_ll(const char *opt, const char *s, long long *out, ErrBuf *e) {
    char *end;
    errno = 0;
    long long v = strtoll(s, &end, 10);
    if (end == s || *end != '\0' || errno != 0)
        return errf(e, "%s: expected an integer, got '%s'", opt, s);
    *out = v;
    return 0;
}

static int hex_digit(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
}

// Turns the C-style escapes of --doc-separator into bytes (so '\n\n\n' needs no shell quoting
// tricks). Returns a heap string; -1 with a message on a bad escape.
static int unescape(const char *s, char **out, size_t *out_len, ErrBuf *e) {
    size_t n = strlen(s), k = 0;
    char *buf = xmalloc(n + 1);
    for (size_t i = 0; i < n; i++) {
        if (s[i] != '\\') { buf[k++] = s[i]; continue; }
        char c = s[++i];
        switch (c) {
            case 'n': buf[k++] = '\n'; break;
            case 't': buf[k++] = '\t'; break;
            case 'r': buf[k++] = '\r'; break;
            case 'f': buf[k++] = '\f'; break;
            case '\\': buf[k++] = '\\'; break;
            case 'x': {
                int hi = i + 1 < n ? hex_digit(s[i + 1]) : -1;
                int lo = i + 2 < n ? hex_digit(s[i + 2]) : -1;
                if (hi < 0 || lo < 0) {
                    free(buf);
                    return errf(e, "--doc-separator: '\\x' must be followed by two hex digits in '%s'", s);
                }
                buf[k++] = (char)(hi * 16 + lo);
                i += 2;
                break;
            }
            default:
                free(buf);
                return errf(e, "--doc-separator: unknown escape '\\%c' in '%s' (known: \\n \\t \\r \\f \\\\ \\xHH)",
                            c ? c : '0', s);
        }
    }
    if (k == 0) { free(buf); return errf(e, "--doc-separator: must not be empty"); }
    buf[k] = '\0';
    *out = buf;
    *out_len = k;
    return 0;
}

// Returns 0 (run), 1 (help printed) or -1 (error in e).
static int parse_args(int argc, char **argv, TokenizeArgs *a, ErrBuf *e) {
    memset(a, 0, sizeof *a);
    a->val_fraction = DEFAULT_VAL_FRACTION;
    a->shard_tokens = DEFAULT_SHARD_TOKENS;
    a->seed = DEFAULT_SEED;
    a->files = xcalloc((size_t)(argc > 0 ? argc : 1), sizeof(char *));
    bool only_files = false;  // after "--" everything is a file name
    for (int i = 1; i < argc; i++) {
        const char *arg = argv[i];
        if (only_files || arg[0] != '-' || strcmp(arg, "-") == 0) { a->files[a->n_files++] = argv[i]; continue; }
        if (strcmp(arg, "--") == 0) { only_files = true; continue; }
        if (strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0) { fputs(USAGE, stdout); return 1; }
        if (strcmp(arg, "--force") == 0) { a->force = true; continue; }
        // Every other option takes a value: --opt VALUE or --opt=VALUE.
        char name[64];
        const char *value = NULL;
        const char *eq = strchr(arg, '=');
        if (eq && (size_t)(eq - arg) < sizeof name) {
            memcpy(name, arg, (size_t)(eq - arg));
            name[eq - arg] = '\0';
            value = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg);
        }
        bool known = strcmp(name, "--out") == 0 || strcmp(name, "--val-fraction") == 0 ||
                     strcmp(name, "--shard-tokens") == 0 || strcmp(name, "--vocab") == 0 ||
                     strcmp(name, "--doc-separator") == 0 || strcmp(name, "--seed") == 0;
        if (!known) return errf(e, "tokenize: unknown option '%s' (see train_gpt tokenize --help)", arg);
        if (!value) {
            if (i + 1 >= argc) return errf(e, "tokenize: option %s needs a value", name);
            value = argv[++i];
        }
        if (strcmp(name, "--out") == 0) {
            if (!*value) return errf(e, "--out: expected a directory, got an empty string");
            a->out_dir = value;
        } else if (strcmp(name, "--vocab") == 0) {
            a->vocab_dir = value;
        } else if (strcmp(name, "--val-fraction") == 0) {
            if (parse_double(name, value, &a->val_fraction, e)) return -1;
            if (!(a->val_fraction >= 0.0 && a->val_fraction < 1.0))
                return errf(e, "--val-fraction: expected a fraction with 0 <= F < 1, got '%s'", value);
        } else if (strcmp(name, "--shard-tokens") == 0) {
            if (parse_ll(name, value, &a->shard_tokens, e)) return -1;
            if (a->shard_tokens < 1 || a->shard_tokens > INT32_MAX)  // the header holds an int32 count
                return errf(e, "--shard-tokens: expected 1 <= N <= %d, got '%s'", INT32_MAX, value);
        } else if (strcmp(name, "--seed") == 0) {
            long long s;
            if (parse_ll(name, value, &s, e)) return -1;
            a->seed = (unsigned long long)s;
        } else {  // --doc-separator
            free(a->separator);
            a->separator = NULL;
            if (unescape(value, &a->separator, &a->separator_len, e)) return -1;
        }
    }
    if (!a->out_dir) return errf(e, "tokenize: --out DIR is required (see train_gpt tokenize --help)");
    if (a->n_files == 0) return errf(e, "tokenize: no input files (usage: train_gpt tokenize --out DIR FILE...)");
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Documents: a whole file, or the non-empty pieces between separators.

typedef struct {
    const char *text;
    size_t len;
} Span;

// Next document of a file's text starting at *pos; false when there is none left.
static bool next_document(const char *text, size_t len, size_t *pos, const TokenizeArgs *a, Span *doc) {
    if (!a->separator) {  // the whole file, even when empty: one document per file
        if (*pos > 0) return false;
        *pos = len + 1;
        doc->text = text;
        doc->len = len;
        return true;
    }
    while (*pos < len) {
        const char *start = text + *pos;
        const char *hit = memmem(start, len - *pos, a->separator, a->separator_len);
        size_t piece = hit ? (size_t)(hit - start) : len - *pos;
        *pos += piece + (hit ? a->separator_len : 0);
        if (piece > 0) {
            doc->text = start;
            doc->len = piece;
            return true;
        }
    }
    return false;
}

// splitmix64: a well-mixed 64-bit hash of (seed, document index).
static unsigned long long doc_hash(unsigned long long seed, long long index) {
    return splitmix64_mix(seed + SPLITMIX64_GAMMA * (unsigned long long)(index + 1));
}

typedef struct {
    unsigned long long hash;
    long long index;
} DocKey;

static int cmp_doc_key(const void *pa, const void *pb) {
    const DocKey *x = pa, *y = pb;
    if (x->hash != y->hash) return x->hash < y->hash ? -1 : 1;
    return x->index < y->index ? -1 : (x->index > y->index);
}

// Marks the held-out documents: is_val (n_docs) gets 1 for the k documents of smallest hash.
static long long choose_val_documents(long long n_docs, double fraction, unsigned long long seed,
                                      unsigned char *is_val) {
    memset(is_val, 0, (size_t)n_docs);
    if (fraction <= 0.0 || n_docs < 2) return 0;
    long long k = llround(fraction * (double)n_docs);
    if (k < 1) k = 1;
    if (k > n_docs - 1) k = n_docs - 1;  // training keeps at least one document
    DocKey *keys = xmalloc((size_t)n_docs * sizeof *keys);
    for (long long i = 0; i < n_docs; i++) keys[i] = (DocKey){doc_hash(seed, i), i};
    qsort(keys, (size_t)n_docs, sizeof *keys, cmp_doc_key);
    for (long long i = 0; i < k; i++) is_val[keys[i].index] = 1;
    free(keys);
    return k;
}

// ---------------------------------------------------------------------------------------------
// Shard writer: buffers one split's tokens and writes a shard each time N are collected.

typedef struct {
    const char *dir;
    const char *split;     // "train" or "val"
    long long max_tokens;  // tokens per shard
    uint32_t *buf;         // (cap) tokens of the shard being filled
    long long n, cap;
    int shards;            // shard files written so far
    long long total;       // tokens written or buffered
    long long docs;
} ShardWriter;

static void shard_path(char *path, size_t size, const char *dir, const char *split, int index) {
    snprintf(path, size, "%s/%s_%06d.bin", dir, split, index);
}

static int writer_flush(ShardWriter *w, ErrBuf *e) {
    if (w->n == 0) return 0;
    char path[4096];
    shard_path(path, sizeof path, w->dir, w->split, w->shards);
    if (shard_write(path, w->buf, w->n, e)) return -1;
    w->shards++;
    w->n = 0;
    return 0;
}

static int writer_push(ShardWriter *w, const uint32_t *ids, long long n, ErrBuf *e) {
    w->total += n;
    while (n > 0) {
        if (w->n == w->cap) {  // grow geometrically up to one shard (a small corpus stays small)
            long long cap = w->cap ? 2 * w->cap : (1LL << 16);
            if (cap > w->max_tokens) cap = w->max_tokens;
            w->buf = xrealloc(w->buf, (size_t)cap * sizeof *w->buf);
            w->cap = cap;
        }
        long long take = w->max_tokens - w->n;
        if (take > w->cap - w->n) take = w->cap - w->n;
        if (take > n) take = n;
        memcpy(w->buf + w->n, ids, (size_t)take * sizeof *ids);
        w->n += take;
        ids += take;
        n -= take;
        if (w->n == w->max_tokens && writer_flush(w, e)) return -1;
    }
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Output directory: never replace shards the user already has, unless --force.

// Parses "<split>_<digits>.bin"; returns the index or -1.
static long long shard_index(const char *name, const char *split) {
    size_t k = strlen(split);
    if (strncmp(name, split, k) != 0 || name[k] != '_') return -1;
    const char *p = name + k + 1;
    long long idx = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) idx = idx * 10 + (*p - '0');
    if (digits == 0 || digits > 9 || strcmp(p, ".bin") != 0) return -1;
    return idx;
}

// Counts the shards already in dir (0 if dir does not exist); first names one of them.
static int existing_shards(const char *dir, char *first, size_t first_size) {
    DIR *d = opendir(dir);
    if (!d) return 0;
    int count = 0;
    struct dirent *ent;
    while ((ent = readdir(d)) != NULL) {
        if (shard_index(ent->d_name, "train") >= 0 || shard_index(ent->d_name, "val") >= 0) {
            if (count++ == 0) snprintf(first, first_size, "%s", ent->d_name);
        }
    }
    closedir(d);
    return count;
}

// With --force, shards of an older run beyond the ones just written would otherwise be picked
// up by a glob together with the new ones: remove them.
static void remove_stale_shards(const char *dir, int train_shards, int val_shards) {
    DIR *d = opendir(dir);
    if (!d) return;
    struct dirent *ent;
    char path[4096];
    while ((ent = readdir(d)) != NULL) {
        long long t = shard_index(ent->d_name, "train"), v = shard_index(ent->d_name, "val");
        if ((t >= 0 && t >= train_shards) || (v >= 0 && v >= val_shards)) {
            snprintf(path, sizeof path, "%s/%s", dir, ent->d_name);
            if (unlink(path) == 0) fprintf(stderr, "tokenize: removed stale shard %s (--force)\n", path);
        }
    }
    closedir(d);
}

// ---------------------------------------------------------------------------------------------
// Progress on a terminal.

typedef struct {
    bool on;
    double start, last;
    long long total_bytes;
} Progress;

static void progress_show(Progress *p, long long done_bytes, long long tokens, bool final) {
    if (!p->on) return;
    double now = now_seconds();
    if (!final && now - p->last < 0.2) return;
    p->last = now;
    double frac = p->total_bytes > 0 ? (double)done_bytes / (double)p->total_bytes : 1.0;
    if (frac > 1.0) frac = 1.0;
    char bar[31];
    int fill = (int)(frac * 30.0);
    for (int i = 0; i < 30; i++) bar[i] = i < fill ? '#' : '.';
    bar[30] = '\0';
    double secs = now - p->start;
    double mb = (double)done_bytes / 1e6;
    fprintf(stderr, "\rtokenize [%s] %5.1f%%  %.1f/%.1f MB  %.2f MB/s  %lld tokens", bar, 100.0 * frac,
            mb, (double)p->total_bytes / 1e6, secs > 0 ? mb / secs : 0.0, tokens);
    if (final) fputc('\n', stderr);
    fflush(stderr);
}

// ---------------------------------------------------------------------------------------------
// Encoding.

static bool is_ascii_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }

// A cut point for encoding a long document in pieces without changing its tokens: just before a
// space that sits between two ASCII letters ("...abc| def..."). GPT-2's pre-tokenizer ends a
// word at such a space and starts the next piece " def" there, so no BPE word spans the cut.
// Returns len when no cut is needed or none is found near the target.
static size_t safe_cut(const char *text, size_t len, size_t target) {
    if (len <= target) return len;
    for (size_t i = target; i + 1 < len; i++) {
        if (text[i] == ' ' && is_ascii_letter(text[i - 1]) && is_ascii_letter(text[i + 1])) return i;
    }
    return len;
}

// Encodes one document into w: <|endoftext|> first, then its tokens.
static int encode_document(Tokenizer *tok, Span doc, ShardWriter *w, Progress *pg,
                           long long *done_bytes, long long *tokens, ErrBuf *e) {
    const uint32_t eot = GPT2_EOT;
    if (writer_push(w, &eot, 1, e)) return -1;
    (*tokens)++;
    size_t pos = 0;
    while (pos < doc.len) {
        size_t piece = safe_cut(doc.text + pos, doc.len - pos, ENCODE_PIECE_BYTES);
        uint32_t *ids = NULL;
        size_t n = tokenizer_encode(tok, doc.text + pos, piece, &ids);
        int rc = writer_push(w, ids, (long long)n, e);
        free(ids);
        if (rc) return -1;
        *tokens += (long long)n;
        *done_bytes += (long long)piece;
        pos += piece;
        progress_show(pg, *done_bytes, *tokens, false);
    }
    w->docs++;
    return 0;
}

// ---------------------------------------------------------------------------------------------

typedef struct {
    long long n_docs;
    long long total_bytes;
} InputScan;

// First pass: every input must be a readable regular file; count the documents (reads the
// files only when a separator splits them).
static int scan_inputs(const TokenizeArgs *a, InputScan *s, ErrBuf *e) {
    memset(s, 0, sizeof *s);
    for (int f = 0; f < a->n_files; f++) {
        const char *path = a->files[f];
        struct stat st;
        if (stat(path, &st) != 0) return errf(e, "%s: cannot read input file: %s", path, strerror(errno));
        if (!S_ISREG(st.st_mode)) return errf(e, "%s: input is not a regular file", path);
        FILE *fp = fopen(path, "rb");
        if (!fp) return errf(e, "%s: cannot open input file: %s", path, strerror(errno));
        fclose(fp);
        s->total_bytes += (long long)st.st_size;
        if (!a->separator) { s->n_docs++; continue; }
        size_t len;
        char *text = read_file_text(path, &len, e);
        if (!text) return -1;
        size_t pos = 0;
        Span doc;
        while (next_document(text, len, &pos, a, &doc)) s->n_docs++;
        free(text);
    }
    if (s->n_docs == 0) return errf(e, "tokenize: the input files hold no documents (all empty?)");
    return 0;
}

static int run_tokenize(const TokenizeArgs *a, ErrBuf *e) {
    double t0 = now_seconds();
    char first[512];
    int existing = existing_shards(a->out_dir, first, sizeof first);
    if (existing > 0 && !a->force)
        return errf(e, "%s already holds %d shard file(s) (e.g. %s); refusing to overwrite them "
                       "(choose another --out, or pass --force to replace them)", a->out_dir, existing, first);
    InputScan scan;
    if (scan_inputs(a, &scan, e)) return -1;
    unsigned char *is_val = xmalloc((size_t)scan.n_docs);
    long long n_val = choose_val_documents(scan.n_docs, a->val_fraction, a->seed, is_val);
    Tokenizer *tok = tokenizer_load(a->vocab_dir, e);
    if (!tok) { free(is_val); return -1; }
    if (make_dirs(a->out_dir, e)) { tokenizer_free(tok); free(is_val); return -1; }

    ShardWriter train = {.dir = a->out_dir, .split = "train", .max_tokens = a->shard_tokens};
    ShardWriter val = {.dir = a->out_dir, .split = "val", .max_tokens = a->shard_tokens};
    Progress pg = {.on = isatty(STDERR_FILENO) != 0, .start = t0, .last = 0.0, .total_bytes = scan.total_bytes};
    long long done_bytes = 0, tokens = 0, doc_index = 0;
    int rc = 0;
    for (int f = 0; f < a->n_files && rc == 0; f++) {
        size_t len;
        char *text = read_file_text(a->files[f], &len, e);
        if (!text) { rc = -1; break; }
        size_t pos = 0, seen = 0;
        Span doc;
        while (rc == 0 && next_document(text, len, &pos, a, &doc)) {
            ShardWriter *w = is_val[doc_index++] ? &val : &train;
            long long before = done_bytes;
            rc = encode_document(tok, doc, w, &pg, &done_bytes, &tokens, e);
            seen += (size_t)(done_bytes - before);
        }
        done_bytes += (long long)(len - seen);  // separators count as done too
        free(text);
        progress_show(&pg, done_bytes, tokens, false);
    }
    if (rc == 0) rc = writer_flush(&train, e);
    if (rc == 0) rc = writer_flush(&val, e);
    progress_show(&pg, done_bytes, tokens, true);
    if (rc == 0 && a->force) remove_stale_shards(a->out_dir, train.shards, val.shards);
    if (rc == 0) {
        double secs = now_seconds() - t0;
        printf("tokenize: %lld documents (%lld train, %lld val), %lld tokens (%lld train, %lld val), "
               "%d shards (%d train, %d val) in %s\n",
               scan.n_docs, train.docs, val.docs, tokens, train.total, val.total,
               train.shards + val.shards, train.shards, val.shards, a->out_dir);
        printf("tokenize: %.1f MB of text in %.1f s (%.2f MB/s)\n", (double)scan.total_bytes / 1e6, secs,
               secs > 0 ? (double)scan.total_bytes / 1e6 / secs : 0.0);
        if (a->val_fraction > 0 && n_val == 0)
            printf("tokenize: note: only %lld document, so no validation split; split a file into "
                   "documents with --doc-separator\n", scan.n_docs);
        // Whole documents are held out: with few (or very unequal) documents the validation share
        // of the tokens can be far from F, e.g. one of two files.
        double val_share = tokens > 0 ? (double)val.total / (double)tokens : 0.0;
        if (n_val > 0 && (val_share > 2.0 * a->val_fraction || val_share < 0.5 * a->val_fraction))
            fprintf(stderr, "tokenize: warning: the validation split holds %.1f%% of the tokens (%lld of %lld documents), "
                   "not the %.1f%% --val-fraction asks for: documents are held out whole; split the files into "
                   "more documents with --doc-separator\n", 100.0 * val_share, val.docs, scan.n_docs,
                   100.0 * a->val_fraction);
    }
    free(train.buf);
    free(val.buf);
    tokenizer_free(tok);
    free(is_val);
    return rc;
}

int cmd_tokenize(int argc, char **argv) {
    TokenizeArgs a;
    ErrBuf e = {{0}};
    int parsed = parse_args(argc, argv, &a, &e);
    int rc = 0;
    if (parsed < 0) {
        fprintf(stderr, "train_gpt: error: %s\n", e.msg);
        rc = 1;
    } else if (parsed == 0 && run_tokenize(&a, &e) != 0) {
        fprintf(stderr, "train_gpt: error: %s\n", e.msg);
        rc = 1;
    }
    free(a.separator);
    free(a.files);
    return rc;
}
