"""Span attention on a GPU: spanformer's CUDA kernel against the plain composition, FlexAttention with a
per-head sliding-window block mask, and scaled_dot_product_attention.

    SPANFORMER_TORCH_OPS=build-cuda/libspanformer_torch_ops.so python3 bench/python/gpu_compare.py \
        [--B 8 --K 8 --D 64 --M 512 --L 8192] [--dtype bf16] [--out figures.md]

The shape is the GPU target's (B 8, K 8, D 64, M 512, L 8192): M queries attend a window of W = L keys
(k and v hold W + M rows). Span patterns: "all" (every head spans L) and "bimodal" (half the heads
span 64 tokens, half L). Figures are medians of triton.testing.do_bench (CUDA events) after warm-up.

What each line computes:
  plain      adaptive_span_attention_reference: the reference's operations (scores over the whole
             window, softmax, soft span mask, renormalisation, value product), batched ATen ops;
  kernel     torch.ops.spanformer.adaptive_span_attention on CUDA (src/ops/cuda, numbered versions in
             docs/kernels.md): the same function; its forward is version 1 (tensor cores) for bf16 with
             D 32 / 64 / 128, else version 0;
  kernel v0  the same op with SPANFORMER_SPAN_KERNEL=v0: version 0's forward and backward, beside it;
  flex       FlexAttention (torch.compile) with a block mask that lets head h see distances 1 .. S_h:
             hard window attention, not the adaptive-span function (no soft ramp, no whole-window
             normaliser), the speed bar to beat;
  flex exact FlexAttention computing the reference's function (the exact peer): the position
             term Q pe^T as one matmul (B, K, M, W) read by score_mod, + log m(d) for the soft span
             mask, the same block mask skipping every key beyond S_h; it leaves out the 1e-8 Z term of
             the reference's normaliser (a relative change near 1e-8), so its difference from plain
             is rounding; the whole function (matmul + flex) is one torch.compile graph;
  sdpa_dense scaled_dot_product_attention over all W + M keys, no mask: dense attention's cost.
Each row gives the forward and the forward + backward (gradients of q, k, v; the kernel's backward is
version 2's (tensor cores) for bf16 / fp16 with D 32, 64 or 128, else version 0's; "kernel v0" is version 0
both ways). "Useful" FLOP/s (forward) count 4 * B * K * M * D * S_h per head (QK^T and PV over the visited distances only),
the pe term 2 * B * K * M * D * W, and nothing for masked-out work.
"""
import argparse
import math
import os
import sys

import torch

from gpu_table import add_row, bench, finish, with_env

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "python"))
import spanformer  # noqa: E402  (loads the operator library)


def visited(z, ramp, window):
    return max(1, min(window, math.floor(z + ramp) + 1))


def make_inputs(B, K, M, D, L, spans, dtype, seed, device="cuda"):
    g = torch.Generator(device=device).manual_seed(seed)
    W = L
    opts = dict(device=device, dtype=dtype)
    q = torch.randn(B, K, M, D, generator=g, **opts)
    k = torch.randn(B, K, W + M, D, generator=g, **opts)
    v = torch.randn(B, K, W + M, D, generator=g, **opts)
    pe = torch.randn(D, L, generator=g, **opts)
    ratio = torch.tensor([z / L for z in spans], device=device, dtype=dtype)
    return q, k, v, pe, ratio


def with_version(fn, version):
    """fn with SPANFORMER_SPAN_KERNEL=version ("" = the default kernels), forward and backward."""
    return with_env(fn, "SPANFORMER_SPAN_KERNEL", version)


def window_mask(K, M, L, spans, ramp, device):
    """FlexAttention's block mask letting head h see distances 1 .. S_h (no key beyond its span)."""
    from torch.nn.attention.flex_attention import create_block_mask
    W = L
    S = torch.tensor([visited(z, ramp, W) for z in spans], device=device, dtype=torch.int32)

    def window(b, h, q_idx, kv_idx):
        d = (q_idx + W) - kv_idx  # query i sits at position W + i; key row j at position j
        return (d >= 1) & (d <= S[h])

    return create_block_mask(window, B=None, H=K, Q_LEN=M, KV_LEN=W + M, device=device)


def flex_fn(K, M, L, spans, ramp, device="cuda"):
    from torch.nn.attention.flex_attention import flex_attention
    mask = window_mask(K, M, L, spans, ramp, device)
    compiled = torch.compile(flex_attention)
    return lambda q, k, v, pe, ratio: compiled(q, k, v, block_mask=mask)


