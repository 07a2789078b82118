// bench_fp8_quant.cu: times the fp8_block quantization passes of a training step against the
// BF16 kernels they sit next to, at one model's shapes (default paper_569m: N = 16384 tokens,
// C = 1536, F = 3968), on random inputs (not zeros).
//
// Rows (median of timed runs, CUDA events, after warm-up):
//   copy (N, C)                 cudaMemcpyAsync of a BF16 (N, C): the bandwidth peer
//   quantize 1x128 both (R, K)  fp8_quantize_gpu, Q(x) and Q(x^T), for the operands that are still
//                               quantized in their own pass (o (N, C), dqkv (N, 3C), dres (N, C))
//   rmsnorm+res: bf16 / fused / unfused    residual_rmsnorm_forward_gpu / rmsnorm_forward_fp8_gpu
//                               (y not written) / the BF16 kernel then fp8_quantize_gpu
//   swiglu fwd, swiglu bwd: the same three
// Each row gives ms, the GB/s of the bytes the kernel must move (reads + writes of its contract)
// and, for fused and unfused, the ratio of its time to the BF16 layer alone (what FP8 adds).
//
//   bench_fp8_quant [N=16384] [C=1536] [F=3968]
#include <cuda_runtime.h>  // events, memory
#include <stdint.h>        // uint16_t
#include <stdio.h>         // printf
#include <stdlib.h>        // atoi, exit
#include <algorithm>       // sort
#include <functional>      // std::function
#include <vector>          // timings

#include "layers.h"          // the BF16 kernels
#include "layers_fp8.h"      // the fused kernels
#include "linear_fp8_gpu.h"  // fp8_quantize_gpu, Fp8Operand

#define CU(call)                                                                                   \
    do {                                                                                           \
        cudaError_t e_ = (call);                                                                   \
        if (e_ != cudaSuccess) {                                                                   \
            fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(e_)); \
            exit(1);                                                                               \
        }                                                                                          \
    } while (0)

// BF16 pseudo-random values in about [-2, 2) (hash of the index and seed).
__global__ void fill_random_bf16(uint16_t *x, size_t n, uint32_t seed) {
    size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= n) return;
    uint32_t h = (uint32_t)i * 2654435761u ^ seed;
    h ^= h >> 16; h *= 0x7feb352du; h ^= h >> 15; h *= 0x846ca68bu; h ^= h >> 16;
    float f = ((h >> 8) * (1.0f / 16777216.0f)) * 4.0f - 2.0f;
    uint32_t bits = __float_as_uint(f);
    x[i] = (uint16_t)((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16);
}

static uint16_t *random_bf16(size_t n, uint32_t seed) {
    uint16_t *p;
    CU(cudaMalloc(&p, n * 2));
    fill_random_bf16<<<(unsigned)((n + 255) / 256), 256>>>(p, n, seed);
    CU(cudaGetLastError());
    return p;
}

