#include "row_math.h"

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

}  // namespace spanformer::ops::cpu::rows
