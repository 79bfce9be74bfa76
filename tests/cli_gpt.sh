#!/usr/bin/env bash
# The GPT family through the engine's commands: every attention trains, resumes, evaluates (sliding
# window), generates with the KV cache and benchmarks; spans of the adaptive-span model; safetensors
# round trip; the attention race script end to end; word-level data; the family's user mistakes (one
# line, non-zero exit).
set -euo pipefail
py="${SPANFORMER_PYTHON:-/usr/bin/python3}"  # a Python with torch (CTest passes the one whose LibTorch the build uses)
bin="$1"; src="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/cli_checks.sh"
head -c 200000 "$src/../shared/data/dickens.txt" > "$tmp/text.txt"
"$bin" data prepare "$tmp/text.txt" --out "$tmp/data" > /dev/null 2>&1
"$bin" config keys --arch gpt | grep "model.attention" > /dev/null
small=(--n_layer=2 --d_model=32 --n_head=2 --context=64 --batch_size=4 --nb_steps=20 --eval_interval=10
       --eval_blocks=2 --lr_warmup=2 --eval_batch_size=4)
for attention in dense flash window adaptive_span sparse_strided sparse_fixed lsh; do
  run="$tmp/$attention"
  extra=(); [ "$attention" = lsh ] && extra=(--reversible=true --ff_chunks=2)  # the Reformer's three parts
  "$bin" train -c "$src/configs/gpt/demo.json" --data "$tmp/data" --out "$run" "${small[@]}" --attention=$attention \
    --window=16 --adapt_span_init=0.2 --sparse_combine=per_head --lsh_chunk=8 "${extra[@]}" --stop-after 10 --quiet > /dev/null
  "$bin" train -c "$src/configs/gpt/demo.json" --data "$tmp/data" --out "$run" "${small[@]}" --attention=$attention \
    --window=16 --adapt_span_init=0.2 --sparse_combine=per_head --lsh_chunk=8 "${extra[@]}" --resume --quiet | tee "$tmp/train.out"
  grep -q "trained 20 steps" "$tmp/train.out"
  test "$(wc -l < "$run/log.jsonl")" -eq 2
  "$bin" eval "$run" --split test --json > "$tmp/eval.json"
  eval_consistent "$tmp/eval.json"
  "$py" - "$tmp/eval.json" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
# 90 symbols: uniform guessing is 6.49 bits; 20 steps reach 5.84 with every attention (2026-11-28)
assert 0 < r["bpc"] < 6.2 and r["tokens"] > 0 and "stride 32" in r["protocol"], ("bpc of a trained byte model", r)
PY
  # Every target scored once: the dump has one log-probability per token and sums to the NLL.
  "$bin" eval "$run" --split test --eval_stride=7 --dump-logprobs "$tmp/lp.txt" --json > "$tmp/eval7.json"
  "$py" - "$tmp/eval7.json" "$tmp/lp.txt" <<'PY'
import json, sys
r = json.load(open(sys.argv[1])); lp = [float(l) for l in open(sys.argv[2])]
assert len(lp) == r["tokens"], ("one log-probability per token", len(lp), r["tokens"])
assert abs(-sum(lp) / len(lp) - r["nll"]) < 1e-6, ("the dump sums to the NLL", sum(lp), r)
PY
  "$bin" generate "$run" --prompt "It was the" --tokens 150 --seed 4 > "$tmp/gen.out"
  test "$(wc -c < "$tmp/gen.out")" -ge 140 || fail "150 tokens generated: $(wc -c < "$tmp/gen.out") bytes"
  "$bin" generate "$run" --prompt "It was the" --tokens 150 --seed 4 | cmp -s - "$tmp/gen.out" \
    || fail "the same seed gives the same sample ($attention)"
  "$bin" generate "$run" --prompt "It was the" --tokens 150 --seed 5 > "$tmp/gen5.out"
  differ "$tmp/gen.out" "$tmp/gen5.out" "--seed changes the sample ($attention)"
