// attention_cpu.c: causal attention for one head on the CPU in every precision of
// docs/fp8-attention.md, tiled and cast exactly like the GPU kernels.
//
// One code path serves every mode: a ModePlan says how each operand is cast (FP32, BF16, FP8)
// and how D is formed; the tile loops below are shared. Casts are emulated by quantize-
// dequantize (fp8_qdq): with power-of-two scales the dequantized value is exactly what the
// FP8 matmul multiplies, so every "FP8 matmul" here is an FP32 matmul on dequantized values.
// Accumulation is FP32 throughout (the order differs from the tensor cores', so GPU results
// agree to FP32-accumulation tolerance, while the FP8 codes themselves agree bit for bit).
//
// Which P forms dS and D (spec §1, §3: "D_i = (sum_j P_ij dP_ij) / (sum_j P_ij) (both sums over
// the P and dP used in dS_ij)"). dS_ij = P_ij (dP_ij - D_i) is elementwise work in FP32
// registers, so the P in it is the FP32 P recomputed against the final LSE, not the E4M3 P̂
// (which only feeds the dV matmul). The delta pass therefore sums that same FP32 P and the same
// FP32 dP = dÔ V̂^T, produced by the same routine (bwd_tile_p_dp) over the same tiles, so
// sum_j dS_ij = 0 up to FP32 rounding. The residual is measured on the FP32 dS before its cast.
//
// Where tau enters: S = tau * (Q̂ · K̂) per element; dQ and dK are accumulated without tau and
// multiplied by tau at the end (as the GPU's last dQ/dK step does).
//
// Beyond the paper (docs/fp8-attention.md §6), in the FP8 modes: centred keys quantize K - c
// instead of K (one c per head; the forward, the S recompute and the dQ matmul all see K̂ = the
// quantized K - c; dK's formula is unchanged, c being a constant); the rank-one correction
// subtracts r_i sum_j P_ij K̂_j / sum_j P_ij from dQ_i, with r_i the row sum of the cast dS that
// the dQ matmul used, so that dQ is that of a dS whose rows sum to zero.
#include "cpu/attention_cpu.h"

#include <math.h>    // expf, logf, sqrtf, fabsf, INFINITY
#include <string.h>  // memcpy, memset

#include "core/common.h"  // xmalloc, FATAL

// ---------------------------------------------------------------------------------------------
// What each precision does with each operand.

typedef enum { OPND_F32 = 0, OPND_BF16, OPND_FP8 } OperandKind;

typedef struct {
    OperandKind fwd_qkv;   // Q, K, V in the forward and in the backward's S recompute
    OperandKind p_fwd;     // P before the forward's PV (FP8: E4M3 * p_scale, vs the running max)
    int o_bf16;            // O stored BF16-rounded
    OperandKind bwd_do;    // dO in dP = dO V^T and dV = P^T dO (FP8: grad_format, per block)
    OperandKind p_dv;      // P before dV = P^T dO (FP8: E4M3 * p_scale, vs the final LSE)
    OperandKind ds;        // dS before dQ, dK (FP8: grad_format, one scale per tile)
    AttnDelta delta;       // how D is formed (core/precision.h)
    int delta_do_bf16;     // ATTN_DELTA_FROM_O: dO rounded to BF16 first (all modes but fp32)
} ModePlan;

