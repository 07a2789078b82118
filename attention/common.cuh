// common.cuh: what the attention kernels share beyond the PTX wrappers of gpu/ptx/: the causal
// CTA and tile orders (heaviest first within head groups sized for L2), the persistent kernels'
// tile counter and producer / consumer ring, the online-softmax row helpers, the epilogues (O by
// fragments or by TMA, dK and dV through shared memory), FP8 scale reciprocals, and the host-side
// argument check and SM count. Everything here is inline, static or a template.
#ifndef ATTENTION_GPU_COMMON_CUH
#define ATTENTION_GPU_COMMON_CUH

#include <cuda_bf16.h>     // __nv_bfloat16
#include <cuda_runtime.h>  // cudaError_t, cudaGetErrorString
#include <stdint.h>        // uint32_t, uint64_t, uintptr_t

#include "core/common.h"             // FATAL
#include "core/fp8.h"                // FP8_SCALE_MAX_EXP: the range of the quantization scales
#include "gpu/fp8_cvt.cuh"           // cvt_e4m3x2 / cvt_e5m2x2: the hardware FP8 conversion (finite inputs here)
#include "gpu/ptx/async_copy.cuh"    // cp.async, mbarriers, TMA, bulk copies
#include "gpu/ptx/fast_exp2.cuh"     // fast_exp2: the softmax exponentials (inputs <= 0 or -inf)
#include "gpu/ptx/mma.cuh"           // ldmatrix / stmatrix, mma.sync, pack_bf16
#include "gpu/ptx/smem.cuh"          // smem_addr, smem_align1024, sw128, lds / sts
#include "gpu/ptx/warpgroup.cuh"     // named barriers, setmaxnreg, opaque_u32, nsmid_nonzero
#include "gpu/ptx/wgmma.cuh"         // wgmma wrappers, descriptors, fences, reg_fence

typedef __nv_bfloat16 bf16;

