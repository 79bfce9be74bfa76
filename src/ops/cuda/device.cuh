// Device helpers shared by the CUDA kernels: element conversions (every kernel computes in fp32 and
// reads/writes float32, bfloat16 or float16), warp reductions, and the two spellings that differ between
// nvcc and the CPU model of CUDA the tests run the kernels on (tests/cuda_emulated/emulator.h): a launch and the dynamic
// shared memory array.
#pragma once
#include <cstdint>
#include <type_traits>

#ifdef SPANFORMER_CUDA_EMULATE
#include "emulator_device.h"  // tests/cuda_emulated/
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

// Two elements (lo at the lower address) as one 32-bit register: the operand unit of mma.sync.
__device__ __forceinline__ uint32_t pack_bits(unsigned short lo, unsigned short hi) {
  return static_cast<uint32_t>(lo) | (static_cast<uint32_t>(hi) << 16);
}
__device__ __forceinline__ unsigned short bits_of(__nv_bfloat16 x) { return __bfloat16_as_ushort(x); }
__device__ __forceinline__ unsigned short bits_of(__half x) { return __half_as_ushort(x); }
template <typename T>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return pack_bits(bits_of(from_float<T>(lo)), bits_of(from_float<T>(hi)));
}

// D += A B on the tensor cores: mma.sync m16n8k16 with bf16 or fp16 inputs and fp32 accumulators
// (fragment layouts: emulator_device.h, combine_mma, from the PTX ISA).
template <typename T>
__device__ __forceinline__ void mma_16816(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2]) {
#ifdef SPANFORMER_CUDA_EMULATE
  ::spanformer::cuda_emulator::mma_m16n8k16(std::is_same<T, __nv_bfloat16>::value, d, a, b);
#else
  if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  } else {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                 : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
  }
#endif
}

// Two consecutive elements as one 32-bit register (p 4-byte aligned).
template <typename T>
__device__ __forceinline__ uint32_t load_pair(const T* p) {
  return *reinterpret_cast<const uint32_t*>(p);
}

// ldmatrix.sync.aligned.m8n8.{x2,x4}[.trans].shared.b16: the warp reads N 8 x 8 matrices of 16-bit
// elements from shared memory in one instruction. Lane 8 m + r names row r of matrix m (16 bytes,
// 16-byte aligned; x2 reads lanes 0-15's names); register m of lane 4 g + t receives matrix m's elements
// (g, 2t) and (g, 2t + 1), or with Trans (2t, g) and (2t + 1, g): exactly the A / B fragments of
// mma.m16n8k16 (layouts: emulator_device.h, combine_mma and combine_ldmatrix). One instruction where
// the element gathers it replaces took 2-8 loads and packs (their composition: the emulated selftest
// LdmatrixGivesTheGatheredFragments).
template <int N, bool Trans>
__device__ __forceinline__ void ldmatrix(uint32_t (&r)[N], const void* row) {
  static_assert(N == 2 || N == 4, "x2 or x4");
#ifdef SPANFORMER_CUDA_EMULATE
  ::spanformer::cuda_emulator::ldmatrix_m8n8<N>(Trans, r, row);
#else
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(row));
  if constexpr (N == 4 && !Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  else if constexpr (N == 4)
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3]) : "r"(a));
  else if constexpr (!Trans)
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
  else
    asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];\n" : "=r"(r[0]), "=r"(r[1]) : "r"(a));
#endif
}

// cp.async.cg.shared.global (sm_80+): 16 bytes from global into shared memory without passing through
// registers, while the thread goes on; with `valid` false the 16 bytes are zeros and nothing is read
// (src-size 0). A thread's copies form a group at cp_async_commit(); cp_async_wait<N>() returns when all
// but its N most recent groups have landed; other threads see them after a __syncthreads() that follows.
// The CPU model of CUDA lands each copy at that wait and holds NaN in its destination until then.
template <typename T>
__device__ __forceinline__ void cp_async16(T* dst, const T* src, bool valid) {
#ifdef SPANFORMER_CUDA_EMULATE
  ::spanformer::cuda_emulator::cp_async(dst, src, 16, valid ? 16 : 0);
#else
  const unsigned a = static_cast<unsigned>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(a), "l"(src), "r"(valid ? 16 : 0) : "memory");
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#ifdef SPANFORMER_CUDA_EMULATE
  ::spanformer::cuda_emulator::cp_async_commit();
