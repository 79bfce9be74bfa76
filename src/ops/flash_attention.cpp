// Tiled online-softmax attention with its own backward (ops/flash_attention.h has the formulas): the
// `tiles` row of src/ops/backends.h, and the flash attention operators registered with torch.library
// (`spanformer::flash_attention`, one autograd function over private forward / backward operators with
// Meta kernels, so torch.compile traces it; the C++ entry point calls the same operator).
#include <iterator>

#include "spanformer/ops/flash_attention.h"

#include <ATen/Parallel.h>
#include <ATen/core/dispatch/Dispatcher.h>
#include <torch/autograd.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/ranges.h>

#include "spanformer/ops/adaptive_span_attention.h"
#include "spanformer/util/error.h"
#include "autograd_function.h"
#include "backends.h"
#include "cpu/tile_gemm.h"
#include "dropout_hash.h"
#include "op_autocast.h"

namespace spanformer::ops {

namespace {

// The logsumexp's dtype: float32 (float64 for float64 inputs), whatever the inputs' precision.
at::ScalarType lse_dtype(at::ScalarType t) { return t == at::kDouble ? at::kDouble : at::kFloat; }

struct Dims {
  int64_t B, K, N, C, D, band, offset;  // offset = C - N: the key position of query 0
  at::Tensor first, end;                // padded batches: (X, 1, 1) int64, each (batch, head)'s keys; or undefined
};

// Dims of q (B, K, N, D) and k (B, K, C, D), with the key ranges of padded batches as (X, 1, 1).
Dims dims_of(const at::Tensor& q, const at::Tensor& k, int64_t band, const at::Tensor& key_ranges) {
  Dims d{q.size(0), q.size(1), q.size(2), k.size(2), q.size(3), band, k.size(2) - q.size(2), {}, {}};
  if (key_ranges.defined()) {
    auto r = key_ranges.to(q.device(), at::kLong).repeat_interleave(d.K, 0);  // (X, 2)
    d.first = r.select(1, 0).view({-1, 1, 1}).contiguous();
    d.end = r.select(1, 1).view({-1, 1, 1}).contiguous();
  }
  return d;
}

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
  if (!d.first.defined() && j1 - 1 <= p0 && p0 + n - 1 - j0 < d.band) return;  // every pair inside
  auto opts = at::TensorOptions().dtype(at::kLong).device(s.device());
  auto qpos = at::arange(p0, p0 + n, opts).unsqueeze(1), kpos = at::arange(j0, j1, opts).unsqueeze(0);  // (n, 1), (1, c)
  auto outside = (kpos > qpos) | (qpos - kpos >= d.band);                                            // (n, c)
  if (d.first.defined())  // keys outside [first, end), and every key of a query at or after end (right padding)
    outside = outside | (kpos < d.first) | (kpos >= d.end) | (qpos >= d.end);                        // (X, n, c)
  s.masked_fill_(outside, -std::numeric_limits<double>::infinity());
}

// A row with no key at all (padded batches) keeps a maximum of -inf: its exponentials are taken from 0
// instead, so that they are 0 rather than NaN.
at::Tensor finite_or_zero(const at::Tensor& m) { return at::where(at::isinf(m), at::zeros_like(m), m); }

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

// The sink logit of each (batch, head) as (X, 1, 1) in `like`'s dtype: sinks (K) repeated over the batch.
at::Tensor sink_rows(const at::Tensor& sinks, const Dims& d, const at::TensorOptions& like) {
  return sinks.to(like).repeat({d.B}).view({d.B * d.K, 1, 1});
}

// Forward of one query tile over its key tiles: returns out (X, n, D) and L (X, n, 1).
std::pair<at::Tensor, at::Tensor> forward_tile(const at::Tensor& qs, const at::Tensor& k, const at::Tensor& v,
                                               const Dims& d, const FlashOptions& o, int64_t i0, int64_t n) {
  const bool drop = o.training && o.dropout > 0;
  const int64_t p0 = d.offset + i0;
  auto qt = qs.narrow(1, i0, n);                                                     // (X, n, D)
  auto m = at::full({qt.size(0), n, 1}, -std::numeric_limits<double>::infinity(), qt.options());  // (X, n, 1)
  auto l = at::zeros_like(m);                                                        // (X, n, 1)
  if (o.sinks.defined()) {  // the sink's term first: the running maximum and sum start at it
    m = sink_rows(o.sinks, d, qt.options()).expand({qt.size(0), n, 1}).clone();
    l = at::ones_like(m);
  }
  auto acc = at::zeros_like(qt);                                                     // (X, n, D)
  for (auto [j0, j1] : key_tiles(d, i0, n, o.tile)) {
    auto s = at::bmm(qt, k.narrow(1, j0, j1 - j0).transpose(1, 2));  // (X, n, c)
    if (o.softcap > 0) s = s.div(o.softcap).tanh_().mul_(o.softcap);
    mask_scores(s, d, p0, n, j0, j1);
    auto m_new = at::maximum(m, std::get<0>(s.max(-1, /*keepdim=*/true)));  // (X, n, 1), finite but in padded rows
    auto m_from = d.first.defined() ? finite_or_zero(m_new) : m_new;        // (X, n, 1)
    auto e = (s - m_from).exp_();                                           // (X, n, c)
    auto alpha = (m - m_from).exp_();                                       // (X, n, 1)
    l = l * alpha + e.sum(-1, /*keepdim=*/true);
    if (drop) e.mul_(dropout_scale(d, o.seed, o.dropout, p0, n, j0, j1, e.options()));
    acc = at::baddbmm(acc * alpha, e, v.narrow(1, j0, j1 - j0));  // (X, n, D)
    m = m_new;
  }
  if (d.first.defined()) {  // rows without a key: out 0 and L = -inf (m + log l would be -inf + -inf; acc / l NaN)
    auto empty = l == 0;    // (X, n, 1)
    return {at::where(empty, at::zeros_like(acc), acc / l),
            at::where(empty, at::full_like(m, -std::numeric_limits<double>::infinity()), m + l.log())};
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
  if (d.first.defined())  // a row without a key (L = -inf) has P = 0: exp(-inf - +inf)
    lt = at::where(at::isinf(lt), at::full_like(lt, std::numeric_limits<double>::infinity()), lt);
  auto dqt = dq.narrow(1, i0, n);                                                         // (X, n, D)
  for (auto [j0, j1] : key_tiles(d, i0, n, o.tile)) {
    const int64_t c = j1 - j0;
    auto ku = k.narrow(1, j0, c), vu = v.narrow(1, j0, c);  // (X, c, D)
    auto s = at::bmm(qt, ku.transpose(1, 2));                // (X, n, c)
    at::Tensor cap_grad;                                     // (X, n, c): d capped / d s = 1 - tanh^2
    if (o.softcap > 0) {
      auto t = s.div(o.softcap).tanh_();
      cap_grad = 1 - t * t;
      s = t.mul_(o.softcap);
    }
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
    if (cap_grad.defined()) ds.mul_(cap_grad);
    dqt.baddbmm_(ds, ku, /*beta=*/1, /*alpha=*/scale);                     // (X, n, D)
    dk.narrow(1, j0, c).baddbmm_(ds.transpose(1, 2), qraw, 1, scale);      // (X, c, D)
  }
}

void check(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashOptions& o) {
  // Values of another head width than the keys (multi-head latent attention's) are named as such.
  if (q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && k.sizes().slice(0, 3) == v.sizes().slice(0, 3) &&
      q.size(3) == k.size(3) && v.size(3) != k.size(3))
    fail("flash attention: v's head width {} differs from q's and k's {}: the op takes one head width D for q, k and v "
         "(pad v to D, or split it)", v.size(3), k.size(3));
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || k.sizes() != v.sizes() || q.size(0) != k.size(0) ||
      q.size(1) != k.size(1) || q.size(3) != k.size(3) || q.size(2) > k.size(2) || q.size(2) < 1)
    fail("flash attention: q (B, K, N, D) and k, v (B, K, C, D) with C >= N >= 1 expected (got {}, {}, {})",
         fmt::join(q.sizes(), "x"), fmt::join(k.sizes(), "x"), fmt::join(v.sizes(), "x"));
  if (!q.is_floating_point())
    fail("flash attention: q, k and v must be floating point (float32, float64, bfloat16 or float16), got {}",
         c10::toString(q.scalar_type()));
  if (k.scalar_type() != q.scalar_type() || v.scalar_type() != q.scalar_type() || k.device() != q.device() ||
      v.device() != q.device())
    fail("flash attention: q, k and v must share dtype and device (got {} on {}, {} on {}, {} on {})",
         c10::toString(q.scalar_type()), q.device().str(), c10::toString(k.scalar_type()), k.device().str(),
         c10::toString(v.scalar_type()), v.device().str());
  if (o.band < 0) fail("flash attention: band must be >= 0 (0 = dense), got {}", o.band);
  if (!(o.dropout >= 0 && o.dropout < 1)) fail("flash attention: dropout must be in [0, 1), got {}", o.dropout);
  if (o.tile < 1) fail("flash attention: tile must be >= 1, got {}", o.tile);
  if (!(o.softcap >= 0 && std::isfinite(o.softcap))) fail("flash attention: softcap must be a finite number >= 0 (0 = none), got {}", o.softcap);
  if (o.key_ranges.defined() &&
      (o.key_ranges.dim() != 2 || o.key_ranges.size(0) != q.size(0) || o.key_ranges.size(1) != 2 ||
       !at::isIntegralType(o.key_ranges.scalar_type(), /*includeBool=*/false)))
    fail("flash attention: key_ranges must be (B, 2) = ({}, 2) integers, each batch row's [first, end) of keys (got {} {})",
         q.size(0), c10::toString(o.key_ranges.scalar_type()), fmt::join(o.key_ranges.sizes(), "x"));
  if (o.sinks.defined() && (o.sinks.dim() != 1 || o.sinks.size(0) != q.size(1) || !o.sinks.is_floating_point() ||
                            o.sinks.device() != q.device()))
    fail("flash attention: sinks must be one floating-point logit per head, ({}) on {} (got {} {} on {})", q.size(1),
         q.device().str(), c10::toString(o.sinks.scalar_type()), fmt::join(o.sinks.sizes(), "x"), o.sinks.device().str());
}

}  // namespace

