// test_dataloader.c: shard format round trips (v1 and v7), window contents, per-epoch and
// per-rank coverage, seeded shuffling, exact state save/restore, reset, and every bad-shard
// error (returns -1 with a message naming the file and the problem); the mixed order (rows of
// every shard in one permutation: coverage, ranks, sources mixed, sources named, state, short
// shards) and its passkey mixing (share, layout, determinism across restores and world sizes).
#include <math.h>      // sqrt, fabs
#include <stdlib.h>    // mkdtemp
#include <string.h>    // strstr, memcmp
#include <sys/stat.h>  // stat, mkdir
#include <unistd.h>    // unlink, rmdir

#include "core/common.h"   // ErrBuf, xmalloc
#include "dataloader.h"    // the module under test
#include "eval/passkey.h"  // the passkey template the mixing uses
#include "test.h"         // CHECK, test_summary

static char tmpdir[256];

// ---------------------------------------------------------------------------------------------
// Helpers.

static unsigned long long rng = 0x9E3779B97F4A7C15ULL;
static uint32_t rand_below(uint32_t n) {  // xorshift64*, independent of the loader's generator
    rng ^= rng >> 12; rng ^= rng << 25; rng ^= rng >> 27;
    return (uint32_t)(((rng * 0x2545F4914F6CDD1DULL) >> 32) % n);
}

static void path_in(char *out, size_t cap, const char *sub, const char *name) {
    snprintf(out, cap, "%s/%s/%s", tmpdir, sub, name);
}

static void make_subdir(const char *sub) {
    char p[512];
    snprintf(p, sizeof p, "%s/%s", tmpdir, sub);
    mkdir(p, 0777);
}

// Writes a shard by hand: the header fields as given, then n_tokens tokens of token_bytes each
// (values from tokens), then extra zero bytes.
static void write_raw(const char *path, int magic, int version, int count, int token_bytes,
                      const uint32_t *tokens, long long n_tokens, int extra) {
    FILE *f = fopen(path, "wb");
    if (!f) { perror(path); exit(2); }
    int32_t header[256] = {0};
    header[0] = magic; header[1] = version; header[2] = count;
    fwrite(header, 4, 256, f);
    for (long long i = 0; i < n_tokens; i++) {
        if (token_bytes == 2) { uint16_t t = (uint16_t)tokens[i]; fwrite(&t, 2, 1, f); }
        else fwrite(&tokens[i], 4, 1, f);
    }
    for (int i = 0; i < extra; i++) fputc(0, f);
    fclose(f);
}

static long long file_size(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 ? (long long)st.st_size : -1;
}

// ---------------------------------------------------------------------------------------------
// Round trips and window contents.

static void test_round_trip(const char *sub, uint32_t max_id, int expect_version) {
    make_subdir(sub);
    char path[512], pattern[512];
    path_in(path, sizeof path, sub, "a.bin");
    path_in(pattern, sizeof pattern, sub, "*.bin");
    const long long n = 1000;
    uint32_t *tok = xmalloc(n * sizeof(uint32_t));
    for (long long i = 0; i < n; i++) tok[i] = rand_below(max_id);
    tok[17] = max_id - 1;  // make sure the widest id is present
    ErrBuf e = {{0}};
    int rc = shard_write(path, tok, n, &e);
    CHECK(rc == 0, "shard_write ok", "%s", e.msg);
    int32_t header[3] = {0};
    FILE *f = fopen(path, "rb");
    if (f) { if (fread(header, 4, 3, f) != 3) header[0] = 0; fclose(f); }
    const int tb = expect_version == 1 ? 2 : 4;
    CHECK(header[1] == expect_version && header[2] == n && file_size(path) == 1024 + n * tb,
          expect_version == 1 ? "shard_write v1 header and size" : "shard_write v7 header and size",
          "magic %d version %d count %d size %lld", header[0], header[1], header[2], file_size(path));

    DataLoader dl;
    const int B = 3, T = 16, S = B * T;
    rc = dataloader_open(&dl, pattern, B, T, 0, 1, 0, 1, (int)max_id, &e);
    CHECK(rc == 0, "open written shard", "%s", e.msg);
    if (rc != 0) { free(tok); return; }
    int32_t in[48], tg[48];
    int ok = 1;
    long long windows = (n - 1) / S;
    CHECK(dataloader_batches_per_epoch(&dl) == windows, "batches per epoch (one rank)", "%lld vs %lld",
          dataloader_batches_per_epoch(&dl), windows);
    for (long long w = 0; w < windows; w++) {  // no shuffle: windows in file order
        dataloader_next(&dl, in, tg);
        for (int i = 0; i < S; i++)
            if (in[i] != (int32_t)tok[w * S + i] || tg[i] != (int32_t)tok[w * S + i + 1]) ok = 0;
    }
    CHECK(ok, expect_version == 1 ? "v1 windows: inputs and targets shifted by one"
                                  : "v7 windows: inputs and targets shifted by one",
          "a window differs from the tokens written");
    dataloader_next(&dl, in, tg);  // wraps to epoch 1, window 0
    CHECK(in[0] == (int32_t)tok[0] && dl.st.epoch == 1, "wraps to the next epoch",
          "epoch %lld, first token %d vs %u", dl.st.epoch, in[0], tok[0]);
    dataloader_close(&dl);
    free(tok);
}

