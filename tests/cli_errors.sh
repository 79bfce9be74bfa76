#!/usr/bin/env bash
# Every user mistake gives exactly one line "spanformer: error: ..." on stderr, a non-zero exit, no
# stack trace and no output file.
set -u
py="${SPANFORMER_PYTHON:-/usr/bin/python3}"  # a Python with torch (CTest passes the one whose LibTorch the build uses)
bin="$1"
src="$(cd "$(dirname "$0")/.." && pwd)"
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
    if [ "$rc" -eq 0 ]; then echo "FAIL: a refused input must exit non-zero: $* -> $(cat "$tmp/err")"
    else echo "FAIL: one error line naming the mistake: $* (rc $rc) -> $(cat "$tmp/err")"; fi
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
expect_error "data/train.bin is too short for 2 streams of blocks of 20000" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r5" --block_size=20000
expect_error "divisible by nb_heads" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r5" --hidden_size=9
expect_error "attn_span must be at least 1" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r6" --attn_span=0
expect_error "must be positive" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r7" --block_size=-4
expect_error "file not found" "$bin" train -c "$tmp/none.json" --data "$tmp/data" --out "$tmp/r8"
# A validation that overflows is the same failure as a training loss that does: one line, no record of it,
# no checkpoint of that step.
expect_error "training diverged at step 1: the validation loss is" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" \
  --out "$tmp/r_nan" --nb_steps=1 --eval_interval=1 --lr=1e38 --optim=sgd --grad_clip=0 --lr_warmup=0
if [ -s "$tmp/r_nan/log.jsonl" ] || [ -e "$tmp/r_nan/checkpoint.pt" ]; then
  echo "FAIL: a diverged validation left a record or a checkpoint: $(ls "$tmp/r_nan")"; failures=$((failures + 1))
fi
echo '{"model": {' > "$tmp/bad.json"
expect_error "not valid JSON" "$bin" train -c "$tmp/bad.json" --data "$tmp/data" --out "$tmp/r9"
expect_error "checkpoint not found" "$bin" eval "$tmp/none.pt"
# A pickle declaring a storage larger than its zip entry (CRCs intact): refused before LibTorch reads past the entry.
expect_error "declares 256 bytes for storage '1' and its entry holds 8" "$bin" eval "$src/tests/fuzz/crashes/checkpoint/tensor-bytes-beyond-record"
head -c 2000 "$tmp/run/checkpoint.pt" > "$tmp/trunc.pt"
expect_error "not a readable spanformer checkpoint" "$bin" eval "$tmp/trunc.pt"
expect_error "not a readable spanformer checkpoint" "$bin" generate "$tmp/text.txt"
expect_error "another model" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/run" --resume --hidden_size=16
expect_error "diverged" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r10" --optim=sgd --grad_clip=0 --lr=1e30
expect_error "temperature must be positive" "$bin" generate "$tmp/run" --temperature=0
expect_error "--unit must be bpc or ppl" "$bin" eval "$tmp/run" --unit=bits
expect_error "unknown dataset" "$bin" data get enwik9 --out "$tmp/d3"
expect_error "nccl backend needs a CUDA build" env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1 \
  "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r11" --dist_backend=nccl
expect_error "dist_backend must be auto, gloo or nccl (got 'mpi')" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r11b" --dist_backend=mpi
expect_error "SPANFORMER_CPU_HALF_PRODUCTS=fast is not one of: auto, widened, native" \
  env SPANFORMER_CPU_HALF_PRODUCTS=fast "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r_env"
expect_error "MASTER_ADDR is not set" env RANK=0 WORLD_SIZE=2 MASTER_ADDR= \
  "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r12"

# No partial outputs were left behind by the failures.
leftovers=$(find "$tmp" -name '*.tmp.*' | wc -l)
if [ "$leftovers" -ne 0 ]; then echo "FAIL: temporary files left: $(find "$tmp" -name '*.tmp.*')"; failures=$((failures + 1)); fi
[ -e "$tmp/d2/train.bin" ] && { echo "FAIL: a failed prepare wrote train.bin"; failures=$((failures + 1)); }

