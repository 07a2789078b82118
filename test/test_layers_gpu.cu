// test_layers_gpu.cu: every kernel of layers.h (and the AdamW kernel of adamw_gpu.h) against
// CPU references written here: FP64 math on the same BF16 inputs, on fresh seeded random data,
// outputs poisoned with NaN (0xFF bytes) before each call, several sizes including odd ones.
// Tolerances: rel L2 < 5e-3 for one BF16 rounding of the output, 1e-2 for BF16 chains, FP32
// accumulations 1e-4 or tighter; exact where the operation is exact (copies, casts, adds).
// Determinism: embedding backward, gain gradients and the gradient norm are run twice and must
// agree bitwise; AdamW must match optimizer.c's adamw_update_range bit for bit.
// Without a GPU: prints one "skipped" line and returns 0. With GPU_LAYERS_TIMING=1 it also
// times every kernel at training sizes ("# timing" lines: achieved GB/s over the bytes each
// kernel must move at least).
#include <algorithm>       // std::lower_bound (Zipf sampling)
#include <cuda_runtime.h>  // device memory
#include <math.h>          // sqrt, exp, log, cos, sin, pow
#include <stdint.h>        // uint16_t, uint64_t, int32_t
#include <stdio.h>         // printf
#include <stdlib.h>        // getenv
#include <string.h>        // memcmp, memcpy
#include <vector>          // host buffers

#include "gpu/adamw_gpu.h"  // adamw_update_gpu
#include "core/fp8.h"       // bf16_from_f32, bf16_to_f32 (host reference conversions)
#include "gpu/layers.h"     // the kernels under test
#include "optimizer.h"      // adamw_update_range (the CPU AdamW the kernel must match)
#include "gpu_test.h"       // CU, rng_normal, gpu_test_have_gpu, dnew/dup/back, Err
#include "test.h"           // CHECK, test_summary

typedef std::vector<uint16_t> Bf;
typedef std::vector<double> Dv;

// --- random inputs ---------------------------------------------------------------------------
static Bf rand_bf(size_t n, double scale, double offset = 0.0) {
    Bf v(n);
    for (size_t i = 0; i < n; i++) v[i] = bf16_from_f32((float)(offset + scale * rng_normal()));
    return v;
}
static std::vector<float> rand_f(size_t n, double scale) {
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) v[i] = (float)(scale * rng_normal());
    return v;
}
static double bv(uint16_t b) { return bf16_to_f32(b); }

static Err err_bf(const Bf &got, const Dv &ref) {
    Err e;
    for (size_t i = 0; i < ref.size(); i++) e.add(bv(got[i]), ref[i]);
    return e;
}
static Err err_f(const std::vector<float> &got, const Dv &ref) {
    Err e;
    for (size_t i = 0; i < ref.size(); i++) e.add(got[i], ref[i]);
    return e;
}
#define CHECK_ERR(e, tol, name, ...)                                                                 \
    do {                                                                                             \
        char nm_[160];                                                                               \
        snprintf(nm_, sizeof nm_, name, __VA_ARGS__);                                                \
        CHECK((e).ok(tol), nm_, "rel L2 %.3g (tol %.1g), max abs %.3g of max %.3g, %ld non-finite", (e).rel(), \
              (double)(tol), (e).maxabs, (e).maxref, (e).nonfinite);                                 \
        printf("#   %-64s rel L2 %.2e  max abs %.2e\n", nm_, (e).rel(), (e).maxabs);                \
    } while (0)

// ---------------------------------------------------------------------------------------------
// hot: the share of positions holding token 3 % Vp (one long run after the sort, crossing tiles);
// bad: the share holding a token outside [0, Vp) (-1 or Vp: a NaN row forward, skipped backward).
static void test_embedding(int N, int C, int Vp, double hot = 0.33, double bad = 0.0) {
    std::vector<int32_t> tok(N);
    for (int i = 0; i < N; i++) {
        double u = rng_uniform();
        tok[i] = u < hot ? 3 % Vp : u < hot + bad ? (rng_uniform() < 0.5 ? -1 : Vp) : (int32_t)(rng_uniform() * Vp);
    }
    Bf wte = rand_bf((size_t)Vp * C, 1.0);
    int32_t *d_tok = dup(tok);
    uint16_t *d_wte = dup(wte), *d_x = dnew<uint16_t>((size_t)N * C);
    embedding_forward_gpu(d_x, d_tok, d_wte, N, C, Vp, 0);
    Bf x = back(d_x, (size_t)N * C);
    bool same = true;
    for (int i = 0; i < N && same; i++) {
        if (tok[i] < 0 || tok[i] >= Vp) {
            for (int c = 0; c < C; c++) same = same && bv(x[(size_t)i * C + c]) != bv(x[(size_t)i * C + c]);
        } else {
            same = memcmp(&x[(size_t)i * C], &wte[(size_t)tok[i] * C], 2 * C) == 0;
        }
    }
    char nm[160];
    snprintf(nm, sizeof nm, "embedding forward N=%d C=%d Vp=%d hot %.2f bad %.2f exact (NaN rows for bad tokens)", N, C,
             Vp, hot, bad);
    CHECK(same, nm, "a row differs from wte[token]");

    Bf dx = rand_bf((size_t)N * C, 1.0);
    std::vector<float> init = rand_f((size_t)Vp * C, 0.5);
    Dv ref(init.begin(), init.end());
    for (int i = 0; i < N; i++)
        if (tok[i] >= 0 && tok[i] < Vp)
            for (int c = 0; c < C; c++) ref[(size_t)tok[i] * C + c] += bv(dx[(size_t)i * C + c]);
    uint16_t *d_dx = dup(dx);
    float *d_dw = dup(init);
    void *scratch = dnew<char>(embedding_backward_scratch_bytes(N, C));
    embedding_backward_gpu(d_dw, d_dx, d_tok, scratch, N, C, Vp, 0);
    std::vector<float> dw1 = back(d_dw, (size_t)Vp * C);
    CHECK_ERR(err_f(dw1, ref), 1e-5, "embedding backward N=%d C=%d Vp=%d hot %.2f bad %.2f vs fp64", N, C, Vp, hot, bad);
    CU(cudaMemcpy(d_dw, init.data(), init.size() * 4, cudaMemcpyHostToDevice));
    poison((char *)scratch, embedding_backward_scratch_bytes(N, C));
    embedding_backward_gpu(d_dw, d_dx, d_tok, scratch, N, C, Vp, 0);
    std::vector<float> dw2 = back(d_dw, (size_t)Vp * C);
    snprintf(nm, sizeof nm, "embedding backward N=%d C=%d deterministic", N, C);
    CHECK(memcmp(dw1.data(), dw2.data(), dw1.size() * 4) == 0, nm, "two runs differ");
    cudaFree(d_tok); cudaFree(d_wte); cudaFree(d_x); cudaFree(d_dx); cudaFree(d_dw); cudaFree(scratch);
}

