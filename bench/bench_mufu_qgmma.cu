// bench_mufu_qgmma.cu: do the special-function unit's exponentials (MUFU.EX2) and the FP8 tensor
// cores (QGMMA) run at the same time on one SM? The FP8 forward's loop measures as if they did not
// (docs/fp8-attention-kernels.md §8.17: its clocks per key block are the tensor time plus the
// exponentials' time), and every loop built to overlap them was slower. This isolates the
// question from the attention kernel: one CTA per SM, two warpgroups, each iteration one forward
// key block's worth of work per warpgroup (8 m64n128k32 e4m3 wgmmas: 4.2 MFLOP; 64 exponentials
// per thread: 8192), in these forms:
//   tensor      the wgmmas alone (4 SS + 4 RS, A from registers, as the forward's S and PV)
//   mufu        the exponentials alone (FFMA + ex2.approx, 64 independent chains per thread)
//   both_wg     each warpgroup issues its wgmmas, computes its exponentials (independent of the
//               accumulators) while they run, then waits: the best case of the forward's loop
//   split_wg    warpgroup 0 only wgmmas, warpgroup 1 only exponentials (twice as many iterations
//               each: the same totals per SM)
//   both_poly   as both_wg with the exponentials on the FMA pipe (a degree-5 polynomial)
//   poly        those polynomial exponentials alone
//   plain_dep   the FP8 forward's plain loop's dependences: S (4 SS) and PV (4 RS) issued as two
//               groups, the exponentials of S once S is done (while PV runs), then PV waited for
//   pingpong_dep  the same with FA3's ping-pong: each warpgroup issues its two groups on its turn
//               (named barriers), so one's exponentials can run under the other's matmuls
// and, growing the skeleton into the kernel's real step (attention_fwd_fp8_step.cuh: the same
// functions the FP8 forward runs, so the same instructions):
//   mufu_pack   the exponentials and their conversion to E4M3 (pack_p: 32 F2FP per thread) alone:
//               whether the conversions share the exponentials' unit
//   softmax     the kernel's whole softmax step alone: softmax_block (row max, exponentials, row
//               sums, alpha), the O update (64 FMUL + 64 FFMA) and pack_p, on fixed S values
//   softmax_norescale  the same with the O update of a block whose row maxima did not move
//               (alpha = 1: 64 FFMA, O = O + PV * fac)
//   split_real  warpgroup 0 only the wgmmas, warpgroup 1 only the real softmax step (twice as
//               many iterations each): one warp's softmax per scheduler under the other's matmuls
//   plain_real  the plain loop with the real step: S_j and PV_{j-1} issued as two groups, the
//               softmax of S_j while PV_{j-1} runs, then O += PV_{j-1}, P̂_j packed (the kernel's
//               loop without its ring: no mbarriers, no producer)
//   plain_real_norescale  the same with the alpha = 1 O update
//   pingpong_real the plain_real loop with ping-pong's named barriers
// Prints clocks per iteration and SM (clock64, the SM's own clock) and what "overlap" would give:
// max(tensor, mufu) if the two run at once, tensor + mufu if they do not. The accumulators and
// exponentials feed a checksum, so nothing is optimized away; the data are fixed small E4M3 codes.
//   build (GPU machine): nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -Isrc
//                        bench/bench_mufu_qgmma.cu src/common.c -o /tmp/bench_mufu_qgmma
//   run: /tmp/bench_mufu_qgmma [iterations]        (scripts/gpu_mufu_qgmma.sh does both)
#include <cuda_runtime.h>  // launches, events
#include <stdint.h>        // uint8_t, uint32_t, uint64_t
#include <stdio.h>         // printf
#include <stdlib.h>        // atoi

#include "attention_fwd_fp8_step.cuh"  // the FP8 forward's issue_s, issue_pv, softmax_block, pack_p
#include "attention_gpu_common.cuh"    // wg_fp8, wg_fp8_rs, kmajor_desc(_lo), wgmma fences, CUDA_OK
#include "fast_exp2.cuh"               // fast_exp2 (ex2.approx.ftz)

