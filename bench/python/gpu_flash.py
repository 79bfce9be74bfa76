"""Causal attention on a GPU: spanformer's flash attention (its CUDA kernels, version 1 on the tensor
cores by default, with its key-major backward by SPANFORMER_FLASH_KERNEL=v1-keys, its forward with
32 rows a warp by =v1-m2 and with cp.async double-buffered tiles by =v1-async, version 0 by =v0, and its
ATen tiles) against
scaled_dot_product_attention with is_causal (PyTorch's FlashAttention backend) and the plain composition.

    SPANFORMER_TORCH_OPS=build-cuda/libspanformer_torch_ops.so python3 bench/python/gpu_flash.py \\
        [--B 4 --K 8 --D 64 --T 1024 4096 8192] [--dtype bf16] [--rows sdpa,v1,keys,m2,async,v0,aten,plain] [--out figures.md]

Each line: forward and forward + backward times (medians of triton.testing.do_bench, CUDA events),
TFLOP/s of the causal forward (2 * 2 * B * K * D * T (T + 1) / 2 multiply-adds counted as 2 FLOPs),
peak memory of one forward + backward beyond the inputs, and the largest difference of the output
from SDPA's.
"""
import argparse
import os
import sys

import torch

from gpu_table import add_row, bench, finish, with_env

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import spanformer  # noqa: E402,F401  (loads the operator library)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", type=int, default=4)
    ap.add_argument("--K", type=int, default=8)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--T", type=int, nargs="+", default=[1024, 4096, 8192])
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--rows", default="sdpa,v1,keys,m2,async,v0,aten,plain",
                    help="which rows, comma-separated: sdpa v1 keys m2 async v0 aten plain (v0 and plain are slow or "
                         "out of memory at long T)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    rows = set(a.rows.split(","))
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    lines = [f"# gpu_flash.py on {torch.cuda.get_device_name()}, torch {torch.__version__}, {a.dtype}, "
             f"B {a.B} K {a.K} D {a.D}",
             "| T | implementation | forward ms | fwd TFLOP/s | fwd + bwd ms | peak MB | max abs diff vs SDPA |",
             "|---|---|---|---|---|---|---|"]
    ops = torch.ops.spanformer

    kernels = lambda q, k, v: ops.flash_attention(q, k, v, cuda_kernel=True)  # noqa: E731
    impls = {
        "sdpa causal": lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
        "spanformer kernels v1": with_env(kernels, "SPANFORMER_FLASH_KERNEL", ""),
        "spanformer kernels v1, key-major backward": with_env(kernels, "SPANFORMER_FLASH_KERNEL", "v1-keys"),
        "spanformer kernels v1, 32 rows a warp": with_env(kernels, "SPANFORMER_FLASH_KERNEL", "v1-m2"),
        "spanformer kernels v1, cp.async tiles": with_env(kernels, "SPANFORMER_FLASH_KERNEL", "v1-async"),
        "spanformer kernels v0": with_env(kernels, "SPANFORMER_FLASH_KERNEL", "v0"),
        "spanformer ATen tiles": lambda q, k, v: ops.flash_attention(q, k, v, cuda_kernel=False),
        "plain composition": lambda q, k, v: ops.flash_attention_reference(q, k, v),
    }
    short = dict(zip(impls, ["sdpa", "v1", "keys", "m2", "async", "v0", "aten", "plain"]))
    impls = {label: fn for label, fn in impls.items() if short[label] in rows or short[label] == "sdpa"}
    for T in a.T:
        g = torch.Generator(device="cuda").manual_seed(T)
        q, k, v = (torch.randn(a.B, a.K, T, a.D, device="cuda", dtype=dtype, generator=g) for _ in range(3))
        flops = 2.0 * 2.0 * a.B * a.K * a.D * T * (T + 1) / 2
        with torch.no_grad():
            ref = impls["sdpa causal"](q, k, v).float()
        for label, fn in impls.items():
            def row():
                with torch.no_grad():
                    out = fn(q, k, v)
                    torch.cuda.synchronize()
                    fwd = bench(lambda: fn(q, k, v), 10, 100)
                qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))
                grad = torch.randn_like(q)

                def step():
                    torch.autograd.grad(fn(qg, kg, vg), (qg, kg, vg), grad)

                step()
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
                base = torch.cuda.memory_allocated()
                step()
                torch.cuda.synchronize()
                peak = (torch.cuda.max_memory_allocated() - base) / 2**20
                both = bench(step, 10, 100)
                diff = (out.float() - ref).abs().max().item()
                return f"| {T} | {label} | {fwd:.3f} | {flops / fwd / 1e9:.1f} | {both:.3f} | {peak:.0f} | {diff:.3g} |"
            add_row(lines, row, f"| {T} | {label} |", 5)
        del q, k, v, ref
        torch.cuda.empty_cache()
    finish(lines, a.out)


if __name__ == "__main__":
    main()
