// bench_mufu_qgmma.cu: do the special-function unit's exponentials (MUFU.EX2) and the FP8 tensor
// cores (QGMMA) run at the same time on one SM? The FP8 forward's loop measures as if they did not
// (its clocks per key block are about the tensor time plus the exponentials' time: docs/perf.md,
// "FP8 forward"; docs/fp8-attention-kernels.md §11), and every loop built to overlap them was
// slower. This isolates the question from the attention kernel: one CTA per SM, two warpgroups,
// each iteration one forward key block's worth of work per warpgroup (8 m64n128k32 e4m3 wgmmas:
// 4.2 MFLOP; 64 exponentials per thread: 8192), in these forms:
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
// and, growing the skeleton into the kernel's real step (attention/fwd_fp8_step.cuh: the same
// functions the FP8 forward runs, so the same instructions):
//   mufu_pack   the exponentials and their conversion to E4M3 (pack_p: 32 F2FP per thread) alone:
//               whether the conversions share the exponentials' unit
//   softmax     the whole softmax step alone: the kernel's row max (softmax_max), exponentials and
//               FP32 row sums (bench_softmax_block), the O update (64 FFMA, O * a + PV) and pack_p,
//               on fixed S values
//   softmax_norescale  the same with the O update of a block whose row maxima and V scale did
//               not move (a = 1: 64 FADD, O + PV)
//   split_real  warpgroup 0 only the wgmmas, warpgroup 1 only the real softmax step (twice as
//               many iterations each): one warp's softmax per scheduler under the other's matmuls
//   plain_real  the plain loop with the real step: S_j and PV_{j-1} issued as two groups, the
//               softmax of S_j while PV_{j-1} runs, then O += PV_{j-1}, P̂_j packed (the kernel's
//               loop without its ring: no mbarriers, no producer)
//   plain_real_norescale  the same with the alpha = 1 O update
//   pingpong_real the plain_real loop with ping-pong's named barriers
//   ... traced  plain_real and pingpong_real with clock64 marks in the step (plain_real's TRACE):
//               one warp of each warpgroup on one scheduler, printed after the table
//   softmax_one warpgroup 0 the real softmax step alone (twice as many iterations), warpgroup 1 idle
//   pingpong_at_s, pingpong_at_softmax  ping-pong with the turn passed once S_j is done / after the
//               softmax, instead of right after the issue
//   mufu_h2     the exponentials as ex2.approx.f16x2, two per instruction (f32 in and out)
//   mufu_h2_pack  the same kept in f16x2 and converted to E4M3 from there
//   overlap_real  the kernel's overlap loop: S_{j+1} issued before the softmax of S_j, PV_j after
//               it into S_j's registers and waited for at once (overlap_step)
//   overlap_split the same with the row max of S_{j+1} between PV_j's issue and its wait
//   issue_alone warpgroup 0 alone issues a block's 8 wgmmas and waits for them, warpgroup 1 idle;
//               issue_both: both warpgroups (the tensor mode); issue_s_alone: S's 4 wgmmas only.
//               Printed after the table: the mean clocks from the fence to the last issued wgmma,
//               and from there to the wait's end (thread 0 of each warpgroup, CTA 0)
//   plain_interleave  S_j issued alone and waited for; then its row max, and PV_{j-1}'s 4 wgmmas
//               issued one at a time between quarters of the exponentials (so no issue waits
//               behind a whole block of the other warpgroup's); then PV waited for, O updated
//   overlap_interleave  the overlap loop with S_{j+1}'s 4 wgmmas issued one at a time between
//               quarters of S_j's exponentials (then PV_j after the packing, as overlap_split)
//   plain_split the plain loop with S_{j+1} issued right after P̂_j is packed, before the O update,
//               and PV_j after it (plain_split): S queued a step's tail earlier
//   plain_real_bb plain_real with the softmax in a basic block of its own, so that PV_{j-1}'s wait
//               stays after it (in plain_real ptxas hoists it above 50 of the 64 exponentials)
//   plain_waitall, pingpong_waitall (traced)  plain_real / pingpong_real with S_j and PV_{j-1} both
//               waited for before the softmax: does a warp compute slower while its own wgmmas run?
//   softmax_one wg1 traced, split_real_ss traced  warpgroup 1's real steps timed from inside (the
//               traced window and the whole loop): alone, and under warpgroup 0's wgmmas with PV
//               from shared memory (split_real traced: from registers, as the kernel's)
//   probe X alone / under tensor  warpgroup 1 times steps of one kind of the softmax's work (exp:
//               64 FFMA + ex2; fp32: two O updates, 128 FMUL + 128 FFMA; pack: two pack_p, 64
//               F2FP + 32 PRMT) alone, and while warpgroup 0 runs wgmma blocks: which part of the
//               step do the tensor cores slow down?
//   plain_poly N  plain_real with N of a thread's 64 exponentials per block on the FMA pipe
//               (poly_exp2, fast_exp2.cuh) instead of the SFU
//   ..._ss      PV with A from shared memory (P̂ stored there by each warpgroup, 16 shared stores
//               per thread, a proxy fence and the warpgroup's barrier) instead of registers: is
//               it the register operand that holds a warp at its wgmma issue (the traces: 410-630
//               clocks)? No: the issue waits as long, and the loops are slower (issue_* shows why)
// Prints clocks per iteration and SM (clock64, the SM's own clock) and what "overlap" would give:
// max(tensor, mufu) if the two run at once, tensor + mufu if they do not. The accumulators and
// exponentials feed a checksum, so nothing is optimized away; the data are fixed small E4M3 codes.
//   build (GPU machine): nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I.
//                        dev/bench/bench_mufu_qgmma.cu core/common.c -o /tmp/bench_mufu_qgmma
//   run: /tmp/bench_mufu_qgmma [iterations]
//   or on the GPU machine: bash scripts/gpu.sh bench bench_mufu_qgmma [iterations]
#include <cuda_runtime.h>  // launches, events
#include <stdint.h>        // uint8_t, uint32_t, uint64_t
#include <stdio.h>         // printf
#include <stdlib.h>        // atoi
#include <string.h>        // strlen

