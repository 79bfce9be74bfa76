// Encoder-decoder translation models (the seq2seq family, config/seq2seq_config.h), from the recurrent
// baseline to the Transformer, behind one decoding interface.
//
// Recurrent (kind gru | bahdanau | luong). E_s, E_t embeddings (E_t = the first Vt rows of E_s when
// share_embeddings), GRU stacks of L layers, dropout on embeddings and between layers.
//   encoder:    o_1..o_S, h_S = GRU_enc(drop(E_s x))   packed by source length  (B, S, H), (L, B, H)
//   bidirectional (by flag; Bahdanau et al.'s annotations): two GRUs of H/2 read x_1..x_n and x_n..x_1,
//               o_j = [fwd_j; bwd_j] (each layer's input the previous layer's concatenation),
//               h = [fwd_n; bwd_1] per layer                         (B, S, H), (L, B, H) as above
//   decoder state s_0 = h_S (every layer); at step t with input y_{t-1}:
//   gru         s_t = GRU_dec([drop(E_t y_{t-1}); o_S^top], s_{t-1})       the source summarised once
//   bahdanau    c_t = sum_j a_tj o_j,  a_t = softmax_j(w^T tanh(W_q s_{t-1}^top + W_k o_j))  (masked)
//               s_t = GRU_dec([drop(E_t y_{t-1}); c_t], s_{t-1})           logits = W_out drop(s_t^top)
//               deep_output (by flag; the paper's output, its appendix A.2.2): a maxout layer over the
//               previous state, the previous word and the context,
//               t~_t = U s_{t-1}^top + V drop(E_t y_{t-1}) + C c_t + b  (2H),  t_tj = max(t~_t,2j, t~_t,2j+1),
//               logits = W_out drop(t_t)
//   luong       s_t = GRU_dec([drop(E_t y_{t-1}); h~_{t-1}], s_{t-1})      (input feeding; h~_0 = 0)
//               a_t = softmax_j(score(s_t^top, o_j)), score dot or general (s^T W o)
//               h~_t = tanh(W_c [c_t; s_t^top]),  logits = W_out drop(h~_t)
// Transformer (Vaswani et al. 2017): x = drop(E x sqrt(H) + P), P sinusoidal (nn/positional.h);
//   encoder block   x = LN(x + drop(SelfAttn(x)));  x = LN(x + drop(FFN(x)))     post-norm (the paper)
//                   x = x + drop(SelfAttn(LN(x)));  x = x + drop(FFN(LN(x)))     pre-norm (+ final LN)
//   decoder block   causal self-attention, cross-attention over the encoder output, FFN, same norms.
//   FFN(x) = W2 drop(relu(W1 x)) (H -> I -> H). Attention: attention/multi_head.h (source key padding).
// Output layer: Linear(H, Vt), or with share_embeddings the embedding's first Vt rows (+ a bias).
//
// Decoding interface: start() encodes a batch into a DecodeState whose tensors all have the batch in
// dim 0 (so beams reorder with one index_select), step() takes the previous tokens and returns the
// next token's log-probabilities. forward() (teacher forcing, training) and step() by step compute the
// same function: tests hold them to each other in double precision.
#pragma once
#include <torch/arg.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include "spanformer/nn/dropout.h"
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/modules/rnn.h>

#include <memory>
#include <vector>

#include "spanformer/attention/multi_head.h"
#include "spanformer/attention/scoring.h"
#include "spanformer/config/seq2seq_config.h"
#include "spanformer/nn/linear.h"

