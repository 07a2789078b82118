// test_layers_fp8_gpu.cu: the layers that write their output's FP8 codes (layers_fp8.h) against
// the unfused path, code for code: for RMSNorm (plain and with the residual add), SwiGLU and the
// SwiGLU backward, at shapes that are and are not multiples of 128 (and one width not a multiple
// of 8: the element-by-element paths), E4M3 and E5M2, with and without Q(out^T), with and
// without the BF16 output:
//   - the BF16 output (and the residual, rstd) is bit-identical to layers.h's kernel's;
//   - Q(out) and Q(out^T): every code and every scale (device layout, 1/s) identical to what
//     fp8_quantize_gpu writes from that BF16 output, and to linear_fp8.c's fp8_quantize on the
//     host (the contract);
//   - with the BF16 output NULL, its buffer is left untouched;
//   - Q(out^T) may be in 128x128 blocks instead (precision.linear_wgrad_blocks), against
//     fp8_quantize_gpu's mixed pass and fp8_quantize the same way;
//   - per-tensor codes with a given amax (delayed scaling, run_tensor_case), and the RoPE
//     backward writing dqkv's (run_rope_case).
// Inputs: seeded random BF16 with a zero row, a row of large values and a few NaN / inf (which
// must give the same codes both ways). Without a GPU: one "skipped" line, exit 0.
#include <cuda_runtime.h>  // device memory
#include <math.h>          // ldexp, INFINITY, NAN
#include <stdint.h>        // uint8_t, uint16_t
#include <stdio.h>         // printf, snprintf
#include <string.h>        // memcmp, strlen
#include <vector>          // host buffers

#include "core/fp8.h"            // bf16_from_f32, bf16_to_f32
#include "gpu/layers.h"          // the unfused kernels
#include "gpu/layers_fp8.h"      // under test
#include "cpu/linear_fp8.h"      // fp8_quantize: the contract on the host
#include "gpu/linear_fp8_gpu.h"  // fp8_quantize_gpu: the unfused quantization
#include "gpu_test.h"            // CU, rng_normal, gpu_test_have_gpu, dnew/dup/back
#include "test.h"                // CHECK, test_summary

typedef std::vector<uint16_t> Bf;

// n BF16 of N(0, 1) * 2^[-3, 3]; special: element 0 of `row_len`-wide row 0 .. all zero (row 0),
// row 1 times 2^20, a NaN and an inf somewhere past row 1.
static Bf random_bf(size_t n, int row_len, int special) {
    Bf x(n);
    for (size_t i = 0; i < n; i++) x[i] = bf16_from_f32((float)ldexp(rng_normal(), (int)(rng_uniform() * 7) - 3));
    if (special && n >= (size_t)4 * row_len) {
        for (int c = 0; c < row_len; c++) x[c] = 0;
        for (int c = 0; c < row_len; c++) x[(size_t)row_len + c] = bf16_from_f32(bf16_to_f32(x[(size_t)row_len + c]) * 1048576.0f);
        x[2 * (size_t)row_len + (size_t)(rng_uniform() * (n - 2 * (size_t)row_len))] = bf16_from_f32(NAN);
        x[2 * (size_t)row_len + (size_t)(rng_uniform() * (n - 2 * (size_t)row_len))] = bf16_from_f32(INFINITY);
    }
    return x;
}

