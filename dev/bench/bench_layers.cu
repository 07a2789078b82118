// bench_layers.cu: times the BF16 row kernels that every precision runs, at one model's shapes
// (default paper_569m: N = 16384 tokens, C = 1536, vocabulary 50257 padded to 50304, the LM head's
// 8192-token chunk), on random inputs (not zeros), against the copy of the same bytes.
//
// Rows (median of timed runs, CUDA events, after warm-up):
//   copy (chunk, Vp)            cudaMemcpyAsync of the logits chunk: the bandwidth peer of the
//                               cross-entropy (both read and write each element once)
//   cross-entropy (chunk, Vp)   cross_entropy_gpu: loss and dlogits in place. Its input after the
//                               first call is the previous call's dlogits: finite values, the same
//                               bytes and exponentials, so the time is the same.
//   copy (N, C)                 the bandwidth peer of the RMSNorm backward
//   rmsnorm backward (N, C)     rmsnorm_backward_gpu with accumulate (dx += ..., the gain gradient)
// GB/s counts the bytes each kernel's contract must move: cross-entropy 4 B per logit (read and
// write), RMSNorm backward 8 B per element (dy, x, dx read and dx written).
//
//   bench_layers [N=16384] [C=1536] [V=50257] [chunk=8192]
#include <stdio.h>   // printf
#include <stdlib.h>  // atoi
#include <vector>    // the rstd upload

#include "bench_gpu.cuh"  // CU, random_bf16, bench_time_ms (this folder)
#include "gpu/layers.h"   // cross_entropy_gpu, rmsnorm_backward_gpu

// One table row; returns its GB/s. peer_gbs: the copy's GB/s (the last column is the fraction of it).
static double row(const char *name, double ms, double bytes, double peer_gbs) {
    const double gbs = bytes / (ms * 1e-3) / 1e9;
    printf("| %-36s | %8.4f | %7.0f | %5.2f |\n", name, ms, gbs, peer_gbs > 0 ? gbs / peer_gbs : 1.0);
    return gbs;
}

__global__ void targets_kernel(int32_t *t, int n, int V) {
    const int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) t[i] = (int32_t)(((unsigned)i * 2654435761u) % (unsigned)V);
}

int main(int argc, char **argv) {
    const int N = argc > 1 ? atoi(argv[1]) : 16384, C = argc > 2 ? atoi(argv[2]) : 1536,
              V = argc > 3 ? atoi(argv[3]) : 50257, chunk = argc > 4 ? atoi(argv[4]) : 8192;
    if (N <= 0 || C <= 0 || V <= 0 || chunk <= 0 || C % 8) {
        fprintf(stderr, "bench_layers: N, C, V, chunk must be positive, C a multiple of 8 (got %d %d %d %d)\n", N, C,
                V, chunk);
        return 2;
    }
    const int Vp = (V + 127) / 128 * 128;
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    printf("# bench_layers on %s: N %d, C %d, V %d (Vp %d), chunk %d\n", prop.name, N, C, V, Vp, chunk);
    const size_t nl = (size_t)chunk * Vp, NC = (size_t)N * C;
    uint16_t *logits = random_bf16(nl, 1), *copy_dst;
    CU(cudaMalloc(&copy_dst, nl * 2));
    int32_t *tgt;
    float *loss;
    CU(cudaMalloc(&tgt, sizeof(int32_t) * chunk));
    CU(cudaMalloc(&loss, sizeof(float) * chunk));
    targets_kernel<<<(chunk + 255) / 256, 256>>>(tgt, chunk, V);
    CU(cudaGetLastError());
    uint16_t *dy = random_bf16(NC, 2), *x = random_bf16(NC, 3), *g = random_bf16(C, 4), *dx = random_bf16(NC, 5);
    float *rstd, *dg;
    void *scratch;
    CU(cudaMalloc(&rstd, sizeof(float) * N));
    CU(cudaMalloc(&dg, sizeof(float) * C));
    CU(cudaMalloc(&scratch, rmsnorm_backward_scratch_bytes(N, C)));
    CU(cudaMemset(dg, 0, sizeof(float) * C));
    {  // rstd of rows of [-2, 2) values: about 1 / sqrt(4/3)
        std::vector<float> h(N, 0.866f);
        CU(cudaMemcpy(rstd, h.data(), sizeof(float) * N, cudaMemcpyHostToDevice));
    }
    const cudaStream_t s = 0;

    printf("| kernel | ms | GB/s | of the copy's GB/s |\n|---|---|---|---|\n");
    const double copy_l = row("copy (chunk, Vp) BF16", bench_time_ms([&] {
        CU(cudaMemcpyAsync(copy_dst, logits, nl * 2, cudaMemcpyDeviceToDevice, s)); }), 4.0 * nl, 0);
    const float grad_scale = 1.0f / (float)N;
    row("cross-entropy + dlogits (chunk, Vp)",
        bench_time_ms([&] { cross_entropy_gpu(logits, loss, tgt, chunk, V, Vp, grad_scale, s); }), 4.0 * nl, copy_l);
    const double copy_c = row("copy (N, C) BF16", bench_time_ms([&] {
        CU(cudaMemcpyAsync(copy_dst, x, NC * 2, cudaMemcpyDeviceToDevice, s)); }), 4.0 * NC, 0);
    row("rmsnorm backward, accumulate (N, C)",
        bench_time_ms([&] { rmsnorm_backward_gpu(dx, dg, scratch, dy, x, g, rstd, N, C, 1, s); }), 8.0 * NC, copy_c);
    CU(cudaDeviceSynchronize());
    printf("# per step of N tokens the LM head runs the cross-entropy on N / chunk = %.1f chunks; each block "
           "runs the RMSNorm backward twice\n", (double)N / chunk);
    return 0;
}
