// test_linear_fp8.c: the FP8 operand quantization of linear_fp8.c against an independent
// double-precision reference (its own scale search and its own round-to-nearest-even on the FP8
// grid; fp8.h only decodes the codes under test), on fresh seeded matrices whose magnitudes vary
// by row, column and group; then the three GEMMs of a linear layer in both FP8 modes against
// reference products on operands quantized by the contract's groupings.
#include <math.h>    // frexp, ldexp, nearbyint, fabs, INFINITY, NAN
#include <stdint.h>  // uint8_t
#include <stdlib.h>  // malloc, free
#include <string.h>  // memcpy

#include "core/fp8.h"        // fp8_to_f32 (decoding the codes under test), FP8 maxima
#include "core/config.h"     // linear_precision_name
#include "cpu/linear_fp8.h"  // fp8_quantize, linear_*
#include "cpu/matmul_cpu.h"  // the FP32 products the BF16 path must equal
#include "test.h"            // CHECK

static unsigned long long rng = 0x243F6A8885A308D3ull;
static double urand(void) {
    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(rng >> 11) * 0x1p-53;
}
static double nrand(void) {  // roughly normal: sum of uniforms
    double s = 0;
    for (int i = 0; i < 4; i++) s += urand();
    return (s - 2.0) * 1.7;
}

// A (rows, cols) matrix whose magnitudes vary by 2^[-e, e] per row and per column (like tokens
// and channels with outliers), so that different groupings give different scales.
static float *random_matrix(int rows, int cols, int e) {
    float *x = malloc(sizeof(float) * (size_t)rows * cols);
    double *rs = malloc(sizeof(double) * rows), *cs = malloc(sizeof(double) * cols);
    for (int r = 0; r < rows; r++) rs[r] = ldexp(1.0, (int)(urand() * (2 * e + 1)) - e);
    for (int c = 0; c < cols; c++) cs[c] = ldexp(1.0, (int)(urand() * (2 * e + 1)) - e);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) x[(long)r * cols + c] = (float)(nrand() * rs[r] * cs[c] * (1 + urand()));
    free(rs);
    free(cs);
    return x;
}

// --- the reference ------------------------------------------------------------------------------
typedef struct {
    int mbits, emin;  // mantissa bits, exponent of the smallest normal
    double fmax;
} RefFmt;
static RefFmt ref_fmt(Fp8Format f) {
    RefFmt r = {3, -6, 448.0};
    if (f == FP8_E5M2) r = (RefFmt){2, -14, 57344.0};
    return r;
}

// Nearest FP8 value (ties to even), saturating at fmax.
static double ref_round(double v, RefFmt f) {
    if (v == 0 || v != v) return v;
    double a = fabs(v);
    int e;
    frexp(a, &e);  // a in [2^(e-1), 2^e)
    e -= 1;
    if (e < f.emin) e = f.emin;  // subnormals share the smallest normal's quantum
    double quantum = ldexp(1.0, e - f.mbits);
    double r = nearbyint(a / quantum) * quantum;  // a / quantum is exact; default mode is RNE
    if (r > f.fmax) r = f.fmax;
    return v < 0 ? -r : r;
}

// The largest power of two s with amax * s <= fmax (exponent clamped to [-126, 126]); 1 for 0/inf.
static double ref_scale(double amax, RefFmt f) {
    if (amax == 0 || isinf(amax)) return 1.0;
    int k = 0;
    while (ldexp(amax, k) > f.fmax) k--;
    while (ldexp(amax, k + 1) <= f.fmax) k++;
    if (k > 126) k = 126;
    if (k < -126) k = -126;
    return ldexp(1.0, k);
}

// Reference quantize-dequantize of x (rows, cols) in groups of gr x gc (gr = rows and gc = cols
// for a tensor scale). out gets the dequantized values, scales the group scales row-major.
static void ref_quantize(double *out, double *scales, const float *x, int rows, int cols, int gr, int gc,
                         Fp8Format fmt) {
    RefFmt f = ref_fmt(fmt);
    int n_gc = (cols + gc - 1) / gc;
    for (int r0 = 0; r0 < rows; r0 += gr)
        for (int c0 = 0; c0 < cols; c0 += gc) {
            double amax = 0;
            for (int r = r0; r < r0 + gr && r < rows; r++)
                for (int c = c0; c < c0 + gc && c < cols; c++) {
                    double a = fabs((double)x[(long)r * cols + c]);
                    if (a > amax) amax = a;  // NaN compares false: ignored
                }
            double s = ref_scale(amax, f);
            if (scales) scales[(r0 / gr) * n_gc + c0 / gc] = s;
            for (int r = r0; r < r0 + gr && r < rows; r++)
                for (int c = c0; c < c0 + gc && c < cols; c++)
                    out[(long)r * cols + c] = ref_round((double)x[(long)r * cols + c] * s, f) / s;
        }
}

static void group_shape(Fp8Grouping g, int rows, int cols, int *gr, int *gc) {
    *gr = g == FP8_GROUP_TENSOR ? rows : g == FP8_GROUP_1x128 ? 1 : 128;
    *gc = g == FP8_GROUP_TENSOR ? cols : 128;
}

