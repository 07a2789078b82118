// trainer.h: the training run loop on the CPU or the GPU (backend.h): data, gradient accumulation, AdamW,
// progress lines, JSONL metrics, evaluation, samples, checkpoints, exact resume and a clean
// stop on SIGINT/SIGTERM.
#ifndef TRAINER_H
#define TRAINER_H

#include "config.h"  // Config

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int resume;               // --resume given: continue the run in log.dir
    const char *resume_from;  // a checkpoint path; NULL or "latest": the newest of the run's checkpoints
    long long stop_after;     // > 0: stop after this step, writing a checkpoint (tests, preemption drills)
} TrainOptions;

// Trains c (validated) on the device train.device names: "auto" takes the GPU when there is one
// and the GPU backend runs the config (else the CPU, with a note saying why); "gpu" without
// either is an error. Bad input (data, run dir, checkpoint, device) is reported as
// "train_gpt: error: ..." before anything is written. Returns the process exit status.
int train_run(const Config *c, const TrainOptions *opt);

#ifdef __cplusplus
}
#endif
#endif  // TRAINER_H
