#include "spanformer/nn/attention_pooling.h"

#include <fmt/ranges.h>
#include <torch/autograd.h>

#include "spanformer/util/error.h"
#include "spanformer/util/names.h"

namespace spanformer::nn {

constexpr auto kPoolingNames = name_table("pooling", std::pair{Pooling::kAverage, "average"},
                                          std::pair{Pooling::kNadaraya, "nadaraya"},
                                          std::pair{Pooling::kParametric, "parametric"});

const char* pooling_name(Pooling value) { return kPoolingNames.name(value); }

torch::Tensor pooling_weights(Pooling kind, const torch::Tensor& queries, const torch::Tensor& keys,
                              const torch::Tensor& w) {
  if (queries.dim() != 1) fail("attention pooling: queries must be (Q) (got {})", fmt::join(queries.sizes(), "x"));
  const int64_t Q = queries.size(0);
  if (!(keys.dim() == 1 || (keys.dim() == 2 && keys.size(0) == Q)) || keys.size(-1) < 1)
    fail("attention pooling: keys must be (n) or (Q, n) = ({}, n) with n >= 1 (got {})", Q,
         fmt::join(keys.sizes(), "x"));
  const int64_t n = keys.size(-1);
  if (kind == Pooling::kAverage) return torch::full({Q, n}, 1.0 / static_cast<double>(n), queries.options());
  auto d = (queries.unsqueeze(1) - (keys.dim() == 1 ? keys.unsqueeze(0) : keys)) * w;  // (Q, n)
  return torch::softmax(-d * d / 2, 1);                                                // (Q, n)
}

ParametricPoolingImpl::ParametricPoolingImpl(double w0) {
  w = register_parameter("w", torch::full({1}, w0, torch::kDouble));
}

torch::Tensor ParametricPoolingImpl::forward(const torch::Tensor& queries, const torch::Tensor& keys,
                                             const torch::Tensor& values, torch::Tensor* weights) {
  if (values.sizes() != keys.sizes())
    fail("attention pooling: values must have the keys' shape {} (got {})", fmt::join(keys.sizes(), "x"),
         fmt::join(values.sizes(), "x"));
  auto a = pooling_weights(Pooling::kParametric, queries, keys, w.to(queries.scalar_type()));  // (Q, n)
  if (weights) *weights = a;
  return values.dim() == 1 ? torch::mv(a, values) : (a * values).sum(1);  // (Q)
}

std::vector<double> fit_parametric_pooling(ParametricPoolingImpl& pooling, const torch::Tensor& x,
                                           const torch::Tensor& y, int64_t epochs, double lr) {
  const int64_t n = x.size(0);
  if (x.dim() != 1 || y.sizes() != x.sizes() || n < 2)
    fail("attention pooling: fit needs x and y of one shape (n), n >= 2");
  // Row i holds every pair but the i-th: (n, n - 1).
  auto others = torch::ones({n, n}, torch::kBool).logical_xor(torch::eye(n, torch::kBool));
  auto keys = x.unsqueeze(0).expand({n, n}).masked_select(others).view({n, n - 1});    // (n, n - 1)
  auto values = y.unsqueeze(0).expand({n, n}).masked_select(others).view({n, n - 1});  // (n, n - 1)
  std::vector<double> losses;
  for (int64_t e = 0; e < epochs; ++e) {
    auto loss = (pooling.forward(x, keys, values) - y).pow(2).mean();
    auto g = torch::autograd::grad({loss}, {pooling.w})[0];
    {
      torch::NoGradGuard no_grad;
      pooling.w.sub_(lr * g);
    }
    losses.push_back(loss.item<double>());
  }
  return losses;
}

}  // namespace spanformer::nn
