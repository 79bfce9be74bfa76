#!/usr/bin/env bash
# The ecosystem's formats and the build record: safetensors export and import for every family, checked
# against an independent Python reader/writer (tests/python/safetensors_io.py); damaged safetensors
# files refused in one line; --version; the per-session record in a run directory.
set -euo pipefail
py="${SPANFORMER_PYTHON:-/usr/bin/python3}"  # a Python with torch (CTest passes the one whose LibTorch the build uses)
bin="$1"; src="$2"
st="$src/tests/python/safetensors_io.py"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/cli_checks.sh"

"$bin" --version | tee "$tmp/version"
grep -qE "^spanformer [0-9]+\.[0-9]+\.[0-9]+ \(commit ([0-9a-f]{12}(-dirty)?|unknown)\), LibTorch [0-9.]+.*, CUDA: " "$tmp/version"

printf 'In the beginning God created the heaven and the earth.\n%.0s' $(seq 1 400) > "$tmp/text.txt"
"$bin" data prepare "$tmp/text.txt" --out "$tmp/bytes" > /dev/null
head -n 300 "$src/../shared/data/wikitext-2/wiki.valid.tokens" > "$tmp/train.tokens"
head -n 100 "$src/../shared/data/wikitext-2/wiki.test.tokens" > "$tmp/test.tokens"
"$bin" data words --train "$tmp/train.tokens" --valid "$tmp/test.tokens" --test "$tmp/test.tokens" --out "$tmp/words" > /dev/null
cat > "$tmp/span.json" <<JSON
{"model": {"nb_layers": 2, "hidden_size": 16, "inner_hidden_size": 32, "nb_heads": 2, "attn_span": 32, "block_size": 16},
 "train": {"batch_size": 2, "nb_steps": 3, "eval_interval": 3, "eval_blocks": 2, "lr_warmup": 0}}
JSON
cat > "$tmp/xl.json" <<JSON
{"arch": "xl", "model": {"n_layer": 2, "d_model": 16, "n_head": 2, "d_head": 8, "d_inner": 32, "tgt_len": 8, "mem_len": 8,
 "adaptive": true, "cutoffs": [100], "div_val": 2},
 "train": {"batch_size": 2, "nb_steps": 3, "eval_interval": 3, "eval_segments": 2, "warmup_steps": 0}}
JSON

for family in span xl; do
  data=bytes; [ $family = xl ] && data=words
  "$bin" train -c "$tmp/$family.json" --data "$tmp/$data" --out "$tmp/$family" --quiet > /dev/null 2>&1
  # The run directory records each session: code version, commit, LibTorch, host, start, command line.
  $py -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; assert len(r)==1 and r[0]['step']==0 and \
