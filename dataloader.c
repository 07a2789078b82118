// dataloader.c: llm.c-compatible token shards: validation at open, the two seeded orders (mixed
// rows, or shard by shard), per-rank micro-batches, passkey mixing, exact save/restore of the
// position.
//
// Mixed order. Rows of T+1 tokens, numbered across the shards in file order (row_start); the
// epoch's permutation row_order; this rank's j-th micro-batch takes the rows at permutation
// positions q = ((j*W + r)*B + b) mod n_rows, b < B. Rows are read with pread from descriptors
// opened on first use.
//
// Shards order, window arithmetic. With S = B*T, a shard of n tokens has n_windows = (n - 1) / S
// windows; window w covers tokens [w*S, w*S + S + 1) (the +1 is the last target). Each epoch visits the
// shards in shard_order and, inside a shard, the positions j of its window order; position j of
// rank r is window_order[(j*W + r) % n_windows]. Every rank takes the same number of positions
// per shard, windows_per_rank = n_windows / W (the last n_windows % W windows of the order are
// left out this epoch; with shuffle they change from epoch to epoch), so ranks stay in step and
// read disjoint windows. A shard with fewer windows than ranks gives each rank one position and
// ranks wrap (rank r reads window order[r % n_windows]): windows repeat across ranks there.
// Because all ranks step in lockstep, DataLoaderState is the same on every rank.
#include "dataloader.h"
#include "core/rng.h"       // splitmix64 for the seeded orders
#include "eval/passkey.h"   // passkey sequences for the mixing

#include <errno.h>     // errno for messages
#include <fcntl.h>     // open
#include <glob.h>      // glob: the shard pattern
#include <string.h>    // strcmp, strerror, memset
#include <sys/stat.h>  // stat: size and type of each shard
#include <unistd.h>    // pread, close

#define SHARD_HEADER_INTS 256
#define SHARD_HEADER_BYTES ((long long)(SHARD_HEADER_INTS * sizeof(int32_t)))
#define SHARD_MAGIC_U16 20240520  // version 1, uint16 tokens
#define SHARD_MAGIC_U32 20240801  // version 7, uint32 tokens
#define VALIDATE_CHUNK_TOKENS ((size_t)1 << 20)
#define PASSKEY_STREAM (-1LL)
#define MAX_OPEN_SHARDS 256  // beyond this many shards a row's file is opened and closed per read

// ---------------------------------------------------------------------------------------------
// A small portable generator for the orders: splitmix64 and an unbiased Fisher-Yates.

// A stateless mix: one splitmix64 step from z.
static uint64_t mix64(uint64_t z) { return splitmix64_mix(z + SPLITMIX64_GAMMA); }

// Uniform in [0, n) by rejection (no modulo bias).
static uint64_t rand_below(uint64_t *state, uint64_t n) {
    const uint64_t limit = UINT64_MAX - UINT64_MAX % n;
    uint64_t r;
    do r = splitmix64_next(state); while (r >= limit);
    return r % n;
}

// Key of one order: stream 0 is the shard order of an epoch (shards order) or the row order
// (mixed order), stream f + 1 the window order of file f in that epoch, PASSKEY_STREAM the
// passkey mixing's choices.
static uint64_t order_key(unsigned long long seed, long long epoch, long long stream) {
    return mix64(mix64(mix64((uint64_t)seed) ^ (uint64_t)epoch) ^ (uint64_t)stream);
}

// a = 0..n-1, permuted when shuffle.
static void make_order(long long *a, long long n, int shuffle, uint64_t key) {
    for (long long i = 0; i < n; i++) a[i] = i;
    if (!shuffle) return;
    uint64_t state = key;
    for (long long i = n - 1; i > 0; i--) {
        long long j = (long long)rand_below(&state, (uint64_t)i + 1);
        long long t = a[i];
        a[i] = a[j];
        a[j] = t;
    }
}

// ---------------------------------------------------------------------------------------------
// Opening and validating shards.

// Tokens a unit of the order spans, less one: a window of B*T (shards order) or a row of T (mixed).
static long long window_tokens(const DataLoader *dl) { return dl->mixed ? dl->T : (long long)dl->B * dl->T; }

