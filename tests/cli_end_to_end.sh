#!/usr/bin/env bash
# The user's path on real text: prepare, train, resume, evaluate, generate, draw the spans.
set -euo pipefail
py="${SPANFORMER_PYTHON:-/usr/bin/python3}"  # a Python with torch (CTest passes the one whose LibTorch the build uses)
bin="$1"; src="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/cli_checks.sh"
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
# train.log: both sessions, the resume and the interval lines, each with its UTC time.
test "$(grep -c '^\[[0-9T:-]*Z\] session at step' "$tmp/run/train.log")" -eq 2
grep -qE '^\[20[0-9]{2}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z\] step +20 \| train' "$tmp/run/train.log"
grep -qE '^\[[0-9T:-]+Z\] step +40 \| train' "$tmp/run/train.log"
grep -q "resumed .* at step 20" "$tmp/run/train.log"
"$bin" eval "$tmp/run" --split test --batch 4 | tee "$tmp/eval.out"
grep -qE "^test bpc [0-9]+\.[0-9]+" "$tmp/eval.out"
"$bin" eval "$tmp/run" --split test --batch 4 --json > "$tmp/eval.json"
eval_consistent "$tmp/eval.json"
grep -qF "test bpc $("$py" -c 'import json, sys; print("{:.7f}".format(json.load(open(sys.argv[1]))["bpc"]))' "$tmp/eval.json")" "$tmp/eval.out" \
  || fail "the printed bpc is the record's: $(cat "$tmp/eval.out") vs $(cat "$tmp/eval.json")"
"$bin" generate "$tmp/run/checkpoint.pt" --prompt "It was the best of times" --tokens 50 --seed 3 > "$tmp/gen1"
"$bin" generate "$tmp/run/checkpoint.pt" --prompt "It was the best of times" --tokens 50 --seed 3 > "$tmp/gen2"
cmp "$tmp/gen1" "$tmp/gen2"   # seeded sampling is reproducible
"$bin" generate "$tmp/run/checkpoint.pt" --prompt "It was the best of times" --tokens 50 --seed 4 > "$tmp/gen3"
differ "$tmp/gen1" "$tmp/gen3" "--seed changes the sample"
test "$(wc -c < "$tmp/gen1")" -ge 70
"$bin" spans "$tmp/run" --out "$tmp/spans.png" | tee "$tmp/spans.out"
grep -q "layer  1" "$tmp/spans.out"
picture_drawn "$tmp/spans.png"
"$bin" attention "$tmp/run" --text "It was the best of times, it was the worst of times" --layer 1 --head 0 \
  -o "$tmp/att.png" | grep "drawn over distances" > /dev/null
picture_drawn "$tmp/att.png"
# Every picture as SVG or PDF by its extension, with the numbers drawn in a JSON file beside it.
"$bin" spans "$tmp/run" --out "$tmp/spans.svg" > /dev/null
grep -q "<svg" "$tmp/spans.svg"
"$bin" attention "$tmp/run" --text "It was the best of times, it was the worst of times" -o "$tmp/att.pdf" > /dev/null
head -c 5 "$tmp/att.pdf" | grep -q "%PDF-"
"$bin" spans "$tmp/run" --json --out "$tmp/spans2.png" > "$tmp/spans_record.json"
"$bin" spans "$tmp/run" --layout grid --out "$tmp/grid.pdf" > /dev/null
"$py" - "$tmp" <<'PY'
import json, sys
d = sys.argv[1]
drawn, printed = json.load(open(d + "/spans.json")), json.load(open(d + "/spans_record.json"))
assert drawn["picture"] == "spans" and drawn["spans"] == printed["spans"] and drawn["ramp"] == printed["ramp"], drawn
assert drawn["layout"] == "curves", drawn["layout"]  # few heads: the mask curves by default
grid = json.load(open(d + "/grid.json"))
assert grid["layout"] == "grid" and grid["spans"] == printed["spans"] and grid["rows"] == "layer", grid
att = json.load(open(d + "/att.json"))
assert att["picture"] == "heatmaps" and len(att["panels"]) == 2, att.keys()  # a panel per layer
for p in att["panels"]:
    assert len(p["values"]) == len(p["row_ticks"]) and all(len(r) == len(p["col_ticks"]) for r in p["values"]), p["title"]
    assert all(abs(sum(r) - 1) < 1e-3 for r in p["values"]), p["title"]  # a query's weights by distance (< 1e-6 ones cut)
