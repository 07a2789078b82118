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

#include "core/config.h"  // AttnPrecision, ScalingKind
#include "core/fp8.h"     // Fp8Format

#include <stddef.h>  // size_t
#include <stdint.h>  // uint64_t

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
// (while the history is empty, i.e. on the first step, from the head's own amax). cur_amax
// collects this step's amax over all heads; attn_delayed_commit() pushes it into the history at the end of a step.
#define ATTN_MAX_AMAX_HISTORY 64
typedef struct {
    int len, pos, filled;
    float hist[4][ATTN_MAX_AMAX_HISTORY];
    float cur_amax[4];
} AttnDelayedState;
void attn_delayed_init(AttnDelayedState *s, int history_len);
// The maximum of tensor `tensor`'s history (0..3; the history must not be empty): the amax a
// delayed scale comes from (attention's and the FP8 linears' alike).
float attn_delayed_amax(const AttnDelayedState *s, int tensor);
void attn_delayed_commit(AttnDelayedState *s);
// A copy of n layers' states (n may be 0), for a step that must leave no trace in them (a
// diagnostics probe); attn_delayed_restore copies it back over s and frees it.
AttnDelayedState *attn_delayed_save(const AttnDelayedState *s, int n);
void attn_delayed_restore(AttnDelayedState *s, AttnDelayedState *saved, int n);
// The four tensor scales of a step from a history that is not empty: scale[t] =
// fp8_scale_for_amax(format of t, max of the history of t; V's within 2^±ATTN_V_SCALE_MAX_EXP), Q, K, V in E4M3 and dO in
// grad_format: what attn_quantize_operand uses past the first step (the GPU model uploads them).
void attn_delayed_scales(const AttnDelayedState *s, Fp8Format grad_format, float scale[4]);

// Block scaling: one scale per ATTN_SCALE_BLOCK tokens of the head's sequence for Q, K, V, dO,
// independent of the kernel's block_q / block_k.
#define ATTN_SCALE_BLOCK 128
// V's block scales have their exponent clamped to [-40, 40] (fp8_scale_for_amax_within), not
// [-126, 126]: a V block whose amax lies in [~2^-32, ~2^49] is quantized as any other operand;
// smaller values lose bits (below 2^-49 they become 0), larger ones saturate at 448 * 2^40.
// Why: the FP8 forward carries O in the units of each key block's V scale, so that a block's O
// update is one FFMA (attention_fwd_fp8_step.cuh); those units move O by the ratio of two V
// scales of the head, at most 2^80 here, which keeps it inside FP32 for any T up to 2^20
// (docs/fp8-attention.md §2). Delayed scaling clamps V's tensor (or head) scale alike: its
// scales are all equal, so U stays within 2^8 * T * 448, but the epilogue's factor (1 / l) /
// s_v must stay a normal float (s_v <= 2^40).
#define ATTN_V_SCALE_MAX_EXP 40
// The exponent bound of an operand's scales (fp8_scale_for_amax_within), block or delayed: V's,
// or the default. The one place that decides it, for the CPU emulation and the GPU layer alike.
static inline int attn_scale_max_exp(AttnCast which) {
    return which == CAST_V ? ATTN_V_SCALE_MAX_EXP : FP8_SCALE_MAX_EXP;
}

// Counters a call adds to (callers zero them). FP8 casts only (BF16 roundings are not counted).
// Q, K, V casts are counted by the forward (the backward re-derives the same values); P by both
// (forward PV, backward dV); dO and dS by the backward.
//
// Row-sum residual. resid_max is spec §4.1's max_i |sum_j dS_ij| / sum_j |dS_ij|, measured on
// the FP32 dS before its cast (sums in FP64). For nearly one-hot rows (sharp attention, early
// rows) dS itself is below FP32 resolution and that ratio is rounding noise, up to 1 even in the
// fp32 mode; resid_cancel_max divides the same sum by the size of the terms that cancel in it,
// sum_j P_ij (|dP_ij| + |D_i|) (sum_j dS_ij = sum_j P dP - D sum_j P), which is what FP32
// rounding bounds: ~1e-7 for fp8_dm and fp32, 1e-3..1 for fp8_naive. Tests assert on it.
typedef struct {
    long long saturated[ATTN_N_CASTS];  // values whose |x*s| exceeded the format's max
    long long casts[ATTN_N_CASTS];      // values cast
    double resid_max;                   // max over rows of |sum_j dS_ij| / sum_j |dS_ij|
    double resid_cancel_max;            // max over rows of |sum_j dS_ij| / sum_j P_ij(|dP_ij|+|D_i|)
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

// The FP8 operand as the kernels see it (which = CAST_Q, CAST_K, CAST_V or CAST_DO; fmt E4M3 for
// Q, K, V, the grad format for dO): xhat = fp8(x*s)/s with s from the 128-token block's amax
// (block scaling) or from the delayed state's history (delayed; that step's amax collected into
// ds->cur_amax when update_amax). x, xhat: (T, d). scales (optional): (ceil(T/128)) the scale of
// each 128-token block. Counts casts and saturations into st (optional).
void attn_quantize_operand(const AttnOptions *opt, AttnDelayedState *ds, AttnCast which,
                           Fp8Format fmt, int T, int d, const float *x, float *xhat,
                           float *scales, AttnStats *st, int update_amax);

// FP64 reference on the unquantized inputs (for tests and attn-check).
void attn_ref_forward_f64(int T, int d, const double *q, const double *k, const double *v,
                          double *o, double *lse);
void attn_ref_backward_f64(int T, int d, const double *q, const double *k, const double *v,
                           const double *dout, double *dq, double *dk, double *dv);

// One precision on one input set, against an FP64 reference computed by the caller on the same
// unquantized inputs (attn_ref_*): forward + backward with a fresh delayed state, then the
// row-sum residual (median and max over rows) and relative L2 errors of O, dQ, dK, dV.
typedef struct {
    double resid_median, resid_max;
    double err_o, err_dq, err_dk, err_dv;
    AttnStats stats;
} AttnEval;
void attn_eval_mode(const AttnOptions *opt, int T, int d, const float *q, const float *k,
                    const float *v, const float *dout, const double *ref_o, const double *ref_dq,
                    const double *ref_dk, const double *ref_dv, AttnEval *out);

// n draws of N(0,1) from a seeded generator (splitmix64 + Box-Muller): the inputs of attn-check.
void attn_fill_normal(float *x, size_t n, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif  // ATTENTION_CPU_H
