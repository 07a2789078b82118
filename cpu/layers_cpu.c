// layers_cpu.c: RMSNorm, RoPE, SwiGLU and cross-entropy for the CPU backend (see layers_cpu.h).
#include "cpu/layers_cpu.h"

#include <math.h>    // sqrtf, expf, logf, cos, sin, pow
#include <stdlib.h>  // free
#include <string.h>  // memcpy

#include "core/common.h"  // xcalloc, FATAL

// --- RMSNorm -------------------------------------------------------------------------------------

void rmsnorm_forward(float *y, float *rstd, const float *x, const float *g, int n, int dim, float eps) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float *xi = x + (long)i * dim;
        float *yi = y + (long)i * dim;
        double ss = 0.0;  // sum of squares in double: exact enough for any dim
        for (int j = 0; j < dim; j++) ss += (double)xi[j] * xi[j];
        float r = (float)(1.0 / sqrt(ss / dim + eps));
        rstd[i] = r;
        for (int j = 0; j < dim; j++) yi[j] = xi[j] * r * g[j];
    }
}

// With xhat = x * r and dxhat = dy * g:  dx = r * (dxhat - xhat * mean(dxhat * xhat)),
// dg = sum over rows of dy * xhat.
void rmsnorm_backward(float *dx, float *dg, const float *dy, const float *x, const float *g,
                      const float *rstd, int n, int dim, int accumulate) {
    // Gain gradient first (dx may alias dy): one sequential pass over the rows in a fixed
    // order, double accumulators.
    double *acc = xcalloc((size_t)dim, sizeof(double));
    for (int i = 0; i < n; i++) {
        const float *xi = x + (long)i * dim, *dyi = dy + (long)i * dim;
        float r = rstd[i];
        for (int j = 0; j < dim; j++) acc[j] += (double)(dyi[j] * (xi[j] * r));
    }
    for (int j = 0; j < dim; j++) dg[j] += (float)acc[j];
    free(acc);
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float *xi = x + (long)i * dim, *dyi = dy + (long)i * dim;
        float *dxi = dx + (long)i * dim;
        float r = rstd[i];
        double dot = 0.0;  // sum_j dxhat_j * xhat_j
        for (int j = 0; j < dim; j++) dot += (double)(dyi[j] * g[j]) * (xi[j] * r);
        float mean = (float)(dot / dim);
        for (int j = 0; j < dim; j++) {  // element j of dy is read before dx's is written
            float d = r * (dyi[j] * g[j] - xi[j] * r * mean);
            dxi[j] = accumulate ? dxi[j] + d : d;
        }
    }
}

// --- RoPE ----------------------------------------------------------------------------------------

void rope_table(float *cos_sin, int T, int hd, double theta) {
    int half = hd / 2;
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double freq = pow(theta, -2.0 * i / hd);
            double angle = t * freq;
            cos_sin[((long)t * half + i) * 2 + 0] = (float)cos(angle);
            cos_sin[((long)t * half + i) * 2 + 1] = (float)sin(angle);
        }
}

// Rotates each pair by the table's angle times `sign` (+1 forward, -1 backward).
static void rope_apply(float *x, const float *cos_sin, int n, int T, int hd, float sign) {
    int half = hd / 2;
#pragma omp parallel for schedule(static)
    for (int row = 0; row < n; row++) {
        float *xr = x + (long)row * hd;
        const float *cs = cos_sin + (long)(row % T) * half * 2;
        for (int i = 0; i < half; i++) {
            float c = cs[2 * i], s = sign * cs[2 * i + 1];
            float a = xr[i], b = xr[i + half];
            xr[i] = a * c - b * s;
            xr[i + half] = b * c + a * s;
        }
    }
}

void rope_forward(float *x, const float *cos_sin, int n, int T, int hd) { rope_apply(x, cos_sin, n, T, hd, 1.0f); }
void rope_backward(float *dx, const float *cos_sin, int n, int T, int hd) { rope_apply(dx, cos_sin, n, T, hd, -1.0f); }

// --- SwiGLU --------------------------------------------------------------------------------------

