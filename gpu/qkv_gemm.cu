// qkv_gemm.cu: the QKV projection as a wgmma GEMM with a quantizing epilogue (interface and
// layouts: qkv_gemm.h).
//
// Structure (one persistent CTA per SM, 384 threads):
//   - warpgroup 0, the producer: one thread copies, per 64-wide K block, the CTA's x rows and W's
//     tile by TMA (128-byte swizzle, the layout wgmma's K-major descriptors read) into a ring of
//     stages, each with a full barrier (TMA bytes) and an empty one (the consuming warps);
//   - warpgroups 1 and 2, the consumers; every (128-token block, head) scale block is computed by
//     one CTA, so its epilogue can quantize it. Four forms (QgForm, QG_FORM_*, below): ping-pong
//     (consumer tiles of 128 x 128, one consumer's epilogue under the other's matmuls), cooperative
//     (256 x 128 CTA tiles), wide (128 x 256, two heads, m64n256k16) and wide2, the default (wide
//     in clusters of 2 CTAs sharing W's tile by TMA multicast).
// Mainloop per K block: 4 k16 steps of wgmma (m64n128k16 twice, or m64n256k16 once), one commit
// group per block; after the block's group is issued, the previous one is waited for and its stage
// released. Between the two, the consumer does one piece of its previous tile's code stores
// (deferred stores, store_codes_chunk): in the cooperative and wide forms both consumers'
// epilogues run at once with the tensor cores idle, and the global stores were the part of that
// time that need not wait (3-5% of the GEMM, stop 37).
// What the forms measured (docs/perf.md, stops 36-38): the multicast halves W's L2 reads yet gains
// ~1% over wide: L2 bandwidth is not the limit. The epilogue was: Nsight Compute put it at ~20% of
// the consumers' time with the tensor pipe idle (80% active, cuBLASLt 93%). Since stop 38 the wide
// forms run all of it under the next tile's mainloop (qkv_gemm_overlap.cuh), 3-7% faster than the
// serial epilogue with deferred stores; since stop 39 the tile's position and addresses are
// computed there too, not between two mainloops: 0.90-1.00x cuBLASLt's rate (tensor pipe 84%).
//
// Accumulator layout (m64n128k16, per 64-row half h): thread (warp w, lane 4 g + t4) holds rows
// 64 h + 16 w + g + 8 rr (rr = 0, 1) and columns 8 j + 2 t4 + e (j = 0..15, e = 0, 1) in
// acc[h][4 j + 2 rr + e]. Column i < 64 of a head pairs with i + 64 for RoPE: j and j + 8, the
// same thread, so RoPE needs no shuffles. The wide forms' m64n256k16 accumulators are the same
// layout per head: acc[h] is head h of the tile (columns 128 h ..), rows 16 w + g + 8 rr of the
// consumer's 64.
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
#include "attention/common.cuh"    // CUDA_OK, attn_sm_count, bf16, attn_env_* (host side)
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

#define QG_TILE 128                        // a scale block: rows (tokens) = columns = head dim
#define QG_BK 64                           // K per stage: one 128-byte swizzled row of BF16
#define QG_THREADS 384
#define QG_STAGING_BYTES (QG_TILE * QG_TILE)  // one scale block's 128 x 128 codes
#define QG_CHUNKS 16  // the code stores of one staged block, in the pieces a mainloop's K blocks take (store_codes_chunk)