done
# dense and flash are one function of the same weights: a dense run evaluates identically under flash
# (to float rounding: the figures agree to the printed 4 decimals), and LSH evaluates with more rounds.
diff <("$bin" eval "$tmp/dense" | sed 's/; [0-9.]* s)//') <("$bin" eval "$tmp/dense" --attention=flash | sed 's/; [0-9.]* s)//')
# More hash rounds score the same text differently (each round its own random rotations).
"$bin" eval "$tmp/lsh" --split test --json > "$tmp/lsh1.json"
"$bin" eval "$tmp/lsh" --split test --lsh_hashes=4 --json > "$tmp/lsh4.json"
eval_consistent "$tmp/lsh4.json"
if [ "$("$py" -c 'import json, sys; print(json.load(open(sys.argv[1]))["nll"] == json.load(open(sys.argv[2]))["nll"])' "$tmp/lsh1.json" "$tmp/lsh4.json")" = True ]; then
  fail "--lsh_hashes changes the figure: $(cat "$tmp/lsh4.json")"
fi
"$bin" spans "$tmp/adaptive_span" -o "$tmp/spans.png" | grep "layer  1" > /dev/null
# Attention pictures of a text: the window model weighs distances 0 .. 15 only; lsh has no one matrix.
"$bin" attention "$tmp/window" --text "It was the best of times, it was the worst of times, it was the age" \
  -o "$tmp/att.png" | grep "over distances 0 .. 15 in" > /dev/null
"$bin" attention "$tmp/dense" --text "It was the best of times" --layer 0 -o "$tmp/att_heads.png" > /dev/null
picture_drawn "$tmp/att.png" "$tmp/att_heads.png"
if "$bin" attention "$tmp/lsh" --text "It was" -o "$tmp/x.png" 2> "$tmp/err"; then echo "FAIL: lsh picture"; exit 1; fi
test "$(grep -c . "$tmp/err")" -eq 1
grep -q "lsh attention has no one weight matrix" "$tmp/err"
if "$bin" attention "$tmp/dense" --text "It was" --layer 9 -o "$tmp/x.png" 2> "$tmp/err"; then echo "FAIL: --layer 9"; exit 1; fi
grep -q "layer must be in" "$tmp/err"
picture_drawn "$tmp/spans.png"
"$bin" spans "$tmp/dense" -o "$tmp/none.png" 2> "$tmp/err" && exit 1
grep -q "^spanformer: error: " "$tmp/err"

# safetensors round trip: the imported checkpoint evaluates to the same figure.
"$bin" export safetensors "$tmp/window/checkpoint.pt" -o "$tmp/w.safetensors" > /dev/null
"$bin" import safetensors "$tmp/w.safetensors" -o "$tmp/w.pt" > /dev/null
diff <("$bin" eval "$tmp/window/checkpoint.pt" | sed 's/; [0-9.]* s)//') <("$bin" eval "$tmp/w.pt" | sed 's/; [0-9.]* s)//')

# Benchmarks print figures that hold together (throughput = the step's tokens over its time).
"$bin" bench -c "$src/configs/gpt/demo.json" "${small[@]}" --steps 1 --warmup 0 | grep "ms/step" > /dev/null
"$bin" bench -c "$src/configs/gpt/demo.json" "${small[@]}" --steps 1 --warmup 0 --json 2> /dev/null > "$tmp/bench.json"
bench_plausible "$tmp/bench.json"
"$bin" bench -c "$src/configs/gpt/demo.json" "${small[@]}" --mode eval --attention=adaptive_span --span-dist bimodal \
  --steps 1 --warmup 0 --json 2> /dev/null > "$tmp/bench.json"
"$py" -c 'import json, sys; sys.exit(json.load(open(sys.argv[1]))["attention"] != "adaptive_span")' "$tmp/bench.json" \
  || fail "bench runs the asked attention: $(cat "$tmp/bench.json")"
