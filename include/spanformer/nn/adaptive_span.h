// Adaptive attention span (Sukhbaatar, Grave, Bojanowski, Joulin, ACL 2019, arXiv 1905.07799, sec. 3).
//
// Each head k learns span_ratio[k] in [0, 1]; its span is z_k = span_ratio[k] * L. Attention weights at
// distance d in [1, L] are multiplied by the soft mask
//     m_z(d) = clamp((R + z - (d - 1)) / R, 0, 1)                                   (paper eq. 6)
// and renormalised: a / (sum a + 1e-8). The span loss  coeff * L * mean_k(span_ratio)  pushes spans down.
//
// Layout convention shared with the attention layer: a score row holds the last W distances with
// column j standing for distance W - j (so the rightmost column is distance 1, the previous token).
//
// Compute follows the spans: with S = min(L, ceil(max_k z_k) + R) the layer only needs the last
//     L' = L - trim_len,   trim_len = 64 * floor(min(L - 1, L - S) / 64)
// keys, and its cache keeps min(L, L' + 64) states (64 spare for spans that grow before the next trim).
// These host-side sizes come from a copy of max_k span_ratio that sync_host() refreshes (once per
// optimizer step, for all layers at once through TransformerSeq::sync_spans): no host synchronisation
// inside a forward pass.
//
// Invariant: after every optimizer step, clamp_() keeps span_ratio in [0, 1].
#pragma once
#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include <vector>

namespace spanformer::nn {

struct AdaptiveSpanOptions {
  AdaptiveSpanOptions(int64_t attn_span, int64_t nb_heads) : attn_span_(attn_span), nb_heads_(nb_heads) {}
  TORCH_ARG(int64_t, attn_span);        // L, the largest span a head may learn
  TORCH_ARG(int64_t, nb_heads);         // K, one span per head
  TORCH_ARG(int64_t, ramp) = 32;        // R, the paper's ramp width (32 in every experiment)
  TORCH_ARG(double, init) = 0.0;        // initial span_ratio: the reference starts all spans at 0
  TORCH_ARG(double, loss_coeff) = 0.0;  // span-loss coefficient (2e-6 small, 5e-7 base models)
  TORCH_ARG(bool, adapt_cache) = true;  // shrink the cache with the spans
};

class AdaptiveSpanImpl : public torch::nn::Module {
 public:
  explicit AdaptiveSpanImpl(AdaptiveSpanOptions options);

  // Soft mask m_z(d) at distances d (any shape S, the parameter's dtype; 1 = the nearest key) -> (K, S).
  // The one home of the formula.
  // With head >= 0: that head's mask only, shape S.
  torch::Tensor mask_at(const torch::Tensor& distance, int64_t head = -1) const;
  // The masks of heads `heads` (int64 indices) only: (|heads|, S).
  torch::Tensor mask_at(const torch::Tensor& distance, const torch::Tensor& heads) const;
  // Soft mask over the last `width` distances: (K, 1, width), column j = distance width - j.
  torch::Tensor mask(int64_t width) const;

  // attn: (B, K, M, W) probabilities over the last W distances. Multiplies by the mask and, when
  // `normalize`, divides each row by its sum + 1e-8.
  torch::Tensor forward(const torch::Tensor& attn, bool normalize = true) const;
  // attn (B, K, M, N) probabilities at distances (M, N) (any layout, e.g. Transformer-XL's key order):
  // masked and renormalised the same way. With head >= 0, attn (B, M, N) is that head's.
  torch::Tensor forward_at(const torch::Tensor& attn, const torch::Tensor& distance, int64_t head = -1) const;

  // Span-loss term: loss_coeff * L * mean(span_ratio) (a 0-dim tensor).
  torch::Tensor loss() const;

  // Clamp span_ratio to [0, 1] in place (after each optimizer step).
  void clamp_();

  // Host-side copy of span_ratio, from which every size below is computed; refreshed by sync_host
  // (or, for all layers in one transfer, TransformerSeq::sync_spans).
  void sync_host();
  void set_host_ratios(std::vector<double> ratios);
  const std::vector<double>& host_ratios() const { return host_ratios_; }

  // Distances head h reads in a window of `window` keys: min(window, floor(z_h + R) + 1), the last one
  // where the mask reaches 0 (see ops/adaptive_span_attention.h).
  std::vector<int64_t> visited(int64_t window) const;

  int64_t max_size(bool include_ramp = true) const;  // S = clamp(ceil(max z) + R, 0, L)
  double avg_size(bool include_ramp = true) const;   // clamp(mean z + R, 0, L)
  int64_t trim_len() const;                          // keys that can be skipped
  int64_t used_span() const;                         // L' = L - trim_len: keys actually used
  int64_t cache_size() const;                        // states the cache must keep

  const AdaptiveSpanOptions& options() const { return options_; }

  torch::Tensor span_ratio;  // (K) learnable, in [0, 1]

 private:
  AdaptiveSpanOptions options_;
  std::vector<double> host_ratios_;
};
TORCH_MODULE(AdaptiveSpan);

// Reference formulas in double precision, for tests and documentation: the mask at distance d for a
// span z, and the trim length for a largest span ratio.
double span_mask_value(double z, int64_t distance, int64_t ramp);
int64_t span_trim_len(double max_ratio, int64_t attn_span, int64_t ramp);

}  // namespace spanformer::nn
