#!/usr/bin/env bash
# Coverage-guided fuzzing of every reader of user files (targets in tests/fuzz, findings and
# figures in docs/reliability.md).
#
#   bash scripts/fuzz.sh [TARGET[,TARGET...]|all] [SECONDS]
#                                                build build-fuzz/ (clang, ASan + UBSan, libFuzzer), make
#                                                the seed corpora, then fuzz each target for SECONDS
#                                                (default 600; FUZZ_JOBS targets at a time, default 1)
#                                                and print its executions, coverage and findings;
#                                                crashing inputs land in build-fuzz/crashes/
#   bash scripts/fuzz.sh seeds DIR CLI           the seed corpora, DIR/<target>/, made on the spot with the
#                                                spanformer command CLI (small valid files: no blobs kept)
#   bash scripts/fuzz.sh replay FUZZ_REPLAY CLI  (CTest's fuzz.replay) every target over fresh seeds and
#                                                every kept crash, tests/fuzz/crashes/<target>/, each held
#                                                to its outcome in NAME.expect, in the normal build: seconds
# A crash found by fuzzing gets a fix and its input kept in tests/fuzz/crashes/<target>/ (named by what
# it broke) with NAME.expect beside it ("accepted", or "refused: <part of the message>"), so that the
# replay holds the fix and the outcome the fix chose.
set -euo pipefail
cd "$(dirname "$0")/.."
targets=(vocab config idx tokens pairs jsonl safetensors checkpoint reference xl_reference sentencepiece archive bpe)

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
  # JSON nesting 100,000 levels deep (a log line like it once crashed `report` in the serializer).
  { head -c 100000 /dev/zero | tr '\0' '['; head -c 100000 /dev/zero | tr '\0' ']'; echo; } > "$out/jsonl/deep.jsonl"
  { echo '{"model": '; head -c 100000 /dev/zero | tr '\0' '['; head -c 100000 /dev/zero | tr '\0' ']'; echo '}'; } > "$out/config/deep.json"
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
  # The references' state_dicts, exported from the tiny runs (the targets build the same configs).
  "$cli" export adaptive-span "$work/run" --out "$out/reference/adaptive_span.pt" > /dev/null
  cat > "$work/xl.json" <<JSON
{"arch": "xl", "model": {"n_layer": 1, "d_model": 8, "n_head": 2, "d_head": 4, "d_inner": 16, "tgt_len": 8, "mem_len": 8},
 "train": {"batch_size": 2, "nb_steps": 2, "eval_interval": 2, "eval_blocks": 1, "lr_warmup": 0}}
JSON
  "$cli" train -c "$work/xl.json" --data "$work/data" --out "$work/xl" --quiet > /dev/null 2>&1
  "$cli" export transformer-xl "$work/xl" --out "$out/xl_reference/transformer_xl.pt" > /dev/null
  # A SentencePiece model: a tiny seq2seq run with subwords, its model bytes taken from the safetensors
  # export's metadata (builds without SentencePiece keep that corpus empty).
  if "$cli" train -c configs/seq2seq/transformer.json --data "$out/pairs/pairs.txt" --out "$work/sp" \
      --tokenizer=sentencepiece --subword_vocab=40 --valid_pairs=4 --test_pairs=4 --d_model=16 --n_layer=1 --n_head=2 \
      --d_inner=32 --batch_size=4 --nb_steps=2 --eval_interval=2 --quiet > /dev/null 2>&1; then
    "$cli" export safetensors "$work/sp" -o "$work/sp.safetensors" > /dev/null
    python3 - "$work/sp.safetensors" "$out/sentencepiece/subwords.model" <<'PY'
import json, struct, sys
with open(sys.argv[1], "rb") as f:
    header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
open(sys.argv[2], "wb").write(bytes.fromhex(header["__metadata__"]["spanformer.vocab_model"]))
PY
  fi
  # A byte-level BPE tokenizer.json: the 256 byte tokens (GPT-2's byte-to-unicode characters), two merges
  # and an added token.
  python3 - "$out/bpe/tokenizer.json" <<'PY'
import json, sys
printable = [*range(33, 127), *range(161, 173), *range(174, 256)]
chars, n = {}, 256
for b in range(256):
    chars[b] = chr(b) if b in printable else chr(n)
    n += b not in printable
vocab = {chars[b]: b for b in range(256)}
vocab.update({"th": 256, "the": 257, "<|endoftext|>": 258})
json.dump({"model": {"type": "BPE", "vocab": vocab, "merges": ["t h", "th e"]},
           "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "use_regex": True},
           "added_tokens": [{"id": 258, "content": "<|endoftext|>"}]}, open(sys.argv[1], "w"))
PY
  # Archives: the member data get unpacks, deflated and stored.
  python3 - "$work/text.txt" "$out/archive" <<'PY'
import sys, zipfile
text = open(sys.argv[1], "rb").read()
for name, method in (("deflated.zip", zipfile.ZIP_DEFLATED), ("stored.zip", zipfile.ZIP_STORED)):
    with zipfile.ZipFile(f"{sys.argv[2]}/{name}", "w", method) as z:
        z.writestr("enwik8", text[:2000])
PY
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
      [ -d "tests/fuzz/crashes/$t" ] && inputs+=(--expect "tests/fuzz/crashes/$t")
      "$replay" "$t" "${inputs[@]}"
    done
    exit 0 ;;
esac

target=${1:-all} seconds=${2:-600}
[ "$target" = all ] && run=("${targets[@]}") || IFS=, read -r -a run <<< "$target"
for t in "${run[@]}"; do
  [[ " ${targets[*]} " == *" $t "* ]] || { echo "fuzz: unknown target '$t' (${targets[*]}, all)" >&2; exit 2; }
done
command -v clang++ > /dev/null || { echo "fuzz: needs clang++ (scripts/install-deps.sh installs clang)" >&2; exit 1; }
[ -x build/spanformer ] || bash scripts/build.sh
python="${SPANFORMER_VENV:-$PWD/.venv}/bin/python"
prefix=$("$python" -c 'import os, torch; print(os.path.dirname(torch.__file__))')
if [ ! -f build-fuzz/build.ninja ]; then
  CC=clang CXX=clang++ cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_PREFIX_PATH="$prefix" \
    -DSPANFORMER_FUZZ=ON -DSPANFORMER_SANITIZE=ON -DSPANFORMER_TESTS=OFF -DSPANFORMER_BENCH=OFF -DSPANFORMER_PYTHON=OFF > /dev/null
fi
# (the SentencePiece module too, where the build has it: the sentencepiece target opens it at run time)
ninja -C build-fuzz -j "$(nproc)" $(for t in "${targets[@]}"; do echo "fuzz_$t"; done) \
  $(ninja -C build-fuzz -t targets all 2>/dev/null | grep -o '^spanformer_sentencepiece:' | tr -d :)
rm -rf build-fuzz/seeds
make_seeds build-fuzz/seeds build/spanformer
export ASAN_OPTIONS="detect_leaks=0:allocator_may_return_null=0" UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
fuzz_one() {  # TARGET: one libFuzzer process for $seconds, then its summary line
  local t=$1 log status runs cov crashes
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
}
# FUZZ_JOBS targets at a time (default 1), each one process on one core.
for t in "${run[@]}"; do
  while [ "$(jobs -rp | wc -l)" -ge "${FUZZ_JOBS:-1}" ]; do wait -n; done
  fuzz_one "$t" &
done
wait
