// Adaptive-span attention on the tensor cores: the forward's version 1 and the backward's version 2
// (semantics: include/spanformer/ops/adaptive_span_attention.h; version 0 of both, for fp32 and the
// other widths: span_attention_kernels.cu).
//
// Per head h, query i (position W + i) and distance d = 1 .. W (key row j = i + W - d):
//   s_id = q_i . (k_j + pe[:, L - d]) / sqrt(D),   m_d = clamp((z_h - (d - 1)) / R + 1, 0, 1) for d <= S_h, else 0,
//   out_i = sum_d e^{s_id} m_d keep_id v_j / (sum_d e^{s_id} m_d + 1e-8 sum_d e^{s_id}),
// the last sum (Z) over every key of the window, as the reference computes it (docs/kernels.md).
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
// distance dlo is beyond S_h adds to Z only: no mask, no values read, no P V product; in the 2-block form,
// a warp whose 16 x 64 lies wholly in the window skips the validity selects, and wholly within the span
// (no dropout) the mask. Fragments come from shared memory by ldmatrix (device.cuh). A variant, opt-in
// until measured on a GPU (SPANFORMER_SPAN_KERNEL=v1b2-async, D 32 / 64), double-buffers the tiles with
// cp.async.
// Writes out and the row statistics (max, Z, N) of the reference's formula, from which either backward
// recomputes the scores. Blocks go longest head first (the glue's head_order), so that the short heads'
// quicker blocks fill the last wave; `__launch_bounds__` asks for 2 or 3 blocks an SM (the glue's rule).
//
// D in {32, 64, 128} (templated: fragment arrays stay in registers); other widths and float32 take
// version 0. Tested on the CPU model of CUDA (tests/test_cuda_emulated.cpp), which computes each mma.sync
// from the PTX ISA's fragment layouts, and on an H100 (tests/test_cuda.cpp): at B 8, K 8, M 512, D 64,
// L 8192 in bf16 the forward takes 1.42 ms with bimodal spans (plain composition 5.54 ms) and 1.81 ms
// with every span at L; with version 2's backward, forward + backward 6.73-6.90 and 7.99 ms (plain 15.4
// and 15.1 ms); docs/kernels.md, "v1 tuned", "v2" and "ldmatrix" (before the whole-tile shortcuts).
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

constexpr int kTileRows = 2 * kKeys + kDist;  // shared rows of one tile: keys, values, distances

