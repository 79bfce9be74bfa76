#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install (Debian packages, PyPI's torch into .venv), build,
# prepare the King James Bible, train a small adaptive-span model for a minute or two on the CPU, then
# print test bpc, draw the spans and print a generated sample. Re-running resumes/reuses what is already there.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
bash scripts/build.sh --target spanformer_tool  # the program alone: the tests are scripts/test.sh's
sf=./build/spanformer

mkdir -p data
if [ ! -s data/kjv.txt ]; then
  bible -l0 'Genesis1:1-Revelation22:21' > data/kjv.txt.tmp && mv data/kjv.txt.tmp data/kjv.txt
fi
[ -f data/kjv/train.bin ] || $sf data prepare data/kjv.txt --out data/kjv

$sf train --config configs/demo.json --data data/kjv --out runs/demo --resume
echo
$sf eval runs/demo --split test
$sf spans runs/demo --out runs/demo/spans.png
echo "--- sample ---"
$sf generate runs/demo --prompt "And God said" --tokens 400 --temperature 0.8 --seed 1
