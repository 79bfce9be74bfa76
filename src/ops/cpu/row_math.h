// The elementwise work of the CPU attention kernels, one row of a tile at a time, in loops the compiler
// vectorises. Float32 rows are compiled three times (x86-64-v4: AVX-512; x86-64-v3: AVX2 + FMA; the
// baseline), and one table is picked on first use: ops/cpu_features.h's vector level (the widest the CPU
// runs, lowered by ATEN_CPU_CAPABILITY=avx2|default), so that a machine with AVX-512 runs every level in
// its tests. The library itself is built for the baseline. Float64 rows are plain loops with
// std::exp (they exist for the exact tests).
//
// The float32 exponential is a degree-6 polynomial after the range reduction x = n ln 2 + r (Cody and
// Waite's split of ln 2; the polynomial of Cephes' expf): within 1 ulp of exp over [-87, 0] (0.94 one at
// a time, 0.99 through an AVX-512 row, whose fused multiply-adds round otherwise; 174,001 points against
// double, FlashAttention.RowExponentialIsWithinTwoUlpOfExp), 0 below -87.3 (where exp is below float's
// smallest normal) and for -inf. ATen's softmax uses Sleef's 1-ulp exp; the kernels' tests hold both to
// the double reference at the float32 composition's error.
//
// Rows are [0, n); the functions never read or write beyond n.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <cstdint>

namespace spanformer::ops::cpu::rows {

// max of s[0, n); -inf when n = 0.
float max_of(const float* s, int64_t n);
double max_of(const double* s, int64_t n);

// s[c] = exp(s[c] - shift) for c in [0, n); returns the sum of the new values.
float exp_shifted_sum(float* s, int64_t n, float shift);
double exp_shifted_sum(double* s, int64_t n, double shift);

// p[c] = exp(s[c] - lse[c]) for c in [0, n) (a key's row of P^T: each query its own logsumexp).
void exp_minus(float* s, const float* lse, int64_t n);
void exp_minus(double* s, const double* lse, int64_t n);

// p[c] = p[c] (dp[c] - delta[c]) for c in [0, n) (dS = P (dP - Dv), a key's row of the transposes).
void times_difference(float* p, const float* dp, const float* delta, int64_t n);
void times_difference(double* p, const double* dp, const double* delta, int64_t n);

// y[c] *= a for c in [0, n).
void scale(float* y, int64_t n, float a);
void scale(double* y, int64_t n, double a);

// sum of x[c] y[c] over [0, n); 16-bit rows widened to float32 (two 16-bit rows: each product exact),
// summed in float32.
float dot(const float* x, const float* y, int64_t n);
double dot(const double* x, const double* y, int64_t n);
float dot(const c10::BFloat16* x, const c10::BFloat16* y, int64_t n);
float dot(const c10::Half* x, const c10::Half* y, int64_t n);
float dot(const c10::BFloat16* x, const float* y, int64_t n);
float dot(const c10::Half* x, const float* y, int64_t n);

// y[c] += a x[c] for c in [0, n), x widened to y's type.
void add_scaled(float* y, const float* x, int64_t n, float a);
void add_scaled(double* y, const double* x, int64_t n, double a);
void add_scaled(float* y, const c10::BFloat16* x, int64_t n, float a);
void add_scaled(float* y, const c10::Half* x, int64_t n, float a);

// The exponential of one float, as the rows compute it (for the tests of its error).
float exp_approx(float x);

// p[c] = softmax(s / divisor)[c] over [0, n) (s divided in float, as ATen divides a float tensor by a
// scalar; the exponential above). s and p may be the same row.
void softmax_divided(const float* s, int64_t n, double divisor, float* p);

// y[c] = x[c] rounded to 16 bits (to nearest even), c in [0, n).
void narrow_to(const float* x, int64_t n, c10::BFloat16* y);
void narrow_to(const float* x, int64_t n, c10::Half* y);

// ---- The adaptive-span op's rows (span_attention_cpu.cpp has the derivation) ----------------------
// One query row of a tile: pv = the row's softmax over its S visited distances, m the head's mask, keep
// the row's dropout factors keep / (1 - p_drop) (null: no dropout). Computed in double whatever the
// row's type: the span gradient sums t over every row, and t cancels. The float32 rows, which feed the
// float32 and 16-bit products, run in the clones above; float64 rows at the baseline.
struct SpanRowMask {
  const double* m;   // (S) the clamped mask
  const double* dm;  // (S) d m / d ratio; 0 outside [ramp_begin, ramp_end)
  int64_t S, ramp_begin, ramp_end;
};

// a[c] = pv[c] m[c] / (sum pv m + 1e-8) keep[c], c in [0, S).
void span_weights_row(const float* pv, const SpanRowMask& mask, const double* keep, float* a);
void span_weights_row(const float* pv, const SpanRowMask& mask, const double* keep, c10::BFloat16* a);
void span_weights_row(const float* pv, const SpanRowMask& mask, const double* keep, c10::Half* a);
void span_weights_row(const double* pv, const SpanRowMask& mask, const double* keep, double* a);

// Backward of one row, from p (W: the whole window's softmax, the visited distances last) and g = dA
// (S): a (S) as span_weights_row writes it, ds (W) = the score gradient times alpha; returns the row's
// share of d ratio. scratch: 2 S doubles.
double span_backward_row(const float* p, const float* g, int64_t W, const SpanRowMask& mask, const double* keep,
                         double alpha, double* scratch, float* a, float* ds);
double span_backward_row(const float* p, const float* g, int64_t W, const SpanRowMask& mask, const double* keep,
                         double alpha, double* scratch, c10::BFloat16* a, c10::BFloat16* ds);
double span_backward_row(const float* p, const float* g, int64_t W, const SpanRowMask& mask, const double* keep,
                         double alpha, double* scratch, c10::Half* a, c10::Half* ds);
double span_backward_row(const double* p, const double* g, int64_t W, const SpanRowMask& mask, const double* keep,
                         double alpha, double* scratch, double* a, double* ds);

}  // namespace spanformer::ops::cpu::rows
