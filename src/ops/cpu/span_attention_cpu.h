// CPU kernel of adaptive-span attention (see include/spanformer/ops/adaptive_span_attention.h for the
// semantics). Internal header: inputs are already checked and contiguous, options.visited resolved.
#pragma once
#include <ATen/ATen.h>

#include "spanformer/ops/adaptive_span_attention.h"

namespace spanformer::ops::cpu {

// p_keep: where to keep the softmax p (K, B, M, W) for backward; null to keep nothing.
at::Tensor span_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& key_pe, const at::Tensor& span_ratio,
                                  const SpanAttentionOptions& options, at::Tensor* p_keep = nullptr);

struct SpanAttentionGrads {
  at::Tensor q, k, v, key_pe, span_ratio;
};

// p_kept: the p the forward kept (K, B, M, W).
SpanAttentionGrads span_attention_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& key_pe,
                                           const at::Tensor& span_ratio, const SpanAttentionOptions& options,
                                           const at::Tensor& p_kept);

}  // namespace spanformer::ops::cpu
