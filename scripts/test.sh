#!/usr/bin/env bash
# Everything CI checks (.ci/run runs this), in stages; installs what it needs first (idempotent), so it
# works on a fresh machine before or after scripts/demo.sh.
#   bash scripts/test.sh                  every stage, in this order
#   bash scripts/test.sh suite python     some of them
# Stages:
#   suite    LibTorch 2.x (PyPI's torch in .venv) in build/: the whole CTest suite (C++, command line,
#            Python operators and checkpoints, the CPU model of CUDA running the CUDA kernels)
#   system   Debian's LibTorch 1.13 in build-system/: the same suite but the long fault sweep (the
#            reference fixtures included)
#   cuda     the CUDA build against PyPI's CUDA LibTorch in build-cuda/: kernels, glue, NCCL, tests and the
#            operator module compiled and linked; the cuda-labelled tests, which skip without a GPU
#   python   the package: `pip install .` in a fresh virtual environment (with PyPI's torch), then `pip
#            wheel .` and that wheel in another fresh one; each runs the Python tests against the
#            installed copy and its `spanformer` command
# and one stage that runs only when named (too long for CI's time; docs/reliability.md has its figures):
#   sanitize the suite stage's CTest suite built with AddressSanitizer and UndefinedBehaviorSanitizer
#            (-DSPANFORMER_SANITIZE=ON in build-asan/; LibTorch itself is not instrumented), leaks
#            checked with tests/sanitize/lsan.supp; the Python tests are left out (the operator module
#            would need the sanitizer runtime preloaded into Python)
# Extra arguments to a single stage go to CTest: bash scripts/test.sh suite -R Flash
set -euo pipefail
cd "$(dirname "$0")/.."
all=(suite system cuda python)
stages=() ctest_args=()
for arg in "$@"; do
  case "$arg" in
    suite|system|cuda|python|sanitize) stages+=("$arg") ;;
    *) ctest_args+=("$arg") ;;
  esac
done
[ ${#stages[@]} -eq 0 ] && stages=("${all[@]}")

bash scripts/install-deps.sh
export GOMP_SPINCOUNT="${GOMP_SPINCOUNT:-10000}"  # see cli/main.cpp: OpenMP spinning slows OpenBLAS on small machines
venv="${SPANFORMER_VENV:-$PWD/.venv}"
summary=()

# A test that skips fails CI unless it needs a GPU (label cuda) and none is here: a test that stopped
# running must not pass as green. GoogleTest's GTEST_SKIP, a script's exit 77 and pytest's skips
# (SPANFORMER_NO_SKIPS, tests/python/conftest.py) all count.
export SPANFORMER_NO_SKIPS=1
run_ctest() {  # build folder, then CTest arguments
  local dir=$1; shift
  local log="$dir/Testing/test-sh.log"
  mkdir -p "$dir/Testing"
  (cd "$dir" && ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@") | tee "$log"
  local skipped unexpected=()
  skipped=$(sed -nE 's/^[[:space:]]*[0-9]+ - (.*) \(Skipped\)$/\1/p' "$log")
  for name in $skipped; do
    (cd "$dir" && ctest -N -L '^cuda$' -R "^${name//./\\.}\$" | grep -q "Total Tests: 1") || unexpected+=("$name")
  done
  if [ ${#unexpected[@]} -gt 0 ]; then
    echo "test: skipped where nothing may skip: ${unexpected[*]} (see $log)" >&2
    return 1
  fi
}

stage_suite() {
  bash scripts/build.sh
  run_ctest build "${ctest_args[@]}"
}

stage_system() {
  bash scripts/build.sh --torch system
  run_ctest build-system -E "^cli.faults_slow$" "${ctest_args[@]}"
}

stage_cuda() {
  command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
    { echo "test: the cuda stage needs nvcc (the CUDA toolkit)" >&2; return 1; }
  PATH="$PATH:/usr/local/cuda/bin" bash scripts/build.sh --cuda
  # Without a GPU every cuda-labelled test must report itself skipped (CTest: "Not Run ... Skipped").
  run_ctest build-cuda -L cuda "${ctest_args[@]}"
}

stage_sanitize() {
  bash scripts/build.sh --dir build-asan -DSPANFORMER_SANITIZE=ON -DSPANFORMER_BENCH=OFF -DSPANFORMER_PYTHON=OFF
  ASAN_OPTIONS="detect_leaks=1:allocator_may_return_null=0" LSAN_OPTIONS="suppressions=$PWD/tests/sanitize/lsan.supp:print_suppressions=0" \
    UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1" run_ctest build-asan "${ctest_args[@]}"
}

stage_python() {
  local tmp pytest_pin
  tmp=$(mktemp -d)
  trap 'rm -rf "$tmp"' RETURN
  pytest_pin="pytest==$(sed -n 's/^pytest==//p' python/requirements.txt)"
  # 1. What a user types: `pip install .` in a fresh virtual environment (pip builds in an isolated
  #    environment with the pinned torch, and installs that torch from PyPI beside the package).
  /usr/bin/python3 -m venv "$tmp/a"
  "$tmp/a/bin/python" -m pip install --quiet --disable-pip-version-check . "$pytest_pin"
  run_pytest "$tmp/a"
  # 2. `pip wheel .` makes a wheel that installs into another fresh environment.
  "$tmp/a/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$tmp/dist" .
  local wheel
  wheel=$(ls "$tmp/dist"/spanformer-*.whl)
  echo "test: built $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"
  /usr/bin/python3 -m venv "$tmp/b"
  "$tmp/b/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel" "$pytest_pin"
  run_pytest "$tmp/b"
}

# The Python tests against the package installed in a virtual environment, from outside the checkout
# (so `import spanformer` finds the installed copy), with its `spanformer` command first on PATH. The
# oracle tests need the test-only packages (sacrebleu, transformers, ...), which a user's environment
# does not have: the suite stage runs them (CTest's python.oracles, with .venv).
run_pytest() {
  local env=$1 src=$PWD
  (cd "$env" && env -u SPANFORMER_TORCH_OPS -u SPANFORMER_CLI PATH="$env/bin:$PATH" PYTHONDONTWRITEBYTECODE=1 \
     "$env/bin/python" -m pytest -q -p no:cacheprovider --ignore="$src/tests/python/test_oracles.py" "$src/tests/python")
}

for stage in "${stages[@]}"; do
  echo "=== test: stage $stage ==="
  start=$(date +%s)
  "stage_$stage"
  summary+=("$stage $(( $(date +%s) - start )) s")
done
echo "=== test: passed: ${summary[*]}"
