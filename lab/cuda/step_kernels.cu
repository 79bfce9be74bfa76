// Fused step kernels (the lab: awaiting a GPU, docs/platform.md): the elementwise work of a training step that ATen runs as separate kernels, each
// pass here one launch over rows of H contiguous elements (semantics and the composition they replace:
// include/spanformer/ops/step_ops.h).
//
//   add + LayerNorm   s = x + r (rounded to the activations' dtype, as the composition's add rounds it),
//                     mean and rstd = 1 / sqrt(var + eps) of s over H (biased variance, fp32), and
//                     y = (s - mean) rstd w + b; one warp a row, three passes over the row (s, the
//                     variance around the mean, y), the row's statistics kept for the backward.
//                     Backward, with g = dy w and xhat = (s - mean) rstd:
//                       ds = ds_direct + rstd (g - mean_H(g) - xhat mean_H(g xhat))   (which is dx and dr),
//                       dw = sum_rows dy xhat,  db = sum_rows dy   (column sums, fp32 atomics per block).
//   bias + GELU       u = x + b (rounded as a product with its bias is), y = gelu(u), exact (erf) or the
//                     tanh approximation; backward du = dy gelu'(u), db = sum_rows du.
//
// Everything is computed in fp32 from float32, bfloat16 or float16 activations; the parameters are
// float32 (master weights under autocast) or the activations' dtype. Tested on the CPU model of CUDA
// (tests/test_cuda_emulated.cpp, StepKernelsEmulated.*) against the double-precision composition, within
// 2x the same-dtype composition's own error.
#include <algorithm>
#include <cmath>

#include "ops/cuda/device.cuh"
#include "step_params.h"

