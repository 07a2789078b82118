// test_tile_bound.c: the per-tile bound the GPU attention tests put on the FP8 backward's
// gradients (test.h's TileMax; test_attention_fp8_gpu.cu), sized and checked here on the CPU
// emulation, which needs no GPU.
//
// The GPU's dQ, dK, dV differ from the emulation's by accumulation order, Hopper's truncating FP8
// sums and the FP8 code flips these cause (relative L2 < 5e-2 allowed). The same kinds of
// difference arise between two emulations that tile the keys differently (block_k 128 against
// 64: the online softmax's running max moves at other places, so P's FP8 codes flip): that
// difference's worst tile must stay well inside the bound. And a tile that is wrong (scaled by
// 1.5, zeroed, its rows shifted by one), which the relative L2 over a large tensor can miss, must
// exceed it. Tiles are 64 rows of one head, the backward kernel's query block (its key block is
// 128 rows: a wrong key tile is two wrong 64-row tiles).
#include <math.h>    // sqrt, fabs
#include <stdlib.h>  // malloc
#include <string.h>  // memcpy

#include "attention_fp8.h"       // attn_block_options: the GPU cases' options
#include "core/config.h"         // attn_precision_name
#include "core/fp8.h"            // bf16_round: inputs as the GPU gets them
#include "cpu/attention_cpu.h"   // the emulation
#include "test.h"                // CHECK, TileMax

#define TILE_ROWS 64
#define TILE_BOUND 0.25   // test_attention_fp8_gpu.cu's bound on the worst tile's max error / its max |ref|
#define TILE_FLOOR 1e-2   // tiles below 1% of the tensor's largest value are measured against that 1%

typedef struct {
    int heads, T, d;
    double qk_scale;
    Fp8Format gfmt;
} Shape;

// The gradients dQ, dK, dV (3 x heads x T x d) of one mode with one key tiling; inputs (4 x heads
// x T x d: Q, K, V, dO) as the GPU cases make them.
static void grads(const Shape *s, AttnPrecision mode, int block_k, const float *in, float *out) {
    AttnOptions opt = attn_block_options(mode, s->gfmt, 128);
    opt.block_q = 64;
    opt.block_k = block_k;
    const size_t hn = (size_t)s->T * s->d, all = (size_t)s->heads * hn;
    float *o = malloc(hn * sizeof(float)), *lse = malloc((size_t)s->T * sizeof(float));
    for (int h = 0; h < s->heads; h++) {
        const float *q = in + h * hn, *k = in + all + h * hn, *v = in + 2 * all + h * hn, *dout = in + 3 * all + h * hn;
        AttnStats st;
        memset(&st, 0, sizeof st);
        attn_cpu_forward(&opt, NULL, s->T, s->d, q, k, v, o, lse, &st);
        attn_cpu_backward(&opt, NULL, s->T, s->d, q, k, v, o, lse, dout, out + h * hn, out + all + h * hn,
                          out + 2 * all + h * hn, &st, NULL);
    }
    free(o);
    free(lse);
}

// Relative L2, the worst tile's relative L2 and the max-abs ratio of got against ref, one
// gradient (heads x T x d).
static void compare(const Shape *s, const float *got, const float *ref, double *rel, double *tile, double *maxabs) {
    const int tiles_per_head = (s->T + TILE_ROWS - 1) / TILE_ROWS;
    TileErr te = tile_err_new(s->heads * tiles_per_head);
    double num = 0, den = 0;
    for (int h = 0; h < s->heads; h++)
        for (int t = 0; t < s->T; t++)
            for (int c = 0; c < s->d; c++) {
                size_t i = ((size_t)h * s->T + t) * s->d + c;
                num += ((double)got[i] - ref[i]) * ((double)got[i] - ref[i]);
                den += (double)ref[i] * ref[i];
                tile_err_add(&te, h * tiles_per_head + t / TILE_ROWS, got[i], ref[i]);
            }
    *rel = sqrt(num / (den > 0 ? den : 1));
    *tile = tile_err_rel(&te, TILE_FLOOR, NULL);
    *maxabs = tile_err_maxabs(&te);
    tile_err_free(&te);
}

