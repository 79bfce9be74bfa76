// The adaptive-span character language model (Sukhbaatar et al. 2019), layer for layer as the
// reference implementation (facebookresearch/adaptive-span, models.py):
//
//   x (B, M) token ids
//   h = in_emb(x)                                   (B, M, H)   no scaling, no absolute positions
//   for each layer l:                               caches[l]: (B, C_l, H) its own earlier INPUTS
//       h = LN1(h + Attn(h, caches[l], key_pe))     post-norm; key_pe (D, L) shared by all layers
//       h = LN2(h + FF(h))                          FF = Linear(H, I) - ReLU - Dropout - Linear(I, H)
//                                                   (no FF, no LN2 in persistent-memory layers)
//   logits = out_emb(h)                             (B, M, V)   Linear with bias, not tied
//
// Caches are detached and keep the last cache_size() inputs of each layer (the span decides how many).
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <torch/arg.h>

#include <vector>

#include "spanformer/attention/seq_attention.h"
#include "spanformer/config/adaptive_span_config.h"
#include "spanformer/nn/linear.h"

namespace spanformer::models {

// One post-norm layer: the span-aware attention (its own options) and, without persistent memory, the
// feed-forward H -> inner_hidden_size (ReLU, dropout) -> H.
struct TransformerSeqLayerOptions {
  TransformerSeqLayerOptions(attention::SeqAttentionOptions attention, int64_t inner_hidden_size)
      : attention_(std::move(attention)), inner_hidden_size_(inner_hidden_size) {}
  TORCH_ARG(attention::SeqAttentionOptions, attention);
  TORCH_ARG(int64_t, inner_hidden_size);  // unused with persistent memory (attention().pers_mem_size() > 0)
};

// A layer's options from a model config (what TransformerSeq builds its layers from).
TransformerSeqLayerOptions transformer_seq_layer_options(const ModelConfig& config);

class TransformerSeqLayerImpl : public torch::nn::Module {
 public:
  explicit TransformerSeqLayerImpl(TransformerSeqLayerOptions options);
  // h: (B, M, H), cache: (B, C, H), key_pe: (D, L) -> (B, M, H)
  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& cache, const torch::Tensor& key_pe);

  attention::SeqAttention attn{nullptr};
  spanformer::nn::Linear fc1{nullptr}, fc2{nullptr};  // absent with persistent memory
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};

 private:
  double dropout_;
};
TORCH_MODULE(TransformerSeqLayer);

class TransformerSeqImpl : public torch::nn::Module {
 public:
  explicit TransformerSeqImpl(const ModelConfig& config);

  // x: (B, M) int64. Uses caches (one (B, C_l, H) per layer) and replaces them with the next block's.
  // Returns the last hidden state (B, M, H).
  torch::Tensor forward(const torch::Tensor& x, std::vector<torch::Tensor>& caches);

  // (B, M, H) -> (B, M, V) unnormalised scores.
  torch::Tensor logits(const torch::Tensor& hidden) { return out_emb(hidden); }

  // Zero caches of the right size for `batch` streams.
  std::vector<torch::Tensor> initial_caches(int64_t batch) const;

  // Sum over layers of the span loss (0 when adaptive span is off).
  torch::Tensor span_loss() const;
  // Clamp every span_ratio to [0, 1] and refresh the host-side span sizes (one transfer for all layers).
  void clamp_spans();
  void sync_spans();
  // Per layer: the spans z = span_ratio * L of each head, on the host.
  std::vector<std::vector<double>> spans() const;

  const ModelConfig& config() const { return config_; }

  torch::nn::Embedding in_emb{nullptr};
  spanformer::nn::Linear out_emb{nullptr};
  torch::Tensor key_pe;  // (D, L), column j = distance L - j
  std::vector<TransformerSeqLayer> layers;

 private:
  ModelConfig config_;
  double emb_dropout_;
};
TORCH_MODULE(TransformerSeq);

}  // namespace spanformer::models