namespace tiles {

Forward flash_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashOptions& o) {
  const Dims d = dims_of(q, k, o.band, o.key_ranges);
  const int64_t X = d.B * d.K;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.D));
  auto q3 = q.reshape({X, d.N, d.D}), k3 = k.reshape({X, d.C, d.D}).contiguous(), v3 = v.reshape({X, d.C, d.D}).contiguous();
  auto qs = q3 * scale;                                                              // (X, N, D)
  auto out = at::empty_like(q3);                                                     // (X, N, D)
  auto lse = at::empty({X, d.N, 1}, q.options().dtype(lse_dtype(q.scalar_type())));  // (X, N, 1)
  for (int64_t i0 = 0; i0 < d.N; i0 += o.tile) {
    const int64_t n = std::min(o.tile, d.N - i0);
    auto [o_t, l_t] = forward_tile(qs, k3, v3, d, o, i0, n);
    out.narrow(1, i0, n).copy_(o_t);
    lse.narrow(1, i0, n).copy_(l_t);  // widened without loss (bf16 / fp16 -> fp32)
  }
  return {out.view(q.sizes()), lse.view({d.B, d.K, d.N})};
}

FlashGrads flash_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& out, const at::Tensor& lse_in, const FlashOptions& o) {
  const Dims d = dims_of(q, k, o.band, o.key_ranges);
  const int64_t X = d.B * d.K;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d.D));
  auto q3 = q.reshape({X, d.N, d.D}), k3 = k.reshape({X, d.C, d.D}), v3 = v.reshape({X, d.C, d.D});
  auto lse = lse_in.to(q.scalar_type()).reshape({X, d.N, 1});                      // (X, N, 1), the forward's values
  auto dout = grad_out.reshape({X, d.N, d.D}).contiguous();                        // (X, N, D)
  auto delta = (dout * out.reshape({X, d.N, d.D})).sum(-1, /*keepdim=*/true);     // (X, N, 1)
  auto qs = q3 * scale;
  auto dq = at::zeros_like(q3), dk = at::zeros_like(k3), dv = at::zeros_like(v3);
  for (int64_t i0 = 0; i0 < d.N; i0 += o.tile)
    backward_tile(qs, q3, k3, v3, dout, lse, delta, dq, dk, dv, d, o, i0, std::min(o.tile, d.N - i0), scale);
  return {dq.view(q.sizes()), dk.view(k.sizes()), dv.view(v.sizes())};
}

}  // namespace tiles

