// qkv_gemm.cu: the QKV projection as a wgmma GEMM with a quantizing epilogue (interface and
// layouts: qkv_gemm.h).
//
// Structure (one persistent CTA per SM, 384 threads, clusters of 2 CTAs):
//   - warpgroup 0, the producer: one thread copies, per 64-wide K block, the CTA's x rows and its
//     half of W's tile by TMA (128-byte swizzle, the layout wgmma's K-major descriptors read) into a
//     ring of stages, each with a full barrier (TMA bytes) and an empty one (the consuming warps);
//   - warpgroups 1 and 2, the consumers: the CTA's tile is 128 tokens x 256 columns (one 128-token
//     block of two heads), consumer cw its rows 64 cw .. 64 cw + 63 across all 256 columns with
//     m64n256k16 wgmmas. Every (128-token block, head) scale block is computed by one CTA, so its
//     epilogue can quantize it; the two consumers' halves of a block meet on one 256-thread barrier.
//   - the two CTAs of a cluster work on neighbouring token blocks of the same two heads: each
//     producer loads its own x rows and one 128-row half of the W tile, which TMA multicasts into
//     both CTAs (W's L2 reads halved); a stage is refilled once the consumers of both CTAs released
//     it (16 warp arrivals, 8 of them from the peer CTA).
// Mainloop per K block: 4 k16 steps of m64n256k16, one commit group per block; after the block's
// group is issued, the previous one is waited for and its stage released. Between the two, the
// consumer runs one slice of the previous tile's quantizing epilogue (qkv_gemm_overlap.cuh), so
// that the epilogue's ~1240 instructions a warp run with the tensor cores busy: 0.90-0.99x
// cuBLASLt's rate for a BF16 output (docs/perf.md, "QKV projection GEMM with the FP8 epilogue").
//
// Accumulator layout (m64n256k16 as two m64n128 halves acc[h], h the tile's head): thread (warp w,
// lane 4 g + t4) holds rows 16 w + g + 8 rr (rr = 0, 1) of its consumer's 64 and columns
// 128 h + 8 j + 2 t4 + e (j = 0..15, e = 0, 1) in acc[h][4 j + 2 rr + e]. Column i < 64 of a head
// pairs with i + 64 for RoPE: j and j + 8, the same thread, so RoPE needs no shuffles.
//
// The quantizing epilogue stages each scale block's codes once in shared memory (16 KB per block),
// in a layout both of its readers can read without bank conflicts: 32-bit word w of token row r
// at word w ^ 4 s(r), s(r) = (r ^ (r >> 3)) & 7 (a 16-byte chunk c at c ^ s(r)). The row-major
// codes of a (b, h, block) are 16 KB contiguous in (B, H, T, 128): 16-byte loads and stores, a
// warp's 32 covering four whole rows. The transposed codes: each lane reads one word of four
// consecutive rows, transposes the 4 x 4 bytes (transpose4x4) and stores 4 bytes to each of 4
// rows of codes_t; a warp's store covers one 32-byte sector of each of 4 rows.
#include "gpu/qkv_gemm.h"

#include <cuda.h>          // CUtensorMap (types only)
#include <cuda_runtime.h>  // launches, cudaFuncSetAttribute
#include <stdint.h>        // uint8_t, uint32_t, uintptr_t
#include <string.h>        // memset

#include "core/precision.h"      // attn_scale_max_exp (V's scale bound), CAST_*
#include "attention/common.cuh"    // CUDA_OK, attn_sm_count, bf16 (host side)
#include "gpu/ptx/async_copy.cuh"  // cp.async, mbarriers, TMA loads, clusters
#include "gpu/ptx/mma.cuh"         // pack_bf16
#include "gpu/ptx/smem.cuh"        // smem_addr, smem_align1024
#include "gpu/ptx/warpgroup.cuh"   // named barriers, setmaxnreg
#include "gpu/ptx/wgmma.cuh"       // wgmma, fences, K-major descriptors, reg_fence
#include "core/common.h"         // FATAL
#include "core/fp8.h"            // fp8_scale_for_amax_within
#include "gpu/fp8_cvt.cuh"       // cvt_e4m3x2, transpose4x4
#include "gpu/layers_math.cuh"   // lm_rope_lo / lm_rope_hi, lm_f2bf: rope_forward_gpu's element math
#include "gpu/tensor_map.h"      // tensor_map_2d
#include "gpu/test_hooks.h"      // gpu_test_hooks.qkv_gemm_group_rows

