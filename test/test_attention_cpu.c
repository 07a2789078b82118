// test_attention_cpu.c: the CPU attention emulation (attention_cpu.h) against an FP64 reference
// and against the properties spec docs/fp8-attention.md §2-§4 demands, on seeded
// N(0,1) inputs (never zeros).
#include <math.h>    // fabs, sqrt
#include <string.h>  // memcpy, memcmp

#include "cpu/attention_cpu.h"  // the code under test
#include "core/common.h"        // xmalloc
#include "test.h"               // CHECK, test_summary

// One input set with its FP64 reference.
typedef struct {
    int T, d;
    float *q, *k, *v, *dout;          // (T, d)
    double *ro, *rlse, *rdq, *rdk, *rdv;  // FP64 reference outputs
} Case;

static Case case_make(int T, int d, uint64_t seed, float sharp) {
    Case c = {T, d, 0, 0, 0, 0, 0, 0, 0, 0, 0};
    size_t n = (size_t)T * d;
    c.q = xmalloc(n * sizeof(float)); c.k = xmalloc(n * sizeof(float));
    c.v = xmalloc(n * sizeof(float)); c.dout = xmalloc(n * sizeof(float));
    attn_fill_normal(c.q, n, seed * 4 + 0);
    attn_fill_normal(c.k, n, seed * 4 + 1);
    attn_fill_normal(c.v, n, seed * 4 + 2);
    attn_fill_normal(c.dout, n, seed * 4 + 3);
    double *qd = xmalloc(n * sizeof(double)), *kd = xmalloc(n * sizeof(double));
    double *vd = xmalloc(n * sizeof(double)), *dd = xmalloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) {
        c.q[i] *= sharp; c.k[i] *= sharp;
        qd[i] = c.q[i]; kd[i] = c.k[i]; vd[i] = c.v[i]; dd[i] = c.dout[i];
    }
    c.ro = xmalloc(n * sizeof(double)); c.rlse = xmalloc((size_t)T * sizeof(double));
    c.rdq = xmalloc(n * sizeof(double)); c.rdk = xmalloc(n * sizeof(double)); c.rdv = xmalloc(n * sizeof(double));
    attn_ref_forward_f64(T, d, qd, kd, vd, c.ro, c.rlse);
    attn_ref_backward_f64(T, d, qd, kd, vd, dd, c.rdq, c.rdk, c.rdv);
    free(qd); free(kd); free(vd); free(dd);
    return c;
}
static void case_free(Case *c) {
    free(c->q); free(c->k); free(c->v); free(c->dout);
    free(c->ro); free(c->rlse); free(c->rdq); free(c->rdk); free(c->rdv);
}

static AttnOptions opts(AttnPrecision p, Fp8Format g, int bq, int bk) {
    AttnOptions o = {p, g, SCALING_BLOCK, 256.0f, bq, bk};
    return o;
}

static AttnEval eval(const Case *c, AttnOptions o) {
    AttnEval e;
    attn_eval_mode(&o, c->T, c->d, c->q, c->k, c->v, c->dout, c->ro, c->rdq, c->rdk, c->rdv, &e);
    return e;
}

// Outputs of one mode (forward and backward), for comparing two runs.
typedef struct { float *o, *lse, *dq, *dk, *dv; AttnStats st; } Run;
static Run run(const Case *c, AttnOptions o) {
    size_t n = (size_t)c->T * c->d;
    Run r;
    memset(&r.st, 0, sizeof r.st);
    r.o = xmalloc(n * 4); r.lse = xmalloc((size_t)c->T * 4);
    r.dq = xmalloc(n * 4); r.dk = xmalloc(n * 4); r.dv = xmalloc(n * 4);
    attn_cpu_forward(&o, NULL, c->T, c->d, c->q, c->k, c->v, r.o, r.lse, &r.st);
    attn_cpu_backward(&o, NULL, c->T, c->d, c->q, c->k, c->v, r.o, r.lse, c->dout, r.dq, r.dk, r.dv, &r.st, NULL);
    return r;
}
static void run_free(Run *r) { free(r->o); free(r->lse); free(r->dq); free(r->dk); free(r->dv); }

