#!/usr/bin/env bash
# `spanformer report`: the page is self-contained, Chromium (headless) draws it with data in every chart,
# live mode reloads while a run writes and turns static when it ends, PAR runs get their block charts.
set -euo pipefail
py="${SPANFORMER_PYTHON:-/usr/bin/python3}"  # a Python with torch (CTest passes the one whose LibTorch the build uses)
bin="$1"; src="$2"
tmp=$(mktemp -d)
trap 'kill $(jobs -p) 2> /dev/null || true; rm -rf "$tmp"' EXIT
browser=$(command -v chromium || command -v chromium-browser || true)
test -n "$browser" || { echo "cli_report: chromium is not installed (scripts/install-deps.sh installs it)"; exit 1; }
head -c 200000 "$src/../shared/data/dickens.txt" > "$tmp/dickens.txt"
"$bin" data prepare "$tmp/dickens.txt" --out "$tmp/data" --crlf-to-lf > /dev/null
cat > "$tmp/c.json" <<JSON
{"model": {"nb_layers": 2, "hidden_size": 32, "inner_hidden_size": 64, "nb_heads": 4, "attn_span": 64,
           "block_size": 32, "adapt_span_init": 0.2},
 "train": {"batch_size": 4, "nb_steps": 40, "eval_interval": 10, "eval_blocks": 2, "lr_warmup": 10}}
JSON
"$bin" train -c "$tmp/c.json" --data "$tmp/data" --out "$tmp/run" --stop-after 20 --quiet > /dev/null

# Live: the page reloads itself while the run is unfinished, and is final once the run reached nb_steps.
"$bin" report "$tmp/run" --live 1 > "$tmp/live.out" &
live=$!
for _ in $(seq 50); do test -s "$tmp/run/report.html" && break; sleep 0.2; done
grep -q '<meta http-equiv="refresh" content="1">' "$tmp/run/report.html"
"$bin" train -c "$tmp/c.json" --data "$tmp/data" --out "$tmp/run" --resume --quiet > /dev/null
wait "$live"
grep -q "is final" "$tmp/live.out"
if grep -q 'http-equiv="refresh"' "$tmp/run/report.html"; then echo "FAIL: the final page still reloads"; exit 1; fi

# Self-contained: no script, style or picture is fetched from anywhere.
"$bin" report "$tmp/run" --out "$tmp/report.html" | grep -q "report: $tmp/report.html"
if grep -qiE '<script[^>]+src=|<link[^>]+href=|<img[^>]+src=' "$tmp/report.html"; then echo "external resource"; exit 1; fi
grep -q "uPlot" "$tmp/report.html"

# Chromium draws it: one chart per curve (bpc, loss, tokens/s, step time, lr, 2 span layers), each with data.
flags=(--headless --no-sandbox --disable-gpu --hide-scrollbars --virtual-time-budget=4000 --user-data-dir="$tmp/chrome")
"$browser" "${flags[@]}" --dump-dom "file://$tmp/report.html" 2> /dev/null > "$tmp/dom.html"
grep -q 'data-charts="7"' "$tmp/dom.html"
test "$(grep -o 'data-points="[0-9]*"' "$tmp/dom.html" | grep -vc 'data-points="0"')" -eq 7
grep -q "Span grid at step 40" "$tmp/dom.html"
"$browser" "${flags[@]}" --window-size=1280,1600 --screenshot="$tmp/shot.png" "file://$tmp/report.html" > /dev/null 2>&1
"$py" "$src/tests/png_check.py" "$tmp/shot.png" | tee "$tmp/shot.txt"
"$py" -c 'import re, sys
drawn, colours = map(float, re.search(r"([0-9.]+)% drawn, ([0-9]+) colours", open(sys.argv[1]).read()).groups())
assert drawn > 3 and colours > 50, (drawn, colours)  # a blank page is 0% drawn' "$tmp/shot.txt"

# A PAR super-network: one chart per block with the three probabilities.
head -n 300 "$src/../shared/data/wikitext-2/wiki.valid.tokens" > "$tmp/w.tokens"
"$bin" data words --train "$tmp/w.tokens" --valid "$tmp/w.tokens" --test "$tmp/w.tokens" --out "$tmp/wt" > /dev/null
cat > "$tmp/xl.json" <<JSON
{"arch": "xl", "model": {"n_layer": 2, "d_model": 32, "n_head": 2, "d_head": 16, "d_inner": 64, "tgt_len": 16,
                         "mem_len": 16, "search": true},
 "train": {"batch_size": 4, "nb_steps": 20, "eval_interval": 10, "eval_segments": 2}}
JSON
"$bin" train -c "$tmp/xl.json" --data "$tmp/wt" --out "$tmp/par" --quiet > /dev/null
"$bin" report "$tmp/par" > /dev/null
"$browser" "${flags[@]}" --dump-dom "file://$tmp/par/report.html" 2> /dev/null > "$tmp/par_dom.html"
grep -q "PAR block probabilities over training" "$tmp/par_dom.html"
grep -q "block 3" "$tmp/par_dom.html"

# Mistakes: one line, non-zero exit, nothing written.
expect_error() {
  local want="$1"; shift
  if "$@" > "$tmp/err.out" 2>&1; then echo "expected failure: $*"; exit 1; fi
  grep -q "$want" "$tmp/err.out" || { echo "wanted '$want', got: $(cat "$tmp/err.out")"; exit 1; }
  test "$(wc -l < "$tmp/err.out")" -eq 1 || { cat "$tmp/err.out"; exit 1; }
}
expect_error "is not a run directory" "$bin" report "$tmp/nowhere"
mkdir "$tmp/empty"
expect_error "config.json not found" "$bin" report "$tmp/empty" --out "$tmp/e.html"
test ! -e "$tmp/e.html"
cp "$tmp/run/config.json" "$tmp/empty/config.json"
printf '{"step": 10}\nnot json\n{"step": 20}\n' > "$tmp/empty/log.jsonl"
expect_error "log.jsonl line 2 is not JSON" "$bin" report "$tmp/empty"
echo "cli report: passed"