// ---------------------------------------------------------------------------------------------
// Coverage over ranks: three shards whose tokens encode (file, position) as file*10000 + pos.

enum { COV_B = 2, COV_T = 4, COV_S = COV_B * COV_T, COV_FILES = 3, MAX_WIN = 32 };
static const int cov_windows[COV_FILES] = {12, 6, 18};

static void write_coverage_shards(void) {
    make_subdir("cov");
    for (int f = 0; f < COV_FILES; f++) {
        long long n = (long long)cov_windows[f] * COV_S + 1 + f * 3;  // ragged tails too
        uint32_t *tok = xmalloc(n * sizeof(uint32_t));
        for (long long i = 0; i < n; i++) tok[i] = (uint32_t)(f * 10000 + i);
        char path[512], name[32];
        snprintf(name, sizeof name, "shard_%02d.bin", f);
        path_in(path, sizeof path, "cov", name);
        ErrBuf e;
        if (shard_write(path, tok, n, &e) != 0) { printf("setup: %s\n", e.msg); exit(2); }
        free(tok);
    }
}

// Reads one epoch of every rank; counts visits per (file, window) and checks window contents.
// Returns the number of windows visited more than once by one rank, or across ranks.
static void check_coverage(int world, int shuffle) {
    char pattern[512];
    path_in(pattern, sizeof pattern, "cov", "shard_*.bin");
    int visits[COV_FILES][MAX_WIN] = {{0}};
    int own_twice = 0, bad_content = 0, state_differs = 0;
    long long expect_batches = 0;
    for (int f = 0; f < COV_FILES; f++)
        expect_batches += cov_windows[f] >= world ? cov_windows[f] / world : 1;
    DataLoaderState end_state[8];
    for (int r = 0; r < world; r++) {
        DataLoader dl;
        ErrBuf e;
        if (dataloader_open(&dl, pattern, COV_B, COV_T, r, world, shuffle, 7, 65536, &e) != 0) {
            CHECK(0, "coverage open", "%s", e.msg);
            return;
        }
        if (dataloader_batches_per_epoch(&dl) != expect_batches) state_differs = 1;
        int mine[COV_FILES][MAX_WIN] = {{0}};
        int32_t in[COV_S], tg[COV_S];
        for (long long b = 0; b < expect_batches; b++) {
            dataloader_next(&dl, in, tg);
            int f = in[0] / 10000, pos = in[0] % 10000;
            if (f < 0 || f >= COV_FILES || pos % COV_S != 0 || pos / COV_S >= cov_windows[f]) {
                bad_content = 1;
                continue;
            }
            for (int i = 0; i < COV_S; i++)
                if (in[i] != in[0] + i || tg[i] != in[0] + i + 1) bad_content = 1;
            if (mine[f][pos / COV_S]++) own_twice = 1;
            visits[f][pos / COV_S]++;
        }
        dataloader_get_state(&dl, &end_state[r]);
        dataloader_close(&dl);
    }
    int covered = 1, disjoint = 1, visited = 0;
    for (int f = 0; f < COV_FILES; f++)
        for (int w = 0; w < cov_windows[f]; w++) {
            if (visits[f][w] == 0) covered = 0;
            if (visits[f][w] > 1) disjoint = 0;
            visited += visits[f][w];
        }
    for (int r = 0; r < world; r++) {
        const DataLoaderState *s = &end_state[r];
        if (s->epoch != 1 || s->shard_pos != 0 || s->window_pos != 0 ||
            memcmp(s, &end_state[0], sizeof *s) != 0)
            state_differs = 1;
    }
    char name[128];
    snprintf(name, sizeof name, "world %d shuffle %d: window contents", world, shuffle);
    CHECK(!bad_content, name, "a window is not (file, consecutive positions) with targets shifted");
    snprintf(name, sizeof name, "world %d shuffle %d: each rank visits a window at most once", world, shuffle);
    CHECK(!own_twice, name, "a rank read a window twice in one epoch");
    snprintf(name, sizeof name, "world %d shuffle %d: ranks disjoint", world, shuffle);
    CHECK(disjoint, name, "two ranks read the same window");
    snprintf(name, sizeof name, "world %d shuffle %d: every window visited once", world, shuffle);
    CHECK(covered && visited == 36, name, "%d of 36 windows visited", visited);
    snprintf(name, sizeof name, "world %d shuffle %d: same state on all ranks at epoch end", world, shuffle);
    CHECK(!state_differs, name, "states differ or are not at epoch 1 start");
}

