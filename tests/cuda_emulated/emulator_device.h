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
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 x) { return x.bits; }
inline unsigned short __half_as_ushort(__half x) { return x.bits; }

namespace spanformer::cuda_emulator {

// mma.sync.aligned.m16n8k16.row.col.f32.{bf16,f16}.{bf16,f16}.f32: D = A B + C with A 16 x 16, B 16 x 8,
// C and D 16 x 8 (fp32), each spread over the warp's lanes as the PTX ISA's fragment layouts say
// ("Matrix Fragments for mma.m16n8k16 with floating point type"), with g = lane >> 2 and t = lane % 4:
//   A: register r holds elements 2r (low half) and 2r + 1: row g (+ 8 for r = 1, 3), column 2t + half (+ 8 for r >= 2)
//   B: register r holds elements 2r and 2r + 1: row (k) 2t + half (+ 8 for r = 1), column (n) g
//   C, D: element i: row g (+ 8 for i >= 2), column 2t + (i & 1)
struct MmaOperand {
  bool bf16;
  uint32_t a[4], b[2];
  float d[4];
};
inline float mma_element(uint32_t reg, int half, bool bf16) {
  const uint16_t bits = static_cast<uint16_t>(reg >> (16 * half));
  if (bf16) return __bfloat162float(__nv_bfloat16{bits});
  return __half2float(__half{bits});
}
inline void combine_mma(void* const* operands, unsigned mask) {
  if (mask != 0xffffffffu) fail("mma.sync needs every lane of the warp");
  float A[16][16], B[16][8], C[16][8];
  for (int l = 0; l < 32; ++l) {
    const auto* o = static_cast<const MmaOperand*>(operands[l]);
    const int g = l >> 2, t = l & 3;
    for (int r = 0; r < 4; ++r)
      for (int half = 0; half < 2; ++half)
        A[g + (r & 1) * 8][2 * t + half + (r >= 2) * 8] = mma_element(o->a[r], half, o->bf16);
    for (int r = 0; r < 2; ++r)
      for (int half = 0; half < 2; ++half) B[2 * t + half + r * 8][g] = mma_element(o->b[r], half, o->bf16);
    for (int i = 0; i < 4; ++i) C[g + (i >= 2) * 8][2 * t + (i & 1)] = o->d[i];
  }
  for (int l = 0; l < 32; ++l) {
    auto* o = static_cast<MmaOperand*>(operands[l]);
    const int g = l >> 2, t = l & 3;
    for (int i = 0; i < 4; ++i) {
      const int m = g + (i >= 2) * 8, n = 2 * t + (i & 1);
      float acc = C[m][n];
      for (int k = 0; k < 16; ++k) acc += A[m][k] * B[k][n];
      o->d[i] = acc;
    }
  }
}
inline void mma_m16n8k16(bool bf16, float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
  MmaOperand o{bf16, {a[0], a[1], a[2], a[3]}, {b[0], b[1]}, {d[0], d[1], d[2], d[3]}};
  warp_collective(0xffffffffu, combine_mma, &o);
  for (int i = 0; i < 4; ++i) d[i] = o.d[i];
}

// ldmatrix.sync.aligned.m8n8.{x2,x4}[.trans].shared.b16 (PTX ISA, "Warp-level matrix load instruction:
// ldmatrix"): n 8 x 8 matrices of 16-bit elements; lane 8 m + r gives the address of row r of matrix m
// (16 bytes, 16-byte aligned, in shared memory; x2 reads lanes 0-15's). Register m of lane l = 4 g + t
// holds matrix m's elements (g, 2t) and (g, 2t + 1), the lower address in the low half; transposed,
// (2t, g) and (2t + 1, g).
struct LdmatrixOperand {
  const uint16_t* row;
  int n;
  bool trans;
  uint32_t r[4];
};
inline void combine_ldmatrix(void* const* operands, unsigned mask) {
  if (mask != 0xffffffffu) fail("ldmatrix needs every lane of the warp");
  const auto* first = static_cast<const LdmatrixOperand*>(operands[0]);
  uint16_t M[4][8][8];
  for (int m = 0; m < first->n; ++m)
    for (int r = 0; r < 8; ++r) {
      const auto* o = static_cast<const LdmatrixOperand*>(operands[8 * m + r]);
      if (o->n != first->n || o->trans != first->trans) fail("ldmatrix: the lanes name different shapes");
      if (reinterpret_cast<uintptr_t>(o->row) % 16 != 0) fail("ldmatrix: a row address is not 16-byte aligned");
      if (!in_dynamic_shared(o->row, 16)) fail("ldmatrix: a row address is not in the block's shared memory");
      std::memcpy(M[m][r], o->row, 16);
    }
  for (int l = 0; l < 32; ++l) {
    auto* o = static_cast<LdmatrixOperand*>(operands[l]);
    const int g = l >> 2, t = l & 3;
    for (int m = 0; m < first->n; ++m) {
      const uint16_t lo = first->trans ? M[m][2 * t][g] : M[m][g][2 * t];
      const uint16_t hi = first->trans ? M[m][2 * t + 1][g] : M[m][g][2 * t + 1];
      o->r[m] = static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
    }
  }
}
template <int N>
void ldmatrix_m8n8(bool trans, uint32_t (&r)[N], const void* row) {
  LdmatrixOperand o{static_cast<const uint16_t*>(row), N, trans, {0, 0, 0, 0}};
  warp_collective(0xffffffffu, combine_ldmatrix, &o);
  for (int m = 0; m < N; ++m) r[m] = o.r[m];
}

}  // namespace spanformer::cuda_emulator
