// common.cuh: device helpers shared by the fused attention kernels
// (attention/fwd_bf16.cu, attention/bwd_bf16.cu): PTX wrappers (cp.async, ldmatrix, mma.sync, wgmma and its
// fences), the 128-byte-swizzle wgmma descriptors, shared-memory tile loaders, and the host-side
// argument check. Everything here is inline/static: each .cu that includes it gets its own copy.
//
// Fragment layouts of mma.m16n8k16 (g = lane/4, t = lane%4) used throughout:
//   A (16x16, row): a0 (g, 2t..2t+1)  a1 (g+8, 2t..)  a2 (g, 2t+8..)  a3 (g+8, 2t+8..)
//   B (16x8, col):  b0 (k 2t..2t+1, n g)  b1 (k 2t+8.., n g)
//   C (16x8):       c0,c1 (g, 2t..2t+1)   c2,c3 (g+8, 2t..2t+1)
// so the C fragments of two neighbouring n-tiles of S are the A fragment of P for PV (no
// shuffles). Padded shared-memory tiles (load_tile) have rows padded by 8 elements (16 bytes),
// which makes every ldmatrix and 16-byte cp.async free of bank conflicts.
#ifndef ATTENTION_GPU_COMMON_CUH
#define ATTENTION_GPU_COMMON_CUH

#include <cuda_bf16.h>     // __nv_bfloat16, __floats2bfloat162_rn
#include <cuda_runtime.h>  // cudaError_t, cudaGetErrorString
#include <stdint.h>        // uint32_t, uint64_t, uintptr_t
#include <stdio.h>         // fprintf (attn_env_choice's unknown value)
#include <stdlib.h>        // getenv, atoi (attn_env_count, attn_env_switch, attn_env_choice)
#include <string.h>        // strcmp (attn_env_choice)

#include "core/common.h"          // FATAL
#include "core/fp8.h"             // FP8_SCALE_MAX_EXP: the range of the quantization scales
#include "gpu/ptx/fast_exp2.cuh"  // fast_exp2: the softmax exponentials (inputs <= 0 or -inf)
#include "gpu/fp8_cvt.cuh"        // cvt_e4m3x2 / cvt_e5m2x2: the hardware FP8 conversion (finite inputs here)

typedef __nv_bfloat16 bf16;

