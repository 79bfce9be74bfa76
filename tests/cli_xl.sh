#!/usr/bin/env bash
# The Transformer-XL / PAR path on real words (WikiText-2): prepare, train, resume, evaluate, search,
# draw, derive, train the derived model; and the family's user mistakes (one line, non-zero exit).
set -euo pipefail
py="${SPANFORMER_PYTHON:-/usr/bin/python3}"  # a Python with torch (CTest passes the one whose LibTorch the build uses)
bin="$1"; src="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/cli_checks.sh"
wt2="$src/../shared/data/wikitext-2"
head -n 600 "$wt2/wiki.valid.tokens" > "$tmp/train.tokens"
head -n 150 "$wt2/wiki.test.tokens" > "$tmp/test.tokens"
"$bin" data words --train "$tmp/train.tokens" --valid "$tmp/test.tokens" --test "$tmp/test.tokens" --out "$tmp/wt" \
  | tee "$tmp/prep.out"
grep -q "vocabulary" "$tmp/prep.out"
"$bin" data cutoffs "$tmp/wt" --coverage 0.6 --coverage 0.85 --round 100 | tee "$tmp/cut.out"
cutoffs=$(sed -n 's/^cutoffs \[\([^]]*\)\].*/\1/p' "$tmp/cut.out")
test -n "$cutoffs"
cat > "$tmp/xl.json" <<JSON
{"arch": "xl",
 "model": {"n_layer": 2, "d_model": 32, "n_head": 2, "d_head": 16, "d_inner": 64, "tgt_len": 16, "mem_len": 16,
           "adaptive": true, "cutoffs": [$cutoffs], "div_val": 2, "dropout": 0.1},
 "search": {"arch_freeze_steps": 4},
 "train": {"batch_size": 4, "nb_steps": 20, "eval_interval": 10, "eval_segments": 5, "lr": 0.003,
           "warmup_steps": 5, "eval_tgt_len": 8, "eval_mem_len": 24, "eval_same_length": true, "eval_batch_size": 4}}
JSON
"$bin" train -c "$tmp/xl.json" --data "$tmp/wt" --out "$tmp/txl" --stop-after 10 --quiet
"$bin" train -c "$tmp/xl.json" --data "$tmp/wt" --out "$tmp/txl" --resume --quiet | tee "$tmp/train.out"
grep -q "trained 20 steps" "$tmp/train.out"
test "$(wc -l < "$tmp/txl/log.jsonl")" -eq 2
"$bin" eval "$tmp/txl" --split test | tee "$tmp/eval.out"
grep -qE "^test ppl [0-9]+\.[0-9]+ .*mem_len 24, clamp_len 0, same_length true" "$tmp/eval.out"
"$bin" eval "$tmp/txl" --split test --eval_mem_len=8 | grep "mem_len 8" > /dev/null
"$bin" eval "$tmp/txl" --split test --json > "$tmp/eval.json"
eval_consistent "$tmp/eval.json"
"$bin" bench -c "$tmp/xl.json" --vocab_size=5000 --steps 1 --warmup 1 | grep "ms/step" > /dev/null
"$bin" bench -c "$tmp/xl.json" --vocab_size=5000 --steps 1 --warmup 1 --json 2> /dev/null > "$tmp/bench.json"
bench_plausible "$tmp/bench.json"
"$bin" bench -c "$tmp/xl.json" --vocab_size=5000 --mode eval --mem-len 32 --steps 1 --warmup 0 | grep "ms/token" > /dev/null
"$bin" bench -c "$tmp/xl.json" --vocab_size=5000 --mode eval --mem-len 32 --steps 1 --warmup 0 --json 2> /dev/null > "$tmp/bench.json"
bench_plausible "$tmp/bench.json"

