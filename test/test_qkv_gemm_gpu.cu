// test_qkv_gemm_gpu: the QKV projection GEMM with its quantizing epilogue (gpu/qkv_gemm.h).
//   1. qkv_gemm_bf16 against a CPU reference of x W^T (FP64 sums of the BF16 inputs) and against
//      cuBLASLt (matmul_forward_gpu): within BF16 output rounding and FP32 summation order;
//   2. qkv_gemm_bf16 with RoPE: bit for bit its own unrotated output through rope_forward_gpu;
//   3. qkv_gemm_quant: codes, transposed codes and scales of q, k, v bit for bit what
//      attn_gpu_quantize (RoPE on q, k; V's scale bound) makes of qkv_gemm_bf16's output;
//   4. attn_forward on upstream codes on those codes: O and LSE bit for bit attn_forward with RoPE's on the
//      same BF16 qkv, and the backward on the kept codes identical too;
//   5. what the quantizing form refuses (qkv_gemm_quant_supported, attn_mode_codes_upstream).
// Shapes cover a grid smaller than the SMs (consumers idle), CTAs with many tiles, a cluster's two
// token blocks in different sequences (T / 128 odd), and K blocks fewer and more than the
// epilogue's 23 slices (some slices after the mainloop, or every slice inside the next one); the
// tiles' grouped order (gpu_test_hooks.qkv_gemm_group_rows) with a short last group. Inputs are
// fresh random values with per-token and per-output-row magnitudes spread over 2^-4 .. 2^4, so the
// blocks' scales differ.
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <vector>

#include "attention_fp8.h"
#include "attention/kernels_fp8.h"
#include "gpu_test.h"
#include "gpu/layers.h"
#include "gpu/matmul.h"
#include "gpu/qkv_gemm.h"
#include "gpu/test_hooks.h"
#include "test.h"

typedef std::vector<uint16_t> Bf;

// BF16 values U[-1, 1) times a magnitude 2^(-4..4) drawn per group of `group` rows (x: per
// 128-token block, W: per head's 128 output rows), so that the (block, head) scales differ (up to
// 2^16 apart), times `scale` (W: 1 / sqrt(K), as a model's initialization keeps q, k, v of order
// x's). Wider spreads made the attention logits ~1e9 at K = 768-1280, where the backward's S,
// recomputed in another summation order, lies tens of FP32 ulps above the forward's LSE and its P
// overflows: no model reaches such logits, and that is not what this test is about.
static Bf random_rows(int rows, int cols, int group, float scale, uint64_t seed) {
    rng_state = seed;
    Bf v((size_t)rows * cols);
    float mag = 1.0f;
    for (int r = 0; r < rows; r++) {
        if (r % group == 0) mag = scale * ldexpf(1.0f, (int)(rng_uniform() * 9.0) - 4);
        for (int c = 0; c < cols; c++) v[(size_t)r * cols + c] = bf16_from_f32(mag * (float)(2.0 * rng_uniform() - 1.0));
    }
    return v;
}

static int count_diff(const uint8_t *a, const uint8_t *b, size_t n) {
    int d = 0;
    for (size_t i = 0; i < n; i++) d += a[i] != b[i];
    return d;
}
template <class T> static int count_diff_v(const std::vector<T> &a, const std::vector<T> &b) {
    return count_diff((const uint8_t *)a.data(), (const uint8_t *)b.data(), a.size() * sizeof(T));
}