// RMSNorm reference over rows described like layers.cu's RowMap (group, stride, dim).
struct Rows { int group; long long stride; int dim; long long n; };
static long long roff(const Rows &m, long long r) { return (r / m.group) * m.stride + (r % m.group) * m.dim; }
static void ref_norm_fwd(Dv &y, Dv &rstd, const Dv &x, const Dv &g, const Rows &m, double eps) {
    for (long long r = 0; r < m.n; r++) {
        long long o = roff(m, r);
        double ss = 0;
        for (int c = 0; c < m.dim; c++) ss += x[o + c] * x[o + c];
        double rs = 1.0 / sqrt(ss / m.dim + eps);
        rstd[r] = rs;
        for (int c = 0; c < m.dim; c++) y[o + c] = x[o + c] * rs * g[c];
    }
}
static void ref_norm_bwd(Dv &dx, Dv &dg, const Dv &dy, const Dv &x, const Dv &g, const Rows &m, double eps) {
    for (long long r = 0; r < m.n; r++) {
        long long o = roff(m, r);
        double ss = 0, dot = 0;
        for (int c = 0; c < m.dim; c++) ss += x[o + c] * x[o + c];
        double rs = 1.0 / sqrt(ss / m.dim + eps);
        for (int c = 0; c < m.dim; c++) dot += dy[o + c] * g[c] * x[o + c] * rs;
        for (int c = 0; c < m.dim; c++) {
            dx[o + c] += rs * (dy[o + c] * g[c] - x[o + c] * rs * dot / m.dim);
            dg[c] += dy[o + c] * x[o + c] * rs;
        }
    }
}
static Dv to_d(const Bf &b) { Dv d(b.size()); for (size_t i = 0; i < b.size(); i++) d[i] = bv(b[i]); return d; }
static Dv to_d(const std::vector<float> &f) { return Dv(f.begin(), f.end()); }

static void test_rmsnorm(int N, int C) {
    const float eps = 1e-5f;
    const size_t n = (size_t)N * C;
    Bf x = rand_bf(n, 1.5, 0.3), g = rand_bf(C, 0.2, 1.0), delta = rand_bf(n, 0.7);
    Rows m = {1, C, C, N};
    Dv y_ref(n), r_ref(N);
    ref_norm_fwd(y_ref, r_ref, to_d(x), to_d(g), m, eps);
    uint16_t *d_x = dup(x), *d_g = dup(g), *d_y = dnew<uint16_t>(n), *d_delta = dup(delta);
    float *d_r = dnew<float>(N);
    rmsnorm_forward_gpu(d_y, d_r, d_x, d_g, N, C, eps, 0);
    CHECK_ERR(err_bf(back(d_y, n), y_ref), 5e-3, "rmsnorm forward y N=%d C=%d", N, C);
    CHECK_ERR(err_f(back(d_r, N), r_ref), 1e-5, "rmsnorm forward rstd N=%d C=%d", N, C);

    // fused residual: res = bf16(x + delta) exactly, then the norm of the stored residual
    Bf res_ref(n);
    for (size_t i = 0; i < n; i++) res_ref[i] = bf16_from_f32(bf16_to_f32(x[i]) + bf16_to_f32(delta[i]));
    ref_norm_fwd(y_ref, r_ref, to_d(res_ref), to_d(g), m, eps);
    uint16_t *d_res = dnew<uint16_t>(n);
    poison(d_y, n); poison(d_r, N);
    residual_rmsnorm_forward_gpu(d_res, d_y, d_r, d_x, d_delta, d_g, N, C, eps, 0);
    char nm[128];
    snprintf(nm, sizeof nm, "residual+rmsnorm residual N=%d C=%d exact", N, C);
    CHECK(back(d_res, n) == res_ref, nm, "residual differs from bf16(x + delta)");
    CHECK_ERR(err_bf(back(d_y, n), y_ref), 5e-3, "residual+rmsnorm y N=%d C=%d", N, C);
    residual_rmsnorm_forward_gpu(d_x, d_y, d_r, d_x, d_delta, d_g, N, C, eps, 0);  // in place
    snprintf(nm, sizeof nm, "residual+rmsnorm in place N=%d C=%d exact", N, C);
    CHECK(back(d_x, n) == res_ref, nm, "in-place residual differs");
    CU(cudaMemcpy(d_x, x.data(), 2 * n, cudaMemcpyHostToDevice));

    // backward, overwrite and accumulate
    rmsnorm_forward_gpu(d_y, d_r, d_x, d_g, N, C, eps, 0);  // rstd of x again
    Bf dy = rand_bf(n, 1.0), dx0 = rand_bf(n, 1.0);
    std::vector<float> dg0 = rand_f(C, 1.0);
    void *scratch = dnew<char>(rmsnorm_backward_scratch_bytes(N, C));
    for (int acc = 0; acc < 2; acc++) {
        Dv dx_ref = acc ? to_d(dx0) : Dv(n, 0.0), dg_ref = to_d(dg0);
        ref_norm_bwd(dx_ref, dg_ref, to_d(dy), to_d(x), to_d(g), m, eps);
        uint16_t *d_dy = dup(dy), *d_dx = acc ? dup(dx0) : dnew<uint16_t>(n);
        float *d_dg = dup(dg0);
        rmsnorm_backward_gpu(d_dx, d_dg, scratch, d_dy, d_x, d_g, d_r, N, C, acc, 0);
        std::vector<float> dg1 = back(d_dg, C);
        CHECK_ERR(err_bf(back(d_dx, n), dx_ref), 1e-2, "rmsnorm backward dx N=%d C=%d accumulate=%d", N, C, acc);
        CHECK_ERR(err_f(dg1, dg_ref), 1e-4, "rmsnorm backward dg N=%d C=%d accumulate=%d", N, C, acc);
        if (!acc) {  // in place (dx = dy) and deterministic gain gradient
            CU(cudaMemcpy(d_dg, dg0.data(), 4 * C, cudaMemcpyHostToDevice));
            poison((char *)scratch, rmsnorm_backward_scratch_bytes(N, C));
            rmsnorm_backward_gpu(d_dy, d_dg, scratch, d_dy, d_x, d_g, d_r, N, C, 0, 0);
            CHECK_ERR(err_bf(back(d_dy, n), dx_ref), 1e-2, "rmsnorm backward in place N=%d C=%d", N, C);
            snprintf(nm, sizeof nm, "rmsnorm backward dg N=%d C=%d deterministic", N, C);
            CHECK(back(d_dg, C) == dg1, nm, "two runs differ");
        }
        cudaFree(d_dy); cudaFree(d_dx); cudaFree(d_dg);
    }
    cudaFree(d_x); cudaFree(d_g); cudaFree(d_y); cudaFree(d_delta); cudaFree(d_r); cudaFree(d_res);
    cudaFree(scratch);
}

