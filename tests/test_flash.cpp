// The flash attention op (ops/flash_attention.h) against a loop oracle and its plain composition, in
// double precision: values and the gradients of q, k and v from its own tiled backward, with tiles that
// do and do not divide the lengths, a KV cache (N < C), bands (sliding windows) and dropout (the same
// hashed mask in every implementation). Tolerances: in double the computations differ by rounding
// only (~1e-15 relative over sums of <= 300 terms), so 1e-12 on values and 1e-11 on gradients is tight
// and safe; float32 against double at T = 1000 keeps 2e-5 (the softmax accumulation in float).
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>
#include <torch/cuda.h>

#include <array>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "spanformer/ops/adaptive_span_attention.h"
#include "spanformer/ops/flash_attention.h"
#include "spanformer/util/build_info.h"
#include "spanformer/util/torch_compat.h"
#include "cpu_levels.h"
#include "op_cases.h"
#include "ops/cpu/row_math.h"
#include "ops/cpu/tile_gemm.h"
#include "util.h"

using namespace spanformer;

namespace {

using tu::max_diff;

// out[b, h, i] = sum_j P_ij Z_ij v_j over keys p_i - band < j <= p_i, p_i = C - N + i, written as loops from
// the header's formula (Z from ops::dropout_keep, the hash every implementation shares).
// With key_ranges, row b reads keys first_b <= j < end_b only, and a query with none gives 0.
at::Tensor loop_flash(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const ops::FlashOptions& o) {
  const int64_t B = q.size(0), K = q.size(1), N = q.size(2), C = k.size(2), D = q.size(3);
  const int64_t band = o.band == 0 ? C : o.band;
  auto out = at::zeros_like(q);
  auto qa = q.accessor<double, 4>(), ka = k.accessor<double, 4>(), va = v.accessor<double, 4>();
  auto oa = out.accessor<double, 4>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < K; ++h)
      for (int64_t i = 0; i < N; ++i) {
        const int64_t p = C - N + i;
        const int64_t lo = o.key_ranges.defined() ? o.key_ranges[b][0].item<int64_t>() : 0;
        const int64_t hi = o.key_ranges.defined() ? o.key_ranges[b][1].item<int64_t>() : C;
        if (p < lo || p >= hi) continue;  // no key: 0
        std::vector<double> s;
        double best = -1e300, total = 0;
        for (int64_t j = std::max<int64_t>(lo, p - band + 1); j <= p; ++j) {
          double dot = 0;
          for (int64_t e = 0; e < D; ++e) dot += qa[b][h][i][e] * ka[b][h][j][e];
          s.push_back(dot / std::sqrt(static_cast<double>(D)));
          best = std::max(best, s.back());
        }
        for (double x : s) total += std::exp(x - best);
        const int64_t first = std::max<int64_t>(lo, p - band + 1);
        for (int64_t j = first; j <= p; ++j) {
          double w = std::exp(s[static_cast<size_t>(j - first)] - best) / total;
          if (o.training && o.dropout > 0) w *= ops::dropout_keep(o.seed, b, h, p, j, o.dropout) ? 1 / (1 - o.dropout) : 0;
          for (int64_t e = 0; e < D; ++e) oa[b][h][i][e] += w * va[b][h][j][e];
        }
      }
  return out;
}

// The rows of the op's table that take CPU tensors: the fused kernel (cpu) and the ATen tiles.
const std::vector<std::string> kCpuRows = tu::flash_rows(at::zeros({1, 1, 1, 8}, at::kDouble));

}  // namespace

// The op's one case list (tests/op_cases.h) on each CPU row, tiles of the case's size: in double the
// rows differ from the loops by rounding only.
TEST(FlashAttention, MatchesTheLoopOracleAndItsBackwardMatchesAutogradOfThePlainComposition) {
  for (const auto& row : kCpuRows) {
    const ops::FlashBackendOverride forced(row);
    for (const auto& c : tu::flash_test_cases()) {
      SCOPED_TRACE(row + ": " + tu::flash_label(c));
      std::vector<at::Tensor> in;
      for (const auto& t : tu::flash_inputs(c)) in.push_back(t.requires_grad_(true));
      const auto& q = in[0];
      const auto& k = in[1];
      const auto& v = in[2];
      const auto o = tu::flash_options(c);
      ASSERT_EQ(ops::flash_attention_backend(q), row);
      auto oracle = loop_flash(q.detach(), k.detach(), v.detach(), o);
      auto flash = ops::flash_attention(q, k, v, o);
      auto plain = ops::flash_attention_reference(q, k, v, o);
      EXPECT_LT(max_diff(flash, oracle), 1e-12);
      EXPECT_LT(max_diff(plain, oracle), 1e-12);
      auto weight = torch::randn_like(flash);
      auto gf = torch::autograd::grad({(flash * weight).sum()}, {q, k, v});
      auto gp = torch::autograd::grad({(plain * weight).sum()}, {q, k, v});
      for (size_t i = 0; i < 3; ++i) EXPECT_LT(max_diff(gf[i], gp[i]), 1e-11) << "gradient " << i;
    }
  }
}

