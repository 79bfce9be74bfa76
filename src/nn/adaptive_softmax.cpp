#include "spanformer/nn/adaptive_softmax.h"

#include <ATen/ATen.h>
#include <torch/nn/functional/embedding.h>

#include <cmath>

#include "spanformer/util/error.h"
#include "spanformer/util/precision.h"

namespace spanformer::nn {
namespace {

std::vector<int64_t> cluster_bounds(const AdaptiveOptions& o) {
  std::vector<int64_t> b{0};
  for (auto c : o.cutoffs) {
    if (c <= b.back() || c >= o.vocab_size)
      fail("adaptive softmax: cutoffs must be strictly increasing and below the vocabulary size {} (got {})",
           o.vocab_size, c);
    b.push_back(c);
  }
  b.push_back(o.vocab_size);
  return b;
}

int64_t cluster_width(const AdaptiveOptions& o, size_t i) {
  int64_t w = o.d_embed;
  for (size_t k = 0; k < i; ++k) w /= o.div_val;
  return w;
}

}  // namespace

AdaptiveEmbeddingImpl::AdaptiveEmbeddingImpl(AdaptiveOptions options)
    : options_(std::move(options)), bounds_(cluster_bounds(options_)) {
  const auto& o = options_;
  const size_t n = bounds_.size() - 1;
  if (o.div_val == 1) {
    tables.push_back(register_parameter("table_0", torch::randn({o.vocab_size, o.d_embed}) * o.init_std));
    if (o.d_proj != o.d_embed)
      projs.push_back(register_parameter("proj_0", torch::randn({o.d_proj, o.d_embed}) * o.proj_init_std));
  } else {
    for (size_t i = 0; i < n; ++i) {
      const int64_t rows = bounds_[i + 1] - bounds_[i], width = cluster_width(o, i);
      tables.push_back(register_parameter("table_" + std::to_string(i), torch::randn({rows, width}) * o.init_std));
      projs.push_back(register_parameter("proj_" + std::to_string(i), torch::randn({o.d_proj, width}) * o.proj_init_std));
    }
  }
}

torch::Tensor AdaptiveEmbeddingImpl::forward(const torch::Tensor& x) const {
  const double scale = std::sqrt(static_cast<double>(options_.d_proj));
  if (options_.div_val == 1) {
    auto e = torch::embedding(tables[0], x);                       // x.shape + (E)
    if (!projs.empty()) e = torch::matmul(e, projs[0].t());       // x.shape + (P)
    return e * scale;
  }
  auto flat = x.reshape({-1});                                     // (N)
  auto out = torch::zeros({flat.size(0), options_.d_proj}, tables[0].options());  // (N, P)
  for (size_t i = 0; i + 1 < bounds_.size(); ++i) {
    auto idx = ((flat >= bounds_[i]) & (flat < bounds_[i + 1])).nonzero().squeeze(1);  // (N_i)
    if (idx.numel() == 0) continue;
    auto e = torch::embedding(tables[i], flat.index_select(0, idx) - bounds_[i]);     // (N_i, E_i)
    out = out.index_copy(0, idx, torch::matmul(e, projs[i].t()).to(out.scalar_type()));  // (N_i, P); autocast may narrow the product
  }
  auto sizes = x.sizes().vec();
  sizes.push_back(options_.d_proj);
  return out.view(sizes) * scale;
}

AdaptiveLogSoftmaxImpl::AdaptiveLogSoftmaxImpl(AdaptiveOptions options, const AdaptiveEmbeddingImpl* tied,
                                               bool tie_weight, bool tie_projs)
    : options_(std::move(options)), bounds_(cluster_bounds(options_)) {
  const auto& o = options_;
  const int64_t n = nb_clusters();
  if (n > 0) {
    cluster_weight = register_parameter("cluster_weight", torch::randn({n, o.d_embed}) * o.init_std);
    cluster_bias = register_parameter("cluster_bias", torch::zeros({n}));
  }
  auto own = [&](const std::string& name, torch::Tensor t) { return register_parameter(name, std::move(t)); };
  if (o.div_val == 1) {
    weights.push_back(tie_weight && tied ? tied->tables[0] : own("weight_0", torch::randn({o.vocab_size, o.d_embed}) * o.init_std));
    biases.push_back(own("bias_0", torch::zeros({o.vocab_size})));
    for (int64_t i = 0; i <= n; ++i) {
      if (o.d_proj == o.d_embed) {
        projs.emplace_back();
      } else if (i > 0 && tie_projs && tied) {
        projs.push_back(tied->projs[0]);
      } else {
        projs.push_back(own("proj_" + std::to_string(i), torch::randn({o.d_proj, o.d_embed}) * o.proj_init_std));
      }
    }
  } else {
    for (int64_t i = 0; i <= n; ++i) {
      const int64_t rows = bounds_[i + 1] - bounds_[i], width = cluster_width(o, i);
      const auto s = std::to_string(i);
      weights.push_back(tie_weight && tied ? tied->tables[i] : own("weight_" + s, torch::randn({rows, width}) * o.init_std));
      biases.push_back(own("bias_" + s, torch::zeros({rows})));
      projs.push_back(i > 0 && tie_projs && tied ? tied->projs[i]
                                                 : own("proj_" + s, torch::randn({o.d_proj, width}) * o.proj_init_std));
    }
  }
}

std::pair<torch::Tensor, torch::Tensor> AdaptiveLogSoftmaxImpl::layer(int64_t i) const {
  torch::Tensor w, b;
  if (options_.div_val == 1) {
    w = weights[0].slice(0, bounds_[i], bounds_[i + 1]);
    b = biases[0].slice(0, bounds_[i], bounds_[i + 1]);
  } else {
    w = weights[i];
    b = biases[i];
  }
  if (i == 0 && nb_clusters() > 0) {  // head: shortlist rows, then one row per tail cluster
    w = torch::cat({w, cluster_weight}, 0);
    b = torch::cat({b, cluster_bias}, 0);
  }
  return {w, b};
}

torch::Tensor AdaptiveLogSoftmaxImpl::logits(const torch::Tensor& hidden, int64_t i) const {
  auto h = projs[i].defined() ? torch::matmul(hidden, projs[i]) : hidden;  // (N, P) -> (N, E_i)
  auto [w, b] = layer(i);
  return widen_reduced(torch::addmm(b, h, w.t()));                         // (N, V_i (+ n)); fp32 under autocast
}

torch::Tensor AdaptiveLogSoftmaxImpl::nll(const torch::Tensor& hidden, const torch::Tensor& target) const {
  if (hidden.dim() != 2 || target.dim() != 1 || hidden.size(0) != target.size(0))
    fail("adaptive softmax: hidden (N, P) and target (N) expected");
  auto head = torch::log_softmax(logits(hidden, 0), 1);  // (N, c_1 + n)
  const int64_t n = nb_clusters();
  if (n == 0) return -head.gather(1, target.unsqueeze(1)).squeeze(1);
  auto out = torch::zeros({target.size(0)}, head.options());
  for (int64_t i = 0; i <= n; ++i) {
    auto idx = ((target >= bounds_[i]) & (target < bounds_[i + 1])).nonzero().squeeze(1);  // (N_i)
    if (idx.numel() == 0) continue;
    auto t = target.index_select(0, idx) - bounds_[i];                                    // (N_i)
    auto head_i = head.index_select(0, idx);                                              // (N_i, c_1 + n)
    torch::Tensor lp;
    if (i == 0) {
      lp = head_i.gather(1, t.unsqueeze(1)).squeeze(1);
    } else {
      auto tail = torch::log_softmax(logits(hidden.index_select(0, idx), i), 1);        // (N_i, V_i)
      lp = head_i.select(1, bounds_[1] + n - i) + tail.gather(1, t.unsqueeze(1)).squeeze(1);
    }
    out = out.index_copy(0, idx, -lp);
  }
  return out;
}

torch::Tensor AdaptiveLogSoftmaxImpl::log_prob(const torch::Tensor& hidden) const {
  auto head = torch::log_softmax(logits(hidden, 0), 1);  // (N, c_1 + n)
  const int64_t n = nb_clusters();
  if (n == 0) return head;
  std::vector<torch::Tensor> parts{head.slice(1, 0, bounds_[1])};
  for (int64_t i = 1; i <= n; ++i) {
    auto tail = torch::log_softmax(logits(hidden, i), 1);  // (N, V_i)
    parts.push_back(head.slice(1, bounds_[1] + n - i, bounds_[1] + n - i + 1) + tail);
  }
  return torch::cat(parts, 1);  // (N, V)
}

std::vector<int64_t> propose_cutoffs(const std::vector<int64_t>& counts, const std::vector<double>& coverage,
                                     int64_t round_to) {
  if (counts.empty()) fail("propose_cutoffs: no token counts");
  if (round_to < 1) fail("propose_cutoffs: round_to must be >= 1 (got {})", round_to);
  for (size_t i = 0; i < coverage.size(); ++i) {
    if (!(coverage[i] > 0 && coverage[i] < 1)) fail("cutoff coverage must be in (0, 1) (got {})", coverage[i]);
    if (i > 0 && coverage[i] <= coverage[i - 1]) fail("cutoff coverages must increase (got {} after {})", coverage[i], coverage[i - 1]);
  }
  double total = 0;
  for (auto c : counts) total += static_cast<double>(c);
  const auto V = static_cast<int64_t>(counts.size());
  std::vector<int64_t> cutoffs;
  double cum = 0;
  size_t q = 0;
  for (int64_t r = 0; r < V && q < coverage.size(); ++r) {
    cum += static_cast<double>(counts[r]);
    while (q < coverage.size() && cum >= coverage[q] * total) {
      int64_t c = ((r + 1 + round_to - 1) / round_to) * round_to;  // words kept before this cutoff
      if (c < V && (cutoffs.empty() || c > cutoffs.back())) cutoffs.push_back(c);
      ++q;
    }
  }
  return cutoffs;
}

}  // namespace spanformer::nn
