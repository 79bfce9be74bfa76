// The lab's entry points (src/ops/cuda/lab/*.cu): kernel variants awaiting a GPU (docs/platform.md), which the
// mainline launchers hand a call to when its params name one (SpanAttentionParams::variant,
// FlashParams::variant; the table: ../variants.h) and it applies to the call's width. Each `applies`
// is false for the mainline's variants, so the mainline runs whatever the lab does not take.
#pragma once
#include "../params.h"

namespace spanformer::ops::cuda {

bool flash_lab_forward_applies(const FlashParams& p);
cudaError_t flash_lab_forward(const FlashParams& p, cudaStream_t stream);
// The lab's backward writes every element of dk and dv (the mainline's adds into zeroed buffers).
bool flash_lab_backward_applies(const FlashParams& p);
cudaError_t flash_lab_backward(const FlashParams& p, cudaStream_t stream);

bool span_lab_forward_applies(const SpanAttentionParams& p);
cudaError_t span_lab_forward(const SpanAttentionParams& p, cudaStream_t stream);

}  // namespace spanformer::ops::cuda
