// layers_cpu.h: the element-wise and row-wise layers of the CPU backend, forward and backward,
// FP32. Rows are independent and split across OpenMP threads; every reduction over rows (gain
// gradients) runs in a fixed order, so results do not depend on the thread count.
#ifndef LAYERS_CPU_H
#define LAYERS_CPU_H

#include <stdint.h>  // int32_t targets

#ifdef __cplusplus
extern "C" {
#endif

// RMSNorm over rows of length dim: y = x / sqrt(mean(x^2) + eps) * g.
// x, y: (n, dim); g: (dim); rstd: (n) saved 1/sqrt(mean(x^2) + eps).
void rmsnorm_forward(float *y, float *rstd, const float *x, const float *g, int n, int dim, float eps);
// dx (n, dim): overwritten (accumulate == 0) or added to; dg (dim): added to. dx may be dy
// (in place) when accumulate == 0.
void rmsnorm_backward(float *dx, float *dg, const float *dy, const float *x, const float *g,
                      const float *rstd, int n, int dim, int accumulate);

// RoPE, rotate-half convention: in each row of length hd the pairs (i, i + hd/2), i < hd/2,
// are rotated by the angle pos * theta^(-2i/hd), pos = row % T (rows are (..., T, hd)).
// cos_sin: (T, hd/2, 2) table from rope_table. Forward rotates by +angle, backward by -angle
// (the transpose of a rotation is its inverse), both in place.
void rope_table(float *cos_sin, int T, int hd, double theta);
void rope_forward(float *x, const float *cos_sin, int n, int T, int hd);
void rope_backward(float *dx, const float *cos_sin, int n, int T, int hd);

// SwiGLU: fc (n, 2F) = [gate | up] per row; out (n, F) = silu(gate) * up.
void swiglu_forward(float *out, const float *fc, int n, int F);
// dfc (n, 2F) overwritten from dout (n, F).
void swiglu_backward(float *dfc, const float *dout, const float *fc, int n, int F);

// exp(x) for -4e6 < x <= 0 (below -87 it returns ~1e-38 instead of 0), relative error ~2e-7,
// vectorisable and identical on every machine (no libm).
float exp_nonpos(float x);

// Cross-entropy over the first V of Vp columns of logits (n, Vp), in place. For each row with a
// target in [0, V): loss[i] = logsumexp(row[:V]) - row[target]; rows with target < 0 get
// loss[i] = 0. If grad_scale != 0 the row is overwritten with d(loss_i * grad_scale)/d(logits):
// (softmax - onehot) * grad_scale on the real columns, 0 on the padded ones and on ignored rows.
void cross_entropy_rows(float *logits, float *loss, const int32_t *targets, int n, int V, int Vp,
                        float grad_scale);

#ifdef __cplusplus
}
#endif
#endif  // LAYERS_CPU_H
