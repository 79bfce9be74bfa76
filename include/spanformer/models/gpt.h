// A GPT-style decoder (Radford et al. 2019, GPT-2) whose causal self-attention is a drop-in choice
// (attention/causal_attention.h): dense, window, adaptive span, Sparse Transformer strided or fixed.
//
//   x (B, N) token ids at positions p0 .. p0 + N - 1 (p0 + N <= T)
//   h = drop(wte(x) + P[p0 : p0 + N])          (B, N, H)   P learned (T, H) or sinusoidal
//   for each layer l (pre-norm):
//       h = h + drop(proj(Attn(LN1(h))))        Attn: K heads of D = H / K, causal, over the KV cache
//       h = h + drop(fc2(GELU(fc1(LN2(h)))))    fc1: H -> I, fc2: I -> H; GELU exact or tanh (model.activation)
//   h = LN_f(h);  logits = h W^T                (B, N, V)   W = wte.weight when tied
// With `reversible` (Gomez et al. 2017; Kitaev et al. 2020, sec. 3) the layers carry two streams,
//   x1 = x2 = h;  per layer  y1 = x1 + F(x2),  y2 = x2 + G(y1);  then h = (y1 + y2) / 2,
// F = drop(proj(Attn(LN1 .))), G = drop(fc2(GELU(fc1(LN2 .)))). Training keeps only the last layer's
// (y1, y2): backward rebuilds each layer's inputs from its outputs, x2 = y2 - G(y1), x1 = y1 - F(x2),
// recomputing F and G under the random state the forward used (dropout masks, LSH rotations), so
// activation memory does not grow with depth. G runs over `ff_chunks` slices of the positions.
//
// Initialisation as GPT-2: every Linear and embedding N(0, init_std), biases 0, and the two residual
// projections (attention proj, fc2) N(0, init_std / sqrt(2 N_layers)).
//
// KV cache (generation): a GptCache keeps each layer's keys and values (1..B, K, C, D) and the next
// position p0. With `trim` the cache keeps only the keys a layer can still read: window: w - 1;
// adaptive span: its largest visited distance - 1 (the spans are fixed at inference). Results are then
// identical to running the model on the whole context (tests/test_gpt.cpp).
//
// Fixed shapes (GptDecoder::fixed_shapes; the lab's CUDA graphs, lab/step_graph.h): a GPU spends a one-token step of a
// small model launching a few hundred short kernels, which a CUDA graph replays at once, but a graph
// needs the same shapes and buffers at every replay. So after the context is encoded the cache moves
// into buffers of the whole context, (1, K, T, D) per layer, and each new token is written at row `at`
// (an int64 tensor on the device) and reads rows 0 .. at through its pattern's weights
// (attention::causal_attention_at): the same sums as the growing cache, with keys after `at` weighing 0.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/embedding.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>
#include <torch/nn/pimpl.h>

#include <torch/arg.h>

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "spanformer/attention/causal_attention.h"
#include "spanformer/config/gpt_config.h"
#include "spanformer/nn/adaptive_span.h"
#include "spanformer/nn/linear.h"

namespace spanformer::models {

struct GptCache {
  std::vector<torch::Tensor> k, v;  // per layer (B, K, C_l, D); empty before the first call
  int64_t position = 0;             // p0 of the next tokens
  bool trim = true;                 // keep only the keys each layer can still read
  // Fixed shapes: defined, (1) int64 on the device = position; k, v are then (B, K, T, D) buffers and
  // one token a call is written at row `at` (header comment).
  torch::Tensor at;
};

// What runs a fixed-shape step: step(x, at) itself, or its CUDA graph replayed on copies of x (1, 1)
// and at (1) (train::StepGraph::run). Returns the step's hidden state (1, 1, H).
using GptStepFn = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&)>;
using GptStepRunner = std::function<torch::Tensor(const torch::Tensor&, const torch::Tensor&, const GptStepFn&)>;

// Generation's context rule, the same with and without a cache: tokens are appended to `history`;
// the model sees history[start ..] at positions 0, 1, ...; when that would exceed the context T, start
// moves so that the last T / 2 tokens remain (the cache is then rebuilt from them). With use_cache the
// new tokens run against the cached keys and values; without it the whole context is recomputed at
// every call (the reference the cache is tested against, and bench --mode generate's baseline).
// With fixed_shapes (and use_cache) each single new token runs at fixed shapes against `fixed`, whose
// buffers are filled from the cache whenever the context is encoded anew (the first call, a slide) and
// keep their storage from then on (a captured graph reads them); `runner`, when set, runs those steps.
struct GptDecoder {
  bool use_cache = true, trim = true;
  std::vector<int64_t> history;
  int64_t start = 0;
  GptCache cache;
  bool fixed_shapes = false;
  GptStepRunner runner;
  GptCache fixed;
};

// One layer's causal self-attention: H = d_model in K = heads heads of D = H / K, the pattern (the
// fields of attention::CausalSpec a layer keeps: kind, window, stride, summary, combine, layer, LSH
// sizes, attention dropout; the spans and the training flag are filled at each call), how it is
// computed, and the learned spans of an adaptive_span pattern.
struct GptAttentionOptions {
  GptAttentionOptions(int64_t d_model, int64_t heads) : d_model_(d_model), heads_(heads) {}
  TORCH_ARG(int64_t, d_model);
  TORCH_ARG(int64_t, heads);
  TORCH_ARG(attention::CausalSpec, pattern);
  TORCH_ARG(attention::AttnImpl, impl) = attention::AttnImpl::kAuto;
  TORCH_ARG(std::optional<nn::AdaptiveSpanOptions>, span);  // adaptive_span only
};

