// attention_fp8.cu: one layer's attention in any precision mode (attention_fp8.h): the mode's
// plan (attn_mode_plan) decides which quantize passes run, into which parts of the workspace, and
// which forward and backward kernels consume them. Read attn_forward and attn_backward first; the
// kernels are in attention/ (fwd_bf16.cu, bwd_bf16.cu, quant_fp8.cu, fwd_fp8.cu, bwd_fp8.cu,
// delta_fp8.cu). Its own two small kernels serve delayed scaling and the diagnostics.
#include "attention_fp8.h"

#include <string.h>  // memset

#include "attention/kernels_bf16.h"  // attn_gpu_forward / attn_gpu_backward (BF16)
#include "attention/kernels_fp8.h"   // attn_gpu_quantize, attn_gpu_forward_fp8, attn_gpu_backward_fp8
#include "core/common.h"             // FATAL
#include "gpu/cuda_check.h"          // CUDA_CHECK
#include "core/gpu_sizes.h"          // gpu_attn_mode_workspace_bytes (shared with model.c's memory plan)
#include "gpu/layers.h"              // rope_forward_gpu: the BF16 forward with RoPE first

typedef uint16_t bf16;

extern "C" int attn_mode_supported(const AttnOptions *opt, int d, const char **why) {
    const char *w = NULL;
    if (d != 64 && d != 128) w = "the GPU attention supports head_dim 64 or 128";
    else if (opt->precision == ATTN_FP32) w = "fp32 attention is the CPU backend's reference mode";
    else if (opt->precision != ATTN_BF16 && !attn_precision_is_fp8(opt->precision)) w = "unknown attention precision";
    else if (attn_precision_is_fp8(opt->precision) && opt->scaling != SCALING_BLOCK && opt->scaling != SCALING_DELAYED)
        w = "unknown attention scaling";
    else if (attn_precision_is_fp8(opt->precision) && opt->p_scale != 256.0f)
        w = "the GPU's FP8 attention kernels use the static P scale 256 (precision.attention_p_scale)";
    // What the CPU emulation has and the kernels not yet (docs/fp8-attention.md §6).
    else if (opt->precision == ATTN_FP8_HYBRID_DM)
        w = "fp8_hybrid_dm runs on the CPU backend only (the BF16 backward has no delta pass over its own P and dP)";
    else if (attn_precision_is_fp8(opt->precision) && opt->center_keys != CENTER_KEYS_OFF)
        w = "precision.attention_center_keys runs on the CPU backend only (the quantize pass does not subtract c yet); "
            "use \"off\"";
    else if (attn_precision_is_fp8(opt->precision) && opt->rowsum_correction)
        w = "precision.attention_rowsum_correction runs on the CPU backend only (the FP8 backward does not sum the cast "
            "dS per row yet); use false";
    if (why) *why = w;
    return w ? -1 : 0;
}

extern "C" void attn_mode_block_sizes(const AttnOptions *opt, int d, int *block_q, int *block_k) {
    if (attn_precision_is_fp8(opt->precision)) {
        *block_q = ATTN_FP8_BWD_BLOCK_Q;
        *block_k = ATTN_FP8_BWD_BLOCK_K;
    } else {
        attn_gpu_block_sizes(d, block_q, block_k);
    }
}

extern "C" AttnOptions attn_block_options(AttnPrecision p, Fp8Format grad_format, int d) {
    AttnOptions o;
    memset(&o, 0, sizeof o);
    o.precision = p;
    o.grad_format = grad_format;
    o.scaling = SCALING_BLOCK;
    o.p_scale = 256.0f;
    attn_mode_block_sizes(&o, d, &o.block_q, &o.block_k);
    return o;
}

extern "C" size_t attn_mode_workspace_bytes(const AttnOptions *opt, int B, int H, int T, int d) {
    return gpu_attn_mode_workspace_bytes(opt->precision, (size_t)B, (size_t)H, (size_t)T, (size_t)d);
}

extern "C" size_t attn_saved_codes_bytes(const AttnOptions *opt, int B, int H, int T, int d) {
    return gpu_attn_saved_codes_bytes(opt->precision, (size_t)B, (size_t)H, (size_t)T, (size_t)d);
}