r[0]['command'][1]=='train' and r[0]['host'] and r[0]['start'].endswith('Z') and r[0]['torch'], r" "$tmp/$family/sessions.jsonl"
  "$bin" export safetensors "$tmp/$family" -o "$tmp/$family.safetensors" | grep "config: $tmp/$family.json" > /dev/null
  $py "$st" check "$tmp/$family.safetensors"
  # Our file -> checkpoint -> the same evaluation, bit for bit.
  "$bin" import safetensors "$tmp/$family.safetensors" -o "$tmp/$family.pt" > /dev/null
  want=$("$bin" eval "$tmp/$family" --split test 2> /dev/null | cut -d'(' -f1)
  got=$("$bin" eval "$tmp/$family.pt" --data "$tmp/$data" --split test 2> /dev/null | cut -d'(' -f1)
  [ "$want" = "$got" ] || { echo "FAIL: $family eval after the round trip: $want vs $got"; exit 1; }
  # A file written by the independent Python writer (other values, other order) -> import -> export:
  # the same tensors, bit for bit.
  $py "$st" rewrite "$tmp/$family.safetensors" "$tmp/py.safetensors" 7
  "$bin" import safetensors "$tmp/py.safetensors" -o "$tmp/py.pt" > /dev/null 2> "$tmp/note"
  # No spanformer.sha256 in a file written elsewhere: one note, and the tensors taken as they are. With the
  # key kept while the values changed: refused.
  grep -q "^spanformer: note: .*py.safetensors carries no spanformer.sha256 checksum" "$tmp/note"
  $py "$st" rewrite "$tmp/$family.safetensors" "$tmp/stale.safetensors" 7 --keep-sum
  if "$bin" import safetensors "$tmp/stale.safetensors" -o "$tmp/stale.pt" > /dev/null 2> "$tmp/err"; then
    echo "FAIL: a stale spanformer.sha256 accepted"; exit 1; fi
  grep -q "do not match the spanformer.sha256 in its metadata" "$tmp/err"
  # Weights that overflow: a warning at import; eval refuses the non-finite result instead of printing it.
  $py "$st" huge "$tmp/$family.safetensors" "$tmp/huge.safetensors"
  "$bin" import safetensors "$tmp/huge.safetensors" -o "$tmp/huge.pt" > /dev/null 2> "$tmp/note" \
    || fail "import of finite, overflowing weights: $(cat "$tmp/note")"
  grep -q "^spanformer: warning: .*holds values up to 3e+38, beyond float16's range" "$tmp/note" \
    || fail "import warns of overflowing weights: $(cat "$tmp/note")"
  expect_error "(not finite): the model's weights overflow" "$bin" eval "$tmp/huge.pt" --data "$tmp/$data" --split test
  "$bin" export safetensors "$tmp/py.pt" -o "$tmp/again.safetensors" > /dev/null
  $py "$st" same "$tmp/py.safetensors" "$tmp/again.safetensors"
  # The exported config trains the same model.
  "$bin" train -c "$tmp/$family.json" --data "$tmp/$data" --out "$tmp/$family.init" --init "$tmp/py.pt" --nb_steps=1 \
    --quiet > /dev/null 2>&1
done

# Machine-readable results: eval --json (the same figure as the text line), kept in the run's eval.jsonl;
# spans --json.
text=$("$bin" eval "$tmp/span" --split test 2> /dev/null)
"$bin" eval "$tmp/span" --split test --json 2> /dev/null > "$tmp/eval.json"
$py - "$tmp/eval.json" "$text" "$tmp/span/eval.jsonl" <<'PY'
import json, sys
r = json.loads(open(sys.argv[1]).read())
assert r["split"] == "test" and r["unit"] == "bpc" and r["step"] == 3 and r["tokens"] > 0, r
assert f"test bpc {r['bpc']:.7f} " in sys.argv[2], (r, sys.argv[2])
kept = [json.loads(l) for l in open(sys.argv[3])]
assert len(kept) == 3 and kept[-1]["bpc"] == r["bpc"], kept  # the round-trip eval, the text one, this one
PY
"$bin" spans "$tmp/span" -o "$tmp/s.png" --json > "$tmp/spans.json"
$py -c "import json,sys; r=json.load(open(sys.argv[1])); assert len(r['spans'])==2 and len(r['spans'][0])==2 and \
r['span_limit']==32 and r['family']=='adaptive-span', r" "$tmp/spans.json"
test -s "$tmp/s.png"

# Damaged files: one line, non-zero exit, no checkpoint written.
for kind in hole overlap dtype header short flip vocab swap; do
  $py "$st" damage "$tmp/span.safetensors" "$tmp/bad.safetensors" $kind
  if "$bin" import safetensors "$tmp/bad.safetensors" -o "$tmp/bad.pt" > /dev/null 2> "$tmp/err"; then
    echo "FAIL: damaged safetensors ($kind) accepted"; exit 1; fi
  [ "$(grep -c . "$tmp/err")" -eq 1 ] && grep -q "^spanformer: error: .*bad.safetensors" "$tmp/err" && [ ! -e "$tmp/bad.pt" ] \
    || { echo "FAIL: damaged safetensors ($kind): $(cat "$tmp/err")"; exit 1; }
  echo "$kind: $(cat "$tmp/err")"
  case $kind in  # the header's own checksum catches what the data's cannot
    vocab|swap) grep -q "do not match the spanformer.header_sha256" "$tmp/err" \
                  || fail "an edited header refused by its checksum ($kind): $(cat "$tmp/err")" ;;
  esac
done
if "$bin" import safetensors "$tmp/span.safetensors" -o "$tmp/x.pt" --vocab "$tmp/bytes/vocab.txt" 2> "$tmp/err"; then
  echo "FAIL: --vocab accepted with safetensors"; exit 1; fi
echo "cli formats: passed"
