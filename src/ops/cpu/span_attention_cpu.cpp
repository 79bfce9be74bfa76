// CPU kernel of adaptive-span attention: blocked over (head, query tile), batched over B. The scores
// cover the whole window (the reference's softmax normaliser Z counts every key, see the op's header);
// everything after the softmax (mask, renormalisation, dropout, the value product and its gradients)
// touches only the S_h visited distances of the tile's head.
//
// Tile of T queries i0 .. i0+T-1 of head h, S = S_h visited of W distances, for all B streams at once:
//   Kt     = rows i0 .. i0 + T - 2 + W of k                               (B, W + T - 1, D)
//   Vt     = rows i0 + W - S .. i0 + T - 2 + W of v                       (B, S + T - 1, D)
//   s      = (unskew(Q Kt^T) + Q pe[:, L-W:]) / sqrt(D)                   (B, T, W), column c = distance W - c
//   p      = softmax(s) over W;  pv = p[:, :, W-S:]                       (B, T, S)
//   a~     = pv m / (sum pv m + 1e-8);  a = a~ keep / (1 - p_drop)        (B, T, S)
//   out    = skew(a) Vt                                                   (B, T, D)
// When gradients are needed the forward keeps p (K, B, M, W) for backward (v4); backward rebuilds the
// rest of the tile from p (mask, renormalisation, dropout: O(T S)) and applies, row by row,
//   da~ = dA keep / (1 - p_drop);  dw = (da~ - <da~, a~>) / (sum pv m + 1e-8);  dpv = dw m
//   c   = <dpv, pv>;  ds = p (dp - c) / sqrt(D)  with dp = dpv on visited columns, 0 on the others
//   d ratio = sum dw pv [0 <= x <= 1] L / R  (x the unclamped mask)
// so the far columns get ds = -p c: the gradient of the 1e-8 Z term, as autograd gives the reference.
//
// Versions (2-core machine; docs/kernels.md has the measurements):
//   v1  tiles of 64 per (b, h), ATen GEMMs per tile, (b, h) in parallel.
//   v2  tiles batched over B with bmm, heads in parallel; softmax over the visited distances only,
//       which dropped the 1e-8 Z term of the far keys: 0.1 bpc wrong on reference models whose heads
//       rely on it (issue 10).
//   v3  v2 with the scores and Z over the whole window, as the reference; backward recomputed the
//       scores, so training did two more window-long products than the plain path's eight.
//   v4  (this file) v3 keeping p from the forward when gradients are needed: six window-long
//       products in training, one stored M x W tensor per head instead of the plain path's several.
#include "span_attention_cpu.h"

#include <ATen/Parallel.h>

#include <cmath>

