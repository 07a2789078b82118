// attn_check.c: `train_gpt attn-check`, spec §4 (docs/fp8-attention.md) on the CPU
// emulation or (--device gpu) on the GPU kernels: for attention from diffuse to sharp (Q and K
// scaled by 1, 2, 3), every precision's row-sum residual of dS and relative L2 errors of O, dQ,
// dK, dV against the FP64 reference on the same unquantized inputs; on the GPU each mode also
// next to its CPU emulation (spec §4.3). Exit status 1 when fp8_dm (or fp8_hybrid_dm) breaks the
// row-sum invariant, 2 when --device gpu finds no CUDA device.
//
// Inputs (spec §6): N(0,1) draws, optionally with a shared key and query offset and outlier key
// channels, or (--from-checkpoint, CPU) one head's real Q, K, V, dO from a trained checkpoint on a
// validation window. On the CPU each FP8 mode can run with centred keys and the row-sum
// correction (--center-keys, --rowsum-correction), and every row shows the post-cast residual.
#include "eval/attn_check.h"
#include "cpu/attention_cpu.h"
#include "cpu/model_cpu.h"  // cpu_model_attention_inputs: --from-checkpoint

#include <math.h>    // sqrt, log, cos
#include <stdint.h>  // uint64_t
#include <stdlib.h>    // strtol, strtod, qsort
#include <string.h>    // strcmp, strncmp
#include <sys/stat.h>  // stat: a checkpoint directory or file

#include "attention_fp8.h"        // attn_mode_supported, attn_mode_block_sizes (--device gpu)
#include "eval/attn_check_gpu.h"  // attn_eval_mode_gpu, AttnGpuEval
#include "core/checkpoint.h"      // checkpoint_read_config, checkpoint_load: --from-checkpoint
#include "core/common.h"          // xmalloc
#include "core/config.h"          // attn_precision_name, grad_format_name, scaling_name
#include "dataloader.h"           // the validation window of --from-checkpoint
#include "core/fp8.h"             // bf16_round: the GPU's inputs and outputs are BF16
#include "gpu/gpu_info.h"         // gpu_info_query: is there a GPU for --device gpu
#include "core/rng.h"             // splitmix64_next for the seeded inputs


// --- seeded normal draws (splitmix64 + Box-Muller) --------------------------------------------
static double uniform01(uint64_t *s) { return ((double)(splitmix64_next(s) >> 11) + 0.5) * 0x1.0p-53; }

void attn_fill_normal(float *x, size_t n, uint64_t seed) {
    uint64_t s = seed;
    for (size_t i = 0; i < n; i += 2) {
        double r = sqrt(-2.0 * log(uniform01(&s))), t = 6.283185307179586 * uniform01(&s);
        x[i] = (float)(r * cos(t));
        if (i + 1 < n) x[i + 1] = (float)(r * sin(t));
    }
}

