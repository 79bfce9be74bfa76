#include "spanformer/nn/adaptive_span.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "spanformer/ops/adaptive_span_attention.h"

namespace spanformer::nn {

AdaptiveSpanImpl::AdaptiveSpanImpl(AdaptiveSpanOptions options) : options_(std::move(options)) {
  span_ratio = register_parameter("span_ratio", torch::full({options_.nb_heads()}, options_.init()));
  sync_host();
}

torch::Tensor AdaptiveSpanImpl::mask(int64_t width) const {
  const int64_t L = options_.attn_span();
  TORCH_CHECK(width >= 0 && width <= L, "span mask width ", width, " outside [0, ", L, "]");
  // template_j = -(d - 1) for distance d = width - j; computed in the parameter's dtype like the
  // reference: (template + ratio * L) / R + 1.
  auto distance_minus_one = torch::arange(width - 1, -1, -1, span_ratio.options());  // (W): d - 1
  auto z = (span_ratio * static_cast<double>(L)).view({-1, 1, 1});                  // (K, 1, 1)
  auto m = (z - distance_minus_one) / static_cast<double>(options_.ramp()) + 1.0;     // (K, 1, W)
  return m.clamp(0.0, 1.0);
}

torch::Tensor AdaptiveSpanImpl::forward(const torch::Tensor& attn, bool normalize) const {
  auto masked = attn * mask(attn.size(-1));  // (B, K, M, W)
  if (normalize) masked = masked / (masked.sum(-1, /*keepdim=*/true) + 1e-8);
  return masked;
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
  auto size = static_cast<int64_t>(std::ceil(max_ratio * static_cast<double>(L)));
  if (include_ramp) size += options_.ramp();
  return std::clamp<int64_t>(size, 0, L);
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
  int64_t S = std::clamp<int64_t>(static_cast<int64_t>(std::ceil(max_ratio * attn_span)) + ramp, 0, attn_span);
  int64_t trim = std::min(attn_span - 1, attn_span - S);
  return (trim / 64) * 64;
}

}  // namespace spanformer::nn
