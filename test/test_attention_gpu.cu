// test_attention_gpu.cu: the fused BF16 attention kernels (attention/kernels_bf16.h) against two CPU
// references computed here in FP64 on the same BF16 inputs:
//   - "f64":  exact attention (no rounding inside), tolerance of BF16 arithmetic (rel L2 < 1e-2);
//   - "emul": the kernels' own numerics (P rounded to BF16 against the running max of each key
//             block of the forward, O stored in BF16, P and dS rounded to BF16 in the backward,
//             D = rowsum(dO * O_stored), outputs rounded to BF16): much tighter tolerance.
// Inputs are fresh seeded random values (Q and K scaled by 1..3 for diffuse to sharp attention),
// every output is poisoned with NaN before the call, and q/k/v, dq/dk/dv are views of packed
// (B, T, 3, H, d) buffers in some cases. Without a GPU: prints one "skipped" line, returns 0.
#include <cuda_bf16.h>     // __float2bfloat16, __bfloat162float (host side too)
#include <cuda_runtime.h>  // device memory, streams
#include <math.h>          // exp, log, sqrt
#include <stdint.h>        // uint16_t, uint64_t
#include <stdio.h>         // printf
#include <stdlib.h>        // malloc
#include <string.h>        // memcpy, memset
#include <vector>          // host buffers

#include "attention/kernels_bf16.h"  // the kernels under test
#include "gpu/test_hooks.h"          // gpu_test_hooks: the forward's O from its fragments
#include "gpu_test.h"                // CU, rng_uniform/rng_normal, gpu_test_have_gpu
#include "test.h"                    // CHECK, test_summary

static uint16_t f2bf(float x) {
    __nv_bfloat16 b = __float2bfloat16(x);
    uint16_t u;
    memcpy(&u, &b, 2);
    return u;
}
static float bf2f(uint16_t u) {
    __nv_bfloat16 b;
    memcpy(&b, &u, 2);
    return __bfloat162float(b);
}
static double bfr(double x) { return bf2f(f2bf((float)x)); }  // the value BF16 keeps

// gpu_test.h's error accumulator, but relative L2 is absolute when the reference is zero (Err
// counts a zero reference as failing instead).
struct AttnErr : Err {
    double rel() const { return sqrt(num / (den > 0 ? den : 1)); }
};

