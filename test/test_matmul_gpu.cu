// test_matmul_gpu.cu: the cuBLASLt GEMMs of matmul.h against an FP64 CPU reference on the same
// BF16 inputs (fresh seeded random values), for the three forms of a linear layer, with and
// without accumulation, at several shapes including ones that are not multiples of 16.
// Outputs are poisoned (NaN) before overwriting calls. Tolerances: BF16 outputs rel L2 < 5e-3
// (one rounding), FP32 weight gradients rel L2 < 3e-5 (FP32 accumulation). Also checks that a
// repeated shape reuses its cached plan. Without a GPU: prints one "skipped" line, returns 0.
// With GPU_LAYERS_TIMING=1 it also times the three GEMMs at training sizes ("# timing" lines).
#include <cuda_runtime.h>  // device memory
#include <math.h>          // sqrt, log, cos
#include <stdint.h>        // uint16_t, uint64_t
#include <stdio.h>         // printf, snprintf
#include <vector>          // host buffers

#include "core/fp8.h"    // bf16_from_f32, bf16_to_f32
#include "gpu/matmul.h"  // the GEMMs under test
#include "gpu_test.h"    // CU, rng_normal, gpu_test_have_gpu, dnew/dup/back, Err
#include "test.h"        // CHECK, test_summary

typedef std::vector<uint16_t> Bf;
typedef std::vector<double> Dv;

static Bf rand_bf(size_t n, double scale) {
    Bf v(n);
    for (size_t i = 0; i < n; i++) v[i] = bf16_from_f32((float)(scale * rng_normal()));
    return v;
}
static Dv to_d(const Bf &b) {
    Dv d(b.size());
    for (size_t i = 0; i < b.size(); i++) d[i] = bf16_to_f32(b[i]);
    return d;
}

static void report(const Err &e, double tol, const char *what, int M, int N, int K, int acc) {
    char nm[128];
    snprintf(nm, sizeof nm, "matmul %s M=%d N=%d K=%d accumulate=%d", what, M, N, K, acc);
    CHECK(e.ok(tol), nm, "rel L2 %.3g (tol %.1g), max abs %.3g of max %.3g (bound 5 x tol), %ld non-finite", e.rel(),
          tol, e.maxabs, e.maxref, e.nonfinite);
    printf("#   %-52s rel L2 %.2e\n", nm, e.rel());
}

// y = x W^T, dx = dy W, dW += dy^T x with x (M, K), W (N, K), dy (M, N).
static void test_shape(int M, int N, int K) {
    Bf x = rand_bf((size_t)M * K, 1.0), w = rand_bf((size_t)N * K, 0.5), dy = rand_bf((size_t)M * N, 1.0);
    Bf y0 = rand_bf((size_t)M * N, 1.0), dx0 = rand_bf((size_t)M * K, 1.0);
    std::vector<float> dw0((size_t)N * K);
    for (auto &v : dw0) v = (float)rng_normal();
    Dv xd = to_d(x), wd = to_d(w), dyd = to_d(dy);
    Dv y_ref((size_t)M * N), dx_ref((size_t)M * K, 0.0), dw_ref((size_t)N * K, 0.0);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double s = 0;
            for (int k = 0; k < K; k++) s += xd[(size_t)i * K + k] * wd[(size_t)j * K + k];
            y_ref[(size_t)i * N + j] = s;
        }
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            const double g = dyd[(size_t)i * N + j];
            for (int k = 0; k < K; k++) {
                dx_ref[(size_t)i * K + k] += g * wd[(size_t)j * K + k];
                dw_ref[(size_t)j * K + k] += g * xd[(size_t)i * K + k];
            }
        }
    uint16_t *d_x = dup(x), *d_w = dup(w), *d_dy = dup(dy);
    for (int acc = 0; acc < 2; acc++) {
        uint16_t *d_y = acc ? dup(y0) : dnew<uint16_t>((size_t)M * N);
        uint16_t *d_dx = acc ? dup(dx0) : dnew<uint16_t>((size_t)M * K);
        matmul_forward_gpu(d_y, d_x, d_w, M, N, K, acc, 0);
        matmul_dgrad_gpu(d_dx, d_dy, d_w, M, N, K, acc, 0);
        Bf y = back(d_y, (size_t)M * N), dx = back(d_dx, (size_t)M * K);
        Err ey, edx;
        for (size_t i = 0; i < y.size(); i++) ey.add(bf16_to_f32(y[i]), y_ref[i] + (acc ? bf16_to_f32(y0[i]) : 0.0));
        for (size_t i = 0; i < dx.size(); i++)
            edx.add(bf16_to_f32(dx[i]), dx_ref[i] + (acc ? bf16_to_f32(dx0[i]) : 0.0));
        report(ey, 5e-3, "forward", M, N, K, acc);
        report(edx, 5e-3, "dgrad", M, N, K, acc);
        cudaFree(d_y);
        cudaFree(d_dx);
    }
    // wgrad always accumulates into FP32: run it twice from dw0, expect dw0 + 2 * dy^T x
    float *d_dw = dup(dw0);
    matmul_wgrad_gpu(d_dw, d_dy, d_x, M, N, K, 0);
    std::vector<float> dw1 = back(d_dw, (size_t)N * K);
    const int plans = matmul_gpu_plan_count();
    matmul_wgrad_gpu(d_dw, d_dy, d_x, M, N, K, 0);
    std::vector<float> dw2 = back(d_dw, (size_t)N * K);
    Err e1, e2;
    for (size_t i = 0; i < dw1.size(); i++) {
        e1.add(dw1[i], dw0[i] + dw_ref[i]);
        e2.add(dw2[i], dw0[i] + 2.0 * dw_ref[i]);
    }
    report(e1, 3e-5, "wgrad fp32", M, N, K, 1);
    report(e2, 3e-5, "wgrad fp32 twice", M, N, K, 1);
    char nm[96];
    snprintf(nm, sizeof nm, "matmul plan cached M=%d N=%d K=%d", M, N, K);
    CHECK(matmul_gpu_plan_count() == plans, nm, "plans %d -> %d for a repeated shape", plans, matmul_gpu_plan_count());
    cudaFree(d_dw);
    cudaFree(d_x);
    cudaFree(d_w);
    cudaFree(d_dy);
}


