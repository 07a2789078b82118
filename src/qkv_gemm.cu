// qkv_gemm.cu: the QKV projection as a wgmma GEMM with a quantizing epilogue (interface and
// layouts: qkv_gemm.h).
//
// Structure (one persistent CTA per SM, 384 threads):
//   - warpgroup 0, the producer: one thread copies, per 64-wide K block, the CTA's x rows and W's
//     128 x 64 tile by TMA (128-byte swizzle, the layout wgmma's K-major descriptors read) into a
//     ring of stages, each with a full barrier (TMA bytes) and an empty one (the consuming warps);
//   - warpgroups 1 and 2, the consumers; consumer cw's 128 x 128 output tile is one scale block of
//     one head. Two forms (QgForm):
//       cooperative (the default): the CTA's tile is 256 x 128, consumer cw its rows 128 cw ..;
//         both read every stage (x 256 x 64, W 128 x 64: 48 KB, 4 stages), so W's tile serves
//         two consumers, but their epilogues run at the same time, with the tensor cores idle;
//       ping-pong: each consumer owns every other tile of the CTA (tiles c + k G, G CTAs,
//         consumer k % 2; stages of 32 KB, 5 of them); the ring takes the tiles' K blocks in the
//         CTA's tile order and a consumer's mainloop starts when the other's has issued its last
//         matmuls (order barriers, below): one warpgroup's epilogue runs under the other's
//         matmuls, the ping-pong of CUTLASS's Hopper kernels, for 4/3 of the L2 traffic.
//     Measured (docs/perf.md, stop 36): cooperative 592-635 TFLOP/s with the quantizing epilogue,
//     ping-pong 569-620, cuBLASLt's BF16 GEMM of the same shapes 714-765.
// Mainloop per K block: 4 k16 steps x 2 wgmma m64n128k16 (rows 0-63 and 64-127 of the tile share
// W's tile), one commit group per block; after the next block's group is issued, the previous
// one is waited for and its stage released.
//
// Accumulator layout (m64n128k16, per 64-row half h): thread (warp w, lane 4 g + t4) holds rows
// 64 h + 16 w + g + 8 rr (rr = 0, 1) and columns 8 j + 2 t4 + e (j = 0..15, e = 0, 1) in
// acc[h][4 j + 2 rr + e]. Column i < 64 of a head pairs with i + 64 for RoPE: j and j + 8, the
// same thread, so RoPE needs no shuffles.
//
// The quantizing epilogue stages the tile's codes once in shared memory (16 KB per consumer),
// in a layout both of its readers can read without bank conflicts: 32-bit word w of token row r
// at word w ^ 4 s(r), s(r) = (r ^ (r >> 3)) & 7 (a 16-byte chunk c at c ^ s(r)). The row-major
// codes of a (b, h, block) are 16 KB contiguous in (B, H, T, 128): 16-byte loads and stores, a
// warp's 32 covering four whole rows. The transposed codes: each lane reads one word of four
// consecutive rows, transposes the 4 x 4 bytes (transpose4x4) and stores 4 bytes to each of 4
// rows of codes_t; a warp's store covers one 32-byte sector of each of 4 rows.
#include "qkv_gemm.h"

#include <cuda.h>          // CUtensorMap (types only)
#include <cuda_runtime.h>  // launches, cudaFuncSetAttribute
#include <stdint.h>        // uint8_t, uint32_t, uintptr_t
#include <string.h>        // memset

#include "attention_cpu.h"           // attn_scale_max_exp (V's scale bound), CAST_*
#include "attention_gpu_common.cuh"  // wgmma, descriptors, mbarriers, TMA, named barriers, setmaxnreg, CUDA_OK
#include "common.h"                  // FATAL
#include "fp8.h"                     // fp8_scale_for_amax_within
#include "fp8_cvt.cuh"               // cvt_e4m3x2, transpose4x4
#include "layers_math.cuh"           // lm_rope_lo / lm_rope_hi, lm_f2bf: rope_forward_gpu's element math
#include "tensor_map.h"              // tensor_map_2d

