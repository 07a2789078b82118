// fast_exp2.cuh: 2^x on the special-function unit, for the exponentials of the softmax-like
// kernels (the attention kernels' P, the cross-entropy's row sums and gradients): ex2.approx.ftz,
// ~2 ulp, results below 2^-126 flush to 0, 2^-inf = 0.
#ifndef FAST_EXP2_CUH
#define FAST_EXP2_CUH

__device__ __forceinline__ float fast_exp2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
    return y;
}

#endif  // FAST_EXP2_CUH
