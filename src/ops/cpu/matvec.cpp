// One decoding row's products on the CPU (matvec.h says when they apply and why they exist).
//
//   y (out) = W x + b,  x (in),  W stored either
//     (in, out), row k = in index (lay_out_for_decoding's float32 blocks): each thread takes a run of
//                rows and adds x[k] W[k, :] into a float32 partial sum of the whole output, four rows at
//                a time (one pass over the partial sum per four rows); the partial sums are added at the
//                end;
//     (out, in), row n = out index (bfloat16 blocks, and the tied output layer, the embedding table):
//                each thread takes a run of outputs, each a dot product of its row with each row of x
//                (a weight row read once for groups of up to 8 rows of x; one row of x by the pairs:
//                four weight rows at a time, x read once for four).
// Both stream every weight once, in storage order, which is what a decoding step's time is made of.
// The loops are compiled once per vector level (matvec_rows.inc, as the attention rows are: the widest
// the CPU runs, lowered by ATEN_CPU_CAPABILITY). bfloat16 weights are multiplied one of two ways, the
// attention kernels' switch deciding (ops/cpu_features.h, SPANFORMER_CPU_HALF_PRODUCTS):
//   widened  each weight widened to float32 (its 16 bits atop a float's: exact) and multiplied by x in
//            float32 (x widened once), on every CPU;
//   native   AVX512-BF16's dot product of pairs (vdpbf16ps: the products exact, summed in float32) on x
//            as bfloat16, where the CPU has it (AMD Zen 4 and later, Intel Xeon from Cooper Lake, AMX's
//            among them) at the AVX-512 level and oneDNN's ISA cap allows bf16 products.
// Either way the sums are float32, the bias is added to them and the result rounded to bfloat16 once.
// The reference is at::linear; tests/test_gpt.cpp (DecodeMatvec.*) holds every layout, dtype and way
// to the float64 product, and the isa.* CTest entries run them at each vector level.
#include "matvec.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <vector>

#include "ops/cpu/row_math.h"
#include "ops/cpu_features.h"

namespace spanformer::ops::cpu::matvec_rows {

struct MatvecTable {
  void (*add_rows)(const float* W, const float* X, int64_t R, int64_t K, int64_t k0, int64_t k1, int64_t N, float* acc);
  void (*dot_rows_float)(const float* W, const float* X, int64_t R, int64_t K, int64_t N, int64_t n0, int64_t n1, float* Y);
  void (*dot_rows_bf16)(const uint16_t* W, const float* X, int64_t R, int64_t K, int64_t N, int64_t n0, int64_t n1,
                        float* Y);
};

}  // namespace spanformer::ops::cpu::matvec_rows

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define SPANFORMER_MATVEC_LEVELS 1
#include <immintrin.h>
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
#define SPANFORMER_ROW_LEVEL avx512
#include "matvec_rows.inc"
#undef SPANFORMER_ROW_LEVEL
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
#define SPANFORMER_ROW_LEVEL avx2
#include "matvec_rows.inc"
#undef SPANFORMER_ROW_LEVEL
#pragma GCC pop_options

