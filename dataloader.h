// dataloader.h: llm.c-compatible token shards.
//
// A shard is a 256 x int32 header followed by tokens:
//   header[0] magic 20240520, header[1] version 1, header[2] token count, then uint16 tokens; or
//   header[0] magic 20240801, header[1] version 7, header[2] token count, then uint32 tokens.
// The loader expands a glob into a sorted list of shards, validates every one at open time
// (magic, version, file size == header + count * token size, every token id < vocab_size), and
// serves (B, T) micro-batches: inputs tokens[0..T), targets tokens[1..T+1) of each row.
//
// Two orders (data.order):
//
// mixed (dataloader_open_mixed): every shard is cut into rows of T+1 tokens (row i: tokens
// [i*T, i*T + T + 1), (n - 1) / T rows per shard), and an epoch visits all rows of all shards in
// one seeded permutation (identity without shuffle), so every micro-batch mixes sources. Global
// micro-batch k takes rows [k*B, k*B + B) of the permutation; rank r of W takes k = j*W + r at
// its j-th call, so ranks read disjoint rows and W ranks read together what one rank reads in W
// calls. An epoch has max(1, rows / (B*W)) micro-batches per rank (the rows past them are left
// out that epoch; with shuffle others each epoch; fewer rows than B*W wrap). Rows are read from
// the files as needed (pread), so shards of any size take no memory. A shard shorter than T+1
// tokens gives no row (n_short counts them).
//
// shards (dataloader_open): an epoch visits the shards in a seeded permutation (when shuffle),
// and inside a shard the windows of B*T tokens in a seeded permutation; rank r of W takes every
// W-th window, so ranks read disjoint slices. A shard of n tokens has (n - 1) / (B*T) windows;
// window w is tokens [w*B*T, w*B*T + B*T + 1). Every rank takes n_windows / W windows of each
// shard (the last n_windows % W of that epoch's order are skipped; with shuffle they change every
// epoch), so all ranks move in lockstep. A shard with fewer windows than ranks gives each rank
// one window and ranks wrap (rank r reads window r % n_windows). A shard too small for one window
// is an error.
//
// Either way the whole position is a few integers (DataLoaderState), identical on every rank,
// that a checkpoint saves and restores exactly. Orders come from splitmix64 keyed by (seed,
// epoch) and, for the shards order's windows, the file index.
//
// Passkey mixing (mixed order, dataloader_mix_passkey): a seeded fraction of the rows is turned
// into passkey sequences (eval/passkey.h) whose filler is the row's own text; which rows, and
// their numbers and distances, follow from (seed, epoch, row position), so runs resume exactly
// and every world size sees the same sequences.
#ifndef DATALOADER_H
#define DATALOADER_H

#include <stdint.h>  // int32_t

#include "core/common.h"  // ErrBuf

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    unsigned long long seed;
    long long epoch;        // completed passes over all shards
    long long shard_pos;    // index into this epoch's shard order
    long long window_pos;   // index into this shard's window order
} DataLoaderState;

struct PasskeyTemplate;  // eval/passkey.h

typedef struct {
    int B, T, rank, world, shuffle, vocab_size;
    int mixed;              // 1: the mixed order, 0: shard by shard
    int n_files;
    char **files;           // (n_files) sorted shard paths
    long long *n_tokens;    // (n_files) token count of each shard
    int *token_bytes;       // (n_files) 2 or 4
    int *source;            // (n_files) index into source_names
    char **source_names;    // (n_sources) each shard's source: the name of its folder
                            // (data/corpus/kjv/val_000000.bin: kjv), in the files' order
    int n_sources;
    int *row_file;          // (B) the shard each row of the last micro-batch came from
    DataLoaderState st;
    // mixed order
    long long *row_start;   // (n_files + 1) first global row of each shard; [n_files] = n_rows
    long long n_rows;
    int n_short;            // shards shorter than one row
    long long *row_order;   // (n_rows) this epoch's permutation
    long long row_epoch;    // epoch row_order was made for, -1 if none
    int *fds;               // (n_files) descriptors opened as rows are read, -1 if not open
    uint32_t *row_buf, *row_tmp;  // (T + 1) one row as read, scratch for passkey mixing
    const struct PasskeyTemplate *passkey;  // passkey mixing, or NULL
    double passkey_fraction;
    long long passkey_rows; // passkey sequences served so far (this process)
    // shards order: current shard
    int *shard_order;       // (n_files) this epoch's permutation
    long long cur_file;     // index into files of the loaded shard, -1 if none
    uint32_t *tokens;       // tokens of the loaded shard
    long long *window_order;// (n_windows) this shard's window permutation
    long long n_windows;
    long long order_epoch;  // epoch shard_order was made for, -1 if none
    long long window_epoch; // epoch window_order was made for, -1 if none
} DataLoader;

// Opens every shard matching pattern and validates it, for the shards order; returns 0 or -1
// with a message naming the file and what is wrong. A shard too small for one window of B*T+1
// tokens is an error.
int dataloader_open(DataLoader *dl, const char *pattern, int B, int T, int rank, int world,
                    int shuffle, unsigned long long seed, int vocab_size, ErrBuf *e);
// The same for the mixed order. Shards shorter than T+1 tokens give no rows (dl->n_short); all
// of them together must hold at least one row.
int dataloader_open_mixed(DataLoader *dl, const char *pattern, int B, int T, int rank, int world,
                          int shuffle, unsigned long long seed, int vocab_size, ErrBuf *e);
// Mixed order: turns the given fraction (0..1) of rows into passkey sequences built from the
// template t (kept, not copied; T+1 must hold one: passkey_max_distance(t, T+1, 7) >= 0).
void dataloader_mix_passkey(DataLoader *dl, const struct PasskeyTemplate *t, double fraction);
void dataloader_close(DataLoader *dl);

// Fills inputs and targets (B, T) with the next micro-batch of this rank (and row_file with
// the shard of each row); wraps to a new epoch.
void dataloader_next(DataLoader *dl, int32_t *inputs, int32_t *targets);

// Back to the start of the first epoch (validation uses the same windows every time).
void dataloader_reset(DataLoader *dl);

// Batches (calls to dataloader_next) in one epoch of this rank (the same on every rank).
long long dataloader_batches_per_epoch(const DataLoader *dl);

// The state names the NEXT micro-batch to serve; it is identical on every rank. In the mixed
// order shard_pos is 0 and window_pos counts this rank's micro-batches in the epoch. set_state
// adopts the saved seed too (the seed is part of the position).
void dataloader_get_state(const DataLoader *dl, DataLoaderState *s);
// Restores a saved position; returns -1 with a message if it does not fit these shards.
int dataloader_set_state(DataLoader *dl, const DataLoaderState *s, ErrBuf *e);

// Writes a shard (for tests and the tokenizer): version 1 (uint16) when every id < 65536,
// else version 7 (uint32). Atomic. Returns 0 or -1.
int shard_write(const char *path, const uint32_t *tokens, long long n, ErrBuf *e);

#ifdef __cplusplus
}
#endif
#endif  // DATALOADER_H
