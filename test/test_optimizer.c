// test_optimizer.c: AdamW against a straightforward double-precision reference, decoupled weight
// decay only on decay tensors, clipping, the LR schedules at their key points, the global norm,
// ZeRO-1 slices and run-to-run / thread-count determinism.
#include <math.h>    // fabs, sqrt
#include <omp.h>     // omp_set_num_threads: results must not depend on the thread count
#include <string.h>  // memcpy, memcmp, memset

#include "core/common.h"  // xmalloc
#include "optimizer.h"    // the module under test
#include "test.h"         // CHECK, test_summary

// ---------------------------------------------------------------------------------------------
// Seeded random numbers (xorshift64*), independent of the code under test.
static unsigned long long rng_state = 0x243F6A8885A308D3ULL;
static double rand_uniform(void) {  // [0, 1)
    rng_state ^= rng_state >> 12;
    rng_state ^= rng_state << 25;
    rng_state ^= rng_state >> 27;
    return (double)((rng_state * 0x2545F4914F6CDD1DULL) >> 11) * (1.0 / 9007199254740992.0);
}
static float rand_sym(double scale) { return (float)((2.0 * rand_uniform() - 1.0) * scale); }

// ---------------------------------------------------------------------------------------------
// A small parameter table built by hand: matrices decay, gains do not.
static ParamTable table;
static void add_tensor(const char *name, long rows, long cols, int decay) {
    ParamDesc *d = &table.p[table.n++];
    memset(d, 0, sizeof *d);
    snprintf(d->name, sizeof d->name, "%s", name);
    d->ndim = cols > 1 ? 2 : 1;
    d->rows = rows;
    d->cols = cols;
    d->numel = (size_t)(rows * cols);
    d->offset = table.total;
    d->weight_decay = decay;
    d->layer = -1;
    table.total += d->numel;
}
static void build_table(void) {
    static ParamDesc descs[8];
    memset(&table, 0, sizeof table);
    table.p = descs;
    add_tensor("wte", 37, 13, 1);
    add_tensor("norm_a", 13, 1, 0);
    add_tensor("big", 300, 200, 1);  // large enough for the OpenMP path
    add_tensor("norm_b", 29, 1, 0);
    add_tensor("proj", 5, 41, 1);
}

static TrainConfig make_tc(void) {
    TrainConfig tc;
    memset(&tc, 0, sizeof tc);
    tc.lr = 3e-3;
    tc.weight_decay = 0.1;
    tc.beta1 = 0.9;
    tc.beta2 = 0.95;
    tc.eps = 1e-8;
    tc.grad_clip = 1.0;
    tc.min_lr_ratio = 0.1;
    tc.steps = 100;
    return tc;
}

// The reference: the textbook AdamW in double, one tensor at a time.
static void reference_step(double *p, double *m, double *v, const float *g, const TrainConfig *tc,
                           double lr, double clip, long long t) {
    for (int k = 0; k < table.n; k++) {
        const ParamDesc *d = &table.p[k];
        double wd = d->weight_decay ? tc->weight_decay : 0.0;
        for (size_t i = d->offset; i < d->offset + d->numel; i++) {
            double gi = (double)g[i] * clip;
            m[i] = tc->beta1 * m[i] + (1.0 - tc->beta1) * gi;
            v[i] = tc->beta2 * v[i] + (1.0 - tc->beta2) * gi * gi;
            double m_hat = m[i] / (1.0 - pow(tc->beta1, (double)t));
            double v_hat = v[i] / (1.0 - pow(tc->beta2, (double)t));
            p[i] -= lr * wd * p[i];
            p[i] -= lr * m_hat / (sqrt(v_hat) + tc->eps);
        }
    }
}

// Runs n_steps of adamw_step from a seeded start; fills params (total) and the optimizer.
static void run_steps(AdamW *o, float *params, int n_steps, unsigned long long seed, double wd) {
    TrainConfig tc = make_tc();
    tc.weight_decay = wd;
    size_t n = table.total;
    rng_state = seed;
    for (size_t i = 0; i < n; i++) params[i] = rand_sym(1.0);
    float *g = xmalloc(n * sizeof(float));
    adamw_init(o, n);
    for (int s = 0; s < n_steps; s++) {
        for (size_t i = 0; i < n; i++) g[i] = rand_sym(0.5);
        adamw_step(o, &table, &tc, params, g, lr_at_step(&tc, s), 0.75);
    }
    free(g);
}

