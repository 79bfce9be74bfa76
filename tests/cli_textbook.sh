#!/usr/bin/env bash
# The attention textbook's commands: `example pooling` (errors of the three poolings, pictures,
# figures), and the ViT family through the engine's commands on a slice of Fashion-MNIST (train,
# resume, eval with accuracy, attention pictures, bench) with its user mistakes (one line, non-zero exit).
set -euo pipefail
py="${SPANFORMER_PYTHON:-/usr/bin/python3}"  # a Python with torch (CTest passes the one whose LibTorch the build uses)
bin="$1"; src="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/cli_checks.sh"

# Attention pooling: kernel regression beats the average; the learned kernel is sharper than w = 1.
"$bin" example pooling --out "$tmp/pool" > "$tmp/pool.out"
grep "nadaraya" "$tmp/pool.out" > /dev/null
picture_drawn "$tmp/pool/fits.png" "$tmp/pool/weights.png"
"$py" - "$tmp/pool/pooling.json" "$tmp/pool.out" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
assert r["nadaraya_mse"] < r["average_mse"] and r["parametric_mse"] < r["average_mse"], ("pooling beats the average", r)
assert r["leave_one_out_loss"][-1] < r["leave_one_out_loss"][0], ("the kernel's width is learnt", r)
# the printed errors are the recorded ones
text = open(sys.argv[2]).read()
for key in ("average_mse", "nadaraya_mse", "parametric_mse"):
    assert f"{r[key]:.4f}" in text, ("printed figures equal the recorded ones", key, r[key], text)
PY
expect_error "already holds a pooling example: pass --overwrite to replace it" "$bin" example pooling --out "$tmp/pool"              # would overwrite
cp "$tmp/pool/pooling.json" "$tmp/pooling_seed_default.json"
"$bin" example pooling --out "$tmp/pool" --overwrite --seed 3 > /dev/null
"$py" - "$tmp/pooling_seed_default.json" "$tmp/pool/pooling.json" <<'PY'
import json, sys
a, b = (json.load(open(f)) for f in sys.argv[1:])
assert a["average_mse"] != b["average_mse"] and a["parametric_w"] != b["parametric_w"], ("--seed changes the example's draw", a, b)
PY
expect_error "--n must be at least 2 (got 1)" "$bin" example pooling --out "$tmp/pool2" --n 1
expect_error "--sigma must be positive (got 0)" "$bin" example pooling --out "$tmp/pool2" --sigma 0

# ViT on the first 1200 training and 300 test images of Fashion-MNIST.
fashion=/usr/share/datasets/fashion-mnist
if [ ! -d "$fashion" ]; then echo "cli textbook: pooling passed; ViT skipped (dataset-fashion-mnist not installed)"; exit 77; fi
mkdir -p "$tmp/fm"
"$py" - "$fashion" "$tmp/fm" <<'PY'
import gzip, sys
src, out = sys.argv[1], sys.argv[2]
for prefix, n in [("train", 1200), ("t10k", 300)]:
    b = gzip.open(f"{src}/{prefix}-images-idx3-ubyte.gz").read()
    open(f"{out}/{prefix}-images-idx3-ubyte", "wb").write(b[:4] + n.to_bytes(4, "big") + b[8:16] + b[16:16 + 784 * n])
    b = gzip.open(f"{src}/{prefix}-labels-idx1-ubyte.gz").read()
    open(f"{out}/{prefix}-labels-idx1-ubyte", "wb").write(b[:4] + n.to_bytes(4, "big") + b[8:8 + n])
PY
small=(--data "$tmp/fm" --patch=7 --n_layer=2 --n_head=2 --d_model=32 --d_inner=64 --valid_images=200 --batch_size=32
       --nb_steps=40 --eval_interval=20 --lr_warmup=5 --lr=5e-3 --eval_batch_size=100 --augment_shift=1)