int main(void) {
    // The GPU cases' kinds: sharp and diffuse, d 64 and 128, ragged T, both gradient formats; the
    // last is large (16 heads x 1024: 256 dQ tiles) so that one tile is a small part of it.
    const Shape shapes[] = {
        {2, 200, 64, 1.0, FP8_E4M3}, {1, 517, 128, 2.0, FP8_E5M2}, {2, 1024, 64, 3.0, FP8_E4M3},
        {1, 384, 128, 2.0, FP8_E4M3}, {16, 1024, 64, 1.0, FP8_E5M2},
    };
    const AttnPrecision modes[3] = {ATTN_FP8_NAIVE, ATTN_FP8_DM, ATTN_FP8_DM_APPROX};
    const char *gname[3] = {"dQ", "dK", "dV"};
    double worst_noise = 0, worst_noise_rel = 0, worst_maxabs = 0;
    for (int si = 0; si < (int)(sizeof shapes / sizeof shapes[0]); si++) {
        const Shape *s = &shapes[si];
        const size_t all = (size_t)s->heads * s->T * s->d;
        float *in = malloc(4 * all * sizeof(float)), *a = malloc(3 * all * sizeof(float));
        float *b = malloc(3 * all * sizeof(float)), *bad = malloc(all * sizeof(float));
        for (int w = 0; w < 4; w++) {
            attn_fill_normal(in + w * all, all, 0x711E0000ull + 16 * si + w);
            const double scale = w < 2 ? s->qk_scale : w == 2 ? 1.0 : 1e-2;
            for (size_t i = 0; i < all; i++) in[w * all + i] = bf16_round((float)(in[w * all + i] * scale));
        }
        const int big = s->heads * s->T >= 16384;
        for (int mi = 0; mi < 3; mi++) {
            if (big && modes[mi] != ATTN_FP8_DM) continue;  // the large shape once: time
            grads(s, modes[mi], 128, in, a);
            grads(s, modes[mi], 64, in, b);
            for (int g = 0; g < 3; g++) {
                double rel, tile, maxabs;
                compare(s, b + g * all, a + g * all, &rel, &tile, &maxabs);
                printf("# %-13s %s heads %2d T %4d d %3d qk*%.0f %s: block_k 64 vs 128: rel L2 %.2e, worst tile %.2e, "
                       "max abs %.2e\n", attn_precision_name(modes[mi]), gname[g], s->heads, s->T, s->d, s->qk_scale,
                       s->gfmt == FP8_E5M2 ? "e5m2" : "e4m3", rel, tile, maxabs);
                worst_maxabs = nan_max(worst_maxabs, maxabs);
                worst_noise = nan_max(worst_noise, tile);
                worst_noise_rel = nan_max(worst_noise_rel, rel);
            }
            if (modes[mi] != ATTN_FP8_DM) continue;
            // One wrong tile of each gradient, in the middle of the last head, against the clean one.
            for (int g = 0; g < 3; g++) {
                const float *ref = a + g * all;
                const size_t first = ((size_t)(s->heads - 1) * s->T + (size_t)(s->T / 2 / TILE_ROWS) * TILE_ROWS) * s->d;
                const size_t rows = (size_t)(s->T - s->T / 2 / TILE_ROWS * TILE_ROWS) < TILE_ROWS
                                        ? (size_t)(s->T - s->T / 2 / TILE_ROWS * TILE_ROWS) : TILE_ROWS;
                const char *what[3] = {"scaled by 1.5", "zeroed", "rows shifted by one"};
                for (int kind = 0; kind < 3; kind++) {
                    memcpy(bad, ref, all * sizeof(float));
                    for (size_t r = 0; r < rows; r++)
                        for (int c = 0; c < s->d; c++) {
                            size_t i = first + r * s->d + c;
                            bad[i] = kind == 0 ? 1.5f * ref[i] : kind == 1 ? 0.0f : ref[first + ((r + 1) % rows) * s->d + c];
                        }
                    double rel, tile, maxabs;
                    compare(s, bad, ref, &rel, &tile, &maxabs);
                    char name[200];
                    snprintf(name, sizeof name, "a %s tile %s trips the tile bound (%g): heads %d T %d d %d", gname[g],
                             what[kind], TILE_BOUND, s->heads, s->T, s->d);
                    CHECK(tile > TILE_BOUND, name, "worst tile %.3e (rel L2 %.3e, max abs %.3e)", tile, rel, maxabs);
                    if (big && kind == 0) {
                        snprintf(name, sizeof name, "... where the relative L2 bound (5e-2) misses it: %s", gname[g]);
                        CHECK(rel < 5e-2, name, "rel L2 %.3e", rel);
                    }
                }
            }
        }
        free(in), free(a), free(b), free(bad);
    }
    printf("# worst tile of the tiling difference: %.3e (its rel L2 up to %.3e, max abs %.3e); bound %g\n", worst_noise,
           worst_noise_rel, worst_maxabs, TILE_BOUND);
    CHECK(worst_noise < 0.5 * TILE_BOUND, "legitimate differences (another key tiling) stay under half the tile bound",
          "worst tile %.3e, bound %g", worst_noise, TILE_BOUND);
    return test_summary("test_tile_bound");
}
