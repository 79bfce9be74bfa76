// The adaptive-span attention op (every CPU row of its table) against its reference composition over the one
// case list (tests/op_cases.h): forward and every gradient equal in double, within the float32
// reference's error in float32 and the bf16 one's in bf16 (with float32 spans); plus finite differences
// of the hand-written backward and the link between the op's semantics and the model's plain attention.
#include <gtest/gtest.h>

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "spanformer/attention/seq_attention.h"
#include "spanformer/ops/adaptive_span_attention.h"
#include "spanformer/ops/skew.h"
#include "op_cases.h"
#include "ops/cpu/tile_gemm.h"
#include "spanformer/util/torch_compat.h"
#include "util.h"

using namespace spanformer;
using ops::SpanAttentionOptions;

namespace {

// The small cases below the shared list (finite differences, the model's link, dropout statistics) are
// tu::SpanCase values too, with their inputs made here from a seed of their own.
using tu::SpanCase;

struct Inputs {
  at::Tensor q, k, v, pe, ratio;
  std::vector<at::Tensor> all() const { return {q, k, v, pe, ratio}; }
};

Inputs make_inputs(const SpanCase& c, at::ScalarType dtype, uint64_t seed) {
  at::manual_seed(seed);
  auto o = at::TensorOptions().dtype(dtype);
  Inputs in;
  in.q = at::randn({c.B, c.K, c.M, c.D}, o).requires_grad_(true);
  in.k = at::randn({c.B, c.K, c.W + c.M, c.D}, o).requires_grad_(true);
  in.v = at::randn({c.B, c.K, c.W + c.M, c.D}, o).requires_grad_(true);
  in.pe = at::randn({c.D, c.L}, o).requires_grad_(true);
  std::vector<double> ratios;
  for (double z : c.spans) ratios.push_back(z / static_cast<double>(c.L));
  in.ratio = at::tensor(ratios, o).requires_grad_(true);
  return in;
}

using tu::max_diff;

// The op on CPU tensors, on the row the table picks (cpu) or the one forced around it.
at::Tensor cpu_row(const tu::Inputs& in, const SpanAttentionOptions& o) {
  return ops::adaptive_span_attention(in[0], in[1], in[2], in[3], in[4], o);
}

// Every row of the op's table that takes CPU tensors: the fused kernel, then the reference row.
std::vector<std::string> cpu_rows() { return tu::span_rows(at::zeros({1, 1, 1, 8}, at::kDouble)); }

}  // namespace

// The op's one case list (tests/op_cases.h), on every CPU row (forced in turn) where the test is about
// the op, on the cpu row where it is about that kernel's 16-bit products.
class SpanAttentionOp : public ::testing::TestWithParam<tu::SpanCase> {};

TEST(SpanAttentionOpTest, TheCpuRowsAreTheKernelThenTheReference) {
  EXPECT_EQ(cpu_rows(), (std::vector<std::string>{"cpu", "reference"}));
  for (auto dtype : {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf})
    EXPECT_STREQ(ops::adaptive_span_attention_backend(at::zeros({1, 1, 2, 8}, dtype)), "cpu") << c10::toString(dtype);
  EXPECT_NE(tu::error_of([] { ops::SpanBackendOverride forced("no-such-row"); }).find("no row 'no-such-row'"),
            std::string::npos);
}

TEST_P(SpanAttentionOp, ForwardAndGradientsMatchTheReferenceInDouble) {
  for (const auto& row : cpu_rows()) {
    const ops::SpanBackendOverride forced(row);
    const auto& c = GetParam();
    SCOPED_TRACE(row + ": " + tu::span_label(c));
    ASSERT_EQ(ops::adaptive_span_attention_backend(at::zeros({1}, at::kDouble)), row);
    std::vector<at::Tensor> in;
    for (const auto& t : tu::span_inputs(c)) in.push_back(t.requires_grad_(true));
    const auto o = tu::span_options(c);
    auto weights = at::randn({c.B, c.K, c.M, c.D}, at::kDouble);
    auto fused = cpu_row(in, o);
    auto ref = ops::adaptive_span_attention_reference(in[0], in[1], in[2], in[3], in[4], o);
    EXPECT_LT(max_diff(fused, ref), 1e-12);
    auto gf = torch::autograd::grad({(fused * weights).sum()}, in);
    auto gr = torch::autograd::grad({(ref * weights).sum()}, in);
    const char* names[] = {"q", "k", "v", "key_pe", "span_ratio"};
    for (size_t i = 0; i < gf.size(); ++i) {
      // Same arithmetic in another order, in double: agreement to ~1e-12 relative.
      const double scale = std::max(1.0, gr[i].abs().max().item<double>());
      EXPECT_LT(max_diff(gf[i], gr[i]) / scale, 1e-11) << names[i];
    }
  }
}

