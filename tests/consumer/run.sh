#!/bin/sh
# Installs an mtopt build into a fresh prefix and builds the consumer against
# it twice: with CMake's find_package(mtopt) and with pkg-config. Runs both.
# Usage: run.sh <mtopt build dir> <consumer source dir> <scratch dir> [extra C flags]
set -eu
build=$1
src=$2
work=$3
cflags=${4:-}
rm -rf "$work"
mkdir -p "$work"
prefix=$work/prefix

echo "== cmake --install $build --prefix $prefix"
cmake --install "$build" --prefix "$prefix" > "$work/install.log"

echo "== find_package(mtopt)"
cmake -S "$src" -B "$work/cmake-build" -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_C_FLAGS="$cflags" -DCMAKE_EXE_LINKER_FLAGS="$cflags" > "$work/configure.log"
cmake --build "$work/cmake-build" > "$work/build.log"
"$work/cmake-build/consumer"

echo "== pkg-config mtopt"
pc=$(find "$prefix" -name mtopt.pc | head -n 1)
test -n "$pc" || { echo "mtopt.pc was not installed"; exit 1; }
pcdir=$(dirname "$pc")
flags=$(PKG_CONFIG_PATH=$pcdir pkg-config --cflags --libs mtopt)
libdir=$(PKG_CONFIG_PATH=$pcdir pkg-config --variable=libdir mtopt)
case "$libdir" in
  "$prefix"/*|"$pcdir"/*) ;;
  *) echo "mtopt.pc points at $libdir, not into $prefix"; exit 1 ;;
esac
# shellcheck disable=SC2086
${CC:-cc} $cflags "$src/consumer.c" -o "$work/consumer-pc" $flags -lm
LD_LIBRARY_PATH=$libdir${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} "$work/consumer-pc"
echo "consumer: all ok"