static void test_residual_add(size_t n) {
    Bf a = rand_bf(n, 1.0), b = rand_bf(n, 0.01), ref(n);
    for (size_t i = 0; i < n; i++) ref[i] = bf16_from_f32(bf16_to_f32(a[i]) + bf16_to_f32(b[i]));
    uint16_t *d_a = dup(a), *d_b = dup(b), *d_o = dnew<uint16_t>(n);
    residual_add_gpu(d_o, d_a, d_b, n, 0);
    char nm[96];
    snprintf(nm, sizeof nm, "residual add n=%zu exact", n);
    CHECK(back(d_o, n) == ref, nm, "differs from bf16(a + b)");
    cudaFree(d_a); cudaFree(d_b); cudaFree(d_o);
}

static void test_qk_norm(int N, int H, int hd) {
    const float eps = 1e-5f;
    const size_t n = (size_t)N * 3 * H * hd;
    const long long rows = (long long)N * H;
    Bf qkv = rand_bf(n, 2.0, -0.2), qg = rand_bf(hd, 0.3, 1.0), kg = rand_bf(hd, 0.3, 1.0);
    Rows mq = {H, 3LL * H * hd, hd, rows};
    Dv out_ref = to_d(qkv), r_ref(2 * rows), xd = to_d(qkv), rq(rows), rk(rows);
    Dv x_k(xd.begin() + (size_t)H * hd, xd.end()), y_k(x_k);  // k view: shift the base
    ref_norm_fwd(out_ref, rq, xd, to_d(qg), mq, eps);
    ref_norm_fwd(y_k, rk, x_k, to_d(kg), mq, eps);
    for (size_t i = 0; i < y_k.size(); i++) {  // merge the k heads into out_ref
        size_t o = i + (size_t)H * hd, col = o % (3 * (size_t)H * hd);
        if (col >= (size_t)H * hd && col < 2 * (size_t)H * hd) out_ref[o] = y_k[i];
    }
    for (long long r = 0; r < rows; r++) { r_ref[r] = rq[r]; r_ref[rows + r] = rk[r]; }
    uint16_t *d_in = dup(qkv), *d_out = dnew<uint16_t>(n), *d_qg = dup(qg), *d_kg = dup(kg);
    float *d_r = dnew<float>(2 * rows);
    qk_rmsnorm_forward_gpu(d_out, d_r, d_in, d_qg, d_kg, N, H, hd, eps, 0);
    Bf out = back(d_out, n);
    CHECK_ERR(err_bf(out, out_ref), 5e-3, "qk-norm forward N=%d H=%d hd=%d", N, H, hd);
    CHECK_ERR(err_f(back(d_r, 2 * rows), r_ref), 1e-5, "qk-norm forward rstd N=%d H=%d hd=%d", N, H, hd);
    bool v_same = true;
    for (size_t i = 0; i < n; i++)
        if (i % (3 * (size_t)H * hd) >= 2 * (size_t)H * hd && out[i] != qkv[i]) v_same = false;
    char nm[128];
    snprintf(nm, sizeof nm, "qk-norm forward N=%d H=%d hd=%d v copied", N, H, hd);
    CHECK(v_same, nm, "v part differs");

    // backward: dq/dk through the norms, dv copied; gains accumulated
    Bf dout = rand_bf(n, 1.0);
    std::vector<float> dqg0 = rand_f(hd, 1.0), dkg0 = rand_f(hd, 1.0);
    Dv dx_ref(n, 0.0), dqg = to_d(dqg0), dkg = to_d(dkg0), dyd = to_d(dout);
    ref_norm_bwd(dx_ref, dqg, dyd, xd, to_d(qg), mq, eps);
    Dv dx_k(x_k.size(), 0.0), dy_k(dyd.begin() + (size_t)H * hd, dyd.end());
    ref_norm_bwd(dx_k, dkg, dy_k, x_k, to_d(kg), mq, eps);
    for (size_t i = 0; i < dx_k.size(); i++) {
        size_t o = i + (size_t)H * hd, col = o % (3 * (size_t)H * hd);
        if (col >= (size_t)H * hd && col < 2 * (size_t)H * hd) dx_ref[o] = dx_k[i];
        if (col >= 2 * (size_t)H * hd) dx_ref[o] = dyd[o];
    }
    void *scratch = dnew<char>(qk_rmsnorm_backward_scratch_bytes(N, H, hd));
    for (int inplace = 0; inplace < 2; inplace++) {
        uint16_t *d_dy = dup(dout), *d_dx = inplace ? d_dy : dnew<uint16_t>(n);
        float *d_dqg = dup(dqg0), *d_dkg = dup(dkg0);
        qk_rmsnorm_backward_gpu(d_dx, d_dqg, d_dkg, scratch, d_dy, d_in, d_qg, d_kg, d_r, N, H, hd, 0);
        CHECK_ERR(err_bf(back(d_dx, n), dx_ref), 1e-2, "qk-norm backward dqkv N=%d H=%d hd=%d in_place=%d", N, H,
                  hd, inplace);
        CHECK_ERR(err_f(back(d_dqg, hd), dqg), 1e-4, "qk-norm backward dq_gain N=%d H=%d hd=%d in_place=%d", N, H,
                  hd, inplace);
        CHECK_ERR(err_f(back(d_dkg, hd), dkg), 1e-4, "qk-norm backward dk_gain N=%d H=%d hd=%d in_place=%d", N, H,
                  hd, inplace);
        if (!inplace) cudaFree(d_dx);
        cudaFree(d_dy); cudaFree(d_dqg); cudaFree(d_dkg);
    }
    cudaFree(d_in); cudaFree(d_out); cudaFree(d_qg); cudaFree(d_kg); cudaFree(d_r); cudaFree(scratch);
}