TEST_P(SpanAttentionOp, Float32WithinTheFloat32ReferenceError) {
  for (const auto& row : cpu_rows()) {
    SCOPED_TRACE(row);
    const ops::SpanBackendOverride forced(row);
    tu::expect_span_within_reference_error(GetParam(), at::kFloat, 2.0, at::kCPU, cpu_row);
  }
}

// The kinds of 16-bit products the CPU kernel has (ops/cpu/tile_gemm.h), each under its override:
// widened (computed in float32, rounded once) everywhere, native (16-bit operands, float32 sums) where
// this LibTorch has 16-bit tile products. Native rounds the skewed a and ds to 16 bits before the
// products that read them, as the composition rounds every intermediate.
std::vector<ops::cpu::HalfProducts> half_product_kinds() {
  std::vector<ops::cpu::HalfProducts> kinds{ops::cpu::HalfProducts::widened};
  if (ops::cpu::half_products_available()) kinds.push_back(ops::cpu::HalfProducts::native);
  return kinds;
}

const char* kind_name(ops::cpu::HalfProducts kind) {
  return kind == ops::cpu::HalfProducts::native ? "native 16-bit products" : "widened to float32";
}

// bf16 inputs with float32 span ratios, as a mixed-precision caller passes them (z = ratio L needs the
// ratio's bits; the argument check allows it). Kernel v4 stopped there with "expected m1 and m2 to have
// the same dtype"; the ratios hold the bf16 reference's values, so both see the same spans.
TEST_P(SpanAttentionOp, BFloat16WithFloat32SpansWithinTheBf16ReferenceError) {
  for (auto kind : half_product_kinds()) {
    SCOPED_TRACE(kind_name(kind));
    const ops::cpu::HalfProductsOverride products(kind);
    tu::expect_span_within_reference_error(GetParam(), at::kBFloat16, 2.0, at::kCPU,
                                           [](const tu::Inputs& in, const SpanAttentionOptions& o) {
                                             return ops::adaptive_span_attention(in[0], in[1], in[2], in[3],
                                                                                 in[4].to(at::kFloat), o);
                                           });
  }
}

// bf16 and fp16 inputs with spans in the same dtype (a caller who casts the whole module), within the
// same-dtype composition's error (which rounds z = ratio L too), with both kinds of products.
TEST_P(SpanAttentionOp, BFloat16AndFloat16WithSpansOfTheirDtypeWithinTheirReferenceError) {
  const auto op = [](const tu::Inputs& in, const SpanAttentionOptions& o) {
    return ops::adaptive_span_attention(in[0], in[1], in[2], in[3], in[4], o);
  };
  for (auto kind : half_product_kinds()) {
    SCOPED_TRACE(kind_name(kind));
    const ops::cpu::HalfProductsOverride products(kind);
    tu::expect_span_within_reference_error(GetParam(), at::kBFloat16, 2.0, at::kCPU, op);
#if SPANFORMER_HAS_CPU_HALF_MATMUL  // the float16 composition needs half matmuls (LibTorch 2.1+)
    tu::expect_span_within_reference_error(GetParam(), at::kHalf, 2.0, at::kCPU, op);
#endif
  }
}

