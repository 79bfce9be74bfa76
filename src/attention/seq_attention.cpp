#include "spanformer/attention/seq_attention.h"

#include <ATen/ATen.h>
#include "spanformer/nn/dropout.h"
#include <torch/nn/functional/padding.h>

#include <cmath>

#include "spanformer/attention/record.h"
#include "spanformer/util/error.h"
#include "spanformer/util/names.h"

#include "spanformer/ops/adaptive_span_attention.h"
#include "spanformer/ops/skew.h"

namespace spanformer::attention {

namespace F = torch::nn::functional;

namespace {
// Per-head value projections only from this window on.
constexpr int64_t kPerHeadMinWindow = 512;
}  // namespace

SeqAttentionImpl::SeqAttentionImpl(SeqAttentionOptions options) : options_(std::move(options)) {
  const int64_t H = options_.hidden_size(), K = options_.nb_heads();
  TORCH_CHECK(H % K == 0, "hidden_size ", H, " not divisible by nb_heads ", K);
  const int64_t D = H / K, N = options_.pers_mem_size();
  auto linear = [&](const char* name) {
    return register_module(name, spanformer::nn::Linear(torch::nn::LinearOptions(H, H).bias(false)));
  };
  proj_query = linear("proj_query");
  proj_key = linear("proj_key");
  proj_val = linear("proj_val");
  proj_out = linear("proj_out");
  if (options_.adapt_span()) {
    span = register_module("span", nn::AdaptiveSpan(nn::AdaptiveSpanOptions(options_.attn_span(), K)
                                                        .ramp(options_.adapt_span_ramp())
                                                        .init(options_.adapt_span_init())
                                                        .loss_coeff(options_.adapt_span_loss())
                                                        .adapt_cache(options_.adapt_span_cache())));
  }
  if (N > 0) {
    // Scaled so that q . key and the value sum start at unit scale (reference persistent_memory.py).
    pers_key = register_parameter("pers_key", torch::randn({K, D, N}) / std::sqrt(static_cast<double>(D)));
    pers_val = register_parameter("pers_val", torch::randn({K, N, D}) / std::sqrt(static_cast<double>(N)));
  }
}

int64_t SeqAttentionImpl::used_span() const { return span ? span->used_span() : options_.attn_span(); }
int64_t SeqAttentionImpl::cache_size() const { return span ? span->cache_size() : options_.attn_span(); }

torch::Tensor take_last_states(const torch::Tensor& cache, int64_t width) {
  const int64_t C = cache.size(1);
  if (C >= width) return cache.narrow(1, C - width, width);
  return F::pad(cache, F::PadFuncOptions({0, 0, width - C, 0}));  // zeros on the left
}



bool SeqAttentionImpl::uses_fused_op(int64_t B, int64_t M) const {
  if (!span || options_.pers_mem_size() > 0 || WeightRecorder::active()) return false;
  switch (options_.impl()) {
    case AttnImpl::kPlain: return false;
    case AttnImpl::kFused: return true;
    case AttnImpl::kAuto: break;
  }
  return auto_rule::span_fused(span->span_ratio.device().is_cuda());  // attention/attn_impl.h
}

bool SeqAttentionImpl::uses_per_head_values(int64_t B, int64_t M) const {
  if (!uses_fused_op(B, M)) return false;
  // Only for long windows of which a quarter of the rows or more can be skipped: with equal spans of
  // 540 on bench_small the per-head products cost more than the one big product, and on short windows
  // they save little (docs/kernels.md).
  const int64_t W = used_span();
  if (W < kPerHeadMinWindow) return false;
  int64_t rows = 0;
  for (int64_t S : span->visited(W)) rows += S;
  return 4 * rows < 3 * options_.nb_heads() * W;
}

torch::Tensor SeqAttentionImpl::forward(const torch::Tensor& h, const torch::Tensor& cache,
                                        const torch::Tensor& key_pe) {
  const int64_t B = h.size(0), M = h.size(1), H = options_.hidden_size(), K = options_.nb_heads();
  const int64_t D = H / K, Lp = used_span();

  auto context = torch::cat({take_last_states(cache, Lp), h}, 1);                    // (B, L'+M, H)
  // Heads made contiguous once: every product below is then a plain batched GEMM.
  auto q = proj_query(h).view({B, M, K, D}).transpose(1, 2).contiguous();              // (B, K, M, D)
  // Keys: every row (the softmax normaliser counts every key of the window, see the op's header).
  auto k = proj_key(context).view({B, Lp + M, K, D}).transpose(1, 2).contiguous();     // (B, K, L'+M, D)
  torch::Tensor v;
  if (uses_per_head_values(B, M)) {
    // Head h projects only the S_h + M value rows the op reads (zeros elsewhere, never read).
    const auto visited = span->visited(Lp);
    std::vector<torch::Tensor> vs;
    for (int64_t hd = 0; hd < K; ++hd) {
      const int64_t S = visited[hd];
      auto rows = context.narrow(1, Lp - S, S + M);                                    // (B, S+M, H)
      auto head = torch::matmul(rows, proj_val->weight.narrow(0, hd * D, D).t());       // (B, S+M, D)
      vs.push_back(F::pad(head, F::PadFuncOptions({0, 0, Lp - S, 0})));                 // (B, L'+M, D)
    }
    v = torch::stack(vs, 1);                                                           // (B, K, L'+M, D)
  } else {
    v = proj_val(context).view({B, Lp + M, K, D}).transpose(1, 2).contiguous();        // (B, K, L'+M, D)
  }

  auto out = attend(q, k, v, key_pe);                                                  // (B, K, M, D)
  out = out.transpose(1, 2).reshape({B, M, H});                                        // (B, M, H)
  return proj_out(out);
}

torch::Tensor SeqAttentionImpl::attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                      const torch::Tensor& key_pe) {
  if (uses_fused_op(q.size(0), q.size(2))) {
    ops::SpanAttentionOptions o;
    o.attn_span = options_.attn_span();
    o.ramp = static_cast<double>(options_.adapt_span_ramp());
    o.dropout = options_.dropout();
    o.training = is_training();
    if (o.training && o.dropout > 0) o.seed = ops::draw_dropout_seed();
    o.visited = span->visited(k.size(2) - q.size(2));
    return ops::adaptive_span_attention(q, k, v, key_pe, span->span_ratio, o);
  }
  return attend_plain(q, k, v, key_pe);
}