static void test_rope(int B, int T, int H, int hd) {
    const double theta = 10000.0;
    const int half = hd / 2;
    const size_t n = (size_t)B * T * 3 * H * hd;
    float *d_tab = dnew<float>((size_t)T * half * 2);
    rope_table_gpu(d_tab, T, hd, theta, 0);
    std::vector<float> tab = back(d_tab, (size_t)T * half * 2);
    Dv tab_ref(tab.size());
    for (int t = 0; t < T; t++)
        for (int i = 0; i < half; i++) {
            double a = t * pow(theta, -2.0 * i / hd);
            tab_ref[((size_t)t * half + i) * 2] = cos(a);
            tab_ref[((size_t)t * half + i) * 2 + 1] = sin(a);
        }
    CHECK_ERR(err_f(tab, tab_ref), 1e-6, "rope table T=%d hd=%d", T, hd);
    Bf qkv = rand_bf(n, 1.0);
    uint16_t *d = dup(qkv);
    for (int dir = 0; dir < 2; dir++) {  // forward (+angle), backward (-angle)
        CU(cudaMemcpy(d, qkv.data(), 2 * n, cudaMemcpyHostToDevice));
        if (dir == 0) rope_forward_gpu(d, d_tab, B, T, H, hd, 0);
        else rope_backward_gpu(d, d_tab, B, T, H, hd, 0);
        Dv ref = to_d(qkv);
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++)
                for (int part = 0; part < 2; part++)
                    for (int h = 0; h < H; h++) {
                        size_t o = (((size_t)b * T + t) * 3 + part) * H * hd + (size_t)h * hd;
                        for (int i = 0; i < half; i++) {
                            double a = t * pow(theta, -2.0 * i / hd) * (dir ? -1 : 1);
                            double x0 = bv(qkv[o + i]), x1 = bv(qkv[o + i + half]);
                            ref[o + i] = x0 * cos(a) - x1 * sin(a);
                            ref[o + i + half] = x1 * cos(a) + x0 * sin(a);
                        }
                    }
        Bf got = back(d, n);
        CHECK_ERR(err_bf(got, ref), 5e-3, "rope %s B=%d T=%d H=%d hd=%d", dir ? "backward" : "forward", B, T, H, hd);
        bool v_same = true;
        for (size_t i = 0; i < n; i++)
            if (i % (3 * (size_t)H * hd) >= 2 * (size_t)H * hd && got[i] != qkv[i]) v_same = false;
        char nm[128];
        snprintf(nm, sizeof nm, "rope %s B=%d T=%d hd=%d leaves v", dir ? "backward" : "forward", B, T, hd);
        CHECK(v_same, nm, "v part changed");
    }
    cudaFree(d); cudaFree(d_tab);
}

static void test_swiglu(int N, int F) {
    const size_t n = (size_t)N * F;
    Bf fc = rand_bf(2 * n, 2.0), dout = rand_bf(n, 1.0);
    Dv out_ref(n), dfc_ref(2 * n);
    for (int i = 0; i < N; i++)
        for (int j = 0; j < F; j++) {
            double g = bv(fc[(size_t)i * 2 * F + j]), u = bv(fc[(size_t)i * 2 * F + F + j]);
            double s = 1.0 / (1.0 + exp(-g)), d = bv(dout[(size_t)i * F + j]);
            out_ref[(size_t)i * F + j] = g * s * u;
            dfc_ref[(size_t)i * 2 * F + j] = d * u * s * (1.0 + g * (1.0 - s));
            dfc_ref[(size_t)i * 2 * F + F + j] = d * g * s;
        }
    uint16_t *d_fc = dup(fc), *d_out = dnew<uint16_t>(n), *d_dout = dup(dout), *d_dfc = dnew<uint16_t>(2 * n);
    swiglu_forward_gpu(d_out, d_fc, N, F, 0);
    swiglu_backward_gpu(d_dfc, d_dout, d_fc, N, F, 0);
    CHECK_ERR(err_bf(back(d_out, n), out_ref), 5e-3, "swiglu forward N=%d F=%d", N, F);
    CHECK_ERR(err_bf(back(d_dfc, 2 * n), dfc_ref), 5e-3, "swiglu backward N=%d F=%d", N, F);
    cudaFree(d_fc); cudaFree(d_out); cudaFree(d_dout); cudaFree(d_dfc);
}

