// The backends of the span-aware and flash attention ops, each a forward that returns what its backward
// needs and a backward that takes it: the rows the ops' dispatcher entries (registered with
// torch.library in the ops' own files) and their one autograd function (autograd_function.h) call.
// Internal header: inputs are checked, contiguous, cast by OpAutocast, bands and spans resolved.
//
//   op                       row          forward keeps                        file
//   adaptive_span_attention  cpu          p (K, B, M, W) when training         cpu/span_attention_cpu.cpp
//                            cuda         row (max, Z, N) (3, B, K, M) fp32     cuda/span_attention_cuda.cpp
//                            reference    (autograd over the composition)      adaptive_span_attention.cpp
//   flash_attention          cpu          logsumexp (B, K, N)                  cpu/flash_attention_cpu.cpp
//                            tiles        logsumexp (B, K, N)                  flash_attention.cpp (any device)
//                            cuda         logsumexp (B, K, N) fp32              cuda/flash_attention_cuda.cpp
// Which row serves which inputs is each op's backend table, walked in order by its entry (kSpanBackends
// in adaptive_span_attention.cpp: cuda, cpu, reference; kFlashBackends in flash_attention.cpp: cuda,
// cpu, tiles); adaptive_span_attention_backend(q) and flash_attention_backend(q) name the row, and
// SpanBackendOverride / FlashBackendOverride force one. The tests run one case list per op on every row
// of the device (tests/op_cases.h), and `--op-perf` times every row with its GFLOP/s.
// Dims: B batch, K heads, M / N queries, W window, C keys, D head width, L max span.
#pragma once
#include <ATen/ATen.h>

#include <atomic>
#include <iterator>
#include <string>
#include <vector>

#include <fmt/ranges.h>

#include "spanformer/ops/adaptive_span_attention.h"
#include "spanformer/ops/flash_attention.h"
#include "spanformer/util/error.h"

namespace spanformer::ops {

// What a backend's forward returns: the output and what its backward reads (see the table above).
struct Forward {
  at::Tensor out, saved;
};

struct SpanAttentionGrads {
  at::Tensor q, k, v, key_pe, span_ratio;
};

struct FlashGrads {
  at::Tensor q, k, v;
};

// The span mask before its clamp to [0, 1], for the S nearest distances of every head:
//   x[h, c] = (ratio_h L - (S - 1 - c)) / R + 1,  column c = distance S - c              (K, S)
// in the spans' dtype. The reference composition and the CPU kernel both take it from here: their
// masks must round alike (in float32 x is 0 at z = 1.2e-6, S = 33, R = 32, where double gives 3.7e-8).
at::Tensor span_mask_unclamped(const at::Tensor& span_ratio, int64_t S, int64_t attn_span, double ramp);

// The names of a backend table's rows, in the order they are asked.
template <class Row, size_t N>
std::vector<std::string> row_names(const Row (&table)[N]) {
  std::vector<std::string> names;
  for (const auto& row : table) names.emplace_back(row.name);
  return names;
}

// A table's forced row (an index; -1: none) and the override that sets it for its lifetime: the one
// implementation behind SpanBackendOverride and FlashBackendOverride. A name not in the table is a
// one-line error that lists the rows.
template <class Row, size_t N>
int force_row(const Row (&table)[N], std::atomic<int>& forced, const std::string& name, const char* op) {
  for (size_t r = 0; r < N; ++r)
    if (name == table[r].name) return forced.exchange(static_cast<int>(r));
  fail("{}: no row '{}' in this build (rows: {})", op, name, fmt::join(row_names(table), ", "));
}

// The row serving q: the forced one (refusing inputs it cannot take), else the first that takes them.
// Takes is a callable (row, q) -> bool.
template <class Row, size_t N, class Takes>
const Row& pick_row(const Row (&table)[N], const std::atomic<int>& forced, const at::Tensor& q, const char* op,
                    Takes takes) {
  if (const int r = forced.load(); r >= 0) {
    if (!takes(table[r], q))
      fail("{}: the {} row cannot take {} inputs on {}", op, table[r].name, c10::toString(q.scalar_type()),
           q.device().str());
    return table[r];
  }
  for (const auto& row : table)
    if (takes(row, q)) return row;
  return table[N - 1];
}

namespace cpu {
// The dtype the CPU kernel computes in: float32 for bf16 / fp16 inputs (products accumulated and
// rounded once, as the CUDA kernels do; ATen's 16-bit CPU products differ by LibTorch version), the
// inputs' own otherwise. p is kept in it.
inline at::ScalarType span_compute_dtype(at::ScalarType t) {
  return t == at::kBFloat16 || t == at::kHalf ? at::kFloat : t;
}
// The span op's cpu row: CPU tensors, any floating dtype, any layout. options.visited resolved; saved = p
// (in span_compute_dtype) when keep_p, else an empty tensor (no backward possible). The backward reads
// p_kept, not out.
inline bool span_takes(const at::Tensor& q) { return q.device().is_cpu(); }
Forward span_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& key_pe, const at::Tensor& span_ratio,
                               const SpanAttentionOptions& options, bool keep_p);
SpanAttentionGrads span_attention_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& key_pe,
                                           const at::Tensor& span_ratio, const at::Tensor& out,
                                           const at::Tensor& p_kept, const SpanAttentionOptions& options);
