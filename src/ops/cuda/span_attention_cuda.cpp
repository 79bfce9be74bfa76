// LibTorch glue of the span attention CUDA kernels (the `cuda` row of src/ops/backends.h; built with
// -DSPANFORMER_CUDA=ON against a CUDA LibTorch, and on the tests' CPU model of CUDA): fills
// SpanAttentionParams and launches on the current stream. The forward keeps each row's (max, Z, N) in
// fp32; gradients are accumulated in fp32 and cast back to the inputs' dtype.
#include <ATen/ATen.h>
#include <algorithm>
#include <numeric>
#include <string>
#include <vector>

#include "../backends.h"
#include "glue.h"
#include "params.h"

namespace spanformer::ops {
namespace {

// Which kernels run. Version 1's blocks an SM: 3 (at most 168 registers a thread) where at least a
// quarter of the window's distances lie beyond the heads' spans, whose tiles add to Z only and finish
// sooner; 2 where (nearly) every head spans the window, whose equal blocks fill 2 waves of 2 on 132 SMs
// better than 1.3 waves of 3 (measured, docs/kernels.md "v1 tuned"). SPANFORMER_SPAN_KERNEL names another
// row of variants.h's table: the mainline's forced choices for A/B runs (v0, v1-bwd-v0, v1b2, v1b3,
// v1b3-in-order) or a lab variant (lab/lab.h; 2 blocks an SM).
struct KernelChoice {
  cuda::SpanVariant variant = cuda::SpanVariant::automatic;
  bool forward_v0 = false, backward_v0 = false, heads_in_order = false;
  int min_blocks = 2;
};

KernelChoice kernel_choice(const SpanAttentionOptions& o, int64_t window) {
  using cuda::SpanVariant;
  int64_t visited_sum = 0;
  for (const auto s : o.visited) visited_sum += s;
  KernelChoice c;
  c.variant = cuda::variant_named(cuda::kSpanVariants, "SPANFORMER_SPAN_KERNEL");
  const auto v = c.variant;
  c.forward_v0 = v == SpanVariant::v0;
  c.backward_v0 = v == SpanVariant::v0 || v == SpanVariant::v1_backward_v0;
  c.heads_in_order = v == SpanVariant::v1b3_in_order;
  const auto K = static_cast<int64_t>(o.visited.size());
  const bool two = v == SpanVariant::v1b2 || v == SpanVariant::lab_async || v == SpanVariant::lab_shortcuts;
  const bool three = v == SpanVariant::v1b3 || v == SpanVariant::v1b3_in_order;
  c.min_blocks = two ? 2 : three ? 3 : 4 * visited_sum <= 3 * window * K ? 3 : 2;
  return c;
}

// What the kernels read per head, (2K) int32 on the inputs' device: the distances each head visits,
// then the heads by visited distance, longest first (version 1 starts the blocks of long heads first, so
// that the short heads' quicker blocks fill the last wave).
at::Tensor visited_tensor(const SpanAttentionOptions& o, const KernelChoice& c, const at::Tensor& like) {
  const auto K = static_cast<int>(o.visited.size());
  std::vector<int> both(o.visited.begin(), o.visited.end());
  std::vector<int> order(K);
  std::iota(order.begin(), order.end(), 0);
  if (!c.heads_in_order)
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return o.visited[a] > o.visited[b]; });
  both.insert(both.end(), order.begin(), order.end());
  return at::tensor(both, like.options().dtype(at::kInt));
}

cuda::SpanAttentionParams make_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& key_pe, const at::Tensor& ratio, const at::Tensor& visited,
                                      const KernelChoice& c, const SpanAttentionOptions& o) {
  cuda::SpanAttentionParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.key_pe = key_pe.data_ptr();
  p.span_ratio = ratio.data_ptr<float>();
  p.visited = visited.data_ptr<int>();
  p.head_order = p.visited + q.size(1);
  p.B = q.size(0);
  p.K = q.size(1);
  p.M = q.size(2);
  p.D = q.size(3);
  p.W = k.size(2) - q.size(2);
  p.L = o.attn_span;
  p.ramp = static_cast<float>(o.ramp);
  p.dropout = static_cast<float>(o.dropout);
  p.training = o.training;
  p.seed = o.seed;
  p.dtype = cuda::dtype_of(q, "adaptive_span_attention");
  p.forward_v0 = c.forward_v0;
  p.backward_v0 = c.backward_v0;
  p.forward_min_blocks = c.min_blocks;
  p.variant = c.variant;
  return p;
}

}  // namespace

