// test_attention_cpu.c: the CPU attention emulation (attention_cpu.h) against an FP64 reference
// and against the properties spec docs/fp8-attention.md §2-§4 demands, on seeded
// N(0,1) inputs (never zeros).
#include <math.h>    // fabs, sqrt
#include <string.h>  // memcpy, memcmp

#include "attention_fp8.h"      // attn_mode_supported: the GPU's refusals
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
    AttnOptions o = {.precision = p, .grad_format = g, .scaling = SCALING_BLOCK, .p_scale = 256.0f, .block_q = bq, .block_k = bk};
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

// --- numerics beyond the paper (spec §6) ------------------------------------------------------

// The shared key offset of the offset cases: off * sqrt(d) (a key's norm at sharpness 1) along a
// seeded unit vector, added to every row of k: (T, d).
static void add_key_offset(float *k, int T, int d, double off, uint64_t seed) {
    float *u = xmalloc((size_t)d * sizeof *u);
    attn_fill_normal(u, (size_t)d, seed);
    double norm = 0;
    for (int c = 0; c < d; c++) norm += (double)u[c] * u[c];
    for (int c = 0; c < d; c++) u[c] = (float)(off * sqrt((double)d) * u[c] / sqrt(norm));
    for (int t = 0; t < T; t++)
        for (int c = 0; c < d; c++) k[(size_t)t * d + c] += u[c];
    free(u);
}

// A case on inputs already in c.q .. c.dout: recompute its FP64 reference.
static void case_rereference(Case *c) {
    size_t n = (size_t)c->T * c->d;
    double *x = xmalloc(4 * n * sizeof *x);
    for (size_t i = 0; i < n; i++) {
        x[i] = c->q[i]; x[n + i] = c->k[i]; x[2 * n + i] = c->v[i]; x[3 * n + i] = c->dout[i];
    }
    attn_ref_forward_f64(c->T, c->d, x, x + n, x + 2 * n, c->ro, c->rlse);
    attn_ref_backward_f64(c->T, c->d, x, x + n, x + 2 * n, x + 3 * n, c->rdq, c->rdk, c->rdv);
    free(x);
}

static AttnOptions opts_x(AttnPrecision p, Fp8Format g, AttnCenterKeys ck, int corr) {
    AttnOptions o = opts(p, g, 128, 128);
    o.center_keys = ck;
    o.rowsum_correction = corr;
    return o;
}

// Outputs with a given key centre, and the residuals per row.
typedef struct { float *o, *lse, *dq, *dk, *dv, *resid, *post; AttnStats st; } RunC;
static RunC run_c(const Case *c, AttnOptions o, const float *key_center) {
    size_t n = (size_t)c->T * c->d;
    RunC r;
    memset(&r.st, 0, sizeof r.st);
    r.o = xmalloc(n * 4); r.lse = xmalloc((size_t)c->T * 4);
    r.dq = xmalloc(n * 4); r.dk = xmalloc(n * 4); r.dv = xmalloc(n * 4);
    r.resid = xmalloc((size_t)c->T * 4); r.post = xmalloc((size_t)c->T * 4);
    attn_cpu_forward_centered(&o, NULL, c->T, c->d, c->q, c->k, c->v, key_center, r.o, r.lse, &r.st);
    attn_cpu_backward_centered(&o, NULL, c->T, c->d, c->q, c->k, c->v, key_center, r.o, r.lse, c->dout, r.dq, r.dk,
                               r.dv, &r.st, r.resid, r.post);
    return r;
}
static void run_c_free(RunC *r) {
    free(r->o); free(r->lse); free(r->dq); free(r->dk); free(r->dv); free(r->resid); free(r->post);
}
static int same_run(const RunC *a, const RunC *b, const Case *c) {
    size_t n = (size_t)c->T * c->d;
    return !memcmp(a->o, b->o, n * 4) && !memcmp(a->lse, b->lse, (size_t)c->T * 4) && !memcmp(a->dq, b->dq, n * 4) &&
           !memcmp(a->dk, b->dk, n * 4) && !memcmp(a->dv, b->dv, n * 4);
}