// Appends to msg what differs between operand a (fused) and b (unfused) of shape (rows, cols),
// and between a and fp8_quantize on the host values ref (rows, cols), in a's grouping (1x128, or
// 128x128 for a wgrad operand in blocks).
static void compare(char *msg, size_t cap, const char *tag, const Fp8Operand &a, const Fp8Operand &b,
                    const std::vector<float> &ref, int rows, int cols) {
    const size_t n = (size_t)rows * cols;
    const Fp8Grouping g = a.grouping;
    const long ns = fp8_group_count(g, rows, cols);
    std::vector<uint8_t> ca = back(a.codes, n), cb = back(b.codes, n), cc(n);
    std::vector<float> sa_dev = back(a.scales, (size_t)fp8_gpu_scale_count(g, rows, cols));
    std::vector<float> sb_dev = back(b.scales, sa_dev.size()), sa(ns), sb(ns), sc(ns);
    fp8_scales_to_rowmajor(sa.data(), sa_dev.data(), g, rows, cols);
    fp8_scales_to_rowmajor(sb.data(), sb_dev.data(), g, rows, cols);
    fp8_quantize(NULL, cc.data(), sc.data(), ref.data(), rows, cols, g, a.fmt, NULL);
    long d_ab = 0, d_ac = 0, s_ab = 0, s_ac = 0, first = -1;
    for (size_t i = 0; i < n; i++) {
        if (ca[i] != cb[i] && d_ab++ == 0) first = (long)i;
        d_ac += ca[i] != cc[i];
    }
    for (long i = 0; i < ns; i++) {
        s_ab += memcmp(&sa[i], &sb[i], sizeof(float)) != 0;
        s_ac += memcmp(&sa[i], &sc[i], sizeof(float)) != 0;
    }
    if (d_ab || d_ac || s_ab || s_ac) {
        size_t len = strlen(msg);
        snprintf(msg + len, cap - len, " %s: codes differ from the unfused %ld (first %ld) / from fp8_quantize %ld, "
                 "scales %ld / %ld;", tag, d_ab, first, d_ac, s_ab, s_ac);
    }
}

static std::vector<float> to_f(const std::vector<uint16_t> &b) {
    std::vector<float> f(b.size());
    for (size_t i = 0; i < b.size(); i++) f[i] = bf16_to_f32(b[i]);
    return f;
}
static std::vector<float> transpose(const std::vector<float> &a, int rows, int cols) {
    std::vector<float> t(a.size());
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) t[(size_t)c * rows + r] = a[(size_t)r * cols + c];
    return t;
}
template <class T> static bool same(const T *a, const T *b, size_t n) {
    return memcmp(back(a, n).data(), back(b, n).data(), n * sizeof(T)) == 0;
}

enum Layer { NORM = 0, NORM_RES, SWIGLU, SWIGLU_BWD };
static const char *layer_name[] = {"rmsnorm", "residual rmsnorm", "swiglu", "swiglu backward"};