namespace cuda_glue {

bool span_attention_supported(const at::Tensor& q) {
  const auto t = q.scalar_type();
  return (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf) && q.size(3) % 32 == 0 && q.size(3) <= 256;
}

Forward span_attention_forward(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                               const at::Tensor& pe_in, const at::Tensor& ratio_in, const SpanAttentionOptions& o,
                               bool /*keep*/) {
  auto q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous(), pe = pe_in.contiguous();
  auto ratio = ratio_in.detach().to(at::kFloat).contiguous();
  const auto choice = kernel_choice(o, k.size(2) - q.size(2));
  auto visited = visited_tensor(o, choice, q);
  auto out = cuda::uninitialized(q.sizes(), q.options());                                           // (B, K, M, D)
  auto stats = cuda::uninitialized({3, q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));  // (3,B,K,M)
  auto p = make_params(q, k, v, pe, ratio, visited, choice, o);
  const int64_t W = p.W, L = p.L;
  auto pe_by_distance = pe.narrow(1, L - W, W).flip({1}).t().contiguous();  // (W, D): row d - 1 = pe[:, L - d]
  p.key_pe_by_distance = pe_by_distance.data_ptr();
  p.out = out.data_ptr();
  p.row_max = stats[0].data_ptr<float>();
  p.row_z = stats[1].data_ptr<float>();
  p.row_n = stats[2].data_ptr<float>();
  cuda::check_launch(cuda::span_attention_forward(p, cuda::current_stream()), "adaptive_span_attention CUDA forward");
  return {out, stats};
}

SpanAttentionGrads span_attention_backward(const at::Tensor& grad_in, const at::Tensor& q_in, const at::Tensor& k_in,
                                           const at::Tensor& v_in, const at::Tensor& pe_in, const at::Tensor& ratio_in,
                                           const at::Tensor& out_in, const at::Tensor& stats,
                                           const SpanAttentionOptions& o) {
  auto q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous(), pe = pe_in.contiguous();
  auto out = out_in.contiguous();
  auto ratio = ratio_in.detach().to(at::kFloat).contiguous();
  const auto choice = kernel_choice(o, k.size(2) - q.size(2));
  auto visited = visited_tensor(o, choice, q);
  auto grad_out = grad_in.to(q.scalar_type()).contiguous();
  auto f32 = q.options().dtype(at::kFloat);
  auto dq = at::zeros(q.sizes(), f32), dk = at::zeros(k.sizes(), f32), dv = at::zeros(v.sizes(), f32);
  auto dpe = at::zeros(pe.sizes(), f32), dratio = at::zeros(ratio.sizes(), f32);
  auto p = make_params(q, k, v, pe, ratio, visited, choice, o);
  const int64_t W = p.W, L = p.L;
  auto pe_by_distance = pe.narrow(1, L - W, W).flip({1}).t().contiguous();  // (W, D): row d - 1 = pe[:, L - d]
  p.key_pe_by_distance = pe_by_distance.data_ptr();
  p.out = out.data_ptr();
  p.row_max = stats[0].data_ptr<float>();
  p.row_z = stats[1].data_ptr<float>();
  p.row_n = stats[2].data_ptr<float>();
  p.grad_out = grad_out.data_ptr();
  p.grad_q = dq.data_ptr<float>();
  p.grad_k = dk.data_ptr<float>();
  p.grad_v = dv.data_ptr<float>();
  p.grad_key_pe = dpe.data_ptr<float>();
  p.grad_span_ratio = dratio.data_ptr<float>();
  auto dpe_by_distance = at::zeros({W, q.size(3)}, f32);  // (W, D): version 2's dpe, row d - 1 = distance d
  p.grad_key_pe_by_distance = dpe_by_distance.data_ptr<float>();
  cuda::check_launch(cuda::span_attention_backward(p, cuda::current_stream()), "adaptive_span_attention CUDA backward");
  dpe.narrow(1, L - W, W).add_(dpe_by_distance.flip({0}).t());
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), dpe.to(pe.scalar_type()),
          dratio.to(ratio_in.scalar_type())};
}

}  // namespace cuda_glue
}  // namespace spanformer::ops