// 1 + 2: the BF16 form against the CPU and cuBLASLt, and its RoPE against rope_forward_gpu.
static void check_bf16(int M, int C, int T, uint64_t seed) {
    const int N = 3 * C, K = C;
    char name[160];
    const Bf hx = random_rows(M, K, 128, 1.0f, seed), hw = random_rows(N, K, 128, 1.0f / sqrtf((float)K), seed + 1);
    uint16_t *x = dup(hx), *w = dup(hw), *y = dnew<uint16_t>((size_t)M * N), *yr = dnew<uint16_t>((size_t)M * N),
             *yc = dnew<uint16_t>((size_t)M * N);
    float *rope = dnew<float>((size_t)T * 64 * 2);
    rope_table_gpu(rope, T, 128, 10000.0, 0);
    qkv_gemm_bf16(y, x, w, M, N, K, NULL, T, 0);
    matmul_forward_gpu(yc, x, w, M, N, K, 0, 0);
    const Bf gy = back(y, (size_t)M * N), gc = back(yc, (size_t)M * N);
    // CPU reference on a sample of rows (every 7th and the last), all columns
    Err e_cpu, e_cub;
    double worst = 0;  // max |y - ref| / (|ref| 2^-8 + sum |x w| 2^-16): BF16 rounding + the FP32 sums
    std::vector<int> rows;
    for (int r = 0; r < M; r += 7) rows.push_back(r);
    rows.push_back(M - 1);
    for (int r : rows) {
        for (int n = 0; n < N; n++) {
            double s = 0, sa = 0;
            for (int k = 0; k < K; k++) {
                const double p = (double)bf16_to_f32(hx[(size_t)r * K + k]) * bf16_to_f32(hw[(size_t)n * K + k]);
                s += p;
                sa += fabs(p);
            }
            const double got = bf16_to_f32(gy[(size_t)r * N + n]);
            e_cpu.add(got, s);
            worst = nan_max(worst, fabs(got - s) / (fabs(s) * 0x1p-8 + sa * 0x1p-16 + 1e-30));
        }
    }
    long n_same = 0;
    for (size_t i = 0; i < gy.size(); i++) {
        e_cub.add(bf16_to_f32(gy[i]), bf16_to_f32(gc[i]));
        n_same += gy[i] == gc[i];
    }
    printf("# qkv_gemm_bf16 M=%d N=%d K=%d: %ld of %zu values bit-identical to cuBLASLt's\n", M, N, K, n_same, gy.size());
    snprintf(name, sizeof name, "qkv_gemm_bf16 M=%d N=%d K=%d: against FP64 sums within BF16 rounding", M, N, K);
    CHECK(e_cpu.nonfinite == 0 && worst <= 1.0, name, "worst %.3g of the bound, rel L2 %.3g, %ld non-finite", worst,
          e_cpu.rel(), e_cpu.nonfinite);
    snprintf(name, sizeof name, "qkv_gemm_bf16 M=%d N=%d K=%d: against cuBLASLt (rel L2 < 3e-3)", M, N, K);
    CHECK(e_cub.ok(3e-3), name, "rel L2 %.3g, max abs %.3g of max %.3g", e_cub.rel(), e_cub.maxabs, e_cub.maxref);

    // RoPE in the epilogue = rope_forward_gpu on the unrotated output, bit for bit
    qkv_gemm_bf16(yr, x, w, M, N, K, rope, T, 0);
    rope_forward_gpu(y, rope, M / T, T, C / 128, 128, 0);
    const Bf gr = back(yr, (size_t)M * N), gref = back(y, (size_t)M * N);
    snprintf(name, sizeof name, "qkv_gemm_bf16 M=%d C=%d T=%d: RoPE in the epilogue = rope_forward_gpu", M, C, T);
    const int nd = count_diff_v(gr, gref);
    CHECK(nd == 0, name, "%d bytes differ", nd);
    cudaFree(x), cudaFree(w), cudaFree(y), cudaFree(yr), cudaFree(yc), cudaFree(rope);
}

