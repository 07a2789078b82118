// bench_tokenizer.c: GPT-2 encode throughput (MB/s of input text) on one core.
//
//   gcc -std=c11 -D_GNU_SOURCE -O2 -I. core/common.c tokenizer/tokenizer.c tokenizer/tokenizer_vocab.c tokenizer/unicode_classes.c
//       dev/bench/bench_tokenizer.c -lcjson -lm -o build/bench_tokenizer      (one command line)
//   ./build/bench_tokenizer [text file, default test/data/tokenizer_novel.txt] [repeats, default 10]
//
// Prints the load time, the first pass over the text with a fresh tokenizer (empty word cache:
// every distinct word goes through BPE once) and the best of the repeated passes (warm cache).
#include <stdio.h>   // printf
#include <stdlib.h>  // atoi, free

#include "core/common.h"          // ErrBuf, read_file_text, now_seconds, die_user
#include "tokenizer/tokenizer.h"  // tokenizer_load, tokenizer_encode

int main(int argc, char **argv) {
    const char *path = argc > 1 ? argv[1] : "test/data/tokenizer_novel.txt";
    int repeats = argc > 2 ? atoi(argv[2]) : 10;
    if (repeats < 1) repeats = 1;
    ErrBuf e;
    size_t len;
    char *text = read_file_text(path, &len, &e);
    if (!text) die_user(&e);
    double t0 = now_seconds();
    Tokenizer *t = tokenizer_load(NULL, &e);
    if (!t) die_user(&e);
    double load_s = now_seconds() - t0;

    uint32_t *ids;
    t0 = now_seconds();
    size_t n = tokenizer_encode(t, text, len, &ids);
    double first_s = now_seconds() - t0;
    free(ids);
    double best_s = 1e30;
    for (int r = 0; r < repeats; r++) {
        t0 = now_seconds();
        size_t m = tokenizer_encode(t, text, len, &ids);
        double s = now_seconds() - t0;
        if (m != n) FATAL("encode gave %zu ids, then %zu", n, m);
        free(ids);
        if (s < best_s) best_s = s;
    }
    printf("text: %s, %zu bytes -> %zu ids (%.2f bytes/id)\n", path, len, n, (double)len / n);
    printf("load: %.3f s\n", load_s);
    printf("encode, first pass (cold cache): %.1f MB/s\n", len / first_s / 1e6);
    printf("encode, best of %d (warm cache): %.1f MB/s, %.2f M ids/s\n", repeats, len / best_s / 1e6,
           n / best_s / 1e6);
    tokenizer_free(t);
    free(text);
    return 0;
}
