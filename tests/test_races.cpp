// Races in the CPU kernels, caught by their bits rather than by chance. Every work item of the span and
// flash kernels writes outputs of its own (src/ops/cpu/work_queue.h), and each output is summed in one
// fixed order whatever the thread that computes it, so the result of any thread count is the one-thread
// result bit for bit. Two threads adding into one buffer (a head's key_pe gradient rows given to another
// head's item, say) break that in nearly every run, even where no update is lost: the additions then
// happen in the order the threads reach them, and floating-point sums round by order. So each case runs
// once with one thread and then, repeatedly, with 2, 3 and 4 (more threads than these machines' two
// cores: the scheduler then interleaves them at random points), over many heads of unequal cost (so that
// the workers take items in a different order each time), and every output and gradient must be equal
// to the one-thread result. Forward and backward, float32 and both kinds of 16-bit products.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <string>
#include <vector>

#include "op_cases.h"
#include "ops/cpu_features.h"
#include "spanformer/ops/adaptive_span_attention.h"
#include "spanformer/ops/flash_attention.h"
#include "spanformer/util/torch_compat.h"
#include "util.h"

namespace spanformer {
namespace {

constexpr int kRepeats = 4;  // per thread count: 12 multi-threaded runs a case

// Restores the intra-op thread count at the end of a test.
class ThreadCount {
 public:
  ThreadCount() : saved_(at::get_num_threads()) {}
  ~ThreadCount() { at::set_num_threads(saved_); }

 private:
  int saved_;
};

// run() under 1 thread, then kRepeats times under 2, 3 and 4: every tensor equal to the first bit for bit.
void expect_same_bits_at_every_thread_count(const std::function<std::vector<at::Tensor>()>& run,
                                            const std::vector<std::string>& names) {
  const ThreadCount restore;
  at::set_num_threads(1);
  const auto one = run();
  for (int threads : {2, 3, 4})
    for (int r = 0; r < kRepeats; ++r) {
      at::set_num_threads(threads);
      const auto many = run();
      for (size_t i = 0; i < one.size(); ++i)
        ASSERT_TRUE(at::equal(many[i], one[i]))
            << names[i] << " with " << threads << " threads (repeat " << r << ") differs from one thread by "
            << tu::max_diff(many[i], one[i]);
    }
}

// 16-bit kinds: widened and, where this LibTorch has them, 16-bit products (in hardware or ATen's
// portable ones: both are what some CPU runs).
std::vector<ops::cpu::HalfProducts> product_kinds() {
  std::vector<ops::cpu::HalfProducts> kinds{ops::cpu::HalfProducts::widened};
  if (ops::cpu::half_products_available()) kinds.push_back(ops::cpu::HalfProducts::native);
  return kinds;
}

// 24 heads with spans from 3 to the whole window, so that items cost from almost nothing to the most.
tu::SpanCase race_span_case() {
  tu::SpanCase c{2, 24, 96, 192, 32, 192, {}, 0.0};
  for (int h = 0; h < c.K; ++h) c.spans.push_back(3.5 + (h * 37 % 24) * 8.0);
  return c;
}

std::vector<at::Tensor> span_run(const tu::SpanCase& c, at::ScalarType dtype) {
  const auto in = tu::inputs_on(tu::span_inputs(c), dtype, at::kCPU);
  const auto weights = at::randn({c.B, c.K, c.M, c.D}, at::TensorOptions().dtype(at::kDouble));
  auto out = ops::adaptive_span_attention(in[0], in[1], in[2], in[3], in[4], tu::span_options(c));
  return tu::output_and_gradients(out, in, weights);
}

const std::vector<std::string> kSpanNames{"out", "q", "k", "v", "key_pe", "span_ratio"};

TEST(Races, SpanOpGivesOneThreadsBitsAtEveryThreadCount) {
  const ops::SpanBackendOverride forced("cpu");
  auto c = race_span_case();
  expect_same_bits_at_every_thread_count([&] { return span_run(c, at::kFloat); }, kSpanNames);
  c.dropout = 0.2;  // the hashed dropout keyed by position: the same mask on every thread
  expect_same_bits_at_every_thread_count([&] { return span_run(c, at::kFloat); }, kSpanNames);
}

TEST(Races, SpanOpIn16BitsGivesOneThreadsBitsAtEveryThreadCount) {
  const ops::SpanBackendOverride forced("cpu");
  const auto c = race_span_case();
  for (auto kind : product_kinds()) {
    const ops::cpu::HalfProductsOverride products(kind);
    for (auto dtype : {at::kBFloat16, at::kHalf}) {
      if (dtype == at::kHalf && !SPANFORMER_HAS_CPU_HALF_MATMUL) continue;  // LibTorch 1.13: no float16 CPU ops
      SCOPED_TRACE(std::string(c10::toString(dtype)) + (kind == ops::cpu::HalfProducts::native ? " 16-bit products" : " widened"));
      expect_same_bits_at_every_thread_count([&] { return span_run(c, dtype); }, kSpanNames);
    }
  }
}

std::vector<at::Tensor> flash_run(const tu::FlashCase& c, at::ScalarType dtype) {
  at::manual_seed(3);
  const auto o64 = at::TensorOptions().dtype(at::kDouble);
  const tu::Inputs base{at::randn({c.B, c.K, c.N, c.D}, o64), at::randn({c.B, c.K, c.C, c.D}, o64),
                        at::randn({c.B, c.K, c.C, c.D}, o64)};
  const auto in = tu::inputs_on(base, dtype, at::kCPU);
  const auto weights = at::randn({c.B, c.K, c.N, c.D}, o64);
  auto out = ops::flash_attention(in[0], in[1], in[2], tu::flash_options(c));
  return tu::output_and_gradients(out, in, weights);
}

TEST(Races, FlashOpGivesOneThreadsBitsAtEveryThreadCount) {
  const ops::FlashBackendOverride forced("cpu");
  // Causal over 40 cached keys (rows of unequal cost), 20 heads, tiles of 32: many items a head.
  tu::FlashCase c{2, 20, 160, 200, 32, 0, 0.0, 32};
  for (double dropout : {0.0, 0.2}) {
    c.dropout = dropout;
    expect_same_bits_at_every_thread_count([&] { return flash_run(c, at::kFloat); }, {"out", "q", "k", "v"});
    for (auto kind : product_kinds()) {
      const ops::cpu::HalfProductsOverride products(kind);
      SCOPED_TRACE(kind == ops::cpu::HalfProducts::native ? "bf16, 16-bit products" : "bf16, widened");
      expect_same_bits_at_every_thread_count([&] { return flash_run(c, at::kBFloat16); }, {"out", "q", "k", "v"});
    }
  }
}

}  // namespace
}  // namespace spanformer