template <typename T, int D, bool Async = false>
constexpr size_t shared_bytes() {
  return (Async ? 2 : 1) * kTileRows * pitch<D>() * sizeof(T) + kWarps * 16 * kGPitch * sizeof(float);
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

// Where a block and its warp stand. Block order: head rank (longest visited span first, the glue's
// head_order), batch, query tile of kRows; a warp takes 16 rows from r0.
struct Place {
  int64_t h, b, x, i0, r0;
  int warp, g, t;
};

__device__ __forceinline__ Place place(const SpanAttentionParams& p) {
  Place at;
  const int64_t tiles = (p.M + kRows - 1) / kRows;
  at.h = p.head_order[blockIdx.x / (tiles * p.B)];
  at.b = (blockIdx.x / tiles) % p.B;
  at.x = at.b * p.K + at.h;
  at.i0 = (blockIdx.x % tiles) * kRows;
  const int lane = static_cast<int>(threadIdx.x) % kWarp;
  at.warp = static_cast<int>(threadIdx.x) / kWarp;
  at.g = lane >> 2;
  at.t = lane & 3;
  at.r0 = at.i0 + at.warp * 16;
  return at;
}

// The position term of a warp's 16 rows over the distances they meet in a tile: G = Q_w pes[16 warp ..
// 16 warp + 80)^T (16 x 80, fp32) into the warp's shared gw, which the score loops read skewed
// (row r, key n: G[r][r - n + 63]).
template <typename T, int D, typename Fragments>
__device__ __forceinline__ void position_term(float* gw, const Fragments& qa, const T* pes, int warp, int g, int t) {
#pragma unroll
  for (int n = 0; n < kWarpDist / 8; ++n) {
    float acc[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
    for (int c = 0; c < D / 16; c += 2) {
      uint32_t b[4], af[4];
      b_of_columns2(b, pes, pitch<D>(), warp * 16 + n * 8, c, g, t);
      qa.get(af, c);
      mma_16816<T>(acc, af, {b[0], b[1]});
      qa.get(af, c + 1);
      mma_16816<T>(acc, af, {b[2], b[3]});
    }
    gw[g * kGPitch + n * 8 + 2 * t] = acc[0];
    gw[g * kGPitch + n * 8 + 2 * t + 1] = acc[1];
    gw[(g + 8) * kGPitch + n * 8 + 2 * t] = acc[2];
    gw[(g + 8) * kGPitch + n * 8 + 2 * t + 1] = acc[3];
  }
}

// MinBlocks: blocks an SM that __launch_bounds__ asks registers for (2: up to 255 registers a thread).
// Async (2 blocks, D 32 / 64; SPANFORMER_SPAN_KERNEL=v1b2-async): two tile buffers; tile t + 1's copies
// (cp.async) are in flight while tile t is computed, and one barrier a tile both publishes tile t and
// frees the buffer tile t + 1 goes into (every warp is past tile t - 1, which read it).
template <typename T, int D, int MinBlocks, bool Async>
__global__ void __launch_bounds__(kWarps * kWarp, MinBlocks) forward_mma_kernel(SpanAttentionParams p) {
  SPANFORMER_DYNAMIC_SHARED(float, smem);
  constexpr int P = pitch<D>(), NT = D / 8, kBuffer = kTileRows * P;
  static_assert(!Async || MinBlocks == 2, "the double-buffered forward is the 2-block form");
  T* ks = reinterpret_cast<T*>(smem);  // (kKeys, P); with Async buffer b's rows at + b kBuffer
  T* vs = ks + kKeys * P;              // (kKeys, P)
  T* pes = vs + kKeys * P;             // (kDist, P)
  float* g_all = reinterpret_cast<float*>(ks + (Async ? 2 : 1) * kBuffer);  // (kWarps, 16, kGPitch)

  const Place at = place(p);
  const int64_t h = at.h, b = at.b, x = at.x, i0 = at.i0, r0 = at.r0, W = p.W, M = p.M, L = p.L;
  const int warp = at.warp, g = at.g, t = at.t, S = p.visited[h];
  const float z = p.span_ratio[h] * static_cast<float>(L), inv_sqrt_d = rsqrtf(static_cast<float>(D));
  const bool dropping = p.training && p.dropout > 0.f;
  const float drop_scale = dropping ? 1.f / (1.f - p.dropout) : 1.f;
  const T* q = static_cast<const T*>(p.q) + x * M * D;
  const T* k = static_cast<const T*>(p.k) + x * (W + M) * D;
  const T* v = static_cast<const T*>(p.v) + x * (W + M) * D;
  const T* pe_d = static_cast<const T*>(p.key_pe_by_distance);  // (W, D): row d - 1 is distance d
  float* gw = g_all + warp * 16 * kGPitch;

  // Q_w as A fragments: register r of chunk c holds row g (+8 for odd r), columns 16c + 2t (+8 for r >= 2).
  HeldFragments<D> qa;
  qa.load_global(q, r0, M, g, t);
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float mx[2] = {-INFINITY, -INFINITY}, zs[2] = {0.f, 0.f}, ns[2] = {0.f, 0.f};  // rows g and g + 8

  const int64_t j_end = min(i0 + kRows - 1 + W, W + M);  // one past the last key row the block reads
  // The pair's smallest distance (row i0, key j0 + 63); some pair within the span: mask and P V needed.
  const auto smallest_distance = [&](int64_t j0) { return i0 + W - j0 - (kKeys - 1); };
  if constexpr (Async) {
    if (i0 < j_end)
      load_tile_async<T, D>(ks, vs, pes, k, v, pe_d, i0, smallest_distance(i0), W, M, smallest_distance(i0) <= S);
    cp_async_commit();
  }
  int buffer = 0;
  for (int64_t j0 = i0; j0 < j_end; j0 += kKeys) {
    const int64_t dlo = smallest_distance(j0);
    const bool values = dlo <= S;
    const T* kt = ks;  // this tile's rows in shared memory
    const T* vt = vs;
    const T* pt = pes;
    if constexpr (Async) {
      cp_async_wait<0>();
      __syncthreads();  // tile j0 is in for every thread; the other buffer is free
      const int64_t next = j0 + kKeys, next_dlo = smallest_distance(next);
      if (next < j_end)
        load_tile_async<T, D>(ks + (buffer ^ 1) * kBuffer, vs + (buffer ^ 1) * kBuffer, pes + (buffer ^ 1) * kBuffer, k,
                              v, pe_d, next, next_dlo, W, M, next_dlo <= S);
      cp_async_commit();
      kt += buffer * kBuffer;
      vt += buffer * kBuffer;
      pt += buffer * kBuffer;
      buffer ^= 1;
    } else {
      __syncthreads();  // the previous tile is consumed
      load_tile<T, D>(ks, vs, pes, k, v, pe_d, j0, dlo, W, M, values);
      __syncthreads();
    }

    // Content scores: 8 tiles of 8 keys; B (k x n) = K^T: register r holds ks[n = g][16c + 2t (+8 for r = 1)].
    float s[8][4];
    fragments_times_keys<T, D>(s, qa, kt, P, g, t);
    // Position term: G = Q_w pes[16 warp .. 16 warp + 80)^T into shared memory, then the skewed reads.
    position_term<T, D>(gw, qa, pt, warp, g, t);
    __syncwarp();

    // Scores of the warp's rows; -inf outside the window (or past the last query). Index arithmetic in
    // 32 bits (M + W < 2^31, checked by the glue): element (row, col) is query r0 + row at distance
    // d0 + row - col.
    // Warp-uniform shortcuts: every element of the warp's 16 x 64 in the window (distances d0 - 63 ..
    // d0 + 15 within 1 .. W, every row a query), and, with values and no dropout, every mask 1 (the
    // largest distance at most the span: (z - (d - 1)) / R + 1 >= 1 exactly when d - 1 <= z in fp32).
    // In the 2-blocks-an-SM form only (heads visiting most of the window, where most tiles are such):
    // under the 3-block form's 168 registers they cost spills (nvcc 13.0: 48 bytes at D 64).
    const int d0 = static_cast<int>(r0 + W - j0), rows_left = static_cast<int>(M - r0), Wi = static_cast<int>(W);
    const bool inside = MinBlocks < 3 && rows_left >= 16 && d0 - (kKeys - 1) >= 1 && d0 + 15 <= Wi;
    const bool whole = MinBlocks < 3 && values && !dropping && d0 + 15 <= S && static_cast<float>(d0 + 14) <= z;
    float tile_max[2] = {-INFINITY, -INFINITY};
    if (inside) {
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const int row = g + (e >> 1) * 8, col = n * 8 + 2 * t + (e & 1);
          s[n][e] = (s[n][e] + gw[row * kGPitch + row - col + kKeys - 1]) * inv_sqrt_d;
          tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[n][e]);
        }
    } else {
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
    if (whole) {  // m = 1, no dropout: w = e
#pragma unroll
      for (int n = 0; n < 8; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          const float ex = __expf(s[n][e] - tile_max[e >> 1]);  // 0 for -inf scores
          z_part[e >> 1] += ex;
          n_part[e >> 1] += ex;
          s[n][e] = ex;
        }
    } else {
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
    scale_rows<D>(o, rescale);
    if (!values) continue;  // block-uniform: beyond every row's span, Z only
    weights_times_rows<T, D>(o, s, vt, P, g, t);  // P V
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
  const int64_t blocks = p.B * p.K * ((p.M + kRows - 1) / kRows);
  if constexpr (D <= 64)
    if (p.forward_async)
      return launch_with_shared(forward_mma_kernel<T, D, 2, true>, blocks, kWarps * kWarp, shared_bytes<T, D, true>(), p,
                                stream);
  const auto kernel = p.forward_min_blocks == 3 ? forward_mma_kernel<T, D, 3, false> : forward_mma_kernel<T, D, 2, false>;
  return launch_with_shared(kernel, blocks, kWarps * kWarp, shared_bytes<T, D>(), p, stream);
}

template <typename T>
cudaError_t launch_mma_for_width(const SpanAttentionParams& p, cudaStream_t stream) {
  return with_mma_width(p.D, [&](auto d) { return launch_mma<T, decltype(d)::value>(p, stream); });
}

// ---- Backward, version 2 (tensor cores) -----------------------------------------------------------
// The forward's tiling (a block: 64 queries of one (b, h), 4 warps of 16 rows; key tiles of 64 rows),
// recomputing each tile's scores from the row statistics (max, Z, N) the forward saved:
//   e = exp(s - max), denom = N + 1e-8 Z, G1 = dO . out,  dP = dO V^T,
//   ds = e / denom (m c dP - G1 (m + 1e-8)) / sqrt(D)   (c = keep / (1 - p); m = 0 beyond the span),
//   w = e m c / denom (the value weights),   dz += e / denom (c dP - G1) inside the ramp,
// the formulas of version 0's backward (span_attention_kernels.cu) over tiles. Products per tile and
// warp, all mma.sync m16n8k16 with fp32 accumulators:
//   dQ_w += ds K_tile                      (ds from registers as A fragments, like P in the forward's P V)
//   dQ_w += DS pes                          (the position term's transpose: DS[r][c] = ds at distance dlo + c)
//   dK rows [16 w, +16) += ds^T Q,  dV rows += w^T dO       (ds, w through shared memory, transposed)
//   dpe distances [32 w, +32) += DS^T Q                    (per distance, into a (W, D) buffer)
// dQ stays in registers (one warp owns its rows); dK, dV and dpe are sums over blocks: fp32 atomics,
// once per block and tile after the block-wide products. ds and w enter the tensor cores in the inputs'
// 16-bit type, as P does in the forward. D 32, 64 and 128; at D 128 Q's and dO's fragments are read from
// shared memory at each use instead of held in registers, and nvcc 13.0 (sm_90) still spills 904 bytes a
// thread there (255 registers and no spills at D 64).
constexpr int kQPitch = kRows + 8;  // shared rows indexed by query (ds^T, w^T, DS^T)

template <typename T, int D>
constexpr size_t backward_shared_bytes() {
  return ((2 * kKeys + kDist + 2 * kRows) * pitch<D>() + (2 * kKeys + kDist) * kQPitch) * sizeof(T) +
         kWarps * 16 * kGPitch * sizeof(float);
}

template <typename T, int D>
__global__ void __launch_bounds__(kWarps * kWarp, 1) backward_mma_kernel(SpanAttentionParams p) {
  SPANFORMER_DYNAMIC_SHARED(float, smem);
  constexpr int P = pitch<D>(), QP = kQPitch, NT = D / 8, V = 16 / sizeof(T), VR = D / V;
  constexpr int kThreads = kWarps * kWarp;
  T* ks = reinterpret_cast<T*>(smem);  // (kKeys, P)
  T* vs = ks + kKeys * P;              // (kKeys, P)
  T* pes = vs + kKeys * P;             // (kDist, P)
  T* qs = pes + kDist * P;             // (kRows, P): the block's queries
  T* dos = qs + kRows * P;             // (kRows, P): their output gradients
  T* dst = dos + kRows * P;            // (kKeys, QP): ds transposed, [key][query]
  T* wt = dst + kKeys * QP;            // (kKeys, QP): value weights transposed
  T* dss = wt + kKeys * QP;            // (kDist, QP): dss[c][query] = ds of the query at distance dlo + c
  float* g_all = reinterpret_cast<float*>(dss + kDist * QP);  // (kWarps, 16, kGPitch)

  const Place at = place(p);
  const int64_t h = at.h, b = at.b, x = at.x, i0 = at.i0, r0 = at.r0, W = p.W, M = p.M, L = p.L;
  const int warp = at.warp, g = at.g, t = at.t, S = p.visited[h];
  const float z = p.span_ratio[h] * static_cast<float>(L), inv_sqrt_d = rsqrtf(static_cast<float>(D));
  const bool dropping = p.training && p.dropout > 0.f;
  const float drop_scale = dropping ? 1.f / (1.f - p.dropout) : 1.f;
  const int tid = static_cast<int>(threadIdx.x), lane = tid % kWarp;
  const T* q = static_cast<const T*>(p.q) + x * M * D;
  const T* k = static_cast<const T*>(p.k) + x * (W + M) * D;
  const T* v = static_cast<const T*>(p.v) + x * (W + M) * D;
  const T* dout = static_cast<const T*>(p.grad_out) + x * M * D;
  const T* out = static_cast<const T*>(p.out) + x * M * D;
  const T* pe_d = static_cast<const T*>(p.key_pe_by_distance);
  float* gk = p.grad_k + x * (W + M) * D;
  float* gv = p.grad_v + x * (W + M) * D;
  float* gw = g_all + warp * 16 * kGPitch;

  // The block's queries and output gradients into shared memory (zero past the last query).
  for (int idx = tid; idx < kRows * VR; idx += kThreads) {
    const int row = idx / VR, e = (idx % VR) * V;
    const int64_t i = i0 + row;
    store16(qs + row * P + e, i < M ? load16(q + i * D + e) : zero16());
    store16(dos + row * P + e, i < M ? load16(dout + i * D + e) : zero16());
  }
  // Row statistics of rows g and g + 8: max, 1 / denom, G1 = dO . out (4 lanes a row, D / 4 each).
  float mx[2], inv_denom[2], g1[2];
#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t i = r0 + g + rr * 8;
    float dot = 0.f;
    if (i < M)
      for (int e = t * (D / 4); e < (t + 1) * (D / 4); ++e) dot += to_float(dout[i * D + e]) * to_float(out[i * D + e]);
    dot += __shfl_xor_sync(kFullMask, dot, 1);
    dot += __shfl_xor_sync(kFullMask, dot, 2);
    g1[rr] = dot;
    mx[rr] = i < M ? p.row_max[x * M + i] : 0.f;
    inv_denom[rr] = i < M ? 1.f / (p.row_n[x * M + i] + 1e-8f * p.row_z[x * M + i]) : 0.f;
  }
  __syncthreads();
  // Q_w and dO_w as A fragments: in registers up to D 64, read from shared memory at D 128.
  const RowFragments<T, D, (D <= 64)> qa(qs, P, warp * 16, g, t), da(dos, P, warp * 16, g, t);
  float dq[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.f;
  float dz = 0.f;

  const int64_t j_end = min(i0 + kRows - 1 + W, W + M);
  for (int64_t j0 = i0; j0 < j_end; j0 += kKeys) {
    const int64_t dlo = i0 + W - j0 - (kKeys - 1);
    const bool values = dlo <= S;
    __syncthreads();  // the previous tile's shared products are done
    load_tile<T, D>(ks, vs, pes, k, v, pe_d, j0, dlo, W, M, values);
    for (int idx = tid; idx < kDist * QP / 8; idx += kThreads) store16(dss + idx * 8, zero16());
    __syncthreads();

    // Scores as in the forward: Q_w K^T, and the position term through G in shared memory.
    float s[8][4], dp[8][4];
    fragments_times_keys<T, D>(s, qa, ks, P, g, t);
    position_term<T, D>(gw, qa, pes, warp, g, t);
    // dP = dO_w V^T where some pair is within the span.
    if (values) {
      fragments_times_keys<T, D>(dp, da, vs, P, g, t);
    } else {
#pragma unroll
      for (int n = 0; n < 8; ++n) dp[n][0] = dp[n][1] = dp[n][2] = dp[n][3] = 0.f;
    }
    __syncwarp();

    // ds (into s) and the value weights (into dp), element by element.
    const int d0 = static_cast<int>(r0 + W - j0), rows_left = static_cast<int>(M - r0), Wi = static_cast<int>(W);
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int rr = e >> 1, row = g + rr * 8, col = n * 8 + 2 * t + (e & 1);
        const int d = d0 + row - col;
        float ds = 0.f, w = 0.f;
        if (row < rows_left && d >= 1 && d <= Wi) {
          const float pr =
              __expf((s[n][e] + gw[row * kGPitch + row - col + kKeys - 1]) * inv_sqrt_d - mx[rr]) * inv_denom[rr];
          if (values && d <= S) {
            const float m = ramp_mask(z, p.ramp, d);
            const bool kept = !dropping || dropout_keep_hash(p.seed, b, h, r0 + row, d, static_cast<double>(p.dropout));
            const float a = dp[n][e] * (kept ? drop_scale : 0.f);  // c dP
            ds = pr * (a * m - g1[rr] * (m + 1e-8f));
            w = pr * m * (kept ? drop_scale : 0.f);
            const float xr = (z - static_cast<float>(d - 1)) / p.ramp + 1.f;
            if (xr >= 0.f && xr <= 1.f) dz += pr * (a - g1[rr]);  // dm_d inside the ramp (clamp's gradient)
          } else {
            ds = -pr * g1[rr] * 1e-8f;  // beyond the span: the 1e-8 Z term only
          }
          ds *= inv_sqrt_d;
        }
        s[n][e] = ds;
        dp[n][e] = w;
      }

    weights_times_rows<T, D>(dq, s, ks, P, g, t);  // dQ_w += ds K_tile
    // ds and w into shared memory, transposed, and ds by distance: query row qr, key col, c = qr - col + 63.
#pragma unroll
    for (int n = 0; n < 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int qr = warp * 16 + g + (e >> 1) * 8, col = n * 8 + 2 * t + (e & 1);
        const T ds = from_float<T>(s[n][e]);
        dst[col * QP + qr] = ds;
        dss[(qr - col + kKeys - 1) * QP + qr] = ds;
        if (values) wt[col * QP + qr] = from_float<T>(dp[n][e]);
      }
    __syncthreads();

    // dQ_w += DS_w pes: A (16 rows x 80 distances 16 warp + kk) read from dss transposed, B = pes rows.
#pragma unroll
    for (int c = 0; c < kWarpDist / 16; ++c) {
      uint32_t af[4];
      a_of_columns(af, dss, QP, warp * 16 + 16 * c, warp * 16, g, t);
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        uint32_t bf[2];
        b_of_rows(bf, pes, P, warp * 16 + 16 * c, n * 8, g, t);
        mma_16816<T>(dq[n], af, bf);
      }
    }
    // dK and dV rows [16 warp, +16) of the tile, summed over the block's 64 queries; then atomics.
    float acc[NT][4];
    rows_times<T, D, kRows>(acc, dst, QP, warp * 16, qs, P, g, t);
    atomic_add_rows<D>(gk, acc, j0 + warp * 16, 0, W + M, g, t);
    if (values) {
      rows_times<T, D, kRows>(acc, wt, QP, warp * 16, dos, P, g, t);
      atomic_add_rows<D>(gv, acc, j0 + warp * 16, 0, W + M, g, t);
    }
    // dpe of distances dlo + [32 warp, +32), summed over the block's queries.
#pragma unroll
    for (int half = 0; half < 2; ++half) {
      const int c0 = warp * 32 + half * 16;
      rows_times<T, D, kRows>(acc, dss, QP, c0, qs, P, g, t);
      atomic_add_rows<D>(p.grad_key_pe_by_distance, acc, dlo + c0 - 1, 0, W, g, t);  // row d - 1: distance d
    }
  }

#pragma unroll
  for (int rr = 0; rr < 2; ++rr) {
    const int64_t i = r0 + g + rr * 8;
    if (i >= M) continue;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      p.grad_q[(x * M + i) * D + n * 8 + 2 * t] = dq[n][2 * rr];
      p.grad_q[(x * M + i) * D + n * 8 + 2 * t + 1] = dq[n][2 * rr + 1];
    }
  }
  dz = warp_sum(dz);
  if (lane == 0) atomicAdd(p.grad_span_ratio + h, dz * static_cast<float>(L) / p.ramp);
}