// References for one head. In: q, k, v, dout (T, d) (BF16 values as doubles), block_k of the
// kernel. Out (per reference r = 0 f64, 1 emul): o, lse, dq, dk, dv.
struct HeadRef {
    std::vector<double> o[2], lse[2], dq[2], dk[2], dv[2];
};
static void reference_head(int T, int d, int block_k, const double *q, const double *k,
                           const double *v, const double *dout, HeadRef *R) {
    const double tau = 1.0 / sqrt((double)d);
    std::vector<double> S((size_t)T * T), dP((size_t)T * T);
    for (int r = 0; r < 2; r++) {
        R->o[r].assign((size_t)T * d, 0); R->lse[r].assign(T, 0);
        R->dq[r].assign((size_t)T * d, 0); R->dk[r].assign((size_t)T * d, 0); R->dv[r].assign((size_t)T * d, 0);
    }
    // scores and dP (lower triangle)
#pragma omp parallel for schedule(dynamic, 16)
    for (int i = 0; i < T; i++)
        for (int j = 0; j <= i; j++) {
            double s = 0, dp = 0;
            for (int c = 0; c < d; c++) {
                s += q[(size_t)i * d + c] * k[(size_t)j * d + c];
                dp += dout[(size_t)i * d + c] * v[(size_t)j * d + c];
            }
            S[(size_t)i * T + j] = tau * s;
            dP[(size_t)i * T + j] = dp;
        }
    // forward, both references
#pragma omp parallel for schedule(dynamic, 16)
    for (int i = 0; i < T; i++) {
        const double *s = &S[(size_t)i * T];
        double mx = -INFINITY;
        for (int j = 0; j <= i; j++) mx = fmax(mx, s[j]);
        double l = 0;
        std::vector<double> acc(d, 0.0);
        for (int j = 0; j <= i; j++) {
            double p = exp(s[j] - mx);
            l += p;
            for (int c = 0; c < d; c++) acc[c] += p * v[(size_t)j * d + c];
        }
        for (int c = 0; c < d; c++) R->o[0][(size_t)i * d + c] = acc[c] / l;
        R->lse[0][i] = mx + log(l);
        // emulation: running max per key block, P in BF16 for PV, l over unrounded P
        double m = -INFINITY;
        l = 0;
        for (int c = 0; c < d; c++) acc[c] = 0;
        for (int j0 = 0; j0 <= i; j0 += block_k) {
            int j1 = j0 + block_k - 1 < i ? j0 + block_k - 1 : i;
            double mn = m;
            for (int j = j0; j <= j1; j++) mn = fmax(mn, s[j]);
            double alpha = exp(m - mn);
            l *= alpha;
            for (int c = 0; c < d; c++) acc[c] *= alpha;
            for (int j = j0; j <= j1; j++) {
                double p = exp(s[j] - mn);
                l += p;
                double pb = bfr(p);
                for (int c = 0; c < d; c++) acc[c] += pb * v[(size_t)j * d + c];
            }
            m = mn;
        }
        for (int c = 0; c < d; c++) R->o[1][(size_t)i * d + c] = bfr(acc[c] / l);
        R->lse[1][i] = m + log(l);
    }
    // backward: turn S into dS (f64) and dP into dS (emul) in place, P kept on the fly
    std::vector<double> Pe((size_t)T * T), Pf((size_t)T * T);
#pragma omp parallel for schedule(dynamic, 16)
    for (int i = 0; i < T; i++) {
        double Df = 0, De = 0;
        for (int j = 0; j <= i; j++) Df += exp(S[(size_t)i * T + j] - R->lse[0][i]) * dP[(size_t)i * T + j];
        for (int c = 0; c < d; c++) De += dout[(size_t)i * d + c] * R->o[1][(size_t)i * d + c];
        for (int j = 0; j <= i; j++) {
            size_t ij = (size_t)i * T + j;
            double pf = exp(S[ij] - R->lse[0][i]), pe = exp(S[ij] - R->lse[1][i]);
            Pf[ij] = pf;
            Pe[ij] = bfr(pe);
            S[ij] = pf * (dP[ij] - Df);         // dS, f64
            dP[ij] = bfr(pe * (dP[ij] - De));   // dS, emulated
        }
        std::vector<double> af(d, 0.0), ae(d, 0.0);
        for (int j = 0; j <= i; j++) {
            double sf = S[(size_t)i * T + j], se = dP[(size_t)i * T + j];
            for (int c = 0; c < d; c++) {
                af[c] += sf * k[(size_t)j * d + c];
                ae[c] += se * k[(size_t)j * d + c];
            }
        }
        for (int c = 0; c < d; c++) {
            R->dq[0][(size_t)i * d + c] = tau * af[c];
            R->dq[1][(size_t)i * d + c] = bfr(tau * ae[c]);
        }
    }
#pragma omp parallel for schedule(dynamic, 16)
    for (int j = 0; j < T; j++) {
        std::vector<double> kf(d, 0), ke(d, 0), vf(d, 0), ve(d, 0);
        for (int i = j; i < T; i++) {
            size_t ij = (size_t)i * T + j;
            for (int c = 0; c < d; c++) {
                kf[c] += S[ij] * q[(size_t)i * d + c];
                ke[c] += dP[ij] * q[(size_t)i * d + c];
                vf[c] += Pf[ij] * dout[(size_t)i * d + c];
                ve[c] += Pe[ij] * dout[(size_t)i * d + c];
            }
        }
        for (int c = 0; c < d; c++) {
            R->dk[0][(size_t)j * d + c] = tau * kf[c];
            R->dk[1][(size_t)j * d + c] = bfr(tau * ke[c]);
            R->dv[0][(size_t)j * d + c] = vf[c];
            R->dv[1][(size_t)j * d + c] = bfr(ve[c]);
        }
    }
}

struct Case {
    int B, H, T, d;
    bool packed;   // q/k/v and dq/dk/dv as views of (B, T, 3, H, d) buffers
    double qk_scale;
};

