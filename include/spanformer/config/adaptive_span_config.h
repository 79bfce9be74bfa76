// The adaptive-span family's configuration: its keys named as in the reference implementation's flags
// (facebookresearch/adaptive-span, main.py), in the sections every family's config has (`model`, `run`,
// `train`; config/train_config.h), read from a JSON file plus `--key=value` overrides. The key table
// (section, help, JSON in and out) and the validation are src/config/adaptive_span_config.cpp;
// docs/config.md prints the table.
//
// Dims legend used across the repository:
//   B batch (streams), M block length (block_size), L maximum span (attn_span), H model width
//   (hidden_size), K heads (nb_heads), D = H / K head width, I FFN width (inner_hidden_size),
//   V vocabulary size, N persistent-memory vectors per head (pers_mem_size).
//
// Each key's meaning is written once, as its help text in src/config/adaptive_span_config.cpp (`spanformer config keys` and
// docs/config.md print it); the comments below add only dimension letters and what the help does not say.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "spanformer/attention/kinds.h"
#include "spanformer/config/train_config.h"

namespace spanformer {

// The model's shape and the span machinery. Saved inside every checkpoint; a checkpoint only loads
// into a model with the same ModelConfig.
struct ModelConfig {
  int64_t vocab_size = 0;
  int64_t nb_layers = 8;
  int64_t hidden_size = 256;         // H
  int64_t inner_hidden_size = 1024;  // I
  int64_t nb_heads = 4;              // K
  int64_t attn_span = 1024;
  int64_t block_size = 256;          // M
  double dropout = 0.0;
  double emb_dropout = 0.0;
  bool adapt_span = true;
  int64_t adapt_span_ramp = 32;
  double adapt_span_init = 0.0;
  double adapt_span_loss = 2e-6;
  bool adapt_span_cache = true;
  int64_t pers_mem_size = 0;
  attention::AttnImpl attn_impl = attention::AttnImpl::kAuto;  // auto | fused | plain: how attention is
                                     // computed (attention/attn_impl.h); checkpoints load under any.

  int64_t head_dim() const { return hidden_size / nb_heads; }
};

// An adaptive-span config: its model section and the shared train section (config/train_config.h).
struct AdaptiveSpanConfig {
  ModelConfig model;
  TrainConfig train;
};

// JSON <-> AdaptiveSpanConfig. Unknown keys are an error (a typo must not silently fall back to a default).
nlohmann::json to_json(const AdaptiveSpanConfig& config);
nlohmann::json to_json(const ModelConfig& config);
AdaptiveSpanConfig config_from_json(const nlohmann::json& j, const std::string& origin);
// The first key of the model section that differs ("nb_layers 4 vs 2"; "" when a checkpoint made under
// one config fits the other). Run and train keys may differ.
std::string model_difference(const AdaptiveSpanConfig& a, const AdaptiveSpanConfig& b);
ModelConfig model_config_from_json(const nlohmann::json& j, const std::string& origin);

// Reads a JSON config file (clear error for missing/corrupt files or unknown keys).
AdaptiveSpanConfig load_config(const std::string& path);

// Applies "key=value" overrides (value parsed as JSON when possible, else as a string).
void apply_overrides(AdaptiveSpanConfig& config, const std::vector<std::string>& overrides);

// Throws Error naming the first invalid value (sizes, divisibility, ranges, names).
void validate(const ModelConfig& config);
void validate(const AdaptiveSpanConfig& config);
// A training step's working memory, batch included, against the machine's (train, bench --mode train).
void check_training_step_fits(const AdaptiveSpanConfig& config);

}  // namespace spanformer
