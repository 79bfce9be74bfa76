// The CUDA kernels (src/ops/cuda/*.cu) and their LibTorch glue run on the CPU model of CUDA
// (tests/cuda_emulated/emulator.h) in every CI run, held to the double-precision reference with the measure and
// cases the GPU tests use (tests/op_cases.h): float32 within 4x, bfloat16 within 2x of the same-dtype
// composition's own error. The model runs every CUDA thread in lockstep at each barrier and shuffle, so it
// checks indexing, tiling, barriers, warp reductions, dropout streams and the backward formulas; timing
// and the fast-math intrinsics' last bits are left to the GPU (label cuda, tests/test_cuda.cpp).
// Built where the CUDA build is off (the glue's symbols are the CUDA build's own) and Boost.Context exists.
#include <gtest/gtest.h>

#include <ATen/ATen.h>

#include <array>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <set>
#include <string>
#include <vector>

#include "cuda_emulated/emulator.h"
#include "cuda_emulated/selftest.h"
#include "op_cases.h"
#include "ops/autograd_function.h"
#include "ops/backends.h"
#include "lab/lab.h"
#include "lab/step_autograd.h"
#include "spanformer/ops/step_ops.h"
#include "spanformer/util/torch_compat.h"
#include "spanformer/ops/adaptive_span_attention.h"
#include "spanformer/ops/flash_attention.h"

using namespace spanformer;
namespace selftest = spanformer::cuda_emulator::selftest;

namespace {

// The rows of the CUDA backend (src/ops/backends.h) with the glue called directly on CPU tensors, under
// the ops' own autograd functions: what the private operators do on a GPU for the cuda row.
struct EmulatedSpanRow {
  static ops::Triple forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_pe,
                             const at::Tensor& span_ratio, const ops::SpanCall& c) {
    auto o = options(span_ratio, k.size(2) - q.size(2), c, c.seed);
    auto f = ops::cuda_glue::span_attention_forward(q, k, v, key_pe, span_ratio, o, true);
    return {f.out, f.saved, ops::seed_tensor(c.seed, q)};
  }
  static std::vector<at::Tensor> backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const at::Tensor& key_pe, const at::Tensor& span_ratio,
                                          const at::Tensor& out, const at::Tensor& stats, const at::Tensor& seed,
                                          const ops::SpanCall& c) {
    auto o = options(span_ratio, k.size(2) - q.size(2), c, seed.item<int64_t>());
    auto g = ops::cuda_glue::span_attention_backward(grad_out, q, k, v, key_pe, span_ratio, out, stats, o);
    return {g.q, g.k, g.v, g.key_pe, g.span_ratio};
  }
  static ops::SpanAttentionOptions options(const at::Tensor& span_ratio, int64_t window, const ops::SpanCall& c,
                                           int64_t seed) {
    ops::SpanAttentionOptions o{c.attn_span, c.ramp, c.dropout, c.training, static_cast<uint64_t>(seed), {}};
    o.visited = ops::visited_distances(span_ratio, c.attn_span, c.ramp, window);
    return o;
  }
};

struct EmulatedFlashRow {
  static ops::Triple forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ops::FlashCall& c) {
    auto f = ops::cuda_glue::flash_forward(q, k, v, options(c, c.seed));
    return {f.out, f.saved, ops::seed_tensor(c.seed, q)};
  }
  static std::vector<at::Tensor> backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                          const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                          const at::Tensor& seed, const ops::FlashCall& c) {
    auto g = ops::cuda_glue::flash_backward(grad_out, q, k, v, out, lse, options(c, seed.item<int64_t>()));
    return {g.q, g.k, g.v};
  }
  static ops::FlashOptions options(const ops::FlashCall& c, int64_t seed) {
    return ops::FlashOptions{c.band, c.dropout, c.training, static_cast<uint64_t>(seed), c.tile, true};
  }
};

// What adaptive_span_attention does on CUDA for float32 / bfloat16 inputs.
at::Tensor emulated_span(const tu::Inputs& in, const ops::SpanAttentionOptions& o) {
  EXPECT_TRUE(ops::cuda_glue::span_attention_supported(in[0]));
  return ops::SpanAttentionFunction<EmulatedSpanRow>::apply(in[0], in[1], in[2], in[3], in[4], o.attn_span, o.ramp,
                                                            o.dropout, o.training, static_cast<int64_t>(o.seed),
                                                            std::vector<int64_t>{}, /*keep=*/true, "cuda");
}

