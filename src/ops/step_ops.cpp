// The step ops' one entry each and their table: the ATen composition (the reference, and the default
// everywhere), or the kernel row a program added (add_step_row) when SPANFORMER_STEP_KERNELS=kernels and
// it takes the tensors. Semantics: include/spanformer/ops/step_ops.h.
#include "spanformer/ops/step_ops.h"

#include <string>

#include "spanformer/util/error.h"
#include "spanformer/util/switches.h"

namespace spanformer::ops {
namespace {

std::optional<StepRow>& kernel_row() {
  static std::optional<StepRow> row;
  return row;
}

// The added row where SPANFORMER_STEP_KERNELS=kernels, else none (the composition).
const StepRow* chosen_row() {
  const std::string value = switch_value("SPANFORMER_STEP_KERNELS");  // util/switches.h
  if (value != "kernels") return nullptr;
  if (!kernel_row()) fail("SPANFORMER_STEP_KERNELS=kernels: this program has no step kernels (a build with -DSPANFORMER_LAB=ON adds the lab's)");
  return &*kernel_row();
}

}  // namespace

void add_step_row(const StepRow& row) {
  if (kernel_row() && std::string(kernel_row()->name) != row.name)
    fail("step ops: a second kernel row '{}' beside '{}'", row.name, kernel_row()->name);
  kernel_row() = row;
}

bool step_kernels_take(const at::Tensor& x) {
  const StepRow* row = chosen_row();
  return row != nullptr && row->takes(x);
}

SumAndNorm add_layer_norm(const at::Tensor& x, const at::Tensor& r, const at::Tensor& weight, const at::Tensor& bias,
                          double eps) {
  if (const StepRow* row = chosen_row(); row != nullptr && row->takes(x))
    if (auto fused = row->add_layer_norm(x, r, weight, bias, eps)) return *fused;
  auto s = x + r;                                                                  // (..., H)
  return {s, at::layer_norm(s, {weight.numel()}, weight, bias, eps)};              // (..., H)
}

at::Tensor bias_gelu(const at::Tensor& x, const at::Tensor& bias, bool tanh) {
  if (const StepRow* row = chosen_row(); row != nullptr && row->takes(x))
    if (auto fused = row->bias_gelu(x, bias, tanh); fused.defined()) return fused;
  return at::gelu(x + bias.to(x.scalar_type()), tanh ? "tanh" : "none");  // (..., H), in x's dtype
}

}  // namespace spanformer::ops
