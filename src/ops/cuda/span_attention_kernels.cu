// CUDA kernels of adaptive-span attention (semantics: include/spanformer/ops/adaptive_span_attention.h).
//
// Version 0 (this file): correctness first. One warp per query row; lanes take 32 distances at a time
// (a lane computes one score with a length-D dot product), an online softmax keeps the row's running
// max, Z = sum e and N = sum e*m; each lane owns D/32 output components. Scores and Z cover the
// whole window (the reference's normaliser); values, mask and dropout only the S_h visited distances
// of the row's head. Backward recomputes each row from the saved (max, Z, N), uses
//   G1 = dO . out,  dw_d = (da~_d - G1) / (N/Z + 1e-8),  G2 = sum dp p = 1e-8 G1 / (N/Z + 1e-8),
//   ds_d = p_d (dw_d m_d - G2) / sqrt(D),
// (ds_d = -p_d G2 / sqrt(D) beyond the span) and accumulates dk, dv, dkey_pe and dspan_ratio with
// fp32 atomics. Run on an H100 on 2026-11-23 (docs/kernels.md): correct, 19x slower than the plain
// composition. The forward's version 1 and the backward's version 2 (tensor cores, bf16 / fp16) are in
// span_attention_mma_kernels.cu; this backward serves fp32 and the widths version 2 does not take, from
// the row statistics (max, Z, N) either forward writes.
#include "../dropout_hash.h"
#include "device.cuh"
#include "params.h"

