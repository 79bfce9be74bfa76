// LibTorch glue of the CUDA kernels (built with -DSPANFORMER_CUDA=ON against a CUDA LibTorch): an
// autograd function that fills SpanAttentionParams and launches on the current stream. Gradients are
// accumulated in fp32 and cast back to the inputs' dtype.
#include <ATen/ATen.h>
#include <cstdlib>
#include <string>
#include <torch/autograd.h>

#include "glue.h"
#include "params.h"
#include "spanformer/ops/adaptive_span_attention.h"

namespace spanformer::ops {
namespace {

cuda::SpanAttentionParams make_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                      const at::Tensor& key_pe, const at::Tensor& ratio, const at::Tensor& visited,
                                      const SpanAttentionOptions& o) {
  cuda::SpanAttentionParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.key_pe = key_pe.data_ptr();
  p.span_ratio = ratio.data_ptr<float>();
  p.visited = visited.data_ptr<int>();
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
  // SPANFORMER_SPAN_KERNEL=v0: the forward's version 0 where version 1 would run (A/B measurements).
  const char* version = std::getenv("SPANFORMER_SPAN_KERNEL");
  p.forward_v0 = version != nullptr && std::string(version) == "v0";
  return p;
}

class SpanAttentionCudaFunction : public torch::autograd::Function<SpanAttentionCudaFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, const at::Tensor& pe_in, const at::Tensor& ratio_in,
                            int64_t attn_span, double ramp, double dropout, bool training, int64_t seed,
                            std::vector<int64_t> visited) {
    SpanAttentionOptions o{attn_span, ramp, dropout, training, static_cast<uint64_t>(seed), visited};
    auto q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous(), pe = pe_in.contiguous();
    auto ratio = ratio_in.detach().to(at::kFloat).contiguous();
    auto visited_t = at::tensor(std::vector<int>(visited.begin(), visited.end()), q.options().dtype(at::kInt));
    auto out = at::empty_like(q);
    auto stats = at::empty({3, q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));
    auto p = make_params(q, k, v, pe, ratio, visited_t, o);
    p.out = out.data_ptr();
    p.row_max = stats[0].data_ptr<float>();
    p.row_z = stats[1].data_ptr<float>();
    p.row_n = stats[2].data_ptr<float>();
    cuda::check_launch(cuda::span_attention_forward(p, cuda::current_stream()),
                       "adaptive_span_attention CUDA forward");
    ctx->save_for_backward({q, k, v, pe, ratio_in, out, stats, visited_t});
    ctx->saved_data["attn_span"] = attn_span;
    ctx->saved_data["ramp"] = ramp;
    cuda::DropoutSettings{dropout, training, seed}.save(ctx);
    return out;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    auto s = ctx->get_saved_variables();
    const auto &q = s[0], &k = s[1], &v = s[2], &pe = s[3], &ratio_in = s[4], &out = s[5], &stats = s[6], &visited_t = s[7];
    const auto drop = cuda::DropoutSettings::load(ctx);
    SpanAttentionOptions o{ctx->saved_data["attn_span"].toInt(), ctx->saved_data["ramp"].toDouble(), drop.dropout,
                           drop.training, static_cast<uint64_t>(drop.seed), {}};
    auto ratio = ratio_in.detach().to(at::kFloat).contiguous();
    auto grad_out = grads[0].to(q.scalar_type()).contiguous();
    auto f32 = q.options().dtype(at::kFloat);
    auto dq = at::zeros(q.sizes(), f32), dk = at::zeros(k.sizes(), f32), dv = at::zeros(v.sizes(), f32);
    auto dpe = at::zeros(pe.sizes(), f32), dratio = at::zeros(ratio.sizes(), f32);
    auto p = make_params(q, k, v, pe, ratio, visited_t, o);
    p.out = const_cast<void*>(out.data_ptr());
    p.row_max = stats[0].data_ptr<float>();
    p.row_z = stats[1].data_ptr<float>();
    p.row_n = stats[2].data_ptr<float>();
    p.grad_out = grad_out.data_ptr();
    p.grad_q = dq.data_ptr<float>();
    p.grad_k = dk.data_ptr<float>();
    p.grad_v = dv.data_ptr<float>();
    p.grad_key_pe = dpe.data_ptr<float>();
    p.grad_span_ratio = dratio.data_ptr<float>();
    cuda::check_launch(cuda::span_attention_backward(p, cuda::current_stream()),
                       "adaptive_span_attention CUDA backward");
    return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), dpe.to(pe.scalar_type()),
            dratio.to(ratio_in.scalar_type()), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor adaptive_span_attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                        const at::Tensor& key_pe, const at::Tensor& span_ratio,
                                        const SpanAttentionOptions& o, std::vector<int64_t> visited) {
  return SpanAttentionCudaFunction::apply(q, k, v, key_pe, span_ratio, o.attn_span, o.ramp, o.dropout, o.training,
                                          static_cast<int64_t>(o.seed), std::move(visited));
}

}  // namespace spanformer::ops
