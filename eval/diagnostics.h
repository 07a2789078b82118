// diagnostics.h: FP8-attention diagnostics while training (config section `diagnostics`,
// docs/diagnostics.md): every `interval` steps, on fixed probe micro-batches at the current
// parameters, without touching the training state:
//  - per layer, on probe batch 0: the row-sum residual of dS (median and max of spec §4.1's
//    |sum_j dS_ij| / sum_j |dS_ij|, and the max of the cancellation-scaled measure the invariant is
//    asserted on), the same ratio for the dS the dQ and dK matmuls use, after its cast (the
//    post-cast residual, median and max), the saturation counts of the FP8 casts (Q, K, V, dO, P, dS), and the relative
//    L2 error of the attention input gradients dQ, dK, dV against a recomputation of the same
//    batch with attention in `reference` precision (end to end, and of the layer's attention
//    alone on the same inputs);
//  - the gradient-bias probe: over N = bias_probe_batches distinct probe batches, with g the full
//    parameter gradient of one batch, ratio = ||sum_b (g_mode - g_ref)|| / sum_b ||g_mode - g_ref||:
//    about 1/sqrt(N) when the differences are independent noise, near 1 when they point the same
//    way every time (a bias the optimizer integrates).
// Output: a compact table to the log and one JSON line per event into the metrics file.
//
// Both backends run the probes (cpu_model_probe, gpu_model_probe). On the GPU: the reference must be
// "bf16" (fp32 attention is CPU-only); the per-row measure is the cancellation-scaled residual
// (resid_median / resid_max, which need sum_j |dS_ij|, print as nan), the post-cast residual is
// not measured (nan: the FP8 backward sums dS per row before its cast only), and only the Q, K, V and dO
// casts are counted (P and dS cannot saturate: P <= 1 under its static 2^8 scale, dS is scaled
// by its own tile's amax).
#ifndef DIAGNOSTICS_H
#define DIAGNOSTICS_H

#include <stddef.h>  // size_t
#include <stdint.h>  // int32_t tokens
#include <stdio.h>   // FILE

#include "core/precision.h"  // AttnStats, ATTN_N_CASTS
#include "core/common.h"     // ErrBuf
#include "core/config.h"     // Config, AttnPrecision
#include "cpu/model_cpu.h"   // CpuModel, ModelProbe
#include "gpu/model_gpu.h"   // GpuModel, gpu_model_probe

#ifdef __cplusplus
extern "C" {
#endif

// Accumulator of the gradient-bias ratio over probe batches.
typedef struct {
    size_t n;          // gradient length
    double *sum_diff;  // (n) sum_b (g_mode - g_ref)
    double sum_norm;   // sum_b ||g_mode - g_ref||
    int count;         // batches added
} BiasProbe;

void bias_probe_init(BiasProbe *bp, size_t n);
void bias_probe_reset(BiasProbe *bp);
void bias_probe_add(BiasProbe *bp, const float *g_mode, const float *g_ref);  // both (n)
// ||sum_diff|| / sum_norm; NaN when nothing was added or every difference was zero.
double bias_probe_ratio(const BiasProbe *bp);
void bias_probe_free(BiasProbe *bp);

// One layer of a diagnostics event.
typedef struct {
    double resid_median, resid_max;     // over rows of |sum_j dS_ij| / sum_j |dS_ij|
    double resid_cancel_median;         // median and max over rows of the cancellation-scaled
    double resid_cancel_max;            // |sum_j dS_ij| / sum_j P(|dP|+|D|) (the median: GPU only)
    double post_median, post_max;       // over rows of |sum_j cast(dS)_ij| / sum_j |dS_ij| (CPU only)
    long long saturated[ATTN_N_CASTS];  // FP8 casts past the format's max, per AttnCast
    long long casts[ATTN_N_CASTS];      // FP8 casts, per AttnCast (0 in bf16 / fp32)
    // Relative L2 error of the attention input gradients against the reference, two ways:
    // err_*: the whole micro-batch recomputed with attention in the reference precision in every
    //   layer (what the run's gradients really are against a BF16 run: includes the error earlier
    //   layers and the FP8 forward propagated into this layer's inputs and output gradient);
    // local_*: this layer's attention alone recomputed in the reference precision on exactly the
    //   q, k, v and dO the run's attention received (the error this layer's attention adds).
    double err_dq, err_dk, err_dv;
    double err_qkv;                     // over dQ, dK, dV concatenated
    double local_dq, local_dk, local_dv, local_qkv;
} DiagLayer;

typedef struct {
    long long step;
    AttnPrecision mode, reference;
    int n_layer;
    DiagLayer *layers;         // (n_layer)
    float loss_mode, loss_ref; // probe batch 0's loss in the run's precision and the reference
    int bias_n;                // probe batches in the bias ratio (0: off)
    double bias_ratio;         // NaN when off or when no gradient differed from the reference
    double seconds;            // wall time of the event
} DiagReport;

typedef struct {
    int enabled;               // diagnostics.interval > 0
    int interval, n_bias;
    AttnPrecision mode, reference;
    int B, T, n_batches;       // probe batches held: max(1, n_bias), each (B, T)
    int32_t *inputs, *targets; // (n_batches, B, T)
    int prepared;              // the probe buffers below exist (made on the first event)
    ModelProbe run, ref;       // the run's precision, the reference precision
    BiasProbe bias;
    DiagReport last;           // the latest event (layers allocated with the probes)
    int on_gpu;                // the probes are GPU probes (model_gpu.h)
} Diagnostics;

// From the config: disabled (returns 0, every call a no-op) when diagnostics.interval is 0.
// Otherwise reads the probe batches once, max(1, bias_probe_batches) windows of (B, T) from
// data.val (data.train when there is none) in a seeded order of their own, so every event looks
// at the same batches. -1 with e filled when the shards cannot be read.
int diagnostics_init(Diagnostics *d, const Config *c, int B, int T, ErrBuf *e);
// The same with probe batches given (n of them, (n, B, T) each array); n >= 1. For tests and
// callers with their own probe stream. n smaller than bias_probe_batches lowers the bias N to n.
void diagnostics_init_batches(Diagnostics *d, const Config *c, int B, int T, const int32_t *inputs,
                              const int32_t *targets, int n);
void diagnostics_free(Diagnostics *d);

// Whether `step` is a diagnostics step.
int diagnostics_due(const Diagnostics *d, long long step);

// Call once per step after the optimizer update. At a due step runs the event on the one model
// given (cpu or gpu, the other NULL; its B, T must be the probe batches').
// Writes the table to log and one JSON line to metrics (either may be NULL).
void diagnostics_maybe_run(Diagnostics *d, CpuModel *cpu, GpuModel *gpu, long long step, FILE *metrics, FILE *log);

// Runs an event now, whatever the step; fills and returns d->last.
const DiagReport *diagnostics_run(Diagnostics *d, CpuModel *cpu, GpuModel *gpu, long long step, FILE *metrics,
                                  FILE *log);

// The event as one JSON line ({"step": s, "diagnostics": {...}} and '\n'); caller frees.
char *diagnostics_json(const DiagReport *r);

#ifdef __cplusplus
}
#endif
#endif  // DIAGNOSTICS_H