// --- the workspace, carved in gpu_attn_mode_workspace_bytes' order --------------------------------
enum { OP_Q = 0, OP_K, OP_V, OP_DO };
typedef struct {
    uint8_t *codes[4], *codes_t[4];  // (B, H, Tp, d), (B, H, d, Tp) per operand
    float *scales[4];                // (B, H, Tp/128)
    void *bwd;                       // the backward's FP32 scratch (dQ accumulator, D)
    bf16 *deq;                       // fp8_hybrid: (B, T, 3, H, d) dequantized Q̂ K̂ V̂
    float *amax[4];                  // delayed scaling: (B, H, Tp/128) block amaxes per operand
    float *heads[4];                 // delayed scaling, first step: (B, H) per-head scales per operand
} Parts;

static Parts carve_parts(const AttnOptions *opt, void *ws, int B, int H, int T, int d) {
    Parts p;
    memset(&p, 0, sizeof p);
    char *c = (char *)ws;
    if (((uintptr_t)c) % 256) FATAL("attention: workspace %p is not 256-byte aligned", ws);
    const GpuAttnLayout l = gpu_attn_mode_layout(opt->precision, (size_t)B, (size_t)H, (size_t)T, (size_t)d);
    if (l.codes) {
        for (int i = 0; i < 4; i++, c += l.codes) p.codes[i] = (uint8_t *)c;
        for (int i = 0; i < 4; i++, c += l.codes) p.codes_t[i] = (uint8_t *)c;
        for (int i = 0; i < 4; i++, c += l.scales) p.scales[i] = (float *)c;
    }
    p.bwd = c;
    c += l.bwd;
    if (l.deq) p.deq = (bf16 *)c;
    c += l.deq;
    if (l.codes) {
        for (int i = 0; i < 4; i++, c += l.scales) p.amax[i] = (float *)c;
        for (int i = 0; i < 4; i++, c += l.heads) p.heads[i] = (float *)c;
    }
    return p;
}

// The kept Q, K, V (gpu_attn_saved_codes_bytes' order): codes Q K V, transposed codes Q K V,
// scales Q K V; fp8_hybrid keeps its (B, T, 3, H, d) BF16 Q̂ | K̂ | V̂ from the start instead.
// Overrides the workspace's parts of Q, K, V (dO stays in the workspace).
static void carve_saved(Parts *p, AttnPrecision prec, void *buf, int B, int H, int T, int d) {
    char *c = (char *)buf;
    if (!attn_mode_plan(prec).fp8_backward) {  // a hybrid
        p->deq = (bf16 *)c;
        return;
    }
    const GpuAttnLayout l = gpu_attn_mode_layout(prec, (size_t)B, (size_t)H, (size_t)T, (size_t)d);
    for (int i = 0; i < 3; i++, c += l.codes) p->codes[i] = (uint8_t *)c;
    for (int i = 0; i < 3; i++, c += l.codes) p->codes_t[i] = (uint8_t *)c;
    for (int i = 0; i < 3; i++, c += l.scales) p->scales[i] = (float *)c;
}

extern "C" void attn_saved_codes_view(const AttnSavedCodes *s, int i, const uint8_t **codes, const uint8_t **codes_t,
                                      const float **scales, const uint16_t **dequant) {
    if (!s->valid || i < 0 || i > 2) FATAL("attn_saved_codes_view: operand %d of %s codes", i, s->valid ? "kept" : "unfilled");
    Parts p;
    memset(&p, 0, sizeof p);
    carve_saved(&p, s->precision, s->buf, s->B, s->H, s->T, s->d);
    if (codes) *codes = p.codes[i];
    if (codes_t) *codes_t = p.codes_t[i];
    if (scales) *scales = p.scales[i];
    if (dequant) *dequant = p.deq;
}

static void check_mode(const AttnOptions *opt, int d) {
    const char *why;
    if (attn_mode_supported(opt, d, &why)) FATAL("attention %s on the GPU: %s", attn_precision_name(opt->precision), why);
}

// One operand to quantize; outputs left NULL are not written.
static AttnQuantTensor operand(const bf16 *x, int stride, Fp8Format fmt, uint8_t *codes, uint8_t *codes_t,
                               float *scales, const AttnModeDiag *diag, AttnCast which) {
    AttnQuantTensor t;
    memset(&t, 0, sizeof t);
    t.x = x;
    t.stride = stride;
    t.fmt = fmt;
    t.codes = codes;
    t.codes_t = codes_t;
    t.scales = scales;
    t.saturated = diag && diag->saturated ? diag->saturated + which : NULL;
    t.max_scale_exp = attn_scale_max_exp(which);  // V's bound: the FP8 forward's O units need it
    return t;
}

