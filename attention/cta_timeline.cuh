// cta_timeline.cuh: optional per-CTA timestamps, to see where a kernel's time goes between its
// prologue, its loop, its epilogue and the gaps between CTAs on an SM: what a per-kernel time
// and ncu's averages do not show. Compiled in only with -DATTN_TIMELINE (bench/attn_timeline.py
// builds a library that way); otherwise every macro here is empty and the kernels are unchanged.
//
// An instrumented kernel's translation unit declares one record pointer (TL_DECLARE) and a host
// setter (TL_DEFINE_SETTER); one thread per CTA (the "leader", a thread that takes part in every
// phase) writes its CTA's record: the SM it ran on, %globaltimer (ns, one clock for all SMs) at up
// to TL_MARKS points, the SM's clock64 at the first and the last (so the clock rate the kernel ran
// at), and a work count (loop iterations). Records are indexed by the linear CTA
// index; the reader sorts them per SM by start time.
#pragma once

#define TL_MARKS 6

struct CtaTimeline {
    unsigned long long t[TL_MARKS];  // %globaltimer at marks 0..TL_MARKS-1 (0: not reached)
    long long clk[2];                // clock64 at mark 0 and at the end: the SM's clock rate under load
    unsigned smid, work;
};

#ifdef ATTN_TIMELINE
__device__ __forceinline__ unsigned long long tl_now(void) {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;\n" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned tl_smid(void) {
    unsigned s;
    asm volatile("mov.u32 %0, %%smid;\n" : "=r"(s));
    return s;
}
__device__ __forceinline__ unsigned tl_cta(void) {
    return blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
}
#define TL_DECLARE(ptr) static __device__ CtaTimeline *ptr = nullptr
// host: extern "C" int fn(void *records) points ptr at a device array of CtaTimeline (NULL: off)
#define TL_DEFINE_SETTER(fn, ptr)                                                  \
    extern "C" int fn(void *records) {                                             \
        CtaTimeline *p = (CtaTimeline *)records;                                   \
        return cudaMemcpyToSymbol(ptr, &p, sizeof p) == cudaSuccess ? 0 : -1;      \
    }
// record idx (TL_MARK / TL_END: the linear CTA index; a persistent kernel passes its work item)
#define TL_MARK_AT(ptr, leader, idx, i)                                            \
    do {                                                                           \
        if ((leader) && ptr) {                                                     \
            ptr[idx].t[i] = tl_now();                                              \
            if ((i) == 0) ptr[idx].clk[0] = clock64();                             \
        }                                                                          \
    } while (0)
#define TL_END_AT(ptr, leader, idx, i, n_work)                                     \
    do {                                                                           \
        if ((leader) && ptr) {                                                     \
            CtaTimeline *r_ = ptr + (idx);                                         \
            r_->t[i] = tl_now();                                                   \
            r_->clk[1] = clock64();                                                \
            r_->smid = tl_smid();                                                  \
            r_->work = (unsigned)(n_work);                                         \
        }                                                                          \
    } while (0)
#define TL_MARK(ptr, leader, i) TL_MARK_AT(ptr, leader, tl_cta(), i)
#define TL_END(ptr, leader, i, n_work) TL_END_AT(ptr, leader, tl_cta(), i, n_work)
#else
#define TL_DECLARE(ptr)
#define TL_DEFINE_SETTER(fn, ptr)
#define TL_MARK_AT(ptr, leader, idx, i) ((void)0)
#define TL_END_AT(ptr, leader, idx, i, n_work) ((void)0)
#define TL_MARK(ptr, leader, i) ((void)0)
#define TL_END(ptr, leader, i, n_work) ((void)0)
#endif
