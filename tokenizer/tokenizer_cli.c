// tokenizer_cli.c: the `encode` and `decode` commands of train_gpt.
//
//   train_gpt encode [--vocab DIR] < text      ids, space-separated, one line
//   train_gpt decode [--vocab DIR] < ids       the bytes those ids stand for
//
// (`tokenize`, which prepares whole corpora, lives with the data preparation code.)
#include <ctype.h>   // isspace, isdigit
#include <errno.h>   // errno for stdin/stdout failures
#include <stdio.h>   // stdin, stdout, fread, fwrite
#include <stdlib.h>  // free
#include <string.h>  // strcmp, strerror

#include "core/common.h"          // ErrBuf, errf, xrealloc
#include "tokenizer/tokenizer.h"  // Tokenizer, tokenizer_load, tokenizer_encode, tokenizer_token_bytes

// Reads all of stdin into a heap buffer. Returns NULL with e filled if reading fails.
static char *read_stdin(size_t *len, ErrBuf *e) {
    size_t cap = 1 << 16, n = 0;
    char *buf = xmalloc(cap);
    for (;;) {
        if (n == cap) buf = xrealloc(buf, cap *= 2);
        size_t got = fread(buf + n, 1, cap - n, stdin);
        n += got;
        if (got == 0) break;
    }
    if (ferror(stdin)) {
        free(buf);
        errf(e, "reading standard input: %s", strerror(errno));
        return NULL;
    }
    *len = n;
    return buf;
}

static void usage(FILE *f, const char *cmd) {
    if (!strcmp(cmd, "encode"))
        fprintf(f, "usage: train_gpt encode [--vocab DIR] < text\n"
                   "  Encodes standard input with GPT-2's tokenizer and prints the token ids, space-separated,\n"
                   "  on one line.\n");
    else
        fprintf(f, "usage: train_gpt decode [--vocab DIR] < ids\n"
                   "  Reads GPT-2 token ids (whitespace-separated) from standard input and writes the bytes they\n"
                   "  stand for.\n");
    fprintf(f, "  --vocab DIR   directory with encoder.json and vocab.bpe (default: see README)\n"
               "  --help        this text\n");
}

// Whether the arguments ask for the usage (--help or -h anywhere).
static int wants_help(int argc, char **argv) {
    for (int i = 1; i < argc; i++)
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) return 1;
    return 0;
}

// Parses "[--vocab DIR]" and loads the tokenizer; NULL with e filled on a bad argument or vocab.
static Tokenizer *load_from_args(int argc, char **argv, ErrBuf *e) {
    const char *dir = NULL;
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--vocab") == 0 && i + 1 < argc) {
            dir = argv[++i];
        } else {
            errf(e, "%s: unknown or incomplete argument '%s'; usage: train_gpt %s [--vocab DIR] "
                 "< input", argv[0], argv[i], argv[0]);
            return NULL;
        }
    }
    return tokenizer_load(dir, e);
}

static int fail(const ErrBuf *e) {
    fprintf(stderr, "train_gpt: error: %s\n", e->msg);
    return 1;
}

static int finish_stdout(void) {
    if (fflush(stdout) != 0 || ferror(stdout)) {
        fprintf(stderr, "train_gpt: error: writing standard output: %s\n", strerror(errno));
        return 1;
    }
    return 0;
}

// What both commands start with: the tokenizer (from --vocab or the default place) and all of
// standard input. Returns 0; -1 when --help printed the usage (exit 0); or the exit status after
// reporting the error.
static int open_command(int argc, char **argv, Tokenizer **t, char **text, size_t *len) {
    ErrBuf e;
    if (wants_help(argc, argv)) {
        usage(stdout, argv[0]);
        return -1;  // done: the usage is all there is to do
    }
    *t = load_from_args(argc, argv, &e);
    if (!*t) return fail(&e);
    *text = read_stdin(len, &e);
    if (!*text) { tokenizer_free(*t); return fail(&e); }
    return 0;
}

int cmd_encode(int argc, char **argv) {
    Tokenizer *t;
    char *text;
    size_t len;
    int rc = open_command(argc, argv, &t, &text, &len);
    if (rc) return rc < 0 ? 0 : rc;
    uint32_t *ids;
    size_t n = tokenizer_encode(t, text, len, &ids);
    for (size_t k = 0; k < n; k++) printf(k ? " %u" : "%u", ids[k]);
    printf("\n");
    free(ids);
    free(text);
    tokenizer_free(t);
    return finish_stdout();
}

int cmd_decode(int argc, char **argv) {
    Tokenizer *t;
    char *text;
    size_t len;
    int opened = open_command(argc, argv, &t, &text, &len);
    if (opened) return opened < 0 ? 0 : opened;
    ErrBuf e;
    // Check every id before writing anything, so a bad id leaves stdout empty.
    size_t cap = 1024, n = 0;
    uint32_t *ids = xmalloc(cap * sizeof *ids);
    int rc = 0;
    for (size_t i = 0, item = 1; i < len && rc == 0; item++) {
        while (i < len && isspace((unsigned char)text[i])) i++;
        if (i == len) break;
        size_t start = i;
        while (i < len && !isspace((unsigned char)text[i])) i++;
        uint64_t v = 0;
        int ok = i - start <= 9;  // 9 digits cannot overflow; longer is out of range anyway
        for (size_t k = start; k < i && ok; k++) {
            ok = isdigit((unsigned char)text[k]);
            v = v * 10 + (uint64_t)(text[k] - '0');
        }
        size_t tl;
        if (!ok || !tokenizer_token_bytes(t, (uint32_t)v, &tl)) {
            rc = errf(&e, "decode: invalid token id '%.*s' (item %zu of the input): expected an "
                      "integer in 0..%u", (int)(i - start > 40 ? 40 : i - start), text + start,
                      item, tokenizer_vocab_size(t) - 1);
            break;
        }
        if (n == cap) ids = xrealloc(ids, (cap *= 2) * sizeof *ids);
        ids[n++] = (uint32_t)v;
    }
    if (rc == 0) {
        size_t out_len;
        char *out = tokenizer_decode(t, ids, n, &out_len);
        fwrite(out, 1, out_len, stdout);
        free(out);
        rc = finish_stdout();
    } else {
        fail(&e);
        rc = 1;
    }
    free(ids);
    free(text);
    tokenizer_free(t);
    return rc;
}
