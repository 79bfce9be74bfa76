#!/usr/bin/env bash
# Time and peak memory of one forward + backward of each causal attention pattern against T (B 1, K 8,
# D 64), one process per point, and the fitted exponent alpha of time ~ T^alpha over the measured T.
#   bash bench/causal_sweep.sh [build dir] [T ...]     (default: build, T = 1024 2048 4096 8192)
#   PATTERNS="dense flash" bash bench/causal_sweep.sh  (a subset of the patterns; IMPLS="fused" one impl)
# A point that runs out of memory or time is printed as such and left out of the fit.
set -u
build="${1:-build}"; shift || true
lengths=("$@"); [ ${#lengths[@]} -eq 0 ] && lengths=(1024 2048 4096 8192)
for pattern in ${PATTERNS:-dense flash window adaptive_span sparse_strided sparse_fixed lsh}; do
  impls="${IMPLS:-plain fused}"
  [ "$pattern" = flash ] && impls=fused  # flash's plain composition is dense's
  for impl in $impls; do
    out=()
    for T in "${lengths[@]}"; do
      line=$(GOMP_SPINCOUNT=10000 timeout 600 "$build/bench/bench_causal" "$pattern" "$T" "$impl" 3 2>&1) \
        || line="$pattern $impl $T failed ($line)"
      echo "$line"
      out+=("$line")
    done
    printf '%s\n' "${out[@]}" | /usr/bin/python3 -c '
import math, sys
pts = [(float(w[2]), float(w[3])) for w in (l.split() for l in sys.stdin) if len(w) >= 5 and w[4] == "ms"]
if len(pts) >= 2:
    xs = [math.log(t) for t, _ in pts]; ys = [math.log(ms) for _, ms in pts]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    a = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    print(f"  fitted time ~ T^{a:.2f} over T = {int(pts[0][0])} .. {int(pts[-1][0])}")'
  done
done
