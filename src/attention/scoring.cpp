#include "spanformer/attention/scoring.h"

#include <fmt/ranges.h>

#include <cmath>

#include "spanformer/ops/masked_softmax.h"
#include "spanformer/util/error.h"
#include "spanformer/util/names.h"

namespace spanformer::attention {

constexpr auto kScoreKindNames = name_table("score", std::pair{ScoreKind::kAdditive, "additive"},
                                            std::pair{ScoreKind::kDot, "dot"},
                                            std::pair{ScoreKind::kScaledDot, "scaled_dot"},
                                            std::pair{ScoreKind::kGeneral, "general"});

const char* score_kind_name(ScoreKind value) { return kScoreKindNames.name(value); }
ScoreKind parse_score_kind(const std::string& name) { return kScoreKindNames.parse(name); }

AttentionScoringImpl::AttentionScoringImpl(const ScoringOptions& o) : options_(o) {
  if (o.query_size < 1 || o.key_size < 1)
    fail("attention scoring: query and key sizes must be positive (got {}, {})", o.query_size, o.key_size);
  if ((o.kind == ScoreKind::kDot || o.kind == ScoreKind::kScaledDot) && o.query_size != o.key_size)
    fail("attention scoring: the {} score needs queries and keys of one width (got {} and {})", score_kind_name(o.kind),
         o.query_size, o.key_size);
  if (!(o.dropout >= 0 && o.dropout < 1)) fail("attention scoring: dropout must be in [0, 1) (got {})", o.dropout);
  if (o.kind == ScoreKind::kAdditive) {
    const int64_t h = o.hidden > 0 ? o.hidden : o.key_size;
    w_q = register_module("w_q", spanformer::nn::Linear(torch::nn::LinearOptions(o.query_size, h).bias(false)));
    w_k = register_module("w_k", spanformer::nn::Linear(torch::nn::LinearOptions(o.key_size, h).bias(false)));
    w_v = register_module("w_v", spanformer::nn::Linear(torch::nn::LinearOptions(h, 1).bias(false)));
  } else if (o.kind == ScoreKind::kGeneral) {
    w = register_parameter("w",
                           torch::randn({o.query_size, o.key_size}) / std::sqrt(static_cast<double>(o.query_size)));
  }
  drop = register_module("drop", spanformer::nn::Dropout(o.dropout));
}

torch::Tensor AttentionScoringImpl::score(const torch::Tensor& q, const torch::Tensor& k) {
  if (q.dim() != 3 || k.dim() != 3 || q.size(0) != k.size(0) || q.size(-1) != options_.query_size ||
      k.size(-1) != options_.key_size)
    fail("attention scoring: q must be (B, N, {}) and k (B, C, {}) (got {} and {})", options_.query_size,
         options_.key_size, fmt::join(q.sizes(), "x"), fmt::join(k.sizes(), "x"));
  switch (options_.kind) {
    case ScoreKind::kAdditive: {
      auto features = torch::tanh(w_q(q).unsqueeze(2) + w_k(k).unsqueeze(1));  // (B, N, C, h)
      return w_v(features).squeeze(-1);                                        // (B, N, C)
    }
    case ScoreKind::kDot:
      return torch::matmul(q, k.transpose(1, 2));  // (B, N, C)
    case ScoreKind::kScaledDot:
      return torch::matmul(q, k.transpose(1, 2)) / std::sqrt(static_cast<double>(options_.key_size));  // (B, N, C)
    case ScoreKind::kGeneral:
      return torch::matmul(torch::matmul(q, w), k.transpose(1, 2));  // (B, N, C)
  }
  return {};
}

std::pair<torch::Tensor, torch::Tensor> AttentionScoringImpl::forward(const torch::Tensor& q, const torch::Tensor& k,
                                                                      const torch::Tensor& v,
                                                                      const torch::Tensor& valid) {
  if (v.dim() != 3 || v.size(0) != k.size(0) || v.size(1) != k.size(1))
    fail("attention scoring: v must be (B, C, Dv) with k's B and C (got {} for k {})", fmt::join(v.sizes(), "x"),
         fmt::join(k.sizes(), "x"));
  auto a = ops::masked_softmax(score(q, k), valid);  // (B, N, C)
  return {torch::bmm(drop(a), v), a};                // (B, N, Dv), (B, N, C)
}

}  // namespace spanformer::attention