# Outputs: a run directory in use, results to a closed or full stdout, a device as an
# output file; a symbolic link is written through; stale temporaries of killed writers are removed.
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

# Command-line parse errors: one prefixed line, exit status 2.
expect_exit2() {  # expect_exit2 "message part" command...
  local want="$1"; shift
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -ne 2 ] || [ "$(grep -c . "$tmp/err")" -ne 1 ] || ! grep -q "^spanformer: error: .*$want" "$tmp/err"; then
    if [ "$rc" -eq 0 ]; then echo "FAIL: a refused input must exit non-zero: $* -> $(cat "$tmp/err")"
    else echo "FAIL: one error line naming the mistake: $* (rc $rc) -> $(cat "$tmp/err")"; fi; failures=$((failures + 1))
  else passed=$((passed + 1)); fi
}
expect_exit2 "--tokens: Value 1e12 not in range" "$bin" generate "$tmp/run" --tokens 1e12
expect_exit2 "--tokens: Value 99999999999999999999 not in range" "$bin" generate "$tmp/run" --tokens 99999999999999999999
expect_exit2 "unknown command 'frobnicate' (--help lists the commands)" "$bin" frobnicate
expect_exit2 "unknown command 'trian' (did you mean 'train'?)" "$bin" --threads 1 trian -c "$tmp/tiny.json"
expect_exit2 "unknown config command 'kyes' (did you mean 'keys'?) (config: keys, families)" "$bin" config kyes
expect_exit2 "unknown data command 'prepar' (did you mean 'prepare'?)" "$bin" data prepar "$tmp/text.txt"
expect_exit2 "par needs one of its commands: derive, plot" "$bin" par
expect_exit2 "unknown config key 'nb_layer' in override 'nb_layer=2' (did you mean 'nb_layers'?)" \
  "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r4b" --nb_layer=2
expect_exit2 "override 'lr' must look like --key=value or --key value" \
  "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r4c" --lr
expect_error "pictures.txt: a picture is written as .png, .svg or .pdf" "$bin" spans "$tmp/run" --out "$tmp/pictures.txt"
if [ -e "$tmp/pictures.txt" ]; then echo "FAIL: a refused picture name was written"; failures=$((failures + 1))
else passed=$((passed + 1)); fi
# Global flags after the command mean what they mean before it; "--key value" overrides as "--key=value".
expect_error "no CUDA device is available" "$bin" generate "$tmp/run" --tokens 2 --device cuda
# --device where a command runs on the CPU only, and a device that does not exist, are refused.
expect_error "--device cuda: \`spans\` runs on the CPU (--device is for train, eval, bench, generate and translate)" \
  "$bin" --device cuda spans "$tmp/run" -o "$tmp/spans_dev.png"
expect_error "--device cuda:7: \`attention\` runs on the CPU" "$bin" attention "$tmp/run" --text "In the" --device cuda:7 -o "$tmp/att_dev.png"
expect_error "unknown device 'tpu' (cpu, cuda or cuda:N)" "$bin" eval "$tmp/run" --device tpu
expect_error "unknown device 'tpu'" "$bin" spans "$tmp/run" --device tpu -o "$tmp/spans_dev.png"
if "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/spaced" --nb_steps 3 --eval_interval 3 --lr 0.002 \
     --threads 1 --quiet > "$tmp/out" 2>&1 && grep -q "trained 3 steps" "$tmp/out" \
   && grep -qE '"lr": ?0.002' "$tmp/spaced/config.json" && grep -qE '"threads": ?1\b' "$tmp/spaced/config.json"; then
  passed=$((passed + 1))
else echo "FAIL: --key value overrides and a global flag after train -> $(cat "$tmp/out")"; failures=$((failures + 1)); fi
expect_exit2 "subcommand is required" "$bin"
# Config values: duplicate keys, integers out of range, absurd sizes, a port out of range.
printf '{"model": {"nb_layers": 1, "nb_layers": 2}}' > "$tmp/dup.json"
expect_error "key 'nb_layers' is given twice" "$bin" train -c "$tmp/dup.json" --data "$tmp/data" --out "$tmp/r13"
expect_error "config key 'seed': integer out of range" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r14" \
  --seed=9223372036854775808