// How each operand is cast, from the mode's plan (core/precision.h's attn_mode_plan, the table the
// GPU dispatcher reads too): an FP8 forward quantizes Q, K, V and P; an FP8 backward dO, P and dS,
// a BF16 backward (bf16, the hybrids: on the forward's own Q̂, K̂, V̂, exact in BF16) rounds them
// to BF16; fp32 casts nothing.
static ModePlan plan_for(AttnPrecision p) {
    if (p < 0 || p >= ATTN_N_PRECISIONS)
        FATAL("unknown attention precision %d (hint: AttnOptions not filled by attn_options_from_config?)", (int)p);
    const AttnModePlan mp = attn_mode_plan(p);
    ModePlan m;
    memset(&m, 0, sizeof m);
    if (p == ATTN_FP32) return m;  // everything FP32, D from stored (FP32) O and FP32 dO
    const OperandKind fwd = mp.fp8_forward ? OPND_FP8 : OPND_BF16, bwd = mp.fp8_backward ? OPND_FP8 : OPND_BF16;
    m.fwd_qkv = m.p_fwd = fwd;
    m.bwd_do = m.p_dv = m.ds = bwd;
    m.o_bf16 = m.delta_do_bf16 = 1;
    m.delta = mp.delta;
    return m;
}
static void check_options(const AttnOptions *opt, const AttnDelayedState *ds, int T, int d) {
    if (opt->block_q < 1 || opt->block_k < 1 || T < 1 || d < 1)
        FATAL("attention: bad shape T=%d d=%d block_q=%d block_k=%d", T, d, opt->block_q, opt->block_k);
    if (opt->scaling == SCALING_DELAYED && !ds)
        FATAL("attention: delayed scaling needs an AttnDelayedState (hint: pass the layer's state)");
    if (!(opt->p_scale > 0.0f))
        FATAL("attention: p_scale must be positive, got %g", opt->p_scale);
}

// ---------------------------------------------------------------------------------------------
// Operand casts.

static float amax_of(const float *x, size_t n) {
    float a = 0.0f;
    for (size_t i = 0; i < n; i++) a = fmaxf(a, fabsf(x[i]));
    return a;
}

// Scale of one tensor under delayed scaling: from the max of the amax history of previous
// steps; while the history is empty (the first step), from this head's own amax.
static float delayed_scale(const AttnDelayedState *ds, int tensor, Fp8Format fmt, float own_amax) {
    return fp8_scale_for_amax_within(fmt, ds->filled == 0 ? own_amax : attn_delayed_amax(ds, tensor),
                                     attn_scale_max_exp((AttnCast)tensor));
}

// x_hat = fp8(x*s)/s over rows [r0, r1) with one scale, counting casts and saturations.
static void qdq_rows(Fp8Format fmt, float s, int r0, int r1, int d, const float *x, float *xhat,
                     AttnStats *st, AttnCast which) {
    const float fmax = fp8_max(fmt);
    long long sat = 0;
    for (size_t i = (size_t)r0 * d; i < (size_t)r1 * d; i++) {
        float xs = x[i] * s;
        sat += fabsf(xs) > fmax;
        xhat[i] = fp8_round(fmt, xs) / s;
    }
    if (st) {
        st->saturated[which] += sat;
        st->casts[which] += (long long)(r1 - r0) * d;
    }
}

void attn_quantize_operand(const AttnOptions *opt, AttnDelayedState *ds, AttnCast which,
                           Fp8Format fmt, int T, int d, const float *x, float *xhat,
                           float *scales, AttnStats *st, int update_amax) {
    if (which > CAST_DO) FATAL("attn_quantize_operand: cast %d is not a per-tensor operand", (int)which);
    if (opt->scaling == SCALING_DELAYED && !ds)
        FATAL("attention: delayed scaling needs an AttnDelayedState (hint: pass the layer's state)");
    if (opt->scaling == SCALING_DELAYED) {
        float own = amax_of(x, (size_t)T * d);
        if (update_amax) ds->cur_amax[which] = fmaxf(ds->cur_amax[which], own);
        float s = delayed_scale(ds, (int)which, fmt, own);
        qdq_rows(fmt, s, 0, T, d, x, xhat, st, which);
        if (scales)
            for (int b = 0; b * ATTN_SCALE_BLOCK < T; b++) scales[b] = s;
        return;
    }
    // Block scaling: one scale per 128-token block of the sequence, from that block's amax.
    for (int b = 0; b * ATTN_SCALE_BLOCK < T; b++) {
        int r0 = b * ATTN_SCALE_BLOCK, r1 = r0 + ATTN_SCALE_BLOCK < T ? r0 + ATTN_SCALE_BLOCK : T;
        const float amax = amax_of(x + (size_t)r0 * d, (size_t)(r1 - r0) * d);
        float s = fp8_scale_for_amax_within(fmt, amax, attn_scale_max_exp(which));
        qdq_rows(fmt, s, r0, r1, d, x, xhat, st, which);
        if (scales) scales[b] = s;
    }
}

