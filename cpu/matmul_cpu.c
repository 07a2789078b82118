// matmul_cpu.c: cache-blocked FP32 GEMM for the CPU backend.
//
// Structure (the classic Goto/BLIS scheme, simplified):
//   the output is cut into tiles of mt x nt; OpenMP hands whole tiles to threads, so each
//   output element belongs to exactly one thread. For its tile a thread walks k in blocks of
//   KC; for each block it packs the A rows into MR-row micro-panels and the B columns into
//   NR-column micro-panels (zero-padded at the edges), then runs an MR x NR register-tile
//   micro-kernel over them. The micro-kernel loads the output into its accumulators (or zeros
//   on the very first k block without accumulate), adds the products for k in increasing order
//   and stores it back: each element is the same sequential sum whatever the blocking.
//
// The micro-kernel is written with GCC vector extensions, in two register layouts: 8-float
// vectors in a copy compiled with target("avx2"), chosen at run time when the CPU has AVX2, and
// 4-float vectors for the baseline target (SSE2 on x86-64, or 128-bit SIMD elsewhere).
// Separate multiply and add (no FMA; -std=c11 also disables contraction) keep both copies
// bit-identical.
#include "cpu/matmul_cpu.h"

#include <omp.h>     // omp_get_max_threads, parallel tiles
#include <stdlib.h>  // aligned_alloc, free
#include <string.h>  // memset

#include "core/common.h"  // FATAL

#define MR 6    // micro-tile rows (broadcast A values)
#define NR 16   // micro-tile columns (two 8-float or four 4-float vectors)
#define KC 256  // k block: an A micro-panel (KC x MR) and a B micro-panel (KC x NR) stay in L1/L2

typedef float v8f __attribute__((vector_size(32)));                 // aligned (packed panels)
typedef float v8f_u __attribute__((vector_size(32), aligned(4)));   // unaligned (output rows)

// A strided view: element (r, c) lives at p[r * rs + c * cs]. The three products differ only
// in the views they pass.
typedef struct {
    const float *p;
    long rs, cs;
} View;

typedef struct {
    int M, N, K;
    View a, b;       // a: (M, K), b: (K, N)
    float *out;      // (M, N), row stride N
    int accumulate;
    int mt, nt;      // tile shape (multiples of MR and NR)
} Gemm;

// --- packing -----------------------------------------------------------------------------------
// pa: for each micro-panel of MR rows, kc groups of MR values (k-major). Rows past M are zero.
static inline __attribute__((always_inline)) void pack_a(float *restrict pa, View a, int i0,
                                                         int rows, int k0, int kc) {
    for (int p = 0; p < rows; p += MR) {
        float *dst = pa + (long)p * kc;
        int mr = rows - p < MR ? rows - p : MR;
        if (a.rs == 1 && mr == MR) {  // columns of a are contiguous: copy MR at a time
            for (int k = 0; k < kc; k++) {
                const float *src = a.p + (long)(k0 + k) * a.cs + (i0 + p);
                float *d = dst + k * MR;  // spelled out: a 6-float loop becomes a memmove call
                d[0] = src[0]; d[1] = src[1]; d[2] = src[2]; d[3] = src[3]; d[4] = src[4]; d[5] = src[5];
            }
            continue;
        }
        for (int r = 0; r < MR; r++) {
            if (r < mr) {
                const float *src = a.p + (long)(i0 + p + r) * a.rs + (long)k0 * a.cs;
                for (int k = 0; k < kc; k++) dst[k * MR + r] = src[k * a.cs];
            } else {
                for (int k = 0; k < kc; k++) dst[k * MR + r] = 0.0f;
            }
        }
    }
}

// pb: for each micro-panel of NR columns, kc groups of NR values. Columns past N are zero.
static inline __attribute__((always_inline)) void pack_b(float *restrict pb, View b, int j0,
                                                         int cols, int k0, int kc) {
    for (int p = 0; p < cols; p += NR) {
        float *dst = pb + (long)p * kc;
        int nr = cols - p < NR ? cols - p : NR;
        if (b.cs == 1 && nr == NR) {  // rows of b are contiguous: copy NR at a time
            for (int k = 0; k < kc; k++) {
                const float *src = b.p + (long)(k0 + k) * b.rs + (j0 + p);
                *(v8f *)(dst + k * NR) = *(const v8f_u *)src;  // NR == 16: two vectors
                *(v8f *)(dst + k * NR + 8) = *(const v8f_u *)(src + 8);
            }
        } else {
            for (int c = 0; c < NR; c++) {
                if (c < nr) {
                    const float *src = b.p + (long)(k0) * b.rs + (long)(j0 + p + c) * b.cs;
                    for (int k = 0; k < kc; k++) dst[k * NR + c] = src[(long)k * b.rs];
                } else {
                    for (int k = 0; k < kc; k++) dst[k * NR + c] = 0.0f;
                }
            }
        }
    }
}