expect_error "config key 'lr': expected a finite number" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r15" --lr=nan
expect_error "more than this machine's" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r16" --nb_layers=100000 \
  --hidden_size=4096 --nb_heads=8
expect_error "MASTER_PORT='99999' is not an integer in \[0, 65535\]" env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
  MASTER_PORT=99999 "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r17"
# A token file whose header count overflows the size check (count * 4 wraps around to the file size).
cp -r "$tmp/data" "$tmp/overflow"
"$py" - "$tmp/overflow/test.bin" <<'PY'
import struct, sys
body = b"\0" * 40
open(sys.argv[1], "wb").write(b"SPFTOK01" + struct.pack("<IIQ", 4, 300, (1 << 62) + 10) + body)
PY
expect_error "test.bin is truncated or corrupt: header says 4611686018427387914 tokens" "$bin" eval "$tmp/run" \
  --data "$tmp/overflow" --split test
# Resuming on other data with the same vocabulary and sizes: refused by the fingerprints.
cp -r "$tmp/data" "$tmp/other"
"$py" - "$tmp/other/train.bin" <<'PY'
import sys
b = bytearray(open(sys.argv[1], "rb").read()); b[30], b[31] = b[31], b[30]
open(sys.argv[1], "wb").write(bytes(b))
PY
expect_error "was trained on other data" "$bin" train -c "$tmp/tiny.json" --data "$tmp/other" --out "$tmp/run" --resume \
  --nb_steps=6

# Numbers beyond double range name their key, from an override and from a config file.
expect_error "config key 'lr': 1e999 is out of range" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r18" --lr=1e999
printf '{"train": {"lr": 1e999}}' > "$tmp/big.json"
expect_error "big.json: the value of key 'lr' is out of range" "$bin" train -c "$tmp/big.json" --data "$tmp/data" --out "$tmp/r19"
expect_error "steps must be >= 1" "$bin" bench -c "$tmp/tiny.json" --steps 0
expect_error "--steps must be >= 1 and --warmup >= 0, each at most 1000000000 (got 9223372036854775807" \
  "$bin" bench -c "$tmp/tiny.json" --steps 99999999999999999999
expect_error "--profile: a path, and empty" "$bin" bench -c "$tmp/tiny.json" --steps 1 --profile ''
# --spans-from, as docs/usage.md shows it: the trained run's spans in the benchmark model.
if ! "$bin" bench -c "$tmp/tiny.json" --spans-from "$tmp/run" --steps 1 --warmup 0 --mode eval > "$tmp/spans_from.txt" 2>&1 \
    || ! grep -q "ms/step" "$tmp/spans_from.txt"; then
  echo "FAIL: bench --spans-from a trained run: $(cat "$tmp/spans_from.txt")"; failures=$((failures + 1))
fi
# A run directory that holds a run is never silently replaced; --overwrite replaces it, never with --resume.
expect_error "already holds a run: continue it with --resume, or replace it with --overwrite" \
  "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/run"
expect_error "--resume excludes --overwrite" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/run" --resume --overwrite
cp -r "$tmp/run" "$tmp/replaced"
if "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/replaced" --overwrite --nb_steps=1 --eval_interval=1 \
    2>/dev/null | grep -q "trained 1 steps" && [ "$(grep -c '"step"' "$tmp/replaced/log.jsonl")" -eq 1 ]; then
  passed=$((passed + 1))
else
  echo "FAIL: --overwrite did not start a new run"; failures=$((failures + 1))
fi
# JSON nested 100,000 levels deep in a run's log, config or a config file: refused, not a crash.
cp -r "$tmp/run" "$tmp/deep"
deep=$(head -c 100000 /dev/zero | tr '\0' '['; head -c 100000 /dev/zero | tr '\0' ']')
echo "$deep" > "$tmp/deep/log.jsonl"
expect_error "log.jsonl line 1: JSON nested deeper than 64 levels" "$bin" report "$tmp/deep" -o "$tmp/deep.html"
echo "{\"model\": $deep}" > "$tmp/deep.json"
expect_error "deep.json: JSON nested deeper than 64 levels" "$bin" train -c "$tmp/deep.json" --data "$tmp/data" --out "$tmp/r21"
expect_error "config key 'lr': JSON nested deeper than 64 levels" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" \
  --out "$tmp/r22" --lr="$(head -c 1000 /dev/zero | tr '\0' '[')"

