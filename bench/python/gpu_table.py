"""What the GPU comparison scripts share: timing (medians of triton.testing.do_bench, CUDA events),
kernel versions chosen per call, and their Markdown tables (a failing row is kept as such, so one
failure does not lose the others)."""
import os

import triton.testing


def bench(fn, warmup=25, rep=200):
    return triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median")


def add_row(lines, make_row, failed_prefix, columns):
    """Appends make_row() to lines, or the failure as a row of `columns` cells, and prints it."""
    try:
        lines.append(make_row())
    except Exception as e:  # one failing line must not lose the others
        lines.append(f"{failed_prefix} failed: {str(e).splitlines()[0][:120]} |" + " |" * (columns - 1))
    print(lines[-1], flush=True)


def finish(lines, out):
    """Prints the table and appends it to `out` (when given)."""
    text = "\n".join(lines) + "\n"
    print(text)
    if out:
        with open(out, "a") as f:
            f.write(text + "\n")


def with_env(fn, name, value):
    """fn with the environment variable `name` set to `value` ("" = unset) from its call on. The glue
    reads it at every forward and backward, and autograd runs the backward after fn returns, so the
    variable is left as set: every row of one op is wrapped, so each call sets its own."""
    def call(*args):
        if value:
            os.environ[name] = value
        else:
            os.environ.pop(name, None)
        return fn(*args)
    return call
