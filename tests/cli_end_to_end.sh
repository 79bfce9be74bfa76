#!/usr/bin/env bash
# The user's path on real text: prepare, train, resume, evaluate, generate, draw the spans.
set -euo pipefail
bin="$1"; src="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
head -c 300000 "$src/../shared/data/dickens.txt" > "$tmp/dickens.txt"
"$bin" data prepare "$tmp/dickens.txt" --out "$tmp/data" --crlf-to-lf
cat > "$tmp/c.json" <<JSON
{"model": {"nb_layers": 2, "hidden_size": 32, "inner_hidden_size": 64, "nb_heads": 2, "attn_span": 64,
           "block_size": 32, "adapt_span_init": 0.2},
 "train": {"batch_size": 4, "nb_steps": 40, "eval_interval": 20, "eval_blocks": 4, "lr_warmup": 10}}
JSON
"$bin" --threads 2 train -c "$tmp/c.json" --data "$tmp/data" --out "$tmp/run" --stop-after 20 --quiet
"$bin" train -c "$tmp/c.json" --data "$tmp/data" --out "$tmp/run" --resume --quiet | tee "$tmp/train.out"
grep -q "trained 40 steps" "$tmp/train.out"
test "$(wc -l < "$tmp/run/log.jsonl")" -eq 2
"$bin" eval "$tmp/run" --split test --batch 4 | tee "$tmp/eval.out"
grep -qE "^test bpc [0-9]+\.[0-9]+" "$tmp/eval.out"
"$bin" generate "$tmp/run/checkpoint.pt" --prompt "It was the best of times" --tokens 50 --seed 3 > "$tmp/gen1"
"$bin" generate "$tmp/run/checkpoint.pt" --prompt "It was the best of times" --tokens 50 --seed 3 > "$tmp/gen2"
cmp "$tmp/gen1" "$tmp/gen2"   # seeded sampling is reproducible
test "$(wc -c < "$tmp/gen1")" -ge 70
"$bin" spans "$tmp/run" --out "$tmp/spans.png" | tee "$tmp/spans.out"
grep -q "layer  1" "$tmp/spans.out"
head -c 8 "$tmp/spans.png" | od -An -c | grep "P   N   G" > /dev/null
"$bin" attention "$tmp/run" --text "It was the best of times, it was the worst of times" --layer 1 --head 0 \
  -o "$tmp/att.png" | grep "drawn over distances" > /dev/null
head -c 8 "$tmp/att.png" | od -An -c | grep "P   N   G" > /dev/null
"$bin" bench -c "$tmp/c.json" --steps 2 --warmup 1 | grep "tokens/s" > /dev/null

# Distributed evaluation over two local processes gives the same figure.
one=$("$bin" eval "$tmp/run" --split test --batch 4 | awk '{print $3}')
two=$("$bin" eval "$tmp/run" --split test --batch 4 --nproc-per-node 2 | awk '{print $3}')
test "$one" = "$two"

# Fine-tuning: resume with a new learning rate and more steps (the optimizer state is kept).
"$bin" train -c "$tmp/c.json" --data "$tmp/data" --out "$tmp/run" --resume --lr=0.007 --nb_steps=60 --quiet \
  | grep "trained 60 steps" > /dev/null

# Ctrl-C: the run saves a checkpoint, exits 130, and the checkpoint resumes.
"$bin" train -c "$tmp/c.json" --data "$tmp/data" --out "$tmp/long" --nb_steps=100000 --eval_interval=100000 --quiet \
  > "$tmp/long.out" 2> "$tmp/long.err" &
pid=$!
for _ in $(seq 100); do grep -q "spanformer: config" "$tmp/long.out" 2>/dev/null && break; sleep 0.1; done
sleep 2
kill -INT "$pid"
rc=0; wait "$pid" || rc=$?
test "$rc" -eq 130
grep -q "checkpoint saved at step" "$tmp/long.err"
"$bin" eval "$tmp/long" --split valid --batch 2 | grep "valid bpc" > /dev/null
echo "cli end to end: 1 passed, 0 failed"