# Files this user may not read: the reason, not "corrupt" or "not a run directory". Root reads anything
# through two capabilities; it runs the program without them (still root, so the checkout and its
# LibTorch stay reachable wherever they are: another user cannot enter a checkout under a 0700 home).
expect_denied() {  # expect_denied "message" command...
  if [ "$(id -u)" -eq 0 ]; then
    expect_error "$1" setpriv --inh-caps=-dac_override,-dac_read_search --bounding-set=-dac_override,-dac_read_search "${@:2}"
  else
    expect_error "$@"
  fi
}
cp "$tmp/run/checkpoint.pt" "$tmp/private.pt"
chmod 000 "$tmp/private.pt"
expect_denied "cannot open .*private.pt: Permission denied" "$bin" eval "$tmp/private.pt" --data "$tmp/data"
mkdir -p "$tmp/private_run" && cp "$tmp/run/checkpoint.pt" "$tmp/private_run/" && chmod 000 "$tmp/private_run"
expect_denied "cannot read the run directory .*private_run: Permission denied" "$bin" eval "$tmp/private_run" --data "$tmp/data"
chmod 700 "$tmp/private_run"

# --device before the subcommand reaches train too (it used to train on the CPU without a word).
expect_error "no CUDA device is available" "$bin" --device cuda train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r20"
# An override the command does not use is refused, not ignored.
expect_error "override of train.eval_blocks is not used" "$bin" eval "$tmp/run" --eval_segments=5
# A session stopped before its first evaluation says so (it used to print "train 0.0000 bpc").
if "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/early" --nb_steps=4 --eval_interval=4 --stop-after 1 \
    --quiet 2> /dev/null | grep -q "stopped at step 1 before this session's first evaluation"; then passed=$((passed + 1))
else echo "FAIL: summary of a session stopped before its first evaluation"; failures=$((failures + 1)); fi
# Prompt characters outside the vocabulary: a warning naming them, then the sample.
"$bin" generate "$tmp/run" --prompt "God§Z" --tokens 2 > /dev/null 2> "$tmp/err"
if grep -q "warning: prompt characters not in the vocabulary were left out: 0xc2 0xa7 'Z'" "$tmp/err"; then passed=$((passed + 1))
else echo "FAIL: prompt warning: $(cat "$tmp/err")"; failures=$((failures + 1)); fi

# A directory where the run's checkpoint belongs: refused, and left alone (it used to be taken for "no
# checkpoint" and removed).
mkdir -p "$tmp/dirck/checkpoint.pt"
expect_error "checkpoint.pt exists and is not a regular file (the run's checkpoint)" \
  "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/dirck" --resume
if [ -d "$tmp/dirck/checkpoint.pt" ]; then passed=$((passed + 1)); else echo "FAIL: checkpoint.pt directory removed"; failures=$((failures + 1)); fi
# --resume with --init: resuming wins, and says that --init was not used.
cp "$tmp/run/checkpoint.pt" "$tmp/init.pt"
if "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/run" --resume --init "$tmp/init.pt" --nb_steps=5 --quiet \
    > /dev/null 2> "$tmp/err" && grep -q "init.pt is not used: it only starts a new run" "$tmp/err"; then passed=$((passed + 1))
else echo "FAIL: --resume --init -> $(cat "$tmp/err")"; failures=$((failures + 1)); fi
# Empty paths: refused at parsing (data prepare --out '' used to write /train.bin).
expect_exit2 "--out: a path, and empty" "$bin" data prepare "$tmp/text.txt" --out ''
expect_exit2 "--data: a path, and empty" "$bin" train -c "$tmp/tiny.json" --data '' --out "$tmp/r21"
expect_exit2 "--out: a path, and empty" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out ""
# "Not given" values of the request are not the user's to give.
expect_exit2 "--head: Value -1 not in range" "$bin" attention "$tmp/run" --text "In the" --layer 0 --head -1
# Word counts that count nothing propose no cutoffs (it printed -nan%).
mkdir -p "$tmp/zero_words"; printf '0\n0\n' > "$tmp/zero_words/counts.txt"
expect_error "counts no training tokens: no cutoffs to propose" "$bin" data cutoffs "$tmp/zero_words"
printf '123456789012345678901234\n' > "$tmp/zero_words/counts.txt"
expect_error "counts.txt: '123456789012345678901234' is not a count" "$bin" data cutoffs "$tmp/zero_words"

