// Google Benchmark: adaptive-span attention, forward + backward, fused op vs the plain
// reference-semantics path, over B, K x D, M, L and four span distributions per head:
//   at_L      every head at L
//   equal     every head at s (here 256)
//   loguni    log-uniform in [16, L] (fixed seed)
//   bimodal   75% of heads <= 256 (uniform 16..256), 25% in [2048, L]
// Useful FLOP/s counts 4*B*M*D*sum_h(S_h) for the two products + 2*B*M*D*sum_h(S_h) for the position
// term, S_h = min(L, z_h + R) the keys a head needs; x3 for forward + backward.
//   ./build/bench/bench_attention --benchmark_filter='B:1/K:8/D:64/M:512/L:8192/.*bimodal'
#include <benchmark/benchmark.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <random>

#include "spanformer/attention/seq_attention.h"
#include "spanformer/util/runtime.h"

using spanformer::attention::SeqAttention;
using spanformer::attention::SeqAttentionOptions;

namespace {

enum Spread { kAtL, kEqual, kLogUniform, kBimodal };
const char* kSpreadNames[] = {"at_L", "equal256", "loguni", "bimodal"};

std::vector<double> spans_for(Spread spread, int64_t K, int64_t L) {
  std::mt19937 rng(1);
  std::vector<double> z;
  for (int64_t h = 0; h < K; ++h) {
    switch (spread) {
      case kAtL: z.push_back(static_cast<double>(L)); break;
      case kEqual: z.push_back(std::min<double>(256, L)); break;
      case kLogUniform: z.push_back(std::exp(std::uniform_real_distribution<double>(std::log(16.0), std::log(double(L)))(rng))); break;
      case kBimodal:
        z.push_back(h % 4 == 3 ? std::uniform_real_distribution<double>(std::min<double>(2048, L), L)(rng)
                               : std::uniform_real_distribution<double>(16, 256)(rng));
        break;
    }
  }
  return z;
}

void run(benchmark::State& state, int64_t B, int64_t K, int64_t D, int64_t M, int64_t L, Spread spread, bool fused) {
  spanformer::set_threads(0);
  torch::manual_seed(0);
  const int64_t R = 32;
  SeqAttention attn(SeqAttentionOptions(K * D, K, L).impl(fused ? spanformer::attention::AttnImpl::kFused : spanformer::attention::AttnImpl::kPlain).adapt_span_ramp(R));
  const auto z = spans_for(spread, K, L);
  {
    torch::NoGradGuard g;
    for (int64_t h = 0; h < K; ++h) attn->span->span_ratio[h] = z[h] / static_cast<double>(L);
  }
  attn->span->sync_host();
  const int64_t W = attn->used_span();  // the layer's window, from its largest span
  auto q = torch::randn({B, K, M, D}, torch::requires_grad());
  auto k = torch::randn({B, K, W + M, D}, torch::requires_grad());
  auto v = torch::randn({B, K, W + M, D}, torch::requires_grad());
  auto key_pe = torch::randn({D, L}, torch::requires_grad());
  for (auto _ : state) {
    auto out = attn->attend(q, k, v, key_pe);
    out.sum().backward();
    benchmark::DoNotOptimize(out.data_ptr());
  }
  double needed = 0;
  for (double zh : z) needed += std::min<double>(L, zh + R);
  state.counters["useful_FLOP/s"] =
      benchmark::Counter(3.0 * 6.0 * B * M * D * needed, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["window"] = static_cast<double>(W);
}

void register_all() {
  for (int64_t B : {1, 8})
    for (auto [K, D] : std::vector<std::pair<int64_t, int64_t>>{{4, 64}, {8, 64}, {8, 96}})
      for (int64_t M : {256, 512})
        for (int64_t L : {1024, 8192})
          for (int s = 0; s < 4; ++s)
            for (bool fused : {false, true}) {
              auto name = "span_attention/B:" + std::to_string(B) + "/K:" + std::to_string(K) + "/D:" + std::to_string(D) +
                          "/M:" + std::to_string(M) + "/L:" + std::to_string(L) + "/" + kSpreadNames[s] +
                          (fused ? "/fused" : "/plain");
              benchmark::RegisterBenchmark(name.c_str(), [=](benchmark::State& st) {
                run(st, B, K, D, M, L, static_cast<Spread>(s), fused);
              })->Unit(benchmark::kMillisecond)->UseRealTime();
            }
}

}  // namespace

int main(int argc, char** argv) {
  spanformer::keep_freed_memory();  // as the CLI does (util/runtime.h)
  register_all();
  benchmark::Initialize(&argc, argv);
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