#define CUDA_OK(call)                                                                    \
    do {                                                                                 \
        cudaError_t err_ = (call);                                                       \
        if (err_ != cudaSuccess)                                                         \
            FATAL("%s failed: %s (check the GPU and the arguments of the attention call)", \
                  #call, cudaGetErrorString(err_));                                      \
    } while (0)

// Causal kernels' work items (block rank, head), heaviest first within groups of hg heads: item
// t (of n_blocks blocks per head, n_bh heads) lies in group t / (hg n_blocks); inside it, rank =
// w / hg' and head = group hg + w % hg' (w = t's place in the group, hg' = the group's heads,
// fewer in a last partial group). The kernel maps rank 0 to its longest block loop, so each
// group's long items start first and its short ones fill in behind them. hg = n_bh is heaviest
// first over all heads; with the natural order (each head's blocks in turn) the last heads'
// longest CTAs start near the end and run alone. Smaller groups keep the items that run at once
// on fewer heads, whose K̂, V̂ blocks then stay in L2 (causal_heads_per_group picks hg).
// On one H200 (measured 2026-11-30), against heaviest first over all heads: the persistent FP8
// forward in head groups of two waves of CTAs 2-5% faster, the delta pass 9-19% faster at 1K-2K;
// the main FP8 backward in groups of one wave +2-4% over the natural order (over all heads, -18-21%
// at 1K-2K: its CTAs running at once no longer share a head's Q̂, dÔ blocks and dQ rows in L2); the
// BF16 kernels in groups of about one wave: the forward 6-29% and the backward 0-27% faster (most
// at T = 1K-2K).
struct CausalItem {
    int rank, bh;
};
__host__ __device__ __forceinline__ CausalItem causal_item_grouped(unsigned t, int n_blocks, int n_bh, int hg) {
    const unsigned per = (unsigned)(hg * n_blocks), grp = t / per, w = t - grp * per;
    const int left = n_bh - (int)grp * hg, hge = hg < left ? hg : left;  // (host-callable: no min)
    return {(int)(w / (unsigned)hge), (int)grp * hg + (int)(w % (unsigned)hge)};
}
// The next work item of a persistent CTA (the FP8 forward, fp8_dm's delta pass): CTAs take
// the next tile from a counter in global memory when they start one (dynamic, in the order of
// the tile numbers: the greedy schedule the hardware's own block scheduler gives a grid of one
// CTA per tile). counter[0] hands out the tiles, counter[1] counts the CTAs that have seen the
// end (every CTA fetches once more than its tiles); the last of them sets both back to 0, so
// every launch starts from 0 without a memset, also when replayed from a CUDA graph. Launches on
// one stream follow each other, so the kernels on one stream share its counter
// (attn_fp8_tile_counter, attention/kernels_fp8.h); launches on different streams may overlap.
// With counter NULL (tests: gpu_test_hooks.fwd_fp8_static_order) the order is fixed instead: CTA c of G takes tiles r G + c on even rounds r and r G + G - 1 - c on odd ones (a
// snake, so that the CTAs get about the same amount of work). Called by one thread.
__device__ __forceinline__ int persistent_next_tile(unsigned *counter, int round, int n_tiles) {
    if (!counter) {
        const int G = (int)gridDim.x, c = (int)blockIdx.x;
        return round * G + ((round & 1) ? G - 1 - c : c);
    }
    const unsigned t = atomicAdd(counter, 1u);
    if (t >= (unsigned)n_tiles) {
        // this CTA's last fetch is done (the fence orders it before the count below, so the
        // reset cannot overtake another CTA's fetch)
        __threadfence();
        if (atomicAdd(counter + 1, 1u) == gridDim.x - 1) {
            atomicExch(counter, 0u);
            atomicExch(counter + 1, 0u);
        }
        return n_tiles;
    }
    return (int)t;
}

// hg for causal_item_grouped: the most heads whose shared operands (kv_bytes_per_head: the
// forwards' K and V, the backwards' Q and dO, with their copies) fit in 16 MiB (a third of the
// H200's 50 MB L2, the rest being the CTAs' own tiles, outputs and the other partition's copies),
// but at least enough heads for min_items items per group (the caller's choice, measured per
// kernel: two waves of CTAs for the persistent FP8 forward, one wave for the one-CTA-per-item
// kernels, so that a group's long items have short ones to overlap), at most n_bh.
static inline int causal_heads_per_group(long kv_bytes_per_head, int n_blocks, int n_bh, int min_items) {
    const long fit = (16L << 20) / (kv_bytes_per_head > 0 ? kv_bytes_per_head : 1);
    const int need = (min_items + n_blocks - 1) / (n_blocks > 0 ? n_blocks : 1);
    const long hg = fit < need ? need : fit;
    return hg < 1 ? 1 : hg > n_bh ? n_bh : (int)hg;
}
// The number of SMs of the current device, once per process (one device per process: one GPU
// per rank). The causal kernels' group sizes and the persistent FP8 forward's grid use it.
static inline int attn_sm_count(void) {
    static int n_sm = 0;
    if (n_sm == 0) {
        int dev = 0;
        CUDA_OK(cudaGetDevice(&dev));
        CUDA_OK(cudaDeviceGetAttribute(&n_sm, cudaDevAttrMultiProcessorCount, dev));
    }
    return n_sm;
}

// --- the dK, dV epilogue of the backward kernels (attention/bwd_fp8.cu, attention/bwd_bf16.cu) ----------
// A CTA's 128 keys x D of dV and tau dK go from the two consumer warpgroups' wgmma accumulators
// (FP32, rows = keys) to BF16 rows of dv and dk through a staging area of 2 x 128 rows of 2D bytes
// in shared memory: stmatrix writes the fragments as 8 x 8 tiles (a tile row is one 16-byte chunk;
// chunk c of row r sits at c ^ (r % 8), so the 8 rows of a tile fall in 8 different bank quads),
// then the threads copy whole rows out in 16-byte chunks. Stored straight from the fragments, D / 2
// four-byte stores per thread would each cover half of the sectors they touch: on one H200
// (measured 2026-11-30) the staged copy makes the FP8 backward 2-7.5% and the BF16 backward 0-6%
// faster (most at T = 1K). Byte offset in the area of chunk c of row r of tensor t (0: dV, 1: dK):
template <int D>
__device__ __forceinline__ uint32_t dkdv_chunk(int t, int r, int c) {
    return (uint32_t)((t * 128 + r) * (2 * D) + 16 * (c ^ (r & 7)));
}
// The staging writes of one warp: its 16 accumulator rows start at row wrow0 of the area (64 w +
// 16 warp); dK is scaled by tau on the way (one rounding: BF16(dK tau)).
template <int D>
__device__ __forceinline__ void dkdv_stage(uint32_t area, const float (&dka)[D / 2], const float (&dva)[D / 2],
                                           float tau, int wrow0) {
    // lanes 8i .. 8i+7 address the rows of tile i: (n-tile n, rows 0-7), (n, 8-15), (n+1, 0-7), (n+1, 8-15)
    const int lane = threadIdx.x & 31, r = wrow0 + (lane & 7) + 8 * ((lane >> 3) & 1), cn = lane >> 4;
#pragma unroll
    for (int t = 0; t < 2; t++) {
        const float(&acc)[D / 2] = t ? dka : dva;
        const float f = t ? tau : 1.0f;
#pragma unroll
        for (int n = 0; n < D / 8; n += 2)
            stmatrix_x4(area + dkdv_chunk<D>(t, r, n + cn), pack_bf16(acc[4 * n] * f, acc[4 * n + 1] * f),
                        pack_bf16(acc[4 * n + 2] * f, acc[4 * n + 3] * f),
                        pack_bf16(acc[4 * n + 4] * f, acc[4 * n + 5] * f),
                        pack_bf16(acc[4 * n + 6] * f, acc[4 * n + 7] * f));
    }
}
// The copy out by NT threads (thread index i < NT), after a barrier over the staging writes: rows
// of keys k0 .. k0 + 127 (those < T) of head h of batch b, gbase = b T stride + h D elements.
template <int D, int NT>
__device__ __forceinline__ void dkdv_copy_out(const unsigned char *area, bf16 *dk, bf16 *dv, long gbase,
                                              int stride, int k0, int T, int i0) {
#pragma unroll 4
    for (int i = i0; i < 2 * 128 * (D / 8); i += NT) {
        const int t = i / (128 * (D / 8)), row = (i / (D / 8)) % 128, c = i % (D / 8), key = k0 + row;
        if (key < T)
            *reinterpret_cast<uint4 *>((t ? dk : dv) + gbase + (long)key * stride + 8 * c) =
                *reinterpret_cast<const uint4 *>(area + dkdv_chunk<D>(t, row, c));
    }
}

// --- the forwards' O epilogue by TMA (attention/fwd_bf16.cu, attention/fwd_fp8.cu) --------------------
// A warpgroup's 64 rows of O = acc / l in BF16 go to a staging area with stmatrix, as D / 64 boxes
// of 64 rows x 128 bytes in TMA's 128-byte swizzle (16-byte chunk c of row r at c ^ (r % 8): the 8
// rows of an 8 x 8 tile fall in 8 different bank quads), HALF bytes apart, which one thread then
// stores with D / 64 bulk tensor copies (store_o_tma, below: tensor_map_bthd with 64 rows). The 4-byte
// stores straight from the fragments (fwd_store_rows, the fallback for O rows that are not 16-byte
// aligned) each cover half of the 8 sectors they touch and hold the consumers ~1.5-1.8 us per tile
// (9-13% of the forwards' SM time at T = 2K). The same products and roundings as fwd_store_rows:
// O is the same bit for bit. inv[r] = 1 / l of the thread's row g + 8 r; warp: within the warpgroup.
template <int D, int HALF>
__device__ __forceinline__ void stage_o_sw128(uint32_t area, const float (&acc)[D / 2], const float (&inv)[2],
                                              int warp) {
    // lanes 8i .. 8i+7 address the rows of tile i: (n-tile n, rows 0-7), (n, 8-15), (n+1, 0-7), (n+1, 8-15)
    const int lane = threadIdx.x & 31, r = warp * 16 + (lane & 7) + 8 * ((lane >> 3) & 1), cn = lane >> 4;
#pragma unroll
    for (int n = 0; n < D / 8; n += 2) {
        const int c = n + cn;  // 16-byte chunk of the row: 8 BF16 columns
        stmatrix_x4(area + (c >> 3) * HALF + r * 128 + (((c & 7) ^ (r & 7)) << 4),
                    pack_bf16(acc[4 * n] * inv[0], acc[4 * n + 1] * inv[0]),
                    pack_bf16(acc[4 * n + 2] * inv[1], acc[4 * n + 3] * inv[1]),
                    pack_bf16(acc[4 * n + 4] * inv[0], acc[4 * n + 5] * inv[0]),
                    pack_bf16(acc[4 * n + 6] * inv[1], acc[4 * n + 7] * inv[1]));
    }
}

// Row statistics and the epilogue of the forward kernels. quad_sum / quad_max: a row's sum / max
// over the 4 threads of a quad (the threads of one accumulator row), in all four. fwd_store_rows: this thread's two rows row0 and
// row0 + 8 (those < T) of O = acc * inv_l[r] in BF16 (inv_l = 1 / l, or the FP8 forward's factor), acc in the mma / wgmma fragment order (element
// 4n + 2r + c is row r, column 8n + 2 t4 + c), o the head's first row, and from the quad's first
// thread lse_head[row] = lse_of(r).
__device__ __forceinline__ void quad_sum(float (&v)[2]) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        v[r] += __shfl_xor_sync(0xffffffffu, v[r], 1);
        v[r] += __shfl_xor_sync(0xffffffffu, v[r], 2);
    }
}
__device__ __forceinline__ float quad_max(float v) {
    v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 1));
    return fmaxf(v, __shfl_xor_sync(0xffffffffu, v, 2));
}
// The BF16 forwards' online-softmax step for this thread's two rows: mx (the block's row maxima
// of this thread, raw S) becomes the row's maximum over the quad, which becomes the running max
// m; ms = that max in log2 units (S * scale_log2), alpha the factor for the old accumulators.
__device__ __forceinline__ void online_max_step(float (&mx)[2], float (&m)[2], float (&ms)[2], float (&alpha)[2],
                                                float scale_log2) {
#pragma unroll
    for (int r = 0; r < 2; r++) {  // one row at a time, as the kernels were scheduled and measured
        mx[r] = quad_max(mx[r]);
        ms[r] = mx[r] * scale_log2;
        alpha[r] = exp2f(m[r] * scale_log2 - ms[r]);
        m[r] = mx[r];
    }
}
// fwd_store_lse: the LSE part alone (the O-by-TMA epilogue, store_o_tma, writes O itself).
template <class LseOf>
__device__ __forceinline__ void fwd_store_lse(float *lse_head, int row0, int T, int t4, LseOf lse_of) {
    if (t4 == 0)
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (row0 + 8 * r < T) lse_head[row0 + 8 * r] = lse_of(r);
}
template <int D, class LseOf>
__device__ __forceinline__ void fwd_store_rows(const float (&acc)[D / 2], const float (&inv_l)[2], bf16 *o, int o_stride,
                                               float *lse_head, int row0, int T, int t4, LseOf lse_of) {
#pragma unroll
    for (int r = 0; r < 2; r++) {
        const int row = row0 + r * 8;
        if (row >= T) continue;
        const float inv = inv_l[r];
        bf16 *orow = o + (long)row * o_stride;
#pragma unroll
        for (int n = 0; n < D / 8; n++)
            *reinterpret_cast<uint32_t *>(orow + n * 8 + 2 * t4) =
                pack_bf16(acc[4 * n + 2 * r] * inv, acc[4 * n + 2 * r + 1] * inv);
    }
    fwd_store_lse(lse_head, row0, T, t4, lse_of);
}