static double max_rel_f64(const double *a, const double *b, size_t n) {
    double num = 0, den = 0;
    for (size_t i = 0; i < n; i++) {
        num = fmax(num, fabs(a[i] - b[i]));
        den = fmax(den, fabs(b[i]));
    }
    return num / (den > 0 ? den : 1);
}

// Centred keys: exact in FP64 (the shifted problem has the unshifted one's O, dQ, dK, dV, and its
// LSE moves by tau q_i . c), and in the emulation the same as the uncentred mode on K - c.
static void test_center_keys(void) {
    {
        const int T = 96, d = 32;
        size_t n = (size_t)T * d;
        Case c = case_make(T, d, 101, 1.5f);
        double *q = xmalloc(n * 8), *ks = xmalloc(n * 8), *v = xmalloc(n * 8), *g = xmalloc(n * 8);
        double *o = xmalloc(n * 8), *lse = xmalloc((size_t)T * 8), *dq = xmalloc(n * 8), *dk = xmalloc(n * 8),
               *dv = xmalloc(n * 8);
        float cvec[32];
        attn_fill_normal(cvec, (size_t)d, 102);
        for (size_t i = 0; i < n; i++) {
            q[i] = c.q[i]; v[i] = c.v[i]; g[i] = c.dout[i];
            ks[i] = c.k[i] - 4.0 * cvec[i % d];  // an arbitrary c, larger than the keys
        }
        attn_ref_forward_f64(T, d, q, ks, v, o, lse);
        attn_ref_backward_f64(T, d, q, ks, v, g, dq, dk, dv);
        double lse_err = 0;
        for (int i = 0; i < T; i++) {
            double qc = 0;
            for (int x = 0; x < d; x++) qc += q[(size_t)i * d + x] * 4.0 * cvec[x];
            lse_err = fmax(lse_err, fabs(lse[i] - (c.rlse[i] - qc / sqrt((double)d))));
        }
        double eo = max_rel_f64(o, c.ro, n), eq = max_rel_f64(dq, c.rdq, n), ek = max_rel_f64(dk, c.rdk, n),
               ev = max_rel_f64(dv, c.rdv, n);
        CHECK(eo < 1e-12 && eq < 1e-12 && ek < 1e-12 && ev < 1e-12 && lse_err < 1e-12,
              "centred keys: FP64 attention on K - c equals it on K (O, dQ, dK, dV; LSE moves by tau q.c)",
              "O %.1e dQ %.1e dK %.1e dV %.1e LSE %.1e", eo, eq, ek, ev, lse_err);
        free(q); free(ks); free(v); free(g); free(o); free(lse); free(dq); free(dk); free(dv);
        case_free(&c);
    }
    {
        Case c = case_make(200, 64, 103, 2.0f);
        add_key_offset(c.k, c.T, c.d, 3.0, 104);
        size_t n = (size_t)c.T * c.d;
        float mean[64], other[64];
        attn_key_mean(c.T, c.d, c.k, mean);
        attn_fill_normal(other, 64, 105);
        for (int x = 0; x < 64; x++) other[x] = bf16_round(mean[x] + 0.3f * other[x]);  // a stale estimate
        Case sh = c;  // the same inputs with the keys shifted by hand
        float *k_mean = xmalloc(n * 4), *k_other = xmalloc(n * 4);
        for (size_t i = 0; i < n; i++) { k_mean[i] = c.k[i] - mean[i % 64]; k_other[i] = c.k[i] - other[i % 64]; }
        const AttnPrecision modes[] = {ATTN_FP8_NAIVE, ATTN_FP8_HYBRID, ATTN_FP8_DM, ATTN_FP8_DM_APPROX, ATTN_FP8_HYBRID_DM};
        int bad_mean = 0, bad_delayed = 0, bad_first = 0;
        for (int m = 0; m < 5; m++) {
            sh.k = k_mean;
            RunC want = run_c(&sh, opts_x(modes[m], FP8_E4M3, CENTER_KEYS_OFF, 0), NULL);
            RunC got = run_c(&c, opts_x(modes[m], FP8_E4M3, CENTER_KEYS_MEAN, 0), other);  // mean ignores it
            RunC first = run_c(&c, opts_x(modes[m], FP8_E4M3, CENTER_KEYS_DELAYED, 0), NULL);
            bad_mean += !same_run(&want, &got, &c);
            bad_first += !same_run(&want, &first, &c);
            run_c_free(&want); run_c_free(&got); run_c_free(&first);
            sh.k = k_other;
            want = run_c(&sh, opts_x(modes[m], FP8_E4M3, CENTER_KEYS_OFF, 0), NULL);
            got = run_c(&c, opts_x(modes[m], FP8_E4M3, CENTER_KEYS_DELAYED, 0), other);
            bad_delayed += !same_run(&want, &got, &c);
            run_c_free(&want); run_c_free(&got);
        }
        CHECK(bad_mean == 0 && bad_delayed == 0 && bad_first == 0,
              "centred keys: every FP8 mode with c = mean (or a given delayed c, or none: the mean) is the "
              "uncentred mode on K - c, bit for bit (O, LSE, dQ, dK, dV)",
              "%d mean, %d delayed, %d first-step modes differ", bad_mean, bad_delayed, bad_first);
        int differ = 0;
        for (int p = 0; p < 2; p++) {
            RunC a = run_c(&c, opts_x((AttnPrecision)p, FP8_E4M3, CENTER_KEYS_OFF, 0), NULL);
            RunC b = run_c(&c, opts_x((AttnPrecision)p, FP8_E4M3, CENTER_KEYS_MEAN, 1), NULL);
            differ += !same_run(&a, &b, &c);
            run_c_free(&a); run_c_free(&b);
        }
        CHECK(differ == 0, "centred keys and the correction: fp32 and bf16 ignore them (bit for bit)", "%d differ", differ);
        free(k_mean); free(k_other);
        case_free(&c);
    }
}

