#include "row_math.h"

#include <ATen/OpMathType.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "../cpu_features.h"

#if defined(__GNUC__)
#define SPANFORMER_INLINE_ROW inline __attribute__((always_inline))
#else
#define SPANFORMER_INLINE_ROW inline
#endif

namespace spanformer::ops::cpu::rows {

// One level's float32 rows (row_math_rows.inc fills one per level).
struct RowTable {
  float (*max_of)(const float*, int64_t);
  float (*exp_shifted_sum)(float*, int64_t, float);
  void (*exp_minus)(float*, const float*, int64_t);
  void (*times_difference)(float*, const float*, const float*, int64_t);
  void (*scale)(float*, int64_t, float);
  float (*dot)(const float*, const float*, int64_t);
  float (*dot_bf16)(const c10::BFloat16*, const c10::BFloat16*, int64_t);
  float (*dot_f16)(const c10::Half*, const c10::Half*, int64_t);
  float (*dot_bf16_f32)(const c10::BFloat16*, const float*, int64_t);
  float (*dot_f16_f32)(const c10::Half*, const float*, int64_t);
  void (*add_scaled)(float*, const float*, int64_t, float);
  void (*add_scaled_bf16)(float*, const c10::BFloat16*, int64_t, float);
  void (*add_scaled_f16)(float*, const c10::Half*, int64_t, float);
  void (*softmax_divided)(const float*, int64_t, double, float*);
  void (*narrow_bf16)(const float*, int64_t, c10::BFloat16*);
  void (*narrow_f16)(const float*, int64_t, c10::Half*);
  void (*weights_f32)(const float*, const SpanRowMask&, const double*, float*);
  void (*weights_bf16)(const float*, const SpanRowMask&, const double*, c10::BFloat16*);
  void (*weights_f16)(const float*, const SpanRowMask&, const double*, c10::Half*);
  double (*backward_f32)(const float*, const float*, int64_t, const SpanRowMask&, const double*, double, double*,
                         float*, float*);
  double (*backward_bf16)(const float*, const float*, int64_t, const SpanRowMask&, const double*, double, double*,
                          c10::BFloat16*, c10::BFloat16*);
  double (*backward_f16)(const float*, const float*, int64_t, const SpanRowMask&, const double*, double, double*,
                         c10::Half*, c10::Half*);
};

}  // namespace spanformer::ops::cpu::rows

// The levels. x86-64 with GCC 12 or later compiles three (the micro-architecture levels x86-64-v4:
// AVX-512 F/BW/CD/DQ/VL; x86-64-v3: AVX2, FMA; the baseline); elsewhere the baseline alone.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__) && __GNUC__ >= 12
#define SPANFORMER_ROW_LEVELS 1
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v4")
#define SPANFORMER_ROW_LEVEL avx512
#include "row_math_rows.inc"
#undef SPANFORMER_ROW_LEVEL
#pragma GCC pop_options
#pragma GCC push_options
#pragma GCC target("arch=x86-64-v3")
#define SPANFORMER_ROW_LEVEL avx2
#include "row_math_rows.inc"
#undef SPANFORMER_ROW_LEVEL
#pragma GCC pop_options
#else
#define SPANFORMER_ROW_LEVELS 0
#endif
#define SPANFORMER_ROW_LEVEL baseline
#include "row_math_rows.inc"
#undef SPANFORMER_ROW_LEVEL

