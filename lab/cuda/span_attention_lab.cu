// The adaptive-span forward's lab: version 1's variants awaiting a GPU (docs/platform.md) (src/ops/cuda/variants.h names
// them; SPANFORMER_SPAN_KERNEL selects one), the mainline kernel (src/ops/cuda/span_attention_mma.cuh) with another
// form, both at 2 blocks an SM (heads visiting most of the window, the all-at-L case):
//   v1b2-async      tiles double-buffered with cp.async (DoubleBufferedTiles, D 32 / 64; at D 128 two
//                   buffers would leave one block an SM, so the mainline runs there): tile t + 1's copies
//                   in flight while tile t is computed;
//   v1b2-shortcuts  a warp whose whole 16 x 64 lies in the window skips the validity selects, and where it
//                   also lies within the span (no dropout) the mask (WholeTileShortcuts): the instructions
//                   per score Nsight Compute blamed in the all-at-L forward (nvcc 13.2, sm_90: 238 registers
//                   at D 64 against the mainline's 212, no spills; under the 3-block form's 168 registers the
//                   same code spills).
// Tested on the CPU model of CUDA (SpanAttentionEmulated.LabVariantsWithinTheReferenceError: a tile read
// before its copies landed is NaN there; a case whose heads visit most of a 200-key window reaches both
// shortcuts); timed on a GPU by `scripts/gpu-check.sh tune`.
#include "kernels.h"
#include "ops/cuda/span_attention_mma.cuh"

namespace spanformer::ops::cuda {
namespace {

// The same tile with cp.async (sm_80+): every thread issues its 16-byte copies (zeros where load_tile
// stores zeros; value rows not copied where no pair is within the span, as load_tile leaves them) and
// goes on; they land at its cp_async_wait. The double-buffered forward's loads.
template <typename T, int D>
__device__ __forceinline__ void load_tile_async(T* ks, T* vs, T* pes, const T* k, const T* v, const T* pe_d,
                                                int64_t j0, int64_t dlo, int64_t W, int64_t M, bool values) {
  constexpr int P = pitch<D>(), V = 16 / sizeof(T), VR = D / V, kThreads = kWarps * kWarp;
  constexpr int NK = kKeys * VR / kThreads, NP = kDist * VR / kThreads;
  const int tid = static_cast<int>(threadIdx.x);
#pragma unroll
  for (int n = 0; n < NK; ++n) {
    const int idx = tid + n * kThreads, row = idx / VR, e = (idx % VR) * V;
    const bool valid = j0 + row < W + M;
    cp_async16(ks + row * P + e, valid ? k + (j0 + row) * D + e : k, valid);
    if (values) cp_async16(vs + row * P + e, valid ? v + (j0 + row) * D + e : v, valid);
  }
#pragma unroll
  for (int n = 0; n < NP; ++n) {
    const int idx = tid + n * kThreads, row = idx / VR, e = (idx % VR) * V;
    const int64_t d = dlo + row;
    const bool valid = d >= 1 && d <= W;
    cp_async16(pes + row * P + e, valid ? pe_d + (d - 1) * D + e : pe_d, valid);
  }
}

// Two tile buffers: tile t + 1's copies (cp.async) are in flight while tile t is computed, and one
// barrier a tile both publishes tile t and frees the buffer tile t + 1 goes into (every warp is past
// tile t - 1, which read it).
struct DoubleBufferedTiles : LoadedTiles {
  static constexpr int kBuffers = 2;
  static constexpr int kMinBlocks = 2;
  template <typename T, int D>
  __device__ static void load(T* base, const Window<T>& src, int64_t j0) {
    constexpr int P = pitch<D>();
    const int64_t dlo = src.smallest_distance(j0);
    load_tile_async<T, D>(base, base + kKeys * P, base + 2 * kKeys * P, src.k, src.v, src.pe_d, j0, dlo, src.W, src.M,
                          dlo <= src.S);
  }
  template <typename T, int D>
  __device__ static void start(T* ks, const Window<T>& src) {
    if (src.i0 < src.j_end) load<T, D>(ks, src, src.i0);
    cp_async_commit();
  }
  template <typename T, int D>
  __device__ static const T* tile(T* ks, const Window<T>& src, int64_t j0, int& buffer) {
    constexpr int kBuffer = kTileRows * pitch<D>();
    cp_async_wait<0>();
    __syncthreads();  // tile j0 is in for every thread; the other buffer is free
    if (j0 + kKeys < src.j_end) load<T, D>(ks + (buffer ^ 1) * kBuffer, src, j0 + kKeys);
    cp_async_commit();
    const T* current = ks + buffer * kBuffer;
    buffer ^= 1;
    return current;
  }
};

// Warp-uniform shortcuts over the mainline's loops: every element of the warp's 16 x 64 in the window
// (distances d0 - 63 .. d0 + 15 within 1 .. W, every row a query): no validity selects; and, with values
// and no dropout, every mask 1 (the largest distance at most the span: (z - (d - 1)) / R + 1 >= 1 exactly
// when d - 1 <= z in fp32): w = e.
struct WholeTileShortcuts : LoadedTiles {
  static constexpr int kMinBlocks = 2;
  __device__ static void scores(float (&s)[8][4], const float* gw, float (&tile_max)[2], const WarpTile& w) {
    if (!(w.rows_left >= 16 && w.d0 - (kKeys - 1) >= 1 && w.d0 + 15 <= w.W)) return masked_scores(s, gw, tile_max, w);
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = w.g + (e >> 1) * 8, col = n * 8 + 2 * w.t + (e & 1);
        s[n][e] = (s[n][e] + gw[row * kGPitch + row - col + kKeys - 1]) * w.inv_sqrt_d;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[n][e]);
      }
  }
  __device__ static void weights(float (&s)[8][4], const float (&tile_max)[2], float (&z_part)[2], float (&n_part)[2],
                                 const WarpTile& w) {
    if (!(w.values && !w.dropping && w.d0 + 15 <= w.S && static_cast<float>(w.d0 + 14) <= w.z))
      return masked_weights(s, tile_max, z_part, n_part, w);
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const float ex = __expf(s[n][e] - tile_max[e >> 1]);  // 0 for -inf scores
        z_part[e >> 1] += ex;
        n_part[e >> 1] += ex;
        s[n][e] = ex;
      }
  }
};