namespace spanformer::ops::cpu {
namespace {

// Queries per tile; docs/kernels.md has the measurements behind the choice.
constexpr int64_t kTile = 64;

// (B, T, S + T - 1) contiguous -> (B, T, S) view of row r's columns r .. r + S - 1.
at::Tensor tile_unskew(const at::Tensor& x, int64_t T, int64_t S) {
  return x.as_strided({x.size(0), T, S}, {T * (S + T - 1), S + T, 1});
}

// (B, T, S) -> (B, T, S + T - 1) with row r shifted right by r, zeros elsewhere.
at::Tensor tile_skew(const at::Tensor& a, int64_t T, int64_t S) {
  auto out = at::zeros({a.size(0), T, S + T - 1}, a.options());
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
at::Tensor dropout_scale(const SpanAttentionOptions& o, const Shape& s, int64_t h, int64_t i0, int64_t T, int64_t S,
                         const at::TensorOptions& options) {
  if (!o.training || o.dropout <= 0) return {};
  auto scale = at::empty({s.B, T, S}, at::kDouble);
  double* p = scale.data_ptr<double>();
  const double kept = 1.0 / (1.0 - o.dropout);
  for (int64_t b = 0; b < s.B; ++b)
    for (int64_t r = 0; r < T; ++r)
      for (int64_t c = 0; c < S; ++c)
        *p++ = dropout_keep(o.seed, b, h, i0 + r, S - c, o.dropout) ? kept : 0.0;
  return scale.to(options);
}

// Everything the forward computes for one tile, recomputed in backward.
struct TileState {
  at::Tensor Q, Kt, Vt, pe, p, pv, m, N, a_tilde, scale, a;
};

// qh (B, M, D), kh / vh (B, W + M, D): one head's slices. p_saved: this head's (B, M, W) p kept by
// the forward (backward), or undefined to compute the scores (forward).
TileState compute_tile(const at::Tensor& qh, const at::Tensor& kh, const at::Tensor& vh, const at::Tensor& key_pe,
                       const at::Tensor& mask, const Shape& s, int64_t S, int64_t h, int64_t i0, int64_t T,
                       const SpanAttentionOptions& o, const at::Tensor& p_saved) {
  TileState t;
  t.Q = qh.narrow(1, i0, T);                                                      // (B, T, D)
  t.Kt = kh.narrow(1, i0, s.W + T - 1);                                           // (B, W+T-1, D)
  t.Vt = vh.narrow(1, i0 + s.W - S, S + T - 1);                                   // (B, S+T-1, D)
  t.pe = key_pe.narrow(1, s.L - s.W, s.W);                                        // (D, W)
  if (p_saved.defined()) {
    t.p = p_saved.narrow(1, i0, T);                                               // (B, T, W)
  } else {
    auto content = tile_unskew(at::bmm(t.Q, t.Kt.transpose(1, 2)), T, s.W);       // (B, T, W)
    auto scores = (content + at::matmul(t.Q, t.pe)) / std::sqrt(double(s.D));     // (B, T, W)
    t.p = at::softmax(scores, 2);                                                 // (B, T, W)
  }
  t.pv = t.p.narrow(2, s.W - S, S);                                               // (B, T, S)
  t.m = mask;                                                                     // (S)
  auto w = t.pv * t.m;                                                            // (B, T, S)
  t.N = w.sum(2, /*keepdim=*/true) + 1e-8;                                        // (B, T, 1)
  t.a_tilde = w / t.N;                                                            // (B, T, S)
  t.scale = dropout_scale(o, s, h, i0, T, S, qh.options());
  t.a = t.scale.defined() ? t.a_tilde * t.scale : t.a_tilde;                      // (B, T, S)
  return t;
}

}  // namespace

Forward span_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& key_pe, const at::Tensor& span_ratio,
                               const SpanAttentionOptions& o, bool keep_p) {
  const Shape s = shape_of(q, k, o);
  const auto& visited = o.visited;  // resolved by the entry point
  at::Tensor kept = keep_p ? at::empty({s.K, s.B, s.M, s.W}, q.options())        // (K, B, M, W) head-major, as out
                           : at::empty({0}, q.options());
  at::Tensor* p_keep = keep_p ? &kept : nullptr;
  std::vector<at::Tensor> masks;
  for (int64_t h = 0; h < s.K; ++h) masks.push_back(unclamped_mask(span_ratio, h, visited[h], o).clamp(0.0, 1.0));
  auto out = at::empty({s.K, s.B, s.M, s.D}, q.options());                        // head-major while filling
  at::parallel_for(0, s.K, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      const int64_t S = visited[h];
      auto qh = q.select(1, h), kh = k.select(1, h), vh = v.select(1, h), oh = out[h];
      for (int64_t i0 = 0; i0 < s.M; i0 += kTile) {
        const int64_t T = std::min(kTile, s.M - i0);
        auto t = compute_tile(qh, kh, vh, key_pe, masks[h], s, S, h, i0, T, o, at::Tensor());
        if (p_keep) (*p_keep)[h].narrow(1, i0, T).copy_(t.p);
        oh.narrow(1, i0, T).copy_(at::bmm(tile_skew(t.a, T, S), t.Vt));          // (B, T, D)
      }
    }
  });
  return {out.transpose(0, 1).contiguous(), kept};                                // (B, K, M, D)
}

