#include "spanformer/attention/causal_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "spanformer/nn/adaptive_span.h"
#include <fmt/ranges.h>
#include "spanformer/util/error.h"

namespace spanformer::attention {

const char* causal_kind_name(CausalKind kind) {
  switch (kind) {
    case CausalKind::kDense: return "dense";
    case CausalKind::kWindow: return "window";
    case CausalKind::kAdaptiveSpan: return "adaptive_span";
  }
  return "?";
}

CausalKind parse_causal_kind(const std::string& name) {
  if (name == "dense") return CausalKind::kDense;
  if (name == "window") return CausalKind::kWindow;
  if (name == "adaptive_span") return CausalKind::kAdaptiveSpan;
  fail("attention must be dense, window or adaptive_span (got '{}')", name);
}

int64_t causal_band(const CausalSpec& spec, int64_t keys) {
  switch (spec.kind) {
    case CausalKind::kDense: return keys;
    case CausalKind::kWindow: return std::min(keys, spec.window);
    case CausalKind::kAdaptiveSpan: {
      int64_t band = 1;
      for (int64_t s : spec.span->visited(spec.span->options().attn_span())) band = std::max(band, s);
      return std::min(keys, band);
    }
  }
  return keys;
}

at::Tensor causal_weights(const CausalSpec& spec, const at::Tensor& distance) {
  auto causal = distance >= 1;  // (N, C)
  switch (spec.kind) {
    case CausalKind::kDense: return causal.to(distance.scalar_type()).unsqueeze(0);
    case CausalKind::kWindow: return (causal & (distance <= spec.window)).to(distance.scalar_type()).unsqueeze(0);
    case CausalKind::kAdaptiveSpan:  // (K, N, C); L is a hard limit as in the paper (distances 1..L)
      return spec.span->mask_at(distance) *
             (causal & (distance <= spec.span->options().attn_span())).to(distance.scalar_type());
  }
  return {};
}

namespace {

// a = m exp(s) / sum m exp(s) over the last dim. s (B, K, n, c), m (K or 1, n, c). The shift is the
// largest score among keys with m > 0 (d = 1 always qualifies); keys with m = 0 contribute 0 to the
// value and exp(min(s - shift, 30)) to m's gradient.
at::Tensor masked_softmax(const at::Tensor& s, const at::Tensor& m) {
  at::Tensor shift;
  {
    at::NoGradGuard no_grad;
    shift = at::where(m > 0, s, at::full({}, -std::numeric_limits<double>::infinity(), s.options()))
                .amax(-1, /*keepdim=*/true);  // (B, K, n, 1)
  }
  auto e = at::exp((s - shift).clamp_max(30.0)) * m;  // (B, K, n, c)
  return e / e.sum(-1, /*keepdim=*/true);
}

// Distances d (n, c) of queries [q0, q0 + n) at key positions offset + q0 + i and keys [k0, k0 + c).
at::Tensor distances(int64_t offset, int64_t q0, int64_t n, int64_t k0, int64_t c, const at::TensorOptions& options) {
  auto qpos = at::arange(offset + q0, offset + q0 + n, options).unsqueeze(1);  // (n, 1)
  auto kpos = at::arange(k0, k0 + c, options).unsqueeze(0);                    // (1, c)
  return qpos - kpos + 1;                                                      // (n, c)
}

at::Tensor attend(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& m,
                  const CausalSpec& spec) {
  auto s = at::matmul(q, k.transpose(-1, -2)) / std::sqrt(static_cast<double>(q.size(-1)));  // (B, K, n, c)
  auto a = masked_softmax(s, m);                                                            // (B, K, n, c)
  if (spec.training && spec.dropout > 0) a = at::dropout(a, spec.dropout, true);
  return at::matmul(a, v);  // (B, K, n, D)
}

// Query-key pairs the fused tiles read, as a fraction of N x C.
double fused_fraction(int64_t N, int64_t C, int64_t band) {
  double read = 0;
  for (int64_t i0 = 0; i0 < N; i0 += kQueryTile) {
    const int64_t n = std::min(kQueryTile, N - i0), last = C - N + i0 + n - 1;
    read += static_cast<double>(n) * static_cast<double>(last + 1 - std::max<int64_t>(0, C - N + i0 - band + 1));
  }
  return read / (static_cast<double>(N) * static_cast<double>(C));
}

}  // namespace

at::Tensor causal_attention_reference(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const CausalSpec& spec) {
  const int64_t N = q.size(2), C = k.size(2);
  auto d = distances(C - N, 0, N, 0, C, q.options());  // (N, C)
  return attend(q, k, v, causal_weights(spec, d), spec);
}

at::Tensor causal_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const CausalSpec& spec,
                            AttnImpl impl) {
  if (q.dim() != 4 || k.dim() != 4 || v.dim() != 4 || k.sizes() != v.sizes() || q.size(0) != k.size(0) ||
      q.size(1) != k.size(1) || q.size(3) != k.size(3) || q.size(2) > k.size(2) || q.size(2) < 1)
    fail("causal attention: q (B, K, N, D) and k, v (B, K, C, D) with C >= N >= 1 expected (got {}, {}, {})",
         fmt::join(q.sizes(), "x"), fmt::join(k.sizes(), "x"), fmt::join(v.sizes(), "x"));
  if (spec.kind == CausalKind::kWindow && spec.window < 1) fail("causal attention: window must be >= 1");
  if (spec.kind == CausalKind::kAdaptiveSpan && (!spec.span || spec.span->options().nb_heads() != q.size(1)))
    fail("causal attention: adaptive_span needs one span per head");
  const int64_t N = q.size(2), C = k.size(2), band = causal_band(spec, C);
  if (impl == AttnImpl::kPlain || (impl == AttnImpl::kAuto && fused_fraction(N, C, band) > 0.75))
    return causal_attention_reference(q, k, v, spec);
  std::vector<at::Tensor> tiles;  // (B, K, n, D) each
  for (int64_t i0 = 0; i0 < N; i0 += kQueryTile) {
    const int64_t n = std::min(kQueryTile, N - i0);
    const int64_t last = C - N + i0 + n - 1, k0 = std::max<int64_t>(0, C - N + i0 - band + 1), c = last + 1 - k0;
    auto d = distances(C - N, i0, n, k0, c, q.options());  // (n, c)
    tiles.push_back(attend(q.narrow(2, i0, n), k.narrow(2, k0, c), v.narrow(2, k0, c), causal_weights(spec, d), spec));
  }
  return tiles.size() == 1 ? tiles[0] : at::cat(tiles, 2);  // (B, K, N, D)
}

}  // namespace spanformer::attention
