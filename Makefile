# fsdpd build.  `make` builds everything into build/; `make test` runs the test suite;
# `make test-asan` builds and runs the unit tests under AddressSanitizer + UBSan (build-asan/);
# `make fuzz` builds the libFuzzer targets (build-fuzz/, clang); `make check-fuzz` runs
# each briefly.  CUDA objects are built whenever nvcc is found (CUDA=0 forces CPU-only).

BUILD    ?= build
CC       ?= cc
NVCC     ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
CUDA     ?= $(if $(NVCC),1,0)
CUDA_HOME ?= /usr/local/cuda
SAN      ?= 0

BLAS_CFLAGS := $(shell pkg-config --cflags openblas 2>/dev/null || echo -I/usr/include/x86_64-linux-gnu)
BLAS_LIBS   := $(shell pkg-config --libs openblas 2>/dev/null || echo -lopenblas)
# PMIx (libpmix-dev): fsdpd's rendezvous under `srun --mpi=pmix` (daemon/pmix_join.h).
PMIX_CFLAGS := $(shell pkg-config --cflags pmix 2>/dev/null)
PMIX_LIBS   := $(shell pkg-config --libs pmix 2>/dev/null || echo -lpmix)
# libcurl (libcurl4-openssl-dev): runtime.log_to mlflow's HTTP(S) client (daemon/mlflow_log.h).
CURL_CFLAGS := $(shell pkg-config --cflags libcurl 2>/dev/null)
CURL_LIBS   := $(shell pkg-config --libs libcurl 2>/dev/null || echo -lcurl)

OPT      ?= -O2 -g
CFLAGS   := $(OPT) -std=c11 -D_GNU_SOURCE -Wall -Wextra -Werror -I. $(BLAS_CFLAGS) $(PMIX_CFLAGS) $(CURL_CFLAGS) -MMD -MP
LDLIBS   := -levent -levent_pthreads -ljansson -lpcre2-8 $(BLAS_LIBS) $(PMIX_LIBS) $(CURL_LIBS) -lpthread -lm -ldl
ifeq ($(SAN),1)
CFLAGS   += -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS  += -fsanitize=address,undefined
endif

# CUDA: sm_80 (A100), sm_86 (3090), sm_89 (4090/L40), sm_90 (H100/H200) + PTX for newer.
CUDA_ARCHS := -gencode arch=compute_80,code=sm_80 -gencode arch=compute_86,code=sm_86 \
              -gencode arch=compute_89,code=sm_89 -gencode arch=compute_90,code=sm_90 \
              -gencode arch=compute_90,code=compute_90