enum {
    M_TENSOR, M_MUFU, M_BOTH, M_SPLIT, M_POLY, M_POLY_ALONE, M_PLAIN, M_PINGPONG,  // the skeleton
    M_MUFU_PACK, M_SOFTMAX, M_SOFTMAX_NORESCALE, M_SPLIT_REAL, M_PLAIN_REAL, M_PLAIN_REAL_NORESCALE,
    M_PINGPONG_REAL, N_MODES
};
static const char *const mode_names[N_MODES] = {
    "tensor",   "mufu",       "both_wg",           "split_wg",   "both_poly",  "poly",
    "plain_dep", "pingpong_dep", "mufu_pack",      "softmax",    "softmax_norescale",
    "split_real", "plain_real", "plain_real_norescale", "pingpong_real"};

// The kernel's numbers for the real step: tau_qk (tau / (s_q s_k)), log2(p_scale), fac (1 / (p_scale s_v))
struct StepArgs {
    float tau_qk, log2_ps, fac;
};

// 2^x on the FMA pipe (x <= 0, |x| < 126): 2^floor(x) from the exponent bits, 2^frac by a
// degree-5 polynomial (~2e-7 relative); about as many FMA-pipe instructions as FA4's emulation.
__device__ __forceinline__ float poly_exp2(float x) {
    const float fl = floorf(x), f = x - fl;
    float p = fmaf(1.8775767e-3f, f, 8.9893397e-3f);
    p = fmaf(p, f, 5.5826318e-2f);
    p = fmaf(p, f, 2.4015361e-1f);
    p = fmaf(p, f, 6.9315308e-1f);
    p = fmaf(p, f, 1.0f);
    return __int_as_float(__float_as_int(p) + ((int)fl << 23));
}

// 64 exponentials per thread, 64 independent chains (the softmax's FFMA then ex2 per element)
template <bool POLY>
__device__ __forceinline__ void exps(float (&x)[64]) {
#pragma unroll
    for (int i = 0; i < 64; i++) {
        const float a = fmaf(x[i], -0.75f, -0.125f);
        x[i] = POLY ? poly_exp2(a) : fast_exp2(a);
    }
}

// The forward's tensor work of one key block for one warpgroup: S = 4 k32 steps SS (m64n128),
// PV = 4 k32 steps with A from registers.
__device__ __forceinline__ void issue_block(float (&s)[64], float (&pv)[64], uint32_t da, uint32_t db,
                                            uint32_t (&pa)[4][4]) {
    reg_fence(s);
    reg_fence(pv);
    reg_fence(pa);  // (as the forward does for P̂: else ptxas injects warpgroup.arrive and may serialize)
    wgmma_fence();
    // always accumulating: with a fresh accumulator every block, ptxas drops the wgmmas whose
    // results the next block overwrites unread (seen in the SASS: 3 of 4 unrolled blocks had none)
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wg_fp8<128, 0, 0>(s, kmajor_desc(da + 2 * kk), kmajor_desc(db + 2 * kk), 1);
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wg_fp8_rs<128, 0>(pv, pa[kk], kmajor_desc(db + 2 * kk), 1);
    wgmma_commit();
}

// The O update of one key block: the kernel's O = O * alpha + PV * fac, or, where no row's
// maximum moved (alpha = 1 for all), O = O + PV * fac (the same bits, half the instructions).
template <bool RESCALE>
__device__ __forceinline__ void o_update(float (&o)[64], const float (&pv)[64], const float (&alpha)[2], float fac) {
#pragma unroll
    for (int i = 0; i < 64; i++) o[i] = RESCALE ? fmaf(pv[i], fac, o[i] * alpha[(i >> 1) & 1]) : fmaf(pv[i], fac, o[i]);
}

