# The checks the command-line test scripts (tests/cli_*.sh) share, sourced after they set bin, py and tmp.
# Every check looks at a value a user would see (a figure, a picture, an error line), and a failing one
# prints one line "FAIL: <the check>: <what it saw>" and exits 1, so that the log of a failing run names
# the check that caught it (tests/mutants/run.sh requires that name).
checks_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

fail() {  # fail "the check: what was seen"
  echo "FAIL: $*" >&2
  exit 1
}

# expect_error "part of the message" command...: exits non-zero with one line "spanformer: error: ..."
# that contains the text.
expect_error() {
  local want="$1"; shift
  if "$@" > /dev/null 2> "$tmp/err"; then fail "a refused input must exit non-zero: $*"; fi
  if [ "$(grep -c . "$tmp/err")" -ne 1 ] || ! grep -q "^spanformer: error: " "$tmp/err" || ! grep -qF -- "$want" "$tmp/err"; then
    fail "one error line naming the mistake: $* -> $(cat "$tmp/err") (expected: $want)"
  fi
}

# picture_drawn FILE...: each is a PNG with at least 1% of its pixels off the background, in 4 or more
# colours (a blank or one-colour picture fails; every picture we draw has axes, labels and a colour scale).
picture_drawn() {
  local f
  for f; do
    [ -s "$f" ] || fail "picture drawn: $f is missing or empty"
    "$py" "$checks_dir/png_check.py" "$f" --min-drawn 1 --min-colours 4 > /dev/null || exit 1
  done
}

# bench_plausible FILE: `bench --json`'s record holds together: a step time and a peak memory a 2-core
# to 128-core machine can show, and a throughput that is the step's work over the step's time (the
# record's "what" names B and T, or B alone for images).
bench_plausible() {
  "$py" - "$1" <<'PY' || exit 1
import json, re, sys
r = json.loads(open(sys.argv[1]).read().strip().splitlines()[-1])
def need(ok, what):
    if not ok:
        sys.exit(f"FAIL: bench figures plausible: {what}: {r}")
need(0 < r["peak_rss_mb"] < 1e6, "peak RSS between 0 and 1 TB")
if "params" in r:  # the model's size, and the first step's mean NLL at initialisation: about ln V
    need(isinstance(r["params"], int) and r["params"] > 0, "a positive whole number of parameters")
    if r.get("first_loss") is not None:  # nats; V from 2 (2 bytes) to 16000 (seq2seq's words): 0.7 .. 9.7
        need(0.3 < r["first_loss"] < 12, "a first-step NLL near ln V")
if r["mode"] == "generate":
    for key in ("cached_tokens_per_s", "recomputed_tokens_per_s"):
        need(0.1 < r[key] < 1e7, f"{key} between 0.1 and 1e7")
    sys.exit(0)
step_ms = r.get("ms_per_step", r.get("ms_per_segment"))  # Transformer-XL's eval times a segment
need(0.01 < step_ms < 6e5, "a step between 0.01 ms and 10 minutes")
what = dict((k, int(v)) for k, v in re.findall(r"\b(B|T|M|tgt_len) (\d+)\b", r["what"]))
rate = next(k for k in r if k.endswith("_per_s"))
per_step = r[rate] * step_ms / 1e3
if rate == "tokens_per_s":  # B sequences of T tokens (M for adaptive span's blocks, tgt_len for XL's eval)
    expected = what["B"] * what.get("T", what.get("tgt_len", what.get("M", 0)))
elif rate == "images_per_s":
    expected = what["B"]
else:  # seq2seq: "B 8 pairs of 16 + 17 tokens", the target side counted
    expected = what["B"] * int(re.search(r"pairs of \d+ \+ (\d+) tokens", r["what"]).group(1))
need(abs(per_step - expected) <= 1e-6 * expected, f"{rate} x step time = {per_step:.3f}, not the step's {expected}")
PY
}

# same_figure A B what: two figures equal to 1e-6 relative (the same computation printed twice).
same_figure() {
  "$py" -c 'import sys; a, b = float(sys.argv[1]), float(sys.argv[2]); sys.exit(0 if abs(a - b) <= 1e-6 * max(abs(a), abs(b), 1e-30) else 1)' "$1" "$2" \
    || fail "$3: $1 vs $2"
}

# printed_figure FILE REGEX VALUE what: the number REGEX's first group finds in FILE (a command's text
# output) is VALUE (its --json twin) to the digits printed: within half a unit of the last digit shown.
printed_figure() {
  "$py" - "$1" "$2" "$3" "$4" <<'PY' || exit 1
import re, sys
text, pattern, value, what = open(sys.argv[1]).read(), sys.argv[2], float(sys.argv[3]), sys.argv[4]
m = re.search(pattern, text, re.M)
if not m:
    sys.exit(f"FAIL: {what}: no figure matching {pattern!r} in: {text.strip()[:300]}")
shown = m.group(1)
decimals = len(shown.split(".")[1]) if "." in shown else 0
if abs(float(shown) - value) > 0.5 * 10 ** -decimals * (1 + 1e-9) + 1e-12 * abs(value):
    sys.exit(f"FAIL: {what}: printed {shown}, --json {value!r}")
PY
}

# rate_consistent FILE COUNT what: a bench line "X ms/step, Y <unit>/s" holds together: Y x X / 1000 is
# the step's COUNT (images, tokens) to the digits printed.
rate_consistent() {
  "$py" - "$1" "$2" "$3" <<'PY' || exit 1
import re, sys
text, count, what = open(sys.argv[1]).read(), float(sys.argv[2]), sys.argv[3]
m = re.search(r"([0-9.]+) ms/step, ([0-9.]+) [a-z]+/s", text)
if not m:
    sys.exit(f"FAIL: {what}: no 'ms/step, .../s' line in: {text.strip()[:300]}")
ms, rate = float(m.group(1)), float(m.group(2))
unit = lambda s: 0.5 * 10 ** -(len(s.split(".")[1]) if "." in s else 0)
allowed = count * (unit(m.group(1)) / ms + unit(m.group(2)) / rate) + 1e-9
if abs(rate * ms / 1000 - count) > allowed:
    sys.exit(f"FAIL: {what}: {rate} /s x {ms} ms = {rate * ms / 1000:.3f}, not the step's {count}")
PY
}

# differ A B what: two outputs (files) that an option must make different.
differ() {
  if cmp -s "$1" "$2"; then fail "$3: the outputs are identical"; fi
}

# eval_consistent FILE: `eval --json`'s figure is its NLL in the printed unit: bpc = nll / ln 2, or
# ppl = exp(nll) (to 1e-9 relative: one double computation).
eval_consistent() {
  "$py" - "$1" <<'PY' || exit 1
import json, math, sys
r = json.loads(open(sys.argv[1]).read())
if "ppl" in r:
    ok, what = abs(r["ppl"] - math.exp(r["nll"])) <= 1e-9 * r["ppl"], "ppl = exp(nll)"
else:
    ok, what = abs(r["bpc"] - r["nll"] / math.log(2)) <= 1e-9 * r["bpc"], "bpc = nll / ln 2"
if not (ok and math.isfinite(r["nll"]) and r["nll"] > 0):
    sys.exit(f"FAIL: {what}: {r}")
PY
}