// World 4 does not divide 6 and 18: each rank takes floor(n_windows / 4) per shard, disjoint.
static void check_ragged_world(void) {
    char pattern[512];
    path_in(pattern, sizeof pattern, "cov", "shard_*.bin");
    int visits[COV_FILES][MAX_WIN] = {{0}};
    long long per_rank = 6 / 4 + 12 / 4 + 18 / 4;
    int ok = 1;
    for (int r = 0; r < 4; r++) {
        DataLoader dl;
        ErrBuf e;
        if (dataloader_open(&dl, pattern, COV_B, COV_T, r, 4, 1, 3, 65536, &e) != 0) { ok = 0; break; }
        if (dataloader_batches_per_epoch(&dl) != per_rank) ok = 0;
        int32_t in[COV_S], tg[COV_S];
        for (long long b = 0; b < per_rank; b++) {
            dataloader_next(&dl, in, tg);
            visits[in[0] / 10000][(in[0] % 10000) / COV_S]++;
        }
        dataloader_close(&dl);
    }
    int total = 0, repeated = 0;
    for (int f = 0; f < COV_FILES; f++)
        for (int w = 0; w < MAX_WIN; w++) { total += visits[f][w]; repeated |= visits[f][w] > 1; }
    CHECK(ok && total == 4 * per_rank && !repeated, "world 4: floor(windows/4) per shard, disjoint",
          "ok %d, %d windows read (expected %lld), repeated %d", ok, total, 4 * per_rank, repeated);
}

// A shard with one window and two ranks: both ranks read it (wrap), no crash.
static void check_wrap(void) {
    make_subdir("wrap");
    char path[512], pattern[512];
    path_in(path, sizeof path, "wrap", "one.bin");
    path_in(pattern, sizeof pattern, "wrap", "*.bin");
    uint32_t tok[COV_S + 1];
    for (int i = 0; i <= COV_S; i++) tok[i] = 100 + i;
    ErrBuf e;
    shard_write(path, tok, COV_S + 1, &e);
    int32_t in0[COV_S], tg0[COV_S], in1[COV_S], tg1[COV_S];
    DataLoader a, b;
    int ok = dataloader_open(&a, pattern, COV_B, COV_T, 0, 2, 1, 1, 1000, &e) == 0 &&
             dataloader_open(&b, pattern, COV_B, COV_T, 1, 2, 1, 1, 1000, &e) == 0;
    if (ok) {
        dataloader_next(&a, in0, tg0);
        dataloader_next(&b, in1, tg1);
        ok = memcmp(in0, in1, sizeof in0) == 0 && in0[0] == 100 && a.st.epoch == 1;
        dataloader_close(&a);
        dataloader_close(&b);
    }
    CHECK(ok, "fewer windows than ranks: ranks wrap", "%s", ok ? "" : e.msg);
}

// ---------------------------------------------------------------------------------------------
// Shuffle, state and reset.

// The first n batches' first tokens from a fresh loader.
static void first_tokens(int shuffle, unsigned long long seed, int n, int32_t *out) {
    char pattern[512];
    path_in(pattern, sizeof pattern, "cov", "shard_*.bin");
    DataLoader dl;
    ErrBuf e;
    if (dataloader_open(&dl, pattern, COV_B, COV_T, 0, 1, shuffle, seed, 65536, &e) != 0) {
        printf("open: %s\n", e.msg);
        exit(2);
    }
    int32_t in[COV_S], tg[COV_S];
    for (int i = 0; i < n; i++) { dataloader_next(&dl, in, tg); out[i] = in[0]; }
    dataloader_close(&dl);
}

static void test_shuffle(void) {
    int32_t a[72], b[72], c[72], plain[36];
    first_tokens(1, 11, 72, a);  // two epochs
    first_tokens(1, 11, 72, b);
    first_tokens(1, 12, 72, c);
    first_tokens(0, 11, 36, plain);
    CHECK(memcmp(a, b, sizeof a) == 0, "shuffle: same seed, same order", "orders differ");
    CHECK(memcmp(a, c, sizeof a) != 0, "shuffle: different seed, different order", "orders equal");
    CHECK(memcmp(a, a + 36, 36 * sizeof(int32_t)) != 0, "shuffle: a new order each epoch",
          "epoch 1 repeats epoch 0");
    CHECK(memcmp(a, plain, sizeof plain) != 0, "shuffle differs from file order", "not shuffled");

    // One shard: the window order itself changes from epoch to epoch.
    char pattern[512];
    path_in(pattern, sizeof pattern, "cov", "shard_02.bin");
    DataLoader dl;
    ErrBuf e;
    int32_t in[COV_S], tg[COV_S], epoch0[18], epoch1[18];
    int rc = dataloader_open(&dl, pattern, COV_B, COV_T, 0, 1, 1, 11, 65536, &e);
    for (int i = 0; i < 36 && rc == 0; i++) {
        dataloader_next(&dl, in, tg);
        if (i < 18) epoch0[i] = in[0]; else epoch1[i - 18] = in[0];
    }
    CHECK(rc == 0 && memcmp(epoch0, epoch1, sizeof epoch0) != 0,
          "shuffle: window order of a shard changes each epoch", "rc %d or same order", rc);
    if (rc == 0) dataloader_close(&dl);
    int in_order = 1;
    for (int i = 1; i < 36; i++) if (plain[i] <= plain[i - 1]) in_order = 0;
    CHECK(in_order, "no shuffle: file order", "windows out of order");
}

