#!/usr/bin/env bash
# The seq2seq family through the engine's commands: training with a stop and resume, eval with BLEU,
# translate (text, file), alignment pictures, bench, on a synthetic word-for-word language that a tiny
# Transformer learns in a few hundred steps (so BLEU must be high), then a short run on the real
# French-English pairs; SentencePiece subwords; and the user mistakes (one line, non-zero exit).
set -euo pipefail
py="${SPANFORMER_PYTHON:-/usr/bin/python3}"  # a Python with torch (CTest passes the one whose LibTorch the build uses)
bin="$1"; src="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
source "$(dirname "$0")/cli_checks.sh"

"$py" - "$tmp/pairs.txt" <<'PY'
import random, sys
random.seed(4)
en = "i you we see like the a cat dog house red big small".split()
fr = "je tu nous vois aime le un chat chien maison rouge grand petit".split()
with open(sys.argv[1], "w") as f:
    for _ in range(3000):
        idx = [random.randrange(len(en)) for _ in range(random.randint(1, 6))]
        f.write(" ".join(en[i] for i in idx).capitalize() + ".\t" + " ".join(fr[i] for i in idx).capitalize() + " .\n")
PY
cfg="$src/configs/seq2seq/transformer.json"
small=(--data "$tmp/pairs.txt" --d_model=32 --n_layer=1 --n_head=2 --d_inner=64 --dropout=0 --max_length=8
       --valid_pairs=200 --test_pairs=200 --batch_size=32 --nb_steps=300 --eval_interval=150 --lr_warmup=30
       --lr=3e-3 --eval_batch_size=100)
"$bin" config keys --arch seq2seq | grep "model.kind" > /dev/null
"$bin" train -c "$cfg" --out "$tmp/tf" "${small[@]}" --stop-after 100 --quiet > /dev/null
"$bin" train -c "$cfg" --out "$tmp/tf" "${small[@]}" --resume --quiet | tee "$tmp/train.out"
grep "trained 300 steps" "$tmp/train.out" > /dev/null
"$py" - "$tmp/tf/log.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1])]
assert [r["step"] for r in rows] == [150, 300], rows
assert rows[-1]["valid_loss"] < rows[0]["valid_loss"] and rows[-1]["valid_bleu"] > 50, ("BLEU of a learnt language", rows)
assert all(r["target_tokens_per_s"] > 0 and r["pairs_per_s"] > 0 for r in rows), rows
PY
"$bin" eval "$tmp/tf" --json > "$tmp/eval.json"
"$bin" eval "$tmp/tf" --split valid --beam=1 --json > "$tmp/valid.json"
"$py" - "$tmp/eval.json" "$tmp/valid.json" "$tmp/tf/log.jsonl" <<'PY'
import json, math, re, sys
test, valid = json.load(open(sys.argv[1])), json.load(open(sys.argv[2]))
last = [json.loads(l) for l in open(sys.argv[3])][-1]
assert test["split"] == "test" and test["target_tokens"] > 200 and test["bleu"] > 50, ("BLEU of a learnt language", test)
# the BLEU line carries the same score, and the score is BP x the geometric mean of its four precisions
# (printed to 0.1, so to 0.5%)
m = re.match(r"BLEU ([0-9.]+) ([0-9.]+)/([0-9.]+)/([0-9.]+)/([0-9.]+) \(BP ([0-9.]+)", test["bleu_text"])
assert m and m.group(1) == f"{test['bleu']:.2f}", ("the BLEU line and the figure agree", test)
p = [float(m.group(i)) for i in range(2, 6)]
assert abs(float(m.group(6)) * math.exp(sum(map(math.log, p)) / 4) - test["bleu"]) < 5e-3 * test["bleu"], ("BLEU = BP x geometric mean of the precisions", test)
# greedy on the valid split: the command and the training run's validation agree
assert abs(valid["bleu"] - last["valid_bleu"]) < 1e-9 and abs(valid["nll"] - last["valid_loss"]) < 1e-9, (valid, last)
PY
"$bin" translate "$tmp/tf" --text "Je vois le chat ." --text "Nous aimons" > "$tmp/out.txt"
test "$(wc -l < "$tmp/out.txt")" -eq 2 || fail "two lines translated: $(cat "$tmp/out.txt")"
test "$(grep -c . "$tmp/out.txt")" -eq 2 || fail "translations non-empty: $(cat "$tmp/out.txt")"
grep -q "^i see the cat\.$" "$tmp/out.txt" || fail "the learnt translation: $(cat "$tmp/out.txt")"
printf 'Tu vois un chien rouge .\n\nLe chat .\n' > "$tmp/in.txt"
"$bin" translate "$tmp/tf" --file "$tmp/in.txt" --beam 1 --out "$tmp/translated.txt" 2> /dev/null
test "$(wc -l < "$tmp/translated.txt")" -eq 3 || fail "three lines translated: $(cat "$tmp/translated.txt")"
test -z "$(sed -n 2p "$tmp/translated.txt")" || fail "an empty line stays empty"
grep -q "^you see a red dog\.$" "$tmp/translated.txt" || fail "the learnt translation: $(cat "$tmp/translated.txt")"
"$bin" attention "$tmp/tf" --text "Je vois le chat ." --out "$tmp/align.png" | grep "i see the cat" > /dev/null
"$bin" attention "$tmp/tf" --pair 0 3 --layer 0 --head 1 --out "$tmp/head.png" | grep "reference:" > /dev/null
picture_drawn "$tmp/align.png" "$tmp/head.png"
"$bin" bench -c "$cfg" --steps 1 --warmup 0 --n_layer=1 --batch_size=8 | grep "target tokens/s" > /dev/null
"$bin" bench -c "$cfg" --steps 1 --warmup 0 --n_layer=1 --batch_size=8 --json 2> /dev/null > "$tmp/bench.json"
bench_plausible "$tmp/bench.json"