SpanAttentionGrads span_attention_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& key_pe,
                                           const at::Tensor& span_ratio, const SpanAttentionOptions& o,
                                           const at::Tensor& p_kept) {
  TORCH_CHECK(p_kept.dim() == 4, "span_attention_backward: the forward kept no probabilities");
  const Shape s = shape_of(q, k, o);
  const auto& visited = o.visited;
  std::vector<at::Tensor> masks, mask_grad;  // clamped mask, and d m / d ratio = L / R inside [0, 1]
  for (int64_t h = 0; h < s.K; ++h) {
    auto x = unclamped_mask(span_ratio, h, visited[h], o);
    masks.push_back(x.clamp(0.0, 1.0));
    mask_grad.push_back(((x >= 0) & (x <= 1)).to(x.options()) * (static_cast<double>(s.L) / o.ramp));
  }
  // Head-major gradients: each head is written by one thread only.
  auto dq = at::empty({s.K, s.B, s.M, s.D}, q.options());
  auto dk = at::zeros({s.K, s.B, s.W + s.M, s.D}, k.options());
  auto dv = at::zeros({s.K, s.B, s.W + s.M, s.D}, v.options());
  auto pe_parts = at::zeros({s.K, s.D, s.W}, key_pe.options());  // summed over heads at the end
  auto dratio = at::zeros({s.K}, span_ratio.options());
  const double sqrt_d = std::sqrt(double(s.D));
  at::parallel_for(0, s.K, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      const int64_t S = visited[h];
      auto qh = q.select(1, h), kh = k.select(1, h), vh = v.select(1, h), go = grad_out.select(1, h);
      auto dpe = pe_parts[h];                                                     // (D, W)
      auto dratio_h = at::zeros({}, span_ratio.options());
      for (int64_t i0 = 0; i0 < s.M; i0 += kTile) {
        const int64_t T = std::min(kTile, s.M - i0);
        auto t = compute_tile(qh, kh, vh, key_pe, masks[h], s, S, h, i0, T, o, p_kept[h]);
        auto dO = go.narrow(1, i0, T);                                            // (B, T, D)
        dv[h].narrow(1, i0 + s.W - S, S + T - 1).add_(at::bmm(tile_skew(t.a, T, S).transpose(1, 2), dO));
        auto dA = tile_unskew(at::bmm(dO, t.Vt.transpose(1, 2)), T, S);           // (B, T, S)
        auto da_tilde = t.scale.defined() ? dA * t.scale : dA;
        auto dw = (da_tilde - (da_tilde * t.a_tilde).sum(2, true)) / t.N;        // (B, T, S)
        auto dpv = dw * t.m;                                                      // (B, T, S)
        dratio_h = dratio_h + ((dw * t.pv).sum(at::IntArrayRef{0, 1}) * mask_grad[h]).sum();
        auto c = (dpv * t.pv).sum(2, true);                                       // (B, T, 1)
        auto ds = t.p * (-c);                                                     // (B, T, W): far columns
        ds.narrow(2, s.W - S, S).add_(t.pv * dpv);                                // visited columns
        ds.div_(sqrt_d);
        auto ds_skew = tile_skew(ds, T, s.W);                                     // (B, T, W+T-1)
        dq[h].narrow(1, i0, T).copy_(at::bmm(ds_skew, t.Kt) + at::matmul(ds, t.pe.t()));
        dk[h].narrow(1, i0, s.W + T - 1).add_(at::bmm(ds_skew.transpose(1, 2), t.Q));
        dpe.add_(at::mm(t.Q.reshape({-1, s.D}).t(), ds.reshape({-1, s.W})));     // (D, W)
      }
      dratio[h] = dratio_h;
    }
  });
  SpanAttentionGrads g;
  g.q = dq.transpose(0, 1).contiguous();
  g.k = dk.transpose(0, 1).contiguous();
  g.v = dv.transpose(0, 1).contiguous();
  g.key_pe = at::zeros({s.D, s.L}, key_pe.options());
  g.key_pe.narrow(1, s.L - s.W, s.W).copy_(pe_parts.sum(0));
  g.span_ratio = dratio;
  return g;
}

}  // namespace spanformer::ops::cpu