at::Tensor emulated_flash(const tu::Inputs& in, const ops::FlashOptions& o) {
  EXPECT_TRUE(ops::cuda_glue::flash_supported(in[0]));
  const int64_t band = o.band == 0 || o.band > in[1].size(2) ? in[1].size(2) : o.band;
  return ops::FlashFunction<EmulatedFlashRow>::apply(in[0], in[1], in[2], band, o.dropout, o.training,
                                                     static_cast<int64_t>(o.seed), o.tile, true, 0.0,
                                                     /*has_sinks=*/false, in[0], /*has_ranges=*/false, in[0]);
}

}  // namespace

TEST(GpuEmulator, ShufflesVotesAndBarriersComputeWhatTheGpuComputes) {
  std::vector<long long> out;
  ASSERT_EQ(selftest::shuffles_and_barriers(out), "");
  for (long long t = 0; t < 64; ++t) {
    SCOPED_TRACE(::testing::Message() << "thread " << t);
    const long long lane = t % 32, base = t - lane;
    EXPECT_EQ(out[6 * t + 0], base + 31 - lane);                              // __shfl_sync
    EXPECT_EQ(out[6 * t + 1], t ^ 5);                                         // __shfl_xor_sync
    EXPECT_EQ(out[6 * t + 2], lane + 3 < 32 ? t + 3 : t);                     // __shfl_down_sync: own value past the end
    EXPECT_EQ(out[6 * t + 3], lane % 8 >= 2 ? t - 2 : t);                     // __shfl_up_sync within segments of 8
    EXPECT_EQ(out[6 * t + 4], 0xAAAAAAAALL);                                  // __ballot_sync of the odd lanes
    EXPECT_EQ(out[6 * t + 5], 63 * 64 / 2);                                   // warp sums through shared memory
  }
}

TEST(GpuEmulator, FailsLaunchesThatWouldHangOrReadGarbage) {
  const auto deadlock = selftest::deadlock();
  EXPECT_NE(deadlock.find("deadlock: threads 0-4 a warp op, threads 5-5 __syncthreads"), std::string::npos)
      << deadlock;
  const auto exited = selftest::exited_lane();
  EXPECT_NE(exited.find("lane 16 exited"), std::string::npos) << exited;
  std::vector<float> out;
  ASSERT_EQ(selftest::unwritten_shared(out), "");
  for (float x : out) EXPECT_TRUE(std::isnan(x)) << "dynamic shared memory is poisoned with NaN";
  ASSERT_EQ(selftest::missing_barrier(out), "");
  for (float x : out) EXPECT_TRUE(std::isnan(x)) << "a read another warp's write does not precede by a barrier";
}

// ldmatrix (device.cuh's fragment helpers): the fragments the element gathers of the PTX ISA's layouts give,
// and a misaligned row fails as on the GPU.
TEST(GpuEmulator, LdmatrixGivesTheGatheredFragments) {
  std::vector<unsigned> got, want;
  ASSERT_EQ(selftest::ldmatrix_fragments(40, got, want), "");
  EXPECT_EQ(got, want);
  EXPECT_EQ(got[0], (8u * 40 + 16) | (8u * 40 + 17) << 16) << "lane 0's first A register: m[8][16], m[8][17]";
  const auto misaligned = selftest::ldmatrix_fragments(36, got, want);
  EXPECT_NE(misaligned.find("not 16-byte aligned"), std::string::npos) << misaligned;
}

