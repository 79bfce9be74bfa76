"""What the GPU comparison scripts share: timing (medians of triton.testing.do_bench, CUDA events) and
their Markdown tables (a failing row is kept as such, so one failure does not lose the others)."""
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
