// bench_fwd_fp8_wg.cu: does a third consumer warpgroup (three warps per scheduler instead of two)
// shorten the FP8 forward's loop? The loop is latency-bound per warpgroup (the chain S wait ->
// softmax -> O update, the work beside the tensor cores slowed while they run:
// docs/fp8-attention-kernels.md §11), which more warps per scheduler could hide. Three consumer
// warpgroups fit the register file only at ~160 registers each, so the kernel's plain step (O 64 +
// S 64 + the PV accumulator 64 + P̂ 16) does not fit; the serial step does: S_j issued and waited
// for, its softmax, P̂_j packed, PV_j issued into S_j's own registers (S is dead once packed) and
// waited for, O updated: O 64 + S 64 + P̂ 16.
// The same functions as the kernel (attention/fwd_fp8_step.cuh), on fixed shared tiles, one CTA
// per SM, no ring (compare bench_mufu_qgmma.cu's plain_real: 1875 clocks per two key blocks).
//   forms: wg2_plain   the kernel's plain step, 2 warpgroups (the reference)
//          wg2_serial  the serial step, 2 warpgroups
//          wg3_serial  the serial step, 3 warpgroups (at most 168 registers: ptxas -v says what it used)
//          wg3_serial160  the same capped at 160 registers (what a producer warpgroup would leave)
//          wg2_plain_qrs, wg3_serial_qrs  S's A operand (Q̂) from registers (wg_fp8_rs_tile): the wgmmas
//                      then read only K̂ and V̂^T from shared memory (is it shared memory's traffic
//                      that slows the work beside the tensor cores?)
//          wg2_plain_norescale, wg3_serial_norescale  the O update without the rescale (O + PV:
//                      64 FADD instead of 64 FFMA), timing only
// Prints clocks per iteration (every warpgroup one key block of 64 rows) and per two key blocks
// (the unit of bench_mufu_qgmma.cu's table).
//   build (GPU machine): nvcc -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -I. -Xptxas -v
//                        dev/bench/bench_fwd_fp8_wg.cu core/common.c -o /tmp/bench_fwd_fp8_wg
//   run: /tmp/bench_fwd_fp8_wg [iterations]
//   or on the GPU machine: bash scripts/gpu.sh bench bench_fwd_fp8_wg [iterations]
#include <cuda_runtime.h>  // launches
#include <math.h>          // INFINITY
#include <stdint.h>        // uint8_t, uint32_t
#include <stdio.h>         // printf
#include <stdlib.h>        // atoi

#include "attention/fwd_fp8_step.cuh"  // issue_s, issue_pv, softmax_max, pack_p, o_rescale_add
#include "attention/common.cuh"        // wgmma fences, reg_fence, kmajor_desc_lo, smem_addr, CUDA_OK
#include "bench_fwd_fp8_loops.cuh"     // StepArgs, plain_real, cta_time, SmClocks

enum { F_WG2_PLAIN, F_WG2_SERIAL, F_WG3_SERIAL, F_WG3_SERIAL160, F_WG2_PLAIN_QRS, F_WG3_SERIAL_QRS,
       F_WG2_PLAIN_NORESCALE, F_WG3_SERIAL_NORESCALE, N_FORMS };
static const char *const form_names[N_FORMS] = {"wg2_plain", "wg2_serial", "wg3_serial", "wg3_serial160",
                                                "wg2_plain_qrs", "wg3_serial_qrs", "wg2_plain_norescale",
                                                "wg3_serial_norescale"};
__host__ __device__ constexpr int form_wgs(int f) {
    return f == F_WG3_SERIAL || f == F_WG3_SERIAL160 || f == F_WG3_SERIAL_QRS || f == F_WG3_SERIAL_NORESCALE ? 3 : 2;
}
__host__ __device__ constexpr bool form_qrs(int f) { return f == F_WG2_PLAIN_QRS || f == F_WG3_SERIAL_QRS; }

// The serial step, iters times: S_j = A B (4 SS wgmmas, or QRS: A from registers qa; waited for), softmax_block, P̂_j packed,
// PV_j = P̂_j B into S_j's registers (4 RS wgmmas, waited for), O = O * alpha + PV_j (o_rescale_add).
template <bool QRS, bool RESCALE = true>
__device__ __forceinline__ void serial_loop(int iters, const StepArgs &a, uint32_t da, uint32_t db, float (&s)[64],
                                            float (&o)[64], uint32_t (&pa)[4][4], float (&m)[2], float (&l)[2],
                                            uint32_t (&qa)[4][4]) {
    const int lane = threadIdx.x & 31;
    float alpha[2];
    for (int it = 0; it < iters; it++) {
        reg_fence(s);
        if constexpr (QRS) reg_fence(qa);
        wgmma_fence();
        if constexpr (QRS) wg_fp8_rs_tile<128, 0, 4>(s, qa, db);
        else issue_s<128>(s, da, db);
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(s);
        bench_softmax_block<false>(s, m, l, alpha, a.tau_qk, a.log2_ps, 0, 0, 1 << 30, lane >> 2, lane & 3);
        pack_p(pa, s);
        reg_fence(s);
        reg_fence(pa);
        wgmma_fence();
        issue_pv<128>(s, pa, db);  // into S's registers: a fresh accumulator
        wgmma_commit();
        wgmma_wait<0>();
        reg_fence(s);
        reg_fence(pa);
        if (RESCALE) o_rescale_add(o, s, alpha);
        else o_add(o, s);
    }
}