// cp.async (device.cuh's helpers): a copy lands when its thread waits for its group, not before, and the
// mistakes the hardware leaves undefined fail the launch.
TEST(GpuEmulator, AsyncCopiesLandAtTheirWait) {
  std::vector<float> in(512), out;
  for (int i = 0; i < 512; ++i) in[i] = static_cast<float>(i) + 0.5f;
  ASSERT_EQ(selftest::async_copies(0, in, out), "");
  for (int t = 0; t < 64; ++t) {
    SCOPED_TRACE(::testing::Message() << "thread " << t);
    EXPECT_TRUE(std::isnan(out[6 * t + 0])) << "read before any wait";
    EXPECT_EQ(out[6 * t + 1], in[4 * t]) << "group 0 after wait_group 1";
    EXPECT_EQ(out[6 * t + 2], 0.f) << "src-size 0 fills zeros";
    EXPECT_TRUE(std::isnan(out[6 * t + 3])) << "group 1 has not landed after wait_group 1";
    EXPECT_EQ(out[6 * t + 4], in[256 + 4 * t]) << "group 1 after wait_group 0";
    EXPECT_EQ(out[6 * t + 5], in[4 * (t ^ 1)]) << "another thread's copy after its wait and a barrier";
  }
  const auto unwaited = selftest::async_copies(1, in, out);
  EXPECT_NE(unwaited.find("exited with 3 copies it never waited for"), std::string::npos) << unwaited;
  const auto misaligned = selftest::async_copies(2, in, out);
  EXPECT_NE(misaligned.find("not aligned"), std::string::npos) << misaligned;
  const auto global = selftest::async_copies(3, in, out);
  EXPECT_NE(global.find("not in the block's shared memory"), std::string::npos) << global;
}

TEST(GpuEmulator, EnforcesTheLaunchLimits) {
  EXPECT_EQ(selftest::launch(1024, 48 * 1024, 0), "");
  EXPECT_NE(selftest::launch(1025, 0, 0), "") << "more than 1024 threads a block";
  EXPECT_NE(selftest::launch(64, 48 * 1024 + 4, 0), "") << "over 48 KiB of dynamic shared memory, limit not raised";
  EXPECT_EQ(selftest::launch(64, 100 * 1024, 100 * 1024), "") << "limit raised by cudaFuncSetAttribute";
  EXPECT_NE(selftest::launch(64, 228 * 1024, 240 * 1024), "") << "beyond sm_90's 227 KiB";
}

TEST(SpanAttentionEmulated, Float32WithinTheFloat32ReferenceError) {
  for (const auto& c : tu::span_test_cases()) {
    SCOPED_TRACE(tu::span_label(c));
    tu::expect_span_within_reference_error(c, at::kFloat, 4.0, at::kCPU, emulated_span);
  }
}

TEST(SpanAttentionEmulated, BFloat16WithinTheBFloat16ReferenceError) {
  for (const auto& c : tu::span_test_cases()) {
    SCOPED_TRACE(tu::span_label(c));
    tu::expect_span_within_reference_error(c, at::kBFloat16, 2.0, at::kCPU, emulated_span);
  }
}

// float16: the same kernels with the other 16-bit format (the tensor-core forward's f16 mma). Its
// same-dtype composition needs CPU matrix products in float16 (LibTorch 2.1 on; not on Debian's 1.13).
#if SPANFORMER_HAS_CPU_HALF_MATMUL
TEST(SpanAttentionEmulated, Float16WithinTheFloat16ReferenceError) {
  for (const auto& c : tu::span_test_cases()) {
    SCOPED_TRACE(tu::span_label(c));
    tu::expect_span_within_reference_error(c, at::kHalf, 2.0, at::kCPU, emulated_span);
  }
}

TEST(FlashEmulated, Float16WithinTheFloat16ReferenceError) {
  for (const auto& c : tu::flash_test_cases()) tu::expect_flash_within_reference_error(c, at::kHalf, 2.0, at::kCPU, emulated_flash);
}
#endif

// bfloat16 above runs the forward's version 1 (tensor cores) for D 32, 64 and 128 and version 0 for
// D 96 and 256, and the backward's version 2 (tensor cores) for D 32, 64 and 128, version 0 for the
// others; here every case takes version 0 forward and backward.
TEST(SpanAttentionEmulated, BFloat16Version0WithinTheBFloat16ReferenceError) {
  const tu::KernelVariantEnv env("SPANFORMER_SPAN_KERNEL", "v0");
  for (const auto& c : tu::span_test_cases()) {
    SCOPED_TRACE(tu::span_label(c));
    tu::expect_span_within_reference_error(c, at::kBFloat16, 2.0, at::kCPU, emulated_span);
  }
}