static double rel_diff(const float *a, const float *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num += ((double)a[i] - b[i]) * ((double)a[i] - b[i]);
        den += (double)b[i] * b[i];
    }
    return sqrt(num / (den > 0 ? den : 1));
}

// (a) Finite differences of the FP64 reference: L = sum(O ∘ G), gradients vs central differences.
static void test_reference_fd(void) {
    const int T = 9, d = 6;
    size_t n = (size_t)T * d;
    float tmp[9 * 6];
    double q[9 * 6], k[9 * 6], v[9 * 6], g[9 * 6], o[9 * 6], dq[9 * 6], dk[9 * 6], dv[9 * 6];
    double *xs[3] = {q, k, v}, *grads[3] = {dq, dk, dv};
    for (int t = 0; t < 4; t++) {
        attn_fill_normal(tmp, n, 100 + t);
        double *dst = t < 3 ? xs[t] : g;
        for (size_t i = 0; i < n; i++) dst[i] = tmp[i] * (t < 2 ? 1.5 : 1.0);
    }
    attn_ref_backward_f64(T, d, q, k, v, g, dq, dk, dv);
    double worst = 0;
    const double h = 1e-5;
    for (int t = 0; t < 3; t++)
        for (size_t i = 0; i < n; i++) {
            double keep = xs[t][i], lp = 0, lm = 0;
            xs[t][i] = keep + h;
            attn_ref_forward_f64(T, d, q, k, v, o, NULL);
            for (size_t x = 0; x < n; x++) lp += o[x] * g[x];
            xs[t][i] = keep - h;
            attn_ref_forward_f64(T, d, q, k, v, o, NULL);
            for (size_t x = 0; x < n; x++) lm += o[x] * g[x];
            xs[t][i] = keep;
            double fd = (lp - lm) / (2 * h), err = fabs(fd - grads[t][i]) / (fabs(fd) + 1e-3);
            if (err > worst) worst = err;
        }
    CHECK(worst < 1e-6, "reference: FP64 backward matches central differences (T=9, d=6, all of dQ dK dV)",
          "worst relative error %.3e", worst);

    // LSE of the reference: log sum_j exp(tau S_ij), checked directly on row T-1.
    double lse[9];
    attn_ref_forward_f64(T, d, q, k, v, o, lse);
    double sum = 0;
    for (int j = 0; j < T; j++) {
        double s = 0;
        for (int c = 0; c < d; c++) s += q[(T - 1) * d + c] * k[j * d + c];
        sum += exp(s / sqrt((double)d));
    }
    CHECK(fabs(lse[T - 1] - log(sum)) < 1e-12, "reference: LSE is log sum exp of the scaled scores", "%.17g vs %.17g",
          lse[T - 1], log(sum));
}