template <int FORM>
__device__ __forceinline__ void body(int iters, StepArgs a, float *sink, long long *clocks) {
    constexpr int NWG = form_wgs(FORM);
    // A (NWG warpgroups x 64 rows), B (128 rows)
    __shared__ __align__(1024) uint8_t tiles[3 * 64 * 128 + 128 * 128];
    for (int i = threadIdx.x; i < (int)sizeof tiles; i += blockDim.x) tiles[i] = (uint8_t)(0x20 + (i * 37) % 0x18);
    fence_proxy_async();  // the generic-proxy writes -> the wgmmas' reads
    __syncthreads();
    const int wg = threadIdx.x / 128;
    const uint32_t da = kmajor_desc_lo(smem_addr(tiles + wg * 64 * 128)), db = kmajor_desc_lo(smem_addr(tiles + NWG * 64 * 128));
    uint32_t pa[4][4], qa[4][4];  // P̂, and Q̂ as A fragments (the _qrs forms)
#pragma unroll
    for (int k = 0; k < 4; k++)
#pragma unroll
        for (int q = 0; q < 4; q++) {
            pa[k][q] = 0x28282828u + (uint32_t)(threadIdx.x + k + q);
            qa[k][q] = 0x30303030u + (uint32_t)(threadIdx.x ^ (k + q));
        }
    float s[64], o[64], pv[64], m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};
#pragma unroll
    for (int i = 0; i < 64; i++) s[i] = o[i] = pv[i] = 0.f;
    __syncthreads();
    const long long t0 = clock64();
    if (FORM == F_WG2_PLAIN) plain_real<true, 0>(iters, a, da, db, wg, s, o, pv, pa, m, l);
    else if (FORM == F_WG2_PLAIN_QRS)
        plain_real<true, 0, false, false, false, false, 0, true>(iters, a, da, db, wg, s, o, pv, pa, m, l, nullptr, 0, &qa);
    else if (FORM == F_WG2_PLAIN_NORESCALE) plain_real<false, 0>(iters, a, da, db, wg, s, o, pv, pa, m, l);
    else serial_loop<form_qrs(FORM), FORM != F_WG3_SERIAL_NORESCALE>(iters, a, da, db, s, o, pa, m, l, qa);
    // the CTA's time: the latest warp's end, each read after its checksum (cta_time)
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < 64; i++) acc += s[i] + pv[i] + o[i];
    acc += m[0] + m[1] + l[0] + l[1] + (float)(pa[0][0] ^ pa[3][3]);
    cta_time(acc, t0, sink, clocks);
}
template <int FORM>
__global__ void __launch_bounds__(form_wgs(FORM) * 128, 1) wg_kernel(int iters, StepArgs a, float *sink, long long *clocks) {
    body<FORM>(iters, a, sink, clocks);
}
// the 160-register cap of a kernel whose producer warpgroup keeps 24 (65536 - 128 * 24 = 62464
// = 384 * 162.7, rounded down to setmaxnreg's multiple of 8)
__global__ void __maxnreg__(160) wg_kernel_160(int iters, StepArgs a, float *sink, long long *clocks) {
    body<F_WG3_SERIAL160>(iters, a, sink, clocks);
}

template <int FORM>  // every form from FORM on
static void run_forms(double (&c)[N_FORMS], SmClocks<384> &b, int iters, StepArgs a) {
    c[FORM] = b.per_iter(iters, [&](int n) {
        if (FORM == F_WG3_SERIAL160) wg_kernel_160<<<b.n_sm, 384>>>(n, a, b.sink, b.d_clk);
        else wg_kernel<FORM><<<b.n_sm, form_wgs(FORM) * 128>>>(n, a, b.sink, b.d_clk);
    });
    if constexpr (FORM + 1 < N_FORMS) run_forms<FORM + 1>(c, b, iters, a);
}

int main(int argc, char **argv) {
    const int iters = argc > 1 ? atoi(argv[1]) : 4000;
    SmClocks<384> b;
    const StepArgs a = {0.05f, 8.0f};  // as bench_mufu_qgmma.cu's
    double c[N_FORMS];
    run_forms<0>(c, b, iters, a);
    printf("# %s, %d SMs, %d iterations; one iteration: every warpgroup one key block (64 rows x 128 keys)\n",
           b.prop.name, b.n_sm, iters);
    printf("| form | warpgroups | clocks / iteration | clocks / 2 key blocks | vs wg2_plain |\n|---|---|---|---|---|\n");
    for (int f = 0; f < N_FORMS; f++) {
        const double per2 = c[f] * 2.0 / form_wgs(f);
        printf("| %s | %d | %.0f | %.0f | %.2f |\n", form_names[f], form_wgs(f), c[f], per2, per2 / c[F_WG2_PLAIN]);
    }
    return 0;
}
