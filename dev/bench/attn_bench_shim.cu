// attn_bench_shim.cu: plain C entry points over attention_fp8.h and attention/kernels_fp8.h for
// dev/bench/bench_attention_fp8.py (ctypes), so that Python passes ints and pointers instead of
// AttnOptions / AttnQuantTensor / AttnFp8BwdArgs structs. The shim owns what only the bare-kernel
// timings need (the quantized operands and two scratch buffers); Python owns the inputs and every
// output (torch tensors), so it can compare the modes' results.
//
// Timed entry points (one stream, all asynchronous):
//   shim_fwd / shim_bwd          attn_forward / attn_backward: what the trainer runs with
//                                precision.attention_keep_codes = false (the backward quantizes Q,
//                                K, V again)
//   shim_fwd_keep / shim_bwd_keep  the same with the forward's Q, K, V codes kept for the backward
//                                (the trainer's default): the forward writes more layouts, the
//                                backward quantizes dO alone
//   shim_quant(0 / 1, 2 / 3)     attn_gpu_quantize with the forward's / the backward's layouts,
//                                without / with kept codes
//   shim_fp8_fwd / shim_fp8_bwd  attn_gpu_forward_fp8 / attn_gpu_backward_fp8 on those codes
//   shim_delta                   fp8_dm's delta-pass kernel alone (attn_bench_shim_delta.cu)
//   shim_rope / shim_fwd_rope    the forward as the model runs it after the QKV projection, RoPE
//                                included: rope_forward_gpu alone; attn_forward with RoPE (bf16:
//                                rope_forward_gpu then the forward; FP8 modes: RoPE inside the
//                                quantize pass, kept codes, q and k not written back, as the
//                                trainer does without diagnostics). On the shim's own copy of qkv,
//                                which the bf16 calls keep rotating (timing only)
#include <cuda_runtime.h>
#include <stdint.h>
#include <stdio.h>   // snprintf
#include <string.h>  // memset

#include "attention_fp8.h"
#include "attention/kernels_fp8.h"
#include "gpu/layers.h"  // rope_table_gpu, rope_forward_gpu