#else
  asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#ifdef SPANFORMER_CUDA_EMULATE
  ::spanformer::cuda_emulator::cp_async_wait(N);
#else
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

// Fragments of m16n8k16 from row-major shared matrices (16-byte aligned rows: pitches of whole 16-byte
// vectors), one ldmatrix each; g = lane >> 2, t = lane & 3 as everywhere.
// A (16 x 16): rows m0 + g (+8), columns k0 + 2t (+1, +8, +9); matrices (rows +0 / +8) x (columns +0 / +8).
template <typename T>
__device__ __forceinline__ void a_of_rows(uint32_t (&a)[4], const T* m, int pitch, int m0, int k0, int g, int t) {
  const int lane = 4 * g + t, q = lane >> 3;
  ldmatrix<4, false>(a, m + (m0 + (lane & 7) + (q & 1) * 8) * pitch + k0 + (q >> 1) * 8);
}
// A (16 x 16) of a matrix stored transposed (m[k][row]): A rows m0 + g (+8) are stored columns, A
// columns k0 + 2t (+1, +8, +9) stored rows.
template <typename T>
__device__ __forceinline__ void a_of_columns(uint32_t (&a)[4], const T* m, int pitch, int k0, int m0, int g, int t) {
  const int lane = 4 * g + t, q = lane >> 3;
  ldmatrix<4, true>(a, m + (k0 + (lane & 7) + (q >> 1) * 8) * pitch + m0 + (q & 1) * 8);
}
// B (k x n = 16 x 8) of a matrix whose rows are k: rows k0 + 2t (+1, +8, +9), column n0 + g.
template <typename T>
__device__ __forceinline__ void b_of_rows(uint32_t (&bf)[2], const T* m, int pitch, int k0, int n0, int g, int t) {
  const int lane = 4 * g + t;
  ldmatrix<2, true>(bf, m + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * pitch + n0);
}
// B fragments of R^T for the columns (k) of chunks c and c + 1, [16 c, 16 c + 32), and the 8 rows (n)
// [n0, n0 + 8) of a shared matrix R of rows by n (keys by d in Q K^T): b[0..1] chunk c, b[2..3] c + 1.
template <typename T>
__device__ __forceinline__ void b_of_columns2(uint32_t (&b)[4], const T* r, int pitch, int n0, int c, int g, int t) {
  const int lane = 4 * g + t;
  ldmatrix<4, false>(b, r + (n0 + (lane & 7)) * pitch + 16 * c + 8 * (lane >> 3));
}
// acc = A B for one warp: A rows [m0, m0 + 16) of a shared (.., Kdim) matrix, B a shared (Kdim, D)
// matrix; acc in the accumulator layout (n-tile n: rows g, g + 8, columns 8n + 2t, + 1).
template <typename T, int D, int Kdim>
__device__ __forceinline__ void rows_times(float (&acc)[D / 8][4], const T* a, int a_pitch, int m0, const T* b,
                                           int b_pitch, int g, int t) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.f;
#pragma unroll
  for (int c = 0; c < Kdim / 16; ++c) {
    uint32_t af[4];
    a_of_rows(af, a, a_pitch, m0, 16 * c, g, t);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      uint32_t bf[2];
      b_of_rows(bf, b, b_pitch, 16 * c, n * 8, g, t);
      mma_16816<T>(acc[n], af, bf);
    }
  }
}

// A warp's 16 rows [m0, m0 + 16) of a shared (.., D) matrix as the A fragments of its D / 16 column
// chunks: held in registers (Hold), or read from shared memory at each use, which keeps a kernel with
// D 128 under 255 registers.
template <typename T, int D, bool Hold>
struct RowFragments {
  uint32_t held[Hold ? D / 16 : 1][4];
  const T* m;
  int pitch, m0, g, t;
  __device__ __forceinline__ RowFragments(const T* m_, int pitch_, int m0_, int g_, int t_)
      : m(m_), pitch(pitch_), m0(m0_), g(g_), t(t_) {
    if constexpr (Hold) {
#pragma unroll
      for (int c = 0; c < D / 16; ++c) a_of_rows(held[c], m, pitch, m0, 16 * c, g, t);
    }
  }
  __device__ __forceinline__ void get(uint32_t (&a)[4], int c) const {
    if constexpr (Hold) {
      a[0] = held[c][0];
      a[1] = held[c][1];
      a[2] = held[c][2];
      a[3] = held[c][3];
    } else {
      a_of_rows(a, m, pitch, m0, 16 * c, g, t);
    }
  }
};

