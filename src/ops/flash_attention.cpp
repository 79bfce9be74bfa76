// Tiled online-softmax attention with its own backward (ops/flash_attention.h has the formulas).
#include "spanformer/ops/flash_attention.h"

#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/ranges.h>

#include "spanformer/ops/adaptive_span_attention.h"
#include "spanformer/util/error.h"
#include "dropout_hash.h"
#include "op_autocast.h"

namespace spanformer::ops {

#ifdef SPANFORMER_WITH_CUDA
bool flash_attention_cuda_supported(const at::Tensor& q);  // src/ops/cuda/flash_attention_cuda.cpp
at::Tensor flash_attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashOptions& o);
#endif

namespace {

struct Dims {
  int64_t B, K, N, C, D, band, offset;  // offset = C - N: the key position of query 0
};

// Key tiles of a query tile [i0, i0 + n): the diagonal tile [p0, p0 + n) first, then tiles of `tile`
// keys going back to the band's first key. Returns [j0, j1) pairs.
std::vector<std::pair<int64_t, int64_t>> key_tiles(const Dims& s, int64_t i0, int64_t n, int64_t tile) {
  const int64_t p0 = s.offset + i0, lo = std::max<int64_t>(0, p0 - s.band + 1);
  std::vector<std::pair<int64_t, int64_t>> tiles{{p0, p0 + n}};
  for (int64_t end = p0; end > lo; end -= tile) tiles.emplace_back(std::max(lo, end - tile), end);
  return tiles;
}

// Scores of queries at positions [p0, p0 + n) against keys [j0, j1) outside the pattern set to -inf;
// s (X, n, c) in place. Only tiles that cross the diagonal or the band's edge have any.
void mask_scores(at::Tensor& s, const Dims& d, int64_t p0, int64_t n, int64_t j0, int64_t j1) {
  if (j1 - 1 <= p0 && p0 + n - 1 - j0 < d.band) return;  // every pair inside
  auto opts = at::TensorOptions().dtype(at::kLong).device(s.device());
  auto qpos = at::arange(p0, p0 + n, opts).unsqueeze(1), kpos = at::arange(j0, j1, opts).unsqueeze(0);  // (n, 1), (1, c)
  s.masked_fill_((kpos > qpos) | (qpos - kpos >= d.band), -std::numeric_limits<double>::infinity());
}

// Z = keep / (1 - p) of queries [p0, p0 + n) and keys [j0, j1) for every (batch, head): (X, n, c).
at::Tensor dropout_scale(const Dims& d, uint64_t seed, double p, int64_t p0, int64_t n, int64_t j0, int64_t j1,
                         const at::TensorOptions& like) {
  const int64_t c = j1 - j0, X = d.B * d.K;
  auto keep = at::empty({X, n, c}, at::TensorOptions().dtype(at::kByte));
  uint8_t* out = keep.data_ptr<uint8_t>();
  at::parallel_for(0, X, 1, [&](int64_t begin, int64_t end) {
    for (int64_t x = begin; x < end; ++x)
      for (int64_t r = 0; r < n; ++r)
        for (int64_t j = 0; j < c; ++j) out[(x * n + r) * c + j] = dropout_keep_hash(seed, x / d.K, x % d.K, p0 + r, j0 + j, p);
  });
  return keep.to(like) * (1.0 / (1.0 - p));  // in the tensors' dtype
}

// Forward of one query tile over its key tiles: returns out (X, n, D) and L (X, n, 1).
std::pair<at::Tensor, at::Tensor> forward_tile(const at::Tensor& qs, const at::Tensor& k, const at::Tensor& v,
                                               const Dims& d, const FlashOptions& o, int64_t i0, int64_t n) {
  const bool drop = o.training && o.dropout > 0;
  const int64_t p0 = d.offset + i0;
  auto qt = qs.narrow(1, i0, n);                                                     // (X, n, D)
  auto m = at::full({qt.size(0), n, 1}, -std::numeric_limits<double>::infinity(), qt.options());  // (X, n, 1)
  auto l = at::zeros_like(m);                                                        // (X, n, 1)
  auto acc = at::zeros_like(qt);                                                     // (X, n, D)
  for (auto [j0, j1] : key_tiles(d, i0, n, o.tile)) {
    auto s = at::bmm(qt, k.narrow(1, j0, j1 - j0).transpose(1, 2));  // (X, n, c)
    mask_scores(s, d, p0, n, j0, j1);
    auto m_new = at::maximum(m, std::get<0>(s.max(-1, /*keepdim=*/true)));  // (X, n, 1), finite
    auto e = (s - m_new).exp_();                                            // (X, n, c)
    auto alpha = (m - m_new).exp_();                                        // (X, n, 1)
    l = l * alpha + e.sum(-1, /*keepdim=*/true);
    if (drop) e.mul_(dropout_scale(d, o.seed, o.dropout, p0, n, j0, j1, e.options()));
    acc = at::baddbmm(acc * alpha, e, v.narrow(1, j0, j1 - j0));  // (X, n, D)
    m = m_new;
  }
  return {acc / l, m + l.log()};
}

// Backward of one query tile: adds its share to dq (rows of the tile), dk and dv (key rows it read).
void backward_tile(const at::Tensor& qs, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                   const at::Tensor& dout, const at::Tensor& lse, const at::Tensor& delta, at::Tensor& dq,
                   at::Tensor& dk, at::Tensor& dv, const Dims& d, const FlashOptions& o, int64_t i0, int64_t n,
                   double scale) {
  const bool drop = o.training && o.dropout > 0;
  const int64_t p0 = d.offset + i0;
  auto qt = qs.narrow(1, i0, n), qraw = q.narrow(1, i0, n), dot = dout.narrow(1, i0, n);  // (X, n, D)
  auto lt = lse.narrow(1, i0, n), dt = delta.narrow(1, i0, n);                            // (X, n, 1)
  auto dqt = dq.narrow(1, i0, n);                                                         // (X, n, D)
  for (auto [j0, j1] : key_tiles(d, i0, n, o.tile)) {
    const int64_t c = j1 - j0;
    auto ku = k.narrow(1, j0, c), vu = v.narrow(1, j0, c);  // (X, c, D)
    auto s = at::bmm(qt, ku.transpose(1, 2));                // (X, n, c)
    mask_scores(s, d, p0, n, j0, j1);
    auto p = (s - lt).exp_();                                // (X, n, c): P, 0 outside the pattern
    auto dp = at::bmm(dot, vu.transpose(1, 2));              // (X, n, c): dO V^T
    if (drop) {
      auto z = dropout_scale(d, o.seed, o.dropout, p0, n, j0, j1, p.options());
      dv.narrow(1, j0, c).baddbmm_((p * z).transpose(1, 2), dot);
      dp.mul_(z);
    } else {
      dv.narrow(1, j0, c).baddbmm_(p.transpose(1, 2), dot);
    }
    auto ds = p.mul_(dp.sub_(dt));                                         // (X, n, c)
    dqt.baddbmm_(ds, ku, /*beta=*/1, /*alpha=*/scale);                     // (X, n, D)
    dk.narrow(1, j0, c).baddbmm_(ds.transpose(1, 2), qraw, 1, scale);      // (X, c, D)
  }
}

class FlashFunction : public torch::autograd::Function<FlashFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, int64_t band, double dropout, bool training, int64_t seed,
                            int64_t tile) {
    const FlashOptions o{band, dropout, training, static_cast<uint64_t>(seed), tile};
    const Dims d{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), band, k.size(2) - q.size(2)};
    const int64_t X = d.B * d.K;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d.D));
    auto q3 = q.reshape({X, d.N, d.D}), k3 = k.reshape({X, d.C, d.D}).contiguous(), v3 = v.reshape({X, d.C, d.D}).contiguous();
    auto qs = q3 * scale;                      // (X, N, D)
    auto out = at::empty_like(q3);             // (X, N, D)
    auto lse = at::empty({X, d.N, 1}, q.options());  // (X, N, 1)
    for (int64_t i0 = 0; i0 < d.N; i0 += tile) {
      const int64_t n = std::min(tile, d.N - i0);
      auto [o_t, l_t] = forward_tile(qs, k3, v3, d, o, i0, n);
      out.narrow(1, i0, n).copy_(o_t);
      lse.narrow(1, i0, n).copy_(l_t);
    }
    out = out.view(q.sizes());
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["band"] = band;
    ctx->saved_data["dropout"] = dropout;
    ctx->saved_data["training"] = training;
    ctx->saved_data["seed"] = seed;
    ctx->saved_data["tile"] = tile;
    return out;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx, torch::autograd::tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    const auto &q = saved[0], &k = saved[1], &v = saved[2], &out = saved[3], &lse = saved[4];
    const FlashOptions o{ctx->saved_data["band"].toInt(), ctx->saved_data["dropout"].toDouble(),
                         ctx->saved_data["training"].toBool(), static_cast<uint64_t>(ctx->saved_data["seed"].toInt()),
                         ctx->saved_data["tile"].toInt()};
    const Dims d{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), o.band, k.size(2) - q.size(2)};
    const int64_t X = d.B * d.K;
    const double scale = 1.0 / std::sqrt(static_cast<double>(d.D));
    auto q3 = q.reshape({X, d.N, d.D}), k3 = k.reshape({X, d.C, d.D}), v3 = v.reshape({X, d.C, d.D});
    auto dout = grads[0].reshape({X, d.N, d.D}).contiguous();                      // (X, N, D)
    auto delta = (dout * out.reshape({X, d.N, d.D})).sum(-1, /*keepdim=*/true);   // (X, N, 1)
    auto qs = q3 * scale;
    auto dq = at::zeros_like(q3), dk = at::zeros_like(k3), dv = at::zeros_like(v3);
    for (int64_t i0 = 0; i0 < d.N; i0 += o.tile)
      backward_tile(qs, q3, k3, v3, dout, lse, delta, dq, dk, dv, d, o, i0, std::min(o.tile, d.N - i0), scale);
    return {dq.view(q.sizes()), dk.view(k.sizes()), dv.view(v.sizes()), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashOptions& o) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || k.sizes() != v.sizes() || q.size(0) != k.size(0) ||
      q.size(1) != k.size(1) || q.size(3) != k.size(3) || q.size(2) > k.size(2) || q.size(2) < 1)
    fail("flash attention: q (B, K, N, D) and k, v (B, K, C, D) with C >= N >= 1 expected (got {}, {}, {})",
         fmt::join(q.sizes(), "x"), fmt::join(k.sizes(), "x"), fmt::join(v.sizes(), "x"));
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type() || k.device() != q.device() ||
      v.device() != q.device())
    fail("flash attention: q, k and v must share dtype and device");
  if (o.band < 0) fail("flash attention: band must be >= 0 (0 = dense), got {}", o.band);
  if (!(o.dropout >= 0 && o.dropout < 1)) fail("flash attention: dropout must be in [0, 1), got {}", o.dropout);
  if (o.tile < 1) fail("flash attention: tile must be >= 1, got {}", o.tile);
}

}  // namespace

