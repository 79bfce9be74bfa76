#!/usr/bin/env bash
# Configures (once) and builds spanformer with Ninja and ccache.
#   scripts/build.sh                  LibTorch 2.x of the project's Python environment (.venv, made by
#                                     scripts/install-deps.sh) into build/
#   scripts/build.sh --torch system   Debian's libtorch-dev 1.13 into build-system/
#   scripts/build.sh --torch DIR      any LibTorch (a torch package's folder, an unpacked libtorch) into build-custom/
#   scripts/build.sh --cuda           the CUDA build (kernels, NCCL) into build-cuda/: needs a CUDA
#                                     LibTorch (PyPI's torch is one) and nvcc: the one install-deps.sh
#                                     puts in .venv/cuda from PyPI, else the machine's
#   --dir DIR                         another build folder; arguments after -- go to CMake
#   --target NAME                     build only that target and what it needs (repeatable; default: all)
set -euo pipefail
cd "$(dirname "$0")/.."
torch=venv cuda=OFF dir="" cmake_args=() targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --torch) torch="${2:?--torch needs venv, system or a directory}"; shift 2 ;;
    --cuda) cuda=ON; shift ;;
    --dir) dir="${2:?--dir needs a folder}"; shift 2 ;;
    --target) targets+=("${2:?--target needs a target name}"); shift 2 ;;
    --) shift; cmake_args+=("$@"); break ;;
    -D*) cmake_args+=("$1"); shift ;;
    *) echo "build: unknown option '$1' (--torch venv|system|DIR, --cuda, --dir DIR, --target NAME, -- CMAKE_ARGS)" >&2; exit 2 ;;
  esac
done

case "$torch" in
  venv)
    python="${SPANFORMER_VENV:-$PWD/.venv}/bin/python"
    [ -x "$python" ] || { echo "build: no Python environment at $python: run scripts/install-deps.sh first" >&2; exit 1; }
    prefix=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))' 2>/dev/null) ||
      { echo "build: $python has no torch: run scripts/install-deps.sh" >&2; exit 1; }
    default_dir=build ;;
  system) prefix="" default_dir=build-system ;;
  *) prefix=$(readlink -f "$torch") default_dir=build-custom ;;
esac
[ "$cuda" = ON ] && default_dir=build-cuda
dir="${dir:-$default_dir}"

# The CUDA build's toolkit: the one scripts/install-deps.sh laid out in the environment from PyPI's
# nvidia-* wheels (the CUDA release of torch's own libraries), else the machine's (nvcc on PATH).
toolkit="${SPANFORMER_VENV:-$PWD/.venv}/cuda"
if [ "$cuda" = ON ] && [ "$torch" = venv ] && [ -x "$toolkit/bin/nvcc" ]; then
  export PATH="$toolkit/bin:$PATH"
  cmake_args+=(-DCMAKE_CUDA_COMPILER="$toolkit/bin/nvcc" -DCUDAToolkit_ROOT="$toolkit" -DCUDA_TOOLKIT_ROOT_DIR="$toolkit")
fi

if [ ! -f "$dir/build.ninja" ]; then
  args=(-S . -B "$dir" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPANFORMER_CUDA=$cuda)
  [ -n "$prefix" ] && args+=(-DCMAKE_PREFIX_PATH="$prefix")
  cmake "${args[@]}" "${cmake_args[@]}"
fi
ninja -C "$dir" -j "$(nproc)" "${targets[@]}"