static long long shard_windows(const DataLoader *dl, long long f) {
    return (dl->n_tokens[f] - 1) / window_tokens(dl);
}

static long long windows_per_rank(const DataLoader *dl, long long n_windows) {
    return n_windows >= dl->world ? n_windows / dl->world : 1;
}

// Reads and checks the header against the file size; fills count and token bytes.
static int read_shard_header(FILE *f, const char *path, long long file_bytes, long long *count,
                             int *token_bytes, ErrBuf *e) {
    if (file_bytes < SHARD_HEADER_BYTES)
        return errf(e, "%s: %lld bytes, too small for the %lld-byte shard header (not an llm.c "
                    "token shard?)", path, file_bytes, SHARD_HEADER_BYTES);
    int32_t header[SHARD_HEADER_INTS];
    if (fread(header, sizeof(int32_t), SHARD_HEADER_INTS, f) != SHARD_HEADER_INTS)
        return errf(e, "%s: cannot read the shard header: %s", path, strerror(errno));
    const int magic = header[0], version = header[1];
    int expected_version;
    if (magic == SHARD_MAGIC_U16) { expected_version = 1; *token_bytes = 2; }
    else if (magic == SHARD_MAGIC_U32) { expected_version = 7; *token_bytes = 4; }
    else
        return errf(e, "%s: bad magic %d in the shard header (expected %d for uint16 tokens or %d "
                    "for uint32 tokens; not an llm.c token shard?)", path, magic, SHARD_MAGIC_U16,
                    SHARD_MAGIC_U32);
    if (version != expected_version)
        return errf(e, "%s: unsupported shard version %d for magic %d (expected version %d)", path,
                    version, magic, expected_version);
    *count = header[2];
    if (*count < 0) return errf(e, "%s: negative token count %lld in the shard header", path, *count);
    const long long expected = SHARD_HEADER_BYTES + *count * *token_bytes;
    if (file_bytes < expected)
        return errf(e, "%s: truncated: header says %lld tokens (%lld bytes) but file has %lld bytes",
                    path, *count, expected, file_bytes);
    if (file_bytes > expected)
        return errf(e, "%s: too long: header says %lld tokens (%lld bytes) but file has %lld bytes "
                    "(%lld extra; corrupt, or the header count is wrong)", path, *count, expected,
                    file_bytes, file_bytes - expected);
    return 0;
}

// Reads count tokens of token_bytes each from f into out (count) as uint32.
static int read_tokens(FILE *f, int token_bytes, uint32_t *out, size_t count) {
    if (token_bytes == 4) return fread(out, 4, count, f) == count ? 0 : -1;
    uint16_t *narrow = (uint16_t *)out;  // read into the front half, widen from the back
    if (fread(narrow, 2, count, f) != count) return -1;
    for (size_t i = count; i-- > 0;) out[i] = narrow[i];
    return 0;
}

// Opens, checks the header and size and scans every token id of one shard.
static int validate_shard(DataLoader *dl, int idx, uint32_t *buf, ErrBuf *e) {
    const char *path = dl->files[idx];
    struct stat st;
    if (stat(path, &st) != 0) return errf(e, "%s: cannot stat: %s", path, strerror(errno));
    if (!S_ISREG(st.st_mode)) return errf(e, "%s: not a regular file (expected a token shard)", path);
    FILE *f = fopen(path, "rb");
    if (!f) return errf(e, "%s: cannot open: %s", path, strerror(errno));
    long long count = 0;
    int token_bytes = 0;
    if (read_shard_header(f, path, (long long)st.st_size, &count, &token_bytes, e) != 0) {
        fclose(f);
        return -1;
    }
    const long long need = window_tokens(dl) + 1;
    if (count < need && !dl->mixed) {
        fclose(f);
        return errf(e, "%s: %lld tokens, too small for one window of B*T+1 = %lld tokens (B=%d, "
                    "T=%d; use a smaller micro_batch or seq_len, or larger shards)", path, count,
                    need, dl->B, dl->T);
    }
    for (long long pos = 0; pos < count;) {
        size_t n = (size_t)(count - pos) < VALIDATE_CHUNK_TOKENS ? (size_t)(count - pos)
                                                                 : VALIDATE_CHUNK_TOKENS;
        if (read_tokens(f, token_bytes, buf, n) != 0) {
            fclose(f);
            return errf(e, "%s: read failed at token %lld: %s", path, pos, strerror(errno));
        }
        for (size_t i = 0; i < n; i++) {
            if (buf[i] >= (uint32_t)dl->vocab_size) {
                fclose(f);
                return errf(e, "%s: token id %u at position %lld is >= vocab_size %d (shard made "
                            "with another tokenizer, or model.vocab_size too small?)", path,
                            buf[i], pos + (long long)i, dl->vocab_size);
            }
        }
        pos += (long long)n;
    }
    fclose(f);
    dl->n_tokens[idx] = count;
    dl->token_bytes[idx] = token_bytes;
    return 0;
}

