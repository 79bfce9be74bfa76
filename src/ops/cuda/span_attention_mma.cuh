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
// distance dlo is beyond S_h adds to Z only: no mask, no values read, no P V product. Fragments come
// from shared memory by ldmatrix (device.cuh).
// Writes out and the row statistics (max, Z, N) of the reference's formula, from which either backward
// recomputes the scores. Blocks go longest head first (the glue's head_order), so that the short heads'
// quicker blocks fill the last wave; `__launch_bounds__` asks for 2 or 3 blocks an SM (the glue's rule).
//
// D in {32, 64, 128} (templated: fragment arrays stay in registers); other widths and float32 take
// version 0. Tested on the CPU model of CUDA (tests/test_cuda_emulated.cpp), which computes each mma.sync
// from the PTX ISA's fragment layouts, and on an H100 (tests/test_cuda.cpp): at B 8, K 8, M 512, D 64,
// L 8192 in bf16 the forward takes 1.42 ms with bimodal spans (plain composition 5.54 ms) and 1.81 ms
// with every span at L; with version 2's backward, forward + backward 6.73-6.90 and 7.99 ms (plain 15.4
// and 15.1 ms); docs/kernels.md, "v1 tuned", "v2" and "ldmatrix".
//
// This header holds the forward and the helpers the backward shares; span_attention_mma_kernels.cu
// launches the mainline (what `auto` runs) and holds the backward, and lab/cuda/span_attention_lab.cu
// builds the lab's forward variants from the same pieces (variants.h lists them). The
// forward takes a `Form`: how a key tile comes into shared memory, and the warp's score and weight loops
// over it. LoadedTiles here is the mainline's (load, barrier, compute, barrier; the general loops).
#pragma once
#include <cstdint>

#include "../dropout_hash.h"
#include "device.cuh"
#include "params.h"

namespace spanformer::ops::cuda {
namespace {  // each translation unit its own kernels: the mainline's and the lab's

constexpr int kRows = 64;          // queries a block
constexpr int kWarps = kRows / 16;  // 16 query rows a warp
constexpr int kKeys = 64;          // keys a tile
constexpr int kDist = 128;         // distances a (query tile, key tile) pair spans: 127, padded
constexpr int kWarpDist = 80;      // distances a warp's 16 rows span in a tile: 79, padded to 10 x 8
constexpr int kGPitch = kWarpDist + 4;

template <int D>
__host__ __device__ constexpr int pitch() { return D + 8; }  // shared rows of ks, vs, pes (elements)

constexpr int kTileRows = 2 * kKeys + kDist;  // shared rows of one tile: keys, values, distances


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

// The key rows a block reads and where their tiles come from: rows i0 .. j_end - 1 of k and v (the
// block's queries read rows i .. i + W - 1), pe's rows by distance.
template <typename T>
struct Window {
  const T* k;
  const T* v;
  const T* pe_d;
  int64_t W, M, i0, j_end;
  int S;  // the head's visited distances
  // The pair's smallest distance (row i0, key j0 + 63).
  __device__ int64_t smallest_distance(int64_t j0) const { return i0 + W - j0 - (kKeys - 1); }
};

// What a warp's score and weight loops need of one (query tile, key tile) pair: its rows r0 + g (+8),
// element (row, col) at distance d0 + row - col; rows_left queries from r0; values: some pair is within
// the span (else Z only).
struct WarpTile {
  int g, t, d0, rows_left, W, S;
  bool values, dropping;
  float z, ramp, inv_sqrt_d, drop_scale, dropout;
  uint64_t seed;
  int64_t b, h, r0;
};

// The scores of a warp's 16 x 64 (content s plus the skewed position term in gw, over sqrt(D)), -inf
// outside the window or past the last query; tile_max the rows' maxima.
__device__ __forceinline__ void masked_scores(float (&s)[8][4], const float* gw, float (&tile_max)[2], const WarpTile& w) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int row = w.g + (e >> 1) * 8, col = n * 8 + 2 * w.t + (e & 1);
      const int d = w.d0 + row - col;
      const bool valid = row < w.rows_left && d >= 1 && d <= w.W;
      s[n][e] = valid ? (s[n][e] + gw[row * kGPitch + row - col + kKeys - 1]) * w.inv_sqrt_d : -INFINITY;
      tile_max[e >> 1] = fmaxf(tile_max[e >> 1], s[n][e]);
    }
}

// e = exp(s - max) into the rows' Z, e m into their N, and s becomes the value weight e m keep / (1 - p)
// (0 where no pair is within the span).
__device__ __forceinline__ void masked_weights(float (&s)[8][4], const float (&tile_max)[2], float (&z_part)[2],
                                               float (&n_part)[2], const WarpTile& w) {
#pragma unroll
  for (int n = 0; n < 8; ++n)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int rr = e >> 1, row = w.g + rr * 8, col = n * 8 + 2 * w.t + (e & 1);
      const float ex = __expf(s[n][e] - tile_max[rr]);  // 0 for -inf scores
      z_part[rr] += ex;
      float weight = 0.f;
      if (w.values) {
        const int d = w.d0 + row - col;
        const float m = d <= w.S ? ramp_mask(w.z, w.ramp, d) : 0.f;
        n_part[rr] += ex * m;
        const bool kept = !w.dropping || dropout_keep_hash(w.seed, w.b, w.h, w.r0 + row, d, static_cast<double>(w.dropout));
        weight = ex * m * (kept ? w.drop_scale : 0.f);
      }
      s[n][e] = weight;
    }
}

