// Configuration of the GPT family: a decoder-only language model (GPT-2's pre-norm blocks) whose
// causal self-attention is a drop-in choice.
//
// A config file of this family says `"arch": "gpt"` at the top level and has two sections:
//   "model"  the network and its attention (below),
//   "train"  the section every family shares (config/train_config.h), with this family's defaults
//            (AdamW, weight decay 0.1 on matrices, beta2 0.95, warmup + cosine decay, global clip 1).
// `--key=value` overrides work as for every family (bare or "section.key").
//
// Dims legend: B batch, T context (tokens per training example), H = d_model, K = n_head,
// D = H / K, I = d_inner, V vocabulary, N layers.
//
// Each key's meaning is written once, as its help text in src/config/gpt_config.cpp (`spanformer config keys` and
// docs/config.md print it); the comments below add only dimension letters and what the help does not say.
#pragma once
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "spanformer/attention/kinds.h"
#include "spanformer/config/train_config.h"

namespace spanformer {

enum class Positions { kLearned, kSinusoidal };
const char* positions_name(Positions p);
Positions parse_positions(const std::string& name);

// The feed-forward's GELU: exact, x Phi(x) (erf), or the tanh approximation GPT-2 was trained with
// (0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))); Hugging Face's "gelu_new").
enum class Activation { kGelu, kGeluTanh };
const char* activation_name(Activation a);
Activation parse_activation(const std::string& name);

struct GptModelConfig {
  int64_t vocab_size = 0;
  int64_t n_layer = 4;         // N
  int64_t n_head = 4;          // K
  int64_t d_model = 128;       // H (a multiple of K)
  int64_t d_inner = 0;         // I (0 = 4 H)
  int64_t context = 256;       // T: tokens per training example, the longest context of the model
  Positions positions = Positions::kLearned;  // learned (GPT-2) | sinusoidal (Vaswani et al.)
  Activation activation = Activation::kGelu;  // gelu (exact) | gelu_tanh (GPT-2's approximation)
  bool tie_weights = true;
  double dropout = 0.1;
  double attn_dropout = 0.0;
  double init_std = 0.02;      // N(0, init_std); residual projections N(0, init_std / sqrt(2 N))
  attention::CausalKind attention = attention::CausalKind::kDense;
  int64_t window = 64;
  int64_t attn_span = 0;
  int64_t adapt_span_ramp = 32;     // R
  double adapt_span_init = 0.0;     // initial z / L (the reference starts at 0)
  double adapt_span_loss = 2e-6;
  int64_t sparse_stride = 0;   // sparse_*: l (0 = round(sqrt(context)))
  int64_t sparse_summary = 8;  // sparse_fixed: c, the summary keys at the end of every block (<= l)
  attention::SparseCombine sparse_combine = attention::SparseCombine::kMerged;  // merged | alternating | per_head
  int64_t lsh_hashes = 2;      // lsh: R, hashing rounds (a run-time choice: evaluation may use more)
  int64_t lsh_buckets = 0;     // lsh: nb, even (0 = about context / lsh_chunk, so a bucket holds about a chunk)
  int64_t lsh_chunk = 64;      // lsh: m, the most recent same-bucket keys a query reads per round
  // plain = the reference composition (one masked T x T product); fused = query tiles that read only
  // the keys their band reaches (causal tiles above the diagonal never touched); auto = fused.
  attention::AttnImpl attn_impl = attention::AttnImpl::kAuto;
  // Reversible residual layers (Gomez et al. 2017; Reformer sec. 3): two streams, y1 = x1 + Attn(x2),
  // y2 = x2 + FF(y1), activations recomputed in backward so that their memory does not grow with depth.
  bool reversible = false;
  int64_t ff_chunks = 1;       // feed-forward applied to this many slices of the positions (Reformer sec. 3)
  int64_t eval_stride = 0;     // sliding-window evaluation: tokens scored per window after the first (0 = T / 2)

  int64_t inner_dim() const { return d_inner > 0 ? d_inner : 4 * d_model; }
  int64_t span_limit() const { return attn_span > 0 ? attn_span : context; }
  int64_t stride_l() const {
    return sparse_stride > 0 ? sparse_stride : std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(context))));
  }
  int64_t buckets() const {
    return lsh_buckets > 0 ? lsh_buckets : std::max<int64_t>(2, 2 * ((context + lsh_chunk) / (2 * lsh_chunk)));
  }
  int64_t stride() const { return eval_stride > 0 ? eval_stride : std::max<int64_t>(1, context / 2); }
};

// The GPT family's defaults (GPT-2 / nanoGPT recipe: AdamW, warmup + cosine decay, global clipping).
TrainConfig gpt_train_defaults();

struct GptConfig {
  GptModelConfig model;
  TrainConfig train = gpt_train_defaults();
};

nlohmann::json to_json(const GptConfig& config);
nlohmann::json to_json(const GptModelConfig& config);
GptConfig gpt_config_from_json(const nlohmann::json& j, const std::string& origin);
void apply_overrides(GptConfig& config, const std::vector<std::string>& overrides);
std::vector<ConfigKey> gpt_config_keys();

// Throws Error naming the first invalid value.
void validate(const GptModelConfig& config);
void validate(const GptConfig& config);
// A training step's working memory, batch included, against the machine's (train, bench --mode train).
void check_training_step_fits(const GptConfig& config);

// The first key of the model section that differs ("n_layer 4 vs 2"; "" when a checkpoint made under one
// config fits the other). Run and train keys may differ.
std::string model_difference(const GptConfig& a, const GptConfig& b);

}  // namespace spanformer