// The real step without the matmuls (softmax, softmax_norescale, split_real's warpgroup 1): the
// kernel's softmax_block on fixed S values s0, the O update with fixed PV values, pack_p. The
// fences make s0 and P̂ opaque to the compiler every iteration, so nothing leaves the loop.
template <bool RESCALE>
__device__ __forceinline__ void softmax_alone(int iters, const StepArgs &a, float (&s0)[64], float (&o)[64],
                                              float (&pv)[64], uint32_t (&pa)[4][4], float (&m)[2], float (&l)[2]) {
    const int lane = threadIdx.x & 31;
    for (int it = 0; it < iters; it++) {
        reg_fence(s0);
        reg_fence(pv);
        float s[64], alpha[2];
#pragma unroll
        for (int i = 0; i < 64; i++) s[i] = s0[i];
        softmax_block<false, true>(s, m, l, alpha, a.tau_qk, a.log2_ps, 0, 0, 1 << 30, lane >> 2, lane & 3);
        o_update<RESCALE>(o, pv, alpha, a.fac);
        pack_p(pa, s);
        reg_fence(pa);
    }
}

// The kernel's plain loop (PP: with ping-pong) around the real step, without its ring: S_j and
// PV_{j-1} as two wgmma groups, the softmax of S_j once S_j is done, PV_{j-1} waited for, O
// updated, P̂_j packed for the next block's PV. A and V are the same fixed tiles every block.
template <bool RESCALE, bool PP>
__device__ __forceinline__ void plain_real(int iters, const StepArgs &a, uint32_t da, uint32_t db, int wg,
                                           float (&s)[64], float (&o)[64], float (&pv)[64], uint32_t (&pa)[4][4],
                                           float (&m)[2], float (&l)[2]) {
    const int lane = threadIdx.x & 31;
    float alpha[2], alpha_prev[2] = {1.f, 1.f};
    if (PP && wg == 1) named_bar_arrive<1, 256>();  // warpgroup 0 goes first
    for (int it = 0; it < iters; it++) {
        if (PP) {
            if (wg == 0) named_bar_sync<1, 256>();
            else named_bar_sync<2, 256>();
        }
        reg_fence(s);
        reg_fence(pv);
        reg_fence(pa);
        wgmma_fence();
        issue_s<128>(s, da, db);
        wgmma_commit();
        issue_pv<128>(pv, pa, db);
        wgmma_commit();
        if (PP && !(wg == 1 && it == iters - 1)) {  // hand the turn over (1 arrived up front)
            if (wg == 0) named_bar_arrive<2, 256>();
            else named_bar_arrive<1, 256>();
        }
        wgmma_wait<1>();
        reg_fence(s);
        softmax_block<false, true>(s, m, l, alpha, a.tau_qk, a.log2_ps, 0, 0, 1 << 30, lane >> 2, lane & 3);
        wgmma_wait<0>();
        reg_fence(pv);
        reg_fence(pa);
        o_update<RESCALE>(o, pv, alpha_prev, a.fac);
        pack_p(pa, s);
        alpha_prev[0] = alpha[0];
        alpha_prev[1] = alpha[1];
    }
}

