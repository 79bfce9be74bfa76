// The fused step kernels' params (cuda/step_kernels.cu): plain pointers and sizes, no LibTorch headers.
#pragma once
#include "ops/cuda/params.h"

namespace spanformer::ops::cuda {

// The kernels' params: a training step's elementwise work between its products.
// Rows of H contiguous elements; activations `dtype`, the LayerNorm's weight and bias and the bias of
// bias + GELU `param_dtype` (float32, or `dtype`); statistics and parameter gradients float32.
struct AddLayerNormParams {
  const void* x;            // (rows, H): the residual stream
  const void* r;            // (rows, H): the branch added to it
  const void* weight;       // (H)
  const void* bias;         // (H)
  void* sum;                // forward output (rows, H): s = x + r, rounded to `dtype`
  void* out;                // forward output (rows, H): y = (s - mean) rstd weight + bias
  float* mean;              // (rows)
  float* rstd;              // (rows): 1 / sqrt(var + eps), var the biased variance of s
  const void* grad_out;     // backward input (rows, H): dy
  const void* grad_sum;     // backward input (rows, H): the gradient reaching s directly, or null
  void* grad_in;            // backward output (rows, H): ds, which is dx and dr
  float* grad_weight;       // backward outputs (H), zeroed by the caller
  float* grad_bias;
  int64_t rows, H;
  float eps;
  DType dtype, param_dtype;
};

struct BiasGeluParams {
  const void* x;            // (rows, H): a product without its bias
  const void* bias;         // (H)
  void* out;                // forward output (rows, H): gelu(x + bias)
  const void* grad_out;     // backward input (rows, H)
  void* grad_in;            // backward output (rows, H): d(x + bias)
  float* grad_bias;         // backward output (H), zeroed by the caller
  int64_t rows, H;
  bool tanh;                // GELU's tanh approximation, else the exact (erf) form
  DType dtype, param_dtype;
};

cudaError_t add_layer_norm_forward(const AddLayerNormParams& params, cudaStream_t stream);
cudaError_t add_layer_norm_backward(const AddLayerNormParams& params, cudaStream_t stream);
cudaError_t bias_gelu_forward(const BiasGeluParams& params, cudaStream_t stream);
cudaError_t bias_gelu_backward(const BiasGeluParams& params, cudaStream_t stream);

}  // namespace spanformer::ops::cuda
