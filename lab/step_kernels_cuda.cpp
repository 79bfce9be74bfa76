// LibTorch glue of the fused step kernels (cuda/step_kernels.cu; built with -DSPANFORMER_CUDA=ON against a
// CUDA LibTorch, and on the tests' CPU model of CUDA): flattens the rows, fills the params and launches
// on the current stream; parameter gradients come back in fp32 and are cast to the parameters' dtype.
#include <ATen/ATen.h>

#include "cuda/step_params.h"
#include "ops/cuda/glue.h"
#include "step_kernels.h"

namespace spanformer::ops {
namespace {

void check_rows(const at::Tensor& x, const at::Tensor& param, const char* op) {
  TORCH_CHECK(x.dim() >= 1 && param.dim() == 1 && x.size(-1) == param.numel(), op,
              ": the last dimension of the activations must be the parameters' length");
  TORCH_CHECK(param.scalar_type() == at::kFloat || param.scalar_type() == x.scalar_type(), op,
              ": parameters must be float32 or the activations' dtype");
}

// The params both bias + GELU launches share: the rows of x, the bias, the form.
cuda::BiasGeluParams bias_gelu_params(const at::Tensor& x, const at::Tensor& bias, bool tanh) {
  cuda::BiasGeluParams p{};
  p.x = x.data_ptr();
  p.bias = bias.data_ptr();
  p.H = x.size(-1);
  p.rows = x.numel() / p.H;
  p.tanh = tanh;
  p.dtype = cuda::dtype_of(x, "bias_gelu");
  p.param_dtype = cuda::dtype_of(bias, "bias_gelu");
  return p;
}

}  // namespace

namespace cuda_glue {

AddLayerNormForward add_layer_norm_forward(const at::Tensor& x_in, const at::Tensor& r_in, const at::Tensor& weight_in,
                                           const at::Tensor& bias_in, double eps) {
  check_rows(x_in, weight_in, "add_layer_norm");
  TORCH_CHECK(r_in.sizes() == x_in.sizes() && r_in.scalar_type() == x_in.scalar_type(),
              "add_layer_norm: the branch must have the residual stream's shape and dtype");
  auto x = x_in.contiguous(), r = r_in.contiguous(), weight = weight_in.contiguous();
  auto bias = bias_in.to(weight.scalar_type()).contiguous();
  const int64_t H = x.size(-1), rows = x.numel() / H;
  auto f32 = x.options().dtype(at::kFloat);
  AddLayerNormForward f{cuda::uninitialized(x.sizes(), x.options()), cuda::uninitialized(x.sizes(), x.options()),
                        cuda::uninitialized({rows}, f32), cuda::uninitialized({rows}, f32)};
  cuda::AddLayerNormParams p{};
  p.x = x.data_ptr();
  p.r = r.data_ptr();
  p.weight = weight.data_ptr();
  p.bias = bias.data_ptr();
  p.sum = f.sum.data_ptr();
  p.out = f.out.data_ptr();
  p.mean = f.mean.data_ptr<float>();
  p.rstd = f.rstd.data_ptr<float>();
  p.rows = rows;
  p.H = H;
  p.eps = static_cast<float>(eps);
  p.dtype = cuda::dtype_of(x, "add_layer_norm");
  p.param_dtype = cuda::dtype_of(weight, "add_layer_norm");
  cuda::check_launch(cuda::add_layer_norm_forward(p, cuda::current_stream()), "add_layer_norm CUDA forward");
  return f;
}

std::vector<at::Tensor> add_layer_norm_backward(const at::Tensor& grad_out, const at::Tensor& grad_sum,
                                                const AddLayerNormForward& saved, const at::Tensor& weight_in) {
  const auto& s = saved.sum;
  auto dy = grad_out.to(s.scalar_type()).contiguous();
  auto direct = grad_sum.defined() ? grad_sum.to(s.scalar_type()).contiguous() : at::Tensor();
  auto weight = weight_in.contiguous();
  const int64_t H = s.size(-1), rows = s.numel() / H;
  auto ds = cuda::uninitialized(s.sizes(), s.options());                                   // (..., H)
  auto dweight = at::zeros({H}, s.options().dtype(at::kFloat)), dbias = at::zeros({H}, s.options().dtype(at::kFloat));
  cuda::AddLayerNormParams p{};
  p.weight = weight.data_ptr();
  p.sum = s.data_ptr();
  p.mean = saved.mean.data_ptr<float>();
  p.rstd = saved.rstd.data_ptr<float>();
  p.grad_out = dy.data_ptr();
  p.grad_sum = direct.defined() ? direct.data_ptr() : nullptr;
  p.grad_in = ds.data_ptr();
  p.grad_weight = dweight.data_ptr<float>();
  p.grad_bias = dbias.data_ptr<float>();
  p.rows = rows;
  p.H = H;
  p.dtype = cuda::dtype_of(s, "add_layer_norm");
  p.param_dtype = cuda::dtype_of(weight, "add_layer_norm");
  cuda::check_launch(cuda::add_layer_norm_backward(p, cuda::current_stream()), "add_layer_norm CUDA backward");
  return {ds, dweight.to(weight.scalar_type()), dbias.to(weight.scalar_type())};
}

at::Tensor bias_gelu_forward(const at::Tensor& x_in, const at::Tensor& bias_in, bool tanh) {
  check_rows(x_in, bias_in, "bias_gelu");
  auto x = x_in.contiguous(), bias = bias_in.contiguous();
  auto y = cuda::uninitialized(x.sizes(), x.options());  // (..., H)
  auto p = bias_gelu_params(x, bias, tanh);
  p.out = y.data_ptr();
  cuda::check_launch(cuda::bias_gelu_forward(p, cuda::current_stream()), "bias_gelu CUDA forward");
  return y;
}

std::vector<at::Tensor> bias_gelu_backward(const at::Tensor& grad_out, const at::Tensor& x_in, const at::Tensor& bias_in,
                                           bool tanh) {
  auto x = x_in.contiguous(), bias = bias_in.contiguous();
  auto dy = grad_out.to(x.scalar_type()).contiguous();
  auto dx = cuda::uninitialized(x.sizes(), x.options());                 // (..., H)
  auto dbias = at::zeros({x.size(-1)}, x.options().dtype(at::kFloat));  // (H)
  auto p = bias_gelu_params(x, bias, tanh);
  p.grad_out = dy.data_ptr();
  p.grad_in = dx.data_ptr();
  p.grad_bias = dbias.data_ptr<float>();
  cuda::check_launch(cuda::bias_gelu_backward(p, cuda::current_stream()), "bias_gelu CUDA backward");
  return {dx, dbias.to(bias.scalar_type())};
}

}  // namespace cuda_glue
}  // namespace spanformer::ops
