// test_hooks.h: the one way tests and benchmarks reach past the GPU kernels' automatic choices.
// A launcher picks a kernel's form from the shape (TMA where rows are 16-byte aligned, a grid of
// one CTA per SM, heads grouped to fit L2, ...); a fallback that the trainer takes only on some
// shapes is still tested on every shape by setting a field here. Every field's zero value is the
// trainer's behaviour, and nothing in the training path writes this struct.
#ifndef TEST_HOOKS_H
#define TEST_HOOKS_H

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
    // attention kernels (attention/)
    int fwd_bf16_no_o_tma;     // 1: the BF16 forward stores O from its fragments, not by TMA
    int fwd_fp8_no_o_tma;      // 1: the FP8 forward stores O from its fragments, not by TMA
    int fwd_fp8_max_ctas;      // > 0: the FP8 forward's grid capped at this many CTAs
    int fwd_fp8_static_order;  // 1: the FP8 forward's CTAs walk a fixed order, no tile counter
    int bwd_fp8_group_heads;   // > 0: the FP8 backward's heads per group of its CTA order
    int bwd_fp8_no_tma;        // 1: the FP8 backward loads its query blocks by cp.async, not TMA
    int delta_fp8_no_tma;      // 1: fp8_dm's delta pass loads K and V by cp.async, not TMA (d = 128)
    // GEMMs and layers (gpu/)
    int qkv_gemm_group_rows;   // > 0: the QKV GEMM's units (a cluster's two tiles) walked in groups of
                               // this many unit rows, column by column, instead of row by row
} GpuTestHooks;

extern GpuTestHooks gpu_test_hooks;

#ifdef __cplusplus
}
#endif
#endif  // TEST_HOOKS_H
