"""Where the time goes in the rows of peers.py's table where a peer wins (docs/benchmarks.md), measured
with PyTorch's profiler on the CPU: each implementation's step split into matrix products, PyTorch's
fused attention kernel, and everything else (elementwise work, normalisation, softmax pieces, copies,
the optimizer; for a compiled model, the generated kernels that fuse them).

    SPANFORMER_TORCH_OPS=build/libspanformer_torch_ops.so .venv/bin/python bench/python/peers_profile.py \
        [--rows flash,gpt,lm,seq2seq] [--steps 3] [--threads 2] [--amp bf16]

Rows (the same models and inputs as bench/python/peers.py, which this imports):
  flash    causal attention B 1, K 8, D 64, T 1k, forward + backward: ours, spanformer.flash_attention
           (its tiles are ATen calls, which the profiler records one by one), and SDPA's CPU flash kernel
  gpt      the GPT training step at T 1k, batch 8, dense attention: the PyTorch model eager (the same
           ATen operations spanformer's step runs: 1373 against 1386 ms in the table) and compiled
  lm       the adaptive-span LM's training step, bench_small at span 40: reference_semantics.py's model
           eager (319 ms in the table against our 321) and compiled
  seq2seq  the Transformer seq2seq training step: nn.Transformer eager and compiled

With --amp bf16 the flash row takes bf16 inputs and the training rows run under CPU bf16 autocast, as
`peers.py --amp bf16` times them.

Times are the profiler's self CPU times summed per class over `--steps` steps after warm-up (and
compilation), divided by the steps; "step" is the wall time of the profiled steps.
"""
import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import peers  # noqa: E402  (the models, inputs and spanformer's operators)

PRODUCTS = {"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::addbmm", "aten::matmul", "aten::linear",
            "aten::_addmm_activation"}
FUSED_ATTENTION = ("aten::_scaled_dot_product_flash_attention_for_cpu",
                   "aten::_scaled_dot_product_flash_attention_for_cpu_backward")


def split(fn, steps):
    """{class: ms per step} of fn's self CPU time, and the wall ms per step, after two warm-up calls."""
    fn()
    fn()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        for _ in range(steps):
            fn()
        wall = (time.perf_counter() - start) * 1e3 / steps
    out = {"products": 0.0, "fused attention": 0.0, "everything else": 0.0}
    for e in prof.key_averages():
        ms = e.self_cpu_time_total / 1e3 / steps
        if e.key in PRODUCTS:
            out["products"] += ms
        elif e.key.startswith(FUSED_ATTENTION):
            out["fused attention"] += ms
        else:
            out["everything else"] += ms
    return out, wall


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", default="flash,gpt,lm,seq2seq")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    parser.add_argument("--amp", default="off", choices=["off", "bf16"])
    args = parser.parse_args()
    peers.AMP = args.amp == "bf16"
    torch.set_num_threads(args.threads)
    print(f"# profile: torch {torch.__version__}, {args.threads} threads, {args.steps} steps, ms per step"
          f"{', bf16 (autocast; flash: bf16 inputs)' if peers.AMP else ''}")
    print(f"# CPU: {peers.cpu_line()}")
    print("| row | implementation | step (wall) | products | fused attention | everything else |")
    print("|---|---|---|---|---|---|")
    # The twins as peers.py makes them, from our record's spans (dense GPT: none; the LM at span 40: every head).
    makers = {"flash": lambda: peers.flash_impls(1024, torch.bfloat16 if peers.AMP else torch.float32),
              "gpt": lambda: peers.gpt_twins("dense", 1024, 8, {"spans": None})[0],
              "lm": lambda: peers.lm_twins("bench_small.json", {"spans": [[40.0] * 4] * 4})[0],
              "seq2seq": lambda: peers.seq2seq_twins()[0]}
    for row in args.rows.split(","):
        for name, fn in makers[row]().items():
            parts, wall = split(fn, args.steps)
            print(f"| {row} | {name} | {wall:.0f} | {parts['products']:.0f} | {parts['fused attention']:.0f} | "
                  f"{parts['everything else']:.0f} |", flush=True)


if __name__ == "__main__":
    main()
