// The flash kernels' lab: version 1's variants awaiting a GPU (docs/platform.md) (src/ops/cuda/variants.h names them;
// SPANFORMER_FLASH_KERNEL selects one), built from the mainline's pieces (src/ops/cuda/flash_attention_mma.cuh):
//   v1-m2     the mainline forward with two sets of 16 rows a warp (MT 2, 128 queries a block), D 32 / 64:
//             each K / V fragment serves both sets, whose softmax steps interleave (nvcc 13.2, sm_90: 254
//             registers at D 32, 255 and 44 bytes of spill loads at D 64);
//   v1-async  the mainline forward with K / V tiles double-buffered by cp.async (DoubleBufferedTiles),
//             every D: tile t + 1's copies in flight while tile t is computed;
//   v1-keys   the backward's dk and dv from a key-major kernel (backward_keys_kernel, D 32 / 64; no
//             atomics, every element written) while the mainline's query-major kernel forms dq only.
// Tested on the CPU model of CUDA (FlashEmulated.LabVariantsWithinTheReferenceError: a tile read before
// its copies landed, or an element the key-major kernel misses, is NaN there); timed on a GPU by
// `scripts/gpu-check.sh tune`.
#include "kernels.h"
#include "ops/cuda/flash_attention_mma.cuh"