// Offset keys: the FP8 errors rise well above the zero-mean level; centred keys (the current mean
// or a delayed one from another draw) bring them back; the row-sum correction part of dQ's.
static void test_offset_inputs(void) {
    const int T = 384, d = 64;
    for (int g = 0; g < 2; g++) {
        Fp8Format gf = g ? FP8_E5M2 : FP8_E4M3;
        const char *gn = g ? "e5m2" : "e4m3";
        Case zero = case_make(T, d, 111, 1.0f);
        Case off = case_make(T, d, 111, 1.0f);  // the same draws, keys offset by 3 norms
        add_key_offset(off.k, T, d, 3.0, 112);
        case_rereference(&off);
        Case prev = case_make(T, d, 113, 1.0f);  // "the previous micro-batch": another draw, same offset
        add_key_offset(prev.k, T, d, 3.0, 112);
        float c_prev[64];
        attn_key_mean(T, d, prev.k, c_prev);
        const AttnPrecision modes[] = {ATTN_FP8_NAIVE, ATTN_FP8_DM, ATTN_FP8_HYBRID, ATTN_FP8_HYBRID_DM};
        const char *names[] = {"fp8_naive", "fp8_dm", "fp8_hybrid", "fp8_hybrid_dm"};
        for (int m = 0; m < 4; m++) {
            AttnEval z = eval(&zero, opts_x(modes[m], gf, CENTER_KEYS_OFF, 0));
            AttnEval o = eval(&off, opts_x(modes[m], gf, CENTER_KEYS_OFF, 0));
            AttnEval cm = eval(&off, opts_x(modes[m], gf, CENTER_KEYS_MEAN, 0));
            AttnEval cd;
            AttnOptions od = opts_x(modes[m], gf, CENTER_KEYS_DELAYED, 0);
            attn_eval_mode_centered(&od, c_prev, T, d, off.q, off.k, off.v, off.dout, off.ro, off.rdq, off.rdk, off.rdv, &cd);
            char name[200];
            snprintf(name, sizeof name, "offset keys (3 norms), %s %s: O and dQ errors well above zero-mean inputs'", names[m], gn);
            CHECK(o.err_o > 1.4 * z.err_o && o.err_dq > 1.4 * z.err_dq, name, "O %.4f vs %.4f, dQ %.4f vs %.4f", o.err_o,
                  z.err_o, o.err_dq, z.err_dq);
            snprintf(name, sizeof name, "offset keys, %s %s: centred keys (mean, delayed) bring O, dQ, dK, dV to the "
                     "zero-mean level (within 15%%)", names[m], gn);
            int ok = 1;
            const AttnEval *cs[2] = {&cm, &cd};
            for (int k = 0; k < 2; k++)
                ok &= cs[k]->err_o < 1.15 * z.err_o && cs[k]->err_dq < 1.15 * z.err_dq && cs[k]->err_dk < 1.15 * z.err_dk &&
                      cs[k]->err_dv < 1.15 * z.err_dv;
            CHECK(ok, name, "zero-mean O %.4f dQ %.4f dK %.4f dV %.4f; mean %.4f %.4f %.4f %.4f; delayed %.4f %.4f %.4f %.4f",
                  z.err_o, z.err_dq, z.err_dk, z.err_dv, cm.err_o, cm.err_dq, cm.err_dk, cm.err_dv, cd.err_o, cd.err_dq,
                  cd.err_dk, cd.err_dv);
            if (modes[m] == ATTN_FP8_NAIVE || modes[m] == ATTN_FP8_DM) {
                AttnEval r = eval(&off, opts_x(modes[m], gf, CENTER_KEYS_OFF, 1));
                AttnEval zr = eval(&zero, opts_x(modes[m], gf, CENTER_KEYS_OFF, 1));
                // The correction removes the residual's push along the mean key, not K̂'s coarser
                // rounding (the offset takes K's range), which centred keys remove too.
                snprintf(name, sizeof name, "offset keys, %s %s: the row-sum correction lowers dQ's error (by 10%% or more), "
                         "centred keys lower it further; on zero-mean inputs it does not raise it", names[m], gn);
                CHECK(r.err_dq < 0.9 * o.err_dq && cm.err_dq < r.err_dq && zr.err_dq <= 1.01 * z.err_dq, name,
                      "dQ %.4f -> %.4f with the correction, %.4f with centred keys; zero-mean %.4f -> %.4f", o.err_dq,
                      r.err_dq, cm.err_dq, z.err_dq, zr.err_dq);
            }
        }
        case_free(&zero); case_free(&off); case_free(&prev);
    }
}