// Which kernels each variant of a table launches, and that every lab variant launches one of its own:
// a lab row that the glue quietly served with a mainline kernel would pass the value checks. The
// kernels of the mainline are those the non-lab rows launch for the same cases (every row, bf16 and
// fp16); a lab row must launch at least one kernel outside them (the CPU model of CUDA logs each
// launch's kernel function).
template <typename Id, size_t N>
void expect_lab_variants_within_the_reference_error_on_kernels_of_their_own(
    const ops::cuda::KernelVariant<Id> (&table)[N], const char* variable, const std::function<void()>& run_cases) {
  namespace emu = spanformer::cuda_emulator;
  std::set<const void*> mainline;
  for (const auto& row : table) {
    if (row.lab) continue;
    const tu::KernelVariantEnv env(variable, row.name);
    emu::clear_launched_kernels();
    run_cases();
    for (const void* k : emu::launched_kernels()) mainline.insert(k);
  }
  const auto lab = tu::lab_variants(table);
  ASSERT_GE(lab.size(), 1u);
  for (const auto& variant : lab) {
    SCOPED_TRACE(variant);
    const tu::KernelVariantEnv env(variable, variant);
    emu::clear_launched_kernels();
    run_cases();
    int64_t own = 0;
    for (const void* k : emu::launched_kernels()) own += mainline.count(k) == 0;
    EXPECT_GT(own, 0) << variable << "=" << variant << " launched only kernels the mainline launches";
  }
}

// The forward's lab variants (src/ops/cuda/variants.h, every lab row): v1b2-async double-buffers the
// tiles with cp.async at D 32 / 64 (the mainline at D 128): a tile read before its copies landed, or a
// buffer refilled while a warp still reads it, is NaN here; v1b2-shortcuts skips the validity selects and
// the mask in whole tiles, which the case whose heads visit most of a 200-key window reaches.
TEST(SpanAttentionEmulated, LabVariantsWithinTheReferenceError) {
  ASSERT_GE(tu::lab_variants(ops::cuda::kSpanVariants).size(), 2u);
  expect_lab_variants_within_the_reference_error_on_kernels_of_their_own(ops::cuda::kSpanVariants, "SPANFORMER_SPAN_KERNEL", [] {
    for (const auto& c : tu::span_test_cases()) {
      SCOPED_TRACE(tu::span_label(c));
      tu::expect_span_within_reference_error(c, at::kBFloat16, 2.0, at::kCPU, emulated_span);
#if SPANFORMER_HAS_CPU_HALF_MATMUL
      tu::expect_span_within_reference_error(c, at::kHalf, 2.0, at::kCPU, emulated_span);
#endif
    }
  });
}

// A name not in the table is one line naming the variable and listing the names (not a silent default).
TEST(SpanAttentionEmulated, AnUnknownVariantIsRefusedWithTheNames) {
  for (const char* variable : {"SPANFORMER_SPAN_KERNEL", "SPANFORMER_FLASH_KERNEL"}) {
    const tu::KernelVariantEnv env(variable, "v1-async-keys");
    const bool span = std::string(variable) == "SPANFORMER_SPAN_KERNEL";
    try {
      if (span) {
        tu::expect_span_within_reference_error(tu::span_test_cases()[0], at::kBFloat16, 2.0, at::kCPU, emulated_span);
      } else {
        tu::expect_flash_within_reference_error(tu::flash_test_cases()[0], at::kBFloat16, 2.0, at::kCPU, emulated_flash);
      }
      ADD_FAILURE() << variable << "=v1-async-keys ran";
    } catch (const std::exception& e) {
      const std::string message = e.what(), first = message.substr(0, message.find('\n'));
      EXPECT_NE(first.find(std::string(variable) + "=v1-async-keys is not one of: auto, v0, "),
                std::string::npos) << first;
      EXPECT_NE(first.find(span ? "v1b2-shortcuts" : "v1-async"), std::string::npos) << first;
    }
  }
}

TEST(FlashEmulated, Float32WithinTheFloat32ReferenceError) {
  for (const auto& c : tu::flash_test_cases()) tu::expect_flash_within_reference_error(c, at::kFloat, 4.0, at::kCPU, emulated_flash);
}