PY
"$bin" bench -c "$tmp/c.json" --steps 2 --warmup 1 | grep "tokens/s" > /dev/null
"$bin" bench -c "$tmp/c.json" --steps 1 --warmup 0 --json 2> /dev/null > "$tmp/bench.json"
"$py" -c 'import json, sys; r = json.load(open(sys.argv[1]))
assert r["family"] == "adaptive-span" and r["mode"] == "train" and r["what"].startswith("train step"), r' "$tmp/bench.json"
bench_plausible "$tmp/bench.json"
# --profile: a Chrome trace of the timed steps (complete events, nested on their thread) and a table of
# the operators by their own time that adds up: the rows and the rest line make the profiled total, the
# shares 100%, and the profiled time (own time summed over the threads that ran operators) lies between
# part of a step and the step times its two threads.
"$bin" bench -c "$tmp/c.json" --steps 2 --warmup 1 --profile "$tmp/trace.json" > /dev/null 2> "$tmp/profile.txt"
"$py" - "$tmp/trace.json" "$tmp/profile.txt" <<'PY' || fail "bench --profile: trace and table hold together: $(cat "$tmp/profile.txt")"
import json, re, sys
events = [e for e in json.load(open(sys.argv[1])) if e.get("ph") == "X"]
names = {e["name"] for e in events}
assert len(events) > 100 and all(e["dur"] >= 0 for e in events), len(events)
assert "spanformer::adaptive_span_attention" in names and names & {"aten::mm", "aten::addmm", "aten::linear"}, names
text = open(sys.argv[2]).read()
head = re.search(r"profile: operators by own time, ms per step \(step ([0-9.]+) ms; every thread ([0-9.]+) ms\)", text)
step, profiled = float(head.group(1)), float(head.group(2))
rows = re.findall(r"^ +([0-9.]+) +([0-9.]+)% +([0-9]+)  (.+)$", text, re.M)
assert len(rows) >= 10, rows
assert abs(sum(float(r[0]) for r in rows) - profiled) <= 0.02 * len(rows) + 1e-3 * profiled, (rows, profiled)
assert abs(sum(float(r[1]) for r in rows) - 100) <= 0.06 * len(rows), rows
assert 0.3 * step < profiled <= 2.1 * step + 1, (step, profiled)  # own time on every thread; 2 threads
ms = [float(r[0]) for r in rows if not r[3].startswith("(")]
assert ms == sorted(ms, reverse=True), ms  # largest first
assert "trace of 2 steps written to" in text, text
PY
expect_error "--profile" "$bin" bench -c "$tmp/c.json" --steps 1 --warmup 0 --profile "$tmp"

# Distributed evaluation over two local processes gives the same figure, to float32 rounding: each
# process evaluates half the streams, and a float32 product over 2 rows may round otherwise than over 4
# (measured on Debian's LibTorch 1.13 with one thread, 2026-11-27: 4.5715290 against 4.5715291).
one=$("$bin" eval "$tmp/run" --split test --batch 4 | awk '{print $3}')
two=$("$bin" eval "$tmp/run" --split test --batch 4 --nproc-per-node 2 | awk '{print $3}')
"$py" -c 'import sys; a, b = map(float, sys.argv[1:]); assert a > 0 and abs(a - b) <= 1e-6 * a, (a, b)' "$one" "$two" ||
  { echo "FAIL: distributed evaluation $two, one process $one"; exit 1; }

# Fine-tuning: resume with a new learning rate and more steps (the optimizer state is kept).
"$bin" train -c "$tmp/c.json" --data "$tmp/data" --out "$tmp/run" --resume --lr=0.007 --nb_steps=60 --quiet \
  | grep "trained 60 steps" > /dev/null

# Ctrl-C: the run saves a checkpoint, exits 130, and the checkpoint resumes. The interrupt is sent once
# the run has trained (its first validation record, after 5 steps, is in log.jsonl), however slowly a
# busy machine gets there; a run that never gets there fails the test by name.
"$bin" train -c "$tmp/c.json" --data "$tmp/data" --out "$tmp/long" --nb_steps=100000 --eval_interval=5 \
  --checkpoint_interval=100000 --quiet > "$tmp/long.out" 2> "$tmp/long.err" &
pid=$!
for _ in $(seq 1200); do test -s "$tmp/long/log.jsonl" && break; kill -0 "$pid" 2> /dev/null || break; sleep 0.1; done
test -s "$tmp/long/log.jsonl" || { echo "FAIL: the long run wrote no log record in 120 s"; cat "$tmp/long.err"; exit 1; }
kill -INT "$pid"
rc=0; wait "$pid" || rc=$?
test "$rc" -eq 130 || { echo "FAIL: Ctrl-C: exit $rc, not 130"; cat "$tmp/long.err"; exit 1; }
saved=$(sed -nE 's/.*checkpoint saved at step ([0-9]+).*/\1/p' "$tmp/long.err")
test -n "$saved" && test "$saved" -ge 5 || { echo "FAIL: Ctrl-C saved no checkpoint after step 5"; cat "$tmp/long.err"; exit 1; }
"$bin" eval "$tmp/long" --split valid --batch 2 | grep "valid bpc" > /dev/null
echo "cli end to end: 1 passed, 0 failed"
