#!/usr/bin/env bash
# Coverage-guided fuzzing of every reader of user files (issue 38; targets in tests/fuzz, findings and
# figures in docs/reliability.md).
#
#   bash scripts/fuzz.sh [TARGET|all] [SECONDS]   build build-fuzz/ (clang, ASan + UBSan, libFuzzer), make
#                                                the seed corpora, then fuzz each target for SECONDS
#                                                (default 600) and print its executions, coverage and
#                                                findings; crashing inputs land in build-fuzz/crashes/
#   bash scripts/fuzz.sh seeds DIR CLI           the seed corpora, DIR/<target>/, made on the spot with the
#                                                spanformer command CLI (small valid files: no blobs kept)
#   bash scripts/fuzz.sh replay FUZZ_REPLAY CLI  (CTest's fuzz.replay) every target over fresh seeds and
#                                                every kept crash, tests/fuzz/crashes/<target>/, in the
#                                                normal build: seconds
# A crash found by fuzzing gets a fix and its input kept in tests/fuzz/crashes/<target>/ (named by what
# it broke), so that the replay holds the fix.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(vocab config idx tokens pairs jsonl safetensors checkpoint)

make_seeds() {  # DIR CLI
  local out=$1 cli=$2 work
  work=$(mktemp -d)
  for t in "${targets[@]}"; do mkdir -p "$out/$t"; done
  printf 'In the beginning God created the heaven and the earth.\n%.0s' $(seq 1 300) > "$work/text.txt"
  printf 'And the earth was without form, and void; and darkness was upon the face of the deep.\n%.0s' $(seq 1 50) >> "$work/text.txt"
  "$cli" data prepare "$work/text.txt" --out "$work/data" > /dev/null
  cp "$work/data/vocab.txt" "$out/vocab/vocab.txt"
  printf 'the\nof\nand\n<unk>\n<eos>\n' > "$out/vocab/words.txt"
  cp "$work/data/train.bin" "$out/tokens/train.bin"
  cp "$work/data/valid.bin" "$out/tokens/valid.bin"
  head -c 64 "$work/text.txt" > "$out/tokens/raw.ids"
  for f in configs/*.json configs/*/*.json; do cp "$f" "$out/config/$(echo "$f" | tr / _)"; done
  printf '\x00\x00\x08\x01\x00\x00\x00\x04\x01\x02\x03\x09' > "$out/idx/labels.idx"                       # 4 labels
  printf '\x00\x00\x08\x03\x00\x00\x00\x01\x00\x00\x00\x02\x00\x00\x00\x02\x00\x7f\xff\x10' > "$out/idx/images.idx"  # 1 image of 2 x 2
  local en=(i you we see like the a cat dog house) fr=(je tu nous vois aime le un chat chien maison)
  for i in $(seq 0 39); do
    printf '%s %s.\t%s %s .\n' "${en[$((i % 10))]}" "${en[$((i * 7 % 10))]}" "${fr[$((i % 10))]}" "${fr[$((i * 7 % 10))]}"
  done > "$out/pairs/pairs.txt"
  cat > "$work/tiny.json" <<JSON
{"model": {"nb_layers": 1, "hidden_size": 8, "inner_hidden_size": 16, "nb_heads": 2, "attn_span": 16, "block_size": 8},
 "train": {"batch_size": 2, "nb_steps": 2, "eval_interval": 2, "eval_blocks": 1, "lr_warmup": 0}}
JSON
  "$cli" train -c "$work/tiny.json" --data "$work/data" --out "$work/run" --quiet > /dev/null 2>&1
  "$cli" train -c configs/gpt/demo.json --data "$work/data" --out "$work/gpt" --n_layer=1 --d_model=16 --n_head=2 \
    --context=16 --batch_size=2 --nb_steps=2 --eval_interval=2 --eval_blocks=1 --lr_warmup=0 --eval_batch_size=2 \
    --quiet > /dev/null 2>&1
  cp "$work/run/log.jsonl" "$out/jsonl/adaptive_span.jsonl"
  cp "$work/gpt/log.jsonl" "$out/jsonl/gpt.jsonl"
  cp "$work/run/checkpoint.pt" "$out/checkpoint/adaptive_span.pt"
  cp "$work/gpt/checkpoint.pt" "$out/checkpoint/gpt.pt"
  "$cli" export safetensors "$work/run" -o "$out/safetensors/adaptive_span.safetensors" > /dev/null
  "$cli" export safetensors "$work/gpt" -o "$out/safetensors/gpt.safetensors" > /dev/null
  rm -f "$out"/safetensors/*.json
  rm -rf "$work"
}

case "${1:-all}" in
  seeds)
    make_seeds "${2:?seeds DIR CLI}" "${3:?seeds DIR CLI}"
    exit 0 ;;
  replay)
    replay=${2:?replay FUZZ_REPLAY CLI} cli=${3:?replay FUZZ_REPLAY CLI}
    tmp=$(mktemp -d)
    trap 'rm -rf "$tmp"' EXIT
    make_seeds "$tmp" "$cli"
    for t in "${targets[@]}"; do
      inputs=("$tmp/$t")
      [ -d "tests/fuzz/crashes/$t" ] && inputs+=("tests/fuzz/crashes/$t")
      "$replay" "$t" "${inputs[@]}"
    done
    exit 0 ;;
esac

target=${1:-all} seconds=${2:-600}
if [ "$target" != all ] && [[ ! " ${targets[*]} " == *" $target "* ]]; then
  echo "fuzz: unknown target '$target' (${targets[*]}, all)" >&2; exit 2
fi
command -v clang++ > /dev/null || { echo "fuzz: needs clang++ (scripts/install-deps.sh installs clang)" >&2; exit 1; }
[ -x build/spanformer ] || bash scripts/build.sh
python="${SPANFORMER_VENV:-$PWD/.venv}/bin/python"
prefix=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
if [ ! -f build-fuzz/build.ninja ]; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$prefix" \
    -DSPANFORMER_FUZZ=ON -DSPANFORMER_SANITIZE=ON -DSPANFORMER_TESTS=OFF -DSPANFORMER_BENCH=OFF -DSPANFORMER_PYTHON=OFF > /dev/null
fi
ninja -C build-fuzz -j "$(nproc)" $(for t in "${targets[@]}"; do echo "fuzz_$t"; done)
rm -rf build-fuzz/seeds
make_seeds build-fuzz/seeds build/spanformer
[ "$target" = all ] && run=("${targets[@]}") || run=("$target")
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=0" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
for t in "${run[@]}"; do
  mkdir -p "build-fuzz/corpus/$t" "build-fuzz/crashes/$t"
  log="build-fuzz/fuzz_$t.log"
  touch "build-fuzz/.start_$t"
  set +e
  "build-fuzz/tests/fuzz/fuzz_$t" "build-fuzz/corpus/$t" "build-fuzz/seeds/$t" -max_total_time="$seconds" -rss_limit_mb=6144 \
    -timeout=60 -artifact_prefix="build-fuzz/crashes/$t/" -print_final_stats=1 > "$log" 2>&1
  status=$?
  set -e
  runs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | grep -oE '[0-9]+$' || echo "?")
  cov=$(grep -oE 'cov: [0-9]+ ft: [0-9]+' "$log" | tail -1 || echo "cov: ?")
  crashes=$(find "build-fuzz/crashes/$t" -type f -newer "build-fuzz/.start_$t" | wc -l)
  echo "fuzz $t: ${seconds} s, $runs executions, $cov, exit $status, $crashes new crashing inputs (log: $log)"
done