at::Tensor flash_attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, FlashOptions o) {
  const OpAutocast cast(q_in);  // train.amp: the op's own compute dtype (op_autocast.h)
  const auto q = cast(q_in), k = cast(k_in), v = cast(v_in);
  check(q, k, v, o);
  if (o.band == 0 || o.band > k.size(2)) o.band = k.size(2);
  if (o.training && o.dropout > 0 && o.seed == 0) o.seed = draw_dropout_seed();
#ifdef SPANFORMER_WITH_CUDA
  if (o.cuda_kernel && q.is_cuda() && flash_attention_cuda_supported(q)) return flash_attention_cuda(q, k, v, o);
#endif
  return FlashFunction::apply(q, k, v, o.band, o.dropout, o.training, static_cast<int64_t>(o.seed), o.tile);
}

at::Tensor flash_attention_reference(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                     const FlashOptions& options) {
  const OpAutocast cast(q_in);
  const auto q = cast(q_in), k = cast(k_in), v = cast(v_in);
  check(q, k, v, options);
  FlashOptions o = options;
  if (o.band == 0 || o.band > k.size(2)) o.band = k.size(2);
  const Dims d{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), o.band, k.size(2) - q.size(2)};
  auto s = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(d.D));  // (B, K, N, C)
  auto flat = s.reshape({d.B * d.K, d.N, d.C});
  mask_scores(flat, d, d.offset, d.N, 0, d.C);
  auto p = at::softmax(flat.view(s.sizes()), -1);  // (B, K, N, C)
  if (o.training && o.dropout > 0) {
    if (o.seed == 0) fail("flash attention reference: dropout needs an explicit seed");
    p = p * dropout_scale(d, o.seed, o.dropout, d.offset, d.N, 0, d.C, p.options()).view(s.sizes());
  }
  return at::matmul(p, v);  // (B, K, N, D)
}

}  // namespace spanformer::ops
