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

#include "comm/comm.h"      // Comm
#include "core/common.h"    // ErrBuf
#include "core/config.h"    // TrainConfig
#include "gpu/model_gpu.h"  // GpuModel

#ifdef __cplusplus
extern "C" {
#endif

// Step 1 above; *norm is the global L2 norm of the summed gradient, the same on every rank.
// reduced: the slice was already summed (gpu_dp_overlap_finish under ZeRO-1): the norm only.
int zero1_gpu_sync_grads(GpuModel *m, Comm *c, int reduced, double *norm, ErrBuf *e);
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

// --- Overlap of the gradient reduction with the backward (train.overlap_comm, default on) ---------
// During the LAST micro-step's backward, the model's gradient-ready hook (model_gpu.h) reports the
// ranges of the flat gradient buffer that are final, from the top of the buffer down: the final
// norm and the untied LM head at once (the head's gradient is made by the forward), then each
// block from the last to the first, then wte (embedding, and the tied head) at the very end.
// Adjacent ranges are gathered into buckets of whole ranges (whole layers) of at least
// DP_BUCKET_BYTES; a bucket is handed over by recording an event on the model's stream that a
// separate, high-priority communication stream waits on, then enqueueing its collective there:
//   plain DP: ncclAllReduce of the bucket, in place;
//   ZeRO-1:   ncclReduce (sum, in place) of each piece of the bucket that falls in one rank's
//             slice [r*S, min((r+1)*S, P)), to that rank: every rank ends with its own slice
//             summed, as the reduce-scatter leaves it (the rest of g, unused, stays unreduced).
// Per element this is the same sum as the single all-reduce / reduce-scatter after the backward:
// with 2 ranks one FP32 addition per value whatever the algorithm, so losses stay bit for bit;
// with more ranks NCCL may add in another order (FP32 rounding, as between its collectives).
// gpu_dp_overlap_finish (in backend_dp_sync_grads, before the norm and the optimizer) waits for
// the communication stream with comm.h's deadline (comm_wait_async: a dead or hung rank ends the
// run with a message naming the buckets) and makes the model's stream wait on it.
#define DP_BUCKET_BYTES (32u << 20)

typedef struct GpuDpOverlap {
    GpuModel *m;
    Comm *c;
    int zero1;              // reduce each piece to its owner instead of all-reducing
    size_t bucket_values;   // a bucket is handed over once it holds this many values
    void *comm_stream;      // cudaStream_t of the buckets' collectives
    void *ready, *done;     // cudaEvent_t: model stream -> comm stream, comm stream -> model stream
    size_t next_hi;         // the next reported range must end here (P: none reported yet)
    size_t pend_lo, pend_hi;  // final gradients not handed over yet
    int armed;              // the hook is set for the coming backward
    int buckets;            // handed over during the current backward (0: none yet)
    int failed;             // an enqueue failed: err says why (reported by finish)
    ErrBuf err;
} GpuDpOverlap;

// Creates the stream and events for model m over c (world > 1, NCCL). 0, or -1 with e.
int gpu_dp_overlap_init(GpuDpOverlap *o, GpuModel *m, Comm *c, int zero1, ErrBuf *e);
void gpu_dp_overlap_free(GpuDpOverlap *o);
// Sets (arm 1) or clears (0) the model's hook: around the last micro-step's backward only.
void gpu_dp_overlap_arm(GpuDpOverlap *o, int arm);
// 1 once a backward has handed over buckets that finish has not waited for yet.
int gpu_dp_overlap_in_flight(const GpuDpOverlap *o);
// After that backward: waits for every bucket (deadline), the model's stream then waits on the
// communication stream. 0, or -1 with e (the communicator is then unusable).
int gpu_dp_overlap_finish(GpuDpOverlap *o, ErrBuf *e);

#ifdef __cplusplus
}
#endif
#endif  // ZERO1_GPU_H
