// test_attention_fp8_gpu.cu: the FP8 quantize kernels of the attention operands
// (attention_quant.h) against the CPU emulation's attn_quantize_operand (attention_cpu.h), which
// the FP8 attention kernels must reproduce code for code (docs/fp8-attention.md §4.3), and the
// FP8 forward (attention_fwd_fp8.cu) against attn_cpu_forward in the same mode, and fp8_hybrid's
// BF16 backward on the quantize kernel's BF16 copies of Q̂, K̂, V̂ (see run_fwd_case).
// Fresh seeded random BF16 inputs (Q, K scaled by 1..3; some 128-token blocks scaled up or down
// by large powers so scales below and far above 1 occur), several shapes (T not a multiple of
// 128, d 64 and 128, q/k/v as views of a packed QKV buffer or separate), both gradient formats.
// Checked, per case: every code of the (B, H, Tp, d) layout identical to the CPU's, padding rows
// zero, the (B, H, d, Tp) copy equal to the transpose, every scale and block amax identical,
// saturation counts equal; delayed scaling on the first step (per-head scale from the head's
// own amax) and on a later step with a stale history (values saturate; counts compared).
// Without a GPU: prints one "skipped" line, returns 0.
#include <cuda_bf16.h>     // __float2bfloat16 (host side)
#include <cuda_runtime.h>  // device memory, events
#include <math.h>          // fabsf, ldexpf
#include <stdint.h>        // uint8_t, uint16_t
#include <stdio.h>         // printf, snprintf
#include <stdlib.h>        // getenv, atoi, exit
#include <string.h>        // memcpy, memset
#include <vector>          // host buffers

#include "attention_cpu.h"    // attn_quantize_operand, AttnOptions, AttnDelayedState (the oracle)
#include "attention_gpu.h"    // attn_gpu_backward (BF16; fp8_hybrid's backward)
#include "attention_quant.h"  // the kernels under test
#include "fp8.h"              // fp8_from_f32, bf16_to_f32
#include "gpu_test.h"         // CU, rng_*, gpu_test_have_gpu
#include "test.h"             // CHECK, test_summary

static uint16_t f2bf(float x) {
    __nv_bfloat16 b = __float2bfloat16(x);
    uint16_t u;
    memcpy(&u, &b, 2);
    return u;
}

struct Case {
    int B, H, T, d;
    bool packed;      // q/k/v views of one (B, T, 3, H, d) buffer
    double qk_scale;  // sharpness
};

// Device outputs of one quantized tensor.
struct DevOut {
    uint8_t *codes, *codes_t;
    float *scales, *bamax;
    unsigned long long *sat;
    uint16_t *deq;  // (B, T, H, d) BF16 dequantized values, row stride H*d
};
static DevOut dev_out_alloc(int B, int H, int Tp, int d, int nblk) {
    DevOut o;
    CU(cudaMalloc(&o.codes, (size_t)B * H * Tp * d));
    CU(cudaMalloc(&o.codes_t, (size_t)B * H * Tp * d));
    CU(cudaMalloc(&o.scales, (size_t)B * H * nblk * 4));
    CU(cudaMalloc(&o.bamax, (size_t)B * H * nblk * 4));
    CU(cudaMalloc(&o.sat, 8));
    CU(cudaMalloc(&o.deq, (size_t)B * H * Tp * d * 2));  // >= B*T*H*d elements
    CU(cudaMemset(o.deq, 0xFF, (size_t)B * H * Tp * d * 2));
    // poison: codes 0xAB (not 0, so unwritten padding shows), scales NaN
    CU(cudaMemset(o.codes, 0xAB, (size_t)B * H * Tp * d));
    CU(cudaMemset(o.codes_t, 0xAB, (size_t)B * H * Tp * d));
    CU(cudaMemset(o.scales, 0xFF, (size_t)B * H * nblk * 4));
    CU(cudaMemset(o.bamax, 0xFF, (size_t)B * H * nblk * 4));
    CU(cudaMemset(o.sat, 0, 8));
    return o;
}
static void dev_out_free(DevOut &o) {
    cudaFree(o.codes); cudaFree(o.codes_t); cudaFree(o.scales); cudaFree(o.bamax); cudaFree(o.sat);
    cudaFree(o.deq);
}
// Every output of o requested; the dequantized copy as a plain (B, T, H, d) tensor (row stride C).
static AttnQuantTensor qt(const uint16_t *x, int stride, Fp8Format fmt, const DevOut &o, int C) {
    AttnQuantTensor t;
    memset(&t, 0, sizeof t);
    t.x = x; t.stride = stride; t.fmt = fmt;
    t.codes = o.codes; t.codes_t = o.codes_t; t.scales = o.scales; t.block_amax = o.bamax;
    t.saturated = o.sat;
    t.dequant = o.deq;
    t.dequant_stride = C;
    return t;
}