// One case: layer L on N rows of width W (C for the norms, F for SwiGLU).
// qt_blocks: Q(out^T) in 128x128 blocks (a wgrad operand in blocks) instead of 1x128 slices.
static void run_case(Layer L, int N, int W, Fp8Format fmt, int with_qt, int with_out, int qt_blocks = 0) {
    const Fp8Grouping gt = qt_blocks ? FP8_GROUP_128x128 : FP8_GROUP_1x128;
    const int C = L == SWIGLU_BWD ? 2 * W : W;  // width of the output (and of its codes)
    const size_t n = (size_t)N * C;
    // inputs
    Bf hx = random_bf(L >= SWIGLU ? (size_t)N * 2 * W : n, L >= SWIGLU ? 2 * W : W, 1);
    Bf hd = random_bf(L == SWIGLU_BWD ? (size_t)N * W : n, W, 0);
    Bf hg = random_bf((size_t)W, W, 0);
    uint16_t *x = dup(hx), *delta = dup(hd), *g = dup(hg);
    // outputs: unfused (reference), fused
    uint16_t *out_ref = dnew<uint16_t>(n), *out = dnew<uint16_t>(n), *res_ref = dnew<uint16_t>(n), *res = dnew<uint16_t>(n);
    float *rstd_ref = dnew<float>(N), *rstd = dnew<float>(N);
    Fp8Operand q, qt, q_ref, qt_ref;
    fp8_operand_alloc(&q, N, C, FP8_GROUP_1x128, fmt);
    fp8_operand_alloc(&qt, C, N, gt, fmt);
    fp8_operand_alloc(&q_ref, N, C, FP8_GROUP_1x128, fmt);
    fp8_operand_alloc(&qt_ref, C, N, gt, fmt);
    const long nsc = fp8_gpu_scale_count(FP8_GROUP_1x128, N, C);  // scales of Q(out) (N, C)
    const long nsc_t = fp8_gpu_scale_count(gt, C, N);             // scales of Q(out^T) (C, N)
    CU(cudaMemset(q.codes, 0xAA, n));  // poison; unwritten scale slack stays equal on both sides
    CU(cudaMemset(qt.codes, 0xAA, n));
    CU(cudaMemset(q.scales, 0xFF, sizeof(float) * nsc));
    CU(cudaMemset(qt.scales, 0xFF, sizeof(float) * nsc_t));
    CU(cudaMemset(q_ref.scales, 0xFF, sizeof(float) * nsc));
    CU(cudaMemset(qt_ref.scales, 0xFF, sizeof(float) * nsc_t));
    const float eps = 1e-5f;
    uint16_t *o = with_out ? out : NULL;
    const Fp8Operand *pqt = with_qt ? &qt : NULL;
    switch (L) {
    case NORM:
        rmsnorm_forward_gpu(out_ref, rstd_ref, x, g, N, C, eps, 0);
        rmsnorm_forward_fp8_gpu(NULL, o, rstd, x, NULL, g, N, C, eps, &q, pqt, NULL, 0);
        break;
    case NORM_RES:
        residual_rmsnorm_forward_gpu(res_ref, out_ref, rstd_ref, x, delta, g, N, C, eps, 0);
        rmsnorm_forward_fp8_gpu(res, o, rstd, x, delta, g, N, C, eps, &q, pqt, NULL, 0);
        break;
    case SWIGLU:
        swiglu_forward_gpu(out_ref, x, N, W, 0);
        swiglu_forward_fp8_gpu(o, x, N, W, &q, pqt, NULL, 0);
        break;
    case SWIGLU_BWD:
        swiglu_backward_gpu(out_ref, delta, x, N, W, 0);
        swiglu_backward_fp8_gpu(o, delta, x, N, W, &q, pqt, NULL, 0);
        break;
    }
    fp8_quantize_gpu(&q_ref, with_qt ? &qt_ref : NULL, out_ref, N, C, NULL, 0);
    CU(cudaGetLastError());
    CU(cudaDeviceSynchronize());
    std::vector<float> ref = to_f(back(out_ref, n));
    char msg[1024] = "";
    if (with_out && !same(out, out_ref, n)) snprintf(msg + strlen(msg), sizeof msg - strlen(msg), " BF16 output differs;");
    if (!with_out) {  // left untouched: still the 0xFF poison
        std::vector<uint16_t> h = back(out, n);
        long touched = 0;
        for (uint16_t v : h) touched += v != 0xFFFFu;
        if (touched) snprintf(msg + strlen(msg), sizeof msg - strlen(msg), " %ld BF16 outputs written;", touched);
    }
    if ((L == NORM || L == NORM_RES) && !same(rstd, rstd_ref, (size_t)N))
        snprintf(msg + strlen(msg), sizeof msg - strlen(msg), " rstd differs;");
    if (L == NORM_RES && !same(res, res_ref, n)) snprintf(msg + strlen(msg), sizeof msg - strlen(msg), " residual differs;");
    compare(msg, sizeof msg, "Q(out)", q, q_ref, ref, N, C);
    if (with_qt) compare(msg, sizeof msg, "Q(out^T)", qt, qt_ref, transpose(ref, N, C), C, N);
    char name[200];
    snprintf(name, sizeof name, "%s %d x %d %s%s%s: codes and scales of the unfused path and of fp8_quantize",
             layer_name[L], N, W, fmt == FP8_E4M3 ? "e4m3" : "e5m2",
             with_qt ? (qt_blocks ? ", with Q(out^T) in 128x128 blocks" : ", with Q(out^T)") : "",
             with_out ? ", BF16 output bit-identical" : ", no BF16 output");
    CHECK(msg[0] == 0, name, "%s", msg);
    fp8_operand_free(&q); fp8_operand_free(&qt); fp8_operand_free(&q_ref); fp8_operand_free(&qt_ref);
    CU(cudaFree(x)); CU(cudaFree(delta)); CU(cudaFree(g)); CU(cudaFree(out_ref)); CU(cudaFree(out));
    CU(cudaFree(res_ref)); CU(cudaFree(res)); CU(cudaFree(rstd_ref)); CU(cudaFree(rstd));
}