def flex_exact_fn(K, M, L, spans, ramp, device="cuda", compile=True):
    """The reference's function (adaptive_span_attention_reference, training off) on FlexAttention:
    score(i, d) = (q_i . k_{i,d} + q_i . pe[:, L - d]) / sqrt(D) + log m(d), m(d) = clamp((z_h - (d - 1)) / R + 1, 0, 1),
    softmax over the keys the block mask lets through (distances 1 .. S_h, where m > 0 or m = 0 at the
    edge); the reference's 1e-8 Z term is left out. compile=False runs FlexAttention's eager reference (the
    CPU check of this formula)."""
    from torch.nn.attention.flex_attention import flex_attention
    W = L
    mask = window_mask(K, M, L, spans, ramp, device)

    def run(q, k, v, pe, ratio):
        D = q.size(-1)
        scale = 1.0 / math.sqrt(D)
        qpe = torch.matmul(q, pe[:, L - W:])  # (B, K, M, W): column c is distance W - c
        z = ratio.float() * L                 # (K)

        def score_mod(score, b, h, q_idx, kv_idx):
            d = q_idx + W - kv_idx
            c = torch.clamp(W - d, 0, W - 1)  # masked-out positions of a partial block read a valid column
            m = torch.clamp((z[h] - (d - 1)) / ramp + 1.0, 0.0, 1.0)
            return score + qpe[b, h, q_idx, c] * scale + torch.log(m)

        return flex_attention(q, k, v, score_mod=score_mod, block_mask=mask, scale=scale)

    return torch.compile(run) if compile else run


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
    ap.add_argument("--skip-v0", action="store_true", help="leave out the kernel's version 0 row (its backward takes seconds)")
    ap.add_argument("--out", default="")
    a = ap.parse_args()
    dtype = torch.bfloat16 if a.dtype == "bf16" else torch.float32
    B, K, M, D, L, R = a.B, a.K, a.M, a.D, a.L, a.ramp
    name = torch.cuda.get_device_name()
    lines = [f"# gpu_compare.py on {name}, torch {torch.__version__}, {a.dtype}, B {B} K {K} M {M} D {D} L {L}",
             "| spans | implementation | forward ms (median) | useful TFLOP/s | fwd + bwd ms (median) | max abs diff vs plain |",
             "|---|---|---|---|---|---|"]
    patterns = {"all": [float(L)] * K, "bimodal": [64.0 if h % 2 == 0 else float(L) for h in range(K)]}
    for pattern, spans in patterns.items():
        q, k, v, pe, ratio = make_inputs(B, K, M, D, L, spans, dtype, seed=len(pattern))
        S = [visited(z, R, L) for z in spans]
        useful = sum(4.0 * B * M * D * s for s in S) + 2.0 * B * K * M * D * L
        ops = torch.ops.spanformer
        rows = [("plain", lambda q, k, v, pe, ratio: ops.adaptive_span_attention_reference(q, k, v, pe, ratio, L, R))]
        if not a.skip_kernel:
            kernel = lambda q, k, v, pe, ratio: ops.adaptive_span_attention(q, k, v, pe, ratio, L, R)
            rows.append(("kernel", with_version(kernel, "")))
            if not a.skip_v0:
                rows.append(("kernel v0", with_version(kernel, "v0")))
        rows.append(("flex", flex_fn(K, M, L, spans, R)))
        rows.append(("flex exact", flex_exact_fn(K, M, L, spans, R)))
        rows.append(("sdpa_dense", lambda q, k, v, pe, ratio: torch.nn.functional.scaled_dot_product_attention(q, k, v)))
        with torch.no_grad():
            ref = rows[0][1](q, k, v, pe, ratio).float()
        grad = torch.randn_like(q)
        for label, fn in rows:
            def row():
                with torch.no_grad():
                    out = fn(q, k, v, pe, ratio)
                    torch.cuda.synchronize()
                    ms = bench(lambda: fn(q, k, v, pe, ratio))
                qg, kg, vg = (x.detach().requires_grad_() for x in (q, k, v))

                def step():
                    torch.autograd.grad(fn(qg, kg, vg, pe, ratio), (qg, kg, vg), grad)

                step()
                torch.cuda.synchronize()
                both = bench(step, 10, 100)
                exact = label.startswith("kernel") or label == "flex exact"
                diff_text = f"{(out.float() - ref).abs().max().item():.3g}" if exact else "other function"
                return f"| {pattern} | {label} | {ms:.3f} | {useful / ms / 1e9:.1f} | {both:.3f} | {diff_text} |"
            add_row(lines, row, f"| {pattern} | {label} |", 4)
        del q, k, v, pe, ratio, ref, rows
        torch.cuda.empty_cache()
    finish(lines, a.out)


if __name__ == "__main__":
    main()
