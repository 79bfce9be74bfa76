#include "spanformer/models/transformer_seq.h"

#include <ATen/ATen.h>
#include "spanformer/nn/dropout.h"

namespace spanformer::models {

TransformerSeqLayerOptions transformer_seq_layer_options(const ModelConfig& c) {
  return TransformerSeqLayerOptions(attention::SeqAttentionOptions(c.hidden_size, c.nb_heads, c.attn_span)
                                        .dropout(c.dropout)
                                        .adapt_span(c.adapt_span)
                                        .adapt_span_ramp(c.adapt_span_ramp)
                                        .adapt_span_init(c.adapt_span_init)
                                        .adapt_span_loss(c.adapt_span_loss)
                                        .adapt_span_cache(c.adapt_span_cache)
                                        .pers_mem_size(c.pers_mem_size)
                                        .impl(c.attn_impl),
                                    c.inner_hidden_size);
}

TransformerSeqLayerImpl::TransformerSeqLayerImpl(TransformerSeqLayerOptions o) : dropout_(o.attention().dropout()) {
  const auto& a = o.attention();
  const int64_t H = a.hidden_size();
  attn = register_module("attn", attention::SeqAttention(a));
  norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  if (a.pers_mem_size() == 0) {
    fc1 = register_module("fc1", spanformer::nn::Linear(H, o.inner_hidden_size()));
    fc2 = register_module("fc2", spanformer::nn::Linear(o.inner_hidden_size(), H));
    norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  }
}

torch::Tensor TransformerSeqLayerImpl::forward(const torch::Tensor& h, const torch::Tensor& cache,
                                               const torch::Tensor& key_pe) {
  auto x = norm1(h + attn(h, cache, key_pe));                                   // (B, M, H)
  if (!fc1) return x;
  auto inner = spanformer::nn::dropout(torch::relu(fc1(x)), dropout_, is_training());    // (B, M, I)
  return norm2(x + fc2(inner));                                                 // (B, M, H)
}

TransformerSeqImpl::TransformerSeqImpl(const ModelConfig& c) : config_(c), emb_dropout_(c.emb_dropout) {
  TORCH_CHECK(c.vocab_size > 0, "vocab_size must be set before building a model");
  in_emb = register_module("in_emb", torch::nn::Embedding(c.vocab_size, c.hidden_size));  // N(0, 1)
  out_emb = register_module("out_emb", spanformer::nn::Linear(c.hidden_size, c.vocab_size));
  key_pe = register_parameter("key_pe", torch::randn({c.head_dim(), c.attn_span}));
  auto list = register_module("layers", torch::nn::ModuleList());  // parameter names layers.<l>.*
  for (int64_t l = 0; l < c.nb_layers; ++l) {
    TransformerSeqLayer layer(transformer_seq_layer_options(c));
    list->push_back(layer);
    layers.push_back(layer);
  }
}

torch::Tensor TransformerSeqImpl::forward(const torch::Tensor& x, std::vector<torch::Tensor>& caches) {
  TORCH_CHECK(caches.size() == layers.size(), "expected ", layers.size(), " caches, got ", caches.size());
  const int64_t M = x.size(1);
  auto h = in_emb(x);                                                           // (B, M, H)
  if (emb_dropout_ > 0) h = spanformer::nn::dropout(h, emb_dropout_, is_training());
  for (size_t l = 0; l < layers.size(); ++l) {
    // The next block's cache: the last cache_size inputs of this layer (this block's included).
    const int64_t keep = layers[l]->attn->cache_size();
    torch::Tensor next;
    if (keep > M) {
      const int64_t C = caches[l].size(1), from_cache = std::min(C, keep - M);
      next = torch::cat({caches[l].narrow(1, C - from_cache, from_cache), h}, 1).detach();  // (B, <=keep, H)
    } else {
      next = h.narrow(1, M - keep, keep).detach();                              // (B, keep, H)
    }
    h = layers[l]->forward(h, caches[l], key_pe);                               // (B, M, H)
    caches[l] = next;
  }
  if (emb_dropout_ > 0) h = spanformer::nn::dropout(h, emb_dropout_, is_training());
  return h;
}

std::vector<torch::Tensor> TransformerSeqImpl::initial_caches(int64_t batch) const {
  std::vector<torch::Tensor> caches;
  for (const auto& layer : layers) {
    caches.push_back(torch::zeros({batch, layer->attn->cache_size(), config_.hidden_size}, key_pe.options()));
  }
  return caches;
}

torch::Tensor TransformerSeqImpl::span_loss() const {
  auto total = torch::zeros({}, key_pe.options());
  for (const auto& layer : layers)
    if (layer->attn->span) total = total + layer->attn->span->loss();
  return total;
}

void TransformerSeqImpl::sync_spans() {
  if (!config_.adapt_span) return;
  std::vector<torch::Tensor> ratios;
  for (const auto& layer : layers) ratios.push_back(layer->attn->span->span_ratio.detach());
  auto host = torch::stack(ratios).to(torch::kCPU, torch::kDouble).contiguous();  // (layers, K): one transfer
  const int64_t K = host.size(1);
  for (size_t l = 0; l < layers.size(); ++l) {
    const double* row = host.data_ptr<double>() + static_cast<int64_t>(l) * K;
    layers[l]->attn->span->set_host_ratios(std::vector<double>(row, row + K));
  }
}

void TransformerSeqImpl::clamp_spans() {
  if (!config_.adapt_span) return;
  for (auto& layer : layers) layer->attn->span->clamp_();
  sync_spans();
}

std::vector<std::vector<double>> TransformerSeqImpl::spans() const {
  std::vector<std::vector<double>> out;
  for (const auto& layer : layers) {
    std::vector<double> z;
    if (layer->attn->span) {
      auto r = layer->attn->span->span_ratio.detach().to(torch::kCPU, torch::kDouble);
      for (int64_t k = 0; k < r.size(0); ++k) z.push_back(r[k].item<double>() * config_.attn_span);
    } else {
      z.assign(config_.nb_heads, static_cast<double>(config_.attn_span));
    }
    out.push_back(z);
  }
  return out;
}

}  // namespace spanformer::models
