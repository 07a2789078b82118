// fast_exp2.cuh: 2^x on the special-function unit, for the exponentials of the softmax-like
// kernels (the attention kernels' P, the cross-entropy's row sums and gradients): ex2.approx.ftz,
// ~2 ulp, results below 2^-126 flush to 0, 2^-inf = 0. And poly_exp2, the same on the FMA pipe.
#ifndef FAST_EXP2_CUH
#define FAST_EXP2_CUH

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

// 2^x on the FMA pipe, for x <= 0 (or -inf): 10 FMA-pipe instructions instead of one SFU one,
// for a kernel whose special-function unit is its bottleneck (FA4's trick on Blackwell). Not the
// FP8 attention forward's: moving some of its exponentials here measures slower (the step
// benchmark's NPOLY, dev/bench/bench_fwd_fp8_loops.cuh); test_attention_fp8_gpu checks it.
// 2^x = 2^floor(x) * 2^f, f = x - floor(x) in [0, 1): floor(x) from adding 1.5 * 2^23 rounding
// down (t's low mantissa bits are floor(x) as a two's complement integer: exact for |x| < 2^22),
// 2^f by a degree-5 polynomial (max relative error ~2e-7, as ex2.approx's ~2 ulp), and 2^floor(x)
// added to its exponent field: bits(t) << 23 is floor(x) << 23 modulo 2^32, since the constant's
// low 9 bits are 0. x below -127 (and -inf) is taken as -127: a denormal < 2^-126 where
// ex2.approx.ftz gives 0 (no softmax sum or E4M3 code can see the difference).
__device__ __forceinline__ float poly_exp2(float x) {
    constexpr float SHIFT = 12582912.0f;  // 1.5 * 2^23
    x = fmaxf(x, -127.0f);
    const float t = __fadd_rd(x, SHIFT);
    const float f = x - (t - SHIFT);  // exact
    float p = fmaf(1.8775767e-3f, f, 8.9893397e-3f);
    p = fmaf(p, f, 5.5826318e-2f);
    p = fmaf(p, f, 2.4015361e-1f);
    p = fmaf(p, f, 6.9315308e-1f);
    p = fmaf(p, f, 1.0f);
    return __int_as_float(__float_as_int(p) + (int)((unsigned)__float_as_int(t) << 23));
}

#endif  // FAST_EXP2_CUH
