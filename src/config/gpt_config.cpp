// The GPT config's enums and the model's invariants (`validate` of the model section), which
// models/gpt check when built. The family's key table, train defaults and schema are in
// src/train/families/gpt/config.cpp.
#include "spanformer/config/gpt_config.h"

#include "fields.h"
#include "spanformer/util/error.h"
#include "spanformer/util/names.h"

namespace spanformer {

constexpr auto kPositionsNames = name_table("positions", std::pair{Positions::kLearned, "learned"},
                                            std::pair{Positions::kSinusoidal, "sinusoidal"});

const char* positions_name(Positions value) { return kPositionsNames.name(value); }

Positions parse_positions(const std::string& name) { return kPositionsNames.parse(name); }

constexpr auto kActivationNames = name_table("activation", std::pair{Activation::kGelu, "gelu"},
                                             std::pair{Activation::kGeluTanh, "gelu_tanh"});

const char* activation_name(Activation value) { return kActivationNames.name(value); }

Activation parse_activation(const std::string& name) { return kActivationNames.parse(name); }

void validate(const GptModelConfig& c) {
  config_detail::require_positive("n_layer", c.n_layer);
  config_detail::require_positive("n_head", c.n_head);
  config_detail::require_positive("d_model", c.d_model);
  config_detail::require_positive("context", c.context);
  if (c.vocab_size < 0) fail("config: vocab_size must be >= 0 (got {})", c.vocab_size);
  if (c.d_inner < 0) fail("config: d_inner must be >= 0 (0 = 4 d_model; got {})", c.d_inner);
  if (c.d_model % c.n_head != 0) fail("config: d_model ({}) must be a multiple of n_head ({})", c.d_model, c.n_head);
  if (c.positions == Positions::kSinusoidal && c.d_model % 2 != 0)
    fail("config: sinusoidal positions need an even d_model (got {})", c.d_model);
  config_detail::require_fraction("dropout", c.dropout);
  config_detail::require_fraction("attn_dropout", c.attn_dropout);
  if (!(c.init_std > 0)) fail("config: init_std must be positive (got {})", c.init_std);
  if (c.window < 1) fail("config: window must be >= 1 (got {})", c.window);
  if (c.attn_span < 0) fail("config: attn_span must be >= 0 (0 = context; got {})", c.attn_span);
  if (c.attn_span > c.context) fail("config: attn_span ({}) cannot exceed the context ({})", c.attn_span, c.context);
  config_detail::require_positive("adapt_span_ramp", c.adapt_span_ramp);
  if (!(c.adapt_span_init >= 0 && c.adapt_span_init <= 1))
    fail("config: adapt_span_init must be in [0, 1] (got {})", c.adapt_span_init);
  if (!(c.adapt_span_loss >= 0)) fail("config: adapt_span_loss must be >= 0 (got {})", c.adapt_span_loss);
  if (c.sparse_stride < 0) fail("config: sparse_stride must be >= 0 (0 = sqrt(context); got {})", c.sparse_stride);
  if (c.attention == attention::CausalKind::kSparseFixed && (c.sparse_summary < 1 || c.sparse_summary > c.stride_l()))
    fail("config: sparse_summary must be in [1, sparse_stride = {}] (got {})", c.stride_l(), c.sparse_summary);
  config_detail::require_positive("ff_chunks", c.ff_chunks);
  config_detail::require_positive("lsh_hashes", c.lsh_hashes);
  config_detail::require_positive("lsh_chunk", c.lsh_chunk);
  if (c.lsh_buckets < 0 || c.lsh_buckets % 2 != 0)
    fail("config: lsh_buckets must be even and >= 2, or 0 (about context / lsh_chunk; got {})", c.lsh_buckets);
  if (c.eval_stride < 0 || c.eval_stride > c.context)
    fail("config: eval_stride must be in [0, context] (0 = context / 2; got {})", c.eval_stride);
  const double H = static_cast<double>(c.d_model), I = static_cast<double>(c.inner_dim());
  check_model_fits(static_cast<double>(c.vocab_size + c.context) * H * (c.tie_weights ? 1 : 2) +
                   static_cast<double>(c.n_layer) * (4 * H * H + 2 * H * I));
  // One window of one sequence: every layer's keys and values, one feed-forward hidden, the logits.
  const double T = static_cast<double>(c.context);
  check_working_memory_fits(T * (2 * static_cast<double>(c.n_layer) * H + I + static_cast<double>(c.vocab_size)),
                            fmt::format("one window of context {} tokens", c.context));
}

}  // namespace spanformer
