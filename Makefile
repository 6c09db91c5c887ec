# One-stop entry points. `make demo` and `make test` each do the whole set-up first.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip -q
# The editable install records which files exist: reinstall when any source file changes.
CSRC   := $(shell find csrc src -type f -not -name "*.pyc") CMakeLists.txt pyproject.toml

.PHONY: setup demo test test-cpp test-py test-native gtest sanitize clean

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

# The demo runs where both backends are pip-installed (an overlay of the base venv).
DEMO_VENV := .venv-demo
BACKEND_SRC := $(shell find backends/example backends/native_cpu -type f -not -path "*/build/*" -not -name "*.pyc")

$(DEMO_VENV)/.installed: $(VENV)/.tileops-installed $(BACKEND_SRC)
	rm -rf $(DEMO_VENV)
	tools/overlay_venv.sh $(DEMO_VENV) backends/example backends/native_cpu
	touch $@

demo: $(DEMO_VENV)/.installed
	$(DEMO_VENV)/bin/python examples/demo.py

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
# every core themselves, and two workers made it slower (44 s against 29 s).
PYTEST := -m pytest -q -n auto --dist loadfile

test-py: setup
	$(PY) $(PYTEST) tests

# The native C++ backend's own suite, where it is the only backend installed (a
# throwaway overlay: tools/overlay_venv.sh --run; its build stays in backends/native_cpu/build).
test-native: setup
	tools/overlay_venv.sh --run backends/native_cpu -- \
	  sh -c 'cd backends/native_cpu && python -m pytest -q tests'

# Everything: C++ unit tests, the Python suite, the native backend's suite, and the
# sanitizer job (about 7 of the whole 16 minutes on 2 cores; see docs/reliability.md).
test: test-cpp test-py test-native sanitize

# Sanitizers: ASan+UBSan on the engine's GoogleTest suite and on the Python suites
# (tileops._C and the native backend rebuilt with them), TSan on the memo's concurrency
# tests. Runs last in `make test`; `make sanitize` runs it alone.
sanitize: setup gtest
	tools/sanitize.sh

clean:
	rm -rf build $(VENV) .venv-*