#define CUDA_OK(call)                                                                    \
    do {                                                                                 \
        cudaError_t err_ = (call);                                                       \
        if (err_ != cudaSuccess)                                                         \
            FATAL("%s failed: %s (check the GPU and the arguments of the attention call)", \
                  #call, cudaGetErrorString(err_));                                      \
    } while (0)

// Tile sizes. Forward: 128 query rows per CTA (8 warps x 16 rows), key blocks of 64.

// --- small PTX wrappers ------------------------------------------------------------------------
__device__ __forceinline__ uint32_t smem_addr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

// 16-byte async copy global -> shared; when !valid the destination is zero-filled (src-size 0).
__device__ __forceinline__ void cp_async16(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async4(void *dst, const void *src, bool valid) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n" ::"r"(smem_addr(dst)), "l"(src),
                 "r"(valid ? 4 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
__device__ __forceinline__ void cp_async_wait_all() { asm volatile("cp.async.wait_group 0;\n" ::); }
// all but the most recent group have landed (groups complete in order)
__device__ __forceinline__ void cp_async_wait_1() { asm volatile("cp.async.wait_group 1;\n" ::: "memory"); }

// The dynamic shared memory rounded up to a 1024-byte boundary (the swizzled wgmma regions'
// alignment; the launches add 1024 bytes of slack). Rounded by pointer arithmetic on raw itself:
// rounding the generic address through an integer (uintptr_t) hides from the compiler that the
// result points to shared memory, and every access through such a pointer compiles to a generic
// 64-bit LD/ST with 64-bit address math.
__device__ __forceinline__ uint8_t *smem_align1024(unsigned char *raw) {
    return raw + ((0u - smem_addr(raw)) & 1023u);  // bytes to the next multiple of 1024
}
// Causal kernels' work items (block rank, head), heaviest first within groups of hg heads: item
// t (of n_blocks blocks per head, n_bh heads) lies in group t / (hg n_blocks); inside it, rank =
// w / hg' and head = group hg + w % hg' (w = t's place in the group, hg' = the group's heads,
// fewer in a last partial group). The kernel maps rank 0 to its longest block loop, so each
// group's long items start first and its short ones fill in behind them. hg = n_bh is heaviest
// first over all heads; with the natural order (each head's blocks in turn) the last heads'
// longest CTAs start near the end and run alone. Smaller groups keep the items that run at once
// on fewer heads, whose K̂, V̂ blocks then stay in L2 (causal_heads_per_group picks hg).
// Measured on one H200 (docs/perf.md): the persistent FP8 forward in head groups (two waves of
// CTAs each) 2-5% faster than heaviest first over all heads; the persistent delta pass in the
// forward's groups 9-19% faster at 1K-2K than over all heads, the same as in groups of 4 heads;
// the old, one-CTA-per-item delta pass heaviest first
// over all heads 6-12% faster than in the natural order, and 0-10% slower in head groups; the
// main FP8 backward over all heads +1% at 4K-8K but -18-21% at 1K-2K (its CTAs running at once
// no longer share a head's Q̂, dÔ blocks and dQ rows in L2), in groups of one wave +2-4% over the
// natural order. Our BF16 kernels in groups of about one wave: the forward 6-29% and the backward
// 0-27% faster than heaviest first over all heads (most at T = 1K-2K).
struct CausalItem {
    int rank, bh;
};
__host__ __device__ __forceinline__ CausalItem causal_item_grouped(unsigned t, int n_blocks, int n_bh, int hg) {
    const unsigned per = (unsigned)(hg * n_blocks), grp = t / per, w = t - grp * per;
    const int left = n_bh - (int)grp * hg, hge = hg < left ? hg : left;  // (host-callable: no min)
    return {(int)(w / (unsigned)hge), (int)grp * hg + (int)(w % (unsigned)hge)};
}
// The item of this CTA of a grid (n_blocks, n_bh): its launch index (blockIdx.x fastest), grouped.
__device__ __forceinline__ CausalItem causal_cta_grouped(int hg) {
    return causal_item_grouped(blockIdx.y * gridDim.x + blockIdx.x, (int)gridDim.x, (int)gridDim.y, hg);
}
// The next work item of a persistent CTA (the FP8 forward, fp8_dm's delta pass): CTAs take
// the next tile from a counter in global memory when they start one (dynamic, in the order of
// the tile numbers: the greedy schedule the hardware's own block scheduler gives a grid of one
// CTA per tile). counter[0] hands out the tiles, counter[1] counts the CTAs that have seen the
// end (every CTA fetches once more than its tiles); the last of them sets both back to 0, so
// every launch starts from 0 without a memset, also when replayed from a CUDA graph. Launches on
// one stream follow each other, so the kernels on one stream share its counter
// (attn_fp8_tile_counter, attention/kernels_fp8.h); launches on different streams may overlap.
// With counter NULL (ATTN_FP8_FWD_SCHED=static, for timing comparisons) the order is fixed
// instead: CTA c of G takes tiles r G + c on even rounds r and r G + G - 1 - c on odd ones (a
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
// kernels, so that a group's long items have short ones to overlap), at most n_bh. (A kernel's
// timing knob may override the result, as ATTN_FP8_FWD_GROUP_HEADS and the others do.)
static inline int causal_heads_per_group(long kv_bytes_per_head, int n_blocks, int n_bh, int min_items) {
    const long fit = (16L << 20) / (kv_bytes_per_head > 0 ? kv_bytes_per_head : 1);
    const int need = (min_items + n_blocks - 1) / (n_blocks > 0 ? n_blocks : 1);
    const long hg = fit < need ? need : fit;
    return hg < 1 ? 1 : hg > n_bh ? n_bh : (int)hg;
}
// The heads per group a causal kernel launches with: forced > 0 that many (at most n_bh), 0 all
// heads (heaviest first over all of them), < 0 the kernel's own choice `automatic` (usually
// causal_heads_per_group's). forced comes from the kernel's timing knob, attn_env_count.
static inline int causal_group_heads(int forced, int n_bh, int automatic) {
    return forced > 0 ? (forced < n_bh ? forced : n_bh) : forced == 0 ? n_bh : automatic;
}
// A count timing knob (ATTN_*_GROUP_HEADS=N heads per group, QKV_GEMM_GROUP_ROWS=N rows per tile
// group): -1 when unset (the kernel's own choice), 0 for N <= 0 (none: all heads, no groups), else
// N. Launchers read it once: static const int k = attn_env_count(..).
static inline int attn_env_count(const char *name) {
    const char *v = getenv(name);
    if (!v || !*v) return -1;
    return atoi(v) > 0 ? atoi(v) : 0;
}
// An on / off switch of a kernel's form (ATTN_*_TMA=0 turns it off): on unless set to 0. Launchers
// read it once: static const bool on = attn_env_switch(..).
static inline bool attn_env_switch(const char *name) {
    const char *v = getenv(name);
    return !v || !*v || atoi(v) != 0;
}
// A kernel's form chosen by name (ATTN_FP8_FWD_LOOP=plain, QKV_GEMM_FORM=wide): the index of the
// variable's value in names[0 .. n - 1], or -1 when unset or unknown (then a line on stderr naming
// the choices; the caller takes its default). Launchers read it once.
static inline int attn_env_choice(const char *var, const char *const *names, int n) {
    const char *v = getenv(var);
    if (!v || !*v) return -1;
    for (int i = 0; i < n; i++)
        if (strcmp(v, names[i]) == 0) return i;
    fprintf(stderr, "%s=%s is none of", var, v);
    for (int i = 0; i < n; i++) fprintf(stderr, "%s %s", i ? "," : "", names[i]);
    fprintf(stderr, "; using the default\n");
    return -1;
}
// A form's switch as a launcher applies it: a test hook's setting as the hook was given it (0 off,
// > 0 on, < 0 none) before the environment's (attn_env_switch).
static inline bool attn_form_on(int test_form, bool env_on) { return test_form >= 0 ? test_form != 0 : env_on; }
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
// The same value, opaque to the compiler: addresses and descriptors derived from it inside a loop
// body are recomputed there (a few integer adds) instead of hoisted out of the loop into
// registers, of which the attention kernels have none to spare.
__device__ __forceinline__ uint32_t opaque_u32(uint32_t x) {
    asm volatile("mov.b32 %0, %0;\n" : "+r"(x));
    return x;
}
// True on every GPU (the number of SMs), but neither the compiler nor ptxas can know it: code
// under `if (nsmid_nonzero())` lies in a basic block of its own, and ptxas moves no instruction
// of the code after it (a wgmma wait, say) up into it or above it. The kernels use it where
// ptxas's scheduler would otherwise hoist a wait for a wgmma group above the work meant to
// overlap that group. Measure each use: in tile_p_dp (attention/bwd_fp8_tile.cuh) it made the
// main FP8 backward 2-5% faster; the same fence in the delta pass made it 5% slower (not used).
__device__ __forceinline__ bool nsmid_nonzero(void) {
    uint32_t n;
    asm volatile("mov.u32 %0, %%nsmid;\n" : "=r"(n));
    return n != 0;
}
// Byte offset of (row r, byte column c) in a 128-byte-swizzled tile of 128-byte rows (16-byte
// chunk c / 16 of row r at chunk (c / 16) ^ (r % 8)): the FP8 kernels' K-major wgmma tiles.
__device__ __forceinline__ uint32_t sw128(int r, int c) {
    return (uint32_t)(r * 128 + ((((c >> 4) ^ (r & 7)) << 4) | (c & 15)));
}
// Shared-memory accesses by 32-bit address. volatile: they stay in program order with the other
// volatile asm of a loop body (lds_f32x2 keeps the compiler from loading a whole stage's LSE or D
// values at once, 16-32 registers).
__device__ __forceinline__ float2 lds_f32x2(uint32_t addr) {
    float2 v;
    asm volatile("ld.shared.v2.f32 {%0, %1}, [%2];\n" : "=f"(v.x), "=f"(v.y) : "r"(addr));
    return v;
}
__device__ __forceinline__ void sts_b32(uint32_t addr, uint32_t v) {
    asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
__device__ __forceinline__ void sts_f32x2(uint32_t addr, float x, float y) {
    asm volatile("st.shared.v2.f32 [%0], {%1, %2};\n" ::"r"(addr), "f"(x), "f"(y) : "memory");
}
// Named barrier ID (1..15; 0 is __syncthreads') over N threads (a multiple of 32). Immediate
// operands, so that ptxas reserves only the barriers a kernel names.
template <int ID, int N>
__device__ __forceinline__ void named_bar_sync() { asm volatile("bar.sync %0, %1;\n" ::"n"(ID), "n"(N) : "memory"); }
template <int ID, int N>
__device__ __forceinline__ void named_bar_arrive() { asm volatile("bar.arrive %0, %1;\n" ::"n"(ID), "n"(N) : "memory"); }

// Four 8x8 b16 tiles to shared memory (the inverse of ldmatrix_x4): lanes 8i .. 8i+7 give the row
// addresses of tile i, and every lane's r[i] holds its fragment of tile i (row lane / 4, columns
// 2 (lane % 4), +1: the mma / wgmma accumulator layout of an 8-column slice, packed).
__device__ __forceinline__ void stmatrix_x4(uint32_t addr, uint32_t r0, uint32_t r1, uint32_t r2, uint32_t r3) {
    asm volatile("stmatrix.sync.aligned.m8n8.x4.shared.b16 [%0], {%1, %2, %3, %4};\n" ::"r"(addr), "r"(r0), "r"(r1),
                 "r"(r2), "r"(r3)
                 : "memory");
}
__device__ __forceinline__ void ldmatrix_x4(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t r[4], const void *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

// c += a * b, BF16 inputs, FP32 accumulators.
__device__ __forceinline__ void mma_bf16(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// Two floats -> packed BF16 pair (lo in the low half), round to nearest even.
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t *>(&v);
}

// --- the dK, dV epilogue of the backward kernels (attention/bwd_fp8.cu, attention/bwd_bf16_wgmma.cuh) ---
// A CTA's 128 keys x D of dV and tau dK go from the two consumer warpgroups' wgmma accumulators
// (FP32, rows = keys) to BF16 rows of dv and dk through a staging area of 2 x 128 rows of 2D bytes
// in shared memory: stmatrix writes the fragments as 8 x 8 tiles (a tile row is one 16-byte
// chunk; chunk c of row r sits at c ^ (r % 8), so the 8 rows of a tile fall in 8 different bank
// quads), then the threads copy whole rows out in 16-byte chunks. Storing the fragments straight
// to global memory took D / 2 four-byte stores per thread, each warp's covering only half of every
// sector it touched; measured (docs/perf.md, stop 26) at T = 1K / 2K / 4K / 8K: the FP8 backward
// 7.5 / 4.4 / 2.8 / 2.0% faster, our BF16 backward 5.8 / 3.0 / 0.9 / 0%. Byte offset in the area
// of chunk c of row r of tensor t (0: dV, 1: dK):
template <int D>
__device__ __forceinline__ uint32_t dkdv_chunk(int t, int r, int c) {
    return (uint32_t)((t * 128 + r) * (2 * D) + 16 * (c ^ (r & 7)));
}
// The staging writes of one warp: its 16 accumulator rows start at row wrow0 of the area (64 w +
// 16 warp); dK is scaled by tau on the way (the rounding as before: BF16(dK tau)).
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
// stores straight from the fragments (fwd_store_rows) each covered half of the 8 sectors they
// touched and held the consumers ~1.5-1.8 us per tile (bench/attn_timeline.py, the "epilogue":
// 9-13% of the forwards' SM time at T = 2K). The same products and roundings as fwd_store_rows:
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

// acc (16 x N) += A (16 x K) * B (K x N) for one warp of the mma.sync kernels: A is the BF16
// rounding of this warp's FP32 m16n8 accumulator fragments a (K/8 of them: P, P^T or dS^T, fed
// to the next product straight from registers), B a row-major BF16 tile in shared memory (K rows
// of pitch elements: V, dO or Q) read transposed by ldmatrix. The O += P V of the forward and the
// dV += P^T dO, dK += dS^T Q of the backward.
template <int K, int N>
__device__ __forceinline__ void mma_frag_rowtile(float (&acc)[N / 8][4], const float (&a)[K / 8][4], const bf16 *b,
                                                 int pitch, int lane) {
#pragma unroll
    for (int kk = 0; kk < K / 16; kk++) {
        const uint32_t pa[4] = {pack_bf16(a[2 * kk][0], a[2 * kk][1]), pack_bf16(a[2 * kk][2], a[2 * kk][3]),
                                pack_bf16(a[2 * kk + 1][0], a[2 * kk + 1][1]),
                                pack_bf16(a[2 * kk + 1][2], a[2 * kk + 1][3])};
#pragma unroll
        for (int n2 = 0; n2 < N / 16; n2++) {
            uint32_t bt[4];
            ldmatrix_x4_trans(bt, b + (kk * 16 + (lane & 7) + (((lane >> 3) & 1) << 3)) * pitch + n2 * 16 +
                                      (lane >> 4) * 8);
            mma_bf16(acc[2 * n2], pa, bt[0], bt[1]);
            mma_bf16(acc[2 * n2 + 1], pa, bt[2], bt[3]);
        }
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

// Copies rows [row0, row0+ROWS) of a (T, stride) BF16 matrix (D columns used) into a shared
// tile with row pitch D+8; rows >= T become zeros (so masked keys never bring NaN into PV).
template <int ROWS, int D, int NTHREADS>
__device__ __forceinline__ void load_tile(bf16 *s, const bf16 *g, long stride, int row0, int T,
                                          int tid) {
    constexpr int CHUNKS = D / 8;  // 16-byte chunks per row
    static_assert(ROWS * CHUNKS % NTHREADS == 0, "tile copy must split evenly over the threads");
#pragma unroll
    for (int i = 0; i < ROWS * CHUNKS / NTHREADS; i++) {
        int c = tid + i * NTHREADS;
        int r = c / CHUNKS, col = (c % CHUNKS) * 8;
        int t = row0 + r;
        bool ok = t < T;
        cp_async16(s + r * (D + 8) + col, g + (long)(ok ? t : 0) * stride + col, ok);
    }
}
// --- wgmma (sm_90a) helpers ------------------------------------------------------------------
// Shared tiles for wgmma use the 128-byte swizzle: a tile of R rows x 64 BF16 (128 bytes a row)
// is one region; 16-byte chunk c of row r sits at chunk c ^ (r % 8); a d = 128 tile is two such
// regions (columns 0-63, 64-127). Regions start at 1024-byte boundaries.
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}
__device__ __forceinline__ void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ __forceinline__ void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
template <int N>  // wait until at most N committed wgmma groups are pending
__device__ __forceinline__ void wgmma_wait() { asm volatile("wgmma.wait_group.sync.aligned %0;\n" ::"n"(N) : "memory"); }
// 1 / s for a quantization scale s: fp8_scale_for_amax (fp8.h) gives s = 2^k with |k| <= 126 (or
// s = 1), so 1 / s = 2^-k exactly, the value the IEEE division 1.0f / s returns; with bits(2^k) =
// (127 + k) << 23 it is bits(2^-k) = (127 - k) << 23 = (254 << 23) - bits(2^k), a normal float
// (exponent field 1..253). One integer subtraction instead of the division (MUFU.RCP, a Newton
// step, a range check and a branch to a slow-path call). Wrong for a scale that is not a power of
// two, which the quantize kernels never produce (the FP8 kernels' scale arrays must come from them).
static_assert(FP8_SCALE_MAX_EXP <= 126, "pow2_recip: 2^-k must be a normal float");
__device__ __forceinline__ float pow2_recip(float s) { return __int_as_float(0x7f000000 - __float_as_int(s)); }

// Keeps the compiler from moving reads/writes of accumulator registers across wgmma waits.
template <int N>
__device__ __forceinline__ void reg_fence(float (&r)[N]) {
#pragma unroll
    for (int i = 0; i < N; i++) asm volatile("" : "+f"(r[i])::"memory");
}

template <int N>
__device__ __forceinline__ void reg_fence(uint32_t (&r)[N][4]) {
#pragma unroll
    for (int i = 0; i < N; i++)
#pragma unroll
        for (int e = 0; e < 4; e++) asm volatile("" : "+r"(r[i][e])::"memory");
}

// Matrix descriptor: start address, leading and stride byte offsets, 128-byte swizzle.
// K-major operand: stride offset = 1024 (next 8 rows), leading offset unused.
// N-major operand (V in PV): leading offset = bytes to the next 64-column region, stride = 1024
// (next 8 rows along K).
__device__ __forceinline__ uint64_t wgmma_desc_at(uint32_t addr, uint32_t lbo, uint32_t sbo) {  // 32-bit shared address
    return ((addr & 0x3FFFF) >> 4) | ((uint64_t)((lbo & 0x3FFFF) >> 4) << 16) |
           ((uint64_t)((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}
__device__ __forceinline__ uint64_t wgmma_desc(const void *p, uint32_t lbo, uint32_t sbo) {
    return wgmma_desc_at(smem_addr(p), lbo, sbo);
}
// The descriptor of a K-major tile (wgmma_desc(tile, 16, 1024)) handled as its low word: the high
// word is a constant (stride 1024 B per 8 rows, 128-byte swizzle); the low word is the start
// address in 16-byte units (bits 0-13) and the unused leading offset (16 B). Shared addresses
// stay below 2^18 (at most 228 KB), so the address field never carries into the leading offset:
// the tile o bytes (a multiple of 16) further on has the low word kmajor_desc_lo(..) + o / 16 (a
// 32-byte FP8 k-step: + 2). Loops derive every descriptor from one base by 32-bit adds of
// constants instead of rebuilding each with 64-bit math from a pointer.
__device__ __forceinline__ uint32_t kmajor_desc_lo(uint32_t addr) { return ((addr & 0x3FFFF) >> 4) | (1u << 16); }
__device__ __forceinline__ uint64_t kmajor_desc(uint32_t lo) { return (uint64_t)(1024 >> 4) << 32 | 1ull << 62 | lo; }
// The same for a K-major tile of 64-byte rows in the 64-byte swizzle (TMA's SWIZZLE_64B: 16-byte
// chunk c of row r at c ^ ((r / 2) % 4), regions 512-byte aligned): stride 512 B per 8 rows,
// layout type 2. A reduction of 64 FP8 elements (two k32 steps: + 2 each) fits one row.
__device__ __forceinline__ uint64_t kmajor_desc_sw64(uint32_t lo) { return (uint64_t)(512 >> 4) << 32 | 2ull << 62 | lo; }

#define WG_ACC8(b) "+f"(d[(b) + 0]), "+f"(d[(b) + 1]), "+f"(d[(b) + 2]), "+f"(d[(b) + 3]), \
                   "+f"(d[(b) + 4]), "+f"(d[(b) + 5]), "+f"(d[(b) + 6]), "+f"(d[(b) + 7])
#define WG_REGS32 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
                  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31"
#define WG_REGS64 WG_REGS32 ", %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, " \
                  "%45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63"
// N = D + 8 (the FP8 forward's PV with its row-sum columns, l_add_ones): 4 more accumulators
#define WG_ACC4(b) "+f"(d[(b) + 0]), "+f"(d[(b) + 1]), "+f"(d[(b) + 2]), "+f"(d[(b) + 3])
#define WG_REGS36 WG_REGS32 ", %32, %33, %34, %35"
#define WG_REGS68 WG_REGS64 ", %64, %65, %66, %67"

// BF16 wgmma with both operands in shared memory: d (64 x N, FP32) (+)= A (64 x 16) * B (16 x N);
// accumulate = 0 starts a fresh accumulator. TA / TB: 0 = the operand is K-major, 1 = transposed
// (A M-major, B N-major).
template <int TA = 0, int TB = 0>
__device__ __forceinline__ void wgmma_m64n128_ss(float (&d)[64], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_REGS64 "}, %64, %65, p, 1, 1, %67, %68;\n}\n"
        : WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24), WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TA), "n"(TB));
}
// N = 256 with both operands K-major, the accumulators in two halves: lo holds columns 0..127
// (d[4 j + 2 rr + e] for column 8 j + 2 t4 + e, j < 16), hi columns 128..255 in the same layout,
// so each half is exactly an m64n128 accumulator (the QKV GEMM's two heads of a 256-wide tile).
#define WG_REGS128 WG_REGS64 ", %64, %65, %66, %67, %68, %69, %70, %71, %72, %73, %74, %75, %76, %77, %78, " \
                   "%79, %80, %81, %82, %83, %84, %85, %86, %87, %88, %89, %90, %91, %92, %93, %94, %95, %96, %97, " \
                   "%98, %99, %100, %101, %102, %103, %104, %105, %106, %107, %108, %109, %110, %111, %112, %113, " \
                   "%114, %115, %116, %117, %118, %119, %120, %121, %122, %123, %124, %125, %126, %127"
#define WG_ACC8_H(h, b) "+f"(h[(b) + 0]), "+f"(h[(b) + 1]), "+f"(h[(b) + 2]), "+f"(h[(b) + 3]), \
                        "+f"(h[(b) + 4]), "+f"(h[(b) + 5]), "+f"(h[(b) + 6]), "+f"(h[(b) + 7])
__device__ __forceinline__ void wgmma_m64n256_ss(float (&lo)[64], float (&hi)[64], uint64_t desc_a, uint64_t desc_b,
                                                 int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16 {" WG_REGS128 "}, %128, %129, p, 1, 1, 0, 0;\n}\n"
        : WG_ACC8_H(lo, 0), WG_ACC8_H(lo, 8), WG_ACC8_H(lo, 16), WG_ACC8_H(lo, 24), WG_ACC8_H(lo, 32),
          WG_ACC8_H(lo, 40), WG_ACC8_H(lo, 48), WG_ACC8_H(lo, 56), WG_ACC8_H(hi, 0), WG_ACC8_H(hi, 8),
          WG_ACC8_H(hi, 16), WG_ACC8_H(hi, 24), WG_ACC8_H(hi, 32), WG_ACC8_H(hi, 40), WG_ACC8_H(hi, 48),
          WG_ACC8_H(hi, 56)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate));
}
template <int TA = 0, int TB = 0>
__device__ __forceinline__ void wgmma_m64n64_ss(float (&d)[32], uint64_t desc_a, uint64_t desc_b, int accumulate) {
    asm volatile(
        "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WG_REGS32 "}, %32, %33, p, 1, 1, %35, %36;\n}\n"
        : WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24)
        : "l"(desc_a), "l"(desc_b), "r"(accumulate), "n"(TA), "n"(TB));
}
// d (64 x 128) += A (64 x 16, registers) * B (16 x 128, smem, N-major)
__device__ __forceinline__ void wgmma_m64n128_rs_nmajor(float (&d)[64], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {" WG_REGS64 "}, {%64, %65, %66, %67}, %68, 1, 1, 1, 1;\n"
        : WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24), WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
