// bench_fwd_fp8_loops.cuh: the FP8 forward's loop forms around its own per-block step
// (attention/fwd_fp8_step.cuh), for dev/bench/bench_mufu_qgmma.cu: the plain loop and ping-pong
// (with the turn passed at three points, P̂ from registers or shared memory, with or without the
// O rescale, traced or not, with the PV wait kept below the softmax, with both groups waited for
// first, with some exponentials on the FMA pipe), the step without matmuls, the overlap loop, PV
// issued between quarters of the exponentials, the issue split around the O update
// (plain_split), and the wgmma issue timed alone. One key block per warpgroup per iteration, the
// same fixed shared tiles every block (no ring). See the mode list at the top of
// bench_mufu_qgmma.cu.
#pragma once

#include <math.h>    // INFINITY
#include <stdint.h>  // uint32_t

#include "attention/fwd_fp8_step.cuh"  // issue_s, issue_pv, softmax_max, pack_p, o_rescale_add: the kernel's step
#include "attention/common.cuh"        // wgmma wrappers and fences, reg_fence, sw128, named barriers, CUDA_OK
#include "core/common.h"               // FATAL

// --- the step's forms that only the benchmarks run ----------------------------------------------
// Named barriers 1 and 2, 256 threads each: the consumers' ping-pong (3: the producer's own).
__device__ __forceinline__ void pp_sync(int wg) {  // wait for warpgroup wg's turn
    if (wg == 0) named_bar_sync<1, 256>();
    else named_bar_sync<2, 256>();
}
__device__ __forceinline__ void pp_pass(int wg) {  // warpgroup wg hands the turn to the other one
    if (wg == 0) named_bar_arrive<2, 256>();
    else named_bar_arrive<1, 256>();
}

