// test.h: a minimal test harness. Every CHECK is one counted test: it prints "ok - <name>" or
// "FAIL - <name>: <detail>". test/run_tests.sh counts those lines over all test programs and
// closes with "N passed, M failed". A test program returns test_summary() from main().
#ifndef TEST_H
#define TEST_H

#include <math.h>    // fabs, sqrt, INFINITY, NAN
#include <stdio.h>   // printf
#include <stdlib.h>  // exit status, calloc

static int test_n_pass, test_n_fail;

// CHECK(cond, name, detail-format, ...): name is a short string; detail explains a failure.
#define CHECK(cond, name, ...)                                                  \
    do {                                                                        \
        if (cond) {                                                             \
            test_n_pass++;                                                      \
            printf("ok - %s\n", name);                                          \
        } else {                                                                \
            test_n_fail++;                                                      \
            printf("FAIL - %s (%s:%d): ", name, __FILE__, __LINE__);            \
            printf(__VA_ARGS__);                                                \
            printf("\n");                                                       \
        }                                                                       \
        fflush(stdout);                                                         \
    } while (0)

static inline int test_summary(const char *program) {
    printf("# %s: %d passed, %d failed\n", program, test_n_pass, test_n_fail);
    return test_n_fail ? 1 : 0;
}

// max that propagates NaN (fmax drops it): a NaN on either side then fails a "< bound" check.
static inline double nan_max(double a, double b) { return (a != a || b != b) ? a + b : (a > b ? a : b); }

// Per-tile errors. One wrong tile of a large output hides in its relative L2 error, which the
// rest of the tensor dilutes (a tile of 1/n of the values, scaled by 1.5, moves it by only
// 0.5/sqrt(n)), but not in the tile's own error. TileErr keeps, per tile (a block of rows the
// kernel computes together), the sums of squares of got - ref and of ref, and the largest
// |got - ref| and |ref|:
//   tile_err_rel: the worst tile's relative L2 error, each tile's norm floored at floor_frac of
//     the tensor's RMS tile norm (tiles of (near) zeros divide by no (near) zero). A tile wrong by
//     a factor of 1.5 or more, zeroed or misplaced is at 0.5 or more; rounding noise of relative
//     L2 e averages over the tile's values and stays near e.
//   tile_err_maxabs: the worst element, max |got - ref| over the tensor's max |ref|.
// test_tile_bound measures both on the CPU emulation, for noise and for a corrupted tile.
typedef struct {
    int n;                                  // tiles
    double *err_ss, *ref_ss, *err_max, *ref_max;  // (n) each
    long nonfinite;                         // got values that are not finite
} TileErr;
static inline TileErr tile_err_new(int n_tiles) {
    TileErr t;
    t.n = n_tiles;
    t.err_ss = (double *)calloc(4 * (size_t)n_tiles, sizeof(double));
    t.ref_ss = t.err_ss + n_tiles, t.err_max = t.ref_ss + n_tiles, t.ref_max = t.err_max + n_tiles;
    t.nonfinite = 0;
    return t;
}
static inline void tile_err_add(TileErr *t, int tile, double got, double ref) {
    if (!(got - got == 0)) t->nonfinite++;
    t->err_ss[tile] += (got - ref) * (got - ref);
    t->ref_ss[tile] += ref * ref;
    t->err_max[tile] = nan_max(t->err_max[tile], fabs(got - ref));
    t->ref_max[tile] = nan_max(t->ref_max[tile], fabs(ref));
}
static inline double tile_err_rel(const TileErr *t, double floor_frac, int *worst) {
    double mean_ss = 0, r = 0;
    for (int i = 0; i < t->n; i++) mean_ss += t->ref_ss[i] / t->n;
    const double floor_ss = floor_frac * floor_frac * mean_ss;
    if (worst) *worst = -1;
    for (int i = 0; i < t->n; i++) {
        double den = t->ref_ss[i] > floor_ss ? t->ref_ss[i] : floor_ss;
        double x = den > 0 ? sqrt(t->err_ss[i] / den) : (t->err_ss[i] > 0 ? INFINITY : 0);
        if (!(x <= r)) { r = x; if (worst) *worst = i; }
    }
    return t->nonfinite ? NAN : r;
}
static inline double tile_err_maxabs(const TileErr *t) {
    double e = 0, m = 0;
    for (int i = 0; i < t->n; i++) e = nan_max(e, t->err_max[i]), m = nan_max(m, t->ref_max[i]);
    return t->nonfinite ? NAN : m > 0 ? e / m : (e > 0 ? INFINITY : 0);
}
static inline void tile_err_free(TileErr *t) { free(t->err_ss); t->err_ss = NULL; }

#endif  // TEST_H
