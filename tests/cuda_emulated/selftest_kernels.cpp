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

__global__ void ldmatrix_kernel(int pitch, unsigned* got, unsigned* want) {
  using T = __nv_bfloat16;
  SPANFORMER_DYNAMIC_SHARED(T, m);
  const int lane = static_cast<int>(threadIdx.x), g = lane >> 2, t = lane & 3;
  for (int i = lane; i < 32 * pitch; i += 32) m[i] = T{static_cast<uint16_t>(i)};
  __syncwarp();
  const auto at = [&](int r, int c) { return static_cast<unsigned>(r * pitch + c); };  // m[r][c]'s bits
  const auto pack = [](unsigned lo, unsigned hi) { return lo | hi << 16; };
  unsigned* o = got + 14 * lane;
  unsigned* w = want + 14 * lane;
  uint32_t a[4], b[2], b4[4];
  ops::cuda::a_of_rows(a, m, pitch, 8, 16, g, t);  // A rows 8 + g (+8), columns 16 + 2t (+1, +8, +9)
  for (int r = 0; r < 4; ++r) {
    o[r] = a[r];
    w[r] = pack(at(8 + g + (r & 1) * 8, 16 + 2 * t + (r >> 1) * 8), at(8 + g + (r & 1) * 8, 17 + 2 * t + (r >> 1) * 8));
  }
  ops::cuda::a_of_columns(a, m, pitch, 16, 8, g, t);  // A[row][k] = m[16 + k][8 + row]
  for (int r = 0; r < 4; ++r) {
    o[4 + r] = a[r];
    const int row = 8 + g + (r & 1) * 8, k = 16 + 2 * t + (r >> 1) * 8;
    w[4 + r] = pack(at(k, row), at(k + 1, row));
  }
  ops::cuda::b_of_rows(b, m, pitch, 16, 8, g, t);  // B[k][n] = m[16 + k][8 + n]: k 2t (+1, +8, +9), n g
  for (int r = 0; r < 2; ++r) {
    o[8 + r] = b[r];
    w[8 + r] = pack(at(16 + 2 * t + 8 * r, 8 + g), at(17 + 2 * t + 8 * r, 8 + g));
  }
  ops::cuda::b_of_columns2(b4, m, pitch, 8, 0, g, t);  // B[k][n] = m[8 + n][k]: n g, k 2t (+1, +8, +9, +16, ..)
  for (int r = 0; r < 4; ++r) {
    o[10 + r] = b4[r];
    w[10 + r] = pack(at(8 + g, 2 * t + 8 * r), at(8 + g, 2 * t + 8 * r + 1));
  }
}

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

std::string ldmatrix_fragments(int pitch, std::vector<unsigned>& got, std::vector<unsigned>& want) {
  got.assign(32 * 14, 0);
  want.assign(32 * 14, 1);
  SPANFORMER_LAUNCH(ldmatrix_kernel, 1, 32, 32 * pitch * 2, nullptr)(pitch, got.data(), want.data());
  return result();
}

std::string launch(unsigned threads, unsigned shared_bytes, int raised) {
  if (raised > 0) cudaFuncSetAttribute(empty_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, raised);
  SPANFORMER_LAUNCH(empty_kernel, 3, threads, shared_bytes, nullptr)();
  return result();
}

}  // namespace spanformer::cuda_emulator::selftest
