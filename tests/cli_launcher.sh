#!/usr/bin/env bash
# The launcher (cli/launcher.cpp) says in one line why the program could not load its LibTorch, where the
# dynamic loader would otherwise take another one and die on an undefined symbol (exit 127).
#
#   bash tests/cli_launcher.sh BUILD/spanformer BUILD/spanformer-launcher-probe PROBE_TORCH_DIR TORCH_DIR
#
# The probe is the same launcher built with PROBE_TORCH_DIR as its LibTorch directory: the script makes
# that directory (the real library linked in) and breaks it in each way. TORCH_DIR is the real one.
set -u
bin="$1"; probe="$2"; probe_dir="$3"; torch_dir="$4"
tmp=$(mktemp -d)
trap 'chmod -R u+rwx "$tmp" "$(dirname "$probe_dir")" 2>/dev/null; rm -rf "$tmp" "$(dirname "$(dirname "$probe_dir")")"' EXIT
failures=0
passed=0
fail() { echo "FAIL: $*"; failures=$((failures + 1)); }

expect_error() {  # expect_error "check" "what the message must say" command...
  local check="$1" want="$2"; shift 2
  "$@" >"$tmp/out" 2>"$tmp/err"
  local rc=$?
  if [ "$rc" -eq 0 ] || [ "$rc" -eq 127 ] || [ "$(grep -c . "$tmp/err")" -ne 1 ] \
      || ! grep -q "^spanformer: error: .*$want" "$tmp/err"; then
    fail "$check: one error line saying '$want' and exit 1 (rc $rc): $(head -c 400 "$tmp/err")"
  else
    passed=$((passed + 1))
  fi
}
expect_runs() {  # expect_runs "check" command...: the program starts and prints its version
  local check="$1"; shift
  if ! "$@" --version >"$tmp/out" 2>"$tmp/err" || ! grep -q "^spanformer " "$tmp/out"; then
    fail "$check: the program runs: $(head -c 400 "$tmp/err")"
  else
    passed=$((passed + 1))
  fi
}

# The name the program asks the loader for (libtorch_cpu.so from PyPI, libtorch_cpu.so.1.13 from Debian).
program="$(dirname "$(realpath "$bin")")/spanformer-bin"
soname=$(objdump -p "$program" 2>/dev/null | awk '$1 == "NEEDED" && $2 ~ /^libtorch_cpu\.so/ {print $2}')
[ -n "$soname" ] || { echo "FAIL: $program does not ask for libtorch_cpu (objdump -p)"; exit 1; }
[ -r "$torch_dir/$soname" ] || { echo "FAIL: the build's LibTorch $torch_dir/$soname is not readable"; exit 1; }
version=$("$bin" --version | sed -n 's/.*LibTorch \([0-9][0-9.]*\).*/\1/p' | head -1)

# 1. The real launcher runs the program, also with LD_LIBRARY_PATH naming its own LibTorch directory.
expect_runs "the launcher runs the program" "$bin"
LD_LIBRARY_PATH="$torch_dir" expect_runs "its own LibTorch on LD_LIBRARY_PATH" "$bin"

# 2. Another library of that name first on LD_LIBRARY_PATH. A copy of the same library is let through
# (same size); a different one is refused: Debian's where it is installed and is another file (then the
# program started without the launcher shows what is prevented: the loader takes it and dies, exit 127),
# else a stand-in of another size.
# The copy keeps its neighbours' places: PyPI's torch finds its CUDA runtime libraries (libcupti,
# libcudart) at $ORIGIN/../../nvidia, which a lone copy elsewhere loses on a machine without a CUDA toolkit.
copy="$tmp/copy/torch/lib"
mkdir -p "$copy" "$tmp/other"
cp "$torch_dir/$soname" "$copy/$soname"
if [ -d "$torch_dir/../../nvidia" ]; then ln -s "$(realpath "$torch_dir/../../nvidia")" "$tmp/copy/nvidia"; fi
LD_LIBRARY_PATH="$copy" expect_runs "a copy of the same LibTorch on LD_LIBRARY_PATH" "$bin"
rm -rf "$tmp/copy"
system=/usr/lib/$(gcc -print-multiarch 2>/dev/null || echo x86_64-linux-gnu)
if [ -e "$system/$soname" ] && [ "$(stat -Lc %s "$system/$soname")" != "$(stat -Lc %s "$torch_dir/$soname")" ]; then
  other="$system"
  LD_LIBRARY_PATH="$other" "$program" --version > /dev/null 2>&1
  rc=$?
  [ "$rc" -ne 0 ] || fail "the program without the launcher, with $other first: it loads another LibTorch and still runs?"
else
  other="$tmp/other"
  head -c 4096 "$torch_dir/$soname" > "$other/$soname"
fi
LD_LIBRARY_PATH="/nonexistent::$other" expect_error "another LibTorch on LD_LIBRARY_PATH" \
  "LD_LIBRARY_PATH's $other holds another LibTorch ($soname)" "$bin" --version

# 3. The recorded directory missing (a removed virtual environment).
rm -rf "$probe_dir"
expect_error "a missing LibTorch" "cannot read LibTorch at $probe_dir/$soname: No such file or directory" "$probe" --version

# 4. Present: the probe runs the program.
mkdir -p "$probe_dir"
ln -s "$torch_dir/$soname" "$probe_dir/$soname"
expect_runs "the probe with a readable LibTorch" "$probe"

# 5. Another torch version in the package (PyPI's torch/version.py beside lib/).
echo "__version__ = '0.0.1+cpu'" > "$(dirname "$probe_dir")/version.py"
expect_error "another torch version" "made for LibTorch $version, but $(dirname "$probe_dir") now holds torch 0.0.1" "$probe" --version
echo "__version__ = '$version+cpu'" > "$(dirname "$probe_dir")/version.py"
expect_runs "the same version with another local part" "$probe"

# 6. A directory this user cannot enter (a checkout under another user's 0700 home). Root reads anything
# through two capabilities; it runs the probe without them.
chmod 000 "$probe_dir"
if [ "$(id -u)" -eq 0 ]; then
  expect_error "an unreadable LibTorch" "cannot read LibTorch at $probe_dir/$soname: Permission denied" \
    setpriv --inh-caps=-dac_override,-dac_read_search --bounding-set=-dac_override,-dac_read_search "$probe" --version
else
  expect_error "an unreadable LibTorch" "cannot read LibTorch at $probe_dir/$soname: Permission denied" "$probe" --version
fi
chmod 755 "$probe_dir"

echo "launcher: $passed checks passed, $failures failed"
[ "$failures" -eq 0 ]