// The operand as a matmul of `kind` sees it.
static void prepare_operand(const AttnOptions *opt, AttnDelayedState *ds, OperandKind kind,
                            Fp8Format fmt, AttnCast which, int T, int d, const float *x,
                            float *out, AttnStats *st, int update_amax) {
    size_t n = (size_t)T * d;
    if (kind == OPND_F32) memcpy(out, x, n * sizeof *out);
    else if (kind == OPND_BF16)
        for (size_t i = 0; i < n; i++) out[i] = bf16_round(x[i]);
    else attn_quantize_operand(opt, ds, which, fmt, T, d, x, out, NULL, st, update_amax);
}

// Centred keys: whether the mode quantizes K - c, and K - c itself into kc: (T, d). c is
// key_center under CENTER_KEYS_DELAYED when given, else the head's own mean (attn_key_mean).
static int centering_on(const AttnOptions *opt) {
    return attn_precision_is_fp8(opt->precision) && opt->center_keys != CENTER_KEYS_OFF;
}

void attn_key_mean(int T, int d, const float *k, float *c) {
    double *sum = xcalloc((size_t)d, sizeof *sum);
    for (int t = 0; t < T; t++)
        for (int x = 0; x < d; x++) sum[x] += k[(size_t)t * d + x];
    for (int x = 0; x < d; x++) c[x] = bf16_round((float)(sum[x] / T));
    free(sum);
}

static void centred_keys(const AttnOptions *opt, int T, int d, const float *k, const float *key_center, float *kc) {
    float *c = xmalloc((size_t)d * sizeof *c);
    if (opt->center_keys == CENTER_KEYS_DELAYED && key_center) memcpy(c, key_center, (size_t)d * sizeof *c);
    else attn_key_mean(T, d, k, c);
    for (int t = 0; t < T; t++)
        for (int x = 0; x < d; x++) kc[(size_t)t * d + x] = k[(size_t)t * d + x] - c[x];
    free(c);
}

// K as the S recompute and the matmuls see it: K̂ of the centred keys when centring is on.
static void prepare_keys(const AttnOptions *opt, AttnDelayedState *ds, OperandKind kind, int T, int d,
                         const float *k, const float *key_center, float *out, AttnStats *st, int update_amax) {
    if (!centering_on(opt)) {
        prepare_operand(opt, ds, kind, FP8_E4M3, CAST_K, T, d, k, out, st, update_amax);
        return;
    }
    float *kc = xmalloc((size_t)T * d * sizeof *kc);
    centred_keys(opt, T, d, k, key_center, kc);
    prepare_operand(opt, ds, kind, FP8_E4M3, CAST_K, T, d, kc, out, st, update_amax);
    free(kc);
}

// P before a matmul: FP8 is E4M3 with the static scale p_scale (P <= 1 against the max it was
// taken against, so p_scale = 256 never saturates; a larger p_scale may, and is counted).
static inline float cast_p(OperandKind kind, float p, float p_scale, AttnStats *st) {
    if (kind == OPND_BF16) return bf16_round(p);
    if (kind == OPND_F32) return p;
    float ps = p * p_scale;
    if (st) {
        st->casts[CAST_P]++;
        st->saturated[CAST_P] += ps > FP8_E4M3_MAX;
    }
    return fp8_round(FP8_E4M3, ps) / p_scale;
}

static inline float dot(const float *a, const float *b, int n) {
    float s = 0.0f;
    for (int c = 0; c < n; c++) s += a[c] * b[c];
    return s;
}

static inline int min_int(int a, int b) { return a < b ? a : b; }

// ---------------------------------------------------------------------------------------------
// Forward: online softmax over key blocks, one query block at a time.

void attn_cpu_forward(const AttnOptions *opt, AttnDelayedState *ds, int T, int d,
                      const float *q, const float *k, const float *v, float *o, float *lse,
                      AttnStats *st) {
    attn_cpu_forward_centered(opt, ds, T, d, q, k, v, NULL, o, lse, st);
}