// Without an override the CPU takes the fused kernel for every dtype it computes.
TEST(FlashAttention, TheCpuTakesTheFusedKernel) {
  EXPECT_EQ(kCpuRows, (std::vector<std::string>{"cpu", "tiles"}));
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf})
    EXPECT_STREQ(ops::flash_attention_backend(torch::zeros({1, 1, 2, 8}, dtype)), "cpu") << c10::toString(dtype);
  EXPECT_NE(tu::error_of([] { ops::FlashBackendOverride forced("no-such-row"); }).find("no row 'no-such-row'"),
            std::string::npos);
}

// A tile larger than the sequence is the whole sequence (the fused kernel's buffers are tile-sized).
TEST(FlashAttention, ATileBeyondTheSequenceIsTheWholeSequence) {
  torch::manual_seed(8);
  auto q = torch::randn({1, 2, 40, 16}, torch::kDouble), k = torch::randn({1, 2, 50, 16}, torch::kDouble);
  ops::FlashOptions small, huge;
  small.tile = 8;
  huge.tile = int64_t{1} << 40;
  EXPECT_LT(max_diff(ops::flash_attention(q, k, k, huge), ops::flash_attention(q, k, k, small)), 1e-12);
}

// float32 on each CPU row, every case: within a small multiple of the float32 composition's own error.
TEST(FlashAttention, Float32WithinTheFloat32ReferenceError) {
  for (const auto& row : kCpuRows) {
    const ops::FlashBackendOverride forced(row);
    for (const auto& c : tu::flash_test_cases())
      tu::expect_flash_within_reference_error(c, at::kFloat, 2.0, at::kCPU, [](const tu::Inputs& in, const ops::FlashOptions& o) {
        return ops::flash_attention(in[0], in[1], in[2], o);
      });
  }
}

// Soft-capped scores (Gemma 2) and attention sinks (GPT-OSS), on every CPU row, against the plain
// composition: in double equal to it (values and every gradient, the sinks' too, by autograd of the
// composition) to rounding; in float32 (every row), bfloat16 and float16 (the fused kernel) within twice
// the same-dtype composition's own error. Scores up to about 25 (q scaled by 3) so that a cap of 5 bends most of them; a band, a KV
// cache and dropout each in one case. And each option changes the result (neither is ignored).
TEST(FlashAttention, SoftcapAndSinksMatchTheirComposition) {
  struct Case {
    int64_t B, K, N, C, D, band;
    double softcap, dropout;
    bool sinks;
    int64_t tile;
  };
  const std::vector<Case> cases = {{2, 3, 37, 37, 16, 0, 5.0, 0.0, false, 8},  {2, 3, 37, 37, 16, 0, 0.0, 0.0, true, 8},
                                   {1, 2, 30, 61, 32, 12, 5.0, 0.0, true, 16}, {2, 2, 40, 40, 64, 0, 3.0, 0.3, true, 32},
                                   {1, 4, 1, 50, 16, 0, 5.0, 0.0, true, 7}};
  for (const auto& c : cases) {
    SCOPED_TRACE(fmt::format("B{} K{} N{} C{} D{} band {} softcap {} dropout {} sinks {}", c.B, c.K, c.N, c.C, c.D,
                             c.band, c.softcap, c.dropout, c.sinks));
    torch::manual_seed(c.N + c.C);
    const auto o64 = torch::TensorOptions().dtype(torch::kDouble);
    const tu::Inputs base{3 * torch::randn({c.B, c.K, c.N, c.D}, o64), torch::randn({c.B, c.K, c.C, c.D}, o64),
                          torch::randn({c.B, c.K, c.C, c.D}, o64), torch::randn({c.K}, o64) + 2};
    const auto weights = torch::randn({c.B, c.K, c.N, c.D}, o64);
    ops::FlashOptions o;
    o.band = c.band;
    o.softcap = c.softcap;
    o.dropout = c.dropout;
    o.training = c.dropout > 0;
    o.seed = 77;
    o.tile = c.tile;
    for (const auto& row : kCpuRows) {
      SCOPED_TRACE(row);
      const ops::FlashBackendOverride forced(row);
      tu::KernelRun run = [&](bool kernel, at::ScalarType t, at::Device d) {
        auto in = tu::inputs_on({base[0], base[1], base[2]}, t, d);
        auto sinks = base[3].to(d, t == at::kDouble ? at::kDouble : at::kFloat).requires_grad_(true);  // logits: float32
        auto with = o;
        if (c.sinks) with.sinks = sinks;
        auto out = kernel ? ops::flash_attention(in[0], in[1], in[2], with) : ops::flash_attention_reference(in[0], in[1], in[2], with);
        if (c.sinks) in.push_back(sinks);
        return tu::output_and_gradients(out, in, weights);
      };
      std::vector<std::string> names{"out", "q", "k", "v"};
      if (c.sinks) names.push_back("sinks");
      const auto kernel = run(true, at::kDouble, at::kCPU), plain = run(false, at::kDouble, at::kCPU);
      for (size_t i = 0; i < kernel.size(); ++i)
        EXPECT_LT(tu::max_diff(kernel[i], plain[i]), 1e-10 * (1 + plain[i].abs().max().item<double>())) << names[i];
      // 16 bits on the fused kernel (float32 statistics); the ATen tiles keep them in 16 bits, as the
      // other 16-bit tests leave them out.
      for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
        if ((dtype == at::kHalf && !SPANFORMER_HAS_CPU_HALF_MATMUL) || (dtype != at::kFloat && row != "cpu")) continue;
        tu::expect_within_reference_error(run, names, row, dtype, 2.0, at::kCPU);
      }
    }
    // Neither option is ignored: without it the output moves by far more than rounding.
    auto q = base[0], k = base[1], v = base[2];
    ops::FlashOptions with = o, without = o;
    if (c.sinks) with.sinks = base[3];
    without.softcap = 0;
    EXPECT_GT(tu::max_diff(ops::flash_attention(q, k, v, with), ops::flash_attention(q, k, v, without)), 1e-2);
  }
}

