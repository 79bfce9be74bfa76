// The ViT config's one home below the engine: its enums' names, the model's invariants (`validate`
// of the model section, which models/vit check when built), its key table (each key's name, section
// and help, the only place a key's help is written), its train defaults and its schema (JSON in and
// out, overrides, `config keys`, the model section a checkpoint must match). The structs the models
// read are in spanformer/config/vit_config.h.
#include "spanformer/config/vit_config.h"

#include "schema.h"
#include "spanformer/util/error.h"

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


namespace {

using namespace config_detail;  // the key tables' and schema's parts (fields.h, schema.h)

const std::vector<Field<VitModelConfig>>& vit_model_fields() {
  using C = VitModelConfig;
  static const std::vector<Field<C>> fields = {
      field("image_size", &C::image_size, "S: images are S x S"),
      field("channels", &C::channels, "colour channels"),
      field("patch", &C::patch, "P: patches of P x P pixels (S a multiple of P)"),
      field("classes", &C::classes, "C; taken from the data when 0"),
      field("n_layer", &C::n_layer, "L, encoder blocks (pre-norm)"),
      field("n_head", &C::n_head, "K, attention heads"),
      field("d_model", &C::d_model, "H, a multiple of n_head"),
      field("d_inner", &C::d_inner, "I, GELU MLP width (0 = 4 d_model)"),
      run_key(field("dropout", &C::dropout, "embeddings and each residual branch")),
      run_key(field("attn_dropout", &C::attn_dropout, "attention probabilities")),
      field("pixel_mean", &C::pixel_mean, "input normalisation: (pixel / 255 - mean) / std"),
      field("pixel_std", &C::pixel_std, "input normalisation"),
      run_key(field("augment_shift", &C::augment_shift, "training: random translation by up to this many pixels (0 = none)")),
      run_key(field("valid_images", &C::valid_images, "the last images of the training file, held out for validation")),
  };
  return fields;
}

}  // namespace

TrainConfig vit_train_defaults() {
  TrainConfig t;
  t.data = "/usr/share/datasets/fashion-mnist";
  t.batch_size = 128;
  t.optim = OptimKind::kAdamW;
  t.weight_decay = 0.05;
  t.lr = 2e-3;
  t.lr_min = 0;
  t.scheduler = Schedule::kCosine;
  t.lr_warmup = 200;
  t.grad_clip = 1.0;
  t.nb_steps = 3000;
  t.eval_interval = 250;
  t.eval_batch_size = 500;
  return t;
}

namespace {

const config_detail::Schema<VitConfig>& vit_schema() {
  static const config_detail::Schema<VitConfig> schema{
      "vit", "ViT",
      {model_section(&VitConfig::model, vit_model_fields),
       run_section(&VitConfig::model, vit_model_fields), train_section(&VitConfig::train)}};
  return schema;
}

}  // namespace

std::vector<ConfigKey> vit_config_keys() { return vit_schema().keys(); }

json to_json(const VitConfig& config) { return vit_schema().to_json(config); }

VitConfig vit_config_from_json(const json& j, const std::string& origin) { return vit_schema().from_json(j, origin); }

void apply_overrides(VitConfig& config, const std::vector<std::string>& overrides) {
  vit_schema().apply_overrides(config, overrides);
}

void validate(const VitConfig& config) {
  validate(config.model);
  validate(config.train);
}

void check_training_step_fits(const VitConfig& config) {
  // A training step: every token of every image through every layer, with each head's (N, N) weights.
  const auto& m = config.model;
  const double B = micro_batch(config.train), N = static_cast<double>(m.tokens());
  if (step_in_host_memory(config.train))
    check_working_memory_fits(B * N * static_cast<double>(m.n_layer) *
                                (kept_per_token(static_cast<double>(m.d_model), static_cast<double>(m.inner_dim())) +
                                 2 * static_cast<double>(m.n_head) * N),
                            fmt::format("a training step of {:.0f} images of {:.0f} tokens", B, N));
}

std::string model_difference(const VitConfig& a, const VitConfig& b) { return vit_schema().model_difference(a, b); }

}  // namespace spanformer