static inline float sigmoidf(float x) { return 1.0f / (1.0f + expf(-x)); }

void swiglu_forward(float *out, const float *fc, int n, int F) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float *gate = fc + (long)i * 2 * F, *up = gate + F;
        float *o = out + (long)i * F;
        for (int j = 0; j < F; j++) o[j] = gate[j] * sigmoidf(gate[j]) * up[j];
    }
}

// out = silu(g) * u:  du = dout * silu(g),  dg = dout * u * s * (1 + g * (1 - s)), s = sigmoid(g).
void swiglu_backward(float *dfc, const float *dout, const float *fc, int n, int F) {
#pragma omp parallel for schedule(static)
    for (int i = 0; i < n; i++) {
        const float *gate = fc + (long)i * 2 * F, *up = gate + F;
        const float *d = dout + (long)i * F;
        float *dgate = dfc + (long)i * 2 * F, *dup = dgate + F;
        for (int j = 0; j < F; j++) {
            float s = sigmoidf(gate[j]);
            dup[j] = d[j] * gate[j] * s;
            dgate[j] = d[j] * up[j] * s * (1.0f + gate[j] * (1.0f - s));
        }
    }
}

// --- cross-entropy -------------------------------------------------------------------------------

static inline float bits_to_float(unsigned u) {
    union { unsigned u; float f; } v = {u};
    return v.f;
}

// exp(x) for -4e6 < x <= 0: 2^k * exp(r), k = round(x / ln 2), r = x - k ln 2 in [-ln2/2, ln2/2]; exp(r) by its
// Taylor polynomial to degree 7 (error < 2e-8 on that interval). Plain float arithmetic, no
// libm, no FMA: the same bits on every machine and vectorisable in a loop.
static inline float exp_nonpos_inline(float x) {
    const float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
    float t = x * 1.44269504088896341f + round_magic;
    float k = t - round_magic;
    float r = (x - k * 0.693145751953125f) - k * 1.42860682030941723e-6f;  // ln 2 split hi + lo
    float p = 1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 + r * (1.0f / 24 + r * (1.0f / 120 +
                  r * (1.0f / 720 + r * (1.0f / 5040)))))));
    // The exponent is clamped as an integer (a float compare would stop the vectoriser):
    // below 2^-126 the result is a tiny normal number instead of 0, which no sum of softmax
    // terms can notice.
    int ki = (int)k;
    ki = ki < -126 ? -126 : ki;
    return p * bits_to_float((unsigned)(ki + 127) << 23);
}

float exp_nonpos(float x) { return exp_nonpos_inline(x); }

void cross_entropy_rows(float *logits, float *loss, const int32_t *targets, int n, int V, int Vp,
                        float grad_scale) {
#pragma omp parallel for schedule(dynamic, 4)
    for (int i = 0; i < n; i++) {
        float *row = logits + (long)i * Vp;
        int tgt = targets[i];
        if (tgt < 0) {
            loss[i] = 0.0f;
            if (grad_scale != 0.0f) memset(row, 0, sizeof(float) * (size_t)Vp);
            continue;
        }
        float mx = row[0];
#pragma omp simd reduction(max : mx)
        for (int j = 1; j < V; j++) mx = row[j] > mx ? row[j] : mx;
        float target_logit = row[tgt];
        float sum = 0.0f;
        if (grad_scale != 0.0f) {  // keep exp(l - max) in the row for the gradient
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < V; j++) {
                float e = exp_nonpos_inline(row[j] - mx);
                row[j] = e;
                sum += e;
            }
        } else {
#pragma omp simd reduction(+ : sum)
            for (int j = 0; j < V; j++) sum += exp_nonpos_inline(row[j] - mx);
        }
        loss[i] = logf(sum) + mx - target_logit;
        if (grad_scale != 0.0f) {
            float scale = grad_scale / sum;
#pragma omp simd
            for (int j = 0; j < V; j++) row[j] *= scale;
            row[tgt] -= grad_scale;
            for (int j = V; j < Vp; j++) row[j] = 0.0f;
        }
    }
}
