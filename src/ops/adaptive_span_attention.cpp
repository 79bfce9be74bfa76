// Entry point of the adaptive-span attention op: argument checks once, then the CPU kernel (fused,
// hand-written backward), the CUDA kernel, or the reference composition for other devices.
#include "op_autocast.h"
#include "spanformer/ops/adaptive_span_attention.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cmath>

#include "spanformer/ops/skew.h"
#include "spanformer/util/error.h"
#include "cpu/span_attention_cpu.h"
#include "dropout_hash.h"

namespace spanformer::ops {

#ifdef SPANFORMER_WITH_CUDA
at::Tensor adaptive_span_attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& key_pe, const at::Tensor& span_ratio,
                                        const SpanAttentionOptions& o, std::vector<int64_t> visited);
#endif

int64_t visited_distance(double z, double ramp, int64_t window) {
  const auto last = static_cast<int64_t>(std::floor(z + ramp)) + 1;  // the mask reaches 0 here
  return std::clamp<int64_t>(last, 1, window);
}

std::vector<int64_t> visited_distances(const at::Tensor& span_ratio, int64_t attn_span, double ramp, int64_t window) {
  auto z = span_ratio.detach().to(at::kCPU, at::kDouble) * static_cast<double>(attn_span);
  std::vector<int64_t> visited;
  for (int64_t h = 0; h < z.size(0); ++h) visited.push_back(visited_distance(z[h].item<double>(), ramp, window));
  return visited;
}

bool dropout_keep(uint64_t seed, int64_t b, int64_t h, int64_t i, int64_t d, double p) {
  return dropout_keep_hash(seed, b, h, i, d, p);
}

uint64_t draw_dropout_seed() {
  return static_cast<uint64_t>(at::randint(std::numeric_limits<int64_t>::max(), {1}, at::kLong).item<int64_t>());
}

namespace {

// The visited distances of each head: from the options when the caller knows them, else read.
std::vector<int64_t> resolve_visited(const at::Tensor& span_ratio, int64_t W, const SpanAttentionOptions& o) {
  if (o.visited.empty()) return visited_distances(span_ratio, o.attn_span, o.ramp, W);
  TORCH_CHECK(static_cast<int64_t>(o.visited.size()) == span_ratio.size(0), "adaptive_span_attention: one visited count per head");
  for (int64_t s : o.visited) TORCH_CHECK(s >= 1 && s <= W, "adaptive_span_attention: visited count ", s, " outside [1, ", W, "]");
  return o.visited;
}

void check_arguments(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const at::Tensor& key_pe,
                     const at::Tensor& span_ratio, const SpanAttentionOptions& o) {
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4, "adaptive_span_attention: q, k, v must be (B, K, T, D)");
  const int64_t B = q.size(0), K = q.size(1), M = q.size(2), D = q.size(3);
  TORCH_CHECK(k.sizes() == v.sizes(), "adaptive_span_attention: k and v shapes differ");
  TORCH_CHECK(k.size(0) == B && k.size(1) == K && k.size(3) == D, "adaptive_span_attention: k does not match q");
  const int64_t W = k.size(2) - M;
  TORCH_CHECK(W >= 1 && W <= o.attn_span, "adaptive_span_attention: window ", W, " outside [1, L=", o.attn_span, "]");
  TORCH_CHECK(key_pe.dim() == 2 && key_pe.size(0) == D && key_pe.size(1) == o.attn_span,
              "adaptive_span_attention: key_pe must be (D, L)");
  TORCH_CHECK(span_ratio.dim() == 1 && span_ratio.size(0) == K, "adaptive_span_attention: span_ratio must be (K)");
  TORCH_CHECK(o.ramp > 0, "adaptive_span_attention: ramp must be positive");
  TORCH_CHECK(o.dropout >= 0 && o.dropout < 1, "adaptive_span_attention: dropout must be in [0, 1)");
  for (const auto* t : {&k, &v, &key_pe}) {
    TORCH_CHECK(t->scalar_type() == q.scalar_type() && t->device() == q.device(),
                "adaptive_span_attention: all inputs must share dtype and device");
  }
  // The spans may stay float32 beside bf16 / fp16 inputs (mixed precision): z = ratio L needs its bits.
  TORCH_CHECK(span_ratio.device() == q.device() &&
                  (span_ratio.scalar_type() == q.scalar_type() || span_ratio.scalar_type() == at::kFloat),
              "adaptive_span_attention: all inputs must share dtype and device");
}

