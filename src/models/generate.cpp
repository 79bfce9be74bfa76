#include "spanformer/models/generate.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "spanformer/util/error.h"

namespace spanformer::models {

std::string generate(TransformerSeq& model, const data::Vocab& vocab, const std::string& prompt,
                     const GenerateOptions& options, const std::function<void(const std::string&)>& on_token) {
  if (!(options.temperature > 0)) fail("temperature must be positive (got {})", options.temperature);
  if (options.top_k < 0) fail("top-k must be >= 0 (got {})", options.top_k);
  if (options.tokens < 0) fail("the number of tokens must be >= 0 (got {})", options.tokens);
  torch::NoGradGuard no_grad;
  model->eval();
  const auto device = model->key_pe.device();
  const auto byte_to_id = vocab.byte_to_id();
  std::vector<int64_t> ids;
  for (unsigned char c : prompt)
    if (byte_to_id[c] >= 0) ids.push_back(byte_to_id[c]);
  if (ids.empty()) ids.push_back(byte_to_id['\n'] >= 0 ? byte_to_id['\n'] : 0);  // start from <eos>

  auto caches = model->initial_caches(1);
  const int64_t M = model->config().block_size;
  torch::Tensor last_hidden;
  for (size_t start = 0; start < ids.size(); start += M) {
    const int64_t n = std::min<int64_t>(M, static_cast<int64_t>(ids.size() - start));
    auto x = torch::from_blob(ids.data() + start, {1, n}, torch::kLong).to(device);  // (1, n)
    last_hidden = model->forward(x, caches).narrow(1, n - 1, 1);                    // (1, 1, H)
  }
  std::string text;
  for (int64_t t = 0; t < options.tokens; ++t) {
    auto logits = model->logits(last_hidden).view({-1}).to(torch::kFloat) / options.temperature;  // (V)
    if (options.top_k > 0 && options.top_k < logits.size(0)) {
      auto kth = std::get<0>(logits.topk(options.top_k)).min();
      logits = logits.masked_fill(logits < kth, -std::numeric_limits<float>::infinity());
    }
    auto next = torch::multinomial(torch::softmax(logits, -1), 1);                   // (1)
    const int64_t id = next.item<int64_t>();
    std::string piece = vocab.decode(id);
    text += piece;
    if (on_token) on_token(piece);
    if (t + 1 < options.tokens) last_hidden = model->forward(next.view({1, 1}), caches);  // (1, 1, H)
  }
  return text;
}

}  // namespace spanformer::models