namespace spanformer::ops::cuda {
namespace {

// The same with cp.async (sm_80+): every thread issues its 16-byte copies and goes on; they land at its
// cp_async_wait, rows at or past `end` as zeros. The double-buffered forward's loads.
template <typename T, int D, int Rows>
__device__ __forceinline__ void load_rows_async(T* dst, const T* src, int64_t r0, int64_t end) {
  constexpr int P = pitch<D>(), V = 16 / sizeof(T), VR = D / V, kThreads = kWarps * kWarp, N = Rows * VR / kThreads;
  static_assert(Rows * VR % kThreads == 0, "whole vectors per thread");
  const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const int idx = tid + n * kThreads, row = idx / VR, e = (idx % VR) * V;
    const bool valid = r0 + row < end;
    cp_async16(dst + row * P + e, valid ? src + (r0 + row) * D + e : src, valid);
  }
}

// Two K / V buffers: tile t + 1's copies (cp.async) are in flight while tile t is computed, and one
// barrier a tile both publishes tile t and frees the buffer tile t + 1 goes into (every warp is past
// tile t - 1, which read it).
struct DoubleBufferedTiles {
  static constexpr int kBuffers = 2;
  template <typename T, int D>
  __device__ static void start(T* ks, const T* k, const T* v, const Tile& w) {
    // tile 0 (lo < hi: the block's first query reads its own position)
    load_rows_async<T, D, kKeys>(ks, k, w.lo, w.hi);
    load_rows_async<T, D, kKeys>(ks + kKeys * pitch<D>(), v, w.lo, w.hi);
    cp_async_commit();
  }
  template <typename T, int D>
  __device__ static const T* tile(T* ks, const T* k, const T* v, const Tile& w, int64_t j0, int& buffer) {
    constexpr int kBuffer = 2 * kKeys * pitch<D>();
    cp_async_wait<0>();
    __syncthreads();  // tile j0 is in for every thread; the other buffer is free
    T* next = ks + (buffer ^ 1) * kBuffer;
    if (j0 + kKeys < w.hi) {
      load_rows_async<T, D, kKeys>(next, k, j0 + kKeys, w.hi);
      load_rows_async<T, D, kKeys>(next + kKeys * pitch<D>(), v, j0 + kKeys, w.hi);
    }
    cp_async_commit();
    const T* current = ks + buffer * kBuffer;
    buffer ^= 1;
    return current;
  }
};

template <typename T, int D>
constexpr size_t keys_bytes() { return 2 * kRows * pitch<D>() * sizeof(T) + 2 * kRows * sizeof(float); }

// dk and dv key-major (D 32 / 64): a block takes 64 keys [j0, j0 + 64) of one (b, h), each warp 16 of
// them, K_w and V_w as A fragments in registers; query tiles of 64 walk the queries that read any of the
// block's keys (positions j0 .. j0 + 63 + band - 1). Per tile, transposed: S^T = K_w Q^T, P^T =
// e^{S^T - lse}, dP^T = V_w dout^T, dS^T = P^T (Z dP^T - delta) / sqrt(D); dv_w += (P Z)^T dout and
// dk_w += dS^T Q accumulate in registers and are written once: no atomics, every element written.
template <typename T, int D>
__global__ void __launch_bounds__(kWarps * kWarp) backward_keys_kernel(FlashParams p) {
  SPANFORMER_DYNAMIC_SHARED(float, smem);
  constexpr int P = pitch<D>(), NT = D / 8;
  T* qs = reinterpret_cast<T*>(smem);                      // (kRows, P): a query tile
  T* dos = qs + kRows * P;                                 // (kRows, P): its output gradients
  float* lses = reinterpret_cast<float*>(dos + kRows * P);  // (kRows)
  float* deltas = lses + kRows;                            // (kRows)
  const int64_t tiles = (p.C + kKeys - 1) / kKeys;
  const int64_t x = blockIdx.x / tiles, b = x / p.K, h = x % p.K, j0 = (blockIdx.x % tiles) * kKeys;
  const int lane = static_cast<int>(threadIdx.x) % kWarp, warp = static_cast<int>(threadIdx.x) / kWarp;
  const int g = lane >> 2, t = lane & 3;
  const int64_t offset = p.C - p.N, kr0 = j0 + warp * 16;  // the warp's first key
  const int64_t ilo = max(static_cast<int64_t>(0), j0 - offset);
  const int64_t ihi = min(p.N, j0 + kKeys - 1 + p.band - offset);  // one past the last query reading the block
  const float scale = rsqrtf(static_cast<float>(D));
  const T* q = static_cast<const T*>(p.q) + x * p.N * D;
  const T* dout = static_cast<const T*>(p.grad_out) + x * p.N * D;
  HeldFragments<D> ka, va;  // K_w, V_w (rows past C zero)
  ka.load_global(static_cast<const T*>(p.k) + x * p.C * D, kr0, p.C, g, t);
  va.load_global(static_cast<const T*>(p.v) + x * p.C * D, kr0, p.C, g, t);
  float dk[NT][4], dv[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) dk[n][e] = dv[n][e] = 0.f;

  for (int64_t i0 = ilo; i0 < ihi; i0 += kRows) {
    __syncthreads();  // the previous tile is consumed
    load_rows<T, D, kRows>(qs, q, i0, ihi);
    load_rows<T, D, kRows>(dos, dout, i0, ihi);
    if (threadIdx.x < kRows) {
      const int64_t i = i0 + threadIdx.x;
      lses[threadIdx.x] = i < ihi ? p.lse[x * p.N + i] : 0.f;
      deltas[threadIdx.x] = i < ihi ? p.delta[x * p.N + i] : 0.f;
    }
    __syncthreads();
    float s[kRows / 8][4], dp[kRows / 8][4];  // rows: the warp's keys g, g + 8; columns: the tile's queries
    fragments_times_keys<T, D>(s, ka, qs, P, g, t);   // S^T = K_w Q^T
    fragments_times_keys<T, D>(dp, va, dos, P, g, t);  // dP^T = V_w dout^T
    // Key kr0 + row is read by query i0 + col when 0 <= offset + i0 + col - (kr0 + row) < band.
    const int rows_left = static_cast<int>(p.C - kr0), cols_left = static_cast<int>(ihi - i0);
    const int base = static_cast<int>(offset + i0 - kr0);
#pragma unroll
    for (int n = 0; n < kRows / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = g + (e >> 1) * 8, col = n * 8 + 2 * t + (e & 1), back = base + col - row;
        const bool seen = row < rows_left && col < cols_left && back >= 0 && back < p.band;
        const float pr = seen ? __expf(s[n][e] * scale - lses[col]) : 0.f;
        const float z = pr > 0.f ? dropout_at(p, b, h, offset + i0 + col, kr0 + row) : 0.f;
        s[n][e] = pr * (z * dp[n][e] - deltas[col]) * scale;  // dS^T
        dp[n][e] = pr * z;                                    // (P Z)^T
      }
    weights_times_rows<T, D>(dv, dp, dos, P, g, t);  // dv_w += (P Z)^T dout
    weights_times_rows<T, D>(dk, s, qs, P, g, t);    // dk_w += dS^T Q
  }

#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t j = kr0 + g + rr * 8;
    if (j >= p.C) continue;
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        p.grad_k[(x * p.C + j) * D + n * 8 + 2 * t + c] = dk[n][2 * rr + c];
        p.grad_v[(x * p.C + j) * D + n * 8 + 2 * t + c] = dv[n][2 * rr + c];
      }
  }
}