// The per-tensor operands of one fused-against-unfused comparison (rows, cols): the fused kernel's
// q, qt and the reference pass's q_ref, qt_ref (codes poisoned), the given amax on the device and
// the two observe words (ts: the fused kernel's scale and observe[0]; observe + 1 the reference's).
struct TensorCase {
    Fp8Operand q, qt, q_ref, qt_ref;
    float *amax;
    unsigned *obs;
    Fp8TensorScale ts;
    TensorCase(int rows, int cols, Fp8Format fmt, float given) {
        fp8_operand_alloc(&q, rows, cols, FP8_GROUP_TENSOR, fmt);
        fp8_operand_alloc(&qt, cols, rows, FP8_GROUP_TENSOR, fmt);
        fp8_operand_alloc(&q_ref, rows, cols, FP8_GROUP_TENSOR, fmt);
        fp8_operand_alloc(&qt_ref, cols, rows, FP8_GROUP_TENSOR, fmt);
        CU(cudaMemset(q.codes, 0xAA, (size_t)rows * cols));
        CU(cudaMemset(qt.codes, 0xAA, (size_t)rows * cols));
        amax = dup(std::vector<float>{given});
        obs = dnew<unsigned>(2);
        CU(cudaMemset(obs, 0, 2 * sizeof(unsigned)));
        ts = {amax, obs};
    }
    ~TensorCase() {
        fp8_operand_free(&q); fp8_operand_free(&qt); fp8_operand_free(&q_ref); fp8_operand_free(&qt_ref);
        CU(cudaFree(amax)); CU(cudaFree(obs));
    }
    // The two observed amaxes (fused, reference) as floats.
    void observed(float out[2]) const {
        const std::vector<unsigned> ob = back(obs, 2);
        memcpy(out, ob.data(), 2 * sizeof(float));
    }
};

// max |v| over ref (NaN ignored, inf counts) into *own, and over its finite values (returned).
static float finite_amax(const std::vector<float> &ref, float *own) {
    float finite = 0.0f;
    *own = 0.0f;
    for (float v : ref) {
        *own = fmaxf(*own, fabsf(v));
        if (isfinite(v)) finite = fmaxf(finite, fabsf(v));
    }
    return finite;
}