# The engine's commands serve this family too: sampling with memories (words out), the log-probability
# dump (one per scored token, summing to the reported NLL), the best-validation checkpoint, --init.
"$bin" generate "$tmp/txl" --prompt "the" --tokens 12 --top-p 0.9 --seed 3 > "$tmp/gen.out"
test "$(wc -w < "$tmp/gen.out")" -ge 10
"$bin" generate "$tmp/txl" --prompt "the" --tokens 12 --top-p 0.9 --seed 3 | cmp -s - "$tmp/gen.out"
"$bin" eval "$tmp/txl" --split test --dump-logprobs "$tmp/lp.txt" | tee "$tmp/eval_lp.out"
n=$(grep -oE "[0-9]+ tokens," "$tmp/eval_lp.out" | head -1 | grep -oE "[0-9]+")
test "$(wc -l < "$tmp/lp.txt")" -eq "$n"
"$py" - "$tmp/lp.txt" "$tmp/eval_lp.out" <<'PY'
import math, re, sys
lp = [float(x) for x in open(sys.argv[1])]
nll = float(re.search(r"nll ([0-9.]+) nats", open(sys.argv[2]).read()).group(1))
assert abs(-sum(lp) / len(lp) - nll) < 1e-5, (-sum(lp) / len(lp), nll)
PY
test -f "$tmp/txl/best.pt"
# Every key of both families' configs is listed with a type, a default and a meaning.
for arch in adaptive-span xl; do
  "$bin" config keys --arch $arch | tail -n +2 | awk 'NF < 4 { print "no help: " $0; bad = 1 } END { exit bad }'
done
"$bin" config keys --arch xl | grep "^train.lr_warmup" > /dev/null
"$bin" eval "$tmp/txl/best.pt" --split test | grep "^test ppl" > /dev/null
"$bin" train -c "$tmp/xl.json" --data "$tmp/wt" --out "$tmp/init" --init "$tmp/txl" --nb_steps=2 --quiet | grep "trained 2 steps" > /dev/null

# Adaptive span inside Transformer-XL attention: trains, logs spans, draws them, evaluates, samples.
"$bin" train -c "$tmp/xl.json" --data "$tmp/wt" --out "$tmp/span" --nb_steps=4 --eval_interval=2 --adapt_span=true \
  --adapt_span_init=0.2 --adapt_span_loss=0.001 --quiet > /dev/null
grep -q '"span_mean"' "$tmp/span/log.jsonl"
"$bin" spans "$tmp/span" -o "$tmp/span.png" | tee "$tmp/spans.out"
test "$(grep -c '^layer' "$tmp/spans.out")" -eq 2
picture_drawn "$tmp/span.png"
"$bin" eval "$tmp/span" --split test | grep "^test ppl" > /dev/null
"$bin" generate "$tmp/span" --prompt "the" --tokens 5 --seed 1 > /dev/null
"$bin" attention "$tmp/span" --text "the game 's first season was played in the" -o "$tmp/att.png" | grep "drawn over" > /dev/null
"$bin" attention "$tmp/txl" --text "the game 's first season" --layer 1 --head 0 -o "$tmp/att1.png" | grep "drawn over" > /dev/null
picture_drawn "$tmp/att.png" "$tmp/att1.png"
if "$bin" train -c "$tmp/xl.json" --data "$tmp/wt" --out "$tmp/e10" --adapt_span=true --ext_len=4 2> "$tmp/err"; then
  echo "FAIL: ext_len with adapt_span accepted"; exit 1; fi
grep -q "ext_len > 0 with adapt_span is not supported" "$tmp/err"