// Median ms of `iters` runs of f after `warmup`, each timed alone with events.
static double time_ms(const std::function<void()> &f, int warmup = 5, int iters = 25) {
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

static void row(const char *name, double ms, double bytes, double base_ms) {
    printf("| %-34s | %8.4f | %7.0f |", name, ms, bytes / (ms * 1e-3) / 1e9);
    if (base_ms > 0) printf(" %5.2f |\n", ms / base_ms);
    else printf("       |\n");
}

int main(int argc, char **argv) {
    const int N = argc > 1 ? atoi(argv[1]) : 16384, C = argc > 2 ? atoi(argv[2]) : 1536,
              F = argc > 3 ? atoi(argv[3]) : 3968;
    if (N <= 0 || C <= 0 || F <= 0 || F % 8) {
        fprintf(stderr, "bench_fp8_quant: N, C, F must be positive, F a multiple of 8 (got %d %d %d)\n", N, C, F);
        return 2;
    }
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("# bench_fp8_quant on %s: N %d, C %d, F %d (E4M3, 1x128 both ways)\n", prop.name, N, C, F);
    const size_t NC = (size_t)N * C, NF = (size_t)N * F;
    uint16_t *x = random_bf16(3 * NC, 1), *delta = random_bf16(NC, 2), *g = random_bf16(C, 3);
    uint16_t *fc = random_bf16(2 * NF, 4), *dout = random_bf16(NF, 5);
    uint16_t *res, *y, *sw, *dfc;
    float *rstd;
    CU(cudaMalloc(&res, NC * 2));
    CU(cudaMalloc(&y, NC * 2));
    CU(cudaMalloc(&sw, NF * 2));
    CU(cudaMalloc(&dfc, 2 * NF * 2));
    CU(cudaMalloc(&rstd, (size_t)N * 4));
    Fp8Operand q[3], qt[3];  // (N, C), (N, 3C) / (N, F), (N, 2F)
    const int widths[3] = {C, 3 * C, 2 * F};
    for (int i = 0; i < 3; i++) {
        fp8_operand_alloc(&q[i], N, widths[i], FP8_GROUP_1x128, FP8_E4M3);
        fp8_operand_alloc(&qt[i], widths[i], N, FP8_GROUP_1x128, FP8_E4M3);
    }
    Fp8Operand qf, qft;  // (N, F) for the SwiGLU output
    fp8_operand_alloc(&qf, N, F, FP8_GROUP_1x128, FP8_E4M3);
    fp8_operand_alloc(&qft, F, N, FP8_GROUP_1x128, FP8_E4M3);
    const float eps = 1e-5f;
    const cudaStream_t s = 0;

    printf("| kernel | ms | GB/s | vs BF16 layer |\n|---|---|---|---|\n");
    row("copy (N, C) BF16", time_ms([&] { CU(cudaMemcpyAsync(y, x, NC * 2, cudaMemcpyDeviceToDevice, s)); }), 4.0 * NC, 0);
    const char *qnames[3] = {"quantize both (N, C)", "quantize both (N, 3C)", "quantize both (N, 2F)"};
    const uint16_t *qsrc[3] = {x, x, fc};
    for (int i = 0; i < 3; i++) {
        const double n = (double)N * widths[i];
        row(qnames[i], time_ms([&] { fp8_quantize_gpu(&q[i], &qt[i], qsrc[i], N, widths[i], NULL, s); }), 4.0 * n, 0);
    }
    // RMSNorm with the residual add: reads x, delta; writes res and (BF16) y or (FP8) both codes
    const double t_norm = time_ms([&] { residual_rmsnorm_forward_gpu(res, y, rstd, x, delta, g, N, C, eps, s); });
    row("rmsnorm+res bf16", t_norm, 8.0 * NC, 0);
    row("rmsnorm+res fused fp8",
        time_ms([&] { rmsnorm_forward_fp8_gpu(res, NULL, rstd, x, delta, g, N, C, eps, &q[0], &qt[0], s); }), 8.0 * NC,
        t_norm);
    row("rmsnorm+res unfused fp8", time_ms([&] {
            residual_rmsnorm_forward_gpu(res, y, rstd, x, delta, g, N, C, eps, s);
            fp8_quantize_gpu(&q[0], &qt[0], y, N, C, NULL, s);
        }),
        8.0 * NC, t_norm);
    // SwiGLU: reads fc (N, 2F); writes out (N, F) BF16 or both codes
    const double t_sw = time_ms([&] { swiglu_forward_gpu(sw, fc, N, F, s); });
    row("swiglu fwd bf16", t_sw, 6.0 * NF, 0);
    row("swiglu fwd fused fp8", time_ms([&] { swiglu_forward_fp8_gpu(NULL, fc, N, F, &qf, &qft, s); }), 6.0 * NF, t_sw);
    row("swiglu fwd unfused fp8", time_ms([&] {
            swiglu_forward_gpu(sw, fc, N, F, s);
            fp8_quantize_gpu(&qf, &qft, sw, N, F, NULL, s);
        }),
        6.0 * NF, t_sw);
    // SwiGLU backward: reads fc (N, 2F), dout (N, F); writes dfc (N, 2F) BF16 or both codes
    const double t_swb = time_ms([&] { swiglu_backward_gpu(dfc, dout, fc, N, F, s); });
    row("swiglu bwd bf16", t_swb, 10.0 * NF, 0);
    row("swiglu bwd fused fp8",
        time_ms([&] { swiglu_backward_fp8_gpu(NULL, dout, fc, N, F, &q[2], &qt[2], s); }), 10.0 * NF, t_swb);
    row("swiglu bwd unfused fp8", time_ms([&] {
            swiglu_backward_gpu(dfc, dout, fc, N, F, s);
            fp8_quantize_gpu(&q[2], &qt[2], dfc, N, 2 * F, NULL, s);
        }),
        10.0 * NF, t_swb);
    CU(cudaDeviceSynchronize());
    printf("# GB/s: the bytes of each kernel's contract (BF16 in, BF16 or both FP8 codes out) over its time;\n"
           "# vs BF16 layer: time / the BF16 layer's time (what the FP8 codes add)\n");
    return 0;
}