// A fragments held in registers, read like RowFragments: Q_w straight from global memory (rows past
// `rows` zero).
template <int D>
struct HeldFragments {
  uint32_t held[D / 16][4];
  template <typename T>
  __device__ __forceinline__ void load_global(const T* m, int64_t r0, int64_t rows, int g, int t) {
#pragma unroll
    for (int c = 0; c < D / 16; ++c)
#pragma unroll
      for (int r = 0; r < 4; ++r) {
        const int64_t row = r0 + g + (r & 1) * 8;
        held[c][r] = row < rows ? load_pair(m + row * D + 16 * c + 2 * t + (r >> 1) * 8) : 0u;
      }
  }
  __device__ __forceinline__ void get(uint32_t (&a)[4], int c) const {
    a[0] = held[c][0];
    a[1] = held[c][1];
    a[2] = held[c][2];
    a[3] = held[c][3];
  }
};

// acc[m] = A[m] R^T for one warp over 64 keys, for MT sets of 16 rows at once (each B fragment read once
// for all of them): A[m] fragments D wide, R a shared (64, D) matrix of rows by key (Q K^T, dO V^T); acc
// in the accumulator layout of eight 8-key tiles.
template <typename T, int D, int MT, typename Fragments>
__device__ __forceinline__ void fragments_times_keys(float (&acc)[MT][8][4], const Fragments (&a)[MT], const T* r,
                                                     int pitch, int g, int t) {
  static_assert(D % 32 == 0, "chunks in pairs");
#pragma unroll
  for (int n = 0; n < 8; ++n) {
#pragma unroll
    for (int m = 0; m < MT; ++m) acc[m][n][0] = acc[m][n][1] = acc[m][n][2] = acc[m][n][3] = 0.f;
#pragma unroll
    for (int c = 0; c < D / 16; c += 2) {
      uint32_t b[4];
      b_of_columns2(b, r, pitch, n * 8, c, g, t);
#pragma unroll
      for (int m = 0; m < MT; ++m) {
        uint32_t af[4];
        a[m].get(af, c);
        mma_16816<T>(acc[m][n], af, {b[0], b[1]});
        a[m].get(af, c + 1);
        mma_16816<T>(acc[m][n], af, {b[2], b[3]});
      }
    }
  }
}
// One set of 16 rows.
template <typename T, int D, typename Fragments>
__device__ __forceinline__ void fragments_times_keys(float (&acc)[8][4], const Fragments& a, const T* r, int pitch,
                                                     int g, int t) {
  fragments_times_keys<T, D, 1>(reinterpret_cast<float (&)[1][8][4]>(acc), reinterpret_cast<const Fragments (&)[1]>(a),
                                r, pitch, g, t);
}

// Rows g and g + 8 of an accumulator times rescale[0] and rescale[1] (an online softmax's correction).
template <int D>
__device__ __forceinline__ void scale_rows(float (&o)[D / 8][4], const float (&rescale)[2]) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n) {
    o[n][0] *= rescale[0];
    o[n][1] *= rescale[0];
    o[n][2] *= rescale[1];
    o[n][3] *= rescale[1];
  }
}

// grad rows row0 + g and row0 + g + 8 (those in [lo, hi)) += the accumulator's rows, fp32 atomics.
template <int D>
__device__ __forceinline__ void atomic_add_rows(float* grad, const float (&acc)[D / 8][4], int64_t row0, int64_t lo,
                                                int64_t hi, int g, int t) {
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t r = row0 + g + rr * 8;
    if (r < lo || r >= hi) continue;
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      atomicAdd(grad + r * D + n * 8 + 2 * t, acc[n][2 * rr]);
      atomicAdd(grad + r * D + n * 8 + 2 * t + 1, acc[n][2 * rr + 1]);
    }
  }
}

