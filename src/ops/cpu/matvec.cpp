// One decoding row's products on the CPU (matvec.h says when they apply and why they exist).
//
//   y (out) = W x + b,  x (in),  W stored either
//     (in, out), row k = in index (lay_out_for_decoding's blocks): each thread takes a run of rows and
//                adds x[k] W[k, :] into a float32 partial sum of the whole output, four rows at a time
//                (one pass over the partial sum per four rows); the partial sums are added at the end;
//     (out, in), row n = out index (the tied output layer, the embedding table): each thread takes a run
//                of outputs, each a dot product of its row with x, eight partial sums a row.
// Both stream every weight once, in storage order, which is what a decoding step's time is made of.
// float32 only: for bfloat16 weights ATen's one-row product was faster than this loop (82 against 101
// tokens/s at GPT-2 12 x 768, V 50257; docs/benchmarks.md), so bfloat16 stays with at::linear.
// The reference is at::linear; tests/test_gpt.cpp (DecodeMatvec.*) holds both layouts to the float64
// product.
#include "matvec.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdint>
#include <vector>

namespace spanformer::ops::cpu {
namespace {

// acc[0, N) += sum over rows k in [k0, k1) of x[k] W[k, :], W rows of N elements.
void add_rows(const float* W, const float* x, int64_t k0, int64_t k1, int64_t N, float* acc) {
  int64_t k = k0;
  for (; k + 4 <= k1; k += 4) {
    const float *w0 = W + k * N, *w1 = w0 + N, *w2 = w1 + N, *w3 = w2 + N;
    const float x0 = x[k], x1 = x[k + 1], x2 = x[k + 2], x3 = x[k + 3];
    for (int64_t n = 0; n < N; ++n)
      acc[n] += x0 * w0[n] + x1 * w1[n] + x2 * w2[n] + x3 * w3[n];
  }
  for (; k < k1; ++k) {
    const float* w = W + k * N;
    const float xk = x[k];
    for (int64_t n = 0; n < N; ++n) acc[n] += xk * w[n];
  }
}

// dot(W[n, :], x) over K elements, eight partial sums.
float dot_row(const float* w, const float* x, int64_t K) {
  float s[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t k = 0;
  for (; k + 8 <= K; k += 8)
    for (int j = 0; j < 8; ++j) s[j] += w[k + j] * x[k + j];
  float total = ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
  for (; k < K; ++k) total += w[k] * x[k];
  return total;
}

void matvec(const float* W, bool rows_are_inputs, const float* x, int64_t K, int64_t N, float* y) {
  if (rows_are_inputs) {  // W (K, N)
    const int64_t threads = std::max<int64_t>(1, std::min<int64_t>(at::get_num_threads(), K / 64));
    std::vector<float> partial(static_cast<size_t>(threads * N), 0.0f);  // (threads, N)
    at::parallel_for(0, threads, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t)
        add_rows(W, x, t * K / threads, (t + 1) * K / threads, N, partial.data() + t * N);
    });
    std::fill(y, y + N, 0.0f);
    for (int64_t t = 0; t < threads; ++t)
      for (int64_t n = 0; n < N; ++n) y[n] += partial[t * N + n];
  } else {  // W (N, K)
    at::parallel_for(0, N, 64, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) y[n] = dot_row(W + n * K, x, K);
    });
  }
}

}  // namespace

at::Tensor decode_linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (!x.device().is_cpu() || !weight.device().is_cpu() || weight.dim() != 2) return {};
  const auto dtype = weight.scalar_type();
  if (dtype != at::kFloat || x.scalar_type() != dtype) return {};
  const int64_t N = weight.size(0), K = weight.size(1);  // (out, in)
  if (x.dim() < 1 || x.size(-1) != K || x.numel() != K || K < 1 || N < 1) return {};  // one row
  if (bias.defined() && (bias.scalar_type() != dtype || bias.numel() != N || !bias.device().is_cpu())) return {};
  if (at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad() || (bias.defined() && bias.requires_grad())))
    return {};
  const bool rows_are_inputs = weight.stride(0) == 1 && weight.stride(1) == N;  // (in, out) storage
  if (!rows_are_inputs && !weight.is_contiguous()) return {};
  auto xf = x.reshape({K}).contiguous();  // (K)
  auto y = at::empty({N}, x.options());  // (N)
  matvec(weight.data_ptr<float>(), rows_are_inputs, xf.data_ptr<float>(), K, N, y.data_ptr<float>());
  if (bias.defined()) y.add_(bias);
  auto shape = x.sizes().vec();
  shape.back() = N;
  return y.view(shape);  // (..., N), one row
}

}  // namespace spanformer::ops::cpu