// Padded batches on a row that does not read key_ranges (the CUDA kernels): each batch row's real tokens
// as a batch of one, queries at positions [max(first, C - N), end) over keys [first, end) (the causal
// keys of the last of them); the padded queries keep out 0 and L = -inf, and their keys no gradient.
namespace {
struct RowSlice {
  int64_t b, q0, n, k0, c;  // batch row; queries [q0, q0 + n); keys [k0, k0 + c)
};
std::vector<RowSlice> row_slices(const at::Tensor& key_ranges, int64_t N, int64_t C) {
  auto r = key_ranges.to(at::kCPU, at::kLong).contiguous();  // (B, 2)
  const int64_t* a = r.data_ptr<int64_t>();
  std::vector<RowSlice> rows;
  for (int64_t b = 0; b < r.size(0); ++b) {
    const int64_t first = a[2 * b], end = a[2 * b + 1], p0 = std::max(first, C - N);
    if (p0 < end) rows.push_back({b, p0 - (C - N), end - p0, first, end - first});
  }
  return rows;
}

FlashOptions slice_options(FlashOptions o, const RowSlice& r) {
  o.key_ranges = at::Tensor();
  o.band = std::min(o.band, r.c);
  return o;
}
}  // namespace

Forward flash_forward_by_rows(FlashForwardFn row, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const FlashOptions& o) {
  auto out = at::zeros_like(q);                                                                   // (B, K, N, D)
  auto lse = at::full({q.size(0), q.size(1), q.size(2)}, -std::numeric_limits<double>::infinity(),
                      q.options().dtype(lse_dtype(q.scalar_type())));                              // (B, K, N)
  for (const RowSlice& r : row_slices(o.key_ranges, q.size(2), k.size(2))) {
    auto f = row(q.narrow(0, r.b, 1).narrow(2, r.q0, r.n).contiguous(),   // (1, K, n, D)
                 k.narrow(0, r.b, 1).narrow(2, r.k0, r.c).contiguous(),   // (1, K, c, D)
                 v.narrow(0, r.b, 1).narrow(2, r.k0, r.c).contiguous(), slice_options(o, r));
    out.narrow(0, r.b, 1).narrow(2, r.q0, r.n).copy_(f.out);
    lse.narrow(0, r.b, 1).narrow(2, r.q0, r.n).copy_(f.saved);
  }
  return {out, lse};
}

