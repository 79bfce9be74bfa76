// Flash attention on the tensor cores, version 1: the mainline's launchers (the kernels, their formulas
// and tiling: flash_attention_mma.cuh). A lab variant named by SPANFORMER_FLASH_KERNEL (variants.h)
// runs instead where a lab build has added it and it applies (LabKernels, params.h); `auto` never names one.
#include "flash_attention_mma.cuh"

namespace spanformer::ops::cuda {
namespace {

template <typename T>
cudaError_t forward_for_width(const FlashParams& p, cudaStream_t stream) {
  return with_mma_width(p.D, [&](auto d) {
    constexpr int D = decltype(d)::value;
    return launch(forward_mma_kernel<T, D, 1, LoadedTiles>, forward_bytes<T, D, LoadedTiles>(), p, stream);
  });
}

template <typename T>
cudaError_t backward_for_width(const FlashParams& p, cudaStream_t stream) {
  return with_mma_width(p.D, [&](auto d) {
    constexpr int D = decltype(d)::value;
    return launch(backward_mma_kernel<T, D, true>, backward_bytes<T, D, true>(), p, stream);
  });
}

}  // namespace

bool flash_mma_forward_supported(const FlashParams& p) {
  return p.dtype != DType::kFloat32 && mma_width(p.D) && aligned(p.q) && aligned(p.k) &&
         aligned(p.v) && p.C < (int64_t{1} << 31);
}

bool flash_mma_backward_supported(const FlashParams& p) {
  return flash_mma_forward_supported(p) && aligned(p.grad_out);
}

cudaError_t flash_attention_forward_mma(const FlashParams& p, cudaStream_t stream) {
  if (!flash_mma_forward_supported(p)) return cudaErrorInvalidValue;
  const auto& lab = lab_kernels();
  if (lab.flash_forward && lab.flash_forward_applies(p)) return lab.flash_forward(p, stream);
  return p.dtype == DType::kBFloat16 ? forward_for_width<__nv_bfloat16>(p, stream) : forward_for_width<__half>(p, stream);
}

cudaError_t flash_attention_backward_mma(const FlashParams& p, cudaStream_t stream) {
  if (!flash_mma_backward_supported(p)) return cudaErrorInvalidValue;
  const auto& lab = lab_kernels();
  if (lab.flash_backward && lab.flash_backward_applies(p)) return lab.flash_backward(p, stream);
  return p.dtype == DType::kBFloat16 ? backward_for_width<__nv_bfloat16>(p, stream) : backward_for_width<__half>(p, stream);
}

}  // namespace spanformer::ops::cuda
