#include "train/families/adaptive_span/evaluate.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>

#include "spanformer/data/batches.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer::train {

double EvalResult::bpc() const { return nll / std::log(2.0); }
double EvalResult::ppl() const { return std::exp(nll); }

torch::Tensor eval_block(models::TransformerSeq& model, const torch::Tensor& x, const torch::Tensor& y,
                         std::vector<torch::Tensor>& caches) {
  auto hidden = model->forward(x, caches);                                   // (B, M, H)
  auto logits = model->logits(hidden);                                       // (B, M, V)
  return torch::cross_entropy_loss(logits.reshape({-1, logits.size(-1)}), y.reshape({-1}));
}

EvalResult evaluate(models::TransformerSeq& model, const data::TokenFile& tokens, int64_t batch,
                    const std::function<void(int64_t, int64_t)>& progress, dist::Group* group,
                    const std::string& dump_logprobs) {
  if (!dump_logprobs.empty() && group && group->world() > 1) fail("--dump-logprobs runs in one process");
  const int64_t world = group ? group->world() : 1, rank = group ? group->rank() : 0;
  if (batch % world != 0) fail("the evaluation batch ({}) must divide by the number of processes ({})", batch, world);
  const int64_t local = batch / world, first = rank * local;
  torch::NoGradGuard no_grad;
  const bool was_training = model->is_training();
  model->eval();
  const int64_t M = model->config().block_size;
  data::Streams streams(tokens, batch);
  if (streams.length() <= M)
    fail("{}: streams of {} tokens are too short for blocks of {} (lower the eval batch size)", tokens.path(),
         streams.length(), M);
  const auto device = model->key_pe.device();
  auto caches = model->initial_caches(local);
  const int64_t total = (streams.length() - 1 + M - 1) / M;  // upper bound, for progress only
  std::vector<torch::Tensor> losses, dumped;
  for (int64_t pos = 0;; pos += M) {
    auto [x, y] = data::make_block(streams, pos, M, device, first, local);
    if (dump_logprobs.empty()) {
      losses.push_back(eval_block(model, x, y, caches));
    } else {
      auto logp = torch::log_softmax(model->logits(model->forward(x, caches)), -1);  // (B, M, V)
      auto lp = logp.gather(2, y.unsqueeze(2)).squeeze(2);                          // (B, M)
      losses.push_back(-lp.mean());
      dumped.push_back(lp.to(torch::kCPU, torch::kDouble));
    }
    if (progress) progress(static_cast<int64_t>(losses.size()), total);
    if (pos + M >= streams.length() - M) break;  // the next block would be incomplete
  }
  model->train(was_training);
  if (!dump_logprobs.empty()) write_logprobs(dump_logprobs, torch::cat(dumped, 1));
  EvalResult result;
  result.blocks = static_cast<int64_t>(losses.size());
  result.tokens = result.blocks * M * batch;
  result.nll = torch::stack(losses).to(torch::kDouble).mean().item<double>();
  if (group) result.nll = group->all_reduce_sum(result.nll) / static_cast<double>(world);  // equal shares
  return result;
}

}  // namespace spanformer::train
