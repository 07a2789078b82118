// qkv_gemm_overlap.cuh: the quantizing epilogue, run under the next tile's mainloop (a part of
// qkv_gemm.cu, included there after QgArgs, qg_block, rope_row_to_smem, rope_smem_pairs,
// store_codes_chunk, wide_block_scale and stage_code_pair; not a header of its own).
//
// Why: the epilogue is ~1240 instructions a warp per tile, latency-bound with two consumer warps
// per scheduler, and both consumers run it at once; run between two mainloops it kept the tensor
// pipe idle for ~20% of the consumers' time (Nsight Compute on one H200, 2026-12-02: 80% active
// against cuBLASLt's 93%). Cut into slices under the next tile's matmuls it runs with the tensor
// cores busy (84% active: docs/perf.md, "QKV projection GEMM with the FP8 epilogue").
//
// How: once a tile's last K block is waited for, its sums are rounded to BF16 and packed two to a
// register (p: 64 registers; the 128 accumulators are then free for the next tile's wgmmas). The
// rest is cut into slices, one run per K block of the next tile between its wgmma issue and wait,
// and after the loop where the next mainloop has fewer K blocks than slices (and for the CTA's
// last tile):
//   0      first the tile's position and addresses (unit_pos, locate: integer divisions, run under
//          the first K block's matmuls rather than between two mainloops, where they would hold
//          the next wgmma issue); q, k: the (cos, sin) of the thread's row rr = 0 by cp.async
//          into its consumer's staged block (free until slice 5; a consumer barrier first, the
//          previous tile's stores read it)
//   1, 2   q, k: RoPE on row 0's pairs j = 0..3, 4..7 for both heads; after 2, row 1's (cos, sin)
//          into the same slots (a barrier first); v: the amax of rows 0, 1
//   3, 4   q, k: RoPE on row 1's pairs. The amax is kept packed, of the rounded values, one
//          HMNMX2 per pair (amax2_xorsign, fp8_cvt.cuh)
//   5      the amax over the block (warp shuffles, 16 warp maxima across both consumers, barrier),
//          the scales, head 0's codes staged
//   6      head 1's codes staged; barrier (the staged blocks complete)
//   7..22  the global stores of this consumer's staged block (store_codes_chunk pieces 0..15)
// The codes are bit for bit what attn_gpu_quantize makes of the GEMM's BF16 output
// (test_qkv_gemm_gpu).
// Registers: 128 accumulators + 64 packed values + the tile's addresses, within the consumers'
// 232 (ptxas: 8 bytes of spills, outside the mainloop); the (cos, sin) table goes through shared
// memory because 16 more registers for it made ptxas spill and serialize the wgmmas (C7518).
#ifndef QKV_GEMM_OVERLAP_CUH
#define QKV_GEMM_OVERLAP_CUH

#define QG_OVL_SLICES (7 + QG_CHUNKS)  // the slices of one tile's overlapped epilogue

struct OverlapEpi {
    uint32_t p[2][32];  // head h, pair (j, rr): p[h][2 j + rr] = BF16 columns 8 j + 2 t4 (low), + 1 (high) of row rr
    uint32_t mx[2];     // head h's amax so far (slices 1-4: a BF16 pair whose larger magnitude it is), then
                        // its scale's bits (slice 5 on)
    int unit = -1;      // the pending tile's unit (qkv_gemm.cu's unit_pos); < 0: none pending
    int which = 0;      // its operand (0 q, 1 k, 2 v), + 4 when RoPE applies
    int tr = 0;         // the thread's row rr = 0, as a position in its sequence
    uint8_t *codes = nullptr, *codes_t = nullptr;  // this consumer's block of it (head head0 + cw)
    float *scale = nullptr;                         // and that block's scale

