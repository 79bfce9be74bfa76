"""spanformer from Python: the span-aware attention as a PyTorch operator.

    import spanformer                      # loads libspanformer_torch_ops.so
    out = torch.ops.spanformer.adaptive_span_attention(q, k, v, key_pe, span_ratio, attn_span)
    out = spanformer.adaptive_span_attention(q, k, v, key_pe, span_ratio, attn_span, ramp=32)

The library is found through $SPANFORMER_TORCH_OPS, then beside this package (an installed tree), then
in ../../build (a source checkout). Shapes and semantics: include/spanformer/ops/adaptive_span_attention.h.
"""
import os

import torch

_NAME = "libspanformer_torch_ops.so"


def _library_path():
    here = os.path.dirname(os.path.abspath(__file__))
    candidates = [os.environ.get("SPANFORMER_TORCH_OPS", ""), os.path.join(here, _NAME),
                  os.path.join(here, "..", "..", "build", _NAME)]
    for path in candidates:
        if path and os.path.isfile(path):
            return path
    raise ImportError(f"spanformer: {_NAME} not found (build it with CMake, or set SPANFORMER_TORCH_OPS)")


torch.ops.load_library(_library_path())


def adaptive_span_attention(q, k, v, key_pe, span_ratio, attn_span, ramp=32.0, dropout=0.0, training=False, seed=-1):
    """q (B,K,M,D); k, v (B,K,W+M,D); key_pe (D,L); span_ratio (K) -> (B,K,M,D). Differentiable."""
    return torch.ops.spanformer.adaptive_span_attention(q, k, v, key_pe, span_ratio, attn_span, ramp, dropout,
                                                        training, seed)
