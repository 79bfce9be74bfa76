// LibTorch glue of the CUDA flash attention kernels (built with -DSPANFORMER_CUDA=ON against a CUDA
// LibTorch): an autograd function that fills FlashParams and launches on the current stream. Saves q, k,
// v, out and the fp32 logsumexp per row; gradients come back in fp32 and are cast to the inputs' dtype.
#include <ATen/ATen.h>
#include <torch/autograd.h>

#include "glue.h"
#include "params.h"
#include "spanformer/ops/flash_attention.h"

namespace spanformer::ops {
namespace {

cuda::FlashParams make_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, int64_t band,
                              const cuda::DropoutSettings& drop) {
  cuda::FlashParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.B = q.size(0);
  p.K = q.size(1);
  p.N = q.size(2);
  p.C = k.size(2);
  p.D = q.size(3);
  p.band = band;
  p.dropout = static_cast<float>(drop.dropout);
  p.training = drop.training;
  p.seed = static_cast<uint64_t>(drop.seed);
  p.dtype = cuda::dtype_of(q, "flash_attention");
  return p;
}

class FlashCudaFunction : public torch::autograd::Function<FlashCudaFunction> {
 public:
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& q_in, const at::Tensor& k_in,
                            const at::Tensor& v_in, int64_t band, double dropout, bool training, int64_t seed) {
    auto q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
    auto out = at::empty_like(q);                                                 // (B, K, N, D)
    auto lse = at::empty({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));  // (B, K, N)
    const cuda::DropoutSettings drop{dropout, training, seed};
    auto p = make_params(q, k, v, band, drop);
    p.out = out.data_ptr();
    p.lse = lse.data_ptr<float>();
    cuda::check_launch(cuda::flash_attention_forward(p, cuda::current_stream()), "flash attention CUDA forward");
    ctx->save_for_backward({q, k, v, out, lse});
    ctx->saved_data["band"] = band;
    drop.save(ctx);
    return out;
  }

  static torch::autograd::tensor_list backward(torch::autograd::AutogradContext* ctx,
                                               torch::autograd::tensor_list grads) {
    auto s = ctx->get_saved_variables();
    const auto &q = s[0], &k = s[1], &v = s[2], &out = s[3], &lse = s[4];
    auto grad_out = grads[0].to(q.scalar_type()).contiguous();                                  // (B, K, N, D)
    auto delta = (grad_out.to(at::kFloat) * out.to(at::kFloat)).sum(-1).contiguous();          // (B, K, N)
    auto f32 = q.options().dtype(at::kFloat);
    auto dq = at::empty(q.sizes(), f32), dk = at::empty(k.sizes(), f32), dv = at::empty(v.sizes(), f32);
    auto p = make_params(q, k, v, ctx->saved_data["band"].toInt(), cuda::DropoutSettings::load(ctx));
    p.out = const_cast<void*>(out.data_ptr());
    p.lse = lse.data_ptr<float>();
    p.grad_out = grad_out.data_ptr();
    p.delta = delta.data_ptr<float>();
    p.grad_q = dq.data_ptr<float>();
    p.grad_k = dk.data_ptr<float>();
    p.grad_v = dv.data_ptr<float>();
    cuda::check_launch(cuda::flash_attention_backward(p, cuda::current_stream()), "flash attention CUDA backward");
    return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type()), at::Tensor(), at::Tensor(),
            at::Tensor(), at::Tensor()};
  }
};

}  // namespace

bool flash_attention_cuda_supported(const at::Tensor& q) {
  const auto t = q.scalar_type();
  return (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf) && cuda::flash_supported(q.size(3));
}

// Called by flash_attention after its checks: o.band is already 1 .. C and the dropout seed drawn.
at::Tensor flash_attention_cuda(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashOptions& o) {
  return FlashCudaFunction::apply(q, k, v, o.band, o.dropout, o.training, static_cast<int64_t>(o.seed));
}

}  // namespace spanformer::ops
