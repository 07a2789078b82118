// model_gpu_probe.c: diagnostics probes on the GPU backend (model_gpu.h's gpu_model_probe): one
// forward + backward of a probe batch in a chosen attention precision, through the model's own
// code path, with attention_fp8.h's diagnostics outputs switched on for every layer. The
// measurements stay on the device until the end (row sums, saturation counters, the squared
// differences of dq, dk, dv), so a probe costs one training step plus a few small copies, not
// host copies of every layer's gradients.
#include "gpu/model_gpu.h"

#include <cuda_runtime_api.h>  // cudaMalloc, cudaMemcpy, cudaMemset
#include <math.h>              // fabs, NAN
#include <string.h>            // memset

#include "attention_fp8.h"   // AttnModeDiag, attn_options_from_config
#include "core/common.h"     // FATAL, xcalloc, xmalloc
#include "gpu/cuda_check.h"  // CUDA_CHECK

// Device buffers of one probe, one allocation carved per layer.
typedef struct {
    int L;
    size_t rows, bt3c;          // B*H*T rows; B*T*3C elements of one layer's dq | dk | dv
    char *base;                 // the allocation
    float *row_sum, *row_cancel;          // (L, rows) each
    unsigned long long *saturated;        // (L, ATTN_N_CASTS)
    double *sq;                           // (L, 12): cmp_sq (6) then local_sq (6)
    uint16_t *keep;                       // (L, bt3c) or NULL
    uint16_t *ref_o, *ref_dqkv;           // local reference scratch: (BT, C), (BT, 3C)
    float *ref_lse;                       // (rows)
    AttnModeDiag *diag;                   // (L) host array handed to the model
    float *host_sum, *host_cancel;        // (rows) host staging of one layer's row sums
} ProbeDev;

// The next `bytes` of the allocation at base (256-byte aligned); base NULL only counts (sizing).
static void *take_dev(char *base, size_t *off, size_t bytes) {
    void *p = base ? base + *off : NULL;
    *off += (bytes + 255) / 256 * 256;
    return p;
}

// Carves the probe's device buffers from base in one fixed order and returns the bytes used, so
// the same function sizes the allocation (base NULL) and fills the pointers.
static size_t carve_probe(ProbeDev *d, char *base, int keep, size_t bt, size_t C) {
    size_t off = 0, L = (size_t)d->L;
    d->row_sum = (float *)take_dev(base, &off, L * d->rows * sizeof(float));
    d->row_cancel = (float *)take_dev(base, &off, L * d->rows * sizeof(float));
    d->saturated = (unsigned long long *)take_dev(base, &off, L * ATTN_N_CASTS * sizeof(unsigned long long));
    d->sq = (double *)take_dev(base, &off, L * 12 * sizeof(double));
    d->keep = keep ? (uint16_t *)take_dev(base, &off, L * d->bt3c * 2) : NULL;
    d->ref_o = (uint16_t *)take_dev(base, &off, bt * C * 2);
    d->ref_dqkv = (uint16_t *)take_dev(base, &off, d->bt3c * 2);
    d->ref_lse = (float *)take_dev(base, &off, d->rows * sizeof(float));
    return off;
}

void gpu_probe_alloc(ModelProbe *p, GpuModel *m, int keep) {
    const ModelConfig *mc = &m->cfg.model;
    memset(p, 0, sizeof *p);
    int L = mc->n_layer;
    size_t rows = (size_t)m->B * mc->n_head * m->T, bt = (size_t)m->B * m->T, C = mc->d_model;
    p->n_layer = L;
    p->n_rows = rows;
    p->n_attn = rows * mc->head_dim;
    p->resid_cancel_rows = 1;
    p->layer_stats = xcalloc((size_t)(L ? L : 1), sizeof(AttnStats));
    p->row_resid = xcalloc((size_t)L * rows + 1, sizeof(float));
    p->cmp_sq = xcalloc((size_t)L * 6 + 1, sizeof(double));
    p->local_sq = xcalloc((size_t)L * 6 + 1, sizeof(double));
    p->grads = xcalloc(m->table.total, sizeof(float));
    p->local_ref = ATTN_N_PRECISIONS;

    ProbeDev *d = xcalloc(1, sizeof *d);
    d->L = L;
    d->rows = rows;
    d->bt3c = bt * 3 * C;
    CUDA_CHECK(cudaMalloc((void **)&d->base, carve_probe(d, NULL, keep, bt, C)));
    carve_probe(d, d->base, keep, bt, C);
    d->diag = xcalloc((size_t)(L ? L : 1), sizeof(AttnModeDiag));
    d->host_sum = xmalloc((rows ? rows : 1) * sizeof(float));
    d->host_cancel = xmalloc((rows ? rows : 1) * sizeof(float));
    p->dev = d;
}