// The row-sum correction: dQ of a dS whose rows sum to zero; it changes dQ only.
static void test_rowsum_correction(void) {
    // All keys equal: the exact dQ is 0 (dQ_i = tau sum_j dS_ij k = 0), the uncorrected FP8 dQ is
    // tau r_i k (r_i the cast's row sum), the corrected one 0 up to FP32 rounding.
    Case c = case_make(256, 64, 121, 1.0f);
    for (int t = 1; t < c.T; t++) memcpy(c.k + (size_t)t * c.d, c.k, (size_t)c.d * 4);
    case_rereference(&c);
    size_t n = (size_t)c.T * c.d;
    double ref_dq = 0, ref_dk = 0;
    for (size_t i = 0; i < n; i++) { ref_dq = fmax(ref_dq, fabs(c.rdq[i])); ref_dk = fmax(ref_dk, fabs(c.rdk[i])); }
    CHECK(ref_dq < 1e-12 * ref_dk && ref_dk > 0, "correction: with all keys equal the FP64 dQ is 0",
          "max |dQ| %.2e, max |dK| %.2e", ref_dq, ref_dk);
    const AttnPrecision modes[] = {ATTN_FP8_NAIVE, ATTN_FP8_DM, ATTN_FP8_HYBRID, ATTN_FP8_DM_APPROX, ATTN_FP8_HYBRID_DM};
    int bad = 0;
    double worst = 0, plain_least = INFINITY;
    for (int m = 0; m < 5; m++)
        for (int g = 0; g < 2; g++) {
            Fp8Format gf = g ? FP8_E5M2 : FP8_E4M3;
            RunC a = run_c(&c, opts_x(modes[m], gf, CENTER_KEYS_OFF, 0), NULL);
            RunC b = run_c(&c, opts_x(modes[m], gf, CENTER_KEYS_OFF, 1), NULL);
            double na = 0, nb = 0;
            for (size_t i = 0; i < n; i++) { na += (double)a.dq[i] * a.dq[i]; nb += (double)b.dq[i] * b.dq[i]; }
            worst = fmax(worst, sqrt(nb / na));
            plain_least = fmin(plain_least, sqrt(na));
            // the correction touches dQ alone
            bad += memcmp(a.o, b.o, n * 4) || memcmp(a.dk, b.dk, n * 4) || memcmp(a.dv, b.dv, n * 4) ||
                   memcmp(a.post, b.post, (size_t)c.T * 4);
            run_c_free(&a); run_c_free(&b);
        }
    CHECK(worst < 1e-4 && plain_least > 0, "correction: with all keys equal the corrected dQ is 0 in every FP8 mode "
          "(FP32 rounding of the uncorrected r_i k)", "corrected/uncorrected %.2e", worst);
    CHECK(bad == 0, "correction: O, dK, dV and the post-cast residual bitwise unchanged", "%d modes differ", bad);
    case_free(&c);
}