// One tensor's GPU result (o) against the CPU: hx is the host BF16 tensor (B, T, H, d) with row
// stride `stride` at offset `off`; opt/ds say the scaling (ds: the delayed state, whose cur_amax
// collects this call's amax over all heads, as a step's forward would). Returns the mismatch
// counts of codes, padding, transposed copy, scales and block amaxes, and both saturation counts.
struct Mismatch {
    long codes = 0, pad = 0, trans = 0, scales = 0, bamax = 0, deq = 0;
    long long cpu_sat = 0, gpu_sat = 0;
    long first_code = -1;
    int first_gpu = 0, first_cpu = 0;
};
static Mismatch compare_tensor(const Case &cs, const std::vector<uint16_t> &hx, size_t off, int stride,
                               AttnCast which, Fp8Format fmt, const AttnOptions *opt, AttnDelayedState *ds,
                               const DevOut &o) {
    const int B = cs.B, H = cs.H, T = cs.T, d = cs.d, Tp = attn_quant_padded_len(T), nblk = attn_quant_n_blocks(T);
    Mismatch m;
    std::vector<uint8_t> codes((size_t)B * H * Tp * d), codes_t(codes.size());
    std::vector<float> scales((size_t)B * H * nblk), bamax(scales.size());
    unsigned long long gsat = 0;
    CU(cudaMemcpy(codes.data(), o.codes, codes.size(), cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(codes_t.data(), o.codes_t, codes_t.size(), cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(scales.data(), o.scales, scales.size() * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(bamax.data(), o.bamax, bamax.size() * 4, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(&gsat, o.sat, 8, cudaMemcpyDeviceToHost));
    m.gpu_sat = (long long)gsat;
    const int C = H * d;
    std::vector<uint16_t> deq((size_t)B * T * C);
    CU(cudaMemcpy(deq.data(), o.deq, deq.size() * 2, cudaMemcpyDeviceToHost));

    std::vector<float> x((size_t)T * d), xhat((size_t)T * d), s_cpu(nblk);
    for (int b = 0; b < B; b++)
        for (int h = 0; h < H; h++) {
            const size_t bh = (size_t)b * H + h;
            for (int t = 0; t < T; t++)
                for (int c = 0; c < d; c++)
                    x[(size_t)t * d + c] = bf16_to_f32(hx[off + ((size_t)b * T + t) * stride + (size_t)h * d + c]);
            AttnStats st;
            memset(&st, 0, sizeof st);
            attn_quantize_operand(opt, ds, which, fmt, T, d, x.data(), xhat.data(), s_cpu.data(), &st, 1);
            m.cpu_sat += st.saturated[which];
            for (int k = 0; k < nblk; k++) {
                if (fp8_f32_bits(scales[bh * nblk + k]) != fp8_f32_bits(s_cpu[k])) m.scales++;
                float am = 0.0f;
                for (int t = k * ATTN_SCALE_BLOCK; t < T && t < (k + 1) * ATTN_SCALE_BLOCK; t++)
                    for (int c = 0; c < d; c++) am = fmaxf(am, fabsf(x[(size_t)t * d + c]));
                if (fp8_f32_bits(bamax[bh * nblk + k]) != fp8_f32_bits(am)) m.bamax++;
            }
            for (int t = 0; t < Tp; t++)
                for (int c = 0; c < d; c++) {
                    const uint8_t g = codes[(bh * Tp + t) * d + c];
                    if (t >= T) {
                        if (g != 0) m.pad++;
                    } else {
                        // the CPU's code: xhat * s is the decoded FP8 value exactly (s is a power
                        // of two), and encoding a representable value returns its code
                        const float s = s_cpu[t / ATTN_SCALE_BLOCK];
                        const uint8_t want = fp8_from_f32(fmt, xhat[(size_t)t * d + c] * s);
                        if (deq[((size_t)b * T + t) * C + (size_t)h * d + c] != bf16_from_f32(xhat[(size_t)t * d + c]))
                            m.deq++;
                        if (g != want) {
                            if (m.codes == 0) {
                                m.first_code = (long)((bh * Tp + t) * d + c);
                                m.first_gpu = g;
                                m.first_cpu = want;
                            }
                            m.codes++;
                        }
                    }
                    if (codes_t[(bh * d + c) * Tp + t] != g) m.trans++;
                }
        }
    return m;
}

static void report(const char *tag, const char *what, const Mismatch &m, bool expect_sat) {
    char name[256];
    snprintf(name, sizeof name, "attn fp8 quant %s codes == CPU: %s", what, tag);
    CHECK(m.codes == 0, name, "%ld codes differ (first at %ld: gpu 0x%02x cpu 0x%02x)", m.codes, m.first_code,
          m.first_gpu, m.first_cpu);
    snprintf(name, sizeof name, "attn fp8 quant %s scales and block amax == CPU: %s", what, tag);
    CHECK(m.scales == 0 && m.bamax == 0, name, "%ld scales, %ld block amaxes differ", m.scales, m.bamax);
    snprintf(name, sizeof name, "attn fp8 quant %s padding zero, transposed copy == transpose: %s", what, tag);
    CHECK(m.pad == 0 && m.trans == 0, name, "%ld padding codes nonzero, %ld transposed codes differ", m.pad, m.trans);
    snprintf(name, sizeof name, "attn fp8 quant %s BF16 dequantized copy == BF16(CPU x_hat): %s", what, tag);
    CHECK(m.deq == 0, name, "%ld values differ", m.deq);
    snprintf(name, sizeof name, "attn fp8 quant %s saturation count == CPU%s: %s", what,
             expect_sat ? " (> 0)" : "", tag);
    CHECK(m.gpu_sat == m.cpu_sat && (!expect_sat || m.cpu_sat > 0), name, "gpu %lld cpu %lld", m.gpu_sat,
          m.cpu_sat);
}

// Random BF16 (B, T, H, d) values with row stride `stride` at `off`: N(0,1) * scale, and in a
// few random (b, h, 128-token block) cells multiplied by 2^±k (with `cells`: scales far from 1,
// down to the clamp 2^126 of blocks of subnormals);
// with `huge`, also single outliers ×2^12 that make a stale delayed scale saturate.
static void fill_tensor(std::vector<uint16_t> &hx, size_t off, int stride, const Case &cs, double scale,
                        bool cells, bool huge) {
    const int B = cs.B, H = cs.H, T = cs.T, d = cs.d, nblk = attn_quant_n_blocks(T);
    std::vector<float> cell((size_t)B * H * nblk, 1.0f);
    for (size_t i = 0; i < cell.size(); i++) {
        double u = cells ? rng_uniform() : 1.0;
        if (u < 0.15) cell[i] = ldexpf(1.0f, 8 + (int)(rng_uniform() * 20));    // up to 2^27
        else if (u < 0.3) cell[i] = ldexpf(1.0f, -8 - (int)(rng_uniform() * 20));  // down to 2^-27
        else if (u < 0.35) cell[i] = ldexpf(1.0f, -128);  // float/BF16 subnormals: no flush to zero
    }
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int h = 0; h < H; h++)
                for (int c = 0; c < d; c++) {
                    float v = (float)(rng_normal() * scale) * cell[((size_t)b * H + h) * nblk + t / ATTN_SCALE_BLOCK];
                    if (huge && rng_uniform() < 0.002) v *= 4096.0f;
                    hx[off + ((size_t)b * T + t) * stride + (size_t)h * d + c] = f2bf(v);
                }
}

static void run_case(const Case &cs, int seed) {
    const int B = cs.B, H = cs.H, T = cs.T, d = cs.d, C = H * d;
    const int Tp = attn_quant_padded_len(T), nblk = attn_quant_n_blocks(T);
    const int qs = cs.packed ? 3 * C : C;  // row stride of q/k/v
    const size_t n_tok = (size_t)B * T;
    rng_state = 0xF8A77000ull + (uint64_t)seed;
    char tag[160];
    snprintf(tag, sizeof tag, "B=%d H=%d T=%d d=%d %s qk*%.0f", B, H, T, d, cs.packed ? "packed" : "separate",
             cs.qk_scale);

    const size_t qkv_elems = cs.packed ? n_tok * qs : 3 * n_tok * C;
    auto offs = [&](int which) -> size_t { return cs.packed ? (size_t)which * C : (size_t)which * n_tok * C; };
    std::vector<uint16_t> hqkv(qkv_elems, 0), hdo(n_tok * C);
    fill_tensor(hqkv, offs(0), qs, cs, cs.qk_scale, true, false);
    fill_tensor(hqkv, offs(1), qs, cs, cs.qk_scale, true, false);
    fill_tensor(hqkv, offs(2), qs, cs, 1.0, true, false);
    fill_tensor(hdo, 0, C, cs, 1e-3, true, false);  // gradients are small: scales > 1

    uint16_t *d_qkv, *d_do;
    CU(cudaMalloc(&d_qkv, qkv_elems * 2));
    CU(cudaMalloc(&d_do, n_tok * C * 2));
    CU(cudaMemcpy(d_qkv, hqkv.data(), qkv_elems * 2, cudaMemcpyHostToDevice));
    CU(cudaMemcpy(d_do, hdo.data(), n_tok * C * 2, cudaMemcpyHostToDevice));

    AttnOptions opt;
    memset(&opt, 0, sizeof opt);
    opt.precision = ATTN_FP8_DM;
    opt.scaling = SCALING_BLOCK;
    opt.p_scale = 256.0f;
    opt.block_q = opt.block_k = 128;

    // --- block scaling: Q, K, V (E4M3) and dO (E4M3) in one launch, then dO in E5M2 ---------
    DevOut o[5];
    for (int i = 0; i < 5; i++) o[i] = dev_out_alloc(B, H, Tp, d, nblk);
    AttnQuantTensor ts[4] = {qt(d_qkv + offs(0), qs, FP8_E4M3, o[0], C), qt(d_qkv + offs(1), qs, FP8_E4M3, o[1], C),
                             qt(d_qkv + offs(2), qs, FP8_E4M3, o[2], C), qt(d_do, C, FP8_E4M3, o[3], C)};
    attn_gpu_quantize(ts, 4, B, H, T, d, 0);
    AttnQuantTensor t5 = qt(d_do, C, FP8_E5M2, o[4], C);
    attn_gpu_quantize(&t5, 1, B, H, T, d, 0);
    cudaError_t err = cudaDeviceSynchronize();
    CHECK(err == cudaSuccess, "attn fp8 quant runs", "%s: %s", tag, cudaGetErrorString(err));
    if (err != cudaSuccess) exit(1);
    const char *names[5] = {"Q e4m3 block", "K e4m3 block", "V e4m3 block", "dO e4m3 block", "dO e5m2 block"};
    const AttnCast casts[5] = {CAST_Q, CAST_K, CAST_V, CAST_DO, CAST_DO};
    for (int i = 0; i < 5; i++) {
        const std::vector<uint16_t> &hx = i < 3 ? hqkv : hdo;
        Mismatch m = compare_tensor(cs, hx, i < 3 ? offs(i) : 0, i < 3 ? qs : C, casts[i],
                                    i == 4 ? FP8_E5M2 : FP8_E4M3, &opt, NULL, o[i]);
        report(tag, names[i], m, false);
    }

    // --- delayed scaling, first step: each head's scale from its own amax -------------------
    // GPU: amax pass (block amaxes only) -> per-head scales -> cast with them; the tensor's
    // amax for the history (one group over all blocks) must equal the CPU state's cur_amax.
    opt.scaling = SCALING_DELAYED;
    const Fp8Format gfmt = seed & 1 ? FP8_E5M2 : FP8_E4M3;
    AttnDelayedState ds;
    attn_delayed_init(&ds, 16);
    float *d_head_scale, *d_amax, *d_hist, *d_scale;
    CU(cudaMalloc(&d_head_scale, (size_t)B * H * 4));
    CU(cudaMalloc(&d_amax, 4));
    CU(cudaMalloc(&d_hist, ATTN_MAX_AMAX_HISTORY * 4));
    CU(cudaMalloc(&d_scale, 4));
    {
        DevOut od = dev_out_alloc(B, H, Tp, d, nblk);
        AttnQuantTensor a = qt(d_do, C, gfmt, od, C);
        a.codes = NULL; a.codes_t = NULL; a.scales = NULL; a.saturated = NULL; a.dequant = NULL;  // amax only
        attn_gpu_quantize(&a, 1, B, H, T, d, 0);
        attn_gpu_amax_reduce(od.bamax, B * H, nblk, gfmt, NULL, d_head_scale, 0);
        attn_gpu_amax_reduce(od.bamax, 1, B * H * nblk, gfmt, d_amax, NULL, 0);
        AttnQuantTensor c = qt(d_do, C, gfmt, od, C);
        c.scale_in = d_head_scale;
        c.scale_in_per_head = 1;
        attn_gpu_quantize(&c, 1, B, H, T, d, 0);
        err = cudaDeviceSynchronize();
        CHECK(err == cudaSuccess, "attn fp8 quant delayed runs", "%s: %s", tag, cudaGetErrorString(err));
        if (err != cudaSuccess) exit(1);
        Mismatch m = compare_tensor(cs, hdo, 0, C, CAST_DO, gfmt, &opt, &ds, od);
        report(tag, gfmt == FP8_E5M2 ? "dO e5m2 delayed step 1" : "dO e4m3 delayed step 1", m, false);
        float g_amax = -1.0f;
        CU(cudaMemcpy(&g_amax, d_amax, 4, cudaMemcpyDeviceToHost));
        CHECK(fp8_f32_bits(g_amax) == fp8_f32_bits(ds.cur_amax[CAST_DO]), "attn fp8 quant delayed tensor amax == CPU",
              "%s: gpu %g cpu %g", tag, g_amax, ds.cur_amax[CAST_DO]);
        dev_out_free(od);
    }
    attn_delayed_commit(&ds);

    // --- delayed scaling, a later step with a stale history: new dO with outliers saturates --
    // Two history entries (amax 0.01 and 0.005 of earlier steps, set by hand); the new values
    // are N(0, 4e-3) with ×4096 outliers, so the stale scale (from 0.01) saturates the outliers
    // and the 3.4-sigma tail (counted on both sides).
    attn_delayed_commit(&ds);
    ds.hist[CAST_DO][0] = 0.01f;
    ds.hist[CAST_DO][1] = 0.005f;
    fill_tensor(hdo, 0, C, cs, 4e-3, false, true);
    CU(cudaMemcpy(d_do, hdo.data(), n_tok * C * 2, cudaMemcpyHostToDevice));
    {
        DevOut od = dev_out_alloc(B, H, Tp, d, nblk);
        CU(cudaMemcpy(d_hist, ds.hist[CAST_DO], (size_t)ds.filled * 4, cudaMemcpyHostToDevice));
        attn_gpu_amax_reduce(d_hist, 1, ds.filled, gfmt, NULL, d_scale, 0);
        AttnQuantTensor c = qt(d_do, C, gfmt, od, C);
        c.scale_in = d_scale;
        c.scale_in_per_head = 0;
        attn_gpu_quantize(&c, 1, B, H, T, d, 0);
        err = cudaDeviceSynchronize();
        CHECK(err == cudaSuccess, "attn fp8 quant delayed stale runs", "%s: %s", tag, cudaGetErrorString(err));
        if (err != cudaSuccess) exit(1);
        Mismatch m = compare_tensor(cs, hdo, 0, C, CAST_DO, gfmt, &opt, &ds, od);
        report(tag, gfmt == FP8_E5M2 ? "dO e5m2 delayed stale" : "dO e4m3 delayed stale", m, true);
        printf("#   delayed stale: %lld of %zu dO values saturated\n", m.gpu_sat, n_tok * C);
        dev_out_free(od);
    }
    for (int i = 0; i < 5; i++) dev_out_free(o[i]);
    cudaFree(d_head_scale); cudaFree(d_amax); cudaFree(d_hist); cudaFree(d_scale);
    cudaFree(d_qkv); cudaFree(d_do);
}

// --- FP8 forward (attention_fwd_fp8.cu) against attn_cpu_forward in the same mode -------------
// Q, K, V quantized on the GPU (block scaling; V also transposed), the FP8 forward run on them;
// the CPU emulation (fp8_naive's forward = fp8_hybrid's = fp8_dm's; block_q = block_k = 128, the
// kernel's) on the same BF16 inputs per head. O and LSE agree up to the accumulation order and
// Hopper's reduced-precision FP8 accumulation (spec §3: ~2^-12 relative to the partial sums,
// i.e. up to ~1e-2 absolute in S for sharp attention, which also flips some P̂ codes): the
// tolerances (O rel L2 1e-2, LSE 2e-2) are set from that estimate, far below what a wrong scale,
// mask or layout gives (O errors of order 1). The error of both against exact FP64 attention is
// printed, and the GPU's must not exceed the emulation's by more than 10%.
static void run_fwd_case(const Case &cs, int seed) {
    const int B = cs.B, H = cs.H, T = cs.T, d = cs.d, C = H * d;
    const int Tp = attn_quant_padded_len(T), nblk = attn_quant_n_blocks(T);
    const int qs = cs.packed ? 3 * C : C;
    const size_t n_tok = (size_t)B * T;
    rng_state = 0xF8F0D000ull + (uint64_t)seed;
    char tag[160];
    snprintf(tag, sizeof tag, "B=%d H=%d T=%d d=%d %s qk*%.0f", B, H, T, d, cs.packed ? "packed" : "separate",
             cs.qk_scale);
    const size_t qkv_elems = cs.packed ? n_tok * qs : 3 * n_tok * C;
    auto offs = [&](int which) -> size_t { return cs.packed ? (size_t)which * C : (size_t)which * n_tok * C; };
    std::vector<uint16_t> hqkv(qkv_elems, 0);
    fill_tensor(hqkv, offs(0), qs, cs, cs.qk_scale, false, false);
    fill_tensor(hqkv, offs(1), qs, cs, cs.qk_scale, false, false);
    fill_tensor(hqkv, offs(2), qs, cs, 1.0, false, false);

    uint16_t *d_qkv, *d_o;
    float *d_lse;
    CU(cudaMalloc(&d_qkv, qkv_elems * 2));
    CU(cudaMalloc(&d_o, n_tok * C * 2));
    CU(cudaMalloc(&d_lse, (size_t)B * H * T * 4));
    CU(cudaMemcpy(d_qkv, hqkv.data(), qkv_elems * 2, cudaMemcpyHostToDevice));
    CU(cudaMemset(d_o, 0xFF, n_tok * C * 2));  // NaN poison
    CU(cudaMemset(d_lse, 0xFF, (size_t)B * H * T * 4));
    DevOut o[3];
    for (int i = 0; i < 3; i++) o[i] = dev_out_alloc(B, H, Tp, d, nblk);
    AttnQuantTensor ts[3] = {qt(d_qkv + offs(0), qs, FP8_E4M3, o[0], C), qt(d_qkv + offs(1), qs, FP8_E4M3, o[1], C),
                             qt(d_qkv + offs(2), qs, FP8_E4M3, o[2], C)};
    ts[0].codes_t = ts[1].codes_t = NULL;  // the forward needs Q̂, K̂ as they are and V̂^T
    ts[2].codes = NULL;
    attn_gpu_quantize(ts, 3, B, H, T, d, 0);
    attn_gpu_forward_fp8(o[0].codes, o[1].codes, o[2].codes_t, o[0].scales, o[1].scales, o[2].scales, 256.0f,
                         d_o, C, d_lse, B, H, T, d, 0);
    cudaError_t err = cudaDeviceSynchronize();
    CHECK(err == cudaSuccess, "attn fp8 forward runs", "%s: %s", tag, cudaGetErrorString(err));
    if (err != cudaSuccess) exit(1);
    std::vector<uint16_t> g_o(n_tok * C);
    std::vector<float> g_lse((size_t)B * H * T);
    CU(cudaMemcpy(g_o.data(), d_o, g_o.size() * 2, cudaMemcpyDeviceToHost));
    CU(cudaMemcpy(g_lse.data(), d_lse, g_lse.size() * 4, cudaMemcpyDeviceToHost));
    long nonfinite = 0;
    for (uint16_t u : g_o) nonfinite += !isfinite(bf16_to_f32(u));
    for (float x : g_lse) nonfinite += !isfinite(x);
    CHECK(nonfinite == 0, "attn fp8 forward writes every output", "%s: %ld values not finite", tag, nonfinite);

    AttnOptions opt;
    memset(&opt, 0, sizeof opt);
    opt.precision = ATTN_FP8_NAIVE;
    opt.scaling = SCALING_BLOCK;
    opt.grad_format = FP8_E4M3;
    opt.p_scale = 256.0f;
    opt.block_q = ATTN_FP8_FWD_BLOCK_Q;
    opt.block_k = ATTN_FP8_FWD_BLOCK_K;
    std::vector<int> heads;
    if ((double)B * H * T * T <= 4.0e6) for (int i = 0; i < B * H; i++) heads.push_back(i);
    else { heads.push_back(0); if (B * H > 1) heads.push_back(B * H - 1); }
    std::vector<float> x[3], co((size_t)T * d), clse(T);
    std::vector<double> xd[3], ro((size_t)T * d), rlse(T);
    for (int i = 0; i < 3; i++) { x[i].resize((size_t)T * d); xd[i].resize((size_t)T * d); }
    double num = 0, den = 0, maxabs = 0, maxref = 0, lse_err = 0, num64 = 0, den64 = 0, numcpu64 = 0;
    for (int bh : heads) {
        const int b = bh / H, h = bh % H;
        for (int i = 0; i < 3; i++)
            for (int t = 0; t < T; t++)
                for (int c = 0; c < d; c++) {
                    float v = bf16_to_f32(hqkv[offs(i) + ((size_t)b * T + t) * qs + (size_t)h * d + c]);
                    x[i][(size_t)t * d + c] = v;
                    xd[i][(size_t)t * d + c] = v;
                }
        AttnStats st;
        memset(&st, 0, sizeof st);
        attn_cpu_forward(&opt, NULL, T, d, x[0].data(), x[1].data(), x[2].data(), co.data(), clse.data(), &st);
        attn_ref_forward_f64(T, d, xd[0].data(), xd[1].data(), xd[2].data(), ro.data(), rlse.data());
        for (int t = 0; t < T; t++) {
            lse_err = fmax(lse_err, fabs((double)g_lse[(size_t)bh * T + t] - clse[t]));
            for (int c = 0; c < d; c++) {
                const double got = bf16_to_f32(g_o[((size_t)b * T + t) * C + (size_t)h * d + c]);
                const double ref = co[(size_t)t * d + c], exact = ro[(size_t)t * d + c];
                num += (got - ref) * (got - ref);
                den += ref * ref;
                maxabs = fmax(maxabs, fabs(got - ref));
                maxref = fmax(maxref, fabs(ref));
                num64 += (got - exact) * (got - exact);
                numcpu64 += (ref - exact) * (ref - exact);
                den64 += exact * exact;
            }
        }
    }
    const double rel = sqrt(num / (den > 0 ? den : 1)), relmax = maxabs / (maxref > 0 ? maxref : 1);
    const double rel64 = sqrt(num64 / den64), relcpu64 = sqrt(numcpu64 / den64);
    char name[256];
    snprintf(name, sizeof name, "attn fp8 forward O vs CPU emulation (rel L2 < 1e-2, max < 1e-1): %s", tag);
    CHECK(rel < 1e-2 && relmax < 1e-1, name, "rel L2 %.3e, max abs %.3e (max |ref| %.3e)", rel, maxabs, maxref);
    snprintf(name, sizeof name, "attn fp8 forward LSE vs CPU emulation (max abs < 2e-2): %s", tag);
    CHECK(lse_err < 2e-2, name, "max abs %.3e", lse_err);
    snprintf(name, sizeof name, "attn fp8 forward O vs f64 no worse than the emulation's (+10%%): %s", tag);
    CHECK(rel64 < 1.1 * relcpu64 + 1e-3, name, "gpu %.3e, cpu emulation %.3e", rel64, relcpu64);
    printf("#   fwd O vs emul rel L2 %.3e max %.3e | LSE max abs %.3e | O vs f64: gpu %.3e emul %.3e\n", rel, relmax,
           lse_err, rel64, relcpu64);

    // fp8_hybrid's backward: the BF16 kernels (attention_gpu.h) on the dequantized Q̂, K̂, V̂ that
    // the quantize kernel wrote in BF16 (exact), the FP8 forward's O and LSE, BF16 dO; against
    // attn_cpu_backward(fp8_hybrid) fed the same stored O and LSE. Tolerance: BF16 roundings of
    // P, dS and the outputs (the GPU's outputs are BF16, the emulation's FP32).
    std::vector<uint16_t> hdo(n_tok * C);
    for (size_t i = 0; i < hdo.size(); i++) hdo[i] = f2bf((float)rng_normal());
    uint16_t *d_do, *d_dqkv;
    void *d_ws;
    const size_t ws = attn_gpu_backward_workspace_bytes(B, H, T, d);
    CU(cudaMalloc(&d_do, n_tok * C * 2));
    CU(cudaMalloc(&d_dqkv, 3 * n_tok * C * 2));
    CU(cudaMalloc(&d_ws, ws));
    CU(cudaMemcpy(d_do, hdo.data(), n_tok * C * 2, cudaMemcpyHostToDevice));
    CU(cudaMemset(d_dqkv, 0xFF, 3 * n_tok * C * 2));
    attn_gpu_backward(o[0].deq, o[1].deq, o[2].deq, C, d_o, d_do, C, d_lse, d_dqkv, d_dqkv + n_tok * C,
                      d_dqkv + 2 * n_tok * C, C, d_ws, B, H, T, d, 0);
    err = cudaDeviceSynchronize();
    CHECK(err == cudaSuccess, "attn fp8_hybrid backward runs", "%s: %s", tag, cudaGetErrorString(err));
    if (err != cudaSuccess) exit(1);
    std::vector<uint16_t> g_d(3 * n_tok * C);
    CU(cudaMemcpy(g_d.data(), d_dqkv, g_d.size() * 2, cudaMemcpyDeviceToHost));
    opt.precision = ATTN_FP8_HYBRID;
    std::vector<float> fo((size_t)T * d), flse(T), fdo((size_t)T * d), cg[3];
    for (int i = 0; i < 3; i++) cg[i].resize((size_t)T * d);
    double gnum[3] = {0, 0, 0}, gden[3] = {0, 0, 0};
    long gbad = 0;
    for (int bh : heads) {
        const int b = bh / H, h = bh % H;
        for (int i = 0; i < 3; i++)
            for (int t = 0; t < T; t++)
                for (int c = 0; c < d; c++)
                    x[i][(size_t)t * d + c] = bf16_to_f32(hqkv[offs(i) + ((size_t)b * T + t) * qs + (size_t)h * d + c]);
        for (int t = 0; t < T; t++) {
            flse[t] = g_lse[(size_t)bh * T + t];
            for (int c = 0; c < d; c++) {
                const size_t gi = ((size_t)b * T + t) * C + (size_t)h * d + c;
                fo[(size_t)t * d + c] = bf16_to_f32(g_o[gi]);
                fdo[(size_t)t * d + c] = bf16_to_f32(hdo[gi]);
            }
        }
        AttnStats st;
        memset(&st, 0, sizeof st);
        attn_cpu_backward(&opt, NULL, T, d, x[0].data(), x[1].data(), x[2].data(), fo.data(), flse.data(), fdo.data(),
                          cg[0].data(), cg[1].data(), cg[2].data(), &st, NULL);
        for (int i = 0; i < 3; i++)
            for (int t = 0; t < T; t++)
                for (int c = 0; c < d; c++) {
                    const double got = bf16_to_f32(g_d[i * n_tok * C + ((size_t)b * T + t) * C + (size_t)h * d + c]);
                    const double ref = cg[i][(size_t)t * d + c];
                    if (!isfinite(got)) gbad++;
                    gnum[i] += (got - ref) * (got - ref);
                    gden[i] += ref * ref;
                }
    }
    const char *gname[3] = {"dQ", "dK", "dV"};
    for (int i = 0; i < 3; i++) {
        const double r = sqrt(gnum[i] / (gden[i] > 0 ? gden[i] : 1));
        snprintf(name, sizeof name, "attn fp8_hybrid backward %s vs CPU emulation (rel L2 < 5e-3): %s", gname[i], tag);
        CHECK(gbad == 0 && r < 5e-3, name, "rel L2 %.3e, %ld not finite", r, gbad);
        printf("#   hybrid %s vs emul rel L2 %.3e\n", gname[i], r);
    }
    cudaFree(d_do); cudaFree(d_dqkv); cudaFree(d_ws);
    for (int i = 0; i < 3; i++) dev_out_free(o[i]);
    cudaFree(d_qkv); cudaFree(d_o); cudaFree(d_lse);
}

// Bandwidth of the Q, K, V quantization at a training shape (information only): bytes read
// (BF16) plus bytes written (two FP8 layouts) over the kernel time.
static void bench_quant(void) {
    const int B = 8, H = 16, T = 2048, d = 128, C = H * d, Tp = attn_quant_padded_len(T), nblk = attn_quant_n_blocks(T);
    uint16_t *x;
    CU(cudaMalloc(&x, (size_t)B * T * 3 * C * 2));
    CU(cudaMemset(x, 0x3C, (size_t)B * T * 3 * C * 2));  // 0x3C3C: BF16 ~0.0115, every value
    DevOut o[3];
    for (int i = 0; i < 3; i++) o[i] = dev_out_alloc(B, H, Tp, d, nblk);
    AttnQuantTensor ts[3];
    for (int i = 0; i < 3; i++) {
        ts[i] = qt(x + (size_t)i * C, 3 * C, FP8_E4M3, o[i], C);
        ts[i].dequant = NULL;
    }
    cudaEvent_t e0, e1;
    CU(cudaEventCreate(&e0));
    CU(cudaEventCreate(&e1));
    attn_gpu_quantize(ts, 3, B, H, T, d, 0);
    CU(cudaEventRecord(e0));
    const int reps = 20;
    for (int r = 0; r < reps; r++) attn_gpu_quantize(ts, 3, B, H, T, d, 0);
    CU(cudaEventRecord(e1));
    CU(cudaEventSynchronize(e1));
    float ms = 0;
    CU(cudaEventElapsedTime(&ms, e0, e1));
    const double bytes = 3.0 * B * T * C * (2 + 1 + 1);
    printf("# quantize Q,K,V (B=%d H=%d T=%d d=%d, both layouts): %.1f us, %.0f GB/s\n", B, H, T, d,
           1e3 * ms / reps, bytes / (1e-3 * ms / reps) / 1e9);
    for (int i = 0; i < 3; i++) dev_out_free(o[i]);
    cudaFree(x);
    cudaEventDestroy(e0);
    cudaEventDestroy(e1);
}

int main(void) {
    if (!gpu_test_have_gpu("test_attention_fp8_gpu")) return 0;
    const Case cases[] = {
        {2, 3, 200, 64, true, 1.0},    // T not a multiple of 128, several heads
        {1, 2, 517, 128, false, 2.0},  // d = 128, separate buffers
        {2, 2, 1024, 64, true, 3.0},   // whole blocks, sharp
        {1, 1, 64, 128, true, 1.0},    // less than one block
        {3, 2, 129, 128, true, 2.0},   // one row into the second block
        {1, 3, 700, 64, false, 3.0},
    };
    // ATTN_FP8_TEST_SMALL=1: the first two cases, no timing (for compute-sanitizer runs)
    const char *small = getenv("ATTN_FP8_TEST_SMALL");
    const bool is_small = small && atoi(small);
    const int n_cases = is_small ? 2 : (int)(sizeof cases / sizeof cases[0]);
    for (int i = 0; i < n_cases; i++) run_case(cases[i], i);
    const Case fwd_cases[] = {
        {2, 3, 200, 64, true, 1.0},    // one and a half query blocks, several heads
        {1, 2, 517, 128, false, 2.0},  // T not a multiple of 128, d = 128
        {2, 2, 1024, 64, true, 3.0},   // sharp attention, whole blocks
        {1, 1, 64, 128, true, 1.0},    // less than one block
        {1, 2, 2048, 128, true, 2.0},  // 16 key blocks: the running max moves many times
        // Q = K = 0: S = 0, P̂ = 256 exactly, O_i = mean of V_0..V_i. Isolates the P̂ V̂ path
        // (layouts of sP and V̂^T) from the Q̂ K̂^T path: if only these pass, look at S; LSE
        // (which depends on S alone) separates the two likewise.
        {1, 2, 300, 128, false, 0.0},
        {2, 1, 256, 64, true, 0.0},
    };
    const int n_fwd = is_small ? 2 : (int)(sizeof fwd_cases / sizeof fwd_cases[0]);
    for (int i = 0; i < n_fwd; i++) run_fwd_case(fwd_cases[i], i);
    if (!is_small) bench_quant();
    return test_summary("test_attention_fp8_gpu");
}
