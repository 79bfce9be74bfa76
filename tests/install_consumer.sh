#!/usr/bin/env bash
# cmake --install, then what a user of the installed tree does: run the tool, build examples/consumer
# with find_package(spanformer) and run it on a checkpoint, import the Python package.
set -euo pipefail
py="${SPANFORMER_PYTHON:-/usr/bin/python3}"  # a Python with torch (CTest passes the one whose LibTorch the build uses)
build="$1"; src="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
prefix="$tmp/prefix"
cmake --install "$build" --prefix "$prefix" > /dev/null
"$prefix/bin/spanformer" --version | grep "^spanformer " > /dev/null
test -f "$prefix/lib/cmake/spanformer/spanformerConfig.cmake"
test -f "$prefix/include/spanformer/train/family.h"
cmake -S "$src/examples/consumer" -B "$tmp/consumer" -G Ninja -DCMAKE_PREFIX_PATH="$prefix" \
  -DCMAKE_BUILD_TYPE=Release > "$tmp/configure.log" || { cat "$tmp/configure.log"; exit 1; }
cmake --build "$tmp/consumer" > "$tmp/build.log" || { cat "$tmp/build.log"; exit 1; }
printf 'In the beginning God created the heaven and the earth.\n%.0s' $(seq 1 200) > "$tmp/text.txt"
"$prefix/bin/spanformer" data prepare "$tmp/text.txt" --out "$tmp/data" > /dev/null
cat > "$tmp/tiny.json" <<JSON
{"model": {"nb_layers": 1, "hidden_size": 8, "inner_hidden_size": 16, "nb_heads": 2, "attn_span": 16, "block_size": 8},
 "train": {"batch_size": 2, "nb_steps": 2, "eval_interval": 2, "eval_blocks": 1, "lr_warmup": 0}}
JSON
"$prefix/bin/spanformer" --threads 1 train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/run" --quiet > /dev/null
"$tmp/consumer/consumer" "$tmp/run" > "$tmp/out.txt"
"$py" - "$tmp/out.txt" <<'PY'
import re, sys
text = open(sys.argv[1]).read()
error = float(re.search(r"max \|fast - reference\| = (\S+)", text).group(1))
assert error < 1e-5, text  # float32: the fused kernel sums in another order than the composition
assert re.search(r"checkpoint\.pt: adaptive-span, \d+ parameters, step 2", text), text
PY
# The Python package from the installed tree: required where this build has it (CTest passes the
# build's Python in SPANFORMER_PYTHON; empty where the build was configured without Python).
if [ -n "${SPANFORMER_PYTHON:-}" ]; then
  [ -d "$prefix/lib/spanformer/python/spanformer" ] || { echo "FAIL: no Python package under $prefix/lib/spanformer/python"; exit 1; }
  PYTHONPATH="$prefix/lib/spanformer/python" "$py" -c "
import spanformer
m = spanformer.load('$tmp/run')
assert m.family == 'adaptive-span' and m.step == 2, m
print('python from the installed tree:', m)" > /dev/null
  echo "install: tool, library, CMake package, consumer and Python package work from $prefix"
else
  echo "install: tool, library, CMake package and consumer work from $prefix (this build has no Python package)"
fi