# A vocabulary edited after preparing is refused by meta.json's checksum (with two lines swapped, train
# used to go on with a wrong id-to-byte map); a garbage one (no checksum) gets one line naming the file.
cp -r "$tmp/data" "$tmp/swapped"
{ sed -n 2p "$tmp/data/vocab.txt"; sed -n 1p "$tmp/data/vocab.txt"; sed -n '3,$p' "$tmp/data/vocab.txt"; } > "$tmp/swapped/vocab.txt"
expect_error "swapped/vocab.txt was changed after the data was prepared" \
  "$bin" train -c "$tmp/tiny.json" --data "$tmp/swapped" --out "$tmp/r22"
expect_error "swapped/vocab.txt was changed after the data was prepared" "$bin" eval "$tmp/run" --data "$tmp/swapped"
cp -r "$tmp/data" "$tmp/garbage"; rm "$tmp/garbage/meta.json"
printf 'garbage\001\377 line\n\n' > "$tmp/garbage/vocab.txt"
expect_error "garbage/vocab.txt line 1: expected a byte value" "$bin" train -c "$tmp/tiny.json" --data "$tmp/garbage" --out "$tmp/r23"
# ... and nothing else: the config line comes only once the data and the run directory passed.
if [ -s "$tmp/out" ]; then echo "FAIL: a refused train printed: $(cat "$tmp/out")"; failures=$((failures + 1)); else passed=$((passed + 1)); fi
expect_error "garbage/vocab.txt line 1: expected a byte value" "$bin" eval "$tmp/run" --data "$tmp/garbage"

# The kind left out of export / import: the first argument named, with the kinds.
expect_exit2 "export: '.*/run' is not a kind of weights (safetensors, gpt2, adaptive-span, transformer-xl): spanformer export KIND CHECKPOINT" \
  "$bin" export "$tmp/run" --out "$tmp/x.safetensors"
expect_exit2 "import: 'safetensor' is not a kind of weights (safetensors, gpt2, adaptive-span, transformer-xl) (did you mean 'safetensors'?)" \
  "$bin" import safetensor "$tmp/x.safetensors" --out "$tmp/x.pt"
expect_exit2 "import: give the FILE after the kind: spanformer import safetensors FILE --out FILE" \
  "$bin" import safetensors --out "$tmp/x.pt"

# Sizes without a bound are refused before any work, from what one window or segment of one sequence
# needs (config/train_config.h, check_working_memory_fits): a GPT context of 10^8 tokens with a small
# width passed the parameter check and then allocated until the machine ran out.
expect_error "config: one window of context 100000000 tokens needs about .* GB of working memory, more than this machine's" \
  "$bin" train -c "$src/configs/gpt/demo.json" --data "$tmp/data" --out "$tmp/ctx" --context=100000000 --d_model=16 --n_head=2
expect_error "config: a segment of eval_tgt_len 100000000 tokens with .* of memory needs about .* GB of working memory" \
  "$bin" bench -c "$src/configs/xl/wt2_demo.json" --mode eval --vocab_size=9334 --eval_tgt_len=100000000
# ... and from a whole training step, batch included (a GPT context of 200,000 at batch 16 used to pass
# as one window and allocate 8 GB in 25 s), in every family and in bench's own lengths.
expect_error "config: a training step of 16 sequences of 200000 tokens needs about" \
  "$bin" train -c "$src/configs/gpt/demo.json" --data "$tmp/data" --out "$tmp/ctx" --context=200000 --batch_size=16
expect_error "config: a training step of 2 streams of block_size 100000000 needs about" \
  "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/ctx" --block_size=100000000