    // The tile's sums (mainloop done) rounded to BF16 and packed; the tile becomes pending.
    __device__ __forceinline__ void pack(const float (&acc)[2][64], int unit_) {
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int i = 0; i < 32; i++) {
                const __nv_bfloat162 v = __floats2bfloat162_rn(acc[h][2 * i], acc[h][2 * i + 1]);
                p[h][i] = *reinterpret_cast<const uint32_t *>(&v);
            }
        mx[0] = mx[1] = 0u;
        unit = unit_;
    }
    // The pending tile's addresses, once, before its slice 0 (under the next tile's first matmuls,
    // not between the two mainloops, where the tensor cores wait): from its first token row mt (M
    // index) and column n0 (N index). Integer divisions by runtime sizes cost ~20 instructions
    // each: computed here once a tile, not in every slice.
    __device__ __forceinline__ void locate(const QgArgs &a, int mt, int n0, int cw, int wtid) {
        const QgBlock blk = qg_block(a, mt, n0, cw);
        which = blk.which + (blk.which < 2 && a.rope ? 4 : 0);
        tr = blk.t0 + 64 * cw + 16 * (wtid >> 5) + ((wtid & 31) >> 2);
        codes = blk.codes;
        codes_t = blk.codes_t;
        scale = blk.scale;
    }

    // Slice s (0 .. QG_OVL_SLICES - 1) of the pending tile's epilogue, consumer cw (rows 64 cw .. of
    // the tile), thread wtid of its 128. stg: both staged blocks; red: 16 floats. Slice 0 after locate.
    __device__ __forceinline__ void slice(int s, const QgArgs &a, int cw, int wtid, uint8_t *stg, float *red) {
        const int t4 = wtid & 3;
        const bool rot = which >= 4;
        // every index into p must be a constant (else p goes to local memory): one case per slice
        switch (s) {
        case 0:
            if (rot) {  // the previous tile's stores have read this consumer's block: (cos, sin) of row 0 into it
                wg_bar_sync<1>(cw);
                rope_row_to_smem(stg + cw * QG_STAGING_BYTES, a.rope, tr, t4, wtid);
            }
            break;
        case 1:
            if (rot) rotate_landed(stg + cw * QG_STAGING_BYTES, wtid, 0); else {
                amax_rows(0);
            }
            break;
        case 2:
            if (rot) {  // row 0's pairs 4..7, then row 1's (cos, sin) into the same slots once all are read
                rotate(stg + cw * QG_STAGING_BYTES, wtid, 0, 4);
                wg_bar_sync<1>(cw);
                rope_row_to_smem(stg + cw * QG_STAGING_BYTES, a.rope, tr + 8, t4, wtid);
            } else {
                amax_rows(1);
            }
            break;
        case 3:
            if (rot) rotate_landed(stg + cw * QG_STAGING_BYTES, wtid, 1);
            break;
        case 4:
            if (rot) rotate(stg + cw * QG_STAGING_BYTES, wtid, 1, 4);
            break;
        case 5:
            block_scales(a, which & 3, cw, wtid, red);
            stage(0, cw, wtid, stg);
            break;
        case 6:
            stage(1, cw, wtid, stg);
            named_bar_sync<5, 256>();  // both staged blocks complete: the stores may read them
            break;
        default:
            store_codes_chunk(stg + cw * QG_STAGING_BYTES, codes, codes_t, a.T, s - 7, wtid);
        }
    }

  private:
    __device__ __forceinline__ static float lo_of(uint32_t u) { return __uint_as_float(u << 16); }
    __device__ __forceinline__ static float hi_of(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }

    // RoPE on pairs j = jb .. jb + 3 of row rr, both heads (column i < 64 with i + 64: j with j + 8),
    // rope_forward_gpu's arithmetic, rounded to BF16; the rounded values' magnitudes into mx.
    __device__ __forceinline__ void rotate(const uint8_t *own, int wtid, int rr, int jb) {
#pragma unroll
        for (int jj = 0; jj < 4; jj++) {
            const float4 cs = rope_smem_pairs(own, jb + jj, wtid);
#pragma unroll
            for (int h = 0; h < 2; h++) {
                const int j = jb + jj;
                const uint32_t px = p[h][2 * j + rr], py = p[h][2 * (j + 8) + rr];
                const float x[2] = {lo_of(px), hi_of(px)}, y[2] = {lo_of(py), hi_of(py)};
                const float c[2] = {cs.x, cs.z}, sn[2] = {cs.y, cs.w};
                float lo[2], hi[2];
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    lo[e] = lm_rope_lo(x[e], y[e], c[e], sn[e]);
                    hi[e] = lm_rope_hi(x[e], y[e], c[e], sn[e]);
                }
                const __nv_bfloat162 vl = __floats2bfloat162_rn(lo[0], lo[1]), vh = __floats2bfloat162_rn(hi[0], hi[1]);
                p[h][2 * j + rr] = *reinterpret_cast<const uint32_t *>(&vl);
                p[h][2 * (j + 8) + rr] = *reinterpret_cast<const uint32_t *>(&vh);
                mx[h] = amax2_xorsign(amax2_xorsign(mx[h], p[h][2 * j + rr]), p[h][2 * (j + 8) + rr]);
            }
        }
    }
    // The first half of row rr's pairs once this thread's copies of its (cos, sin) have landed.
    __device__ __forceinline__ void rotate_landed(const uint8_t *own, int wtid, int rr) {
        cp_async_wait_all();
        asm volatile("" ::: "memory");  // no read of the copies above the wait
        rotate(own, wtid, rr, 0);
    }
    // v (no RoPE): the amax of row rr's values, both heads
    __device__ __forceinline__ void amax_rows(int rr) {
#pragma unroll
        for (int h = 0; h < 2; h++)
#pragma unroll
            for (int j = 0; j < 16; j++)
                mx[h] = amax2_xorsign(mx[h], p[h][2 * j + rr]);
    }
    // The block amax of each head (rows of both consumers) -> its scale, in mx; head cw's scale stored.
    __device__ __forceinline__ void block_scales(const QgArgs &a, int which, int cw, int wtid, float *red) {
        const int warp = wtid >> 5, lane = wtid & 31;
        float m[2];
#pragma unroll
        for (int h = 0; h < 2; h++) {
            m[h] = fmaxf(fabsf(lo_of(mx[h])), fabsf(hi_of(mx[h])));  // (amax2_xorsign: signs not kept)
#pragma unroll
            for (int o = 16; o > 0; o >>= 1) m[h] = fmaxf(m[h], __shfl_xor_sync(0xffffffffu, m[h], o));
        }
        if (lane == 0) red[4 * cw + warp] = m[0], red[8 + 4 * cw + warp] = m[1];
        // both consumers' maxima; also: every thread is done reading the staged blocks for the
        // previous tile's stores (all its pieces ran before this tile was packed)
        named_bar_sync<5, 256>();
#pragma unroll
        for (int h = 0; h < 2; h++) mx[h] = __float_as_uint(wide_block_scale(red, h, a.max_exp[which]));
        if (wtid == 0) *scale = __uint_as_float(cw ? mx[1] : mx[0]);
    }
    // Head h's codes (scale bits mx[h]) into staged block h, rows 64 cw + 16 warp + g + 8 rr: two codes
    // (columns 8 j + 2 t4, + 1) per 2-byte store (stage_code_pair).
    __device__ __forceinline__ void stage(int h, int cw, int wtid, uint8_t *stg) {
        const int warp = wtid >> 5, lane = wtid & 31, g = lane >> 2, t4 = lane & 3;
        const uint32_t sbase = smem_addr(stg + h * QG_STAGING_BYTES);
        const float sc = __uint_as_float(mx[h]);
#pragma unroll
        for (int rr = 0; rr < 2; rr++) {
            const int r = 64 * cw + 16 * warp + g + 8 * rr;
#pragma unroll
            for (int j = 0; j < 16; j++) {
                const uint32_t v = p[h][2 * j + rr];
                stage_code_pair(sbase, r, j, t4, cvt_e4m3x2(lo_of(v) * sc, hi_of(v) * sc));
            }
        }
    }
};

#endif  // QKV_GEMM_OVERLAP_CUH