template <typename T, int D, typename Form>
cudaError_t launch(const SpanAttentionParams& p, cudaStream_t stream) {
  const int64_t blocks = p.B * p.K * ((p.M + kRows - 1) / kRows);
  return launch_with_shared(forward_mma_kernel<T, D, 2, Form>, blocks, kWarps * kWarp, shared_bytes<T, D, Form>(), p,
                            stream);
}

template <typename T>
cudaError_t launch_for_width(const SpanAttentionParams& p, cudaStream_t stream) {
  return with_mma_width(p.D, [&](auto d) {
    constexpr int D = decltype(d)::value;
    if constexpr (D <= 64)
      if (p.variant == SpanVariant::lab_async) return launch<T, D, DoubleBufferedTiles>(p, stream);
    return launch<T, D, WholeTileShortcuts>(p, stream);
  });
}

}  // namespace

bool span_lab_forward_applies(const SpanAttentionParams& p) {
  return (p.variant == SpanVariant::lab_async && p.D <= 64) || p.variant == SpanVariant::lab_shortcuts;
}

cudaError_t span_lab_forward(const SpanAttentionParams& p, cudaStream_t stream) {
  if (!span_lab_forward_applies(p) || !span_attention_mma_supported(p)) return cudaErrorInvalidValue;
  return p.dtype == DType::kBFloat16 ? launch_for_width<__nv_bfloat16>(p, stream) : launch_for_width<__half>(p, stream);
}

}  // namespace spanformer::ops::cuda
