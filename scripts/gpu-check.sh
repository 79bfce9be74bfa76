#!/usr/bin/env bash
# Everything spanformer owes a GPU machine, in one bounded run: configure against the
# machine's PyTorch (LibTorch 2.x with CUDA), build, run the cuda-labelled tests, measure the ceilings,
# compare span attention implementations, and time CUDA training steps. Every figure lands in
# $OUT/gpu_figures.md (default ./gpu-out), the full log in $OUT/gpu_check.log.
#
#   scripts/gpu-check.sh [stage...]     stages: info build test ops compare flash tune nccl train train_ab peers e2e profile (default: all,
#                                       in order of what a short lease needs most)
#
# Environment: OUT (where results go), BUDGET (seconds for the whole run, default 570), SHARED (the shared data and reference fixtures; default
# ../shared, or .gpu/shared when that copy exists: the GPU machine sees only the checkout), JOBS.
# Each stage runs under its own time limit so that the whole run fits 10 minutes.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
LOG=$OUT/gpu_check.log
FIG=$OUT/gpu_figures.md
BUILD=${BUILD:-build-cuda}
JOBS=${JOBS:-$(nproc)}
if [ -z "${SHARED:-}" ]; then
  if [ -d .gpu/shared ]; then SHARED=$PWD/.gpu/shared; else SHARED=$(realpath ../shared 2>/dev/null || echo ../shared); fi