static void test_state_and_reset(void) {
    char pattern[512];
    path_in(pattern, sizeof pattern, "cov", "shard_*.bin");
    ErrBuf e;
    DataLoader a, b;
    dataloader_open(&a, pattern, COV_B, COV_T, 1, 2, 1, 5, 65536, &e);
    dataloader_open(&b, pattern, COV_B, COV_T, 1, 2, 1, 999, 65536, &e);  // other seed: restored
    int32_t in[COV_S], tg[COV_S], in2[COV_S], tg2[COV_S], first_in[COV_S];
    dataloader_next(&a, first_in, tg);
    for (int i = 0; i < 6; i++) dataloader_next(&a, in, tg);
    dataloader_next(&b, in2, tg2);  // b's cached orders are now those of seed 999
    DataLoaderState s;
    dataloader_get_state(&a, &s);
    int rc = dataloader_set_state(&b, &s, &e);
    CHECK(rc == 0, "set_state accepts a saved state", "%s", e.msg);
    int same = 1;
    for (int i = 0; i < 40; i++) {  // crosses shard and epoch boundaries (18 per epoch)
        dataloader_next(&a, in, tg);
        dataloader_next(&b, in2, tg2);
        if (memcmp(in, in2, sizeof in) || memcmp(tg, tg2, sizeof tg)) same = 0;
    }
    CHECK(same && a.st.epoch == 2, "restored state reproduces the following batches",
          "batches differ (epoch %lld)", a.st.epoch);

    dataloader_reset(&a);
    dataloader_next(&a, in, tg);
    CHECK(memcmp(in, first_in, sizeof in) == 0, "reset goes back to the first batch",
          "first token %d vs %d", in[0], first_in[0]);

    DataLoaderState bad = s;
    bad.shard_pos = 3;
    rc = dataloader_set_state(&b, &bad, &e);
    CHECK(rc == -1 && strstr(e.msg, "shard_pos"), "set_state rejects shard_pos", "rc %d: %s", rc, e.msg);
    bad = s;
    bad.window_pos = 9;  // shards have 3, 6 and 9 positions per rank at world 2
    rc = dataloader_set_state(&b, &bad, &e);
    CHECK(rc == -1 && strstr(e.msg, "window_pos"), "set_state rejects window_pos", "rc %d: %s", rc, e.msg);
    bad = s;
    bad.epoch = -1;
    rc = dataloader_set_state(&b, &bad, &e);
    CHECK(rc == -1 && strstr(e.msg, "epoch"), "set_state rejects epoch", "rc %d: %s", rc, e.msg);
    dataloader_close(&a);
    dataloader_close(&b);
}

// ---------------------------------------------------------------------------------------------
// Bad input.

// Opens sub/*.bin expecting failure; checks the message holds every needle.
static void expect_open_error(const char *sub, const char *name, int vocab, const char *needle1,
                              const char *needle2) {
    char pattern[512];
    path_in(pattern, sizeof pattern, sub, "*.bin");
    DataLoader dl;
    ErrBuf e = {{0}};
    int rc = dataloader_open(&dl, pattern, 2, 8, 0, 1, 1, 1, vocab, &e);
    int ok = rc == -1 && strstr(e.msg, needle1) && (!needle2 || strstr(e.msg, needle2));
    CHECK(ok, name, "rc %d, message: %s", rc, e.msg);
    if (rc == 0) dataloader_close(&dl);
}

