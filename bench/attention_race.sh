#!/usr/bin/env bash
# The attention race: every attention of the GPT family at one model size and context
# (configs/gpt/race.json: 4 layers x 4 heads, H 128, context 1024, bytes) trains on one corpus for the
# same wall-clock budget, then is evaluated on the whole test split with the family's sliding window.
#
#   bash bench/attention_race.sh DATA [MINUTES] [OUT]     (MINUTES per attention, default 20; OUT runs/race)
#   ATTENTIONS="dense window" bash bench/attention_race.sh data/dickens 5
#   BUILD=build-cuda EXTRA="--device cuda" bash bench/attention_race.sh ...
#   ATTENTIONS=window OVERRIDES="--window=16" bash bench/attention_race.sh data/dickens 5 runs/race_w16
#
# DATA is a prepared directory (`spanformer data prepare dickens.txt --out data/dickens`). The budget
# becomes a step count per attention: `spanformer bench` times three training steps of that attention
# (the model as initialised: adaptive span at its initial spans) and nb_steps = budget / ms per step, so
# each run has a whole warmup + cosine schedule. Runs that slow down while training (adaptive span, as
# its spans grow) take longer than the budget: the table prints the training time each run really took
# (the run's log) next to the budget, and the tokens it saw. Nothing else should run meanwhile.
set -euo pipefail
data="${1:?usage: bash bench/attention_race.sh DATA [MINUTES] [OUT]}"; minutes="${2:-20}"; out="${3:-runs/race}"
root="$(cd "$(dirname "$0")/.." && pwd)"
bin="${BUILD:-$root/build}/spanformer"
config="$root/configs/gpt/race.json"
export GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-10000}"  # see cli/main.cpp
[ -x "$bin" ] || { echo "attention_race: no $bin (bash scripts/build.sh)" >&2; exit 1; }
[ -f "$data/train.bin" ] || { echo "attention_race: $data is not a prepared data directory" >&2; exit 1; }
mkdir -p "$out"
results="$out/results.jsonl"
: > "$results"
# shellcheck disable=SC2086
for attention in ${ATTENTIONS:-dense flash window adaptive_span sparse_strided sparse_fixed lsh}; do
  run="$out/$attention"
  if [ -e "$run" ]; then echo "attention_race: $run exists (remove it or pick another OUT)" >&2; exit 1; fi
  ms=$("$bin" ${EXTRA:-} bench -c "$config" --attention="$attention" ${OVERRIDES:-} --steps 3 --warmup 1 --json |
       /usr/bin/python3 -c 'import json, sys; print(json.load(sys.stdin)["ms_per_step"])')
  steps=$(/usr/bin/python3 -c "import sys; print(max(100, int($minutes * 60000 / $ms)))")
  echo "== $attention: $ms ms/step in bench -> $steps steps for $minutes min"
  start=$(date +%s)
  "$bin" ${EXTRA:-} train -c "$config" --data "$data" --out "$run" --attention="$attention" ${OVERRIDES:-} \
    --nb_steps="$steps" --eval_interval="$steps"
  trained=$(( $(date +%s) - start ))
  "$bin" ${EXTRA:-} eval "$run" --split test --json > "$run/test.json"
  [ "$attention" = adaptive_span ] && "$bin" spans "$run" -o "$run/spans.png"
  /usr/bin/python3 - "$run/test.json" "$attention" "$ms" "$steps" "$trained" "$minutes" >> "$results" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
print(json.dumps({"attention": sys.argv[2], "bench_ms_per_step": float(sys.argv[3]), "steps": int(sys.argv[4]),
                  "train_s": int(sys.argv[5]), "budget_s": float(sys.argv[6]) * 60, "test_bpc": r["bpc"],
                  "test_tokens": r["tokens"], "eval_protocol": r["protocol"]}))
PY
done
/usr/bin/python3 - "$results" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
print(f"\n| attention | bench ms/step | steps | trained | budget | test bpc |\n|---|---|---|---|---|---|")
for r in rows:
    print(f"| {r['attention']} | {r['bench_ms_per_step']:.0f} | {r['steps']} | {r['train_s'] / 60:.1f} min | "
          f"{r['budget_s'] / 60:.0f} min | {r['test_bpc']:.4f} |")
if rows: print(f"\ntest split: {rows[0]['test_tokens']} tokens, {rows[0]['eval_protocol']}")
PY
