#include "spanformer/nn/dropout.h"

#include <ATen/Dispatch.h>
#include <ATen/OpMathType.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>

#include "../ops/cpu_features.h"
#include "spanformer/ops/dropout.h"
#include "spanformer/util/error.h"

#if defined(__GNUC__)
#define SPANFORMER_INLINE_LOOP inline __attribute__((always_inline))
#else
#define SPANFORMER_INLINE_LOOP inline
#endif
// The mask loop is compiled for each vector level (x86-64-v4, -v3, the baseline) and picked by
// ops/cpu_features.h's level, as the attention kernels' rows are (the isa.* CTest entries run each).
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define SPANFORMER_DROPOUT_LEVELS 1
#else
#define SPANFORMER_DROPOUT_LEVELS 0
#endif

namespace spanformer::nn {
namespace {

// Elements per chunk: a chunk's mask lives on the stack, and chunks start at multiples of this, so the
// index's high 32 bits are one number across a chunk (2^32 is a multiple of it).
constexpr int64_t kDropoutChunk = 4096;

// A 32-bit integer finaliser (two xor-shift-multiply rounds, "lowbias32"): a bijection that spreads one
// changed input bit over every output bit.
SPANFORMER_INLINE_LOOP uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7FEB352DU;
  x ^= x >> 15;
  x *= 0x846CA68BU;
  x ^= x >> 16;
  return x;
}

// The two 32-bit keys of a seed: splitmix64's output, so that nearby seeds give unrelated keys.
struct DropoutKeys {
  uint32_t low, high;
};
DropoutKeys dropout_keys(uint64_t seed) {
  const uint64_t z = ops::mix_seed(seed);
  return {static_cast<uint32_t>(z), static_cast<uint32_t>(z >> 32)};
}

// hash(i) = mix32(mix32(lo(i) ^ key.low) + (hi(i) ^ key.high)); kept when hash >= threshold.
SPANFORMER_INLINE_LOOP uint32_t dropout_hash(DropoutKeys key, uint32_t low, uint32_t high) {
  return mix32(mix32(low ^ key.low) + (high ^ key.high));
}

// Elements kept with probability 1 - p: hash >= round(p 2^32) (p < 1 here, so the threshold fits).
uint32_t dropout_threshold(double p) {
  return static_cast<uint32_t>(std::min(std::llround(std::ldexp(p, 32)), 0xFFFFFFFFLL));
}

// mask[j] = scale where element first + j is kept, else 0, for j < n (first a multiple of kDropoutChunk).
template <typename T>
SPANFORMER_INLINE_LOOP void mask_loop(DropoutKeys key, uint32_t threshold, uint64_t first, int64_t n, T scale, T* mask) {
  const uint32_t low = static_cast<uint32_t>(first), high = static_cast<uint32_t>(first >> 32);
  for (int64_t j = 0; j < n; ++j)
    mask[j] = dropout_hash(key, low + static_cast<uint32_t>(j), high) >= threshold ? scale : T(0);
}

template <typename T>
void mask_baseline(DropoutKeys key, uint32_t threshold, uint64_t first, int64_t n, T scale, T* mask) {
  mask_loop(key, threshold, first, n, scale, mask);
}
#if SPANFORMER_DROPOUT_LEVELS
template <typename T>
__attribute__((target("arch=x86-64-v3"))) void mask_avx2(DropoutKeys key, uint32_t threshold, uint64_t first,
                                                          int64_t n, T scale, T* mask) {
  mask_loop(key, threshold, first, n, scale, mask);
}
template <typename T>
__attribute__((target("arch=x86-64-v4"))) void mask_avx512(DropoutKeys key, uint32_t threshold, uint64_t first,
                                                            int64_t n, T scale, T* mask) {
  mask_loop(key, threshold, first, n, scale, mask);
}
#endif

template <typename T>
void mask_chunk(DropoutKeys key, uint32_t threshold, uint64_t first, int64_t n, T scale, T* mask) {
#if SPANFORMER_DROPOUT_LEVELS
  switch (ops::cpu::vector_level()) {
    case ops::cpu::VectorLevel::avx512: return mask_avx512(key, threshold, first, n, scale, mask);
    case ops::cpu::VectorLevel::avx2: return mask_avx2(key, threshold, first, n, scale, mask);
    default: break;
  }
#endif
  mask_baseline(key, threshold, first, n, scale, mask);
}

// y = x * mask, in float for 16-bit and float tensors, in double for double ones: a product rather than a
// select, so that an inf or NaN that is dropped still shows (0 * inf = NaN), as with ATen's dropout.
template <typename T>
void apply_mask(const T* x, T* y, const at::opmath_type<T>* mask, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = static_cast<T>(static_cast<at::opmath_type<T>>(x[j]) * mask[j]);
}

at::Tensor dropout_cpu(const at::Tensor& input, double p, uint64_t seed) {  // (...) -> (...)
  const auto x = input.contiguous();
  auto y = at::empty_like(x, at::MemoryFormat::Contiguous);
  const int64_t n = x.numel(), chunks = (n + kDropoutChunk - 1) / kDropoutChunk;
  const DropoutKeys key = dropout_keys(seed);
  const uint32_t threshold = dropout_threshold(p);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kBFloat16, at::kHalf, x.scalar_type(), "spanformer dropout", [&] {
    using opmath_t = at::opmath_type<scalar_t>;
    const opmath_t scale = static_cast<opmath_t>(1.0 / (1.0 - p));
    const scalar_t* src = x.data_ptr<scalar_t>();
    scalar_t* dst = y.data_ptr<scalar_t>();
    // 16 chunks (64k elements) a task: fewer and the threads' start-up costs more than the work.
    at::parallel_for(0, chunks, 16, [&](int64_t c0, int64_t c1) {
      opmath_t mask[kDropoutChunk];  // (chunk)
      for (int64_t c = c0; c < c1; ++c) {
        const int64_t first = c * kDropoutChunk, m = std::min(kDropoutChunk, n - first);
        mask_chunk(key, threshold, static_cast<uint64_t>(first), m, scale, mask);
        apply_mask(src + first, dst + first, mask, m);
      }
    });
  });
  return y;
}