static void run_case(const Case &cs, int seed) {
    const int B = cs.B, H = cs.H, T = cs.T, d = cs.d, C = H * d;
    const int qs = cs.packed ? 3 * C : C;  // row stride of q/k/v and dq/dk/dv
    const size_t n_tok = (size_t)B * T;
    rng_state = 0x5eed0000ull + seed;
    char tag[128];
    snprintf(tag, sizeof tag, "B=%d H=%d T=%d d=%d %s qk*%.0f", B, H, T, d, cs.packed ? "packed" : "separate", cs.qk_scale);

    // host inputs: qkv buffer(s) with row stride qs; three tensors at offsets 0, C, 2C (packed)
    // or in three separate buffers
    const size_t qkv_elems = cs.packed ? n_tok * qs : 3 * n_tok * C;
    std::vector<uint16_t> h_qkv(qkv_elems), h_do(n_tok * C);
    for (size_t i = 0; i < qkv_elems; i++) h_qkv[i] = f2bf((float)rng_normal());
    for (size_t i = 0; i < n_tok * C; i++) h_do[i] = f2bf((float)rng_normal());
    // scale Q and K for sharper attention (values stay BF16)
    auto offs = [&](int which) -> size_t { return cs.packed ? (size_t)which * C : (size_t)which * n_tok * C; };
    for (size_t t = 0; t < n_tok; t++)
        for (int which = 0; which < 2; which++)
            for (int c = 0; c < C; c++) {
                size_t i = offs(which) + t * qs + c;
                h_qkv[i] = f2bf((float)(bf2f(h_qkv[i]) * cs.qk_scale));
            }

    uint16_t *d_qkv, *d_dqkv, *d_o, *d_do;
    float *d_lse;
    void *d_ws;
    size_t ws = attn_gpu_backward_workspace_bytes(B, H, T, d);
    CU(cudaMalloc(&d_qkv, qkv_elems * 2));
    CU(cudaMalloc(&d_dqkv, qkv_elems * 2));
    CU(cudaMalloc(&d_o, n_tok * C * 2));
    CU(cudaMalloc(&d_do, n_tok * C * 2));
    CU(cudaMalloc(&d_lse, (size_t)B * H * T * 4));
    CU(cudaMalloc(&d_ws, ws));
    CU(cudaMemcpy(d_qkv, h_qkv.data(), qkv_elems * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_do, h_do.data(), n_tok * C * 2, cudaMemcpyHostToDevice));
    // poison: 0xFF bytes are NaN in BF16 and FP32
    CU(cudaMemset(d_dqkv, 0xFF, qkv_elems * 2));
    CU(cudaMemset(d_o, 0xFF, n_tok * C * 2));
    CU(cudaMemset(d_lse, 0xFF, (size_t)B * H * T * 4));
    CU(cudaMemset(d_ws, 0xFF, ws));

    const uint16_t *q = d_qkv + offs(0), *k = d_qkv + offs(1), *v = d_qkv + offs(2);
    uint16_t *dq = d_dqkv + offs(0), *dk = d_dqkv + offs(1), *dv = d_dqkv + offs(2);
    attn_gpu_forward(q, k, v, qs, d_o, C, d_lse, B, H, T, d, 0);
    attn_gpu_backward(q, k, v, qs, d_o, d_do, C, d_lse, dq, dk, dv, qs, d_ws, B, H, T, d, 0);
    cudaError_t err = cudaDeviceSynchronize();
    CHECK(err == cudaSuccess, "attn gpu runs", "%s: %s", tag, cudaGetErrorString(err));
    if (err != cudaSuccess) exit(1);

    std::vector<uint16_t> g_o(n_tok * C), g_dqkv(qkv_elems);
    std::vector<float> g_lse((size_t)B * H * T);
    CU(cudaMemcpy(g_o.data(), d_o, n_tok * C * 2, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(g_dqkv.data(), d_dqkv, qkv_elems * 2, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(g_lse.data(), d_lse, g_lse.size() * 4, cudaMemcpyDeviceToHost));

    // The forward's O from the fragments' own stores instead of the TMA store from shared memory
    // (the fallback where O's rows are not 16-byte aligned): the same O and LSE bit for bit
    {
        uint16_t *d_o2;
        float *d_lse2;
        CU(cudaMalloc(&d_o2, n_tok * C * 2));
        CU(cudaMalloc(&d_lse2, (size_t)B * H * T * 4));
        CU(cudaMemset(d_o2, 0xFF, n_tok * C * 2));
        CU(cudaMemset(d_lse2, 0xFF, (size_t)B * H * T * 4));
        gpu_test_hooks.fwd_bf16_no_o_tma = 1;
        attn_gpu_forward(q, k, v, qs, d_o2, C, d_lse2, B, H, T, d, 0);
        gpu_test_hooks.fwd_bf16_no_o_tma = 0;
        std::vector<uint16_t> g_o2(n_tok * C);
        std::vector<float> g_lse2((size_t)B * H * T);
        CU(cudaMemcpy(g_o2.data(), d_o2, n_tok * C * 2, cudaMemcpyDeviceToHost));
        CU(cudaMemcpy(g_lse2.data(), d_lse2, g_lse2.size() * 4, cudaMemcpyDeviceToHost));
        size_t diff = 0;
        for (size_t i = 0; i < g_o.size(); i++) diff += g_o2[i] != g_o[i];
        for (size_t i = 0; i < g_lse.size(); i++) diff += memcmp(&g_lse2[i], &g_lse[i], 4) != 0;
        char nm[192];
        snprintf(nm, sizeof nm, "attn gpu forward: O stored from the fragments = by TMA, bit for bit: %s", tag);
        CHECK(diff == 0, nm, "%zu values differ", diff);
        cudaFree(d_o2);
        cudaFree(d_lse2);
    }

    // every output element written (finite), over all heads; padding of packed buffers untouched
    // is impossible to tell apart here, so count only the tensors' own elements
    long unwritten = 0;
    for (size_t t = 0; t < n_tok; t++)
        for (int c = 0; c < C; c++) {
            if (!isfinite(bf2f(g_o[t * C + c]))) unwritten++;
            for (int which = 0; which < 3; which++)
                if (!isfinite(bf2f(g_dqkv[offs(which) + t * qs + c]))) unwritten++;
        }
    for (float x : g_lse)
        if (!isfinite(x)) unwritten++;
    CHECK(unwritten == 0, "attn gpu writes every output", "%s: %ld elements still NaN", tag, unwritten);

    // every head, no reference needed: each O row is a convex combination of V rows of its head,
    // so |O| <= max |V| of that head (1% slack: P in BF16 against the FP32 row sum, O rounded)
    long out_of_range = 0;
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            double vmax = 0;
            for (int t = 0; t < T; t++)
                for (int c = 0; c < d; c++)
                    vmax = fmax(vmax, fabs(bf2f(h_qkv[offs(2) + ((size_t)b * T + t) * qs + (size_t)h * d + c])));
            for (int t = 0; t < T; t++)
                for (int c = 0; c < d; c++)
                    if (fabs(bf2f(g_o[((size_t)b * T + t) * C + (size_t)h * d + c])) > vmax * 1.01) out_of_range++;
        }
    CHECK(out_of_range == 0, "attn gpu O within the range of V, every head", "%s: %ld elements of O outside",
          tag, out_of_range);

    // references on a few heads (all of them for small problems)
    std::vector<int> heads;
    if ((double)B * H * T * T <= 4.0e6) {
        for (int i = 0; i < B * H; i++) heads.push_back(i);
    } else {
        heads.push_back(0);
        if (B * H > 1) heads.push_back(B * H - 1);
    }
    int block_q, block_k;
    attn_gpu_block_sizes(d, &block_q, &block_k);
    AttnErr eo[2], el[2], edq[2], edk[2], edv[2];
    std::vector<double> hq((size_t)T * d), hk((size_t)T * d), hv((size_t)T * d), hdo((size_t)T * d);
    for (int bh : heads) {
        int b = bh / H, h = bh % H;
        for (int t = 0; t < T; t++)
            for (int c = 0; c < d; c++) {
                size_t row = (size_t)b * T + t, col = (size_t)h * d + c;
                hq[(size_t)t * d + c] = bf2f(h_qkv[offs(0) + row * qs + col]);
                hk[(size_t)t * d + c] = bf2f(h_qkv[offs(1) + row * qs + col]);
                hv[(size_t)t * d + c] = bf2f(h_qkv[offs(2) + row * qs + col]);
                hdo[(size_t)t * d + c] = bf2f(h_do[row * C + col]);
            }
        HeadRef R;
        reference_head(T, d, block_k, hq.data(), hk.data(), hv.data(), hdo.data(), &R);
        for (int r = 0; r < 2; r++)
            for (int t = 0; t < T; t++) {
                size_t row = (size_t)b * T + t;
                el[r].add(g_lse[(size_t)bh * T + t], R.lse[r][t]);
                for (int c = 0; c < d; c++) {
                    size_t col = (size_t)h * d + c, i = (size_t)t * d + c;
                    eo[r].add(bf2f(g_o[row * C + col]), R.o[r][i]);
                    edq[r].add(bf2f(g_dqkv[offs(0) + row * qs + col]), R.dq[r][i]);
                    edk[r].add(bf2f(g_dqkv[offs(1) + row * qs + col]), R.dk[r][i]);
                    edv[r].add(bf2f(g_dqkv[offs(2) + row * qs + col]), R.dv[r][i]);
                }
            }
    }
    const char *names[5] = {"O", "LSE", "dQ", "dK", "dV"};
    AttnErr *errs[5] = {eo, el, edq, edk, edv};
    const double tol_rel[2] = {1e-2, 2e-3};     // f64: BF16 arithmetic; emul: same numerics
    const double tol_max[2] = {5e-2, 1.5e-2};   // max abs error relative to max |ref|
    for (int r = 0; r < 2; r++)
        for (int n = 0; n < 5; n++) {
            const AttnErr &e = errs[n][r];
            char name[256];
            snprintf(name, sizeof name, "attn gpu %s vs %s: %s", names[n], r ? "bf16 emulation" : "f64", tag);
            double relmax = e.maxabs / (e.maxref > 0 ? e.maxref : 1);
            bool lse = n == 1;  // LSE is FP32: absolute error
            bool ok = e.nonfinite == 0 && (lse ? e.maxabs < 2e-3 : (e.rel() < tol_rel[r] && relmax < tol_max[r]));
            CHECK(ok, name, "rel L2 %.3e, max abs %.3e (max |ref| %.3e), nonfinite %ld", e.rel(), e.maxabs, e.maxref, e.nonfinite);
            printf("#   %-4s vs %-4s rel L2 %.3e  max abs %.3e  (max |ref| %.3e)\n", names[n], r ? "emul" : "f64", e.rel(), e.maxabs, e.maxref);
        }
    cudaFree(d_qkv); cudaFree(d_dqkv); cudaFree(d_o); cudaFree(d_do); cudaFree(d_lse); cudaFree(d_ws);
}

int main(void) {
    if (!gpu_test_have_gpu("test_attention_gpu")) return 0;
    const Case cases[] = {
        {2, 3, 200, 64, true, 1.0},     // T below one tile, several heads
        {1, 2, 517, 128, false, 2.0},   // T not a multiple of any tile
        {2, 2, 1024, 64, true, 3.0},    // sharp attention
        {1, 2, 1000, 128, true, 1.0},
        {1, 1, 64, 128, true, 1.0},     // exactly one key block
        {2, 3, 300, 128, true, 2.0},    // d = 128 with several batches and heads
        {1, 2, 4096, 128, true, 2.0},   // long sequence
        {1, 1, 4000, 64, false, 1.0},
        {16, 16, 1024, 128, true, 1.0}, // the benchmark's T = 1K shape (references on 2 heads)
    };
    // ATTN_TEST_SMALL=1: the first two cases only (for compute-sanitizer runs)
    const char *small = getenv("ATTN_TEST_SMALL");
    int n_cases = (int)(sizeof cases / sizeof cases[0]);
    if (small && atoi(small)) n_cases = 2;
    for (int i = 0; i < n_cases; i++) run_case(cases[i], i);
    return test_summary("test_attention_gpu");
}