// The residual of the cast dS: equal to the FP32 one where nothing is cast (fp32), the invariant
// broken by the cast in fp8_dm and fp8_hybrid_dm (though not before it), and bounded by the cast's
// rounding.
static void test_post_cast_residual(void) {
    Case c = case_make(384, 64, 131, 1.0f);
    RunC f = run_c(&c, opts_x(ATTN_FP32, FP8_E4M3, CENTER_KEYS_OFF, 0), NULL);
    CHECK(!memcmp(f.resid, f.post, (size_t)c.T * 4) && f.st.post_resid_max == f.st.resid_max,
          "post-cast residual: fp32 (no cast) equals the FP32 residual row for row", "differs");
    run_c_free(&f);
    for (int g = 0; g < 2; g++) {
        Fp8Format gf = g ? FP8_E5M2 : FP8_E4M3;
        AttnEval dm = eval(&c, opts_x(ATTN_FP8_DM, gf, CENTER_KEYS_OFF, 0));
        AttnEval naive = eval(&c, opts_x(ATTN_FP8_NAIVE, gf, CENTER_KEYS_OFF, 0));
        AttnEval hdm = eval(&c, opts_x(ATTN_FP8_HYBRID_DM, gf, CENTER_KEYS_OFF, 0));
        char name[160];
        snprintf(name, sizeof name, "post-cast residual %s: fp8_dm's cast breaks the invariant (median 1e-4..3e-2), "
                 "below fp8_naive's; fp8_hybrid_dm's BF16 cast less", g ? "e5m2" : "e4m3");
        CHECK(dm.resid_median < 1e-5 && dm.post_median > 1e-4 && dm.post_median < 3e-2 && dm.post_median < naive.post_median &&
                  hdm.post_median < dm.post_median && hdm.post_median > 0,
              name, "fp8_dm %.2e (before the cast %.2e), naive %.2e, hybrid_dm %.2e", dm.post_median, dm.resid_median,
              naive.post_median, hdm.post_median);
    }
    case_free(&c);
}

// fp8_hybrid_dm: fp8_hybrid's forward and dV, a matched D over its own BF16 P and dP.
static void test_hybrid_dm(void) {
    for (int sharp = 1; sharp <= 3; sharp++) {
        Case c = case_make(320, 64, 141 + sharp, (float)sharp);
        size_t n = (size_t)c.T * c.d;
        Run h = run(&c, opts(ATTN_FP8_HYBRID, FP8_E4M3, 128, 128));
        Run hd = run(&c, opts(ATTN_FP8_HYBRID_DM, FP8_E4M3, 128, 128));
        char name[160];
        snprintf(name, sizeof name, "fp8_hybrid_dm: fp8_hybrid's O, LSE and dV bit for bit, another dQ (sharpness %d)", sharp);
        CHECK(!memcmp(h.o, hd.o, n * 4) && !memcmp(h.lse, hd.lse, (size_t)c.T * 4) && !memcmp(h.dv, hd.dv, n * 4) &&
                  memcmp(h.dq, hd.dq, n * 4) != 0 && hd.st.casts[CAST_DS] == 0 && hd.st.casts[CAST_DO] == 0,
              name, "differs (dS casts %lld, dO casts %lld)", hd.st.casts[CAST_DS], hd.st.casts[CAST_DO]);
        AttnEval eh = eval(&c, opts(ATTN_FP8_HYBRID, FP8_E4M3, 128, 128));
        AttnEval ehd = eval(&c, opts(ATTN_FP8_HYBRID_DM, FP8_E4M3, 128, 128));
        snprintf(name, sizeof name, "fp8_hybrid_dm: row-sum invariant within attn_invariant_tol (fp8_hybrid's is broken), "
                 "dQ and dK not worse than fp8_hybrid's (sharpness %d)", sharp);
        CHECK(ehd.stats.resid_cancel_max <= attn_invariant_tol(c.T) && eh.stats.resid_cancel_max > 1e-4 && ehd.err_dq <= eh.err_dq &&
                  ehd.err_dk <= eh.err_dk,
              name, "cancel %.2e (hybrid %.2e), dQ %.4f vs %.4f, dK %.4f vs %.4f", ehd.stats.resid_cancel_max,
              eh.stats.resid_cancel_max, ehd.err_dq, eh.err_dq, ehd.err_dk, eh.err_dk);
        run_free(&h); run_free(&hd);
        case_free(&c);
    }
}