namespace spanformer::ops::cuda {
namespace {

constexpr int kMaxPerLane = 8;  // D <= 256

// Same counter-based stream as the CPU path and the reference.
__device__ __forceinline__ bool keep(uint64_t seed, int64_t b, int64_t h, int64_t i, int64_t d, float p) {
  return dropout_keep_hash(seed, b, h, i, d, static_cast<double>(p));
}

// What a warp knows about its query row.
struct Row {
  int64_t index;     // flat (b, h, i)
  int64_t b, h, i, S;
  float z;           // span in tokens
  int lane, per_lane;
  float inv_sqrt_d, drop_scale;
};

// The warp's row; false when the warp has none (past the last row).
__device__ bool locate_row(const SpanAttentionParams& p, Row& r) {
  r.index = static_cast<int64_t>(blockIdx.x) * (blockDim.x / kWarp) + threadIdx.x / kWarp;
  if (r.index >= p.B * p.K * p.M) return false;
  r.i = r.index % p.M;
  r.h = (r.index / p.M) % p.K;
  r.b = r.index / (p.M * p.K);
  r.S = p.visited[r.h];
  r.z = p.span_ratio[r.h] * static_cast<float>(p.L);
  r.lane = threadIdx.x % kWarp;
  r.per_lane = static_cast<int>(p.D / kWarp);
  r.inv_sqrt_d = rsqrtf(static_cast<float>(p.D));
  r.drop_scale = p.training && p.dropout > 0 ? 1.f / (1.f - p.dropout) : 1.f;
  return true;
}

// Score of query row r at distance d (1-based), q held in registers by lanes (component lane + 32 c).
template <typename T>
__device__ float score(const SpanAttentionParams& p, const Row& r, const float* qreg, int64_t d, float inv_sqrt_d) {
  const T* k = static_cast<const T*>(p.k) + ((r.b * p.K + r.h) * (p.W + p.M) + (r.i + p.W - d)) * p.D;
  const T* pe = static_cast<const T*>(p.key_pe);
  float partial = 0.f;
  const int lane = threadIdx.x % kWarp;
  for (int c = 0; c < p.D / kWarp; ++c) {
    const int64_t e = lane + kWarp * c;
    partial += qreg[c] * (to_float(k[e]) + to_float(pe[e * p.L + (p.L - d)]));
  }
  return warp_sum(partial) * inv_sqrt_d;
}

__device__ __forceinline__ float mask_value(float z, float ramp, int64_t d) {
  return fminf(fmaxf((z - static_cast<float>(d - 1)) / ramp + 1.f, 0.f), 1.f);
}

template <typename T>
__global__ void forward_kernel(SpanAttentionParams p) {
  Row r;
  if (!locate_row(p, r)) return;
  const int64_t row = r.index;
  const int lane = r.lane, per_lane = r.per_lane;
  const float inv_sqrt_d = r.inv_sqrt_d, drop_scale = r.drop_scale;
  float qreg[kMaxPerLane], acc[kMaxPerLane];
  const T* q = static_cast<const T*>(p.q) + row * p.D;
  for (int c = 0; c < per_lane; ++c) {
    qreg[c] = to_float(q[lane + kWarp * c]);
    acc[c] = 0.f;
  }
  float mx = -INFINITY, z_sum = 0.f, n_sum = 0.f;
  const T* v = static_cast<const T*>(p.v) + (r.b * p.K + r.h) * (p.W + p.M) * p.D;
  for (int64_t d = 1; d <= p.W; ++d) {
    // One distance per iteration, whole warp: simple and coalesced over D.
    const float s = score<T>(p, r, qreg, d, inv_sqrt_d);
    const float new_mx = fmaxf(mx, s);
    const float rescale = __expf(mx - new_mx);
    const float e = __expf(s - new_mx);
    if (d > r.S) {  // beyond the span: only the normaliser Z counts this key
      z_sum = z_sum * rescale + e;
      n_sum *= rescale;
      for (int c = 0; c < per_lane; ++c) acc[c] *= rescale;
      mx = new_mx;
      continue;
    }
    const float m = mask_value(r.z, p.ramp, d);
    const bool kept = !(p.training && p.dropout > 0) || keep(p.seed, r.b, r.h, r.i, d, p.dropout);
    const float w = e * m * (kept ? drop_scale : 0.f);
    z_sum = z_sum * rescale + e;
    n_sum = n_sum * rescale + e * m;
    const T* vrow = v + (r.i + p.W - d) * p.D;
    for (int c = 0; c < per_lane; ++c) acc[c] = acc[c] * rescale + w * to_float(vrow[lane + kWarp * c]);
    mx = new_mx;
  }
  const float denom = n_sum + 1e-8f * z_sum;
  T* out = static_cast<T*>(p.out) + row * p.D;
  for (int c = 0; c < per_lane; ++c) out[lane + kWarp * c] = from_float<T>(acc[c] / denom);
  if (lane == 0) {
    p.row_max[row] = mx;
    p.row_z[row] = z_sum;
    p.row_n[row] = n_sum;
  }
}

template <typename T>
__global__ void backward_kernel(SpanAttentionParams p) {
  Row r;
  if (!locate_row(p, r)) return;
  const int64_t row = r.index;
  const int lane = r.lane, per_lane = r.per_lane;
  const float inv_sqrt_d = r.inv_sqrt_d, drop_scale = r.drop_scale;
  float qreg[kMaxPerLane], go[kMaxPerLane], dq[kMaxPerLane];
  const T* q = static_cast<const T*>(p.q) + row * p.D;
  const T* g = static_cast<const T*>(p.grad_out) + row * p.D;
  const T* o = static_cast<const T*>(p.out) + row * p.D;
  float g1 = 0.f;
  for (int c = 0; c < per_lane; ++c) {
    qreg[c] = to_float(q[lane + kWarp * c]);
    go[c] = to_float(g[lane + kWarp * c]);
    dq[c] = 0.f;
    g1 += go[c] * to_float(o[lane + kWarp * c]);
  }
  g1 = warp_sum(g1);                                          // G1 = dO . out
  const float mx = p.row_max[row], z_sum = p.row_z[row], n_sum = p.row_n[row];
  const float n_p = n_sum / z_sum;                            // sum_d p_d m_d
  const float g2 = 1e-8f * g1 / (n_p + 1e-8f);                // sum_d dp_d p_d
  const int64_t base = (r.b * p.K + r.h) * (p.W + p.M);
  const T* k = static_cast<const T*>(p.k) + base * p.D;
  const T* v = static_cast<const T*>(p.v) + base * p.D;
  const T* pe = static_cast<const T*>(p.key_pe);
  float dz = 0.f;
  for (int64_t d = 1; d <= p.W; ++d) {
    const int64_t j = r.i + p.W - d;
    const float s = score<T>(p, r, qreg, d, inv_sqrt_d);
    const float prob = __expf(s - mx) / z_sum;
    if (d > r.S) {  // beyond the span: the gradient of the 1e-8 Z term only, ds = -p G2
      const float ds = -prob * g2 * inv_sqrt_d;
      for (int c = 0; c < per_lane; ++c) {
        const int64_t e = lane + kWarp * c;
        dq[c] += ds * (to_float(k[j * p.D + e]) + to_float(pe[e * p.L + (p.L - d)]));
        atomicAdd(&p.grad_k[(base + j) * p.D + e], ds * qreg[c]);
        atomicAdd(&p.grad_key_pe[e * p.L + (p.L - d)], ds * qreg[c]);
      }
      continue;
    }
    const float m = mask_value(r.z, p.ramp, d);
    const bool kept = !(p.training && p.dropout > 0) || keep(p.seed, r.b, r.h, r.i, d, p.dropout);
    const float scale = kept ? drop_scale : 0.f;
    const float a_tilde = prob * m / (n_p + 1e-8f);
    float da = 0.f;
    for (int c = 0; c < per_lane; ++c) da += go[c] * to_float(v[j * p.D + lane + kWarp * c]);
    da = warp_sum(da) * scale;                                // da~_d
    const float dw = (da - g1) / (n_p + 1e-8f);
    const float ds = prob * (dw * m - g2) * inv_sqrt_d;
    const float x = (r.z - static_cast<float>(d - 1)) / p.ramp + 1.f;
    if (x >= 0.f && x <= 1.f) dz += dw * prob;                // dm_d, inside the ramp (clamp's gradient)
    for (int c = 0; c < per_lane; ++c) {
      const int64_t e = lane + kWarp * c;
      dq[c] += ds * (to_float(k[j * p.D + e]) + to_float(pe[e * p.L + (p.L - d)]));
      atomicAdd(&p.grad_k[(base + j) * p.D + e], ds * qreg[c]);
      atomicAdd(&p.grad_v[(base + j) * p.D + e], a_tilde * scale * go[c]);
      atomicAdd(&p.grad_key_pe[e * p.L + (p.L - d)], ds * qreg[c]);
    }
  }
  for (int c = 0; c < per_lane; ++c) p.grad_q[row * p.D + lane + kWarp * c] = dq[c];
  if (lane == 0) atomicAdd(&p.grad_span_ratio[r.h], dz * static_cast<float>(p.L) / p.ramp);
}

cudaError_t launch(const SpanAttentionParams& p, cudaStream_t stream, void (*f32)(SpanAttentionParams),
                   void (*bf16)(SpanAttentionParams), void (*f16)(SpanAttentionParams)) {
  if (p.D % kWarp != 0 || p.D > kWarp * kMaxPerLane) return cudaErrorInvalidValue;
  const int warps_per_block = 4;
  const int64_t rows = p.B * p.K * p.M;
  const dim3 grid(static_cast<unsigned>((rows + warps_per_block - 1) / warps_per_block));
  const dim3 block(warps_per_block * kWarp);
  switch (p.dtype) {
    case DType::kFloat32: SPANFORMER_LAUNCH(f32, grid, block, 0, stream)(p); break;
    case DType::kBFloat16: SPANFORMER_LAUNCH(bf16, grid, block, 0, stream)(p); break;
    case DType::kFloat16: SPANFORMER_LAUNCH(f16, grid, block, 0, stream)(p); break;
  }
  return cudaGetLastError();
}

}  // namespace

LabKernels& lab_kernels() {
  static LabKernels kernels;
  return kernels;
}

cudaError_t span_attention_forward(const SpanAttentionParams& p, cudaStream_t stream) {
  if (!p.forward_v0 && span_attention_mma_supported(p)) return span_attention_forward_mma(p, stream);
  return launch(p, stream, forward_kernel<float>, forward_kernel<__nv_bfloat16>, forward_kernel<__half>);
}

cudaError_t span_attention_backward(const SpanAttentionParams& p, cudaStream_t stream) {
  if (!p.backward_v0 && span_attention_mma_backward_supported(p)) return span_attention_backward_mma(p, stream);
  return launch(p, stream, backward_kernel<float>, backward_kernel<__nv_bfloat16>, backward_kernel<__half>);
}

}  // namespace spanformer::ops::cuda