static void test_errors(void) {
    uint32_t tok[200];
    for (int i = 0; i < 200; i++) tok[i] = rand_below(500);
    char path[512];

    make_subdir("magic");
    path_in(path, sizeof path, "magic", "bad_magic.bin");
    write_raw(path, 12345, 1, 200, 2, tok, 200, 0);
    expect_open_error("magic", "bad magic", 1000, "bad_magic.bin", "magic");

    make_subdir("version");
    path_in(path, sizeof path, "version", "bad_version.bin");
    write_raw(path, 20240520, 7, 200, 2, tok, 200, 0);
    expect_open_error("version", "bad version", 1000, "bad_version.bin", "version");

    make_subdir("trunc");
    path_in(path, sizeof path, "trunc", "short.bin");
    write_raw(path, 20240801, 7, 200, 4, tok, 150, 0);
    expect_open_error("trunc", "truncated shard", 1000, "short.bin", "truncated");

    make_subdir("long");
    path_in(path, sizeof path, "long", "long.bin");
    write_raw(path, 20240520, 1, 200, 2, tok, 200, 6);
    expect_open_error("long", "oversized shard", 1000, "long.bin", "1430 bytes");

    make_subdir("tiny");
    path_in(path, sizeof path, "tiny", "tiny.bin");
    FILE *f = fopen(path, "wb");
    fputs("not a shard", f);
    fclose(f);
    expect_open_error("tiny", "file shorter than a header", 1000, "tiny.bin", "header");

    make_subdir("vocab");
    path_in(path, sizeof path, "vocab", "a_good.bin");
    write_raw(path, 20240520, 1, 200, 2, tok, 200, 0);
    uint32_t badtok[200];
    memcpy(badtok, tok, sizeof badtok);
    badtok[137] = 1000;
    path_in(path, sizeof path, "vocab", "b_bad_id.bin");
    write_raw(path, 20240520, 1, 200, 2, badtok, 200, 0);
    expect_open_error("vocab", "token id >= vocab_size", 1000, "b_bad_id.bin", "position 137");

    make_subdir("small");
    path_in(path, sizeof path, "small", "small.bin");
    write_raw(path, 20240520, 1, 16, 2, tok, 16, 0);  // B*T+1 = 17 needed
    expect_open_error("small", "shard too small for one window", 1000, "small.bin", "17");

    make_subdir("empty");
    expect_open_error("empty", "empty glob", 1000, "empty/*.bin", "tokenize");
}

// ---------------------------------------------------------------------------------------------
// The mixed order. Three sources (folders), tokens encoding (source, file, position) as
// source*20000 + file*10000 + position, so a row tells where it came from.

enum { MIX_B = 2, MIX_T = 4, MIX_SOURCES = 3, MIX_MAX_ROWS = 256 };
static const int mix_tokens[MIX_SOURCES][2] = {{41, 17}, {33, 0}, {57, 3}};  // per file; 0 = no file, 3: short
static int mix_rows_total;

static void write_mixed_shards(void) {
    mix_rows_total = 0;
    for (int s = 0; s < MIX_SOURCES; s++) {
        char sub[64];
        snprintf(sub, sizeof sub, "mix/src_%c", 'a' + s);
        make_subdir("mix");
        make_subdir(sub);
        for (int f = 0; f < 2; f++) {
            const int n = mix_tokens[s][f];
            if (!n) continue;
            uint32_t tok[64];
            for (int i = 0; i < n; i++) tok[i] = (uint32_t)(s * 20000 + f * 10000 + i);
            char path[512], name[32];
            snprintf(name, sizeof name, "part_%d.bin", f);
            path_in(path, sizeof path, sub, name);
            ErrBuf e;
            if (shard_write(path, tok, n, &e) != 0) { printf("setup: %s\n", e.msg); exit(2); }
            mix_rows_total += n > MIX_T ? (n - 1) / MIX_T : 0;
        }
    }
}

static int open_mix(DataLoader *dl, int rank, int world, int shuffle, unsigned long long seed, ErrBuf *e) {
    char pattern[512];
    path_in(pattern, sizeof pattern, "mix", "src_*/part_*.bin");
    return dataloader_open_mixed(dl, pattern, MIX_B, MIX_T, rank, world, shuffle, seed, 65536, e);
}

// One row's id: its source, file and row index from its first token; -1 if the row is not one.
static int row_id(const int32_t *in, const int32_t *tg) {
    const int s = in[0] / 20000, f = (in[0] % 20000) / 10000, pos = in[0] % 10000;
    if (s >= MIX_SOURCES || pos % MIX_T) return -1;
    for (int t = 0; t < MIX_T; t++)
        if (in[t] != in[0] + t || tg[t] != in[0] + t + 1) return -1;
    return (s * 2 + f) * 64 + pos / MIX_T;
}

