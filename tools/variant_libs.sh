#!/usr/bin/env bash
# Variant libraries built on this machine, without a GPU, for the prebuilt
# variants of tools/gpu_variants.sh (NAME%DIR): each is BUILD's libmtopt
# with some of its CUDA sources compiled again with more flags (typically
# the -D switches a kernel change reads while it is tried), relinked from
# BUILD's other objects. A pass's source compiles in seconds to minutes
# here; building each variant on the GPU host takes minutes of its time.
# BUILD is a built CUDA build directory of this tree, e.g.
#   cmake -S . -B build-v -DCMAKE_BUILD_TYPE=Release -DMTOPT_WITH_CUDA=ON \
#     -DCMAKE_CUDA_ARCHITECTURES=90 -DMTOPT_BUILD_TESTS=OFF \
#     -DMTOPT_BUILD_EXAMPLES=OFF -DMTOPT_WITH_MPI=OFF
#   cmake --build build-v --target mtopt_bench
#
#   tools/variant_libs.sh BUILD OUT NAME=[FLAGS:SRC[,SRC...]] ...
#
# OUT/NAME/libmtopt.so.0 for each variant (NAME= alone: BUILD's own
# library), OUT/mtopt_bench (BUILD's), and OUT.tar.xz of them all. A SRC
# under another checkout of the tree (DIR/src/..., e.g. an earlier commit's
# `git archive COMMIT | tar -x -C .variants/COMMIT`) replaces the source of
# the same path: the baseline of a change, in the same run. Carry
# the .tar.xz (git-ignored under .variants/), unpack it on the GPU host
# in the same place (tar xJf), and time them there:
#   tools/variant_libs.sh build-v .variants/v base= new=-DEXP_X:src/backend/cuda/pass_stats.cu
#   (GPU host) tar xJf .variants/v.tar.xz &&
#     BENCH=.variants/v/mtopt_bench tools/gpu_variants.sh RES base%.variants/v/base \
#       new%.variants/v/new
set -eu -o pipefail
[ $# -ge 3 ] || { sed -n '2,27p' "$0"; exit 2; }
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=$(cd "$1" && pwd)
mkdir -p "$2"
OUT=$(cd "$2" && pwd)
case $OUT/ in "$ROOT"/*) ;; *) echo "OUT must lie in the repository"; exit 2 ;; esac
shift 2
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
flags_make=$BUILD/CMakeFiles/mtopt_core_objects.dir/flags.make
var() { sed -n "s/^$1 = //p" "$flags_make"; }
read -r -a defines <<<"$(var CUDA_DEFINES)"
read -r -a includes <<<"$(var CUDA_INCLUDES)"
read -r -a cflags <<<"$(var CUDA_FLAGS)"
link=$(cat "$BUILD/CMakeFiles/mtopt.dir/link.txt")
objects=$(tr -s ' \n' '\n\n' <"$BUILD/CMakeFiles/mtopt.dir/objects1")
for v in "$@"; do
  name=${v%%=*}
  spec=${v#*=}
  dir=$OUT/$name
  mkdir -p "$dir/obj"
  objs=$objects
  if [ -n "$spec" ]; then
    read -r -a extra <<<"${spec%%:*}"
    IFS=, read -r -a srcs <<<"${spec#*:}"
    for src in "${srcs[@]}"; do
      rel=$src # DIR/src/...: the object of src/...
      until obj=CMakeFiles/mtopt_core_objects.dir/$rel.o; grep -qxF "$obj" <<<"$objects"; do
        [ "$rel" != "${rel#*/}" ] || { echo "$src: not a source of $BUILD's library"; exit 1; }
        rel=${rel#*/}
      done
      mine=$dir/obj/$(basename "$src").o
      (cd "$BUILD" && "$NVCC" "${defines[@]}" "${includes[@]}" "${cflags[@]}" "${extra[@]}" \
        -x cu -c "$ROOT/$src" -o "$mine")
      objs=$(sed "s#^$obj\$#$mine#" <<<"$objs")
    done
  fi
  cmd=$(sed "s#-o libmtopt[.a-z0-9]*#-o $dir/libmtopt.so.0#; s#@CMakeFiles/mtopt.dir/objects1#$(tr '\n' ' ' <<<"$objs")#" <<<"$link")
  (cd "$BUILD" && eval "$cmd")
  rm -rf "$dir/obj"
  echo "$name: $dir/libmtopt.so.0 (${spec:-as built})"
done
cp "$BUILD/bench/mtopt_bench" "$OUT/"
tar -C "$ROOT" -cf - "$(realpath --relative-to="$ROOT" "$OUT")" | xz -9e -T1 >"$OUT.tar.xz"
echo "$OUT.tar.xz: $(du -h "$OUT.tar.xz" | cut -f1)"