#define QG_TILE 128                        // a scale block: rows (tokens) = columns = head dim
#define QG_BK 64                           // K per stage: one 128-byte swizzled row of BF16
#define QG_THREADS 384
#define QG_STAGING_BYTES (QG_TILE * QG_TILE)  // one scale block's 128 x 128 codes
#define QG_CHUNKS 16  // the code stores of one staged block, in the pieces a mainloop's K blocks take (store_codes_chunk)

// The CTA's tile and ring (see the file comment). 4 stages of 48 KB: each k16 step reads A once
// per 256 columns, 10 KB of shared memory per 0.5 MFLOP.
constexpr int QG_CLUSTER = 2;           // CTAs sharing each stage's W tile
constexpr int QG_BM = QG_TILE;          // rows of x per stage
constexpr int QG_BN = 2 * QG_TILE;      // rows of W per stage: two heads
constexpr int QG_CONSUMER_ROWS = 64;    // a consumer's rows of the tile
constexpr int QG_STAGES = 4;
constexpr int QG_X_BYTES = QG_BM * QG_BK * 2, QG_W_BYTES = QG_BN * QG_BK * 2;
constexpr int QG_STAGE_BYTES = QG_X_BYTES + QG_W_BYTES;
constexpr int QG_RING_BYTES = QG_STAGES * QG_STAGE_BYTES;
constexpr int QG_BARS_OFF = QG_RING_BYTES + 2 * QG_STAGING_BYTES;
constexpr int QG_SMEM_BYTES = QG_BARS_OFF + 2 * QG_STAGES * 8 + 16 * 4 + 1024;  // + 16 warp maxima, alignment slack
constexpr int QG_EMPTY_ARRIVALS = 8 * QG_CLUSTER;  // the consuming warps of a stage, in both CTAs
static_assert(QG_SMEM_BYTES <= 227 * 1024, "the CTA fits Hopper's 227 KB of shared memory");

struct QgArgs {
    int n_tn, n_tiles, nk;  // column tiles, tiles, K blocks (n_tiles a multiple of the cluster size)
    int group_rows;         // the units' order: groups of this many unit rows, column by column (0: row by row)
    int pad;                // zero, padding
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

// Unit u's row (of n_rows unit rows: a unit is a cluster's QG_CLUSTER token blocks of the same
// columns) and column tile. Row by row (group_rows 0, the trainer's order), a wave of CTAs spans a
// few rows and every column, so all of W is read again each wave; in groups of g rows taken column
// by column it spans g rows and a slice of the columns (the raster of Triton's GROUP_M / CUTLASS's
// swizzle), which L2 holds across waves (gpu_test_hooks.qkv_gemm_group_rows).
struct UnitPos {
    int row, col;
};
__device__ __forceinline__ UnitPos unit_pos(int u, int n_tn, int n_rows, int group_rows) {
    if (group_rows <= 0) return {u / n_tn, u % n_tn};
    const int per_group = group_rows * n_tn, first = u / per_group * group_rows;
    const int rows = min(group_rows, n_rows - first), r = u % per_group;
    return {first + r % rows, r / rows};
}

// BF16 rounding by the hardware conversion (F2F, one per value; fp8.h's bf16_round is the same RNE
// in integer steps). The BF16 epilogue's: a packed conversion (F2FP, two values, widened again by
// two integer ops) made ptxas serialize the mainloop's wgmmas (C7511, C7520). The quantizing
// epilogue keeps its values packed (qkv_gemm_overlap.cuh).
__device__ __forceinline__ float qg_bf16(float x) { return __bfloat162float(lm_f2bf(x)); }

// The tile's FP32 sums as BF16 values (as a BF16 GEMM would output them), then RoPE on q and k:
// half h (head h of the tile) holds tokens t0 + 16 warp + g + 8 rr, column pair (i, i + 64) of its
// head for i = 8 j + 2 t4 + e < 64. cs_of(h, rr, j): the (cos, sin) of pairs 8 j + 2 t4 and the
// next one for row rr.
template <class CsOf>
__device__ __forceinline__ void round_and_rotate(float (&acc)[2][64], bool rotate, CsOf cs_of) {
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int i = 0; i < 64; i++) acc[h][i] = qg_bf16(acc[h][i]);
    if (!rotate) return;
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++)
#pragma unroll
            for (int j = 0; j < 8; j++) {
                const float4 cs = cs_of(h, rr, j);
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    const float x = acc[h][4 * j + 2 * rr + e], y = acc[h][4 * (j + 8) + 2 * rr + e];
                    const float c = e ? cs.z : cs.x, sn = e ? cs.w : cs.y;
                    acc[h][4 * j + 2 * rr + e] = qg_bf16(lm_rope_lo(x, y, c, sn));
                    acc[h][4 * (j + 8) + 2 * rr + e] = qg_bf16(lm_rope_hi(x, y, c, sn));
                }
            }
}
// The (cos, sin) pairs of token t, pairs 8 j + 2 t4 and the next one, from rope_table_gpu's table.
__device__ __forceinline__ float4 rope_pairs(const float *rope, int t, int j, int t4) {
    return *reinterpret_cast<const float4 *>(rope + ((size_t)t * 64 + 8 * j + 2 * t4) * 2);
}
// Token t's 8 (cos, sin) float4 (pairs 8 j + 2 t4, + 1 for j = 0..7) by cp.async into a consumer's
// staged block `own` (16 KB: float4 j of thread wtid at j * 2048 + 16 wtid, so a warp's reads of
// one j are 512 contiguous bytes), and their reads (rope_smem_pairs).
__device__ __forceinline__ void rope_row_to_smem(uint8_t *own, const float *rope, int t, int t4, int wtid) {
    const float *src = rope + ((size_t)t * 64 + 2 * t4) * 2;
#pragma unroll
    for (int j = 0; j < 8; j++) cp_async16(own + j * 2048 + 16 * wtid, src + 16 * j, true);
    cp_async_commit();
}
__device__ __forceinline__ float4 rope_smem_pairs(const uint8_t *own, int j, int wtid) {
    return *reinterpret_cast<const float4 *>(own + j * 2048 + 16 * wtid);
}

