// Adaptive-span attention as one op: scores, softmax, span mask, renormalisation and dropout for each
// head over only the distances its span needs, with a hand-written backward (issue 6).
//
// Dims: B batch, K heads, M queries, W window (keys per query; the layer's L'), D head width,
// L max span. Inputs
//   q (B, K, M, D); k, v (B, K, W + M, D): query i sees context rows i .. i + W - 1 (distances W .. 1)
//   key_pe (D, L): column L - d is distance d;  span_ratio (K): z_h = span_ratio[h] * L.
//
// Semantics. With s_d = (q_i . k_{i+W-d} + q_i . key_pe[:, L-d]) / sqrt(D), the reference computes
//     a_d = p_d m_d / (sum_e p_e m_e + 1e-8),   p = softmax_d(s) over all W distances,
//     m_d = clamp((R + z - (d - 1)) / R, 0, 1).
// Writing p_d = e_d / Z (e_d = exp(s_d - max)), a_d = e_d m_d / (sum_e e_e m_e + 1e-8 Z): every term
// with m_d = 0 vanishes from the numerators, so a equals a softmax over s_d + log(m_d) restricted to
// the distances where m_d > 0, EXCEPT for the 1e-8 Z term, whose Z counts every key in the window.
// The op therefore visits, per head, the distances d = 1 .. S_h with
//     S_h = min(W, floor(z_h + R) + 1)
// (the last one is where m reaches 0: clamp's gradient is taken there too, as autograd does), and
// uses Z over those S_h distances. That is exactly the reference run with a window of S_h keys; the
// reference's own 64-key trimming already makes Z depend on the window, and the relative difference
// to a wider window is at most 1e-8 * Z_wide / sum(e m) (tested).
//
// Dropout keeps a_d with probability 1 - p and scales by 1 / (1 - p); the keep decision is a hash of
// (seed, b, h, i, d), so forward, backward and the reference agree without storing a mask.
#pragma once
#include <ATen/ATen.h>

#include <cstdint>
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

// Validates the arguments once and dispatches: CPU (fused, autograd-aware) or, later, CUDA.
at::Tensor adaptive_span_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                   const at::Tensor& key_pe, const at::Tensor& span_ratio,
                                   const SpanAttentionOptions& options);

// The executable spec: the same semantics written with plain ATen ops over the whole window (any
// dtype, differentiable by autograd). Used by the tests as the oracle.
at::Tensor adaptive_span_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                             const at::Tensor& key_pe, const at::Tensor& span_ratio,
                                             const SpanAttentionOptions& options);

// Distances head h visits: min(W, floor(z_h + R) + 1) with z_h = span_ratio[h] * L: options.visited
// when given, else read from span_ratio (one host read).
std::vector<int64_t> visited_distances(const at::Tensor& span_ratio, int64_t attn_span, double ramp, int64_t window);

// The dropout decision for (seed, b, h, i, d): true = keep.
bool dropout_keep(uint64_t seed, int64_t b, int64_t h, int64_t i, int64_t d, double p);

// A seed from LibTorch's default CPU generator (so seeded runs and resumed runs repeat their masks).
uint64_t draw_dropout_seed();

}  // namespace spanformer::ops
