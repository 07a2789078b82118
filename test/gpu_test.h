// gpu_test.h: what the GPU tests share: a CUDA-call check that reports a failed check instead
// of crashing, a seeded generator for fresh random inputs, and the "skipped" line printed where
// there is no GPU (run_tests.sh counts it as skipped, neither passed nor failed).
#ifndef GPU_TEST_H
#define GPU_TEST_H

#include <cuda_runtime.h>  // cudaError_t, cudaGetDeviceCount
#include <math.h>          // sqrt, log, cos for the normal generator
#include <stdint.h>        // uint64_t
#include <stdio.h>         // printf
#include <stdlib.h>        // exit

// A failing CUDA call is reported as a FAIL line and ends the test program.
#define CU(call)                                                                                \
    do {                                                                                        \
        cudaError_t e_ = (call);                                                                \
        if (e_ != cudaSuccess) {                                                                \
            printf("FAIL - cuda call %s (%s:%d): %s\n", #call, __FILE__, __LINE__,              \
                   cudaGetErrorString(e_));                                                     \
            exit(1);                                                                            \
        }                                                                                       \
    } while (0)

// splitmix64; each test sets rng_state to its own seed before drawing.
static uint64_t rng_state = 0x1234ABCDull;
static inline double rng_uniform(void) {  // [0, 1)
    uint64_t z = (rng_state += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return (z >> 11) * (1.0 / 9007199254740992.0);
}
static inline double rng_normal(void) {  // N(0, 1), Box-Muller
    double u1 = rng_uniform() + 1e-300, u2 = rng_uniform();
    return sqrt(-2.0 * log(u1)) * cos(6.283185307179586 * u2);
}

// 1 when a CUDA device is usable. Otherwise 0, after one line: "skipped: <name> (no GPU: <why>)"
// where this machine has no GPU (no NVIDIA driver, or a driver that finds no device), the one
// reason a GPU test may skip (run_tests.sh counts it, and fails it where nvidia-smi lists a GPU);
// any other failure (a driver too old for this build, a device that fails to initialise) is a
// broken GPU machine, reported as a FAIL line, so that it never reads green.
static inline int gpu_test_have_gpu(const char *name) {
    int count = 0, driver = 0;
    cudaError_t err = cudaGetDeviceCount(&count);
    if (err == cudaSuccess && count > 0) return 1;
    cudaDriverGetVersion(&driver);
    if (driver == 0 || err == cudaErrorNoDevice || err == cudaSuccess) {
        printf("skipped: %s (no GPU: %s)\n", name, driver == 0 ? "no NVIDIA driver found" : "the driver finds no GPU");
        return 0;
    }
    printf("FAIL - %s: a GPU machine whose GPU cannot be used: %s (driver CUDA %d.%d)\n", name, cudaGetErrorString(err),
           driver / 1000, driver % 1000 / 10);
    return 0;
}

#ifdef __cplusplus
#include <vector>  // host copies of device buffers

#include "core/fp8.h"  // bf16_from_f32 (host and device)

// Device buffers: dnew allocates n elements poisoned with 0xFF bytes (NaN for float and BF16),
// so an output a kernel forgot to write shows up; dup copies a host vector to the device; back
// copies n elements to the host after the device is done; poison re-poisons a buffer.
template <class T> static T *dnew(size_t n) {
    T *p = NULL;
    CU(cudaMalloc(&p, (n ? n : 1) * sizeof(T)));
    CU(cudaMemset(p, 0xFF, (n ? n : 1) * sizeof(T)));
    return p;
}
template <class T> static T *dup(const std::vector<T> &h) {
    T *p = dnew<T>(h.size());
    CU(cudaMemcpy(p, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return p;
}
template <class T> static std::vector<T> back(const T *d, size_t n) {
    std::vector<T> h(n);
    CU(cudaDeviceSynchronize());
    CU(cudaMemcpy(h.data(), d, n * sizeof(T), cudaMemcpyDeviceToHost));
    return h;
}
template <class T> static void poison(T *d, size_t n) { CU(cudaMemset(d, 0xFF, n * sizeof(T))); }

// Error of an output against its reference: relative L2 (a zero reference makes any error
// huge), max abs error, and the count of non-finite outputs (which fail ok()). ok(tol) bounds
// both: the relative L2 by tol and the max abs error by 5 x tol x max |ref|, so that a few wild
// values, which a large tensor dilutes in its L2, fail too (rounding noise of relative L2 e has
// a max abs error near 3e x max |ref| at most: test_tile_bound measures it on the emulation).
struct Err {
    double num = 0, den = 0, maxabs = 0, maxref = 0;  // maxref: max |ref|, to put maxabs in scale
    long nonfinite = 0;
    void add(double got, double ref) {
        if (!isfinite(got)) { nonfinite++; return; }
        double d = got - ref;
        num += d * d;
        den += ref * ref;
        if (fabs(d) > maxabs) maxabs = fabs(d);
        if (fabs(ref) > maxref) maxref = fabs(ref);
    }
    double rel() const { return sqrt(num / (den > 0 ? den : 1e-300)); }
    bool ok(double tol) const { return nonfinite == 0 && rel() < tol && maxabs <= 5 * tol * maxref; }
};

// Fresh values offset + scale * U[-1, 1) made on the device (timing sizes are large), as BF16
// and/or FP32: splitmix64 of the element index and the seed, so never zeros nor a pattern.
__global__ void gpu_test_fill_kernel(uint16_t *bf, float *f, size_t n, uint64_t seed, float scale, float offset) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint64_t z = (i + 1) * 0x9E3779B97F4A7C15ull + seed;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    float u = (float)((z >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;  // [-1, 1)
    float v = offset + scale * u;
    if (bf) bf[i] = bf16_from_f32(v);
    if (f) f[i] = v;
}
static inline void gpu_test_fill_bf16(uint16_t *d, size_t n, uint64_t seed, float scale, float offset = 0.0f) {
    gpu_test_fill_kernel<<<(unsigned)((n + 255) / 256), 256>>>(d, NULL, n, seed, scale, offset);
    CU(cudaGetLastError());
}
static inline void gpu_test_fill_f32(float *d, size_t n, uint64_t seed, float scale) {
    gpu_test_fill_kernel<<<(unsigned)((n + 255) / 256), 256>>>(NULL, d, n, seed, scale, 0.0f);
    CU(cudaGetLastError());
}

// Mean milliseconds of body() over `reps` calls after `warm` untimed ones (CUDA events on the
// default stream; for timing lines, not checks).
template <class F> static double gpu_time_ms(F body, int warm, int reps) {
    for (int i = 0; i < warm; i++) body();
    cudaEvent_t a, b;
    CU(cudaEventCreate(&a));
    CU(cudaEventCreate(&b));
    CU(cudaEventRecord(a));
    for (int i = 0; i < reps; i++) body();
    CU(cudaEventRecord(b));
    CU(cudaEventSynchronize(b));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, a, b));
    CU(cudaEventDestroy(a));
    CU(cudaEventDestroy(b));
    return ms / reps;
}
#endif  // __cplusplus

#endif  // GPU_TEST_H