// --- the *_amax_gpu layers: the same outputs, and max |output| as the FP8 amax pass takes it ---------
// The amax as FP32 bits of the largest BF16 |value| (NaN ignored), as linear_fp8_gpu.cu's amax pass
// and linear_fp8.c's fp8_quantize find it.
static unsigned host_amax_bits(const Bf &v) {
    unsigned m = 0;
    for (uint16_t b : v) {
        const unsigned a = b & 0x7FFFu;
        if (a <= 0x7F80u && a > m) m = a;
    }
    return m << 16;
}
// Runs layer(amax) twice into poisoned outputs: with amax NULL and with *amax = start. The
// outputs must be bit-identical, and *amax max(start, the host's amax of outs[0]: the layer's
// output; others, like a fused residual, are only compared).
template <class Layer>
static void check_amax_layer(const char *what, const std::vector<std::pair<uint16_t *, size_t>> &outs, Layer layer,
                             unsigned start = 0) {
    std::vector<Bf> plain;
    layer((unsigned *)NULL);
    for (auto &o : outs) plain.push_back(back(o.first, o.second));
    unsigned *d_amax = dnew<unsigned>(1);
    CU(cudaMemcpy(d_amax, &start, 4, cudaMemcpyHostToDevice));
    for (auto &o : outs) poison(o.first, o.second);
    layer(d_amax);
    unsigned want = start, got = back(d_amax, 1)[0];
    bool same = true;
    for (size_t i = 0; i < outs.size(); i++) {
        Bf v = back(outs[i].first, outs[i].second);
        same = same && v == plain[i];
        if (i == 0) want = std::max(want, host_amax_bits(v));
    }
    char nm[160];
    snprintf(nm, sizeof nm, "%s: outputs bit-identical to the layer without the amax", what);
    CHECK(same, nm, "outputs differ");
    snprintf(nm, sizeof nm, "%s: amax = max |output| (start 0x%08x)", what, start);
    CHECK(got == want && want != 0, nm, "got 0x%08x, want 0x%08x", got, want);
    cudaFree(d_amax);
}
// nan_at: an input element (x of the norm, the gate of SwiGLU) set to NaN, which the amax ignores.
static void test_output_amax(int N, int C, int F, long nan_at = -1) {
    const float eps = 1e-5f;
    const size_t n = (size_t)N * C, nf = (size_t)N * F;
    Bf x = rand_bf(n, 1.5, 0.3), g = rand_bf(C, 0.2, 1.0), delta = rand_bf(n, 0.7), dy = rand_bf(n, 1.0);
    Bf fc = rand_bf(2 * nf, 2.0), dout = rand_bf(nf, 1.0), dx0 = rand_bf(n, 1.0);
    if (nan_at >= 0) {
        x[(size_t)nan_at % n] = 0x7FC0u;
        fc[(size_t)nan_at % nf] = 0x7FC0u;
    }
    uint16_t *d_x = dup(x), *d_g = dup(g), *d_delta = dup(delta), *d_dy = dup(dy), *d_fc = dup(fc), *d_dout = dup(dout);
    uint16_t *d_y = dnew<uint16_t>(n), *d_res = dnew<uint16_t>(n), *d_dx = dnew<uint16_t>(n);
    uint16_t *d_out = dnew<uint16_t>(nf), *d_dfc = dnew<uint16_t>(2 * nf);
    float *d_r = dnew<float>(N), *d_dg = dnew<float>(C);
    void *scratch = dnew<char>(rmsnorm_backward_scratch_bytes(N, C));
    char nm[120];
    snprintf(nm, sizeof nm, "rmsnorm forward amax N=%d C=%d%s", N, C, nan_at >= 0 ? " (a NaN input)" : "");
    check_amax_layer(nm, {{d_y, n}}, [&](unsigned *a) { rmsnorm_forward_amax_gpu(d_y, d_r, d_x, d_g, N, C, eps, a, 0); });
    snprintf(nm, sizeof nm, "residual+rmsnorm forward amax N=%d C=%d", N, C);
    check_amax_layer(nm, {{d_y, n}, {d_res, n}}, [&](unsigned *a) {
        residual_rmsnorm_forward_amax_gpu(d_res, d_y, d_r, d_x, d_delta, d_g, N, C, eps, a, 0);
    });
    // the amax is of y only: a start above it stays
    snprintf(nm, sizeof nm, "rmsnorm forward amax N=%d C=%d, a larger amax before", N, C);
    check_amax_layer(nm, {{d_y, n}}, [&](unsigned *a) { rmsnorm_forward_amax_gpu(d_y, d_r, d_x, d_g, N, C, eps, a, 0); },
                     0x47000000u);
    rmsnorm_forward_gpu(d_y, d_r, d_x, d_g, N, C, eps, 0);  // rstd of x
    for (int acc = 0; acc < 2; acc++) {
        snprintf(nm, sizeof nm, "rmsnorm backward amax N=%d C=%d accumulate=%d", N, C, acc);
        check_amax_layer(nm, {{d_dx, n}}, [&](unsigned *a) {
            CU(cudaMemcpy(d_dx, dx0.data(), 2 * n, cudaMemcpyHostToDevice));  // the same dx to add to
            CU(cudaMemset(d_dg, 0, 4 * C));
            rmsnorm_backward_amax_gpu(d_dx, d_dg, scratch, d_dy, d_x, d_g, d_r, N, C, acc, a, 0);
        });
    }
    snprintf(nm, sizeof nm, "swiglu forward amax N=%d F=%d%s", N, F, nan_at >= 0 ? " (a NaN input)" : "");
    check_amax_layer(nm, {{d_out, nf}}, [&](unsigned *a) { swiglu_forward_amax_gpu(d_out, d_fc, N, F, a, 0); });
    snprintf(nm, sizeof nm, "swiglu backward amax N=%d F=%d%s", N, F, nan_at >= 0 ? " (a NaN input)" : "");
    check_amax_layer(nm, {{d_dfc, 2 * nf}}, [&](unsigned *a) { swiglu_backward_amax_gpu(d_dfc, d_dout, d_fc, N, F, a, 0); });
    cudaFree(d_x); cudaFree(d_g); cudaFree(d_delta); cudaFree(d_dy); cudaFree(d_fc); cudaFree(d_dout);
    cudaFree(d_y); cudaFree(d_res); cudaFree(d_dx); cudaFree(d_out); cudaFree(d_dfc); cudaFree(d_r); cudaFree(d_dg);
    cudaFree(scratch);
}

static void test_cross_entropy(int N, int V, int Vp) {
    Bf logits = rand_bf((size_t)N * Vp, 3.0);
    std::vector<int32_t> tgt(N);
    int valid = 0;
    for (int i = 0; i < N; i++) {
        tgt[i] = (i % 5 == 2) ? -1 : (int32_t)(rng_uniform() * V);
        if (i == 0) tgt[i] = V - 1;  // the last real column
        valid += tgt[i] >= 0;
    }
    const float scale = 1.0f / (float)(valid ? valid : 1);
    Dv loss_ref(N), grad_ref((size_t)N * Vp, 0.0);
    for (int i = 0; i < N; i++) {
        if (tgt[i] < 0) { loss_ref[i] = 0; continue; }
        const uint16_t *row = &logits[(size_t)i * Vp];
        double mx = -INFINITY, s = 0;
        for (int j = 0; j < V; j++) mx = fmax(mx, bv(row[j]));
        for (int j = 0; j < V; j++) s += exp(bv(row[j]) - mx);
        loss_ref[i] = log(s) + mx - bv(row[tgt[i]]);
        for (int j = 0; j < V; j++) grad_ref[(size_t)i * Vp + j] = (exp(bv(row[j]) - mx) / s - (j == tgt[i])) * scale;
    }
    uint16_t *d_l = dup(logits);
    int32_t *d_t = dup(tgt);
    float *d_loss = dnew<float>(N);
    cross_entropy_gpu(d_l, d_loss, d_t, N, V, Vp, 0.0f, 0);  // loss only: logits untouched
    char nm[128];
    snprintf(nm, sizeof nm, "cross-entropy N=%d V=%d Vp=%d loss-only keeps logits", N, V, Vp);
    CHECK(back(d_l, (size_t)N * Vp) == logits, nm, "logits modified with grad_scale 0");
    Err el;
    std::vector<float> loss = back(d_loss, N);
    for (int i = 0; i < N; i++) el.add(loss[i], loss_ref[i]);
    snprintf(nm, sizeof nm, "cross-entropy N=%d V=%d Vp=%d loss-only loss", N, V, Vp);
    CHECK(el.nonfinite == 0 && el.maxabs < 1e-4 * (1 + log((double)V)), nm, "max abs %.3g, %ld non-finite",
          el.maxabs, el.nonfinite);
    poison(d_loss, N);
    cross_entropy_gpu(d_l, d_loss, d_t, N, V, Vp, scale, 0);
    loss = back(d_loss, N);
    el = Err();
    for (int i = 0; i < N; i++) el.add(loss[i], loss_ref[i]);
    snprintf(nm, sizeof nm, "cross-entropy N=%d V=%d Vp=%d loss", N, V, Vp);
    CHECK(el.nonfinite == 0 && el.maxabs < 1e-4 * (1 + log((double)V)), nm, "max abs %.3g, %ld non-finite",
          el.maxabs, el.nonfinite);
    Bf grad = back(d_l, (size_t)N * Vp);
    CHECK_ERR(err_bf(grad, grad_ref), 1e-2, "cross-entropy N=%d V=%d Vp=%d dlogits", N, V, Vp);
    bool zeros = true;  // padded columns and ignored rows: exactly +0
    for (int i = 0; i < N; i++)
        for (int j = 0; j < Vp; j++)
            if ((tgt[i] < 0 || j >= V) && grad[(size_t)i * Vp + j] != 0) zeros = false;
    snprintf(nm, sizeof nm, "cross-entropy N=%d V=%d Vp=%d zero padding/ignored", N, V, Vp);
    CHECK(zeros, nm, "a padded column or ignored row has a non-zero gradient");
    cudaFree(d_l); cudaFree(d_t); cudaFree(d_loss);
}

