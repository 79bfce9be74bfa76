// CPU kernel of adaptive-span attention: blocked over (head, query tile), one stream b at a time. The
// scores cover the whole window (the reference's softmax normaliser Z counts every key, see the op's
// header); everything after the softmax (mask, renormalisation, dropout, the value product and its
// gradients) touches only the S_h visited distances of the tile's head.
//
// Tile of T queries i0 .. i0+T-1 of head h and stream b, S = S_h visited of W distances:
//   Kt     = rows i0 .. i0 + T - 2 + W of k                               (W + T - 1, D)
//   Vt     = rows i0 + W - S .. i0 + T - 2 + W of v                       (S + T - 1, D)
//   s      = (unskew(Q Kt^T) + Q pe[:, L-W:]) / sqrt(D)                   (T, W), column c = distance W - c
//   p      = softmax(s) over W;  pv = p[:, W-S:]                          (T, S)
//   a~     = pv m / (sum pv m + 1e-8);  a = a~ keep / (1 - p_drop)        (T, S)
//   out    = skew(a) Vt                                                   (T, D)
// which is the reference composition (adaptive_span_attention_reference) up to summation order.
// When gradients are needed the forward keeps p (K, B, M, W) for backward (v4); backward rebuilds the
// rest of the tile from p (mask, renormalisation, dropout: O(T S)) and applies, row by row,
//   da~ = dA keep / (1 - p_drop);  dw = (da~ - <da~, a~>) / (sum pv m + 1e-8);  t = dw pv
//   c   = <t, m>;  ds = (t m - p c) / sqrt(D) on visited columns, -p c / sqrt(D) on the others
//   d ratio = sum t [0 <= x <= 1] L / R  (x the unclamped mask)
// so the far columns get ds = -p c / sqrt(D): the gradient of the 1e-8 Z term, as autograd gives the
// reference. c = 1e-8 <da~, a~> / (sum pv m + 1e-8) is what remains of a sum of O(1) terms, so the row
// loop runs in double (in float32 it would keep few of c's digits).
//
// Where the time goes (v5): six window-long products per tile in training (two forward, four backward)
// run as BLAS calls that write their results where they belong: the unskew is a leading dimension of
// W + T (row r of Q Kt^T starts r columns further along), a power-of-two 1/sqrt(D) is the products' alpha, the
// gradients of k and key_pe accumulate in place (beta 1). The elementwise work of a row is one loop over
// its visited distances and one over the window; the softmax is ATen's vectorised kernel.
//
// Versions (2-core machine; docs/kernels.md has the measurements):
//   v1  tiles of 64 per (b, h), ATen GEMMs per tile, (b, h) in parallel.
//   v2  tiles batched over B with bmm, heads in parallel; softmax over the visited distances only,
//       which dropped the 1e-8 Z term of the far keys: 0.1 bpc wrong on reference models whose heads
//       rely on it (dropping it cost 0.1 bpc).
//   v3  v2 with the scores and Z over the whole window, as the reference; backward recomputed the
//       scores, so training did two more window-long products than the plain path's eight.
//   v4  v3 keeping p from the forward when gradients are needed: six window-long products in training,
//       one stored M x W tensor per head instead of the plain path's several. A composition of ATen ops
//       per tile: every op allocated its (T, W) result and made a pass over it.
//   v5  v4's arithmetic with the products written in place, one loop per row for the rest (in double),
//       the mask held in double after the reference's arithmetic, bf16 / fp16 inputs computed in float32
//       (v4 failed on bf16 inputs with float32 spans), and the work handed out as threads come free:
//       (head, tile) items in forward, whole heads in backward (a head's key gradients need one owner),
//       costliest first.
//   v6  (this file) v5 beside a kernel whose products take 16-bit operands (forward_kernel_native,
//       backward_kernel_native), chosen by tile_gemm.h's half_products_native: where the CPU
//       multiplies bf16 in hardware, and under train.amp=bf16 there (op_autocast.h).
#include "span_attention_cpu.h"

#include "row_math.h"
#include "tile_gemm.h"
#include "work_queue.h"

#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <numeric>

