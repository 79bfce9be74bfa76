// Adaptive-span attention forward on the tensor cores: version 1 (semantics and the backward that uses
// its row statistics: span_attention_kernels.cu and include/spanformer/ops/adaptive_span_attention.h).
//
// Per head h, query i (position W + i) and distance d = 1 .. W (key row j = i + W - d):
//   s_id = q_i . (k_j + pe[:, L - d]) / sqrt(D),   m_d = clamp((z_h - (d - 1)) / R + 1, 0, 1) for d <= S_h, else 0,
//   out_i = sum_d e^{s_id} m_d keep_id v_j / (sum_d e^{s_id} m_d + 1e-8 sum_d e^{s_id}),
// the last sum (Z) over every key of the window, as the reference computes it (docs/kernels.md, issue 10).
//
// Tiling: a block of 4 warps takes 64 queries [i0, i0 + 64) of one (b, h), each warp 16 rows; key tiles
// of 64 rows j0 = i0, i0 + 64, ... (a query reads rows i .. i + W - 1). Per tile, through shared memory:
//   ks, vs    the tile's key and value rows (64 x D, rows padded to D + 8 elements),
//   pes       pe's columns for the 127 distances the (query tile, key tile) pair spans, transposed:
//             pes[c][e] = pe[e][L - (dlo + c)] with dlo = i0 + W - j0 - 63 the pair's smallest distance
//             (read from key_pe_by_distance, pe transposed by the glue, so that rows are 16-byte loads),
//   g         per warp, G = Q_w pes^T (16 x 80 fp32): the position term of every distance the warp's rows
//             meet in this tile; score element (row r, key n) reads G[r][r - n + 63].
// Q_w K^T and Q_w pes^T run on mma.sync m16n8k16 (bf16 / fp16 in, fp32 accumulate) with Q's fragments
// held in registers for the whole row of tiles; the online softmax keeps (max, Z, N) per row in fp32 and
// the weights w = e m keep / (1 - p) go back into the tensor cores as A fragments of the P V product (the
// accumulator layout of two 8-key tiles is the A layout of one 16-key chunk). A tile whose smallest
// distance dlo is beyond S_h adds to Z only: no mask, no values read, no P V product.
// Writes out and the row statistics (max, Z, N) of the reference's formula, so version 0's backward
// (recomputation from them) serves unchanged.
//
// D in {32, 64, 128} (templated: fragment arrays stay in registers); other widths and float32 take
// version 0. Tested on the CPU model of CUDA (tests/test_cuda_emulated.cpp), which computes each mma.sync
// from the PTX ISA's fragment layouts, and on an H200 (tests/test_cuda.cpp): 2.20 ms at B 8, K 8, M 512,
// D 64, L 8192 in bf16, against 4.96 ms for the plain composition; docs/kernels.md, "v1 on a GPU".
#include "../dropout_hash.h"
#include "device.cuh"
#include "params.h"