# Weights in kimiyoung/transformer-xl's MemTransformerLM layout: export, load into an independent Python
# model with those module names (strict), the same log-probabilities there, its own state_dict imported
# back, the same figures again. Two layouts: div_val 2 with tied weights and projections; div_val 1 with
# d_embed != d_model, untied r biases, pre-norm, untied output weights and a clamp.
V=$(wc -l < "$tmp/wt/words.txt")
roundtrip() {  # roundtrip NAME RUN_DIR PYTHON_CONFIG_JSON OVERRIDES...
  local name="$1" run="$2" pyconf="$3"; shift 3
  echo "$pyconf" > "$tmp/$name.py.json"
  "$bin" export transformer-xl "$run" -o "$tmp/$name.state.pt" | grep "exported" > /dev/null
  "$bin" eval "$run" --split test --batch 1 --dump-logprobs "$tmp/$name.lp" > /dev/null
  "$py" "$src/tests/xl_reference.py" "$tmp/$name.py.json" "$tmp/$name.state.pt" "$tmp/wt/test.bin" \
    "$tmp/$name.py.lp" "$tmp/$name.py.state.pt"
  "$bin" import transformer-xl "$tmp/$name.py.state.pt" -c "$tmp/xl.json" --vocab "$tmp/wt/words.txt" \
    --vocab-level word -o "$tmp/$name.back.pt" "$@" > /dev/null
  "$bin" eval "$tmp/$name.back.pt" --data "$tmp/wt" --split test --batch 1 --dump-logprobs "$tmp/$name.back.lp" "$@" > /dev/null
  cmp "$tmp/$name.lp" "$tmp/$name.back.lp"
  # float32 on both sides, other operation orders: 1e-4 nats per token (a wrong tensor moves them by ~1)
  paste "$tmp/$name.lp" "$tmp/$name.py.lp" | awk -v n="$name" '{ d = $1 - $2; if (d < 0) d = -d; if (d > m) m = d; c++ }
    END { if (c < 100 || m > 1e-4) { print "FAIL: " n ": " c " tokens, max |diff| " m; exit 1 }
          print "transformer-xl layout " n ": " c " tokens, max |log p diff| vs Python " m }'
}
roundtrip tied "$tmp/txl" "{\"n_layer\": 2, \"d_model\": 32, \"n_head\": 2, \"d_head\": 16, \"d_inner\": 64, \"d_embed\": 32,
  \"div_val\": 2, \"cutoffs\": [$cutoffs], \"vocab\": $V, \"tie_weight\": true, \"tie_projs\": true, \"untie_r\": false,
  \"pre_lnorm\": false, \"tgt_len\": 8, \"mem_len\": 24, \"clamp_len\": 0, \"same_length\": true}"
untied=(--div_val=1 --d_embed=24 --untie_r=true --pre_lnorm=true --tie_weight=false --eval_clamp_len=6
        --eval_same_length=false)
"$bin" train -c "$tmp/xl.json" --data "$tmp/wt" --out "$tmp/untied" --nb_steps=2 "${untied[@]}" --quiet > /dev/null
roundtrip untied "$tmp/untied" "{\"n_layer\": 2, \"d_model\": 32, \"n_head\": 2, \"d_head\": 16, \"d_inner\": 64, \"d_embed\": 24,
  \"div_val\": 1, \"cutoffs\": [$cutoffs], \"vocab\": $V, \"tie_weight\": false, \"tie_projs\": true, \"untie_r\": true,
  \"pre_lnorm\": true, \"tgt_len\": 8, \"mem_len\": 24, \"clamp_len\": 6, \"same_length\": false}" "${untied[@]}"

# The PAR search, its picture, the derived model.
"$bin" train -c "$tmp/xl.json" --data "$tmp/wt" --out "$tmp/par" --search=true --quiet | grep "trained 20 steps" > /dev/null
grep -q '"probs"' "$tmp/par/log.jsonl"
"$bin" par plot "$tmp/par" --out "$tmp/search.png" | grep "2 records, 4 blocks" > /dev/null
picture_drawn "$tmp/search.png"
"$py" -c 'import json, sys; d = json.load(open(sys.argv[1]))
assert len(d["steps"]) == 2 and len(d["probs"]) == 2 and len(d["probs"][0]) == 4, d
assert all(abs(sum(p) - 1) < 1e-5 for rec in d["probs"] for p in rec), d["probs"]' "$tmp/search.json"
"$bin" par derive "$tmp/par" --rule argmax --out "$tmp/derived_argmax.json" > "$tmp/argmax.out" 2> "$tmp/argmax.err"
grep -q "derived layers" "$tmp/argmax.out"
# A derived model without attention is announced (it cannot look back); one with attention is not.
if grep -q ", 0 attention)" "$tmp/argmax.out"; then
  grep -q "warning: the derived model has no attention block" "$tmp/argmax.err" \
    || { echo "FAIL: the warning of a derived model without attention"; exit 1; }
elif grep -q "warning" "$tmp/argmax.err"; then echo "FAIL: warning for a model with attention"; exit 1; fi
"$bin" par derive "$tmp/par" --ratio 2 --out "$tmp/derived.json" 2> "$tmp/ratio.err" | tee "$tmp/derive.out"
# The ratio rule keeps attention blocks (one in three here), so it must derive silently.
if grep -q ", 0 attention)" "$tmp/derive.out"; then echo "FAIL: --ratio 2 derived no attention"; exit 1; fi
if grep -q "warning" "$tmp/ratio.err"; then echo "FAIL: warning for a model with attention: $(cat "$tmp/ratio.err")"; exit 1; fi
grep -q '"search": false' "$tmp/derived.json"
"$bin" train -c "$tmp/derived.json" --data "$tmp/wt" --out "$tmp/derived" --nb_steps=10 --quiet | grep "trained 10 steps" > /dev/null
"$bin" eval "$tmp/derived" --split test | grep "^test ppl" > /dev/null