namespace spanformer::ops::cpu {
namespace {

// Queries per tile; docs/kernels.md has the measurements behind the choice.
constexpr int64_t kTile = 64;

struct Shape {
  int64_t B, K, M, D, W, L;
  int64_t tiles() const { return (M + kTile - 1) / kTile; }
};

Shape shape_of(const at::Tensor& q, const at::Tensor& k, const SpanAttentionOptions& o) {
  return {q.size(0), q.size(1), q.size(2), q.size(3), k.size(2) - q.size(2), o.attn_span};
}

// One head's mask over its S visited distances (column c = distance S - c): x = span_mask_unclamped (the
// reference's arithmetic, in the spans' dtype), m_c = clamp(x_c, 0, 1), dm_c / d ratio = [0 <= x_c <= 1]
// L / R, held in double for the row loops. Not computed in double: in float32 x is 0 at z = 1.2e-6
// (a head of the small4 reference model) where double gives 3.7e-8, and with that model's scores the
// log-probabilities moved by 0.27.
struct HeadMask {
  int64_t S = 0;
  std::vector<double> m, dm;
  int64_t ramp_begin = 0, ramp_end = 0;  // dm is 0 outside [ramp_begin, ramp_end): the ramp's R + 1 columns at most
  rows::SpanRowMask row() const { return {m.data(), dm.data(), S, ramp_begin, ramp_end}; }
};

std::vector<HeadMask> head_masks(const at::Tensor& span_ratio, const SpanAttentionOptions& o) {
  const auto ratio = span_ratio.detach();
  std::vector<HeadMask> heads(o.visited.size());
  for (size_t h = 0; h < heads.size(); ++h) {
    auto& hm = heads[h];
    hm.S = o.visited[h];
    auto x = span_mask_unclamped(ratio.narrow(0, h, 1), hm.S, o.attn_span, o.ramp)[0];    // (S)
    auto m = x.clamp(0.0, 1.0).to(at::kDouble).contiguous();
    auto dm = (((x >= 0) & (x <= 1)).to(at::kDouble) * (static_cast<double>(o.attn_span) / o.ramp)).contiguous();
    hm.m.assign(m.data_ptr<double>(), m.data_ptr<double>() + hm.S);
    hm.dm.assign(dm.data_ptr<double>(), dm.data_ptr<double>() + hm.S);
    for (int64_t c = 0; c < hm.S; ++c)
      if (hm.dm[c] != 0.0) {
        if (hm.ramp_end == 0) hm.ramp_begin = c;
        hm.ramp_end = c + 1;
      }
  }
  return heads;
}

// Heads by decreasing cost (the window-long products are the same for every head; the value side grows
// with S_h), so that the cheap ones fill the threads' last gaps.
std::vector<int64_t> heads_by_cost(const std::vector<HeadMask>& masks) {
  std::vector<int64_t> order(masks.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return masks[a].S > masks[b].S; });
  return order;
}

// Row r of a skewed (T, n + T - 1) buffer holds its n values at columns r .. r + n - 1: zero the rest.
template <typename scalar_t>
void zero_outside_band(scalar_t* row, int64_t r, int64_t n, int64_t T) {
  std::memset(row, 0, sizeof(scalar_t) * r);
  std::memset(row + r + n, 0, sizeof(scalar_t) * (T - 1 - r));
}

// The (T, W) unskewed view of a contiguous (T, W + T - 1) buffer: row r's columns r .. r + W - 1.
at::Tensor unskewed(const at::Tensor& skewed, int64_t W) {
  const int64_t T = skewed.size(0);
  return skewed.as_strided({T, W}, {W + T, 1});
}

// The per-row factors keep / (1 - p_drop) of a tile row over its S visited distances (1 without dropout).
struct Dropout {
  const SpanAttentionOptions& o;
  bool on() const { return o.training && o.dropout > 0; }
  void row(double* scale, int64_t b, int64_t h, int64_t i, int64_t S) const {
    const double kept = 1.0 / (1.0 - o.dropout);
    for (int64_t c = 0; c < S; ++c) scale[c] = dropout_keep(o.seed, b, h, i, S - c, o.dropout) ? kept : 0.0;
  }
};

// a = a~ keep / (1 - p) of one tile, written skewed into A (T, S + T - 1) for the product with Vt.
// p: the tile's softmax rows (ld W). In double (row_math.h), as backward rebuilds it (backward_rows).
template <typename scalar_t, typename op_t = scalar_t>
void attention_weights(const scalar_t* p, int64_t W, const HeadMask& hm, const Dropout& drop, int64_t b, int64_t h,
                       int64_t i0, int64_t T, op_t* A) {
  const int64_t S = hm.S, ld = S + T - 1;
  const auto mask = hm.row();
  std::vector<double> keep(drop.on() ? S : 0);
  for (int64_t r = 0; r < T; ++r) {
    if (drop.on()) drop.row(keep.data(), b, h, i0 + r, S);
    rows::span_weights_row(p + r * W + (W - S), mask, drop.on() ? keep.data() : nullptr, A + r * ld + r);
    zero_outside_band(A + r * ld, r, S, T);
  }
}

// The scores of one tile, unskew(Q Kt^T) + Q pe_w over sqrt(D), written into the (T, W) view of C
// (T, W + T - 1), then p = softmax into P (T, W). Where 1/sqrt(D) is a power of two (D 4, 16, 64, 256)
// it is the products' alpha, without rounding; otherwise the scores are divided as the reference does
// (an alpha rounded to float32 scales every score by the same relative error, which the span gradient,
// a cancelling sum, amplifies: 5e-6 against the composition's 9e-7 at D 32, measured).
void scores_and_softmax(const at::Tensor& Q, const at::Tensor& Kt, const at::Tensor& pe_w, double sqrt_d, at::Tensor& C,
                        at::Tensor P) {
  int exponent = 0;
  const bool fold = std::frexp(sqrt_d, &exponent) == 0.5;
  const double alpha = fold ? 1.0 / sqrt_d : 1.0;
  at::addmm_out(C, C, Q, Kt.t(), /*beta=*/0, alpha);                              // (T, W+T-1) = Q Kt^T
  auto s = unskewed(C, pe_w.size(1));                                             // (T, W), ld W + T
  s.addmm_(Q, pe_w, /*beta=*/1, alpha);                                           // (T, W) += Q pe_w
  if (!fold) s.div_(sqrt_d);
  at::_softmax_out(P, s, 1, false);                                               // (T, W)
}

// Every (head, tile) once, for every stream: costly heads first, tiles taken by whichever thread is free.
template <typename scalar_t>
void forward_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_pe,
                    const std::vector<HeadMask>& masks, const SpanAttentionOptions& o, const Shape& s, at::Tensor& out,
                    at::Tensor* p_keep) {
  const double sqrt_d = std::sqrt(double(s.D));
  const Dropout drop{o};
  const auto pe_w = key_pe.narrow(1, s.L - s.W, s.W);                             // (D, W), ld L
  const auto heads = heads_by_cost(masks);
  for_each_item(s.K * s.tiles(), [&](int64_t j) {
    const int64_t h = heads[j / s.tiles()], i0 = (j % s.tiles()) * kTile, T = std::min(kTile, s.M - i0);
    const int64_t S = masks[h].S;
    auto C = at::empty({T, s.W + T - 1}, q.options());                            // scores, skewed
    auto P = p_keep ? at::Tensor() : at::empty({T, s.W}, q.options());            // p (evaluation)
    auto A = at::empty({T, S + T - 1}, q.options());                              // a, skewed
    for (int64_t b = 0; b < s.B; ++b) {
      auto Q = q[b][h].narrow(0, i0, T);                                          // (T, D)
      auto Kt = k[b][h].narrow(0, i0, s.W + T - 1);                               // (W+T-1, D)
      auto Vt = v[b][h].narrow(0, i0 + s.W - S, S + T - 1);                       // (S+T-1, D)
      auto p = p_keep ? (*p_keep)[h][b].narrow(0, i0, T) : P;                     // (T, W)
      scores_and_softmax(Q, Kt, pe_w, sqrt_d, C, p);
      attention_weights(p.data_ptr<scalar_t>(), s.W, masks[h], drop, b, h, i0, T, A.data_ptr<scalar_t>());
      auto o_rows = out[b][h].narrow(0, i0, T);                                   // (T, D)
      at::mm_out(o_rows, A, Vt);                                                  // (T, D) = skew(a) Vt
    }
  });
}