static void time_gemm(const char *what, int M, int N, int K) {
    uint16_t *x, *w, *y;
    float *dw;
    CU(cudaMalloc(&x, (size_t)M * K * 2));
    CU(cudaMalloc(&w, (size_t)N * K * 2));
    CU(cudaMalloc(&y, (size_t)M * N * 2));
    CU(cudaMalloc(&dw, (size_t)N * K * 4));
    CU(cudaMemset(dw, 0, (size_t)N * K * 4));
    gpu_test_fill_bf16(x, (size_t)M * K, 1, 1.0f);
    gpu_test_fill_bf16(w, (size_t)N * K, 2, 1.0f);
    gpu_test_fill_bf16(y, (size_t)M * N, 3, 1.0f);
    const char *kinds[3] = {"forward", "dgrad", "wgrad"};
    for (int kind = 0; kind < 3; kind++) {
        double ms = gpu_time_ms([&] {  // 3 warm-up runs, then 10 timed
            if (kind == 0) matmul_forward_gpu(y, x, w, M, N, K, 0, 0);
            if (kind == 1) matmul_dgrad_gpu(x, y, w, M, N, K, 0, 0);
            if (kind == 2) matmul_wgrad_gpu(dw, y, x, M, N, K, 0);
        }, 3, 10);
        printf("# timing %-10s %-7s M=%d N=%d K=%d  %8.3f ms  %6.0f TFLOP/s\n", what, kinds[kind], M, N, K, ms,
               2.0 * M * N * K / (ms * 1e-3) / 1e12);
    }
    CU(cudaFree(x)); CU(cudaFree(w)); CU(cudaFree(y)); CU(cudaFree(dw));
}

int main(void) {
    if (!gpu_test_have_gpu("test_matmul_gpu")) return 0;
    rng_state = 0xC0FFEE11ull;
    matmul_gpu_init();
    test_shape(64, 128, 96);
    test_shape(512, 768, 256);
    test_shape(128, 200, 72);  // multiples of 8, not of 16
    test_shape(1, 64, 64);     // a single row
    test_shape(37, 45, 29);    // odd everything (unaligned rows)
    test_shape(100, 50, 130);
    const char *tm = getenv("GPU_LAYERS_TIMING");
    if (tm && tm[0] == '1') {  // B*T = 16384 tokens, C = 2048, F = 5632, Vp = 50304
        time_gemm("qkv", 16384, 3 * 2048, 2048);
        time_gemm("mlp_fc", 16384, 2 * 5632, 2048);
        time_gemm("mlp_proj", 16384, 2048, 5632);
        time_gemm("lm_head", 4096, 50304, 2048);
    }
    matmul_gpu_shutdown();
    CU(cudaGetLastError());
    return test_summary("test_matmul_gpu");
}
