#!/usr/bin/env bash
# Builds mtopt and runs every test suite: cpu and mpi always, cuda where a GPU
# is present (without one the CUDA suites report "skipped"), then the cpu suites
# again under AddressSanitizer and UBSan.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh
jobs=$(nproc)
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1

cmake -S . -B build -DCMAKE_BUILD_TYPE=Release
cmake --build build -j"$jobs"
ctest --test-dir build --output-on-failure -j"$jobs"

cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DMTOPT_SANITIZE=ON \
  -DMTOPT_WITH_CUDA=OFF -DMTOPT_WITH_MPI=OFF -DMTOPT_BUILD_BENCH=OFF -DMTOPT_BUILD_EXAMPLES=OFF
cmake --build build-asan -j"$jobs"
ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
  ctest --test-dir build-asan -L cpu --output-on-failure -j"$jobs"

# ---- ThreadSanitizer: tests/threads.c (contexts on several host threads:
# steps, saves, loads, step info), CPU only, MPI off. libgomp is not built
# with TSan, so its barriers would be reported falsely: the suite's contexts
# use one OpenMP thread (the CPU backend then enters no parallel region) and
# OMP_NUM_THREADS=1 is set besides. The ISA clones are off: their ifunc
# resolvers run before the TSan runtime is initialised and crash under it.
cmake -S . -B build-tsan -DCMAKE_BUILD_TYPE=RelWithDebInfo \
  -DCMAKE_C_FLAGS=-fsanitize=thread -DCMAKE_EXE_LINKER_FLAGS=-fsanitize=thread \
  -DCMAKE_SHARED_LINKER_FLAGS=-fsanitize=thread -DMTOPT_CPU_DISPATCH=OFF \
  -DMTOPT_WITH_CUDA=OFF -DMTOPT_WITH_MPI=OFF -DMTOPT_BUILD_BENCH=OFF -DMTOPT_BUILD_EXAMPLES=OFF
cmake --build build-tsan -j"$jobs" --target test_threads
OMP_NUM_THREADS=1 TSAN_OPTIONS=halt_on_error=1:second_deadlock_stack=1 \
  ctest --test-dir build-tsan -R '^threads$' --output-on-failure

# ---- Loader fuzzing (tests/fuzz). The seed corpus is replayed under ASan/UBSan
# above (ctest fuzz_replay, label cpu). Where clang with libFuzzer is present
# (deps.sh does not install it: LLVM is a large download), fuzz_load fuzzes for
# a minute from the corpus: new inputs go to a scratch corpus, findings
# (crash-*, leak-*, timeout-*) to build-fuzz/findings. clang 14's
# target_clones do not link across files: the ISA clones are off.
if command -v clang >/dev/null 2>&1; then
  CC=clang cmake -S . -B build-fuzz -DCMAKE_BUILD_TYPE=Debug -DMTOPT_SANITIZE=ON \
    -DCMAKE_C_FLAGS=-fsanitize=fuzzer-no-link -DMTOPT_CPU_DISPATCH=OFF \
    -DMTOPT_WITH_CUDA=OFF -DMTOPT_WITH_MPI=OFF -DMTOPT_BUILD_BENCH=OFF -DMTOPT_BUILD_EXAMPLES=OFF
  if grep -q '^MTOPT_HAVE_LIBFUZZER:INTERNAL=1' build-fuzz/CMakeCache.txt; then
    cmake --build build-fuzz -j"$jobs" --target fuzz_load
    rm -rf build-fuzz/corpus build-fuzz/findings
    mkdir -p build-fuzz/corpus build-fuzz/findings
    OMP_NUM_THREADS=1 ASAN_OPTIONS=detect_leaks=1 UBSAN_OPTIONS=halt_on_error=1:print_stacktrace=1 \
      build-fuzz/tests/fuzz_load -max_total_time=60 -timeout=10 -rss_limit_mb=2048 \
      -artifact_prefix=build-fuzz/findings/ build-fuzz/corpus tests/fuzz/corpus
  else
    echo "test.sh: clang has no libFuzzer: the loader is not fuzzed (its corpus was replayed)"
  fi
else
  echo "test.sh: no clang: the loader is not fuzzed (its corpus was replayed)"
fi

# ---- Python package (python/, docs/python.md): pip builds the C library
# through scikit-build-core and the top-level CMakeLists.txt into a wheel and
# installs it into a virtual environment under the build tree, then the
# numpy tests run against the installed copy (torch tests skip: no torch
# here). The build dependencies are installed first so that pip builds
# without an isolated environment of its own (one download fewer), in
# parallel. pytest's exit code 5 (no tests collected) fails like a failure;
# no cache is written into the work tree.
rm -rf build-py
python3 -m venv build-py/venv
export PIP_DISABLE_PIP_VERSION_CHECK=1
build-py/venv/bin/pip install -q scikit-build-core numpy pytest
CMAKE_BUILD_PARALLEL_LEVEL="$jobs" build-py/venv/bin/pip install -q --no-build-isolation ./python
build-py/venv/bin/python -m pytest python/tests -q -p no:cacheprovider