namespace spanformer::ops::cuda {
namespace {

constexpr int kRows = 64;          // queries a block
constexpr int kWarps = kRows / 16;  // 16 query rows a warp
constexpr int kKeys = 64;          // keys a tile
constexpr int kDist = 128;         // distances a (query tile, key tile) pair spans: 127, padded
constexpr int kWarpDist = 80;      // distances a warp's 16 rows span in a tile: 79, padded to 10 x 8
constexpr int kGPitch = kWarpDist + 4;

template <int D>
__host__ __device__ constexpr int pitch() { return D + 8; }  // shared rows of ks, vs, pes (elements)

template <typename T, int D>
constexpr size_t shared_bytes() {
  return (2 * kKeys + kDist) * pitch<D>() * sizeof(T) + kWarps * 16 * kGPitch * sizeof(float);
}

template <typename T>
__device__ __forceinline__ uint32_t load_pair(const T* p) {  // two consecutive elements, p 4-byte aligned
  return *reinterpret_cast<const uint32_t*>(p);
}

__device__ __forceinline__ float ramp_mask(float z, float ramp, int d) {
  return fminf(fmaxf((z - static_cast<float>(d - 1)) / ramp + 1.f, 0.f), 1.f);
}

// One key tile into shared memory: key and value rows j0 .. j0 + 63 (zero past the last row; values only
// where some pair is within the span) and pe's rows for the distances dlo .. dlo + 127 (zero outside
// 1 .. W), as 16-byte vectors, each thread's loads all issued before its stores (one memory latency a
// batch, not one an element: version 1's first GPU run spent most of its time in an element-wise loop
// here). kBatch is the batch as written; after unrolling nvcc schedules the loads of several batches
// ahead of their stores, so it does not bound the registers the copy holds (nvcc 13.0 for sm_90: 255
// registers and 256 bytes of spills at D 128, docs/kernels.md "v1 on a GPU").
template <typename T, int D>
__device__ __forceinline__ void load_tile(T* ks, T* vs, T* pes, const T* k, const T* v, const T* pe_d, int64_t j0,
                                          int64_t dlo, int64_t W, int64_t M, bool values) {
  constexpr int P = pitch<D>(), V = 16 / sizeof(T), VR = D / V, kThreads = kWarps * kWarp, kBatch = D > 64 ? 4 : 8;
  constexpr int NK = kKeys * VR / kThreads, NP = kDist * VR / kThreads, N = 2 * NK + NP;  // vectors a thread moves
  static_assert(kKeys * VR % kThreads == 0 && kDist * VR % kThreads == 0, "whole vectors per thread");
  const int tid = static_cast<int>(threadIdx.x);
  // Vector n of this thread: keys (n < NK), values (n < 2 NK), pe rows; within its part, vector
  // u = tid + n' kThreads is row u / VR, elements (u % VR) V .. + V. n is a constant after unrolling.
#pragma unroll
  for (int b0 = 0; b0 < N; b0 += kBatch) {
    Vec16 r[kBatch];
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int n = b0 + u;
      if (n >= N) continue;
      const int part = n < NK ? 0 : n < 2 * NK ? 1 : 2;
      const int idx = tid + (part == 2 ? n - 2 * NK : n - part * NK) * kThreads, row = idx / VR, e = (idx % VR) * V;
      if (part < 2) {
        const int64_t j = j0 + row;
        r[u] = (part == 0 || values) && j < W + M ? load16((part == 0 ? k : v) + j * D + e) : zero16();
      } else {
        const int64_t d = dlo + row;
        r[u] = d >= 1 && d <= W ? load16(pe_d + (d - 1) * D + e) : zero16();
      }
    }
#pragma unroll
    for (int u = 0; u < kBatch; ++u) {
      const int n = b0 + u;
      if (n >= N) continue;
      const int part = n < NK ? 0 : n < 2 * NK ? 1 : 2;
      const int idx = tid + (part == 2 ? n - 2 * NK : n - part * NK) * kThreads;
      if (part == 1 && !values) continue;
      store16((part == 0 ? ks : part == 1 ? vs : pes) + (idx / VR) * P + (idx % VR) * V, r[u]);
    }
  }
}

// MinBlocks: blocks an SM that __launch_bounds__ asks registers for (2: up to 255 registers a thread).
template <typename T, int D, int MinBlocks>
__global__ void __launch_bounds__(kWarps * kWarp, MinBlocks) forward_mma_kernel(SpanAttentionParams p) {
  SPANFORMER_DYNAMIC_SHARED(float, smem);
  constexpr int P = pitch<D>(), KC = D / 16, NT = D / 8;
  T* ks = reinterpret_cast<T*>(smem);  // (kKeys, P)
  T* vs = ks + kKeys * P;              // (kKeys, P)
  T* pes = vs + kKeys * P;             // (kDist, P)
  float* g_all = reinterpret_cast<float*>(pes + kDist * P);  // (kWarps, 16, kGPitch)

  // Block order: head rank (longest visited span first), batch, query tile.
  const int64_t tiles = (p.M + kRows - 1) / kRows;
  const int64_t h = p.head_order[blockIdx.x / (tiles * p.B)], b = (blockIdx.x / tiles) % p.B;
  const int64_t x = b * p.K + h, i0 = (blockIdx.x % tiles) * kRows, W = p.W, M = p.M, L = p.L;
  const int warp = static_cast<int>(threadIdx.x) / kWarp, lane = static_cast<int>(threadIdx.x) % kWarp;
  const int g = lane >> 2, t = lane & 3;
  const int64_t r0 = i0 + warp * 16;  // the warp's first query row
  const int S = p.visited[h];
  const float z = p.span_ratio[h] * static_cast<float>(L);
  const float inv_sqrt_d = rsqrtf(static_cast<float>(D));
  const bool dropping = p.training && p.dropout > 0.f;
  const float drop_scale = dropping ? 1.f / (1.f - p.dropout) : 1.f;
  const T* q = static_cast<const T*>(p.q) + x * M * D;
  const T* k = static_cast<const T*>(p.k) + x * (W + M) * D;
  const T* v = static_cast<const T*>(p.v) + x * (W + M) * D;
  const T* pe_d = static_cast<const T*>(p.key_pe_by_distance);  // (W, D): row d - 1 is distance d
  float* gw = g_all + warp * 16 * kGPitch;

  // Q_w as A fragments: register r of chunk c holds row g (+8 for odd r), columns 16c + 2t (+8 for r >= 2).
  uint32_t qa[KC][4];
#pragma unroll
  for (int c = 0; c < KC; ++c)
#pragma unroll
    for (int r = 0; r < 4; ++r) {
      const int64_t row = r0 + g + (r & 1) * 8;
      qa[c][r] = row < M ? load_pair(q + row * D + 16 * c + 2 * t + (r >> 1) * 8) : 0u;
    }
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float mx[2] = {-INFINITY, -INFINITY}, zs[2] = {0.f, 0.f}, ns[2] = {0.f, 0.f};  // rows g and g + 8

  const int64_t j_end = min(i0 + kRows - 1 + W, W + M);  // one past the last key row the block reads
  for (int64_t j0 = i0; j0 < j_end; j0 += kKeys) {
    const int64_t dlo = i0 + W - j0 - (kKeys - 1);  // the pair's smallest distance (row i0, key j0 + 63)
    const bool values = dlo <= S;                   // some pair within the span: mask and P V needed
    __syncthreads();  // the previous tile is consumed
    load_tile<T, D>(ks, vs, pes, k, v, pe_d, j0, dlo, W, M, values);
    __syncthreads();

    // Content scores: 8 tiles of 8 keys; B (k x n) = K^T: register r holds ks[n = g][16c + 2t (+8 for r = 1)].
    float s[8][4];
#pragma unroll
    for (int n = 0; n < 8; ++n) {
      s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
      for (int c = 0; c < KC; ++c) {
        const T* row = ks + (n * 8 + g) * P + 16 * c + 2 * t;
        const uint32_t bf[2] = {load_pair(row), load_pair(row + 8)};
        mma_16816<T>(s[n], qa[c], bf);
      }
    }
    // Position term: G = Q_w pes[16 warp .. 16 warp + 80)^T into shared memory, then the skewed reads.
#pragma unroll
    for (int n = 0; n < kWarpDist / 8; ++n) {
      float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int c = 0; c < KC; ++c) {
        const T* row = pes + (warp * 16 + n * 8 + g) * P + 16 * c + 2 * t;
        const uint32_t bf[2] = {load_pair(row), load_pair(row + 8)};
        mma_16816<T>(acc, qa[c], bf);
      }
      gw[g * kGPitch + n * 8 + 2 * t] = acc[0];
      gw[g * kGPitch + n * 8 + 2 * t + 1] = acc[1];
      gw[(g + 8) * kGPitch + n * 8 + 2 * t] = acc[2];
      gw[(g + 8) * kGPitch + n * 8 + 2 * t + 1] = acc[3];
    }
    __syncwarp();

    // Scores of the warp's rows; -inf outside the window (or past the last query). Index arithmetic in
    // 32 bits (M + W < 2^31, checked by the glue): element (row, col) is query r0 + row at distance
    // d0 + row - col.
    const int d0 = static_cast<int>(r0 + W - j0), rows_left = static_cast<int>(M - r0), Wi = static_cast<int>(W);
    float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int row = g + (e >> 1) * 8, col = n * 8 + 2 * t + (e & 1);
        const int d = d0 + row - col;
        const bool valid = row < rows_left && d >= 1 && d <= Wi;
        s[n][e] = valid ? (s[n][e] + gw[row * kGPitch + row - col + kKeys - 1]) * inv_sqrt_d : -INFINITY;
        tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[n][e]);
      }
    float rescale[2];
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {  // the 4 lanes of a row group (t = 0 .. 3) share a row
      tile_max[rr] = fmaxf(tile_max[rr], __shfl_xor_sync(kFullMask, tile_max[rr], 1));
      tile_max[rr] = fmaxf(tile_max[rr], __shfl_xor_sync(kFullMask, tile_max[rr], 2));
      const float m_new = fmaxf(mx[rr], tile_max[rr]);
      const float base = m_new == -INFINITY ? 0.f : m_new;  // a row with no key yet: e = 0, nothing to rescale
      rescale[rr] = __expf(mx[rr] - base);
      mx[rr] = m_new;
      tile_max[rr] = base;
    }
    float z_part[2] = {0.f, 0.f}, n_part[2] = {0.f, 0.f};
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int rr = e >> 1, row = g + rr * 8, col = n * 8 + 2 * t + (e & 1);
        const float ex = __expf(s[n][e] - tile_max[rr]);  // 0 for -inf scores
        z_part[rr] += ex;
        float w = 0.f;
        if (values) {
          const int d = d0 + row - col;
          const float m = d <= S ? ramp_mask(z, p.ramp, d) : 0.f;
          n_part[rr] += ex * m;
          const bool kept = !dropping || dropout_keep_hash(p.seed, b, h, r0 + row, d, static_cast<double>(p.dropout));
          w = ex * m * (kept ? drop_scale : 0.f);
        }
        s[n][e] = w;
      }
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      z_part[rr] += __shfl_xor_sync(kFullMask, z_part[rr], 1);
      z_part[rr] += __shfl_xor_sync(kFullMask, z_part[rr], 2);
      n_part[rr] += __shfl_xor_sync(kFullMask, n_part[rr], 1);
      n_part[rr] += __shfl_xor_sync(kFullMask, n_part[rr], 2);
      zs[rr] = zs[rr] * rescale[rr] + z_part[rr];
      ns[rr] = ns[rr] * rescale[rr] + n_part[rr];
    }
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      o[n][0] *= rescale[0];
      o[n][1] *= rescale[0];
      o[n][2] *= rescale[1];
      o[n][3] *= rescale[1];
    }
    if (!values) continue;  // block-uniform: beyond every row's span, Z only
    // P V: chunk c of 16 keys; A from the weights of key tiles 2c and 2c + 1; B (k x n) = V rows.
