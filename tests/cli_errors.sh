#!/usr/bin/env bash
# Every user mistake gives exactly one line "spanformer: error: ..." on stderr, a non-zero exit, no
# stack trace and no output file.
set -u
bin="$1"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
passed=0

expect_error() {  # expect_error "what is expected in the message" command...
  local want="$1"; shift
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  local lines
  lines=$(grep -c . "$tmp/err")
  if [ "$rc" -eq 0 ] || [ "$lines" -ne 1 ] || ! grep -q "^spanformer: error: .*$want" "$tmp/err" \
      || grep -qiE "terminate|backtrace|frame #|Exception raised" "$tmp/err"; then
    echo "FAIL: $* (rc $rc) -> $(cat "$tmp/err")"
    failures=$((failures + 1))
  else
    passed=$((passed + 1))
  fi
}

printf 'In the beginning God created the heaven and the earth.\n%.0s' $(seq 1 400) > "$tmp/text.txt"
"$bin" data prepare "$tmp/text.txt" --out "$tmp/data" > /dev/null 2>&1 || { echo "FAIL: prepare"; exit 1; }
cat > "$tmp/tiny.json" <<JSON
{"model": {"nb_layers": 1, "hidden_size": 8, "inner_hidden_size": 16, "nb_heads": 2, "attn_span": 16, "block_size": 8},
 "train": {"batch_size": 2, "nb_steps": 2, "eval_interval": 2, "eval_blocks": 1, "lr_warmup": 0}}
JSON
"$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/run" --quiet > /dev/null 2>&1 || { echo "FAIL: tiny train"; exit 1; }

: > "$tmp/empty.txt"
expect_error "file not found" "$bin" data prepare "$tmp/missing.txt" --out "$tmp/d1"
expect_error "is empty" "$bin" data prepare "$tmp/empty.txt" --out "$tmp/d2"
expect_error "prepared data directory" "$bin" train -c "$tmp/tiny.json" --data "$tmp/nowhere" --out "$tmp/r1"
cp -r "$tmp/data" "$tmp/broken"; : > "$tmp/broken/train.bin"
expect_error "train.bin is empty" "$bin" train -c "$tmp/tiny.json" --data "$tmp/broken" --out "$tmp/r2"
head -c 30 "$tmp/data/valid.bin" > "$tmp/broken/valid.bin"; cp "$tmp/data/train.bin" "$tmp/broken/train.bin"
expect_error "truncated or corrupt" "$bin" train -c "$tmp/tiny.json" --data "$tmp/broken" --out "$tmp/r3"
expect_error "unknown config key 'nb_layer'" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r4" --nb_layer=2
expect_error "divisible by nb_heads" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r5" --hidden_size=9
expect_error "attn_span must be at least 1" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r6" --attn_span=0
expect_error "must be positive" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r7" --block_size=-4
expect_error "file not found" "$bin" train -c "$tmp/none.json" --data "$tmp/data" --out "$tmp/r8"
echo '{"model": {' > "$tmp/bad.json"
expect_error "not valid JSON" "$bin" train -c "$tmp/bad.json" --data "$tmp/data" --out "$tmp/r9"
expect_error "checkpoint not found" "$bin" eval "$tmp/none.pt"
head -c 2000 "$tmp/run/checkpoint.pt" > "$tmp/trunc.pt"
expect_error "not a readable spanformer checkpoint" "$bin" eval "$tmp/trunc.pt"
expect_error "not a readable spanformer checkpoint" "$bin" generate "$tmp/text.txt"
expect_error "another model" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/run" --resume --hidden_size=16
expect_error "diverged" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r10" --optim=sgd --grad_clip=0 --lr=1e30
expect_error "temperature must be positive" "$bin" generate "$tmp/run" --temperature=0
expect_error "--unit must be bpc or ppl" "$bin" eval "$tmp/run" --unit=bits
expect_error "unknown dataset" "$bin" data get enwik9 --out "$tmp/d3"
expect_error "nccl backend is not built" env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 \
  "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r11" --dist_backend=nccl
expect_error "MASTER_ADDR is not set" env RANK=0 WORLD_SIZE=2 MASTER_ADDR= \
  "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r12"

# No partial outputs were left behind by the failures.
leftovers=$(find "$tmp" -name '*.tmp.*' | wc -l)
if [ "$leftovers" -ne 0 ]; then echo "FAIL: temporary files left: $(find "$tmp" -name '*.tmp.*')"; failures=$((failures + 1)); fi
[ -e "$tmp/d2/train.bin" ] && { echo "FAIL: a failed prepare wrote train.bin"; failures=$((failures + 1)); }

# Outputs: no run directory, a run directory in use, results to a closed or full stdout, a device as an
# output file; a symbolic link is written through; stale temporaries of killed writers are removed.
expect_error "no run directory" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out ""
expect_error "is in use by another training run" flock "$tmp/run/.lock" \
  "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/run" --resume --nb_steps=4
expect_error "cannot write the results to standard output" sh -c "exec \"\$0\" eval \"\$1\" --batch 2 >&-" "$bin" "$tmp/run"
expect_error "cannot write the results to standard output" sh -c "exec \"\$0\" eval \"\$1\" --batch 2 > /dev/full" "$bin" "$tmp/run"
expect_error "is not a regular file" "$bin" eval "$tmp/run" --batch 2 --dump-logprobs /dev/null
ln -s "$tmp/real_lp.txt" "$tmp/link_lp.txt"
if "$bin" eval "$tmp/run" --batch 2 --dump-logprobs "$tmp/link_lp.txt" > /dev/null 2>&1 && [ -L "$tmp/link_lp.txt" ] \
    && [ -s "$tmp/real_lp.txt" ]; then passed=$((passed + 1)); else echo "FAIL: write through a symbolic link"; failures=$((failures + 1)); fi
touch "$tmp/run/checkpoint.pt.tmp.999999999"
"$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/run" --resume --nb_steps=4 --quiet > /dev/null 2>&1
if [ ! -e "$tmp/run/checkpoint.pt.tmp.999999999" ]; then passed=$((passed + 1)); else echo "FAIL: stale temporary kept"; failures=$((failures + 1)); fi

echo "cli errors: $passed passed, $failures failed"
[ "$failures" -eq 0 ]
