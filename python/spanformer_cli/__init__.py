"""The `spanformer` command of an installed package: runs the C++ tool shipped in spanformer/bin.

A module of its own so that the command starts without importing torch (spanformer's __init__ does).
"""
import importlib.util
import os
import sys


def main():
    spec = importlib.util.find_spec("spanformer")
    if spec is None or not spec.submodule_search_locations:
        sys.exit("spanformer: error: the spanformer package is not installed")
    tool = os.path.join(list(spec.submodule_search_locations)[0], "bin", "spanformer")
    if not os.access(tool, os.X_OK):
        sys.exit(f"spanformer: error: {tool} is missing (reinstall the package)")
    os.execv(tool, [tool] + sys.argv[1:])
