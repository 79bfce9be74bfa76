// Device helpers shared by the CUDA kernels: element conversions (every kernel computes in fp32 and
// reads/writes float32, bfloat16 or float16), warp reductions, and the two spellings that differ between
// nvcc and the CPU model of CUDA the tests run the kernels on (emulator.h): a launch and the dynamic
// shared memory array.
#pragma once
#ifdef SPANFORMER_CUDA_EMULATE
#include "emulator_device.h"
#define SPANFORMER_LAUNCH(kernel, grid, block, shared, stream) \
  ::spanformer::cuda_emulator::launch_of(kernel, grid, block, shared)
#define SPANFORMER_DYNAMIC_SHARED(T, name) T* name = reinterpret_cast<T*>(::spanformer::cuda_emulator::dynamic_shared())
#else
#include <cuda_bf16.h>
#include <cuda_fp16.h>
// kernel<<<grid, block, shared, stream>>>(args...)
#define SPANFORMER_LAUNCH(kernel, grid, block, shared, stream) kernel<<<grid, block, shared, stream>>>
#define SPANFORMER_DYNAMIC_SHARED(T, name) extern __shared__ T name[]
#endif

namespace spanformer::ops::cuda {

constexpr int kWarp = 32;
constexpr unsigned kFullMask = 0xffffffffu;

__device__ __forceinline__ float to_float(float x) { return x; }
__device__ __forceinline__ float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float to_float(__half x) { return __half2float(x); }
template <typename T> __device__ __forceinline__ T from_float(float x);
template <> __device__ __forceinline__ float from_float<float>(float x) { return x; }
template <> __device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16(x); }
template <> __device__ __forceinline__ __half from_float<__half>(float x) { return __float2half(x); }

__device__ __forceinline__ float warp_sum(float x) {
  for (int o = kWarp / 2; o > 0; o /= 2) x += __shfl_xor_sync(kFullMask, x, o);
  return x;
}

__device__ __forceinline__ float warp_max(float x) {
  for (int o = kWarp / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

}  // namespace spanformer::ops::cuda