static const char *grouping_name(Fp8Grouping g) {
    return g == FP8_GROUP_TENSOR ? "tensor" : g == FP8_GROUP_1x128 ? "1x128" : "128x128";
}
static const char *fmt_name(Fp8Format f) { return f == FP8_E4M3 ? "e4m3" : "e5m2"; }

// --- quantization against the reference --------------------------------------------------------
static void test_quantize(Fp8Grouping g, Fp8Format fmt, int rows, int cols) {
    float *x = random_matrix(rows, cols, 12);
    size_t n = (size_t)rows * cols;
    long ng = fp8_group_count(g, rows, cols);
    float *out = malloc(sizeof(float) * n), *scales = malloc(sizeof(float) * ng);
    uint8_t *codes = malloc(n);
    double *ref = malloc(sizeof(double) * n), *ref_s = malloc(sizeof(double) * ng);
    Fp8QuantStats st = {0, 0, 0};
    fp8_quantize(out, codes, scales, x, rows, cols, g, fmt, &st);
    int gr, gc;
    group_shape(g, rows, cols, &gr, &gc);
    ref_quantize(ref, ref_s, x, rows, cols, gr, gc, fmt);
    long expected_groups = (long)((rows + gr - 1) / gr) * ((cols + gc - 1) / gc);

    size_t bad_val = 0, bad_exact = 0, first_bad = 0;
    for (size_t i = 0; i < n; i++) {
        if ((double)out[i] != ref[i]) {
            if (!bad_val) first_bad = i;
            bad_val++;
        }
    }
    // Every value is exactly code / s, with s its group's scale.
    int n_gc = (cols + gc - 1) / gc;
    long bad_scale = 0, not_pow2 = 0, bad_range = 0;
    for (long k = 0; k < ng; k++) {
        int e;
        if (frexp(scales[k], &e) != 0.5) not_pow2++;
        if ((double)scales[k] != ref_s[k]) bad_scale++;
    }
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            size_t i = (size_t)r * cols + c;
            double s = scales[(r / gr) * n_gc + c / gc];
            if ((double)out[i] * s != (double)fp8_to_f32(fmt, codes[i])) bad_exact++;
        }
    // The group maximum lands in (FMAX/2, FMAX] after scaling: the scale uses the range fully.
    double fp8max = fp8_max(fmt);
    for (int r0 = 0; r0 < rows; r0 += gr)
        for (int c0 = 0; c0 < cols; c0 += gc) {
            double amax = 0;
            for (int r = r0; r < r0 + gr && r < rows; r++)
                for (int c = c0; c < c0 + gc && c < cols; c++) amax = fmax(amax, fabs(x[(long)r * cols + c]));
            double v = amax * scales[(r0 / gr) * n_gc + c0 / gc];
            if (!(v <= fp8max && v > fp8max / 2)) bad_range++;
        }
    char name[160];
    snprintf(name, sizeof name, "quantize %s %s (%d x %d): values equal the double reference", grouping_name(g),
             fmt_name(fmt), rows, cols);
    CHECK(bad_val == 0, name, "%zu of %zu differ; first [%zu]: %.9g vs reference %.9g (x %.9g)", bad_val, n,
          first_bad, (double)out[first_bad], ref[first_bad], (double)x[first_bad]);
    snprintf(name, sizeof name, "quantize %s %s (%d x %d): %ld scales, powers of two equal to the reference",
             grouping_name(g), fmt_name(fmt), rows, cols, ng);
    CHECK(ng == expected_groups && not_pow2 == 0 && bad_scale == 0, name,
          "count %ld (expected %ld), %ld not powers of two, %ld differ from the reference", ng, expected_groups,
          not_pow2, bad_scale);
    snprintf(name, sizeof name, "quantize %s %s: every value is exactly decode(code) / s", grouping_name(g),
             fmt_name(fmt));
    CHECK(bad_exact == 0, name, "%ld of %zu", (long)bad_exact, n);
    snprintf(name, sizeof name, "quantize %s %s: each group's amax scales into (FMAX/2, FMAX]", grouping_name(g),
             fmt_name(fmt));
    CHECK(bad_range == 0, name, "%ld groups outside", bad_range);
    snprintf(name, sizeof name, "quantize %s %s: stats count every cast, no saturation", grouping_name(g),
             fmt_name(fmt));
    CHECK(st.casts == (long long)n && st.saturated == 0 && st.nans == 0, name, "casts %lld sat %lld nan %lld",
          st.casts, st.saturated, st.nans);
    // Without out/codes/scales and in place, the same values.
    float *inplace = malloc(sizeof(float) * n);
    memcpy(inplace, x, sizeof(float) * n);
    fp8_quantize(inplace, NULL, NULL, inplace, rows, cols, g, fmt, NULL);
    snprintf(name, sizeof name, "quantize %s %s: in place gives the same values", grouping_name(g), fmt_name(fmt));
    CHECK(memcmp(inplace, out, sizeof(float) * n) == 0, name, "differs");
    free(inplace);
    free(x), free(out), free(scales), free(codes), free(ref), free(ref_s);
}