// A target past the real columns (a data bug): the row's loss is NaN (visible), its gradient is
// the plain softmax on the real columns (no one-hot subtracted anywhere) and 0 on the padding.
static void test_cross_entropy_bad_target(int V, int Vp) {
    const int N = 2;
    Bf logits = rand_bf((size_t)N * Vp, 3.0);
    std::vector<int32_t> tgt = {V / 2, Vp - 1 > V ? V + 1 : V};  // row 1: a padded column
    uint16_t *d_l = dup(logits);
    int32_t *d_t = dup(tgt);
    float *d_loss = dnew<float>(N);
    cross_entropy_gpu(d_l, d_loss, d_t, N, V, Vp, 0.5f, 0);
    std::vector<float> loss = back(d_loss, N);
    Bf grad = back(d_l, (size_t)N * Vp);
    const uint16_t *row = &logits[(size_t)Vp];
    double mx = -INFINITY, sum = 0;
    for (int j = 0; j < V; j++) mx = fmax(mx, bv(row[j]));
    for (int j = 0; j < V; j++) sum += exp(bv(row[j]) - mx);
    double worst = 0;
    bool pad_zero = true;
    for (int j = 0; j < Vp; j++) {
        const double g = bv(grad[(size_t)Vp + j]);
        if (j >= V) pad_zero = pad_zero && g == 0.0;
        else worst = fmax(worst, fabs(g - 0.5 * exp(bv(row[j]) - mx) / sum) / (0.5 * exp(bv(row[j]) - mx) / sum));
    }
    char nm[128];
    snprintf(nm, sizeof nm, "cross-entropy V=%d Vp=%d target %d past V: loss NaN, softmax gradient, padding 0", V, Vp,
             tgt[1]);
    CHECK(std::isfinite(loss[0]) && std::isnan(loss[1]) && pad_zero && worst < 1e-2, nm,
          "loss %g / %g, padded columns zero %d, worst relative gradient error %.3g", loss[0], loss[1], pad_zero,
          worst);
    cudaFree(d_l); cudaFree(d_t); cudaFree(d_loss);
}

static void test_grad_norm(size_t n) {
    std::vector<float> g = rand_f(n, 1e-2);
    double ref = 0;
    for (size_t i = 0; i < n; i++) ref += (double)g[i] * g[i];
    float *d_g = dup(g);
    double *d_out = dnew<double>(1), *d_part = dnew<double>(GRAD_NORM_PARTIALS);
    grad_norm_squared_gpu(d_out, d_part, d_g, n, 0);
    double got1 = back(d_out, 1)[0];
    poison(d_out, 1); poison(d_part, GRAD_NORM_PARTIALS);
    grad_norm_squared_gpu(d_out, d_part, d_g, n, 0);
    double got2 = back(d_out, 1)[0];
    char nm[96];
    snprintf(nm, sizeof nm, "grad norm^2 n=%zu vs fp64", n);
    CHECK(fabs(got1 - ref) <= 1e-10 * ref, nm, "got %.17g ref %.17g", got1, ref);
    snprintf(nm, sizeof nm, "grad norm^2 n=%zu deterministic", n);
    CHECK(memcmp(&got1, &got2, sizeof got1) == 0, nm, "%.17g vs %.17g", got1, got2);
    cudaFree(d_g); cudaFree(d_out); cudaFree(d_part);
}

static void test_casts(size_t n) {
    std::vector<float> f(n);
    for (size_t i = 0; i < n; i++) f[i] = (float)(rng_normal() * pow(2.0, (int)(rng_uniform() * 40) - 20));
    f[0] = 0.0f;
    if (n > 1) f[1] = -0.0f;
    Bf ref(n);
    for (size_t i = 0; i < n; i++) ref[i] = bf16_from_f32(f[i]);
    float *d_f = dup(f), *d_back = dnew<float>(n);
    uint16_t *d_b = dnew<uint16_t>(n);
    cast_f32_to_bf16_gpu(d_b, d_f, n, 0);
    cast_bf16_to_f32_gpu(d_back, d_b, n, 0);
    char nm[96];
    snprintf(nm, sizeof nm, "cast f32->bf16 n=%zu bit-exact", n);
    CHECK(back(d_b, n) == ref, nm, "differs from bf16_from_f32 (RNE)");
    std::vector<float> fb = back(d_back, n);
    bool ok = true;
    for (size_t i = 0; i < n; i++) {
        float e = bf16_to_f32(ref[i]);
        if (memcmp(&fb[i], &e, 4)) ok = false;
    }
    snprintf(nm, sizeof nm, "cast bf16->f32 n=%zu bit-exact", n);
    CHECK(ok, nm, "differs from bf16_to_f32");
    cudaFree(d_f); cudaFree(d_back); cudaFree(d_b);
}

