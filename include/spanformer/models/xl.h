// Transformer-XL (Dai et al., ACL 2019; kimiyoung/transformer-xl, mem_transformer.py, attn_type 0)
// written as a sequence of blocks, which makes it also the PAR Transformer and its super-network
// (Mandava et al. 2020):
//
//   x (B, Q) token ids                              Q = e + M: e re-read tokens (ext_len), M scored
//   h = drop(AdaptiveEmbedding(x))                  (B, Q, H)   scaled by sqrt(H)
//   r = drop(sinusoid(Kl-1, ..., 1, 0))             (Kl, H)     Kl = Mm + Q; distances clamped at clamp_len
//   for each block b (kinds from the layer string):
//     'a' attention:     h = LN(h + drop(RelAttn(h, mem_b, r)))       (post-norm; pre-norm by flag)
//     'f' feed-forward:  h = LN(h + drop(W2 drop(relu(W1 h))))
//     's' stochastic:    h = w_a * attention(h) + w_f * feed_forward(h) + w_i * h
//                        w = GumbelSoftmax(alpha_b, tau) in training, softmax(alpha_b) or
//                        one_hot(argmax alpha_b) at evaluation (no noise)
//   h = drop(h)                                     (B, Q, H)
//   nll = AdaptiveLogSoftmax(h, targets)            (B, Q)
//
// A Transformer-XL layer is "af"; the classic model is "af" x n_layer. Memory: every block that can
// attend keeps its own INPUT hidden states of the previous segments, (B, Mm, H), detached; after a
// segment it holds rows [end - mem_len, end) of [mem, h_in] with end = Q + max(0, Mm - ext_len), as the
// reference's _update_mems computes it (called there with qlen and mlen swapped).
//
// RelAttn (the four terms of the paper, sec. 3.3), heads K of width D:
//   q, k, v = split(W_qkv [mem; h])          q (B, K, M, D) from the last M rows, k, v (B, K, Kl, D)
//   r_k = W_r r                              (K, Kl, D)
//   score = ((q + u) k^T + rel_shift((q + v) r_k^T)) / sqrt(D)      (B, K, M, Kl)
//   masked (future keys, and with same_length keys beyond the common window) -> -inf, softmax,
//   [adaptive span: multiply by m_z(distance), renormalise], dropatt, @ v, W_o.
// u, v (K, D) are shared by all blocks, or per block with untie_r.
#pragma once
#include <torch/arg.h>
#include <torch/nn/module.h>
#include "spanformer/nn/dropout.h"
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <optional>
#include <vector>

#include "spanformer/config/xl_config.h"
#include "spanformer/nn/adaptive_softmax.h"
#include "spanformer/nn/adaptive_span.h"
#include "spanformer/nn/linear.h"

namespace spanformer::models::xl {

// Shifts row i of x (..., Q, R) left by Q - 1 - i, as the reference's _rel_shift (pad a zero column,
// view as (R + 1, Q), drop the first row): for R = Mm + Q and r ordered by decreasing distance,
// out[i][j] = x[i][j + Q - 1 - i], the term of distance Mm + i - j, for every unmasked j <= Mm + i.
torch::Tensor rel_shift(const torch::Tensor& x);

// pos (R) distances -> (R, H): [sin(pos * f) | cos(pos * f)], f_k = 1 / 10000^(2k / H) (concatenated,
// not interleaved, as the reference).
torch::Tensor sinusoid(const torch::Tensor& pos, int64_t d_model);
// The sinusoid's frequencies 1 / 10000^(2j / H), j < H / 2 (the reference's pos_emb.inv_freq).
torch::Tensor inv_freq(int64_t d_model, const torch::TensorOptions& options = {});

// (Q, Mm + Q) bool, true where query i may NOT see key j: j > Mm + i, and with same_length also
// j <= i - s where s = Q - (Mm + Q - mem_len) if that is positive, else Q (the reference's dec_attn_mask).
torch::Tensor attention_mask(int64_t qlen, int64_t mlen, bool same_length, int64_t mem_len, torch::Device device);

// Run-time lengths (training and evaluation use different ones).
struct Lengths {
  int64_t mem_len = 0, ext_len = 0, clamp_len = 0;
  bool same_length = false;
  static Lengths of(const XlModelConfig& c) { return {c.mem_len, c.ext_len, c.clamp_len, c.same_length}; }
};

// One relative-position attention block: H = d_model into K = heads heads of D = d_head, LayerNorm
// before (pre_lnorm) or after the residual, dropout on the output and on the probabilities, a (u, v)
// bias pair of its own when untied (N(0, init_std)), and the learned spans of adaptive span.
struct RelAttentionOptions {
  RelAttentionOptions(int64_t d_model, int64_t heads, int64_t d_head) : d_model_(d_model), heads_(heads), d_head_(d_head) {}
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(int64_t, heads);
  TORCH_ARG(int64_t, d_head);
  TORCH_ARG(bool, pre_lnorm) = false;
  TORCH_ARG(double, dropout) = 0.0;
  TORCH_ARG(double, dropatt) = 0.0;
  TORCH_ARG(bool, untie_r) = false;
  TORCH_ARG(double, init_std) = 0.02;
  TORCH_ARG(std::optional<nn::AdaptiveSpanOptions>, span);  // adapt_span only
  TORCH_ARG(attention::AttnImpl, impl) = attention::AttnImpl::kAuto;
};

// The position-wise feed-forward block: H -> d_inner (ReLU) -> H, dropout after each, LayerNorm as above.
struct XlFeedForwardOptions {
  XlFeedForwardOptions(int64_t d_model, int64_t d_inner) : d_model_(d_model), d_inner_(d_inner) {}
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(int64_t, d_inner);
  TORCH_ARG(bool, pre_lnorm) = false;
  TORCH_ARG(double, dropout) = 0.0;
};

// The blocks' options from a model config (what XlModel builds them from).
RelAttentionOptions rel_attention_options(const XlModelConfig& config);
XlFeedForwardOptions feed_forward_options(const XlModelConfig& config);

class RelAttentionImpl : public torch::nn::Module {
 public:
  explicit RelAttentionImpl(RelAttentionOptions options);
  // h (B, M, H), mem (B, Mm, H), r (Mm + M, H), u, v (K, D), mask (M, Mm + M) -> (B, M, H)
  torch::Tensor forward(const torch::Tensor& h, const torch::Tensor& mem, const torch::Tensor& r,
                        const torch::Tensor& u, const torch::Tensor& v, const torch::Tensor& mask);

