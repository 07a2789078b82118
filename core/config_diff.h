// config_diff.h: what a resume may change. A checkpoint stores the resolved config it was made
// with; --resume compares it key by key with the config given now.
//
// A key "changes the trajectory" when a resumed run with a new value no longer continues the run
// its checkpoints come from: the model's shape and numerics (model.*, precision.*), what it reads
// and in which order (data.train, data.shuffle, data.seed), the optimizer and its schedule
// (train.lr, min_lr_ratio, warmup_steps, schedule, steps, weight_decay, betas, eps, grad_clip),
// the step's size (train.batch_tokens, train.micro_batch: the data windows are micro-batch sized)
// and the seed. The rest is how the same run is carried out or watched: the device and threads,
// recompute, ZeRO-1, the communication settings, max_bad_steps, the validation data and every
// key of eval, checkpoint, log and diagnostics. A key this file does not know (a section added
// later) counts as changing the trajectory, so that no change slips through unseen.
#ifndef CONFIG_DIFF_H
#define CONFIG_DIFF_H

#include "core/common.h"  // ErrBuf
#include "core/config.h"  // Config

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    char key[96];             // "train.lr"
    char before[1100], after[1100];  // the values as JSON text; null: the key is absent on that side
    int trajectory;           // config_key_changes_trajectory(key)
} ConfigChange;

// 1 when a resumed run with another value of key ("section.name") departs from the run it resumes.
int config_key_changes_trajectory(const char *key);

// The keys whose values differ between the stored resolved config text (as a checkpoint or a run
// directory's config.json holds it) and now. The stored text is read with config_parse first, so
// keys added since it was written take their defaults. Returns the number of differences with
// *out (caller frees; NULL when none), or -1 with e when the stored text cannot be read.
int config_changes(const char *stored_json, const Config *now, ConfigChange **out, ErrBuf *e);

// Appends one JSON line to <dir>/config_changes.jsonl recording that a resume at step `step`
// from `from` (a checkpoint path, or the run directory's config.json) continued with the
// changes listed. 0, or -1 with e.
int config_changes_record(const char *dir, long long step, const char *from, const ConfigChange *changes, int n,
                          ErrBuf *e);

#ifdef __cplusplus
}
#endif
#endif  // CONFIG_DIFF_H
