// bench_qkv_gemm.cu: the attention block's forward up to O, the three ways the trainer can run
// it, against cuBLASLt in the same process on the same GPU (random inputs, never zeros):
//   bf16      cuBLASLt QKV GEMM, rope_forward_gpu, our BF16 flash forward
//   fp8 pass  cuBLASLt QKV GEMM, then fp8_dm's forward with RoPE in its quantize pass
//             (attn_forward with RoPE, kept codes): the trainer's FP8 path where qkv_gemm does not
//             apply (precision.fuse_qkv_epilogue false, or shapes it does not take)
//   fp8 epi   qkv_gemm_quant (our GEMM, quantizing epilogue, RoPE in it), then the FP8 forward on
//             its codes (attn_forward on upstream codes)
// and the parts: the GEMM alone (cuBLASLt BF16 out, ours quantizing), the quantize pass alone, the
// two attention forwards alone. Interleaved rounds (each variant once per round, median of 10 runs
// each), the median over rounds printed. Shapes: B T = 16384 tokens, head dim 128.
// "prep + attn" is each attention's forward with what it needs beyond a plain cuBLASLt projection:
// BF16 rope_forward_gpu, FP8 the time our quantizing GEMM takes over cuBLASLt's; their ratio is the
// FP8 forward's speedup with its operands' preparation paid. The GEMM is the same in every row
// (B T = 16384), so a last table pools the FP8 prep over the rows (the median of the differences):
// one row's difference of two ~0.6 ms GEMMs moves by several % with the GPU's clocks.
// First, the GEMM alone against cuBLASLt: ours with a BF16 output (no RoPE), quantizing without
// RoPE, quantizing with its tiles in groups of 8 unit rows (gpu_test_hooks.qkv_gemm_group_rows),
// and quantizing as the trainer runs it (last).
//
//   bench_qkv_gemm [rounds=5] [C=2048] [T list, default 1024 2048 4096 8192]
//   bench_qkv_gemm profile VARIANT [C=2048]   one GEMM launched twice, nothing else after the inputs'
//     fill, for a profiler: VARIANT cublas, quant (ours, quantizing with RoPE), bf16 (ours, BF16 out
//     without RoPE) or norope (ours, quantizing without RoPE)
#include <stdio.h>   // printf
#include <stdlib.h>  // atoi
#include <string.h>  // memset
#include <algorithm>
#include <string>
#include <vector>

#include "attention_fp8.h"           // attn_forward, kept codes
#include "attention/kernels_bf16.h"  // attn_gpu_forward (BF16)
#include "attention/kernels_fp8.h"   // attn_gpu_quantize
#include "bench_gpu.cuh"             // CU, random_bf16, bench_time_ms
#include "gpu/layers.h"              // rope_table_gpu, rope_forward_gpu
#include "gpu/matmul.h"              // matmul_forward_gpu (cuBLASLt)
#include "gpu/qkv_gemm.h"            // qkv_gemm_quant
#include "gpu/test_hooks.h"          // gpu_test_hooks.qkv_gemm_group_rows

