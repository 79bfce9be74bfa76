#!/usr/bin/env bash
# Everything CI checks (.ci/run runs this), in stages; installs what it needs first (idempotent), so it
# works on a fresh machine before or after scripts/demo.sh.
#   bash scripts/test.sh                  every stage, in this order
#   bash scripts/test.sh suite python     some of them
# Stages:
#   suite    LibTorch 2.x (PyPI's torch in .venv) in build/: the whole CTest suite (C++, command line,
#            Python operators and checkpoints, the CPU model of CUDA running the CUDA kernels)
#   system   Debian's LibTorch 1.13 in build-system/: the suite but the `slow` label and the long
#            command-line scripts (system_skip below)
#   cuda     the CUDA build against PyPI's CUDA LibTorch in build-cuda/: without a GPU (CI) the kernels,
#            glue and NCCL backend compiled and linked into the tool and the operator module, both loaded;
#            with one, everything built and the cuda-labelled tests run
#   python   the package: `pip wheel .` (the build `pip install .` runs), that wheel installed into a
#            fresh virtual environment (with PyPI's torch), the Python tests against the installed copy
#            and its `spanformer` command
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
  # One LibTorch thread a test (OMP_NUM_THREADS: the test binary, the tool's default, Python's torch)
  # while CTest runs one test per core: two tests of two threads each on two cores wait on each other's
  # parallel regions (two GPT training tests side by side: 105.9 s with 2 threads each, 12.9 s with 1;
  # 2-core AMD EPYC with AVX2; docs/testing.md). A test that sets train.threads keeps its count.
  (cd "$dir" && OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" ctest --output-on-failure -j "$(nproc)" --timeout 900 "$@") | tee "$log"
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
  bash scripts/install-peers.sh  # llama.cpp for bench.peers_generate (pip builds it once, then keeps the wheel)
  run_ctest build "${ctest_args[@]}"
}