#define QG_TILE 128                        // a consumer's tile: rows (tokens) = columns = head dim
#define QG_BK 64                           // K per stage: one 128-byte swizzled row of BF16
#define QG_THREADS 384
#define QG_W_BYTES (QG_TILE * QG_BK * 2)   // 16 KB: W's tile of one stage
#define QG_STAGING_BYTES (QG_TILE * QG_TILE)  // one consumer's 128 x 128 codes

// The two forms (QG_FORM_*): ping-pong (each consumer its own 128 x 128 tile, the tiles' K blocks
// one ring in the CTA's tile order, 5 stages of 32 KB) and cooperative (the CTA's tile is 256 x
// 128, consumer cw its rows 128 cw .., both reading every stage's W tile: 4 stages of 48 KB, a
// third less L2 traffic per FLOP, but the epilogues of both consumers at once).
enum { QG_FORM_PINGPONG = 0, QG_FORM_COOP = 1 };
template <int FORM> struct QgForm {
    static constexpr bool COOP = FORM == QG_FORM_COOP;
    static constexpr int BM = COOP ? 2 * QG_TILE : QG_TILE;  // rows of x per stage (the CTA's tile rows)
    static constexpr int STAGES = COOP ? 4 : 5;
    static constexpr int X_BYTES = BM * QG_BK * 2;
    static constexpr int STAGE_BYTES = X_BYTES + QG_W_BYTES;
    static constexpr int RING_BYTES = STAGES * STAGE_BYTES;
    static constexpr int BARS_OFF = RING_BYTES + 2 * QG_STAGING_BYTES;
    static constexpr int SMEM_BYTES = BARS_OFF + 2 * STAGES * 8 + 8 * 4 + 1024;  // + the alignment slack
    static constexpr int EMPTY_ARRIVALS = COOP ? 8 : 4;  // the consuming warps of a stage
};

struct QgArgs {
    int n_tn, n_tiles, nk;  // column tiles, tiles, K blocks
    // BF16 form
    bf16 *y;
    int ldy;
    // both forms: RoPE on the columns < 2 C (q, k) when rope is set
    const float *rope;
    int T, C, H;
    // quantizing form
    uint8_t *codes[3], *codes_t[3];
    float *scales[3];
    int max_exp[3];
};

// BF16 rounding by the hardware conversion (fp8.h's bf16_round is the same RNE in integer steps)
__device__ __forceinline__ float qg_bf16(float x) { return __bfloat162float(lm_f2bf(x)); }

// The tile's FP32 sums as BF16 values (as a BF16 GEMM would output them), then RoPE on q and k:
// token t0 + row, column pair (i, i + 64) for i = 8 j + 2 t4 + e < 64.
__device__ __forceinline__ void round_and_rotate(float (&acc)[2][64], const float *rope, int t0, int warp, int g,
                                                 int t4) {
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int i = 0; i < 64; i++) acc[h][i] = qg_bf16(acc[h][i]);
    if (!rope) return;
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const int t = t0 + 64 * h + 16 * warp + g + 8 * rr;
#pragma unroll
            for (int j = 0; j < 8; j++) {
                // (cos, sin) of pairs 8 j + 2 t4 and the next one
                const float4 cs = *reinterpret_cast<const float4 *>(rope + ((size_t)t * 64 + 8 * j + 2 * t4) * 2);
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float x = acc[h][4 * j + 2 * rr + e], y = acc[h][4 * (j + 8) + 2 * rr + e];
                    const float c = e ? cs.z : cs.x, sn = e ? cs.w : cs.y;
                    acc[h][4 * j + 2 * rr + e] = qg_bf16(lm_rope_lo(x, y, c, sn));
                    acc[h][4 * (j + 8) + 2 * rr + e] = qg_bf16(lm_rope_hi(x, y, c, sn));
                }
            }
        }
}

// The staging layout's swizzle of token row r (see the file comment), in 16-byte chunks.
__device__ __forceinline__ int stage_swz(int r) { return (r ^ (r >> 3)) & 7; }