// --- delayed scaling (AttnDelayedGpu) -------------------------------------------------------------

// cur[i] = max(cur[i], max |amax_i[0 .. n)|) for each pair i (grid.x = pairs, block 256).
struct AmaxFold {
    const float *src[4];
    float *dst[4];
    int n;
};
__global__ void amax_fold_kernel(AmaxFold f) {
    __shared__ float red[8];
    const float *src = f.src[blockIdx.x];
    float m = 0.0f;
    for (int i = threadIdx.x; i < f.n; i += blockDim.x) m = fmaxf(m, src[i]);
    for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, o));
    if ((threadIdx.x & 31) == 0) red[threadIdx.x >> 5] = m;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < 8; w++) m = fmaxf(m, red[w]);
        *f.dst[blockIdx.x] = fmaxf(*f.dst[blockIdx.x], m);
    }
}

// Quantizes ts[0..n) (operands ops[i]) as attn_gpu_quantize does, with delayed scales when
// delayed is set: the step's tensor scale, or on the first step each head's own (a first pass
// finds the block amaxes, attn_gpu_amax_reduce the per-head scales); the operands with track[i]
// then fold their block amaxes into delayed->cur_amax (when tracked).
static void quantize_scaled(const AttnOptions *opt, const AttnDelayedGpu *delayed, AttnQuantTensor *ts, const int *ops,
                            const int *track, int n, const Parts &p, int B, int H, int T, int d, cudaStream_t stream) {
    if (opt->scaling != SCALING_DELAYED) {
        attn_gpu_quantize(ts, n, B, H, T, d, stream);
        return;
    }
    if (!delayed) FATAL("attention %s with delayed scaling: no AttnDelayedGpu (hint: the layer's delayed-scaling state)",
                        attn_precision_name(opt->precision));
    if (!delayed->first_step && !delayed->scale) FATAL("attention: delayed scaling past the first step needs scale");
    const int nblk = attn_quant_n_blocks(T);
    if (delayed->first_step) {
        AttnQuantTensor probe[ATTN_QUANT_MAX_TENSORS];
        for (int i = 0; i < n; i++) {
            memset(&probe[i], 0, sizeof probe[i]);
            probe[i].x = ts[i].x;
            probe[i].stride = ts[i].stride;
            probe[i].fmt = ts[i].fmt;
            probe[i].rope = ts[i].rope;  // the amaxes of the rotated values (nothing written back yet)
            probe[i].block_amax = p.amax[ops[i]];  // the only output: block amaxes
        }
        attn_gpu_quantize(probe, n, B, H, T, d, stream);
        for (int i = 0; i < n; i++)
            attn_gpu_amax_reduce(p.amax[ops[i]], B * H, nblk, ts[i].fmt, ts[i].max_scale_exp, NULL, p.heads[ops[i]],
                                 stream);
    }
    AmaxFold fold;
    memset(&fold, 0, sizeof fold);
    int n_fold = 0;
    for (int i = 0; i < n; i++) {
        ts[i].scale_in = delayed->first_step ? p.heads[ops[i]] : delayed->scale + ops[i];
        ts[i].scale_in_per_head = delayed->first_step;
        if (track[i] && delayed->cur_amax) {
            ts[i].block_amax = p.amax[ops[i]];
            fold.src[n_fold] = p.amax[ops[i]];
            fold.dst[n_fold++] = delayed->cur_amax + ops[i];
        }
    }
    attn_gpu_quantize(ts, n, B, H, T, d, stream);
    if (n_fold) {
        fold.n = B * H * nblk;
        amax_fold_kernel<<<n_fold, 256, 0, stream>>>(fold);
        CUDA_CHECK_LAUNCH();
    }
}

// The kept-codes buffer checked for this shape and mode (attn_forward's, and upstream_parts').
static void check_saved_buffer(const AttnOptions *opt, const AttnSavedCodes *s, int B, int H, int T, int d) {
    const size_t need = attn_saved_codes_bytes(opt, B, H, T, d);
    if (!s || !s->buf || s->bytes < need || ((uintptr_t)s->buf) % 256)
        FATAL("attention: kept codes need a 256-byte aligned buffer of %zu bytes (have %zu at %p)", need,
              s ? s->bytes : 0, s ? s->buf : NULL);
}