// The row loop of one backward tile (row_math.h's span_backward_row, in double). In: p (T, W) of the
// forward, G = dO Vt^T (T, S + T - 1). Out: the skewed a (T, S + T - 1) for dV, the skewed ds / sqrt(D)
// (T, W + T - 1) for dQ, dK and d key_pe; returns the tile's share of d ratio.
template <typename scalar_t, typename op_t = scalar_t>
double backward_rows(const scalar_t* p, const scalar_t* G, int64_t W, const HeadMask& hm, const Dropout& drop,
                     int64_t b, int64_t h, int64_t i0, int64_t T, double alpha, op_t* A, op_t* Ds) {
  const int64_t S = hm.S, lda = S + T - 1, ldd = W + T - 1;
  const auto mask = hm.row();
  std::vector<double> keep(drop.on() ? S : 0), scratch(2 * S);
  double dratio = 0;
  for (int64_t r = 0; r < T; ++r) {
    if (drop.on()) drop.row(keep.data(), b, h, i0 + r, S);
    dratio += rows::span_backward_row(p + r * W, G + r * lda + r, W, mask, drop.on() ? keep.data() : nullptr, alpha,
                                      scratch.data(), A + r * lda + r, Ds + r * ldd + r);
    zero_outside_band(A + r * lda, r, S, T);
    zero_outside_band(Ds + r * ldd, r, W, T);
  }
  return dratio;
}

