// async_copy.cuh: the copy engines of sm_90 for the hand-written kernels: cp.async (16- and
// 4-byte copies into shared memory, zero-filling), the async-proxy fence, mbarriers (arrivals,
// transaction bytes, parity waits), TMA bulk tensor loads, stores and reductions, plain bulk
// stores, and thread block clusters (ranks, the cluster barrier, remote arrivals, multicast).
#ifndef PTX_ASYNC_COPY_CUH
#define PTX_ASYNC_COPY_CUH

#include <stdint.h>  // uint16_t, uint32_t, uint64_t

#include "gpu/ptx/smem.cuh"  // smem_addr

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

// Orders this thread's generic-proxy writes to shared memory (st.shared, cp.async) before later
// async-proxy reads of it (wgmma operands, TMA stores).
__device__ __forceinline__ void fence_proxy_async() {
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
}

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

#endif  // PTX_ASYNC_COPY_CUH
