// attention_ref.c: the FP64 reference of causal attention for one head (no tiling, no casts),
// the yardstick of spec §4 (docs/fp8-attention.md). Plain textbook formulas:
//   S = tau Q K^T (j <= i), P = softmax_row(S), O = P V, LSE_i = log sum_j exp(S_ij)
//   D_i = dO_i · O_i, dS = P ∘ (dP − D), dP = dO V^T,
//   dQ = tau dS K, dK = tau dS^T Q, dV = P^T dO
#include "cpu/attention_cpu.h"

#include <math.h>    // exp, log, sqrt
#include <string.h>  // memset

#include "core/common.h"  // xmalloc

// Row i of P (keys 0..i) into p; returns the row's log-sum-exp.
static double ref_softmax_row(int i, int d, double tau, const double *q, const double *k, double *p) {
    double m = -INFINITY;
    for (int j = 0; j <= i; j++) {
        double s = 0.0;
        for (int c = 0; c < d; c++) s += q[(size_t)i * d + c] * k[(size_t)j * d + c];
        p[j] = tau * s;
        if (p[j] > m) m = p[j];
    }
    double l = 0.0;
    for (int j = 0; j <= i; j++) { p[j] = exp(p[j] - m); l += p[j]; }
    for (int j = 0; j <= i; j++) p[j] /= l;
    return m + log(l);
}

void attn_ref_forward_f64(int T, int d, const double *q, const double *k, const double *v,
                          double *o, double *lse) {
    const double tau = 1.0 / sqrt((double)d);
    double *p = xmalloc((size_t)T * sizeof *p);  // (T) one row of P
    for (int i = 0; i < T; i++) {
        double l = ref_softmax_row(i, d, tau, q, k, p);
        if (lse) lse[i] = l;
        double *oi = o + (size_t)i * d;
        memset(oi, 0, (size_t)d * sizeof *oi);
        for (int j = 0; j <= i; j++)
            for (int c = 0; c < d; c++) oi[c] += p[j] * v[(size_t)j * d + c];
    }
    free(p);
}

void attn_ref_backward_f64(int T, int d, const double *q, const double *k, const double *v,
                           const double *dout, double *dq, double *dk, double *dv) {
    const double tau = 1.0 / sqrt((double)d);
    size_t n = (size_t)T * d;
    double *p = xmalloc((size_t)T * sizeof *p);    // (T) row of P
    double *dp = xmalloc((size_t)T * sizeof *dp);  // (T) row of dP, then dS
    double *oi = xmalloc((size_t)d * sizeof *oi);  // (d) row of O
    memset(dq, 0, n * sizeof *dq);
    memset(dk, 0, n * sizeof *dk);
    memset(dv, 0, n * sizeof *dv);
    for (int i = 0; i < T; i++) {
        const double *doi = dout + (size_t)i * d;
        ref_softmax_row(i, d, tau, q, k, p);
        memset(oi, 0, (size_t)d * sizeof *oi);
        for (int j = 0; j <= i; j++)
            for (int c = 0; c < d; c++) oi[c] += p[j] * v[(size_t)j * d + c];
        double Di = 0.0;
        for (int c = 0; c < d; c++) Di += doi[c] * oi[c];
        for (int j = 0; j <= i; j++) {
            double s = 0.0;
            for (int c = 0; c < d; c++) s += doi[c] * v[(size_t)j * d + c];
            dp[j] = p[j] * (s - Di);  // dS_ij
        }
        for (int j = 0; j <= i; j++) {
            double *dqi = dq + (size_t)i * d, *dkj = dk + (size_t)j * d, *dvj = dv + (size_t)j * d;
            const double *kj = k + (size_t)j * d, *qi = q + (size_t)i * d;
            for (int c = 0; c < d; c++) {
                dqi[c] += tau * dp[j] * kj[c];
                dkj[c] += tau * dp[j] * qi[c];
                dvj[c] += p[j] * doi[c];
            }
        }
    }
    free(p); free(dp); free(oi);
}
