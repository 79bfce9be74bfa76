#include "spanformer/models/vit.h"

#include <torch/nn/functional/activation.h>
#include <torch/nn/init.h>

#include <cmath>

#include <fmt/ranges.h>

#include "spanformer/util/error.h"

namespace spanformer::models {

VitBlockImpl::VitBlockImpl(VitBlockOptions o) {
  const int64_t H = o.attention().d_model, I = o.d_inner();
  norm1 = register_module("norm1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  attn = register_module("attn", attention::MultiHeadAttention(o.attention()));
  norm2 = register_module("norm2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  fc1 = register_module("fc1", spanformer::nn::Linear(H, I));
  fc2 = register_module("fc2", spanformer::nn::Linear(I, H));
  drop = register_module("drop", spanformer::nn::Dropout(o.dropout()));
}

torch::Tensor VitBlockImpl::forward(const torch::Tensor& z, torch::Tensor* weights) {
  auto h = norm1(z);                                                                    // (B, N, H)
  auto y = z + drop(attn->forward(h, h, {}, weights));                                         // (B, N, H)
  return y + drop(fc2(torch::gelu(fc1(norm2(y)))));                                     // (B, N, H)
}

VitModelImpl::VitModelImpl(const VitModelConfig& c) : config_(c) {
  validate(c);
  if (c.classes < 1) fail("vit: the number of classes is unknown (set model.classes or give data)");
  const int64_t H = c.d_model;
  patch_embed = register_module(
      "patch_embed", torch::nn::Conv2d(torch::nn::Conv2dOptions(c.channels, H, c.patch).stride(c.patch)));
  cls_token = register_parameter("cls_token", torch::zeros({1, 1, H}));
  pos_embed = register_parameter("pos_embed", torch::randn({1, c.tokens(), H}) * 0.02);
  blocks = register_module("blocks", torch::nn::ModuleList());
  const auto block = VitBlockOptions({c.d_model, c.n_head, 0, c.attn_dropout, true}, c.inner_dim()).dropout(c.dropout);
  for (int64_t l = 0; l < c.n_layer; ++l) blocks->push_back(VitBlock(block));
  norm = register_module("norm", torch::nn::LayerNorm(torch::nn::LayerNormOptions({H})));
  head = register_module("head", spanformer::nn::Linear(H, c.classes));
  drop = register_module("drop", spanformer::nn::Dropout(c.dropout));
  // Linear layers: truncated-normal-like N(0, 0.02) weights, zero biases (timm's ViT initialisation).
  torch::NoGradGuard no_grad;
  for (auto& m : modules(false))
    if (auto* linear = m->as<torch::nn::Linear>()) {
      torch::nn::init::normal_(linear->weight, 0.0, 0.02);
      torch::nn::init::zeros_(linear->bias);
    }
}

torch::Tensor VitModelImpl::normalise(const torch::Tensor& images) const {
  auto x = images.dim() == 3 ? images.unsqueeze(1) : images;  // (B, c, S, S)
  return (x.to(cls_token.scalar_type()) / 255.0 - config_.pixel_mean) / config_.pixel_std;  // in the weights' dtype
}

torch::Tensor VitModelImpl::forward(const torch::Tensor& images, std::vector<torch::Tensor>* weights) {
  const auto& c = config_;
  auto x = images.scalar_type() == torch::kUInt8 ? normalise(images) : (images.dim() == 3 ? images.unsqueeze(1) : images);
  if (x.dim() != 4 || x.size(1) != c.channels || x.size(2) != c.image_size || x.size(3) != c.image_size)
    fail("vit: images must be (B, {}, {}, {}) (got {})", c.channels, c.image_size, c.image_size, fmt::join(images.sizes(), "x"));
  x = x.to(cls_token.scalar_type());
  const int64_t B = x.size(0);
  auto patches = patch_embed(x).flatten(2).transpose(1, 2);                      // (B, G^2, H)
  auto z = drop(torch::cat({cls_token.expand({B, 1, c.d_model}), patches}, 1) + pos_embed);  // (B, N, H)
  if (weights) weights->clear();
  for (const auto& block : *blocks) {
    torch::Tensor a;
    z = block->as<VitBlock>()->forward(z, weights ? &a : nullptr);               // (B, N, H)
    if (weights) weights->push_back(a);                                          // (B, K, N, N)
  }
  return head(norm(z.select(1, 0)));                                             // (B, C)
}

torch::Tensor attention_rollout(const std::vector<torch::Tensor>& weights) {
  if (weights.empty()) fail("attention rollout: no layers");
  const int64_t B = weights[0].size(0), N = weights[0].size(-1);
  const int64_t G = static_cast<int64_t>(std::llround(std::sqrt(static_cast<double>(N - 1))));
  if (G * G != N - 1) fail("attention rollout: {} tokens are not a class token and a square of patches", N);
  auto eye = torch::eye(N, weights[0].options());
  torch::Tensor r;  // (B, N, N)
  for (const auto& a : weights) {
    auto f = (a.mean(1) + eye) / 2;  // (B, N, N), rows sum to 1
    r = r.defined() ? torch::bmm(f, r) : f;
  }
  return r.select(1, 0).narrow(1, 1, N - 1).reshape({B, G, G});  // (B, G, G)
}

}  // namespace spanformer::models
