#!/usr/bin/env bash
# Each command-line test script against a spanformer with one wrong behaviour (tests/mutants/spanformer):
# every script must fail (the third field names the check meant to catch the mutant; /tmp/mutant.MUT.log
# shows where it did). Not part of CI (5 to 8 minutes on 2 cores); run it after
# changing a script:   bash tests/mutants/run.sh build/spanformer
set -uo pipefail
cd "$(dirname "$0")/../.."
real=$(realpath "${1:?usage: run.sh BUILD/spanformer}")
export SPANFORMER_REAL="$real" SPANFORMER_PYTHON="${SPANFORMER_PYTHON:-$PWD/.venv/bin/python}"
mutant="$PWD/tests/mutants/spanformer"
survived=0
# script | mutation | what must catch it
cases=(
  "cli_errors.sh|errors_exit0|a refused input must exit non-zero"
  "cli_gpt.sh|attention_nopng|test -s att.png"
  "cli_seq2seq.sh|translate_dropline|three lines translated"
  "cli_textbook.sh|pooling_nofits|test -s fits.png"
  "cli_xl.sh|derive_silent|the warning of a derived model without attention"
  "cli_xl.sh|derive_warns|no warning for a derived model with attention"
  "cli_formats.sh|import_accepts|damaged and stale safetensors refused"
  "cli_faults.sh|eval_fails|the undamaged baseline"
  "cli_reference.sh|eval_ids_shift|bpc to 1e-4 of the reference"
  "cli_end_to_end.sh|eval_nproc_differs|distributed eval equals one process"
  "cli_report.sh|report_refresh|the final page does not reload"
)
for c in "${cases[@]}"; do
  IFS='|' read -r script mutation check <<< "$c"
  if MUT=$mutation timeout 900 bash "tests/$script" "$mutant" "$PWD" > /tmp/mutant.$mutation.log 2>&1; then
    echo "SURVIVED: $script under $mutation ($check)"; survived=$((survived + 1))
  else
    echo "killed: $script under $mutation ($check)"
  fi
done
echo "mutants: ${#cases[@]} run, $survived survived"
[ "$survived" -eq 0 ]