static int compare_paths(const void *a, const void *b) {
    return strcmp(*(char *const *)a, *(char *const *)b);
}

// The source of a shard: the name of the folder holding it (a shard with no folder, or in ".",
// is a source of its own, named by its file name).
static void source_of(const char *path, char *out, size_t cap) {
    const char *slash = strrchr(path, '/');
    if (!slash) {
        snprintf(out, cap, "%s", path);
        return;
    }
    const char *dir_end = slash, *dir = slash;
    while (dir > path && dir[-1] != '/') dir--;
    if (dir_end == dir || (dir_end - dir == 1 && dir[0] == '.')) snprintf(out, cap, "%s", slash + 1);
    else snprintf(out, cap, "%.*s", (int)(dir_end - dir), dir);
}

static void name_sources(DataLoader *dl) {
    dl->source = xcalloc((size_t)dl->n_files, sizeof(int));
    dl->source_names = xcalloc((size_t)dl->n_files, sizeof(char *));
    for (int f = 0; f < dl->n_files; f++) {
        char name[512];
        source_of(dl->files[f], name, sizeof name);
        int s = 0;
        while (s < dl->n_sources && strcmp(dl->source_names[s], name) != 0) s++;
        if (s == dl->n_sources) dl->source_names[dl->n_sources++] = xstrdup(name);
        dl->source[f] = s;
    }
}

static int open_any(DataLoader *dl, const char *pattern, int B, int T, int rank, int world, int shuffle,
                    unsigned long long seed, int vocab_size, int mixed, ErrBuf *e) {
    memset(dl, 0, sizeof *dl);
    if (B < 1 || T < 1 || world < 1 || rank < 0 || rank >= world || vocab_size < 1)
        FATAL("dataloader_open: bad arguments B=%d T=%d rank=%d world=%d vocab_size=%d", B, T,
              rank, world, vocab_size);
    dl->B = B; dl->T = T; dl->rank = rank; dl->world = world;
    dl->shuffle = shuffle; dl->vocab_size = vocab_size;
    dl->mixed = mixed;
    dl->cur_file = -1;
    dl->order_epoch = -1;
    dl->window_epoch = -1;
    dl->row_epoch = -1;
    dl->st.seed = seed;

    glob_t g;
    int rc = glob(pattern, 0, NULL, &g);
    if (rc == GLOB_NOMATCH || (rc == 0 && g.gl_pathc == 0)) {
        globfree(&g);
        return errf(e, "no data shards match '%s' (hint: run `train_gpt tokenize` to make shards, "
                    "or check data.train / data.val in the config)", pattern);
    }
    if (rc != 0) {
        globfree(&g);
        return errf(e, "cannot expand the data pattern '%s' (glob error %d: unreadable directory?)",
                    pattern, rc);
    }
    if (g.gl_pathc > (size_t)1 << 30) FATAL("%zu shards match '%s'", g.gl_pathc, pattern);
    dl->n_files = (int)g.gl_pathc;
    dl->files = xcalloc((size_t)dl->n_files, sizeof(char *));
    for (int i = 0; i < dl->n_files; i++) dl->files[i] = xstrdup(g.gl_pathv[i]);
    globfree(&g);
    qsort(dl->files, (size_t)dl->n_files, sizeof(char *), compare_paths);  // locale-independent

    dl->n_tokens = xcalloc((size_t)dl->n_files, sizeof(long long));
    dl->token_bytes = xcalloc((size_t)dl->n_files, sizeof(int));
    dl->shard_order = xcalloc((size_t)dl->n_files, sizeof(int));
    dl->row_file = xcalloc((size_t)B, sizeof(int));
    uint32_t *buf = xmalloc(VALIDATE_CHUNK_TOKENS * sizeof(uint32_t));
    for (int i = 0; i < dl->n_files; i++) {
        if (validate_shard(dl, i, buf, e) != 0) {
            free(buf);
            dataloader_close(dl);
            return -1;
        }
    }
    free(buf);
    name_sources(dl);
    if (!mixed) return 0;
    dl->row_start = xcalloc((size_t)dl->n_files + 1, sizeof(long long));
    for (int f = 0; f < dl->n_files; f++) {
        long long rows = (dl->n_tokens[f] - 1) / T;
        if (rows < 1) rows = 0, dl->n_short++;
        dl->row_start[f + 1] = dl->row_start[f] + rows;
    }
    dl->n_rows = dl->row_start[dl->n_files];
    if (dl->n_rows < 1) {
        long long longest = 0;
        for (int f = 0; f < dl->n_files; f++) longest = dl->n_tokens[f] > longest ? dl->n_tokens[f] : longest;
        errf(e, "'%s': no shard holds one row of T+1 = %d tokens (the longest has %lld; use a smaller seq_len, "
             "or larger shards)", pattern, T + 1, longest);
        dataloader_close(dl);
        return -1;
    }
    dl->row_order = xmalloc((size_t)dl->n_rows * sizeof(long long));
    dl->fds = xmalloc((size_t)dl->n_files * sizeof(int));
    for (int f = 0; f < dl->n_files; f++) dl->fds[f] = -1;
    dl->row_buf = xmalloc(((size_t)T + 1) * sizeof(uint32_t));
    dl->row_tmp = xmalloc(((size_t)T + 1) * sizeof(uint32_t));
    return 0;
}

