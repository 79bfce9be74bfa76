#!/usr/bin/env bash
# Builds and runs the whole test suite (CPU; CUDA-labelled tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
