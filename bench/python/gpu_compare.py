"""Span attention on a GPU: spanformer's CUDA kernel against the plain composition, FlexAttention with a
per-head sliding-window block mask, and scaled_dot_product_attention (issue 15's comparison).

    SPANFORMER_TORCH_OPS=build-cuda/libspanformer_torch_ops.so python3 bench/python/gpu_compare.py \
        [--B 8 --K 8 --D 64 --M 512 --L 8192] [--dtype bf16] [--out figures.md]

The shape is issue 15's target (B 8, K 8, D 64, M 512, L 8192): M queries attend a window of W = L keys
(k and v hold W + M rows). Span patterns: "all" (every head spans L) and "bimodal" (half the heads
span 64 tokens, half L). Figures are medians of triton.testing.do_bench (CUDA events) after warm-up.

What each line computes:
  plain      adaptive_span_attention_reference: the reference's operations (scores over the whole
             window, softmax, soft span mask, renormalisation, value product), batched ATen ops;
  kernel     torch.ops.spanformer.adaptive_span_attention on CUDA (src/ops/cuda, numbered versions in
             docs/kernels.md): the same function; its forward is version 1 (tensor cores) for bf16 with
             D 32 / 64 / 128, else version 0;
  kernel v0  the same op with SPANFORMER_SPAN_KERNEL=v0: version 0's forward, measured beside it;
  flex       FlexAttention (torch.compile) with a block mask that lets head h see distances 1 .. S_h:
             hard window attention, not the adaptive-span function (no soft ramp, no whole-window
             normaliser), the speed bar the issue sets;
  sdpa_dense scaled_dot_product_attention over all W + M keys, no mask: dense attention's cost.
"Useful" FLOP/s count 4 * B * K * M * D * S_h per head (QK^T and PV over the visited distances only),
the pe term 2 * B * K * M * D * W, and nothing for masked-out work.
"""
import argparse
import math
import os
import sys

import torch

from gpu_table import add_row, bench, finish

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import spanformer  # noqa: E402  (loads the operator library)


def visited(z, ramp, window):
    return max(1, min(window, math.floor(z + ramp) + 1))


def make_inputs(B, K, M, D, L, spans, dtype, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    W = L
    opts = dict(device="cuda", dtype=dtype)
    q = torch.randn(B, K, M, D, generator=g, **opts)
    k = torch.randn(B, K, W + M, D, generator=g, **opts)
    v = torch.randn(B, K, W + M, D, generator=g, **opts)
    pe = torch.randn(D, L, generator=g, **opts)
    ratio = torch.tensor([z / L for z in spans], device="cuda", dtype=dtype)
    return q, k, v, pe, ratio


def with_version(fn, version):
    """fn with SPANFORMER_SPAN_KERNEL=version while it runs (the glue reads it at each call)."""
    def call():
        os.environ["SPANFORMER_SPAN_KERNEL"] = version
        try:
            return fn()
        finally:
            os.environ.pop("SPANFORMER_SPAN_KERNEL", None)
    return call


def flex_fn(B, K, M, D, L, spans, ramp):
    from torch.nn.attention.flex_attention import create_block_mask, flex_attention
    W = L
    S = torch.tensor([visited(z, ramp, W) for z in spans], device="cuda", dtype=torch.int32)

    def window(b, h, q_idx, kv_idx):
        d = (q_idx + W) - kv_idx  # query i sits at position W + i; key row j at position j
        return (d >= 1) & (d <= S[h])

    mask = create_block_mask(window, B=None, H=K, Q_LEN=M, KV_LEN=W + M, device="cuda")
    compiled = torch.compile(flex_attention)
    return lambda q, k, v: compiled(q, k, v, block_mask=mask)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--B", type=int, default=8)
    ap.add_argument("--K", type=int, default=8)
    ap.add_argument("--D", type=int, default=64)
    ap.add_argument("--M", type=int, default=512)
    ap.add_argument("--L", type=int, default=8192)
    ap.add_argument("--ramp", type=float, default=32.0)
    ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp32"])
    ap.add_argument("--skip-kernel", action="store_true", help="leave out spanformer's kernel (too slow at a shape)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    B, K, M, D, L, R = a.B, a.K, a.M, a.D, a.L, a.ramp
    name = torch.cuda.get_device_name()
    lines = [f"# gpu_compare.py on {name}, torch {torch.__version__}, {a.dtype}, B {B} K {K} M {M} D {D} L {L}",
             "| spans | implementation | forward ms (median) | useful TFLOP/s | max abs diff vs plain |",
             "|---|---|---|---|---|"]
    patterns = {"all": [float(L)] * K, "bimodal": [64.0 if h % 2 == 0 else float(L) for h in range(K)]}
    for pattern, spans in patterns.items():
        q, k, v, pe, ratio = make_inputs(B, K, M, D, L, spans, dtype, seed=len(pattern))
        S = [visited(z, R, L) for z in spans]
        useful = sum(4.0 * B * M * D * s for s in S) + 2.0 * B * K * M * D * L
        with torch.no_grad():
            plain = lambda: torch.ops.spanformer.adaptive_span_attention_reference(q, k, v, pe, ratio, L, R)
            ref = plain()
            rows = [("plain", plain)]
            if not a.skip_kernel:
                kernel = lambda: torch.ops.spanformer.adaptive_span_attention(q, k, v, pe, ratio, L, R)
                rows.append(("kernel", kernel))
                rows.append(("kernel v0", with_version(kernel, "v0")))
            flex = flex_fn(B, K, M, D, L, spans, R)
            rows.append(("flex", lambda: flex(q, k, v)))
            rows.append(("sdpa_dense", lambda: torch.nn.functional.scaled_dot_product_attention(q, k, v)))
            for label, fn in rows:
                def row():
                    out = fn()
                    torch.cuda.synchronize()
                    ms = bench(fn)
                    diff_text = f"{(out.float() - ref.float()).abs().max().item():.3g}" if label.startswith("kernel") else "other function"
                    return f"| {pattern} | {label} | {ms:.3f} | {useful / ms / 1e9:.1f} | {diff_text} |"
                add_row(lines, row, f"| {pattern} | {label} |", 3)
        del q, k, v, pe, ratio, ref
        torch.cuda.empty_cache()
    finish(lines, a.out)


if __name__ == "__main__":
    main()