// d (64 x 64) += A (64 x 16, registers) * B (16 x 64, smem, N-major)
__device__ __forceinline__ void wgmma_m64n64_rs_nmajor(float (&d)[32], const uint32_t (&a)[4], uint64_t desc_b) {
    asm volatile(
        "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {" WG_REGS32 "}, {%32, %33, %34, %35}, %36, 1, 1, 1, 1;\n"
        : WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24)
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b));
}
// --- FP8 wgmma (QGMMA in SASS): A and B K-major (the only FP8 form), FP32 accumulators -------
// Formats: 0 = e4m3, 1 = e5m2. accumulate = 0 starts a fresh accumulator.
// wg_fp8<N, AT, BT>: d (64 x N) (+)= A (64 x 32, smem) * B (32 x N, smem), descriptors da, db.
template <int N, int AT, int BT>
__device__ void wg_fp8(float (&d)[N / 2], uint64_t da, uint64_t db, int accumulate);
#define WG_REGS16 "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15"
#define WG_FP8_SS(N, AT, BT, ATS, BTS, REGS, IA, IB, IP, ...)                                       \
    template <>                                                                                    \
    __device__ __forceinline__ void wg_fp8<N, AT, BT>(float (&d)[N / 2], uint64_t da, uint64_t db, \
                                                      int accumulate) {                            \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IP ", 0;\n"                            \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32." ATS "." BTS " {" REGS       \
                     "}, %" #IA ", %" #IB ", p, 1, 1;\n}\n"                                        \
                     : __VA_ARGS__                                                                 \
                     : "l"(da), "l"(db), "r"(accumulate));                                         \
    }