int dataloader_open(DataLoader *dl, const char *pattern, int B, int T, int rank, int world,
                    int shuffle, unsigned long long seed, int vocab_size, ErrBuf *e) {
    return open_any(dl, pattern, B, T, rank, world, shuffle, seed, vocab_size, 0, e);
}

int dataloader_open_mixed(DataLoader *dl, const char *pattern, int B, int T, int rank, int world,
                          int shuffle, unsigned long long seed, int vocab_size, ErrBuf *e) {
    return open_any(dl, pattern, B, T, rank, world, shuffle, seed, vocab_size, 1, e);
}

void dataloader_mix_passkey(DataLoader *dl, const PasskeyTemplate *t, double fraction) {
    if (!dl->mixed) FATAL("dataloader_mix_passkey: passkey mixing needs the mixed order");
    if (t && passkey_max_distance(t, dl->T + 1, PASSKEY_MAX_DIGITS) < 0)
        FATAL("dataloader_mix_passkey: rows of %d tokens are too short for a passkey sequence", dl->T + 1);
    dl->passkey = fraction > 0 ? t : NULL;
    dl->passkey_fraction = fraction;
}

void dataloader_close(DataLoader *dl) {
    for (int i = 0; i < dl->n_files && dl->files; i++) free(dl->files[i]);
    for (int i = 0; i < dl->n_sources; i++) free(dl->source_names[i]);
    for (int i = 0; i < dl->n_files && dl->fds; i++)
        if (dl->fds[i] >= 0) close(dl->fds[i]);
    free(dl->files);
    free(dl->n_tokens);
    free(dl->token_bytes);
    free(dl->source);
    free(dl->source_names);
    free(dl->row_file);
    free(dl->shard_order);
    free(dl->tokens);
    free(dl->window_order);
    free(dl->row_start);
    free(dl->row_order);
    free(dl->fds);
    free(dl->row_buf);
    free(dl->row_tmp);
    memset(dl, 0, sizeof *dl);
    dl->cur_file = -1;
}

// ---------------------------------------------------------------------------------------------
// Serving windows.

