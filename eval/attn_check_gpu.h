// attn_check_gpu.h: the GPU half of `train_gpt attn-check --device gpu`: one causal head through
// one attention mode on the GPU (attention_fp8.h's attn_forward / attn_backward),
// measured against the FP64 reference. attn_check.c draws the inputs, runs the CPU emulation of
// the same mode next to it and prints the table (spec §4, docs/fp8-attention.md).
#ifndef ATTN_CHECK_GPU_H
#define ATTN_CHECK_GPU_H

#include "core/precision.h"  // AttnOptions, AttnPrecision

#ifdef __cplusplus
extern "C" {
#endif

// One mode on the GPU. The cancellation-scaled row-sum residual of spec §4.1,
// |sum_j dS_ij| / sum_j P_ij (|dP_ij| + |D_i|), comes from the backward's own FP32 row sums; only
// the FP8 backward reports them (fp8_naive, fp8_dm, fp8_dm_approx). bf16 and fp8_hybrid run the
// BF16 flash backward, which does not expose them: cancel_* are NaN there.
typedef struct {
    double err_o, err_dq, err_dk, err_dv;  // relative L2 error against the FP64 reference
    double cancel_median, cancel_max;      // over rows; a NaN row counts as +inf; NaN if not reported
} AttnGpuEval;

// Runs opt's mode for B = H = 1 on device 0 (opt->block_q / block_k are ignored: the kernels use
// their own tiles, attn_mode_block_sizes). q, k, v, dout: (T, d) floats, rounded to BF16 on the
// host (RNE) as the kernels' inputs; ref_*: (T, d) FP64 reference outputs. o, dq, dk, dv
// (optional, (T, d)): the GPU's BF16 outputs as floats, for comparing with the CPU emulation.
// The caller has checked attn_mode_supported; CUDA failures are FATAL (cuda_check.h).
void attn_eval_mode_gpu(const AttnOptions *opt, int T, int d, const float *q, const float *k,
                        const float *v, const float *dout, const double *ref_o, const double *ref_dq,
                        const double *ref_dk, const double *ref_dv, float *o, float *dq, float *dk,
                        float *dv, AttnGpuEval *out);

#ifdef __cplusplus
}
#endif
#endif  // ATTN_CHECK_GPU_H
