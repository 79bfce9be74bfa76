#!/usr/bin/env bash
# The CUDA sources compile on a machine without a GPU: the kernels with nvcc (sm_90), and the LibTorch
# glue as C++ against this LibTorch's headers with SPANFORMER_WITH_CUDA (syntax only: a CPU LibTorch has
# no CUDA libraries to link; a -DSPANFORMER_CUDA=ON build compiles the glue for real and skips this).
# Exit 77 (skipped) without nvcc or without LibTorch's c10/cuda headers.
#   bash tests/cuda_compile.sh SOURCE_DIR OUT_DIR NVCC "TORCH_INCLUDE_DIRS" [SPANFORMER_CUDA]
set -euo pipefail
src=$1 out=$2 nvcc=$3 torch_includes=$4 cuda_build=${5:-OFF}
[ -x "$nvcc" ] || { echo "nvcc not found"; exit 77; }
cuda_include=$(dirname "$(dirname "$(readlink -f "$nvcc")")")/include
for k in span_attention span_attention_mma flash_attention; do
  "$nvcc" -std=c++17 -O3 -arch=sm_90 -c "$src/src/ops/cuda/${k}_kernels.cu" -o "$out/${k}_kernels.o"
  echo "nvcc: ${k}_kernels.cu compiled"
done
[ "$cuda_build" = ON ] && exit 0
includes=(-I "$src/include" -I "$cuda_include")
for d in $torch_includes; do includes+=(-I "$d"); done
found=""
for d in $torch_includes; do [ -f "$d/c10/cuda/CUDAStream.h" ] && found=$d; done
[ -n "$found" ] || { echo "no c10/cuda headers in this LibTorch"; exit 77; }
# A CPU build of LibTorch installs c10/cuda without the generated macros header: an empty one stands in.
if [ ! -f "$found/c10/cuda/impl/cuda_cmake_macros.h" ]; then
  mkdir -p "$out/cuda_stub/c10/cuda/impl"
  echo '#pragma once' > "$out/cuda_stub/c10/cuda/impl/cuda_cmake_macros.h"
  includes+=(-I "$out/cuda_stub")
fi
for f in src/ops/cuda/span_attention_cuda.cpp src/ops/cuda/flash_attention_cuda.cpp src/ops/flash_attention.cpp \
         src/ops/adaptive_span_attention.cpp; do
  g++ -std=c++17 -fsyntax-only -DSPANFORMER_WITH_CUDA=1 "${includes[@]}" "$src/$f"
  echo "g++: $f compiles with SPANFORMER_WITH_CUDA"
done