template <int MODE>
__global__ void __launch_bounds__(256, 1) mufu_qgmma_kernel(int iters, StepArgs a, float *sink, long long *clocks) {
    __shared__ __align__(1024) uint8_t tiles[2 * 64 * 128 + 128 * 128];  // A (2 warpgroups x 64 rows), B (128 rows)
    for (int i = threadIdx.x; i < (int)sizeof tiles; i += blockDim.x) tiles[i] = (uint8_t)(0x20 + (i * 37) % 0x18);
    fence_proxy_async();  // the generic-proxy writes -> the wgmmas' reads
    __syncthreads();
    const int wg = threadIdx.x / 128;
    const uint32_t da = kmajor_desc_lo(smem_addr(tiles + wg * 64 * 128)), db = kmajor_desc_lo(smem_addr(tiles + 2 * 64 * 128));
    uint32_t pa[4][4];
#pragma unroll
    for (int k = 0; k < 4; k++)
#pragma unroll
        for (int q = 0; q < 4; q++) pa[k][q] = 0x28282828u + (uint32_t)(threadIdx.x + k + q);
    float s[64], pv[64], x[64];
#pragma unroll
    for (int i = 0; i < 64; i++) {
        s[i] = pv[i] = 0.f;
        x[i] = -0.01f * (float)(i + (threadIdx.x & 7));
    }
    constexpr bool do_tensor = MODE == M_TENSOR || MODE == M_BOTH || MODE == M_POLY;
    constexpr bool do_exp = MODE == M_MUFU || MODE == M_BOTH || MODE == M_POLY || MODE == M_POLY_ALONE;
    constexpr int reps = 1;
    float o[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};  // the real step's O and row statistics
#pragma unroll
    for (int i = 0; i < 64; i++) {
        o[i] = 0.f;
        pv[i] = 0.25f * (float)((i + threadIdx.x) % 5);  // the alone modes' fixed PV
        s[i] = 3.0f + 0.5f * (float)((7 * i + threadIdx.x) % 9);  // and their fixed S (raw products)
    }
    __syncthreads();
    const long long t0 = clock64();
    if (MODE == M_MUFU_PACK) {
        for (int it = 0; it < iters; it++) {
            exps<false>(x);
            pack_p(pa, x);
            reg_fence(pa);
        }
    } else if (MODE == M_SOFTMAX) {
        softmax_alone<true>(iters, a, s, o, pv, pa, m, l);
    } else if (MODE == M_SOFTMAX_NORESCALE) {
        softmax_alone<false>(iters, a, s, o, pv, pa, m, l);
    } else if (MODE == M_SPLIT_REAL) {
        if (wg == 0) {
            for (int it = 0; it < 2 * iters; it++) {
                issue_block(s, pv, da, db, pa);
                wgmma_wait<0>();
                reg_fence(s);
                reg_fence(pv);
                reg_fence(pa);
            }
        } else {
            softmax_alone<true>(2 * iters, a, s, o, pv, pa, m, l);
        }
    } else if (MODE == M_PLAIN_REAL) {
        plain_real<true, false>(iters, a, da, db, wg, s, o, pv, pa, m, l);
    } else if (MODE == M_PLAIN_REAL_NORESCALE) {
        plain_real<false, false>(iters, a, da, db, wg, s, o, pv, pa, m, l);
    } else if (MODE == M_PINGPONG_REAL) {
        plain_real<true, true>(iters, a, da, db, wg, s, o, pv, pa, m, l);
    } else if (MODE == M_PLAIN || MODE == M_PINGPONG) {
        if (MODE == M_PINGPONG && wg == 1) named_bar_arrive<1, 256>();  // warpgroup 0 goes first
        for (int it = 0; it < iters; it++) {
            if (MODE == M_PINGPONG) {
                if (wg == 0) named_bar_sync<1, 256>();
                else named_bar_sync<2, 256>();
            }
            reg_fence(s);
            reg_fence(pv);
            reg_fence(pa);
            wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) wg_fp8<128, 0, 0>(s, kmajor_desc(da + 2 * kk), kmajor_desc(db + 2 * kk), 1);
            wgmma_commit();
#pragma unroll
            for (int kk = 0; kk < 4; kk++) wg_fp8_rs<128, 0>(pv, pa[kk], kmajor_desc(db + 2 * kk), 1);
            wgmma_commit();
            if (MODE == M_PINGPONG && !(wg == 1 && it == iters - 1)) {  // hand the turn over (1 arrived up front)
                if (wg == 0) named_bar_arrive<2, 256>();
                else named_bar_arrive<1, 256>();
            }
            wgmma_wait<1>();  // S done
            reg_fence(s);
            if (nsmid_nonzero()) {
#pragma unroll
                for (int i = 0; i < 64; i++) x[i] = fast_exp2(fmaf(s[i], 0.0f, fmaf(x[i], -0.75f, -0.125f)));  // depends on S
            }
            wgmma_wait<0>();  // PV done
            reg_fence(s);
            reg_fence(pv);
            reg_fence(pa);
        }
    } else if (MODE == M_SPLIT) {  // each warpgroup's loop in a straight line (wgmma issue and wait in one path)
        if (wg == 0) {
            for (int it = 0; it < 2 * iters; it++) {
                issue_block(s, pv, da, db, pa);
                wgmma_wait<0>();
                reg_fence(s);
                reg_fence(pv);
                reg_fence(pa);
            }
        } else {
            for (int it = 0; it < 2 * iters; it++) exps<false>(x);
        }
    } else
    for (int it = 0; it < iters; it++) {
        for (int r = 0; r < reps; r++) {
            if (do_tensor) issue_block(s, pv, da, db, pa);
            // a basic block of its own (nsmid_nonzero, always true): ptxas would otherwise hoist
            // the wait below above the exponentials, which then could not overlap the wgmmas
            if (do_exp && nsmid_nonzero()) exps<MODE == M_POLY || MODE == M_POLY_ALONE>(x);
            if (do_tensor) {
                wgmma_wait<0>();
                reg_fence(s);
                reg_fence(pv);
                reg_fence(pa);
            }
        }
    }
    __syncthreads();
    const long long t1 = clock64();
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 64; i++) acc += s[i] + pv[i] + x[i] + o[i];
    acc += m[0] + m[1] + l[0] + l[1] + (float)(pa[0][0] ^ pa[3][3]);
    sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
    if (threadIdx.x == 0) clocks[blockIdx.x] = t1 - t0;
}

