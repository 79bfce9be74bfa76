"""A/B of span kernel version 1's variants on a GPU, forward only, at gpu_compare.py's shape (bf16, B 8,
K 8, M 512, D 64, L 8192; spans all at L and bimodal 64 / L): each variant selected by
SPANFORMER_SPAN_KERNEL as the glue reads it at each call, interleaved over rounds (every round times
each variant once with triton's do_bench), medians of the rounds; the plain composition beside them for
the ratio asked of the span kernels (bimodal >= 3x plain).

    SPANFORMER_TORCH_OPS=build-cuda/libspanformer_torch_ops.so python3 bench/python/gpu_span_tune.py \\
        [--variants v1,v1b2,v1b3,v1b3-in-order,v1b2-async,v1b2-shortcuts] [--rounds 5] [--backward] [--out figures.md]

Variants: v1 (the default: the glue picks 2 or 3 blocks an SM from the spans), v1b2 (__launch_bounds__
for 2 blocks an SM), v1b3 (3 blocks an SM, at most 168 registers a thread), v1b3-in-order (3 blocks,
heads in their order instead of longest span first), v1-bwd-v0 (version 0's backward after version 1),
v0 (version 0's forward and backward), and the lab's variants not yet measured (src/ops/cuda/variants.h):
v1b2-async (2 blocks, tiles double-buffered with cp.async), v1b2-shortcuts (2 blocks, the whole-tile
shortcuts). --backward times forward + backward (version 2's backward for
every variant but v0 and v1-bwd-v0).
"""
import argparse
import os
import statistics
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.join(here, "..", "..", "python")]
import spanformer  # noqa: E402,F401  (loads the operator library)
from gpu_compare import make_inputs, with_version  # noqa: E402
from gpu_table import bench, finish  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--variants", default="v1,v1b2,v1b3,v1b3-in-order,v1b2-async,v1b2-shortcuts")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--backward", action="store_true",
                    help="time forward + backward (gradients of q, k, v, as gpu_compare.py) instead of the forward")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    B, K, M, D, L, R = 8, 8, 512, 64, 8192, 32.0
    ops = torch.ops.spanformer
    what = "forward + backward" if a.backward else "forward"
    lines = [f"# gpu_span_tune.py on {torch.cuda.get_device_name()}, torch {torch.__version__}, bf16, B {B} K {K} "
             f"M {M} D {D} L {L}, {what}, medians of {a.rounds} interleaved rounds of do_bench medians",
             f"| spans | implementation | {what} ms | rounds (ms) | plain / this | "
             f"{'largest gradient difference vs plain (relative)' if a.backward else 'max abs diff vs plain'} |",
             "|---|---|---|---|---|---|"]
    patterns = {"all": [float(L)] * K, "bimodal": [64.0 if h % 2 == 0 else float(L) for h in range(K)]}
    for pattern, spans in patterns.items():
        q, k, v, pe, ratio = make_inputs(B, K, M, D, L, spans, torch.bfloat16, seed=len(pattern))
        kernel = lambda: ops.adaptive_span_attention(q, k, v, pe, ratio, L, R)  # noqa: E731
        impls = {"plain": lambda: ops.adaptive_span_attention_reference(q, k, v, pe, ratio, L, R)}
        for name in a.variants.split(","):
            impls[name] = with_version(kernel, "" if name == "v1" else name)
        with torch.no_grad():
            ref = impls["plain"]().float()
            diffs = {name: (fn().float() - ref).abs().max().item() for name, fn in impls.items()}
        if a.backward:
            grad = torch.randn_like(q)
            q, k, v = (t.detach().requires_grad_() for t in (q, k, v))
            impls = {name: (lambda fn: lambda: torch.autograd.grad(fn(), (q, k, v), grad))(fn) for name, fn in impls.items()}
            grads = {name: fn() for name, fn in impls.items()}
            for name in impls:  # largest gradient difference from the plain composition's, relative to its largest
                diffs[name] = max(((x.float() - y.float()).abs().max() / y.float().abs().max()).item()
                                  for x, y in zip(grads[name], grads["plain"]))
        times = {name: [] for name in impls}
        for _ in range(a.rounds):
            for name, fn in impls.items():
                if a.backward:
                    times[name].append(bench(fn, 3, 100))
                else:
                    with torch.no_grad():
                        times[name].append(bench(fn))
        plain = statistics.median(times["plain"])
        for name, t in times.items():
            ms = statistics.median(t)
            lines.append(f"| {pattern} | {name} | {ms:.3f} | {' '.join(f'{x:.3f}' for x in t)} | {plain / ms:.2f} | "
                         f"{diffs[name]:.3g} |")
            print(lines[-1], flush=True)
        del q, k, v, pe, ratio, ref
        torch.cuda.empty_cache()
    finish(lines, a.out)


if __name__ == "__main__":
    main()
