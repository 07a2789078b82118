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
