#!/bin/sh
# Installs an mtopt build into a fresh prefix, checks what was installed, and
# builds the consumers against it with CMake's find_package and with
# pkg-config: the core alone (mtopt, which must need no MPI) and, in a build
# with MPI, the distributed layer (mtopt::dist, mtopt_dist.pc). Runs them.
# Usage: run.sh <mtopt build dir> <consumer source dir> <scratch dir>
#               [extra C flags] [has MPI 0|1] [MTOPT_NATIVE 0|1] [mpiexec]
set -eu
build=$1
src=$2
work=$3
cflags=${4:-}
has_mpi=${5:-0}
native=${6:-0}
mpiexec=${7:-}
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix
fail() { echo "consumer: $*"; exit 1; }

echo "== cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" > "$work/install.log"
lib=$(find "$prefix" -name libmtopt.so | head -n 1)
test -n "$lib" || fail "libmtopt.so was not installed"
incdir=$prefix/include/mtopt

echo "== what the core needs"
# The core library must run without MPI or NCCL installed.
if readelf -d "$lib" | grep NEEDED | grep -E -i 'libmpi|libnccl|libopen-(rte|pal)'; then
  fail "libmtopt.so needs MPI or NCCL (above)"
fi
if [ "$native" = 0 ]; then
  # No -march=native unless asked for: in the compile flags the build
  # recorded (Makefiles: the library objects' flags.make; Ninja: build.ninja) ...
  for f in "$build/CMakeFiles/mtopt_core_objects.dir/flags.make" "$build/build.ninja"; do
    if [ -f "$f" ] && grep -n -- '-march=native' "$f"; then
      fail "-march=native is in the library's compile flags ($f)"
    fi
  done
  # ... and in the code: wide-vector instructions only in the run-time
  # dispatched clones (backend_cpu.c: *.avx512f, *.fma).
  if [ "$(uname -m)" = x86_64 ] && command -v objdump > /dev/null &&
     nm "$lib" 2> /dev/null | grep -q ' [tT] '; then
    objdump -d --no-show-raw-insn "$lib" | awk '
      /^[0-9a-f]+ <.*>:$/ { fn = $2; next }
      /%[yz]mm[0-9]/ && fn !~ /[.](avx512f|fma)/ { bad[fn]++ }
      END { for (f in bad) { print "  " f ": " bad[f] " AVX instructions"; n++ }
            exit n > 0 }' ||
      fail "libmtopt.so has AVX code outside the dispatched clones (above)"
  fi
fi
echo "== find_package(mtopt), with MPI disabled"
# CMAKE_DISABLE_FIND_PACKAGE_MPI: the core package must not look for MPI.
cmake -S "$src" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_DISABLE_FIND_PACKAGE_MPI=ON --no-warn-unused-cli \
  -DCMAKE_C_FLAGS="$cflags" -DCMAKE_EXE_LINKER_FLAGS="$cflags" > "$work/configure.log"
cmake --build "$work/cmake-build" > "$work/build.log"
"$work/cmake-build/consumer"

echo "== pkg-config mtopt"
pc=$(find "$prefix" -name mtopt.pc | head -n 1)
test -n "$pc" || fail "mtopt.pc was not installed"
pcdir=$(dirname "$pc")
export PKG_CONFIG_PATH="$pcdir"
flags=$(pkg-config --cflags --libs mtopt)
pclibdir=$(pkg-config --variable=libdir mtopt)
case "$pclibdir" in
  "$prefix"/*|"$pcdir"/*) ;;
  *) fail "mtopt.pc points at $pclibdir, not into $prefix" ;;
esac
case "$flags" in *mpi*) fail "mtopt.pc brings MPI: $flags" ;; esac
# shellcheck disable=SC2086
${CC:-cc} $cflags "$src/consumer.c" -o "$work/consumer-pc" $flags -lm
LD_LIBRARY_PATH=$pclibdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$work/consumer-pc"

if [ "$has_mpi" != 1 ]; then
  echo "== no dist component in this build"
  for f in "$incdir/mtopt_dist.h" "$pcdir/mtopt_dist.pc"; do
    test ! -e "$f" || fail "$f is installed by a build without the dist library"
  done
  # find_package(mtopt COMPONENTS dist) must fail, and say why.
  if cmake -S "$src" -B "$work/cmake-build-dist" -DCMAKE_PREFIX_PATH="$prefix" \
       -DCONSUMER_DIST=ON > "$work/configure-dist.log" 2>&1; then
    fail "find_package(mtopt COMPONENTS dist) succeeded without the dist library"
  fi
  grep -q "built without the distributed layer" "$work/configure-dist.log" ||
    { cat "$work/configure-dist.log"; fail "no clear message for the missing dist component"; }
  echo "consumer: all ok"
  exit 0
fi

# One rank: MPI's singleton start, no mpiexec (as root, Open MPI needs the
# ALLOW_RUN_AS_ROOT pair). Where a singleton cannot start, the mpiexec CMake
# found runs it as one rank instead.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
run_one_rank() {
  "$@" && return 0
  test -n "$mpiexec" || return 1
  echo "consumer: failed as a singleton; again under $mpiexec -n 1"
  "$mpiexec" -n 1 "$@"
}

echo "== find_package(mtopt COMPONENTS dist)"
cmake -S "$src" -B "$work/cmake-build-dist" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCONSUMER_DIST=ON \
  -DCMAKE_C_FLAGS="$cflags" -DCMAKE_EXE_LINKER_FLAGS="$cflags" > "$work/configure-dist.log"
cmake --build "$work/cmake-build-dist" > "$work/build-dist.log"
run_one_rank "$work/cmake-build-dist/consumer_dist"

echo "== pkg-config mtopt_dist"
pkg-config --exists mtopt_dist || fail "mtopt_dist.pc is missing or unusable"
flags=$(pkg-config --cflags --libs mtopt_dist)
# shellcheck disable=SC2086
${CC:-cc} $cflags "$src/consumer_dist.c" -o "$work/consumer_dist-pc" $flags -lm
LD_LIBRARY_PATH=$pclibdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} \
  run_one_rank "$work/consumer_dist-pc"
echo "consumer: all ok"
