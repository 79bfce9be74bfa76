#!/usr/bin/env bash
# Installs what spanformer needs on Debian 12, idempotently (run it as often as you like):
#   1. Debian packages with apt-get: the compiler, CMake, Ninja, the libraries below; only the missing
#      ones are installed, and apt's lists are refreshed only then.
#   2. The project's Python environment: a virtual environment (.venv in the checkout, or
#      $SPANFORMER_VENV) with PyPI's packages at the versions in python/requirements.txt, torch among
#      them: its LibTorch 2.x is what scripts/build.sh builds against by default. Reinstalled only when
#      that file changes (a stamp inside the environment holds its checksum).
#   3. The CUDA build's toolkit in .venv/cuda, laid out from that environment's nvidia-* wheels (below).
#
#   --tool-only   leave out the test and benchmark libraries (then configure with
#                 -DSPANFORMER_TESTS=OFF -DSPANFORMER_BENCH=OFF)
#   --apt-only    Debian packages only: for a build against Debian's LibTorch 1.13 (scripts/build.sh
#                 --torch system), no PyPI
set -euo pipefail
cd "$(dirname "$0")/.."
tool_only=false apt_only=false
for arg in "$@"; do
  case "$arg" in
    --tool-only) tool_only=true ;;
    --apt-only) apt_only=true ;;
    *) echo "install-deps: unknown option '$arg' (--tool-only, --apt-only)" >&2; exit 2 ;;
  esac
done

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev            # Debian's LibTorch 1.13 (CPU): the apt-only build, and the one CI checks beside 2.x
  libgloo-dev             # headers of Gloo, the CPU backend of torch.distributed (c10d), for either LibTorch
  libopenblas0-pthread    # fast BLAS for Debian's LibTorch (PyPI's brings MKL)
  libcli11-dev            # command-line parsing
  nlohmann-json3-dev      # configs, logs, metadata
  libfmt-dev              # formatting
  libcairo2-dev           # span pictures (PNG)
  libzip-dev              # reading the enwik8.zip / text8.zip archives
  libcurl4-openssl-dev    # `spanformer data get`
  libssl-dev              # md5 / sha1 / sha256 checksums
  bible-kjv               # the default corpus (King James Bible)
  dataset-fashion-mnist   # Fashion-MNIST (IDX) for the Vision Transformer
  zlib1g-dev              # reading gzip-compressed IDX files
  libsentencepiece-dev    # subword tokenisation of the translation pairs (seq2seq, by flag)
  libpcre2-dev            # GPT-2's pre-tokenizer pattern (Unicode letters and numbers) for its byte-level BPE
  python3-venv python3-dev  # the project's virtual environment; Python's headers for torch.compile's C++
)
# Tests and benchmarks: GoogleTest, Google Benchmark, headless Chromium (renders the run report),
# Boost.Context (fibers of the CPU model of CUDA that runs the CUDA kernels in the tests), and Debian's
# PyTorch 1.13 with pytest for the Python tests of the 1.13 build.
$tool_only || packages+=(libgtest-dev libbenchmark-dev chromium libboost-context-dev python3-torch python3-pytest)

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" > /dev/null || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} Debian packages already installed"
else
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
$apt_only && exit 0

# The Python environment, from Debian's python3 (so that its headers are python3-dev's).
venv="${SPANFORMER_VENV:-$PWD/.venv}"
requirements=python/requirements.txt
want=$(sha256sum "$requirements" | cut -d' ' -f1)
stamp="$venv/.spanformer-requirements"

# 3. A CUDA toolkit for the CUDA build, from the environment's nvidia-* wheels (nvcc, its headers and
#    NVVM, the runtime and libraries torch loads, all one CUDA release): $venv/cuda holds bin, include
#    and nvvm as links into the wheels' nvidia/cu13, and lib with a link to every library of the wheels
#    under its versioned name and its bare one (libcudart.so, what CMake and the linker look for).
#    scripts/build.sh --cuda uses it before any toolkit of the machine's.
cuda_layout() {
  local nvidia root="$venv/cuda"
  nvidia=$("$venv/bin/python" -c 'import os, nvidia; print(list(nvidia.__path__)[0])' 2>/dev/null) || return 0
  [ -x "$nvidia/cu13/bin/nvcc" ] || return 0
  rm -rf "$root.new"
  mkdir -p "$root.new/lib"
  for part in bin include nvvm; do ln -s "$nvidia/cu13/$part" "$root.new/$part"; done
  for lib in "$nvidia"/*/lib/*.so* "$nvidia"/cu13/lib/*.a; do
    [ -e "$lib" ] || continue
    name=$(basename "$lib")
    ln -sf "$lib" "$root.new/lib/$name"
    case "$name" in *.so.*) ln -sf "$lib" "$root.new/lib/${name%%.so.*}.so" ;; esac
  done
  rm -rf "$root"
  mv "$root.new" "$root"
  echo "install-deps: CUDA toolkit $("$root/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') from PyPI laid out in $root"
}

# 4. In a developer's checkout (not under CI), the repository's hooks: a commit that changes a command-line
#    test script runs its mutants (scripts/hooks/pre-commit). An existing hooksPath is left alone.
if [ -z "${CI:-}" ] && command -v git > /dev/null && git -C "$PWD" rev-parse --git-dir > /dev/null 2>&1 \
   && [ -z "$(git -C "$PWD" config core.hooksPath)" ]; then
  git -C "$PWD" config core.hooksPath scripts/hooks
  echo "install-deps: git hooks from scripts/hooks (a commit changing tests/cli_*.sh runs its mutants)"
fi

if [ -x "$venv/bin/python" ] && [ "$(cat "$stamp" 2>/dev/null)" = "$want" ]; then
  echo "install-deps: $venv already holds $requirements"
  [ -x "$venv/cuda/bin/nvcc" ] || cuda_layout
  exit 0
fi
[ -x "$venv/bin/python" ] || /usr/bin/python3 -m venv "$venv"
echo "install-deps: installing $requirements into $venv (PyPI; torch is a few GB the first time)"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -r "$requirements"
cuda_layout
echo "$want" > "$stamp"
