// adamw_gpu.cu: AdamW kernel matching adamw_update_range bit for bit (see adamw_gpu.h).
#include "gpu/adamw_gpu.h"

#include <cuda_bf16.h>     // __float2bfloat16_rn
#include <cuda_runtime.h>  // kernel launch
#include <math.h>          // pow

#include "core/common.h"     // FATAL
#include "gpu/cuda_check.h"  // CUDA_CHECK_LAUNCH

// The float coefficients of one update, computed exactly as optimizer.c computes them.
struct AdamwCoef {
    float clip, b1, one_minus_b1, b2, one_minus_b2, inv_bc1, inv_bc2, lr, eps, keep;
};

// Per element, in optimizer.c's order:
//   gi = g*clip; m = b1*m + (1-b1)*gi; v = b2*v + (1-b2)*(gi*gi);
//   p = p*keep - lr * ((m*inv_bc1) / (sqrt(v*inv_bc2) + eps)).
__global__ void adamw_kernel(float *p, __nv_bfloat16 *p_bf16, const float *g, float *m, float *v, size_t n,
                             AdamwCoef k) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    const float gi = __fmul_rn(g[i], k.clip);
    const float mi = __fadd_rn(__fmul_rn(k.b1, m[i]), __fmul_rn(k.one_minus_b1, gi));
    const float vi = __fadd_rn(__fmul_rn(k.b2, v[i]), __fmul_rn(k.one_minus_b2, __fmul_rn(gi, gi)));
    m[i] = mi;
    v[i] = vi;
    const float m_hat = __fmul_rn(mi, k.inv_bc1);
    const float v_hat = __fmul_rn(vi, k.inv_bc2);
    const float step = __fmul_rn(k.lr, __fdiv_rn(m_hat, __fadd_rn(__fsqrt_rn(v_hat), k.eps)));
    const float pi = __fsub_rn(__fmul_rn(p[i], k.keep), step);
    p[i] = pi;
    if (p_bf16) p_bf16[i] = __float2bfloat16_rn(pi);
}

extern "C" void adamw_update_gpu(float *p, uint16_t *p_bf16, const float *g, float *m, float *v, size_t n,
                                 double lr, double beta1, double beta2, double eps, double wd, double clip,
                                 long long step_1based, cudaStream_t stream) {
    if (n == 0) return;
    if (step_1based < 1) FATAL("AdamW step %lld: the bias correction needs step >= 1", step_1based);
    AdamwCoef k;
    k.clip = (float)clip;
    k.b1 = (float)beta1;
    k.one_minus_b1 = (float)(1.0 - beta1);
    k.b2 = (float)beta2;
    k.one_minus_b2 = (float)(1.0 - beta2);
    k.inv_bc1 = (float)(1.0 / (1.0 - pow(beta1, (double)step_1based)));
    k.inv_bc2 = (float)(1.0 / (1.0 - pow(beta2, (double)step_1based)));
    k.lr = (float)lr;
    k.eps = (float)eps;
    k.keep = (float)(1.0 - lr * wd);
    const int block = 256;
    const size_t blocks = (n + block - 1) / block;
    if (blocks > 0x7fffffffu) FATAL("AdamW over %zu elements: too large for one launch (hint: split it)", n);
    adamw_kernel<<<(unsigned)blocks, block, 0, stream>>>(p, (__nv_bfloat16 *)p_bf16, g, m, v, n, k);
    CUDA_CHECK_LAUNCH();
}