// The FP8 forward on Q, K, V's codes in p (the kept ones or the workspace's).
static void fp8_forward(const AttnCall *c, const Parts &p) {
    attn_gpu_forward_fp8(p.codes[OP_Q], p.codes[OP_K], p.codes_t[OP_V], p.scales[OP_Q], p.scales[OP_K],
                         p.scales[OP_V], c->opt->p_scale, c->o, c->o_stride, c->lse, c->B, c->H, c->T, c->d,
                         c->stream);
}

static void mark_saved(const AttnCall *c) {
    AttnSavedCodes *s = c->saved;
    s->valid = 1;
    s->precision = c->opt->precision;
    s->B = c->B, s->H = c->H, s->T = c->T, s->d = c->d;
}

static Parts upstream_parts(const char *who, const AttnOptions *opt, const AttnSavedCodes *s, int B, int H, int T,
                            int d);

extern "C" void attn_forward(const AttnCall *c) {
    const AttnOptions *opt = c->opt;
    const int B = c->B, H = c->H, T = c->T, d = c->d;
    check_mode(opt, d);
    const AttnModePlan plan = attn_mode_plan(opt->precision);
    if (c->saved) c->saved->valid = 0;
    if (c->codes_ready) {  // Q, K, V's codes came from the QKV projection's epilogue
        const Parts p = upstream_parts("attn_forward (codes_ready)", opt, c->saved, B, H, T, d);
        mark_saved(c);
        fp8_forward(c, p);
        return;
    }
    // q and k are written only with a RoPE table and rotate_in_place
    bf16 *q = const_cast<bf16 *>(c->q), *k = const_cast<bf16 *>(c->k);
    if (c->rope && (!q || c->qkv_stride != 3 * H * d || k != q + H * d || c->v != q + 2 * H * d))
        FATAL("attn_forward with RoPE: q, k, v must be the packed (B, T, 3, H, d) qkv (row stride 3 H d)");
    if (!plan.fp8_forward) {
        if (c->rope) {
            if (!c->rotate_in_place)
                FATAL("attn_forward: %s rotates q and k in place (rope_forward_gpu); rotate_in_place must be 1",
                      attn_precision_name(opt->precision));
            rope_forward_gpu(q, c->rope, B, T, H, d, c->stream);
        }
        attn_gpu_forward(q, k, c->v, c->qkv_stride, c->o, c->o_stride, c->lse, B, H, T, d, c->stream);
        return;
    }
    Parts p = carve_parts(opt, c->workspace, B, H, T, d);
    if (c->saved) {
        check_saved_buffer(opt, c->saved, B, H, T, d);
        carve_saved(&p, opt->precision, c->saved->buf, B, H, T, d);
    }
    // S = Q̂ K̂^T reduces over d (codes), O = P̂ V̂ over tokens (V's transposed codes). Kept for an
    // FP8 backward: also Q^T, K^T (dK = dŜ^T Q̂, dQ = dŜ K̂ reduce over tokens) and V's codes
    // (dP^T = V̂ dÔ^T reduces over d); for fp8_hybrid's BF16 backward the dequantized Q̂, K̂, V̂.
    const int keep = c->saved != NULL, keep_codes = keep && plan.fp8_backward;
    const int C = H * d, qs = c->qkv_stride;
    const AttnModeDiag *diag = c->diag;
    AttnQuantTensor ts[3] = {
        operand(q, qs, FP8_E4M3, p.codes[OP_Q], keep_codes ? p.codes_t[OP_Q] : NULL, p.scales[OP_Q], diag, CAST_Q),
        operand(k, qs, FP8_E4M3, p.codes[OP_K], keep_codes ? p.codes_t[OP_K] : NULL, p.scales[OP_K], diag, CAST_K),
        operand(c->v, qs, FP8_E4M3, keep_codes ? p.codes[OP_V] : NULL, p.codes_t[OP_V], p.scales[OP_V], diag,
                CAST_V)};
    if (keep && !keep_codes)
        for (int i = 0; i < 3; i++) {
            ts[i].dequant = p.deq + (size_t)i * C;
            ts[i].dequant_stride = 3 * C;
        }
    if (c->rope) {  // the quantize pass is the RoPE pass too (attention/kernels_fp8.h)
        bf16 *qk[2] = {q, k};
        for (int i = 0; i < 2; i++) {
            ts[i].rope = c->rope;
            ts[i].rotated = c->rotate_in_place ? qk[i] : NULL;
            ts[i].rotated_stride = qs;
        }
    }
    const int ops[3] = {OP_Q, OP_K, OP_V}, track[3] = {1, 1, 1};  // the forward counts Q, K, V
    quantize_scaled(opt, c->delayed, ts, ops, track, 3, p, B, H, T, d, c->stream);
    if (c->saved) mark_saved(c);
    fp8_forward(c, p);
}