expect_error "config: a segment of 10 sequences of --tgt-len 100000 tokens with 100000 of memory needs about" \
  "$bin" bench -c "$src/configs/xl/wt2_demo.json" --mode eval --vocab_size=9334 --tgt-len 100000 --mem-len 100000 --steps 1
expect_error "config: a training step of 10000000 images of 50 tokens needs about" \
  "$bin" bench -c "$src/configs/vit/fashion_mnist.json" --batch_size=10000000 --steps 1
expect_error "config: a training step of 100000000 pairs of up to 18 tokens a side needs about" \
  "$bin" bench -c "$src/configs/seq2seq/transformer.json" --batch_size=100000000 --steps 1
expect_error "config: the position table of max_positions 1000000000 needs about" \
  "$bin" bench -c "$src/configs/seq2seq/transformer.json" --max_positions=1000000000 --steps 1
[ ! -e "$tmp/ctx" ] || { echo "FAIL: a refused train made its run directory"; failures=$((failures + 1)); }

# A file where a directory is expected, and the reverse, or another family's data: one line naming what
# the path is and what the command wanted (the bad-input sweep of docs/reliability.md).
expect_error "$src/configs/demo.json is a JSON file (a config or a log), not a checkpoint: give a run directory or its checkpoint.pt" \
  "$bin" generate "$src/configs/demo.json"
expect_error "$tmp/run is a directory, not a file (a run directory: its config is $tmp/run/config.json)" \
  "$bin" train -c "$tmp/run" --out "$tmp/sweep1"
expect_error "$tmp/run/checkpoint.pt is a checkpoint, not a config file (continue its run: train --resume --out RUN" \
  "$bin" train -c "$tmp/run/checkpoint.pt" --out "$tmp/sweep2"
expect_error "$tmp/data is a directory without $tmp/data/checkpoint.pt: not a run directory (a prepared data directory?)" \
  "$bin" generate "$tmp/data"
expect_error "$tmp/data is a directory, not a file" "$bin" data prepare "$tmp/data" --out "$tmp/sweep3"
expect_error "$tmp/text.txt is a file; a prepared data directory is expected (spanformer data prepare FILE --out DIR)" \
  "$bin" eval "$tmp/run" --data "$tmp/text.txt"
mkdir -p "$tmp/images" && : > "$tmp/images/train-images-idx3-ubyte"
expect_error "$tmp/images holds an IDX image set (the vit family's data); language models read a prepared text directory" \
  "$bin" train -c "$tmp/tiny.json" --data "$tmp/images" --out "$tmp/sweep4"
expect_error "$tmp/data is a directory, not a file (the seq2seq family reads one file of tab-separated sentence pairs)" \
  "$bin" train -c "$src/configs/seq2seq/gru.json" --data "$tmp/data" --out "$tmp/sweep5"
expect_error "import adaptive-span: $tmp/run/checkpoint.pt is a spanformer checkpoint already (import reads the reference's state_dict)" \
  "$bin" import adaptive-span "$tmp/run/checkpoint.pt" --out "$tmp/sweep6.pt"
expect_error "$tmp/run is a directory, not a file" "$bin" import safetensors "$tmp/run" --out "$tmp/sweep7.pt"
# ... and a damaged one is still ours (a tensor record altered, the zip's CRCs rewritten to match).
"$py" - "$tmp/run/checkpoint.pt" "$tmp/altered.pt" <<'PY'
import sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as src, zipfile.ZipFile(sys.argv[2], "w", zipfile.ZIP_STORED) as dst:
    for info in src.infolist():
        data = bytearray(src.read(info))
        if info.filename.endswith("/data/1"): data[0] ^= 0x40
        dst.writestr(info.filename, bytes(data))
PY
expect_error "altered.pt is damaged: entry '.*' fails its checksum" "$bin" eval "$tmp/altered.pt" --data "$tmp/data"
expect_error "import adaptive-span: $tmp/altered.pt is a spanformer checkpoint already" \
  "$bin" import adaptive-span "$tmp/altered.pt" --out "$tmp/sweep8.pt"
for d in sweep1 sweep2 sweep3 sweep4 sweep5 sweep6.pt sweep7.pt sweep8.pt; do
  [ ! -e "$tmp/$d" ] || { echo "FAIL: a refused command wrote $d"; failures=$((failures + 1)); }