// 3 + 4: the quantizing form against attn_gpu_quantize of the BF16 form's output, and the FP8
// forward / backward on those codes.
static void check_quant(int B, int T, int C, AttnPrecision prec, int use_rope, uint64_t seed) {
    const int M = B * T, N = 3 * C, H = C / 128, d = 128, nblk = T / 128;
    char name[200];
    const char *pn = attn_precision_name(prec);
    const Bf hx = random_rows(M, C, 128, 1.0f, seed), hw = random_rows(N, C, 128, 1.0f / sqrtf((float)C), seed + 1);
    uint16_t *x = dup(hx), *w = dup(hw), *qkv = dnew<uint16_t>((size_t)M * N);
    float *rope = dnew<float>((size_t)T * 64 * 2);
    rope_table_gpu(rope, T, 128, 10000.0, 0);
    const float *rp = use_rope ? rope : NULL;

    const AttnOptions opt = attn_block_options(prec, FP8_E4M3, 128);
    const size_t cb = attn_saved_codes_bytes(&opt, B, H, T, d);
    AttnSavedCodes up, ref;
    memset(&up, 0, sizeof up);
    memset(&ref, 0, sizeof ref);
    up.buf = dnew<uint8_t>(cb), ref.buf = dnew<uint8_t>(cb);
    up.bytes = ref.bytes = cb;
    QkvQuantOut out;
    attn_saved_codes_parts(&opt, &up, B, H, T, d, out.codes, out.codes_t, out.scales);
    out.rope = rp;
    qkv_gemm_quant(&out, x, w, M, T, C, 0);

    // the reference: BF16 output, then the quantize pass as attn_forward with RoPE runs it
    qkv_gemm_bf16(qkv, x, w, M, N, C, NULL, T, 0);
    void *ws = dnew<uint8_t>(attn_mode_workspace_bytes(&opt, B, H, T, d) + 256);
    uint16_t *o_ref = dnew<uint16_t>((size_t)M * C), *o_up = dnew<uint16_t>((size_t)M * C);
    float *lse_ref = dnew<float>((size_t)B * H * T), *lse_up = dnew<float>((size_t)B * H * T);
    if (use_rope) {
        AttnCall c_ = {};
        c_.opt = &opt, c_.B = B, c_.H = H, c_.T = T, c_.d = d, c_.q = qkv, c_.k = qkv + H * d;
        c_.v = qkv + 2 * H * d, c_.qkv_stride = 3 * H * d, c_.rope = rope, c_.rotate_in_place = 0;
        c_.o = o_ref, c_.o_stride = C, c_.lse = lse_ref, c_.saved = &ref, c_.workspace = ws;
        attn_forward(&c_);
    } else {
        AttnCall c_ = {};
        c_.opt = &opt, c_.B = B, c_.H = H, c_.T = T, c_.d = d, c_.q = qkv, c_.k = qkv + C;
        c_.v = qkv + 2 * C, c_.qkv_stride = N, c_.o = o_ref, c_.o_stride = C, c_.lse = lse_ref;
        c_.saved = &ref, c_.workspace = ws;
        attn_forward(&c_);
    }
    {
        AttnCall c_ = {};
        c_.opt = &opt, c_.B = B, c_.H = H, c_.T = T, c_.d = d, c_.codes_ready = 1, c_.o = o_up;
        c_.o_stride = C, c_.lse = lse_up, c_.saved = &up;
        attn_forward(&c_);
    }
    CU(cudaDeviceSynchronize());

    static const char *opn[3] = {"q", "k", "v"};
    float smin = INFINITY, smax = 0;  // over q, k, v: the scales must differ between blocks, or the
                                      // test would not see a block mixed up
    const size_t ncode = (size_t)B * H * T * d, nsc = (size_t)B * H * nblk;
    for (int i = 0; i < 3; i++) {
        const uint8_t *rc, *rct;
        const float *rs;
        attn_saved_codes_view(&ref, i, &rc, &rct, &rs, NULL);
        const std::vector<uint8_t> a = back(out.codes[i], ncode), b = back(rc, ncode);
        const std::vector<uint8_t> at = back(out.codes_t[i], ncode), bt = back(rct, ncode);
        const std::vector<float> as = back(out.scales[i], nsc), bs = back(rs, nsc);
        for (float s : as) smin = fminf(smin, s), smax = fmaxf(smax, s);
        const int d1 = count_diff_v(a, b), d2 = count_diff_v(at, bt), d3 = count_diff_v(as, bs);
        snprintf(name, sizeof name, "qkv_gemm_quant B=%d T=%d C=%d%s: %s codes, transposed codes, scales = attn_gpu_quantize's",
                 B, T, C, use_rope ? " rope" : "", opn[i]);
        CHECK(d1 == 0 && d2 == 0 && d3 == 0, name, "%d / %d / %d bytes differ", d1, d2, d3);
    }
    snprintf(name, sizeof name, "qkv_gemm_quant B=%d T=%d C=%d: the blocks' scales differ (at least 4x apart)", B, T, C);
    CHECK(smax >= 4 * smin, name, "scales %g .. %g", smin, smax);
    const Bf go = back(o_up, (size_t)M * C), gor = back(o_ref, (size_t)M * C);
    const std::vector<float> gl = back(lse_up, (size_t)B * H * T), glr = back(lse_ref, (size_t)B * H * T);
    snprintf(name, sizeof name, "attn_forward on upstream codes %s B=%d T=%d C=%d%s: O and LSE = attn_forward%s's", pn, B,
             T, C, use_rope ? " rope" : "", use_rope ? "_rope" : "");
    const int od = count_diff_v(go, gor), ld = count_diff_v(gl, glr);
    CHECK(od == 0 && ld == 0 && up.valid, name, "O %d bytes differ, LSE %d, valid %d", od, ld, up.valid);

    // the backward on either kept codes: the same gradients (q, k, v are not read with kept codes)
    uint16_t *dout = dnew<uint16_t>((size_t)M * C), *dq = dnew<uint16_t>((size_t)M * N), *dq2 = dnew<uint16_t>((size_t)M * N);
    gpu_test_fill_bf16(dout, (size_t)M * C, seed + 7, 1.0f);
    {
        AttnCall c_ = {};
        c_.opt = &opt, c_.B = B, c_.H = H, c_.T = T, c_.d = d, c_.q = qkv, c_.k = qkv + C;
        c_.v = qkv + 2 * C, c_.qkv_stride = N, c_.o = o_ref, c_.dout = dout, c_.o_stride = C;
        c_.lse = lse_ref, c_.dq = dq, c_.dk = dq + C, c_.dv = dq + 2 * C, c_.dqkv_stride = N;
        c_.saved = &ref, c_.workspace = ws;
        attn_backward(&c_);
    }
    {
        AttnCall c_ = {};
        c_.opt = &opt, c_.B = B, c_.H = H, c_.T = T, c_.d = d, c_.q = qkv, c_.k = qkv + C;
        c_.v = qkv + 2 * C, c_.qkv_stride = N, c_.o = o_up, c_.dout = dout, c_.o_stride = C;
        c_.lse = lse_up, c_.dq = dq2, c_.dk = dq2 + C, c_.dv = dq2 + 2 * C, c_.dqkv_stride = N;
        c_.saved = &up, c_.workspace = ws;
        attn_backward(&c_);
    }
    const Bf g1 = back(dq, (size_t)M * N), g2 = back(dq2, (size_t)M * N);
    // dQ sums in FP32 atomics (order varies: its BF16 values flip an ulp here and there, rel L2 up
    // to 1.35e-5 seen under compute-sanitizer's scheduling; a code that differed would move
    // it by the FP8 rounding, ~1e-2); dK, dV are deterministic
    Err eq;
    int dkv = 0;
    for (int r = 0; r < M; r++)
        for (int c = 0; c < N; c++) {
            const size_t i = (size_t)r * N + c;
            if (c < C) eq.add(bf16_to_f32(g2[i]), bf16_to_f32(g1[i]));
            else dkv += g1[i] != g2[i];
        }
    snprintf(name, sizeof name, "attn_backward %s on upstream codes B=%d T=%d: dK, dV identical, dQ within FP32 order", pn,
             B, T);
    CHECK(dkv == 0 && eq.ok(1e-4), name, "dK/dV %d values differ, dQ rel %.3g, %ld non-finite", dkv, eq.rel(),
          eq.nonfinite);
    {  // the gradients themselves finite (the reference's)
        long nf[3] = {0, 0, 0};
        float amax[3] = {0, 0, 0};
        const Bf hq = back(qkv, (size_t)M * N);
        for (size_t i = 0; i < (size_t)M * N; i++) {
            nf[(i % N) / C] += !isfinite(bf16_to_f32(g1[i]));
            amax[(i % N) / C] = fmaxf(amax[(i % N) / C], fabsf(bf16_to_f32(hq[i])));
        }
        snprintf(name, sizeof name, "attn_backward %s B=%d T=%d C=%d: dQ, dK, dV finite", pn, B, T, C);
        CHECK(nf[0] + nf[1] + nf[2] == 0, name, "non-finite dQ %ld, dK %ld, dV %ld (max |q| %g, |k| %g, |v| %g)", nf[0],
              nf[1], nf[2], amax[0], amax[1], amax[2]);
    }
    cudaFree(x), cudaFree(w), cudaFree(qkv), cudaFree(rope), cudaFree(up.buf), cudaFree(ref.buf), cudaFree(ws);
    cudaFree(o_ref), cudaFree(o_up), cudaFree(lse_ref), cudaFree(lse_up), cudaFree(dout), cudaFree(dq), cudaFree(dq2);
}