// The native bfloat16 rows: Y[r, n] = dot(W[n, :], X[r, :]) for n in [n0, n1), W (N, K) and X (R, K)
// bfloat16 bits, 32 pairs of products a step (a row's last K mod 32 by masked loads). One row of X: four
// rows of W at a time (four chains); R rows: one row of W at a time for R rows (R chains, W read once).
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4,avx512bf16")
namespace spanformer::ops::cpu::matvec_rows::avx512bf16 {
namespace {

inline __m512bh pairs(__m512i v) { return (__m512bh)v; }

void dot_rows_one(const uint16_t* W, const uint16_t* x, int64_t K, int64_t n0, int64_t n1, float* y) {
  const int64_t K32 = K / 32 * 32;
  const __mmask32 tail = static_cast<__mmask32>((uint64_t{1} << (K - K32)) - 1);
  const __m512bh xt = pairs(_mm512_maskz_loadu_epi16(tail, x + K32));
  int64_t n = n0;
  for (; n + 4 <= n1; n += 4) {
    const uint16_t *w0 = W + n * K, *w1 = w0 + K, *w2 = w1 + K, *w3 = w2 + K;
    __m512 s0 = _mm512_setzero_ps(), s1 = _mm512_setzero_ps(), s2 = _mm512_setzero_ps(), s3 = _mm512_setzero_ps();
    for (int64_t k = 0; k < K32; k += 32) {
      const __m512bh xv = pairs(_mm512_loadu_si512(x + k));
      s0 = _mm512_dpbf16_ps(s0, pairs(_mm512_loadu_si512(w0 + k)), xv);
      s1 = _mm512_dpbf16_ps(s1, pairs(_mm512_loadu_si512(w1 + k)), xv);
      s2 = _mm512_dpbf16_ps(s2, pairs(_mm512_loadu_si512(w2 + k)), xv);
      s3 = _mm512_dpbf16_ps(s3, pairs(_mm512_loadu_si512(w3 + k)), xv);
    }
    if (tail) {
      s0 = _mm512_dpbf16_ps(s0, pairs(_mm512_maskz_loadu_epi16(tail, w0 + K32)), xt);
      s1 = _mm512_dpbf16_ps(s1, pairs(_mm512_maskz_loadu_epi16(tail, w1 + K32)), xt);
      s2 = _mm512_dpbf16_ps(s2, pairs(_mm512_maskz_loadu_epi16(tail, w2 + K32)), xt);
      s3 = _mm512_dpbf16_ps(s3, pairs(_mm512_maskz_loadu_epi16(tail, w3 + K32)), xt);
    }
    y[n] = _mm512_reduce_add_ps(s0), y[n + 1] = _mm512_reduce_add_ps(s1);
    y[n + 2] = _mm512_reduce_add_ps(s2), y[n + 3] = _mm512_reduce_add_ps(s3);
  }
  for (; n < n1; ++n) {
    const uint16_t* w = W + n * K;
    __m512 s = _mm512_setzero_ps();
    for (int64_t k = 0; k < K32; k += 32)
      s = _mm512_dpbf16_ps(s, pairs(_mm512_loadu_si512(w + k)), pairs(_mm512_loadu_si512(x + k)));
    if (tail) s = _mm512_dpbf16_ps(s, pairs(_mm512_maskz_loadu_epi16(tail, w + K32)), xt);
    y[n] = _mm512_reduce_add_ps(s);
  }
}

template <int R>
void dot_rows_of(const uint16_t* W, const uint16_t* X, int64_t K, int64_t N, int64_t n0, int64_t n1, float* Y) {
  const int64_t K32 = K / 32 * 32;
  const __mmask32 tail = static_cast<__mmask32>((uint64_t{1} << (K - K32)) - 1);
  for (int64_t n = n0; n < n1; ++n) {
    const uint16_t* w = W + n * K;
    __m512 s[R];
    for (int r = 0; r < R; ++r) s[r] = _mm512_setzero_ps();
    for (int64_t k = 0; k < K32; k += 32) {
      const __m512bh wv = pairs(_mm512_loadu_si512(w + k));
      for (int r = 0; r < R; ++r) s[r] = _mm512_dpbf16_ps(s[r], wv, pairs(_mm512_loadu_si512(X + r * K + k)));
    }
    if (tail) {
      const __m512bh wv = pairs(_mm512_maskz_loadu_epi16(tail, w + K32));
      for (int r = 0; r < R; ++r) s[r] = _mm512_dpbf16_ps(s[r], wv, pairs(_mm512_maskz_loadu_epi16(tail, X + r * K + K32)));
    }
    for (int r = 0; r < R; ++r) Y[r * N + n] = _mm512_reduce_add_ps(s[r]);
  }
}

void dot_rows(const uint16_t* W, const uint16_t* X, int64_t R, int64_t K, int64_t N, int64_t n0, int64_t n1, float* Y) {
  if (R == 1) return dot_rows_one(W, X, K, n0, n1, Y);
  for (int64_t r = 0; r < R;) {
    const uint16_t* x = X + r * K;
    float* y = Y + r * N;
    if (R - r >= 8) dot_rows_of<8>(W, x, K, N, n0, n1, y), r += 8;
    else if (R - r >= 4) dot_rows_of<4>(W, x, K, N, n0, n1, y), r += 4;
    else if (R - r >= 2) dot_rows_of<2>(W, x, K, N, n0, n1, y), r += 2;
    else dot_rows_one(W, x, K, n0, n1, y), r += 1;
  }
}

}  // namespace
}  // namespace spanformer::ops::cpu::matvec_rows::avx512bf16
#pragma GCC pop_options
#else
#define SPANFORMER_MATVEC_LEVELS 0
#endif
#define SPANFORMER_ROW_LEVEL baseline
#include "matvec_rows.inc"
#undef SPANFORMER_ROW_LEVEL

