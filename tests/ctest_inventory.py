"""Every GoogleTest test and every command-line script is run by some CTest test: none is dropped by a
filter, a hand-made list or a forgotten add_test.

  python3 tests/ctest_inventory.py GTEST_BINARY BUILD_DIR

The suite is one GoogleTest binary; CTest runs it through discovered tests (one per test, filter
"-*Slow*:*Cuda*") and hand-made entries (the slow and CUDA tests, each a --gtest_filter pattern). A test
whose name falls between them would never run and never fail: three emulator tests once were, until
renamed. This lists the binary's tests (--gtest_list_tests), collects every CTest test's positive
--gtest_filter patterns (ctest --show-only=json-v1), and fails naming each test no pattern matches.
GoogleTest's patterns are shell wildcards ('*', '?') over "Suite.Test", as fnmatch's are. It also fails
naming each tests/cli_*.sh and each tests/python/test_*.py that no CTest test's command runs, except the
Python files the configuration left out on purpose (BUILD_DIR/tests_not_registered.txt, "file: reason",
written by tests/CMakeLists.txt: test_oracles.py where the torch predates FlexAttention), which it names
with their reasons.
"""
import fnmatch
import glob
import json
import os
import subprocess
import sys


def gtest_names(binary):
    listing = subprocess.run([binary, "--gtest_list_tests"], capture_output=True, text=True, check=True).stdout
    names, suite = [], None
    for line in listing.splitlines():
        if not line.strip():
            continue
        if not line.startswith(" "):
            suite = line.split("#")[0].strip()            # "Suite." or "Prefix/Suite."
        else:
            names.append(suite + line.split("#")[0].strip())
    return names


def ctest_patterns(build_dir):
    """The positive --gtest_filter patterns of every CTest test, and every argument of their commands."""
    shown = subprocess.run(["ctest", "--show-only=json-v1"], cwd=build_dir, capture_output=True, text=True,
                           check=True).stdout
    patterns, arguments = [], set()
    for test in json.loads(shown)["tests"]:
        for arg in test.get("command", []):
            arguments.add(os.path.realpath(arg) if os.path.isabs(arg) else arg)
            if arg.startswith("--gtest_filter="):
                positive = arg.split("=", 1)[1].split("-", 1)[0]   # before '-': what the test runs
                patterns += [p for p in positive.split(":") if p]
    return patterns, arguments


def main():
    binary, build_dir = sys.argv[1:3]
    names, (patterns, arguments) = gtest_names(binary), ctest_patterns(build_dir)
    if not patterns:
        sys.exit(f"ctest_inventory: no --gtest_filter in {build_dir}'s CTest tests")
    missing = [n for n in names if not any(fnmatch.fnmatchcase(n, p) for p in patterns)]
    for name in missing:
        print(f"ctest_inventory: {name} is in {binary} but no CTest test runs it", file=sys.stderr)
    scripts = sorted(glob.glob(os.path.join(os.path.dirname(os.path.realpath(__file__)), "cli_*.sh")))
    scripts = [s for s in scripts if os.path.basename(s) != "cli_checks.sh"]  # sourced by the others
    unrun = [s for s in scripts if os.path.realpath(s) not in arguments]
    for script in unrun:
        print(f"ctest_inventory: {os.path.basename(script)} is in tests/ but no CTest test runs it", file=sys.stderr)
    here = os.path.dirname(os.path.realpath(__file__))
    left_out = {}
    listed = os.path.join(build_dir, "tests_not_registered.txt")
    if os.path.exists(listed):
        for line in open(listed):
            if line.strip():
                name, _, reason = line.partition(":")
                left_out[os.path.realpath(os.path.join(here, name.strip()))] = reason.strip()
    pythons = sorted(glob.glob(os.path.join(here, "python", "test_*.py")))
    unrun_py = [p for p in pythons if os.path.realpath(p) not in arguments and os.path.realpath(p) not in left_out]
    for path in unrun_py:
        print(f"ctest_inventory: python/{os.path.basename(path)} is in tests/ but no CTest test runs it", file=sys.stderr)
    for path, reason in left_out.items():
        print(f"ctest_inventory: python/{os.path.basename(path)} not registered in this build: {reason}")
    print(f"ctest_inventory: {len(names)} GoogleTest tests, {len(patterns)} CTest filters, {len(missing)} not run; "
          f"{len(scripts)} command-line scripts, {len(unrun)} not run; {len(pythons)} Python test files, "
          f"{len(unrun_py)} not run, {len(left_out)} left out by the configuration")
    sys.exit(1 if missing or unrun or unrun_py else 0)


if __name__ == "__main__":
    main()