// Padded batches on the CUDA kernels: the op runs each batch row's real tokens as a batch of one
// (flash_forward_by_rows, the path the cuda row takes for key_ranges), here with the kernels' glue on CPU
// tensors, against the reference composition in float64: left, right and both-sided padding, a row with
// no key, a KV cache (N < C) and a band; float32 within 1e-5 of the largest value, padded positions 0.
TEST(FlashEmulated, PaddedBatchesRowByRowMatchTheReference) {
  struct Case {
    int64_t K, N, C, D, band;
    std::vector<std::array<int64_t, 2>> ranges;
  };
  for (const Case& c : std::vector<Case>{{2, 24, 24, 32, 0, {{5, 24}, {0, 17}, {3, 20}, {0, 0}}},
                                         {2, 9, 30, 64, 7, {{12, 30}, {0, 30}, {0, 25}}}}) {
    const int64_t B = static_cast<int64_t>(c.ranges.size());
    SCOPED_TRACE(fmt::format("B{} K{} N{} C{} D{} band {}", B, c.K, c.N, c.C, c.D, c.band));
    torch::manual_seed(c.N + c.C);
    auto ranges = torch::empty({B, 2}, torch::kLong);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t e = 0; e < 2; ++e) ranges[b][e] = c.ranges[static_cast<size_t>(b)][static_cast<size_t>(e)];
    const auto o64 = torch::TensorOptions().dtype(torch::kDouble);
    auto q = torch::randn({B, c.K, c.N, c.D}, o64).requires_grad_(), k = torch::randn({B, c.K, c.C, c.D}, o64).requires_grad_(),
         v = torch::randn({B, c.K, c.C, c.D}, o64).requires_grad_();
    const auto weights = torch::randn({B, c.K, c.N, c.D}, o64);
    ops::FlashOptions o;
    o.band = c.band > 0 ? c.band : c.C;  // resolved, as the op passes it to a row
    o.tile = 16;
    o.cuda_kernel = true;
    o.key_ranges = ranges;
    auto want = ops::flash_attention_reference(q, k, v, o);
    auto grads = torch::autograd::grad({want}, {q, k, v}, {weights});
    auto f32 = [](const at::Tensor& t) { return t.detach().to(at::kFloat).contiguous(); };
    auto f = ops::flash_forward_by_rows(&ops::cuda_glue::flash_forward, f32(q), f32(k), f32(v), o);
    auto g = ops::flash_backward_by_rows(&ops::cuda_glue::flash_backward, f32(weights), f32(q), f32(k), f32(v), f.out,
                                         f.saved, o);
    auto close = [](const at::Tensor& got, const at::Tensor& ref) {
      return (got.to(at::kDouble) - ref).abs().max().item<double>() <= 1e-5 * (1 + ref.abs().max().item<double>());
    };
    EXPECT_TRUE(close(f.out, want.detach())) << "out";
    EXPECT_TRUE(close(g.q, grads[0])) << "dq";
    EXPECT_TRUE(close(g.k, grads[1])) << "dk";
    EXPECT_TRUE(close(g.v, grads[2])) << "dv";
    // A row with no key at all: out exactly 0 and L = -inf (the reference is 0 there too, checked above).
    if (c.ranges.back()[1] == 0) {
      EXPECT_EQ(f.out[B - 1].abs().max().item<double>(), 0.0);
      EXPECT_TRUE(torch::isinf(f.saved[B - 1]).all().item<bool>());
    }
  }
}

TEST(FlashEmulated, BFloat16WithinTheBFloat16ReferenceError) {
  for (const auto& c : tu::flash_test_cases())
    tu::expect_flash_within_reference_error(c, at::kBFloat16, 2.0, at::kCPU, emulated_flash);
}

// The bf16 test above (and the fp16 one where the CPU has half matmuls) runs the flash kernels'
// version 1 (tensor cores, D 32, 64 or 128) and version 0 for the other widths; here every case takes
// version 0 (SPANFORMER_FLASH_KERNEL=v0).
// The lab variants (src/ops/cuda/variants.h, every lab row): v1-keys, the key-major backward (dk and dv
// by key tiles, no atomics, every element written, so one it misses is NaN here) and v1-m2, the forward
// with 32 rows a warp, at D 32 and 64 (the mainline at D 128); v1-async, the forward with cp.async
// double-buffered tiles, at every D (a tile read before its copies landed is NaN here).
TEST(FlashEmulated, LabVariantsWithinTheReferenceError) {
  ASSERT_GE(tu::lab_variants(ops::cuda::kFlashVariants).size(), 3u);
  expect_lab_variants_within_the_reference_error_on_kernels_of_their_own(ops::cuda::kFlashVariants, "SPANFORMER_FLASH_KERNEL", [] {
    for (const auto& c : tu::flash_test_cases()) {
      tu::expect_flash_within_reference_error(c, at::kBFloat16, 2.0, at::kCPU, emulated_flash);
#if SPANFORMER_HAS_CPU_HALF_MATMUL
      tu::expect_flash_within_reference_error(c, at::kHalf, 2.0, at::kCPU, emulated_flash);
#endif
    }
  });
}