// --- micro-kernels: out (MR x NR, row stride ldo) = start + pa (kc x MR)^T pb (kc x NR) -------
// start is the tile's current content when load, else 0. Two register layouts of the same
// arithmetic (per element: the same products added in the same order, so the same bits):
//   kernel_v8: 6 rows x 2 vectors of 8 (12 accumulators), for AVX2's 16 ymm registers;
//   kernel_v4: two passes over 8-column halves, 6 rows x 2 vectors of 4 (12 accumulators), for
//              the 16 xmm registers of baseline x86-64 (and 128-bit SIMD elsewhere).
typedef float v4f __attribute__((vector_size(16)));
typedef float v4f_u __attribute__((vector_size(16), aligned(4)));

static inline __attribute__((always_inline)) void kernel_v8(int kc, const float *restrict pa,
                                                            const float *restrict pb,
                                                            float *restrict out, long ldo, int load) {
    v8f c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
    if (load) {
#define LD(r) c##r##0 = *(const v8f_u *)(out + (r) * ldo); c##r##1 = *(const v8f_u *)(out + (r) * ldo + 8);
        LD(0) LD(1) LD(2) LD(3) LD(4) LD(5)
#undef LD
    } else {
        c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = (v8f){0};
    }
    for (int k = 0; k < kc; k++) {
        v8f b0 = *(const v8f *)(pb + k * NR), b1 = *(const v8f *)(pb + k * NR + 8);
        const float *ak = pa + k * MR;
#define STEP(r) { float av = ak[r]; c##r##0 += b0 * av; c##r##1 += b1 * av; }
        STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5)
#undef STEP
    }
#define ST(r) *(v8f_u *)(out + (r) * ldo) = c##r##0; *(v8f_u *)(out + (r) * ldo + 8) = c##r##1;
    ST(0) ST(1) ST(2) ST(3) ST(4) ST(5)
#undef ST
}

static inline __attribute__((always_inline)) void kernel_v4(int kc, const float *restrict pa,
                                                            const float *restrict pb,
                                                            float *restrict out, long ldo, int load) {
    for (int half = 0; half < NR; half += 8) {
        float *o = out + half;
        v4f c00, c01, c10, c11, c20, c21, c30, c31, c40, c41, c50, c51;
        if (load) {
#define LD(r) c##r##0 = *(const v4f_u *)(o + (r) * ldo); c##r##1 = *(const v4f_u *)(o + (r) * ldo + 4);
            LD(0) LD(1) LD(2) LD(3) LD(4) LD(5)
#undef LD
        } else {
            c00 = c01 = c10 = c11 = c20 = c21 = c30 = c31 = c40 = c41 = c50 = c51 = (v4f){0};
        }
        for (int k = 0; k < kc; k++) {
            v4f b0 = *(const v4f *)(pb + k * NR + half), b1 = *(const v4f *)(pb + k * NR + half + 4);
            const float *ak = pa + k * MR;
#define STEP(r) { float av = ak[r]; c##r##0 += b0 * av; c##r##1 += b1 * av; }
            STEP(0) STEP(1) STEP(2) STEP(3) STEP(4) STEP(5)
#undef STEP
        }
#define ST(r) *(v4f_u *)(o + (r) * ldo) = c##r##0; *(v4f_u *)(o + (r) * ldo + 4) = c##r##1;
        ST(0) ST(1) ST(2) ST(3) ST(4) ST(5)
#undef ST
    }
}

// A partial tile (mr < MR or nr < NR) goes through a zero-padded MR x NR staging copy.
static inline __attribute__((always_inline)) void micro_tile(int kc, const float *restrict pa,
                                                             const float *restrict pb,
                                                             float *restrict out, long ldo,
                                                             int mr, int nr, int load, int wide) {
    if (mr == MR && nr == NR) {
        if (wide) kernel_v8(kc, pa, pb, out, ldo, load);
        else kernel_v4(kc, pa, pb, out, ldo, load);
        return;
    }
    float edge[MR * NR] __attribute__((aligned(32)));
    memset(edge, 0, sizeof edge);
    if (load)
        for (int r = 0; r < mr; r++)
            for (int c = 0; c < nr; c++) edge[r * NR + c] = out[r * ldo + c];
    if (wide) kernel_v8(kc, pa, pb, edge, NR, 1);
    else kernel_v4(kc, pa, pb, edge, NR, 1);
    for (int r = 0; r < mr; r++)
        for (int c = 0; c < nr; c++) out[r * ldo + c] = edge[r * NR + c];
}

