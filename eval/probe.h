// probe.h: what one diagnostics probe measures (diagnostics.h): a forward + backward of one
// micro-batch in a chosen attention precision, run by cpu_model_probe (model_cpu.h) or
// gpu_model_probe (model_gpu.h) without touching the training state.
#ifndef PROBE_H
#define PROBE_H

#include <stddef.h>  // size_t
#include <stdlib.h>  // free
#include <string.h>  // memset

#include "core/precision.h"  // AttnStats
#include "core/config.h"     // AttnPrecision

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    int n_layer;
    size_t n_rows;           // B*H*T: rows of one layer's attention
    size_t n_attn;           // B*H*T*hd: elements of one layer's dq (and dk, dv)
    AttnStats *layer_stats;  // (n_layer) that layer's forward + backward counters, all heads
    float *row_resid;        // (n_layer, B, H, T) per row: |sum_j dS_ij| / sum_j |dS_ij| (CPU), or
    int resid_cancel_rows;   // (1) the cancellation-scaled |sum_j dS_ij| / sum_j P(|dP|+|D|) (GPU)
    float *row_post_resid;   // CPU: (n_layer, B, H, T) per row |sum_j cast(dS)_ij| / sum_j |dS_ij|, the
                             // residual of the dS the dQ and dK matmuls use; GPU: NULL (not measured)
    float *dq, *dk, *dv;     // CPU: (n_layer, B, H, T, hd) gradients of the attention inputs q, k, v
                             // (after QK-norm and RoPE: what attention itself receives); GPU: NULL,
    double *cmp_sq;          // the GPU compares on the device instead: (n_layer, 6) sum (x - x_other)^2,
                             // sum x_other^2 for x = dq, dk, dv against another probe's kept gradients
    void *dev;               // GPU: the probe's device buffers (model_gpu_probe.c)
    float *grads;            // (table.total) d(mean loss)/d(params) of the probe's batch alone
    float loss;              // the batch's mean loss
    AttnPrecision local_ref; // the local reference of the last probe (ATTN_N_PRECISIONS: none)
    double *local_sq;        // (n_layer, 6) with a local reference: sum (x - x_ref)^2, sum x_ref^2
                             // for x = dq, dk, dv of each layer's attention alone
} ModelProbe;

// Frees the host arrays of either backend's probe (those it never allocated are NULL) and clears
// it; the GPU's device part (dev) is model_gpu_probe.c's to free first.
static inline void probe_free_host(ModelProbe *p) {
    free(p->layer_stats);
    free(p->row_resid);
    free(p->row_post_resid);
    free(p->dq);
    free(p->dk);
    free(p->dv);
    free(p->cmp_sq);
    free(p->grads);
    free(p->local_sq);
    memset(p, 0, sizeof *p);
}

#ifdef __cplusplus
}
#endif
#endif  // PROBE_H
