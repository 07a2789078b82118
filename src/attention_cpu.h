// attention_cpu.h: causal attention for one head on the CPU, in every precision of
// ../shared/design/fp8-attention.md, emulating the GPU kernels' tiling and FP8 casts bit-exactly,
// plus an FP64 reference. This is the oracle the GPU kernels are tested against.
//
// Layout: one head at a time, row-major (T, d) float arrays. tau = 1/sqrt(d). The kernels walk
// query blocks of opt->block_q rows and, inside each, key blocks of opt->block_k columns in
// increasing order (the online softmax advances its running max one key block at a time), so the
// FP8 values of P depend on block_k exactly as on the GPU.
#ifndef ATTENTION_CPU_H
#define ATTENTION_CPU_H

#include "config.h"  // AttnPrecision, ScalingKind
#include "fp8.h"     // Fp8Format

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    AttnPrecision precision;
    Fp8Format grad_format;  // dO and dS casts in the FP8 backward (E4M3 or E5M2)
    ScalingKind scaling;    // block (per 128-token block / per tile) or delayed (per tensor)
    float p_scale;          // static scale of P before its E4M3 cast (default 256)
    int block_q, block_k;   // tile sizes of the GPU kernel being emulated (default 128, 128)
} AttnOptions;

// Fills opt from the precision section of a config.
void attn_options_from_config(AttnOptions *opt, const PrecisionConfig *p);

// The FP8 casts whose scale and saturation are tracked.
typedef enum { CAST_Q = 0, CAST_K, CAST_V, CAST_DO, CAST_P, CAST_DS, ATTN_N_CASTS } AttnCast;

// Delayed scaling (scaling == SCALING_DELAYED): per layer, per tensor (Q, K, V, dO) an amax
// history of the previous `len` steps; the scale of a step comes from the max of the history
// (from the step's own amax while the history is empty). cur_amax collects this step's amax
// over all heads; attn_delayed_commit() pushes it into the history at the end of a step.
#define ATTN_MAX_AMAX_HISTORY 64
typedef struct {
    int len, pos, filled;
    float hist[4][ATTN_MAX_AMAX_HISTORY];
    float cur_amax[4];
} AttnDelayedState;
void attn_delayed_init(AttnDelayedState *s, int history_len);
void attn_delayed_commit(AttnDelayedState *s);

// Counters a call adds to (callers zero them).
typedef struct {
    long long saturated[ATTN_N_CASTS];  // values whose |x*s| exceeded the format's max
    long long casts[ATTN_N_CASTS];      // values cast
    double resid_max;                   // max over rows of |sum_j dS_ij| / sum_j |dS_ij|
} AttnStats;

// Forward. q, k, v: (T, d). o: (T, d) output, stored as the GPU stores it (BF16-rounded in every
// mode but fp32). lse: (T) row log-sum-exp of tau*S in FP32 (natural log).
void attn_cpu_forward(const AttnOptions *opt, AttnDelayedState *ds, int T, int d,
                      const float *q, const float *k, const float *v, float *o, float *lse,
                      AttnStats *st);

// Backward. o and lse are what the forward stored; dout: (T, d). dq, dk, dv: (T, d) outputs
// (overwritten). row_resid (optional, (T)): per row |sum_j dS_ij| / sum_j |dS_ij|.
void attn_cpu_backward(const AttnOptions *opt, AttnDelayedState *ds, int T, int d,
                       const float *q, const float *k, const float *v, const float *o,
                       const float *lse, const float *dout, float *dq, float *dk, float *dv,
                       AttnStats *st, float *row_resid);

// FP64 reference on the unquantized inputs (for tests and attn-check).
void attn_ref_forward_f64(int T, int d, const double *q, const double *k, const double *v,
                          double *o, double *lse);
void attn_ref_backward_f64(int T, int d, const double *q, const double *k, const double *v,
                           const double *dout, double *dq, double *dk, double *dv);

// `train_gpt attn-check [--T N] [--d N] [--seed N] [--grad-format e4m3|e5m2] [--device cpu]`:
// prints spec §4's table. Returns the process exit status.
int cmd_attn_check(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif  // ATTENTION_CPU_H