# The 1.13 stage checks what differs between LibTorch versions (include/spanformer/util/torch_compat.h,
# serialisation, error texts, the Python operators on Debian's torch): every test but the `slow` label and
# the command-line scripts that train or evaluate whole models again through the same code (the suite
# stage runs them; `bash scripts/test.sh system -L .` runs everything on 1.13).
system_skip='^cli\.(reference|gpt|xl|seq2seq)$'
stage_system() {
  bash scripts/build.sh --torch system
  if [ ${#ctest_args[@]} -eq 0 ]; then
    run_ctest build-system -LE '^slow$' -E "$system_skip"
  else
    run_ctest build-system "${ctest_args[@]}"
  fi
}

stage_cuda() {
  # nvcc: PyPI's, laid out by install-deps.sh in the environment (build.sh --cuda takes it), or the machine's.
  [ -x "$venv/cuda/bin/nvcc" ] || command -v nvcc > /dev/null || [ -x /usr/local/cuda/bin/nvcc ] ||
    { echo "test: the cuda stage needs nvcc: scripts/install-deps.sh puts PyPI's in $venv/cuda" >&2; return 1; }
  if command -v nvidia-smi > /dev/null && nvidia-smi -L 2> /dev/null | grep -q "^GPU"; then
    # A GPU here: everything, and the cuda-labelled tests run (scripts/gpu-check.sh does more).
    PATH="$PATH:/usr/local/cuda/bin" bash scripts/build.sh --cuda
    run_ctest build-cuda -L cuda "${ctest_args[@]}"
    return
  fi
  # No GPU (CI): the library with the kernels (nvcc, sm_90), their glue and the NCCL backend, linked into
  # the tool, the operator module and the test binary, whose cuda-labelled tests then run and skip (so
  # that the test binary is known to build against the CUDA LibTorch before a GPU runs it). The
  # benchmarks add no CUDA code: the GPU machine builds them.
  PATH="$PATH:/usr/local/cuda/bin" bash scripts/build.sh --cuda --target spanformer_launcher --target spanformer_torch_ops \
    --target spanformer_tests
  run_ctest build-cuda -L cuda "${ctest_args[@]}"
  # The lab apart (lab/lab.h): the library and the tool link none of its objects, the test binary does.
  local lab_symbols='flash_lab_forward|span_lab_forward|spanformer::lab::register_rows|cuda_glue::bias_gelu_forward' in_main in_tests
  in_main=$(nm -C build-cuda/libspanformer.a build-cuda/spanformer-bin 2> /dev/null | grep -cE "$lab_symbols" || true)
  in_tests=$(nm -C build-cuda/tests/spanformer_tests | grep -cE "$lab_symbols" || true)
  if [ "$in_main" != 0 ] || [ "$in_tests" = 0 ]; then
    echo "test: the lab's symbols: $in_main in libspanformer.a and spanformer-bin (want 0), $in_tests in the test binary" >&2
    return 1
  fi
  echo "test: the lab is apart (nm: 0 of its symbols in libspanformer.a and spanformer-bin, $in_tests in the test binary)"
  # Both load without a GPU and know what they were built with.
  local version
  version=$(build-cuda/spanformer --version)
  echo "test: $version"
  grep -q "CUDA: built in, no device" <<< "$version" || { echo "test: build-cuda/spanformer was not built with CUDA" >&2; return 1; }
  "$venv/bin/python" -c "import torch; torch.ops.load_library('build-cuda/libspanformer_torch_ops.so')
for op in ('adaptive_span_attention', 'flash_attention'): getattr(torch.ops.spanformer, op)
print('test: the CUDA operator module loads:', torch.__version__)"
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
  # One build, as a user's: `pip wheel .` runs the PEP 517 build that `pip install .` runs (scikit-build-core
  # in an isolated environment holding the pinned torch), then the wheel goes into a fresh virtual
  # environment, which pip fills with torch from PyPI beside it. (Running `pip install .` as well would
  # repeat the same build: minutes on 2 cores.)
  # Two copies of PyPI's torch with its CUDA libraries (the build environment, then the fresh one) take
  # about 6 GiB each: say so before pip runs out of disk space halfway through.
  local free_gib
  free_gib=$(( $(df -Pk "$tmp" | awk 'NR == 2 {print $4}') / 1048576 ))
  if [ "$free_gib" -lt 14 ]; then
    echo "test: the python stage needs about 14 GiB free under $(dirname "$tmp"); $free_gib GiB are free" >&2
    return 1
  fi
  /usr/bin/python3 -m venv "$tmp/env"
  "$tmp/env/bin/python" -m pip wheel --quiet --disable-pip-version-check --no-deps --wheel-dir "$tmp/dist" .
  local wheel
  wheel=$(ls "$tmp/dist"/spanformer-*.whl)
  echo "test: built $(basename "$wheel") ($(du -h "$wheel" | cut -f1))"
  "$tmp/env/bin/python" -m pip install --quiet --disable-pip-version-check "$wheel" "$pytest_pin"
  # What a Hugging Face user adds (test_hf.py): transformers and tokenizers, at the pinned versions.
  "$tmp/env/bin/python" -m pip install --quiet --disable-pip-version-check -c python/requirements.txt \
    transformers tokenizers
  run_pytest "$tmp/env"
}

# The Python tests against the package installed in a virtual environment, from outside the checkout
# (so `import spanformer` finds the installed copy), with its `spanformer` command first on PATH, and
# transformers and tokenizers beside it as a Hugging Face user has them (test_hf.py). The other oracle
# tests need test-only packages (sacrebleu, safetensors, FlexAttention's compiler), which a user's
# environment does not have: the suite stage runs them (CTest's python.oracles, with .venv); test_cuda.py
# runs where a GPU is (CTest's python.cuda).
run_pytest() {
  local env=$1 src=$PWD
  # Bounded (about 4 minutes when all is well): a test still running after 300 s prints its stack (pytest's
  # faulthandler_timeout), and the whole run ends after 1200 s, so a hang fails the stage, named.
  (cd "$env" && env -u SPANFORMER_TORCH_OPS -u SPANFORMER_CLI PATH="$env/bin:$PATH" PYTHONDONTWRITEBYTECODE=1 \
     timeout --kill-after=10 1200 "$env/bin/python" -m pytest -q -p no:cacheprovider -o faulthandler_timeout=300 \
     --ignore="$src/tests/python/test_oracles.py" \
     --ignore="$src/tests/python/test_cuda.py" "$src/tests/python")
}

for stage in "${stages[@]}"; do
  echo "=== test: stage $stage ==="
  start=$(date +%s)
  "stage_$stage"
  summary+=("$stage $(( $(date +%s) - start )) s")
done
echo "=== test: passed: ${summary[*]}"
