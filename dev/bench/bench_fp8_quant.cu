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
//   tensor: ... (fp8_tensor) per-tensor Q(x) and Q(x^T): with the amax pass, with the amax given
//                               (fp8_quantize_gpu_with_amax), and after the layer that took it
//                               (layers.h's *_amax_gpu), against the layer then the full quantize
//   delayed: ... (fp8_tensor, precision.linear_scaling = "delayed") the scale from a given amax:
//                               the quantize pass observing x's amax, and the fused layers
//                               writing per-tensor codes both ways (layers_fp8.h, Fp8TensorScale),
//                               the RoPE backward of dqkv among them
// Each row gives ms, the GB/s of the bytes the kernel must move (reads + writes of its contract)
// and, for fused and unfused, the ratio of its time to the BF16 layer alone (what FP8 adds).
//
//   bench_fp8_quant [N=16384] [C=1536] [F=3968]
#include <stdio.h>   // printf
#include <stdlib.h>  // atoi

#include "bench_gpu.cuh"         // CU, random_bf16, bench_time_ms (this folder)
#include "gpu/layers.h"          // the BF16 kernels
#include "gpu/layers_fp8.h"      // the fused kernels
#include "gpu/linear_fp8_gpu.h"  // fp8_quantize_gpu, Fp8Operand


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
    row("copy (N, C) BF16", bench_time_ms([&] { CU(cudaMemcpyAsync(y, x, NC * 2, cudaMemcpyDeviceToDevice, s)); }), 4.0 * NC, 0);
    const char *qnames[3] = {"quantize both (N, C)", "quantize both (N, 3C)", "quantize both (N, 2F)"};
    const uint16_t *qsrc[3] = {x, x, fc};
    for (int i = 0; i < 3; i++) {
        const double n = (double)N * widths[i];
        row(qnames[i], bench_time_ms([&] { fp8_quantize_gpu(&q[i], &qt[i], qsrc[i], N, widths[i], NULL, s); }), 4.0 * n, 0);
    }
    // RMSNorm with the residual add: reads x, delta; writes res and (BF16) y or (FP8) both codes
    const double t_norm = bench_time_ms([&] { residual_rmsnorm_forward_gpu(res, y, rstd, x, delta, g, N, C, eps, s); });
    row("rmsnorm+res bf16", t_norm, 8.0 * NC, 0);
    row("rmsnorm+res fused fp8",
        bench_time_ms([&] { rmsnorm_forward_fp8_gpu(res, NULL, rstd, x, delta, g, N, C, eps, &q[0], &qt[0], NULL, s); }), 8.0 * NC,
        t_norm);
    row("rmsnorm+res unfused fp8", bench_time_ms([&] {
            residual_rmsnorm_forward_gpu(res, y, rstd, x, delta, g, N, C, eps, s);
            fp8_quantize_gpu(&q[0], &qt[0], y, N, C, NULL, s);
        }),
        8.0 * NC, t_norm);
    // SwiGLU: reads fc (N, 2F); writes out (N, F) BF16 or both codes
    const double t_sw = bench_time_ms([&] { swiglu_forward_gpu(sw, fc, N, F, s); });
    row("swiglu fwd bf16", t_sw, 6.0 * NF, 0);
    row("swiglu fwd fused fp8", bench_time_ms([&] { swiglu_forward_fp8_gpu(NULL, fc, N, F, &qf, &qft, NULL, s); }), 6.0 * NF, t_sw);
    row("swiglu fwd unfused fp8", bench_time_ms([&] {
            swiglu_forward_gpu(sw, fc, N, F, s);
            fp8_quantize_gpu(&qf, &qft, sw, N, F, NULL, s);
        }),
        6.0 * NF, t_sw);
    // SwiGLU backward: reads fc (N, 2F), dout (N, F); writes dfc (N, 2F) BF16 or both codes
    const double t_swb = bench_time_ms([&] { swiglu_backward_gpu(dfc, dout, fc, N, F, s); });
    row("swiglu bwd bf16", t_swb, 10.0 * NF, 0);
    row("swiglu bwd fused fp8",
        bench_time_ms([&] { swiglu_backward_fp8_gpu(NULL, dout, fc, N, F, &q[2], &qt[2], NULL, s); }), 10.0 * NF, t_swb);
    row("swiglu bwd unfused fp8", bench_time_ms([&] {
            swiglu_backward_gpu(dfc, dout, fc, N, F, s);
            fp8_quantize_gpu(&q[2], &qt[2], dfc, N, 2 * F, NULL, s);
        }),
        10.0 * NF, t_swb);
    // fp8_tensor: per-tensor codes both ways, (N, 2F) (MLP-in's dy) and (N, C) (a norm's output)
    Fp8Operand tq[2], tqt[2];
    const int twidth[2] = {2 * F, C};
    for (int i = 0; i < 2; i++) {
        fp8_operand_alloc(&tq[i], N, twidth[i], FP8_GROUP_TENSOR, FP8_E4M3);
        fp8_operand_alloc(&tqt[i], twidth[i], N, FP8_GROUP_TENSOR, FP8_E4M3);
    }
    unsigned *amax;
    CU(cudaMalloc(&amax, sizeof(unsigned)));
    swiglu_backward_amax_gpu(dfc, dout, fc, N, F, NULL, s);
    CU(cudaMemsetAsync(amax, 0, 4, s));
    swiglu_backward_amax_gpu(dfc, dout, fc, N, F, amax, s);  // dfc's amax, for "amax given"
    row("tensor: quantize both (N, 2F)",
        bench_time_ms([&] { fp8_quantize_gpu(&tq[0], &tqt[0], dfc, N, 2 * F, NULL, s); }), 8.0 * NF, 0);
    row("tensor: ... amax given", bench_time_ms([&] {
            fp8_quantize_gpu_with_amax(&tq[0], &tqt[0], dfc, N, 2 * F, (const float *)amax, NULL, NULL, s);
        }), 8.0 * NF, 0);
    row("tensor: swiglu bwd, quantize", bench_time_ms([&] {
            swiglu_backward_gpu(dfc, dout, fc, N, F, s);
            fp8_quantize_gpu(&tq[0], &tqt[0], dfc, N, 2 * F, NULL, s);
        }), 10.0 * NF, t_swb);
    row("tensor: swiglu bwd + amax, quantize", bench_time_ms([&] {
            CU(cudaMemsetAsync(amax, 0, 4, s));
            swiglu_backward_amax_gpu(dfc, dout, fc, N, F, amax, s);
            fp8_quantize_gpu_with_amax(&tq[0], &tqt[0], dfc, N, 2 * F, (const float *)amax, NULL, NULL, s);
        }), 10.0 * NF, t_swb);
    row("tensor: rmsnorm+res, quantize", bench_time_ms([&] {
            residual_rmsnorm_forward_gpu(res, y, rstd, x, delta, g, N, C, eps, s);
            fp8_quantize_gpu(&tq[1], &tqt[1], y, N, C, NULL, s);
        }), 8.0 * NC, t_norm);
    row("tensor: rmsnorm+res + amax, quantize", bench_time_ms([&] {
            CU(cudaMemsetAsync(amax, 0, 4, s));
            residual_rmsnorm_forward_amax_gpu(res, y, rstd, x, delta, g, N, C, eps, amax, s);
            fp8_quantize_gpu_with_amax(&tq[1], &tqt[1], y, N, C, (const float *)amax, NULL, NULL, s);
        }), 8.0 * NC, t_norm);
    // fp8_tensor with delayed scaling: the scale comes from a history amax (here dfc's / y's own,
    // so no code saturates), the producers write the codes and observe their amax
    Fp8Operand tqf, tqft;  // (N, F) per tensor, the SwiGLU output
    fp8_operand_alloc(&tqf, N, F, FP8_GROUP_TENSOR, FP8_E4M3);
    fp8_operand_alloc(&tqft, F, N, FP8_GROUP_TENSOR, FP8_E4M3);
    float *hist;  // [0] dfc's amax, [1] y's, [2] sw's
    unsigned *obs;
    CU(cudaMalloc(&hist, 3 * sizeof(float)));
    CU(cudaMalloc(&obs, sizeof(unsigned)));
    CU(cudaMemcpyAsync(hist, amax, 4, cudaMemcpyDeviceToDevice, s));
    CU(cudaMemsetAsync(amax, 0, 4, s));
    residual_rmsnorm_forward_amax_gpu(res, y, rstd, x, delta, g, N, C, eps, amax, s);
    CU(cudaMemcpyAsync(hist + 1, amax, 4, cudaMemcpyDeviceToDevice, s));
    CU(cudaMemsetAsync(amax, 0, 4, s));
    swiglu_forward_amax_gpu(sw, fc, N, F, amax, s);
    CU(cudaMemcpyAsync(hist + 2, amax, 4, cudaMemcpyDeviceToDevice, s));
    const Fp8TensorScale ts_dfc = {hist, obs}, ts_y = {hist + 1, obs}, ts_sw = {hist + 2, obs};
    row("tensor: swiglu fwd + amax, quantize", bench_time_ms([&] {
            CU(cudaMemsetAsync(amax, 0, 4, s));
            swiglu_forward_amax_gpu(sw, fc, N, F, amax, s);
            fp8_quantize_gpu_with_amax(&tqf, &tqft, sw, N, F, (const float *)amax, NULL, NULL, s);
        }), 6.0 * NF, t_sw);
    row("delayed: quantize both (N, 2F)", bench_time_ms([&] {
            fp8_quantize_gpu_with_amax(&tq[0], &tqt[0], dfc, N, 2 * F, hist, obs, NULL, s);
        }), 8.0 * NF, 0);
    row("delayed: rmsnorm+res fused", bench_time_ms([&] {
            rmsnorm_forward_fp8_gpu(res, NULL, rstd, x, delta, g, N, C, eps, &tq[1], &tqt[1], &ts_y, s);
        }), 8.0 * NC, t_norm);
    row("delayed: swiglu fwd fused", bench_time_ms([&] {
            swiglu_forward_fp8_gpu(NULL, fc, N, F, &tqf, &tqft, &ts_sw, s);
        }), 6.0 * NF, t_sw);
    row("delayed: swiglu bwd fused", bench_time_ms([&] {
            swiglu_backward_fp8_gpu(NULL, dout, fc, N, F, &tq[0], &tqt[0], &ts_dfc, s);
        }), 10.0 * NF, t_swb);
    // dqkv (N, 3C): the RoPE backward in place then the delayed quantization, against the RoPE
    // backward writing the codes (heads of 128, sequences of 4096: paper_569m's)
    const int hd = 128, T = 4096, H = C / hd;
    if (C % hd == 0 && N % T == 0 && rope_backward_fp8_supported(H, hd)) {
        Fp8Operand rq, rqt;
        fp8_operand_alloc(&rq, N, 3 * C, FP8_GROUP_TENSOR, FP8_E4M3);
        fp8_operand_alloc(&rqt, 3 * C, N, FP8_GROUP_TENSOR, FP8_E4M3);
        float *cs;
        CU(cudaMalloc(&cs, sizeof(float) * (size_t)T * hd));
        rope_table_gpu(cs, T, hd, 10000.0, s);
        const Fp8TensorScale ts_qkv = {hist, obs};  // (any amax: the time does not depend on it)
        const double t_rope = bench_time_ms([&] { rope_backward_gpu(x, cs, N / T, T, H, hd, s); });
        row("rope bwd bf16 (in place)", t_rope, 8.0 * NC, 0);
        row("delayed: rope bwd, quantize (N, 3C)", bench_time_ms([&] {
                rope_backward_gpu(x, cs, N / T, T, H, hd, s);
                fp8_quantize_gpu_with_amax(&rq, &rqt, x, N, 3 * C, hist, obs, NULL, s);
            }), 12.0 * NC, t_rope);
        row("delayed: rope bwd fused", bench_time_ms([&] {
                rope_backward_fp8_gpu(x, cs, N / T, T, H, hd, &rq, &rqt, &ts_qkv, s);
            }), 12.0 * NC, t_rope);
    }
    CU(cudaDeviceSynchronize());
    printf("# GB/s: the bytes of each kernel's contract (BF16 in, BF16 or both FP8 codes out) over its time;\n"
           "# vs BF16 layer: time / the BF16 layer's time (what the FP8 codes add)\n");
    return 0;
}
