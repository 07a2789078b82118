// attention_lab.cuh: what the attention lab versions share: the problem shapes they run (B*T
// tokens fixed, H heads of d, T from the command line), random packed inputs, the comparison of
// a lab kernel's outputs with the library's, and the TFLOP/s line of a timing.
#pragma once

#include <cuda_bf16.h>     // __nv_bfloat16, __bfloat162float (host side)
#include <cuda_runtime.h>  // device memory
#include <math.h>          // fabs, sqrt
#include <stdint.h>        // uint16_t
#include <stdio.h>         // printf
#include <stdlib.h>        // atoi
#include <string.h>        // memcpy
#include <vector>          // host copies, the T list

#include "attention/kernels_bf16.h"   // attn_gpu_forward: the library's version, the labs' reference
#include "dev/bench/bench_gpu.cuh"  // CU, random_bf16, bench_time_ms

// The shapes of a run: `prog [d=128] [T ...]` (T default 1024 2048 4096 8192), tokens = B * T =
// 16384 (B at least 1), H = 16.
struct LabShapes {
    int d = 128, H = 16, tokens = 16384;
    std::vector<int> Ts;
    LabShapes(int argc, char **argv) {
        if (argc > 1) d = atoi(argv[1]);
        for (int i = 2; i < argc; i++) Ts.push_back(atoi(argv[i]));
        if (Ts.empty()) Ts = {1024, 2048, 4096, 8192};
        if (d != 64 && d != 128) {
            fprintf(stderr, "head dim %d: 64 or 128\n", d);
            exit(2);
        }
    }
    int batch(int T) const { return tokens / T > 0 ? tokens / T : 1; }
};

static inline float lab_bf2f(uint16_t u) {
    __nv_bfloat16 b;
    memcpy(&b, &u, 2);
    return __bfloat162float(b);
}