namespace spanformer::models {

struct DecodeState {
  std::vector<torch::Tensor> tensors;  // every one (B, ...)
  void reorder(const torch::Tensor& index);  // keeps rows `index` (beam search)
};

class Seq2SeqModel {
 public:
  virtual ~Seq2SeqModel() = default;
  // src (B, S) ids (padded with <pad>), src_len (B) in [1, S], tgt_in (B, T) = <bos> y_1 .. y_{T-1}
  // -> logits (B, T, Vt). `attention`, when given, receives the source attention: one (B, T, S) for
  // bahdanau/luong, one (B, K, T, S) per decoder layer for the Transformer, none for gru.
  virtual torch::Tensor translate_logits(const torch::Tensor& src, const torch::Tensor& src_len, const torch::Tensor& tgt_in,
                                         std::vector<torch::Tensor>* attention = nullptr) = 0;
  virtual DecodeState start(const torch::Tensor& src, const torch::Tensor& src_len) = 0;
  // prev (B) tokens -> log-probabilities of the next token (B, Vt); `attention` receives (B, S) (the
  // heads' and layers' mean for the Transformer; zeros for gru).
  virtual torch::Tensor step(DecodeState& state, const torch::Tensor& prev, torch::Tensor* attention = nullptr) = 0;
  virtual const Seq2SeqModelConfig& config() const = 0;
};

// A model of config.kind: the module (registered parameters) and its decoding interface.
struct Seq2SeqNet {
  std::shared_ptr<torch::nn::Module> module;
  Seq2SeqModel* model = nullptr;
};
Seq2SeqNet make_seq2seq(const Seq2SeqModelConfig& config);

class RnnSeq2SeqImpl : public torch::nn::Module, public Seq2SeqModel {
 public:
  explicit RnnSeq2SeqImpl(const Seq2SeqModelConfig& config);
  torch::Tensor translate_logits(const torch::Tensor& src, const torch::Tensor& src_len, const torch::Tensor& tgt_in,
                                 std::vector<torch::Tensor>* attention = nullptr) override;
  DecodeState start(const torch::Tensor& src, const torch::Tensor& src_len) override;
  torch::Tensor step(DecodeState& state, const torch::Tensor& prev, torch::Tensor* attention = nullptr) override;
  const Seq2SeqModelConfig& config() const override { return config_; }

  torch::nn::Embedding src_embed{nullptr}, tgt_embed{nullptr};  // tgt_embed null when shared
  torch::nn::GRU encoder{nullptr}, decoder{nullptr};
  attention::AttentionScoring attn{nullptr};  // bahdanau | luong
  spanformer::nn::Linear combine{nullptr};         // luong: W_c (2H -> H)
  spanformer::nn::Linear deep{nullptr};            // bahdanau with deep_output: [U V C] (3H -> 2H, + b)
  spanformer::nn::Linear out{nullptr};             // W_out (H -> Vt), null when shared
  torch::Tensor out_bias;                     // (Vt) when shared
  spanformer::nn::Dropout drop{nullptr};

 private:
  torch::Tensor embed_target(const torch::Tensor& y);            // (B, T) -> (B, T, H)
  torch::Tensor output_logits(const torch::Tensor& h);           // (..., H) -> (..., Vt)
  // One decoder step on embedded input e (B, H): updates s (L, B, H) and feed (B, H); -> logits (B, Vt).
  torch::Tensor decode_step(const torch::Tensor& e, torch::Tensor& s, torch::Tensor& feed, const torch::Tensor& memory,
                            const torch::Tensor& src_len, torch::Tensor* weights);
  Seq2SeqModelConfig config_;
};
TORCH_MODULE(RnnSeq2Seq);

// One Transformer layer (Vaswani et al. 2017): self-attention, cross-attention over the encoder's
// memory (decoder layers), the feed-forward H -> d_inner (ReLU) -> H, each sublayer with dropout and a
// LayerNorm before it (pre_norm) or after the residual.
struct TransformerLayerOptions {
  // attention: both attentions' options (H = d_model, K heads, dropout on the weights).
  TransformerLayerOptions(attention::MultiHeadOptions attention, int64_t d_inner) : attention_(attention), d_inner_(d_inner) {}
  TORCH_ARG(attention::MultiHeadOptions, attention);
  TORCH_ARG(int64_t, d_inner);
  TORCH_ARG(bool, decoder) = false;
  TORCH_ARG(bool, pre_norm) = false;
  TORCH_ARG(double, dropout) = 0.0;  // on each sublayer's output
};

class TransformerLayerImpl : public torch::nn::Module {
 public:
  explicit TransformerLayerImpl(TransformerLayerOptions options);
  // x (B, N, H); memory (B, S, H) and its padding (B, S) for decoder layers. `weights`: cross-attention
  // (B, K, N, S) for decoder layers.
  torch::Tensor forward(const torch::Tensor& x, const attention::AttentionMask& self_mask, const torch::Tensor& memory = {},
                        const attention::AttentionMask& memory_mask = {}, torch::Tensor* weights = nullptr);

