#include "spanformer/attention/causal_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <fmt/ranges.h>

#include "spanformer/attention/record.h"
#include "spanformer/nn/adaptive_span.h"
#include "spanformer/nn/dropout.h"
#include "spanformer/ops/adaptive_span_attention.h"
#include "spanformer/ops/flash_attention.h"
#include "spanformer/ops/lsh_attention.h"
#include "spanformer/util/error.h"
#include "spanformer/util/names.h"
#include "spanformer/util/torch_compat.h"

namespace spanformer::attention {

constexpr auto kCausalKindNames = name_table("attention", std::pair{CausalKind::kDense, "dense"},
                                             std::pair{CausalKind::kFlash, "flash"},
                                             std::pair{CausalKind::kWindow, "window"},
                                             std::pair{CausalKind::kAdaptiveSpan, "adaptive_span"},
                                             std::pair{CausalKind::kSparseStrided, "sparse_strided"},
                                             std::pair{CausalKind::kSparseFixed, "sparse_fixed"},
                                             std::pair{CausalKind::kLsh, "lsh"});

const char* causal_kind_name(CausalKind value) { return kCausalKindNames.name(value); }
CausalKind parse_causal_kind(const std::string& name) { return kCausalKindNames.parse(name); }

constexpr auto kSparseCombineNames = name_table("sparse_combine", std::pair{SparseCombine::kMerged, "merged"},
                                                std::pair{SparseCombine::kAlternating, "alternating"},
                                                std::pair{SparseCombine::kPerHead, "per_head"});

const char* sparse_combine_name(SparseCombine value) { return kSparseCombineNames.name(value); }
SparseCombine parse_sparse_combine(const std::string& name) { return kSparseCombineNames.parse(name); }

namespace {

bool is_sparse(CausalKind kind) { return kind == CausalKind::kSparseStrided || kind == CausalKind::kSparseFixed; }

// Which components head h of this layer uses: 1, 2 or 3 (both).
int components_of(const CausalSpec& spec, int64_t h, int64_t K) {
  switch (spec.combine) {
    case SparseCombine::kMerged: return 3;
    case SparseCombine::kAlternating: return spec.layer % 2 == 0 ? 1 : 2;
    case SparseCombine::kPerHead: return h < (K + 1) / 2 ? 1 : 2;
  }
  return 3;
}

}  // namespace

int64_t causal_band(const CausalSpec& spec, int64_t keys) {
  switch (spec.kind) {
    case CausalKind::kWindow: return std::min(keys, spec.window);
    case CausalKind::kAdaptiveSpan: {
      int64_t band = 1;
      for (int64_t s : spec.span->visited(spec.span->options().attn_span())) band = std::max(band, s);
      return std::min(keys, band);
    }
    case CausalKind::kLsh: return std::min(keys, spec.lsh_rounds * spec.lsh_chunk + 1);  // at most m per round + self
    default: return keys;
  }
}

at::Tensor causal_weights(const CausalSpec& spec, const at::Tensor& qpos, const at::Tensor& kpos, at::ScalarType dtype,
                          const at::Tensor& heads) {
  auto causal = kpos <= qpos;                    // (n, c)
  switch (spec.kind) {
    case CausalKind::kLsh: fail("causal attention: lsh has no fixed pattern of weights");
    case CausalKind::kDense:
    case CausalKind::kFlash: return causal.to(dtype).unsqueeze(0);
    case CausalKind::kWindow: return (causal & (qpos - kpos < spec.window)).to(dtype).unsqueeze(0);
    case CausalKind::kAdaptiveSpan: {  // (K, n, c); L is a hard limit as in the paper (distances 1..L)
      // In the spans' dtype (float32 under mixed precision: bf16 holds integers exactly only up to 256).
      auto d = (qpos - kpos + 1).to(spec.span->span_ratio.scalar_type());
      auto m = heads.defined() ? spec.span->mask_at(d, heads) : spec.span->mask_at(d);
      return (m * (causal & (qpos - kpos < spec.span->options().attn_span())).to(m.scalar_type())).to(dtype);
    }
    case CausalKind::kSparseStrided:
    case CausalKind::kSparseFixed: {
      const int64_t l = spec.stride;
      at::Tensor a1, a2;
      if (spec.kind == CausalKind::kSparseStrided) {
        a1 = qpos - kpos < l;
        a2 = at::remainder(qpos - kpos, l) == 0;
      } else {
        a1 = at::floor_divide(qpos, l) == at::floor_divide(kpos, l);
        a2 = at::remainder(kpos, l) >= l - spec.summary;
      }
      auto self = qpos == kpos;
      auto m1 = (causal & (a1 | self)).to(dtype), m2 = (causal & (a2 | self)).to(dtype), both = (causal & (a1 | a2 | self)).to(dtype);
      if (spec.combine == SparseCombine::kMerged) return both.unsqueeze(0);
      if (spec.combine == SparseCombine::kAlternating) return (spec.layer % 2 == 0 ? m1 : m2).unsqueeze(0);
      const int64_t K = spec.heads, first = (K + 1) / 2;  // per head: heads [0, first) use A1, the rest A2
      auto rows = [](const at::Tensor& x, int64_t n) {   // (...) -> (n, ...)
        std::vector<int64_t> size{n};
        size.insert(size.end(), x.sizes().begin(), x.sizes().end());
        return x.unsqueeze(0).expand(size);
      };
      auto per_head = at::cat({rows(m1, first), rows(m2, K - first)}, 0);  // (K, ...)
      return heads.defined() ? per_head.index_select(0, heads) : per_head;
    }
  }
  return {};
}

namespace {

// a = m exp(s) / sum m exp(s) over the last dim. s (..., c), m broadcastable to s. The shift is the
// largest score among keys with m > 0 (the query itself always qualifies); keys with m = 0 contribute 0
// to the value and exp(min(s - shift, 30)) to m's gradient.
at::Tensor masked_softmax(const at::Tensor& s, const at::Tensor& m) {
  at::Tensor shift;
  {
    at::NoGradGuard no_grad;
    shift = at::where(m > 0, s, at::full({}, -std::numeric_limits<double>::infinity(), s.options()))
                .amax(-1, /*keepdim=*/true);
  }
  auto e = at::exp((s - shift).clamp_max(30.0)) * m;
  return e / e.sum(-1, /*keepdim=*/true);
}

at::Tensor positions(int64_t first, int64_t n, const at::Tensor& like) {
  return at::arange(first, first + n, like.options().dtype(at::kLong));
}

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& m,
                  const CausalSpec& spec) {
  auto s = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(q.size(-1)));  // (B, K, n, c)
  auto a = masked_softmax(s, m);                                                            // (B, K, n, c)
  if (auto* recorder = WeightRecorder::active()) recorder->add_by_position(a);  // only the reference runs then
  if (spec.training && spec.dropout > 0) a = spanformer::nn::dropout(a, spec.dropout, true);
  return at::matmul(a, v);  // (B, K, n, D)
}

