#!/usr/bin/env bash
# The sanitizer job: the engine and the Python extensions under AddressSanitizer +
# UndefinedBehaviorSanitizer, and the engine's concurrency tests under ThreadSanitizer.
#
#   tools/sanitize.sh            # every step: engine, python, tsan
#   tools/sanitize.sh engine     # GoogleTest suite, ASan+UBSan (build/asan), ctest
#   tools/sanitize.sh python     # tileops._C and tileops_native_cpu built with ASan+UBSan
#                                # into throwaway overlays; tests/oplayer (less numerics
#                                # and compile), tests/reliability,
#                                # backends/native_cpu/tests and the model tests of
#                                # tests/integrations/transformers (on native_cpu) run there
#   tools/sanitize.sh tsan       # KernelCacheTest.* under ThreadSanitizer (build/tsan)
#
# Nothing here touches the project's .venv: the sanitized extensions live in their own
# build folders and in throwaway overlays that see the base venv's packages (torch,
# pytest, hypothesis, build tools) but not its tileops install.
#
# Any sanitizer report fails the step (halt_on_error / -fno-sanitize-recover). Leak
# detection is on for the pure C++ engine tests and off for the Python suite: CPython and
# torch keep allocations alive until exit by design, so LeakSanitizer would report those
# on every run and drown anything of ours.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$(pwd)

