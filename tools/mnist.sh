#!/usr/bin/env bash
# The main job: builds mtopt and trains the MNIST-style MLP example with it
# (Fashion-MNIST by default; GPU when present). Extra arguments go to the
# program (try --help).
set -euo pipefail
cd "$(dirname "$0")/.."
tools/deps.sh
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build -j"$(nproc)" --target mnist_mlp
exec build/examples/mnist_mlp/mnist_mlp "$@"