// 1 / s for a quantization scale s: fp8_scale_for_amax (fp8.h) gives s = 2^k with |k| <= 126 (or
// s = 1), so 1 / s = 2^-k exactly, the value the IEEE division 1.0f / s returns; with bits(2^k) =
// (127 + k) << 23 it is bits(2^-k) = (127 - k) << 23 = (254 << 23) - bits(2^k), a normal float
// (exponent field 1..253). One integer subtraction instead of the division (MUFU.RCP, a Newton
// step, a range check and a branch to a slow-path call). Wrong for a scale that is not a power of
// two, which the quantize kernels never produce (the FP8 kernels' scale arrays must come from them).
static_assert(FP8_SCALE_MAX_EXP <= 126, "pow2_recip: 2^-k must be a normal float");
__device__ __forceinline__ float pow2_recip(float s) { return __int_as_float(0x7f000000 - __float_as_int(s)); }

// The forwards' O epilogue by TMA for consumer warpgroup wg: O = acc * inv_l into its staging area
// (stage_o_sw128: D / 64 boxes HALF bytes apart), then thread `issuer` stores the boxes as rows
// t0 .. t0 + 63 of head h of sequence b (tm_o: tensor_map_bthd with 64 rows) in its bulk group.
// A caller that reuses the area waits for the previous store's reads first (bulk_wait_read by
// the issuer, then wg_bar_sync), and the issuer waits for the last one before the CTA ends.
template <int D, int HALF, int BAR>
__device__ __forceinline__ void store_o_tma(const void *tm_o, uint32_t area, const float (&acc)[D / 2],
                                            const float (&inv_l)[2], int wg, int warp, bool issuer, int h, int t0,
                                            int b) {
    stage_o_sw128<D, HALF>(area, acc, inv_l, warp);
    fence_proxy_async();  // the stmatrix writes -> the bulk copy's reads
    wg_bar_sync<BAR>(wg);
    if (issuer) {
#pragma unroll
        for (int c = 0; c < D / 64; c++) tma_store_4d(tm_o, area + c * HALF, 64 * c, h, t0, b);
        bulk_commit();
    }
}

