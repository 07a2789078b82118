// attn_bench_shim_delta.cu: launches fp8_dm's delta pass (attention/delta_fp8.cu) on its own,
// so the benchmark can time it apart from the main backward: shim_delta_launch fills the
// AttnFp8BwdArgs fields the pass reads and calls its launcher, attn_fp8_delta_pass, with a scratch
// FP32 dQ accumulator of this shim (the pass zeroes its rows, as in the backward). The
// benchmark checks that D equals the backward's delta_out.
#include <cuda_runtime.h>  // cudaMalloc, cudaGetLastError
#include <stdint.h>        // uint8_t
#include <string.h>        // memset

#include "attention/kernels_fp8.h"  // AttnFp8BwdArgs, attn_fp8_delta_pass

extern "C" int shim_delta_launch(const uint8_t *qc, const uint8_t *kc, const uint8_t *vc, const uint8_t *doc,
                                 const float *qs, const float *ks, const float *vs, const float *dos,
                                 const float *lse, float *delta, int B, int H, int T, int d, int e5,
                                 cudaStream_t stream) {
    static float *dq_acc = NULL;  // grown when a call needs more
    static size_t dq_bytes = 0;
    const size_t need = (size_t)B * H * T * d * sizeof(float);
    if (need > dq_bytes) {
        if (dq_acc) cudaFree(dq_acc);
        dq_acc = NULL;
        dq_bytes = 0;
        if (cudaMalloc(&dq_acc, need) != cudaSuccess) return -1;
        dq_bytes = need;
    }
    AttnFp8BwdArgs a;
    memset(&a, 0, sizeof a);
    a.precision = ATTN_FP8_DM;
    a.grad_format = e5 ? FP8_E5M2 : FP8_E4M3;
    a.q_codes = qc;
    a.k_codes = kc;
    a.v_codes = vc;
    a.do_codes = doc;
    a.q_scales = qs;
    a.k_scales = ks;
    a.v_scales = vs;
    a.do_scales = dos;
    a.lse = lse;
    attn_fp8_delta_pass(&a, delta, dq_acc, B, H, T, d, stream);
    return cudaGetLastError() == cudaSuccess ? 0 : -1;
}