#include "attention/fwd_fp8_step.cuh"  // the FP8 forward's issue_s, issue_pv, softmax_max, pack_p
#include "attention/common.cuh"        // wg_fp8, wg_fp8_rs, kmajor_desc(_lo), wgmma fences, CUDA_OK
#include "bench_fwd_fp8_loops.cuh"     // StepArgs, SmClocks and the loop forms around the kernel's step
#include "gpu/ptx/fast_exp2.cuh"       // fast_exp2 (ex2.approx.ftz)

enum {
    M_TENSOR, M_MUFU, M_BOTH, M_SPLIT, M_POLY, M_POLY_ALONE, M_PLAIN, M_PINGPONG,  // the skeleton
    M_MUFU_PACK, M_SOFTMAX, M_SOFTMAX_NORESCALE, M_SPLIT_REAL, M_PLAIN_REAL, M_PLAIN_REAL_NORESCALE,
    M_PINGPONG_REAL, M_PLAIN_TRACE, M_PINGPONG_TRACE,
    M_BOTH_SS, M_PLAIN_SS, M_PINGPONG_SS, M_PINGPONG_SS_TRACE,
    M_SOFTMAX_ONE, M_SPLIT_REAL_TRACE, M_PP_S, M_PP_S_TRACE, M_PP_SM, M_MUFU_H2, M_MUFU_H2_PACK,
    M_OVERLAP_REAL, M_OVERLAP_SPLIT, M_ISSUE_ALONE, M_ISSUE_BOTH, M_ISSUE_S_ALONE,
    M_PLAIN_INTERLEAVE, M_OVERLAP_INTERLEAVE, M_PLAIN_SPLIT, M_PLAIN_SPLIT_TRACE, M_PLAIN_BB, M_PLAIN_WAITALL, M_PP_WAITALL, M_PP_WAITALL_TRACE, M_SOFTMAX_ONE1_TRACE, M_SPLIT_REAL_SS_TRACE, M_PROBE_EXP_ALONE, M_PROBE_EXP_TENSOR, M_PROBE_FP_ALONE, M_PROBE_FP_TENSOR, M_PROBE_PACK_ALONE, M_PROBE_PACK_TENSOR, M_PLAIN_POLY1, M_PLAIN_POLY2, M_PLAIN_POLY3, M_PLAIN_POLY4, M_PLAIN_POLY6, N_MODES
};
static const char *const mode_names[N_MODES] = {
    "tensor",   "mufu",       "both_wg",           "split_wg",   "both_poly",  "poly",
    "plain_dep", "pingpong_dep", "mufu_pack",      "softmax",    "softmax_norescale",
    "split_real", "plain_real", "plain_real_norescale", "pingpong_real",
    "plain_real traced", "pingpong_real traced",
    "both_ss", "plain_real_ss", "pingpong_real_ss", "pingpong_real_ss traced",
    "softmax_one", "split_real traced", "pingpong_at_s", "pingpong_at_s traced", "pingpong_at_softmax",
    "mufu_h2", "mufu_h2_pack", "overlap_real", "overlap_split", "issue_alone", "issue_both", "issue_s_alone",
    "plain_interleave", "overlap_interleave", "plain_split", "plain_split traced", "plain_real_bb", "plain_waitall", "pingpong_waitall", "pingpong_waitall traced", "softmax_one wg1 traced", "split_real_ss traced", "probe exp alone", "probe exp under tensor", "probe fp32 alone", "probe fp32 under tensor", "probe pack alone", "probe pack under tensor", "plain_poly 4", "plain_poly 8", "plain_poly 12", "plain_poly 16", "plain_poly 24"};