// The forms (QG_FORM_*; the outputs are the same bit for bit):
//   ping-pong: each consumer its own 128 x 128 tile, the tiles' K blocks one ring in the CTA's tile
//     order (5 stages of 32 KB); one consumer's epilogue under the other's mainloop;
//   cooperative: the CTA's tile is 256 x 128, consumer cw its rows 128 cw .., both reading every
//     stage's W tile (4 stages of 48 KB: a third less L2 traffic per FLOP than ping-pong);
//   wide: the CTA's tile is 128 x 256 (one 128-token block of two heads), consumer cw its rows
//     64 cw .. 64 cw + 63 across all 256 columns with m64n256k16 wgmmas (4 stages of 48 KB, as
//     cooperative: both consumers read every stage; each k16 step reads A once per 256 columns
//     instead of per 128, 10 KB of shared memory per 0.5 MFLOP instead of 12); each (block, head)
//     scale block is split over both consumers, whose epilogues meet on one 256-thread barrier;
//   wide2: the wide form in clusters of 2 CTAs on neighbouring token blocks of the same two heads:
//     each CTA's producer loads its own x rows and one 128-row half of the W tile, which TMA
//     multicasts into both CTAs (W's L2 reads halved: 32 KB of L2 reads per stage and CTA instead
//     of 48); a stage is refilled once the consumers of both CTAs released it (16 warp arrivals,
//     8 of them from the peer CTA).
enum { QG_FORM_PINGPONG = 0, QG_FORM_COOP = 1, QG_FORM_WIDE = 2, QG_FORM_WIDE2 = 3, QG_N_FORMS };
static const char *const qg_form_names[] = {"pingpong", "coop", "wide", "wide2"};  // QKV_GEMM_FORM's values
static_assert(sizeof qg_form_names / sizeof qg_form_names[0] == QG_N_FORMS, "a name for every QG_FORM_*");
template <int FORM> struct QgForm {
    static constexpr bool PINGPONG = FORM == QG_FORM_PINGPONG, WIDE = FORM == QG_FORM_WIDE || FORM == QG_FORM_WIDE2;
    static constexpr int CLUSTER = FORM == QG_FORM_WIDE2 ? 2 : 1;  // CTAs sharing each stage's W tile
    static constexpr int BM = FORM == QG_FORM_COOP ? 2 * QG_TILE : QG_TILE;  // rows of x per stage
    static constexpr int BN = WIDE ? 2 * QG_TILE : QG_TILE;                  // rows of W per stage
    static constexpr int CONSUMER_ROWS = WIDE ? 64 : QG_TILE;                // a consumer's rows of the tile
    // a consumer's accumulators as two m64n128 halves acc[h]: rows + ROW_STEP h, columns + COL_STEP h
    static constexpr int ROW_STEP = WIDE ? 0 : 64, COL_STEP = WIDE ? 128 : 0;
    static constexpr int STAGES = PINGPONG ? 5 : 4;
    static constexpr int X_BYTES = BM * QG_BK * 2, W_BYTES = BN * QG_BK * 2;
    static constexpr int STAGE_BYTES = X_BYTES + W_BYTES;
    static constexpr int RING_BYTES = STAGES * STAGE_BYTES;
    static constexpr int BARS_OFF = RING_BYTES + 2 * QG_STAGING_BYTES;
    static constexpr int SMEM_BYTES = BARS_OFF + 2 * STAGES * 8 + 16 * 4 + 1024;  // + 16 warp maxima, alignment slack
    static constexpr int EMPTY_ARRIVALS = (PINGPONG ? 4 : 8) * CLUSTER;  // the consuming warps of a stage
};
static_assert(QgForm<QG_FORM_WIDE>::SMEM_BYTES <= 227 * 1024, "the wide form fits Hopper's 227 KB of shared memory");
static_assert(QgForm<QG_FORM_WIDE2>::SMEM_BYTES <= 227 * 1024, "so does wide2");