#pragma unroll
    for (int c = 0; c < kKeys / 16; ++c) {
      const uint32_t pa[4] = {pack2<T>(s[2 * c][0], s[2 * c][1]), pack2<T>(s[2 * c][2], s[2 * c][3]),
                              pack2<T>(s[2 * c + 1][0], s[2 * c + 1][1]), pack2<T>(s[2 * c + 1][2], s[2 * c + 1][3])};
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        const T* col = vs + (16 * c + 2 * t) * P + n * 8 + g;
        const uint32_t bf[2] = {pack_bits(bits_of(col[0]), bits_of(col[P])),
                                pack_bits(bits_of(col[8 * P]), bits_of(col[9 * P]))};
        mma_16816<T>(o[n], pa, bf);
      }
    }
  }

  T* out = static_cast<T*>(p.out) + x * M * D;
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t i = r0 + g + rr * 8;
    if (i >= M) continue;
    const float inv = 1.f / (ns[rr] + 1e-8f * zs[rr]);
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      out[i * D + n * 8 + 2 * t] = from_float<T>(o[n][2 * rr] * inv);
      out[i * D + n * 8 + 2 * t + 1] = from_float<T>(o[n][2 * rr + 1] * inv);
    }
    if (t == 0) {
      p.row_max[x * M + i] = mx[rr];
      p.row_z[x * M + i] = zs[rr];
      p.row_n[x * M + i] = ns[rr];
    }
  }
}