static void test_mixed_coverage(int world, int shuffle) {
    int visits[6 * 64] = {0}, bad = 0, own_twice = 0, file_ok = 1;
    long long per_rank = 0;
    DataLoaderState end[4];
    for (int r = 0; r < world; r++) {
        DataLoader dl;
        ErrBuf e;
        if (open_mix(&dl, r, world, shuffle, 9, &e) != 0) { CHECK(0, "mixed open", "%s", e.msg); return; }
        per_rank = dataloader_batches_per_epoch(&dl);
        int mine[6 * 64] = {0};
        int32_t in[MIX_B * MIX_T], tg[MIX_B * MIX_T];
        for (long long j = 0; j < per_rank; j++) {
            dataloader_next(&dl, in, tg);
            for (int b = 0; b < MIX_B; b++) {
                int id = row_id(in + b * MIX_T, tg + b * MIX_T);
                if (id < 0) { bad = 1; continue; }
                const char *src = dl.source_names[dl.source[dl.row_file[b]]];
                if (src[4] - 'a' != id / 128 || strstr(dl.files[dl.row_file[b]], id % 128 >= 64 ? "part_1" : "part_0") == NULL)
                    file_ok = 0;
                if (mine[id]++) own_twice = 1;
                visits[id]++;
            }
        }
        dataloader_get_state(&dl, &end[r]);
        dataloader_close(&dl);
    }
    int visited = 0, twice = 0, same_end = 1;
    for (int i = 0; i < 6 * 64; i++) visited += visits[i] > 0, twice |= visits[i] > 1;
    for (int r = 0; r < world; r++) same_end &= end[r].epoch == 1 && end[r].window_pos == 0 && end[r].shard_pos == 0;
    char name[160];
    snprintf(name, sizeof name, "mixed, world %d shuffle %d: rows are T+1 consecutive tokens of one shard", world, shuffle);
    CHECK(!bad, name, "a row is not consecutive tokens");
    snprintf(name, sizeof name, "mixed, world %d shuffle %d: row_file names each row's shard and source", world, shuffle);
    CHECK(file_ok, name, "a row_file is wrong");
    snprintf(name, sizeof name, "mixed, world %d shuffle %d: rows disjoint within and across ranks", world, shuffle);
    CHECK(!own_twice && !twice, name, "a row was read twice in one epoch");
    snprintf(name, sizeof name, "mixed, world %d shuffle %d: rows / (B x world) micro-batches per rank", world, shuffle);
    CHECK(per_rank == mix_rows_total / (MIX_B * world) && visited == per_rank * MIX_B * world, name,
          "%lld per rank, %d rows visited of %d", per_rank, visited, mix_rows_total);
    snprintf(name, sizeof name, "mixed, world %d shuffle %d: every rank ends the epoch at the same state", world, shuffle);
    CHECK(same_end, name, "states differ");
}

// The first n micro-batches' rows (ids) of one rank.
static void mixed_rows(int rank, int world, int shuffle, unsigned long long seed, int n, int *ids) {
    DataLoader dl;
    ErrBuf e;
    if (open_mix(&dl, rank, world, shuffle, seed, &e) != 0) { printf("open: %s\n", e.msg); exit(2); }
    int32_t in[MIX_B * MIX_T], tg[MIX_B * MIX_T];
    for (int j = 0; j < n; j++) {
        dataloader_next(&dl, in, tg);
        for (int b = 0; b < MIX_B; b++) ids[j * MIX_B + b] = row_id(in + b * MIX_T, tg + b * MIX_T);
    }
    dataloader_close(&dl);
}