// Query-key pairs the banded tiles read, as a fraction of N x C.
double band_fraction(int64_t N, int64_t C, int64_t band) {
  double read = 0;
  for (int64_t i0 = 0; i0 < N; i0 += kQueryTile) {
    const int64_t n = std::min(kQueryTile, N - i0), last = C - N + i0 + n - 1;
    read += static_cast<double>(n) * static_cast<double>(last + 1 - std::max<int64_t>(0, C - N + i0 - band + 1));
  }
  return read / (static_cast<double>(N) * static_cast<double>(C));
}

// The heads of a layer in groups that share one band of keys: one group (every head, the largest band)
// for every pattern but adaptive span, whose heads may reach very different distances (a few heads near
// L, the others a few dozen keys: docs/benchmarks.md). There heads sorted by S_h are cut into the
// contiguous groups that minimise the keys the tiles read per query, sum over groups of |G| (t + S_G)
// with t the query tile, plus a fixed 4 t per group for its gathers and launches; spec.span_groups > 0
// asks for that many groups (tests: every split is held to the same reference).
struct HeadGroup {
  std::vector<int64_t> heads;  // ascending S_h
  int64_t band;                // the group's largest S_h
};

std::vector<HeadGroup> head_groups(const CausalSpec& spec, int64_t N, int64_t C, int64_t K) {
  if (spec.kind != CausalKind::kAdaptiveSpan) {
    HeadGroup all{{}, causal_band(spec, C)};
    for (int64_t h = 0; h < K; ++h) all.heads.push_back(h);
    return {all};
  }
  const size_t n = static_cast<size_t>(K);
  std::vector<int64_t> S = spec.span->visited(spec.span->options().attn_span()), order(n);  // order: heads by S_h
  for (size_t h = 0; h < n; ++h) {
    S[h] = std::clamp<int64_t>(S[h], 1, C);
    order[h] = static_cast<int64_t>(h);
  }
  std::stable_sort(order.begin(), order.end(), [&](int64_t a, int64_t b) { return S[size_t(a)] < S[size_t(b)]; });
  auto band_of = [&](size_t j) { return S[size_t(order[j - 1])]; };  // the largest S_h of sorted heads [., j)
  const double t = static_cast<double>(std::min(kQueryTile, N));
  auto cost = [&](size_t i, size_t j) {  // sorted heads [i, j) as one group
    return static_cast<double>(j - i) * std::min(static_cast<double>(C), t + static_cast<double>(band_of(j))) + 4 * t;
  };
  // best[g][j]: the cheapest cut of the first j sorted heads into g groups; from[g][j]: its last cut.
  std::vector<std::vector<double>> best(n + 1, std::vector<double>(n + 1, std::numeric_limits<double>::infinity()));
  std::vector<std::vector<size_t>> from(n + 1, std::vector<size_t>(n + 1, 0));
  best[0][0] = 0;
  for (size_t g = 1; g <= n; ++g)
    for (size_t j = g; j <= n; ++j)
      for (size_t i = g - 1; i < j; ++i)
        if (best[g - 1][i] + cost(i, j) < best[g][j]) {
          best[g][j] = best[g - 1][i] + cost(i, j);
          from[g][j] = i;
        }
  size_t groups = spec.span_groups > 0 ? std::min(n, size_t(spec.span_groups)) : 1;
  if (spec.span_groups <= 0)
    for (size_t g = 2; g <= n; ++g)
      if (best[g][n] < best[groups][n]) groups = g;
  std::vector<HeadGroup> result(groups);
  for (size_t g = groups, j = n; g >= 1; --g) {
    const size_t i = from[g][j];
    result[g - 1] = HeadGroup{std::vector<int64_t>(order.begin() + long(i), order.begin() + long(j)), band_of(j)};
    j = i;
  }
  return result;
}