FlashGrads flash_backward_by_rows(FlashBackwardFn row, const at::Tensor& grad_out, const at::Tensor& q,
                                  const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                  const at::Tensor& lse, const FlashOptions& o) {
  auto dq = at::zeros_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  for (const RowSlice& r : row_slices(o.key_ranges, q.size(2), k.size(2))) {
    auto rows = [&](const at::Tensor& t) { return t.narrow(0, r.b, 1).narrow(2, r.q0, r.n).contiguous(); };
    auto keys = [&](const at::Tensor& t) { return t.narrow(0, r.b, 1).narrow(2, r.k0, r.c).contiguous(); };
    auto g = row(rows(grad_out), rows(q), keys(k), keys(v), rows(out), rows(lse), slice_options(o, r));
    dq.narrow(0, r.b, 1).narrow(2, r.q0, r.n).copy_(g.q);
    dk.narrow(0, r.b, 1).narrow(2, r.k0, r.c).copy_(g.k);
    dv.narrow(0, r.b, 1).narrow(2, r.k0, r.c).copy_(g.v);
  }
  return {dq, dk, dv};
}

namespace {

FlashOptions flash_options(const FlashCall& c, int64_t seed) {
  FlashOptions o;
  o.band = c.band;
  o.dropout = c.dropout;
  o.training = c.training;
  o.seed = static_cast<uint64_t>(seed);
  o.tile = c.tile;
  o.cuda_kernel = c.cuda_kernel;
  o.softcap = c.softcap;
  o.sinks = c.sinks;
  o.key_ranges = c.key_ranges;
  return o;
}

using Sinks = c10::optional<at::Tensor>;  // an optional tensor: the sinks (K), the key ranges (B, 2)
using Quad = std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor>;
using FlashForwardOp = Triple(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, double, bool, int64_t,
                              int64_t, bool, double, const Sinks&, const Sinks&);
using FlashBackwardOp = Quad(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                             const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, double, bool, int64_t,
                             bool, double, const Sinks&, const Sinks&);

Sinks as_optional(const at::Tensor& t) { return t.defined() ? Sinks(t) : Sinks(); }
at::Tensor from_optional(const Sinks& t) { return t.has_value() ? *t : at::Tensor(); }

// The row whose halves are the operators `spanformer::_flash_attention_forward` / `_backward` (the CPU
// and any device: ATen tiles; CUDA: the kernels where cuda_kernel asks for them and they apply).
struct FlashDispatchedRow {
  static Triple forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashCall& c) {
    static auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("spanformer::_flash_attention_forward", "").typed<FlashForwardOp>();
    return op.call(q, k, v, c.band, c.dropout, c.training, c.seed, c.tile, c.cuda_kernel, c.softcap, as_optional(c.sinks),
                   as_optional(c.key_ranges));
  }
  static std::vector<at::Tensor> backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                          const at::Tensor& seed, const FlashCall& c) {
    static auto op =
        c10::Dispatcher::singleton().findSchemaOrThrow("spanformer::_flash_attention_backward", "").typed<FlashBackwardOp>();
    auto g = op.call(grad_out, q, k, v, out, lse, seed, c.band, c.dropout, c.training, c.tile, c.cuda_kernel, c.softcap,
                     as_optional(c.sinks), as_optional(c.key_ranges));
    return {std::get<0>(g), std::get<1>(g), std::get<2>(g), std::get<3>(g)};
  }
};