static void shard_order_for(const DataLoader *dl, unsigned long long seed, long long epoch,
                            int *out) {
    long long *tmp = xmalloc((size_t)dl->n_files * sizeof(long long));
    make_order(tmp, dl->n_files, dl->shuffle, order_key(seed, epoch, 0));
    for (int i = 0; i < dl->n_files; i++) out[i] = (int)tmp[i];
    free(tmp);
}

// Reads file f into dl->tokens (validated at open; a change since then is a system failure).
static void load_shard(DataLoader *dl, long long f) {
    const char *path = dl->files[f];
    FILE *fp = fopen(path, "rb");
    if (!fp) FATAL("%s: cannot reopen shard: %s (hint: was it removed during the run?)", path, strerror(errno));
    int32_t header[SHARD_HEADER_INTS];
    if (fread(header, sizeof(int32_t), SHARD_HEADER_INTS, fp) != SHARD_HEADER_INTS ||
        header[2] != dl->n_tokens[f])
        FATAL("%s: shard header changed since the loader validated it (hint: do not rewrite "
              "shards during a run)", path);
    free(dl->tokens);
    dl->tokens = xmalloc((size_t)dl->n_tokens[f] * sizeof(uint32_t));
    if (read_tokens(fp, dl->token_bytes[f], dl->tokens, (size_t)dl->n_tokens[f]) != 0)
        FATAL("%s: short read of %lld tokens (hint: the shard changed during the run?)", path,
              dl->n_tokens[f]);
    fclose(fp);
    dl->cur_file = f;
    dl->n_windows = shard_windows(dl, f);
    free(dl->window_order);
    dl->window_order = xmalloc((size_t)dl->n_windows * sizeof(long long));
    dl->window_epoch = -1;
}

// Makes the shard order, the loaded tokens and the window order match dl->st.
static void prepare(DataLoader *dl) {
    if (dl->order_epoch != dl->st.epoch) {
        shard_order_for(dl, dl->st.seed, dl->st.epoch, dl->shard_order);
        dl->order_epoch = dl->st.epoch;
    }
    const long long f = dl->shard_order[dl->st.shard_pos];
    if (dl->cur_file != f) load_shard(dl, f);
    if (dl->window_epoch != dl->st.epoch) {
        make_order(dl->window_order, dl->n_windows, dl->shuffle, order_key(dl->st.seed, dl->st.epoch, f + 1));
        dl->window_epoch = dl->st.epoch;
    }
}

static void next_shards(DataLoader *dl, int32_t *inputs, int32_t *targets) {
    prepare(dl);
    const long long S = window_tokens(dl);
    const long long j = dl->st.window_pos;
    const long long w = dl->window_order[(j * dl->world + dl->rank) % dl->n_windows];
    const uint32_t *src = dl->tokens + w * S;  // (S + 1) tokens of this window
    for (long long i = 0; i < S; i++) {
        inputs[i] = (int32_t)src[i];       // (B, T)
        targets[i] = (int32_t)src[i + 1];  // (B, T)
    }
    for (int b = 0; b < dl->B; b++) dl->row_file[b] = (int)dl->cur_file;
    // Advance: next position, next shard, next epoch.
    if (++dl->st.window_pos >= windows_per_rank(dl, dl->n_windows)) {
        dl->st.window_pos = 0;
        if (++dl->st.shard_pos >= dl->n_files) {
            dl->st.shard_pos = 0;
            dl->st.epoch++;
        }
    }
}

// Mixed order: micro-batches per rank and epoch.
static long long mixed_batches_per_rank(const DataLoader *dl) {
    long long n = dl->n_rows / ((long long)dl->B * dl->world);
    return n > 0 ? n : 1;
}

// The shard holding global row g (row_start is ascending; shards without rows are skipped).
static int file_of_row(const DataLoader *dl, long long g) {
    int lo = 0, hi = dl->n_files - 1;
    while (lo < hi) {  // the last f with row_start[f] <= g
        int mid = (lo + hi + 1) / 2;
        if (dl->row_start[mid] <= g) lo = mid;
        else hi = mid - 1;
    }
    while (dl->row_start[lo + 1] == dl->row_start[lo]) lo++;  // an empty shard starts where the next does
    return lo;
}