static void test_against_reference(void) {
    TrainConfig tc = make_tc();
    tc.warmup_steps = 2;
    const size_t n = table.total;
    float *p = xmalloc(n * sizeof(float)), *g = xmalloc(n * sizeof(float));
    double *pd = xmalloc(n * sizeof(double)), *md = xcalloc(n, sizeof(double));
    double *vd = xcalloc(n, sizeof(double));
    rng_state = 12345;
    for (size_t i = 0; i < n; i++) { p[i] = rand_sym(1.0); pd[i] = p[i]; }
    AdamW o;
    adamw_init(&o, n);
    const int n_steps = 8;
    double worst_p = 0, worst_m = 0, worst_v = 0;
    for (int s = 0; s < n_steps; s++) {
        // Gradients of varying scale; some steps clipped.
        double scale = (s % 3 == 0) ? 2.0 : 0.05;
        for (size_t i = 0; i < n; i++) g[i] = rand_sym(scale);
        double norm = grad_global_norm(g, n);
        double clip = grad_clip_factor(&tc, norm);
        double lr = lr_at_step(&tc, s);
        adamw_step(&o, &table, &tc, p, g, lr, clip);
        reference_step(pd, md, vd, g, &tc, lr, clip, s + 1);
        for (size_t i = 0; i < n; i++) {
            // Relative error, with a floor for values near zero (cancellation): 1% of the
            // parameter scale, of the largest gradient scale (2.0), and 1e-4 for v.
            double ep = fabs(p[i] - pd[i]) / fmax(fabs(pd[i]), 1e-2);
            double em = fabs(o.m[i] - md[i]) / fmax(fabs(md[i]), 1e-2 * 2.0);
            double ev = fabs(o.v[i] - vd[i]) / fmax(fabs(vd[i]), 1e-4);
            if (ep > worst_p) worst_p = ep;
            if (em > worst_m) worst_m = em;
            if (ev > worst_v) worst_v = ev;
        }
    }
    CHECK(o.step == n_steps, "adamw step counter", "step %lld, expected %d", o.step, n_steps);
    CHECK(worst_p < 1e-6, "adamw params match double reference",
          "worst relative error %.3g over %d steps", worst_p, n_steps);
    CHECK(worst_m < 1e-6, "adamw first moment matches reference", "worst relative error %.3g", worst_m);
    CHECK(worst_v < 1e-6, "adamw second moment matches reference", "worst relative error %.3g", worst_v);
    // The reference must have moved the parameters (so the comparison is not vacuous).
    double moved = 0;
    for (size_t i = 0; i < n; i++) moved = fmax(moved, fabs(pd[i] - (double)p[i]) + fabs(md[i]));
    CHECK(moved > 1e-3, "adamw reference moved", "max |m| %.3g", moved);
    adamw_free(&o);
    free(p); free(g); free(pd); free(md); free(vd);
}

static void test_weight_decay_only_on_decay_tensors(void) {
    const size_t n = table.total;
    float *p_wd = xmalloc(n * sizeof(float)), *p_0 = xmalloc(n * sizeof(float));
    AdamW a, b;
    run_steps(&a, p_wd, 1, 777, 0.1);
    run_steps(&b, p_0, 1, 777, 0.0);
    // One step from the same start: the decay term is lr * wd * p_start on decay tensors, zero
    // on gains (bit-identical there).
    TrainConfig tc = make_tc();
    double lr = lr_at_step(&tc, 0);
    rng_state = 777;
    int gains_identical = 1;
    double worst = 0;
    for (int k = 0; k < table.n; k++) {
        const ParamDesc *d = &table.p[k];
        for (size_t i = d->offset; i < d->offset + d->numel; i++) {
            double start = rand_sym(1.0);  // the same sequence run_steps drew
            if (!d->weight_decay) {
                if (memcmp(&p_wd[i], &p_0[i], sizeof(float)) != 0) gains_identical = 0;
            } else {
                double expect = -lr * 0.1 * start;
                double err = fabs((p_wd[i] - p_0[i]) - expect);
                if (err > worst) worst = err;
            }
        }
    }
    CHECK(gains_identical, "no weight decay on gains", "gain tensors changed with weight_decay");
    CHECK(worst < 2e-7, "weight decay on matrices", "decay term off by %.3g (lr*wd = %.3g)", worst,
          lr * 0.1);
    adamw_free(&a);
    adamw_free(&b);
    free(p_wd); free(p_0);
}