// The step's exponentials with FP32 row sums (the kernel takes its row sums from the PV wgmma,
// l_add_ones): n-tiles N0 .. N1 - 1 (keys 8 N0 .. 8 N1 - 1 of the tile's columns), so that a loop
// may issue wgmmas between parts. c2 = tau_qk * log2(e); rs: this thread's two partial row sums,
// added to in order. NPOLY: n-tiles 16 - NPOLY .. 15 take their exponentials on the FMA pipe
// (poly_exp2) instead of the special-function unit (the kernel's: none).
template <bool MASKED, int N0, int N1, int NPOLY = 0>
__device__ __forceinline__ void bench_softmax_exp_part(float (&s)[F8_BK / 2], float (&rs)[2], const float (&bias)[2], float c2) {
#pragma unroll
    for (int n = N0; n < N1; n++) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const float arg = fmaf(s[4 * n + e], c2, bias[e >> 1]);
            const float p = n >= F8_BK / 8 - NPOLY ? poly_exp2(arg) : fast_exp2(arg);
            // masked: -inf gives 0 through ex2 too, but not if tau_qk underflowed to 0
            s[4 * n + e] = MASKED && s[4 * n + e] == -INFINITY ? 0.0f : p;
        }
        rs[0] += s[4 * n + 0] + s[4 * n + 1];
        rs[1] += s[4 * n + 2] + s[4 * n + 3];
    }
}
__device__ __forceinline__ void softmax_exp_sums(float (&l)[2], const float (&alpha)[2], const float (&rs)[2]) {
    l[0] = l[0] * alpha[0] + rs[0];
    l[1] = l[1] * alpha[1] + rs[1];
}
template <bool MASKED, int NPOLY = 0>
__device__ __forceinline__ void bench_softmax_exp(float (&s)[F8_BK / 2], float (&l)[2], const float (&alpha)[2],
                                            const float (&bias)[2], float tau_qk) {
    constexpr float LOG2E = 1.4426950408889634f;
    float rs[2] = {0.f, 0.f};
    bench_softmax_exp_part<MASKED, 0, F8_BK / 8, NPOLY>(s, rs, bias, tau_qk * LOG2E);
    softmax_exp_sums(l, alpha, rs);
}
// bench_softmax_exp with a wgmma k-step issued before each quarter of the exponentials: issue(kk) for
// kk = 0..3 (the caller's wgmmas, fenced before and committed by the caller, e.g. in issue(3)),
// then the exponentials of n-tiles 4 kk .. 4 kk + 3, each quarter a basic block of its own
// (nsmid_nonzero): else ptxas gathers the wgmmas, may serialize them and hoists the wait for them
// above the exponentials (read in the SASS with dev/sass.sh schedule). The same values as
// bench_softmax_exp.
template <bool MASKED, class Issue>
__device__ __forceinline__ void softmax_exp_interleaved(float (&s)[F8_BK / 2], float (&l)[2], const float (&alpha)[2],
                                                        const float (&bias)[2], float tau_qk, Issue issue) {
    static_assert(F8_BK / 8 == 16, "four quarters of 4 n-tiles");
    constexpr float LOG2E = 1.4426950408889634f;
    const float c2 = tau_qk * LOG2E;
    float rs[2] = {0.f, 0.f};
    issue(0);
    if (nsmid_nonzero()) bench_softmax_exp_part<MASKED, 0, 4>(s, rs, bias, c2);
    issue(1);
    if (nsmid_nonzero()) bench_softmax_exp_part<MASKED, 4, 8>(s, rs, bias, c2);
    issue(2);
    if (nsmid_nonzero()) bench_softmax_exp_part<MASKED, 8, 12>(s, rs, bias, c2);
    issue(3);
    if (nsmid_nonzero()) bench_softmax_exp_part<MASKED, 12, 16>(s, rs, bias, c2);
    softmax_exp_sums(l, alpha, rs);
}
// The whole step's softmax with FP32 row sums: the kernel's softmax_max, then bench_softmax_exp.
template <bool MASKED, int NPOLY = 0>
__device__ __forceinline__ void bench_softmax_block(float (&s)[F8_BK / 2], float (&m)[2], float (&l)[2],
                                                    float (&alpha)[2], float tau_qk, float log2_ps, int k0,
                                                    int row_w0, int T, int g, int t4) {
    float bias[2];
    softmax_max<MASKED>(s, m, alpha, bias, tau_qk, log2_ps, k0, row_w0, T, g, t4);
    bench_softmax_exp<MASKED, NPOLY>(s, l, alpha, bias, tau_qk);
}
// O += PV: the update of a block whose rows' maxima did not move and whose V scale is the
// previous one's (the factor 1): softmax_norescale and plain_real_norescale time it.
template <int N>
__device__ __forceinline__ void o_add(float (&o)[N], const float (&pv)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) o[i] += pv[i];
}

// The kernel's numbers for the real step: tau_qk (tau / (s_q s_k)), log2(p_scale) (O's factor is
// alpha: every block of the benchmark has the same V scale, o_unit_factor's ratio 1)
struct StepArgs {
    float tau_qk, log2_ps;
};

