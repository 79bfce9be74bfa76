// Google Benchmark: the plain (reference-semantics) adaptive-span attention layer, forward + backward,
// over span settings. The useful-FLOP count follows the kernels issue: per head, S_h keys really
// needed; 4*B*M*D*sum_h(S_h) for the two products + 2*B*M*D*sum_h(S_h) for the position term.
#include <benchmark/benchmark.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "spanformer/attention/seq_attention.h"
#include "spanformer/util/runtime.h"

using spanformer::attention::SeqAttention;
using spanformer::attention::SeqAttentionOptions;

static void BM_SeqAttentionPlain(benchmark::State& state) {
  const int64_t B = state.range(0), K = state.range(1), D = 64, M = state.range(2), L = state.range(3);
  const double span = static_cast<double>(state.range(4));
  spanformer::set_threads(0);
  torch::manual_seed(0);
  SeqAttention attn(SeqAttentionOptions(K * D, K, L).adapt_span_init(span / static_cast<double>(L)));
  auto h = torch::randn({B, M, K * D}, torch::requires_grad());
  auto cache = torch::randn({B, attn->cache_size(), K * D});
  auto key_pe = torch::randn({D, L}, torch::requires_grad());
  for (auto _ : state) {
    auto out = attn->forward(h, cache, key_pe);
    out.sum().backward();
    benchmark::DoNotOptimize(out.data_ptr());
  }
  const double needed = std::min<double>(L, span + 32) * static_cast<double>(K);
  state.counters["useful_FLOP/s"] = benchmark::Counter(6.0 * B * M * D * needed, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["keys_used"] = static_cast<double>(attn->used_span());
}
// B, K, M, L, span
BENCHMARK(BM_SeqAttentionPlain)
    ->Args({1, 8, 512, 8192, 40})
    ->Args({1, 8, 512, 8192, 1000})
    ->Args({1, 8, 512, 8192, 8192})
    ->Args({8, 4, 256, 1024, 40})
    ->Args({8, 4, 256, 1024, 540})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

BENCHMARK_MAIN();