// The quantizing epilogue of consumer cw's tile (rows m0.., columns n0..).
__device__ __forceinline__ void epilogue_quant(float (&acc)[2][64], const QgArgs &a, int m0, int n0, int cw, int wtid,
                                               uint8_t *stg, float *red) {
    const int warp = wtid >> 5, lane = wtid & 31, g = lane >> 2, t4 = lane & 3;
    const int which = n0 / a.C, head = (n0 % a.C) / QG_TILE, b = m0 / a.T, t0 = m0 % a.T;
    const int nblk = a.T / QG_TILE, bh = b * a.H + head, blk = t0 / QG_TILE;
    round_and_rotate(acc, which < 2 ? a.rope : nullptr, t0, warp, g, t4);

    // the block's amax (max is exact in any order) -> its scale, the same in every thread
    float mx = 0.0f;
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int i = 0; i < 64; i++) mx = fmaxf(mx, fabsf(acc[h][i]));
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, o));
    if (lane == 0) red[4 * cw + warp] = mx;
    wg_bar_sync<1>(cw);  // also: the previous tile's staging reads are done
    mx = fmaxf(fmaxf(red[4 * cw], red[4 * cw + 1]), fmaxf(red[4 * cw + 2], red[4 * cw + 3]));
    const float s = fp8_scale_for_amax_within(FP8_E4M3, mx, a.max_exp[which]);
    if (wtid == 0) a.scales[which][(long)bh * nblk + blk] = s;

    // the codes into the staging area: two codes (columns 8 j + 2 t4, + 1) per 2-byte store
    const uint32_t sbase = smem_addr(stg);
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const int r = 64 * h + 16 * warp + g + 8 * rr, sw = 4 * stage_swz(r);
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const uint32_t u = cvt_e4m3x2(acc[h][4 * j + 2 * rr] * s, acc[h][4 * j + 2 * rr + 1] * s);
                const int w = 2 * j + (t4 >> 1);
                const uint32_t addr = sbase + r * 128 + ((w ^ sw) << 2) + 2 * (t4 & 1);
                asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"((uint16_t)u) : "memory");
            }
        }
    wg_bar_sync<1>(cw);

    // row-major codes: the block's 16 KB, contiguous
    uint8_t *codes = a.codes[which] + ((long)bh * a.T + t0) * QG_TILE;
#pragma unroll
    for (int it = 0; it < 8; it++) {
        const int idx = it * 128 + wtid, r = idx >> 3, c = idx & 7;
        const uint4 v = *reinterpret_cast<const uint4 *>(stg + r * 128 + ((c ^ stage_swz(r)) << 4));
        *reinterpret_cast<uint4 *>(codes + (long)idx * 16) = v;
    }
    // transposed codes: lane (tl, wl) = (lane / 4, lane % 4), rows 32 warp + 4 tl .. + 3, word 4 p + wl
    const int tl = lane >> 2, wl = lane & 3, r0 = 32 * warp + 4 * tl;
    uint8_t *codes_t = a.codes_t[which] + (long)bh * QG_TILE * a.T + t0 + r0;
#pragma unroll
    for (int p = 0; p < 8; p++) {
        const int w = 4 * p + wl;
        uint32_t x[4];
#pragma unroll
        for (int v = 0; v < 4; v++) {
            const int r = r0 + v;
            x[v] = *reinterpret_cast<const uint32_t *>(stg + r * 128 + ((w ^ (4 * stage_swz(r))) << 2));
        }
        uint32_t out[4];
        transpose4x4(x[0], x[1], x[2], x[3], out);  // out[k]: column 4 w + k, rows r0 .. r0 + 3
#pragma unroll
        for (int k = 0; k < 4; k++) *reinterpret_cast<uint32_t *>(codes_t + (long)(4 * w + k) * a.T) = out[k];
    }
}

// The BF16 epilogue (tests): rounded, rotated values straight from registers.
__device__ __forceinline__ void epilogue_bf16(float (&acc)[2][64], const QgArgs &a, int m0, int n0, int wtid) {
    const int warp = wtid >> 5, lane = wtid & 31, g = lane >> 2, t4 = lane & 3;
    round_and_rotate(acc, a.rope && n0 < 2 * a.C ? a.rope : nullptr, a.rope ? m0 % a.T : 0, warp, g, t4);
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            bf16 *row = a.y + (long)(m0 + 64 * h + 16 * warp + g + 8 * rr) * a.ldy + n0 + 2 * t4;
#pragma unroll
            for (int j = 0; j < 16; j++)
                *reinterpret_cast<uint32_t *>(row + 8 * j) = pack_bf16(acc[h][4 * j + 2 * rr], acc[h][4 * j + 2 * rr + 1]);
        }
}