done

# The GPT-2 layout (Hugging Face transformers): models GPT-2 cannot express, and directories that are not
# one, each refused in one line naming what it got.
gpt_small=(--n_layer=1 --d_model=16 --n_head=2 --context=16 --batch_size=2 --nb_steps=2 --eval_interval=2 --eval_blocks=1
           --lr_warmup=0 --eval_batch_size=2 --quiet)
"$bin" train -c "$src/configs/gpt/demo.json" --data "$tmp/data" --out "$tmp/gpt" "${gpt_small[@]}" > /dev/null 2>&1 &&
"$bin" train -c "$src/configs/gpt/demo.json" --data "$tmp/data" --out "$tmp/gptw" "${gpt_small[@]}" --attention=window \
  --window=4 > /dev/null 2>&1 && "$bin" export gpt2 "$tmp/gpt" --out "$tmp/hf" > /dev/null || { echo "FAIL: gpt runs"; exit 1; }
expect_error "export gpt2: .*/run/checkpoint.pt is of the adaptive-span family; the GPT-2 layout is for the gpt family" \
  "$bin" export gpt2 "$tmp/run" --out "$tmp/hf1"
expect_error "export gpt2: GPT-2 has dense attention only, and this model's attention is window" \
  "$bin" export gpt2 "$tmp/gptw" --out "$tmp/hf2"
expect_error "export gpt2: .*/text.txt is a file; the GPT-2 layout is a directory" "$bin" export gpt2 "$tmp/gpt" --out "$tmp/text.txt"
expect_error "import gpt2: .*/hf/config.json is not a directory" "$bin" import gpt2 "$tmp/hf/config.json" --out "$tmp/g1.pt"
mkdir -p "$tmp/hf_bin" && cp "$tmp/hf/config.json" "$tmp/hf_bin/" && : > "$tmp/hf_bin/pytorch_model.bin"
expect_error "import gpt2: .*/hf_bin has no model.safetensors" "$bin" import gpt2 "$tmp/hf_bin" --out "$tmp/g2.pt"
cp -r "$tmp/hf" "$tmp/hf_llama" && sed -i 's/"model_type": "gpt2"/"model_type": "llama"/' "$tmp/hf_llama/config.json"
expect_error "hf_llama/config.json: a 'llama' model, not gpt2" "$bin" import gpt2 "$tmp/hf_llama" --out "$tmp/g3.pt"
cp -r "$tmp/hf" "$tmp/hf_novocab" && rm "$tmp/hf_novocab/vocab.txt"
expect_error "import gpt2: .*/hf_novocab has neither vocab.txt nor GPT-2.s tokenizer (tokenizer.json, or vocab.json + merges.txt): give --vocab" "$bin" import gpt2 "$tmp/hf_novocab" --out "$tmp/g4.pt"
head -n 5 "$tmp/data/vocab.txt" > "$tmp/short_vocab.txt"
expect_error "vocab_size" "$bin" import gpt2 "$tmp/hf_novocab" --vocab "$tmp/short_vocab.txt" --out "$tmp/g5.pt"
expect_error "import gpt2: the directory's config.json describes the model; --config and overrides are not used" \
  "$bin" import gpt2 "$tmp/hf" --config "$tmp/tiny.json" --out "$tmp/g6.pt"
expect_error "dump-outputs is for the example families (seq2seq, vit); language models have --dump-logprobs" \
  "$bin" eval "$tmp/run" --dump-outputs "$tmp/outputs.tsv"
[ ! -e "$tmp/outputs.tsv" ] || { echo "FAIL: a refused eval wrote outputs.tsv"; failures=$((failures + 1)); }
# What export wrote is what import reads: two vocab.txt lines swapped, a key given twice, a fractional
# size are refused (they used to import silently as another model or a truncated one).
cp -r "$tmp/hf" "$tmp/hf_swapped" && sed -i '2{h;d};3{G}' "$tmp/hf_swapped/vocab.txt"
expect_error "import gpt2: $tmp/hf_swapped/vocab.txt does not match the spanformer_vocab_sha256 in config.json" \
  "$bin" import gpt2 "$tmp/hf_swapped" --out "$tmp/g7.pt"
