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

__global__ void missing_barrier_kernel(float* out) {
  SPANFORMER_DYNAMIC_SHARED(float, smem);
  const int lane = static_cast<int>(threadIdx.x) % 32, warp = static_cast<int>(threadIdx.x) / 32;
  if (warp == 1) smem[lane] = 1.f;
  else out[lane] = smem[lane];  // no barrier since warp 1's write
  __syncthreads();
  if (warp == 0) smem[32 + lane] = 2.f;
  else out[32 + lane] = smem[32 + lane];  // no barrier since warp 0's write
}

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

__global__ void async_copies_kernel(int mode, const float* in, float* out, float* global_scratch) {
  SPANFORMER_DYNAMIC_SHARED(float, smem);
  const int t = static_cast<int>(threadIdx.x);
  float* a = smem + 4 * t;
  float* b = smem + 256 + 4 * t;
  float* c = smem + 512 + 4 * t;
  float* o = out + 6 * t;
  if (mode == 2) ops::cuda::cp_async16(a, in + 4 * t + 1, true);
  if (mode == 3) ops::cuda::cp_async16(global_scratch + 4 * t, in + 4 * t, true);
  ops::cuda::cp_async16(a, in + 4 * t, true);
  ops::cuda::cp_async16(b, in + 4 * t, false);
  ops::cuda::cp_async_commit();
  ops::cuda::cp_async16(c, in + 256 + 4 * t, true);
  ops::cuda::cp_async_commit();
  if (mode == 1) return;
  o[0] = a[0];
  ops::cuda::cp_async_wait<1>();
  o[1] = a[0];
  o[2] = b[0];
  o[3] = c[0];
  ops::cuda::cp_async_wait<0>();
  o[4] = c[0];
  __syncthreads();
  o[5] = smem[4 * (t ^ 1)];
}

}  // namespace

std::string async_copies(int mode, const std::vector<float>& in, std::vector<float>& out) {
  out.assign(64 * 6, -1.f);
  std::vector<float> scratch(256);
  SPANFORMER_LAUNCH(async_copies_kernel, 1, 64, 768 * sizeof(float), nullptr)(mode, in.data(), out.data(),
                                                                              scratch.data());
  return result();
}

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

std::string missing_barrier(std::vector<float>& out) {
  out.assign(64, 0.f);
  SPANFORMER_LAUNCH(missing_barrier_kernel, 1, 64, 64 * sizeof(float), nullptr)(out.data());
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