static void test_mixed_order(void) {
    const int n = 40;  // two epochs and more
    int one[40 * MIX_B], r0[20 * MIX_B], r1[20 * MIX_B], other[40 * MIX_B], plain[40 * MIX_B];
    mixed_rows(0, 1, 1, 5, n, one);
    mixed_rows(0, 2, 1, 5, n / 2, r0);
    mixed_rows(1, 2, 1, 5, n / 2, r1);
    int same = 1;
    for (int j = 0; j < n / 2 && same; j++)  // the 2 ranks' j-th = one rank's (2j)-th and (2j+1)-th
        same = !memcmp(r0 + j * MIX_B, one + 2 * j * MIX_B, sizeof(int) * MIX_B) &&
               !memcmp(r1 + j * MIX_B, one + (2 * j + 1) * MIX_B, sizeof(int) * MIX_B);
    // the epoch has 18 micro-batches on one rank, 9 per rank on two: the same through epoch 0
    CHECK(same, "mixed: two ranks read together what one rank reads in two calls", "differ");
    mixed_rows(0, 1, 1, 6, n, other);
    mixed_rows(0, 1, 0, 5, n, plain);
    CHECK(memcmp(one, other, sizeof one) != 0, "mixed: another seed, another order", "same order");
    CHECK(memcmp(one, one + 18 * MIX_B, 18 * MIX_B * sizeof(int)) != 0, "mixed: a new permutation every epoch",
          "epoch 1 repeats epoch 0");
    int in_order = 1;
    for (int i = 1; i < 18 * MIX_B; i++) in_order &= plain[i] > plain[i - 1];
    CHECK(in_order, "mixed without shuffle: rows in file order", "out of order");
    // Sources are mixed at once: the first 4 micro-batches (8 rows) hold all three.
    int seen[MIX_SOURCES] = {0}, first = 0;
    for (int i = 0; i < 4 * MIX_B; i++) seen[one[i] / 128] = 1;
    for (int s = 0; s < MIX_SOURCES; s++) first += seen[s];
    CHECK(first == MIX_SOURCES, "mixed: the first 4 micro-batches hold rows of every source", "%d of 3", first);

    DataLoader dl;
    ErrBuf e;
    int rc = open_mix(&dl, 0, 1, 1, 5, &e);
    CHECK(rc == 0 && dl.n_sources == 3 && !strcmp(dl.source_names[0], "src_a") && !strcmp(dl.source_names[2], "src_c") &&
              dl.n_short == 1 && dl.n_rows == mix_rows_total,
          "mixed: sources named by folder, a short shard gives no rows", "rc %d, %d sources, %d short, %lld rows: %s", rc,
          dl.n_sources, dl.n_short, dl.n_rows, e.msg);
    // state: save after 7 micro-batches, restore into a loader of another seed, same continuation
    int32_t in[MIX_B * MIX_T], tg[MIX_B * MIX_T], in2[MIX_B * MIX_T], tg2[MIX_B * MIX_T];
    for (int j = 0; j < 7; j++) dataloader_next(&dl, in, tg);
    DataLoaderState st;
    dataloader_get_state(&dl, &st);
    DataLoader b;
    open_mix(&b, 0, 1, 1, 77, &e);
    dataloader_next(&b, in2, tg2);
    rc = dataloader_set_state(&b, &st, &e);
    int cont = rc == 0;
    for (int j = 0; j < 30 && cont; j++) {
        dataloader_next(&dl, in, tg);
        dataloader_next(&b, in2, tg2);
        cont = !memcmp(in, in2, sizeof in) && !memcmp(tg, tg2, sizeof tg);
    }
    CHECK(cont, "mixed: a restored state continues exactly (across epochs)", "rc %d: %s", rc, e.msg);
    DataLoaderState bad = st;
    bad.shard_pos = 1;
    rc = dataloader_set_state(&b, &bad, &e);
    CHECK(rc == -1 && strstr(e.msg, "shard_pos"), "mixed: set_state rejects a shard position", "rc %d: %s", rc, e.msg);
    bad = st;
    bad.window_pos = 18;
    rc = dataloader_set_state(&b, &bad, &e);
    CHECK(rc == -1 && strstr(e.msg, "window_pos 18 out of range [0, 18)"), "mixed: set_state rejects window_pos",
          "rc %d: %s", rc, e.msg);
    dataloader_close(&dl);
    dataloader_close(&b);

    make_subdir("mixshort");
    char path[512], pattern[512];
    path_in(path, sizeof path, "mixshort", "a.bin");
    path_in(pattern, sizeof pattern, "mixshort", "*.bin");
    uint32_t tok[4] = {1, 2, 3, 4};
    shard_write(path, tok, 4, &e);
    rc = dataloader_open_mixed(&dl, pattern, 2, 4, 0, 1, 1, 1, 100, &e);
    CHECK(rc == -1 && strstr(e.msg, "no shard holds one row of T+1 = 5 tokens") && strstr(e.msg, "longest has 4"),
          "mixed: shards all shorter than a row are an error", "rc %d: %s", rc, e.msg);
}