// Per-tensor codes with a given amax (fp8_tensor, delayed scaling, Fp8TensorScale): layer L's
// fused kernel against the BF16 layer then fp8_quantize_gpu_with_amax, and both against the
// contract on the host (code = fp8(x * s), s = fp8_scale_for_amax(fmt, the given amax),
// saturating), for a given amax below the output's own (codes saturate) and far above it; the
// scales hold 1/s and the given amax; the observed amax (both paths) is the output's own max |x|.
static void run_tensor_case(Layer L, int N, int W, Fp8Format fmt, int with_qt) {
    const int C = L == SWIGLU_BWD ? 2 * W : W;
    const size_t n = (size_t)N * C;
    Bf hx = random_bf(L >= SWIGLU ? (size_t)N * 2 * W : n, L >= SWIGLU ? 2 * W : W, 1);
    Bf hd = random_bf(L == SWIGLU_BWD ? (size_t)N * W : n, W, 0);
    Bf hg = random_bf((size_t)W, W, 0);
    uint16_t *x = dup(hx), *delta = dup(hd), *g = dup(hg);
    uint16_t *out_ref = dnew<uint16_t>(n), *res = dnew<uint16_t>(n);
    float *rstd = dnew<float>(N);
    const float eps = 1e-5f;
    switch (L) {  // the BF16 output the codes must come from
    case NORM: rmsnorm_forward_gpu(out_ref, rstd, x, g, N, C, eps, 0); break;
    case NORM_RES: residual_rmsnorm_forward_gpu(res, out_ref, rstd, x, delta, g, N, C, eps, 0); break;
    case SWIGLU: swiglu_forward_gpu(out_ref, x, N, W, 0); break;
    case SWIGLU_BWD: swiglu_backward_gpu(out_ref, delta, x, N, W, 0); break;
    }
    CU(cudaDeviceSynchronize());
    const std::vector<float> ref = to_f(back(out_ref, n));
    float own;
    const float finite = finite_amax(ref, &own);
    const float given[2] = {finite * 0.5f, finite * 1024.0f};
    for (int k = 0; k < 2; k++) {
        TensorCase tc(N, C, fmt, given[k]);
        Fp8Operand &q = tc.q, &qt = tc.qt, &q_ref = tc.q_ref, &qt_ref = tc.qt_ref;
        const Fp8TensorScale &ts = tc.ts;
        const Fp8Operand *pqt = with_qt ? &qt : NULL;
        switch (L) {
        case NORM: rmsnorm_forward_fp8_gpu(NULL, NULL, rstd, x, NULL, g, N, C, eps, &q, pqt, &ts, 0); break;
        case NORM_RES: rmsnorm_forward_fp8_gpu(res, NULL, rstd, x, delta, g, N, C, eps, &q, pqt, &ts, 0); break;
        case SWIGLU: swiglu_forward_fp8_gpu(NULL, x, N, W, &q, pqt, &ts, 0); break;
        case SWIGLU_BWD: swiglu_backward_fp8_gpu(NULL, delta, x, N, W, &q, pqt, &ts, 0); break;
        }
        fp8_quantize_gpu_with_amax(&q_ref, with_qt ? &qt_ref : NULL, out_ref, N, C, tc.amax, tc.obs + 1, NULL, 0);
        CU(cudaGetLastError());
        CU(cudaDeviceSynchronize());
        const float s = fp8_scale_for_amax(fmt, given[k]);
        std::vector<uint8_t> c = back(q.codes, n), ct = back(qt.codes, n), cr = back(q_ref.codes, n),
                             crt = back(qt_ref.codes, n);
        long d_host = 0, d_ref = 0, d_t = 0, n_sat = 0;
        for (int r = 0; r < N; r++)
            for (int j = 0; j < C; j++) {
                const size_t i = (size_t)r * C + j, it = (size_t)j * N + r;
                const float v = ref[i] * s;
                const uint8_t want = fp8_from_f32(fmt, v);
                n_sat += isfinite(ref[i]) && fabsf(v) > fp8_max(fmt);
                d_host += c[i] != want;
                d_ref += c[i] != cr[i];
                if (with_qt) d_t += ct[it] != want || crt[it] != want;
            }
        const std::vector<float> sc = back(q.scales, 2), sct = back(qt.scales, 2), scr = back(q_ref.scales, 2);
        float ob_f[2];
        tc.observed(ob_f);
        const bool scales_ok = sc[0] == 1.0f / s && sc[1] == given[k] && scr[0] == sc[0] && scr[1] == sc[1] &&
                               (!with_qt || (sct[0] == sc[0] && sct[1] == sc[1]));
        CHECK(d_host == 0 && d_ref == 0 && d_t == 0 && scales_ok && ob_f[0] == own && ob_f[1] == own && (k || n_sat),
              "per tensor, given amax", "%s %d x %d %s%s, amax %s the output's: codes vs host %ld, vs the unfused "
              "%ld, Q(out^T) %ld; %ld saturated; scales %s; observed %g / %g, own %g",
              layer_name[L], N, W, fmt == FP8_E4M3 ? "e4m3" : "e5m2", with_qt ? ", with Q(out^T)" : "",
              k ? "above" : "below", d_host, d_ref, d_t, n_sat, scales_ok ? "ok" : "WRONG", ob_f[0], ob_f[1], own);
    }
    CU(cudaFree(x)); CU(cudaFree(delta)); CU(cudaFree(g)); CU(cudaFree(out_ref)); CU(cudaFree(res));
    CU(cudaFree(rstd));
}

