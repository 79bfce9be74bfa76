#include "spanformer/train/optim.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <algorithm>
#include <cmath>
#include <optional>

#include <fmt/ranges.h>

#include "spanformer/ops/step_ops.h"
#include "spanformer/util/error.h"
#include "spanformer/util/torch_compat.h"

namespace spanformer::train {

Optimizer::Optimizer(std::vector<std::pair<std::string, torch::Tensor>> named_params, OptimizerOptions options)
    : options_(std::move(options)) {
  for (auto& [name, p] : named_params) {
    Slot slot{name, p, torch::zeros_like(p), torch::Tensor()};
    if (options_.kind == OptimKind::kAdam || options_.kind == OptimKind::kAdamW) slot.state2 = torch::zeros_like(p);
    slots_.push_back(std::move(slot));
  }
}

void Optimizer::zero_grad() {
  for (auto& s : slots_)
    if (s.param.grad().defined()) s.param.mutable_grad().zero_();
}

void Optimizer::step(double lr) {
  torch::NoGradGuard no_grad;
  ++steps_;
  if (runs_fused())
    step_fused(lr);
  else
    step_plain(lr);
}

bool Optimizer::fusable() const {
  if (!SPANFORMER_HAS_FUSED_OPTIMIZERS) return false;
  std::optional<at::Device> device;
  for (const auto& s : slots_) {
    const auto& g = s.param.grad();
    if (!g.defined()) continue;
    // The kernels walk each tensor as one flat array: every one dense, contiguous, on one device, one dtype;
    // float32 or 16-bit (their gradient scale is a float32 number: double parameters take the plain path).
    if (s.param.scalar_type() == at::kDouble) return false;
    for (const auto& t : {s.param, g, s.state1}) {
      if (!t.is_contiguous() || t.is_sparse() || t.scalar_type() != s.param.scalar_type()) return false;
      if (!device) device = t.device();
      if (t.device() != *device) return false;
    }
    if (s.state2.defined() && !s.state2.is_contiguous()) return false;
  }
  if (!device || device->is_cpu()) return true;
  // On CUDA: ATen's multi-tensor Adam / AdamW, one launch for all parameters, with the other fused step
  // kernels' row (SPANFORMER_STEP_KERNELS=kernels, include/spanformer/ops/step_ops.h; the lab's: lab/lab.h).
  return device->is_cuda() && options_.kind != OptimKind::kAdagrad && ops::step_kernels_take(slots_.front().param);
}

void Optimizer::step_fused(double lr) {
#if SPANFORMER_HAS_FUSED_OPTIMIZERS
  const double c = options_.grad_clip;
  // The kernels read the step count (bias corrections; Adagrad's lr_decay, 0 here) from a float32 tensor.
  // On the parameters' device (CUDA's kernels read it there).
  at::Device device = at::kCPU;
  for (const auto& s : slots_)
    if (s.param.grad().defined()) device = s.param.device();
  const auto step = at::scalar_tensor(static_cast<double>(steps_), at::TensorOptions(at::kFloat).device(device));
  if (options_.kind == OptimKind::kAdagrad) {
    for (auto& s : slots_) {
      const auto& g = s.param.grad();
      if (!g.defined()) continue;
      double clr = lr;  // the reference's clipped rate, from the norm read on the host
      if (c > 0) {
        const double n = g.norm().item<double>();
        if (n > c) clr = lr * (c / (n + 1e-10));
      }
      at::_fused_adagrad_({s.param}, {g}, {s.state1}, {step}, clr, /*lr_decay=*/0.0, /*weight_decay=*/0.0,
                          /*eps=*/1e-10, /*maximize=*/false);
    }
    return;
  }
  adam_fused(lr, step);
#else
  step_plain(lr);
#endif
}

template <typename Lr>
void Optimizer::adam_fused(const Lr& lr, const at::Tensor& step) {
#if SPANFORMER_HAS_FUSED_OPTIMIZERS
  const double c = options_.grad_clip;
  std::vector<at::Tensor> params[2], grads[2], m[2], v[2], steps[2];  // [0]: not decayed, [1]: decayed
  std::vector<at::Tensor> norms;
  for (auto& s : slots_) {
    if (!s.param.grad().defined()) continue;
    const int decayed = options_.kind == OptimKind::kAdamW && options_.weight_decay > 0 && s.param.dim() >= 2;
    params[decayed].push_back(s.param);
    grads[decayed].push_back(s.param.grad());
    m[decayed].push_back(s.state1);
    v[decayed].push_back(s.state2);
    steps[decayed].push_back(step);
    if (c > 0) norms.push_back(s.param.grad().norm());
  }
  // Global-norm clipping as the kernels' gradient scale: they divide each gradient by 1 / coef as they read it.
  std::optional<at::Tensor> grad_scale;
  if (!norms.empty()) grad_scale = (c / (at::stack(norms).norm() + 1e-6)).clamp_max(1.0).reciprocal().to(at::kFloat);
  const double b1 = 0.9, b2 = options_.beta2, eps = 1e-8;
  for (int decayed : {0, 1}) {
    if (params[decayed].empty()) continue;
    if (options_.kind == OptimKind::kAdam)
      at::_fused_adam_(params[decayed], grads[decayed], m[decayed], v[decayed], {}, steps[decayed], lr, b1, b2,
                       options_.weight_decay, eps, /*amsgrad=*/false, /*maximize=*/false, grad_scale);
    else
      at::_fused_adamw_(params[decayed], grads[decayed], m[decayed], v[decayed], {}, steps[decayed], lr, b1, b2,
                        decayed ? options_.weight_decay : 0.0, eps, /*amsgrad=*/false, /*maximize=*/false, grad_scale);
  }
#else
  (void)lr, (void)step;
#endif
}

std::string Optimizer::graph_refusal() const {
  if (!SPANFORMER_HAS_FUSED_OPTIMIZERS) return "it needs ATen's fused optimizers (LibTorch 2.4 or later)";
  if (options_.kind != OptimKind::kAdam && options_.kind != OptimKind::kAdamW)
    return fmt::format("train.optim is {}; the captured update is Adam's or AdamW's", optim_name(options_.kind));
  for (const auto& s : slots_) {
    if (!s.param.is_cuda() || s.param.device() != slots_.front().param.device())
      return "the parameters are not on one CUDA device";
    if (s.param.scalar_type() == at::kDouble || !s.param.is_contiguous()) return "a parameter is double or not contiguous";
  }
  return "";
}

void Optimizer::begin_graph_step(double lr) {
  torch::NoGradGuard no_grad;
  ++steps_;
  if (!graph_lr_.defined()) {
    const auto options = at::TensorOptions(at::kFloat).device(slots_.front().param.device());
    graph_lr_ = at::zeros({}, options);
    graph_steps_ = at::full({}, static_cast<double>(steps_ - 1), options);  // graph_step adds this step
  }
  graph_lr_.fill_(lr);
}

void Optimizer::graph_step() {
  torch::NoGradGuard no_grad;
  graph_steps_.add_(1);
  adam_fused(graph_lr_, graph_steps_);
}

void Optimizer::step_plain(double lr) {
  const double c = options_.grad_clip;
  if (options_.kind == OptimKind::kAdagrad) {
    for (auto& s : slots_) {
      if (!s.param.grad().defined()) continue;
      const auto& g = s.param.grad();
      s.state1.addcmul_(g, g);                                             // sum += g^2 (unclipped)
      auto denom = s.state1.sqrt().add_(1e-10);
      if (c > 0) {
        auto norm = g.norm();                                              // 0-dim, stays on device
        auto scale = torch::where(norm > c, c / (norm + 1e-10), torch::ones_like(norm));
        s.param.sub_(g / denom * (scale * lr));
      } else {
        s.param.addcdiv_(g, denom, -lr);
      }
    }
    return;
  }
  // Global-norm clipping for sgd/adam (torch.nn.utils.clip_grad_norm_).
  if (c > 0) {
    std::vector<torch::Tensor> norms;
    for (auto& s : slots_)
      if (s.param.grad().defined()) norms.push_back(s.param.grad().norm());
    if (!norms.empty()) {
      auto total = torch::stack(norms).norm();
      auto coef = (c / (total + 1e-6)).clamp_max(1.0);
      for (auto& s : slots_)
        if (s.param.grad().defined()) s.param.mutable_grad().mul_(coef);
    }
  }
  for (auto& s : slots_) {
    if (!s.param.grad().defined()) continue;
    torch::Tensor g = s.param.grad();
    if (options_.weight_decay > 0 && options_.kind == OptimKind::kAdam) g = g + s.param * options_.weight_decay;
    if (options_.kind == OptimKind::kSgd) {
      if (options_.momentum > 0) {
        if (steps_ == 1) s.state1.copy_(g); else s.state1.mul_(options_.momentum).add_(g);
        s.param.sub_(s.state1 * lr);
      } else {
        s.param.sub_(g * lr);
      }
    } else {  // adam, adamw
      if (options_.kind == OptimKind::kAdamW && options_.weight_decay > 0 && s.param.dim() >= 2)
        s.param.mul_(1 - lr * options_.weight_decay);
      const double b1 = 0.9, b2 = options_.beta2, eps = 1e-8;
      s.state1.mul_(b1).add_(g, 1 - b1);
      s.state2.mul_(b2).addcmul_(g, g, 1 - b2);
      const double bias1 = 1 - std::pow(b1, static_cast<double>(steps_));
      const double bias2 = 1 - std::pow(b2, static_cast<double>(steps_));
      auto denom = (s.state2.sqrt() / std::sqrt(bias2)).add_(eps);
      s.param.addcdiv_(s.state1, denom, -lr / bias1);
    }
  }
}

void Optimizer::save(CheckpointWriter& out, const std::string& prefix) const {
  out.put_text(prefix + "kind", optim_name(options_.kind));
  out.put_int(prefix + "steps", steps_);
  for (const auto& s : slots_) {
    out.put(prefix + s.name + ".state1", s.state1);
    if (s.state2.defined()) out.put(prefix + s.name + ".state2", s.state2);
  }
}

void Optimizer::load(const Checkpoint& in, const std::string& prefix) {
  const std::string kind = in.text(prefix + "kind");
  if (kind != optim_name(options_.kind))
    fail("the checkpoint's optimizer is {}, the config asks for {} (start a new run to change optimizer)", kind,
         optim_name(options_.kind));
  steps_ = in.integer(prefix + "steps");
  if (steps_ < 0) fail("checkpoint {}: optimizer step count {} is negative", in.path(), steps_);
  auto read_into = [&](const std::string& key, torch::Tensor& target) {
    if (!in.has(key)) fail("checkpoint {} has no optimizer state '{}'", in.path(), key);
    auto t = in.tensor(key);
    if (t.sizes() != target.sizes()) fail("checkpoint optimizer state '{}' has shape {}, expected {}", key,
                                          fmt::join(t.sizes(), "x"), fmt::join(target.sizes(), "x"));
    if (!torch::isfinite(t).all().item<bool>())
      fail("checkpoint {}: optimizer state '{}' holds non-finite values", in.path(), key);
    target.copy_(t);
  };
  torch::NoGradGuard no_grad;
  for (auto& s : slots_) {
    read_into(prefix + s.name + ".state1", s.state1);
    if (s.state2.defined()) read_into(prefix + s.name + ".state2", s.state2);
  }
}

}  // namespace spanformer::train