// The scale of head h's block: the amax over its 8 warp maxima in red (both consumers' warps:
// red[8 h + 4 cw + warp]), read after the barrier that published them.
__device__ __forceinline__ float wide_block_scale(const float *red, int h, int max_exp) {
    float m = red[8 * h];
#pragma unroll
    for (int i = 1; i < 8; i++) m = fmaxf(m, red[8 * h + i]);
    return fp8_scale_for_amax_within(FP8_E4M3, m, max_exp);
}

// The scale block of a tile's head: from the tile's first token row mt (M index) and column n0
// (N index), the operand (0 q, 1 k, 2 v), the block's first token in its sequence, the batch x
// head row (head_off: the head within the tile), and where its row-major codes (16 KB contiguous
// in (B, H, T, 128)), transposed codes (rows of pitch T in (B, H, 128, T)) and scale go.
struct QgBlock {
    int which, t0;
    uint8_t *codes, *codes_t;
    float *scale;
};
__device__ __forceinline__ QgBlock qg_block(const QgArgs &a, int mt, int n0, int head_off) {
    const int which = n0 / a.C, t0 = mt % a.T, b = mt / a.T, head = (n0 % a.C) / QG_TILE + head_off;
    const long bh = (long)b * a.H + head;
    return {which, t0, a.codes[which] + (bh * a.T + t0) * QG_TILE, a.codes_t[which] + bh * QG_TILE * a.T + t0,
            a.scales[which] + bh * (a.T / QG_TILE) + t0 / QG_TILE};
}

// The staging layout's swizzle of token row r (see the file comment), in 16-byte chunks.
__device__ __forceinline__ int stage_swz(int r) { return (r ^ (r >> 3)) & 7; }

