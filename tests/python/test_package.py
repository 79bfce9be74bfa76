"""The package around the operators: the pins that tie the wheel to one torch, the command beside the
Python package, and (for an installed wheel) that the tests import the installed copy, not the checkout."""
import os
import re
import subprocess

import torch

import spanformer


def pinned_torch(text):
    return re.search(r'"?torch==([0-9][^"\s;,]*)', text).group(1)


def test_pins_agree(source):
    """pyproject.toml builds against, and requires, the torch python/requirements.txt installs."""
    pyproject = open(os.path.join(source, "pyproject.toml")).read()
    requirements = open(os.path.join(source, "python", "requirements.txt")).read()
    build_requires = re.search(r"requires = \[([^\]]*)\]", pyproject).group(1)
    dependencies = re.search(r"dependencies = \[([^\]]*)\]", pyproject).group(1)
    assert pinned_torch(build_requires) == pinned_torch(dependencies) == pinned_torch(requirements)


def test_command_matches_torch(cli):
    """The command line and the Python module were built against the LibTorch this Python runs."""
    out = subprocess.run([cli.path, "--version"], capture_output=True, text=True, check=True).stdout
    libtorch = re.search(r"LibTorch (\d+\.\d+)", out).group(1)
    assert libtorch == ".".join(torch.__version__.split(".")[:2]), (out, torch.__version__)


def test_installed_copy_when_installed():
    """Without SPANFORMER_TORCH_OPS the tests run against an installed package: its module sits beside it."""
    if os.environ.get("SPANFORMER_TORCH_OPS"):
        assert spanformer._library_path() == os.environ["SPANFORMER_TORCH_OPS"]
    else:
        here = os.path.dirname(spanformer.__file__)
        assert "site-packages" in here, here
        assert spanformer._library_path() == os.path.join(here, "libspanformer_torch_ops.so")
        assert os.access(os.path.join(here, "bin", "spanformer"), os.X_OK)