static double median(std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

// Each variant once per round, the median of its 10 timed runs; returns the medians over rounds.
static std::vector<double> time_rounds(const std::vector<std::function<void()>> &fs, int rounds) {
    std::vector<std::vector<double>> t(fs.size());
    for (int r = 0; r < rounds; r++)
        for (size_t i = 0; i < fs.size(); i++) t[i].push_back(bench_time_ms(fs[i], 3, 10));
    std::vector<double> m;
    for (auto &v : t) m.push_back(median(v));
    return m;
}

// fp8_dm's kept codes for B sequences of T tokens (kc, a new device buffer) as the quantizing GEMM's
// outputs, with a new RoPE table of T positions (*rope).
static QkvQuantOut quant_outputs(int B, int H, int T, AttnSavedCodes *kc, float **rope) {
    const int d = 128;
    CU(cudaMalloc(rope, (size_t)T * 64 * 2 * 4));
    rope_table_gpu(*rope, T, d, 10000.0, 0);
    const AttnOptions dm = attn_block_options(ATTN_FP8_DM, FP8_E4M3, 128);
    memset(kc, 0, sizeof *kc);
    kc->bytes = attn_saved_codes_bytes(&dm, B, H, T, d);
    CU(cudaMalloc(&kc->buf, kc->bytes));
    QkvQuantOut qo;
    attn_saved_codes_parts(&dm, kc, B, H, T, d, qo.codes, qo.codes_t, qo.scales);
    qo.rope = *rope;
    return qo;
}

// The GEMM alone: cuBLASLt, then ours, BF16 out (no RoPE) and quantizing (without RoPE, in
// groups of 8 unit rows, as the trainer runs it), at T = 4096 (the quantizing epilogue's blocks; the
// GEMM's time does not depend on T). Returns the trainer's GEMM's time over cuBLASLt's, ms (the
// "prep" of FP8).
static double bench_gemm(const uint16_t *x, const uint16_t *w, uint16_t *qkv, int M, int C, int rounds) {
    const int T = 4096, B = M / T, H = C / 128, N = 3 * C;
    float *rope;
    AttnSavedCodes kc;
    const QkvQuantOut qo = quant_outputs(B, H, T, &kc, &rope);
    QkvQuantOut qo_norope = qo;  // an ablation: the quantizing epilogue without RoPE
    qo_norope.rope = NULL;
    std::vector<std::function<void()>> fs = {
        [=] { matmul_forward_gpu(qkv, x, w, M, N, C, 0, 0); },
        [=] { qkv_gemm_bf16(qkv, x, w, M, N, C, NULL, T, 0); },
        [=] { qkv_gemm_quant(&qo_norope, x, w, M, T, C, 0); },
        [=] {
            gpu_test_hooks.qkv_gemm_group_rows = 8;
            qkv_gemm_quant(&qo, x, w, M, T, C, 0);
            gpu_test_hooks.qkv_gemm_group_rows = 0;
        },
        [=] { qkv_gemm_quant(&qo, x, w, M, T, C, 0); },
    };
    const char *const names[] = {"cuBLASLt (BF16 out)", "ours, BF16 out", "ours, quantizing without RoPE",
                                 "ours, quantizing, groups of 8 unit rows", "ours, quantizing (the trainer's)"};
    std::vector<int> grids;  // each variant's CTAs
    for (auto &f : fs) {
        f();
        grids.push_back(qkv_gemm_last_grid());
    }
    const std::vector<double> m = time_rounds(fs, rounds);
    const double gflop = 2.0 * M * N * C * 1e-9;
    printf("| GEMM %d x %d x %d | CTAs | ms | TFLOP/s | / cuBLASLt's time |\n|---|---|---|---|---|\n", M, N, C);
    for (size_t i = 0; i < fs.size(); i++)
        printf("| %s | %s | %.4f | %.0f | %.3f |\n", names[i], i ? std::to_string(grids[i]).c_str() : "-", m[i],
               gflop / m[i], m[i] / m[0]);
    fflush(stdout);
    CU(cudaFree(rope));
    CU(cudaFree(kc.buf));
    return m.back() - m[0];
}

// The profile mode: the named variant twice (a profiler skips the first launch), T = 4096.
static int profile_variant(const char *variant, int C) {
    const int M = 16384, T = 4096, B = M / T, H = C / 128, d = 128, N = 3 * C;
    const bool cublas = !strcmp(variant, "cublas"), quant = !strcmp(variant, "quant"), bf16 = !strcmp(variant, "bf16"),
               norope = !strcmp(variant, "norope");
    const char *why;
    if (!(cublas || quant || bf16 || norope) || qkv_gemm_quant_supported(M, T, C, d, &why)) {
        fprintf(stderr, "bench_qkv_gemm profile: VARIANT cublas, quant, bf16 or norope, C a multiple of 256; got "
                        "'%s', C %d\n", variant, C);
        return 2;
    }
    matmul_gpu_init();
    uint16_t *x = random_bf16((size_t)M * C, 1), *w = random_bf16((size_t)N * C, 2), *qkv;
    CU(cudaMalloc(&qkv, (size_t)M * N * 2));
    float *rope;
    AttnSavedCodes kc;
    QkvQuantOut qo = quant_outputs(B, H, T, &kc, &rope);
    if (norope) qo.rope = NULL;
    for (int i = 0; i < 2; i++) {
        if (cublas) matmul_forward_gpu(qkv, x, w, M, N, C, 0, 0);
        else if (bf16) qkv_gemm_bf16(qkv, x, w, M, N, C, NULL, T, 0);  // as bench_gemm: BF16 out, no RoPE
        else qkv_gemm_quant(&qo, x, w, M, T, C, 0);
    }
    CU(cudaDeviceSynchronize());
    printf("bench_qkv_gemm profile: %s, C %d, launched twice\n", variant, C);
    return 0;
}

int main(int argc, char **argv) {
    if (argc > 2 && !strcmp(argv[1], "profile")) return profile_variant(argv[2], argc > 3 ? atoi(argv[3]) : 2048);
    const int rounds = argc > 1 ? atoi(argv[1]) : 5, C = argc > 2 ? atoi(argv[2]) : 2048;
    std::vector<int> Ts;
    for (int i = 3; i < argc; i++) Ts.push_back(atoi(argv[i]));
    if (Ts.empty()) Ts = {1024, 2048, 4096, 8192};
    const char *why;
    for (int T : Ts)
        if (rounds < 1 || T <= 0 || 16384 % T || qkv_gemm_quant_supported(16384, T, C, 128, &why)) {
            fprintf(stderr, "bench_qkv_gemm: rounds >= 1, T dividing 16384 and the quantizing GEMM's shapes (C %d, T %d)\n", C, T);
            return 2;
        }
    cudaDeviceProp prop;
    CU(cudaGetDeviceProperties(&prop, 0));
    matmul_gpu_init();
    const int M = 16384, H = C / 128, d = 128, N = 3 * C;
    printf("# bench_qkv_gemm on %s: B T = %d, C = %d (H %d, d 128), %d rounds, ms (median)\n", prop.name, M, C, H, rounds);
    uint16_t *x = random_bf16((size_t)M * C, 1), *w = random_bf16((size_t)N * C, 2), *qkv, *o;
    CU(cudaMalloc(&qkv, (size_t)M * N * 2));
    CU(cudaMalloc(&o, (size_t)M * C * 2));
    float *lse, *rope;
    CU(cudaMalloc(&lse, (size_t)M * H * 4));
    const AttnOptions dm = attn_block_options(ATTN_FP8_DM, FP8_E4M3, 128);
    // the FP8 prep (our quantizing GEMM's time over cuBLASLt's): one per timed set, pooled below
    std::vector<double> prep_f8 = {bench_gemm(x, w, qkv, M, C, rounds)};
    std::vector<std::pair<int, double>> bf_side;  // (T, rope + BF16 attention), and FP8 attention:
    std::vector<double> f8_attn;
    printf("\nlayers:\n");
    printf("| T | cuBLASLt GEMM | ours GEMM+quant | TFLOP/s cuBLASLt / ours | quant pass | rope | bf16 attn | fp8 attn "
           "(codes) | bf16 layer | fp8 pass layer | fp8 epi layer | epi / pass | bf16 / epi | prep + attn bf16 / fp8 |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int T : Ts) {
        const int B = M / T;
        AttnSavedCodes kc;
        QkvQuantOut qo = quant_outputs(B, H, T, &kc, &rope);
        void *ws;
        CU(cudaMalloc(&ws, attn_mode_workspace_bytes(&dm, B, H, T, d)));
        AttnQuantTensor ts[3];
        memset(ts, 0, sizeof ts);
        for (int i = 0; i < 3; i++) {
            ts[i].x = qkv + i * C;
            ts[i].stride = N;
            ts[i].fmt = FP8_E4M3;
            ts[i].codes = qo.codes[i];
            ts[i].codes_t = qo.codes_t[i];
            ts[i].scales = qo.scales[i];
            ts[i].max_scale_exp = attn_scale_max_exp(i == 2 ? CAST_V : CAST_Q);
            ts[i].rope = i < 2 ? rope : NULL;
        }
        matmul_forward_gpu(qkv, x, w, M, N, C, 0, 0);  // qkv for the parts that read it
        auto gemm = [&] { matmul_forward_gpu(qkv, x, w, M, N, C, 0, 0); };
        auto ours = [&] { qkv_gemm_quant(&qo, x, w, M, T, C, 0); };
        auto quant = [&] { attn_gpu_quantize(ts, 3, B, H, T, d, 0); };
        auto attn_bf = [&] { attn_gpu_forward(qkv, qkv + C, qkv + 2 * C, N, o, C, lse, B, H, T, d, 0); };
        auto attn_f8 = [&] {
            AttnCall c_ = {};
            c_.opt = &dm, c_.B = B, c_.H = H, c_.T = T, c_.d = d, c_.codes_ready = 1, c_.o = o;
            c_.o_stride = C, c_.lse = lse, c_.saved = &kc;
            attn_forward(&c_);
        };
        auto layer_bf = [&] {
            matmul_forward_gpu(qkv, x, w, M, N, C, 0, 0);
            rope_forward_gpu(qkv, rope, B, T, H, d, 0);
            attn_gpu_forward(qkv, qkv + C, qkv + 2 * C, N, o, C, lse, B, H, T, d, 0);
        };
        auto layer_pass = [&] {
            matmul_forward_gpu(qkv, x, w, M, N, C, 0, 0);
            {
                AttnCall c_ = {};
                c_.opt = &dm, c_.B = B, c_.H = H, c_.T = T, c_.d = d, c_.q = qkv, c_.k = qkv + H * d;
                c_.v = qkv + 2 * H * d, c_.qkv_stride = 3 * H * d, c_.rope = rope, c_.rotate_in_place = 0;
                c_.o = o, c_.o_stride = C, c_.lse = lse, c_.saved = &kc, c_.workspace = ws;
                attn_forward(&c_);
            }
        };
        auto layer_epi = [&] {
            qkv_gemm_quant(&qo, x, w, M, T, C, 0);
            {
                AttnCall c_ = {};
                c_.opt = &dm, c_.B = B, c_.H = H, c_.T = T, c_.d = d, c_.codes_ready = 1, c_.o = o;
                c_.o_stride = C, c_.lse = lse, c_.saved = &kc;
                attn_forward(&c_);
            }
        };
        auto rope_only = [&] { rope_forward_gpu(qkv, rope, B, T, H, d, 0); };
        const std::vector<double> m =
            time_rounds({gemm, ours, quant, rope_only, attn_bf, attn_f8, layer_bf, layer_pass, layer_epi}, rounds);
        const double gflop = 2.0 * M * N * C * 1e-9;
        // prep + attn: BF16 rope + its forward; FP8 (ours - cuBLASLt) + its forward on the codes
        const double bf = m[3] + m[4], f8 = (m[1] - m[0]) + m[5];
        prep_f8.push_back(m[1] - m[0]);
        bf_side.push_back({T, bf});
        f8_attn.push_back(m[5]);
        printf("| %d | %.4f | %.4f | %.0f / %.0f | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f | %.4f | %.3f | %.3f | %.3f |\n",
               T, m[0], m[1], gflop / m[0], gflop / m[1], m[2], m[3], m[4], m[5], m[6], m[7], m[8], m[7] / m[8],
               m[6] / m[8], bf / f8);
        fflush(stdout);
        CU(cudaFree(rope));
        CU(cudaFree(kc.buf));
        CU(cudaFree(ws));
    }
    printf("# epi / pass: the fp8 pass layer's time over the fp8 epi layer's (> 1: the epilogue is faster); "
           "bf16 / epi: our BF16 layer's time over the fp8 epi layer's; prep + attn bf16 / fp8: (rope + bf16 attn) / "
           "(ours GEMM+quant - cuBLASLt GEMM + fp8 attn)\n");
    // The GEMM is the same in every row (M = B T = 16384), so its FP8 prep is one number per width:
    // the median over the GEMM table's default row and the layer rows. A single row's difference of
    // two ~0.6 ms GEMMs moves by several % between rows (the GPU's clocks), which is most of the
    // spread of the per-row ratio above. (With an even count, median takes the upper middle: the
    // larger difference, which counts against FP8.)
    const double prep = median(prep_f8);
    printf("\nprep + attn with the FP8 prep pooled: %.4f ms, the median of %zu (ours - cuBLASLt) differences\n",
           prep, prep_f8.size());
    printf("| T | rope + bf16 attn | prep + fp8 attn | bf16 / fp8 |\n|---|---|---|---|\n");
    for (size_t i = 0; i < bf_side.size(); i++)
        printf("| %d | %.4f | %.4f | %.3f |\n", bf_side[i].first, bf_side[i].second, prep + f8_attn[i],
               bf_side[i].second / (prep + f8_attn[i]));
    return 0;
}
