#include "spanformer/models/gpt.h"

#include <ATen/ATen.h>
#include <torch/nn/init.h>

#include <cmath>

#include "spanformer/util/error.h"

namespace spanformer::models {

torch::Tensor sinusoidal_positions(int64_t T, int64_t H) {
  auto p = torch::arange(T, torch::kDouble).unsqueeze(1);                          // (T, 1)
  auto i = torch::arange(0, H, 2, torch::kDouble);                                 // (ceil(H / 2))
  auto angle = p / torch::pow(10000.0, i / static_cast<double>(H)).unsqueeze(0);    // (T, ceil(H / 2))
  auto table = torch::zeros({T, H}, torch::kDouble);
  table.slice(1, 0, H, 2).copy_(torch::sin(angle));
  table.slice(1, 1, H, 2).copy_(torch::cos(angle).narrow(1, 0, H / 2));
  return table.to(torch::kFloat);                                                   // (T, H)
}

GptAttentionImpl::GptAttentionImpl(const GptModelConfig& config, int64_t layer) : config_(config), layer_(layer) {
  const int64_t H = config.d_model;
  qkv = register_module("qkv", torch::nn::Linear(H, 3 * H));
  proj = register_module("proj", torch::nn::Linear(H, H));
  if (config.attention == attention::CausalKind::kAdaptiveSpan)
    span = register_module("span", nn::AdaptiveSpan(nn::AdaptiveSpanOptions(config.span_limit(), config.n_head)
                                                        .ramp(config.adapt_span_ramp)
                                                        .init(config.adapt_span_init)
                                                        .loss_coeff(config.adapt_span_loss)));
}

attention::CausalSpec GptAttentionImpl::spec() const {
  attention::CausalSpec s;
  s.kind = config_.attention;
  s.window = config_.window;
  s.span = span ? span.get() : nullptr;
  s.stride = config_.stride_l();
  s.summary = config_.sparse_summary;
  s.combine = config_.sparse_combine;
  s.layer = layer_;
  s.heads = config_.n_head;
  s.dropout = config_.attn_dropout;
  s.training = is_training();
  return s;
}

int64_t GptAttentionImpl::band(int64_t keys) const { return attention::causal_band(spec(), keys); }

torch::Tensor GptAttentionImpl::forward(const torch::Tensor& h, torch::Tensor* k_cache, torch::Tensor* v_cache,
                                        int64_t keep) {
  const int64_t B = h.size(0), N = h.size(1), H = config_.d_model, K = config_.n_head, D = H / K;
  auto qkv_heads = qkv(h).view({B, N, 3, K, D}).permute({2, 0, 3, 1, 4});  // (3, B, K, N, D)
  auto q = qkv_heads[0], k = qkv_heads[1], v = qkv_heads[2];               // (B, K, N, D)
  if (k_cache && k_cache->defined()) {
    k = torch::cat({*k_cache, k}, 2);  // (B, K, C + N, D)
    v = torch::cat({*v_cache, v}, 2);
  }
  auto out = attention::causal_attention(q, k, v, spec(), config_.attn_impl);  // (B, K, N, D)
  if (k_cache) {
    const int64_t C = k.size(2);
    const int64_t kept = keep >= 0 ? std::min(C, keep) : C;
    *k_cache = k.narrow(2, C - kept, kept);  // (B, K, kept, D)
    *v_cache = v.narrow(2, C - kept, kept);
  }
  return proj(out.transpose(1, 2).reshape({B, N, H}));  // (B, N, H)
}

GptBlockImpl::GptBlockImpl(const GptModelConfig& config, int64_t layer) : dropout_(config.dropout) {
  const int64_t H = config.d_model;
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  attn = register_module("attn", GptAttention(config, layer));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  fc1 = register_module("fc1", torch::nn::Linear(H, config.inner_dim()));
  fc2 = register_module("fc2", torch::nn::Linear(config.inner_dim(), H));
}

torch::Tensor GptBlockImpl::forward(const torch::Tensor& h, torch::Tensor* k_cache, torch::Tensor* v_cache,
                                    int64_t keep) {
  auto x = h + torch::dropout(attn(ln1(h), k_cache, v_cache, keep), dropout_, is_training());        // (B, N, H)
  return x + torch::dropout(fc2(torch::gelu(fc1(ln2(x)))), dropout_, is_training());                 // (B, N, H)
}

GptModelImpl::GptModelImpl(const GptModelConfig& config) : config_(config) {
  const int64_t H = config.d_model, V = config.vocab_size, T = config.context;
  wte = register_module("wte", torch::nn::Embedding(V, H));
  if (config.positions == Positions::kLearned) {
    wpe = register_module("wpe", torch::nn::Embedding(T, H));
  } else {
    sinusoid = register_buffer("sinusoid", sinusoidal_positions(T, H));
  }
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t l = 0; l < config.n_layer; ++l) {
    block_list_.push_back(GptBlock(config, l));
    blocks->push_back(block_list_.back());
  }
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  if (!config.tie_weights) head = register_module("head", torch::nn::Linear(torch::nn::LinearOptions(H, V).bias(false)));