// The traces (plain_real's and plain_split's TRACE, softmax_alone's): from iteration TRACE_FROM on,
// TRACE_N iterations of each of the CTA's 8 consumer warps (the warpgroups' warps w and w + 4
// share scheduler w)
constexpr int TRACE_FROM = 200, TRACE_N = 4, TRACE_POINTS = 6, TRACE_WARPS = 8;
constexpr int TRACE_LEN = TRACE_WARPS * TRACE_N * TRACE_POINTS;
// The loops' traces (TRACE): lane 0 of each warp of CTA 0 records clock64 at point p of loop
// iteration it, for TRACE_N iterations from TRACE_FROM, at trace[(warp * TRACE_N + it - TRACE_FROM)
// * TRACE_POINTS + p].
template <bool TRACE>
__device__ __forceinline__ void trace_point(long long *trace, int it, int p) {
    if (TRACE && blockIdx.x == 0 && (threadIdx.x & 31) == 0 && it >= TRACE_FROM && it < TRACE_FROM + TRACE_N)
        trace[((threadIdx.x >> 5) * TRACE_N + it - TRACE_FROM) * TRACE_POINTS + p] = clock64();
}
// The CTA's time, into clocks[blockIdx.x]: the latest warp's end, each read once its own results
// are complete (the clock read takes the warp's checksum acc as an input, so ptxas cannot schedule
// it before the work; reading the clock after a __syncthreads is not enough: ptxas may sink a
// warpgroup's register-only work below the barrier, and the split modes read ~half their real
// time so). acc goes to sink, so that nothing is optimized away. t0: the clock at the start.
__device__ __forceinline__ void cta_time(float acc, long long t0, float *sink, long long *clocks) {
    long long t1;
    asm volatile("{\n.reg .f32 dep;\nmov.f32 dep, %1;\nmov.u64 %0, %%clock64;\n}\n" : "=l"(t1) : "f"(acc) : "memory");
    __shared__ unsigned long long t_end;
    if (threadIdx.x == 0) t_end = 0;
    __syncthreads();
    if ((threadIdx.x & 31) == 0) atomicMax(&t_end, (unsigned long long)t1);
    sink[blockIdx.x * blockDim.x + threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.x == 0) clocks[blockIdx.x] = (long long)t_end - t0;
}
// The host side both benchmarks share: one CTA of up to MAX_THREADS threads per SM, each thread's
// checksum into sink and each CTA's clocks (cta_time) into d_clk. per_iter(iters, launch) runs
// launch(n) (a launch of n iterations) as a warm-up of iters / 10, then timed, and returns the
// clocks per iteration, the mean over the SMs.
template <int MAX_THREADS>
struct SmClocks {
    cudaDeviceProp prop;
    int n_sm;
    float *sink;
    long long *d_clk, h_clk[1024];
    SmClocks() {
        CUDA_OK(cudaGetDeviceProperties(&prop, 0));
        n_sm = prop.multiProcessorCount;
        if (n_sm > 1024) FATAL("bench: %d SMs, at most 1024", n_sm);
        CUDA_OK(cudaMalloc(&sink, sizeof(float) * n_sm * MAX_THREADS));
        CUDA_OK(cudaMalloc(&d_clk, sizeof(long long) * n_sm));
    }
    ~SmClocks() {
        cudaFree(sink);
        cudaFree(d_clk);
    }
    template <class Launch>
    double per_iter(int iters, Launch launch) {
        launch(iters / 10);
        launch(iters);
        CUDA_OK(cudaDeviceSynchronize());
        CUDA_OK(cudaMemcpy(h_clk, d_clk, sizeof(long long) * n_sm, cudaMemcpyDeviceToHost));
        double sum = 0;
        for (int i = 0; i < n_sm; i++) sum += (double)h_clk[i];
        return sum / n_sm / iters;
    }
};
// iters calls of step(), timed from inside one warpgroup (TRACE: its thread 0 in CTA 0): the start
// of each step of the window from TRACE_FROM (trace[0 ..]), and the whole loop's start and end
// (trace[TRACE_LEN - 2], trace[TRACE_LEN - 1]): the split and probe modes' warpgroup 1
template <bool TRACE, class Step>
__device__ __forceinline__ void timed_steps(int iters, long long *trace, Step step) {
    const bool rec = TRACE && blockIdx.x == 0 && (threadIdx.x & 127) == 0;
    if (rec) trace[TRACE_LEN - 2] = clock64();
    for (int it = 0; it < iters; it++) {
        if (rec && it >= TRACE_FROM && it < TRACE_FROM + TRACE_LEN - 2) trace[it - TRACE_FROM] = clock64();
        step();
    }
    if (rec) trace[TRACE_LEN - 1] = clock64();
}