bench_plausible "$tmp/bench.json"
"$bin" bench -c "$src/configs/gpt/demo.json" "${small[@]}" --mode generate --steps 1 --warmup 0 | grep "with the KV cache" > /dev/null
"$bin" bench -c "$src/configs/gpt/demo.json" "${small[@]}" --mode generate --steps 1 --warmup 0 --json 2> /dev/null > "$tmp/bench.json"
bench_plausible "$tmp/bench.json"
"$bin" bench -c "$src/configs/gpt/demo.json" "${small[@]}" --mode generate --tokens 5 --steps 1 --warmup 0 2> /dev/null \
  | grep "tokens 60 .. 64 after a prompt of 59" > /dev/null
"$bin" bench -c "$src/configs/gpt/demo.json" "${small[@]}" --mode generate --batch 3 --tokens 5 --recompute 0 --steps 1 \
  --warmup 0 --json 2> /dev/null > "$tmp/bench.json"
"$py" -c 'import json, sys; r = json.load(open(sys.argv[1])); sys.exit(not (r["batch"] == 3 and r["prefill_tokens_per_s"] > 0
          and r["cached_tokens_per_s"] > 0 and r["recomputed_tokens_per_s"] is None))' "$tmp/bench.json" \
  || fail "bench --mode generate --batch 3 times prefill and 3 rows: $(cat "$tmp/bench.json")"

# The attention race runs end to end (a tiny model, the 100-step minimum) and refuses to overwrite.
BUILD="$(dirname "$bin")" ATTENTIONS="window adaptive_span" OVERRIDES="${small[*]}" bash "$src/bench/attention_race.sh" "$tmp/data" 0.001 "$tmp/race" \
  > "$tmp/race.out" 2>&1
grep -q "^| adaptive_span | " "$tmp/race.out"
picture_drawn "$tmp/race/adaptive_span/spans.png"
"$py" - "$tmp/race/results.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["attention"] for r in rows] == ["window", "adaptive_span"], rows
# 100 steps: 4.23 (window) and 4.22 (adaptive span) bits, 2026-11-28; the unigram statistics alone give ~4.4
assert all(r["steps"] == 100 and 0 < r["test_bpc"] < 4.6 for r in rows), rows
PY
if BUILD="$(dirname "$bin")" ATTENTIONS=window bash "$src/bench/attention_race.sh" "$tmp/data" 0.001 "$tmp/race" 2> "$tmp/err"; then echo "FAIL: race overwrote"; exit 1; fi
grep -q "exists" "$tmp/err"

# Word-level data (WikiText-2 lines) train the same way, reported in perplexity.
wt2="$src/../shared/data/wikitext-2"
head -n 400 "$wt2/wiki.valid.tokens" > "$tmp/w.train"; head -n 100 "$wt2/wiki.test.tokens" > "$tmp/w.test"
"$bin" data words --train "$tmp/w.train" --valid "$tmp/w.test" --test "$tmp/w.test" --out "$tmp/words" > /dev/null
"$bin" train -c "$src/configs/gpt/demo.json" --data "$tmp/words" --out "$tmp/wrun" "${small[@]}" --quiet | grep "ppl" > /dev/null
"$bin" eval "$tmp/wrun" --split test > "$tmp/weval.txt"
"$bin" eval "$tmp/wrun" --split test --json > "$tmp/weval.json"
eval_consistent "$tmp/weval.json"
printed_figure "$tmp/weval.txt" "^test ppl ([0-9.]+)" "$("$py" -c 'import json, sys; print(repr(json.load(open(sys.argv[1]))["ppl"]))' "$tmp/weval.json")" \
  "the printed test ppl is eval --json's"