// Soft-capping and sinks out of range: one line each.
TEST(FlashAttention, SoftcapAndSinksOutOfRangeAreOneLineErrors) {
  auto q = torch::randn({1, 2, 4, 8});
  ops::FlashOptions o;
  o.softcap = -1;
  EXPECT_NE(tu::error_of([&] { ops::flash_attention(q, q, q, o); }).find("softcap must be a finite number >= 0"),
            std::string::npos);
  o.softcap = 0;
  o.sinks = torch::zeros({3});
  EXPECT_NE(tu::error_of([&] { ops::flash_attention(q, q, q, o); }).find("sinks must be one floating-point logit per head, (2)"),
            std::string::npos);
}

// Padded batches (key_ranges): every CPU row against the loop oracle that reads each row's range, in
// double; the gradients against autograd of the plain composition; 16 bits on the fused kernel within
// the reference's own error. Left, right and both-sided padding, a row padded but for one key, a row
// with no key at all, a KV cache (N < C), a band, soft-capping and sinks, and dropout (the same hash on
// every row: the fused kernel reads each row's keys in place, at their own positions).
// A padded query's output and every gradient of a padded position are exactly 0.
TEST(FlashAttention, PaddedBatchesReadEachRowsKeysOnly) {
  struct Case {
    int64_t K, N, C, D, band;
    std::vector<std::array<int64_t, 2>> ranges;  // one per batch row
    double softcap, dropout;
    bool sinks;
    int64_t tile;
  };
  const std::vector<Case> cases = {
      {3, 37, 37, 16, 0, {{5, 37}, {0, 30}, {3, 33}, {36, 37}}, 0.0, 0.0, false, 8},   // left, right, both, one key
      {2, 40, 40, 32, 9, {{11, 40}, {0, 17}, {0, 0}}, 0.0, 0.0, false, 16},            // a band; a row with no key
      {2, 1, 50, 16, 0, {{20, 50}, {0, 50}}, 0.0, 0.0, false, 7},                        // a decoding step (KV cache)
      {2, 30, 61, 32, 12, {{40, 61}, {2, 61}, {0, 45}}, 5.0, 0.0, true, 16},             // N < C, softcap, sinks
      {2, 33, 33, 16, 0, {{4, 33}, {0, 21}}, 0.0, 0.3, false, 8}};                       // dropout
  for (const auto& c : cases) {
    const int64_t B = static_cast<int64_t>(c.ranges.size());
    SCOPED_TRACE(fmt::format("B{} K{} N{} C{} D{} band {} softcap {} dropout {} sinks {}", B, c.K, c.N, c.C, c.D,
                             c.band, c.softcap, c.dropout, c.sinks));
    torch::manual_seed(c.N + c.C + B);
    const auto o64 = torch::TensorOptions().dtype(torch::kDouble);
    const tu::Inputs base{2 * torch::randn({B, c.K, c.N, c.D}, o64), torch::randn({B, c.K, c.C, c.D}, o64),
                          torch::randn({B, c.K, c.C, c.D}, o64)};
    const auto sinks = torch::randn({c.K}, o64);
    const auto weights = torch::randn({B, c.K, c.N, c.D}, o64);
    auto ranges = torch::empty({B, 2}, torch::kLong);
    for (int64_t b = 0; b < B; ++b) {
      ranges[b][0] = c.ranges[static_cast<size_t>(b)][0];
      ranges[b][1] = c.ranges[static_cast<size_t>(b)][1];
    }
    ops::FlashOptions o;
    o.band = c.band;
    o.softcap = c.softcap;
    o.dropout = c.dropout;
    o.training = c.dropout > 0;
    o.seed = 91;
    o.tile = c.tile;
    o.key_ranges = ranges;
    if (c.sinks) o.sinks = sinks;
    // The loop oracle has neither soft-capping nor sinks: the composition stands in for it there, itself held
    // to the loops where both apply.
    const auto truth = c.softcap == 0 && !c.sinks ? loop_flash(base[0], base[1], base[2], o)
                                                  : ops::flash_attention_reference(base[0], base[1], base[2], o);
    if (c.softcap == 0 && !c.sinks)
      EXPECT_LT(max_diff(ops::flash_attention_reference(base[0], base[1], base[2], o), truth), 1e-12);
    // Padding changes the result (the ranges are not ignored): the unpadded op differs by far more than rounding.
    auto unpadded = o;
    unpadded.key_ranges = at::Tensor();
    EXPECT_GT(max_diff(ops::flash_attention(base[0], base[1], base[2], unpadded), truth), 1e-2);
    for (const auto& row : kCpuRows) {
      SCOPED_TRACE(row);
      const ops::FlashBackendOverride forced(row);
      tu::KernelRun run = [&](bool kernel, at::ScalarType t, at::Device d) {
        auto in = tu::inputs_on({base[0], base[1], base[2]}, t, d);
        auto out = kernel ? ops::flash_attention(in[0], in[1], in[2], o) : ops::flash_attention_reference(in[0], in[1], in[2], o);
        return tu::output_and_gradients(out, in, weights);
      };
      const auto kernel = run(true, at::kDouble, at::kCPU), plain = run(false, at::kDouble, at::kCPU);
      EXPECT_LT(max_diff(kernel[0], truth), 1e-12) << "out";
      const std::vector<std::string> names{"out", "q", "k", "v"};
      for (size_t i = 1; i < kernel.size(); ++i)
        EXPECT_LT(max_diff(kernel[i], plain[i]), 1e-10 * (1 + plain[i].abs().max().item<double>())) << names[i];
      // Exactly 0 where a row is padded: queries outside the range (output, dq), keys outside it (dk, dv).
      for (int64_t b = 0; b < B; ++b) {
        const int64_t lo = c.ranges[static_cast<size_t>(b)][0], hi = c.ranges[static_cast<size_t>(b)][1];
        for (int64_t i = 0; i < c.N; ++i) {
          const int64_t p = c.C - c.N + i;
          if (p < lo || p >= hi) {
            EXPECT_EQ(kernel[0][b].select(1, i).abs().max().item<double>(), 0.0) << "out of padded query " << b << "," << i;
            EXPECT_EQ(kernel[1][b].select(1, i).abs().max().item<double>(), 0.0) << "dq of padded query " << b << "," << i;
          }
        }
        for (int64_t j = 0; j < c.C; ++j)
          if (j < lo || j >= hi) {
            EXPECT_EQ(kernel[2][b].select(1, j).abs().max().item<double>(), 0.0) << "dk of padded key " << b << "," << j;
            EXPECT_EQ(kernel[3][b].select(1, j).abs().max().item<double>(), 0.0) << "dv of padded key " << b << "," << j;
          }
      }
      if (row != "cpu") continue;
      for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
        if (dtype == at::kHalf && !SPANFORMER_HAS_CPU_HALF_MATMUL) continue;
        tu::expect_within_reference_error(run, names, row, dtype, 2.0, at::kCPU);
      }
    }
  }
}