  // GPT-2 initialisation.
  torch::NoGradGuard no_grad;
  const double residual_std = config.init_std / std::sqrt(2.0 * static_cast<double>(config.n_layer));
  for (auto& module : modules(/*include_self=*/false)) {
    if (auto* linear = module->as<torch::nn::Linear>()) {
      linear->weight.normal_(0, config.init_std);
      if (linear->bias.defined()) linear->bias.zero_();
    } else if (auto* embedding = module->as<torch::nn::Embedding>()) {
      embedding->weight.normal_(0, config.init_std);
    }
  }
  for (auto& block : block_list_) {
    block->attn->proj->weight.normal_(0, residual_std);
    block->fc2->weight.normal_(0, residual_std);
  }
}

torch::Tensor GptModelImpl::forward(const torch::Tensor& x, GptCache* cache) {
  const int64_t N = x.size(1), T = config_.context, p0 = cache ? cache->position : 0;
  if (p0 + N > T) fail("gpt: tokens at positions {} .. {} lie beyond the context of {}", p0, p0 + N - 1, T);
  auto positions = wpe ? wpe->weight.narrow(0, p0, N) : sinusoid.narrow(0, p0, N);  // (N, H)
  auto h = torch::dropout(wte(x) + positions, config_.dropout, is_training());       // (B, N, H)
  if (cache && cache->k.empty()) {
    cache->k.resize(block_list_.size());
    cache->v.resize(block_list_.size());
  }
  for (size_t l = 0; l < block_list_.size(); ++l) {
    auto& block = block_list_[l];
    const int64_t keep = cache && cache->trim ? block->attn->band(T) - 1 : -1;
    h = cache ? block->forward(h, &cache->k[l], &cache->v[l], keep) : block->forward(h);  // (B, N, H)
  }
  if (cache) cache->position += N;
  return ln_f(h);  // (B, N, H)
}

torch::Tensor GptModelImpl::logits(const torch::Tensor& hidden) {
  return head ? head(hidden) : torch::matmul(hidden, wte->weight.t());  // (B, N, V)
}

torch::Tensor GptModelImpl::extend(const torch::Tensor& x, GptDecoder& d) {
  const int64_t n = x.size(1), T = config_.context;
  auto host = x.to(torch::kCPU).contiguous();
  d.history.insert(d.history.end(), host.data_ptr<int64_t>(), host.data_ptr<int64_t>() + n);
  const auto end = static_cast<int64_t>(d.history.size());
  const bool slide = end - d.start > T;
  if (slide) d.start = end - std::max(n, T / 2);
  if (d.use_cache && !slide) {
    d.cache.trim = d.trim;
    return forward(x, &d.cache);  // (1, n, H)
  }
  auto context = torch::tensor(std::vector<int64_t>(d.history.begin() + d.start, d.history.end()), torch::kLong)
                     .view({1, -1}).to(x.device());  // (1, end - start)
  torch::Tensor hidden;  // (1, end - start, H)
  if (d.use_cache) {
    d.cache = GptCache{};
    d.cache.trim = d.trim;
    hidden = forward(context, &d.cache);
  } else {
    hidden = forward(context);
  }
  return hidden.narrow(1, hidden.size(1) - n, n);  // (1, n, H)
}

torch::Tensor GptModelImpl::span_loss() const {
  torch::Tensor total = torch::zeros({}, wte->weight.options());
  for (const auto& block : block_list_)
    if (block->attn->span) total = total + block->attn->span->loss();
  return total;
}

void GptModelImpl::clamp_spans() {
  for (auto& block : block_list_)
    if (block->attn->span) {
      block->attn->span->clamp_();
      block->attn->span->sync_host();
    }
}

std::vector<std::vector<double>> GptModelImpl::spans() const {
  std::vector<std::vector<double>> out;
  for (const auto& block : block_list_) {
    if (!block->attn->span) continue;
    std::vector<double> z;
    for (double r : block->attn->span->host_ratios())
      z.push_back(r * static_cast<double>(block->attn->span->options().attn_span()));
    out.push_back(std::move(z));
  }
  return out;
}

}  // namespace spanformer::models