// spanformer::flash_attention (CompositeImplicitAutograd): checks once, resolves the band.
at::Tensor flash_entry(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, int64_t band,
                       double dropout, bool training, int64_t seed, int64_t tile, bool cuda_kernel, double softcap,
                       const Sinks& sinks, const Sinks& key_ranges) {
  const OpAutocast cast(q_in, cpu::half_products_native);  // train.amp: the op's own compute dtype (op_autocast.h)
  const auto q = cast(q_in), k = cast(k_in), v = cast(v_in);  // the sinks as they are (a logit each: float32)
  check(q, k, v, FlashOptions{band, dropout, training, 0, tile, cuda_kernel, softcap, from_optional(sinks),
                              from_optional(key_ranges)});
  if (band == 0 || band > k.size(2)) band = k.size(2);
  return FlashFunction<FlashDispatchedRow>::apply(q, k, v, band, dropout, training, seed, tile, cuda_kernel, softcap,
                                                  sinks.has_value(), sinks.has_value() ? *sinks : q,
                                                  key_ranges.has_value(), key_ranges.has_value() ? *key_ranges : q);
}

// ---- the backend table ----------------------------------------------------------------------------
// The op's rows in the order its kernels walk them: the first that takes the inputs runs (both halves
// ask the same question, so a backward always meets its forward's row), unless FlashBackendOverride
// names one.
//   cuda   CUDA tensors the kernels take (float32 / bfloat16 / float16, D <= 256) when cuda_kernel asks
//   cpu    CPU tensors of float32 / float64 / bfloat16 / float16: the fused kernel (cpu/flash_attention_cpu.cpp)
//   tiles  everything else: ATen tiles on any device ATen runs on
// The plain composition (flash_attention_reference) is the `plain` implementation, not a row.
struct FlashBackend {
  const char* name;
  bool (*takes)(const at::Tensor& q, bool cuda_kernel);
  bool key_ranges;  // reads FlashOptions::key_ranges itself (else flash_forward_by_rows runs it)
  Forward (*forward)(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashOptions& o);
  FlashGrads (*backward)(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& out, const at::Tensor& lse, const FlashOptions& o);
};

const FlashBackend kFlashBackends[] = {
#ifdef SPANFORMER_WITH_CUDA
    {"cuda", [](const at::Tensor& q, bool cuda_kernel) { return cuda_kernel && q.is_cuda() && cuda_glue::flash_supported(q); },
     false, &cuda_glue::flash_forward, &cuda_glue::flash_backward},
#endif
    {"cpu", [](const at::Tensor& q, bool) { return cpu::flash_supported(q); }, true, &cpu::flash_forward, &cpu::flash_backward},
    {"tiles", [](const at::Tensor&, bool) { return true; }, true, &tiles::flash_forward, &tiles::flash_backward},
};