static void test_clip(void) {
    TrainConfig tc = make_tc();
    tc.grad_clip = 1.0;
    CHECK(grad_clip_factor(&tc, 4.0) == 0.25, "clip factor above threshold", "%g", grad_clip_factor(&tc, 4.0));
    CHECK(grad_clip_factor(&tc, 0.5) == 1.0, "clip factor below threshold", "%g", grad_clip_factor(&tc, 0.5));
    tc.grad_clip = 0.0;
    CHECK(grad_clip_factor(&tc, 1e6) == 1.0, "clip off when grad_clip 0", "%g", grad_clip_factor(&tc, 1e6));

    // Clipping scales the gradient before the moments: clip c on g == clip 1 on (float)(g * c).
    const size_t n = table.total;
    tc = make_tc();
    float *p1 = xmalloc(n * sizeof(float)), *p2 = xmalloc(n * sizeof(float));
    float *g = xmalloc(n * sizeof(float)), *gs = xmalloc(n * sizeof(float));
    rng_state = 99;
    for (size_t i = 0; i < n; i++) { p1[i] = p2[i] = rand_sym(1.0); g[i] = rand_sym(3.0); }
    const double c = 0.3;
    for (size_t i = 0; i < n; i++) gs[i] = g[i] * (float)c;
    AdamW a, b;
    adamw_init(&a, n);
    adamw_init(&b, n);
    for (int s = 0; s < 3; s++) {
        adamw_step(&a, &table, &tc, p1, g, 1e-3, c);
        adamw_step(&b, &table, &tc, p2, gs, 1e-3, 1.0);
    }
    CHECK(memcmp(p1, p2, n * sizeof(float)) == 0 && memcmp(a.v, b.v, n * sizeof(float)) == 0,
          "clip scales gradients first", "clip %g differs from pre-scaled gradients", c);
    adamw_free(&a);
    adamw_free(&b);
    free(p1); free(p2); free(g); free(gs);
}

static int close_to(double a, double b) { return fabs(a - b) <= 1e-12 * fmax(fabs(b), 1e-30); }
#define CHECK_LR(tc, step, expect, name) \
    CHECK(close_to(lr_at_step(&(tc), (step)), (expect)), name, "lr_at_step(%d) = %.10g, expected %.10g", \
          (step), lr_at_step(&(tc), (step)), (double)(expect))

static void test_schedules(void) {
    TrainConfig tc = make_tc();
    tc.lr = 1e-3;
    tc.min_lr_ratio = 0.1;
    tc.warmup_steps = 10;
    tc.steps = 111;  // decay over steps 10..110: 100 intervals
    tc.schedule = SCHED_COSINE;
    CHECK_LR(tc, 0, 1e-4, "warmup first step = lr/warmup");
    CHECK_LR(tc, 4, 5e-4, "warmup middle");
    CHECK_LR(tc, 9, 1e-3, "warmup last step = lr");
    CHECK_LR(tc, 10, 1e-3, "cosine starts at lr");
    CHECK_LR(tc, 60, 5.5e-4, "cosine middle");
    CHECK_LR(tc, 35, 1e-4 + 9e-4 * 0.5 * (1 + cos(M_PI * 0.25)), "cosine quarter");
    CHECK_LR(tc, 110, 1e-4, "cosine last step = lr*min_ratio");
    CHECK_LR(tc, 500, 1e-4, "cosine past the end stays at min");
    tc.schedule = SCHED_LINEAR;
    CHECK_LR(tc, 10, 1e-3, "linear starts at lr");
    CHECK_LR(tc, 35, 7.75e-4, "linear quarter");
    CHECK_LR(tc, 60, 5.5e-4, "linear middle");
    CHECK_LR(tc, 110, 1e-4, "linear last step = lr*min_ratio");
    tc.schedule = SCHED_CONSTANT;
    CHECK_LR(tc, 3, 4e-4, "constant warmup");
    CHECK_LR(tc, 60, 1e-3, "constant after warmup");
    CHECK_LR(tc, 110, 1e-3, "constant last step");
    tc.schedule = SCHED_WSD;
    tc.wsd_decay_fraction = 0.2;  // round(22.2) = 22 decay steps: 89..110
    CHECK_LR(tc, 5, 6e-4, "wsd warmup");
    CHECK_LR(tc, 10, 1e-3, "wsd flat after warmup");
    CHECK_LR(tc, 88, 1e-3, "wsd flat until the decay phase");
    CHECK_LR(tc, 89, 1e-3 - 9e-4 / 22, "wsd first decay step");
    CHECK_LR(tc, 99, 1e-3 - 9e-4 * 11 / 22, "wsd decay middle");
    CHECK_LR(tc, 110, 1e-4, "wsd last step = lr*min_ratio");
    tc.schedule = SCHED_COSINE;
    tc.warmup_steps = 0;
    CHECK_LR(tc, 0, 1e-3, "no warmup starts at lr");
    tc.steps = 1;
    CHECK_LR(tc, 0, 1e-4, "single-step run is its own last step");
}