// --- Q, K, V quantized upstream (the QKV projection's epilogue) ---------------------------------

extern "C" int attn_mode_codes_upstream(const AttnOptions *opt, int d, int T) {
    return attn_mode_plan(opt->precision).fp8_backward && opt->scaling == SCALING_BLOCK && attn_mode_supported(opt, d, NULL) == 0 && T % ATTN_SCALE_BLOCK == 0;
}

// The parts of a kept-codes buffer that a producer upstream fills, checked for this mode and shape.
static Parts upstream_parts(const char *who, const AttnOptions *opt, const AttnSavedCodes *s, int B, int H, int T,
                            int d) {
    if (!attn_mode_codes_upstream(opt, d, T))
        FATAL("%s: attention %s (d %d, T %d) does not take codes quantized upstream (hint: fp8_naive, fp8_dm or "
              "fp8_dm_approx with block scaling and T a multiple of %d)", who, attn_precision_name(opt->precision), d, T,
              ATTN_SCALE_BLOCK);
    check_saved_buffer(opt, s, B, H, T, d);
    Parts p;
    memset(&p, 0, sizeof p);
    carve_saved(&p, opt->precision, s->buf, B, H, T, d);
    return p;
}

extern "C" void attn_saved_codes_parts(const AttnOptions *opt, const AttnSavedCodes *s, int B, int H, int T, int d,
                                       uint8_t *codes[3], uint8_t *codes_t[3], float *scales[3]) {
    const Parts p = upstream_parts("attn_saved_codes_parts", opt, s, B, H, T, d);
    for (int i = 0; i < 3; i++) {
        codes[i] = p.codes[i];
        codes_t[i] = p.codes_t[i];
        scales[i] = p.scales[i];
    }
}

// sq[2i] += sum (x_i - r_i)^2, sq[2i+1] += sum r_i^2 over (rows, C) for i = dq, dk, dv: x_i is
// the i-th of the strided views xs[i] (row stride x_stride), r_i is (rows, 3, C) packed. FP64
// partial sums per block, one atomic add each (order-dependent in the last bits only).
__global__ void diff_sq_kernel(const bf16 *x0, const bf16 *x1, const bf16 *x2, int x_stride, const bf16 *r,
                               size_t rows, int C, double *sq) {
    const bf16 *xs[3] = {x0, x1, x2};
    const int i = blockIdx.y;  // which of dq, dk, dv
    double e = 0.0, n = 0.0;
    size_t total = rows * (size_t)C;
    for (size_t k = (size_t)blockIdx.x * blockDim.x + threadIdx.x; k < total; k += (size_t)gridDim.x * blockDim.x) {
        size_t t = k / C, c = k % C;
        float x = __uint_as_float((uint32_t)xs[i][t * x_stride + c] << 16);
        float y = __uint_as_float((uint32_t)r[t * 3 * C + (size_t)i * C + c] << 16);
        e += ((double)x - y) * ((double)x - y);
        n += (double)y * y;
    }
    __shared__ double se[256], sn[256];
    se[threadIdx.x] = e;
    sn[threadIdx.x] = n;
    __syncthreads();
    for (int w = blockDim.x / 2; w > 0; w /= 2) {
        if ((int)threadIdx.x < w) {
            se[threadIdx.x] += se[threadIdx.x + w];
            sn[threadIdx.x] += sn[threadIdx.x + w];
        }
        __syncthreads();
    }
    if (threadIdx.x == 0) {
        atomicAdd(&sq[2 * i], se[0]);
        atomicAdd(&sq[2 * i + 1], sn[0]);
    }
}

static void diff_sq(const bf16 *dq, const bf16 *dk, const bf16 *dv, int stride, const bf16 *ref, size_t rows, int C,
                    double *sq, cudaStream_t stream) {
    diff_sq_kernel<<<dim3(264, 3), 256, 0, stream>>>(dq, dk, dv, stride, ref, rows, C, sq);
    CUDA_CHECK_LAUNCH();
}