void gpu_probe_free(ModelProbe *p) {
    ProbeDev *d = (ProbeDev *)p->dev;
    if (d) {
        CUDA_CHECK(cudaFree(d->base));
        free(d->diag);
        free(d->host_sum);
        free(d->host_cancel);
        free(d);
    }
    probe_free_host(p);
}

void gpu_model_probe(GpuModel *m, AttnPrecision precision, AttnPrecision local_ref, const int32_t *tokens,
                     const int32_t *targets, const ModelProbe *compare_with, ModelProbe *out) {
    ProbeDev *d = (ProbeDev *)out->dev;
    int L = m->cfg.model.n_layer;
    if (!d || d->L != L || d->rows != (size_t)m->B * m->cfg.model.n_head * m->T)
        FATAL("gpu_model_probe: the probe was allocated for another model (gpu_probe_alloc)");
    const ProbeDev *cw = compare_with ? (const ProbeDev *)compare_with->dev : NULL;
    if (compare_with && (!cw || !cw->keep || cw->bt3c != d->bt3c))
        FATAL("gpu_model_probe: compare_with must be a probe of this model allocated with keep = 1");

    // set aside: the accumulated gradients, the attention precision, the loss scale
    float *grads_saved = xmalloc(sizeof(float) * m->table.total);
    gpu_model_get_grads(m, grads_saved);
    AttnPrecision prec_saved = gpu_model_attention(m);
    float scale_saved = m->loss_scale;
    if (gpu_model_set_attention(m, precision))
        FATAL("gpu_model_probe: attention %s cannot run on this GPU model (hint: diagnostics.reference must be "
              "\"bf16\" on the GPU, and a model for diagnostics needs a config with diagnostics.interval > 0, "
              "which keeps the BF16 q, k, v and o its backward reads)", attn_precision_name(precision));

    AttnOptions ref_opt;
    attn_options_from_config(&ref_opt, &m->cfg.precision);
    ref_opt.precision = local_ref;
    CUDA_CHECK(cudaMemset(d->row_sum, 0, (size_t)L * d->rows * sizeof(float)));
    CUDA_CHECK(cudaMemset(d->row_cancel, 0, (size_t)L * d->rows * sizeof(float)));
    CUDA_CHECK(cudaMemset(d->saturated, 0, (size_t)L * ATTN_N_CASTS * sizeof(unsigned long long)));
    CUDA_CHECK(cudaMemset(d->sq, 0, (size_t)L * 12 * sizeof(double)));
    int fp8_bwd = attn_precision_fp8_backward(precision);
    for (int l = 0; l < L; l++) {
        AttnModeDiag *g = &d->diag[l];
        memset(g, 0, sizeof *g);
        g->saturated = d->saturated + (size_t)l * ATTN_N_CASTS;
        if (fp8_bwd) {
            g->row_ds_sum = d->row_sum + (size_t)l * d->rows;
            g->row_cancel = d->row_cancel + (size_t)l * d->rows;
        }
        if (d->keep) g->dqkv_keep = d->keep + (size_t)l * d->bt3c;
        if (cw) {
            g->dqkv_cmp = cw->keep + (size_t)l * d->bt3c;
            g->cmp_sq = d->sq + 12 * (size_t)l;
        }
        if (local_ref != ATTN_N_PRECISIONS) {
            g->local_ref = &ref_opt;
            g->ref_o = d->ref_o;
            g->ref_dqkv = d->ref_dqkv;
            g->ref_lse = d->ref_lse;
            g->local_sq = d->sq + 12 * (size_t)l + 6;
        }
    }
    gpu_model_zero_grad(m);
    gpu_model_set_loss_scale(m, 1.0f);
    gpu_model_set_attn_diag(m, d->diag);
    // attention delayed scaling: the probe's step commits its amaxes; the training's history
    // comes back afterwards (as cpu_model_probe does)
    int n_delayed = 0;
    AttnDelayedState *delayed = gpu_model_delayed_state(m, &n_delayed);
    AttnDelayedState *delayed_saved = attn_delayed_save(delayed, n_delayed);
    out->loss = gpu_model_forward(m, tokens, targets);
    gpu_model_backward(m, 1.0f);
    attn_delayed_restore(delayed, delayed_saved, n_delayed);
    gpu_model_set_attn_diag(m, NULL);
    gpu_model_get_grads(m, out->grads);
    out->local_ref = local_ref;

    // bring the measurements home
    unsigned long long *sat = xmalloc((size_t)(L ? L : 1) * ATTN_N_CASTS * sizeof *sat);
    double *sq = xmalloc((size_t)(L ? L : 1) * 12 * sizeof *sq);
    CUDA_CHECK(cudaMemcpy(sat, d->saturated, (size_t)L * ATTN_N_CASTS * sizeof *sat, cudaMemcpyDeviceToHost));
    CUDA_CHECK(cudaMemcpy(sq, d->sq, (size_t)L * 12 * sizeof *sq, cudaMemcpyDeviceToHost));
    for (int l = 0; l < L; l++) {
        AttnStats *st = &out->layer_stats[l];
        memset(st, 0, sizeof *st);
        for (int c = 0; c < ATTN_N_CASTS; c++) st->saturated[c] = (long long)sat[(size_t)l * ATTN_N_CASTS + c];
        if (attn_precision_is_fp8(precision)) {  // P and dS casts are not counted on the GPU
            st->casts[CAST_Q] = st->casts[CAST_K] = st->casts[CAST_V] = (long long)out->n_attn;
            if (fp8_bwd) st->casts[CAST_DO] = (long long)out->n_attn;
        }
        st->resid_max = NAN;  // |sum dS| / sum |dS| needs sum |dS|, which the kernels do not reduce
        float *rr = out->row_resid + (size_t)l * d->rows;
        double worst = fp8_bwd ? 0.0 : NAN;
        if (fp8_bwd) {
            CUDA_CHECK(cudaMemcpy(d->host_sum, d->row_sum + (size_t)l * d->rows, d->rows * sizeof(float),
                                  cudaMemcpyDeviceToHost));
            CUDA_CHECK(cudaMemcpy(d->host_cancel, d->row_cancel + (size_t)l * d->rows, d->rows * sizeof(float),
                                  cudaMemcpyDeviceToHost));
            for (size_t i = 0; i < d->rows; i++) {
                double c = d->host_cancel[i];
                double r = c > 0 ? fabs((double)d->host_sum[i]) / c : 0.0;  // an all-zero row cancels nothing
                rr[i] = (float)r;
                if (r > worst) worst = r;
            }
        } else {
            for (size_t i = 0; i < d->rows; i++) rr[i] = NAN;
        }
        st->resid_cancel_max = worst;
        for (int k = 0; k < 6; k++) {
            out->cmp_sq[6 * (size_t)l + k] = cw ? sq[12 * (size_t)l + k] : NAN;
            out->local_sq[6 * (size_t)l + k] = sq[12 * (size_t)l + 6 + k];
        }
    }
    free(sat);
    free(sq);

    // put back what training had
    gpu_model_set_grads(m, grads_saved);
    free(grads_saved);
    if (gpu_model_set_attention(m, prec_saved)) FATAL("gpu_model_probe: cannot restore attention %s",
                                                      attn_precision_name(prec_saved));
    gpu_model_set_loss_scale(m, scale_saved);
}