template <typename T, int D>
cudaError_t forward_at(const FlashParams& p, cudaStream_t stream) {
  if constexpr (D <= 64)
    if (p.variant == FlashVariant::lab_m2)
      return launch(forward_mma_kernel<T, D, 2, LoadedTiles>, forward_bytes<T, D, LoadedTiles>(), p, stream, 2);
  return launch(forward_mma_kernel<T, D, 1, DoubleBufferedTiles>, forward_bytes<T, D, DoubleBufferedTiles>(), p, stream);
}

// dq by the mainline's query-major kernel without its atomics, then dk and dv by key tiles.
template <typename T, int D>
cudaError_t backward_by_keys(const FlashParams& p, cudaStream_t stream) {
  if constexpr (D <= 64) {
    cudaError_t err = launch(backward_mma_kernel<T, D, false>, backward_bytes<T, D, false>(), p, stream);
    if (err != cudaSuccess) return err;
    return launch_with_shared(backward_keys_kernel<T, D>, p.B * p.K * ((p.C + kKeys - 1) / kKeys), kWarps * kWarp,
                              keys_bytes<T, D>(), p, stream);
  }
  return cudaErrorInvalidValue;  // built for D 32 / 64 only
}

template <typename T>
cudaError_t forward_for_width(const FlashParams& p, cudaStream_t stream) {
  return with_mma_width(p.D, [&](auto d) { return forward_at<T, decltype(d)::value>(p, stream); });
}

template <typename T>
cudaError_t backward_for_width(const FlashParams& p, cudaStream_t stream) {
  return with_mma_width(p.D, [&](auto d) { return backward_by_keys<T, decltype(d)::value>(p, stream); });
}

}  // namespace

bool flash_lab_forward_applies(const FlashParams& p) {
  return (p.variant == FlashVariant::lab_m2 && p.D <= 64) || p.variant == FlashVariant::lab_async;
}

cudaError_t flash_lab_forward(const FlashParams& p, cudaStream_t stream) {
  if (!flash_lab_forward_applies(p) || !flash_mma_forward_supported(p)) return cudaErrorInvalidValue;
  return p.dtype == DType::kBFloat16 ? forward_for_width<__nv_bfloat16>(p, stream) : forward_for_width<__half>(p, stream);
}

bool flash_lab_backward_applies(const FlashParams& p) {
  return p.variant == FlashVariant::lab_keys && (p.D == 32 || p.D == 64);
}

cudaError_t flash_lab_backward(const FlashParams& p, cudaStream_t stream) {
  if (!flash_lab_backward_applies(p) || !flash_mma_backward_supported(p)) return cudaErrorInvalidValue;
  return p.dtype == DType::kBFloat16 ? backward_for_width<__nv_bfloat16>(p, stream) : backward_for_width<__half>(p, stream);
}

}  // namespace spanformer::ops::cuda