// Sparse patterns block by block (the layout of Child et al. 2019, section 5.5: the sequence as rows of
// l). Key positions form a grid, row r = positions r l .. r l + l - 1, column = position mod l. A query
// in row r (positions o .. C - 1, o = C - N) can only weigh keys in two disjoint sets:
//   near  strided: rows r - 1 and r (every key at distance < l, the query itself included)
//         fixed:   row r (its own block)
//   far   strided: the query's own column in rows 0 .. r - 2 (distances l, 2 l, ... beyond the near rows)
//         fixed:   the summary columns l - c .. l - 1 of rows 0 .. r - 1 (the earlier blocks' summaries)
// Together they hold A1 u A2 u {self} for every combination, so one masked softmax over their
// concatenation, with m from causal_weights (the one home of the rule) and 0 on grid padding, is the
// reference formula on every key that can weigh. Every query row of a batched matmul reads the same
// blocks: near rows through one strided window, the strided columns as a transposed grid (l causal
// attentions of length C / l), the summaries as one (R c)-key block. Keys per query: 2 l + C / l
// (strided), l + c C / l (fixed); other blocks are never touched.
struct SparseBlocks {
  int64_t l, R, r0, Rq, near, far;  // stride; key rows; first query row and query rows; keys per query
};
SparseBlocks sparse_blocks_of(const CausalSpec& spec, int64_t N, int64_t C) {
  SparseBlocks g{};
  g.l = spec.stride;
  g.R = (C + g.l - 1) / g.l;
  g.r0 = (C - N) / g.l;
  g.Rq = g.R - g.r0;
  const bool strided = spec.kind == CausalKind::kSparseStrided;
  g.near = strided ? 2 * g.l : g.l;
  bool far = false;  // does any head use A2 (the far keys)?
  const int64_t K = std::max<int64_t>(1, spec.heads);
  for (int64_t h = 0; h < K; ++h) far |= (components_of(spec, h, K) & 2) != 0;
  g.far = !far ? 0 : strided ? g.R : g.R * spec.summary;
  return g;
}

