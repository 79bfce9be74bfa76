// Parameters of the CUDA kernels: plain pointers and sizes, so the .cu files need no LibTorch headers.
// Adaptive span (span_attention_kernels.cu), contiguous: q, out (B, K, M, D); k, v (B, K, W + M, D);
// key_pe (D, L), key_pe_by_distance (W, D); span_ratio (K) float; visited (K) int; row statistics (B, K, M) float.
// Flash (flash_attention_kernels.cu), contiguous: q, out, grad_out (B, K, N, D); k, v (B, K, C, D);
// lse, delta (B, K, N) float; gradients float, dq like q, dk and dv like k.
#pragma once
#include <cstdint>

#include "variants.h"

#ifdef SPANFORMER_CUDA_EMULATE
#include "emulator.h"  // the CPU model of CUDA the CPU tests run these kernels on (tests/cuda_emulated/)
#else
#include <cuda_runtime.h>
#endif

namespace spanformer::ops::cuda {

enum class DType { kFloat32, kBFloat16, kFloat16 };

struct SpanAttentionParams {
  // Inputs, element type `dtype`.
  const void* q;
  const void* k;
  const void* v;
  const void* key_pe;
  const void* key_pe_by_distance;  // (W, D): row d - 1 is key_pe[:, L - d] (version 1 reads pe in 16-byte rows)
  const float* span_ratio;  // (K)
  const int* visited;       // (K) distances each head reads, 1 .. W
  const int* head_order;    // (K) the heads by visited distance, longest first (version 1's block order)
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
  float* grad_key_pe_by_distance;  // (W, D): version 2's key_pe gradient by distance (the glue adds it in)
  float* grad_span_ratio;
  int64_t B, K, M, W, D, L;
  float ramp;
  float dropout;            // applied when training
  bool training;
  uint64_t seed;
  DType dtype;
  bool forward_v0;          // the forward takes version 0 even where version 1 could (A/B measurements)
  bool backward_v0;         // the backward takes version 0 even where version 2 could
  int forward_min_blocks;   // version 1's __launch_bounds__ blocks an SM: 2 or 3 (the glue's rule)
  SpanVariant variant;      // a row of variants.h's kSpanVariants (SPANFORMER_SPAN_KERNEL; automatic else)
};

// Host launchers (span_attention_kernels.cu). D must be a multiple of 32 and at most 256. The forward
// takes version 1 (tensor cores, span_attention_mma_kernels.cu) for bf16 / fp16 with D 32, 64 or 128,
// else version 0; the backward takes version 2 (tensor cores, same file) for the same, else version 0;
// either backward works from the row statistics either forward writes.
cudaError_t span_attention_forward(const SpanAttentionParams& params, cudaStream_t stream);
cudaError_t span_attention_backward(const SpanAttentionParams& params, cudaStream_t stream);
bool span_attention_mma_supported(const SpanAttentionParams& params);
cudaError_t span_attention_forward_mma(const SpanAttentionParams& params, cudaStream_t stream);
bool span_attention_mma_backward_supported(const SpanAttentionParams& params);
cudaError_t span_attention_backward_mma(const SpanAttentionParams& params, cudaStream_t stream);

struct FlashParams {
  const void* q;
  const void* k;
  const void* v;
  void* out;                // forward output, `dtype`
  float* lse;               // forward output: log sum_j exp(s_ij) per row
  const void* grad_out;     // backward input, `dtype`
  const float* delta;       // backward input: dout_i . out_i per row
  float* grad_q;            // backward outputs, every element written
  float* grad_k;
  float* grad_v;
  int64_t B, K, N, C, D;
  int64_t band;             // keys per query, itself included: 1 .. C (C = dense causal)
  float dropout;            // applied when training
  bool training;
  uint64_t seed;
  DType dtype;
  FlashVariant variant;     // a row of variants.h's kFlashVariants (SPANFORMER_FLASH_KERNEL; automatic else)
};

// Host launchers (flash_attention_kernels.cu). D at most 256; false from flash_supported otherwise.
// Version 1 (tensor cores, flash_attention_mma_kernels.cu) runs for bf16 / fp16 with D 32, 64 or 128
// unless the variant is v0; version 0 elsewhere; a lab variant where it applies (LabKernels below). Version 1's
// backward adds dk and dv into the buffers (flash_backward_accumulates: the caller zeroes them); version
// 0 and the lab's key-major backward write every element.
bool flash_supported(int64_t D);
cudaError_t flash_attention_forward(const FlashParams& params, cudaStream_t stream);
cudaError_t flash_attention_backward(const FlashParams& params, cudaStream_t stream);
bool flash_backward_accumulates(const FlashParams& params);
bool flash_mma_forward_supported(const FlashParams& params);
bool flash_mma_backward_supported(const FlashParams& params);
cudaError_t flash_attention_forward_mma(const FlashParams& params, cudaStream_t stream);
cudaError_t flash_attention_backward_mma(const FlashParams& params, cudaStream_t stream);

// The lab's rows (lab/: kernel variants awaiting a GPU), which a build with the lab adds here before
// the first call (lab/register.cpp); the library itself never names the lab, and without it the table
// is empty. A launcher hands a call to the lab where its params name a lab variant (variants.h) and the
// lab's `applies` takes it.
struct LabKernels {
  bool linked = false;
  bool (*flash_forward_applies)(const FlashParams&) = nullptr;
  cudaError_t (*flash_forward)(const FlashParams&, cudaStream_t) = nullptr;
  // The lab's backward writes every element of dk and dv (the mainline's adds into zeroed buffers).
  bool (*flash_backward_applies)(const FlashParams&) = nullptr;
  cudaError_t (*flash_backward)(const FlashParams&, cudaStream_t) = nullptr;
  bool (*span_forward_applies)(const SpanAttentionParams&) = nullptr;
  cudaError_t (*span_forward)(const SpanAttentionParams&, cudaStream_t) = nullptr;
};
LabKernels& lab_kernels();  // span_attention_kernels.cu

}  // namespace spanformer::ops::cuda
