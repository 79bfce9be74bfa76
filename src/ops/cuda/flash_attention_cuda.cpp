// LibTorch glue of the CUDA flash attention kernels (the `cuda` row of src/ops/backends.h; built with
// -DSPANFORMER_CUDA=ON against a CUDA LibTorch, and on the tests' CPU model of CUDA): fills FlashParams and
// launches on the current stream. The forward keeps the fp32 logsumexp per row; gradients come back in
// fp32 and are cast to the inputs' dtype.
#include <ATen/ATen.h>

#include "../backends.h"
#include "glue.h"
#include "params.h"

namespace spanformer::ops {
namespace {

cuda::FlashParams make_params(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const FlashOptions& o) {
  cuda::FlashParams p{};
  p.q = q.data_ptr();
  p.k = k.data_ptr();
  p.v = v.data_ptr();
  p.B = q.size(0);
  p.K = q.size(1);
  p.N = q.size(2);
  p.C = k.size(2);
  p.D = q.size(3);
  p.band = o.band;
  p.dropout = static_cast<float>(o.dropout);
  p.training = o.training;
  p.seed = o.seed;
  p.dtype = cuda::dtype_of(q, "flash_attention");
  // Version 1 (tensor cores) wherever it applies (FlashCuda on the H100 and the CPU model of CUDA hold
  // it to the reference; 20-50x version 0's speed, docs/kernels.md); SPANFORMER_FLASH_KERNEL names another
  // row of variants.h's table: v0 for A/B runs, or a lab variant (lab/lab.h).
  p.variant = cuda::variant_named(cuda::kFlashVariants, "SPANFORMER_FLASH_KERNEL");
  return p;
}

}  // namespace

namespace cuda_glue {

bool flash_supported(const at::Tensor& q) {
  const auto t = q.scalar_type();
  return (t == at::kFloat || t == at::kBFloat16 || t == at::kHalf) && cuda::flash_supported(q.size(3));
}

Forward flash_forward(const at::Tensor& q_in, const at::Tensor& k_in, const at::Tensor& v_in, const FlashOptions& o) {
  auto q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous();
  auto out = cuda::uninitialized(q.sizes(), q.options());                                         // (B, K, N, D)
  auto lse = cuda::uninitialized({q.size(0), q.size(1), q.size(2)}, q.options().dtype(at::kFloat));  // (B, K, N)
  auto p = make_params(q, k, v, o);
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  cuda::check_launch(cuda::flash_attention_forward(p, cuda::current_stream()), "flash attention CUDA forward");
  return {out, lse};
}

FlashGrads flash_backward(const at::Tensor& grad_in, const at::Tensor& q_in, const at::Tensor& k_in,
                          const at::Tensor& v_in, const at::Tensor& out_in, const at::Tensor& lse_in,
                          const FlashOptions& o) {
  auto q = q_in.contiguous(), k = k_in.contiguous(), v = v_in.contiguous(), out = out_in.contiguous();
  auto lse = lse_in.contiguous();
  auto grad_out = grad_in.to(q.scalar_type()).contiguous();                                  // (B, K, N, D)
  auto delta = (grad_out.to(at::kFloat) * out.to(at::kFloat)).sum(-1).contiguous();          // (B, K, N)
  auto f32 = q.options().dtype(at::kFloat);
  auto p = make_params(q, k, v, o);
  p.out = out.data_ptr();
  p.lse = lse.data_ptr<float>();
  p.grad_out = grad_out.data_ptr();
  auto dq = cuda::uninitialized(q.sizes(), f32);  // (B, K, N, D)
  // (B, K, C, D): version 1 adds into them, version 0 writes every element (NaN on the CPU model of CUDA
  // until written, so that an element it misses fails the tests).
  const bool adds = cuda::flash_backward_accumulates(p);
  auto dk = adds ? at::zeros(k.sizes(), f32) : cuda::uninitialized(k.sizes(), f32);
  auto dv = adds ? at::zeros(v.sizes(), f32) : cuda::uninitialized(v.sizes(), f32);
  p.delta = delta.data_ptr<float>();
  p.grad_q = dq.data_ptr<float>();
  p.grad_k = dk.data_ptr<float>();
  p.grad_v = dv.data_ptr<float>();
  cuda::check_launch(cuda::flash_attention_backward(p, cuda::current_stream()), "flash attention CUDA backward");
  return {dq.to(q.scalar_type()), dk.to(k.scalar_type()), dv.to(v.scalar_type())};
}

}  // namespace cuda_glue
}  // namespace spanformer::ops
