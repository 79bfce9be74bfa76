// Reduced-precision floats (bfloat16, float16) widened to float32, any other tensor as it is (float64
// stays float64). Under mixed precision (train.amp) the training losses are computed from widened
// logits, so that log-softmax and its sums run in float32 whatever autocast did to the products before.
#pragma once
#include <ATen/ATen.h>

namespace spanformer {

inline at::Tensor widen_reduced(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf ? t.to(at::kFloat) : t;
}

}  // namespace spanformer