// The mainline's form: a tile loaded by every thread between two barriers into one buffer, and the
// general score and weight loops. `tile` returns where tile j0's rows are (K, then V, then pe's
// distances, kKeys, kKeys and kDist rows of pitch P); `buffer` is a form's own state.
struct LoadedTiles {
  static constexpr int kBuffers = 1;
  static constexpr int kMinBlocks = 0;  // any
  template <typename T, int D>
  __device__ static void start(T*, const Window<T>&) {}
  template <typename T, int D>
  __device__ static const T* tile(T* ks, const Window<T>& src, int64_t j0, int& /*buffer*/) {
    constexpr int P = pitch<D>();
    const int64_t dlo = src.smallest_distance(j0);
    __syncthreads();  // the previous tile is consumed
    load_tile<T, D>(ks, ks + kKeys * P, ks + 2 * kKeys * P, src.k, src.v, src.pe_d, j0, dlo, src.W, src.M, dlo <= src.S);
    __syncthreads();
    return ks;
  }
  __device__ static void scores(float (&s)[8][4], const float* gw, float (&tile_max)[2], const WarpTile& w) {
    masked_scores(s, gw, tile_max, w);
  }
  __device__ static void weights(float (&s)[8][4], const float (&tile_max)[2], float (&z_part)[2], float (&n_part)[2],
                                 const WarpTile& w) {
    masked_weights(s, tile_max, z_part, n_part, w);
  }
};

template <typename T, int D, typename Form>
constexpr size_t shared_bytes() {
  return Form::kBuffers * kTileRows * pitch<D>() * sizeof(T) + kWarps * 16 * kGPitch * sizeof(float);
}

// MinBlocks: blocks an SM that __launch_bounds__ asks registers for (2: up to 255 registers a thread).
// Form: LoadedTiles (the mainline) or a lab form.
template <typename T, int D, int MinBlocks, typename Form>
__global__ void __launch_bounds__(kWarps * kWarp, MinBlocks) forward_mma_kernel(SpanAttentionParams p) {
  SPANFORMER_DYNAMIC_SHARED(float, smem);
  constexpr int P = pitch<D>(), NT = D / 8;
  static_assert(Form::kMinBlocks == 0 || Form::kMinBlocks == MinBlocks, "the form is built for these blocks an SM");
  T* ks = reinterpret_cast<T*>(smem);  // Form::kBuffers x ((kKeys, P) K, (kKeys, P) V, (kDist, P) pe rows)
  float* g_all = reinterpret_cast<float*>(ks + Form::kBuffers * kTileRows * P);  // (kWarps, 16, kGPitch)

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

  const Window<T> src{k, v, pe_d, W, M, i0, min(i0 + kRows - 1 + W, W + M), S};  // j_end: past the last key row read
  Form::template start<T, D>(ks, src);
  int buffer = 0;
  for (int64_t j0 = i0; j0 < src.j_end; j0 += kKeys) {
    const bool values = src.smallest_distance(j0) <= S;  // some pair within the span: mask and P V needed
    const T* kt = Form::template tile<T, D>(ks, src, j0, buffer);  // (kKeys, P): this tile's K
    const T* vt = kt + kKeys * P;                                 // (kKeys, P): its V
    const T* pt = vt + kKeys * P;                                 // (kDist, P): its pe rows

    // Content scores: 8 tiles of 8 keys; B (k x n) = K^T: register r holds ks[n = g][16c + 2t (+8 for r = 1)].
    float s[8][4];
    fragments_times_keys<T, D>(s, qa, kt, P, g, t);
    // Position term: G = Q_w pes[16 warp .. 16 warp + 80)^T into shared memory, then the skewed reads.
    position_term<T, D>(gw, qa, pt, warp, g, t);
    __syncwarp();

    // Scores of the warp's rows; -inf outside the window (or past the last query). Index arithmetic in
    // 32 bits (M + W < 2^31, checked by the glue): element (row, col) is query r0 + row at distance
    // d0 + row - col.
    const WarpTile wt{g, t, static_cast<int>(r0 + W - j0), static_cast<int>(M - r0), static_cast<int>(W), S, values,
                      dropping, z, p.ramp, inv_sqrt_d, drop_scale, p.dropout, p.seed, b, h, r0};
    float tile_max[2] = {-INFINITY, -INFINITY};
    Form::scores(s, gw, tile_max, wt);
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
    Form::weights(s, tile_max, z_part, n_part, wt);
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

}  // namespace
}  // namespace spanformer::ops::cuda
