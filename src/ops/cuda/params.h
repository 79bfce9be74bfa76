// Parameters of the CUDA adaptive-span attention kernels: plain pointers, sizes and strides, so the
// .cu file needs no LibTorch headers. Layouts (contiguous): q, out (B, K, M, D); k, v (B, K, W + M, D);
// key_pe (D, L); span_ratio (K) float; visited (K) int; row statistics (B, K, M) float.
#pragma once
#include <cstdint>

#include <cuda_runtime.h>

namespace spanformer::ops::cuda {

enum class DType { kFloat32, kBFloat16, kFloat16 };

struct SpanAttentionParams {
  // Inputs, element type `dtype`.
  const void* q;
  const void* k;
  const void* v;
  const void* key_pe;
  const float* span_ratio;  // (K)
  const int* visited;       // (K) distances each head reads, 1 .. W
  // Forward outputs.
  void* out;                // (B, K, M, D), `dtype`
  float* row_max;           // (B, K, M) running max of the scores
  float* row_z;             // (B, K, M) sum of exp(s - max) over the whole window
  float* row_n;             // (B, K, M) sum of exp(s - max) * mask
  // Backward: incoming gradient (`dtype`) and fp32 gradient buffers (zeroed by the caller).
  const void* grad_out;
  float* grad_q;
  float* grad_k;
  float* grad_v;
  float* grad_key_pe;
  float* grad_span_ratio;
  int64_t B, K, M, W, D, L;
  float ramp;
  float dropout;            // applied when training
  bool training;
  uint64_t seed;
  DType dtype;
};

// Host launchers (span_attention_kernels.cu). D must be a multiple of 32 and at most 256.
cudaError_t span_attention_forward(const SpanAttentionParams& params, cudaStream_t stream);
cudaError_t span_attention_backward(const SpanAttentionParams& params, cudaStream_t stream);

}  // namespace spanformer::ops::cuda