// The span ratios' gradient in 16 bits, held to float32 rather than to the 16-bit composition (whose own
// error reaches tens of percent on this sum of cancelling terms, and so allowed as much). The answer the
// kernel owes is that of the inputs it is given: the 16-bit q, k, v, key_pe and output gradient and the
// float32 spans (as train.amp passes them), computed exactly (float64). The CPU kernel computes this
// gradient from float32 p and float32 products of the 16-bit operands, in double sums, so it must be as
// close to that answer as the float32 composition on the same inputs is, within a factor of 2 (or 8
// float32 ulp of the largest magnitude where that composition happens to be nearly exact), with both
// kinds of products. (Spans in 16 bits are another function, not a rounding of this one: the mask is
// computed in the spans' dtype, as the reference computes it, so z moves by up to 2^-8 relative; the
// test above holds that case to the same-dtype composition.) Measured on the AMD EPYC of
// docs/benchmarks.md: kernel 2.4e-8 .. 8.3e-7 relative, float32 composition 7.7e-8 .. 1.6e-6, at most
// 0.87 of the allowance.
TEST_P(SpanAttentionOp, SixteenBitSpanGradientWithinFloat32OfTheExactAnswerForItsInputs) {
  const auto& c = GetParam();
  SCOPED_TRACE(tu::span_label(c));
  const auto inputs = tu::span_inputs(c);
  const auto o = tu::span_options(c);
  const auto weights = at::randn({c.B, c.K, c.M, c.D}, at::kDouble);
  std::vector<at::ScalarType> dtypes{at::kBFloat16};
#if SPANFORMER_HAS_CPU_HALF_MATMUL
  dtypes.push_back(at::kHalf);
#endif
  for (auto dtype : dtypes)
    for (auto kind : half_product_kinds()) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + ", " + kind_name(kind));
        const ops::cpu::HalfProductsOverride products(kind);
        // The inputs as the kernel gets them: rounded to the dtype (the spans to float32), the output's
        // gradient too (autograd hands the kernel `weights` in the output's dtype).
        std::vector<at::Tensor> given;
        for (size_t i = 0; i < 4; ++i) given.push_back(inputs[i].to(dtype));
        given.push_back(inputs[4].to(at::kFloat));
        const auto w = weights.to(dtype).to(at::kDouble);
        auto ratio_grad = [&](at::ScalarType t, bool kernel) {
          std::vector<at::Tensor> in;
          for (size_t i = 0; i < 4; ++i) in.push_back(given[i].to(t).requires_grad_(true));
          in.push_back((t == dtype ? given[4] : given[4].to(t)).requires_grad_(true));  // float32 beside 16 bits
          auto out = kernel ? ops::adaptive_span_attention(in[0], in[1], in[2], in[3], in[4], o)
                            : ops::adaptive_span_attention_reference(in[0], in[1], in[2], in[3], in[4], o);
          return torch::autograd::grad({(out.to(at::kDouble) * w).sum()}, {in[4]})[0].to(at::kDouble);
        };
        const auto exact = ratio_grad(at::kDouble, false), f32 = ratio_grad(at::kFloat, false);
        const auto kernel = ratio_grad(dtype, true);
        const double scale = std::max(1e-3, exact.abs().max().item<double>());
        const double f32_error = max_diff(f32, exact) / scale, kernel_error = max_diff(kernel, exact) / scale;
        std::printf("measured: span_ratio %s, float32 spans, %s: kernel %.3g, float32 composition %.3g\n",
                    c10::toString(dtype), kind_name(kind), kernel_error, f32_error);
        EXPECT_LE(kernel_error, 2.0 * std::max(f32_error, 8 * std::ldexp(1.0, -23)));
      }
}

// The two kinds are different computations (were `native` to widen, the outputs would be equal) of the
// same attention, and `auto` follows the CPU's 16-bit hardware, as for the flash kernel.
TEST(SpanAttentionOpTest, SixteenBitProductsSwitchBetweenTwoComputations) {
  if (!ops::cpu::half_products_available()) {  // LibTorch 1.13: native is refused by name, auto widens
    const ops::cpu::HalfProductsOverride products(ops::cpu::HalfProducts::automatic);
    EXPECT_FALSE(ops::cpu::half_products_native(at::kBFloat16));
    return;
  }
  SpanCase c{2, 3, 130, 70, 32, 96, {20.5, 60.0, 96.0}, 0.0};
  const auto f = make_inputs(c, at::kFloat, 31);
  auto bf16 = [](const at::Tensor& t) { return t.detach().to(at::kBFloat16).requires_grad_(true); };
  const Inputs in{bf16(f.q), bf16(f.k), bf16(f.v), bf16(f.pe), f.ratio.detach()};
  SpanAttentionOptions o;
  o.attn_span = c.L;
  o.ramp = 32;
  at::Tensor out[2];
  std::vector<at::Tensor> grads[2];
  for (int i = 0; i < 2; ++i) {
    const ops::cpu::HalfProductsOverride products(i ? ops::cpu::HalfProducts::native : ops::cpu::HalfProducts::widened);
    out[i] = ops::adaptive_span_attention(in.q, in.k, in.v, in.pe, in.ratio, o);
    grads[i] = torch::autograd::grad({out[i].to(at::kFloat).square().sum()}, {in.q, in.k, in.v, in.pe});
  }
  EXPECT_GT(max_diff(out[0].to(at::kFloat), out[1].to(at::kFloat)), 0.0);
  EXPECT_LT(max_diff(out[0].to(at::kFloat), out[1].to(at::kFloat)), 0.05);  // both within bf16 rounding
  for (size_t g = 0; g < 4; ++g) {
    const double scale = grads[0][g].to(at::kFloat).abs().max().item<double>();
    EXPECT_LT(max_diff(grads[0][g].to(at::kFloat), grads[1][g].to(at::kFloat)) / scale, 0.05) << g;
  }
  const ops::cpu::HalfProductsOverride products(ops::cpu::HalfProducts::automatic);
  EXPECT_EQ(ops::cpu::half_products_native(at::kBFloat16), ops::cpu::half_products_in_hardware(at::kBFloat16));
}