template <typename scalar_t>
void backward_kernel(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                     const at::Tensor& key_pe, const std::vector<HeadMask>& masks, const SpanAttentionOptions& o,
                     const Shape& s, const at::Tensor& p_kept, SpanAttentionGrads& g, at::Tensor& pe_parts,
                     std::vector<double>& dratio) {
  const double alpha = 1.0 / std::sqrt(double(s.D));
  const Dropout drop{o};
  const auto pe_w = key_pe.narrow(1, s.L - s.W, s.W);                             // (D, W), ld L
  const auto heads = heads_by_cost(masks);
  // One thread owns a head: its tiles all add into its rows of dK and dV and its d key_pe.
  for_each_item(s.K, [&](int64_t j) {
    const int64_t h = heads[j];
    const int64_t S = masks[h].S;
    auto dpe = pe_parts[h];                                                       // (D, W)
    double dratio_h = 0;
    for (int64_t i0 = 0; i0 < s.M; i0 += kTile) {
      const int64_t T = std::min(kTile, s.M - i0);
      auto Ds = at::empty({T, s.W + T - 1}, q.options());                         // skewed ds / sqrt(D)
      auto A = at::empty({T, S + T - 1}, q.options());                            // skewed a
      auto G = at::empty({T, S + T - 1}, q.options());                            // dO Vt^T
      for (int64_t b = 0; b < s.B; ++b) {
        auto Q = q[b][h].narrow(0, i0, T);                                        // (T, D)
        auto Kt = k[b][h].narrow(0, i0, s.W + T - 1);                             // (W+T-1, D)
        auto Vt = v[b][h].narrow(0, i0 + s.W - S, S + T - 1);                     // (S+T-1, D)
        auto dO = grad_out[b][h].narrow(0, i0, T);                                // (T, D)
        at::mm_out(G, dO, Vt.t());
        dratio_h += backward_rows(p_kept[h][b].narrow(0, i0, T).data_ptr<scalar_t>(), G.data_ptr<scalar_t>(), s.W,
                                  masks[h], drop, b, h, i0, T, alpha, A.data_ptr<scalar_t>(),
                                  Ds.data_ptr<scalar_t>());
        auto ds = unskewed(Ds, s.W);                                              // (T, W), ld W + T
        g.v[b][h].narrow(0, i0 + s.W - S, S + T - 1).addmm_(A.t(), dO);           // dVt += skew(a)^T dO
        auto dq = g.q[b][h].narrow(0, i0, T);                                     // (T, D)
        at::mm_out(dq, Ds, Kt);                                                   //   = skew(ds) Kt / sqrt(D)
        dq.addmm_(ds, pe_w.t());                                                  //  += ds pe_w^T / sqrt(D)
        g.k[b][h].narrow(0, i0, s.W + T - 1).addmm_(Ds.t(), Q);                   // dKt += skew(ds)^T Q / sqrt(D)
        dpe.addmm_(Q.t(), ds);                                                    // (D, W) += Q^T ds / sqrt(D)
      }
    }
    dratio[h] = dratio_h;
  });
}

