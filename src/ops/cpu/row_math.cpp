#include "row_math.h"

#include <ATen/OpMathType.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

// One float32 function compiled for AVX-512, AVX2 + FMA and baseline x86-64, picked at load time.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define SPANFORMER_ROW_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define SPANFORMER_ROW_CLONES
#endif

namespace spanformer::ops::cpu::rows {
namespace {

// Lanes of the partial sums and maxima: 16 floats fill one AVX-512 register (two AVX2 ones), and the
// reductions below are written as 16 independent chains so that the compiler may vectorise them
// without reassociating a single sum (which it may not do for floats).
constexpr int kLanes = 16;

inline float from_bits(int32_t i) {
  float f;
  std::memcpy(&f, &i, sizeof f);
  return f;
}
inline int32_t to_bits(float f) {
  int32_t i;
  std::memcpy(&i, &f, sizeof i);
  return i;
}

// exp(x) for x <= 0 (larger x are not used: every argument is a score minus a maximum or logsumexp).
// n = round(x / ln 2) by the 1.5 2^23 trick (no rounding instruction needed on baseline x86-64), r = x -
// n ln 2 in two parts, e^r by Cephes' polynomial, 2^n put into the exponent bits; below -87.3 (and for
// -inf or NaN) the result is 0 by a bit mask, so the loop has no branch to stop its vectorisation.
inline float exp_nonpositive(float x) {
  const float t = x * 1.44269504088896341f + 12582912.0f;
  const float n = t - 12582912.0f;
  const int32_t ni = to_bits(t) - 0x4B400000;
  float r = x - n * 0.693359375f;
  r = r + n * 2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  const float y = (p * r * r + r + 1.0f) * from_bits((ni + 127) << 23);
  const int32_t keep = -static_cast<int32_t>(x >= -87.3f);
  return from_bits(to_bits(y) & keep);
}

template <typename T>
T lane_sum(const T* part) {
  T total = 0;
  for (int j = 0; j < kLanes; ++j) total += part[j];
  return total;
}

}  // namespace

float exp_approx(float x) { return exp_nonpositive(x); }

SPANFORMER_ROW_CLONES float max_of(const float* s, int64_t n) {
  float part[kLanes];
  std::fill(part, part + kLanes, -std::numeric_limits<float>::infinity());
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] = part[j] > s[c + j] ? part[j] : s[c + j];
  for (; c < n; ++c) part[0] = part[0] > s[c] ? part[0] : s[c];
  float best = part[0];
  for (int j = 1; j < kLanes; ++j) best = best > part[j] ? best : part[j];
  return best;
}

double max_of(const double* s, int64_t n) {
  double best = -std::numeric_limits<double>::infinity();
  for (int64_t c = 0; c < n; ++c) best = std::max(best, s[c]);
  return best;
}

SPANFORMER_ROW_CLONES float exp_shifted_sum(float* s, int64_t n, float shift) {
  for (int64_t c = 0; c < n; ++c) s[c] = exp_nonpositive(s[c] - shift);
  float part[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] += s[c + j];
  for (; c < n; ++c) part[c % kLanes] += s[c];
  return lane_sum(part);
}

double exp_shifted_sum(double* s, int64_t n, double shift) {
  double total = 0;
  for (int64_t c = 0; c < n; ++c) total += (s[c] = std::exp(s[c] - shift));
  return total;
}

SPANFORMER_ROW_CLONES void exp_minus(float* s, const float* lse, int64_t n) {
  for (int64_t c = 0; c < n; ++c) s[c] = exp_nonpositive(s[c] - lse[c]);
}

void exp_minus(double* s, const double* lse, int64_t n) {
  for (int64_t c = 0; c < n; ++c) s[c] = std::exp(s[c] - lse[c]);
}

SPANFORMER_ROW_CLONES void times_difference(float* p, const float* dp, const float* delta, int64_t n) {
  for (int64_t c = 0; c < n; ++c) p[c] = p[c] * (dp[c] - delta[c]);
}

