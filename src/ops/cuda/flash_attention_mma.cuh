// Flash attention on the tensor cores: version 1, forward and backward (semantics and formulas:
// include/spanformer/ops/flash_attention.h; version 0, for fp32 and the other widths:
// flash_attention_kernels.cu).
//
// Query i sits at key position p_i = C - N + i and reads keys j with p_i - band < j <= p_i;
// s_ij = q_i . k_j / sqrt(D), Z_ij the dropout scale (keep / (1 - p), the shared hash), and
//   forward:   m_i = max_j s_ij, l_i = sum_j e^{s_ij - m_i}, out_i = sum_j e^{s_ij - m_i} Z_ij v_j / l_i,
//              lse_i = m_i + log l_i (fp32, for the backward);
//   backward:  P_ij = e^{s_ij - lse_i}, dP_ij = dout_i . v_j, dS_ij = P_ij (Z_ij dP_ij - delta_i)
//              (delta_i = dout_i . out_i, from the glue), dq_i = sum_j dS_ij k_j / sqrt(D),
//              dk_j = sum_i dS_ij q_i / sqrt(D), dv_j = sum_i P_ij Z_ij dout_i.
//
// Tiling (the span kernels' v1 / v2, span_attention_mma_kernels.cu, without the position term): a block
// of 4 warps takes 64 queries [i0, i0 + 64) of one (b, h), each warp 16 rows; key tiles of 64 rows
// j0 = lo, lo + 64, .. < hi cover the keys any of the block's queries reads. Q (and in the backward
// dout) are A fragments held in registers; S = Q K^T and dP = dout V^T run on mma.sync m16n8k16
// (bf16 / fp16 in, fp32 accumulate); the forward's online softmax keeps (m, l) per row and sends
// P Z back into the tensor cores as the A fragments of P V. The backward keeps dq in registers (one warp
// owns its rows) and forms dk and dv rows [16 w, +16) of each tile as block-wide products over the
// tile's 64 queries (dS^T Q, (P Z)^T dout, through shared memory), added with fp32 atomics into zeroed
// buffers.
//
// This header holds the kernels and their helpers; flash_attention_mma_kernels.cu launches the mainline
// (what `auto` runs, measured on an H100), and lab/flash_attention_lab.cu builds the variants not yet
// measured on a GPU from the same pieces (lab/variants.h lists them). The forward's key tiles come in
// through a `Tiles` form: LoadedTiles here (load, barrier, compute, barrier, one buffer), a
// double-buffered one in the lab.
//
// D in {32, 64, 128} (templated: fragment arrays stay in registers; the backward reads Q's and dout's
// fragments from shared memory at D 128, to stay under 255 registers); the rest take version 0.
// Tested on the CPU model of CUDA (tests/test_cuda_emulated.cpp, every case of tests/op_cases.h's
// flash list in bf16 and fp16) and on an H100 (FlashCuda, tests/test_cuda.cpp); figures in docs/kernels.md.
#pragma once
#include <cstdint>

#include "../dropout_hash.h"
#include "device.cuh"
#include "params.h"

