#include "spanformer/attention/multi_head.h"

#include <fmt/ranges.h>

#include <cmath>

#include "spanformer/ops/masked_softmax.h"
#include "spanformer/util/error.h"

namespace spanformer::attention {

torch::Tensor attention_keep(const AttentionMask& mask, int64_t B, int64_t N, int64_t C, const torch::Device& device) {
  torch::Tensor keep;  // (B or 1, 1, N or 1, C) bool
  auto both = [&](const torch::Tensor& m) { keep = keep.defined() ? keep.logical_and(m) : m; };
  if (mask.valid.defined()) both(ops::valid_length_mask(mask.valid, B, N, C, device).unsqueeze(1));
  if (mask.key_padding.defined()) {
    if (mask.key_padding.scalar_type() != torch::kBool || mask.key_padding.sizes() != torch::IntArrayRef{B, C})
      fail("attention: key_padding must be a bool (B, C) = ({}, {}) mask (got {} {})", B, C,
           c10::toString(mask.key_padding.scalar_type()), fmt::join(mask.key_padding.sizes(), "x"));
    both(mask.key_padding.to(device).logical_not().view({B, 1, 1, C}));
  }
  if (mask.causal) {
    if (C < N) fail("attention: a causal mask needs at least as many keys as queries (got {} < {})", C, N);
    auto i = torch::arange(N, torch::TensorOptions().dtype(torch::kLong).device(device)).view({N, 1});
    auto j = torch::arange(C, torch::TensorOptions().dtype(torch::kLong).device(device)).view({1, C});
    both((j <= i + (C - N)).view({1, 1, N, C}));
  }
  return keep;
}

MultiHeadAttentionImpl::MultiHeadAttentionImpl(const MultiHeadOptions& o) : options_(o) {
  if (o.d_model < 1 || o.heads < 1 || o.d_model % o.heads != 0)
    fail("multi-head attention: d_model ({}) must be a positive multiple of heads ({})", o.d_model, o.heads);
  if (!(o.dropout >= 0 && o.dropout < 1)) fail("multi-head attention: dropout must be in [0, 1) (got {})", o.dropout);
  const int64_t H = o.d_model, Hkv = o.kv_size > 0 ? o.kv_size : H;
  w_q = register_module("w_q", spanformer::nn::Linear(torch::nn::LinearOptions(H, H).bias(o.bias)));
  w_k = register_module("w_k", spanformer::nn::Linear(torch::nn::LinearOptions(Hkv, H).bias(o.bias)));
  w_v = register_module("w_v", spanformer::nn::Linear(torch::nn::LinearOptions(Hkv, H).bias(o.bias)));
  w_o = register_module("w_o", spanformer::nn::Linear(torch::nn::LinearOptions(H, H).bias(o.bias)));
  drop = register_module("drop", spanformer::nn::Dropout(o.dropout));
}

std::pair<torch::Tensor, torch::Tensor> MultiHeadAttentionImpl::project_kv(const torch::Tensor& memory) {
  const int64_t Hkv = options_.kv_size > 0 ? options_.kv_size : options_.d_model;
  if (memory.dim() != 3 || memory.size(-1) != Hkv)
    fail("multi-head attention: keys must be (B, C, {}) (got {})", Hkv, fmt::join(memory.sizes(), "x"));
  const int64_t B = memory.size(0), C = memory.size(1), K = options_.heads, D = options_.d_model / K;
  auto k = w_k(memory).view({B, C, K, D}).transpose(1, 2);  // (B, K, C, D)
  auto v = w_v(memory).view({B, C, K, D}).transpose(1, 2);  // (B, K, C, D)
  return {k, v};
}

torch::Tensor MultiHeadAttentionImpl::attend(const torch::Tensor& query, const torch::Tensor& k, const torch::Tensor& v,
                                             const AttentionMask& mask, torch::Tensor* weights) {
  const int64_t H = options_.d_model, K = options_.heads, D = H / K;
  if (query.dim() != 3 || query.size(-1) != H || query.size(0) != k.size(0))
    fail("multi-head attention: queries must be (B, N, {}) with the keys' B = {} (got {})", H, k.size(0),
         fmt::join(query.sizes(), "x"));
  const int64_t B = query.size(0), N = query.size(1), C = k.size(2);
  auto q = w_q(query).view({B, N, K, D}).transpose(1, 2);                              // (B, K, N, D)
  auto s = torch::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(D));  // (B, K, N, C)
  auto keep = attention_keep(mask, B, N, C, query.device());                           // (B, 1, N, C) or undefined
  auto a = keep.defined() ? ops::softmax_where(s, keep) : torch::softmax(s, -1);       // (B, K, N, C)
  if (weights) *weights = a;
  auto o = torch::matmul(drop(a), v).transpose(1, 2).reshape({B, N, H});  // (B, N, H)
  return w_o(o);                                                          // (B, N, H)
}

torch::Tensor MultiHeadAttentionImpl::forward(const torch::Tensor& query, const torch::Tensor& memory,
                                              const AttentionMask& mask, torch::Tensor* weights) {
  auto [k, v] = project_kv(memory);  // (B, K, C, D) each
  return attend(query, k, v, mask, weights);
}

}  // namespace spanformer::attention
