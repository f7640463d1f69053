#!/usr/bin/env bash
# One command on a GPU host, from a clean tree: build with CUDA, run the cuda
# and cpu test suites, the step benchmark and the PyTorch baselines, make the
# comparison table and plot, then run the CUDA suite under compute-sanitizer.
#
#   tools/gpu_run.sh [OUT]          (OUT defaults to ./gpu-out)
#
# OUT ends up with at most 9 files:
#   gpu.log           everything, in order
#   summary.txt       one line per step: status, exit code, seconds
#   mtopt_bench.json  mtopt_bench --backend cuda, all nine shapes
#   torch_bench.json  bench/torch_bench.py on the same shapes
#   bench_table.md    bench/compare.py's table (docs/benchmarks.md, the latest GPU run)
#   bench_gpu.png     bench/compare.py's plot
#   bench_dtypes.md   bench/plot_dtypes.py's table (the same section)
#   bench_gpu_dtypes.png  its plot (where matplotlib is installed)
#   logs.tar.gz       one log per step, the CSVs, the CMake/ctest logs
#
# Check: where the host lacks it, put the .debs in .deps/ (on a Debian-like
# machine: mkdir -p .deps && cd .deps && apt-get download check libsubunit-dev
# libsubunit0); .deps/ is git-ignored, so carry it to the GPU host explicitly.
# They are unpacked into .deps/prefix and pkg-config is pointed at them.
# The MNIST tests need the data set: where the host lacks
# /usr/share/datasets/fashion-mnist, copy it to .data/fashion-mnist (also
# git-ignored) and carry that too, or ctest_cuda fails on mnist_dist_cuda.
#
# Steps run in priority order and the script keeps going after a failure; it
# exits non-zero if any step failed. The whole run stays within
# GPU_RUN_BUDGET seconds (default 560): each step's time limit is cut to what
# is left, and steps with under 15 s left are skipped (and count as failed).
# The sanitizers come last; if the budget cut them, run them alone on the warm
# machine (build-gpu is kept): GPU_RUN_ONLY=memcheck,racecheck tools/gpu_run.sh OUT
# Environment:
#   GPU_RUN_BUDGET=560          total seconds
#   GPU_RUN_SKIP="a,b"          steps to skip, GPU_RUN_ONLY="a,b" steps to run
#                               (deps configure build ctest_cuda ctest_mpi
#                               pytest_torch shapes_agree mtopt_bench torch_bench
#                               mtopt_bench_optimizers mtopt_bench_dtypes
#                               plot_dtypes torch_bench_dtypes compare mnist_gpu
#                               dist_bench ctest_cpu cpu_vs_torch multi_dist_test
#                               multi_dist_bench multi_nccl_ref multi_mnist
#                               ncu_small ncu_large ncu_mixed memcheck memcheck_segments
#                               racecheck)
#   GPU_RUN_BUILD_DIR=build-gpu the build directory, under the repository
#   MTOPT_GIT_COMMIT=<sha>      recorded in the JSON when git is unavailable
#   BENCH_ARGS / TORCH_ARGS     extra arguments for the two benchmarks
set -u -o pipefail

cd "$(dirname "$0")/.."
ROOT=$PWD

# Internal: the configure step, run by step() below under a time limit.
if [ "${1:-}" = "--configure" ]; then
  common=(-S "$ROOT" -B "$2" -DCMAKE_BUILD_TYPE=Release -DMTOPT_WITH_CUDA=ON
          -DCMAKE_CUDA_ARCHITECTURES=90 -DMTOPT_GIT_COMMIT="${MTOPT_GIT_COMMIT:-}")
  command -v nvcc >/dev/null && common+=(-DCMAKE_CUDA_COMPILER="$(command -v nvcc)")
  cmake "${common[@]}" && exit 0
  # A host without the example's or MPI's dependencies still builds the rest.
  echo "configure failed; again without the examples and MPI"
  rm -f "$2/CMakeCache.txt"
  exec cmake "${common[@]}" -DMTOPT_BUILD_EXAMPLES=OFF -DMTOPT_WITH_MPI=OFF