NVCCFLAGS  ?= -O3 -g -std=c++17 $(CUDA_ARCHS) -I. -Xcompiler -Wall,-Wextra,-Werror -Werror all-warnings
ifeq ($(CUDA),1)
CFLAGS   += -DFSDP_HAVE_CUDA -I$(CUDA_HOME)/include
LDLIBS   += -L$(CUDA_HOME)/lib64 -Wl,-rpath,$(CUDA_HOME)/lib64 -lnccl -lcublasLt -lcublas -lcudart -lstdc++
CUDA_SRC := $(wildcard kernels/cuda/*.cu)
endif

BASE_SRC    := $(wildcard base/*.c)
PROTO_SRC   := $(wildcard proto/*.c)
KERNELS_SRC := $(wildcard kernels/*.c kernels/cpu/*.c)
MODEL_SRC   := $(wildcard model/*.c)
DATA_SRC    := $(wildcard data/*.c)
WORKER_SRC  := $(filter-out %_main.c,$(wildcard worker/*.c))
DAEMON_SRC  := $(filter-out %_main.c,$(wildcard daemon/*.c))
CTL_SRC     := $(filter-out %_main.c,$(wildcard ctl/*.c))
LIB_SRC     := $(CTL_SRC) $(DAEMON_SRC) $(WORKER_SRC) $(MODEL_SRC) $(DATA_SRC) $(KERNELS_SRC) $(PROTO_SRC) $(BASE_SRC)
LIB_OBJ     := $(LIB_SRC:%.c=$(BUILD)/%.o) $(CUDA_SRC:%.cu=$(BUILD)/%.cu.o)
LIB         := $(BUILD)/libfsdp.a

# A program is built once its main file exists.
PROGRAMS    := $(BUILD)/fsdpctl $(if $(wildcard daemon/fsdpd_main.c),$(BUILD)/fsdpd) \
               $(if $(wildcard worker/worker_main.c),$(BUILD)/fsdp-worker)
TEST_SRC    := $(wildcard tests/unit/test_*.c)
TESTS       := $(TEST_SRC:tests/unit/%.c=$(BUILD)/tests/%)
FUZZ_SRC    := $(wildcard tests/fuzz/fuzz_*.c)
# Test fixtures stored compressed (tests/fixtures/NAME.gz), unpacked into BUILD/fixtures/NAME.
FIXTURES    := $(patsubst tests/fixtures/%.gz,$(BUILD)/fixtures/%,$(shell find tests/fixtures -name '*.gz'))

.PHONY: FORCE all unit-tests fixtures test test-unit test-asan fuzz check-fuzz tiny clean
all: $(PROGRAMS) $(TESTS) fixtures

fixtures: $(FIXTURES)
$(BUILD)/fixtures/%: tests/fixtures/%.gz
	@mkdir -p $(dir $@)
	gzip -dc $< > $@.part && mv $@.part $@

$(BUILD)/%.o: %.c
	@mkdir -p $(dir $@)
	$(CC) $(CFLAGS) -c $< -o $@

# AdamW, which the host optimizer of fsdp.cpu_offload runs on the CPU backend: vectorised
# (IEEE operations in SIMD lanes: the same bits as the scalar loop).
$(BUILD)/kernels/cpu/cpu_loss_optim.o: CFLAGS += -O3 -fno-math-errno

# The Hopper attention uses wgmma and TMA: sm_90a code only (cuda_attention.cu picks it at run
# time on a compute capability 9.0 device), whatever CUDA_ARCHS the command line sets.
$(BUILD)/kernels/cuda/cuda_attention_sm90.cu.o: override CUDA_ARCHS := -gencode arch=compute_90a,code=sm_90a

# fsdpd's version and the CUDA architectures of this build, for run.json (daemon/run_report.c
# alone: nothing else is rebuilt when they change).
comma := ,
FSDP_VERSION := $(shell git describe --always --dirty 2>/dev/null || echo unknown)
FSDP_CUDA_ARCH_LIST := $(if $(filter 1,$(CUDA)),$(sort $(patsubst code=%,%,$(filter code=%,$(subst $(comma), ,$(CUDA_ARCHS))))))
$(BUILD)/daemon/run_report.o: CFLAGS += -DFSDP_VERSION='"$(FSDP_VERSION)"' -DFSDP_CUDA_ARCHS='"$(FSDP_CUDA_ARCH_LIST)"'
# rebuilt when either changes (a stamp rewritten only then)
$(BUILD)/daemon/run_report.o: $(BUILD)/version.stamp
$(BUILD)/version.stamp: FORCE
	@mkdir -p $(BUILD)
	@echo '$(FSDP_VERSION) $(FSDP_CUDA_ARCH_LIST)' | cmp -s - $@ || echo '$(FSDP_VERSION) $(FSDP_CUDA_ARCH_LIST)' > $@
FORCE:

$(BUILD)/%.cu.o: %.cu
	@mkdir -p $(dir $@)
	$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	ar rcs $@ $^

$(BUILD)/fsdpd: $(BUILD)/daemon/fsdpd_main.o $(LIB)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@
$(BUILD)/fsdpctl: $(BUILD)/ctl/fsdpctl_main.o $(LIB)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@
$(BUILD)/fsdp-worker: $(BUILD)/worker/worker_main.o $(LIB)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/tests/%: $(BUILD)/tests/unit/%.o $(BUILD)/tests/unit/fixtures.o $(LIB)
	@mkdir -p $(dir $@)
	$(CC) $(LDFLAGS) $^ $(LDLIBS) -lcmocka -o $@

# Unit tests, then integration scripts, TEST_JOBS of these at a time (2 where there are 2
# cores or more: most scripts wait more than they compute); the last line is
# "N passed, N failed, N skipped".
TEST_JOBS ?= $(shell [ "$$(nproc 2>/dev/null || echo 1)" -ge 2 ] && echo 2 || echo 1)
test: all
	FSDP_TEST_JOBS=$(TEST_JOBS) tests/run.sh $(BUILD) all

test-unit: all
	tests/run.sh $(BUILD) unit

# The unit-test binaries only (the programs are not run under the sanitizers).
unit-tests: $(TESTS) fixtures

test-asan:
	$(MAKE) BUILD=build-asan SAN=1 CUDA=0 OPT="-O1 -g" unit-tests
	ASAN_OPTIONS=detect_leaks=1:abort_on_error=0 UBSAN_OPTIONS=print_stacktrace=1 \
	  tests/run.sh build-asan unit

# libFuzzer targets link the library sources compiled with clang.  The sources are compiled
# once (build-fuzz/obj/, with the fuzzer's coverage instrumentation but not its main:
# fuzzer-no-link) and linked into every target, instead of compiled again for each.
FUZZ_SAN    := address,undefined
FUZZ_CFLAGS := -g -O1 -std=c11 -D_GNU_SOURCE -I. $(BLAS_CFLAGS) -MMD -MP
FUZZ_LIB_SRC := $(PROTO_SRC) $(BASE_SRC) $(DATA_SRC)
FUZZ_LIB_OBJ := $(FUZZ_LIB_SRC:%.c=build-fuzz/obj/%.o)
fuzz: $(FUZZ_SRC:tests/fuzz/%.c=build-fuzz/%)
build-fuzz/obj/%.o: %.c
	@mkdir -p $(dir $@)
	clang $(FUZZ_CFLAGS) -fsanitize=fuzzer-no-link,$(FUZZ_SAN) -c $< -o $@
build-fuzz/%: build-fuzz/obj/tests/fuzz/%.o $(FUZZ_LIB_OBJ)
	clang -fsanitize=fuzzer,$(FUZZ_SAN) $^ -ljansson -lpcre2-8 -lm -o $@

# Each target runs FUZZ_SECONDS; FUZZ_JOBS of them at a time (one a core: libFuzzer runs one
# process per target).
FUZZ_SECONDS ?= 20
FUZZ_JOBS    ?= $(shell nproc 2>/dev/null || echo 1)
check-fuzz: fuzz fixtures
	FUZZ_JOBS=$(FUZZ_JOBS) tests/run_fuzz.sh $(FUZZ_SECONDS) $(FUZZ_SRC:tests/fuzz/%.c=build-fuzz/%)

# The embedded default: a generated arithmetic chat set (scripts/gen_chat_data.py) in the
# Llama 2 chat template, tokenized by fsdpd with the sp32k tokenizer of
# configs/models/tiny-sp32k/ (the first two samples shown first), and the tiny model of that
# vocabulary trained by fsdpd on this machine (its GPUs, one worker each, when it has some;
# else 2 CPU workers); progress on stdout, metrics and the consolidated model in
# runs/tiny-chat/output/.
tiny: all
	@mkdir -p runs/tiny-chat
	python3 scripts/gen_chat_data.py --out runs/tiny-chat/chat.jsonl --n 4000
	$(BUILD)/fsdpctl tokenize --tokenizer configs/models/tiny-sp32k --data runs/tiny-chat/chat.jsonl \
	    --format chat --template llama2 --seq-len 48 --show 2
	$(BUILD)/fsdpd --job configs/jobs/tiny-chat.json --checkpoint.resume=never \
	    --runtime.backend=auto --runtime.workers_per_node=0 --train.micro_batch=1

clean:
	rm -rf build build-asan build-fuzz

# Keep the test objects (they are intermediate files to make).
.SECONDARY:

-include $(shell find $(BUILD) build-fuzz/obj -name '*.d' 2>/dev/null)
