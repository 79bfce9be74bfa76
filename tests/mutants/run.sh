#!/usr/bin/env bash
# Each command-line test script against a spanformer with one wrong behaviour (tests/mutants/spanformer).
# First every script runs with the pass-through wrapper and must pass: a script that fails there would
# "kill" every mutant for the wrong reason. Then each mutant counts as killed only when its script fails
# and the log names the check meant to catch it (the third field, printed by that check's FAIL line);
# exit 77 (skipped), 124 (timed out) and 127 (command not found) are harness errors, not kills.
#
#   bash tests/mutants/run.sh build/spanformer                  every script (about 40 minutes on 2 cores)
#   bash tests/mutants/run.sh build/spanformer cli_gpt.sh ...   the mutants of these scripts only
#
# Logs: $MUTANT_LOGS (default /tmp/spanformer-mutants)/SCRIPT.baseline.log and MUTATION.log.
# scripts/hooks/pre-commit runs it for the scripts a commit changes.
set -uo pipefail
cd "$(dirname "$0")/../.."
real=$(realpath "${1:?usage: run.sh BUILD/spanformer [SCRIPT.sh...]}"); shift
export SPANFORMER_REAL="$real" SPANFORMER_PYTHON="${SPANFORMER_PYTHON:-$PWD/.venv/bin/python}"
mutant="$PWD/tests/mutants/spanformer"
logs="${MUTANT_LOGS:-/tmp/spanformer-mutants}"
mkdir -p "$logs"
# script | mutation | the check that must catch it (text of its FAIL line)
cases=(
  "cli_errors.sh|errors_exit0|FAIL: a refused input must exit non-zero"
  "cli_gpt.sh|attention_nopng|FAIL: picture drawn"
  "cli_gpt.sh|picture_blank|FAIL: picture drawn"
  "cli_gpt.sh|bench_absurd|FAIL: bench figures plausible"
  "cli_gpt.sh|ppl_not_exp|FAIL: ppl = exp(nll)"
  "cli_gpt.sh|lsh_hashes_ignored|FAIL: --lsh_hashes changes the figure"
  "cli_gpt.sh|seed_ignored|FAIL: --seed changes the sample"
  "cli_gpt.sh|ppl_text_off|FAIL: the printed test ppl is eval --json's"
  "cli_seq2seq.sh|translate_dropline|FAIL: three lines translated"
  "cli_seq2seq.sh|translate_empty|FAIL: translations non-empty"
  "cli_seq2seq.sh|bleu_zero|BLEU of a learnt language"
  "cli_seq2seq.sh|bleu_zero_subwords|FAIL: subword BLEU of a learnt language"
  "cli_seq2seq.sh|translate_beam_empty|FAIL: translations non-empty (beam 2)"
  "cli_seq2seq.sh|picture_blank|FAIL: picture drawn"
  "cli_seq2seq.sh|bench_absurd|FAIL: bench figures plausible"
  "cli_textbook.sh|pooling_nofits|FAIL: picture drawn"
  "cli_textbook.sh|picture_blank|FAIL: picture drawn"
  "cli_textbook.sh|bench_absurd|FAIL: bench figures plausible"
  "cli_textbook.sh|bench_text_absurd|FAIL: bench's images/s x ms/step is the batch of 8"
  "cli_textbook.sh|seed_ignored|--seed changes the example's draw"
  "cli_xl.sh|derive_silent|FAIL: the warning of a derived model without attention"
  "cli_xl.sh|derive_warns|FAIL: warning for a model with attention"
  "cli_xl.sh|picture_blank|FAIL: picture drawn"
  "cli_xl.sh|ppl_not_exp|FAIL: ppl = exp(nll)"
  "cli_formats.sh|import_accepts|FAIL: a stale spanformer.sha256 accepted"
  "cli_faults.sh|eval_fails|on the undamaged checkpoint"
  "cli_reference.sh|eval_ids_shift|FAIL: valid bpc"
  "cli_end_to_end.sh|eval_nproc_differs|FAIL: distributed evaluation"
  "cli_report.sh|report_refresh|FAIL: the final page still reloads"
)
wanted() { [ $# -eq 0 ] && return 0; local s; for s in "${only[@]}"; do [ "$s" = "$1" ] && return 0; done; return 1; }
only=("$@")
run_script() {  # run_script SCRIPT LOG [MUT]: the script's exit status
  MUT="${3:-}" timeout 1200 bash "tests/$1" "$mutant" "$PWD" > "$2" 2>&1
}
harness=0 survived=0 killed=0 elsewhere=0
declare -A baseline_ok
for c in "${cases[@]}"; do
  IFS='|' read -r script mutation check <<< "$c"
  { [ ${#only[@]} -eq 0 ] || wanted "$script" "${only[@]}"; } || continue
  if [ -z "${baseline_ok[$script]+x}" ]; then
    run_script "$script" "$logs/${script%.sh}.baseline.log"; rc=$?
    baseline_ok[$script]=$rc
    if [ "$rc" -eq 0 ]; then echo "baseline: $script passes through the wrapper"
    else echo "HARNESS: $script fails through the pass-through wrapper (exit $rc, $logs/${script%.sh}.baseline.log)"; fi
  fi
  if [ "${baseline_ok[$script]}" -ne 0 ]; then harness=$((harness + 1)); continue; fi
  log="$logs/$mutation.${script%.sh}.log"
  run_script "$script" "$log" "$mutation"; rc=$?
  case "$rc" in
    0) echo "SURVIVED: $script under $mutation (the check '$check' did not fire)"; survived=$((survived + 1)) ;;
    77|124|127) echo "HARNESS: $script under $mutation exited $rc (skipped, timed out or a command missing)"; harness=$((harness + 1)) ;;
    *) if grep -qF -- "$check" "$log"; then echo "killed: $script under $mutation by '$check'"; killed=$((killed + 1))
       else echo "ELSEWHERE: $script under $mutation failed (exit $rc) but not by '$check': $(grep -m1 FAIL "$log")"
            elsewhere=$((elsewhere + 1)); fi ;;
  esac
done
echo "mutants: $killed killed by their check, $survived survived, $elsewhere failed elsewhere, $harness harness errors"
[ "$survived" -eq 0 ] && [ "$elsewhere" -eq 0 ] && [ "$harness" -eq 0 ]
