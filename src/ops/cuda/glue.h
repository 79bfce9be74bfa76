// What the LibTorch glue of every CUDA kernel shares: the element type of a tensor as the kernels name
// it, the stream, and the launch check (one line naming the op).
#pragma once
#include <ATen/ATen.h>

#include <cstdlib>
#include <cstring>
#include <limits>
#include <string>

#include "spanformer/util/error.h"
#include "spanformer/util/switches.h"
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

// A tensor for a kernel to fill. On the GPU, at::empty (every element is written by the kernel). On the
// CPU model of CUDA, filled with NaN first, so that an element a kernel never writes shows in the tests
// (tests/op_cases.h) instead of reading as whatever the allocator held.
inline at::Tensor uninitialized(at::IntArrayRef sizes, const at::TensorOptions& options) {
#ifdef SPANFORMER_CUDA_EMULATE
  return at::full(sizes, std::numeric_limits<double>::quiet_NaN(), options);
#else
  return at::empty(sizes, options);
#endif
}

// The row of a variant table (variants.h) a switch names (util/switches.h: unset or empty is the table's
// first row, "auto"; a name not in the table is its one line listing the names it takes). A lab row needs
// a program that carries the lab (lab/lab.h); elsewhere it is one line saying so.
template <typename Id, size_t N>
Id variant_named(const KernelVariant<Id> (&table)[N], const char* variable) {
  const std::string value = switch_value(variable);
  for (const auto& row : table)
    if (value == row.name) {
      if (row.lab && !lab_kernels().linked)
        fail("{}={} is a lab variant: this program was built without the lab (-DSPANFORMER_LAB=ON adds it)", variable,
             value);
      return row.id;
    }
  return table[0].id;  // not reached: switch_value takes only the table's names
}

inline void check_launch(cudaError_t err, const char* what) {
  TORCH_CHECK(err == cudaSuccess, what, ": ", cudaGetErrorString(err));
}

}  // namespace spanformer::ops::cuda