// the type pairs the kernels use: e4m3.e4m3 (S, S^T), e4m3.grad (dP^T, dV), grad.e4m3 (dK, dQ)
#define WG_FP8_SS_TYPES(N, REGS, IA, IB, IP, ...)                      \
    WG_FP8_SS(N, 0, 0, "e4m3", "e4m3", REGS, IA, IB, IP, __VA_ARGS__)  \
    WG_FP8_SS(N, 0, 1, "e4m3", "e5m2", REGS, IA, IB, IP, __VA_ARGS__)  \
    WG_FP8_SS(N, 1, 0, "e5m2", "e4m3", REGS, IA, IB, IP, __VA_ARGS__)
WG_FP8_SS(32, 0, 0, "e4m3", "e4m3", WG_REGS16, 16, 17, 18, WG_ACC8(0), WG_ACC8(8))  // the backward's dQ, d = 64
WG_FP8_SS(32, 1, 0, "e5m2", "e4m3", WG_REGS16, 16, 17, 18, WG_ACC8(0), WG_ACC8(8))
WG_FP8_SS_TYPES(64, WG_REGS32, 32, 33, 34, WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24))
WG_FP8_SS_TYPES(128, WG_REGS64, 64, 65, 66, WG_ACC8(0), WG_ACC8(8), WG_ACC8(16), WG_ACC8(24), WG_ACC8(32),
                WG_ACC8(40), WG_ACC8(48), WG_ACC8(56))