// Piece c (0 .. QG_CHUNKS - 1) of the global stores of one staged block by its consumer's 128
// threads: c < 8 a 16-byte slice of the row-major codes (the block's 16 KB are contiguous), else
// rows of the transposed codes (codes_t: row pitch T). Stores are split so that they can run one
// piece per K block of the next mainloop, between its wgmma issue and wait.
__device__ __forceinline__ void store_codes_chunk(const uint8_t *stg, uint8_t *codes, uint8_t *codes_t, int T, int c,
                                                  int wtid) {
    if (c < 8) {
        const int idx = c * 128 + wtid, r = idx >> 3, ch = idx & 7;
        const uint4 v = *reinterpret_cast<const uint4 *>(stg + r * 128 + ((ch ^ stage_swz(r)) << 4));
        *reinterpret_cast<uint4 *>(codes + (long)idx * 16) = v;
        return;
    }
    // transposed: lane (tl, wl) = (lane / 4, lane % 4), rows 32 warp + 4 tl .. + 3, word 4 p + wl
    const int lane = wtid & 31, warp = wtid >> 5, tl = lane >> 2, wl = lane & 3, r0 = 32 * warp + 4 * tl;
    const int w = 4 * (c - 8) + wl;
    uint32_t x[4];
#pragma unroll
    for (int v = 0; v < 4; v++) {
        const int r = r0 + v;
        x[v] = *reinterpret_cast<const uint32_t *>(stg + r * 128 + ((w ^ (4 * stage_swz(r))) << 2));
    }
    uint32_t out[4];
    transpose4x4(x[0], x[1], x[2], x[3], out);  // out[k]: column 4 w + k, rows r0 .. r0 + 3
#pragma unroll
    for (int k = 0; k < 4; k++) *reinterpret_cast<uint32_t *>(codes_t + r0 + (long)(4 * w + k) * T) = out[k];
}

// Two codes (columns 8 j + 2 t4, + 1 of token row r; u's low 16 bits) into a staged block at sbase,
// one 2-byte store in the staging layout.
__device__ __forceinline__ void stage_code_pair(uint32_t sbase, int r, int j, int t4, uint32_t u) {
    const int w = 2 * j + (t4 >> 1);
    const uint32_t addr = sbase + r * 128 + ((w ^ (4 * stage_swz(r))) << 2) + 2 * (t4 & 1);
    asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"((uint16_t)u) : "memory");
}

#include "gpu/qkv_gemm_overlap.cuh"  // OverlapEpi: the quantizing epilogue under the next mainloop (uses the above)

// The BF16 epilogue (tests): rounded, rotated values straight from registers. Half h: rows
// m0 + 16 warp + g + 8 rr, columns n0 + 128 h ..
__device__ __forceinline__ void epilogue_bf16(float (&acc)[2][64], const QgArgs &a, int m0, int n0, int wtid) {
    const int warp = wtid >> 5, lane = wtid & 31, g = lane >> 2, t4 = lane & 3;
    const int tr = (a.rope ? m0 % a.T : 0) + 16 * warp + g;  // the thread's first token row
    round_and_rotate(acc, a.rope && n0 < 2 * a.C,
                     [&](int h, int rr, int j) { return rope_pairs(a.rope, tr + 8 * rr, j, t4); });
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            bf16 *row = a.y + (long)(m0 + 16 * warp + g + 8 * rr) * a.ldy + n0 + QG_TILE * h + 2 * t4;
#pragma unroll
            for (int j = 0; j < 16; j++)
                *reinterpret_cast<uint32_t *>(row + 8 * j) = pack_bf16(acc[h][4 * j + 2 * rr], acc[h][4 * j + 2 * rr + 1]);
        }
}

// A stage's release by a consumer warp: one arrival (lane 0) on the stage's empty barrier in every
// CTA of the cluster (their producers' multicasts write this CTA's copy of the stage too).
__device__ __forceinline__ void release_stage(uint64_t *empty, int s, int lane, int rank) {
    if (lane != 0) return;
    mbar_arrive(&empty[s]);
    for (int r = 1; r < QG_CLUSTER; r++) mbar_arrive_cluster(&empty[s], (uint32_t)((rank + r) % QG_CLUSTER));
}

// K block q of a consumer's mainloop issued: the stage's full barrier waited for, its 4 k16 steps
// (m64n256k16) into acc as one commit group. d0, dw0: the descriptors' low words of this
// consumer's x rows and of W's tile in stage 0.
__device__ __forceinline__ void issue_k_block(float (&acc)[2][64], uint64_t *full, uint32_t d0, uint32_t dw0,
                                              unsigned q, int kb) {
    const int s = q % QG_STAGES;
    mbar_wait(&full[s], (q / QG_STAGES) & 1);
    const uint32_t da = d0 + s * (QG_STAGE_BYTES / 16), db = dw0 + s * (QG_STAGE_BYTES / 16);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < QG_BK / 16; kk++) {  // 32 bytes per k16 step
        const int accum = kb > 0 || kk > 0;
        wgmma_m64n256_ss(acc[0], acc[1], kmajor_desc(da + 2 * kk), kmajor_desc(db + 2 * kk), accum);
    }
    wgmma_commit();
}