// The RoPE backward writing dqkv's per-tensor codes (rope_backward_fp8_gpu) against the unfused
// path: rope_backward_gpu on a copy, then fp8_quantize_gpu_with_amax with the same given amax (half
// the rotated tensor's finite amax, so that codes saturate): the same codes both ways, the same
// scales and observed amax, and dqkv itself untouched.
static void run_rope_case(int B, int T, int H, int hd, Fp8Format fmt, int with_qt) {
    const int C = H * hd, N = B * T, W = 3 * C;
    const size_t n = (size_t)N * W;
    Bf h = random_bf(n, W, 1);
    uint16_t *dqkv = dup(h), *rot = dup(h);
    float *cs = dnew<float>((size_t)T * hd);
    rope_table_gpu(cs, T, hd, 10000.0, 0);
    rope_backward_gpu(rot, cs, B, T, H, hd, 0);
    CU(cudaDeviceSynchronize());
    const std::vector<float> ref = to_f(back(rot, n));
    float own;
    TensorCase tc(N, W, fmt, finite_amax(ref, &own) * 0.5f);
    const Fp8Operand &q = tc.q, &qt = tc.qt, &q_ref = tc.q_ref, &qt_ref = tc.qt_ref;
    rope_backward_fp8_gpu(dqkv, cs, B, T, H, hd, &q, with_qt ? &qt : NULL, &tc.ts, 0);
    fp8_quantize_gpu_with_amax(&q_ref, with_qt ? &qt_ref : NULL, rot, N, W, tc.amax, tc.obs + 1, NULL, 0);
    CU(cudaGetLastError());
    CU(cudaDeviceSynchronize());
    const std::vector<uint8_t> c = back(q.codes, n), cr = back(q_ref.codes, n), ct = back(qt.codes, n),
                               ctr = back(qt_ref.codes, n);
    long d_q = 0, d_t = 0;
    for (size_t i = 0; i < n; i++) {
        d_q += c[i] != cr[i];
        if (with_qt) d_t += ct[i] != ctr[i];
    }
    const std::vector<float> sc = back(q.scales, 2), scr = back(q_ref.scales, 2);
    float ob_f[2];
    tc.observed(ob_f);
    const bool untouched = back(dqkv, n) == h;
    CHECK(d_q == 0 && d_t == 0 && sc[0] == scr[0] && sc[1] == scr[1] && ob_f[0] == own && ob_f[1] == own && untouched,
          "rope backward fused", "B %d T %d H %d hd %d %s%s: codes differ %ld, Q(x^T) %ld; scales %g/%g vs %g/%g; "
          "observed %g / %g, own %g; dqkv %s", B, T, H, hd, fmt == FP8_E4M3 ? "e4m3" : "e5m2",
          with_qt ? ", with Q(x^T)" : "", d_q, d_t, sc[0], sc[1], scr[0], scr[1], ob_f[0], ob_f[1], own,
          untouched ? "untouched" : "CHANGED");
    CU(cudaFree(dqkv)); CU(cudaFree(rot)); CU(cudaFree(cs));
}