// 64 exponentials per thread, 64 independent chains (the softmax's FFMA then ex2 per element)
template <bool POLY>
__device__ __forceinline__ void exps(float (&x)[64]) {
#pragma unroll
    for (int i = 0; i < 64; i++) {
        const float a = fmaf(x[i], -0.75f, -0.125f);
        x[i] = POLY ? poly_exp2(a) : fast_exp2(a);
    }
}

// 64 exponentials per thread as 32 ex2.approx.f16x2 (two per MUFU instruction, if the unit takes
// them at the f32 rate): the FFMA in f32, the pair converted to f16x2, the result back in f32 (so
// the chains continue as in exps)
__device__ __forceinline__ void exps_h2(float (&x)[64]) {
#pragma unroll
    for (int i = 0; i < 64; i += 2) {
        const float a0 = fmaf(x[i], -0.75f, -0.125f), a1 = fmaf(x[i + 1], -0.75f, -0.125f);
        uint32_t h, r;
        asm("cvt.rn.f16x2.f32 %0, %2, %1;\n" : "=r"(h) : "f"(a0), "f"(a1));
        asm("ex2.approx.f16x2 %0, %1;\n" : "=r"(r) : "r"(h));
        asm("{\n.reg .f16 lo, hi;\nmov.b32 {lo, hi}, %2;\ncvt.f32.f16 %0, lo;\ncvt.f32.f16 %1, hi;\n}\n"
            : "=f"(x[i]), "=f"(x[i + 1]) : "r"(r));
    }
}
// The same, but the f16x2 results stay packed and feed E4M3 conversions straight from f16x2
// (what a softmax on f16 exponentials would do: 32 cvt.e4m3x2.f16x2 instead of 32 from f32 pairs)
__device__ __forceinline__ void exps_h2_pack(float (&x)[64], uint32_t (&pa)[4][4]) {
#pragma unroll
    for (int i = 0; i < 64; i += 4) {
        uint32_t r[2];
#pragma unroll
        for (int k = 0; k < 2; k++) {
            const float a0 = fmaf(x[i + 2 * k], -0.75f, -0.125f), a1 = fmaf(x[i + 2 * k + 1], -0.75f, -0.125f);
            uint32_t h;
            asm("cvt.rn.f16x2.f32 %0, %2, %1;\n" : "=r"(h) : "f"(a0), "f"(a1));
            asm("ex2.approx.f16x2 %0, %1;\n" : "=r"(r[k]) : "r"(h));
            x[i + 2 * k] = __int_as_float(r[k]);  // keeps the chain (bits)
        }
        uint32_t lo, hi;
        asm("{\n.reg .b16 t;\ncvt.rn.satfinite.e4m3x2.f16x2 t, %1;\ncvt.u32.u16 %0, t;\n}\n" : "=r"(lo) : "r"(r[0]));
        asm("{\n.reg .b16 t;\ncvt.rn.satfinite.e4m3x2.f16x2 t, %1;\ncvt.u32.u16 %0, t;\n}\n" : "=r"(hi) : "r"(r[1]));
        pa[(i >> 4) & 3][(i >> 2) & 3] = lo | (hi << 16);
    }
}

