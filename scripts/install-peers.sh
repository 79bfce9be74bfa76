#!/usr/bin/env bash
# Installs llama.cpp as a decoding peer for bench/python/peers.py (`--rows generate`), idempotently:
#   1. bench/python/requirements-peers.txt into the project's environment (.venv, or $SPANFORMER_VENV,
#      made by scripts/install-deps.sh first): llama-cpp-python, built by pip from PyPI's source;
#   2. llama.cpp's converter of Hugging Face models to GGUF (convert_hf_to_gguf.py with its `conversion`
#      and `gguf-py` packages) from the same source release, into $venv/llama.cpp.
# Reinstalled only when that file changes (a stamp in $venv/llama.cpp holds its checksum).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh > /dev/null
venv="${SPANFORMER_VENV:-$PWD/.venv}"
requirements=bench/python/requirements-peers.txt
want=$(sha256sum "$requirements" | cut -d' ' -f1)
stamp="$venv/llama.cpp/.spanformer-requirements"
if [ "$(cat "$stamp" 2> /dev/null)" = "$want" ]; then
  echo "install-peers: $venv already holds $requirements and llama.cpp's converter"
  exit 0
fi
echo "install-peers: installing $requirements into $venv (pip builds llama.cpp from source the first time)"
"$venv/bin/python" -m pip install --quiet --disable-pip-version-check -c python/requirements.txt -r "$requirements"
version=$(sed -n 's/^llama-cpp-python==//p' "$requirements")
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$venv/bin/python" -m pip download --quiet --disable-pip-version-check --no-deps --no-binary :all: \
  --no-build-isolation "llama-cpp-python==$version" -d "$tmp"
tar xzf "$tmp/llama_cpp_python-$version.tar.gz" -C "$tmp"
src="$tmp/llama_cpp_python-$version/vendor/llama.cpp"
rm -rf "$venv/llama.cpp.new"
mkdir -p "$venv/llama.cpp.new"
cp -r "$src/convert_hf_to_gguf.py" "$src/conversion" "$src/gguf-py" "$src/LICENSE" "$venv/llama.cpp.new/"
echo "$want" > "$venv/llama.cpp.new/.spanformer-requirements"
rm -rf "$venv/llama.cpp"
mv "$venv/llama.cpp.new" "$venv/llama.cpp"
echo "install-peers: llama-cpp-python $version and its converter in $venv/llama.cpp"
