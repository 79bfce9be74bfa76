"""What the Python tests share: which spanformer they test and the command line beside it.

Two ways to run them (CTest does the first, scripts/test.sh the second for an installed wheel):
  build tree   SPANFORMER_TORCH_OPS=BUILD/libspanformer_torch_ops.so SPANFORMER_CLI=BUILD/spanformer \\
               .venv/bin/python -m pytest tests/python        (the package from python/, the module built)
  installed    VENV/bin/python -m pytest tests/python          (the installed package and its `spanformer`)
The data sets come from ../shared beside the checkout (SPANFORMER_SHARED_DIR to point elsewhere).
"""
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
SOURCE = os.path.abspath(os.path.join(HERE, "..", ".."))
SHARED = os.environ.get("SPANFORMER_SHARED_DIR", os.path.join(SOURCE, "..", "shared"))
sys.path.insert(0, HERE)  # the helpers beside the tests (safetensors_io)
if os.environ.get("SPANFORMER_TORCH_OPS"):
    sys.path.insert(0, os.path.join(SOURCE, "python"))  # the package of this checkout, the module just built


def _cli_path():
    path = os.environ.get("SPANFORMER_CLI") or shutil.which("spanformer")
    if not path:
        raise RuntimeError("no spanformer command: set SPANFORMER_CLI or install the package")
    return path


class Cli:
    """The command line, one thread (so figures equal the Python side's to the last digit)."""

    def __init__(self, path):
        self.path = path

    def __call__(self, *args):
        done = subprocess.run([self.path, "--threads", "1", *args], capture_output=True, text=True)
        assert done.returncode == 0, f"spanformer {' '.join(args)}: {done.stderr}"
        return done.stdout


@pytest.fixture(scope="session")
def cli():
    return Cli(_cli_path())


@pytest.fixture(scope="session")
def shared():
    if not os.path.isdir(os.path.join(SHARED, "data")):
        pytest.fail(f"{SHARED}/data is missing: the shared data sets must sit beside the checkout")
    return SHARED


@pytest.fixture(scope="session")
def source():
    return SOURCE


# CI (scripts/test.sh) sets SPANFORMER_NO_SKIPS=1: a skipped test fails there, so a test that stopped
# running cannot pass as green. Only skips that name the PyTorch version they need are allowed (they
# fire on Debian's torch 1.13, never on the pinned 2.x).
@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if os.environ.get("SPANFORMER_NO_SKIPS") == "1" and report.skipped:
        reason = str(report.longrepr[-1]) if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if "needs PyTorch" not in reason:
            report.outcome = "failed"
            report.longrepr = f"unexpected skip (SPANFORMER_NO_SKIPS=1): {reason}"