// ---- 16-bit operands (native products, tile_gemm.h) --------------------------------------------------
// The same tiles with q, k, v, key_pe and dO entering the products as they are and the skewed a and ds
// rounded to 16 bits before the products that read them; the scores, p, the row loops and every
// accumulation (the output tile, dQ, dK, dV, d key_pe) stay float32 or double. The products go through
// tile_gemm, which reads its right-hand operand row-major: the keys enter the score product transposed
// (k^T, made once per call), and the key and value gradients are accumulated transposed, dK^T += Q^T
// skew(ds) and dV^T += dO^T skew(a), so that skew(ds) and skew(a) are right-hand operands as written.
// 1/sqrt(D) divides the scores after both products (exact where it is a power of two, as the alpha of
// the float32 kernel; as the reference divides elsewhere).

// (rows, cols) row-major with ld_src into (cols, rows) contiguous.
template <typename T>
void transpose_into(const T* src, int64_t rows, int64_t cols, int64_t ld_src, T* dst) {
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * ld_src + c];
}

template <typename half_t>
void forward_kernel_native(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_pe,
                           const std::vector<HeadMask>& masks, const SpanAttentionOptions& o, const Shape& s,
                           at::Tensor& out, at::Tensor* p_keep) {
  const double sqrt_d = std::sqrt(double(s.D));
  const Dropout drop{o};
  const auto kT = k.transpose(2, 3).contiguous();                                 // (B, K, D, W+M)
  const int64_t ldk = s.W + s.M;
  const half_t* q0 = q.data_ptr<half_t>();                                        // (B, K, M, D)
  const half_t* kT0 = kT.data_ptr<half_t>();                                      // (B, K, D, W+M)
  const half_t* v0 = v.data_ptr<half_t>();                                        // (B, K, W+M, D)
  const half_t* pe_w = key_pe.data_ptr<half_t>() + (s.L - s.W);                   // (D, W), ld L
  half_t* out0 = out.data_ptr<half_t>();                                          // (B, K, M, D)
  float* kept0 = p_keep ? p_keep->data_ptr<float>() : nullptr;                    // (K, B, M, W)
  const auto heads = heads_by_cost(masks);
  for_each_item(s.K * s.tiles(), [&](int64_t j) {
    const int64_t h = heads[j / s.tiles()], i0 = (j % s.tiles()) * kTile, T = std::min(kTile, s.M - i0);
    const int64_t S = masks[h].S, ldc = s.W + T - 1, lda = S + T - 1;
    std::vector<float> C(T * ldc);                                                // scores, skewed
    std::vector<float> P(kept0 ? 0 : T * s.W);                                    // p (evaluation)
    std::vector<half_t> A(T * lda);                                               // a, skewed, 16-bit
    std::vector<float> O(T * s.D);                                                // output tile
    for (int64_t b = 0; b < s.B; ++b) {
      const int64_t bh = b * s.K + h;
      const half_t* Q = q0 + (bh * s.M + i0) * s.D;                               // (T, D)
      const half_t* KtT = kT0 + bh * s.D * ldk + i0;                              // (D, W+T-1), ld W+M
      const half_t* Vt = v0 + (bh * ldk + i0 + s.W - S) * s.D;                    // (S+T-1, D)
      float* p = kept0 ? kept0 + ((h * s.B + b) * s.M + i0) * s.W : P.data();     // (T, W)
      tile_gemm(T, ldc, s.D, Q, s.D, KtT, ldk, C.data(), ldc, false);             // (T, W+T-1) = Q Kt^T
      tile_gemm(T, s.W, s.D, Q, s.D, pe_w, s.L, C.data(), ldc + 1, true);         // unskewed (T, W) += Q pe_w
      for (int64_t r = 0; r < T; ++r)                                             // p = softmax(s / sqrt(D))
        rows::softmax_divided(C.data() + r * (ldc + 1), s.W, sqrt_d, p + r * s.W);
      attention_weights(p, s.W, masks[h], drop, b, h, i0, T, A.data());
      tile_gemm(T, s.D, lda, A.data(), lda, Vt, s.D, O.data(), s.D, false);      // (T, D) = skew(a) Vt
      rows::narrow_to(O.data(), T * s.D, out0 + (bh * s.M + i0) * s.D);           // rounded once
    }
    release_half_products(q.scalar_type());
  });
}