template <int MODE>
static double run_mode(int iters, int n_sm, StepArgs a, float *sink, long long *d_clk, long long *h_clk) {
    mufu_qgmma_kernel<MODE><<<n_sm, 256>>>(iters / 10, a, sink, d_clk);  // warm-up
    mufu_qgmma_kernel<MODE><<<n_sm, 256>>>(iters, a, sink, d_clk);
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaMemcpy(h_clk, d_clk, sizeof(long long) * n_sm, cudaMemcpyDeviceToHost));
    double sum = 0;
    for (int i = 0; i < n_sm; i++) sum += (double)h_clk[i];
    return sum / n_sm / iters;  // clocks per iteration, mean over SMs
}
template <int MODE>  // every mode from MODE on
static void run_modes(double (&c)[N_MODES], int iters, int n_sm, StepArgs a, float *sink, long long *d_clk,
                      long long *h_clk) {
    c[MODE] = run_mode<MODE>(iters, n_sm, a, sink, d_clk, h_clk);
    if constexpr (MODE + 1 < N_MODES) run_modes<MODE + 1>(c, iters, n_sm, a, sink, d_clk, h_clk);
}

int main(int argc, char **argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 4000;
    cudaDeviceProp prop;
    CUDA_OK(cudaGetDeviceProperties(&prop, 0));
    const int n_sm = prop.multiProcessorCount;
    float *sink;
    long long *d_clk, h_clk[1024];
    CUDA_OK(cudaMalloc(&sink, sizeof(float) * n_sm * 256));
    CUDA_OK(cudaMalloc(&d_clk, sizeof(long long) * n_sm));
    // the real step's factors: S * tau_qk of a few units, p_scale 2^8 (the kernel's default), 1 / (p_scale s_v)
    const StepArgs a = {0.05f, 8.0f, 1.0f / 256.0f};
    double c[N_MODES];
    run_modes<0>(c, iters, n_sm, a, sink, d_clk, h_clk);
    printf("# %s, %d SMs, %d iterations; per iteration and SM: 2 x 8 m64n128k32 e4m3 wgmmas (8.4 MFLOP), "
           "2 x 128 x 64 exponentials (16384)\n", prop.name, n_sm, iters);
    printf("| form | clocks / iteration | vs tensor + mufu | vs max(tensor, mufu) |\n|---|---|---|---|\n");
    const double sum = c[M_TENSOR] + c[M_MUFU], mx = c[M_TENSOR] > c[M_MUFU] ? c[M_TENSOR] : c[M_MUFU];
    for (int m = 0; m < N_MODES; m++)
        printf("| %s | %.0f | %.2f | %.2f |\n", mode_names[m], c[m], c[m] / sum, c[m] / mx);
    printf("tensor rate: %.0f FP8 FLOP per clock and SM; MUFU rate: %.1f ex2 per clock and SM\n",
           8.39e6 / c[M_TENSOR], 16384.0 / c[M_MUFU]);
    printf("verdict: the exponentials and the wgmmas %s (both_wg at %.2f of the sum, %.2f of the max)\n",
           c[M_BOTH] < 0.75 * sum ? "overlap" : "do NOT overlap", c[M_BOTH] / sum, c[M_BOTH] / mx);
    cudaFree(sink);
    cudaFree(d_clk);
    return 0;
}
