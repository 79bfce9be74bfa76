// The span-aware attention as a PyTorch operator: `torch.ops.spanformer.adaptive_span_attention`.
//
// Built as a shared module (libspanformer_torch_ops.so) that Python loads with
// torch.ops.load_library (python/spanformer/__init__.py does it). The operator is registered once for
// every backend (CompositeImplicitAutograd): it calls ops::adaptive_span_attention, whose own
// torch::autograd::Function carries the hand-written backward, and which dispatches to the CPU kernel,
// the CUDA kernel (when built with SPANFORMER_CUDA) or the reference composition. Shapes, semantics and
// invariants: include/spanformer/ops/adaptive_span_attention.h.
//
//   adaptive_span_attention(q (B,K,M,D), k (B,K,W+M,D), v (B,K,W+M,D), key_pe (D,L), span_ratio (K),
//                           attn_span L, ramp R = 32, dropout p = 0, training = False, seed = -1)
//     -> (B,K,M,D)
// seed < 0 draws the dropout stream from torch's default generator (torch.manual_seed repeats it).
// adaptive_span_attention_reference: the same signature, the reference's plain composition (the oracle).
//
//   flash_attention(q (B,K,N,D), k (B,K,C,D), v (B,K,C,D), band = 0 (dense causal), dropout = 0,
//                   training = False, seed = -1, cuda_kernel = True) -> (B,K,N,D)
// Causal attention by ops::flash_attention (include/spanformer/ops/flash_attention.h): query i at key
// position C - N + i; cuda_kernel picks the hand-written CUDA kernels for CUDA inputs (else ATen tiles).
// flash_attention_reference: the plain composition of the same formula and dropout mask.
#include <torch/library.h>

#include "spanformer/ops/adaptive_span_attention.h"
#include "spanformer/ops/flash_attention.h"

namespace {

using spanformer::ops::SpanAttentionOptions;

SpanAttentionOptions options(int64_t attn_span, double ramp, double dropout, bool training, int64_t seed) {
  SpanAttentionOptions o;
  o.attn_span = attn_span;
  o.ramp = ramp;
  o.dropout = dropout;
  o.training = training;
  o.seed = seed >= 0 ? static_cast<uint64_t>(seed) : (training && dropout > 0 ? spanformer::ops::draw_dropout_seed() : 0);
  return o;
}

at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_pe,
                     const at::Tensor& span_ratio, int64_t attn_span, double ramp, double dropout, bool training,
                     int64_t seed) {
  return spanformer::ops::adaptive_span_attention(q, k, v, key_pe, span_ratio,
                                                  options(attn_span, ramp, dropout, training, seed));
}

at::Tensor attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_pe,
                               const at::Tensor& span_ratio, int64_t attn_span, double ramp, double dropout,
                               bool training, int64_t seed) {
  return spanformer::ops::adaptive_span_attention_reference(q, k, v, key_pe, span_ratio,
                                                            options(attn_span, ramp, dropout, training, seed));
}

spanformer::ops::FlashOptions flash_options(int64_t band, double dropout, bool training, int64_t seed, bool cuda_kernel) {
  spanformer::ops::FlashOptions o;
  o.band = band;
  o.dropout = dropout;
  o.training = training;
  o.seed = seed >= 0 ? static_cast<uint64_t>(seed) : (training && dropout > 0 ? spanformer::ops::draw_dropout_seed() : 0);
  o.cuda_kernel = cuda_kernel;
  return o;
}

at::Tensor flash(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t band, double dropout,
                 bool training, int64_t seed, bool cuda_kernel) {
  return spanformer::ops::flash_attention(q, k, v, flash_options(band, dropout, training, seed, cuda_kernel));
}

at::Tensor flash_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t band, double dropout,
                           bool training, int64_t seed) {
  return spanformer::ops::flash_attention_reference(q, k, v, flash_options(band, dropout, training, seed, false));
}

}  // namespace

TORCH_LIBRARY(spanformer, m) {
  m.def("adaptive_span_attention(Tensor q, Tensor k, Tensor v, Tensor key_pe, Tensor span_ratio, int attn_span, "
        "float ramp=32., float dropout=0., bool training=False, int seed=-1) -> Tensor",
        &attention);
  m.def("adaptive_span_attention_reference(Tensor q, Tensor k, Tensor v, Tensor key_pe, Tensor span_ratio, "
        "int attn_span, float ramp=32., float dropout=0., bool training=False, int seed=-1) -> Tensor",
        &attention_reference);
  m.def("flash_attention(Tensor q, Tensor k, Tensor v, int band=0, float dropout=0., bool training=False, "
        "int seed=-1, bool cuda_kernel=True) -> Tensor",
        &flash);
  m.def("flash_attention_reference(Tensor q, Tensor k, Tensor v, int band=0, float dropout=0., "
        "bool training=False, int seed=-1) -> Tensor",
        &flash_reference);
}