// How far a lab kernel's BF16 output is from the library's: values that differ in any bit, the
// relative L2 distance and the largest absolute difference (relative to the largest |reference|).
struct LabDiff {
    size_t n = 0, differ = 0, nonfinite = 0;
    double num = 0, den = 0, maxabs = 0, maxref = 0;
    double rel() const { return sqrt(num / (den > 0 ? den : 1)); }
    double relmax() const { return maxabs / (maxref > 0 ? maxref : 1); }
};
// rows rows of cols BF16 values, row strides stride_x (the lab's) and stride_r (the library's),
// both in device memory, added to *dd.
static inline void lab_diff_bf16(LabDiff *dd, const uint16_t *x, int stride_x, const uint16_t *ref, int stride_r,
                                 size_t rows, int cols) {
    std::vector<uint16_t> hx(rows * (size_t)stride_x), hr(rows * (size_t)stride_r);
    CU(cudaMemcpy(hx.data(), x, hx.size() * 2, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(hr.data(), ref, hr.size() * 2, cudaMemcpyDeviceToHost));
    for (size_t r = 0; r < rows; r++)
        for (int c = 0; c < cols; c++) {
            const uint16_t a = hx[r * stride_x + c], b = hr[r * stride_r + c];
            const double fa = lab_bf2f(a), fb = lab_bf2f(b);
            dd->n++;
            dd->differ += a != b;
            if (!isfinite(fa)) {
                dd->nonfinite++;
                continue;
            }
            dd->num += (fa - fb) * (fa - fb);
            dd->den += fb * fb;
            dd->maxabs = fmax(dd->maxabs, fabs(fa - fb));
            dd->maxref = fmax(dd->maxref, fabs(fb));
        }
}
// FP32 values (n of them, device memory) likewise, bit for bit.
static inline void lab_diff_f32(LabDiff *dd, const float *x, const float *ref, size_t n) {
    std::vector<float> hx(n), hr(n);
    CU(cudaMemcpy(hx.data(), x, n * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(hr.data(), ref, n * 4, cudaMemcpyDeviceToHost));
    for (size_t i = 0; i < n; i++) {
        dd->n++;
        dd->differ += memcmp(&hx[i], &hr[i], 4) != 0;
        if (!isfinite(hx[i])) {
            dd->nonfinite++;
            continue;
        }
        dd->num += ((double)hx[i] - hr[i]) * ((double)hx[i] - hr[i]);
        dd->den += (double)hr[i] * hr[i];
        dd->maxabs = fmax(dd->maxabs, fabs((double)hx[i] - hr[i]));
        dd->maxref = fmax(dd->maxref, fabs((double)hr[i]));
    }
}
// One line on the comparison; true when it passes: bit for bit (exact) or within rel L2 `tol`
// and max abs 5 tol (relative to the largest reference value), no value non-finite.
static inline bool lab_report(const char *what, const LabDiff &dd, bool exact, double tol) {
    const bool ok = dd.nonfinite == 0 && (exact ? dd.differ == 0 : dd.rel() < tol && dd.relmax() < 5 * tol);
    printf("%s %s: %zu of %zu values differ, rel L2 %.3e, max abs %.3e (%s)\n", ok ? "ok  " : "FAIL", what, dd.differ,
           dd.n, dd.rel(), dd.relmax(), exact ? "must be identical" : "tolerance");
    return ok;
}

// Causal attention FLOPs: forward 4 B H T^2 d / 2, backward 2.5 times that.
static inline double lab_fwd_flops(int B, int H, int T, int d) { return 4.0 * B * H * (double)T * T * d / 2.0; }
static inline void lab_time_line(const char *who, int T, int B, int H, int d, double ms, double flops) {
    printf("  %-28s T=%5d B=%2d H=%d d=%3d  %8.4f ms  %6.1f TFLOP/s\n", who, T, B, H, d, ms, flops / (ms * 1e-3) / 1e12);
}

// A forward's outputs twice, the library's and the lab's: O (B, T, H d) and LSE (B, H, T).
struct LabForwardOut {
    uint16_t *o_ref, *o_lab;
    float *lse_ref, *lse_lab;
    LabForwardOut(int B, int H, int T, int d) {
        const size_t n_tok = (size_t)B * T;
        CU(cudaMalloc(&o_ref, n_tok * H * d * 2));
        CU(cudaMalloc(&o_lab, n_tok * H * d * 2));
        CU(cudaMalloc(&lse_ref, (size_t)B * H * T * 4));
        CU(cudaMalloc(&lse_lab, (size_t)B * H * T * 4));
    }
    ~LabForwardOut() { cudaFree(o_ref); cudaFree(o_lab); cudaFree(lse_ref); cudaFree(lse_lab); }
    LabForwardOut(const LabForwardOut &) = delete;  // owns its buffers
    LabForwardOut &operator=(const LabForwardOut &) = delete;
};

// Runs the library's forward (lib) and the lab's (lab) once, compares O and LSE (bit for bit when
// `exact`, else O within `tol` and LSE within tol / 100) and times both; true when both compare.
template <class Lib, class Lab>
static bool lab_forward_compare(const LabForwardOut &out, Lib lib, Lab lab, const char *lib_name, const char *lab_name,
                                bool exact, double tol, int B, int H, int T, int d) {
    const int C = H * d;
    lib();
    lab();
    CU(cudaDeviceSynchronize());
    printf("T=%d B=%d H=%d d=%d\n", T, B, H, d);
    LabDiff dO, dL;
    lab_diff_bf16(&dO, out.o_lab, C, out.o_ref, C, (size_t)B * T, C);
    lab_diff_f32(&dL, out.lse_lab, out.lse_ref, (size_t)B * H * T);
    bool ok = lab_report("O against the library's", dO, exact, tol);
    ok &= lab_report("LSE against the library's", dL, exact, exact ? 0 : tol * 1e-2);
    const double flops = lab_fwd_flops(B, H, T, d);
    lab_time_line(lib_name, T, B, H, d, bench_time_ms(lib), flops);
    lab_time_line(lab_name, T, B, H, d, bench_time_ms(lab), flops);
    return ok;
}

// The whole program of a BF16 forward lab version: per T, random packed qkv (B, T, 3 H d), the
// library's attn_gpu_forward and the lab's forward on it, compared and timed (lab_forward_compare).
// lab_forward(d, q, k, v, ld_qkv, o, ld_o, lse, B, H, T) runs the lab version on device pointers.
template <class LabForward>
static int lab_forward_main(int argc, char **argv, const char *lib_name, const char *lab_name, bool exact, double tol,
                            LabForward lab_forward) {
    const LabShapes sh(argc, argv);
    const int d = sh.d, H = sh.H, C = H * d;
    bool ok = true;
    for (int T : sh.Ts) {
        const int B = sh.batch(T);
        uint16_t *qkv = random_bf16((size_t)B * T * 3 * C, 1234u + T);  // (B, T, 3 C)
        const LabForwardOut out(B, H, T, d);
        const uint16_t *q = qkv, *k = qkv + C, *v = qkv + 2 * C;
        auto lib = [&] { attn_gpu_forward(q, k, v, 3 * C, out.o_ref, C, out.lse_ref, B, H, T, d, 0); };
        auto lab = [&] { lab_forward(d, q, k, v, 3 * C, out.o_lab, C, out.lse_lab, B, H, T); };
        ok &= lab_forward_compare(out, lib, lab, lib_name, lab_name, exact, tol, B, H, T, d);
        cudaFree(qkv);
    }
    return ok ? 0 : 1;
}