// acc[m] += W[m] B for one warp and MT sets of 16 rows (each B fragment read once for all), W[m] the
// weights of 64 keys held in the accumulator layout of eight 8-key tiles (rows g, g + 8; keys 8n + 2t,
// + 1), which is the A layout of four 16-key chunks (P V in a forward, dS K in a backward), B a shared
// (64, D) matrix of rows by key.
template <typename T, int D, int MT>
__device__ __forceinline__ void weights_times_rows(float (&acc)[MT][D / 8][4], const float (&w)[MT][8][4], const T* b,
                                                   int b_pitch, int g, int t) {
#pragma unroll
  for (int c = 0; c < 4; ++c) {
    uint32_t pa[MT][4];
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      pa[m][0] = pack2<T>(w[m][2 * c][0], w[m][2 * c][1]);
      pa[m][1] = pack2<T>(w[m][2 * c][2], w[m][2 * c][3]);
      pa[m][2] = pack2<T>(w[m][2 * c + 1][0], w[m][2 * c + 1][1]);
      pa[m][3] = pack2<T>(w[m][2 * c + 1][2], w[m][2 * c + 1][3]);
    }
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      uint32_t bf[2];
      b_of_rows(bf, b, b_pitch, 16 * c, n * 8, g, t);
#pragma unroll
      for (int m = 0; m < MT; ++m) mma_16816<T>(acc[m][n], pa[m], bf);
    }
  }
}
// One set of 16 rows.
template <typename T, int D>
__device__ __forceinline__ void weights_times_rows(float (&acc)[D / 8][4], const float (&w)[8][4], const T* b,
                                                   int b_pitch, int g, int t) {
  weights_times_rows<T, D, 1>(reinterpret_cast<float (&)[1][D / 8][4]>(acc), reinterpret_cast<const float (&)[1][8][4]>(w),
                              b, b_pitch, g, t);
}

// 16 bytes (8 bf16 / fp16 elements) as one load or store: the widest a thread issues (LDG.128 / STS.128).
// Both addresses must be 16-byte aligned.
#ifdef SPANFORMER_CUDA_EMULATE
struct alignas(16) Vec16 {
  uint32_t x, y, z, w;
};
#else
using Vec16 = uint4;
#endif
__device__ __forceinline__ Vec16 load16(const void* p) { return *reinterpret_cast<const Vec16*>(p); }
__device__ __forceinline__ void store16(void* p, const Vec16& v) { *reinterpret_cast<Vec16*>(p) = v; }
__device__ __forceinline__ Vec16 zero16() { return Vec16{0u, 0u, 0u, 0u}; }

__device__ __forceinline__ float warp_max(float x) {
  for (int o = kWarp / 2; o > 0; o /= 2) x = fmaxf(x, __shfl_xor_sync(kFullMask, x, o));
  return x;
}

// kernel over `blocks` blocks of `threads` threads with `bytes` of dynamic shared memory, the kernel's
// limit raised first where it passes the default 48 KiB.
template <typename Kernel, typename Params>
cudaError_t launch_with_shared(Kernel kernel, int64_t blocks, int threads, size_t bytes, const Params& p,
                               cudaStream_t stream) {
  if (bytes > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (err != cudaSuccess) return err;
  }
  SPANFORMER_LAUNCH(kernel, static_cast<unsigned>(blocks), threads, bytes, stream)(p);
  return cudaGetLastError();
}

// The head widths the tensor-core kernels are instantiated for, and the one switch from a runtime width
// to an instantiation: with_mma_width(D, f) is f(std::integral_constant<int, D>{}) for D 32, 64 or 128,
// cudaErrorInvalidValue for any other. A new width is one case here (and its shared-memory check).
inline bool mma_width(int64_t D) { return D == 32 || D == 64 || D == 128; }

template <typename F>
cudaError_t with_mma_width(int64_t D, F&& f) {
  switch (D) {
    case 32: return f(std::integral_constant<int, 32>{});
    case 64: return f(std::integral_constant<int, 64>{});
    case 128: return f(std::integral_constant<int, 128>{});
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace spanformer::ops::cuda
