#!/usr/bin/env bash
# docs/config.md, written from the key tables themselves (`spanformer config keys --arch A` for every
# family `spanformer config families` lists): a key's name, type, default and help have one home, the
# family's key table (src/config/<name>_config.cpp), and the docs are its printout.
#   bash scripts/config-docs.sh [SPANFORMER]           rewrite docs/config.md (default build/spanformer)
#   bash scripts/config-docs.sh --check [SPANFORMER]   exit 1 naming the first difference (test docs.config_keys)
set -euo pipefail
cd "$(dirname "$0")/.."
check=0
if [ "${1:-}" = "--check" ]; then check=1; shift; fi
bin=${1:-build/spanformer}
[ -x "$bin" ] || { echo "config-docs: $bin is not built (bash scripts/build.sh)" >&2; exit 1; }

render() {
  cat <<'HEAD'
# Config keys

Every key of every family's config, as `spanformer config keys --arch <family>` prints it: section.key,
type, default, meaning. This page is that printout (`bash scripts/config-docs.sh` writes it; the test
`docs.config_keys` fails when it differs from the program). A config file is JSON with an `"arch"` and
these sections; any key can also be given after a command as `--key=value` or `--section.key=value`.
`model` keys are what the weights mean (a checkpoint fits a config whose `model` keys are equal), `run`
keys how they run (commands reading a checkpoint may override them), `train` the optimisation, shared by
every family ([usage](usage.md#what-a-run-writes): sections, checkpoints and overrides). A key of type
`choice` takes one of the names in brackets, which come from the one name table its parser reads.
HEAD
  "$bin" config families | while read -r arch what; do
    printf '\n## %s\n%s\n\n```text\n' "$arch" "$what"
    "$bin" config keys --arch "$arch" | grep -v '^#'
    printf '```\n'
  done
}

if [ "$check" = 1 ]; then
  tmp=$(mktemp)
  trap 'rm -f "$tmp"' EXIT
  render > "$tmp"
  if ! diff -u docs/config.md "$tmp" > "$tmp.diff"; then
    echo "config-docs: docs/config.md differs from the key tables (bash scripts/config-docs.sh rewrites it):" >&2
    grep -m 3 '^[-+][^-+]' "$tmp.diff" >&2 || true
    rm -f "$tmp.diff"
    exit 1
  fi
  rm -f "$tmp.diff"
  echo "config-docs: docs/config.md equals the key tables of $("$bin" config families | wc -l) families"
else
  render > docs/config.md.tmp && mv docs/config.md.tmp docs/config.md
  echo "config-docs: wrote docs/config.md"
fi