// P̂ (pack_p's A fragments) into warpgroup tile sp (64 rows x 128 keys of E4M3, K-major, 128-byte
// swizzle: the layout the SS wgmma reads), then the proxy fence and the warpgroup's barrier (3 + wg)
// that order the stores before the wgmma's reads. Register q of k32 step kk: row 16 warp + g +
// 8 (q & 1), keys 32 kk + 16 (q >> 1) + 4 t .. + 3.
__device__ __forceinline__ void store_p_tile(uint32_t sp, const uint32_t (&pa)[4][4], int wg) {
    const int warp = (threadIdx.x >> 5) & 3, g = (threadIdx.x & 31) >> 2, t = threadIdx.x & 3;
#pragma unroll
    for (int kk = 0; kk < 4; kk++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            const uint32_t addr = sp + sw128(16 * warp + g + 8 * (q & 1), 32 * kk + 16 * (q >> 1) + 4 * t);
            asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(pa[kk][q]) : "memory");
        }
    fence_proxy_async();
    wg_bar_sync<3>(wg);
}
// The forward's tensor work of one key block for one warpgroup, always accumulating (with a fresh
// accumulator every block and nothing reading it, ptxas drops the wgmmas whose results the next
// block overwrites unread: 3 of 4 unrolled blocks had none), in one group: S = 4 k32 steps SS
// (m64n128); PV (with PV) = 4 k32 steps with A from registers (pa), or (PV_SS) from the shared
// tile of descriptor dp.
template <bool PV = true, bool PV_SS = false>
__device__ __forceinline__ void issue_block(float (&s)[64], float (&pv)[64], uint32_t da, uint32_t db,
                                            uint32_t (&pa)[4][4], uint32_t dp = 0) {
    reg_fence(s);
    reg_fence(pv);
    reg_fence(pa);  // (as the forward does for P̂: else ptxas injects warpgroup.arrive and may serialize)
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < 4; kk++) wg_fp8<128, 0, 0>(s, kmajor_desc(da + 2 * kk), kmajor_desc(db + 2 * kk), 1);
#pragma unroll
    for (int kk = 0; PV && kk < 4; kk++) {
        if (PV_SS) wg_fp8<128, 0, 0>(pv, kmajor_desc(dp + 2 * kk), kmajor_desc(db + 2 * kk), 1);
        else wg_fp8_rs<128, 0>(pv, pa[kk], kmajor_desc(db + 2 * kk), 1);
    }
    wgmma_commit();
}

// The real step without the matmuls (softmax, softmax_norescale, split_real's warpgroup 1): the
// step's softmax (bench_softmax_block) on fixed S values s0, the O update with fixed PV values, pack_p. The
// fences make s0 and P̂ opaque to the compiler every iteration, so nothing leaves the loop.
// TRACE: timed from inside (timed_steps).
template <bool RESCALE, bool TRACE = false>
__device__ __forceinline__ void softmax_alone(int iters, const StepArgs &a, float (&s0)[64], float (&o)[64],
                                              float (&pv)[64], uint32_t (&pa)[4][4], float (&m)[2], float (&l)[2],
                                              long long *trace = nullptr) {
    const int lane = threadIdx.x & 31;
    timed_steps<TRACE>(iters, trace, [&] {
        reg_fence(s0);
        reg_fence(pv);
        float s[64], alpha[2];
#pragma unroll
        for (int i = 0; i < 64; i++) s[i] = s0[i];
        bench_softmax_block<false>(s, m, l, alpha, a.tau_qk, a.log2_ps, 0, 0, 1 << 30, lane >> 2, lane & 3);
        if (RESCALE) o_rescale_add(o, pv, alpha);  // attention/fwd_fp8_step.cuh
        else o_add(o, pv);
        pack_p(pa, s);
        reg_fence(pa);
    });
}

// The kernel's plain loop (PP: with ping-pong, the turn passed at point PP: 1 after the issue,
// 2 once S_j is done, 3 after the softmax) around the real step, without its ring: S_j and
// PV_{j-1} as two wgmma groups, the softmax of S_j once S_j is done, PV_{j-1} waited for, O
// updated, P̂_j packed for the next block's PV. A and V are the same fixed tiles every block.
// NPOLY: the softmax's last NPOLY n-tiles' exponentials on the FMA pipe (bench_softmax_exp_part).
// WAITALL: S_j and PV_{j-1} both waited for before the softmax (no wgmma of the warp's own in
// flight while it computes; the other warpgroup's may be).
// BB: the softmax in a basic block of its own (nsmid_nonzero), so that ptxas cannot hoist PV_{j-1}'s
// wait above its exponentials (it does in plain_real: after 14 of the 64).
// TRACE: lane 0 of each consumer warp of CTA 0 records clock64 at the step's 6 points (loop top,
// wgmmas issued, S done, softmax done, PV done, P̂ packed), trace_point.
// QRS: S's A operand (Q̂) from registers qa (wg_fp8_rs_tile) instead of shared memory.
template <bool RESCALE, int PP, bool TRACE = false, bool SS = false, bool BB = false, bool WAITALL = false,
          int NPOLY = 0, bool QRS = false>