void attn_cpu_forward_centered(const AttnOptions *opt, AttnDelayedState *ds, int T, int d,
                               const float *q, const float *k, const float *v, const float *key_center,
                               float *o, float *lse, AttnStats *st) {
    check_options(opt, ds, T, d);
    const ModePlan pl = plan_for(opt->precision);
    const int bq = opt->block_q, bk = opt->block_k;
    const float tau = 1.0f / sqrtf((float)d);
    size_t n = (size_t)T * d;
    float *qh = xmalloc(n * sizeof *qh), *kh = xmalloc(n * sizeof *kh), *vh = xmalloc(n * sizeof *vh);
    prepare_operand(opt, ds, pl.fwd_qkv, FP8_E4M3, CAST_Q, T, d, q, qh, st, 1);
    prepare_keys(opt, ds, pl.fwd_qkv, T, d, k, key_center, kh, st, 1);
    prepare_operand(opt, ds, pl.fwd_qkv, FP8_E4M3, CAST_V, T, d, v, vh, st, 1);

    float *srow = xmalloc((size_t)bk * sizeof *srow);  // (bk) one row of the S / P tile
    float *acc = xmalloc((size_t)d * sizeof *acc);     // (d) unnormalised O row

    // Rows are independent in the forward, so walk the tile row by row: the values are those
    // of the (bq x bk) tile loop, because each row only ever sees its own running max.
    for (int q0 = 0; q0 < T; q0 += bq) {
        int q_end = min_int(q0 + bq, T);
        for (int i = q0; i < q_end; i++) {
            float m = -INFINITY, l = 0.0f;
            memset(acc, 0, (size_t)d * sizeof *acc);
            // Key blocks up to the one holding the query block's last row (later ones are all
            // masked and skipped); inside, keys past row i are masked.
            for (int k0 = 0; k0 < q_end; k0 += bk) {
                int nk = min_int(bk, T - k0);
                int nvis = min_int(nk, i - k0 + 1);  // unmasked keys of row i in this block
                if (nvis <= 0) continue;             // row i fully masked here: m, l, acc unchanged
                float tile_max = -INFINITY;
                for (int j = 0; j < nvis; j++) {
                    srow[j] = tau * dot(qh + (size_t)i * d, kh + (size_t)(k0 + j) * d, d);
                    tile_max = fmaxf(tile_max, srow[j]);
                }
                float m_new = fmaxf(m, tile_max);
                float alpha = m == -INFINITY ? 0.0f : expf(m - m_new);  // rescales old l, acc
                float rowsum = 0.0f;
                for (int j = 0; j < nvis; j++) {
                    float p = expf(srow[j] - m_new);
                    srow[j] = cast_p(pl.p_fwd, p, opt->p_scale, st);
                    // l sums the P that multiplies V: the quantized P̂ in the FP8 forward (spec §3:
                    // the weights of O sum to one; the GPU gets the sums from the PV matmul), the
                    // unrounded P where P stays wider (bf16, fp32), as our BF16 kernel does
                    rowsum += pl.p_fwd == OPND_FP8 ? srow[j] : p;
                }
                l = l * alpha + rowsum;
                for (int c = 0; c < d; c++) acc[c] *= alpha;
                for (int j = 0; j < nvis; j++) {
                    const float pj = srow[j], *vj = vh + (size_t)(k0 + j) * d;
                    for (int c = 0; c < d; c++) acc[c] += pj * vj[c];
                }
                m = m_new;
            }
            float inv_l = 1.0f / l;
            for (int c = 0; c < d; c++) {
                float oc = acc[c] * inv_l;
                o[(size_t)i * d + c] = pl.o_bf16 ? bf16_round(oc) : oc;
            }
            lse[i] = m + logf(l);
        }
    }
    free(srow); free(acc); free(qh); free(kh); free(vh);
}

// ---------------------------------------------------------------------------------------------
// Backward.