static void backward(const AttnCall *c);

// The probe outputs of AttnModeDiag, after the backward c: the kept copy, the comparison, the
// local reference.
static void probe_outputs(const AttnCall *c) {
    const AttnModeDiag *diag = c->diag;
    const int C = c->H * c->d;
    const size_t row = (size_t)C * sizeof(bf16), rows = (size_t)c->B * c->T;
    if (diag->dqkv_keep) {
        const bf16 *src[3] = {c->dq, c->dk, c->dv};
        for (int i = 0; i < 3; i++)
            CUDA_CHECK(cudaMemcpy2DAsync(diag->dqkv_keep + (size_t)i * C, 3 * row, src[i],
                                         (size_t)c->dqkv_stride * sizeof(bf16), row, rows, cudaMemcpyDeviceToDevice,
                                         c->stream));
    }
    if (diag->dqkv_cmp) {
        if (!diag->cmp_sq) FATAL("attention diagnostics: dqkv_cmp needs cmp_sq");
        diff_sq(c->dq, c->dk, c->dv, c->dqkv_stride, diag->dqkv_cmp, rows, C, diag->cmp_sq, c->stream);
    }
    if (diag->local_ref) {
        if (!diag->ref_o || !diag->ref_lse || !diag->ref_dqkv || !diag->local_sq)
            FATAL("attention diagnostics: local_ref needs ref_o, ref_lse, ref_dqkv and local_sq");
        if (attn_mode_workspace_bytes(diag->local_ref, c->B, c->H, c->T, c->d) >
            attn_mode_workspace_bytes(c->opt, c->B, c->H, c->T, c->d))
            FATAL("attention diagnostics: the local reference %s needs more workspace than %s",
                  attn_precision_name(diag->local_ref->precision), attn_precision_name(c->opt->precision));
        // a reference in delayed scaling takes the layer's scales, without counting its amaxes
        AttnDelayedGpu rd;
        memset(&rd, 0, sizeof rd);
        if (c->delayed) rd = *c->delayed;
        rd.cur_amax = NULL;
        // the same q, k, v and dO in the reference precision, into the reference buffers
        AttnCall r = *c;
        r.opt = diag->local_ref;
        r.o = diag->ref_o, r.o_stride = C, r.lse = diag->ref_lse;
        r.dq = diag->ref_dqkv, r.dk = diag->ref_dqkv + C, r.dv = diag->ref_dqkv + 2 * C, r.dqkv_stride = 3 * C;
        r.rope = NULL, r.codes_ready = 0, r.saved = NULL, r.diag = NULL;
        r.delayed = c->delayed ? &rd : NULL;
        attn_forward(&r);
        backward(&r);
        diff_sq(c->dq, c->dk, c->dv, c->dqkv_stride, diag->ref_dqkv, rows, C, diag->local_sq, c->stream);
    }
}

extern "C" void attn_backward(const AttnCall *c) {
    backward(c);
    if (c->diag) probe_outputs(c);
}