// The cross-entropy writing its gradient as per-tensor codes (cross_entropy_fp8_gpu: fp8_tensor's
// FP8 LM head) against cross_entropy_gpu then fp8_quantize_gpu_with_amax with the bound
// grad_scale as the amax: the same losses bit for bit, the same codes, the logits left as they
// were, ignored rows' codes zero (targets -1), a target past V a NaN loss as before; then
// fp8_transpose_tensor_gpu of those codes, with the scale floats fp8_set_tensor_scale_gpu gives
// them, against the quantization's Q(x^T), scales included.
static void run_ce_codes_case(int N, int V, int Vp, Fp8Format fmt) {
    const size_t n = (size_t)N * Vp;
    Bf hl = random_bf(n, Vp, 0);
    std::vector<int32_t> tg(N);
    for (int i = 0; i < N; i++) tg[i] = i % 7 == 3 ? -1 : (int32_t)(rng_uniform() * V);
    uint16_t *lg = dup(hl), *lg_ref = dup(hl);
    int32_t *d_tg = dup(tg);
    float *loss = dnew<float>(N), *loss_ref = dnew<float>(N);
    const float gs = 1.0f / 300.0f;  // (not a power of two: the bound's scale rounds down)
    TensorCase tc(N, Vp, fmt, gs);
    cross_entropy_fp8_gpu(lg, loss, d_tg, N, V, Vp, gs, tc.q.codes, fmt, 0);
    cross_entropy_gpu(lg_ref, loss_ref, d_tg, N, V, Vp, gs, 0);
    fp8_quantize_gpu_with_amax(&tc.q_ref, &tc.qt_ref, lg_ref, N, Vp, tc.amax, NULL, NULL, 0);
    fp8_set_tensor_scale_gpu(&tc.q, gs, 0);  // the codes' scale floats, as head_fp8_backward sets them
    fp8_transpose_tensor_gpu(&tc.q, &tc.qt, 0);
    CU(cudaGetLastError());
    CU(cudaDeviceSynchronize());
    const std::vector<uint8_t> c = back(tc.q.codes, n), cr = back(tc.q_ref.codes, n), ct = back(tc.qt.codes, n),
                               ctr = back(tc.qt_ref.codes, n);
    const std::vector<float> l = back(loss, N), lr = back(loss_ref, N), sct = back(tc.qt.scales, 2),
                             sctr = back(tc.qt_ref.scales, 2);
    long d_q = 0, d_t = 0, ignored_nonzero = 0, nonzero = 0;
    for (size_t i = 0; i < n; i++) {
        d_q += c[i] != cr[i];
        d_t += ct[i] != ctr[i];
        nonzero += (c[i] & 0x7F) != 0;
        if (tg[i / Vp] < 0) ignored_nonzero += c[i] != 0;
    }
    const bool losses_same = !memcmp(l.data(), lr.data(), sizeof(float) * N);
    const bool untouched = back(lg, n) == hl;
    CHECK(d_q == 0 && d_t == 0 && ignored_nonzero == 0 && nonzero > 0 && losses_same && untouched &&
              sct[0] == sctr[0] && sct[1] == sctr[1],
          "cross-entropy with per-tensor gradient codes", "N %d V %d Vp %d %s: codes differ %ld, transposed %ld, "
          "ignored rows' nonzero codes %ld, nonzero codes %ld; losses %s; logits %s; Q(x^T) scales %g/%g vs %g/%g", N,
          V, Vp, fmt == FP8_E4M3 ? "e4m3" : "e5m2", d_q, d_t, ignored_nonzero, nonzero,
          losses_same ? "bit-identical" : "DIFFER", untouched ? "untouched" : "CHANGED", sct[0], sct[1], sctr[0],
          sctr[1]);
    CU(cudaFree(lg)); CU(cudaFree(lg_ref)); CU(cudaFree(d_tg)); CU(cudaFree(loss)); CU(cudaFree(loss_ref));
}