namespace spanformer::ops::cpu::rows {
namespace {

const RowTable& t() {
  static const RowTable* table = [] {
#if SPANFORMER_ROW_LEVELS
    if (vector_level() == VectorLevel::avx512) return &avx512::kTable;
    if (vector_level() == VectorLevel::avx2) return &avx2::kTable;
#endif
    return &baseline::kTable;
  }();
  return *table;
}

}  // namespace

float exp_approx(float x) { return baseline::exp_nonpositive(x); }

float max_of(const float* s, int64_t n) { return t().max_of(s, n); }
float exp_shifted_sum(float* s, int64_t n, float shift) { return t().exp_shifted_sum(s, n, shift); }
void exp_minus(float* s, const float* lse, int64_t n) { t().exp_minus(s, lse, n); }
void times_difference(float* p, const float* dp, const float* delta, int64_t n) { t().times_difference(p, dp, delta, n); }
void scale(float* y, int64_t n, float a) { t().scale(y, n, a); }
float dot(const float* x, const float* y, int64_t n) { return t().dot(x, y, n); }
float dot(const c10::BFloat16* x, const c10::BFloat16* y, int64_t n) { return t().dot_bf16(x, y, n); }
float dot(const c10::Half* x, const c10::Half* y, int64_t n) { return t().dot_f16(x, y, n); }
float dot(const c10::BFloat16* x, const float* y, int64_t n) { return t().dot_bf16_f32(x, y, n); }
float dot(const c10::Half* x, const float* y, int64_t n) { return t().dot_f16_f32(x, y, n); }
void add_scaled(float* y, const float* x, int64_t n, float a) { t().add_scaled(y, x, n, a); }
void add_scaled(float* y, const c10::BFloat16* x, int64_t n, float a) { t().add_scaled_bf16(y, x, n, a); }
void add_scaled(float* y, const c10::Half* x, int64_t n, float a) { t().add_scaled_f16(y, x, n, a); }
void softmax_divided(const float* s, int64_t n, double divisor, float* p) { t().softmax_divided(s, n, divisor, p); }
void narrow_to(const float* x, int64_t n, c10::BFloat16* y) { t().narrow_bf16(x, n, y); }
void narrow_to(const float* x, int64_t n, c10::Half* y) { t().narrow_f16(x, n, y); }

void span_weights_row(const float* pv, const SpanRowMask& mask, const double* keep, float* a) {
  t().weights_f32(pv, mask, keep, a);
}
void span_weights_row(const float* pv, const SpanRowMask& mask, const double* keep, c10::BFloat16* a) {
  t().weights_bf16(pv, mask, keep, a);
}
void span_weights_row(const float* pv, const SpanRowMask& mask, const double* keep, c10::Half* a) {
  t().weights_f16(pv, mask, keep, a);
}
double span_backward_row(const float* p, const float* g, int64_t W, const SpanRowMask& mask, const double* keep,
                         double alpha, double* scratch, float* a, float* ds) {
  return t().backward_f32(p, g, W, mask, keep, alpha, scratch, a, ds);
}
double span_backward_row(const float* p, const float* g, int64_t W, const SpanRowMask& mask, const double* keep,
                         double alpha, double* scratch, c10::BFloat16* a, c10::BFloat16* ds) {
  return t().backward_bf16(p, g, W, mask, keep, alpha, scratch, a, ds);
}
double span_backward_row(const float* p, const float* g, int64_t W, const SpanRowMask& mask, const double* keep,
                         double alpha, double* scratch, c10::Half* a, c10::Half* ds) {
  return t().backward_f16(p, g, W, mask, keep, alpha, scratch, a, ds);
}

// ---- Float64: plain loops with std::exp, for the exact tests --------------------------------------

double max_of(const double* s, int64_t n) {
  double best = -std::numeric_limits<double>::infinity();
  for (int64_t c = 0; c < n; ++c) best = std::max(best, s[c]);
  return best;
}

double exp_shifted_sum(double* s, int64_t n, double shift) {
  double total = 0;
  for (int64_t c = 0; c < n; ++c) total += (s[c] = std::exp(s[c] - shift));
  return total;
}

void exp_minus(double* s, const double* lse, int64_t n) {
  for (int64_t c = 0; c < n; ++c) s[c] = std::exp(s[c] - lse[c]);
}

void times_difference(double* p, const double* dp, const double* delta, int64_t n) {
  for (int64_t c = 0; c < n; ++c) p[c] = p[c] * (dp[c] - delta[c]);
}

void scale(double* y, int64_t n, double a) {
  for (int64_t c = 0; c < n; ++c) y[c] *= a;
}

double dot(const double* x, const double* y, int64_t n) {
  double total = 0;
  for (int64_t c = 0; c < n; ++c) total += x[c] * y[c];
  return total;
}

void add_scaled(double* y, const double* x, int64_t n, double a) {
  for (int64_t c = 0; c < n; ++c) y[c] += a * x[c];
}

void span_weights_row(const double* pv, const SpanRowMask& mask, const double* keep, double* a) {
  baseline::weights_row(pv, mask, keep, a);
}

double span_backward_row(const double* p, const double* g, int64_t W, const SpanRowMask& mask, const double* keep,
                         double alpha, double* scratch, double* a, double* ds) {
  return baseline::backward_row(p, g, W, mask, keep, alpha, scratch, a, ds);
}

}  // namespace spanformer::ops::cpu::rows
