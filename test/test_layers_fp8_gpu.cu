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
//     fp8_quantize_gpu's mixed pass and fp8_quantize the same way.
// Inputs: seeded random BF16 with a zero row, a row of large values and a few NaN / inf (which
// must give the same codes both ways). Without a GPU: one "skipped" line, exit 0.
#include <cuda_runtime.h>  // device memory
#include <math.h>          // ldexp, INFINITY, NAN
#include <stdint.h>        // uint8_t, uint16_t
#include <stdio.h>         // printf, snprintf
#include <string.h>        // memcmp, strlen
#include <vector>          // host buffers

#include "fp8.h"             // bf16_from_f32, bf16_to_f32
#include "layers.h"          // the unfused kernels
#include "layers_fp8.h"      // under test
#include "linear_fp8.h"      // fp8_quantize: the contract on the host
#include "linear_fp8_gpu.h"  // fp8_quantize_gpu: the unfused quantization
#include "gpu_test.h"        // CU, rng_normal, gpu_test_have_gpu, dnew/dup/back
#include "test.h"            // CHECK, test_summary

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
        rmsnorm_forward_fp8_gpu(NULL, o, rstd, x, NULL, g, N, C, eps, &q, pqt, 0);
        break;
    case NORM_RES:
        residual_rmsnorm_forward_gpu(res_ref, out_ref, rstd_ref, x, delta, g, N, C, eps, 0);
        rmsnorm_forward_fp8_gpu(res, o, rstd, x, delta, g, N, C, eps, &q, pqt, 0);
        break;
    case SWIGLU:
        swiglu_forward_gpu(out_ref, x, N, W, 0);
        swiglu_forward_fp8_gpu(o, x, N, W, &q, pqt, 0);
        break;
    case SWIGLU_BWD:
        swiglu_backward_gpu(out_ref, delta, x, N, W, 0);
        swiglu_backward_fp8_gpu(o, delta, x, N, W, &q, pqt, 0);
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

int main(void) {
    if (!gpu_test_have_gpu("test_layers_fp8_gpu")) return test_summary("test_layers_fp8_gpu");
    rng_state = 0x5EED0F8ull;
    // (N, width): whole tiles; partial tiles both ways; a width not a multiple of 8 (norms only:
    // SwiGLU needs F % 8 == 0); the paper_569m widths on a few tiles of tokens.
    const int norm_shapes[][2] = {{256, 256}, {200, 200}, {130, 100}, {384, 1536}};
    const int swiglu_shapes[][2] = {{256, 384}, {200, 352}, {130, 136}, {256, 3968}};
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
    return test_summary("test_layers_fp8_gpu");
}