extern "C" {

// The delta kernel's launcher, from attn_bench_shim_delta.cu; weak so that the library still
// links (and shim_delta reports -1) when that file no longer compiles against the library.
int shim_delta_launch(const uint8_t *qc, const uint8_t *kc, const uint8_t *vc, const uint8_t *doc,
                      const float *qs, const float *ks, const float *vs, const float *dos, const float *lse,
                      float *delta, int B, int H, int T, int d, int e5, cudaStream_t stream)
    __attribute__((weak));

// attention_fp8.cu names the mode in its FATAL messages through config.c, which needs cJSON; the
// benchmark links without config.c, and config.c's own definition wins whenever it is linked.
__attribute__((weak)) const char *attn_precision_name(AttnPrecision p) {
    static const char *const names[] = {"fp32", "bf16", "fp8_naive", "fp8_hybrid", "fp8_dm", "fp8_dm_approx"};
    return (unsigned)p < sizeof names / sizeof names[0] ? names[p] : "?";
}

static struct {
    const uint16_t *qkv, *dout;  // (B, T, 3, H, d) and (B, T, H, d) BF16, Python's
    int B, H, T, d;
    Fp8Format gfmt;
    cudaStream_t stream;
    uint8_t *codes[4], *codes_t[4];  // Q, K, V, dO
    float *scales[4];
    void *ws;                // attn_mode_* workspace: the largest mode's
    void *ws8;               // the bare FP8 backward's scratch (kept apart: nothing shared by accident)
    AttnSavedCodes keep[ATTN_N_PRECISIONS];  // per mode: shim_fwd_keep's codes for shim_bwd_keep
    uint16_t *qkv_rope;      // (B, T, 3, H, d): shim_rope / shim_fwd_rope's input, a copy of qkv
    AttnSavedCodes keep_rope;  // shim_fwd_rope's kept codes (apart from keep[], which shim_bwd_keep reads)
    float *rope;             // (T, d/2, 2) rope_table_gpu, theta 10000
} S;

static AttnOptions options(int precision) {
    AttnOptions o;
    memset(&o, 0, sizeof o);
    o.precision = (AttnPrecision)precision;
    o.grad_format = S.gfmt;
    o.scaling = SCALING_BLOCK;
    o.p_scale = 256.0f;  // the config's default, the only P scale the GPU kernels take
    o.block_q = o.block_k = 128;
    return o;
}

// 0 when the GPU runs this precision (ATTN_* of config.h); else -1 and the reason in why.
int shim_supported(int precision, int d, char *why, int why_len) {
    AttnOptions o = options(precision);
    const char *w = NULL;
    int r = attn_mode_supported(&o, d, &w);
    if (why && why_len > 0) snprintf(why, (size_t)why_len, "%s", w ? w : "");
    return r;
}

void shim_free(void) {
    for (int i = 0; i < 4; i++) {
        cudaFree(S.codes[i]);
        cudaFree(S.codes_t[i]);
        cudaFree(S.scales[i]);
    }
    cudaFree(S.ws);
    cudaFree(S.ws8);
    for (int p = 0; p < ATTN_N_PRECISIONS; p++) cudaFree(S.keep[p].buf);
    cudaFree(S.qkv_rope);
    cudaFree(S.rope);
    cudaFree(S.keep_rope.buf);
    memset(&S, 0, sizeof S);
}

// Binds the inputs of one shape and allocates the shim's buffers. grad_fmt: 0 E4M3, 1 E5M2.
// Returns 0, or -1 after printing the failed allocation.
int shim_init(const void *qkv, const void *dout, int B, int H, int T, int d, int grad_fmt, void *stream) {
    shim_free();
    S.qkv = (const uint16_t *)qkv;
    S.dout = (const uint16_t *)dout;
    S.B = B, S.H = H, S.T = T, S.d = d;
    S.gfmt = grad_fmt ? FP8_E5M2 : FP8_E4M3;
    S.stream = (cudaStream_t)stream;
    const size_t Tp = (size_t)attn_quant_padded_len(T), nblk = (size_t)attn_quant_n_blocks(T);
    const size_t codes = (size_t)B * H * Tp * d, scales = sizeof(float) * B * H * nblk;
    size_t ws = 0;
    for (int p = ATTN_BF16; p <= ATTN_FP8_DM_APPROX; p++) {
        AttnOptions o = options(p);
        if (attn_mode_supported(&o, d, NULL) == 0) {
            size_t n = attn_mode_workspace_bytes(&o, B, H, T, d);
            ws = n > ws ? n : ws;
        }
    }
    cudaError_t e = cudaSuccess;
    for (int i = 0; i < 4 && e == cudaSuccess; i++) {
        e = cudaMalloc(&S.codes[i], codes);
        if (e == cudaSuccess) e = cudaMalloc(&S.codes_t[i], codes);
        if (e == cudaSuccess) e = cudaMalloc(&S.scales[i], scales);
    }
    if (e == cudaSuccess) e = cudaMalloc(&S.ws, ws);  // cudaMalloc aligns to 256 bytes and more
    if (e == cudaSuccess) e = cudaMalloc(&S.ws8, attn_gpu_backward_fp8_workspace_bytes(B, H, T, d));
    for (int p = ATTN_FP8_NAIVE; p <= ATTN_FP8_DM_APPROX && e == cudaSuccess; p++) {
        AttnOptions o = options(p);
        S.keep[p].bytes = attn_saved_codes_bytes(&o, B, H, T, d);
        e = cudaMalloc(&S.keep[p].buf, S.keep[p].bytes);
    }
    const size_t n_qkv = (size_t)B * T * 3 * H * d;
    if (e == cudaSuccess) e = cudaMalloc(&S.qkv_rope, n_qkv * sizeof(uint16_t));
    if (e == cudaSuccess) e = cudaMalloc(&S.rope, sizeof(float) * T * d);
    if (e == cudaSuccess) {  // the same size for every FP8 mode
        AttnOptions o = options(ATTN_FP8_DM);
        S.keep_rope.bytes = attn_saved_codes_bytes(&o, B, H, T, d);
        e = cudaMalloc(&S.keep_rope.buf, S.keep_rope.bytes);
    }
    if (e != cudaSuccess) {
        fprintf(stderr, "shim_init: cudaMalloc: %s\n", cudaGetErrorString(e));
        shim_free();
        return -1;
    }
    cudaMemcpyAsync(S.qkv_rope, S.qkv, n_qkv * sizeof(uint16_t), cudaMemcpyDeviceToDevice, S.stream);
    rope_table_gpu(S.rope, T, d, 10000.0, S.stream);
    return 0;
}

// Through the dispatcher, quantization included. o (B, T, H, d), lse (B, H, T), dqkv
// (B, T, 3, H, d): Python's buffers for this mode.
// The layer API on the shim's q, k, v, dout; keep: NULL (the backward quantizes Q, K, V again)
// or the mode's kept-codes buffer.
// The call of one layer on the shim's q, k, v (views of the packed qkv) and dO, into o, lse, dqkv.
static AttnCall shim_call(const AttnOptions *opt, void *o, float *lse, void *dqkv, AttnSavedCodes *keep) {
    const int C = S.H * S.d;
    uint16_t *dq = (uint16_t *)dqkv;
    AttnCall c = {};
    c.opt = opt, c.B = S.B, c.H = S.H, c.T = S.T, c.d = S.d;
    c.q = S.qkv, c.k = S.qkv + C, c.v = S.qkv + 2 * C, c.qkv_stride = 3 * C;
    c.o = (uint16_t *)o, c.dout = S.dout, c.o_stride = C, c.lse = lse;
    if (dq) c.dq = dq, c.dk = dq + C, c.dv = dq + 2 * C, c.dqkv_stride = 3 * C;
    c.saved = keep, c.workspace = S.ws, c.stream = S.stream;
    return c;
}
static void mode_fwd(int precision, void *o, float *lse, AttnSavedCodes *keep) {
    AttnOptions opt = options(precision);
    const AttnCall c = shim_call(&opt, o, lse, NULL, keep);
    attn_forward(&c);
}
static void mode_bwd(int precision, const void *o, const float *lse, void *dqkv, AttnSavedCodes *keep) {
    AttnOptions opt = options(precision);
    const AttnCall c = shim_call(&opt, const_cast<void *>(o), const_cast<float *>(lse), dqkv, keep);
    attn_backward(&c);
}

void shim_fwd(int precision, void *o, float *lse) { mode_fwd(precision, o, lse, NULL); }
void shim_bwd(int precision, const void *o, const float *lse, void *dqkv) { mode_bwd(precision, o, lse, dqkv, NULL); }

// With kept codes (FP8 modes; one buffer per mode): shim_bwd_keep needs a shim_fwd_keep of the
// same precision before it (attention_fp8.cu checks it); every timed forward rewrites the same
// codes, and o, lse are the same as shim_fwd's.
void shim_fwd_keep(int precision, void *o, float *lse) { mode_fwd(precision, o, lse, &S.keep[precision]); }
void shim_bwd_keep(int precision, const void *o, const float *lse, void *dqkv) {
    mode_bwd(precision, o, lse, dqkv, &S.keep[precision]);
}

void shim_rope(void) { rope_forward_gpu(S.qkv_rope, S.rope, S.B, S.T, S.H, S.d, S.stream); }
void shim_fwd_rope(int precision, void *o, float *lse) {
    AttnOptions opt = options(precision);
    const int fp8 = precision != ATTN_BF16, C = S.H * S.d;
    AttnCall c = shim_call(&opt, o, lse, NULL, fp8 ? &S.keep_rope : NULL);
    c.q = S.qkv_rope, c.k = S.qkv_rope + C, c.v = S.qkv_rope + 2 * C;
    c.rope = S.rope, c.rotate_in_place = !fp8;
    attn_forward(&c);
}

static AttnQuantTensor tensor(int i, int with_codes, int with_t) {
    AttnQuantTensor t;
    memset(&t, 0, sizeof t);
    const int C = S.H * S.d;
    t.x = i == 3 ? S.dout : S.qkv + i * C;
    t.stride = i == 3 ? C : 3 * C;
    t.fmt = i == 3 ? S.gfmt : FP8_E4M3;
    t.codes = with_codes ? S.codes[i] : NULL;
    t.codes_t = with_t ? S.codes_t[i] : NULL;
    t.scales = S.scales[i];
    t.max_scale_exp = attn_scale_max_exp((AttnCast)i);  // as the layer quantizes them (i: Q, K, V, dO)
    return t;
}

// which 0: the forward's layouts (Q, K codes; V transposed), 1: the FP8 backward's (Q, K both
// layouts, V codes, dO both), as attention_fp8.cu quantizes them without kept codes; with kept
// codes 2: the forward's (Q, K, V both layouts), 3: the backward's (dO both layouts). Run 0 (or 2)
// before shim_fp8_fwd, 1 (or 2 and 3) before shim_fp8_bwd / shim_delta; the codes stay until
// shim_free.
void shim_quant(int which) {
    if (which == 0) {
        AttnQuantTensor ts[3] = {tensor(0, 1, 0), tensor(1, 1, 0), tensor(2, 0, 1)};
        attn_gpu_quantize(ts, 3, S.B, S.H, S.T, S.d, S.stream);
    } else if (which == 2) {
        AttnQuantTensor ts[3] = {tensor(0, 1, 1), tensor(1, 1, 1), tensor(2, 1, 1)};
        attn_gpu_quantize(ts, 3, S.B, S.H, S.T, S.d, S.stream);
    } else if (which == 3) {
        AttnQuantTensor t = tensor(3, 1, 1);
        attn_gpu_quantize(&t, 1, S.B, S.H, S.T, S.d, S.stream);
    } else {
        AttnQuantTensor ts[4] = {tensor(0, 1, 1), tensor(1, 1, 1), tensor(2, 1, 0), tensor(3, 1, 1)};
        attn_gpu_quantize(ts, 4, S.B, S.H, S.T, S.d, S.stream);
    }
}

void shim_fp8_fwd(void *o, float *lse) {
    attn_gpu_forward_fp8(S.codes[0], S.codes[1], S.codes_t[2], S.scales[0], S.scales[1], S.scales[2], 256.0f,
                         (uint16_t *)o, S.H * S.d, lse, S.B, S.H, S.T, S.d, S.stream);
}

// precision: ATTN_FP8_NAIVE, ATTN_FP8_DM or ATTN_FP8_DM_APPROX; o, lse from shim_fp8_fwd.
// delta_out (B, H, T) or NULL (timed calls: the trainer passes none): D as the backward used it.
void shim_fp8_bwd(int precision, const void *o, const float *lse, void *dqkv, float *delta_out) {
    AttnFp8BwdArgs a;
    memset(&a, 0, sizeof a);
    const int C = S.H * S.d;
    a.precision = (AttnPrecision)precision;
    a.grad_format = S.gfmt;
    a.p_scale = 256.0f;
    a.q_codes = S.codes[0], a.qt_codes = S.codes_t[0];
    a.k_codes = S.codes[1], a.kt_codes = S.codes_t[1];
    a.v_codes = S.codes[2];
    a.do_codes = S.codes[3], a.dot_codes = S.codes_t[3];
    a.q_scales = S.scales[0], a.k_scales = S.scales[1], a.v_scales = S.scales[2], a.do_scales = S.scales[3];
    a.o = (const uint16_t *)o;
    a.dout = S.dout;
    a.o_stride = C;
    a.lse = lse;
    a.dq = (uint16_t *)dqkv, a.dk = a.dq + C, a.dv = a.dq + 2 * C;
    a.dqkv_stride = 3 * C;
    a.workspace = S.ws8;
    a.delta_out = delta_out;
    attn_gpu_backward_fp8(&a, S.B, S.H, S.T, S.d, S.stream);
}

// fp8_dm's delta pass alone on the backward's codes and this lse, D into delta (B, H, T): the
// same values as shim_fp8_bwd's delta_out for ATTN_FP8_DM when the launch matches the library's.
// -1 when the delta launcher is not linked or the launch failed.
int shim_delta(const float *lse, float *delta) {
    if (!shim_delta_launch) return -1;
    return shim_delta_launch(S.codes[0], S.codes[1], S.codes[2], S.codes[3], S.scales[0], S.scales[1],
                             S.scales[2], S.scales[3], lse, delta, S.B, S.H, S.T, S.d, S.gfmt == FP8_E5M2,
                             S.stream);
}

int shim_has_delta(void) { return shim_delta_launch ? 1 : 0; }

}  // extern "C"