// key_ranges of the wrong shape, type or values: one line each.
TEST(FlashAttention, KeyRangesOutOfRangeAreOneLineErrors) {
  auto q = torch::randn({2, 2, 4, 8});
  ops::FlashOptions o;
  o.key_ranges = torch::tensor({0, 4}, torch::kLong);
  EXPECT_NE(tu::error_of([&] { ops::flash_attention(q, q, q, o); }).find("key_ranges must be (B, 2) = (2, 2) integers"),
            std::string::npos);
  o.key_ranges = torch::tensor({0, 4, 3, 2}, torch::kLong).view({2, 2});
  EXPECT_NE(tu::error_of([&] { ops::flash_attention(q, q, q, o); }).find("key_ranges row 1 is [3, 2): expected 0 <= first <= end <= C = 4"),
            std::string::npos);
  o.key_ranges = torch::tensor({0, 5, 0, 4}, torch::kLong).view({2, 2});
  EXPECT_NE(tu::error_of([&] { ops::flash_attention(q, q, q, o); }).find("key_ranges row 0 is [0, 5)"), std::string::npos);
}

// train.amp=bf16 where the bf16 products have no hardware is said once (train, bench): the line names
// the CPU and is empty where the products run in hardware; on this machine, at this ISA level, it is
// empty exactly where the kernels' bf16 products run on hardware.
TEST(TileGemm, Bf16SpeedWarningOnlyWithoutBf16Hardware) {
  compat::CpuInfo none{"Some CPU", "AVX2"};
  const auto line = bf16_speed_warning(none, false);
  EXPECT_NE(line.find("no hardware"), std::string::npos) << line;
  EXPECT_NE(line.find("Some CPU, AVX2, bf16 hardware: none"), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos) << "one line";
  EXPECT_EQ(bf16_speed_warning(none, true), "");
  EXPECT_EQ(bf16_speed_warning(compat::cpu_info(), bf16_products_in_hardware()).empty(),
            ops::cpu::half_products_in_hardware(at::kBFloat16));
}