// The consumers' order barriers. A full barrier's wait names a phase by its parity only, so a
// consumer must never wait on a stage's use u while use u - 1 (the other consumer's, one tile
// earlier in the ring) has not completed: the wait would see use u - 2's phase and pass at once
// (at the start, a consumer whose first stage is a second use would read an empty stage). So
// tile k's mainloop (k > 0) starts only after the consumer of tile k - 1 has passed all of that
// tile's full barriers: named barrier 3 (consumer 0 waits, consumer 1 releases) and 4 (the other
// way), 128 arrivals + 128 syncs each. Every earlier ring block has then been seen complete, and
// the consumers' mainloops alternate (ping-pong), each epilogue under the other's matmuls.
__device__ __forceinline__ void order_wait(int cw) {
    if (cw == 0) named_bar_sync<3, 256>();
    else named_bar_sync<4, 256>();
}
__device__ __forceinline__ void order_release(int cw) {
    if (cw == 0) named_bar_arrive<4, 256>();
    else named_bar_arrive<3, 256>();
}

template <bool QUANT, int FORM>
__global__ void __launch_bounds__(QG_THREADS, 1)
    qkv_gemm_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                    const QgArgs a) {
    using F = QgForm<FORM>;
    constexpr int S = F::STAGES;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint8_t *smem = smem_align1024(smem_raw);
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + F::BARS_OFF), *empty = full + S;
    float *red = reinterpret_cast<float *>(empty + S);  // 2 x 4 warp maxima
    const int G = gridDim.x;
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            mbar_init(&full[s], 1);                   // the producer's arrive (with the TMA bytes)
            mbar_init(&empty[s], F::EMPTY_ARRIVALS);  // the consuming warps
        }
        mbar_fence_init();
    }
    __syncthreads();

    if (threadIdx.x < 128) {
        // ---- producer
        setmaxnreg_dec<40>();
        if (threadIdx.x == 0) {
            unsigned q = 0;  // ring block: stage q % S, its (q / S)-th use
            for (int tile = blockIdx.x; tile < a.n_tiles; tile += G) {
                const int tm = tile / a.n_tn, tn = tile % a.n_tn;
                for (int kb = 0; kb < a.nk; kb++, q++) {
                    const int s = q % S;
                    mbar_wait(&empty[s], ((q / S) & 1) ^ 1);  // a fresh barrier passes parity 1
                    mbar_arrive_expect_tx(&full[s], F::STAGE_BYTES);
                    uint8_t *st = smem + s * F::STAGE_BYTES;
                    tma_load_2d(st, &tm_x, &full[s], kb * QG_BK, tm * F::BM);
                    tma_load_2d(st + F::X_BYTES, &tm_w, &full[s], kb * QG_BK, tn * QG_TILE);
                }
            }
        }
    } else {
        // ---- consumers
        setmaxnreg_inc<232>();
        const int cw = ((int)threadIdx.x - 128) >> 7, wtid = threadIdx.x & 127, lane = wtid & 31;
        // descriptor low words of stage 0: this consumer's 128 rows of x (cooperative: rows 128 cw ..)
        const uint32_t d0 = kmajor_desc_lo(smem_addr(smem + (F::COOP ? cw * QG_TILE * 128 : 0)));
        const uint32_t dw0 = kmajor_desc_lo(smem_addr(smem + F::X_BYTES));
        uint8_t *stg = smem + F::RING_BYTES + cw * QG_STAGING_BYTES;
        // ping-pong: consumer cw takes the CTA's tiles k = cw, cw + 2, ..; cooperative: every tile
        for (int k = F::COOP ? 0 : cw;; k += F::COOP ? 1 : 2) {
            const int tile = blockIdx.x + k * G;
            if (tile >= a.n_tiles) break;
            const unsigned q0 = (unsigned)k * a.nk;
            // ping-pong order: this tile's mainloop waits until the other consumer's tile k - 1 has
            // passed all its full barriers (see order_wait)
            if (!F::COOP && k > 0) order_wait(cw);
            float acc[2][64];
            for (int kb = 0; kb < a.nk; kb++) {
                const unsigned q = q0 + kb;
                const int s = q % S;
                mbar_wait(&full[s], (q / S) & 1);
                const uint32_t da = d0 + s * (F::STAGE_BYTES / 16), db = dw0 + s * (F::STAGE_BYTES / 16);
                wgmma_fence();
#pragma unroll
                for (int kk = 0; kk < QG_BK / 16; kk++) {  // 32 bytes per k16 step
                    const int accum = kb > 0 || kk > 0;
                    wgmma_m64n128_ss(acc[0], kmajor_desc(da + 2 * kk), kmajor_desc(db + 2 * kk), accum);
                    wgmma_m64n128_ss(acc[1], kmajor_desc(da + 64 * 128 / 16 + 2 * kk), kmajor_desc(db + 2 * kk), accum);
                }
                wgmma_commit();
                wgmma_wait<1>();  // the previous block's matmuls are done: its stage is free
                if (kb > 0 && lane == 0) mbar_arrive(&empty[(q - 1) % S]);
            }
            if (!F::COOP && tile + G < a.n_tiles) order_release(cw);  // the other consumer's tile k + 1 may start
            wgmma_wait<0>();
            reg_fence(acc[0]);  // the epilogue reads acc only after the wait (no hoisting above it)
            reg_fence(acc[1]);
            if (lane == 0) mbar_arrive(&empty[(q0 + a.nk - 1) % S]);
            const int m0 = tile / a.n_tn * F::BM + (F::COOP ? cw * QG_TILE : 0), n0 = tile % a.n_tn * QG_TILE;
            if constexpr (QUANT) epilogue_quant(acc, a, m0, n0, cw, wtid, stg, red);
            else epilogue_bf16(acc, a, m0, n0, wtid);
        }
    }
}