// Reads row i of shard f (tokens [i*T, i*T + T + 1)) into dl->row_buf.
static void read_row(DataLoader *dl, int f, long long i) {
    const char *path = dl->files[f];
    int fd = dl->fds[f];
    if (fd < 0) {
        fd = open(path, O_RDONLY);
        if (fd < 0) FATAL("%s: cannot reopen shard: %s (hint: was it removed during the run?)", path, strerror(errno));
        if (dl->n_files <= MAX_OPEN_SHARDS) dl->fds[f] = fd;
    }
    const int tb = dl->token_bytes[f];
    const size_t n = (size_t)dl->T + 1, bytes = n * (size_t)tb;
    unsigned char *dst = tb == 4 ? (unsigned char *)dl->row_buf : (unsigned char *)dl->row_tmp;
    off_t off = (off_t)SHARD_HEADER_BYTES + (off_t)i * dl->T * tb;
    for (size_t got = 0; got < bytes;) {
        ssize_t r = pread(fd, dst + got, bytes - got, off + (off_t)got);
        if (r <= 0) FATAL("%s: short read of row %lld: %s (hint: the shard changed during the run?)", path, i,
                          r < 0 ? strerror(errno) : "end of file");
        got += (size_t)r;
    }
    if (dl->fds[f] < 0) close(fd);
    if (tb == 2) {
        const uint16_t *narrow = (const uint16_t *)dl->row_tmp;
        for (size_t k = 0; k < n; k++) dl->row_buf[k] = narrow[k];
    }
    for (size_t k = 0; k < n; k++)
        if (dl->row_buf[k] >= (uint32_t)dl->vocab_size)
            FATAL("%s: token id %u in row %lld is >= vocab_size %d, though the shard was validated (hint: the shard "
                  "changed during the run?)", path, dl->row_buf[k], i, dl->vocab_size);
}

// Passkey mixing: whether the row at permutation position q of this epoch becomes a passkey
// sequence, and if so which (number, distance): all from (seed, epoch, q).
static void mix_passkey(DataLoader *dl, long long q) {
    uint64_t h = mix64(order_key(dl->st.seed, dl->st.epoch, PASSKEY_STREAM) ^ (uint64_t)q);
    if ((double)(h >> 11) * (1.0 / 9007199254740992.0) >= dl->passkey_fraction) return;
    uint64_t rng = h;
    char digits[PASSKEY_MAX_DIGITS + 1];
    passkey_random_digits(&rng, PASSKEY_MIN_DIGITS, PASSKEY_MAX_DIGITS, digits);
    const int L = dl->T + 1, max = passkey_max_distance(dl->passkey, L, (int)strlen(digits));
    const int distance = (int)(splitmix64_next(&rng) % (uint64_t)(max + 1));
    PasskeyItem item;
    memcpy(dl->row_tmp, dl->row_buf, sizeof(uint32_t) * (size_t)L);
    passkey_build(dl->passkey, dl->row_tmp, L, distance, digits, dl->row_buf, &item);
    dl->passkey_rows++;
}

static void next_mixed(DataLoader *dl, int32_t *inputs, int32_t *targets) {
    if (dl->row_epoch != dl->st.epoch) {
        make_order(dl->row_order, dl->n_rows, dl->shuffle, order_key(dl->st.seed, dl->st.epoch, 0));
        dl->row_epoch = dl->st.epoch;
    }
    const int B = dl->B, T = dl->T;
    const long long k = dl->st.window_pos * dl->world + dl->rank;  // the global micro-batch
    for (int b = 0; b < B; b++) {
        const long long q = (k * B + b) % dl->n_rows, g = dl->row_order[q];
        const int f = file_of_row(dl, g);
        read_row(dl, f, g - dl->row_start[f]);
        if (dl->passkey) mix_passkey(dl, q);
        for (int t = 0; t < T; t++) {
            inputs[(long)b * T + t] = (int32_t)dl->row_buf[t];       // (B, T)
            targets[(long)b * T + t] = (int32_t)dl->row_buf[t + 1];  // (B, T)
        }
        dl->row_file[b] = f;
    }
    if (++dl->st.window_pos >= mixed_batches_per_rank(dl)) {
        dl->st.window_pos = 0;
        dl->st.epoch++;
    }
}