// The tile products (ops/cpu/tile_gemm.h) against float64 on the same operands, for every operand type
// and the shapes the kernels give them: key tiles of 16 to 512 columns (more than 64 is what ATen's own
// AMX packing refused), head widths 32, 64, 128 and odd K (the pairs-of-rows layout pads it), leading
// dimensions wider than the rows, N not a multiple of any vector width, writing and accumulating. 16-bit
// operands multiply exactly in float32, so every product is within float32 summation of K terms:
// 2 K 2^-24 times the sum of |a b| (the bound of a recursive sum, doubled for the rounding of C's own value).
TEST(TileGemm, EveryOperandTypeMatchesFloat64) {
  torch::manual_seed(5);
  // Where the CPU has bf16 hardware that oneDNN may use (ONEDNN_MAX_CPU_ISA), the bf16 tiles must run on
  // it (the pairs-of-rows path): a CPU that fell back to the portable products would pass the checks
  // below, slowly; and where oneDNN is kept below it, they must not.
  if (ops::cpu::half_products_available()) {
    const auto expected = tu::expected_bf16_products_in_hardware();
    if (expected.has_value())
      EXPECT_EQ(ops::cpu::half_products_in_hardware(at::kBFloat16), *expected) << cpu_text();
  }
  std::vector<std::array<int64_t, 3>> shapes{{64, 103, 32}, {7, 33, 5}, {64, 64, 63}, {1, 1, 1}, {16, 250, 64}};
  for (int64_t N : {16, 80, 128, 256, 512})
    for (int64_t K : {32, 64, 128, 65}) shapes.push_back({64, N, K});  // Q K^T (N keys, K = D), P V (K keys)
  for (auto dtype : {at::kFloat, at::kBFloat16, at::kHalf}) {
    if (dtype != at::kFloat && !ops::cpu::half_products_available()) continue;  // LibTorch 1.13: no 16-bit tiles
    for (const auto mode : {ops::cpu::HalfProducts::automatic, ops::cpu::HalfProducts::native}) {
      if (dtype == at::kFloat && mode != ops::cpu::HalfProducts::automatic) continue;
      const ops::cpu::HalfProductsOverride products(mode);
      for (auto [M, N, K] : shapes)
        for (bool accumulate : {false, true}) {
          SCOPED_TRACE(std::string(c10::toString(dtype)) + " M " + std::to_string(M) + " N " + std::to_string(N) +
                       " K " + std::to_string(K) + (accumulate ? " accumulating" : ""));
          const int64_t ld_a = K + 3, ld_b = N + 5, ld_c = N + 2;
          const auto a = torch::randn({M, ld_a}).to(dtype), b = torch::randn({K, ld_b}).to(dtype);  // (M, ld_a), (K, ld_b)
          auto c = torch::randn({M, ld_c});                                                            // (M, ld_c) float32
          const auto a64 = a.narrow(1, 0, K).to(at::kDouble), b64 = b.narrow(1, 0, N).to(at::kDouble);
          const auto c0 = c.narrow(1, 0, N).to(at::kDouble);
          const auto want = at::mm(a64, b64) + (accumulate ? c0 : at::zeros_like(c0));                // (M, N)
          const auto bound = 2.0 * K * std::ldexp(1.0, -24) * (at::mm(a64.abs(), b64.abs()) + c0.abs()) + 1e-30;
          const auto tail = c.narrow(1, N, ld_c - N).clone();                                          // must stay
          if (dtype == at::kFloat)
            ops::cpu::tile_gemm(M, N, K, a.data_ptr<float>(), ld_a, b.data_ptr<float>(), ld_b, c.data_ptr<float>(), ld_c,
                                accumulate);
          else if (dtype == at::kBFloat16)
            ops::cpu::tile_gemm(M, N, K, a.data_ptr<c10::BFloat16>(), ld_a, b.data_ptr<c10::BFloat16>(), ld_b,
                                c.data_ptr<float>(), ld_c, accumulate);
          else
            ops::cpu::tile_gemm(M, N, K, a.data_ptr<c10::Half>(), ld_a, b.data_ptr<c10::Half>(), ld_b,
                                c.data_ptr<float>(), ld_c, accumulate);
          if (dtype != at::kFloat) ops::cpu::release_half_products(dtype);
          const auto err = (c.narrow(1, 0, N).to(at::kDouble) - want).abs();
          EXPECT_TRUE((err <= bound).all().item<bool>()) << "worst error over bound " << (err / bound).max().item<double>();
          EXPECT_TRUE(at::equal(c.narrow(1, N, ld_c - N), tail)) << "wrote past N";
        }
    }
  }
}