fi
PY=${PY:-python3}
# The whole run's budget in seconds: each step's limit is cut to what is left of it (a command on a
# shared GPU machine may be stopped at 10 minutes; results written before then are kept).
BUDGET=${BUDGET:-570}
START=$(date +%s)
stages=("$@")
[ ${#stages[@]} -eq 0 ] && stages=(info build test ops compare flash tune nccl train train_ab peers e2e profile)
failed=0

# step NAME LIMIT_SECONDS COMMAND...: runs COMMAND with its output in the log, prints one status line.
step() {
  local name=$1 limit=$2
  shift 2
  local left=$(( BUDGET - ($(date +%s) - START) ))
  [ $left -lt $limit ] && limit=$left
  if [ $limit -lt 5 ]; then echo "$name: skipped, the run's budget is spent"; failed=1; return 124; fi
  echo "== $name (limit ${limit}s): $*" >>"$LOG"
  local start=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >>"$LOG" 2>&1
  local rc=$?
  local line="$name: rc $rc, $(( $(date +%s) - start )) s"
  echo "== $line" >>"$LOG"
  echo "$line"
  [ $rc -ne 0 ] && failed=1
  return $rc
}

for stage in "${stages[@]}"; do
  case $stage in
  info)
    {
      echo "# gpu-check $(git rev-parse --short HEAD 2>/dev/null) on $(hostname), $(date -u +%FT%TZ)"
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.max.sm --format=csv,noheader
      echo "nvcc: $(nvcc --version | tail -1)"
      $PY - <<'EOF'
import torch, triton.testing
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {torch.cuda.get_device_properties(0).multi_processor_count} SMs")
x = torch.randn(1 << 30, device="cuda", dtype=torch.bfloat16); y = torch.empty_like(x)
ms = triton.testing.do_bench(lambda: y.copy_(x), return_mode="median")
print(f"ceiling: device-to-device copy {2 * x.numel() * 2 / ms / 1e6:.0f} GB/s (read + write, 2 GiB, median of do_bench)")
del x, y
a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16); b = torch.randn_like(a)
ms = triton.testing.do_bench(lambda: a @ b, return_mode="median")
print(f"ceiling: bf16 matmul 8192^3 {2 * 8192**3 / ms / 1e9:.0f} TFLOP/s (random data, median of do_bench)")
EOF
    } 2>&1 | tee -a "$FIG"
    ;;
  build)
    prefix=$($PY -c 'import torch; print(torch.utils.cmake_prefix_path)')
    pictures=OFF; pkg-config --exists cairo && pictures=ON
    zip=OFF; pkg-config --exists libzip && zip=ON
    sp=OFF; pkg-config --exists sentencepiece && sp=ON
    step configure 180 cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSPANFORMER_CUDA=ON -DSPANFORMER_LAB=ON \
      -DCMAKE_PREFIX_PATH="$prefix" -DTORCH_CUDA_ARCH_LIST=9.0 -DSPANFORMER_BENCH=OFF \
      -DSPANFORMER_PICTURES=$pictures -DSPANFORMER_ZIP=$zip -DSPANFORMER_SENTENCEPIECE=$sp -DSPANFORMER_SHARED_DIR="$SHARED" || break
    step build 480 ninja -C "$BUILD" -j "$JOBS" -k 0 spanformer_launcher spanformer_tests spanformer_torch_ops || {
      grep -E "error|FAILED" "$LOG" | head -60
      break
    }
    ;;
  test)
    # The cuda-labelled tests (each skips without a GPU), four at a time on the one GPU; -V puts the
    # gtest lines in the log.
    GOMP_SPINCOUNT=10000 step ctest 240 ctest --test-dir "$BUILD/tests" -L cuda -j 4 -V
    grep -E "Test +#|tests passed|FAILED|Failure|measured:" "$LOG" | sed "s/^[0-9]*: //" | tail -80 | tee -a "$FIG"
    ;;
  ops)
    # The perf mode of the ops' case lists (tests/op_cases.h): each perf case on every row that takes
    # CUDA tensors beside the reference composition, with GFLOP/s, bf16 and fp32.
    step op_perf_bf16 120 "$BUILD/tests/spanformer_tests" --op-perf all --device cuda --dtype bfloat16 --reps 5
    step op_perf_fp32 120 "$BUILD/tests/spanformer_tests" --op-perf all --device cuda --dtype float32 --reps 5
    grep -E "^(op perf|adaptive_span|flash_attention|B[0-9]|  [a-z])" "$LOG" | tail -60 | tee -a "$FIG"
    ;;
  compare)
    export SPANFORMER_TORCH_OPS=$PWD/$BUILD/libspanformer_torch_ops.so
    # Version 0's row is left out (its backward takes seconds a call at this shape; measured in
    # docs/kernels.md).
    step compare_bf16 240 $PY bench/python/gpu_compare.py --dtype bf16 --skip-v0 --out "$FIG"
    grep -E "^\| (all|bimodal) \|" "$LOG" | tail -12  # the rows so far, also when the step ran out of time
    step compare_fp32_small 120 $PY bench/python/gpu_compare.py --dtype fp32 --B 2 --L 2048 --out "$FIG"
    ;;
  flash)
    # The GPT family's causal flash attention against SDPA (its FlashAttention backend) at T 1k-32k:
    # every row at T 1k, then SDPA and the kernels only (version 0, the ATen tiles and the plain
    # composition take seconds a call or run out of memory at long T), B 1 from 16k.
    export SPANFORMER_TORCH_OPS=$PWD/$BUILD/libspanformer_torch_ops.so
    step flash_short 90 $PY bench/python/gpu_flash.py --dtype bf16 --B 4 --T 1024 --out "$FIG"
    step flash_long 150 $PY bench/python/gpu_flash.py --dtype bf16 --B 4 --T 4096 8192 --rows sdpa,v1,keys,m2,async --out "$FIG"
    step flash_longest 150 $PY bench/python/gpu_flash.py --dtype bf16 --B 1 --T 16384 32768 --rows sdpa,v1,keys,m2,async --out "$FIG"
    ;;
  tune)
    # Version 1's variants A/B (forward, interleaved rounds), then forward + backward (version 2's
    # backward; both blocks-an-SM choices of the forward): bench/python/gpu_span_tune.py. The lab's
    # span variants (src/ops/cuda/variants.h) run in both; its flash variants in the flash step.
    export SPANFORMER_TORCH_OPS=$PWD/$BUILD/libspanformer_torch_ops.so
    step span_tune 150 $PY bench/python/gpu_span_tune.py --variants "${TUNE_VARIANTS:-v1,v1b2,v1b3,v1b3-in-order,v1b2-async,v1b2-shortcuts}" --out "$FIG"
    step span_tune_backward 150 $PY bench/python/gpu_span_tune.py --backward --variants v1,v1b2,v1b3,v1b2-async,v1b2-shortcuts --rounds 3 --out "$FIG"
    ;;
  train)
    # Training steps on random tokens on CUDA: tokens/s and peak memory (the bench command), bf16
    # autocast (train.amp) first, then fp32 for the span configs; every family.
    # The GPT rows: dense attention under auto (SDPA), flash attention fused (the CUDA flash kernels).
    runs=("bench_span8k:--span-dist bimodal:plain fused" "enwik8_small::plain fused" "gpt/bench_attention::auto"
          "gpt/bench_attention:--attention flash:fused"
          "xl/wt2_demo::auto" "vit/fashion_mnist::-" "seq2seq/transformer::-")  # -: no attn_impl key
    for amp in bf16 off; do
      for run in "${runs[@]}"; do
        IFS=: read -r name extra impls <<<"$run"
        [ $amp = off ] && [[ $name != bench_span8k && $name != enwik8_small ]] && continue
        for impl in $impls; do
          flag=--attn_impl=$impl; [ "$impl" = - ] && flag=
          step "bench $name $impl amp $amp" 90 "$BUILD/spanformer" --device cuda bench -c "configs/$name.json" \
            --steps 10 --warmup 3 $extra $flag --amp="$amp"
          grep -E "^bench" "$LOG" | tail -2 | sed "s|^|$name $impl amp $amp: |" | tee -a "$FIG"
        done
      done
    done
    ;;
  train_ab)
    # What `auto` should take for the adaptive-span family on CUDA: the plain path against `fused` (the
    # span kernels), and whether the GPT step takes the fused step kernels, bf16 autocast, in interleaved rounds (plain, fused, plain, fused, ..; AB_ROUNDS,
    # default 3) and their medians, since two leases' sequential rows differed by up to 50%.
    cases=("bench_span8k:--span-dist bimodal" "bench_span8k:--span 8192" "enwik8_small:")
    AB=$OUT/train_ab.tsv; : > "$AB"
    for round in $(seq 1 "${AB_ROUNDS:-3}"); do
      for case in "${cases[@]}"; do
        IFS=: read -r name extra <<<"$case"
        for impl in plain fused; do
          step "ab $round $name $extra $impl" 60 "$BUILD/spanformer" --device cuda bench -c "configs/$name.json" \
            --steps 10 --warmup 3 $extra --attn_impl=$impl --amp=bf16 || continue
          ms=$(grep -E "^bench: [0-9.]+ ms/step" "$LOG" | tail -1 | awk '{print $2}')
          printf '%s\t%s\t%s\t%s\n' "$name $extra" "$impl" "$round" "$ms" >> "$AB"
        done
      done
      # The lab's fused step kernels (include/spanformer/ops/step_ops.h) in the GPT step, against the
      # composition (this build carries the lab: -DSPANFORMER_LAB=ON).
      for mode in composition kernels; do
        step "ab $round gpt step ops $mode" 60 env SPANFORMER_STEP_KERNELS=$mode "$BUILD/spanformer" --device cuda \
          bench -c configs/gpt/bench_attention.json --steps 10 --warmup 3 --amp=bf16 || continue
        ms=$(grep -E "^bench: [0-9.]+ ms/step" "$LOG" | tail -1 | awk '{print $2}')
        printf '%s\t%s\t%s\t%s\n' "gpt/bench_attention" "step ops $mode" "$round" "$ms" >> "$AB"
      done
    done
    # The lab's CUDA graphs (lab/step_graph.h): the GPT step and generation's fixed-shape per-token step,
    # eager and replayed, rounds interleaved, with the composition and with the step kernels.
    for mode in composition kernels; do
      step "graph perf $mode" 90 env SPANFORMER_STEP_KERNELS=$mode "$BUILD/tests/spanformer_tests" --graph-perf \
        --config configs/gpt/bench_attention.json --amp bf16 --rounds 5 --steps 10 &&
        grep -E "^  (train step|generation)" "$LOG" | tail -2 | sed "s|^|graph perf ($mode):|" | tee -a "$FIG"
    done
    $PY - "$AB" <<'EOF' 2>&1 | tee -a "$FIG"