// An outlier changes the scale of exactly the group that holds it (group boundaries).
static void test_boundaries(void) {
    int rows = 200, cols = 300;
    float *x = random_matrix(rows, cols, 0);
    size_t n = (size_t)rows * cols;
    float *out = malloc(sizeof(float) * n);
    static float s0[1024], s1[1024];
    struct { Fp8Grouping g; int r, c, gi; } cases[] = {
        {FP8_GROUP_1x128, 5, 255, 5 * 3 + 1},   // last element of slice 1
        {FP8_GROUP_1x128, 5, 256, 5 * 3 + 2},   // first element of the partial slice 2 (44 wide)
        {FP8_GROUP_128x128, 127, 128, 0 * 3 + 1},
        {FP8_GROUP_128x128, 128, 127, 1 * 3 + 0},
        {FP8_GROUP_128x128, 199, 299, 1 * 3 + 2},  // the partial corner block (72 x 44)
    };
    for (size_t k = 0; k < sizeof cases / sizeof cases[0]; k++) {
        long ng = fp8_group_count(cases[k].g, rows, cols);
        fp8_quantize(out, NULL, s0, x, rows, cols, cases[k].g, FP8_E4M3, NULL);
        float keep = x[(long)cases[k].r * cols + cases[k].c];
        x[(long)cases[k].r * cols + cases[k].c] = 5000.0f;
        fp8_quantize(out, NULL, s1, x, rows, cols, cases[k].g, FP8_E4M3, NULL);
        x[(long)cases[k].r * cols + cases[k].c] = keep;
        long changed = 0, which = -1;
        for (long i = 0; i < ng; i++)
            if (s0[i] != s1[i]) changed++, which = i;
        char name[160];
        snprintf(name, sizeof name, "boundaries %s: an outlier at (%d, %d) rescales only group %d",
                 grouping_name(cases[k].g), cases[k].r, cases[k].c, cases[k].gi);
        CHECK(changed == 1 && which == cases[k].gi && s1[which] == 0.0625f, name,
              "%ld groups changed, last %ld (scale %g)", changed, which, which >= 0 ? (double)s1[which] : 0.0);
    }
    free(x), free(out);
}

// Non-finite inputs: +-inf saturate (and take their group's scale to 1, so big finite values
// saturate with them), NaN becomes the NaN code; all are counted. Tiny and zero groups.
static void test_special(void) {
    float x[2 * 130];
    for (int i = 0; i < 260; i++) x[i] = (float)(nrand() * 0.01);
    x[3] = INFINITY;
    x[4] = -1000.0f;  // finite, beyond 448 at s = 1: saturates
    x[5] = NAN;
    x[130 + 7] = -INFINITY;
    float out[260], scales[4];
    uint8_t codes[260];
    Fp8QuantStats st = {0, 0, 0};
    fp8_quantize(out, codes, scales, x, 2, 130, FP8_GROUP_1x128, FP8_E4M3, &st);
    CHECK(st.saturated == 3 && st.nans == 1 && st.casts == 260, "special: saturated and NaN inputs counted",
          "saturated %lld (expected 3), nans %lld (expected 1), casts %lld", st.saturated, st.nans, st.casts);
    CHECK(codes[3] == 0x7E && codes[4] == 0xFE && codes[5] == 0x7F && codes[130 + 7] == 0xFE && out[3] == 448.0f &&
              scales[0] == 1.0f && scales[2] == 1.0f,
          "special: inf saturates to +-448 with scale 1, NaN -> 0x7F", "codes %02x %02x %02x %02x out %g scales %g %g",
          codes[3], codes[4], codes[5], codes[130 + 7], (double)out[3], (double)scales[0], (double)scales[2]);
    CHECK(scales[1] > 1.0f && scales[3] > 1.0f, "special: the other slices keep their own scales",
          "scales %g %g", (double)scales[1], (double)scales[3]);
    st = (Fp8QuantStats){0, 0, 0};
    fp8_quantize(out, codes, scales, x, 2, 130, FP8_GROUP_TENSOR, FP8_E5M2, &st);
    CHECK(st.saturated == 2 && codes[3] == 0x7B && codes[130 + 7] == 0xFB && out[4] == -1024.0f,
          "special: E5M2 saturates inf to +-57344, keeps -1000 (as -1024)", "saturated %lld codes %02x %02x out %g",
          st.saturated, codes[3], codes[130 + 7], (double)out[4]);
    float z[300] = {0}, zs[3];
    z[290] = 1e-37f;  // tiny (< 2^-118): the scale clamps at 2^126 and the value still quantizes
    fp8_quantize(z, NULL, zs, z, 1, 300, FP8_GROUP_1x128, FP8_E4M3, NULL);
    CHECK(zs[0] == 1.0f && zs[1] == 1.0f && zs[2] == 0x1p126f && z[0] == 0.0f &&
              fabs(z[290] - 1e-37) < 0.07e-37,
          "special: zero groups get scale 1, a tiny amax clamps at 2^126", "scales %g %g %g, value %g", (double)zs[0],
          (double)zs[1], (double)zs[2], (double)z[290]);
}