#undef WG_FP8_SS_TYPES
#undef WG_FP8_SS
// wg_fp8_rs<N, AT>: d (64 x N) (+)= A (64 x 32, registers a[4], format AT) * B (32 x N E4M3, smem).
// The A fragment of 8-bit types: register q holds row warp*16 + g + 8 (q & 1), k = 16 (q >> 1) +
// 4 t4 .. + 3 of the k32 step (byte 0 the lowest k).
template <int N, int AT>
__device__ void wg_fp8_rs(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db, int accumulate);
#define WG_FP8_RS(N, AT, ATS, REGS, OPS, IP, ...)                                                              \
    template <>                                                                                                  \
    __device__ __forceinline__ void wg_fp8_rs<N, AT>(float (&d)[N / 2], const uint32_t (&a)[4], uint64_t db,    \
                                                     int accumulate) {                                           \
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" #IP ", 0;\n"                                          \
                     "wgmma.mma_async.sync.aligned.m64n" #N "k32.f32." ATS ".e4m3 {" REGS "}, " OPS              \
                     ", p, 1, 1;\n}\n"                                                                           \
                     : __VA_ARGS__                                                                               \
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(db), "r"(accumulate));                   \
    }
WG_FP8_RS(128, 0, "e4m3", WG_REGS64, "{%64, %65, %66, %67}, %68", 69, WG_ACC8(0), WG_ACC8(8), WG_ACC8(16),
          WG_ACC8(24), WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56))  // the forward's PV, the delta pass's S