template <typename T, int D>
cudaError_t launch_mma(const SpanAttentionParams& p, cudaStream_t stream) {
  const auto kernel = p.forward_min_blocks == 3 ? forward_mma_kernel<T, D, 3> : forward_mma_kernel<T, D, 2>;
  constexpr size_t bytes = shared_bytes<T, D>();
  if (bytes > 48 * 1024) {
    const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
    if (err != cudaSuccess) return err;
  }
  const int64_t blocks = p.B * p.K * ((p.M + kRows - 1) / kRows);
  SPANFORMER_LAUNCH(kernel, static_cast<unsigned>(blocks), kWarps * kWarp, bytes, stream)(p);
  return cudaGetLastError();
}

template <typename T>
cudaError_t launch_mma_for_width(const SpanAttentionParams& p, cudaStream_t stream) {
  switch (p.D) {
    case 32: return launch_mma<T, 32>(p, stream);
    case 64: return launch_mma<T, 64>(p, stream);
    case 128: return launch_mma<T, 128>(p, stream);
    default: return cudaErrorInvalidValue;
  }
}

}  // namespace

bool span_attention_mma_supported(const SpanAttentionParams& p) {
  const auto aligned = [](const void* x) { return x != nullptr && reinterpret_cast<uintptr_t>(x) % 16 == 0; };
  return p.dtype != DType::kFloat32 && (p.D == 32 || p.D == 64 || p.D == 128) && aligned(p.k) && aligned(p.v) &&
         aligned(p.key_pe_by_distance) &&  // 16-byte tile loads
         p.W + p.M + kKeys < (int64_t{1} << 31);  // 32-bit distances and rows in the score loops
}

cudaError_t span_attention_forward_mma(const SpanAttentionParams& p, cudaStream_t stream) {
  if (!span_attention_mma_supported(p)) return cudaErrorInvalidValue;
  return p.dtype == DType::kBFloat16 ? launch_mma_for_width<__nv_bfloat16>(p, stream)
                                     : launch_mma_for_width<__half>(p, stream);
}

}  // namespace spanformer::ops::cuda