__device__ __forceinline__ void plain_real(int iters, const StepArgs &a, uint32_t da, uint32_t db, int wg,
                                           float (&s)[64], float (&o)[64], float (&pv)[64], uint32_t (&pa)[4][4],
                                           float (&m)[2], float (&l)[2], long long *trace = nullptr,
                                           uint32_t sp = 0, uint32_t (*qa)[4][4] = nullptr) {
    const int lane = threadIdx.x & 31;
    float alpha[2], alpha_prev[2] = {1.f, 1.f};
    if (PP && wg == 1) pp_pass(1);  // warpgroup 0 goes first
    for (int it = 0; it < iters; it++) {
        auto mark = [&](int point) { trace_point<TRACE>(trace, it, point); };
        mark(0);
        if (PP) pp_sync(wg);
        reg_fence(s);
        reg_fence(pv);
        reg_fence(pa);
        if constexpr (QRS) reg_fence(*qa);
        wgmma_fence();
        if constexpr (QRS) wg_fp8_rs_tile<128, 0, 4>(s, *qa, db);
        else issue_s<128>(s, da, db);
        wgmma_commit();
        if (SS) issue_s<128>(pv, kmajor_desc_lo(sp), db);  // PV from the P̂ tile: the same wgmmas as S's
        else issue_pv<128>(pv, pa, db);
        wgmma_commit();
        // hand the turn over (warpgroup 1 arrived once up front, so it skips its last)
        auto pass = [&](int point) {
            if (PP == point && !(wg == 1 && it == iters - 1)) pp_pass(wg);
        };
        pass(1);
        mark(1);
        if (WAITALL) wgmma_wait<0>();
        else wgmma_wait<1>();
        reg_fence(s);
        pass(2);
        mark(2);
        if (!BB) bench_softmax_block<false, NPOLY>(s, m, l, alpha, a.tau_qk, a.log2_ps, 0, 0, 1 << 30, lane >> 2, lane & 3);
        else if (nsmid_nonzero())  // a basic block of its own: PV's wait stays below it
            bench_softmax_block<false>(s, m, l, alpha, a.tau_qk, a.log2_ps, 0, 0, 1 << 30, lane >> 2, lane & 3);
        pass(3);
        mark(3);
        wgmma_wait<0>();
        reg_fence(pv);
        reg_fence(pa);
        mark(4);
        if (RESCALE) o_rescale_add(o, pv, alpha_prev);
        else o_add(o, pv);
        pack_p(pa, s);
        if (SS) store_p_tile(sp, pa, wg);
        alpha_prev[0] = alpha[0];
        alpha_prev[1] = alpha[1];
        mark(5);
    }
}