WG_FP8_RS(128, 1, "e5m2", WG_REGS64, "{%64, %65, %66, %67}, %68", 69, WG_ACC8(0), WG_ACC8(8), WG_ACC8(16),
          WG_ACC8(24), WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56))  // the delta pass's dP, E5M2 dO
WG_FP8_RS(64, 0, "e4m3", WG_REGS32, "{%32, %33, %34, %35}, %36", 37, WG_ACC8(0), WG_ACC8(8), WG_ACC8(16),
          WG_ACC8(24))  // the forward's PV, d = 64
WG_FP8_RS(136, 0, "e4m3", WG_REGS68, "{%68, %69, %70, %71}, %72", 73, WG_ACC8(0), WG_ACC8(8), WG_ACC8(16),
          WG_ACC8(24), WG_ACC8(32), WG_ACC8(40), WG_ACC8(48), WG_ACC8(56), WG_ACC4(64))  // PV and row sums, d = 128
WG_FP8_RS(72, 0, "e4m3", WG_REGS36, "{%36, %37, %38, %39}, %40", 41, WG_ACC8(0), WG_ACC8(8), WG_ACC8(16),
          WG_ACC8(24), WG_ACC4(32))  // PV and row sums, d = 64
#undef WG_FP8_RS

// The k32 steps of one tile product, into a fresh accumulator (the caller fences and commits):
// d (64 x N) = A (64 x 32 STEPS) B (32 STEPS x N), B a K-major swizzled tile at descriptor low word
// b (kmajor_desc_lo; a k32 step is 32 bytes further, + 2), A likewise at a (wg_fp8_tile: 128-byte
// swizzle, B too or, B_SW64, in the 64-byte one, STEPS <= 2) or from registers (wg_fp8_rs_tile:
// a[kk] the A fragments of step kk, wg_fp8_rs's layout).
template <int N, int AT, int BT, int STEPS, bool B_SW64 = false>
__device__ __forceinline__ void wg_fp8_tile(float (&d)[N / 2], uint32_t a, uint32_t b) {
    static_assert(!B_SW64 || STEPS <= 2, "a 64-byte row holds two k32 steps");
#pragma unroll
    for (int kk = 0; kk < STEPS; kk++)
        wg_fp8<N, AT, BT>(d, kmajor_desc(a + 2 * kk), B_SW64 ? kmajor_desc_sw64(b + 2 * kk) : kmajor_desc(b + 2 * kk),
                          kk > 0);
}
template <int N, int AT, int STEPS>
__device__ __forceinline__ void wg_fp8_rs_tile(float (&d)[N / 2], const uint32_t (&a)[STEPS][4], uint32_t b) {
#pragma unroll
    for (int kk = 0; kk < STEPS; kk++) wg_fp8_rs<N, AT>(d, a[kk], kmajor_desc(b + 2 * kk), kk > 0);
}