// --- the persistent FP8 kernels' producer / consumer ring (the forward, fp8_dm's delta pass) ---
// A CTA of 3 warpgroups: the producer (threads 0..127) copies each tile's fixed operands into
// one of 2 tile buffers and each key block's operands into a ring of STAGES stages with cp.async;
// the consumers (256 threads) compute. mbarriers pace them (PersistentRing::init): per stage `full` (the
// producer's 128 threads, each once its copies landed) and `empty` (every consumer thread after its
// last read of the stage; WARP_RELEASE: lane 0 of each of the 8 consumer warps once the warp's
// lanes are past it, 8 arrivals per block instead of 256: the FP8 forward's, ~1% faster there, but
// 2-3% slower in the delta pass at 1K-2K); per tile buffer `q_full` (the
// producer's thread 0, once it posted the tile's number in tile_slot) and `q_empty` (every consumer
// thread, once done with the buffer).
// The ring runs on across the CTA's tiles: ring block `it` (key blocks counted over all its
// tiles) goes into stage it % STAGES once the consumers released ring block it - STAGES
// (acquire); a producer thread publishes ring block it-1 only after issuing block it's
// copies (publish), so two blocks are in flight. Consumers release block j-1 while computing
// on block j, so the release waited for (it - STAGES) needs block it - STAGES + 1 published, which
// happened at iteration it - STAGES + 2 <= it - 1: no deadlock for STAGES >= 3, across a tile
// boundary too (the next tile buffer was released a tile earlier). A tile's buffer copies join
// its first key block's cp.async group, so that block's full barrier covers them.
// PersistentRing carves the mbarriers and the 2 posted tile numbers from shared memory (BYTES at
// an 8-byte aligned base; end(): the first byte after them) and keeps every parity of the
// protocol to itself: the kernels name tiles (ti, the CTA's count) and ring blocks (it / rb).
template <int STAGES, bool WARP_RELEASE = false>
struct PersistentRing {
    static_assert(STAGES >= 3, "a producer publishes block it-1 only after refilling a stage for it");
    static constexpr int BYTES = (2 * STAGES + 4) * (int)sizeof(uint64_t) + 2 * (int)sizeof(int);
    uint64_t *full, *empty, *q_full, *q_empty;
    int *tile_slot;  // the tile of tile buffer i (>= n_tiles: none left)
    __device__ __forceinline__ explicit PersistentRing(unsigned char *base)
        : full(reinterpret_cast<uint64_t *>(base)), empty(full + STAGES), q_full(empty + STAGES),
          q_empty(q_full + 2), tile_slot(reinterpret_cast<int *>(q_empty + 2)) {}
    __device__ __forceinline__ unsigned char *end() const { return reinterpret_cast<unsigned char *>(tile_slot + 2); }
    // One thread, before the CTA barrier that precedes any other use.
    __device__ __forceinline__ void init() const {
        for (int i = 0; i < STAGES; i++) {
            mbar_init(full + i, 128);
            mbar_init(empty + i, WARP_RELEASE ? 8 : 256);  // (release)
        }
        for (int i = 0; i < 2; i++) {
            mbar_init(q_full + i, 1);
            mbar_init(q_empty + i, 256);
        }
        mbar_fence_init();
    }
    // Producer: the CTA's tile number ti, for tile buffer ti & 1: once the consumers released the
    // buffer's previous tile, thread 0 takes the next tile from the counter (persistent_next_tile)
    // and posts it; all 128 producer threads return it (>= n_tiles: none left; the consumers stop
    // on the same number).
    __device__ __forceinline__ int post_tile(int ti, unsigned *counter, int n_tiles, int ptid) const {
        const int qs = ti & 1;
        if (ti >= 2) mbar_wait(q_empty + qs, (uint32_t)((ti / 2 - 1) & 1));
        if (ptid == 0) {
            tile_slot[qs] = persistent_next_tile(counter, ti, n_tiles);
            mbar_arrive(q_full + qs);  // release: the consumers see tile_slot after their wait
        }
        named_bar_sync<3, 128>();  // the producer's 128 threads: tile_slot posted
        return tile_slot[qs];
    }
    // Consumers: the tile number the producer posted for the CTA's tile ti (>= n_tiles: none left).
    __device__ __forceinline__ int tile(int ti) const {
        mbar_wait(q_full + (ti & 1), (uint32_t)((ti / 2) & 1));
        return tile_slot[ti & 1];
    }
    // Consumers: done with tile ti's buffer (every consumer thread).
    __device__ __forceinline__ void release_tile(int ti) const { mbar_arrive(q_empty + (ti & 1)); }
    // Producer: before copying ring block it into stage it % STAGES.
    __device__ __forceinline__ void acquire(unsigned it) const {
        if (it >= STAGES) mbar_wait(empty + it % STAGES, (it / STAGES - 1) & 1);
    }
    // Producer: after issuing ring block it's copies: closes their cp.async group and publishes
    // ring block it-1 once its group has landed (groups complete in order).
    __device__ __forceinline__ void publish(unsigned it) const {
        cp_async_commit();
        if (it > 0) {
            cp_async_wait_1();
            fence_proxy_async();  // cp.async writes (generic proxy) -> wgmma reads (async proxy)
            mbar_arrive(full + (it - 1) % STAGES);
        }
    }
    // Producer: a tile's n_blocks key blocks into the ring, from ring block it on (it advances):
    // copy(kb, stage) issues key block kb's copies into that stage. Two ways to publish a block:
    //   ASYNC false: publish (block it-1 once its cp.async group has landed: the producer waits);
    //   ASYNC true: every producer thread arrives on the block's full barrier once its own
    //     cp.async copies so far have landed (cp_async_mbar_arrive), so no thread waits and a block
    //     is published as soon as it is in; copy may add TMA loads counted on full[st]
    //     (mbar_expect_tx first). The tile's copies issued before its first block land with it.
    // After the last tile, drain<ASYNC> with the same ASYNC.
    template <bool ASYNC = false, class Copy>
    __device__ __forceinline__ void fill(unsigned &it, int n_blocks, Copy copy) const {
        unsigned i = it;
        for (int kb = 0; kb < n_blocks; kb++, i++) {
            const unsigned st = i % STAGES;
            acquire(i);
            copy(kb, st);
            if constexpr (ASYNC) cp_async_mbar_arrive(full + st);
            else publish(i);
        }
        it = i;
    }
    // Producer, after its last tile (it blocks were copied in all): fill<false> publishes the last
    // ring block here; after fill<true> the blocks published themselves, and the thread only waits
    // until none of its copies is outstanding.
    template <bool ASYNC = false>
    __device__ __forceinline__ void drain(unsigned it) const {
        cp_async_wait_all();
        if constexpr (!ASYNC) {
            fence_proxy_async();
            if (it > 0) mbar_arrive(full + (it - 1) % STAGES);
        }
    }
    // Consumers: wait until ring block rb's stage holds it; release it after the last read (every
    // consumer thread calls it; with WARP_RELEASE its warp converged: the __syncwarp orders the
    // other lanes' reads of the stage before lane 0's arrival, which releases them to the producer).
    __device__ __forceinline__ void wait_full(unsigned rb) const { mbar_wait(full + rb % STAGES, (rb / STAGES) & 1); }
    __device__ __forceinline__ void release(unsigned rb) const {
        if constexpr (WARP_RELEASE) {
            __syncwarp();
            if ((threadIdx.x & 31) == 0) mbar_arrive(empty + rb % STAGES);
        } else {
            mbar_arrive(empty + rb % STAGES);
        }
    }
};
// A persistent causal kernel's tile number -> (query block, head): heaviest first within groups
// of heads (causal_item_grouped's rank 0 is the last query block, with the most key blocks).
struct CausalTile {
    int qb, bh;
};
__device__ __forceinline__ CausalTile causal_tile(int tile, int n_blocks, int n_bh, int hg) {
    const CausalItem item = causal_item_grouped((unsigned)tile, n_blocks, n_bh, hg);
    return {n_blocks - 1 - item.rank, item.bh};
}

