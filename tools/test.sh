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