// n blocks of issue_block, each waited for: the tensor-only warpgroup of the split forms
__device__ __forceinline__ void tensor_blocks(int n, float (&s)[64], float (&pv)[64], uint32_t da, uint32_t db,
                                              uint32_t (&pa)[4][4]) {
    for (int it = 0; it < n; it++) {
        issue_block(s, pv, da, db, pa);
        wgmma_wait<0>();
        reg_fence(s);
        reg_fence(pv);
        reg_fence(pa);
    }
}


template <int MODE>
__global__ void __launch_bounds__(256, 1) mufu_qgmma_kernel(int iters, StepArgs a, float *sink, long long *clocks, long long *trace) {
    // A (2 warpgroups x 64 rows), B (128 rows), P̂ (2 warpgroups x 64 rows: the _ss modes)
    __shared__ __align__(1024) uint8_t tiles[2 * 64 * 128 + 128 * 128 + 2 * 64 * 128];
    for (int i = threadIdx.x; i < (int)sizeof tiles; i += blockDim.x) tiles[i] = (uint8_t)(0x20 + (i * 37) % 0x18);
    fence_proxy_async();  // the generic-proxy writes -> the wgmmas' reads
    __syncthreads();
    const int wg = threadIdx.x / 128;
    const uint32_t da = kmajor_desc_lo(smem_addr(tiles + wg * 64 * 128)), db = kmajor_desc_lo(smem_addr(tiles + 2 * 64 * 128));
    const uint32_t sp = smem_addr(tiles + 2 * 64 * 128 + 128 * 128 + wg * 64 * 128);
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
    constexpr bool do_tensor = MODE == M_TENSOR || MODE == M_BOTH || MODE == M_POLY || MODE == M_BOTH_SS;
    constexpr bool do_exp = MODE == M_MUFU || MODE == M_BOTH || MODE == M_POLY || MODE == M_POLY_ALONE || MODE == M_BOTH_SS;
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
            tensor_blocks(2 * iters, s, pv, da, db, pa);
        } else {
            softmax_alone<true>(2 * iters, a, s, o, pv, pa, m, l);
        }
    } else if (MODE == M_PLAIN_REAL) {
        plain_real<true, 0>(iters, a, da, db, wg, s, o, pv, pa, m, l);
    } else if (MODE == M_PLAIN_REAL_NORESCALE) {
        plain_real<false, 0>(iters, a, da, db, wg, s, o, pv, pa, m, l);
    } else if (MODE == M_PINGPONG_REAL) {
        plain_real<true, 1>(iters, a, da, db, wg, s, o, pv, pa, m, l);
    } else if (MODE == M_PLAIN_TRACE) {
        plain_real<true, 0, true>(iters, a, da, db, wg, s, o, pv, pa, m, l, trace);
    } else if (MODE == M_PINGPONG_TRACE) {
        plain_real<true, 1, true>(iters, a, da, db, wg, s, o, pv, pa, m, l, trace);
    } else if (MODE == M_PLAIN_SS) {
        plain_real<true, 0, false, true>(iters, a, da, db, wg, s, o, pv, pa, m, l, nullptr, sp);
    } else if (MODE == M_PINGPONG_SS) {
        plain_real<true, 1, false, true>(iters, a, da, db, wg, s, o, pv, pa, m, l, nullptr, sp);
    } else if (MODE == M_MUFU_H2) {
        for (int it = 0; it < iters; it++) exps_h2(x);
    } else if (MODE == M_MUFU_H2_PACK) {
        for (int it = 0; it < iters; it++) {
            exps_h2_pack(x, pa);
            reg_fence(pa);
        }
    } else if (MODE >= M_PROBE_EXP_ALONE && MODE <= M_PROBE_PACK_TENSOR) {
        constexpr bool under = (MODE - M_PROBE_EXP_ALONE) % 2 == 1;
        constexpr int kind = (MODE - M_PROBE_EXP_ALONE) / 2;  // 0 exp, 1 fp32, 2 pack
        if (wg == 0) {
            if (under) tensor_blocks(2 * iters, s, pv, da, db, pa);
        } else {
            timed_steps<true>(2 * iters, trace, [&] {
                if (kind == 0) exps<false>(x);
                if (kind == 1) {
                    const float al[2] = {0.999f, 1.001f};
                    reg_fence(pv);
                    o_rescale_add(o, pv, al);
                    reg_fence(o);
                    o_rescale_add(o, pv, al);
                    reg_fence(o);
                }
                if (kind == 2) {
                    reg_fence(x);
                    pack_p(pa, x);
                    reg_fence(pa);
                    reg_fence(s);
                    pack_p(pa, s);
                    reg_fence(pa);
                }
            });
        }
    } else if (MODE >= M_PLAIN_POLY1 && MODE <= M_PLAIN_POLY6) {
        constexpr int np = MODE == M_PLAIN_POLY6 ? 6 : MODE - M_PLAIN_POLY1 + 1;  // n-tiles of 4
        plain_real<true, 0, false, false, false, false, np>(iters, a, da, db, wg, s, o, pv, pa, m, l);
    } else if (MODE == M_SOFTMAX_ONE1_TRACE) {
        if (wg == 1) softmax_alone<true, true>(2 * iters, a, s, o, pv, pa, m, l, trace);
    } else if (MODE == M_SPLIT_REAL_SS_TRACE) {
        if (wg == 0) {
            for (int it = 0; it < 2 * iters; it++) {
                issue_block<true, true>(s, pv, da, db, pa, kmajor_desc_lo(sp));
                wgmma_wait<0>();
                reg_fence(s);
                reg_fence(pv);
                reg_fence(pa);
            }
        } else {
            softmax_alone<true, true>(2 * iters, a, s, o, pv, pa, m, l, trace);
        }
    } else if (MODE == M_PLAIN_WAITALL) {
        plain_real<true, 0, false, false, false, true>(iters, a, da, db, wg, s, o, pv, pa, m, l);
    } else if (MODE == M_PP_WAITALL) {
        plain_real<true, 1, false, false, false, true>(iters, a, da, db, wg, s, o, pv, pa, m, l);
    } else if (MODE == M_PP_WAITALL_TRACE) {
        plain_real<true, 1, true, false, false, true>(iters, a, da, db, wg, s, o, pv, pa, m, l, trace);
    } else if (MODE == M_PLAIN_BB) {
        plain_real<true, 0, false, false, true>(iters, a, da, db, wg, s, o, pv, pa, m, l);
    } else if (MODE == M_PLAIN_SPLIT) {
        plain_split(iters, a, da, db, s, o, pv, pa, m, l);
    } else if (MODE == M_PLAIN_SPLIT_TRACE) {
        plain_split<true>(iters, a, da, db, s, o, pv, pa, m, l, trace);
    } else if (MODE == M_PLAIN_INTERLEAVE) {
        plain_interleave(iters, a, da, db, s, o, pv, pa, m, l);
    } else if (MODE == M_OVERLAP_INTERLEAVE) {
        overlap_real<2>(iters, a, da, db, s, x, o, pa, m, l);
    } else if (MODE == M_ISSUE_ALONE) {
        if (wg == 0) issue_timed<false>(iters, da, db, wg, s, pv, pa, trace);
    } else if (MODE == M_ISSUE_BOTH) {
        issue_timed<false>(iters, da, db, wg, s, pv, pa, trace);
    } else if (MODE == M_ISSUE_S_ALONE) {
        if (wg == 0) issue_timed<true>(iters, da, db, wg, s, pv, pa, trace);
    } else if (MODE == M_OVERLAP_REAL) {
        overlap_real<0>(iters, a, da, db, s, x, o, pa, m, l);
    } else if (MODE == M_OVERLAP_SPLIT) {
        overlap_real<1>(iters, a, da, db, s, x, o, pa, m, l);
    } else if (MODE == M_SOFTMAX_ONE) {
        if (wg == 0) softmax_alone<true>(2 * iters, a, s, o, pv, pa, m, l);
    } else if (MODE == M_SPLIT_REAL_TRACE) {
        if (wg == 0) {
            tensor_blocks(2 * iters, s, pv, da, db, pa);
        } else {
            softmax_alone<true, true>(2 * iters, a, s, o, pv, pa, m, l, trace);
        }
    } else if (MODE == M_PP_S) {
        plain_real<true, 2>(iters, a, da, db, wg, s, o, pv, pa, m, l);
    } else if (MODE == M_PP_S_TRACE) {
        plain_real<true, 2, true>(iters, a, da, db, wg, s, o, pv, pa, m, l, trace);
    } else if (MODE == M_PP_SM) {
        plain_real<true, 3>(iters, a, da, db, wg, s, o, pv, pa, m, l);
    } else if (MODE == M_PINGPONG_SS_TRACE) {
        plain_real<true, 1, true, true>(iters, a, da, db, wg, s, o, pv, pa, m, l, trace, sp);
    } else if (MODE == M_PLAIN || MODE == M_PINGPONG) {
        if (MODE == M_PINGPONG && wg == 1) pp_pass(1);  // warpgroup 0 goes first
        for (int it = 0; it < iters; it++) {
            if (MODE == M_PINGPONG) pp_sync(wg);
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
            if (MODE == M_PINGPONG && !(wg == 1 && it == iters - 1)) pp_pass(wg);  // (1 arrived up front)
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
            tensor_blocks(2 * iters, s, pv, da, db, pa);
        } else {
            for (int it = 0; it < 2 * iters; it++) exps<false>(x);
        }
    } else
    for (int it = 0; it < iters; it++) {
        for (int r = 0; r < reps; r++) {
            if (do_tensor) issue_block<true, MODE == M_BOTH_SS>(s, pv, da, db, pa, kmajor_desc_lo(sp));
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
    // the CTA's time: the latest warp's end, each read after its checksum (cta_time)
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 64; i++) acc += s[i] + pv[i] + x[i] + o[i];
    acc += m[0] + m[1] + l[0] + l[1] + (float)(pa[0][0] ^ pa[3][3]);
    cta_time(acc, t0, sink, clocks);
}

