// attn_check_gpu.cu: one causal head (B = H = 1) through one attention mode on the GPU for
// `train_gpt attn-check --device gpu` (attn_check_gpu.h): BF16 inputs up, attn_forward and
// attn_backward, O, dQ, dK, dV and the backward's dS row sums back, errors against the FP64
// reference. Everything is synchronous on the default stream: this is a check, not a benchmark.
#include "eval/attn_check_gpu.h"

#include <cuda_runtime.h>  // cudaMalloc, cudaMemcpy, cudaMemset, cudaFree
#include <math.h>          // sqrt, fabs, isnan, INFINITY, NAN
#include <stdint.h>        // uint16_t (BF16 bits)
#include <algorithm>       // std::sort (median)
#include <vector>          // host buffers

#include "attention_fp8.h"   // attn_forward, attn_backward, attn_mode_workspace_bytes, AttnModeDiag
#include "gpu/cuda_check.h"  // CUDA_CHECK
#include "core/fp8.h"        // bf16_from_f32, bf16_to_f32

// Relative L2 error of x against ref (absolute when ref is all zero); NaN if x has a NaN.
static double rel_l2(const std::vector<float> &x, const double *ref) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < x.size(); i++) {
        double e = (double)x[i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

// --- device buffers of one run ----------------------------------------------------------------
// BF16 tensors are (T, d) = (B, T, H, d) with B = H = 1, row stride d.
struct Bufs {
    uint16_t *q, *k, *v, *dout, *o, *dq, *dk, *dv;  // (T, d) BF16
    float *lse;                                     // (T)
    float *ds_sum, *cancel;                         // (T) dS row sums (FP8 backward modes only)
    void *ws;                                       // attn_mode_workspace_bytes
    AttnSavedCodes codes;                           // the forward's Q, K, V kept, as the trainer does
};

static uint16_t *upload_bf16(const float *x, size_t n) {
    std::vector<uint16_t> h(n);
    for (size_t i = 0; i < n; i++) h[i] = bf16_from_f32(x[i]);  // RNE, as __float2bfloat16_rn
    uint16_t *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, n * sizeof *p));
    CUDA_CHECK(cudaMemcpy(p, h.data(), n * sizeof *p, cudaMemcpyHostToDevice));
    return p;
}

// Outputs are poisoned with 0xFF (NaN in BF16 and FP32), so one a kernel forgot to write shows
// up as a NaN error instead of a plausible number left over from another mode.
template <class T> static T *alloc_poisoned(size_t n) {
    T *p = NULL;
    CUDA_CHECK(cudaMalloc(&p, (n ? n : 1) * sizeof *p));
    CUDA_CHECK(cudaMemset(p, 0xFF, (n ? n : 1) * sizeof *p));
    return p;
}

static std::vector<float> download_bf16(const uint16_t *p, size_t n) {
    std::vector<uint16_t> h(n);
    CUDA_CHECK(cudaMemcpy(h.data(), p, n * sizeof *p, cudaMemcpyDeviceToHost));
    std::vector<float> x(n);
    for (size_t i = 0; i < n; i++) x[i] = bf16_to_f32(h[i]);
    return x;
}

// --- the residual --------------------------------------------------------------------------------
// Per row |sum_j dS_ij| / sum_j P_ij(|dP_ij| + |D_i|); a row whose cancelling terms are all zero
// has a zero sum too (0, as the CPU emulation says), unless the kernel is wrong (+inf). NaN rows
// count as +inf so that max and median cannot hide them.
static void cancel_stats(const std::vector<float> &sum, const std::vector<float> &cancel, AttnGpuEval *out) {
    std::vector<double> r(sum.size());
    for (size_t i = 0; i < r.size(); i++) {
        double s = fabs((double)sum[i]), c = cancel[i];
        double x = c > 0.0 ? s / c : s == 0.0 ? 0.0 : INFINITY;
        r[i] = isnan(x) ? INFINITY : x;
    }
    std::sort(r.begin(), r.end());
    size_t n = r.size();
    out->cancel_max = n ? r[n - 1] : 0.0;
    out->cancel_median = n == 0 ? 0.0 : n % 2 ? r[n / 2] : 0.5 * (r[n / 2 - 1] + r[n / 2]);
}

static void copy_out(const std::vector<float> &x, float *dst) {
    if (dst) std::copy(x.begin(), x.end(), dst);
}