template <typename half_t>
void backward_kernel_native(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& key_pe, const std::vector<HeadMask>& masks, const SpanAttentionOptions& o,
                            const Shape& s, const at::Tensor& p_kept, at::Tensor& gq, at::Tensor& gkT, at::Tensor& gvT,
                            at::Tensor& pe_parts, std::vector<double>& dratio) {
  const double alpha = 1.0 / std::sqrt(double(s.D));
  const Dropout drop{o};
  const auto vT = v.transpose(2, 3).contiguous();                                 // (B, K, D, W+M)
  const auto peT = key_pe.t().contiguous();                                       // (L, D)
  const int64_t ldk = s.W + s.M;
  const half_t* pe_wT = peT.data_ptr<half_t>() + (s.L - s.W) * s.D;               // (W, D)
  const half_t* q0 = q.data_ptr<half_t>();                                        // (B, K, M, D)
  const half_t* dO0 = grad_out.data_ptr<half_t>();                                // (B, K, M, D)
  const half_t* k0 = k.data_ptr<half_t>();                                        // (B, K, W+M, D)
  const half_t* vT0 = vT.data_ptr<half_t>();                                      // (B, K, D, W+M)
  const float* p0 = p_kept.data_ptr<float>();                                     // (K, B, M, W)
  half_t* gq0 = gq.data_ptr<half_t>();                                            // (B, K, M, D)
  float* gkT0 = gkT.data_ptr<float>();                                            // (B, K, D, W+M)
  float* gvT0 = gvT.data_ptr<float>();                                            // (B, K, D, W+M)
  const auto heads = heads_by_cost(masks);
  for_each_item(s.K, [&](int64_t j) {
    const int64_t h = heads[j];
    const int64_t S = masks[h].S;
    float* dpe = pe_parts[h].data_ptr<float>();                                   // (D, W)
    double dratio_h = 0;
    std::vector<half_t> QT(s.D * kTile), dOT(s.D * kTile);                        // (D, T) each
    std::vector<half_t> Ds(kTile * (s.W + kTile - 1));                            // skewed ds / sqrt(D), 16-bit
    std::vector<half_t> A(kTile * (S + kTile - 1));                               // skewed a, 16-bit
    std::vector<float> G(kTile * (S + kTile - 1));                                // dO Vt^T
    std::vector<float> dQ(kTile * s.D);
    for (int64_t i0 = 0; i0 < s.M; i0 += kTile) {
      const int64_t T = std::min(kTile, s.M - i0), ldd = s.W + T - 1, lda = S + T - 1;
      for (int64_t b = 0; b < s.B; ++b) {
        const int64_t bh = b * s.K + h;
        const half_t* Q = q0 + (bh * s.M + i0) * s.D;                             // (T, D)
        const half_t* dO = dO0 + (bh * s.M + i0) * s.D;                           // (T, D)
        const half_t* Kt = k0 + (bh * ldk + i0) * s.D;                            // (W+T-1, D)
        const half_t* VtT = vT0 + bh * s.D * ldk + (i0 + s.W - S);                // (D, S+T-1), ld W+M
        const float* p = p0 + ((h * s.B + b) * s.M + i0) * s.W;                   // (T, W)
        tile_gemm(T, lda, s.D, dO, s.D, VtT, ldk, G.data(), lda, false);          // G = dO Vt^T
        dratio_h += backward_rows(p, G.data(), s.W, masks[h], drop, b, h, i0, T, alpha, A.data(), Ds.data());
        transpose_into(Q, T, s.D, s.D, QT.data());
        transpose_into(dO, T, s.D, s.D, dOT.data());
        float* dvT = gvT0 + bh * s.D * ldk + (i0 + s.W - S);                      // (D, S+T-1), ld W+M
        tile_gemm(s.D, lda, T, dOT.data(), T, A.data(), lda, dvT, ldk, true);     // dVt^T += dO^T skew(a)
        tile_gemm(T, s.D, ldd, Ds.data(), ldd, Kt, s.D, dQ.data(), s.D, false);   // dQ = skew(ds) Kt
        tile_gemm(T, s.D, s.W, Ds.data(), ldd + 1, pe_wT, s.D, dQ.data(), s.D, true);  // += ds pe_w^T
        rows::narrow_to(dQ.data(), T * s.D, gq0 + (bh * s.M + i0) * s.D);         // (T, D), rounded once
        float* dkT = gkT0 + bh * s.D * ldk + i0;                                  // (D, W+T-1), ld W+M
        tile_gemm(s.D, ldd, T, QT.data(), T, Ds.data(), ldd, dkT, ldk, true);     // dKt^T += Q^T skew(ds)
        tile_gemm(s.D, s.W, T, QT.data(), T, Ds.data(), ldd + 1, dpe, s.W, true); // d pe_w += Q^T ds
      }
    }
    dratio[h] = dratio_h;
    release_half_products(q.scalar_type());
  });
}

}  // namespace

