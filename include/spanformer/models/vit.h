// The Vision Transformer (Dosovitskiy et al. 2021, "An Image is Worth 16x16 Words"), as in its
// section 3.1: an image cut into P x P patches, each linearly embedded (a strided convolution), a
// learned class token in front, learned positions, pre-norm encoder blocks, and a linear head on the
// class token's final state.
//
//   x = (pixels / 255 - mean) / std                                (B, c, S, S)
//   z0 = [cls; conv_P(x) flattened] + E_pos                         (B, N, H)    N = (S / P)^2 + 1
//   z' = z + MHA(LN(z))           attention/multi_head.h, self, no mask
//   z  = z' + MLP(LN(z'))         W2 GELU(W1 .)   (H -> I -> H)
//   logits = W_head LN(z_L[:, 0])                                   (B, C)
//
// Attention rollout (Abnar & Zuidema 2020): with A_l the heads' mean attention of layer l (B, N, N),
// R = prod_l (A_l + I) / 2 (each factor row-normalised, the residual path counted as half the flow);
// row 0 of R over the patch tokens is how much each patch fed the class token: a (S/P x S/P) map.
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/conv.h>
#include "spanformer/nn/dropout.h"
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <torch/arg.h>

#include <vector>

#include "spanformer/attention/multi_head.h"
#include "spanformer/config/vit_config.h"
#include "spanformer/nn/linear.h"

namespace spanformer::models {

// One pre-norm encoder block: the self-attention (its own options: H = d_model, K heads, dropout on the
// probabilities), the MLP H -> d_inner (GELU) -> H, dropout on both residual branches.
struct VitBlockOptions {
  VitBlockOptions(attention::MultiHeadOptions attention, int64_t d_inner) : attention_(attention), d_inner_(d_inner) {}
  TORCH_ARG(attention::MultiHeadOptions, attention);
  TORCH_ARG(int64_t, d_inner);
  TORCH_ARG(double, dropout) = 0.0;
};

class VitBlockImpl : public torch::nn::Module {
 public:
  explicit VitBlockImpl(VitBlockOptions options);
  // z (B, N, H) -> (B, N, H); `weights` receives the attention (B, K, N, N) when given.
  torch::Tensor forward(const torch::Tensor& z, torch::Tensor* weights = nullptr);

  torch::nn::LayerNorm norm1{nullptr}, norm2{nullptr};
  attention::MultiHeadAttention attn{nullptr};
  spanformer::nn::Linear fc1{nullptr}, fc2{nullptr};
  spanformer::nn::Dropout drop{nullptr};
};
TORCH_MODULE(VitBlock);

class VitModelImpl : public torch::nn::Module {
 public:
  explicit VitModelImpl(const VitModelConfig& config);
  // images (B, S, S) or (B, c, S, S), uint8 pixels or already-normalised floats -> logits (B, C).
  // `weights`, when given, receives each layer's attention (B, K, N, N).
  torch::Tensor forward(const torch::Tensor& images, std::vector<torch::Tensor>* weights = nullptr);
  // Pixels (uint8, 0..255) -> the normalised float input (B, c, S, S).
  torch::Tensor normalise(const torch::Tensor& images) const;
  const VitModelConfig& config() const { return config_; }

  torch::nn::Conv2d patch_embed{nullptr};
  torch::Tensor cls_token, pos_embed;  // (1, 1, H), (1, N, H)
  torch::nn::ModuleList blocks;
  torch::nn::LayerNorm norm{nullptr};
  spanformer::nn::Linear head{nullptr};
  spanformer::nn::Dropout drop{nullptr};

 private:
  VitModelConfig config_;
};
TORCH_MODULE(VitModel);

// Attention rollout of each layer's weights (B, K, N, N) -> (B, G, G) maps of the class token over
// the patches, each summing to the share of the flow that reached patches (< 1: the rest stays on
// the class token itself).
torch::Tensor attention_rollout(const std::vector<torch::Tensor>& weights);

}  // namespace spanformer::models