typedef struct {
    int T, d;
    float tau;
    const float *qh, *kh;  // (T, d) Q, K as the S recompute sees them (the forward's operands)
    const float *vh, *doh; // (T, d) V, dO as dP = dO V^T sees them
    const float *lse;      // (T) the forward's LSE
} BwdTileCtx;

// The one recomputation shared by the delta pass and the main pass: for rows [q0, q0+nq) and
// keys [k0, k0+nk), P_ij = exp(tau Q̂_i·K̂_j - LSE_i) (FP32, against the final LSE) and
// dP_ij = dÔ_i · V̂_j (FP32); both 0 where masked (j > i). Row-major tiles with leading dim nk.
// noinline: both passes run the very same machine code, so even under FP contraction
// (-ffp-contract=fast with FMA targets) the delta pass sees bitwise the main pass's P and dP.
__attribute__((noinline)) static void bwd_tile_p_dp(const BwdTileCtx *c, int q0, int nq, int k0,
                                                    int nk, float *P, float *dP) {
    const int d = c->d;
    for (int r = 0; r < nq; r++) {
        int i = q0 + r;
        for (int j = 0; j < nk; j++) {
            int kj = k0 + j;
            if (kj > i) { P[r * nk + j] = 0.0f; dP[r * nk + j] = 0.0f; continue; }
            float s = c->tau * dot(c->qh + (size_t)i * d, c->kh + (size_t)kj * d, d);
            P[r * nk + j] = expf(s - c->lse[i]);
            dP[r * nk + j] = dot(c->doh + (size_t)i * d, c->vh + (size_t)kj * d, d);
        }
    }
}

// Delta-Matching's delta pass: D_i = (sum_j P_ij dP_ij) / (sum_j P_ij) over exactly the P and
// dP that the main pass turns into dS (same tiles, same order, same routine). FP32 sums.
static void delta_pass(const BwdTileCtx *c, int bq, int bk, float *D, float *P, float *dP) {
    float *psum = xmalloc((size_t)bq * sizeof *psum);  // (bq) sum_j P_ij of the query block
    for (int q0 = 0; q0 < c->T; q0 += bq) {
        int nq = min_int(bq, c->T - q0), q_end = q0 + nq;
        for (int r = 0; r < nq; r++) D[q0 + r] = 0.0f;
        for (int r = 0; r < nq; r++) psum[r] = 0.0f;
        for (int k0 = 0; k0 < q_end; k0 += bk) {
            int nk = min_int(bk, c->T - k0);
            bwd_tile_p_dp(c, q0, nq, k0, nk, P, dP);
            for (int r = 0; r < nq; r++)
                for (int j = 0; j < nk; j++) {
                    D[q0 + r] += P[r * nk + j] * dP[r * nk + j];
                    psum[r] += P[r * nk + j];
                }
        }
        for (int r = 0; r < nq; r++) D[q0 + r] /= psum[r];
    }
    free(psum);
}

void attn_cpu_backward(const AttnOptions *opt, AttnDelayedState *ds, int T, int d,
                       const float *q, const float *k, const float *v, const float *o,
                       const float *lse, const float *dout, float *dq, float *dk, float *dv,
                       AttnStats *st, float *row_resid) {
    attn_cpu_backward_centered(opt, ds, T, d, q, k, v, NULL, o, lse, dout, dq, dk, dv, st, row_resid, NULL);
}

