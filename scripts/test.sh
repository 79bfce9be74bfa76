#!/usr/bin/env bash
# Builds and runs the whole test suite (CPU; CUDA-labelled tests skip without a GPU).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/build.sh
cd build
export GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-10000}"  # see cli/main.cpp: OpenMP spinning slows OpenBLAS on small machines
ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@"