namespace spanformer::ops::cuda {
namespace {  // each translation unit its own kernels: the mainline's and the lab's

constexpr int kRows = 64;           // queries a block
constexpr int kWarps = kRows / 16;  // 16 query rows a warp
constexpr int kKeys = 64;           // keys a tile
constexpr int kQPitch = kRows + 8;  // shared rows indexed by query (dS^T, (P Z)^T)

template <int D>
__host__ __device__ constexpr int pitch() { return D + 8; }

template <typename T, int D, bool Atomics>
constexpr size_t backward_bytes() {
  return ((2 * kKeys + 2 * kRows) * pitch<D>() + (Atomics ? 2 * kKeys * kQPitch : 0)) * sizeof(T);
}

// Rows [r0, r0 + rows) of a (.., D) matrix into shared memory as 16-byte vectors, zero rows at or past
// `end`; every thread's loads before its stores (see span_attention_mma_kernels.cu's load_tile).
template <typename T, int D, int Rows>
__device__ __forceinline__ void load_rows(T* dst, const T* src, int64_t r0, int64_t end) {
  constexpr int P = pitch<D>(), V = 16 / sizeof(T), VR = D / V, kThreads = kWarps * kWarp, N = Rows * VR / kThreads;
  static_assert(Rows * VR % kThreads == 0, "whole vectors per thread");
  const int tid = static_cast<int>(threadIdx.x);
  Vec16 r[N];
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const int idx = tid + n * kThreads, row = idx / VR, e = (idx % VR) * V;
    r[n] = r0 + row < end ? load16(src + (r0 + row) * D + e) : zero16();
  }
#pragma unroll
  for (int n = 0; n < N; ++n) {
    const int idx = tid + n * kThreads;
    store16(dst + (idx / VR) * P + (idx % VR) * V, r[n]);
  }
}

// What a block knows: its (b, h), query tile, the keys its queries read, the warp's place.
struct Tile {
  int64_t x, b, h, i0, offset, lo, hi, r0;
  int warp, g, t;
};

// MT: sets of 16 rows a warp (a block takes 64 MT queries; the warp's rows r0 .. r0 + 16 MT).
template <int MT = 1>
__device__ __forceinline__ Tile locate(const FlashParams& p) {
  constexpr int kBlockRows = kRows * MT;
  Tile s;
  const int64_t tiles = (p.N + kBlockRows - 1) / kBlockRows;
  s.x = blockIdx.x / tiles;
  s.b = s.x / p.K;
  s.h = s.x % p.K;
  s.i0 = (blockIdx.x % tiles) * kBlockRows;
  s.offset = p.C - p.N;
  s.lo = max(static_cast<int64_t>(0), s.offset + s.i0 - p.band + 1);
  s.hi = s.offset + min(s.i0 + kBlockRows, p.N);  // one past the last key the last query reads
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  s.warp = static_cast<int>(threadIdx.x) / kWarp;
  s.g = lane >> 2;
  s.t = lane & 3;
  s.r0 = s.i0 + s.warp * 16 * MT;
  return s;
}

// Scores of 16 rows from r0 over the key tile at j0 (accumulator layout) scaled, and masked: -inf where
// the key is not visible to the row (or the row is past N).
__device__ __forceinline__ void scale_and_mask(float (&s)[kKeys / 8][4], const FlashParams& p, const Tile& w,
                                               int64_t r0, int64_t j0, float scale) {
  // Query r0 + row at position pos reads key j0 + col when 0 <= pos - (j0 + col) < band.
  const int rows_left = static_cast<int>(p.N - r0), base = static_cast<int>(w.offset + r0 - j0);
  const int64_t band = p.band;
  if (rows_left >= 16 && base >= kKeys - 1 && base + 15 < band) {  // the whole 16 x 64 visible: no mask
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) s[n][e] *= scale;
    return;
  }
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = w.g + (e >> 1) * 8, col = n * 8 + 2 * w.t + (e & 1), back = base + row - col;
      s[n][e] = row < rows_left && back >= 0 && back < band ? s[n][e] * scale : -INFINITY;
    }
}

// s = Q_w K_tile^T (16 x 64 per warp), scaled and masked.
template <typename T, int D, typename Fragments>
__device__ __forceinline__ void scores(float (&s)[kKeys / 8][4], const Fragments& qa, const T* ks,
                                       const FlashParams& p, const Tile& w, int64_t j0, float scale) {
  fragments_times_keys<T, D>(s, qa, ks, pitch<D>(), w.g, w.t);
  scale_and_mask(s, p, w, w.r0, j0, scale);
}

// Z of the weight of key j in the row of the query at key position `pos` (1 without dropout).
__device__ __forceinline__ float dropout_at(const FlashParams& p, int64_t b, int64_t h, int64_t pos, int64_t j) {
  if (!(p.training && p.dropout > 0.f)) return 1.f;
  return dropout_keep_hash(p.seed, b, h, pos, j, static_cast<double>(p.dropout)) ? 1.f / (1.f - p.dropout) : 0.f;
}
__device__ __forceinline__ float dropout_scale(const FlashParams& p, const Tile& w, int row, int64_t j) {
  return dropout_at(p, w.b, w.h, w.offset + w.r0 + row, j);
}