static void check_refusals(void) {
    const char *why = NULL;
    CHECK(qkv_gemm_quant_supported(4096, 1024, 768, 64, &why) != 0 && why, "qkv_gemm_quant refuses head_dim 64", "accepted");
    CHECK(qkv_gemm_quant_supported(4000, 1000, 1024, 128, &why) != 0 && why, "qkv_gemm_quant refuses T % 128 != 0",
          "accepted");
    CHECK(qkv_gemm_quant_supported(3 * 1024 + 128, 1024, 1024, 128, &why) != 0 && why,
          "qkv_gemm_quant refuses a partial sequence", "accepted");
    CHECK(qkv_gemm_quant_supported(3 * 128, 128, 1024, 128, &why) != 0 && why,
          "qkv_gemm_quant refuses an odd number of 128-token blocks", "accepted");
    CHECK(qkv_gemm_quant_supported(2048, 1024, 384, 128, &why) != 0 && why, "qkv_gemm_quant refuses an odd number of heads",
          "accepted");
    CHECK(qkv_gemm_quant_supported(8192, 4096, 1536, 128, &why) == 0, "qkv_gemm_quant takes paper_569m's shape",
          "refused: %s", why);
    AttnOptions opt = attn_block_options(ATTN_FP8_DM, FP8_E4M3, 128);
    const AttnPrecision no[] = {ATTN_BF16, ATTN_FP8_HYBRID}, yes[] = {ATTN_FP8_NAIVE, ATTN_FP8_DM, ATTN_FP8_DM_APPROX};
    int bad = 0;
    for (AttnPrecision p : no) opt.precision = p, bad += attn_mode_codes_upstream(&opt, 128, 1024) != 0;
    for (AttnPrecision p : yes) {
        opt.precision = p;
        bad += attn_mode_codes_upstream(&opt, 128, 1024) != 1;
        bad += attn_mode_codes_upstream(&opt, 64, 1024) != 1;  // the attention side takes d 64 codes too
        bad += attn_mode_codes_upstream(&opt, 96, 1024) != 0;
        bad += attn_mode_codes_upstream(&opt, 128, 1000) != 0;
        opt.scaling = SCALING_DELAYED;
        bad += attn_mode_codes_upstream(&opt, 128, 1024) != 0;
        opt.scaling = SCALING_BLOCK;
    }
    CHECK(bad == 0, "attn_mode_codes_upstream: FP8 backward modes with block scaling and whole blocks only",
          "%d wrong answers", bad);
}