TEST(FlashEmulated, BFloat16Version0WithinTheBFloat16ReferenceError) {
  const tu::KernelVariantEnv env("SPANFORMER_FLASH_KERNEL", "v0");
  for (const auto& c : tu::flash_test_cases())
    tu::expect_flash_within_reference_error(c, at::kBFloat16, 2.0, at::kCPU, emulated_flash);
}

// The lab's fused step kernels (lab/cuda/step_kernels.cu) through their autograd functions on the CPU
// model of CUDA, against the composition in double (tests/op_cases.h, every step case).
TEST(StepKernelsEmulated, AddLayerNormWithinTheReferenceError) {
  tu::expect_add_layer_norm_within_reference_error(
      [](bool kernel, const at::Tensor& x, const at::Tensor& r, const at::Tensor& w, const at::Tensor& b) {
        if (kernel) return ops::AddLayerNormFunction::apply(x, r, w, b, 1e-5);
        const auto f = ops::add_layer_norm(x, r, w, b, 1e-5);
        return std::vector<at::Tensor>{f.sum, f.out};
      },
      at::kCPU);
}

TEST(StepKernelsEmulated, BiasGeluWithinTheReferenceError) {
  tu::expect_bias_gelu_within_reference_error(
      [](bool kernel, const at::Tensor& x, const at::Tensor& b, bool tanh) {
        return kernel ? ops::BiasGeluFunction::apply(x, b, tanh) : ops::bias_gelu(x, b, tanh);
      },
      at::kCPU);
}

// In a program without the lab (lab/lab.h: its table empty, as the library alone leaves it), a lab
// variant named by a switch is one line saying so, in the span and the flash glue; with the lab the
// same calls run.
TEST(LabEmulated, ALabVariantWithoutTheLabIsOneLine) {
  torch::manual_seed(2);
  auto q = torch::randn({1, 2, 16, 32}), k = torch::randn({1, 2, 16, 32}), v = torch::randn({1, 2, 16, 32});
  auto ks = torch::randn({1, 2, 24, 32}), vs = torch::randn({1, 2, 24, 32});  // (B, K, W + M, D), W 8
  auto key_pe = torch::randn({32, 8}), span_ratio = torch::full({2}, 0.5);
  ops::FlashOptions fo;
  fo.band = 16;
  ops::SpanAttentionOptions so{8, 4.0, 0.0, false, 1, {}};
  so.visited = ops::visited_distances(span_ratio, 8, 4.0, 8);
  const std::string without = " is a lab variant: this program was built without the lab (-DSPANFORMER_LAB=ON adds it)";
  for (bool linked : {false, true}) {
    SCOPED_TRACE(linked ? "with the lab" : "without the lab");
    lab::set_kernel_rows(linked);
    {
      const tu::KernelVariantEnv env("SPANFORMER_FLASH_KERNEL", "v1-keys");
      if (linked) EXPECT_EQ(tu::error_of([&] { ops::cuda_glue::flash_forward(q, k, v, fo); }), "");
      else EXPECT_ERROR_WITH(ops::cuda_glue::flash_forward(q, k, v, fo), "SPANFORMER_FLASH_KERNEL=v1-keys" + without);
    }
    {
      const tu::KernelVariantEnv env("SPANFORMER_SPAN_KERNEL", "v1b2-async");
      auto run = [&] { ops::cuda_glue::span_attention_forward(q, ks, vs, key_pe, span_ratio, so, false); };
      if (linked) EXPECT_EQ(tu::error_of(run), "");
      else EXPECT_ERROR_WITH(run(), "SPANFORMER_SPAN_KERNEL=v1b2-async" + without);
    }
  }
  lab::set_kernel_rows(true);
}

// A bad SPANFORMER_STEP_KERNELS is one line naming the values it takes.
TEST(StepKernelsEmulated, ABadModeIsRefusedInOneLine) {
  const tu::KernelVariantEnv env("SPANFORMER_STEP_KERNELS", "fast");
  EXPECT_ERROR_WITH(ops::step_kernels_take(at::zeros({2, 3})), "SPANFORMER_STEP_KERNELS=fast is not one of: auto, kernels, composition");
}

