// attn_check.h: the attn-check command, the attention precisions against an FP64 reference
// (docs/fp8-attention.md §4), on the CPU emulation (cpu/attention_cpu.h) or the GPU kernels
// (eval/attn_check_gpu.h).
#ifndef ATTN_CHECK_H
#define ATTN_CHECK_H

#ifdef __cplusplus
extern "C" {
#endif

// `train_gpt attn-check [--T N] [--d N] [--seed N] [--grad-format e4m3|e5m2] [--block-q N]
// [--block-k N] [--device cpu|gpu]` (argv[0] = "attn-check"): prints spec §4's table, on the CPU
// emulation or on the GPU kernels (attn_check_gpu.h). Returns the process exit status: 0, 1 (bad
// option or the fp8_dm invariant broken), 2 (--device gpu without a CUDA device).
int cmd_attn_check(int argc, char **argv);

#ifdef __cplusplus
}
#endif
#endif  // ATTN_CHECK_H