at::Tensor sparse_attention_blocks(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CausalSpec& spec) {
  const int64_t B = q.size(0), K = q.size(1), N = q.size(2), C = k.size(2), D = q.size(3), o = C - N;
  const auto g = sparse_blocks_of(spec, N, C);
  const int64_t l = g.l, R = g.R, r0 = g.r0, Rq = g.Rq;
  const bool strided = spec.kind == CausalKind::kSparseStrided;
  const double scale = 1.0 / std::sqrt(static_cast<double>(D));
  // One zero row before position 0 (the strided near window of row 0) and zeros after C.
  auto grid = [&](const at::Tensor& x) {  // (B, K, C, D) -> (B, K, R + 1, l, D)
    return at::constant_pad_nd(x, {0, 0, l, R * l - C}).view({B, K, R + 1, l, D});
  };
  auto kg = grid(k), vg = grid(v);                                                            // (B, K, R + 1, l, D)
  auto qg = at::constant_pad_nd(q, {0, 0, o - r0 * l, R * l - C}).view({B, K, Rq, l, D});   // (B, K, Rq, l, D)
  auto row = positions(r0, Rq, q).view({Rq, 1, 1});                                         // (Rq, 1, 1)
  auto qpos = row * l + positions(0, l, q).view({1, l, 1});                                  // (Rq, l, 1)
  auto near_rows = [&](const at::Tensor& x) {  // grid rows r (strided: r - 1 and r) -> (B, K, Rq, near, D)
    auto own = x.narrow(2, r0 + 1, Rq);
    return strided ? at::cat({x.narrow(2, r0, Rq), own}, 3) : own;
  };
  auto kn = near_rows(kg), vn = near_rows(vg);                                          // (B, K, Rq, near, D)
  auto npos = row * l - (strided ? l : 0) + positions(0, g.near, q).view({1, 1, g.near});  // (Rq, 1, near)
  auto nreal = ((npos >= 0) & (npos < C)) | ((qpos >= C) & (npos == qpos));  // a padded query reads itself
  auto s = at::matmul(qg, kn.transpose(-1, -2)).mul(scale);                                   // (B, K, Rq, l, near)
  auto m = causal_weights(spec, qpos, npos, q.scalar_type()) * nreal.to(q.scalar_type());     // (K or 1, Rq, l, near)
  at::Tensor kf, vf;  // far keys: strided (B, K, l, R, D), the grid's columns; fixed (B, K, R c, D)
  if (g.far > 0) {
    at::Tensor fpos, freal;
    if (strided) {
      kf = kg.narrow(2, 1, R).transpose(2, 3);
      vf = vg.narrow(2, 1, R).transpose(2, 3);
      fpos = positions(0, R, q).view({1, 1, R}) * l + positions(0, l, q).view({1, l, 1});  // (1, l, R)
      freal = (fpos < (row - 1) * l) & (fpos < C);                                          // rows <= r - 2
      s = at::cat({s, at::matmul(qg.transpose(2, 3), kf.transpose(-1, -2)).mul(scale).transpose(2, 3)}, -1);
    } else {
      const int64_t c = spec.summary;
      kf = kg.narrow(2, 1, R).narrow(3, l - c, c).reshape({B, K, R * c, D});
      vf = vg.narrow(2, 1, R).narrow(3, l - c, c).reshape({B, K, R * c, D});
      fpos = (positions(0, R, q).view({R, 1}) * l + (l - c) + positions(0, c, q).view({1, c})).view({1, 1, R * c});
      freal = (fpos < row * l) & (fpos < C);                                                // rows <= r - 1
      s = at::cat({s, at::matmul(qg.reshape({B, K, Rq * l, D}), kf.transpose(-1, -2)).mul(scale).view({B, K, Rq, l, R * c})}, -1);
    }
    m = at::cat({m, causal_weights(spec, qpos, fpos, q.scalar_type()) * freal.to(q.scalar_type())}, -1);  // (K or 1, Rq, l, near + far)
  }
  auto a = masked_softmax(s, m);                                                              // (B, K, Rq, l, near + far)
  if (spec.training && spec.dropout > 0) a = spanformer::nn::dropout(a, spec.dropout, true);
  auto out = at::matmul(a.narrow(-1, 0, g.near), vn);                                         // (B, K, Rq, l, D)
  if (g.far > 0) {
    auto af = a.narrow(-1, g.near, g.far);                                                    // (B, K, Rq, l, far)
    out = out + (strided ? at::matmul(af.transpose(2, 3), vf).transpose(2, 3)
                         : at::matmul(af.reshape({B, K, Rq * l, g.far}), vf).view({B, K, Rq, l, D}));
  }
  return out.reshape({B, K, Rq * l, D}).narrow(2, o - r0 * l, N);                            // (B, K, N, D)
}
}  // namespace

