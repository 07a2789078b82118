// test_linear_fp8_gpu.cu: the FP8 linear layers of the GPU (linear_fp8_gpu.h) against the CPU
// emulation (linear_fp8.c), on fresh seeded BF16 inputs whose magnitudes vary by row and column.
//   1. Quantization: every grouping (tensor, 1x128, 128x128) x format (E4M3, E5M2) x output (Q(x),
//      Q(x^T), both in one call) at shapes that are and are not multiples of 128 (odd ones too),
//      with +-inf, NaN, an all-zero row, subnormal rows, and a misaligned input: every FP8 code
//      and every scale identical to fp8_quantize's (scales after the layout permutation; the
//      padding of the 128x128 layout is 1.0; the per-tensor amax by-product exact), saturation
//      and NaN counts equal to Fp8QuantStats.
//   2. GEMMs: forward, dgrad, wgrad (overwrite, then accumulate twice) of fp8_tensor (dy E4M3 and
//      E5M2) and fp8_block against linear_forward/dgrad/wgrad on the same values: BF16 outputs
//      rel L2 < 3e-3 (the output's own BF16 rounding alone gives ~1.7e-3; the error against the
//      BF16-rounded reference is printed too), FP32 wgrad rel L2 < 1e-3; a repeated
//      shape reuses its cached plan.
//   3. Timing (information): 8192^3 GEMMs per mode against BF16 cuBLASLt (matmul.h), and the
//      quantization kernels at 8192 x 8192 ("# timing" lines).
// Without a GPU: prints one "skipped" line, returns 0. FP8_TEST_QUANT_ONLY=1 runs part 1 only.
#include <cuda_runtime.h>  // device memory, events
#include <math.h>          // ldexp, fabsf, sqrt, INFINITY, NAN
#include <stdint.h>        // uint8_t, uint16_t, uint64_t
#include <stdio.h>         // printf, snprintf
#include <stdlib.h>        // getenv
#include <string.h>        // memset, memcmp
#include <vector>          // host buffers

#include "core/config.h"         // PrecisionConfig, LinearPrecision
#include "core/fp8.h"            // bf16_from_f32, bf16_to_f32
#include "cpu/linear_fp8.h"      // fp8_quantize, linear_forward/dgrad/wgrad: the CPU emulation
#include "gpu/linear_fp8_gpu.h"  // under test
#include "gpu/matmul.h"          // the BF16 GEMMs timed for comparison
#include "gpu_test.h"            // CU, rng_normal, gpu_test_have_gpu, dnew/dup/back, Err
#include "test.h"                // CHECK, test_summary

typedef std::vector<uint16_t> Bf;
typedef std::vector<float> Fv;

static const char *grouping_name(Fp8Grouping g) {
    return g == FP8_GROUP_TENSOR ? "tensor" : g == FP8_GROUP_1x128 ? "1x128" : "128x128";
}
static const char *fmt_name(Fp8Format f) { return f == FP8_E4M3 ? "e4m3" : "e5m2"; }

// (rows, cols) BF16 whose magnitudes vary by 2^[-e, e] per row and per column (tokens and
// channels with outliers). special: +-inf and NaN at a few places, row 0 all zero, row 1 scaled
// to float subnormals (tiny amax: the clamped scale), row 2 mixing subnormals with one normal.
static Bf random_bf(int rows, int cols, int e, int special) {
    Bf x((size_t)rows * cols);
    std::vector<double> rs(rows), cs(cols);
    for (auto &v : rs) v = ldexp(1.0, (int)(rng_uniform() * (2 * e + 1)) - e);
    for (auto &v : cs) v = ldexp(1.0, (int)(rng_uniform() * (2 * e + 1)) - e);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++)
            x[(size_t)r * cols + c] = bf16_from_f32((float)(rng_normal() * rs[r] * cs[c] * (1 + rng_uniform())));
    if (special) {
        for (int c = 0; c < cols; c++) x[c] = bf16_from_f32(c & 1 ? -0.0f : 0.0f);
        if (rows > 1)
            for (int c = 0; c < cols; c++) x[(size_t)cols + c] = bf16_from_f32((float)ldexp(rng_normal(), -135));
        if (rows > 2)
            for (int c = 0; c < cols; c++)
                x[(size_t)2 * cols + c] = bf16_from_f32((float)(c == cols / 2 ? 3.0 : ldexp(rng_normal(), -128)));
        const size_t n = x.size();
        x[(size_t)(rng_uniform() * n)] = bf16_from_f32(INFINITY);
        x[(size_t)(rng_uniform() * n)] = bf16_from_f32(-INFINITY);
        for (int i = 0; i < 3; i++) x[(size_t)(rng_uniform() * n)] = bf16_from_f32(NAN);
    }
    return x;
}
static Fv to_f(const Bf &b) {
    Fv f(b.size());
    for (size_t i = 0; i < b.size(); i++) f[i] = bf16_to_f32(b[i]);
    return f;
}
static Fv transpose(const Fv &a, int rows, int cols) {  // (cols, rows)
    Fv t(a.size());
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) t[(size_t)c * rows + r] = a[(size_t)r * cols + c];
    return t;
}

