#!/usr/bin/env bash
# Builds of one tree with different CUDA flags, timed against each other in
# one run on a GPU host: the A/B measurement of a kernel change
# (docs/perf_notes_mixed.md, v14). Each variant is NAME=FLAGS, where FLAGS go
# to CMAKE_CUDA_FLAGS (typically -D switches that the change reads while it
# is tried; an empty FLAGS is the tree as it is). The variants build in
# parallel, bench-only (no tests, examples or MPI), then take turns: for each
# --dtype, each variant runs mtopt_bench once, so a drift of the machine
# spreads over all of them. NAME@DIR=FLAGS builds the source tree in DIR
# (relative to the repository) instead of this one: an earlier commit
# against this tree, on one machine, in one run. Make DIR with
# `git archive COMMIT | tar -x -C .variants/COMMIT` (.variants/ is
# git-ignored) and carry it to the GPU host. NAME%LIBDIR builds nothing:
# it runs $BENCH (a carried mtopt_bench) with the libmtopt.so.0 in LIBDIR
# (relative to the repository), as tools/variant_libs.sh builds them on a
# machine without a GPU, so that the host's time goes to the runs only.
#
#   tools/gpu_variants.sh OUT NAME[@DIR]=FLAGS|NAME%LIBDIR ...
#
# OUT gets summary.txt (one line per variant and dtype: each shape's step
# ms, its copy floor's ms and the fraction), the resource usage (registers,
# stack) of each build's block kernels, and results.tar.gz with the JSON.
# Environment:
#   DTYPES="bf16-master f32@sgd"  the --dtype list (mtopt_bench --help names
#                              them; default bf16-master), each with an
#                              --optimizer after an @ (default adamw)
#   SHAPES=gpt2-xl,llama-1.1b  MODES=fused,copy  ITERS=20
#   BUDGET=560                 seconds; the benches stop when it runs out
#   BENCH_ARGS="--chunk-size 4096"  more mtopt_bench arguments, every variant
#   ROUNDS=1                   turns of every variant for each dtype
#   BENCH=.variants/v/mtopt_bench  the benchmark the NAME%LIBDIR variants run
set -u -o pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
[ $# -ge 2 ] || { sed -n '2,28p' "$0"; exit 2; }
mkdir -p "$1"
OUT=$(cd "$1" && pwd)
shift
export PATH="$PATH:/usr/local/cuda/bin"
DTYPES=${DTYPES:-bf16-master}
BUDGET=${BUDGET:-560}
RES=$(mktemp -d)
NAMES=()
BUILDS=$(printf '%s\n' "$@" | grep -vc %)
JOBS=$(( BUILDS > 0 && $(nproc) / BUILDS > 1 ? $(nproc) / BUILDS : 1 ))
declare -A BIN LIB
for v in "$@"; do
  case $v in *%*)
    name=${v%%%*}
    NAMES+=("$name")
    BIN[$name]=$ROOT/${BENCH:?NAME%LIBDIR variants need BENCH}
    LIB[$name]=$ROOT/${v#*%}
    continue ;;
  esac
  name=${v%%=*}
  flags=${v#*=}
  src=$ROOT
  case $name in *@*) src=$ROOT/${name#*@}; name=${name%%@*} ;; esac
  NAMES+=("$name")
  BIN[$name]=/tmp/variant-$name/bench/mtopt_bench
  LIB[$name]=/tmp/variant-$name
  ( cmake -S "$src" -B "/tmp/variant-$name" -DCMAKE_BUILD_TYPE=Release -DMTOPT_WITH_CUDA=ON \
      -DCMAKE_CUDA_ARCHITECTURES=90 -DMTOPT_BUILD_TESTS=OFF -DMTOPT_BUILD_EXAMPLES=OFF \
      -DMTOPT_WITH_MPI=OFF -DMTOPT_GIT_COMMIT="${MTOPT_GIT_COMMIT:-}" \
      "-DCMAKE_CUDA_FLAGS=$flags" >"$RES/configure-$name.log" 2>&1 &&
    cmake --build "/tmp/variant-$name" --target mtopt_bench -j"$JOBS" \
      >"$RES/build-$name.log" 2>&1
    echo "build $name ($flags): rc $? at ${SECONDS}s" ) &
done
wait
{
  for name in "${NAMES[@]}"; do
    echo "== $name"
    cuobjdump -res-usage "${LIB[$name]}"/libmtopt.so.0 2>/dev/null |
      grep -A1 block_kernel | grep -o "block_kernelILi[0-9]ELi[0-9]ELi[0-9]E\|REG:[0-9]*\|STACK:[0-9]*" |
      paste - - -
  done
} >"$OUT/resources.txt"
: >"$OUT/summary.txt"
for d in $DTYPES; do
 for round in $(seq "${ROUNDS:-1}"); do
  for name in "${NAMES[@]}"; do
    if [ "$SECONDS" -gt "$BUDGET" ]; then
      echo "out of time at ${SECONDS}s" | tee -a "$OUT/summary.txt"
      break 3 # variants, rounds and dtypes
    fi
    json=$RES/$name-$d-$round.json
    opt=adamw
    case $d in *@*) opt=${d#*@} ;; esac
    LD_LIBRARY_PATH=${LIB[$name]} timeout 120 "${BIN[$name]}" --backend cuda \
      --shapes "${SHAPES:-gpt2-xl,llama-1.1b}" --modes "${MODES:-fused,copy}" \
      --iters "${ITERS:-20}" --warmup 5 --dtype "${d%@*}" --optimizer "$opt" ${BENCH_ARGS:-} \
      --json "$json" >"$RES/$name-$d-$round.log" 2>&1 ||
      echo "$name $d: mtopt_bench failed" | tee -a "$OUT/summary.txt"
    [ -s "$json" ] && python3 - "$json" "$name" "$d r$round" >>"$OUT/summary.txt" <<'PY'
import json, sys
rows = [r for r in json.load(open(sys.argv[1]))["rows"] if r["mode"] != "copy"]
print(sys.argv[2], sys.argv[3], "  ".join(
    f"{r['shape']} {r['mode']} {r['ms']:.3f}/{r['floor_ms']:.3f}={r['frac_of_floor']:.3f}"
    for r in rows))
PY
  done
 done
done
tar czf "$OUT/results.tar.gz" -C "$RES" .
cat "$OUT/resources.txt" "$OUT/summary.txt"