  attention::MultiHeadAttention self_attn{nullptr}, cross_attn{nullptr};
  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr}, norm3{nullptr};
  spanformer::nn::Linear fc1{nullptr}, fc2{nullptr};
  spanformer::nn::Dropout drop{nullptr};

 private:
  torch::Tensor sublayer(const torch::Tensor& x, torch::nn::LayerNorm& norm, const std::function<torch::Tensor(const torch::Tensor&)>& f);
  bool pre_norm_;
};
TORCH_MODULE(TransformerLayer);

class TransformerSeq2SeqImpl : public torch::nn::Module, public Seq2SeqModel {
 public:
  explicit TransformerSeq2SeqImpl(const Seq2SeqModelConfig& config);
  torch::Tensor translate_logits(const torch::Tensor& src, const torch::Tensor& src_len, const torch::Tensor& tgt_in,
                                 std::vector<torch::Tensor>* attention = nullptr) override;
  DecodeState start(const torch::Tensor& src, const torch::Tensor& src_len) override;
  torch::Tensor step(DecodeState& state, const torch::Tensor& prev, torch::Tensor* attention = nullptr) override;
  const Seq2SeqModelConfig& config() const override { return config_; }

  torch::nn::Embedding src_embed{nullptr}, tgt_embed{nullptr};
  torch::nn::ModuleList encoder, decoder;
  torch::nn::LayerNorm enc_norm{nullptr}, dec_norm{nullptr};  // pre-norm only
  spanformer::nn::Linear out{nullptr};
  torch::Tensor out_bias;
  spanformer::nn::Dropout drop{nullptr};
  torch::Tensor positions;  // (max_positions, H) buffer

 private:
  torch::Tensor encode(const torch::Tensor& src, const torch::Tensor& src_len);  // (B, S, H)
  torch::Tensor decode(const torch::Tensor& tgt_in, const torch::Tensor& memory, const torch::Tensor& src_len,
                       std::vector<torch::Tensor>* attention);  // logits (B, T, Vt)
  torch::Tensor embed(const torch::Tensor& ids, torch::nn::Embedding& table);
  Seq2SeqModelConfig config_;
  std::vector<TransformerLayer> enc_layers_, dec_layers_;
};
TORCH_MODULE(TransformerSeq2Seq);

// ---- decoding ---------------------------------------------------------------------------------------
struct Hypothesis {
  std::vector<int64_t> tokens;  // without <bos>, without the final <eos>
  double logprob = 0;           // sum of the tokens' log-probabilities (the <eos> included)
  double score = 0;             // logprob / ((5 + n) / 6)^alpha, n = tokens + 1
  torch::Tensor attention;      // (n, S): each emitted token's source attention (the <eos> included)
};
struct DecodeOptions {
  int64_t beam = 1;             // 1 = greedy
  double length_penalty = 1.0;  // alpha
  int64_t max_extra = 10;       // at most source length + max_extra tokens
};
// Best hypothesis per source sentence (<pad> and <bos> are never emitted). Greedy decodes the batch at
// once; beam search keeps `beam` live hypotheses per sentence, finishes one on <eos> or at the length
// limit, and stops once `beam` have finished and the best live one scores below the worst of them.
std::vector<Hypothesis> decode(Seq2SeqModel& model, const torch::Tensor& src, const torch::Tensor& src_len,
                               const DecodeOptions& options);

}  // namespace spanformer::models