// --- launchers ---------------------------------------------------------------------------------

static void check_gemm(const char *who, const void *x, const void *w, int M, int N, int K) {
    if (M <= 0 || N <= 0 || K <= 0 || M % QG_TILE || N % QG_TILE || K % QG_BK)
        FATAL("%s: shape M=%d N=%d K=%d (M and N must be positive multiples of %d, K of %d)", who, M, N, K, QG_TILE,
              QG_BK);
    if (!x || !w || (uintptr_t)x % 16 || (uintptr_t)w % 16)
        FATAL("%s: x and W must be 16-byte aligned device pointers", who);
}

// The form a launch uses: the test hook's (qkv_gemm_test_form), else the environment's
// (QKV_GEMM_COOP=0: ping-pong), else cooperative, the default, measured (docs/perf.md, stop 36:
// 592-635 TFLOP/s with the quantizing epilogue against ping-pong's 569-602, C 1536 / 2048 / 3072).
// attn_form_on / attn_env_switch: the attention kernels' switches, the same precedence.
static int qkv_gemm_test_form_kind = -1;
extern "C" void qkv_gemm_test_form(int form) { qkv_gemm_test_form_kind = form; }
static int form_of(int M) {
    static const bool env_coop = attn_env_switch("QKV_GEMM_COOP");
    const bool coop = attn_form_on(qkv_gemm_test_form_kind, env_coop);
    return coop && M % (2 * QG_TILE) == 0 ? QG_FORM_COOP : QG_FORM_PINGPONG;  // 256-row CTA tiles need M % 256 == 0
}

template <bool QUANT, int FORM>
static void launch_form(QgArgs a, const uint16_t *x, const uint16_t *w, int M, int N, int K, cudaStream_t stream) {
    using F = QgForm<FORM>;
    static bool attr_set = false;
    if (!attr_set) {
        CUDA_OK(cudaFuncSetAttribute(qkv_gemm_kernel<QUANT, FORM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     F::SMEM_BYTES));
        attr_set = true;
    }
    const CUtensorMapDataType bf = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    const CUtensorMap tm_x = tensor_map_2d("the QKV GEMM's x", bf, x, K, M, 2L * K, QG_BK, F::BM,
                                           CU_TENSOR_MAP_SWIZZLE_128B);
    const CUtensorMap tm_w = tensor_map_2d("the QKV GEMM's W", bf, w, K, N, 2L * K, QG_BK, QG_TILE,
                                           CU_TENSOR_MAP_SWIZZLE_128B);
    a.n_tn = N / QG_TILE;
    a.n_tiles = M / F::BM * a.n_tn;
    a.nk = K / QG_BK;
    // one CTA per SM; ping-pong CTAs work on two tiles at a time
    int grid = F::COOP ? a.n_tiles : (a.n_tiles + 1) / 2;
    if (grid > attn_sm_count()) grid = attn_sm_count();
    qkv_gemm_kernel<QUANT, FORM><<<grid, QG_THREADS, F::SMEM_BYTES, stream>>>(tm_x, tm_w, a);
    CUDA_OK(cudaGetLastError());
}

