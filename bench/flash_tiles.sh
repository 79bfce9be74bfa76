#!/usr/bin/env bash
# Flash tile size against dense, interleaved (three rounds; report the medians):  bash bench/flash_tiles.sh [build dir]
build="${1:-build}"
for round in 1 2 3; do
  for T in 2048 4096; do
    GOMP_SPINCOUNT=10000 "$build"/bench/bench_causal dense $T plain 3
    GOMP_SPINCOUNT=10000 "$build"/bench/bench_causal dense $T fused 3
    for tile in 64 128 256; do echo -n "tile $tile: "; GOMP_SPINCOUNT=10000 "$build"/bench/bench_causal flash $T fused 3 $tile; done
  done
done
