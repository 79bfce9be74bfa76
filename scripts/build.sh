#!/usr/bin/env bash
# Configures (once) and builds spanformer in ./build with Ninja and ccache. Extra arguments go to CMake.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/build.ninja ]; then
  cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@"
fi
ninja -C build -j "$(nproc)"