void times_difference(double* p, const double* dp, const double* delta, int64_t n) {
  for (int64_t c = 0; c < n; ++c) p[c] = p[c] * (dp[c] - delta[c]);
}

SPANFORMER_ROW_CLONES void scale(float* y, int64_t n, float a) {
  for (int64_t c = 0; c < n; ++c) y[c] *= a;
}

void scale(double* y, int64_t n, double a) {
  for (int64_t c = 0; c < n; ++c) y[c] *= a;
}

SPANFORMER_ROW_CLONES float dot(const float* x, const float* y, int64_t n) {
  float part[kLanes] = {};
  int64_t c = 0;
  for (; c + kLanes <= n; c += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] += x[c + j] * y[c + j];
  for (; c < n; ++c) part[c % kLanes] += x[c] * y[c];
  return lane_sum(part);
}

double dot(const double* x, const double* y, int64_t n) {
  double total = 0;
  for (int64_t c = 0; c < n; ++c) total += x[c] * y[c];
  return total;
}

SPANFORMER_ROW_CLONES void softmax_divided(const float* s, int64_t n, double divisor, float* p) {
  const float d = static_cast<float>(divisor);
  for (int64_t c = 0; c < n; ++c) p[c] = s[c] / d;
  const float total = exp_shifted_sum(p, n, max_of(p, n));
  scale(p, n, 1.0f / total);
}

SPANFORMER_ROW_CLONES void narrow_to(const float* x, int64_t n, c10::BFloat16* y) {
  for (int64_t c = 0; c < n; ++c) y[c] = c10::BFloat16(x[c]);
}

SPANFORMER_ROW_CLONES void narrow_to(const float* x, int64_t n, c10::Half* y) {
  for (int64_t c = 0; c < n; ++c) y[c] = c10::Half(x[c]);
}