# The recurrent kinds run through the same commands.
for kind in gru bahdanau luong; do
  "$bin" train -c "$src/configs/seq2seq/$kind.json" --out "$tmp/$kind" "${small[@]}" --nb_steps=20 --eval_interval=20 --quiet > /dev/null
  "$bin" translate "$tmp/$kind" --text "Le chat ." > "$tmp/$kind.txt"
  test "$(grep -c . "$tmp/$kind.txt")" -eq 1 || fail "translations non-empty ($kind): $(cat "$tmp/$kind.txt")"
done
"$bin" attention "$tmp/luong" --text "Le chat ." --out "$tmp/luong.png" > /dev/null
picture_drawn "$tmp/luong.png"
expect_error "the gru model has no attention (kind gru)" "$bin" attention "$tmp/gru" --text "Le chat ." --out "$tmp/gru.png"
expect_error "luong attention scores with dot or general (got additive)" "$bin" train -c "$src/configs/seq2seq/luong.json" --out "$tmp/bad" "${small[@]}" --score=additive
expect_error "bidirectional is for the recurrent kinds" "$bin" train -c "$cfg" --out "$tmp/bad" "${small[@]}" --bidirectional=true   # the Transformer
# bahdanau.json's encoder is bidirectional: its weights (the "_reverse" directions) survive safetensors.
"$bin" attention "$tmp/bahdanau" --text "Le chat ." --out "$tmp/bahdanau.png" > /dev/null
picture_drawn "$tmp/bahdanau.png"
"$bin" export safetensors "$tmp/bahdanau" -o "$tmp/bahdanau.safetensors" > /dev/null
"$bin" import safetensors "$tmp/bahdanau.safetensors" -o "$tmp/bahdanau_again.pt" > /dev/null
"$bin" translate "$tmp/bahdanau_again.pt" --text "Le chat ." --beam 1 | cmp - <("$bin" translate "$tmp/bahdanau" --text "Le chat ." --beam 1)

# SentencePiece subwords by flag: a stopped and resumed run, then translation from the checkpoint alone
# (the pairs file gone), the same through an exported and re-imported safetensors file.
# 200 steps learn the synthetic language in subwords too: valid BLEU 31 (greedy) on the Zen 5 VM.
sp=(--tokenizer=sentencepiece --subword_vocab=48 --nb_steps=200 --eval_interval=100)
cp "$tmp/pairs.txt" "$tmp/sp_pairs.txt"
sp_small=("${small[@]/pairs.txt/sp_pairs.txt}" "${sp[@]}")  # --data names the copy
"$bin" train -c "$cfg" --out "$tmp/sp" "${sp_small[@]}" --stop-after 100 --quiet > /dev/null
"$bin" train -c "$cfg" --out "$tmp/sp" "${sp_small[@]}" --resume --quiet | grep "trained 200 steps" > /dev/null
"$bin" eval "$tmp/sp" --split valid --beam=1 --json > "$tmp/sp_eval.json"
"$bin" eval "$tmp/sp" --split valid --beam=1 > "$tmp/sp_eval.txt"
"$py" - "$tmp/sp_eval.json" "$tmp/sp/log.jsonl" <<'PY' || exit 1
import json, math, sys
r = json.load(open(sys.argv[1]))
last = [json.loads(l) for l in open(sys.argv[2])][-1]
if not (r["bleu"] > 10 and math.isfinite(r["nll"]) and r["target_tokens"] > 0):
    sys.exit(f"FAIL: subword BLEU of a learnt language: {r}")
# greedy on the valid split: the command and the training run's last validation agree
if abs(r["bleu"] - last["valid_bleu"]) > 1e-9 or abs(r["nll"] - last["valid_loss"]) > 1e-9:
    sys.exit(f"FAIL: subword BLEU is the run's last valid_bleu: eval {r['bleu']}, {r['nll']}; log {last}")
PY
printed_figure "$tmp/sp_eval.txt" "BLEU ([0-9.]+)" "$("$py" -c 'import json, sys; print(repr(json.load(open(sys.argv[1]))["bleu"]))' "$tmp/sp_eval.json")" \
  "the printed subword BLEU is eval --json's"