static char trace_buf[16][8192];  // the traced modes' traces (run_modes), printed after the table
template <int MODE>  // every mode from MODE on; a traced mode keeps its trace
static void run_modes(double (&c)[N_MODES], SmClocks<256> &b, int iters, StepArgs a, long long *d_trace) {
    // clocks per iteration, mean over SMs
    c[MODE] = b.per_iter(iters, [&](int n) { mufu_qgmma_kernel<MODE><<<b.n_sm, 256>>>(n, a, b.sink, b.d_clk, d_trace); });
    constexpr int trace_kind = MODE == M_PLAIN_TRACE ? 0 : MODE == M_PINGPONG_TRACE ? 1 : MODE == M_PINGPONG_SS_TRACE ? 2
                               : MODE == M_PP_S_TRACE ? 3 : MODE == M_PLAIN_SPLIT_TRACE ? 6 : MODE == M_PP_WAITALL_TRACE ? 5 : -1;
    if (trace_kind >= 0) {
        // every warp for plain_real and plain_split (do the warps of a warpgroup reach its wgmmas
        // together?), warps 0 and 4 (one scheduler) for the others
        static long long t[TRACE_LEN];
        CUDA_OK(cudaMemcpy(t, d_trace, sizeof t, cudaMemcpyDeviceToHost));
        const bool all = trace_kind == 0 || trace_kind == 6 || trace_kind == 5;
        char *b = trace_buf[trace_kind];
        int n = snprintf(b, sizeof trace_buf[0], "%s, CTA 0, clocks from warp 0's first traced loop top (%s):\n", mode_names[MODE],
                         trace_kind == 6 ? "top / S issued / S done / softmax done / PV done / packed"
                                         : "top / issued / S done / softmax done / PV done / packed");
        for (int i = 0; i < TRACE_N; i++)
            for (int w = 0; w < TRACE_WARPS; w++) {
                if (!all && w % 4 != 0) continue;
                n += snprintf(b + n, sizeof trace_buf[0] - n, "  block %d wg %d warp %d:", TRACE_FROM + i, w / 4, w % 4);
                for (int p = 0; p < TRACE_POINTS; p++)
                    n += snprintf(b + n, sizeof trace_buf[0] - n, " %6lld", t[(w * TRACE_N + i) * TRACE_POINTS + p] - t[0]);
                n += snprintf(b + n, sizeof trace_buf[0] - n, "\n");
            }
    }
    if (MODE == M_ISSUE_ALONE || MODE == M_ISSUE_BOTH || MODE == M_ISSUE_S_ALONE) {
        long long t[4] = {0, 0, 0, 0};
        CUDA_OK(cudaMemcpy(t, d_trace, sizeof t, cudaMemcpyDeviceToHost));
        char *b = trace_buf[7];
        const size_t n = strlen(b);
        snprintf(b + n, sizeof trace_buf[0] - n, "%s: clocks per block, issue / wait: warpgroup 0 %lld / %lld, warpgroup 1 %lld / %lld\n",
                 mode_names[MODE], t[0], t[1], MODE == M_ISSUE_BOTH ? t[2] : 0LL, MODE == M_ISSUE_BOTH ? t[3] : 0LL);
        CUDA_OK(cudaMemset(d_trace, 0, sizeof t));
    }
    if (MODE == M_SPLIT_REAL_TRACE || MODE == M_SOFTMAX_ONE1_TRACE || MODE == M_SPLIT_REAL_SS_TRACE ||
        (MODE >= M_PROBE_EXP_ALONE && MODE <= M_PROBE_PACK_TENSOR)) {
        // warpgroup 1's softmax steps: the window's durations, their mean, the whole loop's mean
        static long long t[TRACE_LEN];
        CUDA_OK(cudaMemcpy(t, d_trace, sizeof t, cudaMemcpyDeviceToHost));
        char *b = trace_buf[MODE == M_SPLIT_REAL_TRACE ? 4 : MODE == M_SOFTMAX_ONE1_TRACE ? 8 : MODE == M_SPLIT_REAL_SS_TRACE ? 9
                            : 10 + MODE - M_PROBE_EXP_ALONE];
        const int nw = TRACE_LEN - 2;
        int n = snprintf(b, sizeof trace_buf[0], "%s: warpgroup 1's steps, mean clocks: window %.0f, whole loop %.0f; the first 16:",
                         mode_names[MODE], (double)(t[nw - 1] - t[0]) / (nw - 1),
                         (double)(t[TRACE_LEN - 1] - t[TRACE_LEN - 2]) / (2.0 * iters));
        for (int i = 1; i <= 16; i++) n += snprintf(b + n, sizeof trace_buf[0] - n, " %lld", t[i] - t[i - 1]);
        snprintf(b + n, sizeof trace_buf[0] - n, "\n");
    }
    if constexpr (MODE + 1 < N_MODES) run_modes<MODE + 1>(c, b, iters, a, d_trace);
}
int main(int argc, char **argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 4000;
    SmClocks<256> b;
    long long *d_trace;
    CUDA_OK(cudaMalloc(&d_trace, sizeof(long long) * TRACE_LEN));
    // the real step's factors: S * tau_qk of a few units, p_scale 2^8 (the kernel's default)
    const StepArgs a = {0.05f, 8.0f};
    double c[N_MODES];
    run_modes<0>(c, b, iters, a, d_trace);
    printf("# %s, %d SMs, %d iterations; per iteration and SM: 2 x 8 m64n128k32 e4m3 wgmmas (8.4 MFLOP), "
           "2 x 128 x 64 exponentials (16384)\n", b.prop.name, b.n_sm, iters);
    printf("| form | clocks / iteration | vs tensor + mufu | vs max(tensor, mufu) |\n|---|---|---|---|\n");
    const double sum = c[M_TENSOR] + c[M_MUFU], mx = c[M_TENSOR] > c[M_MUFU] ? c[M_TENSOR] : c[M_MUFU];
    for (int m = 0; m < N_MODES; m++)
        printf("| %s | %.0f | %.2f | %.2f |\n", mode_names[m], c[m], c[m] / sum, c[m] / mx);
    printf("tensor rate: %.0f FP8 FLOP per clock and SM; MUFU rate: %.1f ex2 per clock and SM\n",
           8.39e6 / c[M_TENSOR], 16384.0 / c[M_MUFU]);
    printf("verdict: the exponentials and the wgmmas %s (both_wg at %.2f of the sum, %.2f of the max)\n",
           c[M_BOTH] < 0.75 * sum ? "overlap" : "do NOT overlap", c[M_BOTH] / sum, c[M_BOTH] / mx);
    for (int i = 0; i < 16; i++) printf("%s", trace_buf[i]);
    cudaFree(d_trace);
    return 0;
}
