// Adaptive-span attention as one op: scores, softmax, span mask, renormalisation and dropout, with a
// hand-written backward that keeps one M x W tensor (the softmax) per head in training, and none in
// evaluation.
//
// Dims: B batch, K heads, M queries, W window (keys per query; the layer's L'), D head width,
// L max span. Inputs
//   q (B, K, M, D); k, v (B, K, W + M, D): query i sees context rows i .. i + W - 1 (distances W .. 1)
//   key_pe (D, L): column L - d is distance d;  span_ratio (K): z_h = span_ratio[h] * L.
//
// Semantics (exactly the reference's, facebookresearch/adaptive-span). With
// s_d = (q_i . k_{i+W-d} + q_i . key_pe[:, L-d]) / sqrt(D),
//     a_d = p_d m_d / (sum_e p_e m_e + 1e-8),   p = softmax_d(s) over ALL W distances,
//     m_d = clamp((R + z - (d - 1)) / R, 0, 1).
// Writing p_d = e_d / Z (e_d = exp(s_d - max)), a_d = e_d m_d / (sum_e e_e m_e + 1e-8 Z): the distances
// with m_d = 0 vanish from every numerator, but Z counts every key of the window. The 1e-8 Z term is not
// negligible: a head can switch itself off by scoring keys beyond its span far above those inside it
// (1e-8 Z then dominates and a sums to much less than 1), and models trained by the reference do this
// (dropping the term cost 0.1 bpc on ../shared/reference/adaptive-span-small4). So the op
// computes the scores and Z over the whole window, and everything after the softmax (mask,
// renormalisation, dropout, the value product and their gradients) only over the distances
//     d = 1 .. S_h,   S_h = min(W, floor(z_h + R) + 1)
// where m > 0 (the last one is where m reaches 0: clamp's gradient is taken there too, as autograd
// does). Keys beyond S_h still get the gradient of the 1e-8 Z term.
//
// Dropout keeps a_d with probability 1 - p and scales by 1 / (1 - p); the keep decision is a hash of
// (seed, b, h, i, d), so forward, backward and the reference agree without storing a mask.
#pragma once
#include "spanformer/ops/dropout.h"
#include <ATen/ATen.h>

#include <cstdint>
#include <string>
#include <vector>

namespace spanformer::ops {

struct SpanAttentionOptions {
  int64_t attn_span = 0;  // L
  double ramp = 32;       // R
  double dropout = 0.0;   // p, applied when training
  bool training = false;
  uint64_t seed = 0;      // dropout stream; draw a fresh one per call (see draw_dropout_seed)
  // Distances per head (AdaptiveSpan::visited); empty = computed from span_ratio (one host read).
  std::vector<int64_t> visited;
};

// Validates the arguments once and dispatches to the first row of the op's backend table that takes
// the inputs (src/ops/adaptive_span_attention.cpp): cuda, cpu, reference.
at::Tensor adaptive_span_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& key_pe, const at::Tensor& span_ratio,
                                   const SpanAttentionOptions& options);
// The name of the row that serves inputs like q: "cuda", "cpu" or "reference".
const char* adaptive_span_attention_backend(const at::Tensor& q);
// The rows of the table in this build, in the order they are asked.
std::vector<std::string> adaptive_span_attention_backends();

// For tests and benchmarks: while it lives, every call of the op (forward and backward, any thread)
// runs on the named row, and a call that row cannot take is a one-line error. Not for concurrent use
// with other overrides.
class SpanBackendOverride {
 public:
  explicit SpanBackendOverride(const std::string& row);
  ~SpanBackendOverride();
  SpanBackendOverride(const SpanBackendOverride&) = delete;
  SpanBackendOverride& operator=(const SpanBackendOverride&) = delete;

 private:
  int previous_;
};

// The executable spec: the reference's operations over the whole window with plain ATen ops (any dtype,
// differentiable by autograd). Used by the tests as the oracle, and by devices without a kernel.
at::Tensor adaptive_span_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& key_pe, const at::Tensor& span_ratio,
                                             const SpanAttentionOptions& options);

// The distances a head with span z (tokens) visits in a window of W keys: min(W, floor(z + R) + 1), at
// least 1. The one home of this rule (nn::AdaptiveSpan::visited and the kernels use it).
int64_t visited_distance(double z, double ramp, int64_t window);

// visited_distance for every head, z_h = span_ratio[h] * L (one host read).
std::vector<int64_t> visited_distances(const at::Tensor& span_ratio, int64_t attn_span, double ramp, int64_t window);

// The dropout decision for (seed, b, h, i, d): true = keep.
bool dropout_keep(uint64_t seed, int64_t b, int64_t h, int64_t i, int64_t d, double p);

}  // namespace spanformer::ops