// The backward of a fixed mask is the same mask on the gradient: linear, so applying this function again
// also gives the second derivative.
struct HashDropoutFunction : public torch::autograd::Function<HashDropoutFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, double p, int64_t seed) {
    ctx->saved_data["p"] = p;
    ctx->saved_data["seed"] = seed;
    return dropout_cpu(x, p, static_cast<uint64_t>(seed));
  }
  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grad) {
    const double p = ctx->saved_data["p"].toDouble();
    const int64_t seed = ctx->saved_data["seed"].toInt();
    return {HashDropoutFunction::apply(grad[0], p, seed), at::Tensor(), at::Tensor()};
  }
};

void check_probability(double p) {
  if (!(p >= 0 && p <= 1)) fail("dropout: probability must be in [0, 1] (got {})", p);
}

}  // namespace

bool dropout_keeps(uint64_t seed, int64_t index, double p) {
  const auto i = static_cast<uint64_t>(index);
  return dropout_hash(dropout_keys(seed), static_cast<uint32_t>(i), static_cast<uint32_t>(i >> 32)) >=
         dropout_threshold(p);
}

at::Tensor dropout_with_seed(const at::Tensor& x, double p, uint64_t seed) {
  check_probability(p);
  if (!x.device().is_cpu()) fail("dropout: a given seed's mask is computed on the CPU (got a {} tensor)", x.device().str());
  if (p == 1) return x * at::zeros({}, x.options());  // every element dropped (ATen's dropout does the same)
  return HashDropoutFunction::apply(x, p, static_cast<int64_t>(seed));
}

at::Tensor dropout(const at::Tensor& x, double p, bool training) {
  check_probability(p);
  if (!training || p == 0) return x;
  if (!x.device().is_cpu()) return at::dropout(x, p, true);
  return dropout_with_seed(x, p, ops::draw_dropout_seed());
}

at::Tensor dropout_reference(const at::Tensor& x, double p, uint64_t seed) {
  check_probability(p);
  const auto flat = x.to(at::kDouble).contiguous().view(-1);  // (n)
  auto out = at::empty_like(flat);
  const double* src = flat.data_ptr<double>();
  double* dst = out.data_ptr<double>();
  for (int64_t i = 0; i < flat.numel(); ++i)
    dst[i] = p == 1 ? src[i] * 0.0 : dropout_keeps(seed, i, p) ? src[i] / (1.0 - p) : src[i] * 0.0;
  return out.view(x.sizes()).to(x.scalar_type());
}

}  // namespace spanformer::nn
