#!/usr/bin/env bash
# The Python reference's trained model through the command line: import, evaluate on its own token
# ids (its published figures), generate, fine-tune, export; and a wrong config refused clearly.
set -euo pipefail
bin="$1"; src="$2"
ref="$src/../shared/reference/adaptive-span-tiny"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cfg="$src/tests/data/adaptive_span_tiny.json"
py="${SPANFORMER_PYTHON:-/usr/bin/python3}"  # any Python 3 (CTest passes the build's)

"$bin" import adaptive-span "$ref/model.pt" --config "$cfg" --vocab "$ref/vocab.txt" --out "$tmp/tiny.pt"
check() {  # check SPLIT EXPECTED
  local got
  got=$("$bin" eval "$tmp/tiny.pt" --ids "$ref/$1.ids.u8" --vocab "$ref/vocab.txt" --batch 8 | awk '{print $3}')
  awk -v g="$got" -v w="$2" -v s="$1" 'BEGIN { d = g - w; if (d < 0) d = -d;
    if (d > 1e-4) { print "FAIL: " s " bpc " g ", the reference gives " w; exit 1 } print s " bpc " g " (reference " w ")" }'
}
check valid 3.5158603457646094
check test 3.5793226628927504

"$bin" generate "$tmp/tiny.pt" --prompt "It was" --tokens 40 --seed 1 > "$tmp/gen"
test "$(wc -c < "$tmp/gen")" -ge 40

# Export, re-import: the same figure (on the first 40000 valid ids: the weights either survive or not).
"$bin" export adaptive-span "$tmp/tiny.pt" --out "$tmp/exported.pt"
"$bin" import adaptive-span "$tmp/exported.pt" --config "$cfg" --vocab "$ref/vocab.txt" --out "$tmp/again.pt" > /dev/null
head -c 40000 "$ref/valid.ids.u8" > "$tmp/valid_head.ids.u8"
a=$("$bin" eval "$tmp/tiny.pt" --ids "$tmp/valid_head.ids.u8" | awk '{print $3}')
b=$("$bin" eval "$tmp/again.pt" --ids "$tmp/valid_head.ids.u8" | awk '{print $3}')
test "$a" = "$b"

# The same ids as the text they stand for (<eos> is a newline): eval --text tokenizes it with the byte vocabulary
# and gives the same figure; a byte outside the vocabulary, or --text with --ids, is one line.
"$py" -c 'import sys; v = open(sys.argv[1]).read().split("\n")[:-1]; ids = open(sys.argv[2], "rb").read()
open(sys.argv[3], "wb").write(bytes(10 if v[i] == "<eos>" else int(v[i]) for i in ids))' "$ref/vocab.txt" "$tmp/valid_head.ids.u8" "$tmp/valid_head.txt"
c=$("$bin" eval "$tmp/tiny.pt" --text "$tmp/valid_head.txt" | awk '{print $3}')
test "$a" = "$c" || { echo "FAIL: eval --text gives bpc $c, the same tokens as ids give $a"; exit 1; }
printf 'It was\xff' > "$tmp/bad.txt"
if "$bin" eval "$tmp/tiny.pt" --text "$tmp/bad.txt" 2> "$tmp/err"; then echo "FAIL: a byte outside the vocabulary accepted"; exit 1; fi
grep -q "bad.txt: byte 6 (0xff) is not in the checkpoint's vocabulary" "$tmp/err"
if "$bin" eval "$tmp/tiny.pt" --text "$tmp/valid_head.txt" --ids "$tmp/valid_head.ids.u8" 2> "$tmp/err"; then
  echo "FAIL: --text with --ids accepted"; exit 1; fi
grep -q "give one" "$tmp/err"

# Fine-tune the imported model on Dickens prepared the reference's way (same vocabulary).
"$bin" data prepare "$src/../shared/data/dickens.txt" --crlf-to-lf --out "$tmp/dickens" > /dev/null
cmp "$tmp/dickens/vocab.txt" "$ref/vocab.txt"
"$bin" train -c "$cfg" --data "$tmp/dickens" --init "$tmp/tiny.pt" --out "$tmp/ft" --nb_steps=3 --eval_interval=3 \
  --eval_blocks=2 --quiet | grep "trained 3 steps" > /dev/null

# Ids made with another vocabulary are refused.
"$bin" data prepare "$src/../shared/data/wikitext-2/wiki.valid.tokens" --out "$tmp/wiki" > /dev/null
if "$bin" eval "$tmp/tiny.pt" --ids "$ref/valid.ids.u8" --vocab "$tmp/wiki/vocab.txt" 2> "$tmp/err"; then
  echo "FAIL: wrong vocabulary accepted"; exit 1; fi
grep -q "is not the vocabulary of" "$tmp/err"

# A config that does not fit: one line naming the tensor.
if "$bin" import adaptive-span "$ref/model.pt" --config "$cfg" --vocab "$ref/vocab.txt" --out "$tmp/bad.pt" \
    --hidden_size=32 2> "$tmp/err"; then echo "FAIL: wrong config accepted"; exit 1; fi
test "$(grep -c . "$tmp/err")" -eq 1
grep -qE "error: .*'module\.[a-z_.0-9]+' has shape [0-9x]+, the config expects [0-9x]+" "$tmp/err"
test ! -e "$tmp/bad.pt"
if "$bin" import adaptive-span "$ref/model.pt" --config "$cfg" --vocab "$ref/vocab.txt" --out "$tmp/bad.pt" \
    --nb_layers=3 2> "$tmp/err"; then echo "FAIL: missing layer accepted"; exit 1; fi
grep -q "missing tensor 'module.layers.2" "$tmp/err"
if "$bin" import adaptive-span "$ref/model.pt" --config "$cfg" --vocab "$ref/vocab.txt" --out "$tmp/bad.pt" \
    --nb_layers=1 2> "$tmp/err"; then echo "FAIL: extra layer accepted"; exit 1; fi
grep -q "unexpected tensor 'module.layers.1" "$tmp/err"
echo "cli reference: 1 passed, 0 failed"