void dataloader_next(DataLoader *dl, int32_t *inputs, int32_t *targets) {
    if (dl->mixed) next_mixed(dl, inputs, targets);
    else next_shards(dl, inputs, targets);
}

void dataloader_reset(DataLoader *dl) {
    dl->st.epoch = 0;
    dl->st.shard_pos = 0;
    dl->st.window_pos = 0;
}

long long dataloader_batches_per_epoch(const DataLoader *dl) {
    if (dl->mixed) return mixed_batches_per_rank(dl);
    long long total = 0;
    for (int f = 0; f < dl->n_files; f++) total += windows_per_rank(dl, shard_windows(dl, f));
    return total;
}

void dataloader_get_state(const DataLoader *dl, DataLoaderState *s) { *s = dl->st; }

int dataloader_set_state(DataLoader *dl, const DataLoaderState *s, ErrBuf *e) {
    if (s->epoch < 0)
        return errf(e, "data loader state: epoch %lld is negative", s->epoch);
    if (dl->mixed) {
        const long long per_rank = mixed_batches_per_rank(dl);
        if (s->shard_pos != 0)
            return errf(e, "data loader state: shard_pos %lld, but the mixed order keeps 0 (a checkpoint of "
                        "data.order \"shards\"?)", s->shard_pos);
        if (s->window_pos < 0 || s->window_pos >= per_rank)
            return errf(e, "data loader state: window_pos %lld out of range [0, %lld) micro-batches per epoch (the "
                        "shards, micro_batch, seq_len or world size changed since the checkpoint?)", s->window_pos,
                        per_rank);
        dl->st = *s;
        dl->row_epoch = -1;  // the seed may differ: rebuild the order
        return 0;
    }
    if (s->shard_pos < 0 || s->shard_pos >= dl->n_files)
        return errf(e, "data loader state: shard_pos %lld out of range [0, %d) (the number of data "
                    "shards changed since the checkpoint?)", s->shard_pos, dl->n_files);
    int *order = xmalloc((size_t)dl->n_files * sizeof(int));
    shard_order_for(dl, s->seed, s->epoch, order);
    const int f = order[s->shard_pos];
    free(order);
    const long long per_rank = windows_per_rank(dl, shard_windows(dl, f));
    if (s->window_pos < 0 || s->window_pos >= per_rank)
        return errf(e, "data loader state: window_pos %lld out of range [0, %lld) for shard %s "
                    "(the shards, micro_batch, seq_len or world size changed since the "
                    "checkpoint?)", s->window_pos, per_rank, dl->files[f]);
    dl->st = *s;
    dl->order_epoch = -1;  // the seed may differ: rebuild both orders
    dl->window_epoch = -1;
    return 0;
}

// ---------------------------------------------------------------------------------------------
// Writing shards.

int shard_write(const char *path, const uint32_t *tokens, long long n, ErrBuf *e) {
    if (n < 0 || n > INT32_MAX)
        return errf(e, "%s: %lld tokens do not fit a shard (at most %d)", path, n, INT32_MAX);
    uint32_t max_id = 0;
    for (long long i = 0; i < n; i++)
        if (tokens[i] > max_id) max_id = tokens[i];
    const int wide = max_id >= 65536;
    const size_t token_bytes = wide ? 4 : 2;
    const size_t bytes = (size_t)SHARD_HEADER_BYTES + (size_t)n * token_bytes;
    unsigned char *data = xcalloc(bytes, 1);
    int32_t header[SHARD_HEADER_INTS] = {0};
    header[0] = wide ? SHARD_MAGIC_U32 : SHARD_MAGIC_U16;
    header[1] = wide ? 7 : 1;
    header[2] = (int32_t)n;
    memcpy(data, header, sizeof header);
    if (wide) {
        memcpy(data + SHARD_HEADER_BYTES, tokens, (size_t)n * 4);
    } else {
        uint16_t *out = (uint16_t *)(data + SHARD_HEADER_BYTES);
        for (long long i = 0; i < n; i++) out[i] = (uint16_t)tokens[i];
    }
    int rc = write_file_atomic(path, data, bytes, e);
    free(data);
    return rc;
}