// The row FlashBackendOverride names (an index into kFlashBackends), or -1.
std::atomic<int> forced_flash_row{-1};

// Soft-capping and sinks keep the CUDA kernels out (they compute neither; the ATen tiles do); dropout in
// a padded batch keeps the rows out that run it as batches of one (flash_forward_by_rows: each slice would hash
// its own positions).
const FlashBackend& flash_backend(const at::Tensor& q, bool cuda_kernel, const FlashOptions& o = {}) {
  const bool kernels = cuda_kernel && o.softcap == 0 && !o.sinks.defined();
  const bool ranges_in_place = o.key_ranges.defined() && o.training && o.dropout > 0;
  return pick_row(kFlashBackends, forced_flash_row, q, "flash attention",
                  [kernels, ranges_in_place](const FlashBackend& row, const at::Tensor& x) {
                    return (!ranges_in_place || row.key_ranges) && row.takes(x, kernels);
                  });
}

bool runs_padded(const FlashBackend& row, const FlashOptions& o) {
  return o.key_ranges.defined() && !row.key_ranges;
}

// A private operator's inputs, checked as the public entry checks them (a direct call from Python must
// not reach a kernel with shapes it would read past); the band is resolved there, so here it is 1 .. C.
void check_private_call(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t band, double dropout,
                        int64_t tile, double softcap, const Sinks& sinks, const Sinks& key_ranges) {
  check(q, k, v, FlashOptions{band, dropout, false, 0, tile, false, softcap, from_optional(sinks), from_optional(key_ranges)});
  if (band < 1 || band > k.size(2)) fail("flash attention: band must be in [1, C = {}] here (got {})", k.size(2), band);
  if (key_ranges.has_value()) {  // the values (one host read on CUDA): 0 <= first <= end <= C
    auto r = key_ranges->to(at::kCPU, at::kLong).contiguous();
    const int64_t* a = r.data_ptr<int64_t>();
    for (int64_t b = 0; b < r.size(0); ++b)
      if (!(0 <= a[2 * b] && a[2 * b] <= a[2 * b + 1] && a[2 * b + 1] <= k.size(2)))
        fail("flash attention: key_ranges row {} is [{}, {}): expected 0 <= first <= end <= C = {}", b, a[2 * b],
             a[2 * b + 1], k.size(2));
  }
}

Triple flash_forward_kernel(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t band, double dropout,
                            bool training, int64_t seed, int64_t tile, bool cuda_kernel, double softcap,
                            const Sinks& sinks, const Sinks& key_ranges) {
  check_private_call(q, k, v, band, dropout, tile, softcap, sinks, key_ranges);
  const int64_t used = resolve_seed(seed, training, dropout);
  const auto o = flash_options(FlashCall{band, dropout, training, seed, tile, cuda_kernel, softcap, from_optional(sinks),
                                         from_optional(key_ranges)}, used);
  const FlashBackend& row = flash_backend(q, cuda_kernel, o);
  auto f = runs_padded(row, o) ? flash_forward_by_rows(row.forward, q, k, v, o) : row.forward(q, k, v, o);
  return {f.out, f.saved, seed_tensor(used, q)};
}

// d sinks_h = -sum over the head's rows of e^{sinks_h - L_i} Dv_i, Dv_i = dO_i . out_i (every row's, in the
// logsumexp's precision); an empty tensor without sinks.
at::Tensor sink_gradient(const Sinks& sinks, const at::Tensor& grad_out, const at::Tensor& out, const at::Tensor& lse) {
  if (!sinks.has_value()) return at::empty({0}, lse.options());
  const auto acc = lse.scalar_type();
  auto delta = (grad_out.to(acc) * out.to(acc)).sum(-1);                                    // (B, K, N)
  auto p_sink = (sinks->to(acc).view({1, -1, 1}) - lse).exp();                              // (B, K, N)
  p_sink = at::where(at::isinf(lse), at::zeros_like(p_sink), p_sink);  // a padded query (L = -inf) has none
  return (p_sink * delta).sum(at::IntArrayRef{0, 2}).neg().to(sinks->scalar_type());         // (K)
}