// --- 1. quantization ----------------------------------------------------------------------------

// Compares one GPU operand (codes and scales) with fp8_quantize on xf (rows, cols); appends what
// differs to msg (empty: identical).
static void compare_operand(char *msg, size_t cap, const Fp8Operand *op, const Fv &xf, int rows, int cols,
                            Fp8QuantStats *stats, const char *tag) {
    const Fp8Grouping g = op->grouping;
    std::vector<uint8_t> codes((size_t)rows * cols);
    Fv scales((size_t)fp8_group_count(g, rows, cols));
    fp8_quantize(NULL, codes.data(), scales.data(), xf.data(), rows, cols, g, op->fmt, stats);
    std::vector<uint8_t> gc = back(op->codes, codes.size());
    Fv gs_dev = back(op->scales, (size_t)fp8_gpu_scale_count(g, rows, cols)), gs(scales.size());
    fp8_scales_to_rowmajor(gs.data(), gs_dev.data(), g, rows, cols);
    long bad_codes = 0, first = -1, bad_scales = 0, first_s = -1, bad_pad = 0;
    for (size_t i = 0; i < codes.size(); i++)
        if (gc[i] != codes[i] && bad_codes++ == 0) first = (long)i;
    for (size_t i = 0; i < scales.size(); i++)
        if (memcmp(&gs[i], &scales[i], sizeof(float)) != 0 && bad_scales++ == 0) first_s = (long)i;
    if (g == FP8_GROUP_128x128) {  // padding of cuBLASLt's layout holds 1.0
        const int n_gr = (rows + 127) / 128, n_gc = (cols + 127) / 128, L = (n_gc + 3) & ~3;
        for (int i = 0; i < ((n_gr + 3) & ~3); i++)
            for (int j = 0; j < L; j++)
                if ((i >= n_gr || j >= n_gc) && gs_dev[(size_t)i * L + j] != 1.0f) bad_pad++;
    }
    if (g == FP8_GROUP_TENSOR) {  // the amax by-product
        float amax = 0.0f;
        for (float v : xf) amax = fmaxf(amax, fabsf(v));
        if (memcmp(&amax, &gs_dev[1], sizeof amax) != 0) bad_scales++;
    }
    size_t len = strlen(msg);
    if (bad_codes)
        len += snprintf(msg + len, cap - len, " %s: %ld codes differ (first at %ld: gpu 0x%02x cpu 0x%02x)", tag,
                        bad_codes, first, gc[first], codes[first]);
    if (bad_scales && len < cap)
        len += snprintf(msg + len, cap - len, " %s: %ld scales differ (first at %ld: gpu %g cpu %g)", tag, bad_scales,
                        first_s, first_s >= 0 ? gs[first_s] : 0.0f, first_s >= 0 ? scales[first_s] : 0.0f);
    if (bad_pad && len < cap) snprintf(msg + len, cap - len, " %s: %ld padding scales not 1.0", tag, bad_pad);
}