// One online-softmax step of 16 rows (g, g + 8) over a key tile: s (scaled, masked scores) becomes
// e^{s - m_new}; m, l and the rescale of the rows' accumulators follow.
__device__ __forceinline__ void softmax_step(float (&s)[kKeys / 8][4], float (&mx)[2], float (&ls)[2],
                                             float (&rescale)[2]) {
  float tile_max[2] = {-INFINITY, -INFINITY};
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[n][e]);
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {  // the 4 lanes of a row group share a row
    tile_max[rr] = fmaxf(tile_max[rr], __shfl_xor_sync(kFullMask, tile_max[rr], 1));
    tile_max[rr] = fmaxf(tile_max[rr], __shfl_xor_sync(kFullMask, tile_max[rr], 2));
    const float m_new = fmaxf(mx[rr], tile_max[rr]);
    const float base = m_new == -INFINITY ? 0.f : m_new;  // no visible key yet: nothing to rescale
    rescale[rr] = __expf(mx[rr] - base);
    mx[rr] = m_new;
    tile_max[rr] = base;
  }
  float l_part[2] = {0.f, 0.f};
#pragma unroll
  for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      s[n][e] = __expf(s[n][e] - tile_max[e >> 1]);  // 0 where -inf
      l_part[e >> 1] += s[n][e];
    }
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    l_part[rr] += __shfl_xor_sync(kFullMask, l_part[rr], 1);
    l_part[rr] += __shfl_xor_sync(kFullMask, l_part[rr], 2);
    ls[rr] = ls[rr] * rescale[rr] + l_part[rr];
  }
}

// The mainline's key tiles: load, barrier, compute, barrier, one buffer. `tile` returns where tile j0's
// K rows are (its V rows kKeys * P after them); `buffer` is the form's own state.
struct LoadedTiles {
  static constexpr int kBuffers = 1;
  template <typename T, int D>
  __device__ static void start(T*, const T*, const T*, const Tile&) {}
  template <typename T, int D>
  __device__ static const T* tile(T* ks, const T* k, const T* v, const Tile& w, int64_t j0, int& /*buffer*/) {
    __syncthreads();  // the previous tile is consumed
    load_rows<T, D, kKeys>(ks, k, j0, w.hi);
    load_rows<T, D, kKeys>(ks + kKeys * pitch<D>(), v, j0, w.hi);
    __syncthreads();
    return ks;
  }
};

template <typename T, int D, typename Tiles>
constexpr size_t forward_bytes() { return Tiles::kBuffers * 2 * kKeys * pitch<D>() * sizeof(T); }