// AdamW: the GPU kernel against optimizer.c's adamw_update_range, bit for bit, over a few steps.
static void test_adamw(size_t n, double wd, double clip) {
    std::vector<float> p = rand_f(n, 0.05), m = rand_f(n, 1e-3), v(n);
    for (size_t i = 0; i < n; i++) v[i] = (float)(1e-6 * rng_uniform() * rng_uniform());
    float *d_p = dup(p), *d_m = dup(m), *d_v = dup(v), *d_g = dnew<float>(n);
    uint16_t *d_pb = dnew<uint16_t>(n);
    bool same = true, bf_same = true;
    const long long steps[] = {1, 2, 3, 1000};
    for (long long s : steps) {
        std::vector<float> g = rand_f(n, 1e-2);
        CU(cudaMemcpy(d_g, g.data(), 4 * n, cudaMemcpyHostToDevice));
        const double lr = 3e-4 * (1.0 + 0.1 * (double)s);
        adamw_update_range(p.data(), g.data(), m.data(), v.data(), 0, n, lr, 0.9, 0.95, 1e-8, wd, clip, s);
        adamw_update_gpu(d_p, d_pb, d_g, d_m, d_v, n, lr, 0.9, 0.95, 1e-8, wd, clip, s, 0);
        std::vector<float> gp = back(d_p, n), gm = back(d_m, n), gv = back(d_v, n);
        Bf gb = back(d_pb, n);
        same = same && memcmp(gp.data(), p.data(), 4 * n) == 0 && memcmp(gm.data(), m.data(), 4 * n) == 0 &&
               memcmp(gv.data(), v.data(), 4 * n) == 0;
        for (size_t i = 0; i < n; i++)
            if (gb[i] != bf16_from_f32(p[i])) bf_same = false;
    }
    char nm[128];
    snprintf(nm, sizeof nm, "adamw n=%zu wd=%g clip=%g bit-exact vs adamw_update_range", n, wd, clip);
    CHECK(same, nm, "p, m or v differ from the CPU update");
    snprintf(nm, sizeof nm, "adamw n=%zu wd=%g bf16 working weights", n, wd);
    CHECK(bf_same, nm, "BF16 copy differs from bf16(p)");
    cudaFree(d_p); cudaFree(d_m); cudaFree(d_v); cudaFree(d_g); cudaFree(d_pb);
}

// ---------------------------------------------------------------------------------------------
// Timing at training sizes (GPU_LAYERS_TIMING=1): not checks, "# timing" lines only.

static void fill_bf(uint16_t *d, size_t n, float scale, float offset = 0.0f) {
    gpu_test_fill_bf16(d, n, rng_state++, scale, offset);
}
static void fill_f(float *d, size_t n, float scale) { gpu_test_fill_f32(d, n, rng_state++, scale); }

// Mean milliseconds of `body` over 20 runs after 3 warm-up runs (CUDA events).
template <class F> static double time_ms(F body) { return gpu_time_ms(body, 3, 20); }
static void report_time(const char *name, double ms, double bytes) {
    printf("# timing %-44s %8.3f ms %8.0f GB/s\n", name, ms, bytes / (ms * 1e-3) / 1e9);
}

