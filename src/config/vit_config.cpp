// The ViT config's enums and the model's invariants (`validate` of the model section), which
// models/vit check when built. The family's key table, train defaults and schema are in
// src/train/families/vit/config.cpp.
#include "spanformer/config/vit_config.h"

#include "spanformer/util/error.h"
#include "fields.h"

namespace spanformer {

void validate(const VitModelConfig& c) {
  config_detail::require_positive("image_size", c.image_size);
  config_detail::require_positive("channels", c.channels);
  config_detail::require_positive("patch", c.patch);
  config_detail::require_positive("n_layer", c.n_layer);
  config_detail::require_positive("n_head", c.n_head);
  config_detail::require_positive("d_model", c.d_model);
  if (c.classes < 0) fail("config: classes must be >= 0 (got {})", c.classes);
  if (c.d_inner < 0) fail("config: d_inner must be >= 0 (0 = 4 d_model; got {})", c.d_inner);
  if (c.image_size % c.patch != 0) fail("config: image_size ({}) must be a multiple of patch ({})", c.image_size, c.patch);
  if (c.d_model % c.n_head != 0) fail("config: d_model ({}) must be a multiple of n_head ({})", c.d_model, c.n_head);
  config_detail::require_fraction("dropout", c.dropout);
  config_detail::require_fraction("attn_dropout", c.attn_dropout);
  if (!(c.pixel_std > 0)) fail("config: pixel_std must be positive (got {})", c.pixel_std);
  config_detail::require_positive("valid_images", c.valid_images);
  if (c.augment_shift < 0 || c.augment_shift >= c.image_size)
    fail("config: augment_shift must be in [0, image_size) (got {})", c.augment_shift);
  const double H = static_cast<double>(c.d_model), I = static_cast<double>(c.inner_dim());
  check_model_fits(static_cast<double>(c.n_layer) * (4 * H * H + 2 * H * I) +
                   static_cast<double>(c.tokens() + c.patch * c.patch * c.channels) * H);
}

}  // namespace spanformer