fi
OUT_ARG=${1:-./gpu-out}
mkdir -p "$OUT_ARG"
OUT=$(cd "$OUT_ARG" && pwd)
LOGS=$OUT/logs
mkdir -p "$LOGS"
: >"$OUT/gpu.log"
exec > >(tee -a "$OUT/gpu.log") 2>&1

BUDGET=${GPU_RUN_BUDGET:-560}
T_START=$SECONDS
BUILD=$ROOT/${GPU_RUN_BUILD_DIR:-build-gpu}
JOBS=$(nproc 2>/dev/null || echo 8)
SUMMARY=()
FAILED=0

export PATH="$PATH:/usr/local/cuda/bin"
if [ -z "${MTOPT_GIT_COMMIT:-}" ]; then
  MTOPT_GIT_COMMIT=$(git -C "$ROOT" rev-parse HEAD 2>/dev/null || true)
fi
export MTOPT_GIT_COMMIT

want() { # want STEP: whether GPU_RUN_ONLY / GPU_RUN_SKIP let it run
  local s=",$1,"
  if [ -n "${GPU_RUN_ONLY:-}" ] && [[ ",${GPU_RUN_ONLY}," != *"$s"* ]]; then return 1; fi
  if [ -n "${GPU_RUN_SKIP:-}" ] && [[ ",${GPU_RUN_SKIP}," == *"$s"* ]]; then return 1; fi
  return 0
}

record() { # record NAME STATUS RC SECONDS
  SUMMARY+=("$(printf '%-12s %-8s rc=%-4s %5ss' "$1" "$2" "$3" "$4")")
  [ "$2" = ok ] || [ "$2" = skipped ] || FAILED=1
}

# step NAME LIMIT_S CMD...: runs CMD with its output in gpu.log and
# logs/NAME.log, under the smaller of LIMIT_S and the time left.
step() {
  local name=$1 limit=$2
  shift 2
  if ! want "$name"; then
    record "$name" skipped - 0
    return 0
  fi
  local left=$((BUDGET - (SECONDS - T_START)))
  if [ "$left" -lt 15 ]; then
    echo "=== [$name] not run: $left s left of the ${BUDGET} s budget"
    record "$name" no-time - 0
    return 1
  fi
  [ "$limit" -gt "$left" ] && limit=$left
  echo
  echo "=== [$name] $(date -u +%H:%M:%S) limit ${limit}s: $*"
  local t0=$SECONDS rc
  timeout --kill-after=10 "$limit" "$@" 2>&1 | tee "$LOGS/$name.log"
  rc=${PIPESTATUS[0]}
  local dt=$((SECONDS - t0)) status=ok
  if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
    status=timeout
  elif [ "$rc" -ne 0 ]; then
    status=FAILED
  fi
  echo "=== [$name] $status (rc $rc, ${dt}s)"
  record "$name" "$status" "$rc" "$dt"
  return "$rc"
}

