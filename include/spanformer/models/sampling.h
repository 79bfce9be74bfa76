// Sampling the next token from logits: temperature, top-k and nucleus (top-p) filtering, shared by
// every family's generation.
//   p = softmax(logits / temperature); keep the k most likely (k > 0), then the smallest set of most
//   likely tokens whose mass reaches top_p (top_p < 1); renormalise and draw (torch's generator, so
//   `--seed` makes it reproducible).
#pragma once
#include <torch/types.h>

namespace spanformer::models {

struct SamplingOptions {
  double temperature = 1.0;  // > 0
  int64_t top_k = 0;         // 0 = no limit
  double top_p = 1.0;        // in (0, 1]
};

void check(const SamplingOptions& options);  // one-line errors for nonsense values
int64_t sample_token(const torch::Tensor& logits, const SamplingOptions& options);  // logits (V)

}  // namespace spanformer::models