// --- the three GEMMs -----------------------------------------------------------------------------
static double *transpose_d(const double *a, int rows, int cols) {
    double *t = malloc(sizeof(double) * (size_t)rows * cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) t[(long)c * rows + r] = a[(long)r * cols + c];
    return t;
}
static float *transpose_f(const float *a, int rows, int cols) {
    float *t = malloc(sizeof(float) * (size_t)rows * cols);
    for (int r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) t[(long)c * rows + r] = a[(long)r * cols + c];
    return t;
}

// max over outputs of |got - ref| / sum |terms|, with ref[i][j] = sum_k a[i][k] b[j][k].
static double gemm_err(const float *got, const double *a, const double *b, int I, int J, int K) {
    double worst = 0;
    for (int i = 0; i < I; i++)
        for (int j = 0; j < J; j++) {
            double s = 0, mag = 1e-30;
            for (int k = 0; k < K; k++) {
                double p = a[(long)i * K + k] * b[(long)j * K + k];
                s += p;
                mag += fabs(p);
            }
            double e = fabs(got[(long)i * J + j] - s) / mag;
            if (e > worst) worst = e;
        }
    return worst;
}

static void test_gemms(LinearPrecision prec, Fp8Format grad_fmt) {
    int N = 150, M = 200, K = 300;  // none a multiple of 128
    float *x = random_matrix(N, K, 6), *w = random_matrix(M, K, 3), *dy = random_matrix(N, M, 6);
    PrecisionConfig pc = {0};
    pc.linear = prec;
    pc.linear_grad_format = grad_fmt == FP8_E5M2 ? GRADFMT_E5M2 : GRADFMT_E4M3;
    LinearFp8 L;
    linear_fp8_init(&L, &pc);
    Fp8Format gf = prec == LINEAR_FP8_TENSOR ? grad_fmt : FP8_E4M3;
    int blk = prec == LINEAR_FP8_BLOCK;
    // Reference operands, each quantized in the layout that enters its GEMM (contract).
    double *xq = malloc(sizeof(double) * N * K), *wq = malloc(sizeof(double) * M * K);
    double *dyq = malloc(sizeof(double) * N * M), *wtq = malloc(sizeof(double) * M * K);
    double *dytq = malloc(sizeof(double) * N * M), *xtq = malloc(sizeof(double) * N * K);
    float *wt = transpose_f(w, M, K), *dyt = transpose_f(dy, N, M), *xt = transpose_f(x, N, K);
    ref_quantize(xq, NULL, x, N, K, blk ? 1 : N, blk ? 128 : K, FP8_E4M3);        // (N, K) along K
    ref_quantize(wq, NULL, w, M, K, blk ? 128 : M, blk ? 128 : K, FP8_E4M3);      // (M, K) blocks
    ref_quantize(dyq, NULL, dy, N, M, blk ? 1 : N, blk ? 128 : M, gf);            // (N, M) along M
    ref_quantize(wtq, NULL, wt, K, M, blk ? 128 : K, blk ? 128 : M, FP8_E4M3);    // (K, M) blocks of W^T
    ref_quantize(dytq, NULL, dyt, M, N, blk ? 1 : M, blk ? 128 : N, gf);          // (M, N) along tokens
    ref_quantize(xtq, NULL, xt, K, N, blk ? 1 : K, blk ? 128 : N, FP8_E4M3);      // (K, N) along tokens
    double *dyq_t = transpose_d(dyq, N, M);  // (M, N)

    float *y = malloc(sizeof(float) * N * M), *dx = malloc(sizeof(float) * N * K), *dw = malloc(sizeof(float) * M * K);
    linear_forward(&L, prec, y, x, w, N, M, K, 0);
    linear_dgrad(&L, prec, dx, dy, w, N, M, K, 0);
    for (long i = 0; i < (long)M * K; i++) dw[i] = 0.0f;
    linear_wgrad(&L, prec, dw, dy, x, N, M, K, 1);
    double e_fwd = gemm_err(y, xq, wq, N, M, K);
    double e_dgrad = gemm_err(dx, dyq, wtq, N, K, M);
    double e_wgrad = gemm_err(dw, dytq, xtq, M, K, N);
    // The wgrad groups matter: with the dgrad's quantization of dy (along M) the result differs.
    double e_wrong = gemm_err(dw, dyq_t, xtq, M, K, N);
    const char *pn = linear_precision_name(prec);
    char name[160];
    snprintf(name, sizeof name, "gemm %s (grad %s): forward = x_q W_q^T (rel err %.1e)", pn, fmt_name(gf), e_fwd);
    CHECK(e_fwd < 1e-6, name, "%.3g", e_fwd);
    snprintf(name, sizeof name, "gemm %s (grad %s): dgrad = dy_q (W^T)_q (rel err %.1e)", pn, fmt_name(gf), e_dgrad);
    CHECK(e_dgrad < 1e-6, name, "%.3g", e_dgrad);
    snprintf(name, sizeof name, "gemm %s (grad %s): wgrad = (dy^T)_q (x^T)_q^T (rel err %.1e)", pn, fmt_name(gf),
             e_wgrad);
    CHECK(e_wgrad < 1e-6, name, "%.3g", e_wgrad);
    if (blk) {
        snprintf(name, sizeof name, "gemm %s: wgrad slices run along tokens, not along M (err vs that %.1e)", pn,
                 e_wrong);
        CHECK(e_wrong > 1e-4, name, "%.3g", e_wrong);
    }
    // Against the unquantized product: FP8-sized errors, not more.
    double *xd = malloc(sizeof(double) * N * K), *wd = malloc(sizeof(double) * M * K);
    for (long i = 0; i < (long)N * K; i++) xd[i] = x[i];
    for (long i = 0; i < (long)M * K; i++) wd[i] = w[i];
    double e_exact = gemm_err(y, xd, wd, N, M, K);
    snprintf(name, sizeof name, "gemm %s: forward within FP8 error of the exact product (%.1e)", pn, e_exact);
    CHECK(e_exact > 1e-4 && e_exact < 0.15, name, "%.3g", e_exact);
    CHECK(L.gemms == 3 && L.stats[LINEAR_X].casts == 2LL * N * K && L.stats[LINEAR_W].casts == 2LL * M * K &&
              L.stats[LINEAR_DY].casts == 2LL * N * M,
          "gemm: counters of GEMMs and casts per operand", "gemms %lld casts x %lld w %lld dy %lld", L.gemms,
          L.stats[LINEAR_X].casts, L.stats[LINEAR_W].casts, L.stats[LINEAR_DY].casts);
    free(xd), free(wd);
    free(x), free(w), free(dy), free(xq), free(wq), free(dyq), free(wtq), free(dytq), free(xtq), free(wt), free(dyt);
    free(xt), free(dyq_t), free(y), free(dx), free(dw);
    linear_fp8_free(&L);
}