// What the forward keeps, without values (the Meta kernel's): p (K, B, M, W) when keep_p, else nothing.
inline at::Tensor span_saved_like(const at::Tensor& q, const at::Tensor& k, bool keep_p) {
  const auto options = q.options().dtype(span_compute_dtype(q.scalar_type()));
  return keep_p ? at::empty({q.size(1), q.size(0), q.size(2), k.size(2) - q.size(2)}, options) : at::empty({0}, options);
}
// The fused flash kernel: CPU tensors of float32, float64, bfloat16 or float16 (16-bit computed in
// float32). saved = logsumexp (B, K, N) in float32 (float64 for float64 inputs); options.band 1 .. C.
bool flash_supported(const at::Tensor& q);
Forward flash_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashOptions& options);
FlashGrads flash_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& out, const at::Tensor& lse, const FlashOptions& options);
}  // namespace cpu

namespace tiles {
// ATen tiles of FlashAttention (any device ATen runs on): saved = logsumexp (B, K, N) in float32 (float64
// for float64 inputs). options.band is 1 .. C and the dropout seed drawn.
Forward flash_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashOptions& options);
FlashGrads flash_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& out, const at::Tensor& lse, const FlashOptions& options);
}  // namespace tiles

// Padded batches (FlashOptions::key_ranges) on a row whose kernels do not read the ranges (the CUDA
// kernels): each batch row's real tokens as a batch of one, read by `row` without key_ranges; padded
// queries give out 0, L = -inf, and padded positions no gradient (flash_attention.cpp).
using FlashForwardFn = Forward (*)(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashOptions& o);
using FlashBackwardFn = FlashGrads (*)(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                       const at::Tensor& v, const at::Tensor& out, const at::Tensor& lse,
                                       const FlashOptions& o);
Forward flash_forward_by_rows(FlashForwardFn row, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                              const FlashOptions& o);
FlashGrads flash_backward_by_rows(FlashBackwardFn row, const at::Tensor& grad_out, const at::Tensor& q,
                                  const at::Tensor& k, const at::Tensor& v, const at::Tensor& out,
                                  const at::Tensor& lse, const FlashOptions& o);

// The CUDA kernels' glue (src/ops/cuda/*_cuda.cpp): compiled into -DSPANFORMER_CUDA=ON builds, and into
// the tests' CPU model of CUDA (tests/cuda_emulated), where the same code runs on CPU tensors.
namespace cuda_glue {
// The span op's cuda row: CUDA tensors of float32 / bfloat16 / float16 with D a multiple of 32 up to 256.
// saved = the rows' (max, Z, N), (3, B, K, M) float32, whether or not a backward follows (keep unused).
bool span_attention_supported(const at::Tensor& q);
inline bool span_takes(const at::Tensor& q) { return q.is_cuda() && span_attention_supported(q); }
Forward span_attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                               const at::Tensor& key_pe, const at::Tensor& span_ratio,
                               const SpanAttentionOptions& options, bool keep);
inline at::Tensor span_saved_like(const at::Tensor& q, const at::Tensor&, bool) {
  return at::empty({3, q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
}
SpanAttentionGrads span_attention_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& key_pe,
                                           const at::Tensor& span_ratio, const at::Tensor& out,
                                           const at::Tensor& stats, const SpanAttentionOptions& options);
// float32 / bfloat16 / float16 with D <= 256.
bool flash_supported(const at::Tensor& q);
Forward flash_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashOptions& options);
FlashGrads flash_backward(const at::Tensor& grad_out, const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                          const at::Tensor& out, const at::Tensor& lse, const FlashOptions& options);
}  // namespace cuda_glue

}  // namespace spanformer::ops
