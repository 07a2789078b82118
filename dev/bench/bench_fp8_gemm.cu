// bench_fp8_gemm.cu: every GEMM of a model's linear layers at its training shape, in BF16
// (matmul.h, cuBLASLt) and in both FP8 modes (linear_fp8_gpu.h: fp8_tensor per-tensor scales,
// with promoted and with fast accumulation (precision.linear_fast_accum), fp8_block 1x128
// activations / gradients with 128x128 weights), TFLOP/s, on random inputs.
//
// Shapes: N tokens per micro-batch (B x T) and, per block, qkv (3C x C), attention projection
// (C x C), MLP in (2F x C), MLP out (C x F), plus the LM head (V_pad x C, on a chunk of the
// model's GPU_HEAD_CHUNK_TOKENS tokens as the model runs it). Each linear has three GEMMs:
//   forward  y (N, M) = x (N, K) . W (M, K)^T
//   dgrad    dx (N, K) = dy (N, M) . W
//   wgrad    dW (M, K) += dy^T . x        (FP32, accumulating)
// Times are medians of timed runs (CUDA events, after warm-up); "ms / step" weights each GEMM by
// its count in one training step of the config (n_layer per block linear, N / chunk for the head),
// so its total is the linears' GEMM time of a step in each mode (quantization not included).
//
//   bench_fp8_gemm NAME N C F n_layer [V_pad=50304]
//   e.g. bench_fp8_gemm paper_569m 16384 1536 3968 15 ; bench_fp8_gemm paper_1p67b 16384 2048 5504 29
#include <stdio.h>   // printf
#include <stdlib.h>  // atoi

#include "bench_gpu.cuh"         // CU, random_bf16, bench_time_ms (this folder)
#include "core/gpu_sizes.h"      // GPU_HEAD_CHUNK_TOKENS: the LM head's chunk in the model
#include "gpu/linear_fp8_gpu.h"  // Fp8Operand, fp8_quantize_gpu, fp8_gemm_gpu
#include "gpu/matmul.h"          // the BF16 GEMMs

// Fewer runs than the default: the largest GEMMs take milliseconds.
static double time_ms(const std::function<void()> &f) { return bench_time_ms(f, 3, 15); }