Forward span_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& key_pe, const at::Tensor& span_ratio,
                               const SpanAttentionOptions& o, bool keep_p) {
  if (!q.is_contiguous() || !k.is_contiguous() || !v.is_contiguous() || !key_pe.is_contiguous() || !span_ratio.is_contiguous())
    return span_attention_forward(q.contiguous(), k.contiguous(), v.contiguous(), key_pe.contiguous(),
                                  span_ratio.contiguous(), o, keep_p);
  const auto ct = span_compute_dtype(q.scalar_type());
  if (ct != q.scalar_type() && half_products_native(q.scalar_type())) {  // 16-bit operands, float32 rest
    const Shape s = shape_of(q, k, o);
    const auto masks = head_masks(span_ratio, o);
    const auto f32 = q.options().dtype(ct);
    at::Tensor kept = keep_p ? at::empty({s.K, s.B, s.M, s.W}, f32) : at::empty({0}, f32);  // (K, B, M, W)
    auto out = at::empty({s.B, s.K, s.M, s.D}, q.options());                      // (B, K, M, D)
    if (q.scalar_type() == at::kBFloat16)
      forward_kernel_native<c10::BFloat16>(q, k, v, key_pe, masks, o, s, out, keep_p ? &kept : nullptr);
    else
      forward_kernel_native<c10::Half>(q, k, v, key_pe, masks, o, s, out, keep_p ? &kept : nullptr);
    return {out, kept};
  }
  if (ct != q.scalar_type()) {  // 16-bit inputs: computed in float32, the output rounded once
    auto f = span_attention_forward(q.to(ct), k.to(ct), v.to(ct), key_pe.to(ct), span_ratio, o, keep_p);
    return {f.out.to(q.scalar_type()), f.saved};
  }
  const Shape s = shape_of(q, k, o);
  const auto masks = head_masks(span_ratio, o);                                   // o.visited resolved by the entry point
  at::Tensor kept = keep_p ? at::empty({s.K, s.B, s.M, s.W}, q.options())         // (K, B, M, W) head-major
                           : at::empty({0}, q.options());
  auto out = at::empty({s.B, s.K, s.M, s.D}, q.options());                        // (B, K, M, D)
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "span_attention_forward", [&] {
    forward_kernel<scalar_t>(q, k, v, key_pe, masks, o, s, out, keep_p ? &kept : nullptr);
  });
  return {out, kept};
}