struct QgArgs {
    int n_tn, n_tiles, nk;  // column tiles, tiles, K blocks (n_tiles a multiple of the cluster size)
    int group_rows;         // the units' order: groups of this many unit rows, column by column (0: row by row)
    int defer;              // quantizing form: a tile's code stores run in the next tile's mainloop
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

// Unit u's row (of n_rows unit rows: a unit is CLUSTER token blocks of BM rows) and column tile.
// Row by row (group_rows 0), a wave of CTAs spans a few rows and every column, so all of W is read
// again each wave; in groups of g rows taken column by column it spans g rows and a slice of the
// columns (the raster of Triton's GROUP_M / CUTLASS's swizzle), which L2 holds across waves.
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
// in integer steps). The serial epilogue's: a packed conversion there (F2FP, two values, widened
// again by two integer ops) made ptxas serialize the mainloop's wgmmas of the cooperative,
// ping-pong and BF16-out forms (C7511, C7520; stop 38), and did not measurably speed up the wide
// forms. The overlapped epilogue keeps its values packed (qkv_gemm_overlap.cuh).
__device__ __forceinline__ float qg_bf16(float x) { return __bfloat162float(lm_f2bf(x)); }

// The tile's FP32 sums as BF16 values (as a BF16 GEMM would output them), then RoPE on q and k:
// half h holds tokens t0 + ROW_STEP h + 16 warp + g + 8 rr, column pair (i, i + 64) of its head
// for i = 8 j + 2 t4 + e < 64. cs_of(h, rr, j): the (cos, sin) of pairs 8 j + 2 t4 and the next
// one for that half's row rr (rope_pairs: from the table; the wide forms' first row from registers,
// rope_preload, their second from shared memory, rope_to_smem).
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
// The wide form's rows are the same for both heads of its tile. A thread's (cos, sin) float4 of
// its first row (rr = 0: 8 of its 16) are loaded while the tile's last K block is on the tensor
// cores, so that their L2 latency hides under its matmuls, where the epilogue waited for them (the
// GEMM ran 6-10% slower with RoPE than without, stop 37); all 16 beside the accumulators made ptxas
// spill. Row t0 + 16 warp + g.
__device__ __forceinline__ void rope_preload(float4 (&cs)[8], const float *rope, int t0, int warp, int g, int t4) {
#pragma unroll
    for (int j = 0; j < 8; j++) cs[j] = rope_pairs(rope, t0 + 16 * warp + g, j, t4);
}
// Token t's 8 (cos, sin) float4 (pairs 8 j + 2 t4, + 1 for j = 0..7) by cp.async into a consumer's
// staged block `own` (16 KB: float4 j of thread wtid at j * 2048 + 16 wtid, so a warp's reads of
// one j are 512 contiguous bytes), and their reads (rope_smem_pairs). Both epilogues use them.
__device__ __forceinline__ void rope_row_to_smem(uint8_t *own, const float *rope, int t, int t4, int wtid) {
    const float *src = rope + ((size_t)t * 64 + 2 * t4) * 2;
#pragma unroll
    for (int j = 0; j < 8; j++) cp_async16(own + j * 2048 + 16 * wtid, src + 16 * j, true);
    cp_async_commit();
}
__device__ __forceinline__ float4 rope_smem_pairs(const uint8_t *own, int j, int wtid) {
    return *reinterpret_cast<const float4 *>(own + j * 2048 + 16 * wtid);
}
// The serial epilogue's other 8 (rr = 1, row t0 + 16 warp + g + 8) go to shared memory during the
// mainloop, once the deferred stores have read the consumer's staged block, and are read from there
// in the epilogue instead of from L2 with the tensor cores idle. The block is free for them until
// the epilogue's first barrier (after RoPE), past which the consumers stage their codes in it.
__device__ __forceinline__ void rope_to_smem(uint8_t *own, const float *rope, int cw, int t0, int wtid) {
    const int warp = wtid >> 5, lane = wtid & 31;
    wg_bar_sync<1>(cw);  // every thread of this consumer has done its deferred stores' reads of `own`
    rope_row_to_smem(own, rope, t0 + 16 * warp + (lane >> 2) + 8, lane & 3, wtid);
}

// The wide forms' scale of head h's block: the amax over its 8 warp maxima in red (both consumers'
// warps: red[8 h + 4 cw + warp]), read after the barrier that published them.
__device__ __forceinline__ float wide_block_scale(const float *red, int h, int max_exp) {
    float m = red[8 * h];
#pragma unroll
    for (int i = 1; i < 8; i++) m = fmaxf(m, red[8 * h + i]);
    return fp8_scale_for_amax_within(FP8_E4M3, m, max_exp);
}

// The scale block of a tile's head: from the tile's first token row mt (M index) and column n0
// (N index), the operand (0 q, 1 k, 2 v), the block's first token in its sequence, the batch x
// head row (head_off: the head within the tile), and where its row-major codes (16 KB contiguous
// in (B, H, T, 128)), transposed codes (rows of pitch T in (B, H, 128, T)) and scale go. Both
// epilogues (epilogue_quant, OverlapEpi::locate).
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
// rows of the transposed codes (codes_t: row pitch T). Stores are split so that a deferred tile's
// can run one piece per K block of the next mainloop, between its wgmma issue and wait.
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
// one 2-byte store in the staging layout (both epilogues).
__device__ __forceinline__ void stage_code_pair(uint32_t sbase, int r, int j, int t4, uint32_t u) {
    const int w = 2 * j + (t4 >> 1);
    const uint32_t addr = sbase + r * 128 + ((w ^ (4 * stage_swz(r))) << 2) + 2 * (t4 & 1);
    asm volatile("st.shared.u16 [%0], %1;\n" ::"r"(addr), "h"((uint16_t)u) : "memory");
}

#include "gpu/qkv_gemm_overlap.cuh"  // OverlapEpi: the wide forms' epilogue under the next mainloop (uses the above)

// The stores a consumer owes for its last staged block (store_codes_chunk): none while codes is null.
struct PendingCodes {
    uint8_t *codes = nullptr, *codes_t = nullptr;
};

// The quantizing epilogue of consumer cw: the codes of its scale block staged, its stores (pieces
// store_codes_chunk) either done here or left in `pend` for the next mainloop (a.defer).
// mt: the first token row of the 128-token block; n0: the tile's first column. stg: the staging
// area (2 blocks of QG_STAGING_BYTES; consumer cw stores block cw). red: 16 floats.
// Cooperative / ping-pong: the consumer's two halves are the block's rows 0-63 and 64-127 of one
// head; wide: half h is head h of the tile, rows 64 cw .. 64 cw + 63 of each, so the two consumers
// exchange their maxima and fill both staged blocks.
template <int FORM>
__device__ __forceinline__ void epilogue_quant(float (&acc)[2][64], const QgArgs &a, int mt, int n0, int cw, int wtid,
                                               uint8_t *stg, float *red, PendingCodes &pend,
                                               const float4 (&rcs)[8]) {
    using F = QgForm<FORM>;
    const int warp = wtid >> 5, lane = wtid & 31, g = lane >> 2, t4 = lane & 3;
    const QgBlock blk = qg_block(a, mt, n0, F::WIDE ? cw : 0);  // the block this consumer stores
    const int which = blk.which, t0 = blk.t0;
    const int rbase = F::WIDE ? 64 * cw : 0;  // the consumer's first row in the block
    const int tr = t0 + rbase + 16 * warp + g;  // the thread's first token row
    if (F::WIDE && which < 2 && a.rope) {  // rope_to_smem's copies have landed (this thread's own)
        cp_async_wait_all();
        asm volatile("" ::: "memory");  // no read of them above the wait
    }
    const uint8_t *own = stg + cw * QG_STAGING_BYTES;
    round_and_rotate(acc, which < 2 && a.rope, [&](int h, int rr, int j) {
        if (F::WIDE) return rr == 0 ? rcs[j] : rope_smem_pairs(own, j, wtid);
        return rope_pairs(a.rope, tr + F::ROW_STEP * h + 8 * rr, j, t4);
    });

    // the block's amax (max is exact in any order) -> its scale, the same in every thread
    float mx[2] = {0.0f, 0.0f};
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int i = 0; i < 64; i++) mx[h] = fmaxf(mx[h], fabsf(acc[h][i]));
    if (!F::WIDE) mx[0] = fmaxf(mx[0], mx[1]);  // both halves are one block
#pragma unroll
    for (int h = 0; h < (F::WIDE ? 2 : 1); h++)
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) mx[h] = fmaxf(mx[h], __shfl_xor_sync(0xffffffffu, mx[h], o));
    float s[2];
    if constexpr (F::WIDE) {
        if (lane == 0) red[4 * cw + warp] = mx[0], red[8 + 4 * cw + warp] = mx[1];
        named_bar_sync<5, 256>();  // both consumers; also: the previous tile's staging reads are done
#pragma unroll
        for (int h = 0; h < 2; h++) s[h] = wide_block_scale(red, h, a.max_exp[which]);
    } else {
        if (lane == 0) red[4 * cw + warp] = mx[0];
        wg_bar_sync<1>(cw);  // also: the previous tile's staging reads are done
        mx[0] = fmaxf(fmaxf(red[4 * cw], red[4 * cw + 1]), fmaxf(red[4 * cw + 2], red[4 * cw + 3]));
        s[0] = s[1] = fp8_scale_for_amax_within(FP8_E4M3, mx[0], a.max_exp[which]);
    }
    if (wtid == 0) *blk.scale = cw && F::WIDE ? s[1] : s[0];

    // the codes into the staging area: two codes (columns 8 j + 2 t4, + 1) per 2-byte store