  spanformer::nn::Linear qkv{nullptr}, r_net{nullptr}, o_net{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  spanformer::nn::Dropout drop{nullptr}, dropatt{nullptr};
  torch::Tensor r_w_bias, r_r_bias;  // (K, D), only with untie_r
  nn::AdaptiveSpan span{nullptr};    // only with adapt_span

 private:
  // With adapt_span: each head's products over its own window instead of one masked product.
  bool per_head_windows(const std::vector<int64_t>& visited, int64_t Kl, int64_t M) const;
  int64_t K_, D_;
  bool pre_lnorm_;
  attention::AttnImpl impl_;
};
TORCH_MODULE(RelAttention);

class FeedForwardImpl : public torch::nn::Module {
 public:
  explicit FeedForwardImpl(XlFeedForwardOptions options);
  torch::Tensor forward(const torch::Tensor& h);  // (B, M, H) -> (B, M, H)

  spanformer::nn::Linear fc1{nullptr}, fc2{nullptr};
  torch::nn::LayerNorm norm{nullptr};
  spanformer::nn::Dropout drop{nullptr};

 private:
  bool pre_lnorm_;
};
TORCH_MODULE(FeedForward);

inline constexpr int64_t kAttention = 0, kFeedForward = 1, kIdentity = 2;  // columns of block weights

class XlModelImpl : public torch::nn::Module {
 public:
  explicit XlModelImpl(const XlModelConfig& config);

  // x (B, Q) int64; mems: one (B, Mm, H) per block ((B, 0, H) for blocks that never attend), replaced
  // by the next segment's. weights (N, 3): the super-network's block weights (undefined for a plain
  // model). Returns the last hidden state (B, Q, H).
  torch::Tensor forward(const torch::Tensor& x, std::vector<torch::Tensor>& mems, const Lengths& lengths,
                        const torch::Tensor& weights = {});
  // hidden (B, M, H), targets (B, M) -> per-token NLL (B, M), nats.
  torch::Tensor nll(const torch::Tensor& hidden, const torch::Tensor& targets) const;
  // hidden (B, M, H) -> (B, M, V) log-probabilities.
  torch::Tensor log_prob(const torch::Tensor& hidden) const;

  std::vector<torch::Tensor> initial_mems(int64_t batch) const;  // (B, 0, H) each

  // Super-network: block weights for a training step (Gumbel-softmax) and for evaluation (no noise).
  torch::Tensor sample_weights(double tau, bool hard) const;
  torch::Tensor eval_weights() const;
  torch::Tensor probs() const;  // softmax(alpha) (N, 3), detached

  torch::Tensor span_loss() const;  // 0-dim; 0 without adaptive span
  void clamp_spans();
  // Host copies of the span ratios (one transfer), from which the attention's windows and the memory
  // lengths are computed; forward() calls it, so the sizes always follow the parameters.
  void sync_spans();
  std::vector<std::vector<double>> spans() const;  // per attention block, z per head

  // Parameters trained by the main optimizer (everything but alpha) and by the architecture optimizer.
  std::vector<std::pair<std::string, torch::Tensor>> weight_parameters() const;
  std::vector<std::pair<std::string, torch::Tensor>> arch_parameters() const;

  const XlModelConfig& config() const { return config_; }
  const std::vector<BlockKind>& blocks() const { return blocks_; }

  nn::AdaptiveEmbedding word_emb{nullptr};
  nn::AdaptiveLogSoftmax crit{nullptr};
  torch::Tensor r_w_bias, r_r_bias;        // (K, D) shared (without untie_r)
  std::vector<RelAttention> attn;           // per block; null for 'f' blocks
  std::vector<FeedForward> ff;              // per block; null for 'a' blocks
  torch::Tensor alpha;                      // (N, 3) architecture logits (super-network only)
  spanformer::nn::Dropout drop{nullptr};

 private:
  XlModelConfig config_;
  std::vector<BlockKind> blocks_;  // per block
};
TORCH_MODULE(XlModel);

}  // namespace spanformer::models::xl
