// Attention scoring functions and the attention they define (d2l.ai chapter 11; Bahdanau et al. 2015,
// Luong et al. 2015, Vaswani et al. 2017): a score s(q, k) per query-key pair, a masked softmax over
// the valid keys (ops/masked_softmax.h), and the weighted sum of the values.
//
//   additive    s = w_v^T tanh(W_q q + W_k k)      W_q (h, Dq), W_k (h, Dk), w_v (h)   Bahdanau "concat"
//   dot         s = q . k                           Dq = Dk                             Luong "dot"
//   scaled_dot  s = q . k / sqrt(Dk)                Dq = Dk                             Vaswani et al.
//   general     s = q^T W k                         W (Dq, Dk)                          Luong "general"
//
//   a = masked_softmax(s, valid) (B, N, C),   out = dropout(a) v (B, N, Dv)
//
// Dims: B batch, N queries of width Dq, C keys of width Dk with values of width Dv.
#pragma once
#include <torch/nn/module.h>
#include "spanformer/nn/dropout.h"
#include <torch/nn/modules/linear.h>

#include <string>
#include <utility>

#include "spanformer/attention/kinds.h"
#include "spanformer/nn/linear.h"

namespace spanformer::attention {

// ScoreKind (additive | dot | scaled_dot | general): attention/kinds.h.

struct ScoringOptions {
  ScoreKind kind = ScoreKind::kScaledDot;
  int64_t query_size = 0, key_size = 0;
  int64_t hidden = 0;    // h of the additive score (0: key_size)
  double dropout = 0.0;  // on the weights, when training
};

class AttentionScoringImpl : public torch::nn::Module {
 public:
  explicit AttentionScoringImpl(const ScoringOptions& options);
  // q (B, N, Dq), k (B, C, Dk) -> s (B, N, C).
  torch::Tensor score(const torch::Tensor& q, const torch::Tensor& k);
  // -> out (B, N, Dv) and the weights a (B, N, C) (before dropout). `valid`: (B) or (B, N) lengths, or
  // undefined for every key.
  std::pair<torch::Tensor, torch::Tensor> forward(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                                  const torch::Tensor& valid = {});
  const ScoringOptions& options() const { return options_; }

 private:
  ScoringOptions options_;
  spanformer::nn::Linear w_q{nullptr}, w_k{nullptr}, w_v{nullptr};  // additive
  torch::Tensor w;                                               // general (Dq, Dk)
  spanformer::nn::Dropout drop{nullptr};
};
TORCH_MODULE(AttentionScoring);

}  // namespace spanformer::attention