// --- one mode against the reference -----------------------------------------------------------
static double rel_l2(const float *x, const double *ref, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)x[i] - ref[i];
        num += e * e;
        den += ref[i] * ref[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

static int cmp_float(const void *a, const void *b) {
    float x = *(const float *)a, y = *(const float *)b;
    return (x > y) - (x < y);
}

static double median_of(float *x, int T) {  // sorts x
    qsort(x, (size_t)T, sizeof *x, cmp_float);
    return T % 2 ? x[T / 2] : 0.5 * ((double)x[T / 2 - 1] + x[T / 2]);
}

// attn_eval_mode into caller-owned outputs o, dq, dk, dv: (T, d), so that --device gpu can
// compare the emulation's outputs with the GPU's.
static void eval_mode_into(const AttnOptions *opt, const float *key_center, int T, int d, const float *q,
                           const float *k, const float *v, const float *dout, const double *ref_o,
                           const double *ref_dq, const double *ref_dk, const double *ref_dv, float *o, float *dq,
                           float *dk, float *dv, AttnEval *out) {
    size_t n = (size_t)T * d;
    float *lse = xmalloc((size_t)T * sizeof *lse), *resid = xmalloc(2 * (size_t)T * sizeof *resid);
    AttnDelayedState ds;
    attn_delayed_init(&ds, 16);  // a fresh layer: the scales come from this step's own amax
    memset(out, 0, sizeof *out);
    attn_cpu_forward_centered(opt, &ds, T, d, q, k, v, key_center, o, lse, &out->stats);
    attn_cpu_backward_centered(opt, &ds, T, d, q, k, v, key_center, o, lse, dout, dq, dk, dv, &out->stats, resid,
                               resid + T);
    out->err_o = rel_l2(o, ref_o, n);
    out->err_dq = rel_l2(dq, ref_dq, n);
    out->err_dk = rel_l2(dk, ref_dk, n);
    out->err_dv = rel_l2(dv, ref_dv, n);
    out->resid_max = out->stats.resid_max;
    out->resid_median = median_of(resid, T);
    out->post_max = out->stats.post_resid_max;
    out->post_median = median_of(resid + T, T);
    free(lse); free(resid);
}

void attn_eval_mode_centered(const AttnOptions *opt, const float *key_center, int T, int d, const float *q,
                             const float *k, const float *v, const float *dout, const double *ref_o,
                             const double *ref_dq, const double *ref_dk, const double *ref_dv, AttnEval *out) {
    size_t n = (size_t)T * d;
    float *o = xmalloc(n * sizeof *o), *dq = xmalloc(n * sizeof *dq);
    float *dk = xmalloc(n * sizeof *dk), *dv = xmalloc(n * sizeof *dv);
    eval_mode_into(opt, key_center, T, d, q, k, v, dout, ref_o, ref_dq, ref_dk, ref_dv, o, dq, dk, dv, out);
    free(o); free(dq); free(dk); free(dv);
}

void attn_eval_mode(const AttnOptions *opt, int T, int d, const float *q, const float *k,
                    const float *v, const float *dout, const double *ref_o, const double *ref_dq,
                    const double *ref_dk, const double *ref_dv, AttnEval *out) {
    attn_eval_mode_centered(opt, NULL, T, d, q, k, v, dout, ref_o, ref_dq, ref_dk, ref_dv, out);
}

// --- command line -----------------------------------------------------------------------------
static void usage(FILE *f) {
    fprintf(f,
            "usage: train_gpt attn-check [--T N] [--d N] [--seed N] [--grad-format e4m3|e5m2]\n"
            "                            [--block-q N] [--block-k N] [--device cpu|gpu] [--sharpness N]\n"
            "                            [--key-offset A] [--query-offset A] [--outliers N] [--outlier-scale S]\n"
            "                            [--from-checkpoint PATH [--layer L] [--head H] [--window W] [--data GLOB]]\n"
            "                            [--center-keys LIST] [--rowsum-correction LIST]\n"
            "Runs the FP8 attention checks of docs/fp8-attention.md section 4 on the CPU\n"
            "emulation (one causal head): row-sum residual of dS, before and after its cast, and\n"
            "relative L2 error of O, dQ, dK, dV against an FP64 reference, for every attention\n"
            "precision. Defaults: --T 1024 --d 64 --seed 1 --grad-format e4m3 --block-q 128\n"
            "--block-k 128 --device cpu, sharpness 1, 2 and 3.\n"
            "Inputs: Q, K, V, dO ~ N(0,1), Q and K times the sharpness; --key-offset A (--query-offset)\n"
            "adds one seeded vector of A times a key's (query's) norm to every key (query); --outliers N\n"
            "multiplies N seeded channels of K by --outlier-scale S (default 1000) and divides Q's by S,\n"
            "which leaves the exact attention as it was. --from-checkpoint (CPU) takes instead the real\n"
            "Q, K, V and dO of layer L, head H (default 0, 0) of a checkpoint (a file, or a run or\n"
            "checkpoint directory) on validation window W (default 0) of --data (default the\n"
            "checkpoint's data.val, else data.train), with T tokens and d the model's head_dim.\n"
            "--center-keys (off, mean, delayed; comma-separated, default off) and --rowsum-correction\n"
            "(off, on) run each FP8 mode once per combination (CPU; delayed: c is the mean of the keys\n"
            "of the next draw, or the next validation window). --device gpu runs the GPU kernels instead\n"
            "(d 64 or 128; every mode but fp32), each next to its CPU emulation on the same BF16\n"
            "inputs. --block-q/--block-k set the CPU emulation's tiles and apply to --device cpu only:\n"
            "the GPU and its emulation use the kernels' own tiles. Exit status: 0; 1 for a bad option\n"
            "or a broken fp8_dm (fp8_hybrid_dm) invariant; 2 when --device gpu finds no CUDA device.\n");
}

// Parses the integer value of option `name` into *out within [lo, hi]; -1 with a message if not.
static int parse_int_opt(const char *name, const char *val, long lo, long hi, int *out) {
    char *end = NULL;
    long x = val ? strtol(val, &end, 10) : 0;
    if (!val || !*val || *end || x < lo || x > hi) {
        fprintf(stderr, "train_gpt attn-check: %s expects an integer in [%ld, %ld], got '%s'\n", name, lo,
                hi, val ? val : "(nothing)");
        return -1;
    }
    *out = (int)x;
    return 0;
}

// The same for a number in [lo, hi].
static int parse_double_opt(const char *name, const char *val, double lo, double hi, double *out) {
    char *end = NULL;
    double x = val ? strtod(val, &end) : 0.0;
    if (!val || !*val || *end || !(x >= lo && x <= hi)) {
        fprintf(stderr, "train_gpt attn-check: %s expects a number in [%g, %g], got '%s'\n", name, lo, hi,
                val ? val : "(nothing)");
        return -1;
    }
    *out = x;
    return 0;
}

// A comma-separated list of names (names[i] for value i) into on[i] = 1; -1 with a message if a
// name is unknown or the list is empty.
static int parse_list_opt(const char *name, const char *val, const char *const *names, int n_names, int *on) {
    for (int i = 0; i < n_names; i++) on[i] = 0;
    int any = 0;
    const char *p = val;
    while (p && *p) {
        size_t len = strcspn(p, ",");
        int found = -1;
        for (int i = 0; i < n_names; i++)
            if (strlen(names[i]) == len && !strncmp(p, names[i], len)) found = i;
        if (found < 0) break;
        on[found] = any = 1;
        p += len;
        if (*p == ',') p++;
        else p = NULL;
    }
    if (!any || p) {
        fprintf(stderr, "train_gpt attn-check: %s expects a comma-separated list of", name);
        for (int i = 0; i < n_names; i++) fprintf(stderr, "%s %s", i ? "," : "", names[i]);
        fprintf(stderr, ", got '%s'\n", val ? val : "(nothing)");
        return -1;
    }
    return 0;
}

// --- inputs and reference (both devices) ------------------------------------------------------
// The synthetic inputs (spec §6): N(0,1) draws, Q and K times the sharpness, then a shared offset
// on every key (query): key_offset (query_offset) times a key's norm sharp * sqrt(d), along one
// seeded unit vector; then `outliers` seeded channels of K times outlier_scale and of Q divided
// by it (Q K^T, and so the exact attention, stays as it was: only what quantization sees moves).
// FP8 rounds relative to each value, so such channels cost little until the small side nears the
// format's subnormals (a scale of 1000 moves dQ's error by ~7%, 10^4 by ~20%); a power-of-two
// scale changes only exponents.
typedef struct {
    double key_offset, query_offset;
    int outliers;
    double outlier_scale;
} InputShape;

// Seed streams: batch 0 draws Q, K, V, dO from seed*4 + 0..3 (as always); batch 1, the "previous
// micro-batch" of the delayed centre, from another stream; the offset directions and the outlier
// channels from a third, so that both batches come from the same "model".
#define BATCH_STREAM 0x100000000ull
#define SHAPE_STREAM 0x300000000ull

static void unit_vector(float *u, int d, uint64_t seed) {
    attn_fill_normal(u, (size_t)d, seed);
    double norm = 0.0;
    for (int c = 0; c < d; c++) norm += (double)u[c] * u[c];
    norm = sqrt(norm);
    for (int c = 0; c < d; c++) u[c] = (float)(u[c] / norm);
}

// Inputs q, k, v, dout: (T, d) of batch 0 or 1 at one sharpness.
static void make_inputs(int T, int d, int seed, int batch, double sharp, const InputShape *sh, float *q, float *k,
                        float *v, float *dout) {
    size_t n = (size_t)T * d;
    uint64_t base = (uint64_t)seed * 4 + (uint64_t)batch * BATCH_STREAM;
    attn_fill_normal(q, n, base + 0);
    attn_fill_normal(k, n, base + 1);
    attn_fill_normal(v, n, base + 2);
    attn_fill_normal(dout, n, base + 3);
    float *uq = xmalloc((size_t)d * sizeof *uq), *uk = xmalloc((size_t)d * sizeof *uk);
    unit_vector(uq, d, (uint64_t)seed * 4 + SHAPE_STREAM + 0);
    unit_vector(uk, d, (uint64_t)seed * 4 + SHAPE_STREAM + 1);
    const double norm = sharp * sqrt((double)d);
    for (size_t i = 0; i < n; i++) {
        int c = (int)(i % (size_t)d);
        q[i] = (float)(q[i] * sharp + sh->query_offset * norm * uq[c]);
        k[i] = (float)(k[i] * sharp + sh->key_offset * norm * uk[c]);
    }
    if (sh->outliers > 0) {  // the first `outliers` channels of a seeded permutation
        int *perm = xmalloc((size_t)d * sizeof *perm);
        for (int c = 0; c < d; c++) perm[c] = c;
        uint64_t st = (uint64_t)seed * 4 + SHAPE_STREAM + 2;
        for (int c = d - 1; c > 0; c--) {
            int j = (int)(splitmix64_next(&st) % (uint64_t)(c + 1)), t = perm[c];
            perm[c] = perm[j];
            perm[j] = t;
        }
        for (int o = 0; o < sh->outliers && o < d; o++)
            for (int t = 0; t < T; t++) {
                size_t x = (size_t)t * d + perm[o];
                k[x] = (float)(k[x] * sh->outlier_scale);
                q[x] = (float)(q[x] / sh->outlier_scale);
            }
        free(perm);
    }
    free(uq); free(uk);
}

// FP64 forward and backward on float inputs q, k, v, dout: (T, d) into ro, rdq, rdk, rdv: (T, d).
static void reference_f64(int T, int d, const float *q, const float *k, const float *v, const float *dout,
                          double *ro, double *rdq, double *rdk, double *rdv) {
    size_t n = (size_t)T * d;
    double *x = xmalloc(4 * n * sizeof *x);  // qd, kd, vd, dod
    for (size_t i = 0; i < n; i++) {
        x[i] = q[i]; x[n + i] = k[i]; x[2 * n + i] = v[i]; x[3 * n + i] = dout[i];
    }
    attn_ref_forward_f64(T, d, x, x + n, x + 2 * n, ro, NULL);
    attn_ref_backward_f64(T, d, x, x + n, x + 2 * n, x + 3 * n, rdq, rdk, rdv);
    free(x);
}

// --- --device gpu -----------------------------------------------------------------------------
// One mode at one sharpness: the GPU kernels, and the CPU emulation of the same mode with the
// GPU's tiles on the same BF16 inputs (spec §4.3: the two must agree up to accumulation order).
typedef struct {
    int run;        // 0: not a GPU mode (fp32)
    int bq, bk;     // the GPU kernels' tiles (attn_mode_block_sizes), which the emulation uses too
    AttnGpuEval gpu;
    AttnEval emu;
    double vs_emu;  // max over O, dQ, dK, dV of the relative L2 distance GPU vs emulation
} GpuRow;

// Relative L2 distance of x from y (both (n) floats); NaN if x has a NaN.
static double rel_dist(const float *x, const float *y, size_t n) {
    double num = 0.0, den = 0.0;
    for (size_t i = 0; i < n; i++) {
        double e = (double)x[i] - y[i];
        num += e * e;
        den += (double)y[i] * y[i];
    }
    return den > 0.0 ? sqrt(num / den) : sqrt(num);
}

// The emulation's outputs e (O, dQ, dK, dV: 4 x (T, d)) rounded to BF16 as the GPU stores them
// (O is BF16 already), its errors measured again on those, and its distance from the GPU's g:
// what remains between the two is accumulation order (and the FP8 ties it flips).
static void emu_as_bf16(GpuRow *r, const float *g, float *e, size_t n, const double *ro, const double *rdq,
                        const double *rdk, const double *rdv) {
    for (size_t i = 0; i < 4 * n; i++) e[i] = bf16_round(e[i]);
    r->emu.err_o = rel_l2(e, ro, n);
    r->emu.err_dq = rel_l2(e + n, rdq, n);
    r->emu.err_dk = rel_l2(e + 2 * n, rdk, n);
    r->emu.err_dv = rel_l2(e + 3 * n, rdv, n);
    r->vs_emu = 0.0;
    for (int t = 0; t < 4; t++) {
        double x = rel_dist(g + (size_t)t * n, e + (size_t)t * n, n);
        r->vs_emu = isnan(x) || x > r->vs_emu ? x : r->vs_emu;  // a NaN stays
    }
}

// Every GPU mode at one sharpness: rows[ATTN_N_PRECISIONS]. q..dout: (T, d), already BF16 values.
static void gpu_sharpness(const AttnOptions *base, int T, int d, const float *q, const float *k, const float *v,
                          const float *dout, const double *ro, const double *rdq, const double *rdk,
                          const double *rdv, GpuRow *rows) {
    size_t n = (size_t)T * d;
    float *out = xmalloc((size_t)ATTN_N_PRECISIONS * 8 * n * sizeof *out);  // per mode: GPU's O dQ dK dV, emulation's
    for (int m = 0; m < ATTN_N_PRECISIONS; m++) {  // the GPU, one mode after another
        AttnOptions opt = *base;
        opt.precision = (AttnPrecision)m;
        GpuRow *r = &rows[m];
        memset(r, 0, sizeof *r);
        r->run = attn_mode_supported(&opt, d, NULL) == 0;
        if (!r->run) continue;
        attn_mode_block_sizes(&opt, d, &r->bq, &r->bk);
        float *g = out + (size_t)m * 8 * n;
        attn_eval_mode_gpu(&opt, T, d, q, k, v, dout, ro, rdq, rdk, rdv, g, g + n, g + 2 * n, g + 3 * n, &r->gpu);
    }
#pragma omp parallel for schedule(dynamic, 1)
    for (int m = 0; m < ATTN_N_PRECISIONS; m++) {  // the emulation, modes in parallel
        GpuRow *r = &rows[m];
        if (!r->run) continue;
        AttnOptions opt = *base;
        opt.precision = (AttnPrecision)m;
        opt.block_q = r->bq;
        opt.block_k = r->bk;
        float *g = out + (size_t)m * 8 * n, *e = g + 4 * n;
        eval_mode_into(&opt, NULL, T, d, q, k, v, dout, ro, rdq, rdk, rdv, e, e + n, e + 2 * n, e + 3 * n, &r->emu);
        emu_as_bf16(r, g, e, n, ro, rdq, rdk, rdv);
    }
    free(out);
}

// A residual cell: "-" where the source does not report it (NaN).
static const char *cell(char *buf, size_t len, double x) {
    if (isnan(x)) snprintf(buf, len, "-");
    else snprintf(buf, len, "%.3e", x);
    return buf;
}

static void print_gpu_row(int sharp, const GpuRow *r, AttnPrecision m) {
    char tiles[32], a[24], b[24];
    snprintf(tiles, sizeof tiles, "%dx%d", r->bq, r->bk);
    printf("%5d  %-14s %-4s %-8s %11s %11s %10.3e %10.3e %10.3e %10.3e %10.3e\n", sharp, attn_precision_name(m), "gpu",
           tiles, cell(a, sizeof a, r->gpu.cancel_median), cell(b, sizeof b, r->gpu.cancel_max), r->gpu.err_o,
           r->gpu.err_dq, r->gpu.err_dk, r->gpu.err_dv, r->vs_emu);
    printf("%5d  %-14s %-4s %-8s %11s %11.3e %10.3e %10.3e %10.3e %10.3e\n", sharp, attn_precision_name(m), "emu",
           tiles, "-", r->emu.stats.resid_cancel_max, r->emu.err_o, r->emu.err_dq, r->emu.err_dk, r->emu.err_dv);
}

static void print_gpu_legend(const GpuInfo *g, int T, int d, int seed, Fp8Format gfmt, float p_scale,
                             int tiles_given) {
    printf("attn-check: one causal head on the GPU (%s, sm_%d%d) vs FP64 reference (spec section 4)\n", g->name,
           g->sm_major, g->sm_minor);
    printf("  T=%d d=%d seed=%d grad_format=%s scaling=block p_scale=%g\n", T, d, seed,
           gfmt == FP8_E5M2 ? "e5m2" : "e4m3", p_scale);
    printf("  inputs Q, K, V, dO ~ N(0,1); Q and K scaled by the sharpness, then rounded to BF16 (the kernels' input\n");
    printf("           format); the FP64 reference and the CPU emulation take the same BF16 values\n");
    printf("  gpu    = attn_forward/attn_backward (attention_fp8.h); emu = the CPU emulation of the same mode with\n");
    printf("           the GPU kernels' tiles (column tiles: block_q x block_k, from attn_mode_block_sizes), its\n");
    printf("           outputs rounded to BF16 as the GPU stores them\n");
    printf("  cancel = |sum_j dS_ij| / sum_j P_ij (|dP_ij| + |D_i|) per row (spec 4.1), median and max over rows;\n");
    printf("           gpu: from the FP8 backward's own FP32 row sums; \"-\" for bf16 and fp8_hybrid, whose backward\n");
    printf("           is the BF16 flash kernel, which does not expose dS row sums; emu: max only\n");
    printf("  err_X  = relative L2 error of X against FP64; vs_emu = max over O, dQ, dK, dV of the relative L2\n");
    printf("           distance of the GPU's outputs from the emulation's (accumulation order; not asserted)\n");
    printf("  fp32 is the CPU backend's reference mode and does not run on the GPU (see --device cpu)\n");
    if (tiles_given) printf("  --block-q/--block-k ignored: they set the CPU emulation's tiles, the GPU uses its own\n");
    printf("\n%5s  %-14s %-4s %-8s %11s %11s %10s %10s %10s %10s %10s\n", "sharp", "mode", "src", "tiles",
           "cancel_med", "cancel_max", "err_O", "err_dQ", "err_dK", "err_dV", "vs_emu");
}

// The closing lines; returns the exit status: 1 when fp8_dm breaks the invariant on the GPU or a
// GPU output is not finite.
static int gpu_verdict(GpuRow res[3][ATTN_N_PRECISIONS], int T) {
    const double tol = attn_invariant_tol(T);
    double dm_max = 0.0, dm_med = 0.0, dm_emu = 0.0, naive_lo = INFINITY, naive_hi = 0.0, naive_max = 0.0;
    double worst = -1.0;  // below any distance: the first GPU row sets it
    int dm_not_worse = 1, finite = 1, worst_m = 0, worst_s = 0;
    for (int s = 0; s < 3; s++) {
        const GpuRow *dm = &res[s][ATTN_FP8_DM], *nv = &res[s][ATTN_FP8_NAIVE];
        dm_max = isnan(dm->gpu.cancel_max) ? INFINITY : fmax(dm_max, dm->gpu.cancel_max);
        dm_med = fmax(dm_med, dm->gpu.cancel_median);
        dm_emu = fmax(dm_emu, dm->emu.stats.resid_cancel_max);
        naive_lo = fmin(naive_lo, nv->gpu.cancel_median);
        naive_hi = fmax(naive_hi, nv->gpu.cancel_median);
        naive_max = fmax(naive_max, nv->gpu.cancel_max);
        if (!(dm->gpu.err_dq <= nv->gpu.err_dq) || !(dm->gpu.err_dk <= nv->gpu.err_dk)) dm_not_worse = 0;
        for (int m = 0; m < ATTN_N_PRECISIONS; m++) {
            const GpuRow *r = &res[s][m];
            if (!r->run) continue;
            if (!isfinite(r->gpu.err_o + r->gpu.err_dq + r->gpu.err_dk + r->gpu.err_dv)) finite = 0;
            if (!isnan(worst) && !(r->vs_emu <= worst)) { worst = r->vs_emu; worst_m = m; worst_s = s + 1; }
        }
    }
    int dm_ok = dm_max <= tol;
    printf("\ninvariant fp8_dm: max residual %.3e <= %.2g: %s  (cancel, GPU row sums; median <= %.3e; emulation max %.3e)\n",
           dm_max, tol, dm_ok ? "OK" : "FAILED", dm_med, dm_emu);
    printf("fp8_naive residual median %.3e..%.3e, max %.3e (cancel, GPU): %s\n", naive_lo, naive_hi, naive_max,
           naive_max > 100 * tol ? "far above the bound (broken, as expected)"
                                                : "UNEXPECTEDLY SMALL (are the row sums measured?)");
    printf("fp8_dm not worse than fp8_naive on dQ and dK at every sharpness (GPU): %s\n", dm_not_worse ? "OK" : "NO");
    printf("GPU vs CPU emulation: largest distance %.3e (%s, sharpness %d)\n", worst,
           attn_precision_name((AttnPrecision)worst_m), worst_s);
    printf("GPU outputs finite in every mode: %s\n", finite ? "OK" : "FAILED");
    return dm_ok && finite ? 0 : 1;
}

// `attn-check --device gpu`: the table on the GPU kernels, every GPU mode next to its emulation.
static int gpu_check(int T, int d, int seed, Fp8Format gfmt, int tiles_given, const InputShape *sh) {
    AttnOptions base = {.precision = ATTN_FP8_DM, .grad_format = gfmt, .scaling = SCALING_BLOCK, .p_scale = 256.0f};
    const char *unsupported = NULL;
    if (attn_mode_supported(&base, d, &unsupported)) {  // a bad option, GPU or not
        fprintf(stderr, "train_gpt attn-check: --device gpu: %s (got --d %d)\n", unsupported, d);
        return 1;
    }
    GpuInfo g;
    char why[256] = "";
    gpu_info_query(&g, why, sizeof why);
    if (g.count == 0) {
        fprintf(stderr, "attn-check: --device gpu: no CUDA device found (%s)\n", why);
        return 2;
    }
    size_t n = (size_t)T * d;
    float *in = xmalloc(4 * n * sizeof *in);  // q, k, v, dout as the GPU sees them
    float *q = in, *k = in + n, *v = in + 2 * n, *dout = in + 3 * n;
    double *ref = xmalloc(4 * n * sizeof *ref);  // O, dQ, dK, dV

    print_gpu_legend(&g, T, d, seed, gfmt, base.p_scale, tiles_given);
    if (sh->key_offset > 0 || sh->query_offset > 0 || sh->outliers > 0)
        printf("  shaped inputs: key offset %g, query offset %g (times a key's / query's norm), %d outlier channels x %g\n\n",
               sh->key_offset, sh->query_offset, sh->outliers, sh->outlier_scale);
    GpuRow res[3][ATTN_N_PRECISIONS];
    for (int sharp = 1; sharp <= 3; sharp++) {
        make_inputs(T, d, seed, 0, sharp, sh, q, k, v, dout);
        for (size_t i = 0; i < 4 * n; i++) in[i] = bf16_round(in[i]);
        reference_f64(T, d, q, k, v, dout, ref, ref + n, ref + 2 * n, ref + 3 * n);
        gpu_sharpness(&base, T, d, q, k, v, dout, ref, ref + n, ref + 2 * n, ref + 3 * n, res[sharp - 1]);
        for (int m = 0; m < ATTN_N_PRECISIONS; m++)
            if (res[sharp - 1][m].run) print_gpu_row(sharp, &res[sharp - 1][m], (AttnPrecision)m);
        fflush(stdout);
    }
    int rc = gpu_verdict(res, T);
    free(in); free(ref);
    return rc;
}

// --- --from-checkpoint ----------------------------------------------------------------------
typedef struct {
    const char *path, *data;  // checkpoint (file or directory); shard glob (NULL: the config's)
    int layer, head, window;
} CkptSource;

// A checkpoint file, a checkpoint directory, or a run directory holding checkpoints/.
static int resolve_checkpoint(const char *arg, char *out, size_t out_len, ErrBuf *e) {
    struct stat st;
    if (stat(arg, &st) != 0 || !S_ISDIR(st.st_mode)) {
        snprintf(out, out_len, "%s", arg);
        return 0;
    }
    if (checkpoint_dir_has_any(arg)) return checkpoint_find_latest(arg, out, out_len, e);
    char sub[4096];
    snprintf(sub, sizeof sub, "%s/checkpoints", arg);
    return checkpoint_find_latest(sub, out, out_len, e);
}

// One head's Q, K, V, dO from a checkpoint on validation window src->window, (T, d) each with d the
// model's head_dim (returned in *d_out; arrays allocated here), and center: (d) the mean of that
// head's keys on the next window (the delayed centre's "previous micro-batch"). The model runs in
// fp32 attention (the inputs are the model's own, not an FP8 mode's); T may exceed its seq_len
// (RoPE has no learned length; *beyond_context says so). 0, or -1 with e filled.
static int checkpoint_inputs(const CkptSource *src, int T, int *d_out, float **io, float **center,
                             int *beyond_context, ErrBuf *e) {
    char path[4096];
    if (resolve_checkpoint(src->path, path, sizeof path, e) != 0) return -1;
    char *text = checkpoint_read_config(path, e);
    if (!text) return -1;
    Config cfg;
    int rc = config_parse(text, path, NULL, 0, &cfg, e);
    free(text);
    if (rc != 0) return -1;
    const ModelConfig *mc = &cfg.model;
    if (src->layer >= mc->n_layer || src->head >= mc->n_head)
        return errf(e, "--from-checkpoint %s: --layer %d --head %d, but the model has %d layers of %d heads", path,
                    src->layer, src->head, mc->n_layer, mc->n_head);
    Config run = cfg;  // the model as attn-check runs it: fp32 attention, T tokens
    run.model.seq_len = T > mc->seq_len ? T : mc->seq_len;
    run.precision.attention = ATTN_FP32;
    run.precision.attention_center_keys = CENTER_KEYS_OFF;
    run.precision.attention_rowsum_correction = 0;
    run.precision.attention_scaling = SCALING_BLOCK;
    *beyond_context = T > mc->seq_len;
    const char *pattern = src->data ? src->data : cfg.data.val[0] ? cfg.data.val : cfg.data.train;
    DataLoader dl;
    ErrBuf e2;
    if (dataloader_open(&dl, pattern, 1, T, 0, 1, 0, cfg.data.seed, mc->vocab_size, &e2) != 0)
        return errf(e, "--from-checkpoint: the validation window comes from %s: %s", pattern, e2.msg);
    if (dataloader_batches_per_epoch(&dl) < src->window + 2) {
        long long have = dataloader_batches_per_epoch(&dl);
        dataloader_close(&dl);
        return errf(e, "--from-checkpoint: %s has %lld windows of %d tokens; --window %d needs %d (that one and the "
                    "next, for the delayed centre)", pattern, have, T, src->window, src->window + 2);
    }
    CpuModel m;
    cpu_model_init(&m, &run, 1, T, cfg.train.seed);
    CheckpointState st = {.model = mc, .table = &m.table, .params = m.params};
    if (checkpoint_load(path, &st, e) != 0) {
        cpu_model_free(&m);
        dataloader_close(&dl);
        return -1;
    }
    const int d = mc->head_dim;
    const size_t n = (size_t)T * d;
    int32_t *tokens = xmalloc((size_t)T * sizeof *tokens), *targets = xmalloc((size_t)T * sizeof *targets);
    *io = xmalloc(8 * n * sizeof **io);  // q, k, v, dout; the next window's q, k, v, dout
    *center = xmalloc((size_t)d * sizeof **center);
    for (int w = 0; w <= src->window + 1; w++) {
        dataloader_next(&dl, tokens, targets);
        if (w == src->window)
            cpu_model_attention_inputs(&m, tokens, targets, src->layer, 0, src->head, *io, *io + n, *io + 2 * n, *io + 3 * n);
        else if (w == src->window + 1)
            cpu_model_attention_inputs(&m, tokens, targets, src->layer, 0, src->head, *io + 4 * n, *io + 5 * n,
                                       *io + 6 * n, *io + 7 * n);
    }
    attn_key_mean(T, d, *io + 5 * n, *center);
    free(tokens); free(targets);
    cpu_model_free(&m);
    dataloader_close(&dl);
    *d_out = d;
    return 0;
}

// --- --device cpu ----------------------------------------------------------------------------
// One row of the table: a precision with centred keys or not and the correction or not.
typedef struct {
    AttnPrecision mode;
    AttnCenterKeys center;
    int correction;
} Variant;

static const char *const CENTER_NAMES[] = {"off", "mean", "delayed"};
static const char *const ONOFF_NAMES[] = {"off", "on"};

// Every precision, and each FP8 one once per centre and correction asked for; returns the count.
static int make_variants(const int center_on[3], const int corr_on[2], Variant *out) {
    int n = 0;
    for (int m = 0; m < ATTN_N_PRECISIONS; m++)
        for (int c = 0; c < 3; c++)
            for (int r = 0; r < 2; r++) {
                int fp8 = attn_precision_is_fp8((AttnPrecision)m);
                if (fp8 ? !center_on[c] || !corr_on[r] : c || r) continue;
                out[n++] = (Variant){(AttnPrecision)m, (AttnCenterKeys)c, r};
            }
    return n;
}

// Every variant on one input set, against the FP64 reference of those inputs; prints one row each
// under `label` (the sharpness, or "real"). center: (d) the delayed form's c.
static void cpu_input_set(const AttnOptions *base, const Variant *vs, int nv, const char *label, int T, int d,
                          const float *q, const float *k, const float *v, const float *dout, const float *center,
                          AttnEval *res) {
    size_t n = (size_t)T * d;
    double *ref = xmalloc(4 * n * sizeof *ref);  // O, dQ, dK, dV
    reference_f64(T, d, q, k, v, dout, ref, ref + n, ref + 2 * n, ref + 3 * n);
#pragma omp parallel for schedule(dynamic, 1)
    for (int i = 0; i < nv; i++) {
        AttnOptions opt = *base;
        opt.precision = vs[i].mode;
        opt.center_keys = vs[i].center;
        opt.rowsum_correction = vs[i].correction;
        attn_eval_mode_centered(&opt, center, T, d, q, k, v, dout, ref, ref + n, ref + 2 * n, ref + 3 * n, &res[i]);
    }
    for (int i = 0; i < nv; i++) {
        const AttnEval *r = &res[i];
        printf("%5s  %-14s %-7s %-4s %10.3e %10.3e %10.3e %10.3e %10.3e %9.3e %9.3e %9.3e %9.3e\n", label,
               attn_precision_name(vs[i].mode), CENTER_NAMES[vs[i].center], ONOFF_NAMES[vs[i].correction],
               r->resid_median, r->resid_max, r->stats.resid_cancel_max, r->post_median, r->post_max, r->err_o,
               r->err_dq, r->err_dk, r->err_dv);
    }
    fflush(stdout);
    free(ref);
}

// The closing lines over every input set (res: (n_sets, nv)); returns the exit status: 1 when
// fp8_dm or fp8_hybrid_dm breaks the invariant (attn_invariant_tol(T)).
static int cpu_verdict(const Variant *vs, int nv, const AttnEval *res, int n_sets, int T) {
    const double tol = attn_invariant_tol(T);
    double dm_max = 0.0, hdm_max = 0.0, bf16_max = 0.0, naive_lo = INFINITY, naive_hi = 0.0, dm_med = 0.0;
    int dm_not_worse = 1;
    for (int s = 0; s < n_sets; s++) {
        const AttnEval *row = res + (size_t)s * nv;
        const AttnEval *dm = NULL, *naive = NULL;
        for (int i = 0; i < nv; i++) {
            const int plain = vs[i].center == CENTER_KEYS_OFF && !vs[i].correction;
            if (vs[i].mode == ATTN_FP8_DM) dm_max = fmax(dm_max, row[i].stats.resid_cancel_max);
            if (vs[i].mode == ATTN_FP8_HYBRID_DM) hdm_max = fmax(hdm_max, row[i].stats.resid_cancel_max);
            if (vs[i].mode == ATTN_BF16) bf16_max = fmax(bf16_max, row[i].stats.resid_cancel_max);
            if (vs[i].mode == ATTN_FP8_DM) dm_med = fmax(dm_med, row[i].resid_median);
            if (vs[i].mode == ATTN_FP8_NAIVE && plain) {
                naive_lo = fmin(naive_lo, row[i].resid_median);
                naive_hi = fmax(naive_hi, row[i].resid_median);
                naive = &row[i];
            }
            if (vs[i].mode == ATTN_FP8_DM && plain) dm = &row[i];
        }
        if (dm && naive && (dm->err_dq > naive->err_dq || dm->err_dk > naive->err_dk)) dm_not_worse = 0;
    }
    int dm_ok = dm_max <= tol, hdm_ok = hdm_max <= tol;
    printf("\ninvariant fp8_dm: max residual %.3e <= %.2g: %s  (cancel; resid median <= %.3e)\n", dm_max, tol,
           dm_ok ? "OK" : "FAILED", dm_med);
    printf("invariant fp8_hybrid_dm: max residual %.3e <= %.2g: %s  (cancel)\n", hdm_max, tol, hdm_ok ? "OK" : "FAILED");
    printf("invariant bf16: max residual %.3e <= %.2g: %s\n", bf16_max, tol,
           bf16_max <= tol ? "OK" : "not met (stale D: rowsum(dO o O) with O rounded to BF16)");
    if (naive_hi > 0) printf("fp8_naive residual median %.3e..%.3e (broken, as expected)\n", naive_lo, naive_hi);
    printf("fp8_dm not worse than fp8_naive on dQ and dK on every input set: %s\n", dm_not_worse ? "OK" : "NO");
    return dm_ok && hdm_ok ? 0 : 1;
}

// What quantization sees in x: (T, d): the norm of its mean row over its RMS row norm (a shared
// offset: 0 for centred draws, ~3 for --key-offset 3), and its largest channel RMS over the median one.
static void print_shape_of(const char *name, int T, int d, const float *x) {
    double *mean = xcalloc((size_t)d, sizeof *mean), *ms = xcalloc((size_t)d, sizeof *ms), sq = 0.0;
    for (size_t i = 0; i < (size_t)T * d; i++) {
        mean[i % (size_t)d] += x[i];
        ms[i % (size_t)d] += (double)x[i] * x[i];
        sq += (double)x[i] * x[i];
    }
    double mn = 0.0;
    for (int c = 0; c < d; c++) {
        mean[c] /= T;
        mn += mean[c] * mean[c];
        ms[c] = sqrt(ms[c] / T);
    }
    double top = 0.0;
    for (int c = 0; c < d; c++) top = fmax(top, ms[c]);
    for (int i = 1; i < d; i++)  // insertion sort for the median
        for (int j = i; j > 0 && ms[j - 1] > ms[j]; j--) { double t = ms[j]; ms[j] = ms[j - 1]; ms[j - 1] = t; }
    double med = d % 2 ? ms[d / 2] : 0.5 * (ms[d / 2 - 1] + ms[d / 2]);
    printf("           %s: |mean row| / RMS row norm %.3f, largest / median channel RMS %.2f\n", name, sqrt(mn / (sq / T)),
           med > 0 ? top / med : INFINITY);
    free(mean);
    free(ms);
}

static void print_cpu_legend(int T, int d, int seed, Fp8Format gfmt, int bq, int bk, const InputShape *sh,
                             const CkptSource *ck, int beyond_context, const float *q, const float *k) {
    printf("attn-check: one causal head, CPU emulation vs FP64 reference (spec section 4)\n");
    printf("  T=%d d=%d seed=%d grad_format=%s block_q=%d block_k=%d scaling=block p_scale=256\n", T, d, seed,
           gfmt == FP8_E5M2 ? "e5m2" : "e4m3", bq, bk);
    if (ck)
        printf("  inputs: Q, K, V, dO of layer %d head %d of %s on validation window %d (the model in fp32 attention%s)\n",
               ck->layer, ck->head, ck->path, ck->window, beyond_context ? ", T beyond its seq_len" : "");
    if (ck) {
        print_shape_of("K", T, d, k);
        print_shape_of("Q", T, d, q);
    } else
        printf("  inputs: Q, K, V, dO ~ N(0,1); Q and K scaled by the sharpness; key offset %g, query offset %g (times a\n"
               "           key's / query's norm); %d outlier channels of K x %g (of Q / %g)\n",
               sh->key_offset, sh->query_offset, sh->outliers, sh->outlier_scale, sh->outlier_scale);
    printf("  keys   = centred keys (FP8 modes quantize K - c; c: off, the head's mean, or delayed: the mean of the\n"
           "           next %s); corr = the rank-one row-sum correction of dQ\n", ck ? "validation window's keys" : "draw's keys");
    printf("  resid  = |sum_j dS_ij| / sum_j |dS_ij| per row, on the FP32 dS (spec 4.1; for near one-hot rows dS itself\n");
    printf("           is below FP32 resolution and this ratio is noise, up to 1 even in fp32)\n");
    printf("  cancel = |sum_j dS_ij| / sum_j P_ij (|dP_ij| + |D_i|): the same sum relative to the terms that cancel\n");
    printf("           in it (sum P dP - D sum P), which is what FP32 rounding bounds; the invariant is checked on it\n");
    printf("  post   = |sum_j cast(dS)_ij| / sum_j |dS_ij|: the residual of the dS the dQ and dK matmuls use, after\n");
    printf("           its FP8 (BF16) cast; err_X = relative L2 error of X against FP64\n\n");
    printf("%5s  %-14s %-7s %-4s %10s %10s %10s %10s %10s %9s %9s %9s %9s\n", "sharp", "mode", "keys", "corr",
           "resid_med", "resid_max", "cancel_max", "post_med", "post_max", "err_O", "err_dQ", "err_dK", "err_dV");
}

int cmd_attn_check(int argc, char **argv) {
    int T = 1024, d = 64, seed = 1, bq = 128, bk = 128, on_gpu = 0, tiles_given = 0, sharp_only = 0, cpu_only = 0;
    int center_on[3] = {1, 0, 0}, corr_on[2] = {1, 0};
    InputShape sh = {0.0, 0.0, 0, 1000.0};
    CkptSource ck = {NULL, NULL, 0, 0, 0};
    Fp8Format gfmt = FP8_E4M3;
    for (int a = 1; a < argc; a++) {
        const char *arg = argv[a];
        if (!strcmp(arg, "--help") || !strcmp(arg, "-h")) { usage(stdout); return 0; }
        // "--name value" or "--name=value"
        const char *eq = strchr(arg, '=');
        char name[64];
        const char *val;
        if (eq && (size_t)(eq - arg) < sizeof name) {
            memcpy(name, arg, (size_t)(eq - arg));
            name[eq - arg] = '\0';
            val = eq + 1;
        } else {
            snprintf(name, sizeof name, "%s", arg);
            val = a + 1 < argc ? argv[++a] : NULL;
        }
        int rc = 0;
        if (!strcmp(name, "--T")) rc = parse_int_opt(name, val, 1, 1 << 16, &T);
        else if (!strcmp(name, "--d")) rc = parse_int_opt(name, val, 1, 1024, &d);
        else if (!strcmp(name, "--seed")) rc = parse_int_opt(name, val, 0, 2147483647L, &seed);
        else if (!strcmp(name, "--block-q")) { rc = parse_int_opt(name, val, 1, 4096, &bq); tiles_given = 1; }
        else if (!strcmp(name, "--block-k")) { rc = parse_int_opt(name, val, 1, 4096, &bk); tiles_given = 1; }
        else if (!strcmp(name, "--sharpness")) { rc = parse_int_opt(name, val, 1, 64, &sharp_only); cpu_only = 1; }
        else if (!strcmp(name, "--key-offset")) rc = parse_double_opt(name, val, 0.0, 1e6, &sh.key_offset);
        else if (!strcmp(name, "--query-offset")) rc = parse_double_opt(name, val, 0.0, 1e6, &sh.query_offset);
        else if (!strcmp(name, "--outliers")) rc = parse_int_opt(name, val, 0, 1024, &sh.outliers);
        else if (!strcmp(name, "--outlier-scale")) rc = parse_double_opt(name, val, 1.0, 1e6, &sh.outlier_scale);
        else if (!strcmp(name, "--from-checkpoint")) {
            ck.path = val;
            cpu_only = 1;
            if (!val || !*val) {
                fprintf(stderr, "train_gpt attn-check: --from-checkpoint expects a checkpoint file or directory\n");
                return 1;
            }
        } else if (!strcmp(name, "--data")) {
            ck.data = val;
            if (!val || !*val) {
                fprintf(stderr, "train_gpt attn-check: --data expects a shard glob\n");
                return 1;
            }
        } else if (!strcmp(name, "--layer")) rc = parse_int_opt(name, val, 0, 1 << 20, &ck.layer);
        else if (!strcmp(name, "--head")) rc = parse_int_opt(name, val, 0, 1 << 20, &ck.head);
        else if (!strcmp(name, "--window")) rc = parse_int_opt(name, val, 0, 1 << 30, &ck.window);
        else if (!strcmp(name, "--center-keys")) { rc = parse_list_opt(name, val, CENTER_NAMES, 3, center_on); cpu_only = 1; }
        else if (!strcmp(name, "--rowsum-correction")) { rc = parse_list_opt(name, val, ONOFF_NAMES, 2, corr_on); cpu_only = 1; }
        else if (!strcmp(name, "--grad-format")) {
            if (val && !strcmp(val, "e4m3")) gfmt = FP8_E4M3;
            else if (val && !strcmp(val, "e5m2")) gfmt = FP8_E5M2;
            else {
                fprintf(stderr, "train_gpt attn-check: --grad-format expects e4m3 or e5m2, got '%s'\n",
                        val ? val : "(nothing)");
                return 1;
            }
        } else if (!strcmp(name, "--device")) {
            on_gpu = val && !strcmp(val, "gpu");
            if (!on_gpu && (!val || strcmp(val, "cpu"))) {
                fprintf(stderr, "train_gpt attn-check: --device expects cpu or gpu, got '%s'\n", val ? val : "(nothing)");
                return 1;
            }
        } else {
            fprintf(stderr, "train_gpt attn-check: unknown option '%s'\n", arg);
            usage(stderr);
            return 1;
        }
        if (rc) return 1;
    }
    if ((ck.data || ck.layer || ck.head || ck.window) && !ck.path) {
        fprintf(stderr, "train_gpt attn-check: --data, --layer, --head and --window go with --from-checkpoint\n");
        return 1;
    }
    if (on_gpu && cpu_only) {
        fprintf(stderr, "train_gpt attn-check: --sharpness, --from-checkpoint, --center-keys and --rowsum-correction run "
                        "on the CPU emulation only (not with --device gpu)\n");
        return 1;
    }
    if (on_gpu) return gpu_check(T, d, seed, gfmt, tiles_given, &sh);

    float *io = NULL, *center = NULL;  // q, k, v, dout (and scratch); the delayed centre
    int beyond_context = 0;
    if (ck.path) {
        ErrBuf e;
        if (checkpoint_inputs(&ck, T, &d, &io, &center, &beyond_context, &e) != 0) {
            fprintf(stderr, "train_gpt attn-check: %s\n", e.msg);
            return 1;
        }
    } else {
        io = xmalloc(4 * (size_t)T * d * sizeof *io);
        center = xmalloc((size_t)d * sizeof *center);
    }
    size_t n = (size_t)T * d;
    float *q = io, *k = io + n, *v = io + 2 * n, *dout = io + 3 * n;
    Variant vs[ATTN_N_PRECISIONS * 6];
    int nv = make_variants(center_on, corr_on, vs);
    AttnOptions base = {.precision = ATTN_FP32, .grad_format = gfmt, .scaling = SCALING_BLOCK, .p_scale = 256.0f,
                        .block_q = bq, .block_k = bk};
    print_cpu_legend(T, d, seed, gfmt, bq, bk, &sh, ck.path ? &ck : NULL, beyond_context, q, k);

    int s_lo = sharp_only ? sharp_only : 1, s_hi = sharp_only ? sharp_only : 3;
    int n_sets = ck.path ? 1 : s_hi - s_lo + 1;
    AttnEval *res = xmalloc((size_t)n_sets * nv * sizeof *res);
    if (ck.path) {
        cpu_input_set(&base, vs, nv, "real", T, d, q, k, v, dout, center, res);
    } else {
        for (int sharp = s_lo; sharp <= s_hi; sharp++) {
            // the delayed centre: the mean of the keys of another draw from the same "model"
            make_inputs(T, d, seed, 1, sharp, &sh, q, k, v, dout);
            attn_key_mean(T, d, k, center);
            make_inputs(T, d, seed, 0, sharp, &sh, q, k, v, dout);
            char label[16];
            snprintf(label, sizeof label, "%d", sharp);
            cpu_input_set(&base, vs, nv, label, T, d, q, k, v, dout, center, res + (size_t)(sharp - s_lo) * nv);
        }
    }
    int rc = cpu_verdict(vs, nv, res, n_sets, T);
    free(res); free(io); free(center);
    return rc;
}