// The plain loop with the issue split (plain_split): S_{j+1} is issued as soon as P̂_j is packed
// (S_j's registers are free then), before the O update with PV_{j-1}; PV_j after it. ptxas waits
// for S_{j+1} before PV_j's issue (C7517: the O update reads the PV accumulator, a register a
// wgmma wrote, while S_{j+1} is in flight), so the form is: S_{j+1} under the O update, then PV_j
// under the softmax of S_{j+1}. The same registers (O, S, the PV accumulator, P̂) and values as
// plain_real. One step: issue S_{j+1}; O += PV_{j-1}; issue PV_j; the softmax of S_{j+1}; PV_j
// waited for; P̂_{j+1} packed (every wgmma waited for in its own step: across the loop's back
// edge ptxas serializes them, C7514). Trace points: top, S_{j+1} issued (1), S done, softmax
// done, PV done, packed, as plain_real's.
template <bool TRACE = false>
__device__ __forceinline__ void plain_split(int iters, const StepArgs &a, uint32_t da, uint32_t db, float (&s)[64],
                                            float (&o)[64], float (&pv)[64], uint32_t (&pa)[4][4], float (&m)[2],
                                            float (&l)[2], long long *trace = nullptr) {
    const int lane = threadIdx.x & 31;
    float alpha[2] = {1.f, 1.f}, alpha_prev[2] = {1.f, 1.f};
    for (int it = 0; it < iters; it++) {
        auto mark = [&](int point) { trace_point<TRACE>(trace, it, point); };
        mark(0);
        reg_fence(s);
        reg_fence(pa);
        wgmma_fence();
        issue_s<128>(s, da, db);  // S_{j+1}
        wgmma_commit();
        mark(1);
        o_rescale_add(o, pv, alpha_prev);  // PV_{j-1}
        alpha_prev[0] = alpha[0];
        alpha_prev[1] = alpha[1];
        reg_fence(pv);
        wgmma_fence();
        issue_pv<128>(pv, pa, db);  // PV_j
        wgmma_commit();
        wgmma_wait<1>();
        reg_fence(s);
        mark(2);
        if (nsmid_nonzero())  // a basic block of its own: PV_j's wait stays below it
            bench_softmax_block<false>(s, m, l, alpha, a.tau_qk, a.log2_ps, 0, 0, 1 << 30, lane >> 2, lane & 3);
        mark(3);
        wgmma_wait<0>();
        reg_fence(pv);
        reg_fence(pa);
        mark(4);
        pack_p(pa, s);
        mark(5);
    }
}

// The overlap loop (S_{j+1} issued before the softmax of S_j): sc holds S_j, its row max done
// (bias, alpha of block j); one step: issue S_{j+1} into sn; the exponentials of S_j
// (bench_softmax_exp); pack P̂_j; issue PV_j into sc (the fresh PV accumulator is
// S_j's registers); then FORM 0: wait for both, S_{j+1}'s row max, O = O * alpha_j + PV_j; FORM 1 (overlap_split): wait for S_{j+1} only, its row max while PV_j runs, then wait for
// PV_j; FORM 2 (overlap_interleave): as 1, with S_{j+1}'s 4 wgmmas issued one at a time between
// quarters of S_j's exponentials.
template <int FORM>
__device__ __forceinline__ void overlap_step(const StepArgs &a, uint32_t da, uint32_t db, float (&sc)[64],
                                             float (&sn)[64], float (&o)[64], uint32_t (&pa)[4][4], float (&m)[2],
                                             float (&l)[2], float (&alpha)[2], float (&bias)[2]) {
    const int lane = threadIdx.x & 31;
    reg_fence(sn);
    wgmma_fence();
    if constexpr (FORM == 2) {  // S_{j+1}'s k-step kk before each quarter of S_j's exponentials
        softmax_exp_interleaved<false>(sc, l, alpha, bias, a.tau_qk, [&](int kk) {
            wg_fp8<128, 0, 0>(sn, kmajor_desc(da + 2 * kk), kmajor_desc(db + 2 * kk), kk > 0);
            if (kk == 3) wgmma_commit();
        });
    } else {
        issue_s<128>(sn, da, db);
        wgmma_commit();
        bench_softmax_exp<false>(sc, l, alpha, bias, a.tau_qk);
    }
    const float a_j[2] = {alpha[0], alpha[1]};  // O's factor (softmax_max overwrites alpha below)
    pack_p(pa, sc);
    reg_fence(sc);
    reg_fence(pa);
    wgmma_fence();
    issue_pv<128>(sc, pa, db);
    wgmma_commit();
    if (FORM != 0) {
        wgmma_wait<1>();
        reg_fence(sn);
        softmax_max<false>(sn, m, alpha, bias, a.tau_qk, a.log2_ps, 0, 0, 1 << 30, lane >> 2, lane & 3);
        wgmma_wait<0>();
        reg_fence(sc);
        reg_fence(pa);
    } else {
        wgmma_wait<0>();
        reg_fence(sc);
        reg_fence(sn);
        reg_fence(pa);
        softmax_max<false>(sn, m, alpha, bias, a.tau_qk, a.log2_ps, 0, 0, 1 << 30, lane >> 2, lane & 3);
    }
    o_rescale_add(o, sc, a_j);
}