cp -r "$tmp/hf" "$tmp/hf_twice" && sed -i 's/"n_layer": \([0-9]*\),/"n_layer": \1, "n_layer": 7,/' "$tmp/hf_twice/config.json"
expect_error "hf_twice/config.json: key 'n_layer' is given twice in one object" "$bin" import gpt2 "$tmp/hf_twice" --out "$tmp/g8.pt"
cp -r "$tmp/hf" "$tmp/hf_half" && sed -i 's/"n_layer": \([0-9]*\),/"n_layer": \1.5,/' "$tmp/hf_half/config.json"
expect_error "hf_half/config.json: 'n_layer' is 1.5, not an integer" "$bin" import gpt2 "$tmp/hf_half" --out "$tmp/g9.pt"
for f in g1 g2 g3 g4 g5 g6 g7 g8 g9; do [ ! -e "$tmp/$f.pt" ] || { echo "FAIL: a refused import wrote $f.pt"; failures=$((failures + 1)); }; done

# A rank whose job never forms (no rank 0 at the address): one line, without c10d's log of each failed
# connection and its C++ stack traces.
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
expect_error "rank 1: cannot join the job at 127.0.0.1:$port" env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 \
  MASTER_PORT="$port" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r_join" --dist_timeout=2

# A mistake every worker of --nproc-per-node makes is one line (it was one per worker plus the launcher's).
expect_error "batch_size 3 must divide by the number of processes (2)" "$bin" train -c "$tmp/tiny.json" --data "$tmp/data" --out "$tmp/r24" \
  --nproc-per-node 2 --batch_size=3
[ ! -e "$tmp/r24" ] || { echo "FAIL: the launcher created r24 before refusing the batch"; failures=$((failures + 1)); }
# The same mistake under torchrun's variables, no launcher: each rank says it once. Every rank waits at
# joining until all have joined, so no rank leaves while a peer is still connecting (Gloo then printed
# "connectFullMesh failed ... Connection closed by peer" beside the message). Three rounds give the race
# its chances.
for round in 1 2 3; do
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  for r in 0 1; do
    env RANK=$r WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT="$port" "$bin" train -c "$tmp/tiny.json" \
      --data "$tmp/data" --out "$tmp/r24b" --batch_size=3 > /dev/null 2> "$tmp/rank$r.err" &
  done
  wait
  for r in 0 1; do
    if [ "$(grep -c . "$tmp/rank$r.err")" -ne 1 ] || ! grep -q "^spanformer: error: batch_size 3 must divide by the number of processes (2)" "$tmp/rank$r.err"; then
      echo "FAIL: round $round, rank $r under torchrun's variables -> $(cat "$tmp/rank$r.err")"
      failures=$((failures + 1))
    else
      passed=$((passed + 1))
    fi
  done
done

# The family list (train/registry.h): an unknown arch names every family, and docs/usage.md's table
# lists exactly the families `config families` prints, with their descriptions.
printf '{"arch": "nonesuch"}\n' > "$tmp/nonesuch.json"
names=$("$bin" config families | awk '{ print $1 }' | paste -sd, - | sed 's/,/, /g; s/\(.*\), /\1 or /')
expect_error "$tmp/nonesuch.json: unknown arch 'nonesuch' ($names)" "$bin" train -c "$tmp/nonesuch.json" --out "$tmp/r25"
documented=$(grep -E '^\| `[a-z0-9-]+` \| ' "$src/docs/usage.md" | sed -E 's/^\| `([^`]*)` \| (.*) \|$/\1 \2/')
listed=$("$bin" config families | sed -E 's/^([^ ]+) +/\1 /')
if [ -z "$listed" ] || [ "$documented" != "$listed" ]; then
  echo "FAIL: docs/usage.md's family table differs from \`spanformer config families\`:"; diff <(echo "$documented") <(echo "$listed")
  failures=$((failures + 1))
else
  passed=$((passed + 1))
fi

echo "cli errors: $passed passed, $failures failed"
[ "$failures" -eq 0 ]
