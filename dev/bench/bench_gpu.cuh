// bench_gpu.cuh: what the GPU benchmarks share: a CUDA error check that names the call, random
// BF16 inputs (never zeros), and the median time of repeated runs with CUDA events.
#ifndef BENCH_GPU_CUH
#define BENCH_GPU_CUH

#include <cuda_runtime.h>  // events, memory
#include <stdint.h>        // uint16_t, uint32_t
#include <stdio.h>         // fprintf
#include <stdlib.h>        // exit
#include <algorithm>       // sort
#include <functional>      // std::function
#include <vector>          // timings

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

// Fills a BF16 buffer with hash-based pseudo-random values in about [-2, 2).
__global__ void fill_random_bf16(uint16_t *x, size_t n, uint32_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
    float f = ((h >> 8) * (1.0f / 16777216.0f)) * 4.0f - 2.0f;
    uint32_t bits = __float_as_uint(f);
    x[i] = (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

// A new device buffer of n such values.
static inline uint16_t *random_bf16(size_t n, uint32_t seed) {
    uint16_t *p;
    CU(cudaMalloc(&p, n * 2));
    fill_random_bf16<<<(unsigned)((n + 255) / 256), 256>>>(p, n, seed);
    CU(cudaGetLastError());
    return p;
}

// Median ms of `iters` runs of f after `warmup` runs, each timed alone with events.
static inline double bench_time_ms(const std::function<void()> &f, int warmup = 5, int iters = 25) {
    cudaEvent_t a, b;
    CU(cudaEventCreate(&a));
    CU(cudaEventCreate(&b));
    for (int i = 0; i < warmup; i++) f();
    std::vector<float> ms;
    for (int i = 0; i < iters; i++) {
        CU(cudaEventRecord(a));
        f();
        CU(cudaEventRecord(b));
        CU(cudaEventSynchronize(b));
        float t;
        CU(cudaEventElapsedTime(&t, a, b));
        ms.push_back(t);
    }
    CU(cudaGetLastError());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
}

#endif  // BENCH_GPU_CUH