// qt's grouping gt is g's, or 128x128 with a 1x128 q: a wgrad operand in blocks
// (precision.linear_wgrad_blocks), which fp8_quantize_gpu makes in the same pass as Q(x).
static void test_quantize(int rows, int cols, Fp8Grouping g, Fp8Format fmt, int special, int misalign,
                          Fp8Grouping gt) {
    Bf x = random_bf(rows, cols, 6, special);
    Fv xf = to_f(x), xtf = transpose(xf, rows, cols);
    uint16_t *base = NULL;  // misalign: the input starts one element (2 bytes) into the buffer
    CU(cudaMalloc(&base, (x.size() + 8) * sizeof(uint16_t)));
    uint16_t *d_x = base + (misalign ? 1 : 0);
    CU(cudaMemcpy(d_x, x.data(), x.size() * sizeof(uint16_t), cudaMemcpyHostToDevice));
    Fp8Operand q, qt;
    fp8_operand_alloc(&q, rows, cols, g, fmt);
    fp8_operand_alloc(&qt, cols, rows, gt, fmt);
    unsigned long long *d_counts;
    CU(cudaMalloc(&d_counts, 2 * sizeof(unsigned long long)));
    static const char *variant_name[4] = {"", "Q(x)", "Q(x^T)", "Q(x)+Q(x^T)"};
    // per tensor also with the amax given (fp8_quantize_gpu_with_amax, as x's producer takes it):
    // the host's max |x| (NaN ignored), poisoned slots otherwise the same
    unsigned *d_amax = NULL;
    if (g == FP8_GROUP_TENSOR) {
        float amax = 0.0f;
        for (float f : xf) amax = fmaxf(amax, fabsf(f));
        CU(cudaMalloc(&d_amax, sizeof(unsigned)));
        CU(cudaMemcpy(d_amax, &amax, sizeof amax, cudaMemcpyHostToDevice));
    }
    for (int vr = 1; vr <= (d_amax ? 6 : 3); vr++) {
        const int v = (vr - 1) % 3 + 1, ready = vr > 3;
        CU(cudaMemset(q.codes, 0xAA, (size_t)rows * cols));  // poison
        CU(cudaMemset(qt.codes, 0xAA, (size_t)rows * cols));
        CU(cudaMemset(q.scales, 0xFF, sizeof(float) * fp8_gpu_scale_count(g, rows, cols)));
        CU(cudaMemset(qt.scales, 0xFF, sizeof(float) * fp8_gpu_scale_count(gt, cols, rows)));
        CU(cudaMemset(d_counts, 0, 2 * sizeof(unsigned long long)));
        if (ready)
            fp8_quantize_gpu_with_amax(v & 1 ? &q : NULL, v & 2 ? &qt : NULL, d_x, rows, cols, (const float *)d_amax, NULL,
                                       d_counts, 0);
        else fp8_quantize_gpu(v & 1 ? &q : NULL, v & 2 ? &qt : NULL, d_x, rows, cols, d_counts, 0);
        CU(cudaGetLastError());
        char msg[768] = "";
        Fp8QuantStats st = {0, 0, 0}, st_t = {0, 0, 0};
        if (v & 1) compare_operand(msg, sizeof msg, &q, xf, rows, cols, &st, "Q(x)");
        if (v & 2) compare_operand(msg, sizeof msg, &qt, xtf, cols, rows, &st_t, "Q(x^T)");
        const Fp8QuantStats &ref = v & 1 ? st : st_t;  // each element counted once per call
        std::vector<unsigned long long> cnt = back(d_counts, 2);
        if (cnt[0] != (unsigned long long)ref.saturated || cnt[1] != (unsigned long long)ref.nans) {
            size_t len = strlen(msg);
            snprintf(msg + len, sizeof msg - len, " counts: gpu %llu saturated %llu NaN, cpu %lld %lld", cnt[0], cnt[1],
                     ref.saturated, ref.nans);
        }
        char nm[160];
        snprintf(nm, sizeof nm, "quantize %s%s%s %s (%d, %d) %s%s%s%s", grouping_name(g), gt != g ? ", x^T " : "",
                 gt != g ? grouping_name(gt) : "", fmt_name(fmt), rows, cols, variant_name[v],
                 special ? " +inf/nan/zero/subnormal" : "", misalign ? " misaligned" : "",
                 ready ? ", amax given" : "");
        CHECK(msg[0] == 0, nm, "%s", msg);
    }
    fp8_operand_free(&q);
    fp8_operand_free(&qt);
    if (d_amax) CU(cudaFree(d_amax));
    CU(cudaFree(d_counts));
    CU(cudaFree(base));
}

// --- 2. GEMMs -----------------------------------------------------------------------------------