// The quantizing consumer loop (qkv_gemm_overlap.cuh): tile k's mainloop runs one slice of tile
// k - 1's epilogue per K block, then the slices it had no K block for; after the CTA's last tile,
// that tile's slices run on their own. (One loop with a pass without a mainloop for the last tile
// made ptxas serialize every wgmma, C7518.)
__device__ __forceinline__ void consumer_quant(const QgArgs &a, uint8_t *smem, uint64_t *full, uint64_t *empty,
                                               float *red, int cid, int n_clusters, int n_units, int n_rows, int rank,
                                               int cw, int wtid) {
    constexpr int S = QG_STAGES, CL = QG_CLUSTER;
    const int lane = wtid & 31;
    const uint32_t d0 = kmajor_desc_lo(smem_addr(smem + cw * QG_CONSUMER_ROWS * 128));
    const uint32_t dw0 = kmajor_desc_lo(smem_addr(smem + QG_X_BYTES));
    uint8_t *stg = smem + QG_RING_BYTES;
    auto release = [&](int s) { release_stage(empty, s, lane, rank); };
    OverlapEpi ep;
    // the pending tile's position and addresses, before its slice 0 (the mainloop needs neither)
    auto locate = [&] {
        const UnitPos p = unit_pos(ep.unit, a.n_tn, n_rows, a.group_rows);
        ep.locate(a, (p.row * CL + rank) * QG_BM, p.col * QG_BN, cw, wtid);
    };
    for (int k = 0;; k++) {
        const int u = cid + k * n_clusters;
        if (u >= n_units) break;
        const unsigned q0 = (unsigned)k * a.nk;
        float acc[2][64];
        for (int kb = 0; kb < a.nk; kb++) {
            const unsigned q = q0 + kb;
            issue_k_block(acc, full, d0, dw0, q, kb);
            if (ep.unit >= 0 && kb < QG_OVL_SLICES) {
                if (kb == 0) locate();
                ep.slice(kb, a, cw, wtid, stg, red);
            }
            wgmma_wait<1>();  // the previous block's matmuls are done: its stage is free
            if (kb > 0) release((q - 1) % S);
        }
        // the slices the mainloop had no K block for, under its last block's matmuls
        if (ep.unit >= 0)
            for (int sl = a.nk; sl < QG_OVL_SLICES; sl++) ep.slice(sl, a, cw, wtid, stg, red);
        wgmma_wait<0>();
        reg_fence(acc[0]);
        reg_fence(acc[1]);
        release((q0 + a.nk - 1) % S);
        ep.pack(acc, u);
    }
    if (ep.unit >= 0) {  // the CTA's last tile: its whole epilogue, with no mainloop to run under
        locate();
        for (int sl = 0; sl < QG_OVL_SLICES; sl++) ep.slice(sl, a, cw, wtid, stg, red);
    }
}

// The BF16 consumer loop (qkv_gemm_bf16, the tests' reference): each tile's mainloop, then its
// epilogue.
__device__ __forceinline__ void consumer_bf16(const QgArgs &a, uint8_t *smem, uint64_t *full, uint64_t *empty,
                                              int cid, int n_clusters, int n_units, int n_rows, int rank, int cw,
                                              int wtid) {
    constexpr int S = QG_STAGES, CL = QG_CLUSTER;
    const int lane = wtid & 31;
    // descriptor low words of stage 0: this consumer's rows of x, W's tile
    const uint32_t d0 = kmajor_desc_lo(smem_addr(smem + cw * QG_CONSUMER_ROWS * 128));
    const uint32_t dw0 = kmajor_desc_lo(smem_addr(smem + QG_X_BYTES));
    auto release = [&](int s) { release_stage(empty, s, lane, rank); };
    for (int k = 0;; k++) {
        const int u = cid + k * n_clusters;  // the unit
        if (u >= n_units) break;
        const unsigned q0 = (unsigned)k * a.nk;
        const UnitPos p = unit_pos(u, a.n_tn, n_rows, a.group_rows);
        const int tm = p.row * CL + rank, n0 = p.col * QG_BN;
        float acc[2][64];
        for (int kb = 0; kb < a.nk; kb++) {
            const unsigned q = q0 + kb;
            issue_k_block(acc, full, d0, dw0, q, kb);
            wgmma_wait<1>();  // the previous block's matmuls are done: its stage is free
            if (kb > 0) release((q - 1) % S);
        }
        wgmma_wait<0>();
        reg_fence(acc[0]);  // the epilogue reads acc only after the wait (no hoisting above it)
        reg_fence(acc[1]);
        release((q0 + a.nk - 1) % S);
        epilogue_bf16(acc, a, tm * QG_BM + cw * QG_CONSUMER_ROWS, n0, wtid);
    }
}