INSTANTIATE_TEST_SUITE_P(Cases, SpanAttentionOp, ::testing::ValuesIn(tu::span_test_cases()),
                         [](const ::testing::TestParamInfo<tu::SpanCase>& info) { return "case" + std::to_string(info.index); });

TEST(SpanAttentionOpTest, FiniteDifferencesOfTheHandWrittenBackward) {
  SpanCase c{1, 2, 67, 12, 4, 16, {3.3, 9.6}, 0.0};  // spans not at a kink of the mask
  auto in = make_inputs(c, at::kDouble, 3);
  auto o = tu::span_options(c);
  auto weights = at::randn({1, 2, 67, 4}, at::kDouble);
  auto f = [&] { return (ops::adaptive_span_attention(in.q, in.k, in.v, in.pe, in.ratio, o) * weights).sum(); };
  tu::expect_finite_differences(f, in.all());
}

TEST(SpanAttentionOpTest, ReferenceIsTheModelsAttentionWhenEveryDistanceIsVisited) {
  // With spans reaching the window, the op's semantics are exactly the plain layer's.
  SpanCase c{2, 2, 6, 10, 8, 10, {10.0, 9.5}, 0.0};
  auto in = make_inputs(c, at::kDouble, 4);
  auto o = tu::span_options(c);
  auto op = ops::adaptive_span_attention(in.q, in.k, in.v, in.pe, in.ratio, o);
  auto scores = ops::unskew(at::matmul(in.q, in.k.transpose(-1, -2))) + at::matmul(in.q, in.pe);
  auto p = at::softmax(scores / std::sqrt(8.0), -1);
  auto m = ((in.ratio * 10.0).view({2, 1, 1}) - at::arange(9, -1, -1, at::kDouble)) / 8.0 + 1.0;
  auto w = p * m.clamp(0, 1);
  auto plain = at::matmul(ops::skew(w / (w.sum(-1, true) + 1e-8)), in.v);
  EXPECT_LT(max_diff(op, plain), 1e-13);
}

// The mask in the spans' own dtype, as the reference computes it: in float32, (z - 32) / 32 + 1 at
// z = 1.2e-6 (a head of the small4 reference model) is 0, where double keeps 3.7e-8 for that distance.
// With scores as large as a trained model's (inputs x 6 here) the last distance can hold nearly all of p,
// and the output then depends on that mask value: a mask in double moved it by 0.22 here (measured).
TEST(SpanAttentionOpTest, Float32MaskRoundsAsTheReferenceDoes) {
  SpanCase c{1, 4, 128, 64, 64, 1024, {1.2e-6, 1.2e-6, 1.2e-6, 1.2e-6}, 0.0};
  auto in = make_inputs(c, at::kFloat, 6);
  at::NoGradGuard guard;
  for (auto* t : {&in.q, &in.k, &in.pe}) *t = *t * 6.0;
  in.ratio = at::full({4}, 1.2e-6 / 1024, at::kFloat);
  auto o = tu::span_options(c);
  o.ramp = 32;
  auto fused = ops::adaptive_span_attention(in.q, in.k, in.v, in.pe, in.ratio, o);
  auto ref = ops::adaptive_span_attention_reference(in.q, in.k, in.v, in.pe, in.ratio, o);
  EXPECT_LT(max_diff(fused, ref), 1e-4);
}

TEST(SpanAttentionOpTest, DropoutIsSeededAndUnbiased) {
  SpanCase c{1, 1, 64, 32, 16, 32, {32.0}, 0.5};
  auto in = make_inputs(c, at::kDouble, 5);
  auto o = tu::span_options(c);
  at::NoGradGuard guard;
  auto a = ops::adaptive_span_attention(in.q, in.k, in.v, in.pe, in.ratio, o);
  auto b = ops::adaptive_span_attention(in.q, in.k, in.v, in.pe, in.ratio, o);
  EXPECT_TRUE(at::equal(a, b));
  o.seed = 99;
  EXPECT_FALSE(at::equal(a, ops::adaptive_span_attention(in.q, in.k, in.v, in.pe, in.ratio, o)));
  int kept = 0;
  for (int i = 0; i < 20000; ++i) kept += ops::dropout_keep(7, 0, 0, i, 3, 0.3);
  EXPECT_NEAR(kept / 20000.0, 0.7, 0.015);  // 4.6 standard deviations
}