cfg="$src/configs/vit/fashion_mnist.json"
"$bin" config keys --arch vit | grep "model.patch" > /dev/null
"$bin" train -c "$cfg" --out "$tmp/vit" "${small[@]}" --stop-after 25 --quiet > /dev/null
"$bin" train -c "$cfg" --out "$tmp/vit" "${small[@]}" --resume --quiet | tee "$tmp/train.out"
grep "trained 40 steps" "$tmp/train.out" > /dev/null
"$py" - "$tmp/vit/log.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == [20, 40], rows
assert all(0 <= r["valid_acc"] <= 1 and r["images_per_s"] > 0 for r in rows), rows
PY
"$bin" eval "$tmp/vit" --json > "$tmp/eval.json"
"$bin" eval "$tmp/vit" --split valid --json > "$tmp/valid.json"
"$py" - "$tmp/eval.json" "$tmp/valid.json" "$tmp/vit/log.jsonl" <<'PY'
import json, sys
test, valid = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
last = [json.loads(l) for l in open(sys.argv[3])][-1]
# 40 steps learn: test accuracy 0.27-0.35 over seven seeds (the default and 1-6, 2026-11-28), chance 0.10;
# one sd of an accuracy over 300 images is about 0.026, so 0.22 is two below the lowest run
assert test["images"] == 300 and test["split"] == "test" and 0.22 < test["accuracy"] <= 1, test
# the command and the training run's validation score the same images the same way
assert abs(valid["accuracy"] - last["valid_acc"]) < 1e-12 and abs(valid["nll"] - last["valid_loss"]) < 1e-9, (valid, last)
PY
"$bin" attention "$tmp/vit" --image 0 5 17 --out "$tmp/rollout.png" | grep "test image 5" > /dev/null
"$bin" attention "$tmp/vit" --image 3 --layer 1 --head 0 --out "$tmp/head.png" > /dev/null
picture_drawn "$tmp/rollout.png" "$tmp/head.png"
"$bin" bench -c "$cfg" --steps 1 --warmup 0 --n_layer=1 --batch_size=8 > "$tmp/bench.txt"
rate_consistent "$tmp/bench.txt" 8 "bench's images/s x ms/step is the batch of 8"
"$bin" bench -c "$cfg" --steps 1 --warmup 0 --n_layer=1 --batch_size=8 --json 2> /dev/null > "$tmp/bench.json"
bench_plausible "$tmp/bench.json"

expect_error "image 300 is outside the test split (0 .. 299)" "$bin" attention "$tmp/vit" --image 300
expect_error "--layer must be in [0, 2) (got 2)" "$bin" attention "$tmp/vit" --image 0 --layer 2
expect_error "--head needs --layer" "$bin" attention "$tmp/vit" --image 0 --head 1
expect_error "unknown split 'dev' (train, valid or test)" "$bin" eval "$tmp/vit" --split dev
expect_error "are for language models, not the vit family" "$bin" eval "$tmp/vit" --dump-logprobs "$tmp/lp.txt"
expect_error "image_size (28) must be a multiple of patch (5)" "$bin" train -c "$cfg" --out "$tmp/bad" "${small[@]}" --patch=5
expect_error "image_size (32) must be a multiple of patch (7)" "$bin" train -c "$cfg" --out "$tmp/bad" "${small[@]}" --image_size=32
expect_error "cannot hold out 5000 of 1200 training images for validation" "$bin" train -c "$cfg" --out "$tmp/bad" "${small[@]}" --valid_images=5000
expect_error "already holds a run: continue it with --resume, or replace it with --overwrite" "$bin" train -c "$cfg" --out "$tmp/vit" "${small[@]}"    # would overwrite the run
head -c 5000 "$tmp/fm/t10k-images-idx3-ubyte" > "$tmp/cut" && mv "$tmp/cut" "$tmp/fm/t10k-images-idx3-ubyte"
expect_error "t10k-images-idx3-ubyte: 4984 value bytes after the header" "$bin" eval "$tmp/vit"
grep "t10k-images-idx3-ubyte" "$tmp/err" > /dev/null
rm "$tmp/fm/train-labels-idx1-ubyte"
expect_error "no train-labels-idx1-ubyte or train-labels-idx1-ubyte.gz" "$bin" train -c "$cfg" --out "$tmp/bad" "${small[@]}"
expect_error "nowhere: no train-images-idx3-ubyte" "$bin" eval "$tmp/vit" --data "$tmp/nowhere"
echo "cli textbook: passed"