// rounded (may be NULL): the same output against the reference rounded to BF16 (information:
// what is left once the output's own rounding is taken out).
static void report(const Err &e, const Err *rounded, double tol, const char *what, const char *mode, int N, int M,
                   int K) {
    char nm[160];
    snprintf(nm, sizeof nm, "fp8 gemm %s %s N=%d M=%d K=%d", mode, what, N, M, K);
    CHECK(e.ok(tol), nm, "rel L2 %.3g (tol %.1g), max abs %.3g of max %.3g (bound 5 x tol), %ld non-finite", e.rel(),
          tol, e.maxabs, e.maxref, e.nonfinite);
    if (rounded) printf("#   %-72s rel L2 %.2e (vs bf16-rounded ref %.2e)\n", nm, e.rel(), rounded->rel());
    else printf("#   %-72s rel L2 %.2e\n", nm, e.rel());
}

// Runs out = lhs . rhs^T through fp8_gemm_gpu, turning "no algorithm" or a failed call into a
// FAIL line instead of ending the program; returns 1 when it ran. fast: fast accumulation.
static int run_gemm(const char *nm, void *out, int out_fp32, int acc, const Fp8Operand *lhs, const Fp8Operand *rhs,
                    int fast = 0) {
    const int sup = fp8_gemm_gpu_supported(out_fp32, fast, lhs, rhs);
    int st = -1;
    if (sup) {
        st = fp8_gemm_gpu(out, out_fp32, acc, fast, lhs, rhs, 0);
        CU(cudaDeviceSynchronize());
    }
    if (!sup || st != 0)
        CHECK(0, nm, "cuBLASLt: %s (groupings %s x %s, formats %s x %s, (%d, %d) . (%d, %d)^T)",
              sup ? "cublasLtMatmul failed" : "no algorithm", grouping_name(lhs->grouping), grouping_name(rhs->grouping),
              fmt_name(lhs->fmt), fmt_name(rhs->fmt), lhs->rows, lhs->cols, rhs->rows, rhs->cols);
    return sup && st == 0;
}