struct Linear {
    const char *name;
    int M, K;      // W is (M, K)
    double count;  // GEMMs of this shape per training step
};

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: bench_fp8_gemm NAME N C F n_layer [V_pad=50304]\n");
        return 2;
    }
    const char *cfg = argv[1];
    const int N = atoi(argv[2]), C = atoi(argv[3]), F = atoi(argv[4]), L = atoi(argv[5]);
    const int V = argc > 6 ? atoi(argv[6]) : 50304;
    if (N <= 0 || C <= 0 || F <= 0 || L <= 0 || V <= 0 || N % 16 || C % 16 || F % 16 || V % 16) {
        fprintf(stderr, "bench_fp8_gemm: N, C, F, V must be positive multiples of 16 (FP8 GEMMs), n_layer > 0\n");
        return 2;
    }
    const int chunk = (int)gpu_head_chunk((size_t)N);
    const Linear lin[5] = {{"qkv", 3 * C, C, (double)L},
                           {"attn proj", C, C, (double)L},
                           {"mlp in", 2 * F, C, (double)L},
                           {"mlp out", C, F, (double)L},
                           {"lm head", V, C, (double)N / chunk}};
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    matmul_gpu_init();
    linear_fp8_gpu_init();
    printf("# bench_fp8_gemm %s on %s: N %d (head chunk %d), C %d, F %d, %d layers, V %d; TFLOP/s (x: vs bf16)\n", cfg,
           prop.name, N, chunk, C, F, L, V);
    printf("| %s linear | GEMM | rows x cols x k | bf16 | fp8_tensor | x | fp8_tensor fast accum | x | fp8_block | x |\n",
           cfg);
    printf("|---|---|---|---|---|---|---|---|---|---|\n");
    double step_ms[4] = {0, 0, 0, 0};  // bf16, fp8_tensor, fp8_tensor fast, fp8_block
    for (const Linear &l : lin) {
        const int n = l.name[0] == 'l' ? chunk : N, M = l.M, K = l.K;
        uint16_t *x = random_bf16((size_t)n * K, 1), *w = random_bf16((size_t)M * K, 2);
        uint16_t *dy = random_bf16((size_t)n * M, 3), *y, *dx;
        float *dw;
        CU(cudaMalloc(&y, (size_t)n * M * 2));
        CU(cudaMalloc(&dx, (size_t)n * K * 2));
        CU(cudaMalloc(&dw, (size_t)M * K * 4));
        CU(cudaMemset(dw, 0, (size_t)M * K * 4));
        const char *kinds[3] = {"forward", "dgrad", "wgrad"};
        const int shape[3][3] = {{n, M, K}, {n, K, M}, {M, K, n}};  // rows x cols of the output, k
        double ms[3][4];  // [gemm][mode]
        ms[0][0] = time_ms([&] { matmul_forward_gpu(y, x, w, n, M, K, 0, 0); });
        ms[1][0] = time_ms([&] { matmul_dgrad_gpu(dx, dy, w, n, M, K, 0, 0); });
        ms[2][0] = time_ms([&] { matmul_wgrad_gpu(dw, dy, x, n, M, K, 0); });
        for (int mode = 1; mode <= 3; mode++) {  // fp8_tensor, the same with fast accumulation, fp8_block
            const bool tensor = mode <= 2;
            const int fast = mode == 2;
            const Fp8Grouping ag = tensor ? FP8_GROUP_TENSOR : FP8_GROUP_1x128;
            const Fp8Grouping wg = tensor ? FP8_GROUP_TENSOR : FP8_GROUP_128x128;
            Fp8Operand qx, qxt, qw, qwt, qdy, qdyt;
            fp8_operand_alloc(&qx, n, K, ag, FP8_E4M3);
            fp8_operand_alloc(&qxt, K, n, ag, FP8_E4M3);
            fp8_operand_alloc(&qw, M, K, wg, FP8_E4M3);
            fp8_operand_alloc(&qwt, K, M, wg, FP8_E4M3);
            fp8_operand_alloc(&qdy, n, M, ag, FP8_E4M3);
            fp8_operand_alloc(&qdyt, M, n, ag, FP8_E4M3);
            fp8_quantize_gpu(&qx, &qxt, x, n, K, NULL, 0);
            fp8_quantize_gpu(&qw, &qwt, w, M, K, NULL, 0);
            fp8_quantize_gpu(&qdy, &qdyt, dy, n, M, NULL, 0);
            CU(cudaDeviceSynchronize());
            const Fp8Operand *lhs[3] = {&qx, &qdy, &qdyt}, *rhs[3] = {&qw, &qwt, &qxt};
            for (int k = 0; k < 3; k++) {
                void *out = k == 2 ? (void *)dw : (k == 1 ? (void *)dx : (void *)y);
                ms[k][mode] = -1;
                if (!fp8_gemm_gpu_supported(k == 2, fast, lhs[k], rhs[k])) continue;
                int st = 0;
                ms[k][mode] = time_ms([&] { st |= fp8_gemm_gpu(out, k == 2, k == 2, fast, lhs[k], rhs[k], 0); });
                if (st) ms[k][mode] = -1;
            }
            fp8_operand_free(&qx); fp8_operand_free(&qxt); fp8_operand_free(&qw);
            fp8_operand_free(&qwt); fp8_operand_free(&qdy); fp8_operand_free(&qdyt);
        }
        for (int k = 0; k < 3; k++) {
            const double flop = 2.0 * shape[k][0] * (double)shape[k][1] * shape[k][2];
            double tf[4];
            for (int m = 0; m < 4; m++) {
                tf[m] = ms[k][m] > 0 ? flop / (ms[k][m] * 1e-3) / 1e12 : 0;
                step_ms[m] += ms[k][m] > 0 ? ms[k][m] * l.count : 0;
            }
            printf("| %s | %s | %d x %d x %d | %.0f |", l.name, kinds[k], shape[k][0], shape[k][1], shape[k][2], tf[0]);
            for (int m = 1; m < 4; m++) printf(" %.0f | %.2f |", tf[m], tf[0] > 0 ? tf[m] / tf[0] : 0);
            printf("\n");
        }
        CU(cudaFree(x)); CU(cudaFree(w)); CU(cudaFree(dy)); CU(cudaFree(y)); CU(cudaFree(dx)); CU(cudaFree(dw));
    }
    printf("| **all linears, ms / step** | | | %.2f ms |", step_ms[0]);
    for (int m = 1; m < 4; m++) printf(" %.2f ms | %.2f |", step_ms[m], step_ms[0] / step_ms[m]);
    printf("\n");
    printf("# ms / step: each GEMM's time times its count in one step of %d tokens (GEMMs only, no quantization);\n"
           "# the x columns of that row are bf16 time / FP8 time\n", N);

    // fp8_block's wgrad pairs two 1x128 operands (slices along the tokens). cuBLASLt also runs a
    // 1x128 operand against a 128x128 one (not 128x128 against 128x128): the other layouts the
    // wgrad could take, timed on the same shapes (a measurement for a possible contract option).
    printf("\n| %s linear | wgrad dy^T 1x128 . x^T 1x128 | dy^T 1x128 . x^T 128x128 | dy^T 128x128 . x^T 1x128 |\n", cfg);
    printf("|---|---|---|---|\n");
    for (const Linear &l : lin) {
        const int n = l.name[0] == 'l' ? chunk : N, M = l.M, K = l.K;
        float *dw;
        CU(cudaMalloc(&dw, (size_t)M * K * 4));
        CU(cudaMemset(dw, 0, (size_t)M * K * 4));
        const double flop = 2.0 * M * (double)K * n;
        double tf[3];
        for (int v = 0; v < 3; v++) {  // (dy^T, x^T) groupings: (1x128, 1x128), (1x128, 128x128), (128x128, 1x128)
            const Fp8Grouping gd = v == 2 ? FP8_GROUP_128x128 : FP8_GROUP_1x128;
            const Fp8Grouping gx = v == 1 ? FP8_GROUP_128x128 : FP8_GROUP_1x128;
            Fp8Operand qdyt, qxt;
            fp8_operand_alloc(&qdyt, M, n, gd, FP8_E4M3);
            fp8_operand_alloc(&qxt, K, n, gx, FP8_E4M3);
            // random dy^T (M, n) and x^T (K, n), quantized as the GEMM takes them
            uint16_t *dyt = random_bf16((size_t)M * n, 3), *xt = random_bf16((size_t)K * n, 1);
            fp8_quantize_gpu(&qdyt, NULL, dyt, M, n, NULL, 0);
            fp8_quantize_gpu(&qxt, NULL, xt, K, n, NULL, 0);
            CU(cudaDeviceSynchronize());
            tf[v] = 0;
            if (fp8_gemm_gpu_supported(1, 0, &qdyt, &qxt)) {
                int st = 0;
                const double ms = time_ms([&] { st |= fp8_gemm_gpu(dw, 1, 1, 0, &qdyt, &qxt, 0); });
                if (!st) tf[v] = flop / (ms * 1e-3) / 1e12;
            }
            fp8_operand_free(&qdyt); fp8_operand_free(&qxt);
            CU(cudaFree(dyt)); CU(cudaFree(xt));
        }
        printf("| %s | %.0f | %.0f | %.0f |\n", l.name, tf[0], tf[1], tf[2]);
        CU(cudaFree(dw));
    }
    printf("# TFLOP/s; 0: no cuBLASLt algorithm\n");
    linear_fp8_gpu_shutdown();
    matmul_gpu_shutdown();
    return 0;
}