SpanAttentionGrads span_attention_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& key_pe,
                                           const at::Tensor& span_ratio, const at::Tensor& out,
                                           const at::Tensor& p_kept, const SpanAttentionOptions& o) {
  if (!grad_out.is_contiguous() || !q.is_contiguous() || !k.is_contiguous() || !v.is_contiguous() ||
      !key_pe.is_contiguous() || !span_ratio.is_contiguous())
    return span_attention_backward(grad_out.contiguous(), q.contiguous(), k.contiguous(), v.contiguous(),
                                   key_pe.contiguous(), span_ratio.contiguous(), out, p_kept, o);
  TORCH_CHECK(p_kept.dim() == 4, "span_attention_backward: the forward kept no probabilities");
  const auto ct = span_compute_dtype(q.scalar_type());
  if (ct != q.scalar_type() && half_products_native(q.scalar_type())) {  // 16-bit operands, float32 rest
    TORCH_CHECK(p_kept.scalar_type() == ct && p_kept.is_contiguous(),
                "span_attention_backward: p was kept in another dtype or layout");
    const Shape s = shape_of(q, k, o);
    const auto masks = head_masks(span_ratio, o);
    const auto f32 = q.options().dtype(ct);
    SpanAttentionGrads g;
    auto gq = at::empty({s.B, s.K, s.M, s.D}, q.options());                       // every row written once
    auto gkT = at::zeros({s.B, s.K, s.D, s.W + s.M}, f32);                        // accumulated over tiles
    auto gvT = at::zeros({s.B, s.K, s.D, s.W + s.M}, f32);
    auto pe_parts = at::zeros({s.K, s.D, s.W}, f32);                              // summed over heads at the end
    std::vector<double> dratio(s.K, 0.0);
    const auto dO = grad_out.to(q.scalar_type()).contiguous();                    // (B, K, M, D)
    if (q.scalar_type() == at::kBFloat16)
      backward_kernel_native<c10::BFloat16>(dO, q, k, v, key_pe, masks, o, s, p_kept, gq, gkT, gvT, pe_parts, dratio);
    else
      backward_kernel_native<c10::Half>(dO, q, k, v, key_pe, masks, o, s, p_kept, gq, gkT, gvT, pe_parts, dratio);
    g.q = gq;
    // Rounded to the inputs' dtype, then transposed (the same values: rounding is elementwise; ATen's
    // 16-bit transpose is faster than its rounding copy from a transposed float32 view).
    g.k = gkT.to(k.scalar_type()).transpose(2, 3).contiguous();                   // (B, K, W+M, D)
    g.v = gvT.to(v.scalar_type()).transpose(2, 3).contiguous();
    g.key_pe = at::zeros({s.D, s.L}, key_pe.options());
    g.key_pe.narrow(1, s.L - s.W, s.W).copy_(pe_parts.sum(0));
    g.span_ratio = at::tensor(dratio, span_ratio.options().dtype(at::kDouble)).to(span_ratio.scalar_type());
    return g;
  }
  if (ct != q.scalar_type()) {  // 16-bit inputs: computed in float32, each gradient rounded once
    auto g = span_attention_backward(grad_out.to(ct), q.to(ct), k.to(ct), v.to(ct), key_pe.to(ct), span_ratio, out,
                                     p_kept, o);
    g.q = g.q.to(q.scalar_type());
    g.k = g.k.to(k.scalar_type());
    g.v = g.v.to(v.scalar_type());
    g.key_pe = g.key_pe.to(key_pe.scalar_type());
    return g;
  }
  TORCH_CHECK(p_kept.scalar_type() == ct && p_kept.is_contiguous(),
              "span_attention_backward: p was kept in another dtype or layout");
  const Shape s = shape_of(q, k, o);
  const auto masks = head_masks(span_ratio, o);
  SpanAttentionGrads g;
  g.q = at::empty({s.B, s.K, s.M, s.D}, q.options());                             // every row written once
  g.k = at::zeros({s.B, s.K, s.W + s.M, s.D}, k.options());                       // accumulated over tiles
  g.v = at::zeros({s.B, s.K, s.W + s.M, s.D}, v.options());
  auto pe_parts = at::zeros({s.K, s.D, s.W}, key_pe.options());                   // summed over heads at the end
  std::vector<double> dratio(s.K, 0.0);
  AT_DISPATCH_FLOATING_TYPES(q.scalar_type(), "span_attention_backward", [&] {
    backward_kernel<scalar_t>(grad_out, q, k, v, key_pe, masks, o, s, p_kept, g, pe_parts, dratio);
  });
  g.key_pe = at::zeros({s.D, s.L}, key_pe.options());
  g.key_pe.narrow(1, s.L - s.W, s.W).copy_(pe_parts.sum(0));
  g.span_ratio = at::tensor(dratio, span_ratio.options().dtype(at::kDouble)).to(span_ratio.scalar_type());
  return g;
}

}  // namespace spanformer::ops::cpu
