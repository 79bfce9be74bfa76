// CPU kernel of adaptive-span attention: blocked over (batch, head, query tile); each tile touches
// only the S_h + T - 1 context rows its head's span needs, as three small GEMMs (content, position,
// output), so the work per head follows its own span instead of the layer's largest one.
//
// Tile of T queries i0 .. i0+T-1 of head h, S = S_h visited distances:
//   Kt, Vt = rows i0 + W - S .. i0 + T - 2 + W of k, v                   (S + T - 1, D)
//   C      = Q Kt^T                                                       (T, S + T - 1)
//   s      = (unskew(C) + Q pe[:, L-S:]) / sqrt(D)                        (T, S), column c = distance S - c
//   p      = softmax(s);  w = p m;  a = w / (sum w + 1e-8);  a *= keep / (1 - p_drop)
//   out    = skew(a) Vt                                                   (T, D)
// Backward recomputes the tile (nothing of size M x W is stored) and applies, row by row,
//   da~ = dA keep / (1 - p_drop);  dw = (da~ - <da~, a~>) / (N + 1e-8);  dp = dw m;  dm = dw p
//   ds  = p (dp - <dp, p>) / sqrt(D);  dz = sum dm [0 <= x <= 1] / R  (x the unclamped mask)
//
// Version 1 (this file): ATen GEMMs per tile, tiles of 64 queries, heads processed in parallel with
// per-thread accumulators for key_pe and span_ratio gradients. Measured in docs/kernels.md.
#include "span_attention_cpu.h"

#include <ATen/Parallel.h>

#include <cmath>

#include "spanformer/attention/seq_attention.h"

namespace spanformer::ops::cpu {
namespace {

// Queries per tile. On the 2-core machine (B 1, K 8, D 64, M 512, L 8192, bimodal spans, forward +
// backward, median of 5): 64 -> 183 ms, 128 -> 220 ms; all spans at L: 773 ms vs 1081 ms.
constexpr int64_t kTile = 64;

// (T, S + T - 1) contiguous -> (T, S) view of row r's columns r .. r + S - 1.
at::Tensor tile_unskew(const at::Tensor& x, int64_t T, int64_t S) { return x.as_strided({T, S}, {S + T, 1}); }

// (T, S) -> (T, S + T - 1) with row r shifted right by r, zeros elsewhere.
at::Tensor tile_skew(const at::Tensor& a, int64_t T, int64_t S) {
  auto out = at::zeros({T, S + T - 1}, a.options());
  tile_unskew(out, T, S).copy_(a);
  return out;
}

struct Shape {
  int64_t B, K, M, D, W, L;
};

Shape shape_of(const at::Tensor& q, const at::Tensor& k, const SpanAttentionOptions& o) {
  return {q.size(0), q.size(1), q.size(2), q.size(3), k.size(2) - q.size(2), o.attn_span};
}

// Per head: the unclamped mask over the S visited distances (column c = distance S - c).
at::Tensor unclamped_mask(const at::Tensor& span_ratio, int64_t h, int64_t S, const SpanAttentionOptions& o) {
  auto distance_minus_one = at::arange(S - 1, -1, -1, span_ratio.options());
  return (span_ratio[h] * static_cast<double>(o.attn_span) - distance_minus_one) / o.ramp + 1.0;
}

// Dropout scale for the tile (keep / (1 - p)), or an undefined tensor without dropout.
at::Tensor dropout_scale(const SpanAttentionOptions& o, int64_t b, int64_t h, int64_t i0, int64_t T, int64_t S,
                         const at::TensorOptions& options) {
  if (!o.training || o.dropout <= 0) return {};
  auto scale = at::empty({T, S}, at::kDouble);
  double* p = scale.data_ptr<double>();
  const double kept = 1.0 / (1.0 - o.dropout);
  for (int64_t r = 0; r < T; ++r)
    for (int64_t c = 0; c < S; ++c) p[r * S + c] = dropout_keep(o.seed, b, h, i0 + r, S - c, o.dropout) ? kept : 0.0;
  return scale.to(options);
}

// Everything the forward computes for one tile, recomputed in backward.
struct TileState {
  at::Tensor Q, Kt, Vt, pe, p, m, N, a_tilde, scale, a;
};

TileState compute_tile(const at::Tensor& qbh, const at::Tensor& kbh, const at::Tensor& vbh, const at::Tensor& key_pe,
                       const at::Tensor& mask, const Shape& s, int64_t S, int64_t b, int64_t h, int64_t i0, int64_t T,
                       const SpanAttentionOptions& o) {
  TileState t;
  t.Q = qbh.narrow(0, i0, T);                                                     // (T, D)
  t.Kt = kbh.narrow(0, i0 + s.W - S, S + T - 1);                                  // (S+T-1, D)
  t.Vt = vbh.narrow(0, i0 + s.W - S, S + T - 1);                                  // (S+T-1, D)
  t.pe = key_pe.narrow(1, s.L - S, S);                                            // (D, S)
  auto scores = (tile_unskew(at::mm(t.Q, t.Kt.t()), T, S) + at::mm(t.Q, t.pe)) / std::sqrt(double(s.D));  // (T, S)
  t.p = at::softmax(scores, 1);                                                   // (T, S)
  t.m = mask;                                                                     // (S)
  auto w = t.p * t.m;                                                             // (T, S)
  t.N = w.sum(1, /*keepdim=*/true) + 1e-8;                                        // (T, 1)
  t.a_tilde = w / t.N;                                                            // (T, S)
  t.scale = dropout_scale(o, b, h, i0, T, S, qbh.options());
  t.a = t.scale.defined() ? t.a_tilde * t.scale : t.a_tilde;                      // (T, S)
  return t;
}

}  // namespace

at::Tensor span_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                  const at::Tensor& key_pe, const at::Tensor& span_ratio,
                                  const SpanAttentionOptions& o) {
  const Shape s = shape_of(q, k, o);
  const auto& visited = o.visited;  // resolved by the entry point
  std::vector<at::Tensor> masks;
  for (int64_t h = 0; h < s.K; ++h) masks.push_back(unclamped_mask(span_ratio, h, visited[h], o).clamp(0.0, 1.0));
  auto out = at::empty_like(q);                                                   // (B, K, M, D)
  at::parallel_for(0, s.B * s.K, 1, [&](int64_t begin, int64_t end) {
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.K, h = bh % s.K, S = visited[h];
      auto qbh = q[b][h], kbh = k[b][h], vbh = v[b][h], obh = out[b][h];
      for (int64_t i0 = 0; i0 < s.M; i0 += kTile) {
        const int64_t T = std::min(kTile, s.M - i0);
        auto t = compute_tile(qbh, kbh, vbh, key_pe, masks[h], s, S, b, h, i0, T, o);
        obh.narrow(0, i0, T).copy_(at::mm(tile_skew(t.a, T, S), t.Vt));          // (T, D)
      }
    }
  });
  return out;
}