// A pre-norm block: the attention above, then the feed-forward H -> d_inner -> H (GELU, over
// ff_chunks slices of the positions), dropout on both residual branches.
struct GptBlockOptions {
  GptBlockOptions(GptAttentionOptions attention, int64_t d_inner) : attention_(std::move(attention)), d_inner_(d_inner) {}
  TORCH_ARG(GptAttentionOptions, attention);
  TORCH_ARG(int64_t, d_inner);
  TORCH_ARG(double, dropout) = 0.0;
  TORCH_ARG(int64_t, ff_chunks) = 1;
  TORCH_ARG(Activation, activation) = Activation::kGelu;
};

// Layer `layer`'s options from a model config (what GptModel builds its blocks from).
GptBlockOptions gpt_block_options(const GptModelConfig& config, int64_t layer);

class GptAttentionImpl : public torch::nn::Module {
 public:
  explicit GptAttentionImpl(GptAttentionOptions options);
  // h (B, N, H) -> (B, N, H); with k_cache / v_cache (B, K, C, D) the new keys are appended (and the
  // cache trimmed to `keep` keys when keep >= 0). With `at` defined (fixed shapes, N = 1) the caches are
  // (B, K, T, D) buffers: the token's key and value are written at row `at`, which it reads up to.
  torch::Tensor forward(const torch::Tensor& h, torch::Tensor* k_cache = nullptr, torch::Tensor* v_cache = nullptr,
                        int64_t keep = -1, const torch::Tensor& at = {});
  // Keys a query reads at most (itself included): the pattern's band.
  int64_t band(int64_t keys) const;
  attention::CausalSpec spec() const;

  spanformer::nn::Linear qkv{nullptr}, proj{nullptr};
  nn::AdaptiveSpan span{nullptr};  // adaptive_span only

 private:
  GptAttentionOptions options_;
};
TORCH_MODULE(GptAttention);

class GptBlockImpl : public torch::nn::Module {
 public:
  explicit GptBlockImpl(GptBlockOptions options);
  torch::Tensor forward(const torch::Tensor& h, torch::Tensor* k_cache = nullptr, torch::Tensor* v_cache = nullptr,
                        int64_t keep = -1, const torch::Tensor& at = {});

  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  GptAttention attn{nullptr};
  spanformer::nn::Linear fc1{nullptr}, fc2{nullptr};

  // The two residual branches: F = drop(attn(LN1 h)) and G = drop(MLP(LN2 h)) over ff_chunks slices.
  torch::Tensor attention_branch(const torch::Tensor& h, torch::Tensor* k_cache = nullptr,
                                 torch::Tensor* v_cache = nullptr, int64_t keep = -1, const torch::Tensor& at = {});
  torch::Tensor ff_branch(const torch::Tensor& h);
  // fc2(gelu(fc1(z))) with dropout, of the normed z (= ln2(h)): bias + GELU as one op (ops::bias_gelu)
  // where the fused step kernels run (include/spanformer/ops/step_ops.h), else ATen's linear and gelu.
  torch::Tensor feed_forward(const torch::Tensor& z);

 private:
  GptBlockOptions options_;
};
TORCH_MODULE(GptBlock);

class GptModelImpl : public torch::nn::Module {
 public:
  explicit GptModelImpl(const GptModelConfig& config);

  // x (B, N) -> last hidden state (B, N, H). Without a cache the tokens sit at positions 0 .. N - 1;
  // with one at cache->position onward, and their keys and values are appended to it; with a
  // fixed-shape cache (cache->at defined) N = 1 at position `at`, read on the device.
  torch::Tensor forward(const torch::Tensor& x, GptCache* cache = nullptr);
  torch::Tensor logits(const torch::Tensor& hidden);  // (B, N, H) -> (B, N, V)
  // Appends tokens (1, n), n <= T / 2 (or T for the first call), to a decoder's context by its rule.
  // Returns their last hidden states (1, n, H).
  torch::Tensor extend(const torch::Tensor& x, GptDecoder& decoder);
  // Why generation cannot run at fixed shapes (one clause), empty when it can: every pattern but LSH.
  std::string fixed_shape_refusal() const;
  // For generation on the CPU, in the weights' dtype (call it after a cast): each block's linear weights
  // (out, in) stored transposed, the same values as a (out, in) view of an (in, out) tensor, so
  // that a decoding step's matrix-vector products (ops/cpu/matvec.h) stream them as x W with W (in, out);
  // bfloat16 weights stored (out, in), where the pairs of AVX512-BF16's dot product lie. Training keeps
  // the (out, in) storage: `generate` and `bench --mode generate` call this, the training loop never does.
  void lay_out_for_decoding();

  torch::Tensor span_loss() const;  // sum over layers (0 without adaptive span)
  void clamp_spans();               // span ratios to [0, 1] and the host copies refreshed
  // Per layer, per head learned spans z = ratio * L (empty without adaptive span).
  std::vector<std::vector<double>> spans() const;

  const GptModelConfig& config() const { return config_; }

  // Reversible layers under autograd: true recomputes activations in backward (the default); false
  // keeps them and lets autograd differentiate the same composition (the reference tests compare with).
  bool recompute = true;

  torch::nn::Embedding wte{nullptr}, wpe{nullptr};  // wpe: learned positions only
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm ln_f{nullptr};
  spanformer::nn::Linear head{nullptr};  // untied output only
  torch::Tensor sinusoid;           // (T, H) buffer: sinusoidal positions only

 private:
  GptModelConfig config_;
  std::vector<GptBlock> block_list_;
};
TORCH_MODULE(GptModel);


}  // namespace spanformer::models