import statistics, sys
rows = [line.rstrip("\n").split("\t") for line in open(sys.argv[1]) if line.strip()]
print("| config (bf16, ms/step) | plain: rounds | plain median | fused: rounds | fused median | plain / fused |")
print("|---|---|---|---|---|---|")
for case in dict.fromkeys(r[0] for r in rows):
    got = {impl: [float(r[3]) for r in rows if r[0] == case and r[1] == impl] for impl in ("plain", "fused")}
    med = {impl: statistics.median(v) if v else float("nan") for impl, v in got.items()}
    print(f"| {case} | {' '.join(f'{x:.1f}' for x in got['plain'])} | {med['plain']:.1f} | "
          f"{' '.join(f'{x:.1f}' for x in got['fused'])} | {med['fused']:.1f} | {med['plain'] / med['fused']:.2f} |")
EOF
    ;;
  peers)
    # The training rows of bench/python/peers.py on the GPU: ours (`spanformer --device cuda bench
    # --amp=bf16`) beside the same model in PyTorch eager and under torch.compile, bf16 autocast.
    export SPANFORMER_TORCH_OPS=$PWD/$BUILD/libspanformer_torch_ops.so SPANFORMER_CLI=$PWD/$BUILD/spanformer
    step peers 300 $PY bench/python/peers.py --device cuda --rows gpt,lm,seq2seq --gpt-lengths 1024:8 \
      --gpt-attentions dense --rounds 5
    grep -E "^(# peers|\| )" "$LOG" | grep -E "peers|PyTorch|nn.Transformer" | tail -12 | tee -a "$FIG"
    ;;
  e2e)
    # A CUDA training run end to end (configs/demo.json on $DATA): straight through, and stopped half way
    # then resumed (the two logs' last records must be equal), then the checkpoint evaluated on CUDA
    # and on the CPU (the same bpc to 1e-4).
    DATA=${DATA:-$PWD/.gpu/data/dickens3m}
    run=(--device cuda train -c configs/demo.json --data "$DATA" --nb_steps=200 --eval_interval=100 --quiet)
    E2E=${E2E:-/tmp/spanformer-e2e}; rm -rf "$E2E"
    step "train cuda 200 steps" 120 "$BUILD/spanformer" "${run[@]}" -o "$E2E/a"
    step "train cuda 100 + resume 100" 120 bash -c "'$BUILD/spanformer' ${run[*]} -o '$E2E/b' --stop-after 100 &&
      '$BUILD/spanformer' ${run[*]} -o '$E2E/b' --resume"
    $PY - "$E2E/a/log.jsonl" "$E2E/b/log.jsonl" <<'EOF' 2>&1 | tee -a "$FIG" || failed=1