// FP32 accumulator layout (m64nN, N/2 values per thread) -> the BF16 A fragments of an RS wgmma
// over the same N (k16 step kk: elements 8kk .. 8kk + 7, paired).
template <int N>
__device__ __forceinline__ void pack_bf16_afrags(uint32_t (&a)[N / 16][4], const float (&s)[N / 2]) {
#pragma unroll
    for (int kk = 0; kk < N / 16; kk++)
#pragma unroll
        for (int e = 0; e < 4; e++) a[kk][e] = pack_bf16(s[8 * kk + 2 * e], s[8 * kk + 2 * e + 1]);
}

// Copies rows [row0, row0+ROWS) of a (T, stride) BF16 matrix (D columns) into D/64 swizzled
// regions of ROWS x 128 bytes; rows >= T become zeros.
template <int ROWS, int D, int NTHREADS>
__device__ __forceinline__ void load_tile_sw128(bf16 *s, const bf16 *g, long stride, int row0, int T,
                                                int tid) {
    constexpr int CHUNKS = D / 8;
    static_assert(ROWS * CHUNKS % NTHREADS == 0, "tile copy must split evenly over the threads");
    unsigned char *sb = reinterpret_cast<unsigned char *>(s);
#pragma unroll
    for (int i = 0; i < ROWS * CHUNKS / NTHREADS; i++) {
        int c = tid + i * NTHREADS;
        int r = c / CHUNKS, ch = c % CHUNKS;
        int t = row0 + r;
        bool ok = t < T;
        unsigned char *dst = sb + (ch >> 3) * (ROWS * 128) + r * 128 + (((ch & 7) ^ (r & 7)) << 4);
        cp_async16(dst, g + (long)(ok ? t : 0) * stride + ch * 8, ok);
    }
}