static void timing(void) {
    const int B = 8, T = 2048, C = 2048, H = 16, hd = 128, F = 5632, V = 50257, Vp = 50304, Nce = 4096;
    const int N = B * T;
    const size_t NC = (size_t)N * C;
    const size_t n_params = (size_t)400 << 20;
    uint16_t *x = dnew<uint16_t>(NC), *y = dnew<uint16_t>(NC), *r = dnew<uint16_t>(NC), *g = dnew<uint16_t>(C);
    uint16_t *qkv = dnew<uint16_t>(3 * NC), *qkv2 = dnew<uint16_t>(3 * NC), *fc = dnew<uint16_t>((size_t)N * 2 * F);
    uint16_t *dfc = dnew<uint16_t>((size_t)N * 2 * F), *hmid = dnew<uint16_t>((size_t)N * F);
    uint16_t *wte = dnew<uint16_t>((size_t)Vp * C), *logits = dnew<uint16_t>((size_t)Nce * Vp);
    uint16_t *pb = dnew<uint16_t>(n_params);
    float *rstd = dnew<float>(2 * (size_t)N * H), *dg = dnew<float>(C), *dwte = dnew<float>((size_t)Vp * C);
    float *loss = dnew<float>(Nce), *tab = dnew<float>((size_t)T * hd / 2);
    float *p = dnew<float>(n_params), *gr = dnew<float>(n_params), *m = dnew<float>(n_params), *v = dnew<float>(n_params);
    double *sumsq = dnew<double>(1), *part = dnew<double>(GRAD_NORM_PARTIALS);
    int32_t *tok = dnew<int32_t>(N), *tgt = dnew<int32_t>(Nce);
    std::vector<int32_t> ht(N);
    for (int i = 0; i < N; i++) ht[i] = (int32_t)(rng_uniform() * V);
    CU(cudaMemcpy(tok, ht.data(), 4 * (size_t)N, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(tgt, ht.data(), 4 * (size_t)Nce, cudaMemcpyHostToDevice));
    size_t scratch_bytes = embedding_backward_scratch_bytes(N, C);
    if (rmsnorm_backward_scratch_bytes(N, C) > scratch_bytes) scratch_bytes = rmsnorm_backward_scratch_bytes(N, C);
    if (qk_rmsnorm_backward_scratch_bytes(N, H, hd) > scratch_bytes) scratch_bytes = qk_rmsnorm_backward_scratch_bytes(N, H, hd);
    void *scratch = dnew<char>(scratch_bytes);
    fill_bf(x, NC, 1.0f); fill_bf(y, NC, 1.0f); fill_bf(g, C, 0.2f, 1.0f); fill_bf(qkv, 3 * NC, 2.0f);
    fill_bf(fc, (size_t)N * 2 * F, 2.0f); fill_bf(hmid, (size_t)N * F, 1.0f); fill_bf(wte, (size_t)Vp * C, 1.0f);
    fill_f(dg, C, 1.0f); fill_f(dwte, (size_t)Vp * C, 1.0f);
    fill_f(p, n_params, 0.05f); fill_f(gr, n_params, 0.01f); fill_f(m, n_params, 1e-3f); fill_f(v, n_params, 1e-6f);
    CU(cudaMemcpy(r, x, 2 * NC, cudaMemcpyDeviceToDevice));
    rope_table_gpu(tab, T, hd, 10000.0, 0);
    rmsnorm_forward_gpu(y, rstd, x, g, N, C, 1e-5f, 0);
    printf("# timing at B=%d T=%d C=%d H=%d hd=%d F=%d Vp=%d, CE chunk %d rows, %zu M params\n", B, T, C, H, hd, F,
           Vp, Nce, n_params >> 20);
    const double bc = 2.0 * NC;  // bytes of one (N, C) BF16 tensor
    report_time("embedding forward", time_ms([&] { embedding_forward_gpu(y, tok, wte, N, C, Vp, 0); }), 2 * bc);
    report_time("embedding backward (time only)", time_ms([&] { embedding_backward_gpu(dwte, x, tok, scratch, N, C, Vp, 0); }), bc + 8.0 * NC);
    {  // natural text is far from uniform: Zipf's law, token k with probability ~ 1 / (k + 1)
        std::vector<double> cdf(V);
        double acc = 0.0;
        for (int k = 0; k < V; k++) cdf[k] = (acc += 1.0 / (k + 1));
        std::vector<int32_t> zt(N);
        for (int i = 0; i < N; i++) {
            double u = rng_uniform() * acc;
            zt[i] = (int32_t)(std::lower_bound(cdf.begin(), cdf.end(), u) - cdf.begin());
        }
        int32_t *ztok = dnew<int32_t>(N);
        CU(cudaMemcpy(ztok, zt.data(), 4 * (size_t)N, cudaMemcpyHostToDevice));
        report_time("embedding backward, Zipf tokens", time_ms([&] { embedding_backward_gpu(dwte, x, ztok, scratch, N, C, Vp, 0); }), bc + 8.0 * NC);
        std::vector<int32_t> same(N, 11);
        CU(cudaMemcpy(ztok, same.data(), 4 * (size_t)N, cudaMemcpyHostToDevice));
        report_time("embedding backward, one token", time_ms([&] { embedding_backward_gpu(dwte, x, ztok, scratch, N, C, Vp, 0); }), bc + 8.0 * NC);
        CU(cudaFree(ztok));
    }
    report_time("rmsnorm forward", time_ms([&] { rmsnorm_forward_gpu(y, rstd, x, g, N, C, 1e-5f, 0); }), 2 * bc);
    report_time("residual + rmsnorm forward", time_ms([&] { residual_rmsnorm_forward_gpu(r, y, rstd, r, x, g, N, C, 1e-5f, 0); }), 4 * bc);
    report_time("rmsnorm backward (accumulate)", time_ms([&] { rmsnorm_backward_gpu(r, dg, scratch, y, x, g, rstd, N, C, 1, 0); }), 4 * bc);
    report_time("residual add", time_ms([&] { residual_add_gpu(r, r, x, NC, 0); }), 3 * bc);
    report_time("qk-norm forward", time_ms([&] { qk_rmsnorm_forward_gpu(qkv2, rstd, qkv, g, g, N, H, hd, 1e-5f, 0); }), 6 * bc);
    report_time("qk-norm backward", time_ms([&] { qk_rmsnorm_backward_gpu(qkv2, dg, dg, scratch, qkv2, qkv, g, g, rstd, N, H, hd, 0); }), 6 * bc);
    report_time("rope forward", time_ms([&] { rope_forward_gpu(qkv, tab, B, T, H, hd, 0); }), 4 * bc);
    report_time("swiglu forward", time_ms([&] { swiglu_forward_gpu(hmid, fc, N, F, 0); }), 6.0 * N * F);
    report_time("swiglu backward", time_ms([&] { swiglu_backward_gpu(dfc, hmid, fc, N, F, 0); }), 10.0 * N * F);
    {  // the kernel overwrites its input: refill before each run and subtract the refill's time
        double t_both = time_ms([&] {
            fill_bf(logits, (size_t)Nce * Vp, 4.0f);
            cross_entropy_gpu(logits, loss, tgt, Nce, V, Vp, 1.0f / Nce, 0);
        });
        double t_fill = time_ms([&] { fill_bf(logits, (size_t)Nce * Vp, 4.0f); });
        report_time("cross-entropy + dlogits (in place)", t_both - t_fill, 4.0 * Nce * Vp);
    }
    report_time("grad norm^2", time_ms([&] { grad_norm_squared_gpu(sumsq, part, gr, n_params, 0); }), 4.0 * n_params);
    report_time("adamw (+ bf16 weights)", time_ms([&] { adamw_update_gpu(p, pb, gr, m, v, n_params, 1e-4, 0.9, 0.95, 1e-8, 0.1, 1.0, 10, 0); }), 30.0 * n_params);
    report_time("cast f32 -> bf16", time_ms([&] { cast_f32_to_bf16_gpu(pb, p, n_params, 0); }), 6.0 * n_params);
    CU(cudaDeviceSynchronize());
    void *all[] = {x, y, r, g, qkv, qkv2, fc, dfc, hmid, wte, logits, pb, rstd, dg, dwte, loss, tab, p, gr, m, v,
                   sumsq, part, tok, tgt, scratch};
    for (void *a : all) CU(cudaFree(a));
}

int main(void) {
    if (!gpu_test_have_gpu("test_layers_gpu")) return 0;
    test_embedding(1, 64, 17);
    test_embedding(37, 100, 300);
    test_embedding(2048, 256, 5003);
    test_embedding(3000, 40, 7, 0.0, 0.1);     // few tokens: every run crosses tiles; C not a multiple of 8
    test_embedding(5000, 264, 50, 1.0);        // one token: one run over all 79 tiles
    test_embedding(4099, 768, 50304, 0.09, 0.01);  // Zipf-like head token, a few bad ones
    test_rmsnorm(1, 64);
    test_rmsnorm(33, 200);
    test_rmsnorm(257, 1024);
    test_rmsnorm(300, 1536);  // the backward's one-pass kernel with 6 chunks per lane, 2 blocks per SM
    test_rmsnorm(65, 3072);   // ... with 12, 1 block per SM
    test_rmsnorm(40, 36);  // 36 % 8 != 0: the scalar kernels
    test_residual_add(1);
    test_residual_add(100003);
    test_qk_norm(5, 3, 64);
    test_qk_norm(64, 4, 128);
    test_rope(1, 7, 2, 64);
    test_rope(2, 65, 3, 128);
    test_rope(2, 9, 3, 40);  // 40 % 16 != 0: the scalar kernel
    test_swiglu(3, 100);
    test_swiglu(65, 256);
    test_output_amax(257, 1024, 352);    // the vectorized kernels
    test_output_amax(40, 36, 100);       // widths not multiples of 8: the scalar kernels
    test_output_amax(3000, 768, 2048, 12345);
    // the row-in-registers kernel with 4, 8, 13 and 16 chunks per thread, and the scalar kernel
    // (Vp % 8 != 0)
    test_cross_entropy(4, 1000, 1024);
    test_cross_entropy(33, 5000, 5120);
    test_cross_entropy(9, 30000, 30080);
    test_cross_entropy(7, 50257, 50304);
    test_cross_entropy(3, 60000, 60032);
    test_cross_entropy(5, 1001, 1003);
    test_cross_entropy_bad_target(50257, 50304);  // the row-in-registers kernel
    test_cross_entropy_bad_target(1001, 1003);    // the scalar kernel
    test_grad_norm(1);
    test_grad_norm(1000);
    test_grad_norm(3000001);
    test_casts(1);
    test_casts(100003);
    test_adamw(1, 0.1, 1.0);
    test_adamw(1000, 0.1, 0.37);
    test_adamw(100003, 0.0, 1.0);
    CU(cudaGetLastError());
    const char *tm = getenv("GPU_LAYERS_TIMING");
    if (tm && tm[0] == '1') timing();
    return test_summary("test_layers_gpu");
}