// fp8_block with precision.linear_wgrad_blocks: the named wgrad operand in 128x128 blocks (of dy^T
// (M, N) or x^T (K, N)), the other in 1x128 slices along the tokens; forward and dgrad unchanged.
static void test_wgrad_blocks(WgradBlocks b) {
    int N = 300, M = 200, K = 150;  // none a multiple of 128: partial blocks at every edge
    float *x = random_matrix(N, K, 6), *dy = random_matrix(N, M, 6);
    PrecisionConfig pc = {0};
    pc.linear = LINEAR_FP8_BLOCK;
    pc.linear_wgrad_blocks = b;
    LinearFp8 L;
    linear_fp8_init(&L, &pc);
    Fp8Grouping gd, gx;
    linear_wgrad_groupings(LINEAR_FP8_BLOCK, b, &gd, &gx);
    const int dy_blk = b == WGRAD_BLOCKS_GRADIENT, x_blk = b == WGRAD_BLOCKS_ACTIVATION;
    char name[160];
    snprintf(name, sizeof name, "wgrad_blocks %d: groupings dy^T %d, x^T %d", (int)b, (int)gd, (int)gx);
    CHECK(L.wgrad_dyt == gd && L.wgrad_xt == gx && gd == (dy_blk ? FP8_GROUP_128x128 : FP8_GROUP_1x128) &&
              gx == (x_blk ? FP8_GROUP_128x128 : FP8_GROUP_1x128),
          name, "L %d %d", (int)L.wgrad_dyt, (int)L.wgrad_xt);
    float *dyt = transpose_f(dy, N, M), *xt = transpose_f(x, N, K);
    double *dytq = malloc(sizeof(double) * N * M), *xtq = malloc(sizeof(double) * N * K);
    double *dyt1 = malloc(sizeof(double) * N * M), *xt1 = malloc(sizeof(double) * N * K);
    ref_quantize(dytq, NULL, dyt, M, N, dy_blk ? 128 : 1, 128, FP8_E4M3);  // (M, N)
    ref_quantize(xtq, NULL, xt, K, N, x_blk ? 128 : 1, 128, FP8_E4M3);     // (K, N)
    ref_quantize(dyt1, NULL, dyt, M, N, 1, 128, FP8_E4M3);                 // the default's slices
    ref_quantize(xt1, NULL, xt, K, N, 1, 128, FP8_E4M3);
    float *dw = calloc((size_t)M * K, sizeof(float));
    linear_wgrad(&L, LINEAR_FP8_BLOCK, dw, dy, x, N, M, K, 1);
    const double e = gemm_err(dw, dytq, xtq, M, K, N), e_default = gemm_err(dw, dyt1, xt1, M, K, N);
    snprintf(name, sizeof name, "wgrad_blocks %d: wgrad = (dy^T)_q (x^T)_q^T with those groups (rel err %.1e)", (int)b,
             e);
    CHECK(e < 1e-6, name, "%.3g", e);
    if (b != WGRAD_BLOCKS_NONE) {
        snprintf(name, sizeof name, "wgrad_blocks %d: differs from the 1x128 . 1x128 wgrad (%.1e)", (int)b, e_default);
        CHECK(e_default > 1e-4, name, "%.3g", e_default);
    }
    free(x), free(dy), free(dyt), free(xt), free(dytq), free(xtq), free(dyt1), free(xt1), free(dw);
    linear_fp8_free(&L);
}