// MT sets of 16 rows a warp (the mainline takes 1; the lab's v1-m2 2 at D 32 / 64): each K and V
// fragment read from shared memory serves MT products, and the MT sets' softmax steps are independent
// instruction streams the warp interleaves.
template <typename T, int D, int MT, typename Tiles>
__global__ void __launch_bounds__(kWarps * kWarp) forward_mma_kernel(FlashParams p) {
  SPANFORMER_DYNAMIC_SHARED(float, smem);
  constexpr int P = pitch<D>(), NT = D / 8;
  T* ks = reinterpret_cast<T*>(smem);  // Tiles::kBuffers x ((kKeys, P) K rows, then (kKeys, P) V rows)
  const Tile w = locate<MT>(p);
  const float scale = rsqrtf(static_cast<float>(D));
  const bool dropping = p.training && p.dropout > 0.f;
  const T* k = static_cast<const T*>(p.k) + w.x * p.C * D;
  const T* v = static_cast<const T*>(p.v) + w.x * p.C * D;
  HeldFragments<D> qa[MT];  // Q's row sets as A fragments, from global memory
  float o[MT][NT][4], mx[MT][2], ls[MT][2];  // per set: output accumulators; rows g and g + 8: m, l
#pragma unroll
  for (int m = 0; m < MT; ++m) {
    qa[m].load_global(static_cast<const T*>(p.q) + w.x * p.N * D, w.r0 + 16 * m, p.N, w.g, w.t);
#pragma unroll
    for (int n = 0; n < NT; ++n) o[m][n][0] = o[m][n][1] = o[m][n][2] = o[m][n][3] = 0.f;
    mx[m][0] = mx[m][1] = -INFINITY;
    ls[m][0] = ls[m][1] = 0.f;
  }

  Tiles::template start<T, D>(ks, k, v, w);
  int buffer = 0;
  for (int64_t j0 = w.lo; j0 < w.hi; j0 += kKeys) {
    const T* kt = Tiles::template tile<T, D>(ks, k, v, w, j0, buffer);  // (kKeys, P): this tile's K
    const T* vt = kt + kKeys * P;                                       // (kKeys, P): its V
    float s[MT][kKeys / 8][4];
    fragments_times_keys<T, D, MT>(s, qa, kt, P, w.g, w.t);
#pragma unroll
    for (int m = 0; m < MT; ++m) {
      scale_and_mask(s[m], p, w, w.r0 + 16 * m, j0, scale);
      float rescale[2];
      softmax_step(s[m], mx[m], ls[m], rescale);
      if (dropping) {
#pragma unroll
        for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            s[m][n][e] *= dropout_at(p, w.b, w.h, w.offset + w.r0 + 16 * m + w.g + (e >> 1) * 8,
                                     j0 + n * 8 + 2 * w.t + (e & 1));
      }
      scale_rows<D>(o[m], rescale);
    }
    weights_times_rows<T, D, MT>(o, s, vt, P, w.g, w.t);  // P V
  }

  T* out = static_cast<T*>(p.out) + w.x * p.N * D;
#pragma unroll
  for (int m = 0; m < MT; ++m)
#pragma unroll
    for (int rr = 0; rr < 2; ++rr) {
      const int64_t i = w.r0 + 16 * m + w.g + rr * 8;
      if (i >= p.N) continue;
      const float inv = 1.f / ls[m][rr];
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        out[i * D + n * 8 + 2 * w.t] = from_float<T>(o[m][n][2 * rr] * inv);
        out[i * D + n * 8 + 2 * w.t + 1] = from_float<T>(o[m][n][2 * rr + 1] * inv);
      }
      if (w.t == 0) p.lse[w.x * p.N + i] = mx[m][rr] + logf(ls[m][rr]);
    }
}

