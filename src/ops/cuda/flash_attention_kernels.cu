// CUDA kernels of flash attention (semantics and formulas: include/spanformer/ops/flash_attention.h).
//
// Version 0: correctness first, fp32 arithmetic on CUDA cores for float32 / bfloat16 / float16 inputs.
// Query i sits at key position p_i = C - N + i and reads keys j with p_i - band < j <= p_i.
//
// Forward (one warp per query row, 8 rows a block): key tiles of 32 rows of k and v go through shared
// memory (fp32, rows padded to D + 1 floats so that lane t reading row t hits bank (t + e) mod 32);
// lane t scores key j0 + t against the row's q (pre-scaled by 1/sqrt(D)), the warp keeps the online
// softmax (m, l) and each lane owns the output components e = lane + 32 c:
//   m' = max(m, max_t s_t);  l = l e^{m - m'} + sum_t e^{s_t - m'};  acc = acc e^{m - m'} + sum_t e^{s_t - m'} Z_t v_t.
// Writes out = acc / l and L = m + log l (fp32).
// Backward by recomputation (P = exp(s - L), Dv_i = dout_i . out_i computed by the caller):
//   dq kernel (same layout as forward):  dS = P (Z dP - Dv), dP = dout_i . v_j;  dq_i = sum_j dS_ij k_j / sqrt(D);
//   dk/dv kernel (one warp per 32 keys, lane t owns key j0 + t and its rows of dk and dv in shared
//   memory, no atomics): walks the query positions that can read the tile,
//     dv_j += P_ij Z_ij dout_i,   dk_j += dS_ij q_i / sqrt(D).
// Every element of out, L, dq, dk and dv is written (keys no query reads get zero rows).
// Dropout: Z_ij = keep / (1 - p) from the same splitmix64 hash as the CPU op and the reference
// (ops/dropout_hash.h, keyed by batch, head, query position and key position).
// exp/log are the accurate expf/logf: the tests hold fp32 to the fp32 composition's own error.
// Version 1 (tensor cores, bf16 / fp16, D 32 / 64 / 128) is
// flash_attention_mma_kernels.cu; these kernels serve fp32 and the other widths.
#include "../dropout_hash.h"
#include "device.cuh"
#include "params.h"