import json, sys
a, b = (json.loads(open(p).read().splitlines()[-1]) for p in sys.argv[1:3])
keys = ["step", "lr", "train_loss", "valid_loss", "span_mean", "span_max"]
print("e2e: straight run, last record: " + ", ".join(f"{k} {a.get(k)}" for k in keys) + f", {a['tokens_per_s']:.0f} tokens/s")
same = all(a.get(k) == b.get(k) for k in keys)
print("e2e: stopped at 100 and resumed: " + ("the same record" if same else "DIFFERENT: " + json.dumps(b)))
sys.exit(0 if same else 1)
EOF
    for device in cuda cpu; do
      step "eval $device" 120 "$BUILD/spanformer" --device $device eval "$E2E/a/checkpoint.pt" --split test
      grep -E "^test" "$LOG" | tail -1 | sed "s|^|e2e eval on $device: |" | tee -a "$FIG"
    done
    ;;
  nccl)
    # NCCL through the same data-parallel code as Gloo: a group of one on GPU 0 (WORLD_SIZE=1 with the
    # backend named runs every collective) must give the plain CUDA run's last record exactly.
    DATA=${DATA:-$PWD/.gpu/data/dickens3m}
    run=(--device cuda train -c configs/demo.json --data "$DATA" --nb_steps=50 --eval_interval=50 --quiet)
    N=${E2E:-/tmp/spanformer-e2e}/nccl; rm -rf "$N"
    step "train cuda plain 50 steps" 120 "$BUILD/spanformer" "${run[@]}" -o "$N/plain"
    step "train cuda nccl group of one 50 steps" 120 env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 MASTER_ADDR=127.0.0.1 \
      MASTER_PORT=29533 "$BUILD/spanformer" "${run[@]}" --dist_backend=nccl -o "$N/nccl"
    $PY - "$N/plain/log.jsonl" "$N/nccl/log.jsonl" <<'EOF' 2>&1 | tee -a "$FIG" || failed=1
import json, sys
a, b = (json.loads(open(p).read().splitlines()[-1]) for p in sys.argv[1:3])
keys = ["step", "train_loss", "valid_loss"]
same = all(a.get(k) == b.get(k) for k in keys)
print("nccl: group of one " + ("equals" if same else "DIFFERS from") + " the plain run: " +
      ", ".join(f"{k} {a.get(k)} / {b.get(k)}" for k in keys) + f"; {b['tokens_per_s']:.0f} vs {a['tokens_per_s']:.0f} tokens/s")
sys.exit(0 if same else 1)
EOF
    ;;
  profile)
    # Nsight Compute on one launch of the span forward (version 1) at the comparison's shape, bf16, every
    # head at L: speed of light, occupancy, warp stalls, memory, in $OUT/ncu_span_forward.txt
    # (--clock-control none: the card's clocks as found).
    export SPANFORMER_TORCH_OPS=$PWD/$BUILD/libspanformer_torch_ops.so
    step ncu_span_forward 150 bash -c "ncu --clock-control none -k regex:forward_mma -s 1 -c 1 --section SpeedOfLight \
      --section Occupancy --section LaunchStats --section WarpStateStats --section MemoryWorkloadAnalysis \
      --section ComputeWorkloadAnalysis --section SchedulerStats $PY bench/python/gpu_span_once.py > '$OUT/ncu_span_forward.txt' 2>&1"
    grep -E "Duration|Throughput|Registers Per|Achieved Occupancy|Theoretical Occupancy|Warp Cycles Per|Issue Slots|One or More" \
      "$OUT/ncu_span_forward.txt" | head -30 | tee -a "$FIG"
    ;;
  *) echo "unknown stage '$stage' (info build test ops compare flash tune nccl train train_ab peers e2e profile)"; exit 2 ;;
  esac
done
exit $failed
