// dataloader.h: llm.c-compatible token shards.
//
// A shard is a 256 x int32 header followed by tokens:
//   header[0] magic 20240520, header[1] version 1, header[2] token count, then uint16 tokens; or
//   header[0] magic 20240801, header[1] version 7, header[2] token count, then uint32 tokens.
// The loader expands a glob into a sorted list of shards, validates every one at open time
// (magic, version, file size == header + count * token size, every token id < vocab_size), and
// serves (B, T+1) windows: inputs tokens[0..T), targets tokens[1..T+1).
//
// Order: an epoch visits the shards in a seeded permutation (when shuffle), and inside a shard
// the windows of B*T tokens in a seeded permutation; rank r of W takes every W-th window, so
// ranks read disjoint slices. The whole position is a few integers (DataLoaderState) that a
// checkpoint saves and restores exactly.
//
// Details: a shard of n tokens has (n - 1) / (B*T) windows; window w is tokens
// [w*B*T, w*B*T + B*T + 1). Every rank takes n_windows / W windows of each shard (the last
// n_windows % W of that epoch's order are skipped; with shuffle they change every epoch), so all
// ranks move in lockstep and DataLoaderState is identical on every rank. A shard with fewer
// windows than ranks gives each rank one window and ranks wrap (rank r reads window
// r % n_windows), so windows repeat across ranks there. Orders come from splitmix64 keyed by
// (seed, epoch) for shards and (seed, epoch, file index) for windows.
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

typedef struct {
    int B, T, rank, world, shuffle, vocab_size;
    int n_files;
    char **files;           // (n_files) sorted shard paths
    long long *n_tokens;    // (n_files) token count of each shard
    int *token_bytes;       // (n_files) 2 or 4
    DataLoaderState st;
    // current shard
    int *shard_order;       // (n_files) this epoch's permutation
    long long cur_file;     // index into files of the loaded shard, -1 if none
    uint32_t *tokens;       // tokens of the loaded shard
    long long *window_order;// (n_windows) this shard's window permutation
    long long n_windows;
    long long order_epoch;  // epoch shard_order was made for, -1 if none
    long long window_epoch; // epoch window_order was made for, -1 if none
} DataLoader;

// Opens every shard matching pattern and validates it; returns 0 or -1 with a message naming
// the file and what is wrong. A shard too small for one (B, T+1) window is an error.
int dataloader_open(DataLoader *dl, const char *pattern, int B, int T, int rank, int world,
                    int shuffle, unsigned long long seed, int vocab_size, ErrBuf *e);
void dataloader_close(DataLoader *dl);

// Fills inputs and targets (B, T) with the next window of this rank; wraps to a new epoch.
void dataloader_next(DataLoader *dl, int32_t *inputs, int32_t *targets);

// Back to the start of the first epoch (validation uses the same windows every time).
void dataloader_reset(DataLoader *dl);

// Batches (calls to dataloader_next) in one epoch of this rank (the same on every rank).
long long dataloader_batches_per_epoch(const DataLoader *dl);

// The state names the NEXT window to serve; it is identical on every rank. set_state adopts the
// saved seed too (the seed is part of the position).
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