at::Tensor causal_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const CausalSpec& spec) {
  const int64_t N = q.size(2), C = k.size(2);
  auto m = causal_weights(spec, positions(C - N, N, q).unsqueeze(1), positions(0, C, q).unsqueeze(0), q.scalar_type());
  return attend(q, k, v, m, spec);  // m (K or 1, N, C)
}

at::Tensor causal_attention_at(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& at,
                               const CausalSpec& spec) {
  if (q.dim() != 4 || q.size(2) != 1 || k.dim() != 4 || k.sizes() != v.sizes() || q.size(0) != k.size(0) ||
      q.size(1) != k.size(1) || q.size(3) != k.size(3) || at.numel() != 1 || at.scalar_type() != at::kLong)
    fail("causal attention at a position: q (B, K, 1, D), k, v (B, K, T, D) and one int64 position expected "
         "(got {}, {}, {}, {} of {})", fmt::join(q.sizes(), "x"), fmt::join(k.sizes(), "x"), fmt::join(v.sizes(), "x"),
         at.numel(), c10::toString(at.scalar_type()));
  if (spec.kind == CausalKind::kLsh) fail("causal attention at a position: lsh attention has no fixed pattern of weights");
  auto m = causal_weights(spec, at.view({1, 1}), positions(0, k.size(2), q).unsqueeze(0), q.scalar_type());  // (K or 1, 1, T)
  return attend(q, k, v, m, spec);  // (B, K, 1, D)
}

