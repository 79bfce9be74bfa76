// One forward + backward of one causal attention pattern (attention/causal_attention.h) at one length,
// as a separate process per point so that its peak RSS is that point's: the sweep in
// bench/causal_sweep.sh runs it over patterns and T and fits time ~ T^alpha.
//   ./build/bench/bench_causal PATTERN T [IMPL] [REPEATS] [FLASH_TILE] [SPAN_GROUPS]
//   PATTERN: dense | flash | window | adaptive_span | sparse_strided | sparse_fixed | lsh;
//   IMPL: plain | fused | auto; SPAN_GROUPS (adaptive span, fused): 0 the cheapest cut of the heads
//   by band (default), 1 every head in one group reaching the largest span
// Shapes: B 1, K 8, D 64, float32; window 256; adaptive span with the bimodal layout
// (3 of 4 heads z in [16, 256], 1 of 4 in [2048, T]); sparse l = round(sqrt(T)), c = 8, merged; lsh
// 2 rounds, chunk 64, T / 64 buckets, shared query/keys (k = q).
// Prints: pattern, impl, T, median ms of REPEATS runs (after one warm-up), peak RSS in MB.
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "spanformer/attention/causal_attention.h"
#include "spanformer/nn/adaptive_span.h"
#include "spanformer/util/runtime.h"

using namespace spanformer;

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: bench_causal PATTERN T [plain|fused|auto] [REPEATS]\n");
    return 2;
  }
  try {
    const auto kind = attention::parse_causal_kind(argv[1]);
    const int64_t T = std::stoll(argv[2]), B = 1, K = 8, D = 64;
    const auto impl = argc > 3 ? attention::parse_attn_impl(argv[3]) : attention::AttnImpl::kAuto;
    const int repeats = argc > 4 ? std::stoi(argv[4]) : 3;
    set_threads(0);
    keep_freed_memory();  // as the CLI does: large blocks reused, not mapped afresh each call
    torch::manual_seed(1);
    nn::AdaptiveSpan span(nn::AdaptiveSpanOptions(T, K).ramp(32));
    {
      torch::NoGradGuard no_grad;
      std::mt19937 rng(1);
      for (int64_t h = 0; h < K; ++h) {
        const double z = h % 4 == 3 ? std::uniform_real_distribution<double>(std::min<double>(2048, T), T)(rng)
                                    : std::uniform_real_distribution<double>(16, std::min<double>(256, T))(rng);
        span->span_ratio[h] = z / static_cast<double>(T);
      }
      span->sync_host();
    }
    attention::CausalSpec spec;
    spec.kind = kind;
    spec.window = 256;
    spec.span = span.get();
    spec.stride = std::max<int64_t>(1, std::llround(std::sqrt(static_cast<double>(T))));
    spec.summary = std::min<int64_t>(8, spec.stride);
    spec.heads = K;
    if (argc > 5) spec.flash_tile = std::stoll(argv[5]);
    if (argc > 6) spec.span_groups = std::stoll(argv[6]);
    spec.lsh_rounds = 2;
    spec.lsh_chunk = 64;
    spec.lsh_buckets = std::max<int64_t>(2, T / 64 / 2 * 2);
    auto q = torch::randn({B, K, T, D}).requires_grad_();
    auto k = torch::randn({B, K, T, D}).requires_grad_();
    auto v = torch::randn({B, K, T, D}).requires_grad_();
    std::vector<double> times;
    for (int i = 0; i <= repeats; ++i) {
      const double t0 = now_seconds();
      auto out = attention::causal_attention(q, kind == attention::CausalKind::kLsh ? q : k, v, spec, impl);  // (B, K, T, D)
      out.sum().backward();
      const double dt = now_seconds() - t0;
      if (i > 0) times.push_back(dt);
      q.mutable_grad().reset();
      k.mutable_grad().reset();
      v.mutable_grad().reset();
    }
    std::sort(times.begin(), times.end());
    std::printf("%s %s %lld %.1f ms %.0f MB\n", argv[1], attention::attn_impl_name(impl), static_cast<long long>(T),
                times[times.size() / 2] * 1e3, peak_rss_bytes() / 1e6);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_causal: %s\n", e.what());
    return 1;
  }
  return 0;
}