# ---- Check from .deps/*.deb, where the host has none ----
deps() {
  if pkg-config --exists check 2>/dev/null && [ -z "${GPU_RUN_FORCE_DEPS:-}" ]; then
    echo "Check: the system's ($(pkg-config --modversion check))"
    return 0
  fi
  shopt -s nullglob
  local debs=("$ROOT"/.deps/*.deb)
  shopt -u nullglob
  if [ ${#debs[@]} -eq 0 ]; then
    echo "Check: not installed and no .deps/*.deb to unpack"
    return 1
  fi
  local prefix=$ROOT/.deps/prefix
  rm -rf "$prefix"
  mkdir -p "$prefix"
  for f in "${debs[@]}"; do
    echo "unpacking $(basename "$f")"
    dpkg -x "$f" "$prefix" || return 1
  done
  # The .pc files say prefix=/usr: point them at the unpacked tree.
  sed -i "s|^prefix=.*|prefix=$prefix/usr|" "$prefix"/usr/lib/*/pkgconfig/*.pc
}
if want deps; then
  # Not through step(): the exports must reach this shell.
  echo "=== [deps] $(date -u +%H:%M:%S)"
  t0=$SECONDS
  deps 2>&1 | tee "$LOGS/deps.log"
  rc=${PIPESTATUS[0]}
  if [ -d "$ROOT/.deps/prefix/usr/lib" ]; then
    for d in "$ROOT"/.deps/prefix/usr/lib/*/pkgconfig; do
      export PKG_CONFIG_PATH="$d${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
      # The tests link libsubunit.so from there.
      export LD_LIBRARY_PATH="$(dirname "$d")${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    done
    echo "PKG_CONFIG_PATH=$PKG_CONFIG_PATH"
  fi
  if [ "$rc" -eq 0 ]; then
    echo "Check $(pkg-config --modversion check) from $(pkg-config --variable=prefix check)" ||
      rc=1
  fi
  record deps "$([ "$rc" -eq 0 ] && echo ok || echo FAILED)" "$rc" $((SECONDS - t0))
else
  record deps skipped - 0
fi

echo "=== host: $(hostname)  $(date -u +%Y-%m-%dT%H:%M:%SZ)  commit ${MTOPT_GIT_COMMIT:-unknown}"
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm,clocks.max.mem \
  --format=csv 2>&1 | head -5 || true
command -v nvcc >/dev/null && nvcc --version | tail -2

# The example's data set: the system's, or a copy carried in .data/ (hosts
# without the dataset-fashion-mnist package); the tests read MNIST_DATA.
if [ -z "${MNIST_DATA:-}" ]; then
  MNIST_DATA=/usr/share/datasets/fashion-mnist
  [ -d "$MNIST_DATA" ] || MNIST_DATA=$ROOT/.data/fashion-mnist
fi
export MNIST_DATA

# ---- configure and build ----
step configure 120 bash "$ROOT/tools/gpu_run.sh" --configure "$BUILD"
step build 300 cmake --build "$BUILD" -j"$JOBS"

# ---- tests ----
step ctest_cuda 200 ctest --test-dir "$BUILD" -L cuda --output-on-failure
# NCCL at one rank: NVLink multicast stays off on these hosts.
export NCCL_NVLS_ENABLE=0
step ctest_mpi 200 ctest --test-dir "$BUILD" -L mpi --output-on-failure

# The Python package's torch tests on CUDA and CPU tensors, against this
# build's library (PyTorch is on the GPU host; CI has no torch and skips them).
export MTOPT_LIBRARY=$BUILD/libmtopt.so
step pytest_torch 200 env PYTHONPATH="$ROOT/python" python3 -m pytest -q -p no:cacheprovider \
  "$ROOT/python/tests/test_torch_cuda.py" "$ROOT/python/tests/test_torch_cpu.py"

# ---- benchmarks ----
# Every row's floor is a copy of its own bytes in the same run (the copy
# rows, one per B/param); docs/benchmarks.md defines it. The shape lists:
# all built-in ones, and the large models' for the per-optimizer runs.
SHAPES_ALL=gpt2,gpt2-xl,llama-1.1b,bert-large,vit-h-14,switch-base-8,many-4096,many-mixed,tiny-50k
SHAPES_LARGE=gpt2-xl,llama-1.1b,bert-large,vit-h-14,switch-base-8
# mtopt_bench (shapes.c) and torch_bench.py (shapes.py) must time the same lists.
step shapes_agree 60 python3 "$ROOT/bench/shapes.py" --check "$BUILD/bench/mtopt_bench"
# shellcheck disable=SC2086
step mtopt_bench 360 "$BUILD/bench/mtopt_bench" --backend cuda \
  --shapes "$SHAPES_ALL" --iters 20 --warmup 5 --loop-iters 3 \
  --json "$OUT/mtopt_bench.json" --csv "$LOGS/mtopt_bench.csv" ${BENCH_ARGS:-}
# shellcheck disable=SC2086
step torch_bench 400 python3 "$ROOT/bench/torch_bench.py" --shapes "$SHAPES_ALL" --iters 20 \
  --warmup 5 --loop-iters 3 --json "$OUT/torch_bench.json" --csv "$LOGS/torch_bench.csv" \
  ${TORCH_ARGS:-}
# Adam, SGD (momentum) and LAMB on the large models: the fused step, its graph
# replay and the copy of each one's bytes (20, 28, 40 B/param); JSON in logs.
step mtopt_bench_optimizers 240 bash -c "for k in adam sgd lamb; do \"$BUILD/bench/mtopt_bench\" \
  --backend cuda --shapes $SHAPES_LARGE --modes fused,graph,copy --iters 20 --warmup 5 \
  --optimizer \$k --json \"$LOGS/mtopt_bench_\$k.json\" || exit 1; done"
# Mixed precision: every --dtype configuration on two large shapes (the fused
# step, its graph replay and the copy of the same bytes), and PyTorch's
# bf16 counterparts; the JSON files go into logs.tar.gz.
# bf16-master also times the reference AdamW kernel in its layout (ref_adamw.h).
step mtopt_bench_dtypes 240 bash -c "for d in \$(\"$BUILD/bench/mtopt_bench\" --list-dtypes | \
  grep -vx f32); do m=fused,graph,copy; \
  [ \$d = bf16-master ] && m=\$m,ref-adamw; \"$BUILD/bench/mtopt_bench\" --backend cuda \
  --shapes gpt2-xl,llama-1.1b --modes \$m --iters 20 --warmup 5 --dtype \$d \
  --json \"$LOGS/mtopt_bench_\$d.json\" || exit 1; done"
PLOT_PNG=()
python3 -c "import matplotlib" 2>/dev/null && PLOT_PNG=(--png "$OUT/bench_gpu_dtypes.png")
step plot_dtypes 60 python3 "$ROOT/bench/plot_dtypes.py" "$LOGS"/mtopt_bench_*-*.json \
  --md "$OUT/bench_dtypes.md" "${PLOT_PNG[@]}"
step torch_bench_dtypes 180 python3 "$ROOT/bench/torch_bench.py" --shapes gpt2-xl,llama-1.1b \
  --modes bf16-fused,bf16-fused-graph,master-recipe,master-recipe-graph --iters 20 --warmup 5 \
  --json "$LOGS/torch_bench_dtypes.json"
step compare 60 python3 "$ROOT/bench/compare.py" --mtopt "$OUT/mtopt_bench.json" \
  --torch "$OUT/torch_bench.json" --md "$OUT/bench_table.md" --png "$OUT/bench_gpu.png" \
  --title "mtopt vs PyTorch, fp32 AdamW step, $(nvidia-smi --query-gpu=name --format=csv,noheader 2>/dev/null | head -1)"

# ---- the example and the distributed benchmark on the GPU ----
MNIST=$BUILD/examples/mnist_mlp/mnist_mlp
step mnist_gpu 150 bash -c "set -e; for a in '' '--graph' '--dynamic-loss-scale --clip 1' \
  '--optimizer lamb'; do echo \"--- mnist_mlp --gpu \$a\"; $MNIST --gpu --data $MNIST_DATA \$a \
  --csv /dev/null | tail -7; done"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
step dist_bench 180 bash -c "for d in f32 bf16; do for z in 0 1; do mpirun -np 1 \
  $BUILD/bench/mtopt_dist_bench --backend cuda --shape gpt2-xl --buckets 25,100 --iters 10 \
  --warmup 2 --dtype \$d --zero \$z || exit 1; done; done"
step ctest_cpu 150 ctest --test-dir "$BUILD" -L cpu --output-on-failure -j"$JOBS"

# ---- the CPU backend against PyTorch's CPU fused AdamW, on this host's CPU ----
# At 8 and 16 threads: mtopt_bench --backend cpu (the fused step, the copy
# floor) and torch_bench.py --cpu (AdamW fused and foreach, torch's copy) on
# GPT-2 124M and tiny-50k, one after the other; JSON and compare.py's table
# per thread count in logs (cpu_*_t8.json, cpu_vs_torch_t8.md, ...).
step cpu_vs_torch 240 bash -c "for t in 8 16; do \
  \"$BUILD/bench/mtopt_bench\" --backend cpu --threads \$t --shapes gpt2,tiny-50k \
  --modes fused,copy --iters 10 --warmup 2 --repeat 2 --json \"$LOGS/cpu_mtopt_t\$t.json\" \
  || exit 1; python3 \"$ROOT/bench/torch_bench.py\" --cpu --threads \$t --shapes gpt2,tiny-50k \
  --modes fused,foreach --iters 10 --warmup 2 --repeat 2 --json \"$LOGS/cpu_torch_t\$t.json\" \
  || exit 1; python3 \"$ROOT/bench/compare.py\" --mtopt \"$LOGS/cpu_mtopt_t\$t.json\" \
  --torch \"$LOGS/cpu_torch_t\$t.json\" --md \"$LOGS/cpu_vs_torch_t\$t.md\" \
  --title \"mtopt vs PyTorch, fp32 AdamW on the CPU, \$t threads\" && \
  cat \"$LOGS/cpu_vs_torch_t\$t.md\" || exit 1; done"

# ---- several GPUs: data parallel across them (issue: multi-GPU verification) ----
NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
if [ "${NGPU:-0}" -ge 2 ]; then
  MPI2=(mpirun -np 2 --oversubscribe -x NCCL_NVLS_ENABLE=0 -x OMP_NUM_THREADS=1)
  # The distributed suites on NCCL at 2 ranks: fp32, mixed precision (bf16/f16,
  # masters, remainders, ZeRO-1, sharded checkpoints) and reduce_f32.
  step multi_dist_test 300 bash -c "for t in dist dist_mixed dist_reduce; do \
    ${MPI2[*]} $BUILD/tests/test_\$t --backend cuda || exit 1; done"
  # The SM partition as configured by default, then none (-1) for reference.
  step multi_dist_bench 300 bash -c "for a in '--zero 0' '--zero 1' '--zero 0 --comm-sms -1' \
    '--dtype bf16 --zero 0' '--dtype bf16 --zero 1' '--dtype bf16 --zero 0 --reduce-f32'; do \
    ${MPI2[*]} $BUILD/bench/mtopt_dist_bench --backend cuda --shape gpt2-xl --buckets 4,25,100 \
    --iters 10 --warmup 2 \$a || exit 1; done"
  step multi_nccl_ref 120 python3 -m torch.distributed.run --nproc_per_node 2 \
    "$ROOT/bench/nccl_allreduce.py" --sizes-mb 4,25,100
  step multi_mnist 240 bash -c "for p in fp32 bf16; do for np in 1 2; do \
    echo \"--- mnist_mlp --gpu --precision \$p, \$np GPUs\"; mpirun -np \$np --oversubscribe \
    -x NCCL_NVLS_ENABLE=0 $MNIST --gpu --dist --precision \$p --data $MNIST_DATA \
    --csv /dev/null | tail -3 || exit 1; done; done"
else
  for s in multi_dist_test multi_dist_bench multi_nccl_ref multi_mnist; do
    want $s && echo "=== [$s] not run: $NGPU GPU(s)"
    record $s skipped - 0
  done
fi

# ---- profiles (Nsight Compute) ----
# Small tensors, on both small-tensor sets: the fused step's kernel over the
# pool (segments with gaps: the masked flavour), the same tensors packed
# (the plain kernel), and the reference AdamW kernel over the pool, side by
# side (docs/perf_notes_gaps.md: what the masked loop loses). Large
# tensors: the fused step on GPT-2 XL (a block per chunk: block_kernel)
# beside the reference AdamW kernel on the same elements (its first 3
# launches are the check's small buffer: skipped).
if command -v ncu >/dev/null; then
  NCU=(ncu --clock-control none --section SpeedOfLight --section MemoryWorkloadAnalysis
       --section Occupancy --section WarpStateStats --section SchedulerStats --section LaunchStats)
  step ncu_small 240 bash -c "for s in many-mixed tiny-50k; do for m in fused packed; do \
    ${NCU[*]} -k regex:'warp_kernel|block_kernel' -c 1 $BUILD/bench/mtopt_bench --backend cuda \
    --shapes \$s --modes \$m --iters 1 --warmup 1 --check 0 || exit 1; done; \
    ${NCU[*]} -k regex:ref_ --launch-skip 3 -c 1 $BUILD/bench/mtopt_bench --backend cuda \
    --shapes \$s --modes ref-adamw-pooled --iters 1 --warmup 1 --check 0 || exit 1; done"
  # The reference AdamW kernel on GPT-2 XL; a --dtype may follow.
  NCU_REF="${NCU[*]} -k regex:ref_kernel --launch-skip 3 -c 1 $BUILD/bench/mtopt_bench \
    --backend cuda --shapes gpt2-xl --modes ref-adamw --iters 1 --warmup 1 --check 0"
  step ncu_large 150 bash -c "${NCU[*]} -k regex:block_kernel -c 1 $BUILD/bench/mtopt_bench \
    --backend cuda --shapes gpt2-xl --modes fused --iters 1 --warmup 1 --check 0 && $NCU_REF"
  # Mixed precision: the fused step's kernel on GPT-2 XL with fp32 masters
  # and with fp32 state and no masters (docs/perf_notes.md, v12: what the
  # fp32 path gets from its loop and these do not), and the reference AdamW
  # kernel in the fp32-master layout.
  step ncu_mixed 200 bash -c "for d in bf16-master bf16-nearest; do ${NCU[*]} \
    -k regex:block_kernel -c 1 $BUILD/bench/mtopt_bench --backend cuda --shapes gpt2-xl \
    --dtype \$d --modes fused --iters 1 --warmup 1 --check 0 || exit 1; done && \
    $NCU_REF --dtype bf16-master"
fi

# ---- sanitizers (CUDA must not be touched before Check forks: CK_FORK=no) ----
SAN=$(command -v compute-sanitizer || ls /usr/local/cuda/bin/compute-sanitizer \
      /usr/local/cuda/compute-sanitizer/compute-sanitizer 2>/dev/null | head -1)
if [ -n "$SAN" ]; then
  step memcheck 150 env CK_FORK=no "$SAN" --tool memcheck \
    --leak-check full --error-exitcode 1 "$BUILD/tests/test_cuda_backend"
  # segments over tensors in their own cudaMalloc: a gap read is out of bounds
  step memcheck_segments 150 env CK_FORK=no MTOPT_TEST_BACKEND=cuda "$SAN" --tool memcheck \
    --error-exitcode 1 "$BUILD/tests/test_segments"
  step racecheck 150 env CK_FORK=no "$SAN" --tool racecheck \
    --error-exitcode 1 "$BUILD/tests/test_cuda_backend"
else
  for s in memcheck memcheck_segments racecheck; do
    if want $s; then
      echo "compute-sanitizer not found: no $s"
      record $s FAILED - 0
    else
      record $s skipped - 0
    fi
  done
fi

# ---- collect ----
cp "$BUILD/CMakeCache.txt" "$LOGS/" 2>/dev/null
cp "$BUILD/Testing/Temporary/LastTest.log" "$LOGS/ctest_LastTest.log" 2>/dev/null
{
  echo "gpu_run.sh $(date -u +%Y-%m-%dT%H:%M:%SZ) commit ${MTOPT_GIT_COMMIT:-unknown}" \
    "total $((SECONDS - T_START))s of ${BUDGET}s"
  printf '%s\n' "${SUMMARY[@]}"
} | tee "$OUT/summary.txt"
tar -C "$OUT" -czf "$OUT/logs.tar.gz" logs && rm -rf "$LOGS"
echo "outputs in $OUT: $(ls "$OUT" | tr '\n' ' ')"
[ "$FAILED" -eq 0 ] && echo "gpu_run: all steps passed" || echo "gpu_run: some steps FAILED"
exit "$FAILED"
