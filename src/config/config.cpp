// The adaptive-span config's enums and the model's invariants (`validate` of the model section), which
// models/transformer_seq check when built. The family's key table, train defaults and schema are in
// src/train/families/adaptive_span/config.cpp.
#include "spanformer/config/config.h"

#include <algorithm>
#include <cmath>

#include "fields.h"
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

}  // namespace spanformer