template <bool QUANT>
static void launch(QgArgs a, const uint16_t *x, const uint16_t *w, int M, int N, int K, cudaStream_t stream) {
    if (form_of(M) == QG_FORM_COOP) launch_form<QUANT, QG_FORM_COOP>(a, x, w, M, N, K, stream);
    else launch_form<QUANT, QG_FORM_PINGPONG>(a, x, w, M, N, K, stream);
}

extern "C" int qkv_gemm_quant_supported(int M, int T, int C, int d, const char **why) {
    const char *w = NULL;
    if (d != QG_TILE) w = "the quantizing QKV GEMM needs head_dim 128 (one head per 128-column tile)";
    else if (C <= 0 || C % QG_TILE) w = "the quantizing QKV GEMM needs d_model a multiple of 128";
    else if (T <= 0 || T % QG_TILE) w = "the quantizing QKV GEMM needs seq_len a multiple of 128 (whole scale blocks)";
    else if (M <= 0 || M % T) w = "the quantizing QKV GEMM needs whole sequences";
    if (why) *why = w;
    return w ? -1 : 0;
}

extern "C" void qkv_gemm_bf16(uint16_t *y, const uint16_t *x, const uint16_t *w, int M, int N, int K,
                              const float *rope, int T, cudaStream_t stream) {
    check_gemm("qkv_gemm_bf16", x, w, M, N, K);
    if (!y || (uintptr_t)y % 16) FATAL("qkv_gemm_bf16: y must be a 16-byte aligned device pointer");
    QgArgs a;
    memset(&a, 0, sizeof a);
    a.y = (bf16 *)y;
    a.ldy = N;
    if (rope) {
        if (N % 3 || (N / 3) % QG_TILE || T <= 0 || M % T || (uintptr_t)rope % 16)
            FATAL("qkv_gemm_bf16: RoPE needs N = 3 C (C a multiple of 128), whole sequences of T and a 16-byte "
                  "aligned table (N=%d, M=%d, T=%d)", N, M, T);
        a.rope = rope;
        a.T = T;
        a.C = N / 3;
    }
    launch<false>(a, x, w, M, N, K, stream);
}

extern "C" void qkv_gemm_quant(const QkvQuantOut *out, const uint16_t *x, const uint16_t *w, int M, int T, int C,
                               cudaStream_t stream) {
    const char *why;
    if (qkv_gemm_quant_supported(M, T, C, QG_TILE, &why)) FATAL("qkv_gemm_quant (M=%d, T=%d, C=%d): %s", M, T, C, why);
    check_gemm("qkv_gemm_quant", x, w, M, 3 * C, C);
    QgArgs a;
    memset(&a, 0, sizeof a);
    a.T = T;
    a.C = C;
    a.H = C / QG_TILE;
    a.rope = out->rope;
    if (a.rope && (uintptr_t)a.rope % 16) FATAL("qkv_gemm_quant: the RoPE table must be 16-byte aligned");
    static const AttnCast casts[3] = {CAST_Q, CAST_K, CAST_V};
    for (int i = 0; i < 3; i++) {
        if (!out->codes[i] || !out->codes_t[i] || !out->scales[i] || (uintptr_t)out->codes[i] % 16 ||
            (uintptr_t)out->codes_t[i] % 4)
            FATAL("qkv_gemm_quant: operand %d needs codes (16-byte aligned), transposed codes and scales", i);
        a.codes[i] = out->codes[i];
        a.codes_t[i] = out->codes_t[i];
        a.scales[i] = out->scales[i];
        a.max_exp[i] = attn_scale_max_exp(casts[i]);
    }
    launch<true>(a, x, w, M, 3 * C, C, stream);
}