SpanAttentionGrads span_attention_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& key_pe,
                                           const at::Tensor& span_ratio, const SpanAttentionOptions& o) {
  const Shape s = shape_of(q, k, o);
  const auto& visited = o.visited;  // resolved by the entry point
  std::vector<at::Tensor> masks, mask_grad;  // clamped mask, and d m / d ratio = L / R inside [0, 1]
  for (int64_t h = 0; h < s.K; ++h) {
    auto x = unclamped_mask(span_ratio, h, visited[h], o);
    masks.push_back(x.clamp(0.0, 1.0));
    mask_grad.push_back(((x >= 0) & (x <= 1)).to(x.options()) * (static_cast<double>(s.L) / o.ramp));
  }
  SpanAttentionGrads g;
  g.q = at::empty_like(q);
  g.k = at::zeros_like(k);
  g.v = at::zeros_like(v);
  // Shared by every (b, h): one accumulator per thread, summed at the end (static schedule: deterministic).
  const int64_t threads = at::get_num_threads();
  auto pe_parts = at::zeros({threads, s.D, s.L}, key_pe.options());
  auto ratio_parts = at::zeros({threads, s.K}, span_ratio.options());
  const double sqrt_d = std::sqrt(double(s.D));
  at::parallel_for(0, s.B * s.K, 1, [&](int64_t begin, int64_t end) {
    const int64_t thread = at::get_thread_num();
    auto dpe = pe_parts[thread];
    for (int64_t bh = begin; bh < end; ++bh) {
      const int64_t b = bh / s.K, h = bh % s.K, S = visited[h];
      auto qbh = q[b][h], kbh = k[b][h], vbh = v[b][h];
      auto dq = g.q[b][h], dk = g.k[b][h], dv = g.v[b][h], go = grad_out[b][h];
      at::Tensor dratio = at::zeros({}, span_ratio.options());
      for (int64_t i0 = 0; i0 < s.M; i0 += kTile) {
        const int64_t T = std::min(kTile, s.M - i0);
        auto t = compute_tile(qbh, kbh, vbh, key_pe, masks[h], s, S, b, h, i0, T, o);
        auto dO = go.narrow(0, i0, T);                                            // (T, D)
        dv.narrow(0, i0 + s.W - S, S + T - 1).add_(at::mm(tile_skew(t.a, T, S).t(), dO));
        auto dA = tile_unskew(at::mm(dO, t.Vt.t()), T, S);                        // (T, S)
        auto da_tilde = t.scale.defined() ? dA * t.scale : dA;
        auto dw = (da_tilde - (da_tilde * t.a_tilde).sum(1, true)) / t.N;        // (T, S)
        auto dp = dw * t.m;
        dratio = dratio + ((dw * t.p).sum(0) * mask_grad[h]).sum();
        auto ds = t.p * (dp - (dp * t.p).sum(1, true)) / sqrt_d;                  // (T, S)
        auto ds_skew = tile_skew(ds, T, S);                                       // (T, S+T-1)
        dq.narrow(0, i0, T).copy_(at::mm(ds_skew, t.Kt) + at::mm(ds, t.pe.t()));
        dk.narrow(0, i0 + s.W - S, S + T - 1).add_(at::mm(ds_skew.t(), t.Q));
        dpe.narrow(1, s.L - S, S).add_(at::mm(t.Q.t(), ds));                     // (D, S)
      }
      ratio_parts[thread][h].add_(dratio);
    }
  });
  g.key_pe = pe_parts.sum(0);
  g.span_ratio = ratio_parts.sum(0);
  return g;
}

}  // namespace spanformer::ops::cpu
