// bench_attention.cu: times our fused causal attention (attention/kernels_bf16.h), forward and backward
// separately, at a fixed B*T tokens. Prints one line per T:
//   ours T=<T> B=<B> H=<H> d=<d> fwd_ms=<ms> fwd_tflops=<x> bwd_ms=<ms> bwd_tflops=<x>
// FLOPs (causal): forward 4*B*H*T^2*d/2, backward 2.5x that. Median of timed runs (CUDA events,
// after warm-up), inputs random (not zeros), q/k/v views of a packed (B, T, 3, H, d) buffer as in
// the model. For the comparison with PyTorch SDPA (cuDNN, FA2), timed interleaved in one process,
// see dev/bench/bench_attention.py; for other forms of the kernels (lab versions), dev/cuda/.
//
//   bench_attention [tokens=16384] [H=16] [d=128] [T list, default 1024 2048 4096 8192]
#include <cuda_runtime.h>  // events, memory
#include <stdint.h>        // uint16_t
#include <stdio.h>         // printf
#include <stdlib.h>        // atoi, qsort
#include <vector>          // T list, timings
#include <algorithm>       // sort

#include "attention/kernels_bf16.h"  // the kernels
#include "bench_gpu.cuh"             // CU, fill_random_bf16

static double median(std::vector<float> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

int main(int argc, char **argv) {
    int tokens = argc > 1 ? atoi(argv[1]) : 16384;
    int H = argc > 2 ? atoi(argv[2]) : 16;
    int d = argc > 3 ? atoi(argv[3]) : 128;
    std::vector<int> Ts;
    for (int i = 4; i < argc; i++) Ts.push_back(atoi(argv[i]));
    if (Ts.empty()) Ts = {1024, 2048, 4096, 8192};
    const int C = H * d, warmup = 5, iters = 30;

    for (int T : Ts) {
        int B = tokens / T > 0 ? tokens / T : 1;
        size_t n_tok = (size_t)B * T;
        uint16_t *qkv, *dqkv, *o, *dout;
        float *lse;
        void *ws;
        CU(cudaMalloc(&qkv, n_tok * 3 * C * 2));
        CU(cudaMalloc(&dqkv, n_tok * 3 * C * 2));
        CU(cudaMalloc(&o, n_tok * C * 2));
        CU(cudaMalloc(&dout, n_tok * C * 2));
        CU(cudaMalloc(&lse, (size_t)B * H * T * 4));
        CU(cudaMalloc(&ws, attn_gpu_backward_workspace_bytes(B, H, T, d)));
        fill_random_bf16<<<(unsigned)((n_tok * 3 * C + 255) / 256), 256>>>(qkv, n_tok * 3 * C, 1234u + T);
        fill_random_bf16<<<(unsigned)((n_tok * C + 255) / 256), 256>>>(dout, n_tok * C, 99u + T);
        CU(cudaGetLastError());
        const uint16_t *q = qkv, *k = qkv + C, *v = qkv + 2 * C;
        uint16_t *dq = dqkv, *dk = dqkv + C, *dv = dqkv + 2 * C;

        cudaEvent_t e0, e1;
        CU(cudaEventCreate(&e0));
        CU(cudaEventCreate(&e1));
        std::vector<float> tf, tb;
        for (int it = 0; it < warmup + iters; it++) {
            CU(cudaEventRecord(e0));
            attn_gpu_forward(q, k, v, 3 * C, o, C, lse, B, H, T, d, 0);
            CU(cudaEventRecord(e1));
            CU(cudaEventSynchronize(e1));
            float ms;
            CU(cudaEventElapsedTime(&ms, e0, e1));
            if (it >= warmup) tf.push_back(ms);
            CU(cudaEventRecord(e0));
            attn_gpu_backward(q, k, v, 3 * C, o, dout, C, lse, dq, dk, dv, 3 * C, ws, B, H, T, d, 0);
            CU(cudaEventRecord(e1));
            CU(cudaEventSynchronize(e1));
            CU(cudaEventElapsedTime(&ms, e0, e1));
            if (it >= warmup) tb.push_back(ms);
        }
        CU(cudaGetLastError());
        double flops_fwd = 4.0 * B * H * (double)T * T * d / 2.0, flops_bwd = 2.5 * flops_fwd;
        double mf = median(tf), mb = median(tb);
        printf("ours T=%d B=%d H=%d d=%d fwd_ms=%.4f fwd_tflops=%.1f bwd_ms=%.4f bwd_tflops=%.1f\n", T, B, H, d, mf,
               flops_fwd / (mf * 1e-3) / 1e12, mb, flops_bwd / (mb * 1e-3) / 1e12);
        fflush(stdout);
        cudaEventDestroy(e0); cudaEventDestroy(e1);
        cudaFree(qkv); cudaFree(dqkv); cudaFree(o); cudaFree(dout); cudaFree(lse); cudaFree(ws);
    }
    return 0;
}