#pragma unroll
    for (int h = 0; h < 2; h++) {
        const uint32_t sbase = smem_addr(stg + (F::WIDE ? h : cw) * QG_STAGING_BYTES);
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const int r = rbase + F::ROW_STEP * h + 16 * warp + g + 8 * rr;
#pragma unroll
            for (int j = 0; j < 16; j++)
                stage_code_pair(sbase, r, j, t4,
                                cvt_e4m3x2(acc[h][4 * j + 2 * rr] * s[h], acc[h][4 * j + 2 * rr + 1] * s[h]));
        }
    }
    if constexpr (F::WIDE) named_bar_sync<5, 256>();
    else wg_bar_sync<1>(cw);

    // the block's stores: row-major codes, transposed codes
    pend.codes = blk.codes;
    pend.codes_t = blk.codes_t;
    if (!a.defer) {
        for (int c = 0; c < QG_CHUNKS; c++) store_codes_chunk(own, pend.codes, pend.codes_t, a.T, c, wtid);
        pend.codes = nullptr;
    }
}

// The BF16 epilogue (tests): rounded, rotated values straight from registers. Half h: rows
// m0 + ROW_STEP h .., columns n0 + COL_STEP h ..
template <int FORM>
__device__ __forceinline__ void epilogue_bf16(float (&acc)[2][64], const QgArgs &a, int m0, int n0, int wtid) {
    using F = QgForm<FORM>;
    const int warp = wtid >> 5, lane = wtid & 31, g = lane >> 2, t4 = lane & 3;
    const int tr = (a.rope ? m0 % a.T : 0) + 16 * warp + g;  // the thread's first token row
    round_and_rotate(acc, a.rope && n0 < 2 * a.C,
                     [&](int h, int rr, int j) { return rope_pairs(a.rope, tr + F::ROW_STEP * h + 8 * rr, j, t4); });
#pragma unroll
    for (int h = 0; h < 2; h++)
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            bf16 *row = a.y + (long)(m0 + F::ROW_STEP * h + 16 * warp + g + 8 * rr) * a.ldy + n0 + F::COL_STEP * h + 2 * t4;
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

// A stage's release by a consumer warp: one arrival (lane 0) on the stage's empty barrier in every
// CTA of the cluster (their producers' multicasts write this CTA's copy of the stage too).
template <int CL>
__device__ __forceinline__ void release_stage(uint64_t *empty, int s, int lane, int rank) {
    if (lane != 0) return;
    mbar_arrive(&empty[s]);
    for (int r = 1; r < CL; r++) mbar_arrive_cluster(&empty[s], (uint32_t)((rank + r) % CL));
}

// K block q of a consumer's mainloop issued: the stage's full barrier waited for, its 4 k16 steps
// (m64n256k16 once, or m64n128k16 for each 64-row half) into acc as one commit group. d0, dw0: the
// descriptors' low words of this consumer's x rows and of W's tile in stage 0.
template <class F>
__device__ __forceinline__ void issue_k_block(float (&acc)[2][64], uint64_t *full, uint32_t d0, uint32_t dw0,
                                              unsigned q, int kb) {
    const int s = q % F::STAGES;
    mbar_wait(&full[s], (q / F::STAGES) & 1);
    const uint32_t da = d0 + s * (F::STAGE_BYTES / 16), db = dw0 + s * (F::STAGE_BYTES / 16);
    wgmma_fence();
#pragma unroll
    for (int kk = 0; kk < QG_BK / 16; kk++) {  // 32 bytes per k16 step
        const int accum = kb > 0 || kk > 0;
        if constexpr (F::WIDE) {
            wgmma_m64n256_ss(acc[0], acc[1], kmajor_desc(da + 2 * kk), kmajor_desc(db + 2 * kk), accum);
        } else {
            wgmma_m64n128_ss(acc[0], kmajor_desc(da + 2 * kk), kmajor_desc(db + 2 * kk), accum);
            wgmma_m64n128_ss(acc[1], kmajor_desc(da + 64 * 128 / 16 + 2 * kk), kmajor_desc(db + 2 * kk), accum);
        }
    }
    wgmma_commit();
}

// The wide forms' consumer loop with the overlapped epilogue (qkv_gemm_overlap.cuh): tile k's
// mainloop runs one slice of tile k - 1's epilogue per K block, then the slices it had no K block
// for; after the CTA's last tile, that tile's slices run on their own. (One loop with a pass
// without a mainloop for the last tile made ptxas serialize every wgmma, C7518.)
template <int FORM>
__device__ __forceinline__ void consumer_overlapped(const QgArgs &a, uint8_t *smem, uint64_t *full,
                                                    uint64_t *empty, float *red, int cid, int n_clusters,
                                                    int n_units, int n_rows, int rank, int cw, int wtid) {
    using F = QgForm<FORM>;
    constexpr int S = F::STAGES, CL = F::CLUSTER;
    const int lane = wtid & 31;
    const uint32_t d0 = kmajor_desc_lo(smem_addr(smem + cw * F::CONSUMER_ROWS * 128));
    const uint32_t dw0 = kmajor_desc_lo(smem_addr(smem + F::X_BYTES));
    uint8_t *stg = smem + F::RING_BYTES;
    auto release = [&](int s) { release_stage<CL>(empty, s, lane, rank); };
    OverlapEpi ep;
    // the pending tile's position and addresses, before its slice 0 (the mainloop needs neither)
    auto locate = [&] {
        const UnitPos p = unit_pos(ep.unit, a.n_tn, n_rows, a.group_rows);
        ep.locate(a, (p.row * CL + rank) * F::BM, p.col * F::BN, cw, wtid);
    };
    for (int k = 0;; k++) {
        const int u = cid + k * n_clusters;
        if (u >= n_units) break;
        const unsigned q0 = (unsigned)k * a.nk;
        float acc[2][64];
        for (int kb = 0; kb < a.nk; kb++) {
            const unsigned q = q0 + kb;
            issue_k_block<F>(acc, full, d0, dw0, q, kb);
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

// The consumer loop with the serial epilogue (every form; the wide forms' with QKV_GEMM_DEFER < 2):
// each tile's mainloop, then its epilogue, whose code stores are deferred into the next mainloop
// unless a.defer is 0.
template <bool QUANT, int FORM>
__device__ __forceinline__ void consumer_serial(const QgArgs &a, uint8_t *smem, uint64_t *full, uint64_t *empty,
                                                float *red, int cid, int n_clusters, int n_units, int n_rows, int rank,
                                                int cw, int wtid) {
    using F = QgForm<FORM>;
    constexpr int S = F::STAGES, CL = F::CLUSTER;
    const int lane = wtid & 31;
    // descriptor low words of stage 0: this consumer's rows of x (ping-pong: all 128), W's tile
    const uint32_t d0 = kmajor_desc_lo(smem_addr(smem + (F::PINGPONG ? 0 : cw * F::CONSUMER_ROWS * 128)));
    const uint32_t dw0 = kmajor_desc_lo(smem_addr(smem + F::X_BYTES));
    uint8_t *stg = smem + F::RING_BYTES;  // 2 staged blocks; this consumer stores block cw
    const uint8_t *own = stg + cw * QG_STAGING_BYTES;
    PendingCodes pend;  // the previous tile's code stores, when deferred (a.defer)
    auto release = [&](int s) { release_stage<CL>(empty, s, lane, rank); };
    // ping-pong: consumer cw takes the CTA's tiles k = cw, cw + 2, ..; the others: every tile
    for (int k = F::PINGPONG ? cw : 0;; k += F::PINGPONG ? 2 : 1) {
        const int u = cid + k * n_clusters;  // the unit (without clusters: the tile)
        if (u >= n_units) break;
        const unsigned q0 = (unsigned)k * a.nk;
        const UnitPos p = unit_pos(u, a.n_tn, n_rows, a.group_rows);
        const int tm = p.row * CL + rank, n0 = p.col * F::BN;
        // ping-pong order: this tile's mainloop waits until the other consumer's tile k - 1 has
        // passed all its full barriers (see order_wait)
        if (F::PINGPONG && k > 0) order_wait(cw);
        // the wide forms' RoPE: this consumer's first token row (t_own), whether the tile is q or k
        const bool rot = F::WIDE && a.rope && n0 < 2 * a.C;
        const int t_own = F::WIDE ? tm * F::BM % max(a.T, 1) + 64 * cw : 0;
        float acc[2][64];
        for (int kb = 0; kb < a.nk; kb++) {
            const unsigned q = q0 + kb;
            issue_k_block<F>(acc, full, d0, dw0, q, kb);
            // the previous tile's deferred stores, a piece per K block, while the tensor cores work
            if (QUANT && pend.codes && kb < QG_CHUNKS) store_codes_chunk(own, pend.codes, pend.codes_t, a.T, kb, wtid);
            if (QUANT && F::WIDE && rot && kb == QG_CHUNKS)  // the stores' reads are done: RoPE's row 1 in
                rope_to_smem(stg + cw * QG_STAGING_BYTES, a.rope, cw, t_own, wtid);
            wgmma_wait<1>();  // the previous block's matmuls are done: its stage is free
            if (kb > 0) release((q - 1) % S);
        }
        if (F::PINGPONG && u + n_clusters < n_units) order_release(cw);  // the other consumer's tile k + 1 may start
        if (QUANT && pend.codes) {  // pieces the mainloop had no K block for
            for (int c = a.nk; c < QG_CHUNKS; c++) store_codes_chunk(own, pend.codes, pend.codes_t, a.T, c, wtid);
            pend.codes = nullptr;
        }
        if (QUANT && F::WIDE && rot && a.nk <= QG_CHUNKS)  // (no K block after the stores' pieces)
            rope_to_smem(stg + cw * QG_STAGING_BYTES, a.rope, cw, t_own, wtid);
        // the wide form's RoPE pairs of this consumer's first rows (64 cw .. of the token block),
        // loaded while the last K block's matmuls run (rope_preload; inside the loop, a conditional
        // load kept them live across it and ptxas spilled)
        float4 rcs[8];
        if (QUANT && F::WIDE && rot) rope_preload(rcs, a.rope, t_own, wtid >> 5, lane >> 2, lane & 3);
        wgmma_wait<0>();
        reg_fence(acc[0]);  // the epilogue reads acc only after the wait (no hoisting above it)
        reg_fence(acc[1]);
        release((q0 + a.nk - 1) % S);
        if constexpr (QUANT) {
            epilogue_quant<FORM>(acc, a, tm * F::BM + (FORM == QG_FORM_COOP ? cw * QG_TILE : 0), n0, cw, wtid, stg,
                                 red, pend, rcs);
        } else {
            epilogue_bf16<FORM>(acc, a, tm * F::BM + cw * (F::PINGPONG ? 0 : F::CONSUMER_ROWS), n0, wtid);
        }
    }
    if (QUANT && pend.codes)  // the last tile's stores
        for (int c = 0; c < QG_CHUNKS; c++) store_codes_chunk(own, pend.codes, pend.codes_t, a.T, c, wtid);
}

template <bool QUANT, int FORM, bool OVL = false>
__global__ void __launch_bounds__(QG_THREADS, 1)
    qkv_gemm_kernel(const __grid_constant__ CUtensorMap tm_x, const __grid_constant__ CUtensorMap tm_w,
                    const QgArgs a) {
    using F = QgForm<FORM>;
    constexpr int S = F::STAGES;
    extern __shared__ __align__(16) unsigned char smem_raw[];
    uint8_t *smem = smem_align1024(smem_raw);
    uint64_t *full = reinterpret_cast<uint64_t *>(smem + F::BARS_OFF), *empty = full + S;
    float *red = reinterpret_cast<float *>(empty + S);  // 16 warp maxima
    // Clusters of F::CLUSTER CTAs (rank `rank`) walk the same units (a unit: F::CLUSTER tiles on
    // neighbouring token blocks of the same columns, tile rank of the unit to the CTA of that rank):
    // unit u = cluster + k n_clusters, so both CTAs of a cluster fill and drain their rings alike.
    constexpr int CL = F::CLUSTER;
    const int rank = CL > 1 ? (int)cluster_ctarank() : 0;
    const int cid = blockIdx.x / CL, n_clusters = gridDim.x / CL, n_units = a.n_tiles / CL;
    const int n_rows = n_units / a.n_tn;  // unit rows
    if (threadIdx.x == 0) {
        for (int s = 0; s < S; s++) {
            mbar_init(&full[s], 1);                   // the producer's arrive (with the TMA bytes)
            mbar_init(&empty[s], F::EMPTY_ARRIVALS);  // the consuming warps (of both CTAs in a cluster)
        }
        mbar_fence_init();
    }
    __syncthreads();
    if (CL > 1) cluster_sync();  // the peer's barriers are initialized before anything reaches them

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
                    mbar_arrive_expect_tx(&full[s], F::STAGE_BYTES);  // x, and W from every CTA of the cluster
                    uint8_t *st = smem + s * F::STAGE_BYTES;
                    tma_load_2d(st, &tm_x, &full[s], kb * QG_BK, tm * F::BM);
                    if (CL > 1)  // this CTA's part of W, into every CTA of the cluster
                        tma_load_2d_multicast(st + F::X_BYTES + rank * (F::W_BYTES / CL), &tm_w, &full[s], kb * QG_BK,
                                              tn * F::BN + rank * (F::BN / CL), (uint16_t)((1u << CL) - 1));
                    else
                        tma_load_2d(st + F::X_BYTES, &tm_w, &full[s], kb * QG_BK, tn * F::BN);
                }
            }
        }
    } else {
        // ---- consumers
        setmaxnreg_inc<232>();
        const int cw = ((int)threadIdx.x - 128) >> 7, wtid = threadIdx.x & 127;
        if constexpr (OVL) {
            static_assert(QUANT && F::WIDE, "the overlapped epilogue is the wide forms' quantizing one");
            consumer_overlapped<FORM>(a, smem, full, empty, red, cid, n_clusters, n_units, n_rows, rank, cw, wtid);
        } else {
            consumer_serial<QUANT, FORM>(a, smem, full, empty, red, cid, n_clusters, n_units, n_rows, rank, cw, wtid);
        }
    }
    if (CL > 1) cluster_sync();  // no CTA leaves while its peer may still arrive on its barriers
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
// (QKV_GEMM_FORM=pingpong|coop|wide|wide2), else the default; a form the shape does not allow falls
// back (wide2: M a multiple of 256, whole pairs of token blocks, else wide; wide: N and C multiples
// of 256, so that a tile's two heads are one operand's, else cooperative; cooperative: M a
// multiple of 256, else ping-pong, which takes every shape). Measured against the others in the
// same calls (docs/perf.md, stop 37; quantizing, C 1536 / 2048 / 3072, B T 16384): wide2 575 / 588 /
// 612 TFLOP/s, cooperative 556 / 571 / 594 with deferred stores and 532 / 557 / 608 without (stop
// 36's default), ping-pong 542 / 544 / 556, wide 581 / 583 / 613; cuBLASLt's BF16 GEMM 696 / 693 /
// 650. The default is wide2. With stop 38's overlapped epilogue wide was 0.3-1.9% faster in nine
// comparisons; with stop 39's (the tile's addresses and position under the next mainloop, the
// amax packed) wide2 is ahead again at C 2048 and 3072 (0.933 / 0.993 of cuBLASLt's rate against
// 0.920 / 0.982) and behind at C 1536 (0.903 against 0.910), one call, two passes each.
// What runs under the next mainloop likewise (qkv_gemm_test_defer, else QKV_GEMM_DEFER=0|1|2, else
// 2): the wide forms' whole epilogue at 2, the code stores at 1 and 2 in the others (ping-pong never
// defers, launch_form). Measured (stop 38, C 2048 / 1536 / 3072, two calls): wide2 601-603 /
// 606-609 / 618-626 TFLOP/s at 2, 576-581 / 574-589 / 591-598 at 1.
static int qkv_gemm_test_form_kind = -1, qkv_gemm_test_defer_kind = -1, qkv_gemm_test_group = -1;
extern "C" void qkv_gemm_test_form(int form) { qkv_gemm_test_form_kind = form < QG_N_FORMS ? form : -1; }
extern "C" void qkv_gemm_test_defer(int level) { qkv_gemm_test_defer_kind = level; }
extern "C" void qkv_gemm_test_group_rows(int rows) { qkv_gemm_test_group = rows; }
static int form_of(int M, int N, int C) {
    static const int env = attn_env_choice("QKV_GEMM_FORM", qg_form_names, QG_N_FORMS);
    int form = qkv_gemm_test_form_kind >= 0 ? qkv_gemm_test_form_kind : env >= 0 ? env : QG_FORM_WIDE2;
    if (form == QG_FORM_WIDE2 && M % (2 * QG_TILE)) form = QG_FORM_WIDE;
    if ((form == QG_FORM_WIDE || form == QG_FORM_WIDE2) && (N % (2 * QG_TILE) || C % (2 * QG_TILE))) form = QG_FORM_COOP;
    if (form == QG_FORM_COOP && M % (2 * QG_TILE)) form = QG_FORM_PINGPONG;
    return form;
}

static int qg_last_grid = 0;  // the last launch's CTAs (qkv_gemm_last_grid)
extern "C" int qkv_gemm_last_grid(void) { return qg_last_grid; }

template <bool QUANT, int FORM>
static void launch_form(QgArgs a, const uint16_t *x, const uint16_t *w, int M, int N, int K, cudaStream_t stream) {
    using F = QgForm<FORM>;
    constexpr bool CAN_OVL = QUANT && F::WIDE;  // the overlapped epilogue: the wide forms' quantizing one
    static bool attr_set = false;
    if (!attr_set) {
        CUDA_OK(cudaFuncSetAttribute(qkv_gemm_kernel<QUANT, FORM>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     F::SMEM_BYTES));
        CUDA_OK(cudaFuncSetAttribute(qkv_gemm_kernel<QUANT, FORM, CAN_OVL>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                     F::SMEM_BYTES));
        attr_set = true;
    }
    const CUtensorMapDataType bf = CU_TENSOR_MAP_DATA_TYPE_BFLOAT16;
    const CUtensorMap tm_x = tensor_map_2d("the QKV GEMM's x", bf, x, K, M, 2L * K, QG_BK, F::BM,
                                           CU_TENSOR_MAP_SWIZZLE_128B);
    const CUtensorMap tm_w = tensor_map_2d("the QKV GEMM's W", bf, w, K, N, 2L * K, QG_BK, F::BN / F::CLUSTER,
                                           CU_TENSOR_MAP_SWIZZLE_128B);
    a.n_tn = N / F::BN;
    a.n_tiles = M / F::BM * a.n_tn;
    a.nk = K / QG_BK;
    // ping-pong stores at once: its epilogue already runs under the other consumer's matmuls, and
    // deferring moved the stores into its own mainloop, 2-4% slower (stop 37, two calls, 3 widths)
    static const int env_defer = attn_env_count("QKV_GEMM_DEFER");
    const int level = qkv_gemm_test_defer_kind >= 0 ? qkv_gemm_test_defer_kind : env_defer >= 0 ? env_defer : 2;
    a.defer = !F::PINGPONG && level >= 1 ? 1 : 0;
    const bool ovl = CAN_OVL && level >= 2;
    void (*const kernel)(CUtensorMap, CUtensorMap, QgArgs) =
        ovl ? qkv_gemm_kernel<QUANT, FORM, CAN_OVL> : qkv_gemm_kernel<QUANT, FORM>;
    static const int env_group = attn_env_count("QKV_GEMM_GROUP_ROWS");
    a.group_rows = qkv_gemm_test_group >= 0 ? qkv_gemm_test_group : env_group >= 0 ? env_group : 0;
    // one CTA per SM; ping-pong CTAs work on two tiles at a time
    int grid = F::PINGPONG ? (a.n_tiles + 1) / 2 : a.n_tiles;
    cudaLaunchConfig_t cfg;
    memset(&cfg, 0, sizeof cfg);
    cudaLaunchAttribute attr[1];
    cfg.blockDim = dim3(QG_THREADS);
    cfg.dynamicSmemBytes = F::SMEM_BYTES;
    cfg.stream = stream;
    static int max_ctas = 0;  // CTAs resident at once: one per SM, whole clusters (one device per process)
    if (F::CLUSTER > 1) {
        attr[0].id = cudaLaunchAttributeClusterDimension;
        attr[0].val.clusterDim.x = F::CLUSTER;
        attr[0].val.clusterDim.y = attr[0].val.clusterDim.z = 1;
        cfg.attrs = attr;
        cfg.numAttrs = 1;
        if (max_ctas == 0) {
            int n_clusters = 0;
            cfg.gridDim = dim3(attn_sm_count() / F::CLUSTER * F::CLUSTER);
            CUDA_OK(cudaOccupancyMaxActiveClusters(&n_clusters, kernel, &cfg));
            if (n_clusters < 1) FATAL("qkv_gemm: no cluster of %d CTAs fits the device", F::CLUSTER);
            max_ctas = n_clusters * F::CLUSTER;
        }
    } else {
        max_ctas = attn_sm_count();
    }
    if (grid > max_ctas) grid = max_ctas;
    cfg.gridDim = dim3((unsigned)grid);
    qg_last_grid = grid;
    CUDA_OK(cudaLaunchKernelEx(&cfg, kernel, tm_x, tm_w, a));
}

template <bool QUANT>
static void launch(QgArgs a, const uint16_t *x, const uint16_t *w, int M, int N, int K, cudaStream_t stream) {
    // one launcher per form, in the enum's order (QG_FORM_*)
    static void (*const by_form[])(QgArgs, const uint16_t *, const uint16_t *, int, int, int, cudaStream_t) = {
        launch_form<QUANT, QG_FORM_PINGPONG>, launch_form<QUANT, QG_FORM_COOP>, launch_form<QUANT, QG_FORM_WIDE>,
        launch_form<QUANT, QG_FORM_WIDE2>};
    static_assert(sizeof by_form / sizeof by_form[0] == QG_N_FORMS, "a launcher for every QG_FORM_*");
    by_form[form_of(M, N, a.C)](a, x, w, M, N, K, stream);
}

extern "C" const char *qkv_gemm_form_name(int M, int N, int C) { return qg_form_names[form_of(M, N, C)]; }

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
