// Multi-head attention (Vaswani et al. 2017, section 3.2.2), self or cross, with the masks of
// encoders and decoders: the one implementation the encoder-decoder Transformer, the Vision
// Transformer and the textbook modules share.
//
//   q = x W_q, k = m W_k, v = m W_v                  (B, N, H), (B, C, H), (B, C, H) -> K heads of D = H / K
//   a = softmax_where(q k^T / sqrt(D), keep)          (B, K, N, C)   ops/masked_softmax.h
//   out = concat_heads(dropout(a) v) W_o              (B, N, H)
//
// keep(b, i, j) = j < valid(b[, i])  and  not key_padding(b, j)  and  (not causal or j <= C - N + i):
// query i sits at key position C - N + i, so a decoder reading a cache of C - N earlier keys is causal
// too. A query with no key left gets zeros (never NaN).
// Dims: B batch, N queries of width H (d_model), C keys of width Hkv (kv_size; = H for self-attention).
#pragma once
#include <torch/nn/module.h>
#include "spanformer/nn/dropout.h"
#include <torch/nn/modules/linear.h>

#include <utility>

#include "spanformer/nn/linear.h"

namespace spanformer::attention {

struct AttentionMask {
  torch::Tensor valid;        // (B) or (B, N) valid key lengths, or undefined (all keys)
  torch::Tensor key_padding;  // (B, C) bool, true = a padding key, or undefined
  bool causal = false;
};
// The (B, 1, N, C) bool keep-mask of `mask`, or an undefined tensor when every key is kept.
torch::Tensor attention_keep(const AttentionMask& mask, int64_t B, int64_t N, int64_t C, const torch::Device& device);

struct MultiHeadOptions {
  int64_t d_model = 0, heads = 1;
  int64_t kv_size = 0;   // width of the key/value input (0: d_model)
  double dropout = 0.0;  // on the attention weights, when training
  bool bias = true;
};

class MultiHeadAttentionImpl : public torch::nn::Module {
 public:
  explicit MultiHeadAttentionImpl(const MultiHeadOptions& options);
  // query (B, N, H), memory (B, C, Hkv) -> (B, N, H). `weights`, when given, receives a (B, K, N, C).
  torch::Tensor forward(const torch::Tensor& query, const torch::Tensor& memory, const AttentionMask& mask = {},
                        torch::Tensor* weights = nullptr);
  // The heads' keys and values of `memory`: (B, K, C, D) each (cached once per source in decoding).
  std::pair<torch::Tensor, torch::Tensor> project_kv(const torch::Tensor& memory);
  // Attention of `query` over keys and values already projected.
  torch::Tensor attend(const torch::Tensor& query, const torch::Tensor& k, const torch::Tensor& v,
                       const AttentionMask& mask = {}, torch::Tensor* weights = nullptr);
  const MultiHeadOptions& options() const { return options_; }

  spanformer::nn::Linear w_q{nullptr}, w_k{nullptr}, w_v{nullptr}, w_o{nullptr};

 private:
  MultiHeadOptions options_;
  spanformer::nn::Dropout drop{nullptr};
};
TORCH_MODULE(MultiHeadAttention);

}  // namespace spanformer::attention
