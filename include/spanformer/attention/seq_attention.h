// Multi-head attention over a cache of earlier hidden states with learned relative positions and an
// adaptive span: the attention of "Adaptive Attention Span in Transformers" (Sukhbaatar et al. 2019),
// computed exactly as the reference implementation (facebookresearch/adaptive-span, models.py).
//
// Dims: B batch, M block, L max span, L' keys used after trimming (AdaptiveSpan::used_span), C cache
// length, H width, K heads, D = H / K, N persistent-memory vectors.
//
// For query i of the block (absolute position C + i), the keys are the L' states before it, never
// itself: distances d = 1..L'. Scores use
//     s(i, d) = (q_i . k_{i-d} + q_i . key_pe[:, L - d]) / sqrt(D)
// (key_pe column j stands for distance L - j), then softmax over d, the span mask, renormalisation by
// the row sum + 1e-8, and dropout. Cached states are zero at the start and take part in the softmax.
//
// With pers_mem_size N > 0 (the "all-attention" layer, Sukhbaatar et al. 2019b) every head also
// attends to N learned key/value vectors in the same softmax; the span mask applies to the context
// part only and the renormalisation runs over both parts jointly.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/pimpl.h>

#include "spanformer/attention/attn_impl.h"
#include "spanformer/nn/adaptive_span.h"
#include "spanformer/nn/linear.h"

namespace spanformer::attention {

struct SeqAttentionOptions {
  SeqAttentionOptions(int64_t hidden_size, int64_t nb_heads, int64_t attn_span)
      : hidden_size_(hidden_size), nb_heads_(nb_heads), attn_span_(attn_span) {}
  TORCH_ARG(int64_t, hidden_size);    // H
  TORCH_ARG(int64_t, nb_heads);       // K
  TORCH_ARG(int64_t, attn_span);      // L
  TORCH_ARG(double, dropout) = 0.0;   // on attention probabilities
  TORCH_ARG(bool, adapt_span) = true; // learn spans (else every head sees L)
  TORCH_ARG(int64_t, adapt_span_ramp) = 32;
  TORCH_ARG(double, adapt_span_init) = 0.0;
  TORCH_ARG(double, adapt_span_loss) = 0.0;
  TORCH_ARG(bool, adapt_span_cache) = true;
  TORCH_ARG(int64_t, pers_mem_size) = 0;  // N
  // How attention is computed where the fused op applies (adaptive span on, no persistent memory;
  // elsewhere always the plain path): attn_impl.h.
  TORCH_ARG(AttnImpl, impl) = AttnImpl::kAuto;
};

class SeqAttentionImpl : public torch::nn::Module {
 public:
  explicit SeqAttentionImpl(SeqAttentionOptions options);

  // h: (B, M, H) this block's input; cache: (B, C, H) earlier inputs (any C >= 0; left-padded with
  // zeros up to L' when shorter); key_pe: (D, L). Returns (B, M, H).
  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& cache, const torch::Tensor& key_pe);

  // Attention from projected heads: q (B, K, M, D), k and v (B, K, L'+M, D) -> (B, K, M, D), by the
  // fused op or the plain path (uses_fused_op).
  torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       const torch::Tensor& key_pe);

  // Whether a block of M queries (B streams) runs the fused op: adaptive span on, no persistent
  // memory, and impl fused, or auto with the measured rule choosing it for the current spans.
  bool uses_fused_op(int64_t B, int64_t M) const;
  // Whether the fused path projects values per head (only the rows each head's span reads).
  bool uses_per_head_values(int64_t B, int64_t M) const;

  // Keys this layer reads (L') and states its cache keeps.
  int64_t used_span() const;
  int64_t cache_size() const;

  const SeqAttentionOptions& options() const { return options_; }

  spanformer::nn::Linear proj_query{nullptr}, proj_key{nullptr}, proj_val{nullptr}, proj_out{nullptr};
  nn::AdaptiveSpan span{nullptr};  // null when adapt_span is off
  torch::Tensor pers_key;          // (K, D, N) persistent keys, when N > 0
  torch::Tensor pers_val;          // (K, N, D) persistent values, when N > 0

 private:
  torch::Tensor attend_plain(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             const torch::Tensor& key_pe);

  SeqAttentionOptions options_;
};
TORCH_MODULE(SeqAttention);

// The last `width` states of `cache` (B, C, H), left-padded with zeros when C < width: (B, width, H).
torch::Tensor take_last_states(const torch::Tensor& cache, int64_t width);

}  // namespace spanformer::attention