static void backward(const AttnCall *c) {
    const AttnOptions *opt = c->opt;
    const int B = c->B, H = c->H, T = c->T, d = c->d;
    const bf16 *q = c->q, *k = c->k, *v = c->v, *o = c->o, *dout = c->dout;
    const int qkv_stride = c->qkv_stride, o_stride = c->o_stride, dqkv_stride = c->dqkv_stride;
    const float *lse = c->lse;
    bf16 *dq = c->dq, *dk = c->dk, *dv = c->dv;
    const AttnSavedCodes *saved = c->saved;
    const AttnDelayedGpu *delayed = c->delayed;
    const AttnModeDiag *diag = c->diag;
    cudaStream_t stream = c->stream;
    check_mode(opt, d);
    const AttnModePlan plan = attn_mode_plan(opt->precision);
    Parts p = carve_parts(opt, c->workspace, B, H, T, d);
    if (!plan.fp8_forward) {
        attn_gpu_backward(q, k, v, qkv_stride, o, dout, o_stride, lse, dq, dk, dv, dqkv_stride, p.bwd, B, H, T, d,
                          stream);
        return;
    }
    if (saved) {
        if (!saved->valid || saved->precision != opt->precision || saved->B != B || saved->H != H ||
            saved->T != T || saved->d != d)
            FATAL("attention backward (%s, B %d H %d T %d d %d): the kept codes are %s", attn_precision_name(opt->precision),
                  B, H, T, d, saved->valid ? "another forward's (shape or mode differ)" : "not filled by a forward");
        carve_saved(&p, opt->precision, saved->buf, B, H, T, d);
    }
    const int C = H * d;
    if (!plan.fp8_backward) {
        // The BF16 backward on Q̂, K̂, V̂ (the forward's quantized values, exact in BF16) and the
        // BF16 dO: kept by the forward, or made again. Saturations were counted by the forward's
        // casts of the same values.
        if (!saved) {
            AttnQuantTensor ts[3];
            const bf16 *x[3] = {q, k, v};
            const AttnCast casts[3] = {CAST_Q, CAST_K, CAST_V};  // V's scales are clamped (operand)
            for (int i = 0; i < 3; i++) {
                ts[i] = operand(x[i], qkv_stride, FP8_E4M3, NULL, NULL, NULL, NULL, casts[i]);
                ts[i].dequant = p.deq + (size_t)i * C;
                ts[i].dequant_stride = 3 * C;
            }
            const int ops[3] = {OP_Q, OP_K, OP_V}, track[3] = {0, 0, 0};  // counted by the forward
            quantize_scaled(opt, delayed, ts, ops, track, 3, p, B, H, T, d, stream);
        }
        attn_gpu_backward(p.deq, p.deq + C, p.deq + 2 * C, 3 * C, o, dout, o_stride, lse, dq, dk, dv, dqkv_stride,
                          p.bwd, B, H, T, d, stream);
        return;
    }
    // FP8 backward: S^T = K̂ Q̂^T and dP^T = V̂ dÔ^T reduce over d (codes); dV = P̂^T dÔ, dK = dŜ^T Q̂
    // and dQ = dŜ K̂ over tokens (transposed codes of dO, Q, K). Q, K, V are the forward's codes,
    // kept or made again (block scales are functions of the values); their saturations were
    // counted by the forward. dO in the same launch when Q, K, V are made again.
    AttnQuantTensor ts[4] = {
        operand(dout, o_stride, opt->grad_format, p.codes[OP_DO], p.codes_t[OP_DO], p.scales[OP_DO], diag,
                CAST_DO),
        operand(q, qkv_stride, FP8_E4M3, p.codes[OP_Q], p.codes_t[OP_Q], p.scales[OP_Q], NULL, CAST_Q),
        operand(k, qkv_stride, FP8_E4M3, p.codes[OP_K], p.codes_t[OP_K], p.scales[OP_K], NULL, CAST_K),
        operand(v, qkv_stride, FP8_E4M3, p.codes[OP_V], NULL, p.scales[OP_V], NULL, CAST_V)};
    const int ops[4] = {OP_DO, OP_Q, OP_K, OP_V}, track[4] = {1, 0, 0, 0};  // dO counted here, Q K V by the forward
    quantize_scaled(opt, delayed, ts, ops, track, saved ? 1 : 4, p, B, H, T, d, stream);
    AttnFp8BwdArgs a;
    memset(&a, 0, sizeof a);
    a.precision = opt->precision;
    a.grad_format = opt->grad_format;
    a.p_scale = opt->p_scale;
    a.q_codes = p.codes[OP_Q];
    a.qt_codes = p.codes_t[OP_Q];
    a.k_codes = p.codes[OP_K];
    a.kt_codes = p.codes_t[OP_K];
    a.v_codes = p.codes[OP_V];
    a.do_codes = p.codes[OP_DO];
    a.dot_codes = p.codes_t[OP_DO];
    a.q_scales = p.scales[OP_Q];
    a.k_scales = p.scales[OP_K];
    a.v_scales = p.scales[OP_V];
    a.do_scales = p.scales[OP_DO];
    a.o = o;
    a.dout = dout;
    a.o_stride = o_stride;
    a.lse = lse;
    a.dq = dq;
    a.dk = dk;
    a.dv = dv;
    a.dqkv_stride = dqkv_stride;
    a.workspace = p.bwd;
    if (diag) {
        a.delta_out = diag->delta;
        a.row_ds_sum = diag->row_ds_sum;
        a.row_cancel = diag->row_cancel;
        if (!a.row_ds_sum != !a.row_cancel) FATAL("attention diagnostics: row_ds_sum and row_cancel go together");
    }
    attn_gpu_backward_fp8(&a, B, H, T, d, stream);
}

