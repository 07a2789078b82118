// zero1_gpu.h: ZeRO-1 on the GPU backend: the collectives around a GpuModel built with
// gpu_model_init_sharded (model_gpu.h), the same semantics as backend.c's CPU ZeRO-1.
//
// P parameters, W ranks, S = ceil(P / W); rank r owns [lo, hi) = [r*S, min((r+1)*S, P)) and keeps
// only that slice's FP32 masters and AdamW moments (S values each); the BF16 working weights and
// the FP32 gradients stay full (P) on every rank. One step:
//   1. zero1_gpu_sync_grads: reduce-scatter (sum) of the gradients in place, so g[lo, hi) holds
//      this rank's slice of the summed gradient; the global norm is the sum over the slices of
//      their sums of squares (each rank its own, FP64 on the device), gathered and added in rank
//      order on every rank: every rank gets the same bits, and plain data parallelism gets them
//      too (zero1_gpu_full_norm adds the same slices of its all-reduced gradient in the same
//      order). With W = 2 NCCL's reduce-scatter and all-reduce give the same sums (one addition
//      per value), so a ZeRO-1 step is a plain step bit for bit (given the same gradients: the
//      attention backward's dQ atomics may differ between runs); with W > 2 NCCL may add the
//      ranks in another order in the two collectives (FP32 rounding differences only).
//   2. zero1_gpu_step: AdamW on the slice (gpu_model_step_slice, which also rounds the slice into
//      the BF16 weights), then an all-gather of the BF16 slices: every rank's weights complete
//      again. Gathering BF16 instead of FP32 masters gives the same weights (the cast is per
//      element) with half the traffic, and no rank needs the other slices' FP32 values.
// NCCL's reduce-scatter and all-gather need W * S values, more than P when W does not divide P
// (never for W = 2, 4, 8: P is a multiple of 8 on the GPU backend). Then the gradients are
// all-reduced instead (the same sums, twice the traffic) and the BF16 all-gather runs in the
// gradient buffer (dead after the step) and is copied into the weights.
//
// Every collective runs on the model's stream (comm->stream) with comm.h's deadline: a dead or
// hung rank makes the others fail with a message, never hang. Each function returns 0, or -1 with
// e filled (the communicator is then unusable).
#ifndef ZERO1_GPU_H
#define ZERO1_GPU_H

#include "comm.h"       // Comm
#include "common.h"     // ErrBuf
#include "config.h"     // TrainConfig
#include "model_gpu.h"  // GpuModel

#ifdef __cplusplus
extern "C" {
#endif

// Step 1 above; *norm is the global L2 norm of the summed gradient, the same on every rank.
int zero1_gpu_sync_grads(GpuModel *m, Comm *c, double *norm, ErrBuf *e);
// Step 2 above, with learning rate lr and the gradients multiplied by clip first.
int zero1_gpu_step(GpuModel *m, Comm *c, double lr, double clip, const TrainConfig *tc, ErrBuf *e);
// The full FP32 parameters and AdamW moments (P values each) into host arrays, for checkpoints.
// A collective: every rank calls it; an output may be NULL (ranks other than the writer pass
// NULL for all three). Uses the gradient buffer as scratch: call it between steps.
int zero1_gpu_gather_state(GpuModel *m, Comm *c, float *params, float *adam_m, float *adam_v, ErrBuf *e);

// Plain data parallelism (no sharding), after the all-reduce: the global norm of the (full)
// gradients, summed over the W slices of ZeRO-1 in rank order, so that plain and ZeRO-1 runs clip
// by the same factor, bit for bit.
double zero1_gpu_full_norm(GpuModel *m, int world);

#ifdef __cplusplus
}
#endif
#endif  // ZERO1_GPU_H
