#include "train/families/xl/protocol.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>

#include "spanformer/data/batches.h"
#include "spanformer/train/family.h"
#include "spanformer/util/error.h"
#include "spanformer/util/io.h"

namespace spanformer::train::xl {

using models::xl::XlModel;

double temperature(const XlSearchConfig& c, int64_t k, int64_t nb_steps) {
  const double t = std::min(1.0, static_cast<double>(k) / static_cast<double>(std::max<int64_t>(1, nb_steps)));
  if (c.tau_schedule == TauSchedule::kConstant) return c.tau0;
  if (c.tau_schedule == TauSchedule::kLinear) return c.tau0 + (c.tau1 - c.tau0) * t;
  return c.tau0 * std::pow(c.tau1 / c.tau0, t);
}

double EvalResult::ppl() const { return std::exp(nll()); }
double EvalResult::bpc() const { return nll() / std::log(2.0); }

EvalOptions eval_options(const XlConfig& c) {
  EvalOptions o;
  o.batch = c.train.eval_batch_size;
  o.tgt_len = c.model.eval_tgt_len > 0 ? c.model.eval_tgt_len : c.model.tgt_len;
  o.lengths = models::xl::Lengths::of(c.model);
  if (c.model.eval_mem_len >= 0) o.lengths.mem_len = c.model.eval_mem_len;
  if (c.model.eval_clamp_len >= 0) o.lengths.clamp_len = c.model.eval_clamp_len;
  o.lengths.same_length = c.model.eval_same_length;
  return o;
}

EvalResult evaluate(XlModel& model, const data::TokenFile& tokens, const EvalOptions& o,
                    const std::function<void(int64_t, int64_t)>& progress) {
  if (o.batch <= 0 || o.tgt_len <= 0) fail("evaluation needs a positive batch and tgt_len");
  torch::NoGradGuard no_grad;
  model->eval();
  data::Streams streams(tokens, o.batch);
  const int64_t S = streams.length(), B = o.count < 0 ? o.batch - o.first : o.count;
  if (S < 2) fail("{}: streams of {} tokens are too short to evaluate (lower the eval batch size)", tokens.path(), S);
  const auto device = model->word_emb->tables[0].device();
  auto mems = model->initial_mems(B);
  auto weights = model->config().search ? model->eval_weights() : torch::Tensor();
  const int64_t total = (S - 1 + o.tgt_len - 1) / o.tgt_len;
  std::vector<torch::Tensor> dumped;  // (B, seq) log-probabilities per segment
  EvalResult result;
  for (int64_t i = 0; i < S - 1; i += o.tgt_len) {
    if (o.max_segments > 0 && result.segments >= o.max_segments) break;
    const int64_t seq = std::min(o.tgt_len, S - 1 - i), begin = std::max<int64_t>(0, i - o.lengths.ext_len);
    const int64_t Q = i + seq - begin;
    auto [x, y] = data::make_block(streams, begin, Q, device, o.first, B);              // (B, Q)
    auto h = model->forward(x, mems, o.lengths, weights);                          // (B, Q, H)
    auto nll = model->nll(h.narrow(1, Q - seq, seq), y.narrow(1, Q - seq, seq));   // (B, seq)
    if (!o.dump_logprobs.empty()) dumped.push_back((-nll).to(torch::kCPU, torch::kDouble));
    result.nll_sum += nll.sum().to(torch::kDouble).item<double>();
    result.tokens += B * seq;
    ++result.segments;
    if (progress) progress(result.segments, o.max_segments > 0 ? std::min(total, o.max_segments) : total);
  }
  if (!o.dump_logprobs.empty()) write_logprobs(o.dump_logprobs, torch::cat(dumped, 1));
  model->train();
  return result;
}

}  // namespace spanformer::train::xl