# Mistakes: one line, non-zero exit.
expect_error "attention must be dense, flash, window, adaptive_span, sparse_strided, sparse_fixed or lsh (got 'flashy')" "$bin" train -c "$src/configs/gpt/demo.json" --data "$tmp/data" --out "$tmp/bad" --attention=flashy
expect_error "more than this machine's" "$bin" train -c "$src/configs/gpt/demo.json" --data "$tmp/data" --out "$tmp/bad" --context=100000000
expect_error "d_model (30) must be a multiple of n_head (4)" "$bin" train -c "$src/configs/gpt/demo.json" --data "$tmp/data" --out "$tmp/bad" --d_model=30
expect_error "is for another model: n_layer 3 vs 2" "$bin" eval "$tmp/dense" --n_layer=3
expect_error "is for another model: attention \"lsh\" vs \"dense\"" "$bin" eval "$tmp/dense" --attention=lsh
expect_error "the gpt family has no architecture search" "$bin" par derive "$tmp/dense" --out "$tmp/bad.json"
expect_error "data/valid.bin is too short for contexts of 20000 tokens" "$bin" train -c "$src/configs/gpt/demo.json" --data "$tmp/data" --out "$tmp/bad" "${small[@]}" --context=20000 --attention=window --window=16
expect_error "lsh_buckets must be even and >= 2" "$bin" train -c "$src/configs/gpt/demo.json" --data "$tmp/data" --out "$tmp/bad" --attention=lsh --lsh_buckets=3
expect_error "--span and --span-dist need model.attention = adaptive_span" "$bin" bench -c "$src/configs/gpt/demo.json" --span 10 --steps 1
expect_error "the xl family has no bench --mode generate" "$bin" bench -c "$src/configs/xl/wt2_demo.json" --mode generate --steps 1
expect_error "bench --tokens 64: must be below the context 64" "$bin" bench -c "$src/configs/gpt/demo.json" "${small[@]}" --mode generate --tokens 64
expect_error "bench: --tokens is for --mode generate" "$bin" bench -c "$src/configs/gpt/demo.json" "${small[@]}" --tokens 5
expect_error "bench: --dtype is for --mode generate (training: train.amp)" "$bin" bench -c "$src/configs/gpt/demo.json" "${small[@]}" --dtype bfloat16
expect_error "bench: --dtype must be float32 or bfloat16 (got 'float16')" "$bin" bench -c "$src/configs/gpt/demo.json" "${small[@]}" --mode generate --dtype float16
expect_error "bench: --recompute must be 0 or 1 (got 2)" "$bin" bench -c "$src/configs/gpt/demo.json" "${small[@]}" --mode generate --recompute 2
expect_error "bench: --batch must be >= 1 (got 0)" "$bin" bench -c "$src/configs/gpt/demo.json" "${small[@]}" --mode generate --batch 0
expect_error "bench: --batch is for --mode generate (training: train.batch_size)" "$bin" bench -c "$src/configs/gpt/demo.json" "${small[@]}" --batch 8
# Each family's bench settings come from the family table: another family's setting is one line naming
# the settings this family has; values are checked before anything is built.
expect_error "bench: --mem-len is not a setting of the gpt family (its settings: --span, --span-dist, --tokens, --dtype, --recompute, --batch)" \
  "$bin" bench -c "$src/configs/gpt/demo.json" --mem-len 16 --steps 1
expect_error "bench: --span is not a setting of the vit family (it has none beyond --mode, --steps, --warmup and --json)" \
  "$bin" bench -c "$src/configs/vit/fashion_mnist.json" --span 16 --steps 1
expect_error "bench: --span must be a number (got 'wide')" "$bin" bench -c "$src/configs/gpt/demo.json" --attention=adaptive_span --span wide --steps 1
expect_error "bench: --span-dist must be bimodal (got 'flat')" "$bin" bench -c "$src/configs/gpt/demo.json" --attention=adaptive_span --span-dist flat --steps 1
expect_error "bench: --tokens must be >= 1 (got 0)" "$bin" bench -c "$src/configs/gpt/demo.json" "${small[@]}" --mode generate --tokens 0
expect_error "bench: --mem-len and --tgt-len are for --mode eval" "$bin" bench -c "$src/configs/xl/wt2_demo.json" --mem-len 16 --steps 1
echo "cli gpt: passed"
