// What the LibTorch glue of every CUDA kernel shares: the element type of a tensor as the kernels name
// it, the launch check (one line naming the op), and the dropout settings an autograd function keeps
// for its backward.
#pragma once
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "params.h"
#ifndef SPANFORMER_CUDA_EMULATE
#include <c10/cuda/CUDAStream.h>
#endif

namespace spanformer::ops::cuda {

inline DType dtype_of(const at::Tensor& t, const char* op) {
  switch (t.scalar_type()) {
    case at::kFloat: return DType::kFloat32;
    case at::kBFloat16: return DType::kBFloat16;
    case at::kHalf: return DType::kFloat16;
    default: TORCH_CHECK(false, op, " on CUDA supports float32, bfloat16 and float16");
  }
}

// The stream the kernels launch on: LibTorch's current CUDA stream (none in the CPU model of CUDA).
inline cudaStream_t current_stream() {
#ifdef SPANFORMER_CUDA_EMULATE
  return nullptr;
#else
  return c10::cuda::getCurrentCUDAStream();
#endif
}

inline void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, ": ", cudaGetErrorString(err));
}

struct DropoutSettings {
  double dropout;
  bool training;
  int64_t seed;

  void save(torch::autograd::AutogradContext* ctx) const {
    ctx->saved_data["dropout"] = dropout;
    ctx->saved_data["training"] = training;
    ctx->saved_data["seed"] = seed;
  }
  static DropoutSettings load(torch::autograd::AutogradContext* ctx) {
    return {ctx->saved_data["dropout"].toDouble(), ctx->saved_data["training"].toBool(), ctx->saved_data["seed"].toInt()};
  }
};

}  // namespace spanformer::ops::cuda