template <bool QUANT>
__global__ void __launch_bounds__(QG_THREADS, 1)
    qkv_gemm_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                    const QgArgs a) {
    constexpr int S = QG_STAGES;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint8_t *smem = smem_align1024(smem_raw);
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + QG_BARS_OFF), *empty = full + S;
    float *red = reinterpret_cast<float *>(empty + S);  // 16 warp maxima
    // Clusters of QG_CLUSTER CTAs (rank `rank`) walk the same units (a unit: QG_CLUSTER tiles on
    // neighbouring token blocks of the same columns, tile rank of the unit to the CTA of that rank):
    // unit u = cluster + k n_clusters, so both CTAs of a cluster fill and drain their rings alike.
    constexpr int CL = QG_CLUSTER;
    const int rank = (int)cluster_ctarank();
    const int cid = blockIdx.x / CL, n_clusters = gridDim.x / CL, n_units = a.n_tiles / CL;
    const int n_rows = n_units / a.n_tn;  // unit rows
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            mbar_init(&full[s], 1);                    // the producer's arrive (with the TMA bytes)
            mbar_init(&empty[s], QG_EMPTY_ARRIVALS);  // the consuming warps of both CTAs
        }
        mbar_fence_init();
    }
    __syncthreads();
    cluster_sync();  // the peer's barriers are initialized before anything reaches them

    if (threadIdx.x < 128) {
        // ---- producer
        setmaxnreg_dec<40>();
        if (threadIdx.x == 0) {
            unsigned q = 0;  // ring block: stage q % S, its (q / S)-th use
            for (int u = cid; u < n_units; u += n_clusters) {
                const UnitPos p = unit_pos(u, a.n_tn, n_rows, a.group_rows);
                const int tm = p.row * CL + rank, tn = p.col;
                for (int kb = 0; kb < a.nk; kb++, q++) {
                    const int s = q % S;
                    mbar_wait(&empty[s], ((q / S) & 1) ^ 1);  // a fresh barrier passes parity 1
                    mbar_arrive_expect_tx(&full[s], QG_STAGE_BYTES);  // x, and W from every CTA of the cluster
                    uint8_t *st = smem + s * QG_STAGE_BYTES;
                    tma_load_2d(st, &tm_x, &full[s], kb * QG_BK, tm * QG_BM);
                    // this CTA's part of W, into every CTA of the cluster
                    tma_load_2d_multicast(st + QG_X_BYTES + rank * (QG_W_BYTES / CL), &tm_w, &full[s], kb * QG_BK,
                                          tn * QG_BN + rank * (QG_BN / CL), (uint16_t)((1u << CL) - 1));
                }
            }
        }
    } else {
        // ---- consumers
        setmaxnreg_inc<232>();
        const int cw = ((int)threadIdx.x - 128) >> 7, wtid = threadIdx.x & 127;
        if constexpr (QUANT) consumer_quant(a, smem, full, empty, red, cid, n_clusters, n_units, n_rows, rank, cw, wtid);
        else consumer_bf16(a, smem, full, empty, cid, n_clusters, n_units, n_rows, rank, cw, wtid);
    }
    cluster_sync();  // no CTA leaves while its peer may still arrive on its barriers
}

// --- launchers ---------------------------------------------------------------------------------