// y = x W^T with x (N, K), W (M, K), dy (N, M), in precision prec.
static void test_gemms(int N, int M, int K, LinearPrecision prec, GradFormat gf) {
    PrecisionConfig pc;
    memset(&pc, 0, sizeof pc);
    pc.linear = prec;
    pc.linear_grad_format = gf;
    LinearFp8 L;
    linear_fp8_init(&L, &pc);
    const Fp8Format dyf = L.grad_format;
    const Fp8Grouping ag = prec == LINEAR_FP8_TENSOR ? FP8_GROUP_TENSOR : FP8_GROUP_1x128;
    const Fp8Grouping wg = prec == LINEAR_FP8_TENSOR ? FP8_GROUP_TENSOR : FP8_GROUP_128x128;
    char mode[48];
    snprintf(mode, sizeof mode, "%s%s", prec == LINEAR_FP8_TENSOR ? "fp8_tensor" : "fp8_block",
             prec == LINEAR_FP8_TENSOR ? (dyf == FP8_E5M2 ? "/dy-e5m2" : "/dy-e4m3") : "");

    Bf x = random_bf(N, K, 3, 0), w = random_bf(M, K, 2, 0), dy = random_bf(N, M, 3, 0);
    Fv xf = to_f(x), wf = to_f(w), dyf32 = to_f(dy), dw0((size_t)M * K);
    for (auto &v : dw0) v = (float)rng_normal();
    uint16_t *d_x = dup(x), *d_w = dup(w), *d_dy = dup(dy);
    Fp8Operand qx, qxt, qw, qwt, qdy, qdyt;
    fp8_operand_alloc(&qx, N, K, ag, FP8_E4M3);
    fp8_operand_alloc(&qxt, K, N, ag, FP8_E4M3);
    fp8_operand_alloc(&qw, M, K, wg, FP8_E4M3);
    fp8_operand_alloc(&qwt, K, M, wg, FP8_E4M3);
    fp8_operand_alloc(&qdy, N, M, ag, dyf);
    fp8_operand_alloc(&qdyt, M, N, ag, dyf);
    fp8_quantize_gpu(&qx, &qxt, d_x, N, K, NULL, 0);
    fp8_quantize_gpu(&qw, &qwt, d_w, M, K, NULL, 0);
    fp8_quantize_gpu(&qdy, &qdyt, d_dy, N, M, NULL, 0);
    CU(cudaDeviceSynchronize());

    uint16_t *d_y, *d_dx;
    float *d_dw;
    CU(cudaMalloc(&d_y, (size_t)N * M * 2));
    CU(cudaMalloc(&d_dx, (size_t)N * K * 2));
    CU(cudaMalloc(&d_dw, (size_t)M * K * 4));
    CU(cudaMemset(d_y, 0xFF, (size_t)N * M * 2));  // NaN poison
    CU(cudaMemset(d_dx, 0xFF, (size_t)N * K * 2));
    CU(cudaMemset(d_dw, 0xFF, (size_t)M * K * 4));
    char nm[160];

    Fv ref((size_t)N * M);
    // a BF16 GEMM output against the CPU emulation's FP32 result, and against that rounded to BF16
    auto check_bf16_out = [&](const uint16_t *d_out, const char *what) {
        Bf got = back(d_out, ref.size());
        Err e, er;
        for (size_t i = 0; i < got.size(); i++) {
            e.add(bf16_to_f32(got[i]), ref[i]);
            er.add(bf16_to_f32(got[i]), bf16_round(ref[i]));
        }
        report(e, &er, 3e-3, what, mode, N, M, K);
    };
    linear_forward(&L, prec, ref.data(), xf.data(), wf.data(), N, M, K, 0);
    snprintf(nm, sizeof nm, "fp8 gemm %s forward runs N=%d M=%d K=%d", mode, N, M, K);
    if (run_gemm(nm, d_y, 0, 0, &qx, &qw)) check_bf16_out(d_y, "forward (bf16 out)");
    if (prec == LINEAR_FP8_TENSOR) {  // precision.linear_fast_accum: the tensor cores' accumulator throughout
        Bf promoted = back(d_y, ref.size());
        snprintf(nm, sizeof nm, "fp8 gemm %s forward fast accumulation runs N=%d M=%d K=%d", mode, N, M, K);
        if (run_gemm(nm, d_y, 0, 0, &qx, &qw, 1)) {
            Bf got = back(d_y, ref.size());
            Err e;
            for (size_t i = 0; i < got.size(); i++) e.add(bf16_to_f32(got[i]), ref[i]);
            report(e, NULL, 1e-2, "forward, fast accumulation", mode, N, M, K);
            long differ = 0;
            for (size_t i = 0; i < got.size(); i++) differ += got[i] != promoted[i];
            printf("#   fast accumulation: %ld of %zu outputs differ from the promoted GEMM's (K %d)\n", differ,
                   got.size(), K);
        }
    }
    ref.assign((size_t)N * K, 0.0f);
    linear_dgrad(&L, prec, ref.data(), dyf32.data(), wf.data(), N, M, K, 0);
    snprintf(nm, sizeof nm, "fp8 gemm %s dgrad runs N=%d M=%d K=%d", mode, N, M, K);
    if (run_gemm(nm, d_dx, 0, 0, &qdy, &qwt)) check_bf16_out(d_dx, "dgrad (bf16 out)");
    ref.assign((size_t)M * K, 0.0f);
    linear_wgrad(&L, prec, ref.data(), dyf32.data(), xf.data(), N, M, K, 0);
    snprintf(nm, sizeof nm, "fp8 gemm %s wgrad runs N=%d M=%d K=%d", mode, N, M, K);
    if (run_gemm(nm, d_dw, 1, 0, &qdyt, &qxt)) {  // overwrite the poison
        Fv dw = back(d_dw, (size_t)M * K);
        Err e;
        for (size_t i = 0; i < dw.size(); i++) e.add(dw[i], ref[i]);
        report(e, NULL, 1e-3, "wgrad (fp32 out)", mode, N, M, K);
        CU(cudaMemcpy(d_dw, dw0.data(), dw0.size() * 4, cudaMemcpyHostToDevice));
        const int plans = linear_fp8_gpu_plan_count();
        run_gemm(nm, d_dw, 1, 1, &qdyt, &qxt);
        run_gemm(nm, d_dw, 1, 1, &qdyt, &qxt);
        dw = back(d_dw, (size_t)M * K);
        Err e2;
        for (size_t i = 0; i < dw.size(); i++) e2.add(dw[i] - dw0[i], 2.0 * ref[i]);  // dw0 + 2 dy^T x
        report(e2, NULL, 1e-3, "wgrad accumulated twice", mode, N, M, K);
        snprintf(nm, sizeof nm, "fp8 gemm %s plan cached N=%d M=%d K=%d", mode, N, M, K);
        CHECK(linear_fp8_gpu_plan_count() == plans, nm, "plans %d -> %d for a repeated shape", plans,
              linear_fp8_gpu_plan_count());
    }
    fp8_operand_free(&qx); fp8_operand_free(&qxt); fp8_operand_free(&qw);
    fp8_operand_free(&qwt); fp8_operand_free(&qdy); fp8_operand_free(&qdyt);
    CU(cudaFree(d_x)); CU(cudaFree(d_w)); CU(cudaFree(d_dy));
    CU(cudaFree(d_y)); CU(cudaFree(d_dx)); CU(cudaFree(d_dw));
    linear_fp8_free(&L);
}

