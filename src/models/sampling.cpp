#include "spanformer/models/sampling.h"

#include <ATen/ATen.h>

#include <limits>

#include "spanformer/util/error.h"

namespace spanformer::models {

void check(const SamplingOptions& o) {
  if (!(o.temperature > 0)) fail("temperature must be positive (got {})", o.temperature);
  if (o.top_k < 0) fail("top-k must be >= 0 (got {})", o.top_k);
  if (!(o.top_p > 0 && o.top_p <= 1)) fail("top-p must be in (0, 1] (got {})", o.top_p);
}

int64_t sample_token(const torch::Tensor& logits_in, const SamplingOptions& o) {
  const float kNegInf = -std::numeric_limits<float>::infinity();
  auto logits = logits_in.to(torch::kCPU, torch::kFloat) / o.temperature;        // (V)
  // Weights that are finite but overflow in the forward (found by fuzzing imported safetensors:
  // tests/fuzz/crashes/safetensors) would reach multinomial as NaN probabilities.
  if (!torch::isfinite(logits).all().item<bool>())
    fail("the model's next-token scores are not finite (NaN or infinite): its weights overflow in the forward pass");
  if (o.top_k > 0 && o.top_k < logits.size(0)) {
    auto kth = std::get<0>(logits.topk(o.top_k)).min();
    logits = logits.masked_fill(logits < kth, kNegInf);
  }
  if (o.top_p < 1) {
    auto [sorted, order] = logits.sort(/*dim=*/0, /*descending=*/true);          // (V), (V)
    auto probs = torch::softmax(sorted, 0);
    auto before = torch::cumsum(probs, 0) - probs;                                // mass of the more likely ones
    auto drop = before >= o.top_p;                                                // the first token always stays
    logits = logits.index_put({order.masked_select(drop)}, torch::tensor(kNegInf));
  }
  return torch::multinomial(torch::softmax(logits, 0), 1).item<int64_t>();
}

}  // namespace spanformer::models