namespace spanformer::ops::cuda {
namespace {

constexpr int kRowWarps = 4;          // rows a block of the row kernels (one warp each)
constexpr int kColumns = 256;         // columns a block of the column sums (one thread each)
constexpr int kColumnRows = 64;       // rows a block of the column sums adds before its atomics

__device__ __forceinline__ int64_t warp_row() {
  return static_cast<int64_t>(blockIdx.x) * kRowWarps + static_cast<int64_t>(threadIdx.x) / kWarp;
}

template <typename T, typename W>
__global__ void __launch_bounds__(kRowWarps * kWarp) add_layer_norm_forward_kernel(AddLayerNormParams p) {
  const int64_t row = warp_row(), H = p.H;
  if (row >= p.rows) return;  // the whole warp
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const T* x = static_cast<const T*>(p.x) + row * H;
  const T* r = static_cast<const T*>(p.r) + row * H;
  const W* w = static_cast<const W*>(p.weight);
  const W* b = static_cast<const W*>(p.bias);
  T* s = static_cast<T*>(p.sum) + row * H;
  T* y = static_cast<T*>(p.out) + row * H;
  float total = 0.f;
  for (int64_t j = lane; j < H; j += kWarp) {
    const T v = from_float<T>(to_float(x[j]) + to_float(r[j]));
    s[j] = v;
    total += to_float(v);
  }
  const float mean = warp_sum(total) / static_cast<float>(H);
  float squares = 0.f;
  for (int64_t j = lane; j < H; j += kWarp) {
    const float d = to_float(s[j]) - mean;
    squares += d * d;
  }
  const float rstd = rsqrtf(warp_sum(squares) / static_cast<float>(H) + p.eps);
  for (int64_t j = lane; j < H; j += kWarp)
    y[j] = from_float<T>((to_float(s[j]) - mean) * rstd * to_float(w[j]) + to_float(b[j]));
  if (lane == 0) {
    p.mean[row] = mean;
    p.rstd[row] = rstd;
  }
}

template <typename T, typename W>
__global__ void __launch_bounds__(kRowWarps * kWarp) add_layer_norm_backward_kernel(AddLayerNormParams p) {
  const int64_t row = warp_row(), H = p.H;
  if (row >= p.rows) return;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  const T* s = static_cast<const T*>(p.sum) + row * H;
  const T* dy = static_cast<const T*>(p.grad_out) + row * H;
  const T* direct = p.grad_sum != nullptr ? static_cast<const T*>(p.grad_sum) + row * H : nullptr;
  const W* w = static_cast<const W*>(p.weight);
  T* ds = static_cast<T*>(p.grad_in) + row * H;
  const float mean = p.mean[row], rstd = p.rstd[row];
  float g_sum = 0.f, gx_sum = 0.f;
  for (int64_t j = lane; j < H; j += kWarp) {
    const float g = to_float(dy[j]) * to_float(w[j]);
    g_sum += g;
    gx_sum += g * (to_float(s[j]) - mean) * rstd;
  }
  const float g_mean = warp_sum(g_sum) / static_cast<float>(H), gx_mean = warp_sum(gx_sum) / static_cast<float>(H);
  for (int64_t j = lane; j < H; j += kWarp) {
    const float xhat = (to_float(s[j]) - mean) * rstd;
    const float g = to_float(dy[j]) * to_float(w[j]);
    const float d = rstd * (g - g_mean - xhat * gx_mean) + (direct != nullptr ? to_float(direct[j]) : 0.f);
    ds[j] = from_float<T>(d);
  }
}

// A column-sum launch's thread: its column j and the block's first row r0; false past the last column.
__device__ __forceinline__ bool column_place(int64_t H, int64_t& j, int64_t& r0) {
  const int64_t tiles = (H + kColumns - 1) / kColumns;
  j = (blockIdx.x % tiles) * kColumns + threadIdx.x;
  r0 = (blockIdx.x / tiles) * kColumnRows;
  return j < H;
}

// dw and db: thread j of a block sums its column over the block's kColumnRows rows, then one atomic each.
template <typename T>
__global__ void __launch_bounds__(kColumns) layer_norm_parameter_grads_kernel(AddLayerNormParams p) {
  int64_t j, r0;
  if (!column_place(p.H, j, r0)) return;
  const T* s = static_cast<const T*>(p.sum);
  const T* dy = static_cast<const T*>(p.grad_out);
  float dw = 0.f, db = 0.f;
  for (int64_t row = r0; row < r0 + kColumnRows && row < p.rows; ++row) {
    const float g = to_float(dy[row * p.H + j]);
    dw += g * (to_float(s[row * p.H + j]) - p.mean[row]) * p.rstd[row];
    db += g;
  }
  atomicAdd(p.grad_weight + j, dw);
  atomicAdd(p.grad_bias + j, db);
}

__device__ __forceinline__ float gelu(float u, bool tanh_form) {
  if (tanh_form) {
    const float k = 0.7978845608028654f;  // sqrt(2 / pi)
    return 0.5f * u * (1.f + tanhf(k * (u + 0.044715f * u * u * u)));
  }
  return 0.5f * u * (1.f + erff(u * 0.7071067811865476f));
}

__device__ __forceinline__ float gelu_grad(float u, bool tanh_form) {
  if (tanh_form) {
    const float k = 0.7978845608028654f;
    const float t = tanhf(k * (u + 0.044715f * u * u * u));
    return 0.5f * (1.f + t) + 0.5f * u * (1.f - t * t) * k * (1.f + 3.f * 0.044715f * u * u);
  }
  return 0.5f * (1.f + erff(u * 0.7071067811865476f)) + u * expf(-0.5f * u * u) * 0.3989422804014327f;
}

template <typename T, typename W>
__global__ void __launch_bounds__(kColumns) bias_gelu_forward_kernel(BiasGeluParams p) {
  const int64_t n = p.rows * p.H, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const T* x = static_cast<const T*>(p.x);
  const W* b = static_cast<const W*>(p.bias);
  T* y = static_cast<T*>(p.out);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float u = to_float(from_float<T>(to_float(x[i]) + to_float(b[i % p.H])));
    y[i] = from_float<T>(gelu(u, p.tanh));
  }
}

template <typename T, typename W>
__global__ void __launch_bounds__(kColumns) bias_gelu_backward_kernel(BiasGeluParams p) {
  const int64_t n = p.rows * p.H, stride = static_cast<int64_t>(gridDim.x) * blockDim.x;
  const T* x = static_cast<const T*>(p.x);
  const W* b = static_cast<const W*>(p.bias);
  const T* dy = static_cast<const T*>(p.grad_out);
  T* du = static_cast<T*>(p.grad_in);
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride) {
    const float u = to_float(from_float<T>(to_float(x[i]) + to_float(b[i % p.H])));
    du[i] = from_float<T>(to_float(dy[i]) * gelu_grad(u, p.tanh));
  }
}