Quad flash_backward_kernel(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                           const at::Tensor& out, const at::Tensor& lse, const at::Tensor& seed, int64_t band,
                           double dropout, bool training, int64_t tile, bool cuda_kernel, double softcap,
                           const Sinks& sinks, const Sinks& key_ranges) {
  check_private_call(q, k, v, band, dropout, tile, softcap, sinks, key_ranges);
  if (grad_out.sizes() != q.sizes() || out.sizes() != q.sizes() ||
      lse.sizes() != at::IntArrayRef{q.size(0), q.size(1), q.size(2)} || lse.scalar_type() != lse_dtype(q.scalar_type()))
    fail("flash attention backward: grad_out and out must be q's shape {} and lse (B, K, N) {} (got {}, {}, {} {})",
         fmt::join(q.sizes(), "x"), c10::toString(lse_dtype(q.scalar_type())), fmt::join(grad_out.sizes(), "x"),
         fmt::join(out.sizes(), "x"), fmt::join(lse.sizes(), "x"), c10::toString(lse.scalar_type()));
  const auto o = flash_options(FlashCall{band, dropout, training, -1, tile, cuda_kernel, softcap, from_optional(sinks),
                                         from_optional(key_ranges)},
                               seed_value(seed, training, dropout));
  const FlashBackend& row = flash_backend(q, cuda_kernel, o);
  auto g = runs_padded(row, o) ? flash_backward_by_rows(row.backward, grad_out, q, k, v, out, lse, o)
                               : row.backward(grad_out, q, k, v, out, lse, o);
  return {g.q, g.k, g.v, sink_gradient(sinks, grad_out, out, lse)};
}

Triple flash_forward_meta(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t band, double dropout,
                          bool training, int64_t seed, int64_t tile, bool cuda_kernel, double softcap,
                          const Sinks& sinks, const Sinks& key_ranges) {
  auto lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(lse_dtype(q.scalar_type())));  // (B, K, N)
  return {at::empty(q.sizes(), q.options()), lse, at::empty({}, q.options().dtype(at::kLong))};
}

Quad flash_backward_meta(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                         const at::Tensor& out, const at::Tensor& lse, const at::Tensor& seed, int64_t band,
                         double dropout, bool training, int64_t tile, bool cuda_kernel, double softcap,
                         const Sinks& sinks, const Sinks& key_ranges) {
  return {at::empty(q.sizes(), q.options()), at::empty(k.sizes(), k.options()), at::empty(v.sizes(), v.options()),
          sinks.has_value() ? at::empty(sinks->sizes(), sinks->options()) : at::empty({0}, lse.options())};
}

at::Tensor flash_reference_entry(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t band,
                                 double dropout, bool training, int64_t seed, double softcap, const Sinks& sinks,
                                 const Sinks& key_ranges) {
  FlashOptions o{band, dropout, training, static_cast<uint64_t>(resolve_seed(seed, training, dropout))};
  o.softcap = softcap;
  o.sinks = from_optional(sinks);
  o.key_ranges = from_optional(key_ranges);
  return flash_attention_reference(q, k, v, o);
}

}  // namespace
}  // namespace spanformer::ops

// The operators (torch.ops.spanformer.* from Python): the public two take the seed -1 for "draw one".
TORCH_LIBRARY_FRAGMENT(spanformer, m) {
  m.def("flash_attention(Tensor q, Tensor k, Tensor v, int band=0, float dropout=0., bool training=False, "
        "int seed=-1, int tile=256, bool cuda_kernel=True, float softcap=0., Tensor? sinks=None, "
        "Tensor? key_ranges=None) -> Tensor");
  m.def("flash_attention_reference(Tensor q, Tensor k, Tensor v, int band=0, float dropout=0., "
        "bool training=False, int seed=-1, float softcap=0., Tensor? sinks=None, Tensor? key_ranges=None) -> Tensor");
  m.def("_flash_attention_forward(Tensor q, Tensor k, Tensor v, int band, float dropout, bool training, int seed, "
        "int tile, bool cuda_kernel, float softcap, Tensor? sinks, Tensor? key_ranges) "
        "-> (Tensor out, Tensor lse, Tensor seed)");
  m.def("_flash_attention_backward(Tensor grad_out, Tensor q, Tensor k, Tensor v, Tensor out, Tensor lse, "
        "Tensor seed, int band, float dropout, bool training, int tile, bool cuda_kernel, float softcap, Tensor? sinks, "
        "Tensor? key_ranges) -> (Tensor, Tensor, Tensor, Tensor)");
}

