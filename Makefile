# train_gpt: host code in C11 (gcc), device code in CUDA (nvcc), one binary.
#
#   make              build ./train_gpt (needs the CUDA toolkit, not a GPU)
#   make train        train configs/tiny.json (GPU if there is one, else CPU)
#   make test         build and run every test (GPU tests run only where a GPU is present)
#   make bench        build the CPU benchmarks into build/bench/
#
# GPU checks and benchmarks: bash scripts/gpu.sh check|bench|profile AREA (docs/gpu.md).
#
# Variables you may set:
#   CUDA_HOME=/usr/local/cuda       toolkit location
#   GPU_ARCH="-gencode arch=compute_90a,code=sm_90a"   device code target (Hopper by default)
#   CJSON_PREFIX=dir                cJSON under dir/include and dir/lib instead of the system's
#   MPI=0                           build without MPI even where mpicc exists
#   SETUP=0                         never try to install missing packages

CUDA_HOME ?= /usr/local/cuda
NVCC      ?= $(CUDA_HOME)/bin/nvcc
ifeq ($(origin CC),default)
CC        := gcc
endif
GPU_ARCH  ?= -gencode arch=compute_90a,code=sm_90a
BUILD     := build

# --- prerequisites: one line naming what is missing; on Debian/Ubuntu as root, install it -----
SETUP ?= 1
ifeq ($(filter clean,$(MAKECMDGOALS)),)
PREREQ := $(shell SETUP=$(SETUP) CUDA_HOME=$(CUDA_HOME) CJSON_PREFIX=$(CJSON_PREFIX) sh scripts/check_prereqs.sh >&2; echo $$?)
ifneq ($(PREREQ),0)
$(error prerequisites missing (see the line above))
endif
endif

# --- cJSON -------------------------------------------------------------------------------------
ifneq ($(CJSON_PREFIX),)
CJSON_CFLAGS := -I$(CJSON_PREFIX)/include
CJSON_LIBS   := -L$(CJSON_PREFIX)/lib -Wl,-rpath,$(abspath $(CJSON_PREFIX))/lib -lcjson
else
CJSON_CFLAGS :=
CJSON_LIBS   := -lcjson
endif

# --- MPI (optional) ----------------------------------------------------------------------------
MPI ?= $(if $(shell command -v mpicc 2>/dev/null),1,0)
ifeq ($(MPI),1)
MPI_CFLAGS := $(shell mpicc --showme:compile 2>/dev/null || mpicc -compile_info 2>/dev/null | cut -d' ' -f2-) -DUSE_MPI
MPI_LIBS   := $(shell mpicc --showme:link 2>/dev/null || mpicc -link_info 2>/dev/null | cut -d' ' -f2-)
endif

# --- flags -------------------------------------------------------------------------------------
CFLAGS   ?= -O2 -g
CFLAGS   += -std=c11 -D_GNU_SOURCE -Wall -Wextra -Wno-unused-parameter -fopenmp -I. \
            -I$(CUDA_HOME)/include $(CJSON_CFLAGS) $(MPI_CFLAGS)
NVFLAGS  ?= -O3 -lineinfo
NVFLAGS  += -std=c++17 $(GPU_ARCH) -I. $(CJSON_CFLAGS) -Xcompiler -fopenmp
LDLIBS   := -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lcublasLt -lcudart -lnccl \
            $(CJSON_LIBS) $(MPI_LIBS) -fopenmp -lm -lpthread -ldl

# --- sources -----------------------------------------------------------------------------------
# The design's four files at the root (train_gpt.c holds main), the rest in one folder per concern
# (docs/architecture.md). Everything but train_gpt.c is archived into the library the tests link.
SRC_DIRS := core cpu gpu attention comm tokenizer eval
C_SRCS   := dataloader.c optimizer.c $(wildcard $(SRC_DIRS:%=%/*.c))
CU_SRCS  := attention_fp8.cu $(wildcard $(SRC_DIRS:%=%/*.cu))
OBJS     := $(C_SRCS:%.c=$(BUILD)/obj/%.o) $(CU_SRCS:%.cu=$(BUILD)/obj/%.cu.o)
LIB      := $(BUILD)/libtraingpt.a
HEADERS  := $(wildcard *.h $(SRC_DIRS:%=%/*.h) $(SRC_DIRS:%=%/*.cuh) gpu/ptx/*.cuh)

TEST_C   := $(wildcard test/test_*.c)
TEST_CU  := $(wildcard test/test_*.cu)
TESTS    := $(TEST_C:test/%.c=$(BUILD)/tests/%) $(TEST_CU:test/%.cu=$(BUILD)/tests/%)

.PHONY: all train test tests bench clean print-nvflags print-ldlibs
all: train_gpt

$(BUILD)/obj/%.o: %.c $(HEADERS)
	@mkdir -p $(@D)
	$(CC) $(CFLAGS) -c $< -o $@

$(BUILD)/obj/%.cu.o: %.cu $(HEADERS)
	@mkdir -p $(@D)
	$(NVCC) $(NVFLAGS) -c $< -o $@

$(LIB): $(OBJS)
	rm -f $@ && ar rcs $@ $^

train_gpt: train_gpt.c $(LIB) $(HEADERS)
	$(CC) $(CFLAGS) train_gpt.c $(LIB) $(LDLIBS) -lstdc++ -o $@

$(BUILD)/tests/%: test/%.c $(LIB) $(HEADERS) test/test.h | $(BUILD)/tests
	$(CC) $(CFLAGS) -Itest $< $(LIB) $(LDLIBS) -lstdc++ -o $@

# .cu tests are host programs that use CUDA's own headers (e.g. cuda_fp8.h's host conversions)
# and, when a GPU is present, kernels.
$(BUILD)/tests/%: test/%.cu $(LIB) $(HEADERS) test/test.h | $(BUILD)/tests
	$(NVCC) $(NVFLAGS) -Itest -c $< -o $@.o
	$(CC) $@.o $(LIB) $(LDLIBS) -lstdc++ -o $@ && rm -f $@.o

# CPU benchmarks (the GPU ones are built on a GPU machine by scripts/gpu.sh bench AREA).
BENCH_C  := $(wildcard dev/bench/bench_*.c)
bench: $(BENCH_C:dev/bench/%.c=$(BUILD)/bench/%)
$(BUILD)/bench/%: dev/bench/%.c $(LIB) $(HEADERS) | $(BUILD)/bench
	$(CC) $(CFLAGS) $< $(LIB) $(LDLIBS) -lstdc++ -o $@

# GPU benchmarks that link the library (make build/bench/bench_qkv_gemm, ...; scripts/gpu.sh).
$(BUILD)/bench/%: dev/bench/%.cu $(LIB) $(HEADERS) | $(BUILD)/bench
	$(NVCC) $(NVFLAGS) -c $< -o $@.o
	$(CC) $@.o $(LIB) $(LDLIBS) -lstdc++ -o $@ && rm -f $@.o

# The flags, for scripts that compile kernels outside the library (scripts/gpu.sh).
print-nvflags:
	@echo $(NVFLAGS)
print-ldlibs:
	@echo $(LDLIBS)

$(BUILD)/tests $(BUILD)/bench:
	mkdir -p $@

tests: train_gpt $(TESTS)

test: tests
	sh test/run_tests.sh

train: train_gpt
	./train_gpt --config configs/tiny.json

clean:
	rm -rf $(BUILD) train_gpt