// --- 3. timing ----------------------------------------------------------------------------------

// Milliseconds per call of what() over 10 timed calls after 3 warm-up calls.
template <class F> static float time_ms(F what) { return (float)gpu_time_ms(what, 3, 10); }

static void timing(int n) {
    const size_t nn = (size_t)n * n;
    const double flop = 2.0 * n * (double)n * n;
    uint16_t *x, *w, *dy, *y;
    float *dw;
    CU(cudaMalloc(&x, nn * 2));
    CU(cudaMalloc(&w, nn * 2));
    CU(cudaMalloc(&dy, nn * 2));
    CU(cudaMalloc(&y, nn * 2));
    CU(cudaMalloc(&dw, nn * 4));
    CU(cudaMemset(dw, 0, nn * 4));
    gpu_test_fill_bf16(x, nn, 1, 2.0f);  // [-2, 2)
    gpu_test_fill_bf16(w, nn, 2, 2.0f);
    gpu_test_fill_bf16(dy, nn, 3, 2.0f);
    float ms = time_ms([&] { matmul_forward_gpu(y, x, w, n, n, n, 0, 0); });
    printf("# timing bf16        forward %d^3  %8.3f ms  %6.0f TFLOP/s\n", n, ms, flop / (ms * 1e-3) / 1e12);
    ms = time_ms([&] { matmul_wgrad_gpu(dw, dy, x, n, n, n, 0); });
    printf("# timing bf16        wgrad   %d^3  %8.3f ms  %6.0f TFLOP/s (fp32 +=)\n", n, ms, flop / (ms * 1e-3) / 1e12);

    for (int mode = 0; mode < 3; mode++) {  // fp8_tensor/dy-e4m3, fp8_tensor/dy-e5m2, fp8_block
        const char *name = mode == 0 ? "fp8_tensor" : mode == 1 ? "fp8_tensor/e5m2" : "fp8_block";
        const Fp8Grouping ag = mode < 2 ? FP8_GROUP_TENSOR : FP8_GROUP_1x128;
        const Fp8Grouping wg = mode < 2 ? FP8_GROUP_TENSOR : FP8_GROUP_128x128;
        const Fp8Format dyf = mode == 1 ? FP8_E5M2 : FP8_E4M3;
        Fp8Operand qx, qxt, qw, qwt, qdy, qdyt;
        fp8_operand_alloc(&qx, n, n, ag, FP8_E4M3);
        fp8_operand_alloc(&qxt, n, n, ag, FP8_E4M3);
        fp8_operand_alloc(&qw, n, n, wg, FP8_E4M3);
        fp8_operand_alloc(&qwt, n, n, wg, FP8_E4M3);
        fp8_operand_alloc(&qdy, n, n, ag, dyf);
        fp8_operand_alloc(&qdyt, n, n, ag, dyf);
        if (mode != 1) {  // quantization throughput (bytes: 2 read + 1 written per element and output)
            const double gb1 = 3.0 * nn / 1e9, gb2 = 4.0 * nn / 1e9;
            float t1 = time_ms([&] { fp8_quantize_gpu(&qx, NULL, x, n, n, NULL, 0); });
            float t2 = time_ms([&] { fp8_quantize_gpu(NULL, &qxt, x, n, n, NULL, 0); });
            float t3 = time_ms([&] { fp8_quantize_gpu(&qw, &qwt, w, n, n, NULL, 0); });
            printf("# timing quantize %-10s %dx%d act Q(x) %.3f ms (%.0f GB/s), act Q(x^T) %.3f ms (%.0f GB/s), "
                   "weight Q(W)+Q(W^T) %.3f ms (%.0f GB/s)\n",
                   name, n, n, t1, gb1 / (t1 * 1e-3), t2, gb1 / (t2 * 1e-3), t3, gb2 / (t3 * 1e-3));
        }
        fp8_quantize_gpu(&qx, &qxt, x, n, n, NULL, 0);
        fp8_quantize_gpu(&qw, &qwt, w, n, n, NULL, 0);
        fp8_quantize_gpu(&qdy, &qdyt, dy, n, n, NULL, 0);
        CU(cudaDeviceSynchronize());
        const char *kinds[3] = {"forward", "dgrad  ", "wgrad  "};
        const Fp8Operand *lhs[3] = {&qx, &qdy, &qdyt}, *rhs[3] = {&qw, &qwt, &qxt};
        for (int k = 0; k < 3; k++) {
            void *out = k == 2 ? (void *)dw : (void *)y;
            if (!fp8_gemm_gpu_supported(k == 2, 0, lhs[k], rhs[k])) {
                printf("# timing %-15s %s %d^3  no cuBLASLt algorithm\n", name, kinds[k], n);
                continue;
            }
            int st = 0;
            ms = time_ms([&] { st |= fp8_gemm_gpu(out, k == 2, k == 2, 0, lhs[k], rhs[k], 0); });
            printf("# timing %-15s %s %d^3  %8.3f ms  %6.0f TFLOP/s%s\n", name, kinds[k], n, ms,
                   flop / (ms * 1e-3) / 1e12, st ? "  (cublasLtMatmul FAILED)" : "");
        }
        fp8_operand_free(&qx); fp8_operand_free(&qxt); fp8_operand_free(&qw);
        fp8_operand_free(&qwt); fp8_operand_free(&qdy); fp8_operand_free(&qdyt);
    }
    CU(cudaFree(x)); CU(cudaFree(w)); CU(cudaFree(dy)); CU(cudaFree(y)); CU(cudaFree(dw));
}

