// checkpoint.h: one file per checkpoint holding everything a run needs to continue exactly:
// the resolved config, the model's shape and parameter table, FP32 parameters, AdamW moments
// and step, the train loop's step, the data loader position, the attention delayed-scaling
// state and the sampling RNG. Written atomically; loading validates every field against the
// model it is loaded into and says which field differs.
//
// File layout (little-endian, version 2; version 1 files, which end after the delayed-scaling
// states, load as having no key centres):
//   u32 magic "TGPT" (0x54475054), u32 version, u64 file size (all bytes, checksum included)
//   i64 x 12: vocab_size, padded_vocab, d_model, n_layer, n_head, ffn_hidden, seq_len,
//             qk_norm, tied, position, n_tensors, total_params
//   u64 config length, then that many bytes of resolved config JSON
//   n_tensors x { char name[64], i64 rows, i64 cols }
//   f32 params (total), f32 adam m (total), f32 adam v (total)
//   i64 adam step, i64 train step, f64 elapsed seconds, u64 sample RNG state
//   DataLoaderState: u64 seed, i64 epoch, i64 shard_pos, i64 window_pos
//   u64 n_delayed, then n_delayed x AttnDelayedState: i32 len, pos, filled,
//       f32 hist[4][ATTN_MAX_AMAX_HISTORY], f32 cur_amax[4]  (the backend's delayed-scaling states:
//       attention's, one per layer, then with precision.linear_scaling "delayed" the FP8 linears',
//       two per layer; restored only into a model with as many)
//   u64 n_key_center, then n_key_center x f32: centred keys' delayed c, (n_layer, n_head,
//       head_dim), or 0 when the run has none yet (AttnKeyCenters; restored only into a model
//       that keeps as many)
//   u64 FNV-1a 64 checksum of every byte before it
#ifndef CHECKPOINT_H
#define CHECKPOINT_H

#include <stddef.h>  // size_t

#include "core/precision.h"  // AttnDelayedState
#include "core/common.h"     // ErrBuf
#include "core/config.h"     // ModelConfig
#include "dataloader.h"      // DataLoaderState
#include "core/model.h"      // ParamTable

#ifdef __cplusplus
extern "C" {
#endif

#define CKPT_MAGIC 0x54475054u  // "TGPT"
#define CKPT_VERSION 2
#define CKPT_VERSION_MIN 1  // the oldest version this build reads

// Where the state lives in memory. Save reads these buffers; load validates the file against
// model/table and then writes into them. adam_m / adam_v / delayed may be NULL on load to skip
// them (sampling needs only the parameters).
typedef struct {
    const ModelConfig *model;    // shape the buffers were built for
    const ParamTable *table;
    const char *config_json;     // save: the resolved config text stored in the file
    float *params;               // (table->total)
    float *adam_m, *adam_v;      // (table->total)
    long long adam_step;         // optimizer steps taken
    long long train_step;        // train-loop steps completed
    double elapsed_s;            // training wall time so far
    unsigned long long sample_rng;
    DataLoaderState data;
    AttnDelayedState *delayed;   // (n_delayed) per layer, or NULL
    int n_delayed;
    char **config_out;           // load: when non-NULL, receives the stored config text (caller frees)
    AttnKeyCenters *key_centers; // centred keys' delayed c, or NULL (save: kept when ready; load: fills it)
} CheckpointState;

// The file's last 8 bytes: FNV-1a 64 of every byte before them (tests that forge a file use it).
uint64_t checkpoint_checksum(const unsigned char *p, size_t n);

// Writes the state to path atomically (temp file + fsync + rename). 0, or -1 with e filled;
// the previous file at path is untouched on failure. A state that is not finite (a NaN or Inf in
// the parameters, the moments or the delayed-scaling amaxes) is refused: a diverged model is
// never checkpointed.
int checkpoint_save(const char *path, const CheckpointState *s, ErrBuf *e);

// Reads path, checks magic, version, size, checksum and every shape field against s->model and
// s->table, and that the values it is asked for (parameters; moments when s->adam_m, adam_v are
// given; delayed-scaling amaxes) are finite; only then fills s's buffers and scalars, so a refused
// file leaves them as they were. delayed-scaling state is restored only when both the file and s
// have it for the same number of layers. 0; -1 with e naming the file and what is wrong with it
// (unreadable, truncated, corrupt, not finite); -2 with e naming the field when the file is sound
// but made for another model (a shape field, a tensor's name or shape).
int checkpoint_load(const char *path, CheckpointState *s, ErrBuf *e);

// The resolved config JSON stored in a checkpoint (validated header and checksum); caller frees.
char *checkpoint_read_config(const char *path, ErrBuf *e);

// The checkpoint directory of a run: checkpoint.dir, or <log.dir>/checkpoints when empty.
void checkpoint_dir_of(const Config *c, char *out, size_t out_len);

// "<dir>/step_000050.ckpt"
void checkpoint_path_for_step(const char *dir, long long step, char *out, size_t out_len);

// Points <dir>/latest at the file name of path (atomic). 0 or -1.
int checkpoint_mark_latest(const char *dir, const char *path, ErrBuf *e);

// The newest checkpoint of dir: the one `latest` names, else the highest step_*.ckpt.
// 0 with out filled, or -1 with e filled when dir holds none.
int checkpoint_find_latest(const char *dir, char *out, size_t out_len, ErrBuf *e);

// Every checkpoint of dir, newest first: the one `latest` names, then the step_*.ckpt files by
// descending step (the order in which a resume tries them, falling back past corrupt ones).
// Returns the count; *paths (free with checkpoint_list_free) holds that many paths.
int checkpoint_list_newest_first(const char *dir, char ***paths);
void checkpoint_list_free(char **paths, int n);

// Whether dir holds any checkpoint (a `latest` file or a step_*.ckpt).
int checkpoint_dir_has_any(const char *dir);

// What a --checkpoint or --resume argument names: a checkpoint file (*is_file = 1, out = arg), or
// a directory whose newest valid checkpoint is meant (*is_file = 0, out = that directory): a
// checkpoint directory, a run directory (its checkpoints/), or a `latest` pointer (its
// directory). 0, or -1 with e when arg does not exist or is neither.
int checkpoint_resolve(const char *arg, char *out, size_t out_len, int *is_file, ErrBuf *e);

// Deletes all but the newest `keep` step_*.ckpt files of dir up to newest_step, the step just
// written (keep <= 0: keep all). Files of later steps (left by a run that resumed from an older
// checkpoint) are neither counted nor deleted, so the checkpoint just written, which is finite
// (checkpoint_save refuses any other), is never among those deleted. Returns the number deleted.
int checkpoint_prune(const char *dir, int keep, long long newest_step);

#ifdef __cplusplus
}
#endif
#endif  // CHECKPOINT_H
