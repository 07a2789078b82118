// attention_cpu.h: causal attention for one head on the CPU, in every precision of
// docs/fp8-attention.md, emulating the GPU kernels' tiling and FP8 casts bit-exactly,
// plus an FP64 reference. This is the oracle the GPU kernels are tested against.
//
// Layout: one head at a time, row-major (T, d) float arrays. tau = 1/sqrt(d). The kernels walk
// query blocks of opt->block_q rows and, inside each, key blocks of opt->block_k columns in
// increasing order (the online softmax advances its running max one key block at a time), so the
// FP8 values of P depend on block_k exactly as on the GPU.
#ifndef ATTENTION_CPU_H
#define ATTENTION_CPU_H

#include "core/precision.h"  // AttnOptions, AttnDelayedState, AttnStats, AttnCast

#include <stddef.h>  // size_t
#include <stdint.h>  // uint64_t

#ifdef __cplusplus
extern "C" {
#endif

// Forward. q, k, v: (T, d). o: (T, d) output, stored as the GPU stores it (BF16-rounded in every
// mode but fp32). lse: (T) row log-sum-exp of tau*S in FP32 (natural log); with centred keys, of
// the centred scores tau*Q̂(K - c)^T, which the backward recomputes alike.
void attn_cpu_forward(const AttnOptions *opt, AttnDelayedState *ds, int T, int d,
                      const float *q, const float *k, const float *v, float *o, float *lse,
                      AttnStats *st);

// Backward. o and lse are what the forward stored; dout: (T, d). dq, dk, dv: (T, d) outputs
// (overwritten). row_resid (optional, (T)): per row |sum_j dS_ij| / sum_j |dS_ij|.
void attn_cpu_backward(const AttnOptions *opt, AttnDelayedState *ds, int T, int d,
                       const float *q, const float *k, const float *v, const float *o,
                       const float *lse, const float *dout, float *dq, float *dk, float *dv,
                       AttnStats *st, float *row_resid);

// The same with centred keys' c given and the post-cast residual per row. key_center (optional,
// (d)): c under opt->center_keys == CENTER_KEYS_DELAYED (NULL there: the head's own mean, as on
// a first step); ignored otherwise. The forward and its backward must get the same c.
// row_post_resid (optional, (T)): per row |sum_j cast(dS)_ij| / sum_j |dS_ij|, the residual of
// the dS the dQ and dK matmuls use.
void attn_cpu_forward_centered(const AttnOptions *opt, AttnDelayedState *ds, int T, int d,
                               const float *q, const float *k, const float *v, const float *key_center,
                               float *o, float *lse, AttnStats *st);
void attn_cpu_backward_centered(const AttnOptions *opt, AttnDelayedState *ds, int T, int d,
                                const float *q, const float *k, const float *v, const float *key_center,
                                const float *o, const float *lse, const float *dout, float *dq, float *dk,
                                float *dv, AttnStats *st, float *row_resid, float *row_post_resid);

// The mean of a head's keys k: (T, d) into c: (d), summed in FP64 and rounded to BF16: the c of
// CENTER_KEYS_MEAN (and of CENTER_KEYS_DELAYED without an estimate).
void attn_key_mean(int T, int d, const float *k, float *c);

// The FP8 operand as the kernels see it (which = CAST_Q, CAST_K, CAST_V or CAST_DO; fmt E4M3 for
// Q, K, V, the grad format for dO): xhat = fp8(x*s)/s with s from the 128-token block's amax
// (block scaling) or from the delayed state's history (delayed; that step's amax collected into
// ds->cur_amax when update_amax). x, xhat: (T, d). scales (optional): (ceil(T/128)) the scale of
// each 128-token block. Counts casts and saturations into st (optional).
void attn_quantize_operand(const AttnOptions *opt, AttnDelayedState *ds, AttnCast which,
                           Fp8Format fmt, int T, int d, const float *x, float *xhat,
                           float *scales, AttnStats *st, int update_amax);

// Spec §4.1's bound on the row-sum invariant (resid_cancel_max) for rows of up to T keys: the
// worst case of FP32 recursive summation over T terms, T * 2^-24 of their magnitudes, or 1e-5
// where that is larger (T <= 167). FP32 rounding in the sums over a row grows with its length:
// the fp32 mode reaches 4.5e-5 at T = 2048, above a fixed 1e-5.
static inline double attn_invariant_tol(int T) {
    double w = T * 0x1p-24;
    return w > 1e-5 ? w : 1e-5;
}

// FP64 reference on the unquantized inputs (for tests and attn-check).
void attn_ref_forward_f64(int T, int d, const double *q, const double *k, const double *v,
                          double *o, double *lse);
void attn_ref_backward_f64(int T, int d, const double *q, const double *k, const double *v,
                           const double *dout, double *dq, double *dk, double *dv);

// One precision on one input set, against an FP64 reference computed by the caller on the same
// unquantized inputs (attn_ref_*): forward + backward with a fresh delayed state, then the
// row-sum residual (median and max over rows) and relative L2 errors of O, dQ, dK, dV.
// post_*: the same over rows for the cast dS (row_post_resid). key_center as in
// attn_cpu_forward_centered (attn_eval_mode passes NULL).
typedef struct {
    double resid_median, resid_max;
    double post_median, post_max;
    double err_o, err_dq, err_dk, err_dv;
    AttnStats stats;
} AttnEval;
void attn_eval_mode(const AttnOptions *opt, int T, int d, const float *q, const float *k,
                    const float *v, const float *dout, const double *ref_o, const double *ref_dq,
                    const double *ref_dk, const double *ref_dv, AttnEval *out);
void attn_eval_mode_centered(const AttnOptions *opt, const float *key_center, int T, int d, const float *q,
                             const float *k, const float *v, const float *dout, const double *ref_o,
                             const double *ref_dq, const double *ref_dk, const double *ref_dv, AttnEval *out);

// n draws of N(0,1) from a seeded generator (splitmix64 + Box-Muller): the inputs of attn-check.
void attn_fill_normal(float *x, size_t n, uint64_t seed);

#ifdef __cplusplus
}
#endif
#endif  // ATTENTION_CPU_H