int main(void) {
    if (!gpu_test_have_gpu("test_linear_fp8_gpu")) return 0;
    rng_state = 0xF8F8A11Eull;
    linear_fp8_gpu_init();
    matmul_gpu_init();

    // shape, special values, misaligned input
    const int qshapes[][4] = {{37, 45, 1, 0},  {128, 256, 0, 0}, {128, 256, 0, 1}, {300, 200, 1, 0},
                              {1, 130, 0, 0},  {257, 129, 1, 0}, {512, 384, 0, 0}, {64, 1000, 0, 0}};
    const Fp8Grouping groupings[3] = {FP8_GROUP_TENSOR, FP8_GROUP_1x128, FP8_GROUP_128x128};
    for (const auto &s : qshapes)
        for (Fp8Grouping g : groupings)
            for (int f = 0; f < 2; f++) test_quantize(s[0], s[1], g, (Fp8Format)f, s[2], s[3], g);
    for (const auto &s : qshapes)  // 1x128 Q(x) with 128x128 Q(x^T)
        for (int f = 0; f < 2; f++) test_quantize(s[0], s[1], FP8_GROUP_1x128, (Fp8Format)f, s[2], s[3], FP8_GROUP_128x128);

    // FP8_TEST_QUANT_ONLY=1: only the quantization (for compute-sanitizer runs)
    const char *qo = getenv("FP8_TEST_QUANT_ONLY");
    if (qo && qo[0] == '1') {
        linear_fp8_gpu_shutdown();
        matmul_gpu_shutdown();
        return test_summary("test_linear_fp8_gpu");
    }

    // (N tokens, M outputs, K inputs): multiples of 128; of 16 only (partial groups everywhere)
    const int gshapes[][3] = {{256, 384, 512}, {272, 400, 208}, {1024, 768, 1536}, {64, 48, 32}};
    for (const auto &s : gshapes) {
        test_gemms(s[0], s[1], s[2], LINEAR_FP8_TENSOR, GRADFMT_E4M3);
        test_gemms(s[0], s[1], s[2], LINEAR_FP8_TENSOR, GRADFMT_E5M2);
        test_gemms(s[0], s[1], s[2], LINEAR_FP8_BLOCK, GRADFMT_E4M3);
    }

    timing(8192);
    linear_fp8_gpu_shutdown();
    matmul_gpu_shutdown();
    CU(cudaGetLastError());
    return test_summary("test_linear_fp8_gpu");
}