// --- one output tile: all k blocks, packing and micro-kernels ---------------------------------
static inline __attribute__((always_inline)) void tile_body(const Gemm *g, int tile, float *pa,
                                                            float *pb, int wide) {
    int tiles_n = (g->N + g->nt - 1) / g->nt;
    int i0 = (tile / tiles_n) * g->mt, j0 = (tile % tiles_n) * g->nt;
    int rows = g->M - i0 < g->mt ? g->M - i0 : g->mt;
    int cols = g->N - j0 < g->nt ? g->N - j0 : g->nt;
    for (int k0 = 0; k0 < g->K; k0 += KC) {
        int kc = g->K - k0 < KC ? g->K - k0 : KC;
        int load = g->accumulate || k0 > 0;
        pack_a(pa, g->a, i0, rows, k0, kc);
        pack_b(pb, g->b, j0, cols, k0, kc);
        for (int jp = 0; jp < cols; jp += NR) {
            int nr = cols - jp < NR ? cols - jp : NR;
            for (int ip = 0; ip < rows; ip += MR) {
                int mr = rows - ip < MR ? rows - ip : MR;
                micro_tile(kc, pa + (long)ip * kc, pb + (long)jp * kc,
                           g->out + (long)(i0 + ip) * g->N + (j0 + jp), g->N, mr, nr, load, wide);
            }
        }
    }
}

static void tile_generic(const Gemm *g, int tile, float *pa, float *pb) { tile_body(g, tile, pa, pb, 0); }

#if defined(__x86_64__) || defined(__i386__)
__attribute__((target("avx2"))) static void tile_avx2(const Gemm *g, int tile, float *pa, float *pb) {
    tile_body(g, tile, pa, pb, 1);
}
static int cpu_has_avx2(void) { return __builtin_cpu_supports("avx2"); }
#else
static void tile_avx2(const Gemm *g, int tile, float *pa, float *pb) { tile_body(g, tile, pa, pb, 0); }
static int cpu_has_avx2(void) { return 0; }
#endif

static int round_up(int x, int m) { return (x + m - 1) / m * m; }

static void gemm_run(Gemm *g) {
    if (g->M <= 0 || g->N <= 0) return;
    if (g->K <= 0) {  // empty sum: the output is its start value
        if (!g->accumulate) memset(g->out, 0, sizeof(float) * (size_t)g->M * g->N);
        return;
    }
    static int have_avx2 = -1;
    if (have_avx2 < 0) have_avx2 = cpu_has_avx2() ? 1 : 0;
    // Tile shape: large tiles amortise packing; shrink them until every thread has work.
    // The shape never changes the result, so it may depend on the thread count.
    int threads = omp_get_max_threads();
    int tm = (g->M + 95) / 96, tn = (g->N + 255) / 256;  // tile counts along M and N
    int mt = round_up((g->M + tm - 1) / tm, MR), nt = round_up((g->N + tn - 1) / tn, NR);
    while ((long)tm * tn < 2L * threads && (mt > MR || nt > NR)) {
        if (nt > NR && nt >= 2 * mt) tn++;  // split the longer side (B panels are NR wide)
        else if (mt > MR) tm++;
        else tn++;
        mt = round_up((g->M + tm - 1) / tm, MR);
        nt = round_up((g->N + tn - 1) / tn, NR);
    }
    g->mt = mt;
    g->nt = nt;
    int n_tiles = ((g->M + mt - 1) / mt) * ((g->N + nt - 1) / nt);
    int nthr = n_tiles < threads ? n_tiles : threads;
#pragma omp parallel num_threads(nthr)
    {
        float *pa = aligned_alloc(64, sizeof(float) * (size_t)mt * KC);
        float *pb = aligned_alloc(64, sizeof(float) * (size_t)nt * KC);
        if (!pa || !pb) FATAL("matmul: out of memory for packing buffers (%d x %d tiles)", mt, nt);
#pragma omp for schedule(dynamic, 1)
        for (int t = 0; t < n_tiles; t++) {
            if (have_avx2) tile_avx2(g, t, pa, pb);
            else tile_generic(g, t, pa, pb);
        }
        free(pa);
        free(pb);
    }
}

void matmul_nt(float *out, const float *a, const float *b, int M, int N, int K, int accumulate) {
    Gemm g = {M, N, K, {a, K, 1}, {b, 1, K}, out, accumulate, 0, 0};  // b(k, j) = b[j*K + k]
    gemm_run(&g);
}

void matmul_nn(float *out, const float *a, const float *b, int M, int N, int K, int accumulate) {
    Gemm g = {M, N, K, {a, K, 1}, {b, N, 1}, out, accumulate, 0, 0};
    gemm_run(&g);
}

void matmul_tn(float *out, const float *a, const float *b, int M, int N, int K, int accumulate) {
    Gemm g = {M, N, K, {a, 1, M}, {b, N, 1}, out, accumulate, 0, 0};  // a(i, k) = a[k*M + i]
    gemm_run(&g);
}
