#!/usr/bin/env bash
# Installs every system package spanformer needs (Debian 12). Idempotent: packages already present are
# skipped by apt-get, and apt's package lists are refreshed only when stale.
#   --tool-only   leave out the test and benchmark libraries (then configure with
#                 -DSPANFORMER_TESTS=OFF -DSPANFORMER_BENCH=OFF)
set -euo pipefail
tool_only=false
[ "${1:-}" = "--tool-only" ] && tool_only=true

packages=(
  build-essential cmake ninja-build ccache pkg-config
  libtorch-dev            # LibTorch 1.13 (CPU), headers + CMake config
  libgloo-dev             # headers of Gloo, the CPU backend of torch.distributed (c10d) in libtorch
  libopenblas0-pthread    # fast BLAS for LibTorch's matrix products (the reference BLAS is many times slower)
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
)
# Tests (Python checks use /usr/bin/python3; headless Chromium renders the run report), benchmarks.
# libboost-context-dev: fibers for the CPU model of CUDA that runs the CUDA kernels in the tests.
$tool_only || packages+=(libgtest-dev libbenchmark-dev python3-torch chromium libboost-context-dev)

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep "install ok installed" > /dev/null || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages already installed"
  exit 0
fi
echo "install-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq
$SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