// The overlap loop's driver (overlap_step's FORM): S_0 and its row max, then two steps per turn
// (the accumulators swap roles).
template <int FORM>
__device__ __forceinline__ void overlap_real(int iters, const StepArgs &a, uint32_t da, uint32_t db, float (&sa)[64],
                                             float (&sb)[64], float (&o)[64], uint32_t (&pa)[4][4], float (&m)[2],
                                             float (&l)[2]) {
    const int lane = threadIdx.x & 31;
    float alpha[2], bias[2];
    reg_fence(sa);
    wgmma_fence();
    issue_s<128>(sa, da, db);  // S_0 and its row max
    wgmma_commit();
    wgmma_wait<0>();
    reg_fence(sa);
    softmax_max<false>(sa, m, alpha, bias, a.tau_qk, a.log2_ps, 0, 0, 1 << 30, lane >> 2, lane & 3);
    for (int it = 0; it < iters; it += 2) {  // two steps per turn: the accumulators swap roles
        overlap_step<FORM>(a, da, db, sa, sb, o, pa, m, l, alpha, bias);
        overlap_step<FORM>(a, da, db, sb, sa, o, pa, m, l, alpha, bias);
    }
}

// issue_*: a block's wgmmas issued (S_ONLY: S's 4) and waited for, iters times; thread 0 of each
// working warpgroup of CTA 0 adds up the clocks of the issue (fence to last wgmma) and of the
// wait, into trace[2 wg], trace[2 wg + 1]
template <bool S_ONLY>
__device__ __forceinline__ void issue_timed(int iters, uint32_t da, uint32_t db, int wg, float (&s)[64], float (&pv)[64],
                                            uint32_t (&pa)[4][4], long long *trace) {
    long long t_issue = 0, t_wait = 0;
    for (int it = 0; it < iters; it++) {
        const long long t0 = clock64();
        issue_block<!S_ONLY>(s, pv, da, db, pa);
        const long long t1 = clock64();
        wgmma_wait<0>();
        reg_fence(s);
        reg_fence(pv);
        reg_fence(pa);
        const long long t2 = clock64();
        t_issue += t1 - t0;
        t_wait += t2 - t1;
    }
    if (blockIdx.x == 0 && (threadIdx.x & 127) == 0) {
        trace[2 * wg] = t_issue / iters;
        trace[2 * wg + 1] = t_wait / iters;
    }
}

// plain_interleave's step loop (see the list at the top)
__device__ __forceinline__ void plain_interleave(int iters, const StepArgs &a, uint32_t da, uint32_t db, float (&s)[64],
                                                 float (&o)[64], float (&pv)[64], uint32_t (&pa)[4][4], float (&m)[2],
                                                 float (&l)[2]) {
    const int lane = threadIdx.x & 31;
    float alpha[2], bias[2], alpha_prev[2] = {1.f, 1.f};
    for (int it = 0; it < iters; it++) {
        reg_fence(s);
        wgmma_fence();
        issue_s<128>(s, da, db);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(s);
        softmax_max<false>(s, m, alpha, bias, a.tau_qk, a.log2_ps, 0, 0, 1 << 30, lane >> 2, lane & 3);
        reg_fence(pv);
        reg_fence(pa);
        wgmma_fence();
        softmax_exp_interleaved<false>(s, l, alpha, bias, a.tau_qk, [&](int kk) {  // PV's k-step kk first
            wg_fp8_rs<128, 0>(pv, pa[kk], kmajor_desc(db + 2 * kk), kk > 0);
            if (kk == 3) wgmma_commit();
        });
        wgmma_wait<0>();
        reg_fence(pv);
        reg_fence(pa);
        o_rescale_add(o, pv, alpha_prev);
        pack_p(pa, s);
        alpha_prev[0] = alpha[0];
        alpha_prev[1] = alpha[1];
    }
}

