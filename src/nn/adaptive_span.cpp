#include "spanformer/nn/adaptive_span.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "spanformer/ops/adaptive_span_attention.h"
#include "spanformer/util/torch_compat.h"

namespace spanformer::nn {

AdaptiveSpanImpl::AdaptiveSpanImpl(AdaptiveSpanOptions options) : options_(std::move(options)) {
  span_ratio = register_parameter("span_ratio", torch::full({options_.nb_heads()}, options_.init()));
  sync_host();
}

namespace {
// Computed in the parameter's dtype like the reference: (z - (d - 1)) / R + 1, clamped to [0, 1] with
// LibTorch 1.x's gradient at the ends on every build (compat::clamp_closed_gradient says why).
// z (K') spans in tokens, distance (S) -> (K', S).
torch::Tensor soft_mask(const torch::Tensor& z, const torch::Tensor& distance, double ramp) {
  std::vector<int64_t> shape{-1};
  for (int64_t i = 0; i < distance.dim(); ++i) shape.push_back(1);
  return compat::clamp_closed_gradient((z.view(shape) - (distance - 1).unsqueeze(0)) / ramp + 1.0, 0.0, 1.0);
}
}  // namespace

torch::Tensor AdaptiveSpanImpl::mask_at(const torch::Tensor& distance, int64_t head) const {
  auto z = span_ratio * static_cast<double>(options_.attn_span());  // (K)
  if (head >= 0) return soft_mask(z.narrow(0, head, 1), distance, options_.ramp()).squeeze(0);
  return soft_mask(z, distance, options_.ramp());
}

torch::Tensor AdaptiveSpanImpl::mask_at(const torch::Tensor& distance, const torch::Tensor& heads) const {
  return soft_mask(span_ratio.index_select(0, heads) * static_cast<double>(options_.attn_span()), distance, options_.ramp());
}

torch::Tensor AdaptiveSpanImpl::mask(int64_t width) const {
  const int64_t L = options_.attn_span();
  TORCH_CHECK(width >= 0 && width <= L, "span mask width ", width, " outside [0, ", L, "]");
  return mask_at(torch::arange(width, 0, -1, span_ratio.options())).unsqueeze(1);  // (K, 1, W)
}

namespace {
torch::Tensor renormalize(const torch::Tensor& masked) { return masked / (masked.sum(-1, /*keepdim=*/true) + 1e-8); }
}  // namespace

torch::Tensor AdaptiveSpanImpl::forward(const torch::Tensor& attn, bool normalize) const {
  auto masked = attn * mask(attn.size(-1));  // (B, K, M, W)
  return normalize ? renormalize(masked) : masked;
}

torch::Tensor AdaptiveSpanImpl::forward_at(const torch::Tensor& attn, const torch::Tensor& distance, int64_t head) const {
  return renormalize(attn * mask_at(distance, head).unsqueeze(0));  // (B, K, M, N) or (B, M, N)
}

torch::Tensor AdaptiveSpanImpl::loss() const {
  return options_.loss_coeff() * static_cast<double>(options_.attn_span()) * span_ratio.mean();
}

void AdaptiveSpanImpl::clamp_() {
  torch::NoGradGuard no_grad;
  span_ratio.clamp_(0.0, 1.0);
}

void AdaptiveSpanImpl::sync_host() {
  torch::NoGradGuard no_grad;
  auto host = span_ratio.detach().to(torch::kCPU, torch::kDouble).contiguous();
  set_host_ratios(std::vector<double>(host.data_ptr<double>(), host.data_ptr<double>() + host.numel()));
}

void AdaptiveSpanImpl::set_host_ratios(std::vector<double> ratios) {
  TORCH_CHECK(static_cast<int64_t>(ratios.size()) == options_.nb_heads(), "one span ratio per head expected");
  host_ratios_ = std::move(ratios);
}

std::vector<int64_t> AdaptiveSpanImpl::visited(int64_t window) const {
  std::vector<int64_t> out;
  for (double r : host_ratios_)
    out.push_back(ops::visited_distance(r * static_cast<double>(options_.attn_span()),
                                        static_cast<double>(options_.ramp()), window));
  return out;
}

int64_t AdaptiveSpanImpl::max_size(bool include_ramp) const {
  const int64_t L = options_.attn_span();
  const double max_ratio = *std::max_element(host_ratios_.begin(), host_ratios_.end());
  const double span = std::ceil(max_ratio * static_cast<double>(L)) + (include_ramp ? static_cast<double>(options_.ramp()) : 0.0);
  if (!(span < static_cast<double>(L))) return L;  // also a span far outside [0, 1] x L, or NaN (converted without overflow)
  return std::max<int64_t>(0, static_cast<int64_t>(std::max(span, 0.0)));
}

double AdaptiveSpanImpl::avg_size(bool include_ramp) const {
  const double L = static_cast<double>(options_.attn_span());
  double mean = 0;
  for (double r : host_ratios_) mean += r / static_cast<double>(host_ratios_.size());
  double size = mean * L + (include_ramp ? static_cast<double>(options_.ramp()) : 0.0);
  return std::clamp(size, 0.0, L);
}

int64_t AdaptiveSpanImpl::trim_len() const {
  const int64_t L = options_.attn_span();
  int64_t trim = std::min(L - 1, L - max_size());
  return (trim / 64) * 64;  // coarse steps keep the allocator's block sizes stable
}

int64_t AdaptiveSpanImpl::used_span() const { return options_.attn_span() - trim_len(); }

int64_t AdaptiveSpanImpl::cache_size() const {
  const int64_t L = options_.attn_span();
  if (!options_.adapt_cache()) return L;
  return std::min(L, L - trim_len() + 64);
}

double span_mask_value(double z, int64_t distance, int64_t ramp) {
  double v = (static_cast<double>(ramp) + z - static_cast<double>(distance - 1)) / static_cast<double>(ramp);
  return std::clamp(v, 0.0, 1.0);
}

int64_t span_trim_len(double max_ratio, int64_t attn_span, int64_t ramp) {
  const double span = std::ceil(max_ratio * static_cast<double>(attn_span)) + static_cast<double>(ramp);
  const int64_t S = !(span < static_cast<double>(attn_span)) ? attn_span  // NaN and huge spans too
                                                             : std::max<int64_t>(0, static_cast<int64_t>(std::max(span, 0.0)));
  int64_t trim = std::min(attn_span - 1, attn_span - S);
  return (trim / 64) * 64;
}

}  // namespace spanformer::nn