base=${BASE_VENV:-.venv}
cmake="$root/$base/bin/cmake"
ctest="$root/$base/bin/ctest"
ninja="$root/$base/bin/ninja"
steps=("$@")
[ ${#steps[@]} -eq 0 ] && steps=(engine python tsan)

sanitize_flags="-fsanitize=address,undefined -fno-omit-frame-pointer -fno-sanitize-recover=all"
export UBSAN_OPTIONS="halt_on_error=1:print_stacktrace=1"

timed() {  # timed <label> <command...>: runs it and prints how long it took
  local label=$1 start end
  shift
  start=$(date +%s)
  "$@"
  end=$(date +%s)
  echo "== $label: $((end - start)) s"
}

need_gtest() {
  if [ ! -f /usr/include/gtest/gtest.h ]; then
    echo "GoogleTest is missing: run 'make gtest' (installs Debian's libgtest-dev)" >&2
    exit 2
  fi
}

engine_build() {
  "$cmake" -S . -B build/asan -G Ninja -DCMAKE_MAKE_PROGRAM="$ninja" \
    -DCMAKE_BUILD_TYPE=Debug -DTILEOPS_SANITIZE=ON -DTILEOPS_BUILD_TESTS=ON \
    -DTILEOPS_BUILD_PYTHON=OFF >/dev/null
  "$cmake" --build build/asan
}

engine_test() {
  (cd build/asan && ASAN_OPTIONS="detect_leaks=1:halt_on_error=1" "$ctest" --output-on-failure)
}

step_engine() {
  need_gtest
  timed "engine: ASan+UBSan build" engine_build
  timed "engine: ASan+UBSan ctest" engine_test
}

site_of() { "$1/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

# Two throwaway overlays (tools/overlay_venv.sh), removed when the job ends; the builds
# stay in build/asan-py folders, so a rerun only recompiles what changed:
# - asan: the base venv's packages as a plain path (so the base's editable hook mapping
#   tileops._C to the unsanitized build never runs) and tileops installed from
#   build/asan-py. Like the base venv it holds no backend (the op layer's tests expect
#   none installed).
# - asan-native: asan plus the native_cpu backend, built with the same flags.
asan_venvs=$(mktemp -d "${TMPDIR:-/tmp}/tileops-asan.XXXXXX")
trap 'rm -rf "$asan_venvs"' EXIT
asan_venv=$asan_venvs/asan

# At -O1, ASan's usual level (tileops._C's module keeps the -Os nanobind gives it): the
# native kernels' -O3 template code took most of the job's build time on 2 cores (the
# AVX-512 file alone: 141 s at -O2, 66 s at -O1, with ASan). Line tables (-g1) instead of
# full debug information: reports still name file and line, and that file took 41 s
# against 71 s (the build step: 139 s against 203 s).
asan_opt="-DCMAKE_CXX_FLAGS_RELWITHDEBINFO=-O1 -g1 -DNDEBUG"

# The native kernels' AVX-512 build only where this CPU runs it: elsewhere its tests could
# only compile that file, never run it (121 s of CPU with ASan: about 30 s of the job).
native_isa=""
for flag in avx512f avx512bw avx512vl avx512_bf16; do
  grep -qw "$flag" /proc/cpuinfo 2>/dev/null || native_isa=";-DTNC_AVX512=OFF"
done

asan_venv_make() {
  BASE_VENV="$base" BASE_PLAIN=1 SKBUILD_BUILD_DIR=build/asan-py \
    SKBUILD_CMAKE_BUILD_TYPE=RelWithDebInfo \
    SKBUILD_CMAKE_ARGS="-DTILEOPS_SANITIZE=ON;$asan_opt;-DCMAKE_MAKE_PROGRAM=$ninja" \
    tools/overlay_venv.sh "$asan_venv" .
  BASE_VENV="$asan_venv" SKBUILD_BUILD_DIR=build/asan-py \
    SKBUILD_CMAKE_BUILD_TYPE=RelWithDebInfo \
    SKBUILD_CMAKE_ARGS="-DCMAKE_CXX_FLAGS=$sanitize_flags;$asan_opt;-DTNC_OPT_LEVEL=-O1;-DCMAKE_MODULE_LINKER_FLAGS=-fsanitize=address,undefined;-DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=address,undefined;-DCMAKE_MAKE_PROGRAM=$ninja$native_isa" \
    tools/overlay_venv.sh "$asan_venv-native" backends/native_cpu
}

reports="$root/build/asan-py/reports"

asan_run() {  # asan_run <command...>: with the sanitizer runtime loaded first
  mkdir -p "$reports"
  # libstdc++ is preloaded too: the interpreter does not link it, and ASan can only
  # intercept __cxa_throw when libstdc++ is loaded by the time ASan initialises (else
  # the first C++ exception aborts with "CHECK failed ... real___cxa_throw").
  # Reports go to files as well as stderr: pytest's capture loses a dying process's stderr.
  LD_PRELOAD="$(gcc -print-file-name=libasan.so):$(gcc -print-file-name=libstdc++.so)" \
    ASAN_OPTIONS="detect_leaks=0:halt_on_error=1:log_path=$reports/asan" \
    UBSAN_OPTIONS="$UBSAN_OPTIONS:log_path=$reports/ubsan" "$@"
}

no_reports() {  # fails, showing them, if the sanitizers wrote any report
  if compgen -G "$reports/*" >/dev/null; then
    echo "sanitizer reports:" >&2
    cat "$reports"/* >&2
    return 1
  fi
}

asan_python() {  # asan_python <venv> <workers> <pytest args...>, from the current directory
  local venv=$1 workers=$2 status=0
  shift 2
  rm -rf "$reports" && mkdir -p "$reports"
  asan_run "$venv/bin/python" -m pytest -q -p no:cacheprovider -n "$workers" --dist loadfile "$@" \
    || status=$?
  no_reports
  return $status
}

# One worker, so that the kernels run on every core, as they do for users: their parallel
# paths are what most needs the sanitizers. (Two workers on 2 cores, each kernel on both:
# 178-195 s; one: 138 s; two with a thread each: 113 s, but no kernel would run parallel.)
asan_native_tests() { (cd backends/native_cpu && asan_python "$asan_venv-native" 1 tests); }

# Hugging Face models on the sanitized kernels (tests/integrations/transformers), in the
# same overlay and for the same reason on one worker, less test_opt_in_import.py (what a
# fresh interpreter imports, not memory). Seeing ASAN_OPTIONS, the model tests run on
# native_cpu alone (the only backend there; TILEOPS_REQUIRE_BACKENDS makes its absence a
# failure), their per-architecture tests on the configs that between them reach every
# kernel, and leave torch.compile out (SANITIZED in their _models.py).
asan_integration_tests() {
  TILEOPS_REQUIRE_BACKENDS=1 asan_python "$asan_venv-native" 1 tests/integrations/transformers \
    --ignore=tests/integrations/transformers/test_opt_in_import.py
}

asan_check_build() {
  # Proves the sanitized extensions are the ones loaded (an unsanitized _C would make the
  # whole step meaningless): both call ASan's report functions from the preloaded runtime.
  local sos so
  sos=$(asan_run "$asan_venv-native/bin/python" -c '
import importlib.util
for name in ("tileops._C", "tileops_native_cpu._C"):
    print(importlib.util.find_spec(name).origin)')
  for so in $sos; do
    # (grep reads all of nm's output: with -q, nm could die of SIGPIPE and pipefail
    # would call that a failure)
    if ! nm -D "$so" | grep " U __asan_report" >/dev/null; then
      echo "$so is not built with AddressSanitizer" >&2
      exit 1
    fi
    echo "sanitized: $so"
  done
}

# The op layer's suite less two files that would only repeat, slower, what another run
# covers: test_numerics.py drives the numeric harness through a target whose kernels are
# torch's references, and backends/native_cpu/tests/test_conformance.py drives that same
# harness, through the same tileops._C, into the sanitized kernels below; test_compile.py
# checks TorchDynamo's tracing, not memory (the native suite leaves its torch.compile
# test out here too). The two were 180 of this run's 267 CPU-seconds.
asan_oplayer_tests() {
  asan_python "$asan_venv" auto tests/oplayer tests/reliability \
    --ignore=tests/oplayer/test_numerics.py --ignore=tests/oplayer/test_compile.py
}

step_python() {
  timed "python: ASan+UBSan builds (build/asan-py)" asan_venv_make
  asan_check_build
  timed "python: tests/oplayer + tests/reliability under ASan+UBSan" asan_oplayer_tests
  timed "python: backends/native_cpu/tests under ASan+UBSan" asan_native_tests
  timed "python: tests/integrations/transformers (native_cpu) under ASan+UBSan" asan_integration_tests
}

tsan_build() {
  "$cmake" -S . -B build/tsan -G Ninja -DCMAKE_MAKE_PROGRAM="$ninja" \
    -DCMAKE_BUILD_TYPE=Debug -DTILEOPS_BUILD_TESTS=ON -DTILEOPS_BUILD_PYTHON=OFF \
    "-DCMAKE_CXX_FLAGS=-fsanitize=thread -fno-omit-frame-pointer" \
    "-DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread" >/dev/null
  "$cmake" --build build/tsan
}

tsan_test() {
  # The concurrency tests, repeated so that the interleavings vary. TSan needs a memory
  # layout it knows: where the kernel randomises mmap beyond it, run without ASLR.
  local run=(build/tsan/engine_tests --gtest_filter='KernelCacheTest.*' --gtest_repeat=20)
  export TSAN_OPTIONS="halt_on_error=1:second_deadlock_stack=1"
  if ! "${run[@]}" --gtest_brief=1; then
    echo "retrying without ASLR (setarch -R)" >&2
    setarch "$(uname -m)" -R "${run[@]}" --gtest_brief=1
  fi
}

step_tsan() {
  need_gtest
  timed "tsan: build" tsan_build
  timed "tsan: KernelCacheTest.* x20" tsan_test
}

total_start=$(date +%s)
for step in "${steps[@]}"; do
  case $step in
    engine) step_engine ;;
    python) step_python ;;
    tsan) step_tsan ;;
    *) echo "unknown step '$step': engine, python or tsan" >&2; exit 2 ;;
  esac
done
echo "== sanitize (${steps[*]}): $(( $(date +%s) - total_start )) s, no sanitizer report"
