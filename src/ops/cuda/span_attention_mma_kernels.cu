// Adaptive-span attention on the tensor cores: the mainline's forward launcher (version 1; the kernel,
// its formulas and tiling: span_attention_mma.cuh) and the backward's version 2. A forward lab variant
// named by SPANFORMER_SPAN_KERNEL (variants.h) runs instead where a lab build has added it and it applies
// (LabKernels, params.h).
#include "span_attention_mma.cuh"

namespace spanformer::ops::cuda {
namespace {

template <typename T, int D>
cudaError_t launch_mma(const SpanAttentionParams& p, cudaStream_t stream) {
  const int64_t blocks = p.B * p.K * ((p.M + kRows - 1) / kRows);
  const auto kernel = p.forward_min_blocks == 3 ? forward_mma_kernel<T, D, 3, LoadedTiles>
                                                : forward_mma_kernel<T, D, 2, LoadedTiles>;
  return launch_with_shared(kernel, blocks, kWarps * kWarp, shared_bytes<T, D, LoadedTiles>(), p, stream);
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
  const auto& lab = lab_kernels();
  if (lab.span_forward && lab.span_forward_applies(p)) return lab.span_forward(p, stream);
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