# Mistakes.
expect_error() {  # expect_error "message part" command...
  local want="$1"; shift
  local rc=0
  "$@" > "$tmp/out" 2> "$tmp/err" || rc=$?
  if [ "$rc" -eq 0 ] || [ "$(grep -c . "$tmp/err")" -ne 1 ] || ! grep -q "^spanformer: error: .*$want" "$tmp/err"; then
    echo "FAIL: $* (rc $rc) -> $(cat "$tmp/err")"; exit 1
  fi
}
expect_error "unknown block 'x'" "$bin" train -c "$tmp/xl.json" --data "$tmp/wt" --out "$tmp/e1" --layers=afxf
expect_error "strictly increasing" "$bin" train -c "$tmp/xl.json" --data "$tmp/wt" --out "$tmp/e2" '--cutoffs=[200,100]'
expect_error "out of range" "$bin" train -c "$tmp/xl.json" --data "$tmp/wt" --out "$tmp/e3" '--cutoffs=[100,1000000]'
expect_error "tau0 and tau1 must be positive" "$bin" train -c "$tmp/xl.json" --data "$tmp/wt" --out "$tmp/e4" --search=true --tau1=0
expect_error "not a super-network" "$bin" par derive "$tmp/txl" --out "$tmp/e5.json"
expect_error "learns no spans (adapt_span is off)" "$bin" spans "$tmp/txl"
expect_error "the xl family has no export to adaptive-span" "$bin" export adaptive-span "$tmp/txl" -o "$tmp/x.pt"
expect_error "'layers.0.pos_ff.CoreNet.0.weight' has shape 64x32, the config expects 48x32" "$bin" import transformer-xl \
  "$tmp/tied.state.pt" -c "$tmp/xl.json" --vocab "$tmp/wt/words.txt" --vocab-level word -o "$tmp/e8.pt" --d_inner=48
expect_error "missing tensor 'layers.0.dec_attn.r_w_bias'" "$bin" import transformer-xl "$tmp/tied.state.pt" \
  -c "$tmp/xl.json" --vocab "$tmp/wt/words.txt" --vocab-level word -o "$tmp/e8.pt" --untie_r=true
expect_error "differs from 'word_emb.emb_layers.0.weight', which this config ties" "$bin" import transformer-xl \
  "$tmp/untied.state.pt" -c "$tmp/xl.json" --vocab "$tmp/wt/words.txt" --vocab-level word -o "$tmp/e8.pt" \
  "${untied[@]}" --tie_weight=true
expect_error "block order (af)^n_layer" "$bin" export transformer-xl "$tmp/derived" -o "$tmp/e9.pt"
expect_error "another model" "$bin" train -c "$tmp/xl.json" --data "$tmp/wt" --out "$tmp/txl" --resume --d_inner=48
expect_error "another model: d_model" "$bin" eval "$tmp/txl" --d_model=8
expect_error "train split is not on this machine" "$bin" data words "$wt2" --out "$tmp/e6"
expect_error "no search records" "$bin" par plot "$tmp/txl" --out "$tmp/e7.png"
printf '{"step": 5, "probs": []}\n' > "$tmp/empty_probs.jsonl"
expect_error "the search record at step 5 has no block probabilities" "$bin" par plot "$tmp/empty_probs.jsonl" --out "$tmp/e7.png"
printf '{"step": 5, "probs": [[0.5, 0.5]]}\n' > "$tmp/short_probs.jsonl"
expect_error "a block without its three probabilities" "$bin" par plot "$tmp/short_probs.jsonl" --out "$tmp/e7.png"
for f in e5.json e7.png e8.pt e9.pt; do  # a refused command writes nothing
  if [ -e "$tmp/$f" ]; then echo "FAIL: $f written by a refused command"; exit 1; fi
done
test "$(find "$tmp" -name '*.tmp.*' | wc -l)" -eq 0
echo "cli xl: passed"
