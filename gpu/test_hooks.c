// test_hooks.c: the one GpuTestHooks (test_hooks.h), zero: the trainer's choices.
#include "gpu/test_hooks.h"

GpuTestHooks gpu_test_hooks;
