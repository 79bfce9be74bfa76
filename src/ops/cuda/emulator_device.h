// Device side of the CPU model of CUDA (emulator.h says what it models): qualifiers, built-in variables,
// warp intrinsics, atomics, math intrinsics and the bf16 / fp16 types, for kernels compiled as C++ with
// SPANFORMER_CUDA_EMULATE (device.cuh includes this instead of cuda_bf16.h and cuda_fp16.h).
#pragma once
#include "emulator.h"


#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static thread_local
#define threadIdx (::spanformer::cuda_emulator::current().thread_idx)
#define blockIdx (::spanformer::cuda_emulator::current().block_idx)
#define blockDim (::spanformer::cuda_emulator::current().block_dim)
#define gridDim (::spanformer::cuda_emulator::current().grid_dim)
constexpr int warpSize = 32;

inline void __syncthreads() { spanformer::cuda_emulator::block_barrier(); }

namespace spanformer::cuda_emulator {

inline void combine_nothing(void* const*, unsigned) {}

struct ShuffleOperand {
  uint64_t value;
  int src;  // the lane read, or -1: keep the own value (beyond the segment of `width` lanes)
  uint64_t result;
};
inline void combine_shuffle(void* const* operands, unsigned mask) {
  for (int l = 0; l < 32; ++l) {
    if (!(mask >> l & 1u)) continue;
    auto* o = static_cast<ShuffleOperand*>(operands[l]);
    if (o->src < 0) {
      o->result = o->value;
      continue;
    }
    if (!(mask >> o->src & 1u)) fail("__shfl*_sync reads a lane outside its mask");
    o->result = static_cast<ShuffleOperand*>(operands[o->src])->value;
  }
}

template <class T>
T shuffle(unsigned mask, T var, int src) {
  static_assert(sizeof(T) <= 8, "shuffles move 32- or 64-bit values");
  ShuffleOperand o{0, src, 0};
  std::memcpy(&o.value, &var, sizeof(T));
  warp_collective(mask, combine_shuffle, &o);
  T out;
  std::memcpy(&out, &o.result, sizeof(T));
  return out;
}

struct VoteOperand {
  int predicate;
  unsigned ballot;
};
inline void combine_vote(void* const* operands, unsigned mask) {
  unsigned ballot = 0;
  for (int l = 0; l < 32; ++l)
    if ((mask >> l & 1u) && static_cast<VoteOperand*>(operands[l])->predicate) ballot |= 1u << l;
  for (int l = 0; l < 32; ++l)
    if (mask >> l & 1u) static_cast<VoteOperand*>(operands[l])->ballot = ballot;
}
inline unsigned vote(unsigned mask, int predicate) {
  VoteOperand o{predicate, 0};
  warp_collective(mask, combine_vote, &o);
  return o.ballot;
}

}  // namespace spanformer::cuda_emulator

inline void __syncwarp(unsigned mask = 0xffffffffu) {
  spanformer::cuda_emulator::warp_collective(mask, spanformer::cuda_emulator::combine_nothing, nullptr);
}
template <class T>
T __shfl_sync(unsigned mask, T var, int src_lane, int width = 32) {
  const int lane = spanformer::cuda_emulator::current().lane;
  return spanformer::cuda_emulator::shuffle(mask, var, (lane & ~(width - 1)) + (src_lane & (width - 1)));
}
template <class T>
T __shfl_xor_sync(unsigned mask, T var, int lane_mask, int width = 32) {
  const int lane = spanformer::cuda_emulator::current().lane, src = lane ^ lane_mask;
  return spanformer::cuda_emulator::shuffle(mask, var, (src & ~(width - 1)) == (lane & ~(width - 1)) ? src : -1);
}
template <class T>
T __shfl_down_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  const int lane = spanformer::cuda_emulator::current().lane;
  const int in_segment = (lane & (width - 1)) + static_cast<int>(delta);
  return spanformer::cuda_emulator::shuffle(mask, var, in_segment < width ? lane + static_cast<int>(delta) : -1);
}
template <class T>
T __shfl_up_sync(unsigned mask, T var, unsigned delta, int width = 32) {
  const int lane = spanformer::cuda_emulator::current().lane;
  const int in_segment = (lane & (width - 1)) - static_cast<int>(delta);
  return spanformer::cuda_emulator::shuffle(mask, var, in_segment >= 0 ? lane - static_cast<int>(delta) : -1);
}
inline unsigned __ballot_sync(unsigned mask, int predicate) { return spanformer::cuda_emulator::vote(mask, predicate); }
inline int __any_sync(unsigned mask, int predicate) { return spanformer::cuda_emulator::vote(mask, predicate) != 0; }
inline int __all_sync(unsigned mask, int predicate) {
  return spanformer::cuda_emulator::vote(mask, predicate) == mask;
}

template <class T>
T atomicAdd(T* address, T value) {
  const T old = *address;
  *address = old + value;
  return old;
}

inline float __expf(float x) { return std::exp(x); }
inline float __logf(float x) { return std::log(x); }
inline float __fdividef(float a, float b) { return a / b; }
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }
inline int min(int a, int b) { return a < b ? a : b; }
inline int max(int a, int b) { return a > b ? a : b; }
inline unsigned min(unsigned a, unsigned b) { return a < b ? a : b; }
inline unsigned max(unsigned a, unsigned b) { return a > b ? a : b; }
inline long min(long a, long b) { return a < b ? a : b; }
inline long max(long a, long b) { return a > b ? a : b; }
inline long long min(long long a, long long b) { return a < b ? a : b; }
inline long long max(long long a, long long b) { return a > b ? a : b; }
inline float min(float a, float b) { return std::fmin(a, b); }
inline float max(float a, float b) { return std::fmax(a, b); }

// bfloat16 and float16 (cuda_bf16.h, cuda_fp16.h): storage and round-to-nearest-even conversions.
struct __nv_bfloat16 {
  uint16_t bits;
};
struct __half {
  uint16_t bits;
};
inline float __bfloat162float(__nv_bfloat16 x) {
  const uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline __nv_bfloat16 __float2bfloat16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return {static_cast<uint16_t>((u >> 16) | 0x40u)};  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);  // round to nearest, ties to even
  return {static_cast<uint16_t>(u >> 16)};
}
inline float __half2float(__half x) {
  _Float16 h;
  std::memcpy(&h, &x.bits, 2);
  return static_cast<float>(h);
}
inline __half __float2half(float f) {
  const auto h = static_cast<_Float16>(f);  // the compiler's IEEE binary16, round to nearest even
  __half x;
  std::memcpy(&x.bits, &h, 2);
  return x;
}