// Passkey mixing: rows of T+1 = 65 tokens, 30% of them passkey sequences.
static void test_passkey_mixing(void) {
    ErrBuf e;
    Tokenizer *tok = tokenizer_load(NULL, &e);
    PasskeyTemplate t;
    if (!tok || passkey_template_init(&t, tok, &e) != 0) { CHECK(0, "passkey template", "%s", e.msg); return; }
    tokenizer_free(tok);
    enum { B = 4, T = 64, N = 40 };
    make_subdir("pk");
    for (int f = 0; f < 2; f++) {
        uint32_t *text = xmalloc(sizeof(uint32_t) * 3000);
        for (int i = 0; i < 3000; i++) text[i] = 100 + (uint32_t)rand_below(30000);  // not the template's digits
        char path[512], name[32];
        snprintf(name, sizeof name, "s%d.bin", f);
        path_in(path, sizeof path, "pk", name);
        shard_write(path, text, 3000, &e);
        free(text);
    }
    char pattern[512];
    path_in(pattern, sizeof pattern, "pk", "s*.bin");
    // the rows of N micro-batches (inputs then the last target) for a loader of (rank, world)
    static int32_t rows[2][N * B][T + 1];
    int n_pk = 0, layout = 1;
    DataLoader dl;
    int32_t in[B * T], tg[B * T];
    dataloader_open_mixed(&dl, pattern, B, T, 0, 1, 1, 3, 50257, &e);
    dataloader_mix_passkey(&dl, &t, 0.3);
    DataLoaderState mid;
    for (int j = 0; j < N; j++) {
        if (j == N / 2) dataloader_get_state(&dl, &mid);
        dataloader_next(&dl, in, tg);
        for (int b = 0; b < B; b++) {
            int32_t *row = rows[0][j * B + b];
            memcpy(row, in + b * T, sizeof(int32_t) * T);
            row[T] = tg[b * T + T - 1];
            const int n_q = t.n_question;
            int is_pk = 0;
            for (int nd = PASSKEY_MIN_DIGITS; nd <= PASSKEY_MAX_DIGITS && !is_pk; nd++) {
                int q = T + 1 - nd - n_q, match = 1;
                for (int k = 0; k < n_q && match; k++) match = row[q + k] == (int32_t)t.question[k];
                if (!match) continue;
                is_pk = 1;
                // the key sentence somewhere before, holding the same digits
                int found = 0;
                for (int i = 0; i + t.n_key_prefix + nd < q && !found; i++) {
                    int m = 1;
                    for (int k = 0; k < t.n_key_prefix && m; k++) m = row[i + k] == (int32_t)t.key_prefix[k];
                    for (int k = 0; k < nd && m; k++) m = row[i + t.n_key_prefix + k] == row[T + 1 - nd + k];
                    found = m;
                }
                layout &= found;
                for (int k = 0; k < nd; k++) {
                    int digit = 0;
                    for (int d = 0; d < 10; d++) digit |= row[T + 1 - nd + k] == (int32_t)t.digit[d];
                    layout &= digit;
                }
            }
            n_pk += is_pk;
        }
    }
    const double share = (double)n_pk / (N * B), sd = sqrt(0.3 * 0.7 / (N * B));
    CHECK(fabs(share - 0.3) < 4 * sd, "passkey mixing: the share of rows asked for", "%.3f of %d rows (want 0.3 +- %.3f)",
          share, N * B, 4 * sd);
    CHECK(layout && n_pk > 0, "passkey mixing: key, question and answer laid out, the answer the key's number",
          "a passkey row is malformed");
    CHECK(dl.passkey_rows == n_pk, "passkey mixing: the loader counts what it served", "%lld vs %d", dl.passkey_rows,
          n_pk);
    // restored mid-way into a fresh loader: the same rows, passkeys included
    DataLoader r;
    dataloader_open_mixed(&r, pattern, B, T, 0, 1, 1, 3, 50257, &e);
    dataloader_mix_passkey(&r, &t, 0.3);
    dataloader_set_state(&r, &mid, &e);
    int same = 1;
    for (int j = N / 2; j < N && same; j++) {
        dataloader_next(&r, in, tg);
        for (int b = 0; b < B && same; b++) same = !memcmp(rows[0][j * B + b], in + b * T, sizeof(int32_t) * T);
    }
    CHECK(same, "passkey mixing: a restored loader serves the same sequences", "differ");
    dataloader_close(&r);
    // two ranks: together the same rows as one rank, through the first epoch (92 rows: 23
    // micro-batches on one rank, 11 per rank on two)
    int ranks_same = 1;
    for (int rank = 0; rank < 2; rank++) {
        DataLoader w;
        dataloader_open_mixed(&w, pattern, B, T, rank, 2, 1, 3, 50257, &e);
        dataloader_mix_passkey(&w, &t, 0.3);
        for (int j = 0; j < 11 && ranks_same; j++) {
            dataloader_next(&w, in, tg);
            const int k = j * 2 + rank;  // the global micro-batch
            for (int b = 0; b < B && ranks_same; b++) ranks_same = !memcmp(rows[0][k * B + b], in + b * T, sizeof(int32_t) * T);
        }
        dataloader_close(&w);
    }
    CHECK(ranks_same, "passkey mixing: two ranks see the same sequences as one", "differ");
    dataloader_close(&dl);
}

// ---------------------------------------------------------------------------------------------

static void remove_tree(const char *dir) {
    char cmd[600];
    snprintf(cmd, sizeof cmd, "rm -rf '%s'", dir);
    if (system(cmd) != 0) printf("# could not remove %s\n", dir);
}

int main(void) {
    snprintf(tmpdir, sizeof tmpdir, "/tmp/test_dataloader_XXXXXX");
    if (!mkdtemp(tmpdir)) { perror("mkdtemp"); return 2; }
    test_round_trip("v1", 50257, 1);
    test_round_trip("v7", 128256, 7);
    write_coverage_shards();
    for (int world = 1; world <= 3; world++) {
        check_coverage(world, 0);
        check_coverage(world, 1);
    }
    check_ragged_world();
    check_wrap();
    test_shuffle();
    test_state_and_reset();
    test_errors();
    write_mixed_shards();
    for (int world = 1; world <= 3; world++) {
        test_mixed_coverage(world, 0);
        test_mixed_coverage(world, 1);
    }
    test_mixed_order();
    test_passkey_mixing();
    remove_tree(tmpdir);
    return test_summary("test_dataloader");
}