namespace spanformer::ops::cuda {
namespace {

constexpr int kMaxPerLane = 8;    // D <= 256
constexpr int kRowsPerBlock = 8;  // forward and dq: one warp per query row
constexpr int kKeys = 32;         // keys per tile: one per lane

__device__ __forceinline__ bool visible(const FlashParams& p, int64_t pos, int64_t j) {
  return j <= pos && pos - j < p.band;
}

// Z_ij: 1 without dropout, else keep / (1 - p).
__device__ __forceinline__ float drop_scale(const FlashParams& p, int64_t b, int64_t h, int64_t pos, int64_t j) {
  if (!(p.training && p.dropout > 0.f)) return 1.f;
  return dropout_keep_hash(p.seed, b, h, pos, j, static_cast<double>(p.dropout)) ? 1.f / (1.f - p.dropout) : 0.f;
}

// Rows [0, rows) of src (row length D) into dst (row pitch `pitch`) as fp32, zeros for rows >= avail.
template <typename T>
__device__ void load_rows(float* dst, const T* src, int rows, int avail, int D, int pitch, float scale) {
  for (int idx = threadIdx.x; idx < rows * D; idx += blockDim.x) {
    const int r = idx / D, e = idx % D;
    dst[r * pitch + e] = r < avail ? to_float(src[static_cast<int64_t>(r) * D + e]) * scale : 0.f;
  }
}

// A forward / dq block: head x = (b, h), query rows [i0, i0 + rows), one per warp; shared memory holds
// the key tile (ks, vs: kKeys rows of pitch D + 1) and the block's scaled q rows (qs: rows x D).
struct RowBlock {
  int64_t x, b, h, i0, offset;
  int rows, D, pitch, warp, lane, per_lane;
  float scale;
  int64_t lo, hi;         // the keys any of its rows reads: [lo, hi)
  int64_t i, pos;         // this warp's row and its key position
  bool active;            // does this warp have a row?
  float *ks, *vs, *qs, *extra;  // extra: what follows qs in shared memory
};

template <typename T>
__device__ RowBlock row_block(const FlashParams& p, float* smem) {
  RowBlock r;
  const int64_t tiles = (p.N + kRowsPerBlock - 1) / kRowsPerBlock;
  r.x = blockIdx.x / tiles;
  r.i0 = (blockIdx.x % tiles) * kRowsPerBlock;
  r.b = r.x / p.K;
  r.h = r.x % p.K;
  r.offset = p.C - p.N;
  r.rows = static_cast<int>(min(static_cast<int64_t>(kRowsPerBlock), p.N - r.i0));
  r.D = static_cast<int>(p.D);
  r.pitch = r.D + 1;
  r.warp = threadIdx.x / kWarp;
  r.lane = threadIdx.x % kWarp;
  r.per_lane = (r.D + kWarp - 1) / kWarp;
  r.scale = rsqrtf(static_cast<float>(r.D));
  r.lo = max(static_cast<int64_t>(0), r.offset + r.i0 - p.band + 1);
  r.hi = r.offset + r.i0 + r.rows;
  r.i = r.i0 + r.warp;
  r.pos = r.offset + r.i;
  r.active = r.warp < r.rows;
  r.ks = smem;
  r.vs = r.ks + kKeys * r.pitch;
  r.qs = r.vs + kKeys * r.pitch;
  r.extra = r.qs + kRowsPerBlock * r.D;
  load_rows(r.qs, static_cast<const T*>(p.q) + (r.x * p.N + r.i0) * r.D, r.rows, r.rows, r.D, r.D, r.scale);
  return r;
}

// The key tiles [j0, j0 + n) that the block's rows read, through shared memory; body(j0, n) runs in the
// warps that have a row. Every warp makes the same trips (the barriers need all of them).
template <typename T, typename Body>
__device__ void over_key_tiles(const FlashParams& p, const RowBlock& r, Body body) {
  const T* kx = static_cast<const T*>(p.k) + r.x * p.C * r.D;
  const T* vx = static_cast<const T*>(p.v) + r.x * p.C * r.D;
  for (int64_t j0 = r.lo; j0 < r.hi; j0 += kKeys) {
    const int n = static_cast<int>(min(static_cast<int64_t>(kKeys), r.hi - j0));
    __syncthreads();  // the previous tile is consumed (on the first trip: the block's rows are loaded)
    load_rows(r.ks, kx + j0 * r.D, kKeys, n, r.D, r.pitch, 1.f);
    load_rows(r.vs, vx + j0 * r.D, kKeys, n, r.D, r.pitch, 1.f);
    __syncthreads();
    if (r.active) body(j0, n);
  }
}

template <typename T>
__global__ void forward_kernel(FlashParams p) {
  SPANFORMER_DYNAMIC_SHARED(float, smem);
  const RowBlock r = row_block<T>(p, smem);
  const int lane = r.lane, pitch = r.pitch;
  const float* q = r.qs + r.warp * r.D;
  float m = -INFINITY, l = 0.f, acc[kMaxPerLane];
  for (int c = 0; c < kMaxPerLane; ++c) acc[c] = 0.f;
  over_key_tiles<T>(p, r, [&](int64_t j0, int n) {
    const int64_t j = j0 + lane;
    const bool vis = lane < n && visible(p, r.pos, j);
    float s = -INFINITY;
    if (vis) {
      float dot = 0.f;
      for (int e = 0; e < r.D; ++e) dot += q[e] * r.ks[lane * pitch + e];
      s = dot;
    }
    const float tile_max = warp_max(s);
    if (tile_max == -INFINITY) return;  // no key of this tile is visible to the row (warp-uniform)
    const float m_new = fmaxf(m, tile_max);
    const float alpha = expf(m - m_new);  // 0 on the row's first visible tile (m = -inf)
    const float e_s = vis ? expf(s - m_new) : 0.f;
    l = l * alpha + warp_sum(e_s);
    const float w = vis ? e_s * drop_scale(p, r.b, r.h, r.pos, j) : 0.f;
    for (int c = 0; c < r.per_lane; ++c) acc[c] *= alpha;
    for (int t = 0; t < n; ++t) {
      const float wt = __shfl_sync(kFullMask, w, t);
      for (int c = 0; c < r.per_lane; ++c) {
        const int e = lane + kWarp * c;
        if (e < r.D) acc[c] += wt * r.vs[t * pitch + e];
      }
    }
    m = m_new;
  });
  if (!r.active) return;
  T* out = static_cast<T*>(p.out) + (r.x * p.N + r.i) * r.D;
  for (int c = 0; c < r.per_lane; ++c) {
    const int e = lane + kWarp * c;
    if (e < r.D) out[e] = from_float<T>(acc[c] / l);
  }
  if (lane == 0) p.lse[r.x * p.N + r.i] = m + logf(l);
}

template <typename T>
__global__ void dq_kernel(FlashParams p) {
  SPANFORMER_DYNAMIC_SHARED(float, smem);
  const RowBlock r = row_block<T>(p, smem);
  const int lane = r.lane, pitch = r.pitch;
  float* gs = r.extra;  // (kRowsPerBlock, D): dout
  load_rows(gs, static_cast<const T*>(p.grad_out) + (r.x * p.N + r.i0) * r.D, r.rows, r.rows, r.D, r.D, 1.f);
  const float* q = r.qs + r.warp * r.D;
  const float* g = gs + r.warp * r.D;
  const int64_t row = r.x * p.N + r.i;
  const float lse = r.active ? p.lse[row] : 0.f, delta = r.active ? p.delta[row] : 0.f;
  float dq[kMaxPerLane];
  for (int c = 0; c < kMaxPerLane; ++c) dq[c] = 0.f;
  over_key_tiles<T>(p, r, [&](int64_t j0, int n) {
    const int64_t j = j0 + lane;
    float ds = 0.f;
    if (lane < n && visible(p, r.pos, j)) {
      float s = 0.f, dp = 0.f;
      for (int e = 0; e < r.D; ++e) {
        s += q[e] * r.ks[lane * pitch + e];
        dp += g[e] * r.vs[lane * pitch + e];
      }
      ds = expf(s - lse) * (dp * drop_scale(p, r.b, r.h, r.pos, j) - delta);
    }
    for (int t = 0; t < n; ++t) {
      const float dst = __shfl_sync(kFullMask, ds, t);
      for (int c = 0; c < r.per_lane; ++c) {
        const int e = lane + kWarp * c;
        if (e < r.D) dq[c] += dst * r.ks[t * pitch + e];
      }
    }
  });
  if (!r.active) return;
  for (int c = 0; c < r.per_lane; ++c) {
    const int e = lane + kWarp * c;
    if (e < r.D) p.grad_q[row * r.D + e] = dq[c] * r.scale;
  }
}

// One warp per block: keys [j0, j0 + n) of head x; lane t owns key j0 + t.
template <typename T>
__global__ void dkdv_kernel(FlashParams p) {
  SPANFORMER_DYNAMIC_SHARED(float, smem);
  const int D = static_cast<int>(p.D), pitch = D + 1, lane = threadIdx.x;
  const float scale = rsqrtf(static_cast<float>(D));
  const int64_t tiles = (p.C + kKeys - 1) / kKeys;
  const int64_t x = blockIdx.x / tiles, j0 = (blockIdx.x % tiles) * kKeys, b = x / p.K, h = x % p.K;
  const int64_t offset = p.C - p.N;
  const int n = static_cast<int>(min(static_cast<int64_t>(kKeys), p.C - j0));
  float* ks = smem;                 // (kKeys, pitch)
  float* vs = ks + kKeys * pitch;   // (kKeys, pitch)
  float* dks = vs + kKeys * pitch;  // (kKeys, pitch)
  float* dvs = dks + kKeys * pitch; // (kKeys, pitch)
  float* qrow = dvs + kKeys * pitch;  // (D), scaled
  float* grow = qrow + D;             // (D)
  load_rows(ks, static_cast<const T*>(p.k) + (x * p.C + j0) * D, kKeys, n, D, pitch, 1.f);
  load_rows(vs, static_cast<const T*>(p.v) + (x * p.C + j0) * D, kKeys, n, D, pitch, 1.f);
  for (int idx = lane; idx < kKeys * pitch; idx += kWarp) dks[idx] = dvs[idx] = 0.f;
  const int64_t j = j0 + lane;
  const bool own = lane < n;
  // Positions that read some key of the tile: [j0, j0 + n - 1 + band), from the first query on.
  const int64_t first = max(j0, offset), last = min(p.C, j0 + n - 1 + p.band);
  const T* qx = static_cast<const T*>(p.q);
  const T* gx = static_cast<const T*>(p.grad_out);
  for (int64_t pos = first; pos < last; ++pos) {
    const int64_t row = x * p.N + (pos - offset);
    __syncwarp();  // the previous row is consumed
    for (int e = lane; e < D; e += kWarp) {
      qrow[e] = to_float(qx[row * D + e]) * scale;
      grow[e] = to_float(gx[row * D + e]);
    }
    __syncwarp();
    if (!own || !visible(p, pos, j)) continue;
    float s = 0.f, dp = 0.f;
    for (int e = 0; e < D; ++e) {
      s += qrow[e] * ks[lane * pitch + e];
      dp += grow[e] * vs[lane * pitch + e];
    }
    const float prob = expf(s - p.lse[row]), z = drop_scale(p, b, h, pos, j);
    const float pz = prob * z, ds = prob * (dp * z - p.delta[row]);
    for (int e = 0; e < D; ++e) {
      dvs[lane * pitch + e] += pz * grow[e];
      dks[lane * pitch + e] += ds * qrow[e];  // qrow carries 1/sqrt(D)
    }
  }
  __syncwarp();
  for (int idx = lane; idx < n * D; idx += kWarp) {  // coalesced: consecutive lanes, consecutive elements
    const int r = idx / D, e = idx % D;
    p.grad_k[(x * p.C + j0 + r) * D + e] = dks[r * pitch + e];
    p.grad_v[(x * p.C + j0 + r) * D + e] = dvs[r * pitch + e];
  }
}

// Launches f<T> for the params' dtype with `threads` per block and `floats` of dynamic shared memory.
template <template <typename> class K>
cudaError_t launch(const FlashParams& p, int64_t blocks, int threads, size_t floats, cudaStream_t stream) {
  const size_t bytes = floats * sizeof(float);
  auto run = [&](auto kernel) {
    if (bytes > 48 * 1024) {
      const cudaError_t err = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
      if (err != cudaSuccess) return err;
    }
    SPANFORMER_LAUNCH(kernel, static_cast<unsigned>(blocks), threads, bytes, stream)(p);
    return cudaGetLastError();
  };
  switch (p.dtype) {
    case DType::kFloat32: return run(K<float>::kernel);
    case DType::kBFloat16: return run(K<__nv_bfloat16>::kernel);
    case DType::kFloat16: return run(K<__half>::kernel);
  }
  return cudaErrorInvalidValue;
}

template <typename T> struct Forward { static constexpr auto kernel = forward_kernel<T>; };
template <typename T> struct DQ { static constexpr auto kernel = dq_kernel<T>; };
template <typename T> struct DKDV { static constexpr auto kernel = dkdv_kernel<T>; };

int64_t row_blocks(const FlashParams& p) { return p.B * p.K * ((p.N + kRowsPerBlock - 1) / kRowsPerBlock); }

}  // namespace

bool flash_supported(int64_t D) { return D >= 1 && D <= kWarp * kMaxPerLane; }

cudaError_t flash_attention_forward(const FlashParams& p, cudaStream_t stream) {
  if (!flash_supported(p.D) || p.N < 1 || p.C < p.N || p.band < 1) return cudaErrorInvalidValue;
  if (p.variant != FlashVariant::v0 && flash_mma_forward_supported(p)) return flash_attention_forward_mma(p, stream);
  const size_t floats = 2 * kKeys * (p.D + 1) + kRowsPerBlock * p.D;
  return launch<Forward>(p, row_blocks(p), kRowsPerBlock * kWarp, floats, stream);
}

bool flash_backward_accumulates(const FlashParams& p) {
  return p.variant != FlashVariant::v0 && flash_mma_backward_supported(p) &&
         !(lab_kernels().flash_backward && lab_kernels().flash_backward_applies(p));
}

cudaError_t flash_attention_backward(const FlashParams& p, cudaStream_t stream) {
  if (!flash_supported(p.D) || p.N < 1 || p.C < p.N || p.band < 1) return cudaErrorInvalidValue;
  if (p.variant != FlashVariant::v0 && flash_mma_backward_supported(p)) return flash_attention_backward_mma(p, stream);
  cudaError_t err = launch<DQ>(p, row_blocks(p), kRowsPerBlock * kWarp,
                               2 * kKeys * (p.D + 1) + 2 * kRowsPerBlock * p.D, stream);
  if (err != cudaSuccess) return err;
  return launch<DKDV>(p, p.B * p.K * ((p.C + kKeys - 1) / kKeys), kWarp, 4 * kKeys * (p.D + 1) + 2 * p.D, stream);
}

}  // namespace spanformer::ops::cuda