torch::Tensor SeqAttentionImpl::attend_plain(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                            const torch::Tensor& key_pe) {
  const int64_t K = options_.nb_heads(), D = options_.hidden_size() / K, L = options_.attn_span();
  const int64_t Lp = k.size(2) - q.size(2), N = options_.pers_mem_size();
  const double sqrt_d = std::sqrt(static_cast<double>(D));
  auto scores = ops::unskew(torch::matmul(q, k.transpose(-1, -2)));                         // (B, K, M, L')
  scores = scores + torch::matmul(q, key_pe.narrow(1, L - Lp, Lp));                    // (B, K, M, L')

  torch::Tensor attn, pers_out;
  if (N == 0) {
    attn = torch::softmax(scores / sqrt_d, -1);                                       // (B, K, M, L')
    if (span) attn = span(attn);                                                       // masked, renormalised
    if (auto* recorder = WeightRecorder::active()) recorder->add_by_window(attn);
  } else {
    auto pers_scores = torch::matmul(q, pers_key.unsqueeze(0) * std::sqrt(double(D))); // (B, K, M, N)
    auto all = torch::softmax(torch::cat({scores, pers_scores}, -1) / sqrt_d, -1);      // (B, K, M, L'+N)
    attn = all.narrow(-1, 0, Lp);                                                      // (B, K, M, L')
    auto attn_pers = all.narrow(-1, Lp, N);                                            // (B, K, M, N)
    if (span) {
      attn = span->forward(attn, /*normalize=*/false);
      all = torch::cat({attn, attn_pers}, -1);
      all = all / (all.sum(-1, /*keepdim=*/true) + 1e-8);                              // joint renormalisation
      attn = all.narrow(-1, 0, Lp);
      attn_pers = all.narrow(-1, Lp, N);
    }
    if (auto* recorder = WeightRecorder::active()) recorder->add_by_window(attn);  // the context part
    attn_pers = spanformer::nn::dropout(attn_pers, options_.dropout(), is_training());
    pers_out = torch::matmul(attn_pers, pers_val.unsqueeze(0) * std::sqrt(double(N))); // (B, K, M, D)
  }
  attn = spanformer::nn::dropout(attn, options_.dropout(), is_training());

  auto out = torch::matmul(ops::skew(attn), v);                                             // (B, K, M, D)
  if (N > 0) out = out + pers_out;
  return out;
}

}  // namespace spanformer::attention