namespace spanformer::ops::cpu {
namespace {

const matvec_rows::MatvecTable& rows_table() {
  static const matvec_rows::MatvecTable* table = [] {
#if SPANFORMER_MATVEC_LEVELS
    if (vector_level() == VectorLevel::avx512) return &matvec_rows::avx512::kTable;
    if (vector_level() == VectorLevel::avx2) return &matvec_rows::avx2::kTable;
#endif
    return &matvec_rows::baseline::kTable;
  }();
  return *table;
}

// Y (R, N) = X W^T, X (R, K) float32, W float32 (K, N) storage (rows_are_inputs) or (N, K).
void matvec_float(const float* W, bool rows_are_inputs, const float* X, int64_t R, int64_t K, int64_t N, float* Y) {
  const auto& t = rows_table();
  if (rows_are_inputs) {  // W (K, N)
    const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), K / 64));
    std::vector<float> partial(static_cast<size_t>(threads * R * N), 0.0f);  // (threads, R, N)
    at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t i = t0; i < t1; ++i)
        t.add_rows(W, X, R, K, i * K / threads, (i + 1) * K / threads, N, partial.data() + i * R * N);
    });
    std::fill(Y, Y + R * N, 0.0f);
    for (int64_t i = 0; i < threads; ++i)
      for (int64_t n = 0; n < R * N; ++n) Y[n] += partial[i * R * N + n];
  } else {  // W (N, K)
    at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) { t.dot_rows_float(W, X, R, K, N, n0, n1, Y); });
  }
}

// Y (R, N) float32 = X W^T, W (N, K) and X (R, K) bfloat16.
void matvec_bf16(const c10::BFloat16* W, const c10::BFloat16* X, int64_t R, int64_t K, int64_t N, float* Y) {
  const auto* Wb = reinterpret_cast<const uint16_t*>(W);
#if SPANFORMER_MATVEC_LEVELS
  if (decode_bf16_pairs()) {
    const auto* Xb = reinterpret_cast<const uint16_t*>(X);
    at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) { matvec_rows::avx512bf16::dot_rows(Wb, Xb, R, K, N, n0, n1, Y); });
    return;
  }
#endif
  std::vector<float> xf(static_cast<size_t>(R * K));  // (R, K), exact
  for (int64_t i = 0; i < R * K; ++i) xf[i] = static_cast<float>(X[i]);
  const auto& t = rows_table();
  at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) { t.dot_rows_bf16(Wb, xf.data(), R, K, N, n0, n1, Y); });
}

}  // namespace

// bfloat16 rows take vdpbf16ps where the switch says native (ops/cpu_features.h) and the CPU has it at
// the AVX-512 level, within oneDNN's ONEDNN_MAX_CPU_ISA as the attention kernels' probe is (so that a
// machine with AVX512-BF16 runs the widened rows in its tests at AVX512_CORE).
bool decode_bf16_pairs() {
#if SPANFORMER_MATVEC_LEVELS
  static const bool has = vector_level() == VectorLevel::avx512 && __builtin_cpu_supports("avx512bf16") &&
                          half_products_in_hardware(at::kBFloat16);
  return has && half_products_native(at::kBFloat16);
#else
  return false;
#endif
}

at::Tensor decode_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!x.device().is_cpu() || !weight.device().is_cpu() || weight.dim() != 2) return {};
  const auto dtype = weight.scalar_type();
  if ((dtype != at::kFloat && dtype != at::kBFloat16) || x.scalar_type() != dtype) return {};
  const int64_t N = weight.size(0), K = weight.size(1);  // (out, in)
  if (x.dim() < 1 || x.size(-1) != K || K < 1 || N < 1) return {};
  const int64_t R = x.numel() / K;
  if (R < 1 || R > kDecodeRows) return {};
  if (bias.defined() && (bias.scalar_type() != dtype || bias.numel() != N || !bias.device().is_cpu())) return {};
  if (at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad())))
    return {};
  const bool rows_are_inputs = weight.stride(0) == 1 && weight.stride(1) == N;  // (in, out) storage
  if (!(rows_are_inputs && dtype == at::kFloat) && !weight.is_contiguous()) return {};
  auto xc = x.reshape({R, K}).contiguous();  // (R, K)
  auto shape = x.sizes().vec();
  shape.back() = N;
  if (dtype == at::kFloat) {
    auto y = at::empty({R, N}, x.options());  // (R, N)
    matvec_float(weight.data_ptr<float>(), rows_are_inputs, xc.data_ptr<float>(), R, K, N, y.data_ptr<float>());
    if (bias.defined()) y.add_(bias);
    return y.view(shape);  // (..., N)
  }
  std::vector<float> sums(static_cast<size_t>(R * N));  // (R, N) float32
  matvec_bf16(weight.data_ptr<c10::BFloat16>(), xc.data_ptr<c10::BFloat16>(), R, K, N, sums.data());
  if (bias.defined()) {
    auto b = bias.contiguous();
    const auto* bp = b.data_ptr<c10::BFloat16>();
    for (int64_t r = 0; r < R; ++r)
      for (int64_t n = 0; n < N; ++n) sums[r * N + n] += static_cast<float>(bp[n]);
  }
  auto y = at::empty({R, N}, x.options());  // (R, N) bfloat16: the float32 sums rounded once
  rows::narrow_to(sums.data(), R * N, y.data_ptr<c10::BFloat16>());
  return y.view(shape);  // (..., N)
}

}  // namespace spanformer::ops::cpu