template <typename T, int D>
cudaError_t launch_backward_mma(const SpanAttentionParams& p, cudaStream_t stream) {
  return launch_with_shared(backward_mma_kernel<T, D>, p.B * p.K * ((p.M + kRows - 1) / kRows), kWarps * kWarp,
                            backward_shared_bytes<T, D>(), p, stream);
}

template <typename T>
cudaError_t launch_backward_for_width(const SpanAttentionParams& p, cudaStream_t stream) {
  return with_mma_width(p.D, [&](auto d) { return launch_backward_mma<T, decltype(d)::value>(p, stream); });
}

}  // namespace

bool span_attention_mma_supported(const SpanAttentionParams& p) {
  const auto aligned = [](const void* x) { return x != nullptr && reinterpret_cast<uintptr_t>(x) % 16 == 0; };
  return p.dtype != DType::kFloat32 && mma_width(p.D) && aligned(p.k) && aligned(p.v) &&
         aligned(p.key_pe_by_distance) &&  // 16-byte tile loads
         p.W + p.M + kKeys < (int64_t{1} << 31);  // 32-bit distances and rows in the score loops
}

cudaError_t span_attention_forward_mma(const SpanAttentionParams& p, cudaStream_t stream) {
  if (!span_attention_mma_supported(p)) return cudaErrorInvalidValue;
  return p.dtype == DType::kBFloat16 ? launch_mma_for_width<__nv_bfloat16>(p, stream)
                                     : launch_mma_for_width<__half>(p, stream);
}

bool span_attention_mma_backward_supported(const SpanAttentionParams& p) {
  const auto aligned = [](const void* x) { return x != nullptr && reinterpret_cast<uintptr_t>(x) % 16 == 0; };
  return span_attention_mma_supported(p) && aligned(p.q) && aligned(p.grad_out) &&
         p.grad_key_pe_by_distance != nullptr;
}

cudaError_t span_attention_backward_mma(const SpanAttentionParams& p, cudaStream_t stream) {
  if (!span_attention_mma_backward_supported(p)) return cudaErrorInvalidValue;
  return p.dtype == DType::kBFloat16 ? launch_backward_for_width<__nv_bfloat16>(p, stream)
                                     : launch_backward_for_width<__half>(p, stream);
}

}  // namespace spanformer::ops::cuda