// LINEAR_BF16 is the plain FP32 product, bit for bit.
static void test_bf16_path(void) {
    int N = 70, M = 90, K = 50;
    float *x = random_matrix(N, K, 2), *w = random_matrix(M, K, 2), *dy = random_matrix(N, M, 2);
    float *a = malloc(sizeof(float) * N * M), *b = malloc(sizeof(float) * N * M);  // N * M is the largest
    PrecisionConfig pc = {0};
    LinearFp8 L;
    linear_fp8_init(&L, &pc);
    int same = 1;
    linear_forward(&L, LINEAR_BF16, a, x, w, N, M, K, 0);
    matmul_nt(b, x, w, N, M, K, 0);
    same &= memcmp(a, b, sizeof(float) * N * M) == 0;
    linear_dgrad(&L, LINEAR_BF16, a, dy, w, N, M, K, 0);
    matmul_nn(b, dy, w, N, K, M, 0);
    same &= memcmp(a, b, sizeof(float) * N * K) == 0;
    memcpy(a, w, sizeof(float) * M * K);
    memcpy(b, w, sizeof(float) * M * K);
    linear_wgrad(&L, LINEAR_BF16, a, dy, x, N, M, K, 1);
    matmul_tn(b, dy, x, M, K, N, 1);
    same &= memcmp(a, b, sizeof(float) * M * K) == 0;
    CHECK(same && L.gemms == 0, "bf16 path is the FP32 matmul bit for bit", "differs (gemms %lld)", L.gemms);
    linear_fp8_free(&L);
    free(x), free(w), free(dy), free(a), free(b);
}

static void test_precision_of(void) {
    PrecisionConfig p = {0};
    p.linear = LINEAR_FP8_BLOCK;
    p.linear_keep_lm_head_bf16 = 1;
    p.linear_bf16_first_layers = 2;
    p.linear_bf16_last_layers = 1;
    LinearPrecision got[7];
    for (int l = -1; l < 6; l++) got[l + 1] = linear_precision_of(&p, 6, l);
    int ok = got[0] == LINEAR_BF16 && got[1] == LINEAR_BF16 && got[2] == LINEAR_BF16 && got[3] == LINEAR_FP8_BLOCK &&
             got[4] == LINEAR_FP8_BLOCK && got[5] == LINEAR_FP8_BLOCK && got[6] == LINEAR_BF16;
    p.linear_keep_lm_head_bf16 = 0;
    ok &= linear_precision_of(&p, 6, -1) == LINEAR_FP8_BLOCK;
    p.linear = LINEAR_BF16;
    for (int l = -1; l < 6; l++) ok &= linear_precision_of(&p, 6, l) == LINEAR_BF16;
    CHECK(ok, "linear_precision_of: head, first and last layers kept", "%d %d %d %d %d %d %d", got[0], got[1], got[2],
          got[3], got[4], got[5], got[6]);
}

// fp8_tensor's LM head (linear_fp8_head_scales): its scales are the micro-batch's, so the head
// run in chunks of tokens (the CPU's 256, the GPU's 8192) gives what the whole would: x's scale
// from the whole x, dy's from the bound given; linear_fp8_site drops them.
static void test_head_scales(void) {
    const int N = 64, M = 48, K = 80, H = N / 2;
    float *x = random_matrix(N, K, 4), *w = random_matrix(M, K, 2), *dy = random_matrix(N, M, 4);
    for (long i = (long)H * K; i < (long)N * K; i++) x[i] *= 0.125f;  // the second half's own amax is 8x smaller
    float *y = malloc(sizeof(float) * N * M), *y_ref = malloc(sizeof(float) * N * M);
    float *dx = malloc(sizeof(float) * N * K), *dx_ref = malloc(sizeof(float) * N * K);
    float amax_dy = 0.0f;
    for (long i = 0; i < (long)N * M; i++) amax_dy = fmaxf(amax_dy, fabsf(dy[i]));
    PrecisionConfig pc = {0};
    pc.linear = LINEAR_FP8_TENSOR;
    LinearFp8 L;
    linear_fp8_init(&L, &pc);
    linear_fp8_head_scales(&L, x, N, K, amax_dy);
    linear_forward(&L, LINEAR_FP8_TENSOR, y, x, w, H, M, K, 0);
    linear_forward(&L, LINEAR_FP8_TENSOR, y + (long)H * M, x + (long)H * K, w, H, M, K, 0);
    linear_dgrad(&L, LINEAR_FP8_TENSOR, dx, dy, w, H, M, K, 0);
    linear_dgrad(&L, LINEAR_FP8_TENSOR, dx + (long)H * K, dy + (long)H * M, w, H, M, K, 0);
    linear_fp8_site(&L, -1, 0);  // current scaling of the whole: the same scales
    linear_forward(&L, LINEAR_FP8_TENSOR, y_ref, x, w, N, M, K, 0);
    linear_dgrad(&L, LINEAR_FP8_TENSOR, dx_ref, dy, w, N, M, K, 0);
    CHECK(memcmp(y, y_ref, sizeof(float) * N * M) == 0 && memcmp(dx, dx_ref, sizeof(float) * N * K) == 0,
          "head scales: the head in two chunks equals the whole tensor's per-tensor quantization", "differs");
    linear_forward(&L, LINEAR_FP8_TENSOR, y_ref, x + (long)H * K, w, H, M, K, 0);  // the chunk's own amax
    long differ = 0;
    for (long i = 0; i < (long)H * M; i++) differ += y_ref[i] != y[(long)H * M + i];
    CHECK(differ > 0 && L.head_given == 0, "head scales: linear_fp8_site drops them (a chunk's own scale differs)",
          "%ld outputs differ, head_given %d", differ, L.head_given);
    // a bound far above dy's amax: its scale puts every dy code in the subnormals or at zero
    linear_fp8_head_scales(&L, x, N, K, 1e6f * amax_dy);
    linear_dgrad(&L, LINEAR_FP8_TENSOR, dx, dy, w, N, M, K, 0);
    differ = 0;
    for (long i = 0; i < (long)N * K; i++) differ += dx[i] != dx_ref[i];
    CHECK(differ > (long)N * K / 2, "head scales: dy takes the bound's scale, not its own amax", "%ld of %d differ",
          differ, N * K);
    linear_fp8_free(&L);
    free(x); free(w); free(dy); free(y); free(y_ref); free(dx); free(dx_ref);
}