static void test_global_norm(void) {
    const size_t n = 300001;  // several chunks and a ragged end
    float *g = xmalloc(n * sizeof(float));
    rng_state = 4242;
    for (size_t i = 0; i < n; i++) g[i] = rand_sym(1e-2);
    double ref = 0;
    for (size_t i = 0; i < n; i++) ref += (double)g[i] * g[i];
    ref = sqrt(ref);
    omp_set_num_threads(1);
    double n1 = grad_global_norm(g, n);
    omp_set_num_threads(2);
    double n2 = grad_global_norm(g, n);
    omp_set_num_threads(3);
    double n3 = grad_global_norm(g, n);
    CHECK(fabs(n2 - ref) <= 1e-12 * ref, "global norm vs double reference", "%.17g vs %.17g", n2, ref);
    CHECK(memcmp(&n1, &n2, sizeof n1) == 0 && memcmp(&n1, &n3, sizeof n1) == 0,
          "global norm independent of thread count", "%.17g %.17g %.17g", n1, n2, n3);
    CHECK(grad_global_norm(g, 0) == 0.0, "global norm of nothing", "%g", grad_global_norm(g, 0));
    free(g);
}

static void test_determinism(void) {
    const size_t n = table.total;
    float *a = xmalloc(n * sizeof(float)), *b = xmalloc(n * sizeof(float));
    AdamW oa, ob;
    omp_set_num_threads(1);
    run_steps(&oa, a, 5, 2024, 0.1);
    omp_set_num_threads(2);
    run_steps(&ob, b, 5, 2024, 0.1);
    int same = memcmp(a, b, n * sizeof(float)) == 0 && memcmp(oa.m, ob.m, n * sizeof(float)) == 0 &&
               memcmp(oa.v, ob.v, n * sizeof(float)) == 0 && oa.step == ob.step;
    CHECK(same, "adamw bit-identical across runs and thread counts", "two runs differ");

    // ZeRO-1: three slices with their own moments, cutting through tensors, give the same bits.
    float *c = xmalloc(n * sizeof(float)), *g = xmalloc(n * sizeof(float));
    const size_t cuts[4] = {0, 500, 40000, n};
    float *m[3], *v[3];
    for (int s = 0; s < 3; s++) {
        m[s] = xcalloc(cuts[s + 1] - cuts[s], sizeof(float));
        v[s] = xcalloc(cuts[s + 1] - cuts[s], sizeof(float));
    }
    TrainConfig tc = make_tc();
    rng_state = 2024;
    for (size_t i = 0; i < n; i++) c[i] = rand_sym(1.0);
    for (int step = 0; step < 5; step++) {
        for (size_t i = 0; i < n; i++) g[i] = rand_sym(0.5);
        for (int s = 0; s < 3; s++)
            adamw_update_slice(&table, &tc, c, g, m[s], v[s], cuts[s], cuts[s + 1],
                               lr_at_step(&tc, step), 0.75, step + 1);
    }
    int slices_same = memcmp(a, c, n * sizeof(float)) == 0 &&
                      memcmp(oa.m + cuts[1], m[1], (cuts[2] - cuts[1]) * sizeof(float)) == 0;
    CHECK(slices_same, "ZeRO-1 slices match the full step bit for bit", "slice update differs");
    for (int s = 0; s < 3; s++) { free(m[s]); free(v[s]); }
    adamw_free(&oa);
    adamw_free(&ob);
    free(a); free(b); free(c); free(g);
}

int main(void) {
    build_table();
    test_against_reference();
    test_weight_decay_only_on_decay_tensors();
    test_clip();
    test_schedules();
    test_global_norm();
    test_determinism();
    return test_summary("test_optimizer");
}