// --- host side -----------------------------------------------------------------------------
// dq[b,t,h,:] = BF16(tau * dq_acc[b,h,t,:]) for head dim d (64 or 128): the last step of the BF16
// and the FP8 backward alike, which both accumulate dQ in FP32 in the workspace's (B, H, T, d)
// layout (gpu_attn_bwd_workspace_bytes). Defined in attention/bwd_bf16.cu.
void attn_bwd_convert_dq(const float *dq_acc, bf16 *dq, int dqkv_stride, int B, int H, int T, int d, float tau,
                         cudaStream_t stream);

static inline void check_args(const char *what, const void *const *ptrs, int nptr, const int *strides,
                       int nstride, int B, int H, int T, int d) {
    if (d != 64 && d != 128) FATAL("%s: head dim %d unsupported (64 or 128)", what, d);
    if (B <= 0 || H <= 0 || T <= 0) FATAL("%s: bad shape B=%d H=%d T=%d", what, B, H, T);
    for (int i = 0; i < nptr; i++)
        if ((uintptr_t)ptrs[i] % 16) FATAL("%s: pointer %d not 16-byte aligned", what, i);
    for (int i = 0; i < nstride; i++)
        if (strides[i] % 8 || strides[i] < H * d)
            FATAL("%s: row stride %d must be a multiple of 8 and >= H*d = %d", what, strides[i], H * d);
}

#endif  // ATTENTION_GPU_COMMON_CUH