// Delayed scaling (fp8_tensor, linear_scaling "delayed"): the contract's history, step by step,
// on one block's linear 1 (site 1: state 0, tensors 2 (x) and 3 (dy)) with a history of 2:
//   1. empty history: the forward equals current scaling and records x's amax (cur, not yet hist);
//   2. after the commit, x2 = 8 x: the scale of x's amax, so the large values saturate (counted)
//      and y = Q(x2; s of amax(x)) W_q^T; dy likewise through dgrad and wgrad;
//   3. a forward without a commit records nothing; forward_begin zeroes the amaxes;
//   4. after three commits the oldest entry is gone (history of 2);
//   5. the LM head (site -1) and the other sites' histories are untouched.
static void test_delayed(void) {
    const int N = 64, M = 48, K = 80;
    float *x = random_matrix(N, K, 4), *w = random_matrix(M, K, 2), *dy = random_matrix(N, M, 4);
    float *x2 = malloc(sizeof(float) * N * K), *y = malloc(sizeof(float) * N * M), *y_ref = malloc(sizeof(float) * N * M);
    float *dx = malloc(sizeof(float) * N * K), *dw = malloc(sizeof(float) * M * K);
    for (long i = 0; i < (long)N * K; i++) x2[i] = 8.0f * x[i];
    PrecisionConfig pc = {0};
    pc.linear = LINEAR_FP8_TENSOR;
    pc.linear_scaling = LINEAR_SCALING_DELAYED;
    LinearFp8 L, Lc;  // delayed, and current for comparison
    linear_fp8_init(&L, &pc);
    linear_fp8_init(&Lc, &pc);
    AttnDelayedState st[2];
    for (int j = 0; j < 2; j++) attn_delayed_init(&st[j], 2);
    L.delayed = st;
    float amax_x = 0.0f, amax_dy = 0.0f;
    for (long i = 0; i < (long)N * K; i++) amax_x = fmaxf(amax_x, fabsf(x[i]));
    for (long i = 0; i < (long)N * M; i++) amax_dy = fmaxf(amax_dy, fabsf(dy[i]));
    int state, tx, tdy;
    linear_delayed_slot(1, LINEAR_ROLE_X, &state, &tx);
    linear_delayed_slot(1, LINEAR_ROLE_DY, &state, &tdy);
    CHECK(state == 0 && tx == 2 && tdy == 3, "delayed: site 1 is state 0, tensors 2 and 3", "%d %d %d", state, tx, tdy);
    // 1. empty history
    linear_fp8_forward_begin(&L, 1);
    linear_fp8_site(&L, 0, 1);
    linear_forward(&L, LINEAR_FP8_TENSOR, y, x, w, N, M, K, 0);
    linear_forward(&Lc, LINEAR_FP8_TENSOR, y_ref, x, w, N, M, K, 0);
    CHECK(memcmp(y, y_ref, sizeof(float) * N * M) == 0 && st[0].cur_amax[tx] == amax_x && st[0].filled == 0,
          "delayed: an empty history quantizes with the current scale and records x's amax", "cur %g want %g",
          st[0].cur_amax[tx], amax_x);
    linear_dgrad(&L, LINEAR_FP8_TENSOR, dx, dy, w, N, M, K, 0);
    CHECK(st[0].cur_amax[tdy] == amax_dy && st[0].cur_amax[0] == 0 && st[1].cur_amax[tx] == 0,
          "delayed: dgrad records dy's amax at its own slot only", "dy %g want %g", st[0].cur_amax[tdy], amax_dy);
    attn_delayed_commit(&st[0]);
    attn_delayed_commit(&st[1]);
    // 2. x2 = 8 x against the history of x
    linear_fp8_forward_begin(&L, 1);
    const long long sat0 = L.stats[LINEAR_X].saturated;
    linear_forward(&L, LINEAR_FP8_TENSOR, y, x2, w, N, M, K, 0);
    const float s = fp8_scale_for_amax(FP8_E4M3, amax_x);
    double *x2q = malloc(sizeof(double) * N * K), *wq = malloc(sizeof(double) * M * K);
    long long sat_want = 0;
    for (long i = 0; i < (long)N * K; i++) {
        x2q[i] = fp8_to_f32(FP8_E4M3, fp8_from_f32(FP8_E4M3, x2[i] * s)) / s;
        sat_want += fabsf(x2[i] * s) > fp8_max(FP8_E4M3);
    }
    ref_quantize(wq, NULL, w, M, K, M, K, FP8_E4M3);
    const double e = gemm_err(y, x2q, wq, N, M, K);
    const long long sat = L.stats[LINEAR_X].saturated - sat0;
    CHECK(e < 1e-6 && sat == sat_want && sat > 0 && st[0].cur_amax[tx] == 8.0f * amax_x,
          "delayed: x quantized with the history's scale, saturating (and its own amax recorded)",
          "err %.2g, saturated %lld want %lld, cur %g", e, sat, sat_want, st[0].cur_amax[tx]);
    const long long dsat0 = L.stats[LINEAR_DY].saturated;
    for (long i = 0; i < (long)N * M; i++) dy[i] *= 8.0f;
    for (long i = 0; i < (long)M * K; i++) dw[i] = 0.0f;
    linear_wgrad(&L, LINEAR_FP8_TENSOR, dw, dy, x2, N, M, K, 1);
    CHECK(L.stats[LINEAR_DY].saturated > dsat0 && st[0].cur_amax[tdy] == 8.0f * amax_dy,
          "delayed: wgrad's dy too (saturations counted, amax recorded)", "%lld", L.stats[LINEAR_DY].saturated - dsat0);
    // 3. forward_begin zeroes, a forward without commit leaves the history
    linear_fp8_forward_begin(&L, 1);
    CHECK(st[0].cur_amax[tx] == 0 && st[0].cur_amax[tdy] == 0 && st[0].filled == 1 && st[0].hist[tx][0] == amax_x,
          "delayed: forward_begin zeroes this micro-batch's amaxes, the history stays", "%g %d", st[0].cur_amax[tx],
          st[0].filled);
    // 4. a history of 2 forgets its oldest entry: micro-batches with amax 8a, 2a, a keep 2a, a
    for (int k = 1; k <= 3; k++) {
        linear_fp8_forward_begin(&L, 1);
        linear_forward(&L, LINEAR_FP8_TENSOR, y, k == 1 ? x2 : x, w, N, M, K, 0);
        if (k == 2) st[0].cur_amax[tx] = 2.0f * amax_x;  // (as if x were 2 x)
        attn_delayed_commit(&st[0]);
        attn_delayed_commit(&st[1]);
    }
    CHECK(st[0].filled == 2 && attn_delayed_amax(&st[0], tx) == 2.0f * amax_x,
          "delayed: the history keeps the last 2 micro-batches (8a dropped)", "filled %d max %g (a = %g)",
          st[0].filled, attn_delayed_amax(&st[0], tx), amax_x);
    // 5. the head and state 1 untouched
    linear_fp8_forward_begin(&L, 1);
    linear_fp8_site(&L, -1, 0);
    linear_forward(&L, LINEAR_FP8_TENSOR, y, x2, w, N, M, K, 0);
    linear_forward(&Lc, LINEAR_FP8_TENSOR, y_ref, x2, w, N, M, K, 0);
    float other = 0.0f;
    for (int t = 0; t < 4; t++) other = fmaxf(other, st[1].cur_amax[t] + st[1].hist[t][0] + st[1].hist[t][1]);
    CHECK(memcmp(y, y_ref, sizeof(float) * N * M) == 0 && st[0].cur_amax[tx] == 0 && other == 0,
          "delayed: the LM head keeps current scaling and records nothing; other sites untouched", "%g", other);
    linear_fp8_free(&L);
    linear_fp8_free(&Lc);
    free(x); free(w); free(dy); free(x2); free(y); free(y_ref); free(dx); free(dw); free(x2q); free(wq);
}

int main(void) {
    const Fp8Grouping gs[3] = {FP8_GROUP_TENSOR, FP8_GROUP_1x128, FP8_GROUP_128x128};
    for (int g = 0; g < 3; g++)
        for (int f = 0; f < 2; f++) test_quantize(gs[g], (Fp8Format)f, 200, 300);
    test_quantize(FP8_GROUP_1x128, FP8_E4M3, 3, 128);     // exact multiples
    test_quantize(FP8_GROUP_128x128, FP8_E4M3, 256, 384);
    test_quantize(FP8_GROUP_128x128, FP8_E5M2, 1, 5);     // one tiny partial block
    test_boundaries();
    test_special();
    test_gemms(LINEAR_FP8_TENSOR, FP8_E4M3);
    test_gemms(LINEAR_FP8_TENSOR, FP8_E5M2);
    test_gemms(LINEAR_FP8_BLOCK, FP8_E4M3);
    for (int b = 0; b < 3; b++) test_wgrad_blocks((WgradBlocks)b);
    test_bf16_path();
    test_precision_of();
    test_delayed();
    test_head_scales();
    return test_summary("test_linear_fp8");
}