int main(void) {
    check_refusals();
    if (!gpu_test_have_gpu("test_qkv_gemm_gpu")) return test_summary("test_qkv_gemm_gpu");
    matmul_gpu_init();  // cuBLASLt, the peer of case 1
    check_bf16(256, 256, 128, 11);    // one unit row of 3 units: a grid of 6 CTAs, most SMs idle
    check_bf16(512, 512, 256, 12);    // T 256 with RoPE: 2 sequences per unit column
    check_bf16(4096, 768, 256, 13);   // more tiles than CTAs: 144 units
    check_bf16(1024, 1536, 512, 14);  // paper_569m's width: 24 K blocks
    check_bf16(2048, 256, 256, 15);   // 48 tiles of 4 K blocks
    check_quant(2, 256, 256, ATTN_FP8_DM, 1, 21);
    check_quant(3, 512, 512, ATTN_FP8_NAIVE, 1, 22);
    check_quant(4, 1024, 768, ATTN_FP8_DM, 1, 23);
    check_quant(2, 384, 256, ATTN_FP8_DM_APPROX, 0, 24);  // T / 128 = 3: a cluster's blocks in two sequences
    check_quant(2, 384, 512, ATTN_FP8_DM, 1, 25);
    check_quant(2, 1024, 1024, ATTN_FP8_DM, 1, 26);       // 16 K blocks: slices 16..22 after the mainloop
    check_quant(2, 1024, 1280, ATTN_FP8_NAIVE, 1, 27);
    // K blocks beyond the epilogue's 23 slices: every slice inside the next mainloop, none after it
    check_quant(2, 1024, 1536, ATTN_FP8_DM, 1, 161);
    check_quant(1, 2048, 2048, ATTN_FP8_NAIVE, 1, 162);
    check_quant(2, 512, 1536, ATTN_FP8_DM, 0, 163);  // no RoPE: v's amax path for q and k too
    gpu_test_hooks.qkv_gemm_group_rows = 3;  // units in groups of 3 unit rows, the last group short
    printf("# units in groups of 3 rows\n");
    check_quant(4, 1024, 768, ATTN_FP8_DM, 1, 91);
    check_quant(2, 1024, 1280, ATTN_FP8_NAIVE, 1, 92);
    gpu_test_hooks.qkv_gemm_group_rows = 0;
    return test_summary("test_qkv_gemm_gpu");
}