// Autograd wrapper of the CPU kernel: saves the inputs and, when a gradient is needed, the softmax p
// (K, B, M, W), so backward does not recompute the scores (kernel v4).
class SpanAttentionCpuFunction : public torch::autograd::Function<SpanAttentionCpuFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q, const at::Tensor& k,
                            const at::Tensor& v, const at::Tensor& key_pe, const at::Tensor& span_ratio,
                            int64_t attn_span, double ramp, double dropout, bool training, int64_t seed,
                            std::vector<int64_t> visited, bool keep_p) {
    SpanAttentionOptions o{attn_span, ramp, dropout, training, static_cast<uint64_t>(seed), visited};
    ctx->saved_data["attn_span"] = attn_span;
    ctx->saved_data["ramp"] = ramp;
    ctx->saved_data["dropout"] = dropout;
    ctx->saved_data["training"] = training;
    ctx->saved_data["seed"] = seed;
    ctx->saved_data["visited"] = visited;
    at::Tensor p;
    auto out = cpu::span_attention_forward(q.contiguous(), k.contiguous(), v.contiguous(), key_pe.contiguous(),
                                           span_ratio.contiguous(), o, keep_p ? &p : nullptr);
    ctx->save_for_backward({q, k, v, key_pe, span_ratio, p});
    return out;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    auto saved = ctx->get_saved_variables();
    SpanAttentionOptions o{ctx->saved_data["attn_span"].toInt(), ctx->saved_data["ramp"].toDouble(),
                           ctx->saved_data["dropout"].toDouble(), ctx->saved_data["training"].toBool(),
                           static_cast<uint64_t>(ctx->saved_data["seed"].toInt()),
                           ctx->saved_data["visited"].toIntVector()};
    auto g = cpu::span_attention_backward(grads[0].contiguous(), saved[0].contiguous(), saved[1].contiguous(),
                                          saved[2].contiguous(), saved[3].contiguous(), saved[4].contiguous(), o,
                                          saved[5]);
    return {g.q, g.k, g.v, g.key_pe, g.span_ratio, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor adaptive_span_attention(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                   const at::Tensor& key_pe_in, const at::Tensor& span_ratio,
                                   const SpanAttentionOptions& options) {
  const OpAutocast cast(q_in);  // train.amp: the op's own compute dtype (op_autocast.h); the spans stay as they are
  const auto q = cast(q_in), k = cast(k_in), v = cast(v_in), key_pe = cast(key_pe_in);
  check_arguments(q, k, v, key_pe, span_ratio, options);
  const bool grad_needed = q.requires_grad() || k.requires_grad() || v.requires_grad() || key_pe.requires_grad() ||
                           span_ratio.requires_grad();
  if (q.device().is_cpu()) {
    return SpanAttentionCpuFunction::apply(q, k, v, key_pe, span_ratio, options.attn_span, options.ramp,
                                           options.dropout, options.training, static_cast<int64_t>(options.seed),
                                           resolve_visited(span_ratio, k.size(2) - q.size(2), options),
                                           /*keep_p=*/at::GradMode::is_enabled() && grad_needed);
  }
#ifdef SPANFORMER_WITH_CUDA
  if (q.device().is_cuda() && q.scalar_type() != at::kDouble && q.size(3) % 32 == 0 && q.size(3) <= 256) {
    return adaptive_span_attention_cuda(q, k, v, key_pe, span_ratio, options,
                                        resolve_visited(span_ratio, k.size(2) - q.size(2), options));
  }
#endif
  // Other devices and shapes: the reference composition.
  return adaptive_span_attention_reference(q, k, v, key_pe, span_ratio, options);
}

at::Tensor adaptive_span_attention_reference(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in,
                                             const at::Tensor& key_pe_in, const at::Tensor& span_ratio,
                                             const SpanAttentionOptions& o) {
  const OpAutocast cast(q_in);
  const auto q = cast(q_in), k = cast(k_in), v = cast(v_in), key_pe = cast(key_pe_in);
  check_arguments(q, k, v, key_pe, span_ratio, o);
  const int64_t B = q.size(0), K = q.size(1), M = q.size(2), D = q.size(3), W = k.size(2) - M, L = o.attn_span;
  auto scores = unskew(at::matmul(q, k.transpose(-1, -2)));                         // (B, K, M, W)
  scores = (scores + at::matmul(q, key_pe.narrow(1, L - W, W))) / std::sqrt(double(D));
  auto p = at::softmax(scores, -1);                                                 // (B, K, M, W)
  auto distance_minus_one = at::arange(W - 1, -1, -1, span_ratio.options());        // (W), column c = distance W - c (the spans' dtype: exact integers)
  auto m = ((span_ratio * double(L)).view({K, 1, 1}) - distance_minus_one) / o.ramp + 1.0;
  auto w = p * m.clamp(0.0, 1.0);                                                   // (B, K, M, W)
  auto a = w / (w.sum(-1, /*keepdim=*/true) + 1e-8);
  if (o.training && o.dropout > 0) {
    auto keep = at::empty({B, K, M, W}, at::kDouble);
    auto acc = keep.accessor<double, 4>();
    for (int64_t b = 0; b < B; ++b)
      for (int64_t h = 0; h < K; ++h)
        for (int64_t i = 0; i < M; ++i)
          for (int64_t c = 0; c < W; ++c) acc[b][h][i][c] = dropout_keep(o.seed, b, h, i, W - c, o.dropout) ? 1.0 : 0.0;
    a = a * keep.to(q.options()) / (1.0 - o.dropout);
  }
  return at::matmul(skew(a.to(v.scalar_type())), v);                               // (B, K, M, D)
}

}  // namespace spanformer::ops
