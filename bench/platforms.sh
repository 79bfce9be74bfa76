#!/usr/bin/env bash
# The same commands on two builds of spanformer, interleaved, medians: what moving from Debian's LibTorch
# 1.13 (OpenBLAS) to PyPI's LibTorch 2.x (MKL, oneDNN) does to speed and memory. The shapes are the ones
# docs/benchmarks.md measures: adaptive-span training steps (bench_small at spans 40 and 540, bench_span8k
# with bimodal spans, train and eval), the span-attention op alone (B 1, K 8, D 64, M 512, L 8192,
# bimodal spans, forward + backward, plain and fused), a GPT training step (4 x 4, H 256, T 1024; dense,
# window 128, adaptive span) and the encoder-decoder Transformer's step.
#
#   bash bench/platforms.sh [A_BUILD] [B_BUILD] [ROUNDS]       (default build-system build 3)
# Prints one Markdown table: median ms per step (or per op call) of each build, B's speed-up over A, and
# the peak resident memory of the last round. Runs each command once per round, A then B, so that the
# shared machine's drift falls on both alike.
set -euo pipefail
cd "$(dirname "$0")/.."
A=${1:-build-system} B=${2:-build} ROUNDS=${3:-3}
for b in "$A" "$B"; do [ -x "$b/spanformer" ] || { echo "platforms: $b/spanformer missing (scripts/build.sh)" >&2; exit 1; }; done
export GOMP_SPINCOUNT=10000
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT

# name|spanformer arguments (bench --json), or name|op:FILTER for bench_attention
shapes=(
  "bench_small span 40, train|bench -c configs/bench_small.json --span 40 --steps 5 --warmup 1"
  "bench_small span 540, train|bench -c configs/bench_small.json --span 540 --steps 5 --warmup 1"
  "bench_span8k bimodal, train|bench -c configs/bench_span8k.json --span-dist bimodal --steps 3 --warmup 1"
  "bench_span8k bimodal, eval|bench -c configs/bench_span8k.json --span-dist bimodal --steps 3 --warmup 1 --mode eval"
  "span op L 8192 bimodal, plain, fwd+bwd|op:B:1/K:8/D:64/M:512/L:8192/bimodal/plain"
  "span op L 8192 bimodal, fused, fwd+bwd|op:B:1/K:8/D:64/M:512/L:8192/bimodal/fused"
  "GPT 4x4 H 256 T 1k dense, train|bench -c configs/gpt/bench_attention.json --attention=dense --steps 3 --warmup 1"
  "GPT 4x4 H 256 T 1k window 128, train|bench -c configs/gpt/bench_attention.json --attention=window --steps 3 --warmup 1"
  "GPT 4x4 H 256 T 1k adaptive span, train|bench -c configs/gpt/bench_attention.json --attention=adaptive_span --steps 3 --warmup 1"
  "seq2seq Transformer, train|bench -c configs/seq2seq/transformer.json --steps 5 --warmup 1"
)

measure() {  # build, shape -> "ms rss_mb"
  local build=$1 args=$2
  if [[ $args == op:* ]]; then
    "$build/bench/bench_attention" --benchmark_filter="${args#op:}/real_time\$" --benchmark_min_time=2 \
      --benchmark_format=json 2>/dev/null | python3 -c '
import json, sys
b = json.load(sys.stdin)["benchmarks"][0]
print(b["real_time"] if b["time_unit"] == "ms" else b["real_time"] / 1e6, b.get("peak_rss_mb", "-"))'
  else
    # shellcheck disable=SC2086
    "$build/spanformer" $args --json 2>/dev/null | tail -1 |
      python3 -c 'import json, sys; r = json.loads(sys.stdin.read()); print(r["ms_per_step"], round(r["peak_rss_mb"]))'
  fi
}

for round in $(seq 1 "$ROUNDS"); do
  for i in "${!shapes[@]}"; do
    for side in A B; do
      build=$A; [ $side = B ] && build=$B
      measure "$build" "${shapes[$i]#*|}" >> "$tmp/$i.$side"
    done
  done
  echo "platforms: round $round of $ROUNDS done" >&2
done

version() { "$1/spanformer" --version | sed -n 's/.*\(LibTorch [0-9.]*\).*/\1/p'; }
echo "| shape | $(version "$A") ($A) ms | $(version "$B") ($B) ms | speed-up | peak RSS MB ($A / $B) |"
echo "|---|---|---|---|---|"
for i in "${!shapes[@]}"; do
  python3 - "${shapes[$i]%%|*}" "$tmp/$i.A" "$tmp/$i.B" <<'PY'
import statistics, sys
name, fa, fb = sys.argv[1:]
rows = lambda f: [l.split() for l in open(f)]
a, b = rows(fa), rows(fb)
ma, mb = statistics.median(float(r[0]) for r in a), statistics.median(float(r[0]) for r in b)
runs = lambda rs: ", ".join(f"{float(r[0]):.0f}" for r in rs)
print(f"| {name} | {ma:.0f} ({runs(a)}) | {mb:.0f} ({runs(b)}) | {ma / mb:.2f}x | {a[-1][1]} / {b[-1][1]} |")
PY
done