namespace {

// The banded tiles for one band: the heads of q, k, v (B, K', ., D) are `heads` of the layer (undefined:
// all of them), whose rows of the pattern's weights they take.
at::Tensor banded_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CausalSpec& spec,
                            int64_t band, const at::Tensor& heads) {
  const int64_t N = q.size(2), C = k.size(2), K = q.size(1);
  std::vector<at::Tensor> tiles;  // (B, K, n, D) each
  if (4 * band > C) {  // a wide band (a head reaching most of the keys): tiles one by one, each from key 0 up
    for (int64_t i0 = 0; i0 < N; i0 += kQueryTile) {
      const int64_t n = std::min(kQueryTile, N - i0);
      const int64_t last = C - N + i0 + n - 1, k0 = std::max<int64_t>(0, C - N + i0 - band + 1), c = last + 1 - k0;
      auto m = causal_weights(spec, positions(C - N + i0, n, q).unsqueeze(1), positions(k0, c, q).unsqueeze(0),
                              q.scalar_type(), heads);  // (K or 1, n, c)
      tiles.push_back(attend(q.narrow(2, i0, n), k.narrow(2, k0, c), v.narrow(2, k0, c), m, spec));
    }
    return tiles.size() == 1 ? tiles[0] : at::cat(tiles, 2);  // (B, K, N, D)
  }
  // A narrow band: all query tiles at once. Tile i (queries o + i t .. o + i t + t - 1, o = C - N) reads the c = t + band - 1
  // keys from o + i t - band + 1, one strided window of k and v each (unfold), so forward and backward
  // stay linear in N (one slice per tile gives each tile's backward a gradient the size of k: T / 64
  // full-size gradients, which made the window's backward quadratic beyond 8k tokens).
  // Keys outside [0, C) are zero padding with weight 0; padded queries (past N) read their own padded
  // key, so no row is empty, and are cut off at the end.
  const int64_t B = q.size(0), D = q.size(3), t = std::min(kQueryTile, N), nt = (N + t - 1) / t, c = t + band - 1;
  const int64_t o = C - N, left = std::max<int64_t>(0, band - 1 - o), right = nt * t - N;
  const int64_t start = o - band + 1 + left;  // first key of tile 0 in the padded keys
  auto windows = [&](const at::Tensor& x) {  // (B, K, C, D) -> (B, K, nt, D, c)
    return at::constant_pad_nd(x, {0, 0, left, right}).narrow(2, start, (nt - 1) * t + c).unfold(2, c, t);
  };
  auto qt = at::constant_pad_nd(q, {0, 0, 0, right}).reshape({B, K, nt, t, D});  // (B, K, nt, t, D)
  auto tile0 = positions(0, nt, q).mul(t).view({nt, 1, 1}) + o;                      // (nt, 1, 1)
  auto qpos = tile0 + positions(0, t, q).view({1, t, 1});                            // (nt, t, 1)
  auto kpos = tile0 - band + 1 + positions(0, c, q).view({1, 1, c});                 // (nt, 1, c)
  auto real = ((kpos >= 0) & (kpos < C)) | ((qpos >= C) & (kpos == qpos));         // (nt, t, c)
  auto m = causal_weights(spec, qpos, kpos, q.scalar_type(), heads) * real.to(q.scalar_type());  // (K or 1, nt, t, c)
  auto out = attend(qt, windows(k).transpose(-1, -2), windows(v).transpose(-1, -2), m, spec);  // (B, K, nt, t, D)
  return out.reshape({B, K, nt * t, D}).narrow(2, 0, N);                             // (B, K, N, D)
}

}  // namespace

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CausalSpec& spec,
                            AttnImpl impl) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || k.sizes() != v.sizes() || q.size(0) != k.size(0) ||
      q.size(1) != k.size(1) || q.size(3) != k.size(3) || q.size(2) > k.size(2) || q.size(2) < 1)
    fail("causal attention: q (B, K, N, D) and k, v (B, K, C, D) with C >= N >= 1 expected (got {}, {}, {})",
         fmt::join(q.sizes(), "x"), fmt::join(k.sizes(), "x"), fmt::join(v.sizes(), "x"));
  if (spec.kind == CausalKind::kWindow && spec.window < 1) fail("causal attention: window must be >= 1");
  if (spec.kind == CausalKind::kAdaptiveSpan && (!spec.span || spec.span->options().nb_heads() != q.size(1)))
    fail("causal attention: adaptive_span needs one span per head");
  if (is_sparse(spec.kind) && (spec.stride < 1 || spec.summary < 1 || spec.summary > spec.stride ||
                               (spec.combine == SparseCombine::kPerHead && spec.heads != q.size(1))))
    fail("causal attention: sparse patterns need stride >= 1, 1 <= summary <= stride and, per head, one pattern per head");
  const int64_t N = q.size(2), C = k.size(2), K = q.size(1);
  if (WeightRecorder::active()) {  // the whole weight matrix: the reference composition (flash is dense's)
    if (spec.kind == CausalKind::kLsh)
      fail("attention weights: lsh attention has no one weight matrix (each hashing round reads its own buckets)");
    CausalSpec plain = spec;
    if (plain.kind == CausalKind::kFlash) plain.kind = CausalKind::kDense;
    return causal_attention_reference(q, k, v, plain);
  }
  // Dense, flash and sliding-window attention on the CPU under auto and fused: the flash op's fused CPU
  // kernel, the window as its band (auto_rule::cpu_flash).
  const bool banded_kind = spec.kind == CausalKind::kDense || spec.kind == CausalKind::kFlash || spec.kind == CausalKind::kWindow;
  if (banded_kind && impl != AttnImpl::kPlain && auto_rule::cpu_flash(q.is_cuda())) {
    ops::FlashOptions o;
    o.band = spec.kind == CausalKind::kWindow ? std::min(C, spec.window) : 0;
    o.tile = spec.flash_tile;
    o.dropout = spec.dropout;
    o.training = spec.training;
    if (o.training && o.dropout > 0) o.seed = ops::draw_dropout_seed();
    return ops::flash_attention(q, k, v, o);  // (B, K, N, D)
  }
  // Dense and flash (the same formula) under auto: PyTorch's fused kernel where it computes it, measured
  // faster than our dense composition and the flash op's tiles on the CPU and on CUDA (docs/benchmarks.md,
  // docs/kernels.md); fused and plain run ours below.
  if (impl == AttnImpl::kAuto && (spec.kind == CausalKind::kDense || spec.kind == CausalKind::kFlash) &&
      auto_rule::dense_sdpa(N, C, spec.training, spec.dropout)) {
    if (auto out = compat::sdpa_causal(q, k, v); out.defined()) return out;  // (B, K, N, D)
  }
  if (spec.kind == CausalKind::kFlash) {  // the same formula as dense, its own tiles and backward
    ops::FlashOptions o;
    o.tile = spec.flash_tile;
    o.dropout = spec.dropout;
    o.training = spec.training;
    const bool half = q.scalar_type() == at::kBFloat16 || q.scalar_type() == at::kHalf;
    o.cuda_kernel = impl == AttnImpl::kFused ||  // on CUDA: the hand-written kernels, else the ATen tiles
                    (impl == AttnImpl::kAuto && auto_rule::flash_kernels(q.is_cuda(), half, q.size(3), N, C));
    if (o.training && o.dropout > 0) o.seed = ops::draw_dropout_seed();
    return impl == AttnImpl::kPlain ? ops::flash_attention_reference(q, k, v, o) : ops::flash_attention(q, k, v, o);
  }
  if (spec.kind == CausalKind::kLsh) {
    if (!k.is_same(q) || C != N) fail("causal attention: lsh needs shared query/keys (k = q) and no KV cache");
    ops::LshOptions o;
    o.chunk = spec.lsh_chunk;
    o.buckets = spec.lsh_buckets;
    o.dropout = spec.dropout;
    o.training = spec.training;
    auto rotations = ops::lsh_rotations(K, spec.lsh_rounds, q.size(3), spec.lsh_buckets, q.options());  // (K, R, D, nb / 2)
    return impl == AttnImpl::kPlain ? ops::lsh_attention_reference(q, v, rotations, o)
                                    : ops::lsh_attention(q, v, rotations, o);
  }
  if (is_sparse(spec.kind)) {  // query-key pairs the blocks read against the N x C of the plain composition
    const auto g = sparse_blocks_of(spec, N, C);
    const double blocks = static_cast<double>(g.Rq * g.l) * static_cast<double>(g.near + g.far);  // per batch row and head
    if (impl == AttnImpl::kPlain || (impl == AttnImpl::kAuto && !auto_rule::sparse_blocks(blocks, N, C)))
      return causal_attention_reference(q, k, v, spec);
    // Long inputs: query rows in (up to) four groups, each reading the keys up to its own last query
    // only, so the far blocks above a group's rows are never touched: 5/8 of the far keys one pass
    // reads, about half its memory (docs/benchmarks.md); short ones in one pass (fewer, larger ops).
    const int64_t groups = spec.sparse_groups > 0 ? spec.sparse_groups : blocks >= (1 << 21) ? 4 : 1;
    if (groups == 1) return sparse_attention_blocks(q, k, v, spec);
    const int64_t o = C - N, l = spec.stride, per = ((C - 1) / l - o / l + groups) / groups;  // rows per group
    std::vector<at::Tensor> parts;                                                  // (B, K, n, D) each
    for (int64_t first = o; first < C;) {
      const int64_t end = std::min(C, (first / l + per) * l);  // the group's queries: positions [first, end)
      parts.push_back(sparse_attention_blocks(q.narrow(2, first - o, end - first), k.narrow(2, 0, end),
                                              v.narrow(2, 0, end), spec));
      first = end;
    }
    return parts.size() == 1 ? parts[0] : at::cat(parts, 2);  // (B, K, N, D)
  }
  const auto groups = head_groups(spec, N, C, K);
  double read = 0;  // query-key pairs the tiles read, as a fraction of the plain composition's N x C per head
  for (const auto& g : groups) read += static_cast<double>(g.heads.size()) * band_fraction(N, C, g.band);
  if (impl == AttnImpl::kPlain || (impl == AttnImpl::kAuto && !auto_rule::causal_tiles(read, K)))
    return causal_attention_reference(q, k, v, spec);
  if (groups.size() == 1) return banded_attention(q, k, v, spec, groups[0].band, at::Tensor());
  // Heads in groups by band (adaptive span): each group's tiles reach its own largest span only.
  std::vector<at::Tensor> outs;  // (B, |G|, N, D) each
  std::vector<int64_t> order;    // head of each output row, in the order of outs
  for (const auto& g : groups) {
    auto index = at::tensor(g.heads, q.options().dtype(at::kLong));
    outs.push_back(banded_attention(q.index_select(1, index), k.index_select(1, index), v.index_select(1, index), spec,
                                    g.band, index));
    order.insert(order.end(), g.heads.begin(), g.heads.end());
  }
  std::vector<int64_t> inverse(order.size());
  for (size_t r = 0; r < order.size(); ++r) inverse[static_cast<size_t>(order[r])] = static_cast<int64_t>(r);
  return at::cat(outs, 1).index_select(1, at::tensor(inverse, q.options().dtype(at::kLong)));  // (B, K, N, D)
}

}  // namespace spanformer::attention