// The GPU refuses what it does not implement, with the key in the message.
static void test_gpu_refusals(void) {
    AttnOptions o = opts(ATTN_FP8_HYBRID_DM, FP8_E4M3, 128, 128);
    const char *why = NULL;
    int r1 = attn_mode_supported(&o, 64, &why);
    int ok = r1 != 0 && why && strstr(why, "fp8_hybrid_dm");
    o = opts_x(ATTN_FP8_DM, FP8_E4M3, CENTER_KEYS_DELAYED, 0);
    why = NULL;
    ok &= attn_mode_supported(&o, 64, &why) != 0 && why && strstr(why, "precision.attention_center_keys");
    o = opts_x(ATTN_FP8_NAIVE, FP8_E4M3, CENTER_KEYS_OFF, 1);
    why = NULL;
    ok &= attn_mode_supported(&o, 64, &why) != 0 && why && strstr(why, "precision.attention_rowsum_correction");
    o = opts_x(ATTN_FP8_DM, FP8_E4M3, CENTER_KEYS_OFF, 0);
    ok &= attn_mode_supported(&o, 64, NULL) == 0;
    CHECK(ok, "GPU: attn_mode_supported refuses fp8_hybrid_dm, centred keys and the correction, naming the key",
          "last reason: %s", why ? why : "(none)");
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
            snprintf(name, sizeof name, "fp8_dm row-sum invariant within attn_invariant_tol (sharpness %d, %s)", sharp, gn);
            CHECK(dm.stats.resid_cancel_max <= attn_invariant_tol(c.T) && dm.resid_median <= 1e-5, name,
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
        snprintf(name, sizeof name, "fp32 row-sum invariant within attn_invariant_tol (sharpness %d)", sharp);
        CHECK(f32.stats.resid_cancel_max <= attn_invariant_tol(c.T), name, "max %.3e", f32.stats.resid_cancel_max);
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

    // The bound grows with T: at T = 2048 (sharpness 2) the fp32 mode's FP32 rounding exceeds a
    // fixed 1e-5; it and fp8_dm stay within attn_invariant_tol.
    {
        Case c = case_make(2048, 64, 1, 2.0f);
        AttnEval f32 = eval(&c, opts(ATTN_FP32, FP8_E4M3, 128, 128));
        AttnEval dm = eval(&c, opts(ATTN_FP8_DM, FP8_E4M3, 128, 128));
        CHECK(f32.stats.resid_cancel_max <= attn_invariant_tol(c.T) && dm.stats.resid_cancel_max <= attn_invariant_tol(c.T),
              "row-sum invariant at T=2048: fp32 and fp8_dm within attn_invariant_tol(T) = T 2^-24",
              "fp32 %.3e, fp8_dm %.3e, bound %.3e", f32.stats.resid_cancel_max, dm.stats.resid_cancel_max,
              attn_invariant_tol(c.T));
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
        CHECK(ds.cur_amax[CAST_DO] > 0 && st.resid_cancel_max <= attn_invariant_tol(c.T), "delayed: backward runs, dm invariant holds",
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
            CHECK(finite && worst_resid <= attn_invariant_tol(shapes[s][0]), name, "finite/sane %d, dm residual %.2e", finite, worst_resid);
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

    test_center_keys();
    test_offset_inputs();
    test_rowsum_correction();
    test_post_cast_residual();
    test_hybrid_dm();
    test_gpu_refusals();

    printf("# test_attention_cpu: %.1f s\n", now_seconds() - t0);
    return test_summary("test_attention_cpu");
}
