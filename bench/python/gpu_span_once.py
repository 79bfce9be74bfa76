"""Two launches of the span-attention forward at the comparison's shape (bf16, B 8, K 8, M 512, D 64,
L 8192, every head at L): the program scripts/gpu-check.sh's `profile` stage hands to Nsight Compute,
which measures the second launch.

    SPANFORMER_TORCH_OPS=build-cuda/libspanformer_torch_ops.so ncu -k regex:forward_mma -s 1 -c 1 \\
        python3 bench/python/gpu_span_once.py
"""
import os
import sys

import torch

here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.join(here, "..", "..", "python")]
import spanformer  # noqa: E402,F401  (loads the operator library)
from gpu_compare import make_inputs  # noqa: E402

B, K, M, D, L, R = 8, 8, 512, 64, 8192, 32.0
q, k, v, pe, ratio = make_inputs(B, K, M, D, L, [float(L)] * K, torch.bfloat16, seed=1)
with torch.no_grad():
    for _ in range(2):
        torch.ops.spanformer.adaptive_span_attention(q, k, v, pe, ratio, L, R)
torch.cuda.synchronize()