// --- TMA (bulk tensor copies), mbarriers, register reallocation (sm_90) -------------------------
// An mbarrier counts arrivals and, for TMA, transaction bytes; a phase completes when both reach
// zero, and waiters name the phase by its parity (0, 1, 0, ...).
__device__ __forceinline__ void mbar_init(uint64_t *bar, int count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count) : "memory");
}
// Makes barrier inits visible to the async proxy (TMA) before the CTA-wide barrier that follows.
__device__ __forceinline__ void mbar_fence_init() { asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory"); }
__device__ __forceinline__ void mbar_arrive(uint64_t *bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// One arrival that also announces `bytes` of TMA transactions for the current phase.
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void mbar_wait(uint64_t *bar, uint32_t parity) {
    asm volatile(
        "{\n.reg .pred done;\nWAIT:\n"
        "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
        "@!done bra WAIT;\n}\n" ::"r"(smem_addr(bar)),
        "r"(parity)
        : "memory");
}
// Adds `bytes` of expected TMA transactions to the current phase without an arrival.
__device__ __forceinline__ void mbar_expect_tx(uint64_t *bar, uint32_t bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(bytes)
                 : "memory");
}
// One arrival on bar once every cp.async this thread issued so far has landed (its count was set
// at init: .noinc).
__device__ __forceinline__ void cp_async_mbar_arrive(uint64_t *bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}
// TMA: box at coordinates (c0 innermost, c1) of the 2-D tensor map -> shared memory at dst;
// completion is counted on bar.
__device__ __forceinline__ void tma_load_2d(void *dst, const void *tmap, uint64_t *bar, int c0, int c1) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
            smem_addr(dst)),
        "l"((uint64_t)tmap), "r"(c0), "r"(c1), "r"(smem_addr(bar))
        : "memory");
}
// TMA multicast within a thread block cluster: the box at (c0, c1) lands at dst in every CTA of
// cta_mask (bit r: cluster rank r), each completing on its own mbarrier at bar's offset.
__device__ __forceinline__ void tma_load_2d_multicast(void *dst, const void *tmap, uint64_t *bar, int c0, int c1,
                                                      uint16_t cta_mask) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes.multicast::cluster"
        " [%0], [%1, {%2, %3}], [%4], %5;\n" ::"r"(smem_addr(dst)),
        "l"((uint64_t)tmap), "r"(c0), "r"(c1), "r"(smem_addr(bar)), "h"(cta_mask)
        : "memory");
}
// Thread block clusters: this CTA's rank, a barrier over every thread of the cluster (orders
// shared-memory writes, mbarrier inits included, before the peers' reads), and one arrival on the
// mbarrier at bar's offset in the shared memory of the CTA of rank cta (release at CTA scope, the
// default, as CUTLASS's cluster barriers arrive).
__device__ __forceinline__ uint32_t cluster_ctarank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;\n" : "=r"(r));
    return r;
}
__device__ __forceinline__ void cluster_sync() {
    asm volatile("barrier.cluster.arrive.release.aligned;\nbarrier.cluster.wait.acquire.aligned;\n" ::: "memory");
}
__device__ __forceinline__ void mbar_arrive_cluster(uint64_t *bar, uint32_t cta) {
    asm volatile(
        "{\n.reg .b32 ra;\nmapa.shared::cluster.u32 ra, %0, %1;\n"
        "mbarrier.arrive.shared::cluster.b64 _, [ra];\n}\n" ::"r"(smem_addr(bar)),
        "r"(cta)
        : "memory");
}
// TMA: box at coordinates (c0 innermost .. c3) of the 4-D tensor map -> shared memory at dst;
// completion is counted on bar (bytes of the whole box, zero-filled parts included).
__device__ __forceinline__ void tma_load_4d(void *dst, const void *tmap, uint64_t *bar, int c0, int c1,
                                            int c2, int c3) {
    asm volatile(
        "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], [%6];\n" ::"r"(
            smem_addr(dst)),
        "l"((uint64_t)tmap), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(smem_addr(bar))
        : "memory");
}
// TMA reduction: the box at coordinates (c0 innermost, c1, c2) of the 3-D tensor map += the
// shared-memory tile at ssrc (FP32 add, each element atomically in L2; out-of-bound elements are
// dropped), in this thread's current bulk group.
__device__ __forceinline__ void tma_reduce_add_3d(const void *tmap, uint32_t ssrc, int c0, int c1, int c2) {
    asm volatile("cp.reduce.async.bulk.tensor.3d.global.shared::cta.add.tile.bulk_group [%0, {%1, %2, %3}], [%4];\n" ::"l"(
                     (uint64_t)tmap),
                 "r"(c0), "r"(c1), "r"(c2), "r"(ssrc)
                 : "memory");
}
// TMA store: the shared-memory box at ssrc (laid out as the map's box, swizzle included) -> the
// box at coordinates (c0 innermost .. c3) of the 4-D tensor map (out-of-bound rows are not
// written), in this thread's current bulk group.
__device__ __forceinline__ void tma_store_4d(const void *tmap, uint32_t ssrc, int c0, int c1, int c2, int c3) {
    asm volatile("cp.async.bulk.tensor.4d.global.shared::cta.bulk_group [%0, {%1, %2, %3, %4}], [%5];\n" ::"l"(
                     (uint64_t)tmap),
                 "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(ssrc)
                 : "memory");
}
// Bulk copy of `bytes` (a multiple of 16; both addresses 16-byte aligned) from shared memory at
// s_src to global memory at dst, in this thread's current bulk group.
__device__ __forceinline__ void bulk_store(void *dst, uint32_t s_src, uint32_t bytes) {
    asm volatile("cp.async.bulk.global.shared::cta.bulk_group [%0], [%1], %2;\n" ::"l"(dst), "r"(s_src), "r"(bytes)
                 : "memory");
}
__device__ __forceinline__ void bulk_commit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
// the shared-memory sources of this thread's bulk operations have been read (may be overwritten)
__device__ __forceinline__ void bulk_wait_read() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
// (Their writes to global memory complete with the grid, before the next kernel of the stream: no
// kernel here waits for them.)
// Named barrier BASE + wg over the 128 threads of consumer warpgroup wg (0 or 1): each
// warpgroup's own, with immediate ids.
template <int BASE>
__device__ __forceinline__ void wg_bar_sync(int wg) {
    if (wg == 0) named_bar_sync<BASE, 128>();
    else named_bar_sync<BASE + 1, 128>();
}
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
// Register budget per thread of the executing warpgroup (needs a register cap at kernel entry:
// __launch_bounds__(threads, 1)).
template <int N>
__device__ __forceinline__ void setmaxnreg_inc() { asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(N)); }
template <int N>
__device__ __forceinline__ void setmaxnreg_dec() { asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(N)); }

// --- the persistent FP8 kernels' producer / consumer ring (the forward, fp8_dm's delta pass) ---
// A CTA of 3 warpgroups: the producer (threads 0..127) copies each tile's fixed operands into
// one of 2 tile buffers and each key block's operands into a ring of STAGES stages with cp.async;
// the consumers (256 threads) compute. mbarriers pace them (PersistentRing::init): per stage `full` (the
// producer's 128 threads, each once its copies landed) and `empty` (every consumer thread after its
// last read of the stage; WARP_RELEASE: lane 0 of each of the 8 consumer warps once the warp's
// lanes are past it, 8 arrivals per block instead of 256: the FP8 forward's, ~1% faster there, but
// 2-3% slower in the delta pass at 1K-2K, docs/perf.md stop 32); per tile buffer `q_full` (the
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

// Forward implementation, read once from ATTN_GPU_FWD: unset or "wgmma": wgmma, one key block at
// a time (default, tested); "mma": the mma.sync kernel (tested); "wgmma_pipe": wgmma with the

// Tile sizes of the mma.sync kernel: 128 query rows per CTA (8 warps x 16 rows), key blocks of 64.
#define FWD_BQ 128
#define FWD_BK 64
#define FWD_WARPS 8

// The mma.sync forward (attention/fwd_bf16_mma.cu) for head dim d, launched by attn_gpu_forward.
void attn_fwd_mma_launch(int d, const bf16 *q, const bf16 *k, const bf16 *v, int qkv_stride, bf16 *o,
                         int o_stride, float *lse, int B, int H, int T, cudaStream_t stream);

#endif  // ATTENTION_GPU_COMMON_CUH