TORCH_LIBRARY_IMPL(spanformer, CompositeImplicitAutograd, m) {
  m.impl("flash_attention", &spanformer::ops::flash_entry);
  m.impl("flash_attention_reference", &spanformer::ops::flash_reference_entry);
}

// The ATen tiles run on any device ATen runs on; the CUDA key picks the kernels where they apply.
TORCH_LIBRARY_IMPL(spanformer, CompositeExplicitAutograd, m) {
  m.impl("_flash_attention_forward", &spanformer::ops::flash_forward_kernel);
  m.impl("_flash_attention_backward", &spanformer::ops::flash_backward_kernel);
}

TORCH_LIBRARY_IMPL(spanformer, Meta, m) {
  m.impl("_flash_attention_forward", &spanformer::ops::flash_forward_meta);
  m.impl("_flash_attention_backward", &spanformer::ops::flash_backward_meta);
}

namespace spanformer::ops {

const char* flash_attention_backend(const at::Tensor& q, bool cuda_kernel) { return flash_backend(q, cuda_kernel).name; }

std::vector<std::string> flash_attention_backends() { return row_names(kFlashBackends); }

std::string cpu_half_products(const std::string& mode) {
  if (!mode.empty()) cpu::set_half_products(mode);
  return cpu::half_products_native(at::kBFloat16) ? "native" : "widened";
}

FlashBackendOverride::FlashBackendOverride(const std::string& row)
    : previous_(force_row(kFlashBackends, forced_flash_row, row, "flash attention")) {}

FlashBackendOverride::~FlashBackendOverride() { forced_flash_row.store(previous_); }

at::Tensor flash_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, FlashOptions o) {
  static auto op = c10::Dispatcher::singleton()
                       .findSchemaOrThrow("spanformer::flash_attention", "")
                       .typed<at::Tensor(const at::Tensor&, const at::Tensor&, const at::Tensor&, int64_t, double, bool,
                                         int64_t, int64_t, bool, double, const Sinks&, const Sinks&)>();
  const int64_t seed = o.seed == 0 ? -1 : static_cast<int64_t>(o.seed);  // FlashOptions: 0 = draw one
  return op.call(q, k, v, o.band, o.dropout, o.training, seed, o.tile, o.cuda_kernel, o.softcap, as_optional(o.sinks),
                 as_optional(o.key_ranges));
}

at::Tensor flash_attention_reference(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                     const FlashOptions& options) {
  const OpAutocast cast(q_in);
  const auto q = cast(q_in), k = cast(k_in), v = cast(v_in);
  check(q, k, v, options);
  FlashOptions o = options;
  if (o.band == 0 || o.band > k.size(2)) o.band = k.size(2);
  const Dims d = dims_of(q, k, o.band, o.key_ranges);
  auto s = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(d.D));  // (B, K, N, C)
  if (o.softcap > 0) s = at::tanh(s / o.softcap) * o.softcap;
  auto flat = s.reshape({d.B * d.K, d.N, d.C}).clone();
  mask_scores(flat, d, d.offset, d.N, 0, d.C);
  at::Tensor p;
  if (o.sinks.defined()) {  // the sink as one more column of every row, dropped after the softmax
    auto sink = o.sinks.to(s.scalar_type()).view({1, d.K, 1, 1}).expand({d.B, d.K, d.N, 1});  // (B, K, N, 1)
    p = at::softmax(at::cat({flat.view(s.sizes()), sink}, -1), -1).narrow(-1, 0, d.C);        // (B, K, N, C)
  } else {
    p = at::softmax(flat.view(s.sizes()), -1);  // (B, K, N, C)
  }
  if (d.first.defined()) p = at::where(at::isnan(p), at::zeros_like(p), p);  // a query without keys: 0
  if (o.training && o.dropout > 0) {
    if (o.seed == 0) fail("flash attention reference: dropout needs an explicit seed");
    p = p * dropout_scale(d, o.seed, o.dropout, d.offset, d.N, 0, d.C, p.options()).view(s.sizes());
  }
  return at::matmul(p, v);  // (B, K, N, D)
}

}  // namespace spanformer::ops
