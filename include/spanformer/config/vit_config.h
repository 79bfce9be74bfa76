// Configuration of the ViT family: the Vision Transformer (Dosovitskiy et al. 2021) classifying
// images of an IDX image set (data/idx.h; Fashion-MNIST from Debian's dataset-fashion-mnist).
//
// A config file says `"arch": "vit"` and has the two sections every family has: "model" (below) and
// "train" (config/train_config.h; this family's defaults: AdamW 2e-3, weight decay 0.05, warmup +
// cosine, batch 128, global clip 1). train.data is the directory of the four IDX files.
//
// Dims legend: B batch, S = image_size, P = patch, G = S / P patches a side, N = G^2 + 1 tokens
// (the class token first), H = d_model, K = n_head, I = d_inner, C classes, L layers.
//
// Each key's meaning is written once, as its help text in src/config/vit_config.cpp (`spanformer config keys` and
// docs/config.md print it); the comments below add only dimension letters and what the help does not say.
#pragma once
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

#include "spanformer/config/train_config.h"

namespace spanformer {

struct VitModelConfig {
  int64_t image_size = 28;   // S (square images)
  int64_t channels = 1;
  int64_t patch = 4;         // P: S must be a multiple
  int64_t classes = 10;
  int64_t n_layer = 4;       // L
  int64_t n_head = 4;        // K
  int64_t d_model = 64;      // H (a multiple of K)
  int64_t d_inner = 128;     // I (0 = 4 H)
  double dropout = 0.0;
  double attn_dropout = 0.0;
  double pixel_mean = 0.2860, pixel_std = 0.3530;  // input normalisation (Fashion-MNIST's train statistics)
  int64_t augment_shift = 0;  // training only: random translation by up to this many pixels (0 = none)
  int64_t valid_images = 5000;  // the last images of the training file, held out for validation (data, not weights)

  int64_t grid() const { return image_size / patch; }
  int64_t tokens() const { return grid() * grid() + 1; }
  int64_t inner_dim() const { return d_inner > 0 ? d_inner : 4 * d_model; }
};

// The ViT family's defaults (AdamW, warmup + cosine decay).
TrainConfig vit_train_defaults();

struct VitConfig {
  VitModelConfig model;
  TrainConfig train = vit_train_defaults();
};

nlohmann::json to_json(const VitConfig& config);
VitConfig vit_config_from_json(const nlohmann::json& j, const std::string& origin);
void apply_overrides(VitConfig& config, const std::vector<std::string>& overrides);
std::vector<ConfigKey> vit_config_keys();
void validate(const VitModelConfig& config);
void validate(const VitConfig& config);
// A training step's working memory, batch included, against the machine's (train, bench --mode train).
void check_training_step_fits(const VitConfig& config);
// The first key of the model section that differs ("n_layer 4 vs 2"; "" when a checkpoint made under one
// config fits the other). Run and train keys may differ.
std::string model_difference(const VitConfig& a, const VitConfig& b);

}  // namespace spanformer