// The GEMM's shapes: whole units (QG_CLUSTER tiles of 128 token rows) and column tiles of two heads.
static void check_gemm(const char *who, const void *x, const void *w, int M, int N, int K) {
    if (M <= 0 || N <= 0 || K <= 0 || M % (QG_CLUSTER * QG_BM) || N % QG_BN || K % QG_BK)
        FATAL("%s: shape M=%d N=%d K=%d (M and N must be positive multiples of %d, K of %d)", who, M, N, K,
              QG_CLUSTER * QG_BM, QG_BK);
    if (!x || !w || (uintptr_t)x % 16 || (uintptr_t)w % 16)
        FATAL("%s: x and W must be 16-byte aligned device pointers", who);
}

static int qg_last_grid = 0;  // the last launch's CTAs (qkv_gemm_last_grid)
extern "C" int qkv_gemm_last_grid(void) { return qg_last_grid; }

template <bool QUANT>
static void launch(QgArgs a, const uint16_t *x, const uint16_t *w, int M, int N, int K, cudaStream_t stream) {
    static bool attr_set = false;
    if (!attr_set) {
        CUDA_OK(cudaFuncSetAttribute(qkv_gemm_kernel<QUANT>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     QG_SMEM_BYTES));
        attr_set = true;
    }
    const CUtensorMapDataType bf = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    const CUtensorMap tm_x = tensor_map_2d("the QKV GEMM's x", bf, x, K, M, 2L * K, QG_BK, QG_BM,
                                           CU_TENSOR_MAP_SWIZZLE_128B);
    const CUtensorMap tm_w = tensor_map_2d("the QKV GEMM's W", bf, w, K, N, 2L * K, QG_BK, QG_BN / QG_CLUSTER,
                                           CU_TENSOR_MAP_SWIZZLE_128B);
    a.n_tn = N / QG_BN;
    a.n_tiles = M / QG_BM * a.n_tn;
    a.nk = K / QG_BK;
    a.group_rows = gpu_test_hooks.qkv_gemm_group_rows;  // 0 but in tests: row by row
    void (*const kernel)(CUtensorMap, CUtensorMap, QgArgs) = qkv_gemm_kernel<QUANT>;
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cudaLaunchAttribute attr[1];
    cfg.blockDim = dim3(QG_THREADS);
    cfg.dynamicSmemBytes = QG_SMEM_BYTES;
    cfg.stream = stream;
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = QG_CLUSTER;
    attr[0].val.clusterDim.y = attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    static int max_ctas = 0;  // CTAs resident at once: one per SM, whole clusters (one device per process)
    if (max_ctas == 0) {
        int n_clusters = 0;
        cfg.gridDim = dim3(attn_sm_count() / QG_CLUSTER * QG_CLUSTER);
        CUDA_OK(cudaOccupancyMaxActiveClusters(&n_clusters, kernel, &cfg));
        if (n_clusters < 1) FATAL("qkv_gemm: no cluster of %d CTAs fits the device", QG_CLUSTER);
        max_ctas = n_clusters * QG_CLUSTER;
    }
    const int grid = a.n_tiles < max_ctas ? a.n_tiles : max_ctas;
    cfg.gridDim = dim3((unsigned)grid);
    qg_last_grid = grid;
    CUDA_OK(cudaLaunchKernelEx(&cfg, kernel, tm_x, tm_w, a));
}

extern "C" int qkv_gemm_quant_supported(int M, int T, int C, int d, const char **why) {
    const char *w = NULL;
    if (d != QG_TILE) w = "the quantizing QKV GEMM needs head_dim 128 (one head per 128-column tile)";
    else if (C <= 0 || C % QG_BN) w = "the quantizing QKV GEMM needs an even number of heads (a tile is two heads)";
    else if (T <= 0 || T % QG_TILE) w = "the quantizing QKV GEMM needs seq_len a multiple of 128 (whole scale blocks)";
    else if (M <= 0 || M % T) w = "the quantizing QKV GEMM needs whole sequences";
    else if (M % (QG_CLUSTER * QG_BM))
        w = "the quantizing QKV GEMM needs an even number of 128-token blocks (a cluster's two tiles)";
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
        if (N % 3 || (N / 3) % QG_BN || T <= 0 || M % T || (uintptr_t)rope % 16)
            FATAL("qkv_gemm_bf16: RoPE needs N = 3 C (C a multiple of %d), whole sequences of T and a 16-byte "
                  "aligned table (N=%d, M=%d, T=%d)", QG_BN, N, M, T);
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