// Atomics: also dk and dv, by atomics from every (query tile, key tile) pair; else dq only (the lab's
// key-major backward forms dk and dv).
template <typename T, int D, bool Atomics>
__global__ void __launch_bounds__(kWarps * kWarp) backward_mma_kernel(FlashParams p) {
  SPANFORMER_DYNAMIC_SHARED(float, smem);
  constexpr int P = pitch<D>(), QP = kQPitch, NT = D / 8;
  T* ks = reinterpret_cast<T*>(smem);  // (kKeys, P)
  T* vs = ks + kKeys * P;              // (kKeys, P)
  T* qs = vs + kKeys * P;              // (kRows, P): the block's queries
  T* dos = qs + kRows * P;             // (kRows, P): their output gradients
  T* dst = dos + kRows * P;            // (kKeys, QP): dS transposed, [key][query]
  T* wt = dst + kKeys * QP;            // (kKeys, QP): P Z transposed
  const Tile w = locate(p);
  const float scale = rsqrtf(static_cast<float>(D));
  const T* q = static_cast<const T*>(p.q) + w.x * p.N * D;
  const T* dout = static_cast<const T*>(p.grad_out) + w.x * p.N * D;
  const T* k = static_cast<const T*>(p.k) + w.x * p.C * D;
  const T* v = static_cast<const T*>(p.v) + w.x * p.C * D;
  float* gk = p.grad_k + w.x * p.C * D;
  float* gv = p.grad_v + w.x * p.C * D;
  load_rows<T, D, kRows>(qs, q, w.i0, p.N);
  load_rows<T, D, kRows>(dos, dout, w.i0, p.N);
  __syncthreads();
  // Q_w and dout_w as A fragments: in registers up to D 64, read from shared memory at D 128.
  const RowFragments<T, D, (D <= 64)> qa(qs, P, w.warp * 16, w.g, w.t), da(dos, P, w.warp * 16, w.g, w.t);
  float lse[2], delta[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t i = w.r0 + w.g + rr * 8;
    lse[rr] = i < p.N ? p.lse[w.x * p.N + i] : 0.f;
    delta[rr] = i < p.N ? p.delta[w.x * p.N + i] : 0.f;
  }
  float dq[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;

  for (int64_t j0 = w.lo; j0 < w.hi; j0 += kKeys) {
    __syncthreads();  // the previous tile's shared products are done (first trip: qs, dos written)
    load_rows<T, D, kKeys>(ks, k, j0, w.hi);
    load_rows<T, D, kKeys>(vs, v, j0, w.hi);
    __syncthreads();
    float s[kKeys / 8][4], dp[kKeys / 8][4];
    scores<T, D>(s, qa, ks, p, w, j0, scale);
    fragments_times_keys<T, D>(dp, da, vs, P, w.g, w.t);  // dP = dout_w V^T
    // dS (into s, times 1 / sqrt(D)) and P Z (into dp).
#pragma unroll
    for (int n = 0; n < kKeys / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int rr = e >> 1;
        const float pr = __expf(s[n][e] - lse[rr]);  // 0 where -inf
        const float z = pr > 0.f ? dropout_scale(p, w, w.g + rr * 8, j0 + n * 8 + 2 * w.t + (e & 1)) : 0.f;
        s[n][e] = pr * (z * dp[n][e] - delta[rr]) * scale;
        dp[n][e] = pr * z;
      }
    weights_times_rows<T, D>(dq, s, ks, P, w.g, w.t);  // dq_w += dS K_tile
    if constexpr (Atomics) {
  #pragma unroll
      for (int n = 0; n < kKeys / 8; ++n)
  #pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int qr = w.warp * 16 + w.g + (e >> 1) * 8, col = n * 8 + 2 * w.t + (e & 1);
          dst[col * QP + qr] = from_float<T>(s[n][e]);
          wt[col * QP + qr] = from_float<T>(dp[n][e]);
        }
      __syncthreads();
      // dk and dv rows [16 warp, +16) of the tile over the block's 64 queries, then atomics.
      float acc[NT][4];
      rows_times<T, D, kRows>(acc, dst, QP, w.warp * 16, qs, P, w.g, w.t);
      atomic_add_rows<D>(gk, acc, j0 + w.warp * 16, 0, w.hi, w.g, w.t);
      rows_times<T, D, kRows>(acc, wt, QP, w.warp * 16, dos, P, w.g, w.t);
      atomic_add_rows<D>(gv, acc, j0 + w.warp * 16, 0, w.hi, w.g, w.t);
    }
  }

#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t i = w.r0 + w.g + rr * 8;
    if (i >= p.N) continue;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      p.grad_q[(w.x * p.N + i) * D + n * 8 + 2 * w.t] = dq[n][2 * rr];
      p.grad_q[(w.x * p.N + i) * D + n * 8 + 2 * w.t + 1] = dq[n][2 * rr + 1];
    }
  }
}

// A kernel over the (b, h) pairs' query tiles of 64 MT rows.
template <typename Kernel>
cudaError_t launch(Kernel kernel, size_t bytes, const FlashParams& p, cudaStream_t stream, int MT = 1) {
  const int64_t rows = kRows * MT;
  return launch_with_shared(kernel, p.B * p.K * ((p.N + rows - 1) / rows), kWarps * kWarp, bytes, p, stream);
}

inline bool aligned(const void* x) { return x != nullptr && reinterpret_cast<uintptr_t>(x) % 16 == 0; }

}  // namespace
}  // namespace spanformer::ops::cuda
