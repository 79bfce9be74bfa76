// The adaptive-span config's one home below the engine: its enums' names, the model's invariants (`validate`
// of the model section, which models/transformer_seq check when built), its key table (each key's name, section
// and help, the only place a key's help is written), its train defaults and its schema (JSON in and
// out, overrides, `config keys`, the model section a checkpoint must match). The structs the models
// read are in spanformer/config/adaptive_span_config.h.
#include "spanformer/config/adaptive_span_config.h"

#include <algorithm>
#include <cmath>

#include "schema.h"
#include "spanformer/util/error.h"

namespace spanformer {

void validate(const ModelConfig& c) {
  config_detail::require_positive("nb_layers", c.nb_layers);
  config_detail::require_positive("hidden_size", c.hidden_size);
  config_detail::require_positive("nb_heads", c.nb_heads);
  config_detail::require_positive("block_size", c.block_size);
  if (c.attn_span < 1) fail("config: attn_span must be at least 1 (got {})", c.attn_span);
  if (c.pers_mem_size == 0) config_detail::require_positive("inner_hidden_size", c.inner_hidden_size);
  if (c.pers_mem_size < 0) fail("config: pers_mem_size must be >= 0 (got {})", c.pers_mem_size);
  if (c.vocab_size < 0) fail("config: vocab_size must be >= 0 (got {})", c.vocab_size);
  if (c.hidden_size % c.nb_heads != 0)
    fail("config: hidden_size ({}) must be divisible by nb_heads ({})", c.hidden_size, c.nb_heads);
  config_detail::require_fraction("dropout", c.dropout);
  config_detail::require_fraction("emb_dropout", c.emb_dropout);
  if (c.adapt_span) {
    config_detail::require_positive("adapt_span_ramp", c.adapt_span_ramp);
    if (!(c.adapt_span_init >= 0 && c.adapt_span_init <= 1))
      fail("config: adapt_span_init must be in [0, 1] (got {})", c.adapt_span_init);
    if (!(c.adapt_span_loss >= 0 && std::isfinite(c.adapt_span_loss)))
      fail("config: adapt_span_loss must be >= 0 (got {})", c.adapt_span_loss);
  }
  const double H = static_cast<double>(c.hidden_size), V = static_cast<double>(std::max<int64_t>(c.vocab_size, 256));
  check_model_fits(2 * V * H + H * static_cast<double>(c.attn_span) / static_cast<double>(c.nb_heads) +
                   static_cast<double>(c.nb_layers) *
                       (4 * H * H + 2 * H * static_cast<double>(c.inner_hidden_size) + 2 * H * static_cast<double>(c.pers_mem_size)));
}


namespace {

using namespace config_detail;  // the key tables' and schema's parts (fields.h, schema.h)

const std::vector<Field<ModelConfig>>& span_model_fields() {
  static const std::vector<Field<ModelConfig>> fields = {
      field("vocab_size", &ModelConfig::vocab_size, "V; taken from the prepared data when 0"),
      field("nb_layers", &ModelConfig::nb_layers, "layers"),
      field("hidden_size", &ModelConfig::hidden_size, "H"),
      field("inner_hidden_size", &ModelConfig::inner_hidden_size, "I"),
      field("nb_heads", &ModelConfig::nb_heads, "K"),
      field("attn_span", &ModelConfig::attn_span, "L, maximum span"),
      run_key(field("block_size", &ModelConfig::block_size, "M")),
      run_key(field("dropout", &ModelConfig::dropout, "on attention probabilities and the FFN hidden layer")),
      run_key(field("emb_dropout", &ModelConfig::emb_dropout, "on the embeddings and on the last hidden state")),
      field("adapt_span", &ModelConfig::adapt_span, "learn each head's span"),
      field("adapt_span_ramp", &ModelConfig::adapt_span_ramp, "R, width of the soft mask's ramp"),
      field("adapt_span_init", &ModelConfig::adapt_span_init, "initial span_ratio (z / L)"),
      field("adapt_span_loss", &ModelConfig::adapt_span_loss, "span-loss coefficient"),
      run_key(field("adapt_span_cache", &ModelConfig::adapt_span_cache, "keep only the cache the current spans need")),
      field("pers_mem_size", &ModelConfig::pers_mem_size, "N > 0: all-attention layers with persistent memory, no FFN"),
      run_key(enum_field("attn_impl", &ModelConfig::attn_impl, attention::parse_attn_impl, attention::attn_impl_name, "how attention is computed (attention/attn_impl.h); checkpoints load under any.")),
  };
  return fields;
}

// Adaptive-span files predate the "arch" tag: it is neither written nor required.
const config_detail::Schema<AdaptiveSpanConfig>& span_schema() {
  static const config_detail::Schema<AdaptiveSpanConfig> schema{
      nullptr, "adaptive-span",
      {model_section(&AdaptiveSpanConfig::model, span_model_fields),
       run_section(&AdaptiveSpanConfig::model, span_model_fields), train_section(&AdaptiveSpanConfig::train)}};
  return schema;
}

}  // namespace

std::vector<ConfigKey> adaptive_span_config_keys() { return span_schema().keys(); }

json to_json(const ModelConfig& config) { return struct_to_json(config, span_model_fields()); }

json to_json(const AdaptiveSpanConfig& config) { return span_schema().to_json(config); }

ModelConfig model_config_from_json(const json& j, const std::string& origin) {
  ModelConfig config;
  read_section(config, j, span_model_fields(), "model", origin);
  return config;
}

AdaptiveSpanConfig config_from_json(const json& j, const std::string& origin) { return span_schema().from_json(j, origin); }

std::string model_difference(const AdaptiveSpanConfig& a, const AdaptiveSpanConfig& b) { return span_schema().model_difference(a, b); }

AdaptiveSpanConfig load_config(const std::string& path) {
  return config_from_json(config_detail::read_json_file(path), path);
}

void apply_overrides(AdaptiveSpanConfig& config, const std::vector<std::string>& overrides) {
  span_schema().apply_overrides(config, overrides);
}

void validate(const AdaptiveSpanConfig& config) {
  validate(config.model);
  validate(config.train);
  if (config.train.eval_blocks <= 0)
    fail("config: eval_blocks must be positive (got {})", config.train.eval_blocks);
}

void check_training_step_fits(const AdaptiveSpanConfig& config) {
  // A training step: the block's tokens through every layer, the logits, and the cache of attn_span
  // hidden states a layer carries per stream.
  const auto& m = config.model;
  const double B = micro_batch(config.train), M = static_cast<double>(m.block_size), H = static_cast<double>(m.hidden_size);
  const double layers = static_cast<double>(m.nb_layers), V = static_cast<double>(m.vocab_size);
  if (step_in_host_memory(config.train))
    check_working_memory_fits(B * (M * (layers * kept_per_token(H, static_cast<double>(m.inner_hidden_size)) + 2 * V) +
                                 layers * static_cast<double>(m.attn_span) * H),
                            fmt::format("a training step of {:.0f} streams of block_size {}", B, m.block_size));
}

}  // namespace spanformer