template <typename T>
__global__ void __launch_bounds__(kColumns) bias_grad_kernel(BiasGeluParams p) {
  int64_t j, r0;
  if (!column_place(p.H, j, r0)) return;
  const T* du = static_cast<const T*>(p.grad_in);
  float db = 0.f;
  for (int64_t row = r0; row < r0 + kColumnRows && row < p.rows; ++row) db += to_float(du[row * p.H + j]);
  atomicAdd(p.grad_bias + j, db);
}

// Launch<T, W>::run(p, stream) for the params' activation and parameter dtypes (W float32 or T).
template <template <typename, typename> class Launch, typename Params>
cudaError_t with_dtypes(const Params& p, cudaStream_t stream) {
  if (p.rows < 1 || p.H < 1 || (p.param_dtype != DType::kFloat32 && p.param_dtype != p.dtype))
    return cudaErrorInvalidValue;
  const bool float_params = p.param_dtype == DType::kFloat32;
  switch (p.dtype) {
    case DType::kFloat32: return Launch<float, float>::run(p, stream);
    case DType::kBFloat16:
      return float_params ? Launch<__nv_bfloat16, float>::run(p, stream)
                          : Launch<__nv_bfloat16, __nv_bfloat16>::run(p, stream);
    case DType::kFloat16:
      return float_params ? Launch<__half, float>::run(p, stream) : Launch<__half, __half>::run(p, stream);
  }
  return cudaErrorInvalidValue;
}

int64_t row_blocks(int64_t rows) { return (rows + kRowWarps - 1) / kRowWarps; }
int64_t column_blocks(int64_t rows, int64_t H) {
  return ((H + kColumns - 1) / kColumns) * ((rows + kColumnRows - 1) / kColumnRows);
}
int64_t elementwise_blocks(int64_t n) { return std::min<int64_t>((n + kColumns - 1) / kColumns, 65535); }

template <typename T, typename W>
struct NormForward {
  static cudaError_t run(const AddLayerNormParams& p, cudaStream_t stream) {
    return launch_with_shared(add_layer_norm_forward_kernel<T, W>, row_blocks(p.rows), kRowWarps * kWarp, 0, p, stream);
  }
};

// The rows' ds, then the column sums of dw and db.
template <typename T, typename W>
struct NormBackward {
  static cudaError_t run(const AddLayerNormParams& p, cudaStream_t stream) {
    const cudaError_t err =
        launch_with_shared(add_layer_norm_backward_kernel<T, W>, row_blocks(p.rows), kRowWarps * kWarp, 0, p, stream);
    if (err != cudaSuccess) return err;
    return launch_with_shared(layer_norm_parameter_grads_kernel<T>, column_blocks(p.rows, p.H), kColumns, 0, p, stream);
  }
};

template <typename T, typename W>
struct GeluForward {
  static cudaError_t run(const BiasGeluParams& p, cudaStream_t stream) {
    return launch_with_shared(bias_gelu_forward_kernel<T, W>, elementwise_blocks(p.rows * p.H), kColumns, 0, p, stream);
  }
};

// The elements' du, then the column sums of db.
template <typename T, typename W>
struct GeluBackward {
  static cudaError_t run(const BiasGeluParams& p, cudaStream_t stream) {
    const cudaError_t err =
        launch_with_shared(bias_gelu_backward_kernel<T, W>, elementwise_blocks(p.rows * p.H), kColumns, 0, p, stream);
    if (err != cudaSuccess) return err;
    return launch_with_shared(bias_grad_kernel<T>, column_blocks(p.rows, p.H), kColumns, 0, p, stream);
  }
};

}  // namespace

cudaError_t add_layer_norm_forward(const AddLayerNormParams& p, cudaStream_t stream) {
  return with_dtypes<NormForward>(p, stream);
}
cudaError_t add_layer_norm_backward(const AddLayerNormParams& p, cudaStream_t stream) {
  return with_dtypes<NormBackward>(p, stream);
}
cudaError_t bias_gelu_forward(const BiasGeluParams& p, cudaStream_t stream) {
  return with_dtypes<GeluForward>(p, stream);
}
cudaError_t bias_gelu_backward(const BiasGeluParams& p, cudaStream_t stream) {
  return with_dtypes<GeluBackward>(p, stream);
}

}  // namespace spanformer::ops::cuda