// The float32 rows run at the widest vector level the CPU has, lowered by ATEN_CPU_CAPABILITY as ATen's
// own kernels are (the isa.* CTest entries run the kernels' tests at each level below this machine's).
TEST(TileGemm, RowsRunAtTheLevelAsked) {
  EXPECT_EQ(std::string(ops::cpu::vector_level_name()), tu::expected_row_level()) << cpu_text();
  EXPECT_NE(cpu_text().find(std::string("rows ") + ops::cpu::vector_level_name()), std::string::npos) << cpu_text();
}

// bfloat16 and float16 on the fused kernel, with both kinds of products (ops/cpu/tile_gemm.h), whichever
// the CPU would pick. Widened: computed in float32 and rounded once, so within the 16-bit composition's
// own error (which rounds every intermediate) with room to spare. Native: q, k, v and dO enter the
// products as they are and P and dS are rounded to 16 bits before theirs, as the composition rounds
// them, with float32 sums: within 1.5 times the composition's error (measured at most 1.15 times, fp16
// v gradient at D 32, 2-core AMD EPYC, in ATen's portable 16-bit brgemm).
TEST(FlashAttention, BFloat16AndFloat16WithinTheirReferenceErrorWithBothProducts) {
  const ops::FlashBackendOverride forced("cpu");
  for (auto mode : {ops::cpu::HalfProducts::widened, ops::cpu::HalfProducts::native}) {
    if (mode == ops::cpu::HalfProducts::native && !ops::cpu::half_products_available()) continue;  // LibTorch 1.13
    const ops::cpu::HalfProductsOverride products(mode);
    for (auto dtype : {at::kBFloat16, at::kHalf}) {
#if !SPANFORMER_HAS_CPU_HALF_MATMUL
      if (dtype == at::kHalf) continue;  // the float16 composition needs half matmuls (LibTorch 2.1+)
#endif
      SCOPED_TRACE(mode == ops::cpu::HalfProducts::native ? "native 16-bit products" : "widened to float32");
      const double factor = mode == ops::cpu::HalfProducts::native ? 1.5 : 1.0;
      for (const auto& c : tu::flash_test_cases())
        tu::expect_flash_within_reference_error(c, dtype, factor, at::kCPU,
                                                [](const tu::Inputs& in, const ops::FlashOptions& o) {
                                                  return ops::flash_attention(in[0], in[1], in[2], o);
                                                });
    }
  }
}