int main(void) {
    double t0 = now_seconds();
    test_reference_fd();

    // (b) fp32 mode against FP64, both head sizes, several block shapes.
    {
        const int shapes[][4] = {{384, 64, 128, 128}, {256, 128, 64, 128}, {200, 64, 64, 32}};
        for (int s = 0; s < 3; s++) {
            Case c = case_make(shapes[s][0], shapes[s][1], 7 + s, 1.5f);
            AttnEval e = eval(&c, opts(ATTN_FP32, FP8_E4M3, shapes[s][2], shapes[s][3]));
            double worst = fmax(fmax(e.err_o, e.err_dq), fmax(e.err_dk, e.err_dv));
            char name[160];
            snprintf(name, sizeof name, "fp32 mode = FP64 reference within 1e-5 (T=%d d=%d block %dx%d)", c.T, c.d,
                     shapes[s][2], shapes[s][3]);
            CHECK(worst < 1e-5, name, "err O %.2e dQ %.2e dK %.2e dV %.2e", e.err_o, e.err_dq, e.err_dk, e.err_dv);
            case_free(&c);
        }
    }

    // (c) Row-sum invariant at sharpness 1, 2, 3, (d) dm vs naive, (f) bf16 error size.
    for (int sharp = 1; sharp <= 3; sharp++) {
        Case c = case_make(384, 64, 20 + sharp, (float)sharp);
        for (int g = 0; g < 2; g++) {
            Fp8Format gf = g ? FP8_E5M2 : FP8_E4M3;
            const char *gn = g ? "e5m2" : "e4m3";
            AttnEval dm = eval(&c, opts(ATTN_FP8_DM, gf, 128, 128));
            AttnEval naive = eval(&c, opts(ATTN_FP8_NAIVE, gf, 128, 128));
            char name[160];
            snprintf(name, sizeof name, "fp8_dm row-sum invariant <= 1e-5 (sharpness %d, %s)", sharp, gn);
            CHECK(dm.stats.resid_cancel_max <= 1e-5 && dm.resid_median <= 1e-5, name,
                  "max |sum dS| / sum P(|dP|+|D|) = %.3e, median |sum dS|/sum|dS| = %.3e", dm.stats.resid_cancel_max,
                  dm.resid_median);
            snprintf(name, sizeof name, "fp8_naive row-sum residual is broken: median > 1e-4 (sharpness %d, %s)", sharp, gn);
            CHECK(naive.resid_median > 1e-4 && naive.stats.resid_cancel_max > 1e-3, name, "median %.3e, max %.3e",
                  naive.resid_median, naive.stats.resid_cancel_max);
            snprintf(name, sizeof name, "fp8_dm not worse than fp8_naive on dQ and dK (sharpness %d, %s)", sharp, gn);
            CHECK(dm.err_dq <= naive.err_dq && dm.err_dk <= naive.err_dk, name, "dQ %.4f vs %.4f, dK %.4f vs %.4f",
                  dm.err_dq, naive.err_dq, dm.err_dk, naive.err_dk);
            snprintf(name, sizeof name, "fp8_naive and fp8_dm errors of spec magnitude: O < 0.2, dQ dK dV < 0.4 (sharpness %d, %s)",
                     sharp, gn);
            CHECK(naive.err_o < 0.2 && naive.err_dq < 0.4 && naive.err_dk < 0.4 && naive.err_dv < 0.4 && dm.err_dq < 0.4 &&
                      naive.err_o > 1e-3,
                  name, "naive O %.3f dQ %.3f dK %.3f dV %.3f", naive.err_o, naive.err_dq, naive.err_dk, naive.err_dv);
        }
        AttnEval f32 = eval(&c, opts(ATTN_FP32, FP8_E4M3, 128, 128));
        char name[160];
        snprintf(name, sizeof name, "fp32 row-sum invariant <= 1e-5 (sharpness %d)", sharp);
        CHECK(f32.stats.resid_cancel_max <= 1e-5, name, "max %.3e", f32.stats.resid_cancel_max);
        // bf16 keeps the stale D = rowsum(dO ∘ O) of spec §3 with O rounded to BF16, so its
        // residual sits at BF16 rounding (~1e-4 median), not at 1e-5 (reported to the lead):
        // check it is an order below fp8_naive and its errors are BF16-sized.
        AttnEval bf = eval(&c, opts(ATTN_BF16, FP8_E4M3, 128, 128));
        AttnEval naive = eval(&c, opts(ATTN_FP8_NAIVE, FP8_E4M3, 128, 128));
        snprintf(name, sizeof name, "bf16 row-sum residual at BF16 rounding: median < 1e-2, < fp8_naive/4 (sharpness %d)", sharp);
        CHECK(bf.resid_median < 1e-2 && bf.resid_median < naive.resid_median / 4, name, "bf16 %.3e, naive %.3e",
              bf.resid_median, naive.resid_median);
        snprintf(name, sizeof name, "bf16 errors of BF16 size: O < 1e-2, dQ dK dV < 3e-2 (sharpness %d)", sharp);
        CHECK(bf.err_o < 1e-2 && bf.err_dq < 3e-2 && bf.err_dk < 3e-2 && bf.err_dv < 3e-2 && bf.err_o > 1e-4, name,
              "O %.2e dQ %.2e dK %.2e dV %.2e", bf.err_o, bf.err_dq, bf.err_dk, bf.err_dv);
        case_free(&c);
    }

    // Mode structure: the FP8 modes share the forward; dV does not depend on D.
    {
        Case c = case_make(320, 64, 31, 2.0f);
        size_t n = (size_t)c.T * c.d;
        Run naive = run(&c, opts(ATTN_FP8_NAIVE, FP8_E5M2, 128, 128));
        Run dm = run(&c, opts(ATTN_FP8_DM, FP8_E5M2, 128, 128));
        Run hyb = run(&c, opts(ATTN_FP8_HYBRID, FP8_E5M2, 128, 128));
        Run apx = run(&c, opts(ATTN_FP8_DM_APPROX, FP8_E5M2, 128, 128));
        CHECK(!memcmp(naive.o, dm.o, n * 4) && !memcmp(naive.o, hyb.o, n * 4) && !memcmp(naive.o, apx.o, n * 4) &&
                  !memcmp(naive.lse, dm.lse, (size_t)c.T * 4),
              "fp8 modes: one forward (O and LSE bitwise equal across naive, dm, hybrid, dm_approx)", "forwards differ");
        CHECK(!memcmp(naive.dv, dm.dv, n * 4) && !memcmp(naive.dv, apx.dv, n * 4),
              "fp8 modes: dV = P̂^T dÔ is independent of D (bitwise equal in naive, dm, dm_approx)", "dV differs");
        CHECK(memcmp(naive.dq, dm.dq, n * 4) != 0 && memcmp(naive.dq, apx.dq, n * 4) != 0,
              "fp8 modes: dQ differs between stale, matched and approximate D", "dQ identical");
        long long tri = (long long)c.T * (c.T + 1) / 2;
        CHECK(dm.st.casts[CAST_P] == 2 * tri && dm.st.casts[CAST_DS] == tri && dm.st.casts[CAST_Q] == (long long)n &&
                  dm.st.casts[CAST_DO] == (long long)n && hyb.st.casts[CAST_DS] == 0 && hyb.st.casts[CAST_P] == tri,
              "stats: casts counted per kind (P forward + dV, dS per causal element, Q and dO per value)",
              "P %lld (want %lld) dS %lld (want %lld) Q %lld dO %lld hybrid dS %lld P %lld", dm.st.casts[CAST_P], 2 * tri,
              dm.st.casts[CAST_DS], tri, dm.st.casts[CAST_Q], dm.st.casts[CAST_DO], hyb.st.casts[CAST_DS],
              hyb.st.casts[CAST_P]);
        long long sat = 0;
        for (int i = 0; i < ATTN_N_CASTS; i++) sat += dm.st.saturated[i];
        CHECK(sat == 0, "stats: block scaling and p_scale 256 never saturate", "%lld saturated", sat);
        AttnOptions big_p = opts(ATTN_FP8_DM, FP8_E5M2, 128, 128);
        big_p.p_scale = 1024.0f;  // P > 448/1024 saturates
        Run r = run(&c, big_p);
        CHECK(r.st.saturated[CAST_P] > 0, "stats: p_scale 1024 saturates P and is counted", "%lld",
              r.st.saturated[CAST_P]);
        run_free(&r);
        run_free(&naive); run_free(&dm); run_free(&hyb); run_free(&apx);
        case_free(&c);
    }

    // (e) Block sizes: exact modes do not care; FP8 P depends on block_k (and still works).
    {
        Case c = case_make(320, 64, 41, 2.0f);
        size_t n = (size_t)c.T * c.d;
        Run a = run(&c, opts(ATTN_FP32, FP8_E4M3, 128, 128)), b = run(&c, opts(ATTN_FP32, FP8_E4M3, 64, 32));
        double dO = rel_diff(a.o, b.o, n), dQ = rel_diff(a.dq, b.dq, n);
        CHECK(dO < 1e-6 && dQ < 1e-6, "block sizes: fp32 results independent of block_q/block_k (to FP32 rounding)",
              "O %.2e dQ %.2e", dO, dQ);
        run_free(&a); run_free(&b);
        a = run(&c, opts(ATTN_BF16, FP8_E4M3, 128, 128)); b = run(&c, opts(ATTN_BF16, FP8_E4M3, 128, 64));
        dO = rel_diff(a.o, b.o, n); dQ = rel_diff(a.dq, b.dq, n);
        CHECK(dO < 5e-3 && dQ < 5e-3, "block sizes: bf16 results nearly independent of block_k", "O %.2e dQ %.2e", dO, dQ);
        run_free(&a); run_free(&b);
        a = run(&c, opts(ATTN_FP8_DM, FP8_E4M3, 128, 128)); b = run(&c, opts(ATTN_FP8_DM, FP8_E4M3, 128, 64));
        Run q64 = run(&c, opts(ATTN_FP8_DM, FP8_E4M3, 64, 128));
        dO = rel_diff(a.o, b.o, n);
        CHECK(dO > 0 && dO < 0.1, "block sizes: fp8 P depends on block_k (running max), O changes a little",
              "O rel diff %.2e", dO);
        CHECK(!memcmp(a.o, q64.o, n * 4), "block sizes: fp8 forward independent of block_q (bitwise)", "differs");
        run_free(&a); run_free(&b); run_free(&q64);
        case_free(&c);
    }

    // (g) Delayed scaling: a history from small inputs makes today's larger inputs saturate.
    {
        Case c = case_make(256, 64, 51, 1.0f);
        size_t n = (size_t)c.T * c.d;
        AttnOptions o = opts(ATTN_FP8_DM, FP8_E4M3, 128, 128);
        o.scaling = SCALING_DELAYED;
        AttnDelayedState ds;
        attn_delayed_init(&ds, 16);
        float *small = xmalloc(n * 4), *out = xmalloc(n * 4), *lse = xmalloc((size_t)c.T * 4);
        for (size_t i = 0; i < n; i++) small[i] = c.q[i] * 0.25f;
        AttnStats st;
        memset(&st, 0, sizeof st);
        attn_cpu_forward(&o, &ds, c.T, c.d, small, small, small, out, lse, &st);
        CHECK(st.saturated[CAST_Q] == 0 && ds.cur_amax[CAST_Q] > 0, "delayed: first step scales from its own amax, no saturation",
              "%lld saturated, cur_amax %g", st.saturated[CAST_Q], ds.cur_amax[CAST_Q]);
        float amax_small = ds.cur_amax[CAST_Q];
        attn_delayed_commit(&ds);
        CHECK(ds.filled == 1 && ds.hist[CAST_Q][0] == amax_small && ds.cur_amax[CAST_Q] == 0,
              "delayed: commit pushes the step's amax into the history", "filled %d", ds.filled);
        memset(&st, 0, sizeof st);
        attn_cpu_forward(&o, &ds, c.T, c.d, c.q, c.k, c.v, out, lse, &st);
        CHECK(st.saturated[CAST_Q] > 0 && st.saturated[CAST_V] > 0 && st.casts[CAST_Q] == (long long)n,
              "delayed: values beyond the stale range saturate and are counted", "Q %lld V %lld of %lld",
              st.saturated[CAST_Q], st.saturated[CAST_V], st.casts[CAST_Q]);
        float *xh = xmalloc(n * 4);
        attn_quantize_operand(&o, &ds, CAST_Q, FP8_E4M3, c.T, c.d, c.q, xh, NULL, NULL, 0);
        float s = fp8_scale_for_amax(FP8_E4M3, amax_small), worst = 0;
        for (size_t i = 0; i < n; i++) worst = fmaxf(worst, fabsf(xh[i]));
        CHECK(worst == 448.0f / s, "delayed: saturated values sit at +-448/s of the history's scale", "max |x_hat| %g vs %g",
              worst, 448.0f / s);
        // Backward with the same state: dO's amax collected, invariant still holds (dm).
        float *dq = xmalloc(n * 4), *dk = xmalloc(n * 4), *dv = xmalloc(n * 4);
        memset(&st, 0, sizeof st);
        attn_cpu_backward(&o, &ds, c.T, c.d, c.q, c.k, c.v, out, lse, c.dout, dq, dk, dv, &st, NULL);
        CHECK(ds.cur_amax[CAST_DO] > 0 && st.resid_cancel_max <= 1e-5, "delayed: backward runs, dm invariant holds",
              "amax dO %g resid %.2e", ds.cur_amax[CAST_DO], st.resid_cancel_max);
        free(dq); free(dk); free(dv); free(xh);
        free(small); free(out); free(lse);
        // V's delayed scale is clamped to 2^+-ATTN_V_SCALE_MAX_EXP as its block scales are, Q's is not
        AttnDelayedState tiny;
        attn_delayed_init(&tiny, 16);
        for (int t = 0; t < 4; t++) tiny.hist[t][0] = 1e-30f;
        tiny.filled = 1;
        float sc[4];
        attn_delayed_scales(&tiny, FP8_E4M3, sc);
        CHECK(sc[CAST_V] == ldexpf(1.0f, ATTN_V_SCALE_MAX_EXP) && sc[CAST_Q] > ldexpf(1.0f, ATTN_V_SCALE_MAX_EXP) &&
                  sc[CAST_Q] == fp8_scale_for_amax(FP8_E4M3, 1e-30f),
              "delayed: V's scale clamped to 2^+-ATTN_V_SCALE_MAX_EXP, Q's not", "V %g Q %g", sc[CAST_V], sc[CAST_Q]);
        case_free(&c);
    }

    // (h) Quantized operands: per-128-token block power-of-two scales, values exactly on the grid.
    {
        Case c = case_make(300, 64, 61, 3.0f);
        size_t n = (size_t)c.T * c.d;
        for (int b = 64; b < 128; b++) c.q[b] *= 1000.0f;  // a block with a very different range
        AttnOptions o = opts(ATTN_FP8_DM, FP8_E5M2, 128, 64);
        float *xh = xmalloc(n * 4), scales[3];
        AttnStats st;
        memset(&st, 0, sizeof st);
        int fmts_bad = 0, not_idem = 0, not_tight = 0;
        for (int f = 0; f < 2; f++) {
            Fp8Format fmt = f ? FP8_E5M2 : FP8_E4M3;
            attn_quantize_operand(&o, NULL, CAST_Q, fmt, c.T, c.d, c.q, xh, scales, &st, 0);
            for (int blk = 0; blk < 3; blk++) {
                int r0 = blk * 128, r1 = r0 + 128 < c.T ? r0 + 128 : c.T;
                float amax = 0;
                for (size_t i = (size_t)r0 * c.d; i < (size_t)r1 * c.d; i++) {
                    amax = fmaxf(amax, fabsf(c.q[i]));
                    float y = xh[i] * scales[blk];
                    if (fp8_round(fmt, y) != y || fabsf(y) > fp8_max(fmt)) fmts_bad++;
                    if (fp8_qdq(fmt, xh[i], scales[blk]) != xh[i]) not_idem++;
                }
                if (!(amax * scales[blk] <= fp8_max(fmt) && 2 * amax * scales[blk] > fp8_max(fmt))) not_tight++;
            }
        }
        CHECK(fmts_bad == 0 && not_idem == 0 && not_tight == 0,
              "quantized operands: x_hat*s on the FP8 grid, quantization idempotent, s the largest for each 128-block",
              "off grid %d, not idempotent %d, scale not tight %d", fmts_bad, not_idem, not_tight);
        CHECK(scales[0] != scales[1] && st.saturated[CAST_Q] == 0, "quantized operands: one scale per 128-token block",
              "scales %g %g %g", scales[0], scales[1], scales[2]);
        // V's block scales are clamped to 2^+-ATTN_V_SCALE_MAX_EXP (the FP8 forward's O units need
        // it), the other operands' are not: a block scaled by 2^-60 gets 2^40 as V, > 2^40 as K
        for (size_t i = 0; i < (size_t)128 * c.d; i++) c.q[i] = ldexpf(c.q[i], -60);
        float sk[3], sv[3];
        attn_quantize_operand(&o, NULL, CAST_K, FP8_E4M3, c.T, c.d, c.q, xh, sk, NULL, 0);
        attn_quantize_operand(&o, NULL, CAST_V, FP8_E4M3, c.T, c.d, c.q, xh, sv, NULL, 0);
        CHECK(sv[0] == ldexpf(1.0f, ATTN_V_SCALE_MAX_EXP) && sk[0] > ldexpf(1.0f, ATTN_V_SCALE_MAX_EXP) && sv[1] == sk[1] && sv[2] == sk[2],
              "quantized operands: V's block scales clamped to 2^+-ATTN_V_SCALE_MAX_EXP, K's not",
              "V %g %g %g, K %g %g %g", sv[0], sv[1], sv[2], sk[0], sk[1], sk[2]);
        free(xh);
        case_free(&c);
    }

    // (i) Ragged T and both head sizes: every mode runs, dm invariant holds.
    {
        const int shapes[][4] = {{200, 64, 128, 128}, {200, 128, 64, 96}, {131, 64, 32, 128}, {1, 64, 128, 128}};
        for (int s = 0; s < 4; s++) {
            Case c = case_make(shapes[s][0], shapes[s][1], 71 + s, 2.0f);
            int finite = 1;
            double worst_resid = 0;
            for (int m = 0; m < ATTN_N_PRECISIONS; m++) {
                AttnEval e = eval(&c, opts((AttnPrecision)m, FP8_E5M2, shapes[s][2], shapes[s][3]));
                if (!(e.err_o < 0.3 && e.err_dq < 0.5 && e.err_dk < 0.5 && e.err_dv < 0.5)) finite = 0;
                if (m == ATTN_FP8_DM) worst_resid = e.stats.resid_cancel_max;
            }
            char name[160];
            snprintf(name, sizeof name, "ragged shapes: T=%d d=%d block %dx%d, all modes finite and sane, dm invariant",
                     shapes[s][0], shapes[s][1], shapes[s][2], shapes[s][3]);
            CHECK(finite && worst_resid <= 1e-5, name, "finite/sane %d, dm residual %.2e", finite, worst_resid);
            case_free(&c);
        }
    }

    // (j) The FP8 forward's weights sum to one (spec §3: l sums the quantized P̂ that multiplies V):
    // with every column of V constant over the rows and a power of two (±2^e, e in [-6, 0], so
    // its codes are exact), O must be V itself, BF16 bit for bit, in every row. Summing the
    // unquantized P' instead misses it by P̂'s rounding, ~1e-2 in the sharp rows of this case.
    {
        const int T = 384, d = 64;
        Case c = case_make(T, d, 91, 3.0f);
        float *vc = xmalloc((size_t)T * d * sizeof(float));
        for (int col = 0; col < d; col++) {
            const float x = ldexpf(col % 2 ? -1.0f : 1.0f, -(col * 5 % 7));
            for (int t = 0; t < T; t++) vc[(size_t)t * d + col] = x;
        }
        memcpy(c.v, vc, (size_t)T * d * sizeof(float));
        const AttnPrecision fp8_modes[] = {ATTN_FP8_NAIVE, ATTN_FP8_HYBRID, ATTN_FP8_DM, ATTN_FP8_DM_APPROX};
        long off = 0;
        for (int m = 0; m < 4; m++) {
            Run r = run(&c, opts(fp8_modes[m], FP8_E4M3, 128, 128));
            for (size_t i = 0; i < (size_t)T * d; i++) off += r.o[i] != vc[i];
            run_free(&r);
        }
        CHECK(off == 0, "fp8 forward: O = V exactly where V's columns are constant powers of two (l sums P-hat)",
              "%ld of %ld values differ", off, 4L * T * d);
        free(vc);
        case_free(&c);
    }

    printf("# test_attention_cpu: %.1f s\n", now_seconds() - t0);
    return test_summary("test_attention_cpu");
}