void attn_cpu_backward_centered(const AttnOptions *opt, AttnDelayedState *ds, int T, int d,
                                const float *q, const float *k, const float *v, const float *key_center,
                                const float *o, const float *lse, const float *dout, float *dq, float *dk,
                                float *dv, AttnStats *st, float *row_resid, float *row_post_resid) {
    check_options(opt, ds, T, d);
    const ModePlan pl = plan_for(opt->precision);
    const int bq = opt->block_q, bk = opt->block_k;
    const Fp8Format gfmt = opt->grad_format;
    size_t n = (size_t)T * d;

    // Operands. Q, K recompute S exactly as the forward did (same casts, same scales, the same
    // centred keys; their casts were counted by the forward). V too, for dP. The hybrids keep the
    // FP8 values (exact in BF16) and round only dO to BF16.
    float *qh = xmalloc(n * sizeof *qh), *kh = xmalloc(n * sizeof *kh);
    float *vh = xmalloc(n * sizeof *vh), *doh = xmalloc(n * sizeof *doh);
    prepare_operand(opt, ds, pl.fwd_qkv, FP8_E4M3, CAST_Q, T, d, q, qh, NULL, 0);
    prepare_keys(opt, ds, pl.fwd_qkv, T, d, k, key_center, kh, NULL, 0);
    prepare_operand(opt, ds, pl.fwd_qkv, FP8_E4M3, CAST_V, T, d, v, vh, NULL, 0);
    prepare_operand(opt, ds, pl.bwd_do, gfmt, CAST_DO, T, d, dout, doh, st, 1);
    const int correct = attn_precision_is_fp8(opt->precision) && opt->rowsum_correction;

    float *P = xmalloc((size_t)bq * bk * sizeof *P);    // (bq, bk) FP32 P tile
    float *dP = xmalloc((size_t)bq * bk * sizeof *dP);  // (bq, bk) FP32 dP tile, then dS
    float *D = xmalloc((size_t)T * sizeof *D);          // (T)
    double *rs = xcalloc((size_t)T, sizeof *rs);        // (T) sum_j dS_ij   (measurement only)
    double *ra = xcalloc((size_t)T, sizeof *ra);        // (T) sum_j |dS_ij|
    double *rc = xcalloc((size_t)T, sizeof *rc);        // (T) sum_j P_ij (|dP_ij| + |D_i|)
    double *rp = xcalloc((size_t)T, sizeof *rp);        // (T) sum_j cast(dS)_ij  (measurement only)
    // The correction's row sums, in FP32 as a kernel would keep them: r_i = sum_j cast(dS)_ij,
    // sum_j P_ij and sum_j P_ij K̂_j, (T), (T), (T, d).
    float *cr = NULL, *cpsum = NULL, *cpk = NULL;
    if (correct) {
        cr = xcalloc((size_t)T, sizeof *cr);
        cpsum = xcalloc((size_t)T, sizeof *cpsum);
        cpk = xcalloc(n, sizeof *cpk);
    }
    BwdTileCtx c = {T, d, 1.0f / sqrtf((float)d), qh, kh, vh, doh, lse};

    // D.
    if (pl.delta == ATTN_DELTA_MATCHED) {
        delta_pass(&c, bq, bk, D, P, dP);
    } else {
        // stale (rowsum(dO ∘ O) with BF16 dO; FP32 dO in fp32 mode) or approx (dÔ · O).
        for (int i = 0; i < T; i++) {
            float s = 0.0f;
            for (int cc = 0; cc < d; cc++) {
                size_t x = (size_t)i * d + cc;
                float g = pl.delta == ATTN_DELTA_APPROX ? doh[x] : pl.delta_do_bf16 ? bf16_round(dout[x]) : dout[x];
                s += g * o[x];
            }
            D[i] = s;
        }
    }

    memset(dq, 0, n * sizeof *dq);
    memset(dk, 0, n * sizeof *dk);
    memset(dv, 0, n * sizeof *dv);
    for (int q0 = 0; q0 < T; q0 += bq) {
        int nq = min_int(bq, T - q0), q_end = q0 + nq;
        for (int k0 = 0; k0 < q_end; k0 += bk) {
            int nk = min_int(bk, T - k0);
            bwd_tile_p_dp(&c, q0, nq, k0, nk, P, dP);

            // dS = P ∘ (dP − D) in FP32 with the FP32 P of the tile routine. That P (not P̂)
            // enters both dS and the matched D: elementwise work stays in FP32 registers, and
            // only matmul inputs are cast. P̂ (E4M3 vs the final LSE) feeds dV only.
            float ds_amax = 0.0f;
            for (int r = 0; r < nq; r++) {
                int i = q0 + r;
                for (int j = 0; j < nk && k0 + j <= i; j++) {
                    float *x = &dP[r * nk + j];
                    rc[i] += (double)P[r * nk + j] * (fabs((double)*x) + fabs((double)D[i]));
                    *x = P[r * nk + j] * (*x - D[i]);  // dP tile now holds dS
                    rs[i] += *x;
                    ra[i] += fabsf(*x);
                    ds_amax = fmaxf(ds_amax, fabsf(*x));
                }
            }

            // dV += P_cast^T dO_cast.
            for (int r = 0; r < nq; r++) {
                int i = q0 + r;
                const float *doi = doh + (size_t)i * d;
                for (int j = 0; j < nk && k0 + j <= i; j++) {
                    float pc = cast_p(pl.p_dv, P[r * nk + j], opt->p_scale, st);
                    float *dvj = dv + (size_t)(k0 + j) * d;
                    for (int cc = 0; cc < d; cc++) dvj[cc] += pc * doi[cc];
                }
            }

            // dS cast (FP8: grad_format, one power-of-two scale for the tile), then
            // dQ += dS_cast K, dK += dS_cast^T Q (tau applied at the end).
            float s_ds = pl.ds == OPND_FP8 ? fp8_scale_for_amax(gfmt, ds_amax) : 1.0f;
            for (int r = 0; r < nq; r++) {
                int i = q0 + r;
                float *dqi = dq + (size_t)i * d;
                const float *qi = qh + (size_t)i * d;
                for (int j = 0; j < nk && k0 + j <= i; j++) {
                    float x = dP[r * nk + j];
                    if (pl.ds == OPND_BF16) x = bf16_round(x);
                    else if (pl.ds == OPND_FP8) {
                        float xs = x * s_ds;
                        if (st) {
                            st->casts[CAST_DS]++;
                            st->saturated[CAST_DS] += fabsf(xs) > fp8_max(gfmt);
                        }
                        x = fp8_round(gfmt, xs) / s_ds;
                    }
                    rp[i] += x;
                    const float *kj = kh + (size_t)(k0 + j) * d;
                    if (correct) {
                        const float p = P[r * nk + j];
                        cr[i] += x;
                        cpsum[i] += p;
                        for (int cc = 0; cc < d; cc++) cpk[(size_t)i * d + cc] += p * kj[cc];
                    }
                    if (x == 0.0f) continue;
                    float *dkj = dk + (size_t)(k0 + j) * d;
                    for (int cc = 0; cc < d; cc++) dqi[cc] += x * kj[cc];
                    for (int cc = 0; cc < d; cc++) dkj[cc] += x * qi[cc];
                }
            }
        }
    }
    // The rank-one correction: dQ_i -= r_i sum_j P_ij K̂_j / sum_j P_ij, i.e. dQ of the cast dS
    // minus r_i P_ij / sum_j P_ij in each row, whose rows sum to zero.
    if (correct)
        for (int i = 0; i < T; i++) {
            if (!(cpsum[i] > 0.0f)) continue;
            const float f = cr[i] / cpsum[i];
            for (int cc = 0; cc < d; cc++) dq[(size_t)i * d + cc] -= f * cpk[(size_t)i * d + cc];
        }
    for (size_t x = 0; x < n; x++) { dq[x] *= c.tau; dk[x] *= c.tau; }

    // Row-sum invariant, measured on the FP32 dS before its cast, and on the cast dS.
    for (int i = 0; i < T; i++) {
        double r = ra[i] > 0.0 ? fabs(rs[i]) / ra[i] : 0.0;
        if (row_resid) row_resid[i] = (float)r;
        if (st && r > st->resid_max) st->resid_max = r;
        double rr = rc[i] > 0.0 ? fabs(rs[i]) / rc[i] : 0.0;
        if (st && rr > st->resid_cancel_max) st->resid_cancel_max = rr;
        double post = ra[i] > 0.0 ? fabs(rp[i]) / ra[i] : 0.0;
        if (row_post_resid) row_post_resid[i] = (float)post;
        if (st && post > st->post_resid_max) st->post_resid_max = post;
    }
    free(P); free(dP); free(D); free(rs); free(ra); free(rc); free(rp);
    free(cr); free(cpsum); free(cpk);
    free(qh); free(kh); free(vh); free(doh);
}