// ---- The adaptive-span op's rows ------------------------------------------------------------------
namespace {

#if defined(__GNUC__)
#define SPANFORMER_INLINE_ROW inline __attribute__((always_inline))
#else
#define SPANFORMER_INLINE_ROW inline
#endif

// sum_{c < n} f(c) in double with eight partial sums: independent additions the compiler may overlap
// (one AVX-512 register) without reassociating anything (the clones with FMA may still round a product
// and its addition once instead of twice).
template <typename F>
SPANFORMER_INLINE_ROW double sum8(int64_t n, const F& f) {
  double part[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t c = 0;
  for (; c + 8 <= n; c += 8)
    for (int j = 0; j < 8; ++j) part[j] += f(c + j);
  for (; c < n; ++c) part[0] += f(c);
  return ((part[0] + part[1]) + (part[2] + part[3])) + ((part[4] + part[5]) + (part[6] + part[7]));
}

// A value computed in double, stored as the row's type: through float first for 16-bit rows (as ATen
// rounds a float32 result), directly for float and double.
template <typename out_t, typename p_t>
SPANFORMER_INLINE_ROW out_t store(double x) {
  return static_cast<out_t>(static_cast<at::opmath_type<p_t>>(x));
}

template <typename p_t, typename out_t>
SPANFORMER_INLINE_ROW void weights_row(const p_t* pv, const SpanRowMask& mask, const double* keep, out_t* a) {
  const int64_t S = mask.S;
  const double* m = mask.m;
  const double inv_n = 1.0 / (sum8(S, [&](int64_t c) { return double(pv[c]) * m[c]; }) + 1e-8);
  if (keep)
    for (int64_t c = 0; c < S; ++c) a[c] = store<out_t, p_t>(double(pv[c]) * m[c] * inv_n * keep[c]);
  else
    for (int64_t c = 0; c < S; ++c) a[c] = store<out_t, p_t>(double(pv[c]) * m[c] * inv_n);
}

// da~ = dA keep;  <da~, a~>;  t = (da~ - <da~, a~>) pv / n;  c = <t, m>;  d ratio += <t, dm>;
// ds = alpha (t m - pv c) on the visited distances, -alpha p c on the far ones (the 1e-8 Z term).
template <typename p_t, typename out_t>
SPANFORMER_INLINE_ROW double backward_row(const p_t* p, const p_t* g, int64_t W, const SpanRowMask& mask,
                                          const double* keep, double alpha, double* scratch, out_t* a, out_t* ds) {
  using opmath_t = at::opmath_type<p_t>;
  const int64_t S = mask.S;
  const double* m = mask.m;
  const p_t* pv = p + (W - S);
  double* da = scratch;
  double* t = scratch + S;
  const double inv_n = 1.0 / (sum8(S, [&](int64_t c) { return double(pv[c]) * m[c]; }) + 1e-8);
  if (keep)
    for (int64_t c = 0; c < S; ++c) da[c] = double(g[c]) * keep[c];
  else
    for (int64_t c = 0; c < S; ++c) da[c] = double(g[c]);
  const double dot = sum8(S, [&](int64_t c) { return da[c] * (double(pv[c]) * m[c] * inv_n); });  // <da~, a~>
  if (keep)
    for (int64_t c = 0; c < S; ++c) a[c] = store<out_t, p_t>(double(pv[c]) * m[c] * inv_n * keep[c]);
  else
    for (int64_t c = 0; c < S; ++c) a[c] = store<out_t, p_t>(double(pv[c]) * m[c] * inv_n);
  for (int64_t c = 0; c < S; ++c) t[c] = (da[c] - dot) * inv_n * double(pv[c]);  // t = dw pv
  const double cr = sum8(S, [&](int64_t c) { return t[c] * m[c]; });
  double dratio = 0;
  for (int64_t c = mask.ramp_begin; c < mask.ramp_end; ++c) dratio += t[c] * mask.dm[c];
  const opmath_t a_c = static_cast<opmath_t>(alpha * cr);
  for (int64_t x = 0; x < W - S; ++x) ds[x] = static_cast<out_t>(-opmath_t(p[x]) * a_c);
  for (int64_t c = 0; c < S; ++c) ds[W - S + c] = store<out_t, p_t>(alpha * (t[c] * m[c] - double(pv[c]) * cr));
  return dratio;
}

}  // namespace

SPANFORMER_ROW_CLONES void span_weights_row(const float* pv, const SpanRowMask& mask, const double* keep, float* a) {
  weights_row(pv, mask, keep, a);
}
SPANFORMER_ROW_CLONES void span_weights_row(const float* pv, const SpanRowMask& mask, const double* keep,
                                            c10::BFloat16* a) {
  weights_row(pv, mask, keep, a);
}
SPANFORMER_ROW_CLONES void span_weights_row(const float* pv, const SpanRowMask& mask, const double* keep, c10::Half* a) {
  weights_row(pv, mask, keep, a);
}
void span_weights_row(const double* pv, const SpanRowMask& mask, const double* keep, double* a) {
  weights_row(pv, mask, keep, a);
}

SPANFORMER_ROW_CLONES double span_backward_row(const float* p, const float* g, int64_t W, const SpanRowMask& mask,
                                               const double* keep, double alpha, double* scratch, float* a, float* ds) {
  return backward_row(p, g, W, mask, keep, alpha, scratch, a, ds);
}
SPANFORMER_ROW_CLONES double span_backward_row(const float* p, const float* g, int64_t W, const SpanRowMask& mask,
                                               const double* keep, double alpha, double* scratch, c10::BFloat16* a,
                                               c10::BFloat16* ds) {
  return backward_row(p, g, W, mask, keep, alpha, scratch, a, ds);
}
SPANFORMER_ROW_CLONES double span_backward_row(const float* p, const float* g, int64_t W, const SpanRowMask& mask,
                                               const double* keep, double alpha, double* scratch, c10::Half* a,
                                               c10::Half* ds) {
  return backward_row(p, g, W, mask, keep, alpha, scratch, a, ds);
}
double span_backward_row(const double* p, const double* g, int64_t W, const SpanRowMask& mask, const double* keep,
                         double alpha, double* scratch, double* a, double* ds) {
  return backward_row(p, g, W, mask, keep, alpha, scratch, a, ds);
}

}  // namespace spanformer::ops::cpu::rows
