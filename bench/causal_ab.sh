#!/usr/bin/env bash
# Two builds of bench_causal (for example the last commit's and the working tree's), interleaved: for
# each round, pattern and T, one process of A then one of B; prints every line and then, per point, the
# median ms of the rounds and the largest peak RSS for A and B and B's speed-up.
#   bash bench/causal_ab.sh A_BINARY B_BINARY ROUNDS "PATTERN ..." T ... [IMPL]
#   e.g. cp build/bench/bench_causal /tmp/bench_causal_before  (then rebuild)
#        bash bench/causal_ab.sh /tmp/bench_causal_before build/bench/bench_causal 3 "sparse_strided" 1024 4096
# IMPL (env, default fused) is passed to both; each process times 3 runs after a warm-up.
set -u
a="$1" b="$2" rounds="$3" patterns="$4"; shift 4
impl="${IMPL:-fused}"
log=$(mktemp)
for ((r = 1; r <= rounds; r++)); do
  for p in $patterns; do
    for T in "$@"; do
      for side in A B; do
        bin=$a; [ $side = B ] && bin=$b
        line=$(GOMP_SPINCOUNT=10000 timeout 600 "$bin" "$p" "$T" "$impl" 3 2>&1) || line="$p $impl $T failed"
        echo "round $r $side $line" | tee -a "$log"
      done
    done
  done
done
/usr/bin/python3 - "$log" <<'PY'
import statistics, sys
pts = {}
for w in (l.split() for l in open(sys.argv[1])):
    if len(w) >= 9 and w[7] == "ms":
        pts.setdefault((w[3], int(w[5]), w[2]), []).append((float(w[6]), float(w[8])))
for (p, T) in sorted({(p, T) for p, T, _ in pts}):
    a, b = pts.get((p, T, "A"), []), pts.get((p, T, "B"), [])
    if a and b:
        ma, mb = statistics.median(x for x, _ in a), statistics.median(x for x, _ in b)
        print(f"{p} T {T}: A {ma:.0f} ms, {max(m for _, m in a):.0f} MB | B {mb:.0f} ms, "
              f"{max(m for _, m in b):.0f} MB | B is {ma / mb:.1f}x faster ({len(a)} rounds)")
PY
rm -f "$log"