extern "C" void attn_eval_mode_gpu(const AttnOptions *opt, int T, int d, const float *q, const float *k,
                                   const float *v, const float *dout, const double *ref_o, const double *ref_dq,
                                   const double *ref_dk, const double *ref_dv, float *o, float *dq, float *dk,
                                   float *dv, AttnGpuEval *out) {
    const size_t n = (size_t)T * d;
    const int rows = attn_precision_fp8_backward(opt->precision);
    Bufs b;
    b.q = upload_bf16(q, n);
    b.k = upload_bf16(k, n);
    b.v = upload_bf16(v, n);
    b.dout = upload_bf16(dout, n);
    b.o = alloc_poisoned<uint16_t>(n);
    b.dq = alloc_poisoned<uint16_t>(n);
    b.dk = alloc_poisoned<uint16_t>(n);
    b.dv = alloc_poisoned<uint16_t>(n);
    b.lse = alloc_poisoned<float>((size_t)T);
    b.ds_sum = rows ? alloc_poisoned<float>((size_t)T) : NULL;
    b.cancel = rows ? alloc_poisoned<float>((size_t)T) : NULL;
    b.ws = NULL;
    size_t ws_bytes = attn_mode_workspace_bytes(opt, 1, 1, T, d);
    CUDA_CHECK(cudaMalloc(&b.ws, ws_bytes ? ws_bytes : 256));  // cudaMalloc: 256-byte aligned
    // precision.attention_keep_codes' default path (the results are the same bit for bit without)
    b.codes = AttnSavedCodes{};
    b.codes.bytes = attn_saved_codes_bytes(opt, 1, 1, T, d);
    CUDA_CHECK(cudaMalloc(&b.codes.buf, b.codes.bytes ? b.codes.bytes : 256));

    AttnModeDiag diag = {};  // row sums only; saturation is not part of the table
    diag.row_ds_sum = b.ds_sum;
    diag.row_cancel = b.cancel;
    // delayed scaling: a fresh layer, as attn_check.c's CPU rows (each head's scale from its own amax)
    const AttnDelayedGpu fresh = {1, NULL, NULL};
    const AttnDelayedGpu *dl = opt->scaling == SCALING_DELAYED ? &fresh : NULL;
    AttnCall c = {};  // one head: (1, T, 1, d), every row stride d
    c.opt = opt;
    c.B = 1, c.H = 1, c.T = T, c.d = d;
    c.q = b.q, c.k = b.k, c.v = b.v, c.qkv_stride = d;
    c.o = b.o, c.dout = b.dout, c.o_stride = d, c.lse = b.lse;
    c.dq = b.dq, c.dk = b.dk, c.dv = b.dv, c.dqkv_stride = d;
    c.saved = &b.codes;
    c.delayed = dl;
    c.workspace = b.ws;
    attn_forward(&c);
    c.diag = rows ? &diag : NULL;
    attn_backward(&c);
    CUDA_CHECK_LAUNCH();
    CUDA_CHECK(cudaDeviceSynchronize());  // faults inside the kernels surface here

    std::vector<float> ho = download_bf16(b.o, n), hdq = download_bf16(b.dq, n);
    std::vector<float> hdk = download_bf16(b.dk, n), hdv = download_bf16(b.dv, n);
    out->err_o = rel_l2(ho, ref_o);
    out->err_dq = rel_l2(hdq, ref_dq);
    out->err_dk = rel_l2(hdk, ref_dk);
    out->err_dv = rel_l2(hdv, ref_dv);
    copy_out(ho, o); copy_out(hdq, dq); copy_out(hdk, dk); copy_out(hdv, dv);
    out->cancel_median = out->cancel_max = NAN;
    if (rows) {
        std::vector<float> sum((size_t)T), cancel((size_t)T);
        CUDA_CHECK(cudaMemcpy(sum.data(), b.ds_sum, (size_t)T * sizeof(float), cudaMemcpyDeviceToHost));
        CUDA_CHECK(cudaMemcpy(cancel.data(), b.cancel, (size_t)T * sizeof(float), cudaMemcpyDeviceToHost));
        cancel_stats(sum, cancel, out);
    }

    uint16_t *bf[8] = {b.q, b.k, b.v, b.dout, b.o, b.dq, b.dk, b.dv};
    for (int i = 0; i < 8; i++) CUDA_CHECK(cudaFree(bf[i]));
    CUDA_CHECK(cudaFree(b.lse));
    if (rows) { CUDA_CHECK(cudaFree(b.ds_sum)); CUDA_CHECK(cudaFree(b.cancel)); }
    CUDA_CHECK(cudaFree(b.ws));
    CUDA_CHECK(cudaFree(b.codes.buf));
}
