// Kernels that check the CPU model of CUDA itself (selftest.h says what each computes).
#include "selftest.h"

#include "../../src/ops/cuda/device.cuh"

namespace spanformer::cuda_emulator::selftest {
namespace {

std::string result() {
  const cudaError_t err = cudaGetLastError();
  return err == cudaSuccess ? std::string() : std::string(cudaGetErrorString(err));
}

__global__ void shuffles_kernel(long long* out) {
  __shared__ long long partial[2];
  const int t = static_cast<int>(threadIdx.x), lane = t % 32;
  long long* o = out + 6 * t;
  o[0] = __shfl_sync(0xffffffffu, t, 31 - lane);
  o[1] = __shfl_xor_sync(0xffffffffu, t, 5);
  o[2] = __shfl_down_sync(0xffffffffu, t, 3);
  o[3] = __shfl_up_sync(0xffffffffu, t, 2, 8);
  o[4] = static_cast<long long>(__ballot_sync(0xffffffffu, lane % 2 == 1));
  const long long warp_total = static_cast<long long>(ops::cuda::warp_sum(static_cast<float>(t)));
  if (lane == 0) partial[t / 32] = warp_total;
  __syncthreads();
  long long block_total = partial[0] + partial[1];
  __syncthreads();
  o[5] = block_total + __shfl_xor_sync(0xffffffffu, 0LL, 1);
}

__global__ void deadlock_kernel() {
  if (threadIdx.x == 5) {
    __syncthreads();
  } else {
    (void)__shfl_xor_sync(0xffffffffu, 1, 1);
  }
}

__global__ void exited_lane_kernel() {
  if (threadIdx.x >= 16) return;
  (void)__shfl_xor_sync(0xffffffffu, 1, 1);
}

__global__ void unwritten_shared_kernel(float* out) {
  SPANFORMER_DYNAMIC_SHARED(float, smem);
  out[threadIdx.x] = smem[threadIdx.x];
}

__global__ void empty_kernel() {}

}  // namespace

std::string shuffles_and_barriers(std::vector<long long>& out) {
  out.assign(64 * 6, -1);
  SPANFORMER_LAUNCH(shuffles_kernel, 1, 64, 0, nullptr)(out.data());
  return result();
}

std::string deadlock() {
  SPANFORMER_LAUNCH(deadlock_kernel, 1, 64, 0, nullptr)();
  return result();
}

std::string exited_lane() {
  SPANFORMER_LAUNCH(exited_lane_kernel, 1, 32, 0, nullptr)();
  return result();
}

std::string unwritten_shared(std::vector<float>& out) {
  out.assign(32, 0.f);
  SPANFORMER_LAUNCH(unwritten_shared_kernel, 2, 32, 32 * sizeof(float), nullptr)(out.data());
  return result();
}

std::string launch(unsigned threads, unsigned shared_bytes, int raised) {
  if (raised > 0) cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, raised);
  SPANFORMER_LAUNCH(empty_kernel, 3, threads, shared_bytes, nullptr)();
  return result();
}

}  // namespace spanformer::cuda_emulator::selftest