rm "$tmp/sp_pairs.txt"
"$bin" translate "$tmp/sp" --text "Je vois le chat ." --beam 1 > "$tmp/sp.txt"
test "$(grep -c . "$tmp/sp.txt")" -eq 1 || fail "translations non-empty (subwords): $(cat "$tmp/sp.txt")"
"$bin" export safetensors "$tmp/sp" -o "$tmp/sp.safetensors" > /dev/null
"$bin" import safetensors "$tmp/sp.safetensors" -o "$tmp/sp_again.pt" > /dev/null
"$bin" translate "$tmp/sp_again.pt" --text "Je vois le chat ." --beam 1 | cmp - "$tmp/sp.txt"
expect_error "tokenizer must be words or sentencepiece (got 'bytes')" "$bin" train -c "$cfg" --out "$tmp/bad" "${small[@]}" --tokenizer=bytes
expect_error "data.subword_vocab must be in [16, 1000000] (got 8)" "$bin" train -c "$cfg" --out "$tmp/bad" "${small[@]}" --tokenizer=sentencepiece --subword_vocab=8

expect_error "translate: give --text or --file (one of them)" "$bin" translate "$tmp/tf"
expect_error "translate: give --text or --file (one of them)" "$bin" translate "$tmp/tf" --text "x" --file "$tmp/in.txt"
expect_error "--beam must be positive (got 0)" "$bin" translate "$tmp/tf" --text "Le chat ." --beam 0
expect_error "file not found: $tmp/missing.txt" "$bin" translate "$tmp/tf" --file "$tmp/missing.txt"
expect_error "--beam must be positive (got -3)" "$bin" translate "$tmp/tf" --text "   ."  --beam -3
expect_error "--beam must be positive (got -1)" "$bin" translate "$tmp/tf" --text "Le chat ." --beam -1   # not "the config's"
expect_error "beam 1000000 is wider than the target vocabulary" "$bin" translate "$tmp/tf" --text "Le chat ." --beam 1000000
expect_error "--length-penalty must be a finite number >= 0 (got nan)" "$bin" translate "$tmp/tf" --text "Le chat ." --length-penalty nan
# A sentence longer than model.max_positions (256 here) is refused before any work, by every kind (a
# 100,000-word line took a recurrent model 8 GB and half a minute), the line shown by its first words.
long_line=$(printf 'le chat %.0s' $(seq 1 150))
expect_error "translate: 'le chat le chat le chat le chat le chat le chat le chat le c...' has 300 tokens, more than the model's max_positions 256" \
  "$bin" translate "$tmp/gru" --text "$long_line"
expect_error "has 300 tokens, more than the model's max_positions 256" "$bin" translate "$tmp/tf" --text "$long_line"
expect_error "pair 200 is outside the test split (0 .. 199)" "$bin" attention "$tmp/tf" --pair 200
expect_error "--layer must be in [0, 1) (got 1)" "$bin" attention "$tmp/tf" --text "Le chat ." --layer 1
expect_error "unknown split 'dev' (train, valid or test)" "$bin" eval "$tmp/tf" --split dev
expect_error "kind must be gru, bahdanau, luong or transformer (got 'lstm')" "$bin" train -c "$cfg" --out "$tmp/bad" "${small[@]}" --kind=lstm
expect_error "missing.txt" "$bin" train -c "$cfg" --out "$tmp/bad" "${small[@]/pairs.txt/missing.txt}"  # --data names a file that is not there
expect_error "3000 pairs of 1..8 tokens, too few for 200 valid and 3000 test pairs" "$bin" train -c "$cfg" --out "$tmp/bad" "${small[@]}" --test_pairs=3000
expect_error "d_model (33) must be a multiple of n_head (2)" "$bin" train -c "$cfg" --out "$tmp/bad" "${small[@]}" --d_model=33
expect_error "already holds a run: continue it with --resume, or replace it with --overwrite" "$bin" train -c "$cfg" --out "$tmp/tf" "${small[@]}"    # would overwrite the run

# The real pairs (../shared/data/fra-eng): the file and config as docs/usage.md's command reads them.
fra="$src/../shared/data/fra-eng/fra.txt"
if [ ! -f "$fra" ]; then echo "cli seq2seq: synthetic runs passed; fra-eng skipped (../shared/data missing)"; exit 77; fi
"$bin" train -c "$cfg" --out "$tmp/fra" --data "$fra" --d_model=32 --n_layer=1 --n_head=2 --d_inner=64 --batch_size=32 \
  --nb_steps=10 --eval_interval=10 --valid_pairs=100 --quiet | grep "trained 10 steps" > /dev/null
grep '"valid_bleu"' "$tmp/fra/log.jsonl" > /dev/null
"$bin" translate "$tmp/fra" --text "Il fait beau aujourd'hui." --text "Je suis content." --beam 2 > "$tmp/fra_out.txt"
test "$(grep -c . "$tmp/fra_out.txt")" -eq 2 || fail "translations non-empty (beam 2): $(cat "$tmp/fra_out.txt")"