// The two kinds of 16-bit products are different computations (a test of the switch itself: were
// `native` to widen, the results would be equal), and `auto` is native exactly where the CPU multiplies
// 16-bit operands in hardware (AMX).
TEST(FlashAttention, SixteenBitProductsSwitchBetweenTwoComputations) {
  if (!ops::cpu::half_products_available()) {  // LibTorch 1.13: native is refused by name, auto widens
    const ops::cpu::HalfProductsOverride products(ops::cpu::HalfProducts::native);
    EXPECT_NE(tu::error_of([] { ops::cpu::half_products_native(at::kBFloat16); }).find("no 16-bit brgemm"),
              std::string::npos);
    const ops::cpu::HalfProductsOverride automatic(ops::cpu::HalfProducts::automatic);
    EXPECT_FALSE(ops::cpu::half_products_native(at::kBFloat16));
    return;
  }
  torch::manual_seed(12);
  const auto q = torch::randn({1, 2, 300, 64}).to(torch::kBFloat16), k = torch::randn({1, 2, 300, 64}).to(torch::kBFloat16);
  const auto v = torch::randn({1, 2, 300, 64}).to(torch::kBFloat16);
  const ops::FlashBackendOverride forced("cpu");
  at::Tensor widened, native;
  {
    const ops::cpu::HalfProductsOverride products(ops::cpu::HalfProducts::widened);
    widened = ops::flash_attention(q, k, v).to(torch::kFloat);
  }
  {
    const ops::cpu::HalfProductsOverride products(ops::cpu::HalfProducts::native);
    native = ops::flash_attention(q, k, v).to(torch::kFloat);
  }
  EXPECT_GT(max_diff(widened, native), 0.0);
  EXPECT_LT(max_diff(widened, native), 0.05);  // both within bf16 rounding of the same attention
  const ops::cpu::HalfProductsOverride products(ops::cpu::HalfProducts::automatic);
  EXPECT_EQ(ops::cpu::half_products_native(at::kBFloat16), ops::cpu::half_products_in_hardware(at::kBFloat16));
  EXPECT_FALSE(ops::cpu::half_products_native(at::kFloat));
}

// The fused kernel's float32 exponential (ops/cpu/row_math.h), one at a time and through the vectorised
// row (another instruction set, with fused multiply-adds: other roundings): within 2 ulp of exp over
// [-87, 0] (a score minus its row's maximum or logsumexp), 0 below -87.3 and at -inf, and the row's sum
// is the sum of its values.
TEST(FlashAttention, RowExponentialIsWithinTwoUlpOfExp) {
  std::vector<float> xs;
  for (int i = 0; i <= 174000; ++i) xs.push_back(-87.0f + 0.0005f * static_cast<float>(i));
  std::vector<float> row = xs;
  const float sum = ops::cpu::rows::exp_shifted_sum(row.data(), static_cast<int64_t>(row.size()), 0.0f);
  double worst_one = 0, worst_row = 0, expected_sum = 0;
  for (size_t c = 0; c < xs.size(); ++c) {
    const double exact = std::exp(static_cast<double>(xs[c]));
    const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);  // float's unit in the last place at exact
    worst_one = std::max(worst_one, std::abs(ops::cpu::rows::exp_approx(xs[c]) - exact) / ulp);
    worst_row = std::max(worst_row, std::abs(row[c] - exact) / ulp);
    expected_sum += row[c];
  }
  std::printf("measured: row exponential over [-87, 0], worst %.2f ulp one at a time, %.2f ulp in a row\n", worst_one,
              worst_row);
  EXPECT_LE(worst_one, 2.0);
  EXPECT_LE(worst_row, 2.0);
  EXPECT_NEAR(sum, expected_sum, 1e-5 * expected_sum);
  EXPECT_EQ(ops::cpu::rows::exp_approx(-88.0f), 0.0f);
  EXPECT_EQ(ops::cpu::rows::exp_approx(-std::numeric_limits<float>::infinity()), 0.0f);
  EXPECT_EQ(ops::cpu::rows::exp_approx(0.0f), 1.0f);
}