int main(void) {
    if (!gpu_test_have_gpu("test_layers_fp8_gpu")) return test_summary("test_layers_fp8_gpu");
    rng_state = 0x5EED0F8ull;
    // (N, width): whole tiles; partial tiles both ways; a width not a multiple of 8 (norms only:
    // SwiGLU needs F % 8 == 0); the paper_569m widths on a few tiles of tokens.
    const int norm_shapes[][2] = {{256, 256}, {200, 200}, {130, 100}, {384, 1536}};
    // (F % 128 == 0 with the per-tensor codes: the pair kernel, whole and partial rows)
    const int swiglu_shapes[][2] = {{256, 384}, {200, 352}, {130, 136}, {256, 3968}, {200, 256}};
    for (int fmt = 0; fmt < 2; fmt++)
        for (int v = 0; v < 3; v++) {  // with Q(out^T) and the BF16 output, without Q(out^T), without output
            const int with_qt = v != 1, with_out = v != 2;
            for (auto &s : norm_shapes) {
                run_case(NORM, s[0], s[1], (Fp8Format)fmt, with_qt, with_out);
                run_case(NORM_RES, s[0], s[1], (Fp8Format)fmt, with_qt, with_out);
            }
            for (auto &s : swiglu_shapes) {
                run_case(SWIGLU, s[0], s[1], (Fp8Format)fmt, with_qt, with_out);
                run_case(SWIGLU_BWD, s[0], s[1], (Fp8Format)fmt, with_qt, with_out);
            }
        }
    // Q(out^T) in 128x128 blocks (precision.linear_wgrad_blocks): every layer, whole and partial tiles
    for (int fmt = 0; fmt < 2; fmt++) {
        for (auto &s : norm_shapes) {
            run_case(NORM, s[0], s[1], (Fp8Format)fmt, 1, 0, 1);
            run_case(NORM_RES, s[0], s[1], (Fp8Format)fmt, 1, 0, 1);
        }
        for (auto &s : swiglu_shapes) {
            run_case(SWIGLU, s[0], s[1], (Fp8Format)fmt, 1, 0, 1);
            run_case(SWIGLU_BWD, s[0], s[1], (Fp8Format)fmt, 1, 0, 1);
        }
    }
    // per tensor with a given amax (delayed scaling): every layer, whole and partial tiles
    for (int fmt = 0; fmt < 2; fmt++)
        for (int with_qt = 0; with_qt < 2; with_qt++) {
            for (auto &s : norm_shapes) {
                run_tensor_case(NORM, s[0], s[1], (Fp8Format)fmt, with_qt);
                run_tensor_case(NORM_RES, s[0], s[1], (Fp8Format)fmt, with_qt);
            }
            for (auto &s : swiglu_shapes) {
                run_tensor_case(SWIGLU, s[0], s[1], (Fp8Format)fmt, with_qt);
                run_tensor_case(SWIGLU_BWD, s[0], s[1], (Fp8Format)fmt, with_qt);
            }
        }
    // the RoPE backward writing dqkv's codes: heads of 64 and 128, whole and partial row tiles
    for (int fmt = 0; fmt < 2; fmt++)
        for (int with_qt = 0; with_qt < 2; with_qt++) {
            run_rope_case(2, 96, 2, 64, (Fp8Format)fmt, with_qt);   // N 192: a partial row tile
            run_rope_case(1, 256, 3, 128, (Fp8Format)fmt, with_qt);
        }
    // the cross-entropy's gradient as codes: GPT-2's padded vocabulary on a partial row tile, and a
    // small one (fewer chunks per thread, V < Vp)
    for (int fmt = 0; fmt < 2; fmt++) {
        run_ce_codes_case(200, 50257, 50304, (Fp8Format)fmt);
        run_ce_codes_case(256, 1000, 1024, (Fp8Format)fmt);
    }
    return test_summary("test_layers_fp8_gpu");
}