// The backward is right, not only equal to autograd's: central differences, with dropout on.
TEST(FlashAttention, GradientsMatchFiniteDifferences) {
  torch::manual_seed(4);
  auto q = torch::randn({1, 2, 11, 4}, torch::kDouble).requires_grad_();
  auto k = torch::randn({1, 2, 19, 4}, torch::kDouble).requires_grad_();
  auto v = torch::randn({1, 2, 19, 4}, torch::kDouble).requires_grad_();
  auto w = torch::randn({1, 2, 11, 4}, torch::kDouble);
  ops::FlashOptions o;
  o.tile = 4;
  o.band = 9;
  o.dropout = 0.25;
  o.training = true;
  o.seed = 77;
  tu::expect_finite_differences([&] { return (ops::flash_attention(q, k, v, o) * w).sum(); }, {q, k, v});
}

// Float32, the training dtype, over a long sequence: within float rounding of the double result.
TEST(FlashAttention, Float32StaysWithinRoundingOfDouble) {
  torch::manual_seed(5);
  auto q = torch::randn({1, 2, 1000, 16}), k = torch::randn({1, 2, 1000, 16}), v = torch::randn({1, 2, 1000, 16});
  auto exact = ops::flash_attention_reference(q.to(torch::kDouble), k.to(torch::kDouble), v.to(torch::kDouble), {});
  EXPECT_LT(max_diff(ops::flash_attention(q, k, v).to(torch::kDouble), exact), 2e-5);
}

// The hashed dropout drops a fraction p of the weights and the same ones for the same seed.
TEST(FlashAttention, DropoutDropsTheRightFractionReproducibly) {
  torch::manual_seed(6);
  auto q = torch::randn({1, 1, 300, 4}), k = torch::randn({1, 1, 300, 4}), v = torch::ones({1, 1, 300, 4});
  ops::FlashOptions o;
  o.dropout = 0.4;
  o.training = true;
  o.seed = 99;
  auto a = ops::flash_attention(q, k, v, o), b = ops::flash_attention(q, k, v, o);
  EXPECT_EQ(max_diff(a, b), 0.0);
  // With v = 1 every output is sum_j P_ij Z_ij: mean 1 over rows when the kept fraction is 1 - p.
  EXPECT_NEAR(a.select(3, 0).mean().item<double>(), 1.0, 0.03);
  o.seed = 0;  // a fresh seed from the default generator each call
  EXPECT_GT(max_diff(ops::flash_attention(q, k, v, o), ops::flash_attention(q, k, v, o)), 0.0);
}

TEST(FlashAttention, BadArgumentsAreOneLineErrors) {
  auto q = torch::randn({1, 2, 5, 4}), k = torch::randn({1, 2, 4, 4});
  EXPECT_NE(tu::error_of([&] { ops::flash_attention(q, k, k); }).find("C >= N >= 1"), std::string::npos);
  EXPECT_NE(tu::error_of([&] { ops::flash_attention(q, q.to(torch::kDouble), q); }).find("share dtype"), std::string::npos);
  ops::FlashOptions o;
  o.dropout = 1.0;
  EXPECT_NE(tu::error_of([&] { ops::flash_attention(q, q, q, o); }).find("dropout must be in [0, 1)"), std::string::npos);
  o.dropout = 0;
  o.tile = 0;
  EXPECT_NE(tu::error_of([&] { ops::flash_attention(q, q, q, o); }).find("tile must be >= 1"), std::string::npos);
}

// The same op on CUDA tensors (label cuda; skipped on machines without a GPU).
TEST(FlashAttention, CudaMatchesCpu) {
  if (!torch::cuda::is_available()) GTEST_SKIP() << "no CUDA device";
  torch::manual_seed(7);
  auto q = torch::randn({2, 4, 300, 64}, torch::kDouble).requires_grad_();
  auto k = torch::randn({2, 4, 300, 64}, torch::kDouble).requires_grad_();
  auto v = torch::randn({2, 4, 300, 64}, torch::kDouble).requires_grad_();
  ops::FlashOptions o;
  o.dropout = 0.2;
  o.training = true;
  o.seed = 5;
  auto cpu = ops::flash_attention(q, k, v, o);
  auto qc = q.detach().cuda().requires_grad_(), kc = k.detach().cuda().requires_grad_(), vc = v.detach().cuda().requires_grad_();
  auto gpu = ops::flash_attention(qc, kc, vc, o);
  EXPECT_LT(max_diff(cpu, gpu.cpu()), 1e-12);
  auto w = torch::randn_like(cpu);
  auto gc = torch::autograd::grad({(cpu * w).sum()}, {q, k, v});
  auto gg = torch::autograd::grad({(gpu * w.cuda()).sum()}, {qc, kc, vc});
  for (size_t i = 0; i < 3; ++i) EXPECT_LT(max_diff(gc[i], gg[i].cpu()), 1e-11) << "gradient " << i;
}
